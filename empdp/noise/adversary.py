"""Calibration against an adversary who knows a statistic of each database (docs/method.md#101-adversarial-knowledge).

The databases are cut into the buckets of :mod:`empdp.assessment.adversary`; bucket B has its own curator
scale b_B (held-out likelihood within the bucket, or the one ``bandwidth``). One noise law serves
every bucket: h = w·δ_0 + (1 − w)·Laplace(λ) with w = (b_min/λ)² and λ the largest λ*_B over
the buckets that need noise (those whose own model P̂_B ⋆ ℓ_{b_B} is not ε-private). For the
bucket of scale b_min the released density is P̂_B ⋆ ℓ_λ exactly; for a bucket of scale
b_B ≥ b_min, ℓ_{b_B} ⋆ h = ℓ_λ ⋆ g_B with g_B = (b_min/b_B)²·δ_0 + (1 − (b_min/b_B)²)·ℓ_{b_B} (their
Fourier transforms agree), a probability law, and smoothing both densities by it cannot raise
their ratio: every ε_i^B ≤ ε_i^B(λ) ≤ ε. A bucket that needs no noise is smoothed by h, a
probability law, so its ε_i^B stays at most its own model's ≤ ε: its λ*_B (which can exceed
every other) does not enter λ. No noise exactly when every bucket's own model is already
ε-private for everyone (what ``assess --adversary`` finds: nobody at risk at ε).

The calibration stores each bucket (its g-range, databases, scale b_B, λ*_B) in
``deconvolution["adversary"]``; :func:`stored_buckets` reads them back for ``audit release``,
which audits each bucket's released density P̂_B ⋆ ℓ_{b_B} ⋆ h.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..assessment import adversary as adv
from ..assessment.checks import few_databases
from ..errors import InputError
from .calibration import Calibration
from .deconv import laplace_closed_form
from .exact import laplace_kde_eps, minimal_lambda


def calibrate_buckets(q, shifts, g, *, epsilon: float, buckets, labels, statistic: str, bandwidth="auto",
                      undefined=None, kernel=kernels.DEFAULT.name) -> Calibration:
    """The least noise that makes every bucket's released density ε-private (see the module doc)."""
    t0 = time.perf_counter()
    if not kernels.is_laplace(kernel):
        raise InputError("calibrate `adversary` deconvolves Laplace curator kernels only: drop `kernel`",
                         param=("adversary", "kernel"))
    if bandwidth == "variable":
        raise InputError("`bandwidth` variable is for assess only: no single noise law deconvolves kernels of "
                         "different widths; calibrate with `bandwidth` auto or a number", param="bandwidth")
    q = np.asarray(q, dtype=float)
    shifts = np.atleast_2d(np.asarray(shifts, dtype=float)).reshape(-1, q.size)
    undefined = np.zeros(len(shifts), bool) if undefined is None else np.asarray(undefined, bool)
    if len(undefined) and undefined.all():
        raise InputError(f"every individual ({len(undefined)}) is the only contributor to some database: "
                         "no noise level can protect them and there is nothing to calibrate")
    k = adv.check_buckets(buckets, q.size)
    groups, notes = adv.fit_buckets(q, np.asarray(g, dtype=float), k, kernel=kernel, bandwidth=bandwidth)
    notes = few_databases(int(q.size), "the calibration") + notes
    rows = ~undefined & (shifts != 0).any(axis=1)
    at_curator, searches = [], []
    for b in groups:
        a, B = q[b.databases], q[b.databases] - shifts[rows][:, b.databases]
        at_curator.append(float(laplace_kde_eps(a, B, b.model.scale).max(initial=0.0)) if len(B) else 0.0)
        searches.append(minimal_lambda(a, B, epsilon))
    b_min = min(float(b.model.scale) for b in groups)
    # only the buckets whose own model is not ε-private need noise; h smooths the others, which
    # cannot raise their ε_i^B (see the module doc), however large their λ*_B
    need = [e > epsilon for e in at_curator]
    lam = max((s.lam for s, n in zip(searches, need) if n), default=max(s.lam for s in searches))
    if not any(need):  # every bucket's own model already suffices: no noise
        noise, eps_max = laplace_closed_form(b_min, 0.0), max(at_curator)
    else:  # a bucket that needs noise has λ*_B > b_B ≥ b_min, so the closed form applies at λ
        noise = laplace_closed_form(b_min, lam)
        eps_max = max(e if not n else
                      float(laplace_kde_eps(q[b.databases], q[b.databases] - shifts[rows][:, b.databases],
                                            lam).max(initial=0.0)) for b, e, n in zip(groups, at_curator, need))
    if eps_max > epsilon:  # pragma: no cover - each λ*_B is verified and ε_i(λ) falls with λ
        raise RuntimeError(f"verification failed: max eps_i = {eps_max} > {epsilon}")
    if undefined.any():
        notes.append(f"{int(undefined.sum())} sole contributor(s) cannot be protected by any noise level")
    if noise.kind == "none":
        notes.append("no noise is added: within every adversary bucket the curator's density model is already "
                     "epsilon-private for every individual, so the exact value is released")
    for note in notes:
        warnings.warn(note, stacklevel=2)
    deconv = {"method": "closed form, one law for every adversary bucket: w = (b_min/lambda)^2, "
                        "lambda = max of lambda*_B over the buckets that need noise",
              "feasible": True,
              "adversary": {"statistic": statistic, "buckets": [
                  {"lo": b.lo, "hi": b.hi, "n_databases": int(len(b.databases)), "scale": float(b.model.scale),
                   "lambda": float(s.lam), "eps_all_at_scale": e,
                   "databases": [v if isinstance(v, (int, float, str)) else str(v) for v in
                                 (labels[j] for j in b.databases)]}
                  for b, s, e in zip(groups, searches, at_curator)]}}
    return Calibration(
        epsilon=float(epsilon), lam=float(lam), lam_hausdorff=max(s.lam_hausdorff for s in searches),
        lam_winf=max(s.lam_winf for s in searches), curator_kernel={"kind": kernels.Laplace.name, "scale": b_min},
        noise=noise.to_dict(), expected_abs_noise=noise.expected_abs, verified_eps_max=float(eps_max),
        n_individuals=int(len(shifts)), n_sole_contributors=int(undefined.sum()), n_databases=int(q.size),
        deconvolution=deconv, n_bisected=sum(s.n_bisected for s in searches),
        seconds=time.perf_counter() - t0, warnings=notes)


@dataclass(frozen=True)
class StoredBucket:
    """One adversary bucket of a calibration: its databases (columns of the source) and curator scale."""

    databases: np.ndarray  # column indices into the source's databases, in database order
    lo: float
    hi: float
    scale: float


def stored_buckets(deconvolution, labels, where: str = "the calibration") -> tuple[str, list[StoredBucket]]:
    """The adversary statistic and buckets a calibration stores, matched to the source's ``labels``.

    Checked once, here: every bucket names databases of the source, none twice, and together they
    are all of the source's databases (else the source is not the one calibrated); the scale is a
    positive finite number. Labels match by their text, as the calibration file stores them.
    Returns ``("", [])`` for a calibration made without an adversary.
    """
    info = deconvolution.get("adversary") if isinstance(deconvolution, dict) else None
    if not info:
        return "", []
    fix = "re-create it with 'empdp calibrate --adversary'"
    raw = info.get("buckets") if isinstance(info, dict) else None
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where} protects against an adversary but stores no buckets; {fix}")
    column = {str(v): j for j, v in enumerate(labels)}
    seen: dict[int, int] = {}
    out = []
    for k, b in enumerate(raw):
        dbs, scale = (b.get("databases"), b.get("scale")) if isinstance(b, dict) else (None, None)
        lo, hi = (b.get("lo"), b.get("hi")) if isinstance(b, dict) else (None, None)
        numbers = (scale, lo, hi)
        if (not isinstance(dbs, list) or not dbs
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                           for v in numbers) or scale <= 0):
            raise InputError(f"{where}: adversary bucket {k} needs a list of databases, finite lo and hi and a "
                             f"positive scale; {fix}")
        cols = []
        for v in dbs:
            j = column.get(str(v))
            if j is None:
                raise InputError(f"{where}: adversary bucket {k} holds database {str(v)[:40]!r}, which the source "
                                 "does not have; audit on the source the calibration was made from")
            if j in seen:
                raise InputError(f"{where}: database {str(v)[:40]!r} is in adversary buckets {seen[j]} and {k}; "
                                 f"{fix}")
            seen[j] = k
            cols.append(j)
        out.append(StoredBucket(np.sort(np.array(cols, dtype=np.int64)), float(lo), float(hi), float(scale)))
    if len(seen) != len(column):
        missing = next(str(v) for j, v in enumerate(labels) if j not in seen)
        raise InputError(f"{where}: the source's database {missing[:40]!r} is in no adversary bucket "
                         f"({len(column) - len(seen)} database(s) are not): audit on the source the calibration "
                         "was made from")
    return str(info.get("statistic", "")), out
