"""Fast exact node values for Laplace kernels (docs/method.md#53-matrix-form-laplace, the matrix form).

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

from .cells import (
    _by_cell,
    _kinks_lower,
    _within,
    cell_bounds,
    cell_curvature,
    expand_ranges,
    insert_after,
    matters,
    row_curvature,
    tail_limits,
)

#: largest screening bound M_i handled by the matrix form
MAX_BOUND = 6.0
#: order of the Taylor series of p̂ used between grid nodes
TAYLOR_TERMS = 14
_FACT = np.cumprod(np.r_[1.0, np.arange(1.0, TAYLOR_TERMS + 3)])

FIELDS = ("x", "p", "pr", "pl", "F", "pi", "pir", "pil", "Fi")
#: the CDFs as tails, F = G + K (p̂: G, K; p̂_i: Gi, Ki), where they are kept (see :func:`direct`)
TAILS = ("G", "K", "Gi", "Ki")

#: |L| is capped here (beyond it e^ε overflows; the densities are then 0 to double precision)
L_CAP = 700.0


def log_ratio(p, pi, pr, pir, pl, pil):
    """L = log p̂ − log p̂_i and its right and left slopes, as :func:`finite_log_ratio` leaves them."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return finite_log_ratio(np.log(p) - np.log(pi), pr / p - pir / pi, pl / p - pil / pi)


def finite_log_ratio(L, Lr, Ll):
    """L clipped to ±:data:`L_CAP` (NaN, where both densities vanish: 0), non-finite slopes 0."""
    if np.isfinite(L).all():
        L = np.clip(L, -L_CAP, L_CAP)
    else:
        L = np.clip(np.nan_to_num(L, nan=0.0, posinf=L_CAP, neginf=-L_CAP), -L_CAP, L_CAP)
    Lr, Ll = (s if np.isfinite(s).all() else np.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0) for s in (Lr, Ll))
    return L, Lr, Ll


#: cells of one (rows × nodes × terms) block in :func:`direct`: small enough to stay in cache
DIRECT_CELLS = 160_000


def direct(x: np.ndarray, centers: np.ndarray, b: np.ndarray, tails: bool = False):
    """Value, right and left slopes and CDF of (1/n) Σ_l ℓ_{b_l}(x − c_l), exactly.

    ``x`` is (C, m); ``centers`` is (n,) (shared) or (C, n) (one set per row). With ``tails``, also
    the CDF as G and K (F = G + K; see :class:`empdp.risk.nodes._Nodes`): G = Σ_{c > x} bℓ − Σ_{c ≤ x} bℓ,
    each term's smaller tail, and K the share of the centres c ≤ x.
    """
    C, m = x.shape
    step = max(1, DIRECT_CELLS // max(1, m * len(b)))
    if C <= step:
        return _direct(x, centers, b, tails=tails)
    out = [np.empty((C, m)) for _ in range(6 if tails else 4)]
    # two (step, m, n) work buffers serve every block (fresh ones would cost page faults)
    work = (np.empty((step, m, len(b))), np.empty((step, m, len(b))))
    for a in range(0, C, step):
        part = _direct(x[a:a + step], centers if centers.ndim == 1 else centers[a:a + step], b, work, tails)
        for o, p in zip(out, part):
            o[a:a + step] = p
    return tuple(out)


def _direct(x: np.ndarray, centers: np.ndarray, b: np.ndarray, work=None, tails: bool = False):
    n = len(b)
    C, m = x.shape
    c = centers[None, None, :] if centers.ndim == 1 else centers[:, None, :]
    if work is None:
        U, e = np.empty((C, m, n)), np.empty((C, m, n))
    else:
        U, e = work[0][:C], work[1][:C]
    # + 0.0: no −0.0 in x, so U carries the side of the kink in its sign
    np.subtract((x + 0.0)[:, :, None], c, out=U)
    np.abs(U, out=e)
    e *= -1.0 / b
    np.exp(e, out=e)  # e^{−|x − c_l|/b_l}; the weights 1/(2 b_l n) go into the products below
    w = 0.5 / (b * n)
    at_kink = np.flatnonzero(U == 0)
    below = np.count_nonzero(np.signbit(U), axis=2)  # terms whose kink is right of x
    # slope −ℓ/b right of the kink (U ≥ 0), +ℓ/b left of it; CDF 1/n − bℓ right, bℓ left.
    # The sign comes from U by copysign (a masked ufunc would cost as much as the exp).
    signed = np.copysign(e, U, out=U).reshape(-1, n)
    v = (e.reshape(-1, n) @ w).reshape(x.shape)
    both = (signed @ np.stack([-w / b, -w * b], axis=1)).reshape(*x.shape, 2)
    dr = both[..., 0]
    K = (n - below) / n
    F = K + both[..., 1]
    dl = dr
    if len(at_kink):  # at its own kink a term's left slope is +ℓ/b, not −ℓ/b
        term = at_kink % n
        dl = dr + (np.bincount(at_kink // n, weights=2.0 * e.ravel()[at_kink] * w[term] / b[term],
                               minlength=dr.size).reshape(x.shape))
    if tails:
        return v, dr, dl, F, both[..., 1].copy(), K
    return v, dr, dl, F


class GridPlan:
    """Shared grid quantities for the matrix form (one per model and grid)."""

    def __init__(self, points: np.ndarray, bandwidths: np.ndarray, grid: np.ndarray):
        q, b = points, bandwidths
        n, G = len(q), len(grid)
        self.q, self.b, self.x, self.n, self.G = q, b, grid, n, G
        #: one global scale: p̂_i on the grid and at its kinks by running sums (:func:`uniform_grid_values`)
        self.uniform = n > 0 and bool(np.all(b == b[0]))
        if self.uniform:
            with np.errstate(under="ignore"):
                self.decay = np.exp(np.diff(grid) * (-1.0 / b[0]))  # e^{−(x_{g+1} − x_g)/b}
        U = grid[None, :] - q[:, None]
        self.right = U >= 0  # x_g ≥ q_l: the matrix uses the right-hand form of term l
        self.E = np.exp(-np.abs(U) / b[:, None]) * (0.5 / (b * n))[:, None]
        AR = np.where(self.right, self.E, 0.0)
        AL = self.E - AR
        bc = b[:, None]
        self.B = np.block([[AR, -AR / bc, -bc * AR], [AL, AL / bc, bc * AL]])
        self.n_right = self.right.sum(axis=0) / n
        self.chunks = _triangular_chunks(q, grid, self.B)
        #: p̂'s CDF as tails (G, K) on the grid (several scales only; see :func:`direct`), else None
        self.tails = None
        if self.uniform:  # p̂ by the running sums of p̂_i: their round-off cancels in log p̂ − log p̂_i
            self.shared = [a[0] for a in uniform_grid_values(grid, self.decay, q[None, :], b[0])]
        else:
            *shared, G, K = (a[0] for a in direct(grid[None, :], q, b, tails=True))
            self.shared, self.tails = shared, (G, K)  # p̂: p, pr, pl, F
        # Taylor coefficients of p̂ to the right of each grid node (no q_l inside a grid cell):
        # the m-th right derivative is Σ_l (∓1/b_l)^m ℓ_l(x_g), − right of q_l, + left of it.
        # As two small products, AR's terms at rate −1/b_l and AL's at +1/b_l (an einsum over the
        # (n, G, K) powers cost 30 ms a plan, 3% of a large run's evaluation)
        k = np.arange(TAYLOR_TERMS + 1)[:, None]
        inv = 1.0 / b[None, :]
        self.taylor = ((-inv) ** k @ AR + inv ** k @ AL) / _FACT[:TAYLOR_TERMS + 1, None]
        # a cell is safe when the series' remainder over the whole cell is below 1e-15 of p̂ there
        h = np.diff(grid, append=grid[-1])
        z = h[None, :] / b[:, None]
        # cells of hundreds of scales (far in a gap between the points, see empdp._grid._fill_gaps)
        # overflow e^z and z^15 (and E = 0 there gives 0·inf = NaN): the bound is then inf or
        # NaN, the cell not safe, and its points are evaluated directly, as they should be
        with np.errstate(over="ignore", invalid="ignore"):
            rem = (self.E * np.exp(z) * z ** (TAYLOR_TERMS + 1)).sum(axis=0) / _FACT[TAYLOR_TERMS + 1]
        self.taylor_ok = rem <= 1e-15 * self.shared[0]
        self.curvature = cell_curvature(q, b, grid, self.E)
        self.at_q = self.curvature[-1]  # grid index of each q_l

    def shared_at(self, x: np.ndarray, cells: np.ndarray | None = None):
        """p̂'s value, slopes and CDF at points x (C, m) from the grid's Taylor series (exact to 1e-15),
        and with :attr:`tails` the CDF's G and K too.

        Points in cells where the series is not accurate enough are evaluated directly.
        ``cells``, when known: ``searchsorted(grid, x, side="right") − 1``.
        """
        if cells is None:
            cells = np.searchsorted(self.x, x, side="right") - 1
        g = np.clip(cells, 0, self.G - 1)
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
        # the mass from the node on (no q_l inside a cell: K is the node's), to the tails too
        out = [v, d, None, self.shared[3][g] + F * t]
        if self.tails is not None:
            out += [self.tails[0][g] + F * t, self.tails[1][g].copy()]
        # at a node that is some q_l, the left slope is the grid's; elsewhere p̂ is smooth
        out[2] = np.where(t == 0, self.shared[2][g], d)
        bad = ~self.taylor_ok[g] | (t < 0) | ((g == self.G - 1) & (t > 0))  # outside the grid
        if bad.any():
            r, col = np.nonzero(bad)
            ex = direct(x[r, col][:, None], self.q, self.b, tails=self.tails is not None)
            for a, e in zip(out, ex):
                a[r, col] = e[:, 0]
        return tuple(out)

    def shifted(self, shifts: np.ndarray, kink_cells: np.ndarray | None = None, tails: bool = False):
        """p̂_i on the grid for each row of ``shifts`` (C, n): value, right/left slopes, CDF, and with
        ``tails`` (several scales only) the CDF's G and K (see :func:`direct`).

        ``kink_cells`` (C, n), when known: ``searchsorted(grid, q − shifts, side="right") − 1``.
        """
        q, b, x, n, G = self.q, self.b, self.x, self.n, self.G
        if self.uniform:
            return uniform_grid_values(x, self.decay, q[None, :] - shifts, b[0], kink_cells)
        C = shifts.shape[0]
        r = shifts / b
        Rm, Rp = np.exp(-r), np.exp(r)
        V, Dr, Fi = (np.empty((C, G)) for _ in range(3))
        order = self.chunks[0]
        # left-hand weights then right-hand ones, each in q order: a chunk's terms are one column range
        R = np.concatenate([Rp[:, order], Rm[:, order]], axis=1)
        for g0, g1, lo, hi, BB in self.chunks[1]:
            w = g1 - g0
            part = R[:, lo:hi] @ BB
            V[:, g0:g1], Dr[:, g0:g1], Fi[:, g0:g1] = part[:, :w], part[:, w:2 * w], part[:, 2 * w:]
        Gi = Fi.copy() if tails else None  # the product's CDF part is G's: each term's smaller tail
        Fi += self.n_right
        Dl = Dr.copy()
        # fix-ups: grid points where the matrix form of term l is wrong. Kink left of q_l
        # (Δ > 0): [k_il, q_l) (at q_l the right-hand form is exact); kink right of q_l
        # (Δ ≤ 0): [q_l, k_il] (at k_il the left slope, also when k_il = q_l).
        kinks = q - shifts
        at_q = self.at_q[None, :]
        left_of_q = shifts > 0
        right_end = (np.searchsorted(x, kinks, side="right") if kink_cells is None else kink_cells + 1)
        on_node = x[np.clip(right_end - 1, 0, G - 1)] == kinks  # (with right_end ≥ 1; else no node ≤ k)
        left_end = right_end - (on_node & (right_end > 0))  # searchsorted(x, kinks, side="left")
        lo = np.where(left_of_q, left_end, at_q).ravel()
        hi = np.where(left_of_q, at_q, right_end).ravel()
        pair, g = expand_ranges(lo, hi - lo)
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
        if not tails:
            return V, Dr, Dl, Fi
        # the same fix-ups split as F = G + K: each term's tail, and its step of 1/n at its centre
        add(Gi, np.where(u < 0, bl * tv, -bl * tv) - np.where(side, -bl * mv, bl * mv))
        Ki = np.broadcast_to(self.n_right, (C, G)).copy()
        add(Ki, np.where(u < 0, 0.0, 1.0 / n) - np.where(side, 1.0 / n, 0.0))
        return V, Dr, Dl, Fi, Gi, Ki


def _running(start: np.ndarray, decay: np.ndarray, inflow: np.ndarray, reverse: bool = False) -> np.ndarray:
    """S_0 = inflow_0 + start, S_j = S_{j−1}·decay_{j−1} + inflow_j along axis 0 (reversed: from the end).

    ``inflow`` (J, C) is overwritten with S; ``decay`` (J − 1,) or (J − 1, C). The loop over the J nodes
    is compiled (:func:`empdp.compiled.running`): J grows with the number of databases.
    """
    from .. import compiled  # numba: loaded by the evaluation only, never by --help or an audit

    if start is not None:
        inflow[-1 if reverse else 0] += start
    if decay.ndim == 1:
        decay = np.broadcast_to(decay[:, None], (len(decay), inflow.shape[1]))
    compiled.running(decay, inflow, reverse)
    return inflow


def uniform_grid_values(x: np.ndarray, decay: np.ndarray, kinks: np.ndarray, b: float,
                        kink_cells: np.ndarray | None = None):
    """Value, right and left slopes and CDF of p̂_i = (1/n) Σ_l ℓ_b(x_g − k_il) on the grid ``x``
    for each row of ``kinks`` (C, n), one scale b for every term.

    With A_g = Σ_{k_l ≤ x_g} e^{−(x_g − k_l)/b} and B_g = Σ_{k_l > x_g} e^{−(k_l − x_g)/b},
    p̂_i = w (A + B), its right slope (w/b)(B − A), its CDF #{k_l ≤ x_g}/n − w b (A − B) with
    w = 1/(2 b n), and the left slope adds 2 w/b for each kink on x_g. A and B are running sums
    over the grid: A_g = A_{g−1} e^{−(x_g − x_{g−1})/b} + the terms of the kinks in (x_{g−1}, x_g],
    each entering at its first node at or right of it (B mirrored). Every factor is at most 1,
    so nothing overflows, and the sums carry a few units of round-off (the matrix form's
    product carries as many). ``kink_cells``, when known: ``searchsorted(x, kinks, side="right") − 1``.
    """
    C, n = kinks.shape
    G = len(x)
    nb = -1.0 / b
    if kink_cells is None:
        first = np.searchsorted(x, kinks, side="left")  # first node ≥ k (G: none)
    else:  # one less where the kink is on node x_{cell}
        first = kink_cells + 1
        first -= (kink_cells >= 0) & (x[np.maximum(kink_cells, 0)] == kinks)
    rows = np.broadcast_to(np.arange(C)[:, None], (C, n))
    with np.errstate(under="ignore"):
        # A enters at node `first` with e^{−(x_first − k)/b}; B at node first − 1 with e^{−(k − x_{first−1})/b}
        inA = first < G
        wA = np.exp((x[np.minimum(first, G - 1)] - kinks) * nb)
        inB = first > 0
        wB = np.exp((kinks - x[np.maximum(first - 1, 0)]) * nb)
    # node-major (G, C): the running sums step over contiguous rows of the same length
    A = np.bincount((first * C + rows)[inA], weights=wA[inA], minlength=G * C).reshape(G, C)
    B = np.bincount(((first - 1) * C + rows)[inB], weights=wB[inB], minlength=G * C).reshape(G, C)
    on = inA & (x[np.minimum(first, G - 1)] == kinks)  # kinks on a node
    A = _running(None, decay, A)
    B = _running(None, decay, B, reverse=True)
    # kinks ≤ x_g: those entering A at or before node g
    le = np.cumsum(np.bincount((first * C + rows)[inA], minlength=G * C).reshape(G, C), axis=0)
    w = 0.5 / (b * n)
    D = B - A
    V = (w * (A + B)).T
    Dr = (D * (w / b)).T
    F = (le * (1.0 / n) + D * (w * b)).T
    Dl = Dr
    if on.any():
        at = np.bincount((first * C + rows)[on], minlength=G * C).reshape(G, C).T
        Dl = Dr + at * (2.0 * w / b)
    return np.ascontiguousarray(V), np.ascontiguousarray(Dr), np.ascontiguousarray(Dl), np.ascontiguousarray(F)


def uniform_kink_values(kinks: np.ndarray, b: float):
    """:func:`direct` of each row of sorted ``kinks`` (C, n) at its own kinks, one scale b: value,
    right and left slopes and CDF (C, n), by running sums over the sorted kinks.

    At kink m, A = Σ_{k_l ≤ k_m} e^{−(k_m − k_l)/b} and B = Σ_{k_l > k_m} e^{−(k_l − k_m)/b}
    (a tie with k_m counts in A, as :func:`direct` puts x − c = 0 right of the kink).
    """
    C, n = kinks.shape
    d = np.diff(kinks, axis=1).T  # (n − 1, C)
    with np.errstate(under="ignore"):
        f = np.exp(d * (-1.0 / b))
    A = _running(None, f, np.ones((n, C)))
    B = np.zeros((n, C))
    if n > 1:
        B[:-1] = f  # the next kink's term seen from kink m, then B_m = f_m (1 + B_{m+1})
        _running(None, f, B[:-1], reverse=True)
    # ties: every kink of a tie group takes the group's last A and B (and counts all of it)
    tie = d == 0
    idx = np.broadcast_to(np.arange(n)[:, None], (n, C))
    ties = bool(tie.any())
    if ties:
        end = np.where(np.r_[~tie, np.ones((1, C), dtype=bool)], idx, n)
        last = np.minimum.accumulate(end[::-1], axis=0)[::-1]
        start = np.where(np.r_[np.ones((1, C), dtype=bool), ~tie], idx, -1)
        first = np.maximum.accumulate(start, axis=0)
        cols = np.arange(C)[None, :]
        A, B = A[last, cols], B[last, cols]
        count, at = last + 1, last - first + 1
    else:
        count, at = idx + 1, 1
    w = 0.5 / (b * n)
    D = B - A
    V = (w * (A + B)).T
    Dr = (D * (w / b)).T
    Dl = Dr + (at * (2.0 * w / b)).T if ties else Dr + 2.0 * w / b
    F = (count * (1.0 / n) + D * (w * b)).T
    return V, Dr, Dl, F




#: grid chunks of the matrix form's product (see :func:`_triangular_chunks`)
PRODUCT_CHUNKS = 8


def _triangular_chunks(q: np.ndarray, grid: np.ndarray, B: np.ndarray, count: int = PRODUCT_CHUNKS):
    """The matrix form's product R @ B in chunks of grid nodes that skip B's zero blocks.

    At node x_g, term l takes its right-hand form (weight e^{−Δ/b}, the top
    half of B) if q_l ≤ x_g, else its left-hand form (e^{+Δ/b}, the bottom
    half): in q order, each half of B is zero on one side of a staircase. A
    chunk of nodes [g0, g1) needs the right-hand forms of the terms with
    q_l ≤ x_{g1−1} and the left-hand forms of those with q_l > x_{g0}: with
    chunks holding n/count of the q_l each, about (1 + 1/count)/2 of the full
    product. Returns the q order and, per chunk, (g0, g1, lo, hi, BB) for
    ``R[:, lo:hi] @ BB`` with R = [R_left[:, order], R_right[:, order]] (C × 2n): the left-hand
    forms of the terms from a_lo on, then the right-hand forms of the first a_hi, one column
    range, so one product per chunk.
    """
    n, G = len(q), len(grid)
    order = np.argsort(q, kind="stable")
    a = np.searchsorted(q[order], grid, side="right")  # terms right of their q_l at each node
    bounds = np.unique(np.r_[0, np.searchsorted(a, np.arange(1, count) * n / count, side="left"), G])
    chunks = []
    for g0, g1 in zip(bounds[:-1], bounds[1:]):
        cols = np.r_[g0:g1, G + g0:G + g1, 2 * G + g0:2 * G + g1]
        a_hi, a_lo = int(a[g1 - 1]), int(a[g0])
        BB = np.ascontiguousarray(np.concatenate([B[n + order[a_lo:]], B[order[:a_hi]]])[:, cols])
        chunks.append((int(g0), int(g1), a_lo, n + a_hi, BB))
    return order, chunks


def merge(base: dict, extra: dict, pos: np.ndarray) -> dict:
    """Insert ``extra`` columns (C, W) at new positions ``pos`` (C, W) among ``base`` (C, N) columns.

    ``pos`` must be increasing along each row; base columns keep their order.
    Base arrays may be 1-D (shared by every row).
    """
    C, W = pos.shape
    N = next(a.shape[-1] for a in base.values())
    new = (np.repeat(np.arange(C) * (N + W), W) + pos.ravel())  # flat positions of the new columns
    keep = np.ones(C * (N + W), dtype=bool)
    keep[new] = False
    old = np.flatnonzero(keep)  # integer scatters: faster than boolean-mask assignment
    out = {}
    for f, a in base.items():
        m = np.empty((C, N + W), dtype=a.dtype)
        flat = m.reshape(-1)
        flat[old] = np.broadcast_to(a, (C, N)).reshape(-1)
        flat[new] = extra[f].reshape(-1)
        out[f] = m
    return out


def node_values(plan: GridPlan, shifts: np.ndarray, levels: np.ndarray | None = None,
                clear_below: float | None = None, need_eps_i: bool = True,
                sup_levels: np.ndarray | None = None):
    """Exact densities on the grid plus the row's kinks that matter, merged in order (before extrema).

    A kink of p̂_i strictly inside a grid cell becomes a node only if the
    cell's interior can matter (:func:`cell_bounds`, with lower bounds
    tightened by the kinks' positions, :func:`kink_lower_bound`, and
    :func:`matters`, with
    the row's largest |L| on the grid unless ``need_eps_i`` is False: then
    only for δ_i at ``levels``), or if it lies outside the grid. ``levels``
    (sorted ±ε) None asks for ε_i only. At ``sup_levels`` (sorted ε > 0) only
    whether sup |L| exceeds them is asked: the nodes' largest |L| must decide it,
    which needs nodes in far fewer cells than every crossing does.

    Returns ``(values, rows, K)``: the node values of the rows kept (with
    ``certified``: True on a node whose interval to the next node is a cell
    whose kinks were left out, so nothing in it matters, and the log-ratio
    ``L``, ``Lr``, ``Ll`` of :func:`log_ratio`) and their
    :func:`row_curvature` on the grid cells. With
    ``clear_below`` a row is dropped when the certified bounds show
    sup |L| ≤ ``clear_below`` (then ε_i ≤ clear_below and δ_i(ε) = 0 for
    every ε ≥ clear_below); otherwise every row is kept.
    """
    q, b, x, G = plan.q, plan.b, plan.x, plan.G
    C, n = shifts.shape
    p, pr, pl, F = plan.shared
    unsorted = q - shifts
    cells = np.searchsorted(x, unsorted, side="right") - 1  # x_g ≤ kink < x_{g+1}
    tails = plan.tails is not None  # the CDFs as tails too: the far tails' masses keep their digits
    pi, pir, pil, Fi, *tails_i = plan.shifted(shifts, cells, tails=tails)
    kinks = np.sort(unsorted, axis=1)
    g = np.sort(cells, axis=1)  # searchsorted is monotone: the cells of the sorted kinks
    on_node = (g >= 0) & (x[np.clip(g, 0, G - 1)] == kinks)
    outside = (g < 0) | (g >= G - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(p) - np.log(pi)
        Lr, Ll = pr / p - pir / pi, pl / p - pil / pi
        top = np.nanmax(np.abs(L), axis=1, keepdims=True)
    K = row_curvature(shifts, b, plan.curvature, cells)
    rows = np.arange(C)
    if clear_below is not None:
        # only rows whose grid values stay within ±clear_below can be cleared: bound them
        with np.errstate(invalid="ignore"):
            open_ = np.flatnonzero(~(top[:, 0] > clear_below) & ~outside.any(axis=1))
        keep = np.ones(C, dtype=bool)
        within = open_[_within(open_, L, Lr, Ll, x, K, kinks, g, on_node, clear_below)]
        if len(within):
            with np.errstate(invalid="ignore"):
                keep[within] = ~(tail_limits(plan.q, plan.b, shifts[within]) <= clear_below)
        rows = np.flatnonzero(keep)
        if len(rows) < C:
            shifts, kinks, g, on_node, outside, top, K = (a[rows] for a in (shifts, kinks, g, on_node, outside, top, K))
            pi, pir, pil, Fi, L, Lr, Ll = (a[rows] for a in (pi, pir, pil, Fi, L, Lr, Ll))
            tails_i = [a[rows] for a in tails_i]
            C = len(rows)
    base = {"x": plan.x, "p": p, "pr": pr, "pl": pl, "F": F, "pi": pi, "pir": pir, "pil": pil, "Fi": Fi}
    if tails:
        base |= dict(zip(TAILS, (*plan.tails, *tails_i)))
    # the kinks strictly inside a grid cell that matters, and those outside the grid
    inner = ~on_node & ~outside
    r, c = np.nonzero(inner)
    cell = g[r, c]
    lo, hi = cell_bounds(L[r, cell], L[r, cell + 1], Lr[r, cell], Ll[r, cell + 1], x[cell + 1] - x[cell], K[r, cell])
    top_k = top[r, 0] if need_eps_i else np.full(len(r), np.inf)
    need = matters(lo, hi, top_k, levels, sup_levels, top[r, 0])
    if need.any():  # the cells that seem to matter, again with the lower bounds the kinks allow
        k = np.flatnonzero(need)  # every kink of such a cell (the bounds are the cell's)
        starts, pair = _by_cell(r[k], cell[k], G)
        lo_cell = _kinks_lower(lo[k[starts]], L, Lr, Ll, x, K, r[k], cell[k], kinks[r[k], c[k]], starts, pair)
        need[k] = matters(lo_cell[pair], hi[k], top_k[k], levels, sup_levels, top[r[k], 0])
    take = outside & ~on_node
    take[r, c] = need
    # cells whose kinks were left out: their bounds show that nothing in them matters, which
    # :func:`empdp.risk._insert_extrema` need not check again (the same cell, the same bounds)
    certified = np.zeros((C, G), dtype=bool)
    certified[r[~need], cell[~need]] = True
    base["certified"] = certified
    # the log-ratio on the grid (as risk._log_ratio would compute it again after the merge)
    base.update(zip(("L", "Lr", "Ll"), finite_log_ratio(L, Lr, Ll)))
    kr, kc = np.nonzero(take)
    if not len(kr):
        return {f: np.broadcast_to(a, (C, G)).copy() for f, a in base.items()}, rows, K
    kx = kinks[kr, kc]
    kv = [a[:, 0] for a in plan.shared_at(kx[:, None], g[kr, kc][:, None])]
    if plan.uniform:  # the row's own kinks, by running sums over them
        kvi = [a[kr, kc] for a in uniform_kink_values(kinks, b[0])]
    else:
        kvi = [a[:, 0] for a in direct(kx[:, None], (q[None, :] - shifts)[kr], b, tails=tails)]
    values = dict(zip(FIELDS, (kx, *kv[:4], *kvi[:4])), certified=np.zeros(len(kx), dtype=bool))
    if tails:
        values |= dict(zip(TAILS, (*kv[4:], *kvi[4:])))
    values.update(zip(("L", "Lr", "Ll"), log_ratio(kv[0], kvi[0], kv[1], kvi[1], kv[2], kvi[2])))
    return insert_after(base, C, kr, g[kr, kc], values), rows, K
