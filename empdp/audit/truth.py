"""Exact privacy values of the reference mechanisms (closed forms and exact numerics).

Closed forms: Laplace and Gaussian Rényi divergences, the exponential
mechanism's ε (Askin et al. 2022, section V), randomized response. Exact
numerics on a fixed pair: output distributions of Report Noisy Max and of
SVT with c = 1 (one-dimensional integrals over the threshold noise), the
Poisson-binomial law of shuffled randomized response, and the Gaussian or
Laplace mixtures produced by Poisson subsampling.
"""

from __future__ import annotations

import importlib
import math
import warnings

import numpy as np


def _scipy(name: str):
    """A scipy submodule, imported on first use: the true values of most mechanisms need none, and
    importing scipy.stats/integrate/optimize costs the audit command about a second."""
    return importlib.import_module(f"scipy.{name}")


# ----------------------------------------------------------------------------- closed forms

def laplace_renyi(order: float, eps: float) -> float:
    """D_α between Lap(0, b) and Lap(Δ, b) with ε = Δ/b (Mironov 2017, Prop. 6)."""
    a = float(order)
    if eps == 0:
        return 0.0
    if math.isinf(a):
        return eps
    if a == 1:
        return eps + math.expm1(-eps)
    eps = abs(eps)  # log[a/(2a−1) e^{(a−1)ε} + (a−1)/(2a−1) e^{−aε}] with e^{(a−1)ε} taken out
    return eps + math.log(a / (2 * a - 1) + (a - 1) / (2 * a - 1) * math.exp(-(2 * a - 1) * eps)) / (a - 1)


def gaussian_renyi(order: float, delta: float, sigma: float) -> float:
    """D_α between N(0, σ²) and N(Δ, σ²): αΔ²/(2σ²)."""
    return order * delta ** 2 / (2 * sigma ** 2)


def rr_renyi(order: float, p: float) -> float:
    """D_α of binary randomized response with keep probability p."""
    a = order
    return math.log(p ** a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1)


def exponential_epsilon(lam: float) -> float:
    """ε of the exponential mechanism on s ∈ [1, 2], t ≥ 0, density ∝ exp(−λ|s − t|)."""
    return lam + math.log(2 - math.exp(-2 * lam)) - math.log(2 - math.exp(-lam))


def exponential_lambda(eps: float) -> float:
    """The λ at which the exponential mechanism is exactly ε-DP (ε ∈ [λ, 2λ])."""
    return _scipy("optimize").brentq(lambda lam: exponential_epsilon(lam) - eps, eps / 2 * 0.999, eps * 1.001,
                           xtol=1e-14, rtol=1e-14)


def exponential_pair_epsilon(s: float, s2: float, lam: float) -> float:
    """sup_t |log f_s(t) − log f_s2(t)| for the exponential mechanism (piecewise linear in t)."""
    def log_z(v):
        return math.log((2 - math.exp(-lam * v)) / lam)

    cand = [0.0, s, s2]
    diffs = [abs(-lam * abs(s - t) + lam * abs(s2 - t) - log_z(s) + log_z(s2)) for t in cand]
    diffs.append(abs(lam * (s - s2) - log_z(s) + log_z(s2)))  # t → ∞
    return max(diffs)


def noisy_gd_moments(xbar: float, sigma: float, lr: float, steps: int, theta0: float = 0.0):
    """Mean and sd of θ_K of noisy GD on ½(θ − x)² (a Gaussian: the recursion is linear)."""
    r = 1.0 - lr
    mean = xbar + (theta0 - xbar) * r ** steps
    var = 2 * lr * sigma ** 2 * sum(r ** (2 * k) for k in range(steps))
    return mean, math.sqrt(var)


# ----------------------------------------------------------------------------- discrete laws

def discrete_epsilon(p: np.ndarray, q: np.ndarray) -> float:
    """max_k |log p_k − log q_k| (∞ when one law charges a point the other does not)."""
    return max(loss_range(p, q))


def loss_range(p: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(max_k, −min_k) of log p_k − log q_k, each at least 0 (∞ where only one law charges a point):
    the privacy loss's range in each direction, which adds over independent outputs."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    tiny = 1e-300  # below it a probability is 0
    both = (p > tiny) & (q > tiny)
    loss = np.log(p[both]) - np.log(q[both])
    up = math.inf if np.any((p > tiny) & ~both) else float(loss.max(initial=0.0))
    down = math.inf if np.any((q > tiny) & ~both) else float(-loss.min(initial=0.0))
    return up, down


def discrete_renyi(order: float, p: np.ndarray, q: np.ndarray) -> float:
    """D_α(p ‖ q) = log Σ p^α q^{1−α} / (α − 1) for probability vectors on the same points."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    if np.any((p > 0) & (q <= 0)):
        return math.inf
    m = p > 0
    return float(_scipy("special").logsumexp(order * np.log(p[m]) + (1 - order) * np.log(q[m])) / (order - 1))


def rr_pmf(bits, p: float) -> np.ndarray:
    """Law of the randomized-response output vector (outcomes in binary order of the bits)."""
    out = np.array([1.0])
    for b in np.atleast_1d(np.asarray(bits)).astype(int):
        out = np.kron(out, np.array([p, 1 - p]) if b == 0 else np.array([1 - p, p]))
    return out


def shuffled_rr_pmf(bits, p: float) -> np.ndarray:
    """Law of the number of ones after binary RR (Poisson binomial), on 0..m."""
    out = np.array([1.0])
    for b in np.atleast_1d(np.asarray(bits)).astype(int):
        one = p if b == 1 else 1 - p
        out = np.convolve(out, [1 - one, one])
    return out


def segment_edges(breaks, lo: float, hi: float, width: float) -> np.ndarray:
    """Points from ``lo`` to ``hi`` through every break between them, no two more than ``width`` apart."""
    cuts = sorted({lo, hi} | {float(b) for b in breaks if lo < b < hi})
    edges = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        k = max(1, int(math.ceil((b - a) / width)))
        edges.extend(np.linspace(a, b, k + 1)[:-1].tolist())
    edges.append(hi)
    return np.array(edges)


def _segment_nodes(breaks, lo: float, hi: float, width: float, order: int = 48):
    """Gauss-Legendre nodes and weights on [lo, hi], split at ``breaks`` and every ``width``.

    The integrands below are smooth between their kinks (the noise centres),
    so piecewise Gauss-Legendre is exact to rounding; vectorised, no quad loop.
    """
    edges = segment_edges(breaks, lo, hi, width)
    x, w = np.polynomial.legendre.leggauss(order)
    mid, half = (edges[1:] + edges[:-1]) / 2, (edges[1:] - edges[:-1]) / 2
    return (mid[:, None] + half[:, None] * x[None, :]).ravel(), (half[:, None] * w[None, :]).ravel()


def _laplace_logcdf(z):
    return np.where(z < 0, z - math.log(2), np.log1p(-0.5 * np.exp(-np.abs(z))))


def _laplace_logsf(z):
    return _laplace_logcdf(-z)


def noisy_max_pmf(q, scale: float) -> np.ndarray:
    """P(argmax_i (q_i + Lap(scale)) = k), k = 1..m: ∫ f_k(t) Π_{i≠k} F_i(t) dt."""
    q = np.atleast_1d(np.asarray(q, float))
    t, w = _segment_nodes(q, q.min() - 60 * scale, q.max() + 60 * scale, scale / 2)
    z = (t[:, None] - q[None, :]) / scale
    logcdf = _laplace_logcdf(z)
    logpdf = -np.abs(z) - math.log(2 * scale)
    total = logcdf.sum(axis=1, keepdims=True)
    return w @ np.exp(logpdf + total - logcdf)


def svt_pmf(q, rho_scale: float, nu_scale: float, threshold: float = 1.0) -> np.ndarray:
    """Law of SVT with c = 1: P(first answer above at query k), k = 1..m, then P(none above).

    Conditional on the threshold noise ρ = r the answers are independent:
    P(k) = ∫ p_ρ(r) Π_{i<k} F_ν(T + r − q_i) (1 − F_ν(T + r − q_k)) dr.
    """
    q = np.atleast_1d(np.asarray(q, float))
    m = q.size
    big = max(rho_scale, nu_scale)
    breaks = [0.0] + [float(v - threshold) for v in q]
    r, w = _segment_nodes(breaks, min(breaks) - 60 * big, max(breaks) + 60 * big,
                          min(rho_scale, nu_scale) / 2)
    log_rho = -np.abs(r) / rho_scale - math.log(2 * rho_scale)
    z = (threshold + r[:, None] - q[None, :]) / nu_scale
    log_below, log_above = _laplace_logcdf(z), _laplace_logsf(z)
    prefix = np.concatenate([np.zeros((len(r), 1)), np.cumsum(log_below, axis=1)], axis=1)
    logs = np.concatenate([prefix[:, :m] + log_above, prefix[:, m:]], axis=1)
    return w @ np.exp(log_rho[:, None] + logs)


def svt5_law(q, rho_scale: float, threshold: float = 1.0) -> dict:
    """Law of SVT5's answers 1{q_i ≥ T + ρ} (no query noise), as {answers: probability}.

    The answers are the queries at or above a cut: with v_1 < … < v_k the distinct
    values of q, ρ ∈ (v_{j−1} − T, v_j − T] gives "q_i ≥ v_j" and ρ > v_k − T gives
    none above. Every one of these k + 1 answer vectors has positive probability
    (ρ is Laplace), and no other vector occurs: the support is exact even where a
    probability underflows.
    """
    q = np.atleast_1d(np.asarray(q, float))
    vals = np.unique(q)
    edges = np.concatenate([[-np.inf], vals - threshold, [np.inf]])
    lo, hi = edges[:-1], edges[1:]
    cdf, sf = _scipy("stats").laplace.cdf, _scipy("stats").laplace.sf  # upper intervals by sf: no cancellation
    mass = np.where(lo >= 0, sf(lo, scale=rho_scale) - sf(hi, scale=rho_scale),
                    cdf(hi, scale=rho_scale) - cdf(lo, scale=rho_scale))
    patterns = [tuple((q >= v).astype(int).tolist()) for v in vals] + [(0,) * q.size]
    return dict(zip(patterns, mass.tolist()))


def svt5_pair_values(x, y, rho_scale: float, order: float | None = None, threshold: float = 1.0):
    """ε_{x,y} (``order`` None) or D_α(M(x) ‖ M(y)) of SVT5, or None when not exactly computable.

    ∞ exactly when the supports differ (in the direction of D_α: x charges an
    answer vector that y cannot give); otherwise from the two laws, unless a
    probability underflowed to 0 (then the value is not known exactly).
    """
    px, py = svt5_law(x, rho_scale, threshold), svt5_law(y, rho_scale, threshold)
    if order is None and set(px) != set(py):
        return math.inf
    if order is not None and not set(px) <= set(py):
        return math.inf
    keys = sorted(set(px) | set(py))
    p, r = np.array([px.get(k, 0.0) for k in keys]), np.array([py.get(k, 0.0) for k in keys])
    if np.any(p[[k in px for k in keys]] <= 0) or np.any(r[[k in py for k in keys]] <= 0):
        return None
    return discrete_epsilon(p, r) if order is None else discrete_renyi(order, p, r)


# ----------------------------------------------------------------------------- continuous laws

def noisy_max_value_epsilon(v, w, scale: float) -> float:
    """sup_t |log f_v − log f_w| for max_i(v_i + Lap(scale)) (Askin et al. 2022, Example 1)."""
    v, w = np.atleast_1d(np.asarray(v, float)), np.atleast_1d(np.asarray(w, float))
    t = np.linspace(min(v.min(), w.min()) - 40 * scale, max(v.max(), w.max()) + 40 * scale, 40001)

    def logf(u):
        z = (t[:, None] - u[None, :]) / scale
        logcdf = _laplace_logcdf(z)
        logpdf = -np.abs(z) - math.log(2 * scale)
        return _scipy("special").logsumexp(logpdf - logcdf, axis=1) + logcdf.sum(axis=1)

    grid = float(np.max(np.abs(logf(v) - logf(w))))
    left = abs((w.sum() - v.sum()) / scale)  # t → −∞: all components in their left tails
    right = abs(_scipy("special").logsumexp(v / scale) - _scipy("special").logsumexp(w / scale))  # t → +∞
    return max(grid, left, right)


def _subsample_law(x, q: float):
    """Support and weights of Σ_i B_i x_i with B_i ~ Bernoulli(q) independent."""
    law = {0.0: 1.0}
    for xi in np.atleast_1d(np.asarray(x, float)):
        new: dict[float, float] = {}
        for s, w in law.items():
            new[s] = new.get(s, 0.0) + w * (1 - q)
            new[s + xi] = new.get(s + xi, 0.0) + w * q
        law = new
    support = np.array(sorted(law))
    return support, np.array([law[s] for s in support])


def _mixture_logpdf(noise: str, t, support, weights, scale):
    t = np.atleast_1d(np.asarray(t, float))
    if noise == "laplace":
        comp = -np.abs(t[:, None] - support[None, :]) / scale - math.log(2 * scale)
    else:
        comp = _scipy("stats").norm.logpdf(t[:, None], loc=support[None, :], scale=scale)
    with np.errstate(divide="ignore"):  # q = 1 gives zero weights: log 0 = −∞ drops them exactly
        log_w = np.log(weights)
    return _scipy("special").logsumexp(comp + log_w[None, :], axis=1)


def mixture_renyi(noise: str, order: float, x, y, q: float, scale: float) -> float:
    """D_α(M(x) ‖ M(y)) for the Poisson-subsampled sum plus Laplace/Gaussian noise, by quadrature."""
    sx, wx = _subsample_law(x, q)
    sy, wy = _subsample_law(y, q)
    pts = sorted(set(sx.tolist()) | set(sy.tolist()))
    span = pts[-1] - pts[0]
    pad = (60 + 2 * order * span / scale) * scale
    lo, hi = pts[0] - pad, pts[-1] + pad

    def log_integrand(t):
        return order * _mixture_logpdf(noise, t, sx, wx, scale) + (1 - order) * _mixture_logpdf(noise, t, sy, wy, scale)

    top = float(np.max(log_integrand(np.linspace(lo, hi, 20001))))  # scale: high orders overflow e^x

    def integrand(t):
        return math.exp(log_integrand(t)[0] - top)

    with warnings.catch_warnings():  # at α in the hundreds quad reports round-off near 1e-12
        warnings.simplefilter("ignore", _scipy("integrate").IntegrationWarning)
        val = _scipy("integrate").quad(integrand, lo, hi, points=pts, limit=500, epsabs=1e-14, epsrel=1e-12)[0]
    return (top + math.log(val)) / (order - 1)


def mixture_epsilon(noise: str, x, y, q: float, scale: float) -> float:
    """sup_t |log ratio| for subsampled Laplace: attained at a support point or in a tail.

    Between support points both densities are A e^{t/b} + B e^{−t/b}, so their
    ratio is monotone there (the same Möbius argument as docs/method.md#82-the-minimal-scale-exact).
    """
    if noise != "laplace":
        return math.inf
    sx, wx = _subsample_law(x, q)
    sy, wy = _subsample_law(y, q)
    pts = np.array(sorted(set(sx.tolist()) | set(sy.tolist())))
    at = np.abs(_mixture_logpdf(noise, pts, sx, wx, scale) - _mixture_logpdf(noise, pts, sy, wy, scale))
    left = abs(_scipy("special").logsumexp(sx / scale, b=wx) - _scipy("special").logsumexp(sy / scale, b=wy))
    right = abs(_scipy("special").logsumexp(-sx / scale, b=wx) - _scipy("special").logsumexp(-sy / scale, b=wy))
    return float(max(at.max(), left, right))


# ----------------------------------------------------------------------------- (ε, δ) curves

def gaussian_delta(eps: float, shift: float, sd: float) -> float:
    """δ(ε) = sup_S P(N(Δ, σ²) ∈ S) − e^ε P(N(0, σ²) ∈ S) (Balle & Wang 2018, Thm 8).

    δ(ε) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), written as
    Φ(a)·(1 − exp(ε + log Φ(b) − log Φ(a))) so that it keeps its relative
    precision where both terms are tiny (large ε).
    """
    special = _scipy("special")
    if shift == 0:
        return 0.0
    r = abs(shift) / sd
    a, b = r / 2 - eps / r, -r / 2 - eps / r
    log_a = float(special.log_ndtr(a))
    return float(math.exp(log_a) * -math.expm1(eps + float(special.log_ndtr(b)) - log_a))


def gaussian_epsilon_delta(delta: float, shift: float, sd: float) -> float:
    """The smallest ε with δ(ε) ≤ ``delta`` for N(Δ, σ²) vs N(0, σ²) (the analytic Gaussian; 0 when
    already the total variation distance δ(0) is at most ``delta``), by root finding on ε."""
    if gaussian_delta(0.0, shift, sd) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(hi, shift, sd) > delta:  # δ(ε) falls like e^{-ε²σ²/(2Δ²)}: a few doublings
        hi *= 2
    return _scipy("optimize").brentq(lambda e: gaussian_delta(e, shift, sd) - delta, 0.0, hi,
                                     xtol=1e-13, rtol=1e-13)


def laplace_epsilon_delta(delta: float, eps: float) -> float:
    """ε(δ) of the Laplace mechanism with pure ε = Δ/b: δ(ε) = 1 − e^{(ε − ε₀)/2} on [0, ε₀], so
    ε(δ) = max(0, ε₀ + 2 log(1 − δ))."""
    return max(0.0, eps + 2 * math.log1p(-delta))
