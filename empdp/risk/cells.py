"""Certified bounds of the log-ratio L inside grid cells, for Laplace kernels on the general path
(docs/method.md#52-exact-delta-and-epsilon-for-one-individual, "Certified cell bounds"): which
cells and kinks can matter, and the insertion of the nodes that do.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def expand_ranges(first: np.ndarray, count: np.ndarray):
    """The index ranges [first_j, first_j + count_j) laid end to end: (j of each, the index)."""
    owner = np.repeat(np.arange(len(count)), count)
    return owner, first[owner] + (np.arange(len(owner)) - (np.cumsum(count) - count)[owner])


#: rows per pass of the clearing's first bounds (arrays of a few hundred KB stay in cache)
CLEAR_ROWS = 256


def _within(rows, L, Lr, Ll, x, K, kinks, g, on_node, level) -> np.ndarray:
    """Which of ``rows`` have certified bounds |L| ≤ ``level`` on every grid cell (a bool mask).

    The decision is that of :func:`cell_bounds` and :func:`cells_lower` on every cell, at a
    fraction of the passes. A first pass takes hi of :func:`cell_bounds` and a lower bound that
    needs neither the V's crossing nor the kinks: on [0, h] the arm of the V from a falls at
    most h·max(−ma, 0) + K h²/2 below La, the arm from c at most h·max(mc, 0) + K h²/2 below Lc, so

        L ≥ max(La + h·min(ma, 0), Lc − h·max(mc, 0)) − K h²/2,

    never above the V's bottom. Only the cells it leaves below −``level`` get
    :func:`cells_lower`: about half a cell per open row at ε_all/2 on the 10^6 × 100 panel,
    two at ε_all/10, out of 371.
    """
    h = np.diff(x)
    ok = np.zeros(len(rows), dtype=bool)
    weak_at, weak_cell = [np.zeros(0, dtype=np.intp)], [np.zeros(0, dtype=np.intp)]
    with np.errstate(invalid="ignore", over="ignore"):
        for a in range(0, len(rows), CLEAR_ROWS):
            r = rows[a:a + CLEAR_ROWS]
            La, Lc, Kh2 = L[r, :-1], L[r, 1:], K[r] * h * h
            ok[a:a + len(r)] = (np.maximum(La, Lc) + Kh2 / 8 <= level).all(axis=1)
            low = np.maximum(La + h * np.minimum(Lr[r, :-1], 0.0), Lc - h * np.maximum(Ll[r, 1:], 0.0)) - Kh2 / 2
            i, c = np.nonzero(~(low >= -level) & ok[a:a + len(r), None])
            weak_at.append(i + a)
            weak_cell.append(c)
    at, cell = np.concatenate(weak_at), np.concatenate(weak_cell)
    if len(at):
        lo = cells_lower(rows[at], cell, L, Lr, Ll, x, K, kinks, g, on_node, -level)
        ok[at[~(lo >= -level)]] = False
    return ok


def cells_lower(r, cell, L, Lr, Ll, x, K, kinks, g, on_node, below):
    """Lower bounds on L over grid cells (row ``r``, cell ``cell``; sorted by row, then cell).

    :func:`cell_bounds`' V, tightened where it is under ``below``: a cell without a kink of p̂_i
    inside is smooth, L'' ≥ −K on it, so L ≥ min(La, Lc) − K h²/8; a cell with kinks inside gets
    :func:`kink_lower_bound`. The rows' kinks (sorted) are ``kinks`` in grid cells ``g``; those
    ``on_node`` are grid nodes, not inside a cell.
    """
    cells = K.shape[1]
    La, Lc, ma, mc, h, Kc = L[r, cell], L[r, cell + 1], Lr[r, cell], Ll[r, cell + 1], x[cell + 1] - x[cell], K[r, cell]
    lo, _ = cell_bounds(La, Lc, ma, mc, h, Kc)
    # the inner kinks of these rows, keyed (row, cell) in the cells' order
    rows = np.unique(r)
    kr, kc = np.nonzero(~on_node[rows] & (g[rows] >= 0) & (g[rows] < cells))
    kr = rows[kr]
    keys = kr * cells + g[kr, kc]
    want = r * cells + cell
    first, stop = np.searchsorted(keys, want, side="left"), np.searchsorted(keys, want, side="right")
    smooth = first == stop
    with np.errstate(invalid="ignore"):
        chord = np.minimum(La, Lc) - Kc * h * h / 8
        lo = np.where(smooth & (chord > lo), chord, lo)
        weak = np.flatnonzero(~smooth & (lo < below))
    if len(weak):
        pair, k = expand_ranges(first[weak], stop[weak] - first[weak])
        lo[weak] = kink_lower_bound(lo[weak], La[weak], Lc[weak], ma[weak], mc[weak], h[weak], Kc[weak], pair,
                                    kinks[kr[k], kc[k]] - x[cell[weak]][pair])
    return lo


def _by_cell(r, cell, width: int):
    """Kinks (row ``r``, grid cell ``cell``; sorted by row, then position) grouped by cell: whether
    each is its cell's first, and its cell's index among the cells."""
    flat = r * width + cell
    starts = np.r_[True, flat[1:] != flat[:-1]]
    return starts, np.cumsum(starts) - 1


def _kinks_lower(lo, L, Lr, Ll, x, K, r, cell, xk, starts, pair):
    """:func:`kink_lower_bound` of the cells of kinks at ``xk`` (grouped by :func:`_by_cell`)."""
    pr, pc = r[starts], cell[starts]
    return kink_lower_bound(lo, L[pr, pc], L[pr, pc + 1], Lr[pr, pc], Ll[pr, pc + 1], x[pc + 1] - x[pc], K[pr, pc],
                            pair, xk - x[cell])


def tail_limits(q: np.ndarray, b: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """|L(±∞)| for each row of ``shifts`` under points ``q`` with bandwidths ``b``: only the widest
    kernels survive in the tails.

    L(+∞) = −log Σ_l w_l e^{−Δ_l/b} with w the softmax of q_l/b over the
    widest kernels (and mirrored at −∞).
    """
    wide = b >= b.max() * (1 - 1e-12)
    bw = b.max()
    if np.abs(shifts[:, wide]).max(initial=0.0) > 50 * bw:  # e^{±Δ/b} would overflow: log-sum-exp form
        kin = q[wide][None, :] - shifts[:, wide]
        right = logsumexp(q[wide] / bw) - logsumexp(kin / bw, axis=1)
        left = logsumexp(-q[wide] / bw) - logsumexp(-kin / bw, axis=1)
        return np.maximum(np.abs(right), np.abs(left))
    z = q[wide] / bw
    w_right = np.exp(z - z.max())
    w_left = np.exp(z.min() - z)
    r = shifts[:, wide] / bw
    with np.errstate(divide="ignore", over="ignore"):
        right = -np.log(np.exp(-r) @ (w_right / w_right.sum()))
        left = -np.log(np.exp(r) @ (w_left / w_left.sum()))
    return np.maximum(np.abs(right), np.abs(left))


def cell_curvature(q: np.ndarray, b: np.ndarray, grid: np.ndarray, E: np.ndarray | None = None):
    """Shared per-cell quantities for :func:`row_curvature`: (S_var, S_all, reach, flip, D, at_q).

    On grid cell g, with p̂'s terms ℓ_l(x − q_l) (monotone there: every q_l is
    a node), slopes s_l = ∓1/b_l (right/left of q_l) and c_g the midpoint of
    p̂'s log-slope s̄ = p̂'/p̂ at the cell's two ends:

    - S_all ≥ sup Σ_l ℓ_l/b_l² / Σ_l ℓ_l,
    - S_var ≥ sup Σ_l ℓ_l (s_l − c_g)² / Σ_l ℓ_l,
    - reach = min_l dist(cell, q_l)/b_l,
    - flip (n, G − 1) ≥ sup ℓ_l (s_l + c_g)² / Σ_m ℓ_m: term l's share with its slope flipped,
    - D ≥ sup (s̄ − c_g)²: s̄ is nondecreasing on the cell ((log p̂)'' ≥ 0), so
      D is half the cell's rise of s̄, squared,
    - at_q (n,): the grid index of each q_l.

    Each sup takes every numerator term at its larger end value and the
    denominator at its smaller ones.
    """
    if E is None:
        E = np.exp(-np.abs(grid[None, :] - q[:, None]) / b[:, None]) / b[:, None]
    top = np.maximum(E[:, :-1], E[:, 1:])
    low = np.minimum(E[:, :-1], E[:, 1:]).sum(axis=0)
    a, c = grid[None, :-1], grid[None, 1:]
    slope = np.where(a >= q[:, None], -1.0, 1.0) / b[:, None]  # no q_l inside a cell
    with np.errstate(divide="ignore", invalid="ignore"):
        s_a = (E[:, :-1] * slope).sum(axis=0) / E[:, :-1].sum(axis=0)
        s_c = (E[:, 1:] * slope).sum(axis=0) / E[:, 1:].sum(axis=0)
        c_g = (s_a + s_c) / 2
        S_all = (top / (b * b)[:, None]).sum(axis=0) / low
        S_var = (top * (slope - c_g) ** 2).sum(axis=0) / low
        flip = top * (slope + c_g) ** 2 / low
    D = ((s_c - s_a) / 2) ** 2
    dist = np.maximum(0.0, np.maximum(a - q[:, None], q[:, None] - c)) / b[:, None]
    fix = lambda S: np.where(np.isfinite(S), S, np.inf)  # noqa: E731
    at_q = np.searchsorted(grid, q, side="left")
    return fix(S_var), fix(S_all), dist.min(axis=0), fix(flip), fix(D), at_q


def row_curvature(shifts: np.ndarray, b: np.ndarray, curvature, kink_cells: np.ndarray | None = None) -> np.ndarray:
    """K (C, G − 1) with L'' ≥ −K on every grid cell between the kinks of p̂_i.

    Between kinks, (log f)'' of a Laplace mixture is the variance of its
    terms' slopes under the weights w_l ∝ ℓ_l, so L'' = Var_w(s) − Var_v(s′),
    where p̂_i's weights v_l ∝ w_l r_l, with r_l = ℓ_l(x − k_l)/ℓ_l(x − q_l) ∈
    [e^{−M_i}, e^{M_i}], and p̂_i's slopes s′_l are p̂'s except inside the
    kink interval between q_l and k_l, where they are flipped. Two bounds:

    - with Var_w(s) ≥ 0: Var_v(s′) ≤ e^{2 M_i} S_var where no kink interval
      of the row reaches into the cell (M_i < reach), else ≤ e^{2 M_i} S_all;
      always ≤ 1/b_min²;
    - with ``kink_cells`` (C, n) (``searchsorted(grid, q − shifts, side="right") − 1``):
      Var_w(s) = Σ_l w_l (s_l − c)² − (s̄ − c)², Var_v(s′) ≤ Σ_l v_l (s′_l − c)² and
      v_l/w_l = r_l/Σ_m w_m r_m ≤ e^{2 M_i}, so term by term
      L'' ≥ −[(e^{2 M_i} − 1) S_var + e^{2 M_i} Σ_{l flipped in the cell} flip_l + D],
      far smaller for small M_i (the quantities of :func:`cell_curvature`).
    """
    S_var, S_all, reach, flip, D, at_q = curvature
    cap = 1.0 / b.min() ** 2
    M = (np.abs(shifts) / b).max(axis=1, initial=0.0)[:, None]

    def coarse(M):
        S = np.where(M < reach[None, :], S_var[None, :], S_all[None, :])
        # e^{2M} overflows from M ≈ 355 (rows with shifts of hundreds of scales, direct path): the
        # bound is then inf, or NaN where S = 0; fmin takes the cap for both, a valid (looser) bound
        with np.errstate(over="ignore", invalid="ignore"):
            return np.fmin(cap, np.exp(2 * M) * S)

    if kink_cells is None:
        return coarse(M)
    C, n = shifts.shape
    cells = S_var.shape[0]
    # the cells each kink interval meets: [cell(k_l), cell(q_l)) for k_l < q_l, [cell(q_l), cell(k_l)]
    # for k_l > q_l, none for k_l = q_l (q_l is a node; a kink on a node adds a cell: K only loosens)
    lo = np.clip(np.minimum(kink_cells, at_q), 0, cells).ravel()
    hi = np.clip(np.maximum(kink_cells + (shifts < 0), at_q), 0, cells).ravel()
    pairs = np.flatnonzero(hi > lo)
    grow = np.exp(2 * M[:, 0])
    index, weight = [], []
    for o in range(int((hi - lo).max(initial=0))):  # kink intervals span one or two cells, rarely more
        if o:
            pairs = pairs[hi[pairs] > lo[pairs] + o]
        row, g = pairs // n, lo[pairs] + o
        index.append(row * cells + g)
        weight.append(grow[row] * flip.ravel()[pairs % n * cells + g])
    K = np.expm1(2 * M) * S_var[None, :] + D[None, :]
    if index:
        K += np.bincount(np.concatenate(index), np.concatenate(weight), minlength=C * cells).reshape(C, cells)
    np.minimum(K, cap, out=K)
    big = np.flatnonzero(M[:, 0] > 0.5)  # large moves: the first bound can be the tighter one
    if len(big):
        K[big] = np.minimum(K[big], coarse(M[big]))
    return K


def cell_bounds(La, Lc, ma, mc, h, K):
    """Certified bounds (lo, hi) on L over cells [a, a + h] (elementwise arrays).

    Between kinks of p̂_i, L'' ≥ −K (see :func:`row_curvature`), and at a kink
    L' only jumps up. So from the exact end values La, Lc and one-sided
    slopes ma (right of a), mc (left of c):

        L(a + t) ≤ max(La, Lc) + K h²/8,
        L(a + t) ≥ max(f₁(t), f₂(t)),  f₁ = La + t ma − K t²/2,  f₂ = Lc − (h − t) mc − K (h − t)²/2.

    f₁ − f₂ is linear in t, so the smallest max(f₁, f₂) over [0, h] is at
    t = 0, t = h or where they cross.
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        Kh2 = K * h * h
        hi = np.maximum(La, Lc) + Kh2 / 8
        d0 = La - Lc + h * mc + Kh2 / 2  # f₁ − f₂ = d0 + d1 t
        d1 = ma - mc - K * h
        at0 = np.maximum(La, Lc - h * mc - Kh2 / 2)
        ath = np.maximum(La + h * ma - Kh2 / 2, Lc)
        t = np.clip(np.nan_to_num(-d0 / d1, nan=0.0), 0.0, h)
        lo = np.minimum(np.minimum(at0, ath), La + t * ma - K * t * t / 2)
    return lo, hi


def kink_lower_bound(lo, La, Lc, ma, mc, h, K, pair, t):
    """Lower bounds on L over cells that hold kinks of p̂_i, at least as tight as ``lo``.

    :func:`cell_bounds` bounds L from below by the larger of the two end tangents, a V whose
    bottom can lie far below L when the slopes are steep. With the kinks' offsets ``t``
    (sorted within each cell; ``pair`` the cell's index into the per-cell arrays, ascending)
    the tangents bound L at every kink, and between consecutive points (ends or kinks) L has
    no kink, so L'' ≥ −K there and L ≥ min(its end values) − K s²/8 on a stretch of length s.
    The smallest of those stretch bounds is a lower bound on the cell; it is taken where it
    is larger than ``lo``. (On the 10^6 × 100 panel at ε_all/10 it certifies 90% of the
    rows that are not at risk, not 43%.)
    """
    with np.errstate(invalid="ignore", over="ignore"):
        ka, hp = K[pair], h[pair]
        at = np.maximum(La[pair] + t * ma[pair] - ka * t * t / 2,
                        Lc[pair] - (hp - t) * mc[pair] - ka * (hp - t) ** 2 / 2)
        first = np.r_[True, pair[1:] != pair[:-1]]
        last = np.r_[pair[1:] != pair[:-1], True]
        # the stretch left of each kink (from the cell's start or the previous kink) and, after
        # a cell's last kink, the stretch to the cell's end
        t_prev = np.where(first, 0.0, np.r_[0.0, t[:-1]])
        v_prev = np.where(first, La[pair], np.r_[0.0, at[:-1]])
        left = np.minimum(v_prev, at) - ka * (t - t_prev) ** 2 / 8
        right = np.minimum(at, Lc[pair]) - ka * (hp - t) ** 2 / 8
        bound = np.minimum(left, np.where(last, right, np.inf))
        tight = np.full(len(lo), np.inf)
        np.minimum.at(tight, pair, bound)
        return np.maximum(lo, np.where(np.isfinite(tight), tight, -np.inf))


def matters(lo, hi, top, levels=None, sup_levels=None, row_top=None) -> np.ndarray:
    """Bounds not finite, |L| bound above ``top``, a level strictly between lo and hi, or a level
    of ``sup_levels`` (sorted, positive) in [``row_top``, max(hi, −lo)): one that the nodes' largest
    |L| (``row_top``) does not exceed but L might inside, so whether sup |L| exceeds it is open.
    """
    with np.errstate(invalid="ignore"):
        need = ~(np.isfinite(lo) & np.isfinite(hi)) | (hi > top) | (-lo > top)
    if levels is not None and len(levels):
        need |= np.searchsorted(levels, lo, side="right") < np.searchsorted(levels, hi, side="left")
    if sup_levels is not None and len(sup_levels):
        with np.errstate(invalid="ignore"):
            bound = np.maximum(hi, -lo)
        need |= np.searchsorted(sup_levels, row_top, side="left") < np.searchsorted(sup_levels, bound, side="left")
    return need


def insert_after(base: dict, C: int, rows: np.ndarray, after: np.ndarray, values: dict) -> dict:
    """Insert flat new nodes (row ``rows``, right after base column ``after``; rows ascending,
    and within a row ``after`` ascending) among the base columns of every field.

    Rows with fewer new nodes are padded with copies of their first node (zero-length intervals),
    at the start of the row. Base arrays may be 1-D (shared by every row).
    """
    N = next(np.shape(a)[-1] for a in base.values())
    counts = np.bincount(rows, minlength=C)
    width = int(counts.max())
    pad = width - counts
    M = N + width
    rank = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    new = rows * M + after + 1 + pad[rows] + rank  # flat positions of the new nodes
    owner, padded = expand_ranges(np.arange(C) * M, pad)  # flat positions of the copies
    keep = np.ones(C * M, dtype=bool)
    keep[new] = False
    keep[padded] = False
    old = np.flatnonzero(keep)  # integer scatters: faster than boolean-mask assignment
    src = None  # for the shared fields: a gather from [base row, new values] (small, in cache)
    out = {}
    for f, a in base.items():
        v = values[f]
        if np.ndim(a) == 1:
            if src is None:
                src = np.empty(C * M, dtype=np.intp)
                src[old] = np.tile(np.arange(N), C)
                src[new] = N + np.arange(len(new))
                src[padded] = 0
            out[f] = np.concatenate([a, np.asarray(v, dtype=a.dtype)]).take(src).reshape(C, M)
            continue
        m = np.empty(C * M, dtype=a.dtype)
        m[old] = a.reshape(-1)
        m[new] = v
        m[padded] = a[owner, 0]
        out[f] = m.reshape(C, M)
    return out
