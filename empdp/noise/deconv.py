"""Noise h by deconvolution of the curator kernel: k ⋆ h = ℓ_λ (docs/method.md#83-deconvolution-the-noise-law).

- Laplace curator kernel of scale b < λ: closed form
  h = w·δ_0 + (1 − w)·Laplace(λ), w = (b/λ)²; b ≥ λ: h = δ_0.
- Any kernel: numerical Fourier deconvolution ĥ = F ℓ_λ / F k with a check
  that ĥ is the transform of a probability measure (|ĥ| ≤ 1, no negative
  mass). It reproduces the closed form for a Laplace kernel and reports
  infeasibility for a Gaussian kernel, where ĥ grows like e^{σ²ω²/2}.
- Gaussian curator kernel: the feasible family h = w·δ_0 + (1 − w)·ℓ_λ′,
  searched for the least expected |noise| whose ε over P̂ ⋆ k ⋆ h is
  verified (docs/method.md#83-deconvolution-the-noise-law, last item).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
from scipy.special import logsumexp

from .. import kernels
from .exact import laplace_kde_eps, winf_distance

log = logging.getLogger(__name__)
_GAUSSIAN = kernels.Gaussian()


@dataclass(frozen=True)
class NoiseSpec:
    """The release noise h = w·δ_0 + (1 − w)·Laplace(scale) (docs/method.md#83-deconvolution-the-noise-law).

    ``kind`` is ``"none"`` (h = δ_0), ``"laplace"`` (w = 0) or
    ``"laplace_mixture"`` (0 < w < 1).
    """

    kind: str
    weight_zero: float
    scale: float

    @classmethod
    def mixture(cls, weight_zero: float, scale: float) -> "NoiseSpec":
        if scale <= 0 or weight_zero >= 1:
            return cls("none", 1.0, 0.0)
        if weight_zero <= 0:
            return cls("laplace", 0.0, float(scale))
        return cls("laplace_mixture", float(weight_zero), float(scale))

    @property
    def expected_abs(self) -> float:
        """E|y| = (1 − w)·λ (docs/method.md#83-deconvolution-the-noise-law)."""
        return (1.0 - self.weight_zero) * self.scale

    def to_dict(self) -> dict:
        return asdict(self)


def laplace_closed_form(b: float, lam: float) -> NoiseSpec:
    """h with ℓ_b ⋆ h = ℓ_λ: w·δ_0 + (1 − w)·ℓ_λ, w = (b/λ)²; δ_0 when b ≥ λ (docs/method.md#83-deconvolution-the-noise-law).

    F ℓ_λ / F ℓ_b = (1 + b²ω²)/(1 + λ²ω²) = w + (1 − w)/(1 + λ²ω²).
    """
    if lam <= 0 or b >= lam:
        return NoiseSpec.mixture(1.0, 0.0)
    return NoiseSpec.mixture((b / lam) ** 2, lam)


def characteristic_function(kind, scale: float):
    """F k(ω) of a centred kernel (object or name): Laplace 1/(1 + b²ω²), Gaussian e^{−σ²ω²/2}."""
    return kernels.kernel(kind).characteristic(scale)


@dataclass(frozen=True)
class Deconvolution:
    """Result of :func:`fourier_deconvolve`.

    Attributes
    ----------
    feasible : bool
        Whether ĥ is (numerically) the transform of a probability measure.
    reason : str
        Why not, or ``"ok"``.
    weight_zero : float
        Atom at 0: the limit of ĥ(ω) at high frequency.
    x, density : ndarray
        Grid and continuous part of h (integrates to 1 − weight_zero).
    max_abs_transform, negative_mass : float
        max |ĥ| (must be ≤ 1) and ∫ (continuous part)_− dx.
    """

    feasible: bool
    reason: str
    weight_zero: float
    x: np.ndarray
    density: np.ndarray
    max_abs_transform: float
    negative_mass: float


def fourier_deconvolve(kernel, scale, lam, *, points_per_scale=256, width_scales=80, max_points=2**21,
                       tol=1e-4):
    """Numerical deconvolution ĥ = F ℓ_λ / F k on an FFT grid (docs/method.md#83-deconvolution-the-noise-law, Diggle & Hall 1993).

    Parameters
    ----------
    kernel : Kernel or its name
        The curator kernel k (:mod:`empdp.kernels`).
    scale : float
        Its scale (b or σ).
    lam : float
        Target Laplace scale λ.
    points_per_scale, width_scales, max_points : int
        Grid spacing min(scale, λ)/points_per_scale and half-width
        width_scales·max(scale, λ), coarsened to at most max_points points.
    tol : float
        Tolerance of the feasibility checks (|ĥ| ≤ 1 + tol, negative mass ≤ tol).

    Returns
    -------
    Deconvolution
    """
    half_width = width_scales * max(scale, lam)
    dx = max(min(scale, lam) / points_per_scale, 2 * half_width / max_points)
    n = int(2 ** np.ceil(np.log2(2 * half_width / dx)))
    x = (np.arange(n) - n // 2) * dx
    omega = 2 * np.pi * np.fft.fftfreq(n, dx)
    with np.errstate(over="ignore", divide="ignore"):
        hhat = (1.0 / (1.0 + (lam * omega) ** 2)) / characteristic_function(kernel, scale)(omega)
    finite = np.isfinite(hhat)
    max_abs = float(np.abs(hhat).max()) if finite.all() else float("inf")
    nyq = np.argmax(np.abs(omega))
    if not finite.all() or max_abs > 1 + tol:
        over = np.abs(omega[~finite | (np.abs(hhat) > 1 + tol)]).min()
        reason = (
            f"|F l_lambda / F k| exceeds 1 from |omega| = {over:.3g} on (max {max_abs:.3g}): "
            "not the transform of a probability measure (docs/method.md#112-a-gaussian-curator-kernel-cannot-be-deconvolved)"
        )
        return Deconvolution(False, reason, float("nan"), x, np.full(n, np.nan), max_abs, float("nan"))
    # A non-vanishing plateau of ĥ at high frequency is an atom at 0 (Riemann–Lebesgue).
    w = float(hhat[nyq].real)
    density = np.fft.fftshift(np.fft.ifft(hhat - w).real) / dx
    neg = float(-np.minimum(density, 0).sum() * dx)
    if w < -tol:
        return Deconvolution(False, f"negative atom weight {w:.3g}", w, x, density, max_abs, neg)
    if neg > tol:
        return Deconvolution(False, f"negative mass {neg:.3g} in h", w, x, density, max_abs, neg)
    return Deconvolution(True, "ok", max(w, 0.0), x, density, max_abs, neg)


# --- Gaussian curator kernel: the feasible family (docs/method.md#83-deconvolution-the-noise-law) -------------------------


def log_smoothed_kernel(u, sigma, w, lam):
    """log of k′ = w·g_σ + (1 − w)·(g_σ ⋆ ℓ_λ), the kernel of P̂ ⋆ k ⋆ h for Gaussian k (0 ≤ w < 1, λ > 0):
    :meth:`empdp.kernels.Gaussian.smoothed_logpdf`, the one copy (calibration certifies ε with it
    and the release audit computes the exact values with it)."""
    return _GAUSSIAN.smoothed_logpdf(u, sigma, w, lam)


def _tail_start(sigma, w, lam, eta=1e-12):
    """T with |k′(u)/(C e^{−u/λ}) − 1| ≤ η for all u ≥ T (the Laplace tail regime)."""
    log_c = -np.log(2 * lam) + 0.5 * (sigma / lam) ** 2 + np.log1p(-w)
    t = sigma * sigma / lam + sigma
    while True:
        dev = abs(np.expm1(log_smoothed_kernel(t, sigma, w, lam) - log_c + t / lam))
        if dev <= eta:  # every deviation term decreases for u > σ²/λ
            return t
        t *= 1.25


def _log_lipschitz(sigma, w, lam, t):
    """L = sup_u |(log k′)′(u)| (numerically, with 5% margin; exactly 1/λ when w = 0)."""
    if w <= 0:
        return 1.0 / lam
    du = min(sigma, lam) / 400
    u = np.arange(0.0, t + du, du)
    slope = np.abs(np.diff(log_smoothed_kernel(u, sigma, w, lam))).max() / du
    return 1.05 * max(slope, 1.0 / lam)


def smoothed_eps_bound(a, B, sigma, w, lam, *, epsilon, slack, stop_early=False):
    """Certified upper bounds on sup_x |log(P̂⋆k′) − log(P̂_i⋆k′)| per row.

    On a uniform grid of spacing slack/L the log ratio D has |D′| ≤ 2L, so
    sup ≤ max_grid |D| + slack (plus the interpolation error of the tabulated
    log k′). Beyond the grid (≥ T past every point) D is
    within 4η of the Laplace tail ratio. Rows with L·W∞_i ≤ bound are
    certified by pairing without evaluation; so are, for w = 0, rows with
    exact Laplace ε_i(λ) ≤ ε (P̂⋆g⋆ℓ_λ is a post-processing of P̂⋆ℓ_λ).
    Only rows whose cheap bound exceeds ``epsilon`` are evaluated on the grid;
    with ``stop_early`` the evaluation stops at the first row above
    ``epsilon`` and the rows not reached get ``inf``.
    """
    a = np.asarray(a, float)
    B = np.atleast_2d(np.asarray(B, float))
    t = _tail_start(sigma, w, lam)
    big_l = _log_lipschitz(sigma, w, lam, t)
    out = big_l * winf_distance(a, B)
    if w <= 0:
        out = np.minimum(out, laplace_kde_eps(a, B, lam))
    rows = np.flatnonzero(out > epsilon)
    if rows.size == 0:
        return out
    lo = min(a.min(), B[rows].min()) - t
    hi = max(a.max(), B[rows].max()) + t
    step = slack / big_l
    size = int(np.ceil((hi - lo) / step)) + 1
    # log k′ tabulated at spacing `step` and linearly interpolated: error ≤ step²/8·sup|(log k′)″|.
    # The grid x_g = lo + g·step shares the spacing, so for a point p every x_g − p sits at the
    # same fraction between two table entries: one gather per point, no search.
    u0 = -(hi - lo) - 2 * step
    table = log_smoothed_kernel(u0 + step * np.arange(2 * size + 4), sigma, w, lam)
    interp_err = 1.05 * np.abs(np.diff(table, 2)).max() / 8
    offsets = np.arange(size)

    def log_kde(points):
        pos = (lo - points - u0) / step
        i = np.floor(pos).astype(np.int64)
        f = (pos - i)[..., None]
        idx = i[..., None] + offsets
        vals = (1 - f) * table[idx] + f * table[idx + 1]
        top = vals.max(axis=-2, keepdims=True)
        return (np.log(np.exp(vals - top).sum(axis=-2, keepdims=True)) + top)[..., 0, :]

    log_pa = log_kde(a)
    tails = np.maximum(
        np.abs(logsumexp(a / lam) - logsumexp(B[rows] / lam, axis=1)),
        np.abs(logsumexp(-a / lam) - logsumexp(-B[rows] / lam, axis=1)),
    )
    # riskiest rows first, in growing chunks, so that a failing scale is rejected early
    order = np.argsort(-out[rows], kind="stable")
    rows, tails = rows[order], tails[order]
    cap = max(1, int(4e6 // (size * a.size)))
    s, chunk = 0, 1
    while s < rows.size:
        r = rows[s : s + chunk]
        log_pb = log_kde(B[r])
        grid_max = np.abs(log_pa - log_pb).max(axis=1) + slack + 2 * interp_err
        tail = tails[s : s + chunk] + 4.1e-12
        out[r] = np.minimum(out[r], np.maximum(grid_max, tail))
        s, chunk = s + chunk, min(2 * chunk, cap)
        if stop_early and out[r].max() > epsilon:
            out[rows[s:]] = np.inf  # not evaluated: the scale already fails
            break
    return out


@dataclass(frozen=True)
class Fallback:
    """Chosen member of the feasible family and its verified ε (docs/method.md#83-deconvolution-the-noise-law)."""

    noise: NoiseSpec
    eps: np.ndarray
    slack: float

    @property
    def eps_max(self) -> float:
        return float(self.eps.max()) if self.eps.size else 0.0


def gaussian_fallback(a, B, sigma, epsilon, lam_star, *, weights=(0.0, 0.5, 0.75, 0.9, 0.97), rtol=3e-3,
                      progress: Callable[[str, int, int], None] | None = None):
    """Least-E|y| member of {w·δ_0 + (1 − w)·ℓ_λ′} whose ε over P̂ ⋆ g_σ ⋆ h is verified ≤ ε.

    h = ℓ_{λ*} (w = 0) always qualifies, since P̂ ⋆ g ⋆ ℓ_λ* is a
    post-processing of P̂ ⋆ ℓ_λ*; each w is then searched by bisection on λ′
    below the best expected |noise| found so far. Verification uses
    :func:`smoothed_eps_bound` with a grid slack of 1e-2·ε (so λ′ may exceed the
    least feasible value by about 1%).

    Parameters
    ----------
    a, B : array_like
        P̂ (n,) and P̂_i (m, n).
    sigma : float
        Gaussian curator bandwidth.
    epsilon, lam_star : float
        Target ε and the exact Laplace λ* of :func:`~empdp.noise.exact.minimal_lambda`.
    progress : callable, optional
        ``progress("Gaussian fallback", done, total)``, one step per weight w.
    """
    report = progress or (lambda stage, done, total: None)
    report("Gaussian fallback", 0, len(weights))
    slack = 1e-2 * epsilon
    B = np.atleast_2d(np.asarray(B, float))
    if lam_star <= 0:
        lam_star = max(sigma, 1e-300)  # identical point sets: any Laplace tail works

    def ok(w, lam):
        e = smoothed_eps_bound(a, B, sigma, w, lam, epsilon=epsilon, slack=slack, stop_early=True)
        return e.max(initial=0.0) <= epsilon, e

    best = NoiseSpec.mixture(0.0, lam_star)
    best_eps = smoothed_eps_bound(a, B, sigma, 0.0, lam_star, epsilon=epsilon, slack=slack)
    for done, w in enumerate(weights, 1):
        cap = best.expected_abs / (1 - w)  # largest λ′ that would still improve
        good, e = ok(w, cap)
        if not good:
            log.debug("fallback w = %g: no lambda' <= %.6g improves on E|y| = %.6g", w, cap, best.expected_abs)
            report("Gaussian fallback", done, len(weights))
            continue
        hi, hi_eps, lo = cap, e, cap / 2
        for _ in range(30):
            good, e = ok(w, lo)
            if not good:
                break
            hi, hi_eps, lo = lo, e, lo / 2
        while hi > lo * (1 + rtol):
            mid = float(np.sqrt(lo * hi))
            good, e = ok(w, mid)
            if good:
                hi, hi_eps = mid, e
            else:
                lo = mid
        log.debug("fallback w = %g: least verified lambda' %.6g, E|y| = %.6g", w, hi, (1 - w) * hi)
        if (1 - w) * hi < best.expected_abs:
            best, best_eps = NoiseSpec.mixture(w, hi), hi_eps
        report("Gaussian fallback", done, len(weights))
    return Fallback(best, best_eps, slack)
