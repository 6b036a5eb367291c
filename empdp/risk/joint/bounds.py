"""Certified bounds on δ_i(ε) and ε_i of a joint query, O(n d) per individual
(docs/method.md#102-joint-queries, issue 37).

Scaled coordinates u = T x, where each kernel is 2^{−d} e^{−|u − a_j|_1} and individual i moves
database j's point by s_ij = T Δ_ij (l_ij = |s_ij|_1).

* **Upper bound on δ_i(ε), term by term.** p̂ − e^ε p̂_i = (1/n) Σ_j (K_{a_j} − e^ε K_{b_j}) and the
  positive part of a sum is at most the sum of the positive parts, so each side of δ_i is at most
  (1/n) Σ_j g_j(e^ε), g_j(t) = ∫ (K_{a_j} − t K_{b_j})_+. Each g_j is convex in t, equals the total
  variation TV_j at t = 1 and vanishes from t = e^{l_ij} on (the pair's ratio is within e^{±l_ij}),
  so g_j(t) ≤ TV_j (e^{l_ij} − t)/(e^{l_ij} − 1) on [1, e^{l_ij}]; and TV_j ≤ 1 − e^{−l_ij/2} (a
  product of d one-dimensional Laplace pairs, each of total variation 1 − e^{−|s|/2}: the coupling
  inequality). The same holds for the other side (the bound is symmetric in the pair).
* **Upper bound on δ_i(ε), the whole mixture.** δ_i is convex in t = e^ε, at most
  TV(p̂, p̂_i) ≤ (1/n) Σ_j TV_j at t = 1 and 0 from t = e^{ε_i} on, so it lies below that chord
  (with ε_i exact where it is known, else the screening bound M_i = max_j l_ij ≥ ε_i).
* **Lower bound on ε_i.** ε_i = sup |L| ≥ |L(u)| at any u: at the 2^d far corners (beyond every
  kink, L is the constant log Σ_j e^{σ·a_j} − log Σ_j e^{σ·b_j}) and at the kinks a_j, b_j of the
  databases the individual moves most.

The bounds decide most individuals; the assessment evaluates exactly only those whose bounds
cannot decide what it reports (:mod:`empdp.assessment.joint_evaluation`).
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.special import logsumexp

#: databases with the largest shifts whose kinks are tried for the lower bound on ε_i
PROBE_TERMS = 3
#: (rows × databases) per block of the bounds (a few (rows, n, d) temporaries at once)
BLOCK = 2_000_000


def _chord(total_variation: np.ndarray, reach: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """TV (e^{reach} − e^ε)_+ / (e^{reach} − 1), broadcast; 0 where reach is 0, stable for small reach."""
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.expm1(np.minimum(eps - reach, 0.0)) / np.expm1(-reach)
    return np.where(reach > 0, total_variation * np.clip(frac, 0.0, 1.0), 0.0)


def chord_upper(delta0: np.ndarray, eps0: float, eps_i: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Certified δ_i(ε) ≤ the returned (R, E) from the exact δ_i(ε₀) (R,) and ε_i (R,): δ_i is convex
    in t = e^ε and 0 from e^{ε_i} on, so on [e^{ε₀}, e^{ε_i}] it lies below the chord from
    (e^{ε₀}, δ_i(ε₀)) to (e^{ε_i}, 0); 0 from ε_i on (docs/method.md#102-joint-queries)."""
    t0, ti, t = np.exp(min(eps0, 700.0)), np.exp(np.minimum(eps_i, 700.0))[:, None], np.exp(np.minimum(eps, 700.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.clip((ti - t[None, :]) / (ti - t0), 0.0, 1.0)
    above = eps[None, :] >= eps_i[:, None]
    # beyond e^700 the chord's end is not representable: δ_i(ε₀) bounds δ_i(ε) (it decreases in ε)
    chord = (ti > t0) & (eps_i[:, None] <= 700.0)
    return np.where(above, 0.0, np.where(chord, delta0[:, None] * frac, delta0[:, None]))


def delta_upper(su: np.ndarray, eps: np.ndarray, eps_i: np.ndarray | None = None) -> np.ndarray:
    """Certified δ_i(ε) ≥ the returned (R, E) for scaled shifts ``su`` (R, n, d) at levels ``eps`` (E,).

    ``eps_i`` (R,): exact ε_i where known (NaN elsewhere), which tightens the mixture's chord and
    makes the bound 0 from ε_i on.
    """
    R, n, _ = su.shape
    eps = np.asarray(eps, dtype=np.float64)
    out = np.empty((R, len(eps)))
    step = max(1, BLOCK // max(1, n))
    for k in range(0, R, step):
        s = su[k:k + step]
        reach = np.abs(s).sum(-1)  # (r, n): l_ij
        tv = -np.expm1(-0.5 * reach)
        terms = _chord(tv[:, :, None], reach[:, :, None], eps[None, None, :]).sum(1) / n
        top = reach.max(1, initial=0.0)
        if eps_i is not None:
            top = np.where(np.isnan(eps_i[k:k + step]), top, np.minimum(top, eps_i[k:k + step]))
        mixture = _chord(tv.sum(1)[:, None] / n, top[:, None], eps[None, :])
        out[k:k + step] = np.minimum(np.minimum(terms, mixture), 1.0)
    return out


def eps_lower(a: np.ndarray, su: np.ndarray) -> np.ndarray:
    """Certified ε_i ≥ the returned (R,): max |L| over the far corners and the kinks of the
    :data:`PROBE_TERMS` databases each individual moves most (scaled points ``a`` (n, d), shifts ``su``)."""
    R, n, d = su.shape
    out = np.zeros(R)
    step = max(1, BLOCK // max(1, n * (2 * PROBE_TERMS + 1)))
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d)))  # (2^d, d)
    for k in range(0, R, step):
        s = su[k:k + step]
        b = a[None] - s
        # far corners: L_σ = log Σ_j e^{σ·a_j} − log Σ_j e^{σ·b_j}
        corner = logsumexp(a @ signs.T, axis=0)[None, :] - logsumexp(b @ signs.T, axis=1)  # (r, 2^d)
        best = np.abs(corner).max(1)
        top = np.argsort(-np.abs(s).sum(-1), axis=1)[:, :PROBE_TERMS]  # (r, P)
        probes = np.concatenate([a[top], np.take_along_axis(b, top[:, :, None], axis=1)], axis=1)  # (r, 2P, d)
        la = logsumexp(-np.abs(probes[:, :, None, :] - a[None, None, :, :]).sum(-1), axis=2)
        lb = logsumexp(-np.abs(probes[:, :, None, :] - b[:, None, :, :]).sum(-1), axis=2)
        out[k:k + step] = np.maximum(best, np.abs(la - lb).max(1))
    return out


#: half-widths (scaled units) of the boxes around a moved point, and the offsets of the orthants
#: beside it, tried for the lower bound on δ_i
BOX_WIDTHS = (0.25, 0.5, 1.0, 2.0)
ORTHANT_OFFSETS = (-0.5, 0.0, 0.5, 1.5)
#: quantiles of the points where the orthants along the mean shift start
ORTHANT_QUANTILES = (0.5, 0.8, 0.95, 1.0)
#: a lower bound is lowered by this fraction of the masses it subtracts (their rounding)
ROUNDING = 1e-12


def _cdf(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The Laplace(p, 1) CDF at x (both broadcast), exact at ±∞: ½ e^{−|x − p|} or one less it, from
    one exponential per element (the bounds' largest cost at 10^4 individuals)."""
    z = x - p
    half = 0.5 * np.exp(-np.abs(z))
    return np.where(z < 0, half, 1.0 - half)


def _box_mass(lo: np.ndarray, hi: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """(1/n) Σ_j Π_k ∫_{lo_k}^{hi_k} ½ e^{−|u − p_jk|}: boxes (r, B, d) against points (r or 1, n, d)."""
    prod = None
    for k in range(lo.shape[-1]):
        p = pts[:, None, :, k]  # (r, 1, n)
        f = _cdf(hi[:, :, None, k], p) - _cdf(lo[:, :, None, k], p)  # (r, B, n)
        prod = f if prod is None else prod * f
    return prod.mean(-1)


def _boxes(a: np.ndarray, b: np.ndarray, s: np.ndarray):
    """Candidate sets (r, B, d) ``lo``, ``hi`` where one density may exceed the other: boxes around the
    points the individual moves most and around where they move them, orthants beside those points
    away from their other position, and orthants along the mean shift beyond quantiles of the points."""
    r, n, d = s.shape
    top = np.argsort(-np.abs(s).sum(-1), axis=1)[:, :PROBE_TERMS]
    lows, highs = [], []
    for pts, sign in ((np.broadcast_to(a, b.shape), 1.0), (b, -1.0)):
        c = np.take_along_axis(pts, top[:, :, None], axis=1)  # (r, P, d)
        direction = np.where(sign * np.take_along_axis(s, top[:, :, None], axis=1) >= 0, 1.0, -1.0)
        for w in BOX_WIDTHS:
            lows.append(c - w)
            highs.append(c + w)
        for w in ORTHANT_OFFSETS:
            edge = c - direction * w
            lows.append(np.where(direction > 0, edge, -np.inf))
            highs.append(np.where(direction > 0, np.inf, edge))
        mean = np.where(sign * s.sum(1) >= 0, 1.0, -1.0)[:, None, :]  # (r, 1, d)
        for qt in ORTHANT_QUANTILES:
            edge = np.where(mean > 0, np.quantile(pts, qt, axis=1)[:, None, :],
                            np.quantile(pts, 1 - qt, axis=1)[:, None, :])
            lows.append(np.where(mean > 0, edge, -np.inf))
            highs.append(np.where(mean > 0, np.inf, edge))
    return np.concatenate(lows, axis=1), np.concatenate(highs, axis=1)


def delta_lower(a: np.ndarray, su: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Certified δ_i(ε) ≤ the returned (R, E): δ_i(ε) ≥ P(A) − e^ε P_i(A) and ≥ P_i(A) − e^ε P(A) for
    any set A, taken over the candidate boxes and orthants of :func:`_boxes` (masses in closed form,
    O(n d) per set), lowered by their rounding."""
    R, n, d = su.shape
    eps = np.asarray(eps, dtype=np.float64)
    grow = np.exp(np.minimum(eps, 700.0))
    out = np.zeros((R, len(eps)))
    step = max(1, BLOCK // max(1, 16 * n * 2 * (2 * len(BOX_WIDTHS) + 2 * len(ORTHANT_OFFSETS))))
    for k in range(0, R, step):
        s = su[k:k + step]
        b = a[None] - s
        lo, hi = _boxes(a, b, s)
        P, Q = _box_mass(lo, hi, a[None]), _box_mass(lo, hi, b)  # (r, B)
        for x, y in ((P, Q), (Q, P)):
            gain = x[:, :, None] - grow * y[:, :, None] - ROUNDING * (x[:, :, None] + grow * y[:, :, None])
            out[k:k + step] = np.maximum(out[k:k + step], gain.max(axis=1))
    return np.clip(out, 0.0, 1.0)
