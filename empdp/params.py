"""One validator per concept of the entry points' parameters (ε, threads, workers, buckets).

Each error names the library parameter (``InputError.param``): the command line shows its flag
instead. Every stage that takes the concept calls the same function, so the ranges agree.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .errors import InputError
from .textfmt import shorten

#: the largest ε any command takes: e^ε overflows a double just beyond 709; for a calibration, KDE terms
#: e^{-gap/λ} underflow past e^{-708}, so a log ratio above ~700 comes out as inf and λ* could never be
#: verified
MAX_EPSILON = 700.0
#: the smallest target ε of a calibration: ε_i(λ) ~ gap/λ is then a difference of logs of sums near n,
#: whose rounding (~1e-16 relative) becomes a relative error of ~1e-16/ε in λ* (6e-6 at 1e-9, 3e-4 at
#: 1e-12: too small a λ*)
MIN_TARGET_EPSILON = 1e-9
#: where the evaluation of individuals runs (:mod:`empdp.assessment.parallel`)
WORKERS = ("threads", "processes", "auto")


def epsilons(epsilon) -> np.ndarray:
    """The ε values to assess: one or a list, each in [0, :data:`MAX_EPSILON`]; sorted, unique."""
    try:
        eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
    except (TypeError, ValueError):
        eps = np.array([np.nan])
    if not len(eps) or eps.ndim != 1 or np.any(~np.isfinite(eps)) or np.any(eps < 0) or np.any(eps > MAX_EPSILON):
        raise InputError(f"`epsilon` values must be numbers in [0, {MAX_EPSILON:g}] (e^epsilon overflows beyond); "
                         f"got {epsilon!r}", param="epsilon")
    return np.unique(eps)


def target_epsilon(epsilon) -> float:
    """The target ε of a calibration: a number in [:data:`MIN_TARGET_EPSILON`, :data:`MAX_EPSILON`]."""
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        eps = math.nan
    if not (math.isfinite(eps) and eps > 0):
        raise InputError(f"`epsilon` must be a positive number; got {epsilon!r}", param="epsilon")
    if eps > MAX_EPSILON:
        raise InputError(f"`epsilon` {eps:g} is above {MAX_EPSILON:g}, where the densities' ratio "
                         f"(e^{MAX_EPSILON:g}) can no longer be computed in double precision and so cannot be "
                         "verified; such an epsilon protects nobody: use a smaller one", param="epsilon")
    if eps < MIN_TARGET_EPSILON:
        raise InputError(f"`epsilon` {eps:g} is below {MIN_TARGET_EPSILON:g}, where epsilon_i(lambda) can no longer "
                         "be computed exactly in double precision (rounding would make the noise too small); use "
                         f"{MIN_TARGET_EPSILON:g} or more", param="epsilon")
    return eps


def whole(value, name: str, least: int = 1) -> int:
    """A whole number ≥ ``least`` (bools refused), for the parameter ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise InputError(f"`{name}` must be a whole number >= {least}, got {value!r}", param=name)
    return int(value)


def available_cores() -> int:
    """Cores this process may run on (every command's default number of threads)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def max_threads() -> int:
    """The most threads accepted: 4 per core, at least 256 (DuckDB starts every one at once)."""
    return max(256, 4 * (os.cpu_count() or 1))


def threads(value) -> int | None:
    """A thread count from 1 to :func:`max_threads`, or None (every core); far above the cores is refused
    (10^5 threads hang DuckDB)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= max_threads():
        raise InputError(f"`threads` {shorten(value)} must be an integer from 1 to {max_threads()} "
                         f"(this machine has {os.cpu_count() or 1} cores)", param="threads")
    return int(value)


def workers(value) -> str:
    if value not in WORKERS:
        raise InputError(f"`workers` must be one of {', '.join(WORKERS)}, got {value!r}", param="workers")
    return value


def adversary(adversary, adversary_sql, buckets) -> None:
    """What the adversary knows: a query form or SQL (not both), and ``buckets`` only with one of them."""
    from .data.guard import check_select

    if buckets is not None and not (adversary or adversary_sql):
        raise InputError("`buckets` cut the databases by what the adversary knows: give `adversary` too (a "
                         "query form) or `adversary_sql`", param=("buckets", "adversary", "adversary_sql"))
    if adversary and adversary_sql:
        raise InputError("give either `adversary` or `adversary_sql`, not both", param=("adversary", "adversary_sql"))
    if buckets is not None:
        whole(buckets, "buckets")
    if adversary_sql is not None:  # refused naming its own option, before any data are read
        check_select(adversary_sql.strip().rstrip(";").strip(), "adversary_sql")
