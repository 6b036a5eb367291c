"""Audit of a joint release of 2–3 statistics (docs/method.md#94-release-audit, #102-joint-queries-planned).

The joint release law (empirical sense) is r = P̂ ⋆ k ⋆ h in d dimensions: pick a database j
uniformly, add the curator's product Laplace kernel on each whitened axis (scales b_k), add the
release noise z_k ~ w_k δ_0 + (1 − w_k) Laplace(λ_k) there, and map back by W^{−1}; likewise r_i
from P̂_i = {q_j − Δ_ij}. MPL (which takes outputs in ℝ^d, d ≤ 3) runs on (r, r_i) for the
riskiest individuals. It measures the whitened outputs W·x: a known bijection of the released
vector, so the pure-DP ε is the same, and the kernel estimates MPL uses are not distorted by
strongly correlated statistics. Beside it, the exact ε_i of the released density: per whitened
axis ℓ_{b_k} ⋆ h_k = ℓ_{λ_k} (the file's checks make the noise this deconvolution), so r is the
product Laplace(λ_k) KDE of the whitened points, and ε_i = sup |log r − log r_i| is computed exactly
on its kink grid (:func:`empdp.joint.joint_eps_at`), for every individual.

The Rényi bound is not run: its exact counterpart, D_α by quadrature in d dimensions, is not built.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError
from ..io import keyed_hash
from .common import jsonable
from .mechanisms import Mechanism
from .mpl import mpl

log = logging.getLogger("empdp.audit")


@dataclass
class JointReleaseAudit:
    """MPL bound on a joint release beside the exact ε_i of its density (``to_dict`` keeps the plain audit's
    keys; the Rényi ones are null)."""

    target_epsilon: float
    statistics: list
    individuals: list
    mpl_lower_bound: float
    mpl_estimate: float
    exact_epsilon_max: float
    n: int
    N: int
    alpha: float
    noise: dict
    curator_model: dict
    warnings: list = field(default_factory=list)
    ids_hashed: bool = False

    @property
    def d(self) -> int:
        return len(self.statistics)

    @property
    def ok(self) -> bool:
        """Exact ε ≤ target and the MPL bound does not contradict it."""
        tol = 1e-9 * max(1.0, self.target_epsilon)
        return self.exact_epsilon_max <= self.target_epsilon + tol and self.mpl_lower_bound <= self.target_epsilon

    def to_dict(self) -> dict:
        return jsonable({
            "method": "release", "joint": True, "d": self.d, "statistics": self.statistics,
            "target_epsilon": self.target_epsilon, "ok": self.ok, "mpl_lower_bound": self.mpl_lower_bound,
            "mpl_estimate": self.mpl_estimate, "exact_epsilon_max": self.exact_epsilon_max,
            "renyi_lower_bound": None, "exact_renyi_max": None, "renyi_consistent": None,
            "individuals": self.individuals, "n": self.n, "N": self.N, "alpha": self.alpha, "noise": self.noise,
            "curator_kernel": {"kind": self.curator_model.get("kind"), "scales": self.curator_model.get("scales")},
            "curator_model": self.curator_model, "warnings": self.warnings, "ids_hashed": self.ids_hashed,
        })


def joint_release_mechanism(cal, q, shifts_top) -> Mechanism:
    """Sampler of the joint release in whitened coordinates: database −1 is r, database k is r_k for top row k.

    Each output is W p_j + (curator kernel: Laplace(b_k) per axis) + (noise: 0 with probability w_k,
    else Laplace(λ_k), per axis), p_j a uniformly chosen point of P̂ or P̂_k: the law of W·(released vector).
    """
    W = cal.whitening
    b, w, lam = cal.curator_scales, cal.noise_weights, cal.noise_scales
    a = np.asarray(q, float) @ W.T
    sa = np.asarray(shifts_top, float) @ W.T
    n, d = a.shape

    def sample(database, size, rng):
        k = int(database)
        pts = a if k < 0 else a - sa[k]
        y = pts[rng.integers(0, n, size)] + rng.laplace(0.0, 1.0, (size, d)) * b
        if cal.noise_added:
            z = rng.laplace(0.0, 1.0, (size, d)) * lam
            y = y + np.where(rng.random((size, d)) >= w, z, 0.0)
        return y

    return Mechanism("joint release", sample)


def _read(cal, source, loo):
    """(q (n, d), shifts (m, n, d), ids, sole) of the calibration's statistics: ``loo`` as given, or read."""
    if loo is None:
        if source is None:
            raise InputError("give the source the calibration was made from")
        if cal.id is None or cal.by is None or (cal.query is None and cal.sql is None):
            raise InputError("this calibration stores no query (it was made from arrays); pass loo=")
        from ..joint.panel import read_joint

        panel = read_joint(source, id=cal.id, by=cal.by, queries=cal.query, sql=cal.sql, where=cal.where)
        return panel.q, panel.shifts, list(panel.ids.to_list()), panel.sole
    q = np.asarray(loo.q, float)
    shifts = np.asarray(loo.shifts, float)
    ids = getattr(loo, "ids", None)
    sole = getattr(loo, "sole", getattr(loo, "undefined", None))
    return (q, shifts, list(ids if ids is not None else range(len(shifts))),
            np.asarray(sole if sole is not None else np.zeros(len(shifts), bool), bool))


def audit_joint_release(cal, source=None, *, loo=None, top: int = 5, n: int = 20000, N: int = 50000,
                        alpha: float = 0.05, rng=None, progress: Callable[[str, int, int], None] | None = None,
                        hash_key: bytes | None = None) -> JointReleaseAudit:
    """Audit the joint release of :class:`empdp.noise.JointCalibration` ``cal`` on its source (options checked by
    :func:`empdp.audit.audit_release`, which calls this for a joint calibration).

    ``loo``: instead of ``source``, an object with ``q`` (n, d), ``shifts`` (m, n, d) and optionally
    ``ids`` and ``sole`` (sole contributors). The ``top`` individuals with the largest exact ε_i of the
    release are audited by MPL, at level ``alpha``.
    """
    q, shifts, ids, sole = _read(cal, source, loo)
    if q.ndim != 2 or q.shape[1] != cal.d or shifts.shape[1:] != q.shape:
        raise InputError(f"the source gives {q.shape[1] if q.ndim == 2 else 1} statistics over {q.shape[0]} "
                         f"databases, but the calibration has {cal.d} over {cal.n_databases}")
    from ..joint import joint_eps_at

    usable = ~sole & (shifts != 0).any(axis=(1, 2))
    if not usable.any():
        raise InputError("no individual changes the statistics: nothing to audit")
    warnings = ["the Renyi bound is not computed for a joint release (its exact counterpart in d dimensions is "
                "not built); MPL and the exact epsilon_i are"]
    if sole.any():
        warnings.append(f"{int(sole.sum())} sole contributor(s) are not audited (no noise protects them)")
    rows = np.flatnonzero(usable)
    t0 = time.perf_counter()
    report = progress or (lambda stage, done, total: None)
    report(f"exact values: {len(rows)} individuals", 0, 1)
    exact = joint_eps_at(cal.release_model(q), shifts[rows], 1.0)
    report(f"exact values: {len(rows)} individuals", 1, 1)
    order = np.argsort(-exact, kind="stable")[:top]
    chosen = rows[order]
    log.info("joint release audit: exact epsilon_i for %d individuals in %.2f s; max %.6g", len(rows),
             time.perf_counter() - t0, float(exact.max()))
    name = (lambda k: keyed_hash(ids[k], hash_key)) if hash_key else (lambda k: ids[k])
    individuals = [{"id": name(int(k)), "exact_epsilon": float(e)} for k, e in zip(chosen, exact[order])]
    mech = joint_release_mechanism(cal, q, shifts[chosen])
    m = mpl(mech, [(-1, k) for k in range(len(chosen))], n=n, N=N, alpha=alpha, rng=rng, progress=progress)
    for k, est in enumerate(m.pair_estimates):
        individuals[k]["mpl_estimate"] = est
    return JointReleaseAudit(target_epsilon=float(cal.epsilon), statistics=list(cal.statistics),
                             individuals=individuals, mpl_lower_bound=m.lower_bound, mpl_estimate=m.estimate,
                             exact_epsilon_max=float(exact.max()), n=n, N=N, alpha=alpha, noise=dict(cal.noise),
                             curator_model=dict(cal.curator_model), warnings=warnings + m.warnings,
                             ids_hashed=bool(hash_key))
