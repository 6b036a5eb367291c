"""Calibration against an adversary who knows a statistic of each database (docs/method.md#101-adversarial-knowledge).

The databases are cut into the buckets of :mod:`empdp.adversary`; bucket B has its own curator
scale b_B (held-out likelihood within the bucket, or the one ``bandwidth``). One noise law serves
every bucket: h = w·δ_0 + (1 − w)·Laplace(λ) with w = (b_min/λ)² and λ = max_B λ*_B. For the
bucket of scale b_min the released density is P̂_B ⋆ ℓ_λ exactly; for a bucket of scale
b_B ≥ b_min, ℓ_{b_B} ⋆ h = ℓ_λ ⋆ g_B with g_B = (b_min/b_B)²·δ_0 + (1 − (b_min/b_B)²)·ℓ_{b_B} (their
Fourier transforms agree), a probability law, and smoothing both densities by it cannot raise
their ratio: every ε_i^B ≤ ε_i^B(λ) ≤ ε. No noise exactly when every bucket's own model is
already ε-private for everyone (what ``assess --adversary`` finds: nobody at risk at ε).
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .. import adversary as adv
from ..errors import InputError
from .calibration import Calibration
from .deconv import laplace_closed_form
from .exact import laplace_kde_eps, minimal_lambda


def calibrate_buckets(q, shifts, g, *, epsilon: float, buckets, labels, statistic: str, bandwidth="auto",
                      undefined=None, kernel: str = "laplace") -> Calibration:
    """The least noise that makes every bucket's released density ε-private (see the module doc)."""
    t0 = time.perf_counter()
    if kernel != "laplace":
        raise InputError("calibrate --adversary deconvolves Laplace curator kernels only: drop --kernel")
    if bandwidth == "variable":
        raise InputError("--bandwidth variable is for assess only: no single noise law deconvolves kernels of "
                         "different widths; calibrate with --bandwidth auto or a number")
    q = np.asarray(q, dtype=float)
    shifts = np.atleast_2d(np.asarray(shifts, dtype=float)).reshape(-1, q.size)
    undefined = np.zeros(len(shifts), bool) if undefined is None else np.asarray(undefined, bool)
    if len(undefined) and undefined.all():
        raise InputError(f"every individual ({len(undefined)}) is the only contributor to some database: "
                         "no noise level can protect them and there is nothing to calibrate")
    k = adv.check_buckets(buckets, q.size)
    groups, notes = adv.fit_buckets(q, np.asarray(g, dtype=float), k, kernel="laplace", bandwidth=bandwidth)
    rows = ~undefined & (shifts != 0).any(axis=1)
    at_curator, searches = [], []
    for b in groups:
        a, B = q[b.databases], q[b.databases] - shifts[rows][:, b.databases]
        at_curator.append(float(laplace_kde_eps(a, B, b.model.scale).max(initial=0.0)) if len(B) else 0.0)
        searches.append(minimal_lambda(a, B, epsilon))
    b_min = min(float(b.model.scale) for b in groups)
    lam = max(s.lam for s in searches)
    if max(at_curator) <= epsilon:  # every bucket's own model already suffices: no noise
        noise, eps_max = laplace_closed_form(b_min, 0.0), max(at_curator)
    else:  # some bucket needs λ*_B > b_B ≥ b_min, so the closed form applies at λ = max λ*_B
        noise = laplace_closed_form(b_min, lam)
        eps_max = max(float(laplace_kde_eps(q[b.databases], q[b.databases] - shifts[rows][:, b.databases],
                                            lam).max(initial=0.0)) for b in groups)
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
                        "lambda = max over buckets of lambda*_B",
              "feasible": True,
              "adversary": {"statistic": statistic, "buckets": [
                  {"lo": b.lo, "hi": b.hi, "n_databases": int(len(b.databases)), "scale": float(b.model.scale),
                   "lambda": float(s.lam), "eps_all_at_scale": e,
                   "databases": [v if isinstance(v, (int, float, str)) else str(v) for v in
                                 (labels[j] for j in b.databases)]}
                  for b, s, e in zip(groups, searches, at_curator)]}}
    return Calibration(
        epsilon=float(epsilon), lam=float(lam), lam_hausdorff=max(s.lam_hausdorff for s in searches),
        lam_winf=max(s.lam_winf for s in searches), curator_kernel={"kind": "laplace", "scale": b_min},
        noise=noise.to_dict(), expected_abs_noise=noise.expected_abs, verified_eps_max=float(eps_max),
        n_individuals=int(len(shifts)), n_sole_contributors=int(undefined.sum()), n_databases=int(q.size),
        deconvolution=deconv, n_bisected=sum(s.n_bisected for s in searches),
        seconds=time.perf_counter() - t0, warnings=notes)


def statistic_values(source, *, id: str, by: str, adversary, adversary_sql, labels, memory_limit=None,
                     drop_null_ids: bool = False) -> tuple[np.ndarray, str]:
    """g on every database of the assessment (``labels``), and its description."""
    from ..loo import make_engine

    knows = make_engine(source, id=id, by=by, query=adversary, sql=adversary_sql, memory_limit=memory_limit,
                        drop_null_ids=drop_null_ids)
    statistic = knows.query.describe()
    try:
        values = knows.values()
    except InputError as exc:
        raise InputError(f"the adversary statistic {statistic}: {exc}") from None
    finally:
        knows.close()
    return adv.align_statistic(knows.panel.labels, values, labels, statistic), statistic


