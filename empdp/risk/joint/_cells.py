"""Exact ε_i and δ_i(ε) for two statistics on the grid of kink lines (docs/method.md#102-joint-queries).

Scaled coordinates u = T x (each kernel is ¼ e^{−|u − a_j|_1}). For one individual, the kink
lines of axis k are the 2n coordinates a_jk and b_jk = a_jk − s_jk, sorted: x_k,0 ≤ … ≤ x_k,J−1.
On the cell [x_1,i, x_1,i+1] × [x_2,k, x_2,k+1] (local t ∈ [0, w_1] × [0, w_2]) every term of a
density lies in one quadrant of the cell, so

    p(t) = C−− e^{−t1−t2} + C+− e^{−(w1−t1)−t2} + C−+ e^{−t1−(w2−t2)} + C++ e^{−(w1−t1)−(w2−t2)},

C−− summing e^{−|x_1,i − a_j1| − |x_2,k − a_j2|} over the points left of and below the cell, C+−
those right of and below it (referred to the right edge), and so on: every factor is at most 1.
Between two of its own lines a point set's left and right sums only change by a factor, so the
quadrant sums on the (2n)² grid are gathered from each point set's sums on its own (n + 1)² grid
(:func:`_point_grid`, :func:`_gather`): those of the points a_j are shared by every individual, and
the shifted points' cost prefix sums on a quarter of the grid. From them, exactly:

* the values at the grid nodes, hence L = log p − log p_i at every vertex. Along an axis line L is
  monotone between kinks and flat beyond the outermost kink, so on each cell L lies between its
  vertex values and ε_i = max |L| over the vertices (docs/method.md#41-per-individual-risk);
* each cell's mass (1 − e^{−w1})(1 − e^{−w2}) Σ C, and the tails: beyond the outermost kink of an
  axis every term carries the same factor e^{−s} (s the distance to that kink line), so the
  half-strip beyond a boundary segment integrates to ∫ (p − e^ε p_i)_+ along the segment (a 1-d
  closed form), and a corner quadrant to (p − e^ε p_i)_+ at the corner node;
* δ_i(ε) = max(∫ (p − e^ε p_i)_+, ∫ (p_i − e^ε p)_+): a piece (cell, boundary segment, corner)
  whose vertices all have L ≥ ε contributes its mass difference, one whose vertices all have
  L ≤ ε nothing; the pieces the level cuts are integrated exactly along the cell's wider axis
  (α e^{−t} + β e^{−(w−t)} has one root) and along the narrower one in closed form or by
  Gauss–Legendre on the square root that remains, between the points where the level crosses
  the cell's edges (:mod:`._cutcell`);
* only pieces whose L reaches ± min ε get masses and level bins: the others add nothing at any
  level swept;
* with ``only``/``cap``, levels where the total risk has saturated are integrated only for rows
  whose :func:`chord_bound` exceeds the cap.

Rows whose vertex densities underflow (points hundreds of scales apart) are left to the caller
(``ok`` is False for them).
"""

from __future__ import annotations

import numpy as np

from ._cutcell import cell_integral, pos_1d

#: Gauss–Legendre nodes per piece of a cut cell along its narrower axis
NODES = 4
#: per cut cell, halve the Gauss pieces until two rules agree within this (× 2n, unnormalised units)
TOL = 1e-13
#: (rows × vertices) per block: the block's dozen (C, 2J, 2J) temporaries stay within a few tens of MB
BLOCK_VERTICES = 400_000
#: ε_i alone uses products of e^{±(x − c)}: every coordinate within this of the row's centre
FAST_SPAN = 150.0
#: |L| cap, as for one statistic (e^ε overflows beyond it)
L_CAP = 700.0
#: vertex densities below this fraction of the largest are unreliable (underflowed factors): fallback
_TINY = 1e-250



def rows_per_block(n: int) -> int:
    return max(1, BLOCK_VERTICES // (4 * n * n))


def evaluate(a: np.ndarray, s: np.ndarray, eps: np.ndarray | None, nodes: int = NODES,
             only: np.ndarray | None = None, cap: np.ndarray | None = None):
    """Exact ε_i and δ_i(ε) for scaled points ``a`` (n, 2) and scaled shifts ``s`` (C, n, 2).

    Returns ``(eps_i, delta, ok)``: ``eps_i`` (C,), ``delta`` (C, E) or None, and ``ok`` (C,) False
    for rows this method cannot certify (their results are NaN). ``eps`` ascending. With ``only``
    (E,) (True at eps[0]) and ``cap`` (E,): at the levels outside ``only``, δ_i is computed only
    where its bound :func:`chord_bound` exceeds ``cap``, and is NaN elsewhere where it is positive.
    """
    C, n, _ = s.shape
    eps_i = np.full(C, np.nan)
    delta = None if eps is None else np.full((C, len(eps)), np.nan)
    ok = np.zeros(C, dtype=bool)
    step = rows_per_block(n)
    shared = _point_grid(a[None]) if len(s) else None  # the points' own sums: every row shares them
    for k in range(0, C, step):
        sl = slice(k, k + step)
        e, d, good = _block(a, s[sl], eps, nodes, only, cap, shared)
        eps_i[sl], ok[sl] = e, good
        if delta is not None:
            delta[sl] = d
    return eps_i, delta, ok


def chord_bound(delta0: np.ndarray, eps0: float, eps_i: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Upper bound on δ_i(ε) (C, E) from δ_i(ε₀) (C,) and ε_i (C,).

    Each side ∫ (p − t p_i)_+ is convex in t = e^ε (a positive part of functions affine in t), so
    δ_i is, and it vanishes at t_i = e^{ε_i}: on [t₀, t_i] it lies below the chord from (t₀, δ_i(ε₀))
    to (t_i, 0).
    """
    t0, ti, t = np.exp(eps0), np.exp(eps_i)[:, None], np.exp(eps)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.clip((ti - t) / (ti - t0), 0.0, 1.0)
    return np.where(ti > t0, delta0[:, None] * frac, 0.0)


def eps_rows(a: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact ε_i for scaled points ``a`` (n, 2) and scaled shifts ``s`` (C, n, 2), and ``ok`` (C,).

    sup L is attained at a vertex whose coordinates are kinks of p̂ (or the outermost kinks, beyond
    which L is flat) and inf L at kinks of p̂_i (docs/method.md#102-joint-queries), so two
    (n + 2)² vertex sets suffice. Each factor e^{−|x − p|} is min(e^{x−c} e^{c−p}, e^{c−x} e^{p−c})
    about the row's centre c: products instead of exponentials, exact while every coordinate is
    within :data:`FAST_SPAN` of c (``ok`` False otherwise: the caller uses the log-space path).
    """
    C, n, _ = s.shape
    out = np.full(C, np.nan)
    b = a[None] - s
    lo = np.minimum(a.min(0), b.min(1))  # (C, 2): outermost kinks
    hi = np.maximum(a.max(0), b.max(1))
    ok = ((hi - lo) <= 2 * FAST_SPAN).all(1)
    c = 0.5 * (lo + hi)
    step = max(1, BLOCK_VERTICES // (2 * (n + 2) * n))
    for k0 in np.arange(0, C, step):
        r = np.flatnonzero(ok[k0:k0 + step]) + k0
        if not len(r):
            continue
        ea = np.exp(a[None, :, :] - c[r, None, :])  # (R, n, 2)
        eb = np.exp(b[r] - c[r, None, :])
        ends = np.exp(np.stack([lo[r], hi[r]], axis=1) - c[r, None, :])  # (R, 2, 2)
        top = _ratio(np.concatenate([ea, ends], axis=1), ea, eb).max(axis=(1, 2))
        bottom = _ratio(np.concatenate([eb, ends], axis=1), ea, eb).min(axis=(1, 2))
        with np.errstate(divide="ignore"):
            out[r] = np.maximum(np.maximum(np.log(top), -np.log(bottom)), 0.0)
    return out, ok


def _ratio(ex, ea, eb):
    """p̂/p̂_i on the product grid of the vertex coordinates with factors e^{x−c} ``ex`` (R, G, 2)."""
    ix = 1.0 / ex
    vals = []
    for ep in (ea, eb):
        ip = 1.0 / ep
        first = np.minimum(ex[:, :, 0, None] * ip[:, None, :, 0], ix[:, :, 0, None] * ep[:, None, :, 0])  # (R, G, n)
        # the second factor built transposed, (R, n, G): the same products, and a contiguous operand
        # makes the stacked product about twice as fast as a transposed view (the same bits)
        second = np.minimum(ip[:, :, 1, None] * ex[:, None, :, 1], ep[:, :, 1, None] * ix[:, None, :, 1])
        vals.append(first @ second)
    return vals[0] / vals[1]


def _axis(a_k: np.ndarray, b_k: np.ndarray):
    """Sorted kinks x (C, J), each point's rank (C, J: the first n of set A), gaps' e^{−w} (C, J)."""
    C, n = b_k.shape
    coords = np.concatenate([np.broadcast_to(a_k, (C, n)), b_k], axis=1)
    order = np.argsort(coords, axis=1, kind="stable")
    x = np.take_along_axis(coords, order, axis=1)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(2 * n)[None, :], axis=1)
    w = np.diff(x, axis=1)
    f = np.zeros_like(x)
    f[:, :-1] = np.exp(-w)
    return x, rank, w, f


def _factors(x: np.ndarray, pts: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(C, 2J, n): rows i < J the left factors [rank_j ≤ i] e^{−(x_i − p_j)}, rows J + i the right
    factors [rank_j ≥ i + 1] e^{−(p_j − x_{i+1})} (0 for i = J − 1)."""
    C, J = x.shape
    n = pts.shape[1]
    E = np.exp(-np.abs(x[:, :, None] - pts[:, None, :]))  # (C, J, n)
    idx = np.arange(J)[None, :, None]
    out = np.zeros((C, 2 * J, n))
    left = rank[:, None, :] <= idx
    np.multiply(E, left, out=out[:, :J])
    np.multiply(E[:, 1:], ~left[:, :-1], out=out[:, J:2 * J - 1])
    return out


def _quadrants(xs, ranks, pts):
    """The quadrant sums (C, 4, J, J) in the order −−, +−, −+, ++ (axis 1 sign first).

    Each point sits on one kink line per axis, so a quadrant sum is a two-dimensional prefix or
    suffix sum of the points' weights e^{±(p_1 − c_1)} e^{±(p_2 − c_2)} (c the rows' centre), times
    the vertex's factors e^{∓(x − c)}: cumulative sums instead of a matrix product. Rows spanning
    more than 2 :data:`FAST_SPAN` scales (where e^{±(x − c)} would overflow) take the product form.
    """
    x1, x2 = xs
    span = np.maximum(x1[:, -1] - x1[:, 0], x2[:, -1] - x2[:, 0])
    if np.all(span <= 2 * FAST_SPAN):
        return _quadrants_cumsum(xs, ranks, pts)
    return _quadrants_product(xs, ranks, pts)


def _quadrants_cumsum(xs, ranks, pts):
    C, J = xs[0].shape
    n = pts.shape[1]
    rows = np.repeat(np.arange(C), n)
    r1, r2 = ranks[0].ravel(), ranks[1].ravel()
    up, down, e_pts = [], [], []
    for k in (0, 1):
        c = 0.5 * (xs[k][:, :1] + xs[k][:, -1:])
        u = np.exp(xs[k] - c)  # e^{x − c}
        nxt = np.zeros_like(u)
        nxt[:, :-1] = u[:, 1:]  # e^{x_{i+1} − c}: right and upper quadrants refer to the next line
        up.append(nxt)
        down.append(1.0 / u)
        ep = np.exp(pts[..., k] - c).ravel()
        e_pts.append((ep, 1.0 / ep))
    out = np.empty((C, 4, J, J))
    W = np.zeros((C, J, J))
    T = np.empty((C, J, J))
    for q, (s1, s2) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):  # 0: left/below, 1: right/above
        W[:] = 0.0
        W[rows, r1, r2] = e_pts[0][s1] * e_pts[1][s2]
        _scan(W, 1, s1, T)
        S = out[:, q]
        _scan(T, 2, s2, S)
        S *= (up[0] if s1 else down[0])[:, :, None]
        S *= (up[1] if s2 else down[1])[:, None, :]
    return out


def _scan(W, axis, suffix, out):
    """Into ``out``: prefix sums along ``axis`` (index ≤ i), or suffix sums from the next index
    (≥ i + 1; 0 at the end), the latter as a prefix sum over reversed views (no copies)."""
    if not suffix:
        np.cumsum(W, axis=axis, out=out)
    elif axis == 1:
        np.cumsum(W[:, :0:-1], axis=1, out=out[:, -2::-1])
        out[:, -1] = 0.0
    else:
        np.cumsum(W[:, :, :0:-1], axis=2, out=out[:, :, -2::-1])
        out[:, :, -1] = 0.0


def _quadrants_product(xs, ranks, pts):
    F1 = _factors(xs[0], pts[..., 0], ranks[0])
    F2 = _factors(xs[1], pts[..., 1], ranks[1])
    M = F1 @ F2.transpose(0, 2, 1)  # (C, 2J, 2J)
    J = xs[0].shape[1]
    return np.stack([M[:, :J, :J], M[:, J:, :J], M[:, :J, J:], M[:, J:, J:]], axis=1)


def _point_grid(P: np.ndarray):
    """The quadrant sums of point sets ``P`` (C, n, 2) on their own grid, for :func:`_gather`.

    With each axis' coordinates sorted, srt_0 ≤ … ≤ srt_{n−1}, and a line added at srt_0 before the
    first: ``G`` (C, 4, n + 1, n + 1), whose row u holds along that axis the left sums of the first u
    points referred to srt_{u−1} (0 for u = 0) and the right sums of the points from u on referred
    to srt_u (0 for u = n), by :func:`_quadrants`; and ``srt`` per axis (C, n).
    """
    xs, ranks, srt = [], [], []
    for k in range(2):
        order = np.argsort(P[:, :, k], axis=1, kind="stable")
        v = np.take_along_axis(P[:, :, k], order, axis=1)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(1, P.shape[1] + 1)[None, :], axis=1)
        xs.append(np.concatenate([v[:, :1], v], axis=1))
        ranks.append(rank)
        srt.append(v)
    return _quadrants(xs, ranks, P), srt


def _gather(xs, ranks, G, srt):
    """The quadrant sums (C, 4, J, J) of one point set on each row's grid of all kink lines, from
    its :func:`_point_grid` sums ``G`` ((C or 1), 4, n + 1, n + 1).

    Vertex line i of an axis has c_i of the points at or before it (rank ≤ i): its left sum is the
    left sum of those c_i points times e^{−(x_i − srt_{c_i − 1})}, and the right sum from the next
    line is the right sum from point c_i on times e^{−(srt_{c_i} − x_{i+1})} (0 on the last line):
    a gather and two products instead of prefix sums over the (2n)² grid.
    """
    C, J = xs[0].shape
    n = G.shape[-1] - 1
    rows = np.arange(C)[:, None]
    counts, facs = [], []
    for k in range(2):
        mark = np.zeros((C, J), dtype=np.int64)
        mark[rows, ranks[k]] = 1
        c = np.cumsum(mark, axis=1)  # points at or before each line
        x, v = xs[k], np.broadcast_to(srt[k], (C, n))
        # the exponents are ≤ 0 where used; elsewhere +∞ gives 0 without exponentiating a far gap
        left = np.exp(-np.where(c > 0, x - np.take_along_axis(v, np.maximum(c - 1, 0), axis=1), np.inf))
        nxt = np.concatenate([x[:, 1:], x[:, -1:]], axis=1)
        ahead = np.take_along_axis(v, np.minimum(c, n - 1), axis=1)
        right = np.exp(-np.where((c < n) & (np.arange(J) < J - 1), ahead - nxt, np.inf))
        counts.append(c)
        facs.append((left, right))
    base = (np.arange(C) * 4 if G.shape[0] > 1 else np.zeros(C, dtype=np.int64))[:, None, None]
    flat = counts[0][:, :, None] * (n + 1) + counts[1][:, None, :]
    out = np.empty((C, 4, J, J))
    G = G.ravel()
    for q, (s1, s2) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
        S = out[:, q]
        np.take(G, (base + q) * (n + 1) ** 2 + flat, out=S)
        S *= facs[0][s1][:, :, None]
        S *= facs[1][s2][:, None, :]
    return out


def _block(a, s, eps, nodes, only=None, cap=None, shared=None):
    C, n, _ = s.shape
    b = a[None] - s
    xs, ranks, ws, fs = [], [], [], []
    for k in range(2):
        x, rank, w, f = _axis(a[:, k], b[:, :, k])
        xs.append(x)
        ranks.append(rank)
        ws.append(w)
        fs.append(f)
    if shared is None:
        shared = _point_grid(a[None])
    QA = _gather(xs, [r[:, :n] for r in ranks], *shared)
    QB = _gather(xs, [r[:, n:] for r in ranks], *_point_grid(b))
    f1 = fs[0][:, :, None]
    f2 = fs[1][:, None, :]
    VA = QA[:, 0] + f1 * QA[:, 1] + f2 * QA[:, 2] + f1 * f2 * QA[:, 3]
    VB = QB[:, 0] + f1 * QB[:, 1] + f2 * QB[:, 2] + f1 * f2 * QB[:, 3]
    ok = (VA.reshape(C, -1).min(1) > _TINY * n) & (VB.reshape(C, -1).min(1) > _TINY * n)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        L = np.log(VA / VB)  # finite on the rows kept (both sums above _TINY n: |L| < 600)
    if not ok.all():
        L[~ok] = 0.0  # their results are NaN
    eps_i = np.abs(L).reshape(C, -1).max(1)
    eps_i[~ok] = np.nan
    if eps is None:
        return eps_i, None, ok
    pieces = _pieces(L, QA, QB, VA, VB, fs, eps[0])
    need = None
    if only is not None:
        need = np.broadcast_to(np.asarray(only, dtype=bool), (C, len(eps))).copy()
    delta = _delta(pieces, eps, ws, nodes, n, need)
    if need is not None and (~need).any():  # the other levels, where the chord bound exceeds the cap
        more = chord_bound(delta[:, 0], eps[0], eps_i, eps) > np.asarray(cap)[None, :]
        more &= ~need
        if more.any():
            delta = np.where(more, _delta(pieces, eps, ws, nodes, n, more), delta)
            need |= more
        delta[~need] = np.nan
    delta[eps_i[:, None] <= eps[None, :]] = 0.0
    delta[~ok] = np.nan
    return eps_i, delta, ok


def _delta(pieces, eps, ws, nodes, n, need):
    plus = _side(pieces, eps, 0, ws, nodes, need)
    minus = _side(pieces, eps, 1, ws, nodes, need)
    return np.clip(np.maximum(plus, minus) / (4.0 * n), 0.0, 1.0)


def _pieces(L, QA, QB, VA, VB, fs, level):
    """The pieces of the plane whose L reaches ``level`` (plus side: max L > level) or −``level``
    (minus side: min L < −level): the others add nothing at any ε ≥ level. Pieces are, per row, the
    J−1 × J−1 cells, the 4 (J−1) boundary segments (with their half-strips) and the 4 corner
    quadrants, in that order; for the kept ones, flat arrays of (row, piece, min L, max L, mass A,
    mass B), plus what the cut pieces need: the quadrant sums and the segments' (α, β) coefficients."""
    C, J, _ = L.shape
    f1, f2 = fs[0][:, :-1], fs[1][:, :-1]  # (C, J − 1)
    lo1, hi1 = np.minimum(L[:, :-1], L[:, 1:]), np.maximum(L[:, :-1], L[:, 1:])  # over each cell's 4 vertices
    cmin, cmax = np.minimum(lo1[:, :, :-1], lo1[:, :, 1:]), np.maximum(hi1[:, :, :-1], hi1[:, :, 1:])
    # boundary segments: along axis 2 on the lines u1 = x1_0 and u1 = x1_{J−1}, along axis 1 on
    # u2 = x2_0 and u2 = x2_{J−1}; (α, β): the line's density is α e^{−t} + β e^{−(w−t)}
    seg = []
    for Q in (QA, QB):
        g1 = fs[0][:, :, None]
        g2 = fs[1][:, None, :]
        # on the line u1 = x1_i: α = C−− + f1 C+−, β = C−+ + f1 C++ (segment k); u2 = x2_k likewise
        rows, cols = Q[:, :, (0, -1), :], Q[:, :, :, (0, -1)]  # the first and last kink lines of each axis
        al1 = rows[:, 0] + g1[:, (0, -1)] * rows[:, 1]
        be1 = rows[:, 2] + g1[:, (0, -1)] * rows[:, 3]
        al2 = cols[:, 0] + g2[:, :, (0, -1)] * cols[:, 2]
        be2 = cols[:, 1] + g2[:, :, (0, -1)] * cols[:, 3]
        seg.append((np.concatenate([al1[:, 0, :-1], al1[:, 1, :-1], al2[:, :-1, 0], al2[:, :-1, 1]], axis=1),
                    np.concatenate([be1[:, 0, :-1], be1[:, 1, :-1], be2[:, :-1, 0], be2[:, :-1, 1]], axis=1)))
    sw = np.concatenate([f2, f2, f1, f1], axis=1)  # e^{−w} of each segment
    sL0 = np.concatenate([L[:, 0, :-1], L[:, -1, :-1], L[:, :-1, 0], L[:, :-1, -1]], axis=1)
    sL1 = np.concatenate([L[:, 0, 1:], L[:, -1, 1:], L[:, 1:, 0], L[:, 1:, -1]], axis=1)
    kc = (0, -1)
    cL = np.stack([L[:, i, k] for i in kc for k in kc], axis=1)
    sl, sh = np.minimum(sL0, sL1), np.maximum(sL0, sL1)
    ncell = (J - 1) ** 2
    cell = np.flatnonzero((cmax > level) | (cmin < -level))  # flat over (C, J − 1, J − 1)
    edge = np.flatnonzero((np.concatenate([sh, cL], axis=1) > level) | (np.concatenate([sl, cL], axis=1) < -level))
    K, rest = ncell + 4 * J, 4 * J  # pieces per row; segments and corners per row
    row = np.concatenate([cell // ncell, edge // rest])
    piece = np.concatenate([cell % ncell, ncell + edge % rest])
    order = np.argsort(row * K + piece, kind="stable")  # row by row, pieces in order (as the sums expect)
    row, piece = row[order], piece[order]
    lo = np.concatenate([cmin.ravel()[cell], np.concatenate([sl, cL], axis=1).ravel()[edge]])[order]
    hi = np.concatenate([cmax.ravel()[cell], np.concatenate([sh, cL], axis=1).ravel()[edge]])[order]
    nseg = 4 * (J - 1)
    mass = []
    for Q, V, (al, be) in ((QA, VA, seg[0]), (QB, VB, seg[1])):
        m = np.empty(len(row))
        c = piece < ncell
        r, (i, k) = row[c], np.divmod(piece[c], J - 1)
        m[c] = Q[r, :, i, k].sum(1) * ((1.0 - f1[r, i]) * (1.0 - f2[r, k]))
        g = (piece >= ncell) & (piece < ncell + nseg)
        r, ps = row[g], piece[g] - ncell
        m[g] = (al[r, ps] + be[r, ps]) * (1.0 - sw[r, ps])
        e = piece >= ncell + nseg
        r, pc = row[e], piece[e] - ncell - nseg
        m[e] = V[r, np.where(pc < 2, 0, -1), np.where(pc % 2 == 0, 0, -1)]
        mass.append(m)
    return {"row": row, "piece": piece, "lo": lo, "hi": hi, "mA": mass[0], "mB": mass[1],
            "QA": QA, "QB": QB, "seg": seg, "sw": sw, "ncell": ncell, "nseg": nseg, "J": J, "C": C}


def _side(P, eps, side, ws, nodes, need=None):
    """∫ (p − e^ε p_i)_+ (side 0) or ∫ (p_i − e^ε p)_+ (side 1), up to 4n, for each row and ε
    (the cut pieces only at the (row, level) pairs ``need`` (C, E) allows; None: all)."""
    lo, hi, mp, mq = P["lo"], P["hi"], P["mA"], P["mB"]
    if side:
        lo, hi, mp, mq = -P["hi"], -P["lo"], P["mB"], P["mA"]
    keep = hi > eps[0]  # the others lie in {L ≤ ε} at every level
    prow, ppiece, lo, hi, mp, mq = P["row"][keep], P["piece"][keep], lo[keep], hi[keep], mp[keep], mq[keep]
    C = P["C"]
    E = len(eps)
    growth = np.exp(np.minimum(eps, L_CAP))
    k_lo = np.searchsorted(eps, lo, side="right")  # levels ε ≤ min L: the piece lies in {L ≥ ε}
    k_hi = np.searchsorted(eps, hi, side="left")   # levels ε < max L
    flat = prow * (E + 1) + k_lo
    bp = np.bincount(flat, weights=mp, minlength=C * (E + 1)).reshape(C, E + 1)
    bq = np.bincount(flat, weights=mq, minlength=C * (E + 1)).reshape(C, E + 1)
    full_p = np.cumsum(bp[:, ::-1], axis=1)[:, -2::-1]
    full_q = np.cumsum(bq[:, ::-1], axis=1)[:, -2::-1]
    out = full_p - growth * full_q
    count = k_hi - k_lo
    if need is not None:  # drop the pieces cut at no needed level before expanding (piece, level)
        cn = np.zeros((C, E + 1), dtype=np.int64)
        np.cumsum(need, axis=1, out=cn[:, 1:])
        count = np.where(cn[prow, k_hi] - cn[prow, k_lo] > 0, count, 0)
    cut = np.flatnonzero(count > 0)
    if not len(cut):
        return out
    c = count[cut]
    at = np.repeat(cut, c)
    level = np.repeat(k_lo[cut] - (np.cumsum(c) - c), c) + np.arange(len(at))
    row, piece = prow[at], ppiece[at]
    if need is not None:
        keep = need[row, level]
        row, piece, level = row[keep], piece[keep], level[keep]
    g = growth[level]
    value = np.zeros(len(row))
    ncell, nseg, J = P["ncell"], P["nseg"], P["J"]
    is_cell = piece < ncell
    if is_cell.any():
        r, pc, gg = row[is_cell], piece[is_cell], g[is_cell]
        i, k = np.divmod(pc, J - 1)
        Qp, Qq = (P["QA"], P["QB"]) if side == 0 else (P["QB"], P["QA"])
        D = Qp[r, :, i, k] - gg[:, None] * Qq[r, :, i, k]  # (N, 4)
        value[is_cell] = cell_integral(D, ws[0][r, i], ws[1][r, k], nodes, TOL * J)
    is_seg = (piece >= ncell) & (piece < ncell + nseg)
    if is_seg.any():
        r, ps, gg = row[is_seg], piece[is_seg] - ncell, g[is_seg]
        (pa, pb), (qa, qb) = P["seg"] if side == 0 else P["seg"][::-1]
        value[is_seg] = pos_1d(pa[r, ps] - gg * qa[r, ps], pb[r, ps] - gg * qb[r, ps], P["sw"][r, ps])
    # corners are never cut (one value); sum the pairs per (row, level)
    out += np.bincount(row * E + level, weights=value, minlength=C * E).reshape(C, E)
    return out
