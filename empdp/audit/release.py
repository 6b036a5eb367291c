"""Audit of a calibrated release (docs/method.md#94-release-audit).

The release mechanism's output distribution (empirical sense) is
r = P̂ ⋆ k ⋆ h: pick a database j uniformly, add curator-kernel noise k
(smoothed bootstrap), add the release noise y ~ h; likewise r_i from
P̂_i = {q_j − Δ_ij}. We run MPL and the Rényi bound on (r, r_i) for the
riskiest individuals and put the exact values beside them: sup |log r − log r_i|
and D_α by quadrature on a fine grid. A built-in cross-check that the
release meets its target ε and that the audits are calibrated (LB ≤ exact).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError
from ..io import keyed_hash
from .common import as_rng, check_level, check_order, check_size, jsonable
from .mechanisms import Mechanism
from .mpl import mpl
from .renyi import renyi

log = logging.getLogger("empdp.audit")


# ----------------------------------------------------------------------------- release density

def release_kernel_logpdf(x, kernel: str, b: float, w: float, lam: float) -> np.ndarray:
    """log of k ⋆ h at ``x`` for h = w·δ_0 + (1 − w)·Laplace(λ) and k Laplace/Gaussian of scale b.

    For a Gaussian k this is :func:`empdp.noise.deconv.log_smoothed_kernel`, the kernel
    calibration certifies (docs/method.md#94-release-audit).
    """
    x = np.asarray(x, float)
    if kernel not in ("laplace", "gaussian"):
        raise InputError(f"unknown curator kernel {kernel!r}; expected 'laplace' or 'gaussian'")
    noisy = w < 1 and lam > 0
    if kernel == "gaussian":
        if noisy:  # the exponentially modified Gaussian, mixed with the atom at 0
            from ..noise.deconv import log_smoothed_kernel  # scipy.special: imported on first use

            return log_smoothed_kernel(x, b, w, lam)
        return -0.5 * (x / b) ** 2 - math.log(b * math.sqrt(2 * math.pi))
    log_k = -np.abs(x) / b - math.log(2 * b)
    if not noisy:
        return log_k
    if abs(lam - b) < 1e-12 * lam:  # ℓ_b ⋆ ℓ_b
        log_conv = np.log1p(np.abs(x) / b) - np.abs(x) / b - math.log(4 * b)
    else:  # ℓ_b ⋆ ℓ_λ = (λ e^{−|x|/λ} − b e^{−|x|/b}) / (2(λ² − b²))
        hi, lo = max(lam, b), min(lam, b)
        ax = np.abs(x)
        log_conv = (math.log(hi) - ax / hi + np.log1p(-(lo / hi) * np.exp(-ax / lo + ax / hi))
                    - math.log(2 * (hi * hi - lo * lo)))
    if w <= 0:
        return log_conv
    return np.logaddexp(math.log(w) + log_k, math.log1p(-w) + log_conv)


def release_logdensity(x, points, kernel, b, w, lam, chunk: int = 4096) -> np.ndarray:
    """log r(x) for r = (1/n) Σ_j (k ⋆ h)(x − p_j), evaluated in chunks of x."""
    x = np.asarray(x, float)
    points = np.asarray(points, float)
    out = np.empty(x.size)
    for s in range(0, x.size, chunk):
        z = x[s:s + chunk, None] - points[None, :]
        out[s:s + chunk] = _special().logsumexp(release_kernel_logpdf(z, kernel, b, w, lam), axis=1)
    return out - math.log(points.size)


def exact_values(q, shifted, kernel, b, w, lam, order: float, grid_points: int = 20000):
    """Exact ε_i = sup_x |log r − log r_i| and D_α both ways, on a fine grid with all points.

    For Laplace-based release densities the log-ratio is constant in the far
    tails, so a grid reaching 40 scales beyond the points captures the sup;
    with a purely Gaussian release (no noise, Gaussian kernel) ε_i = ∞.
    """
    scale = max(b, lam if w < 1 else 0.0)
    pts = np.concatenate([q, shifted])
    lo, hi = pts.min() - 40 * scale, pts.max() + 40 * scale
    x = np.unique(np.concatenate([np.linspace(lo, hi, grid_points), pts]))
    lr = release_logdensity(x, q, kernel, b, w, lam)
    li = release_logdensity(x, shifted, kernel, b, w, lam)
    diff = lr - li
    if kernel == "gaussian" and (w >= 1 or lam <= 0) and not np.allclose(np.sort(q), np.sort(shifted)):
        eps = math.inf
    else:
        eps = float(np.max(np.abs(diff)))

    def div(la, lb):
        y = np.exp(order * la + (1 - order) * lb)
        return math.log(float(np.trapezoid(y, x))) / (order - 1)

    return eps, max(div(lr, li), div(li, lr))


def release_mechanism(q, shifts_top, kernel, b, w, lam) -> Mechanism:
    """Sampler of the release: database −1 is r = P̂ ⋆ k ⋆ h, database k is r_k for top individual k."""
    q = np.asarray(q, float)
    shifts_top = np.atleast_2d(np.asarray(shifts_top, float))

    def sample(database, size, rng):
        k = int(database)
        pts = q if k < 0 else q - shifts_top[k]
        y = pts[rng.integers(0, q.size, size)]
        y = y + (rng.laplace(0.0, b, size) if kernel == "laplace" else rng.normal(0.0, b, size))
        if w < 1 and lam > 0:
            noisy = rng.random(size) >= w
            y = y + np.where(noisy, rng.laplace(0.0, lam, size), 0.0)
        return y

    return Mechanism("release", sample)


# ----------------------------------------------------------------------------- audit

@dataclass
class ReleaseAudit:
    """MPL and Rényi bounds for a calibrated release beside the exact grid values."""

    target_epsilon: float
    order: float
    individuals: list
    mpl_lower_bound: float
    mpl_estimate: float
    renyi_lower_bound: float
    exact_epsilon_max: float
    exact_renyi_max: float
    n: int
    N: int
    n_renyi: int
    alpha: float
    noise: dict
    curator_kernel: dict
    warnings: list = field(default_factory=list)
    #: the ids in ``individuals`` are keyed pseudonyms (``hash_key`` was given)
    ids_hashed: bool = False

    @property
    def ok(self) -> bool:
        """Exact ε ≤ target and the MPL bound does not contradict it."""
        tol = 1e-9 * max(1.0, self.target_epsilon)
        return self.exact_epsilon_max <= self.target_epsilon + tol and self.mpl_lower_bound <= self.target_epsilon

    @property
    def renyi_consistent(self) -> bool:
        """The Rényi lower bound does not exceed the exact D_α of the audited individuals.

        Not part of :attr:`ok` (there is no Rényi target): a bound above the
        exact value is the bound's allowed miss (probability ≤ alpha), or a
        sign that the release is not the one calibrated.
        """
        return self.renyi_lower_bound <= self.exact_renyi_max * (1 + 1e-9) + 1e-12

    def to_dict(self) -> dict:
        return jsonable({
            "method": "release", "target_epsilon": self.target_epsilon, "order": self.order,
            "ok": self.ok, "renyi_consistent": self.renyi_consistent,
            "mpl_lower_bound": self.mpl_lower_bound, "mpl_estimate": self.mpl_estimate,
            "exact_epsilon_max": self.exact_epsilon_max, "renyi_lower_bound": self.renyi_lower_bound,
            "exact_renyi_max": self.exact_renyi_max, "individuals": self.individuals,
            "n": self.n, "N": self.N, "n_renyi": self.n_renyi, "alpha": self.alpha,
            "noise": self.noise, "curator_kernel": self.curator_kernel, "warnings": self.warnings,
            "ids_hashed": self.ids_hashed,
        })


def audit_release(calibration, source=None, *, loo=None, top: int = 5, order: float = 2.0,
                  n: int = 20000, N: int = 50000, n_renyi: int = 100000, alpha: float = 0.05,
                  rng=None, progress: Callable[[str, int, int], None] | None = None,
                  hash_key: bytes | None = None) -> ReleaseAudit:
    """Audit the release described by ``calibration`` on the databases of ``source`` (docs/method.md#94-release-audit).

    Parameters
    ----------
    calibration : :class:`empdp.noise.Calibration` or a path to its JSON.
    source : the data source the calibration was made from (re-read with its query), or
        ``loo``: an object with ``q`` (n,), ``shifts`` (m, n) and optionally ``ids``, ``undefined``.
    top : number of riskiest individuals audited (by exact ε_i of the release).
    order : Rényi order α > 1.
    n, N : MPL sample sizes; n_renyi : Rényi sample size per database.
    progress : optional callback ``progress(stage, done, total)``.
    hash_key : with a key (:func:`empdp.io.load_hash_key`), the ids are reported as keyed
        pseudonyms (:func:`empdp.io.keyed_hash`, as ``assess --hash-ids`` writes them).
    """
    from ..noise import Calibration
    from ..noise.exact import laplace_kde_eps

    # check the options before the calibration is read and the exact values computed
    # (order = 1 would otherwise fail in exact_values, after the slow part)
    order, alpha = check_order(order), check_level(alpha)
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise InputError(f"--top must be a positive integer, got {top!r}")
    top = int(top)
    n, N, n_renyi = check_size("n", n), check_size("N", N), check_size("n_renyi", n_renyi, 50)
    rng = as_rng(rng)
    cal = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
    if isinstance(cal.deconvolution, dict) and cal.deconvolution.get("adversary"):
        raise InputError("this calibration protects against an adversary (calibrate --adversary): its release "
                         "is audited per adversary bucket, which 'audit release' does not do yet; audit a "
                         "calibration made without --adversary, or read its per-bucket lambda in the file")
    if loo is None:
        if source is None:
            raise InputError("give the source the calibration was made from")
        if cal.id is None or cal.by is None:
            raise InputError("this calibration stores no query (it was made from arrays); pass loo=")
        from ..loo import leave_one_out

        loo = leave_one_out(source, id=cal.id, by=cal.by, query=cal.query, where=cal.where, sql=cal.sql)
    q = np.asarray(loo.q, float)
    shifts = np.atleast_2d(np.asarray(loo.shifts, float)).reshape(-1, q.size)
    ids = list(getattr(loo, "ids", None) if getattr(loo, "ids", None) is not None else range(len(shifts)))
    undefined = np.asarray(getattr(loo, "undefined", None) if getattr(loo, "undefined", None) is not None
                           else np.zeros(len(shifts), bool), bool)
    usable = ~undefined & (shifts != 0).any(axis=1)
    if not usable.any():
        raise InputError("no individual changes the query: nothing to audit")
    kernel, b = cal.curator_kernel["kind"], float(cal.curator_kernel["scale"])
    w, lam = float(cal.noise["weight_zero"]), float(cal.noise["scale"])
    warnings = []
    if undefined.any():
        warnings.append(f"{int(undefined.sum())} sole contributor(s) are not audited (no noise protects them)")

    # rank by the exact Laplace-KDE ε at the effective scale (exact for the Laplace closed form)
    rows = np.flatnonzero(usable)
    eff = lam if w < 1 and lam > 0 else b
    rank_eps = laplace_kde_eps(q, q[None, :] - shifts[rows], eff)
    # the ranking is a proxy for other kernels: take 4x as many, keep the top by exact ε_i
    shortlist = rows[np.argsort(-rank_eps, kind="stable")[:4 * top]]
    report = progress or (lambda stage, done, total: None)
    stage, t0 = f"exact values: {len(shortlist)} individuals", time.perf_counter()
    exact = {}
    for j, k in enumerate(shortlist):
        exact[int(k)] = exact_values(q, q - shifts[k], kernel, b, w, lam, order)
        report(stage, j + 1, len(shortlist))
    chosen = sorted(exact, key=lambda k: -exact[k][0])[:top]
    log.info("release audit: exact epsilon_i and D_%g for %d shortlisted of %d individuals in %.2f s",
             order, len(shortlist), len(rows), time.perf_counter() - t0)

    name = (lambda v: keyed_hash(v, hash_key)) if hash_key else (lambda v: v)
    individuals = [{"id": name(ids[k]), "exact_epsilon": exact[k][0], "exact_renyi": exact[k][1]} for k in chosen]
    mech = release_mechanism(q, shifts[np.array(chosen)], kernel, b, w, lam)
    pairs = [(-1, k) for k in range(len(chosen))]
    m = mpl(mech, pairs, n=n, N=N, alpha=alpha, rng=rng, progress=progress)
    r = renyi(mech, pairs, order=order, n=n_renyi, alpha=alpha, rng=rng, progress=progress)
    for k, est in enumerate(m.pair_estimates):
        individuals[k]["mpl_estimate"] = est
    warnings += m.warnings + r.warnings
    return ReleaseAudit(
        target_epsilon=float(cal.epsilon), order=float(order), individuals=individuals,
        mpl_lower_bound=m.lower_bound, mpl_estimate=m.estimate, renyi_lower_bound=r.lower_bound,
        exact_epsilon_max=max(d["exact_epsilon"] for d in individuals),
        exact_renyi_max=max(d["exact_renyi"] for d in individuals), n=n, N=N, n_renyi=n_renyi,
        alpha=alpha, noise=dict(cal.noise), curator_kernel=dict(cal.curator_kernel), warnings=warnings,
        ids_hashed=bool(hash_key))


def _special():
    """scipy.special, imported on first use (it costs an audit command ~0.4 s that MPL never needs)."""
    from scipy import special

    return special
