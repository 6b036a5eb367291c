"""Checks the method requires (docs/method.md#7-checks; Burchard et al. section 5)."""

from __future__ import annotations

import importlib
import threading

import numpy as np
from scipy.special import chdtrc


def ljung_box(x: np.ndarray, lags: int | None = None) -> tuple[float, int]:
    """Ljung–Box portmanteau test for autocorrelation; returns (p-value, lags)."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    lags = lags or max(1, min(10, n // 4))
    xc = x - x.mean()
    denom = float(np.dot(xc, xc))
    if n < 3 or denom == 0:
        return 1.0, lags
    rho = np.array([np.dot(xc[k:], xc[:-k]) / denom for k in range(1, lags + 1)])
    Q = n * (n + 2) * np.sum(rho**2 / (n - np.arange(1, lags + 1)))
    return float(chdtrc(lags, Q)), lags  # the χ² survival function


def preload() -> None:
    """Start, in a background thread, what the assessment needs once the table is opened, so that it
    overlaps DuckDB's reading (which releases the GIL) instead of adding to the assessment's time:
    the compiled kernels of the density fit and of the exact risk (about 1.4 s: numba's import,
    LLVM's start and the cache's load; the fit's first call waits for it rather than loading them a
    second time) and scipy.stats for the summary's trend test (about 0.5 s)."""
    global _PRELOADED
    if not _PRELOADED:
        _PRELOADED = True
        threading.Thread(target=_preload, daemon=True, name="empdp-preload").start()


_PRELOADED = False


def _preload() -> None:
    from .. import compiled  # numba: the assessment's path only, never --help or an audit

    compiled.warm()
    importlib.import_module("scipy.stats")


def trend_test(x: np.ndarray) -> float:
    """Mann–Kendall trend test (Kendall τ of the series against its index); p-value."""
    x = np.asarray(x, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0:
        return 1.0
    from scipy import stats  # imported here: scipy.stats alone doubles the package's import time

    return float(stats.kendalltau(np.arange(len(x)), x).pvalue)


#: fewer databases than this: a density model of the query's values rests on too few of them (the
#: least an adversary bucket should hold too, :data:`empdp.assessment.adversary.MIN_BUCKET`)
MIN_DATABASES = 10


def few_databases(n: int, where: str = "the assessment") -> list[str]:
    """The small-sample warning when ``where`` (an assessment, a calibration, an adversary bucket)
    rests on fewer than :data:`MIN_DATABASES` databases; none from that many on.

    The one message every model and command gives: the density model is fitted to ``n`` query
    values; with few of them every risk computed from it (and noise calibrated to it) is unreliable,
    and so are the independence checks.
    """
    if n >= MIN_DATABASES:
        return []
    return [f"{where} rests on only {n} database{'' if n == 1 else 's'}; with fewer than {MIN_DATABASES} databases "
            "a density model fitted to the query values, and every risk computed from it, is unreliable; use "
            "more databases if you can"]


def independence(q: np.ndarray, alpha: float = 0.05) -> tuple[dict, list[str]]:
    """Test the query series (in database order) for autocorrelation and trend; warn, too, when the
    series is too short for a reliable model (:func:`few_databases`)."""
    p_lb, lags = ljung_box(q)
    p_tr = trend_test(q)
    warnings = few_databases(len(q))
    if p_lb < alpha:
        warnings.append(f"the query values are autocorrelated across databases (Ljung-Box p = {p_lb:.3g}); "
                        f"the method assumes independent databases, so the risk estimates may be off")
    if p_tr < alpha:
        warnings.append(f"the query values trend across databases (Mann-Kendall p = {p_tr:.3g}); "
                        f"the databases are not identically distributed, so the risk estimates may be off")
    return {"ljung_box_p": p_lb, "ljung_box_lags": lags, "trend_p": p_tr}, warnings


def representativeness(n_present: np.ndarray, n_databases: int) -> tuple[dict, list[str]]:
    """How many databases each individual appears in; warn when most appear only once."""
    n_present = np.asarray(n_present)
    counts = np.bincount(n_present, minlength=n_databases + 1)
    once = float(np.mean(n_present == 1)) if len(n_present) else 0.0
    summary = {
        "median_databases_per_individual": float(np.median(n_present)) if len(n_present) else 0.0,
        "share_in_one_database": once,
        "share_in_all_databases": float(np.mean(n_present == n_databases)) if len(n_present) else 0.0,
        "histogram": {int(k): int(v) for k, v in enumerate(counts) if v},
    }
    warnings = []
    if once > 0.5:
        warnings.append(f"{once:.0%} of individuals appear in only one database; their risk rests on a "
                        f"single observation and the databases may not represent the population")
    return summary, warnings
