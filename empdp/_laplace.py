"""Fast exact node values for Laplace kernels (SPEC 9, the matrix form).

Every term of p̂_i is a Laplace kernel ℓ_{b_l}(x − k_il) with kink
k_il = q_l − Δ_il. Outside the kink interval between q_l and k_il it equals
the unshifted term times e^{−Δ_il/b_l} (right of q_l) or e^{+Δ_il/b_l} (left
of q_l). So on a grid shared by a chunk of individuals, p̂_i, its slope and
its CDF are one BLAS product R (C × 2n) @ B (2n × 3G), followed by exact
fix-ups of the few (individual, term, grid point) triples that fall inside a
kink interval. p̂ on the grid is shared, and between grid nodes it comes from
its Taylor series. The individual's own kinks, where they can matter (see
:func:`node_values`), and the extrema of the log-ratio are summed directly, in
cache-sized (rows × nodes × terms) blocks.

The fix-ups subtract the matrix value e^{±Δ/b}·ℓ from the exact term, so the
matrix form is used only for rows with M_i = max_l |Δ_il|/b_l ≤
:data:`MAX_BOUND`, where that cancellation costs at most e^{2·MAX_BOUND}
units of round-off (< 1e-10 relative); other rows take the direct path.
"""

from __future__ import annotations

import numpy as np

#: largest screening bound M_i handled by the matrix form
MAX_BOUND = 6.0
#: order of the Taylor series of p̂ used between grid nodes
TAYLOR_TERMS = 14
_FACT = np.cumprod(np.r_[1.0, np.arange(1.0, TAYLOR_TERMS + 3)])

FIELDS = ("x", "p", "pr", "pl", "F", "pi", "pir", "pil", "Fi")


#: cells of one (rows × nodes × terms) block in :func:`direct`: small enough to stay in cache
DIRECT_CELLS = 160_000


def direct(x: np.ndarray, centers: np.ndarray, b: np.ndarray):
    """Value, right and left slopes and CDF of (1/n) Σ_l ℓ_{b_l}(x − c_l), exactly.

    ``x`` is (C, m); ``centers`` is (n,) (shared) or (C, n) (one set per row).
    """
    C, m = x.shape
    step = max(1, DIRECT_CELLS // max(1, m * len(b)))
    if C <= step:
        return _direct(x, centers, b)
    out = [np.empty((C, m)) for _ in range(4)]
    for a in range(0, C, step):
        part = _direct(x[a:a + step], centers if centers.ndim == 1 else centers[a:a + step], b)
        for o, p in zip(out, part):
            o[a:a + step] = p
    return tuple(out)


def _direct(x: np.ndarray, centers: np.ndarray, b: np.ndarray):
    n = len(b)
    c = centers[None, None, :] if centers.ndim == 1 else centers[:, None, :]
    U = x[:, :, None] - c
    pos = U >= 0
    at_kink = U == 0
    np.abs(U, out=U)
    U *= -1.0 / b
    U += np.log(0.5 / (b * n))
    e = np.exp(U, out=U)  # the terms ℓ_l(x − c_l) / n
    v = e.sum(axis=2)
    np.negative(e, out=e, where=pos)  # slope sign: −ℓ/b right of the kink, +ℓ/b left of it
    both = e @ np.stack([1.0 / b, b], axis=1)
    dr = both[..., 0]
    F = pos.sum(axis=2) / n + both[..., 1]
    dl = dr
    if at_kink.any():  # at its own kink a term's left slope is +ℓ/b, not −ℓ/b
        dl = dr - 2.0 * np.where(at_kink, e, 0.0) @ (1.0 / b)
    return v, dr, dl, F


class GridPlan:
    """Shared grid quantities for the matrix form (one per model and grid)."""

    def __init__(self, points: np.ndarray, bandwidths: np.ndarray, grid: np.ndarray):
        q, b = points, bandwidths
        n, G = len(q), len(grid)
        self.q, self.b, self.x, self.n, self.G = q, b, grid, n, G
        U = grid[None, :] - q[:, None]
        self.right = U >= 0  # x_g ≥ q_l: the matrix uses the right-hand form of term l
        self.E = np.exp(-np.abs(U) / b[:, None]) * (0.5 / (b * n))[:, None]
        AR = np.where(self.right, self.E, 0.0)
        AL = self.E - AR
        bc = b[:, None]
        self.B = np.block([[AR, -AR / bc, -bc * AR], [AL, AL / bc, bc * AL]])
        self.n_right = self.right.sum(axis=0) / n
        self.shared = [a[0] for a in direct(grid[None, :], q, b)]  # p̂: p, pr, pl, F
        # Taylor coefficients of p̂ to the right of each grid node (no q_l inside a grid cell):
        # the m-th right derivative is Σ_l (∓1/b_l)^m ℓ_l(x_g), − right of q_l, + left of it.
        rate = np.where(self.right, -1.0, 1.0) / bc
        k = np.arange(TAYLOR_TERMS + 1)
        self.taylor = np.einsum("lg,lgk->kg", self.E, rate[:, :, None] ** k) / _FACT[:TAYLOR_TERMS + 1, None]
        # a cell is safe when the series' remainder over the whole cell is below 1e-15 of p̂ there
        h = np.diff(grid, append=grid[-1])
        z = h[None, :] / b[:, None]
        rem = (self.E * np.exp(z) * z ** (TAYLOR_TERMS + 1)).sum(axis=0) / _FACT[TAYLOR_TERMS + 1]
        self.taylor_ok = rem <= 1e-15 * self.shared[0]

    def shared_at(self, x: np.ndarray):
        """p̂'s value, slopes and CDF at points x (C, m) from the grid's Taylor series (exact to 1e-15).

        Points in cells where the series is not accurate enough are evaluated directly.
        """
        g = np.clip(np.searchsorted(self.x, x, side="right") - 1, 0, self.G - 1)
        t = x - self.x[g]
        K, c = TAYLOR_TERMS, self.taylor  # c[k, g] = p̂^(k)(x_g+) / k!
        top = c[K][g]
        v, d, F = top.copy(), top * K, top / (K + 1)
        for k in range(K - 1, -1, -1):
            ck = c[k][g]
            v *= t
            v += ck
            F *= t
            F += ck / (k + 1)
            if k:
                d *= t
                d += ck * k
        F = self.shared[3][g] + F * t
        # at a node that is some q_l, the left slope is the grid's; elsewhere p̂ is smooth
        dl = np.where(t == 0, self.shared[2][g], d)
        bad = ~self.taylor_ok[g] | (t < 0) | ((g == self.G - 1) & (t > 0))  # outside the grid
        if bad.any():
            r, col = np.nonzero(bad)
            ex = direct(x[r, col][:, None], self.q, self.b)
            v[r, col], d[r, col], dl[r, col], F[r, col] = (a[:, 0] for a in ex)
        return v, d, dl, F

    def shifted(self, shifts: np.ndarray):
        """p̂_i on the grid for each row of ``shifts`` (C, n): value, right/left slopes, CDF."""
        q, b, x, n, G = self.q, self.b, self.x, self.n, self.G
        C = shifts.shape[0]
        r = shifts / b
        Rm, Rp = np.exp(-r), np.exp(r)
        out = np.concatenate([Rm, Rp], axis=1) @ self.B
        V, Dr, Fi = out[:, :G], out[:, G:2 * G], out[:, 2 * G:] + self.n_right
        Dl = Dr.copy()
        # fix-ups: grid points in the closed interval between q_l and its kink k_il
        kinks = q - shifts
        lo = np.searchsorted(x, np.minimum(q, kinks), side="left").ravel()
        hi = np.searchsorted(x, np.maximum(q, kinks), side="right").ravel()
        cnt = hi - lo
        total = int(cnt.sum())
        pair = np.repeat(np.arange(C * n), cnt)
        g = np.repeat(lo, cnt) + (np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        row, term = pair // n, pair % n
        bl = b[term]
        u = x[g] - kinks.ravel()[pair]
        tv = np.exp(-np.abs(u) / bl) * (0.5 / (bl * n))
        side = self.right[term, g]
        mv = self.E[term, g] * np.where(side, Rm.ravel()[pair], Rp.ravel()[pair])
        ms = np.where(side, -mv, mv)
        flat = row * G + g
        size = C * G

        def add(target, w):
            target += np.bincount(flat, weights=w, minlength=size).reshape(C, G)

        add(V, tv - mv)
        add(Dr, (np.where(u >= 0, -tv, tv) - ms) / bl)
        add(Dl, (np.where(u > 0, -tv, tv) - ms) / bl)
        add(Fi, np.where(u < 0, bl * tv, 1.0 / n - bl * tv) - np.where(side, 1.0 / n - bl * mv, bl * mv))
        return V, Dr, Dl, Fi


def merge(base: dict, extra: dict, pos: np.ndarray) -> dict:
    """Insert ``extra`` columns (C, W) at new positions ``pos`` (C, W) among ``base`` (C, N) columns.

    ``pos`` must be increasing along each row; base columns keep their order.
    Base arrays may be 1-D (shared by every row).
    """
    C, W = pos.shape
    N = next(a.shape[-1] for a in base.values())
    keep = np.ones((C, N + W), dtype=bool)
    rows = np.repeat(np.arange(C), W)
    keep[rows, pos.ravel()] = False
    out = {}
    for f, a in base.items():
        m = np.empty((C, N + W))
        m[keep] = np.broadcast_to(a, (C, N)).ravel()
        m[rows, pos.ravel()] = extra[f].ravel()
        out[f] = m
    return out


def node_values(plan: GridPlan, shifts: np.ndarray, levels: np.ndarray | None = None):
    """Exact densities on the grid plus the row's kinks that matter, merged in order (before extrema).

    A kink of p̂_i strictly inside a grid cell becomes a node only if the
    cell's interior can matter (:func:`cells_that_matter`, with the row's
    largest |L| on the grid), or if it lies outside the grid. ``levels``
    (sorted ±ε) None asks for ε_i only.
    """
    q, b, x, G = plan.q, plan.b, plan.x, plan.G
    C, n = shifts.shape
    p, pr, pl, F = plan.shared
    pi, pir, pil, Fi = plan.shifted(shifts)
    base = {"x": plan.x, "p": p, "pr": pr, "pl": pl, "F": F, "pi": pi, "pir": pir, "pil": pil, "Fi": Fi}
    kinks = np.sort(q - shifts, axis=1)
    g = np.searchsorted(x, kinks, side="right") - 1  # x_g ≤ kink < x_{g+1}
    on_node = (g >= 0) & (x[np.clip(g, 0, G - 1)] == kinks)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(p) - np.log(pi)
        Lr, Ll = pr / p - pir / pi, pl / p - pil / pi
    with np.errstate(invalid="ignore"):
        top = np.nanmax(np.abs(L), axis=1, keepdims=True)
    need = cells_that_matter(L, Lr, Ll, np.diff(x), b.min(), top, levels)
    outside = (g < 0) | (g >= G - 1)
    take = ~on_node & (outside | need[np.arange(C)[:, None], np.clip(g, 0, G - 2)])
    rows, cols = np.nonzero(take)
    if not len(rows):
        return {f: np.broadcast_to(a, (C, G)).copy() for f, a in base.items()}
    kx = kinks[rows, cols]
    kv = [a[:, 0] for a in plan.shared_at(kx[:, None])]
    kvi = [a[:, 0] for a in direct(kx[:, None], (q[None, :] - shifts)[rows], b)]
    return insert_after(base, C, rows, g[rows, cols], dict(zip(FIELDS, (kx, *kv, *kvi))))


def cells_that_matter(L, Lr, Ll, h, b_min: float, top, levels=None) -> np.ndarray:
    """Cells (C, N−1) between nodes whose interior can change ε_i or δ_i(ε) at ``levels``.

    Between kinks of p̂_i, L'' ≥ −1/b_min², and at a kink L' only jumps up, so
    from the exact end values L and one-sided slopes Lr (right), Ll (left):

        L ≤ max(L_a, L_c) + h²/(8 b_min²),
        L ≥ max(min(L_a, L_a + h Lr_a − h²/(2 b_min²)), min(L_c, L_c − h Ll_c − h²/(2 b_min²))).

    A cell matters if these bounds are not finite, its |L| bound exceeds
    ``top`` (C, 1), the row's largest |L| known, or a level of ``levels``
    (sorted ±ε) lies strictly between them.
    """
    La, Lc, ma, mc = L[:, :-1], L[:, 1:], Lr[:, :-1], Ll[:, 1:]
    curve = h * h / b_min**2
    with np.errstate(invalid="ignore"):
        hi = np.maximum(La, Lc) + curve / 8
        lo = np.maximum(np.minimum(La, La + h * ma - curve / 2), np.minimum(Lc, Lc - h * mc - curve / 2))
        need = ~(np.isfinite(lo) & np.isfinite(hi)) | (hi > top) | (-lo > top)
    if levels is not None and len(levels):
        need |= np.searchsorted(levels, lo, side="right") < np.searchsorted(levels, hi, side="left")
    return need


def insert_after(base: dict, C: int, rows: np.ndarray, after: np.ndarray, values: dict) -> dict:
    """Insert flat new nodes (row ``rows``, right after base column ``after``; rows ascending,
    and within a row ``after`` ascending) among the base columns of every field.

    Rows with fewer new nodes are padded with copies of their first node (zero-length intervals).
    """
    N = next(np.shape(a)[-1] for a in base.values())
    counts = np.bincount(rows, minlength=C)
    width = int(counts.max())
    pad = width - counts
    rank = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    col = pad[rows] + rank
    pos = np.broadcast_to(np.arange(width), (C, width)).copy()
    pos[rows, col] = after + 1 + pad[rows] + rank
    extra = {}
    for f, v in values.items():
        a = np.repeat(np.broadcast_to(base[f], (C, N))[:, :1], width, axis=1)
        a[rows, col] = v
        extra[f] = a
    return merge(base, extra, pos)
