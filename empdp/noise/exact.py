"""Exact ε_i(λ) for fixed-scale Laplace KDEs and the minimal scale λ* (docs/method.md#82-the-minimal-scale-exact).

For a reference point set A = {a_j} (the query values q_j) and, per
individual i, the shifted set B_i = {q_j − Δ_ij}, the target densities are
the Laplace KDEs r = A ⋆ ℓ_λ and r_i = B_i ⋆ ℓ_λ. Between consecutive points
of A ∪ B_i both are A e^{x/λ} + B e^{−x/λ}, so r/r_i is monotone there, and
beyond the extreme points it is the constant tail ratio. Hence

    ε_i(λ) = sup_x |log r(x) − log r_i(x)|

is attained at a point of A ∪ B_i and is computed exactly by one sweep over
the sorted union (O(n log n) per individual, vectorised across individuals).

ε_i(λ) is non-increasing in λ: for λ′ < λ, ℓ_λ = ℓ_λ′ ⋆ h with the
probability measure h = (λ′/λ)²δ_0 + (1 − (λ′/λ)²)ℓ_λ (docs/method.md#83-deconvolution-the-noise-law), and
convolving both densities with one probability measure cannot increase the
sup of the log ratio. So {λ : ε_i(λ) ≤ ε} = [λ_i, ∞) and
λ* = max_i λ_i = min{λ : max_i ε_i(λ) ≤ ε} is found by one bisection.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError
from ..params import target_epsilon

log = logging.getLogger(__name__)

#: the largest λ* returned: noise of ~700 scales must still be a finite double
MAX_LAMBDA = 1e300

#: individuals per chunk: bounds memory at ~ 2n × chunk × 8 bytes per array
_CHUNK = 32768


def _as_rows(a, B):
    a = np.asarray(a, dtype=float).ravel()
    B = np.atleast_2d(np.asarray(B, dtype=float))
    if B.shape[1] != a.size:
        raise ValueError(f"B has {B.shape[1]} columns but A has {a.size} points")
    return a, B


def _sorted_union(a, B):
    """Sorted A ∪ B_i per row, returned transposed (2n, m) with an is-A mask."""
    m, n = B.shape
    pts = np.concatenate([np.broadcast_to(a, (m, n)), B], axis=1)
    order = np.argsort(pts, axis=1, kind="stable")
    x = np.take_along_axis(pts, order, axis=1).T.copy()
    from_a = (order < n).T.copy()
    return x, from_a


def laplace_kde_log_ratio(a, B, lam):
    """log r(x) − log r_i(x) at the sorted points of A ∪ B_i (docs/method.md#82-the-minimal-scale-exact).

    Parameters
    ----------
    a : (n,) array_like
        Points of P̂ (the query values q_j).
    B : (m, n) array_like
        Row i holds the points of P̂_i (q_j − Δ_ij).
    lam : float or (m,) array_like
        Laplace scale λ > 0, shared or per row.

    Returns
    -------
    x, d : (2n, m) ndarray
        The sorted union points (column i for individual i) and the log ratio
        there. The value at the largest (smallest) point equals the right
        (left) tail ratio. Entries are ±inf where a KDE underflows, which
        happens only when the true |log ratio| exceeds ~700.
    """
    a, B = _as_rows(a, B)
    lam = np.broadcast_to(np.asarray(lam, dtype=float), (B.shape[0],))
    x, from_a = _sorted_union(a, B)
    k = x.shape[0]
    decay = np.exp(-np.diff(x, axis=0) / lam)  # (2n − 1, m)
    wa = from_a.astype(float)
    wb = 1.0 - wa
    # S(x_k) = Σ_{p ≤ x_k} e^{−(x_k − p)/λ} + Σ_{p > x_k} e^{−(p − x_k)/λ}:
    # a forward and a backward recursion, each term bounded by 1.
    sa = np.empty_like(x)
    sb = np.empty_like(x)
    la, lb = wa[0].copy(), wb[0].copy()
    sa[0], sb[0] = la, lb
    for t in range(1, k):
        la = la * decay[t - 1] + wa[t]
        lb = lb * decay[t - 1] + wb[t]
        sa[t], sb[t] = la, lb
    ra = np.zeros(x.shape[1])
    rb = np.zeros(x.shape[1])
    for t in range(k - 2, -1, -1):
        ra = (ra + wa[t + 1]) * decay[t]
        rb = (rb + wb[t + 1]) * decay[t]
        sa[t] += ra
        sb[t] += rb
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(sa) - np.log(sb)
    return x, d


def laplace_kde_eps(a, B, lam):
    """Exact ε_i(λ) = sup_x |log r − log r_i| for every row of ``B`` (docs/method.md#82-the-minimal-scale-exact).

    Parameters
    ----------
    a : (n,) array_like
        Points of P̂.
    B : (m, n) array_like
        Points of P̂_i, one individual per row.
    lam : float or (m,) array_like
        Laplace scale(s) λ > 0.

    Returns
    -------
    (m,) ndarray
        ε_i(λ); ``inf`` when a density underflows (true value > ~700).
    """
    a, B = _as_rows(a, B)
    m = B.shape[0]
    lam = np.broadcast_to(np.asarray(lam, dtype=float), (m,))
    out = np.empty(m)
    for s in range(0, m, _CHUNK):
        _, d = laplace_kde_log_ratio(a, B[s : s + _CHUNK], lam[s : s + _CHUNK])
        d = np.abs(d)
        d[np.isnan(d)] = np.inf
        out[s : s + _CHUNK] = d.max(axis=0)
    return out


def winf_distance(a, B):
    """Bottleneck (W∞) distance between A and each B_i: the largest gap of the sorted matching.

    ε_i(λ) ≤ W∞(A, B_i)/λ (docs/method.md#82-the-minimal-scale-exact): pair the kernels of the sorted
    samples; each pair's ratio is at most e^{|gap|/λ}.
    """
    a, B = _as_rows(a, B)
    return np.abs(np.sort(B, axis=1) - np.sort(a)).max(axis=1)


def hausdorff_distance(a, B):
    """Hausdorff distance d_H(A, B_i) per row (for comparison only: docs/method.md#111-the-hausdorff-rule-does-not-guarantee-epsilon)."""
    a, B = _as_rows(a, B)
    out = np.empty(B.shape[0])
    for s in range(0, B.shape[0], _CHUNK):
        x, from_a = _sorted_union(a, B[s : s + _CHUNK])
        out[s : s + _CHUNK] = np.maximum(
            _nearest_other(x, from_a), _nearest_other(x, ~from_a)
        )
    return out


def _nearest_other(x, mark):
    """max over marked points of the distance to the nearest unmarked point, per column."""
    k, m = x.shape
    pos = np.arange(k)[:, None]
    prev = np.maximum.accumulate(np.where(~mark, pos, -1), axis=0)
    nxt = np.minimum.accumulate(np.where(~mark, pos, k)[::-1], axis=0)[::-1]
    cols = np.arange(m)
    x_prev = np.where(prev >= 0, x[np.clip(prev, 0, k - 1), cols], -np.inf)
    x_next = np.where(nxt < k, x[np.clip(nxt, 0, k - 1), cols], np.inf)
    dist = np.minimum(x - x_prev, x_next - x)
    return np.where(mark, dist, 0.0).max(axis=0)


@dataclass(frozen=True)
class LambdaSearch:
    """Result of :func:`minimal_lambda` (docs/method.md#82-the-minimal-scale-exact).

    Attributes
    ----------
    lam : float
        λ*, the least Laplace scale with ε_i(λ*) ≤ ε for every row (0 when
        every B_i equals A as a multiset).
    eps : (m,) ndarray
        Verified ε_i(λ*) for every row (exact, no pruning).
    binding : int or None
        Row index of the binding individual (None when λ* = 0).
    lam_winf, lam_hausdorff : float
        max_i W∞_i/ε (valid, loose) and max_i d_H,i/ε (the paper's rule, not valid).
    n_bisected : int
        Individuals that ever needed an exact evaluation (the rest were pruned by W∞).
    """

    lam: float
    eps: np.ndarray
    binding: int | None
    lam_winf: float
    lam_hausdorff: float
    n_bisected: int

    @property
    def eps_max(self) -> float:
        return float(self.eps.max()) if self.eps.size else 0.0


def minimal_lambda(a, B, epsilon, *, rtol=1e-10, max_steps=400,
                   progress: Callable[[str, int, int], None] | None = None):
    """λ* = max_i min{λ : ε_i(λ) ≤ ε} by bracketing and bisection (docs/method.md#82-the-minimal-scale-exact).

    Because every ε_i is non-increasing in λ (module docstring), one search on
    λ serves all individuals. Pruning: at scale λ only rows with
    W∞_i > ελ can fail, and once λ is known infeasible, rows that pass there
    pass on the whole remaining bracket, so the active set shrinks to the
    binding individuals. The answer is verified on every row afterwards.

    Parameters
    ----------
    a : (n,) array_like
        Points of P̂.
    B : (m, n) array_like
        Points of P̂_i (sole contributors must already be excluded).
    epsilon : float
        Target ε > 0.
    rtol : float
        Relative width of the final bracket [λ_lo, λ*].
    progress : callable, optional
        ``progress("lambda search", done, total)`` after each step (total 0
        while the bracket is being found).

    Returns
    -------
    LambdaSearch
    """
    a, B = _as_rows(a, B)
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
    epsilon = target_epsilon(epsilon)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(B))):
        raise ValueError("query values and shifts must be finite")
    winf = winf_distance(a, B)
    with np.errstate(over="ignore"):
        lam_hausdorff = float(hausdorff_distance(a, B).max(initial=0.0) / epsilon)
        hi = float(winf.max(initial=0.0) / epsilon)
    if not hi <= MAX_LAMBDA:
        raise InputError(f"`epsilon` {epsilon:g} is too small for these data: the noise scale would be "
                         f"{hi:.3g} (the largest shift over epsilon), above {MAX_LAMBDA:g}, so noisy values would "
                         "overflow; use a larger epsilon", param="epsilon")
    lam_winf = hi
    if hi == 0.0:
        return LambdaSearch(0.0, np.zeros(B.shape[0]), None, 0.0, lam_hausdorff, 0)

    touched = np.zeros(B.shape[0], bool)
    report = progress or (lambda stage, done, total: None)
    step = 0

    def failing(lam, rows):
        nonlocal step
        rows = rows[winf[rows] > epsilon * lam]
        touched[rows] = True
        eps = laplace_kde_eps(a, B[rows], lam)
        bad = rows[eps > epsilon]
        step += 1
        log.debug("lambda %.9g: %d of %d rows evaluated, %d above epsilon", lam, rows.size, B.shape[0], bad.size)
        return bad

    active = np.flatnonzero(winf > 0)
    lo = hi / 2
    report("lambda search", 0, 0)
    for _ in range(max_steps):  # bracket: halve until some row fails
        bad = failing(lo, active)
        report("lambda search", step, 0)
        if bad.size:
            active = bad
            break
        hi, lo = lo, lo / 2
    else:  # pragma: no cover - W∞ > 0 forces ε_i(λ) → ∞ as λ → 0
        raise RuntimeError("could not bracket λ*")
    # each geometric bisection halves log(hi/lo); +1 for the final verification
    total = step + max(0, math.ceil(math.log2(math.log(hi / lo) / math.log1p(rtol)))) + 1
    for _ in range(max_steps):
        if hi <= lo * (1 + rtol):
            break
        mid = float(np.sqrt(lo * hi))
        bad = failing(mid, active)
        report("lambda search", step, total)
        if bad.size:
            lo, active = mid, bad
        else:
            hi = mid
    eps = laplace_kde_eps(a, B, hi)
    for k in range(max_steps):  # guard against rounding at the bracket end: steps of 4·rtol, doubling
        if eps.max() <= epsilon:
            break
        hi *= 1 + 4 * rtol * 2.0 ** k
        eps = laplace_kde_eps(a, B, hi)
    else:  # pragma: no cover - ε ≤ MAX_EPSILON keeps every ε_i(λ) computable
        raise RuntimeError(f"could not verify lambda* near {hi:.6g} for epsilon {epsilon:g}")
    binding = int(active[np.argmax(laplace_kde_eps(a, B[active], lo))])
    report("lambda search", total, total)
    return LambdaSearch(hi, eps, binding, lam_winf, lam_hausdorff, int(touched.sum()))
