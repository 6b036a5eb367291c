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

import math

import numpy as np

from .mechanisms import Mechanism


class JointDensity:
    """The joint release density of 2–3 statistics and each individual's: what
    :func:`empdp.audit.release._audit_density` audits for a joint calibration. Every usable individual's
    exact ε_i is computed (on the release density's kink grid) to rank them; D_α is computed for the
    chosen ones."""

    delta = None  # the joint curator kernel is pure DP: no (ε, δ) part

    def __init__(self, cal, q, shifts, order: float):
        self.cal, self.q, self.shifts, self.order = cal, q, shifts, order

    def choose(self, rows: np.ndarray, top: int, report) -> tuple[list, dict]:
        from ..noise.joint_exact import joint_eps_at

        stage = f"exact values: {len(rows)} individuals"
        report(stage, 0, 1)
        exact = joint_eps_at(self.cal.release_model(self.q), self.shifts[rows], 1.0)
        report(stage, 1, 1)
        rank = np.argsort(-exact, kind="stable")[:top]
        chosen = [int(k) for k in rows[rank]]
        return chosen, {k: {"exact_epsilon": float(e)} for k, e in zip(chosen, exact[rank])}

    def mechanism(self, chosen: list) -> Mechanism:
        return joint_release_mechanism(self.cal, self.q, self.shifts[np.array(chosen)])

    def exact_renyi(self, chosen: list, figures: dict) -> None:
        """The exact D_α both ways of each chosen individual (None beyond the quadrature's budget)."""
        T = self.cal.release_model(self.q).transform
        for k in chosen:
            both = exact_renyi(self.q @ T.T, (self.q - self.shifts[k]) @ T.T, self.order)
            figures[k]["exact_renyi"] = None if both is None else max(both)

    def at_delta(self, mech, pairs, **sizes) -> tuple[dict, list]:
        return {}, []


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

    return Mechanism("joint release", sample, threads=None, ours=True)  # each part with its own generator


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
