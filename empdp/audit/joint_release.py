"""Audit of a joint release of 2–3 statistics (docs/method.md#94-release-audit, #102-joint-queries).

The joint release law (empirical sense) is r = P̂ ⋆ k ⋆ h in d dimensions: pick a database j
uniformly, add the curator's product Laplace kernel on each whitened axis (scales b_k), add the
release noise z_k ~ w_k δ_0 + (1 − w_k) Laplace(λ_k) there, and map back by W^{−1}; likewise r_i
from P̂_i = {q_j − Δ_ij}. MPL (which takes outputs in ℝ^d, d ≤ 3) runs on (r, r_i) for the
riskiest individuals, and so does the Rényi bound. They measure the whitened outputs W·x: a known bijection of the released
vector, so the pure-DP ε is the same, and the kernel estimates MPL uses are not distorted by
strongly correlated statistics. Beside it, the exact ε_i of the released density: per whitened
axis ℓ_{b_k} ⋆ h_k = ℓ_{λ_k} (the file's checks make the noise this deconvolution), so r is the
product Laplace(λ_k) KDE of the whitened points, and ε_i = sup |log r − log r_i| is computed exactly
on its kink grid (:func:`empdp.noise.joint_exact.joint_eps_at`), for every individual.

The Rényi bound runs on the same pairs, beside the exact D_α both ways: ∫ r^α r_i^{1−α} by a tensor
quadrature aligned on the kinks (:func:`exact_renyi`), exact in the tails and Gauss–Legendre inside.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError
from ..io import jsonable, keyed_hash
from .mechanisms import Mechanism
from .mpl import mpl
from .renyi import renyi

log = logging.getLogger("empdp.audit")


@dataclass
class JointReleaseAudit:
    """MPL and Rényi bounds on a joint release beside the exact ε_i and D_α of its density (``to_dict`` has the
    plain audit's keys, with ``joint``, ``d``, ``statistics`` and ``curator_model``)."""

    target_epsilon: float
    statistics: list
    individuals: list
    mpl_lower_bound: float
    stage1_max_loss: float  # MPL's largest stage-1 loss: biased up, not a bound
    exact_epsilon_max: float
    renyi_lower_bound: float
    exact_renyi_max: float | None
    order: float
    search_size: int
    final_size: int
    renyi_sample_size: int
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

    @property
    def renyi_consistent(self) -> bool | None:
        """The Rényi bound stays at or below the exact D_α of the audited individuals (None: D_α not computed);
        not part of :attr:`ok`, as for one statistic."""
        if self.exact_renyi_max is None:
            return None
        return self.renyi_lower_bound <= self.exact_renyi_max * (1 + 1e-9) + 1e-12

    def to_dict(self) -> dict:
        return jsonable({
            "method": "release", "joint": True, "d": self.d, "statistics": self.statistics,
            "target_epsilon": self.target_epsilon, "order": self.order, "ok": self.ok,
            "mpl_lower_bound": self.mpl_lower_bound, "stage1_max_loss": self.stage1_max_loss,
            "exact_epsilon_max": self.exact_epsilon_max, "renyi_lower_bound": self.renyi_lower_bound,
            "exact_renyi_max": self.exact_renyi_max, "renyi_consistent": self.renyi_consistent,
            "individuals": self.individuals, "search_size": self.search_size, "final_size": self.final_size,
            "renyi_sample_size": self.renyi_sample_size, "alpha": self.alpha,
            "noise": self.noise,
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


#: the most quadrature nodes of one exact D_α (d = 2: a few seconds); beyond, D_α is not computed
MAX_NODES = 40_000_000
#: scaled units between kernel points beyond which e^{−|u − a|} could underflow: D_α is then not computed
MAX_SPREAD = 600.0


def _axis_rule(kinks: np.ndarray, order: float):
    """Nodes and weights on one axis: Gauss–Legendre on pieces of each interval between consecutive kinks, and
    the two outermost kinks with weight 1. Beyond them every kernel term is e^{∓u} times a constant in this
    coordinate, so the integrand is g(c) e^{−|u − c|} there and integrates to g(c). Inside, the integrand
    r^α r′^{1−α} is analytic with derivatives of order k below ~α^k: pieces of length h ≤ 1/α and the
    fewest points p with (α h / 2)^{2p} / (2p)! ≤ 1e-12 (the Gauss–Legendre error term)."""
    c = np.unique(kinks)
    nodes, weights = [c[:1]], [np.ones(1)]
    for lo, hi in zip(c[:-1], c[1:]):
        m = max(1, math.ceil((hi - lo) * order))
        h = (hi - lo) / m
        p = next(q for q in (2, 3, 4, 6) if (order * h / 2) ** (2 * q) / math.factorial(2 * q) <= 1e-12)
        x, w = np.polynomial.legendre.leggauss(p)
        mid = lo + h * (np.arange(m) + 0.5)
        nodes.append((mid[:, None] + h / 2 * x).ravel())
        weights.append(np.tile(h / 2 * w, m))
    if len(c) > 1:
        nodes.append(c[-1:])
        weights.append(np.ones(1))
    return np.concatenate(nodes), np.concatenate(weights)


def exact_renyi(a: np.ndarray, b: np.ndarray, order: float) -> tuple[float, float] | None:
    """D_α(r ‖ r′) and D_α(r′ ‖ r) for the product Laplace(1) KDEs r, r′ of the points ``a``, ``b`` (n, d), d ≤ 3.

    Scaled coordinates (the released density in u = T x): both are densities there, and D_α does not
    depend on the linear map. ∫ r^α r′^{1−α} by the tensor product of :func:`_axis_rule` on each axis:
    the kink hyperplanes of both densities are node boundaries, so the integrand is analytic inside
    every cell (Gauss–Legendre to about 1e-12 per cell) and exactly exponential in the tails. None
    when the rule would exceed :data:`MAX_NODES` or the points spread over more than :data:`MAX_SPREAD`
    scales (where e^{−|u − a|} could underflow).
    """
    n, d = a.shape
    pts = np.vstack([a, b])
    if np.ptp(pts, axis=0).max() > MAX_SPREAD:
        return None
    rules = [_axis_rule(pts[:, k], order) for k in range(d)]
    if math.prod(len(r[0]) for r in rules) > MAX_NODES:
        return None
    scale = 1.0 / (n * 2.0 ** d)
    E = [[np.exp(-np.abs(r[0][:, None] - q[None, :, k])) for k, r in enumerate(rules)] for q in (a, b)]
    rest = np.ones(1)
    for r in rules[1:]:
        rest = np.multiply.outer(rest, r[1]).reshape(-1)  # the weights of the other axes, flattened
    forward = backward = 0.0
    rows = max(1, 2_000_000 // max(len(rest), 1))  # nodes of the first axis per block
    for g in range(0, len(rules[0][0]), rows):
        dens = []
        for Ea in E:
            first = Ea[0][g:g + rows]
            if d == 1:
                block = first.sum(axis=1)[:, None]
            elif d == 2:
                block = first @ Ea[1].T
            else:
                block = ((first[:, None, :] * Ea[1][None, :, :]).reshape(-1, n) @ Ea[2].T).reshape(len(first), -1)
            dens.append(block * scale)
        r, ri = dens
        ratio = r / ri
        w = rules[0][1][g:g + rows, None] * rest[None, :]
        forward += float(np.sum(w * r * ratio ** (order - 1)))
        backward += float(np.sum(w * ri * ratio ** (1 - order)))
    return math.log(forward) / (order - 1), math.log(backward) / (order - 1)


def _special():
    from scipy import special

    return special


def _read(cal, source, loo):
    """(q (n, d), shifts (m, n, d), ids, sole) of the calibration's statistics: ``loo`` as given, or read."""
    if loo is None:
        if source is None:
            raise InputError("give the source the calibration was made from")
        if cal.id is None or cal.by is None or (cal.query is None and cal.sql is None):
            raise InputError("this calibration stores no query (it was made from arrays); pass loo=")
        from ..loo.joint import read_joint

        panel = read_joint(source, id=cal.id, by=cal.by, queries=cal.query, sql=cal.sql, where=cal.where)
        return panel.q, panel.shifts, list(panel.ids.to_list()), panel.sole
    q = np.asarray(loo.q, float)
    shifts = np.asarray(loo.shifts, float)
    ids = getattr(loo, "ids", None)
    sole = getattr(loo, "sole", getattr(loo, "undefined", None))
    return (q, shifts, list(ids if ids is not None else range(len(shifts))),
            np.asarray(sole if sole is not None else np.zeros(len(shifts), bool), bool))


def audit_joint_release(cal, source=None, *, loo=None, top: int = 5, order: float = 2.0, n: int = 20000,
                        N: int = 50000, n_renyi: int = 100000, alpha: float = 0.05, rng=None,
                        progress: Callable[[str, int, int], None] | None = None,
                        hash_key: bytes | None = None) -> JointReleaseAudit:
    """Audit the joint release of :class:`empdp.noise.JointCalibration` ``cal`` on its source (options checked by
    :func:`empdp.audit.audit_release`, which calls this for a joint calibration).

    ``loo``: instead of ``source``, an object with ``q`` (n, d), ``shifts`` (m, n, d) and optionally
    ``ids`` and ``sole`` (sole contributors). The ``top`` individuals with the largest exact ε_i of the
    release are audited by MPL and by the Rényi bound of order ``order`` (``n_renyi`` outputs per
    database), each at level ``alpha``, beside their exact D_α (:func:`exact_renyi`).
    """
    q, shifts, ids, sole = _read(cal, source, loo)
    if q.ndim != 2 or q.shape[1] != cal.d or shifts.shape[1:] != q.shape:
        raise InputError(f"the source gives {q.shape[1] if q.ndim == 2 else 1} statistics over {q.shape[0]} "
                         f"databases, but the calibration has {cal.d} over {cal.n_databases}")
    from ..noise.joint_exact import joint_eps_at

    usable = ~sole & (shifts != 0).any(axis=(1, 2))
    if not usable.any():
        raise InputError("no individual changes the statistics: nothing to audit")
    warnings = []
    if sole.any():
        warnings.append(f"{int(sole.sum())} sole contributor(s) are not audited (no noise protects them)")
    rows = np.flatnonzero(usable)
    t0 = time.perf_counter()
    report = progress or (lambda stage, done, total: None)
    report(f"exact values: {len(rows)} individuals", 0, 1)
    exact = joint_eps_at(cal.release_model(q), shifts[rows], 1.0)
    report(f"exact values: {len(rows)} individuals", 1, 1)
    rank = np.argsort(-exact, kind="stable")[:top]
    chosen = rows[rank]
    log.info("joint release audit: exact epsilon_i for %d individuals in %.2f s; max %.6g", len(rows),
             time.perf_counter() - t0, float(exact.max()))
    name = (lambda k: keyed_hash(ids[k], hash_key)) if hash_key else (lambda k: ids[k])
    individuals = [{"id": name(int(k)), "exact_epsilon": float(e)} for k, e in zip(chosen, exact[rank])]
    mech = joint_release_mechanism(cal, q, shifts[chosen])
    m = mpl(mech, [(-1, k) for k in range(len(chosen))], n=n, N=N, alpha=alpha, rng=rng, progress=progress)
    for k, est in enumerate(m.stage1_max_loss_by_pair):
        individuals[k]["stage1_max_loss"] = est
    T = cal.release_model(q).transform
    for row, k in zip(individuals, chosen):
        both = exact_renyi(q @ T.T, (q - shifts[k]) @ T.T, order)
        row["exact_renyi"] = None if both is None else max(both)
    exact_d = [row["exact_renyi"] for row in individuals]
    if None in exact_d:
        warnings.append(f"the exact D_{order:g} was not computed for some individuals (more than "
                        f"{MAX_NODES:,} quadrature nodes, or points over {MAX_SPREAD:g} scales apart): "
                        "renyi_consistent is null")
    r = renyi(mech, [(-1, k) for k in range(len(chosen))], order=order, n=n_renyi, alpha=alpha, rng=rng,
              progress=progress)
    return JointReleaseAudit(target_epsilon=float(cal.epsilon), statistics=list(cal.statistics),
                             individuals=individuals, mpl_lower_bound=m.lower_bound, stage1_max_loss=m.stage1_max_loss,
                             exact_epsilon_max=float(exact.max()), renyi_lower_bound=r.lower_bound,
                             exact_renyi_max=None if None in exact_d else max(exact_d), order=float(order),
                             search_size=n, final_size=N, renyi_sample_size=n_renyi, alpha=alpha, noise=dict(cal.noise),
                             curator_model=dict(cal.curator_model), warnings=warnings + m.warnings + r.warnings,
                             ids_hashed=bool(hash_key))
