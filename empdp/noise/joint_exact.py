"""Calibration of a joint release: noise per whitened axis (docs/method.md#102-joint-queries).

The released density is the product Laplace(λ_k) KDE of the whitened points, λ_k = t b_k; the least
t that makes every individual ε-private is found by bisection and verified exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..params import target_epsilon
from ..risk.joint._generic import _check_shifts
from ..risk.joint.exact import exact_eps, joint_bound
from ..risk.joint.model import JointModel


@dataclass(frozen=True)
class JointNoise:
    """Release noise for a joint query (docs/method.md#102-joint-queries): independent per whitened axis k,

        z_k ~ w_k δ_0 + (1 − w_k) Laplace(λ_k),   noise = W^{−1} z   (statistics' units).

    With the curator's kernel ℓ_{b_k} on axis k, ℓ_{b_k} ⋆ (w_k δ_0 + (1 − w_k) ℓ_{λ_k}) = ℓ_{λ_k}
    for w_k = (b_k/λ_k)², so the released density is the product Laplace(λ_k) KDE of the whitened
    points. ``kind`` is 'none' (no noise: every w_k = 1) or 'laplace_mixture'.
    """

    kind: str
    weights: np.ndarray      # (d,) w_k, probability of adding nothing on whitened axis k
    scales: np.ndarray       # (d,) λ_k, whitened units
    unwhitening: np.ndarray  # (d, d) W^{−1}

    def sample(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """(size, d) noise vectors in the statistics' units (NumPy generator: tests only, not private)."""
        d = len(self.scales)
        z = rng.laplace(size=(size, d)) * self.scales
        z[rng.random((size, d)) < self.weights] = 0.0
        return z @ self.unwhitening.T

    def _char(self, s: int):
        """The characteristic function of statistic ``s``'s noise, Σ_k (W^{−1})_sk z_k: a product over the axes."""
        a = self.unwhitening[s] * self.scales
        w = self.weights

        def phi(t):
            return np.prod(w + (1 - w) / (1 + (a * t) ** 2))
        return phi

    def expected_abs(self) -> list[float]:
        """E|noise| of each statistic, in its own units: (2/π) ∫₀^∞ (1 − φ(t)) / t² dt (exact up to the
        quadrature's 1e-10 relative tolerance; for one axis it is (1 − w) λ)."""
        from scipy.integrate import quad

        out = []
        for s in range(len(self.scales)):
            phi = self._char(s)
            value = quad(lambda t: (1 - phi(t)) / (t * t) if t > 0 else 0.0, 0, np.inf, epsrel=1e-10, limit=400)[0]
            out.append(2 / math.pi * value)
        return out

    def interval(self, level: float = 0.95) -> list[list[float]]:
        """The central ``level`` interval [−q, q] of each statistic's noise (it is symmetric), in its own units:
        P(|noise| ≤ q) = 1 + (2/π) ∫₀^∞ (φ(t) − 1) sin(q t) / t dt (Gil-Pelaez, by Fourier quadrature);
        q = 0 when the atom at 0 (probability Π_k w_k) already holds ``level``."""
        from scipy.integrate import quad
        from scipy.optimize import brentq

        out = []
        for s in range(len(self.scales)):
            phi = self._char(s)
            if np.prod(self.weights) >= level:
                out.append([0.0, 0.0])
                continue

            def within(q, phi=phi):
                tail = quad(lambda t: (phi(t) - 1) / t if t > 0 else 0.0, 0, np.inf, weight="sin", wvar=q,
                            limlst=200)[0]
                return 1 + 2 / math.pi * tail - level

            hi = max(self.expected_abs()[s], 1e-300)
            while within(hi) < 0:
                hi *= 2
            # (at q = 0 the formula is not P(|noise| = 0): the bracket starts just above it, below the level)
            q = brentq(within, hi * 2.0 ** -60, hi, xtol=1e-12 * hi, rtol=1e-12)
            out.append([-q, q])
        return out

    def to_dict(self) -> dict:
        return {"kind": self.kind, "weights": self.weights.tolist(), "scales": self.scales.tolist(),
                "unwhitening": self.unwhitening.tolist()}


def joint_noise(model: JointModel, lam) -> JointNoise:
    """The closed-form deconvolution per whitened axis for target scales λ_k (scalar: every axis).

    w_k = (b_k/λ_k)²; λ_k ≤ b_k adds nothing on that axis (w_k = 1, λ_k = 0).
    """
    lam = np.broadcast_to(np.asarray(lam, dtype=np.float64), (model.d,)).copy()
    if not np.all(np.isfinite(lam) & (lam >= 0)):
        raise InputError("noise scales must be non-negative numbers")
    none = lam <= model.scales
    w = np.where(none, 1.0, (model.scales / np.where(none, 1.0, lam)) ** 2)
    lam = np.where(none, 0.0, lam)
    kind = "none" if none.all() else "laplace_mixture"
    return JointNoise(kind, w, lam, model.unwhitening.copy())


@dataclass(frozen=True)
class JointLambda:
    """Result of :func:`joint_minimal_lambda`.

    t : the common factor, λ_k = t b_k (1 when no noise is needed)
    eps : (m,) verified ε_i of the released densities at t (exact)
    eps_curator : (m,) ε_i of the curator's own model (t = 1)
    binding : row of the binding individual (None without noise)
    noise : JointNoise
    n_evaluated : rows ever evaluated exactly during the search
    """

    t: float
    eps: np.ndarray
    eps_curator: np.ndarray
    binding: int | None
    noise: JointNoise
    n_evaluated: int

    @property
    def scales(self) -> np.ndarray:
        return self.noise.scales


def joint_eps_at(model: JointModel, shifts, t: float) -> np.ndarray:
    """Exact ε_i of the released densities (product Laplace(t b_k) KDEs of the whitened points)."""
    s = _check_shifts(model, shifts)
    T = model.transform / t
    return exact_eps(model.points @ T.T, s @ T.T)


def joint_minimal_lambda(model: JointModel, shifts, epsilon: float, *, rtol: float = 1e-10,
                         max_steps: int = 400) -> JointLambda:
    """Least t with max_i ε_i(t) ≤ ε for the released densities at scales λ_k = t b_k (docs/method.md#102-joint-queries).

    ε_i(t) is non-increasing in t (per axis ℓ_{t b} = ℓ_{t' b} ⋆ ((t'/t)² δ_0 + (1 − (t'/t)²) ℓ_{t b})
    for t' < t, and convolving both densities with one probability law cannot raise their
    log-ratio), and ε_i(t) ≤ M_i / t. So t ∈ [1, max_i M_i/ε], found by geometric bisection; rows
    with M_i/t ≤ ε cannot fail, and a row that passes at an infeasible t passes on the rest of
    the bracket. The result is verified exactly on every row. No noise exactly when the curator
    model itself is ε-private for everyone (max_i ε_i(1) ≤ ε).
    """
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise InputError(f"epsilon must be a positive number; got {epsilon!r}")
    epsilon = target_epsilon(epsilon)
    s = _check_shifts(model, shifts)
    bound = joint_bound(model, s)
    eps1 = joint_eps_at(model, s, 1.0)
    touched = bound > epsilon
    if eps1.max(initial=0.0) <= epsilon:
        return JointLambda(1.0, eps1, eps1, None, joint_noise(model, model.scales), int(touched.sum()))
    lo, hi = 1.0, float(bound.max() / epsilon) * (1 + 1e-12)
    active = np.flatnonzero(eps1 > epsilon)
    for _ in range(max_steps):
        if hi <= lo * (1 + rtol):
            break
        mid = math.sqrt(lo * hi)
        rows = active[bound[active] / mid > epsilon]
        touched[rows] = True
        bad = rows[joint_eps_at(model, s[rows], mid) > epsilon] if len(rows) else rows
        if len(bad):
            lo, active = mid, bad
        else:
            hi = mid
    eps = joint_eps_at(model, s, hi)
    for k in range(max_steps):  # rounding guard at the bracket's end
        if eps.max() <= epsilon:
            break
        hi *= 1 + 4 * rtol * 2.0 ** k
        eps = joint_eps_at(model, s, hi)
    binding = int(active[np.argmax(joint_eps_at(model, s[active], lo))])
    return JointLambda(hi, eps, eps1, binding, joint_noise(model, hi * model.scales), int(touched.sum()))
