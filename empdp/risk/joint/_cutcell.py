"""Exact integrals over one cut cell of the d = 2 grid (docs/method.md#102-joint-queries).

On a cell [0, w1] × [0, w2] the integrand p̂ − e^ε p̂_i is four terms D e^{±t1 ± t2}. For fixed t2 it
is α e^{−t1} + β e^{−(w1−t1)} along t1, whose positive part integrates in closed form
(:func:`pos_1d`); :func:`cell_integral` integrates that along t2, in closed form where the root
stays outside the cell and by Gauss–Legendre on the square root where it crosses.
"""

from __future__ import annotations

import numpy as np

#: widest piece (scaled units) of the Gauss–Legendre axis: 4 nodes on e^{±t} over 0.5 err ~1e−12 relative
MAX_PIECE = 0.5
#: most pieces per interval between edge roots
MAX_PARTS = 256
#: cut cells per vectorised pass
CHUNK = 4096
#: Gauss–Legendre nodes per piece when the nearest singularity of the piece's integrand is far
FAST_NODES = 6
#: "far": at least this many piece lengths beyond the piece (Bernstein ρ ≥ 7 + √48 ≈ 13.9: ρ^{−12} ≈ 2e−14)
SAFE_DISTANCE = 3.0

_GL = {q: np.polynomial.legendre.leggauss(q) for q in (2, 3, 4, 6, 8)}


def _rule(nodes: int):
    """Gauss–Legendre nodes and weights for ``nodes`` points (any count ≥ 1; the usual ones cached)."""
    if nodes not in _GL:
        if int(nodes) != nodes or nodes < 1:
            raise ValueError(f"nodes must be a whole number >= 1, got {nodes!r}")
        _GL[int(nodes)] = np.polynomial.legendre.leggauss(int(nodes))
    return _GL[nodes]


def pos_1d(alpha, beta, f):
    """∫_0^w (α e^{−t} + β e^{−(w−t)})_+ dt with f = e^{−w}: exact (one root at most).

    The root t* (α e^{−2t*} = −β f) lies inside when α β < 0 and f² < −β f/α < 1; then the part
    on the positive side is (√P − √(−f N))², P the positive and N the negative coefficient (no
    cancellation). Otherwise the integrand keeps the sign of α + β (its value at w/2 up to e^{−w/2}).
    """
    total = (alpha + beta) * (1.0 - f)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = -beta * f / alpha
    inside = _opposite(alpha, beta) & (ratio > f * f) & (ratio < 1.0)
    pos, neg = np.maximum(alpha, beta), np.minimum(alpha, beta)
    cut = np.square(np.sqrt(np.maximum(pos, 0.0)) - np.sqrt(np.maximum(-f * neg, 0.0)))
    return np.where(inside, cut, np.where(alpha + beta > 0, np.maximum(total, 0.0), 0.0))


def _opposite(x, y):
    """x and y nonzero of opposite signs, by their signs: the product overflows (a warning) or
    underflows to −0.0 (a root lost) for coefficients e^{±500} apart."""
    return ((x > 0) & (y < 0)) | ((x < 0) & (y > 0))


def _edge_root(gamma, eta, f, w):
    """t in [0, w] where γ e^{−t} + η e^{−(w−t)} = 0 (0 when there is none: a harmless breakpoint)."""
    with np.errstate(divide="ignore", invalid="ignore"):  # logs apart: the ratio of far terms overflows
        t = 0.5 * (w + np.log(np.abs(gamma)) - np.log(np.abs(eta)))
    return np.where(_opposite(gamma, eta) & np.isfinite(t), np.clip(t, 0.0, w), 0.0)


def cell_integral(D, w1, w2, nodes, tol):
    """:func:`_cell_chunk` on chunks of :data:`CHUNK` cells (their temporaries stay in cache)."""
    if len(w1) <= CHUNK:
        return _cell_chunk(D, w1, w2, nodes, tol)
    return np.concatenate([_cell_chunk(D[k:k + CHUNK], w1[k:k + CHUNK], w2[k:k + CHUNK], nodes, tol)
                           for k in range(0, len(w1), CHUNK)])


def _cell_chunk(D, w1, w2, nodes, tol):
    """∫∫ (h)_+ over [0, w1] × [0, w2] for h = D−− e^{−t1−t2} + D+− e^{−(w1−t1)−t2} + D−+ e^{−t1−(w2−t2)}
    + D++ e^{−(w1−t1)−(w2−t2)} (D: (N, 4) in that order): exact along the wider axis (t1),
    Gauss–Legendre along the other on pieces between the edge roots.

    For fixed t2 the exact integral along t1 is F(t2) = α − f β ∓ 2 √(−f α β) (α, β: the two
    coefficients, sums of two exponentials in t2) while the root lies inside, and a sum of
    exponentials otherwise; between the edge roots one formula holds, so F is analytic there except
    at the real zeros of α and β (in closed form; their complex zeros are π/2 off the real axis).
    A piece whose nearest such zero is at least :data:`SAFE_DISTANCE` piece lengths away gets one
    :data:`FAST_NODES`-point rule (Bernstein ellipse ρ ≥ 7.8: relative error below 1e−10); the
    others, a small fraction, are halved until two rules agree within ``tol``.
    """
    swap = w2 > w1
    D = np.where(swap[:, None], D[:, [0, 2, 1, 3]], D)
    w1, w2 = np.where(swap, w2, w1), np.where(swap, w1, w2)
    f1, f2 = np.exp(-w1), np.exp(-w2)
    dmm, dpm, dmp, dpp = D.T
    # h on the edges t1 = 0 and t1 = w1 as functions of t2: their roots split the t2 axis
    r1 = _edge_root(dmm + f1 * dpm, dmp + f1 * dpp, f2, w2)
    r2 = _edge_root(f1 * dmm + dpm, f1 * dmp + dpp, f2, w2)
    bps = np.stack([np.zeros_like(w2), np.minimum(r1, r2), np.maximum(r1, r2), w2], axis=1)  # r ∈ [0, w2]
    lo, hi = bps[:, :-1], bps[:, 1:]  # (N, 3) intervals, some empty
    parts = np.maximum(1, np.ceil((hi - lo) / MAX_PIECE)).astype(np.int64)
    h = (hi - lo) / parts
    # real zeros of α(t2) = D−− e^{−t2} + D−+ e^{t2 − w2} and β(t2) = D+− e^{−t2} + D++ e^{t2 − w2}
    near = np.full(lo.shape, np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        for c0, c1 in ((dmm, dmp), (dpm, dpp)):
            z = 0.5 * (w2 + np.log(-c0 / c1))
            z = np.where(np.isfinite(z), z, np.nan)[:, None]
            dist = np.maximum(np.maximum(lo - z, z - hi), 0.0)
            near = np.fmin(near, dist)
        # the formula is entire where the root lies outside [0, w1]: test the interval's midpoint
        mid = 0.5 * (lo + hi)
        e_lo, e_hi = np.exp(-mid), np.exp(mid - w2[:, None])
        al = dmm[:, None] * e_lo + dmp[:, None] * e_hi
        be = dpm[:, None] * e_lo + dpp[:, None] * e_hi
        ratio = -be * f1[:, None] / al
    inside = _opposite(al, be) & (ratio > f1[:, None] ** 2) & (ratio < 1.0)
    safe = (hi <= lo) | ~inside | (near >= SAFE_DISTANCE * h)
    fast = safe.all(axis=1)
    out = np.zeros(len(w1))
    if fast.any():
        positive = al + be > 0  # where the root stays out of [0, w1], the sign of h at t1 = w1/2
        out[fast] = _fixed_rule(D[fast], f1[fast], w2[fast], lo[fast], hi[fast], parts[fast], inside[fast],
                                positive[fast])
    slow = np.flatnonzero(~fast)
    if len(slow):
        out[slow] = _adaptive(dmm[slow], dpm[slow], dmp[slow], dpp[slow], f1[slow], w2[slow], bps[slow], nodes, tol)
    return out


def _fixed_rule(D, f1, w2, lo, hi, parts, inside, positive):
    """∫ F over the intervals [lo, hi] (N, 3) of the Gauss axis, F(t2) the exact integral along t1.

    With α(t2) = D−− e^{−t2} + D−+ e^{t2−w2} and β(t2) = D+− e^{−t2} + D++ e^{t2−w2}: where the
    root stays outside [0, w1], F = (α + β)(1 − f1) or 0, a sum of exponentials integrated in
    closed form; where it lies inside, F = (√P − √(f1 N))², P the positive and −N the negative
    coefficient (no cancellation), by a FAST_NODES-point Gauss–Legendre rule on each of ``parts``
    equal parts.
    """
    dmm, dpm, dmp, dpp = D.T
    L = hi - lo
    with np.errstate(over="ignore", invalid="ignore"):
        down = np.exp(-lo) * -np.expm1(-L)                # ∫ e^{−t}
        up = np.exp(hi - w2[:, None]) * -np.expm1(-L)     # ∫ e^{t − w2}
    whole = ~inside & positive & (L > 0)
    ia = dmm[:, None] * down + dmp[:, None] * up          # ∫ α
    ib = dpm[:, None] * down + dpp[:, None] * up          # ∫ β
    out = np.where(whole, (ia + ib) * (1.0 - f1[:, None]), 0.0).sum(axis=1)
    x, wt = _rule(FAST_NODES)
    h = L / parts
    cnt = np.where(inside & (L > 0), parts, 0).ravel()
    at = np.repeat(np.arange(cnt.size), cnt)  # one entry per (cell, interval, part) the root crosses
    if not len(at):
        return out
    k = np.arange(len(at)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    cell = at // 3
    hh = h.ravel()[at]
    t = (lo.ravel()[at] + hh * (k + 0.5))[:, None] + (0.5 * hh)[:, None] * x
    e_lo = np.exp(-t)
    e_hi = np.exp(t - w2[cell][:, None])
    alpha = dmm[cell][:, None] * e_lo + dmp[cell][:, None] * e_hi
    beta = dpm[cell][:, None] * e_lo + dpp[cell][:, None] * e_hi
    pos, neg = np.maximum(alpha, beta), np.minimum(alpha, beta)
    F = np.square(np.sqrt(np.maximum(pos, 0.0)) - np.sqrt(np.maximum(-f1[cell][:, None] * neg, 0.0)))
    return out + np.bincount(cell, weights=(F @ wt) * (0.5 * hh), minlength=len(out))


def _adaptive(dmm, dpm, dmp, dpp, f1, w2, bps, nodes, tol):
    """The pieces near a zero of α or β: halve until two rules agree within ``tol``."""
    out = np.zeros(len(f1))
    parts = np.maximum(1, np.ceil(w2 / MAX_PIECE)).astype(np.int64)
    todo = np.arange(len(f1))
    coarse = None
    while len(todo):
        fine = np.empty(len(todo))
        for m in np.unique(parts[todo]):
            sel = np.flatnonzero(parts[todo] == m)
            at = todo[sel]
            fine[sel] = _gauss_rows(dmm[at], dpm[at], dmp[at], dpp[at], f1[at], w2[at], bps[at], int(m), nodes)
        out[todo] = fine
        if coarse is not None:
            done = (np.abs(fine - coarse) <= tol) | (parts[todo] >= MAX_PARTS)
            todo, fine = todo[~done], fine[~done]
        parts[todo] *= 2
        coarse = fine
    return out


def _gauss_rows(dmm, dpm, dmp, dpp, f1, w2, bps, m, nodes):
    x, wt = _rule(nodes)
    # pieces: each of the 3 intervals between breakpoints cut into m equal parts
    lo, hi = bps[:, :-1], bps[:, 1:]  # (N, 3)
    frac = np.arange(m + 1) / m
    edges = lo[:, :, None] + (hi - lo)[:, :, None] * frac  # (N, 3, m + 1)
    a, b = edges[:, :, :-1], edges[:, :, 1:]
    half = (b - a) / 2
    t = (a + half)[..., None] + half[..., None] * x  # (N, 3, m, Q)
    weight = half[..., None] * wt
    N = len(w2)
    t = t.reshape(N, -1)
    weight = weight.reshape(N, -1)
    e_lo = np.exp(-t)
    e_hi = np.exp(t - w2[:, None])
    alpha = dmm[:, None] * e_lo + dmp[:, None] * e_hi
    beta = dpm[:, None] * e_lo + dpp[:, None] * e_hi
    inner = pos_1d(alpha, beta, f1[:, None])
    return (inner * weight).sum(1)

