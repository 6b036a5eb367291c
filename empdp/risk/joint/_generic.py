"""Exact ε_i and δ_i(ε) for any d ≤ 3, one individual at a time (docs/method.md#102-joint-queries).

The general path: d = 3, and the d = 2 rows the matrix form of :mod:`._cells` cannot certify.
Everything runs in scaled coordinates u = T x, where each kernel is 2^{−d} exp(−|u − a_j|_1).

**Structure used.** Along any line parallel to an axis both densities are 1-d Laplace mixtures with
positive weights, so between consecutive kinks (the coordinates of both point sets on that axis)
L is monotone (a Möbius function of e^{2u}); beyond the outermost kink every term carries the same
factor e^{∓u_k}, so L does not depend on u_k there. Consequences, all exact:

* On each cell of the grid of kink hyperplanes both densities are Σ_{σ∈{±1}^d} A_σ e^{σ·u}, and
  L restricted to any box inside a cell attains its max and min at the box's vertices.
* At a kink of p̂ only, L has a concave corner along the axis (its slope jumps down); at a kink of
  p̂_i only, a convex one. So sup L along an axis line is attained at a kink of p̂ or in a tail
  plateau, and inf L at a kink of p̂_i or in a tail. Moving one coordinate at a time,

      sup L = max of L over Π_k ({a_jk} ∪ {far left, far right}),
      inf L = min of L over Π_k ({a_jk − s_ijk} ∪ {far left, far right}),

  so ε_i = max(sup L, −inf L) is exact from (n + 2)^d vertex values per set.
* δ_i(ε) = max(∫(p̂ − e^ε p̂_i)_+, ∫(p̂_i − e^ε p̂)_+). A cell whose vertices all have L ≥ ε lies
  inside {L ≥ ε} and contributes its exact mass difference (products of Laplace CDF differences);
  one whose vertices all have L ≤ ε contributes 0. On the few cells the level cuts, the integrand
  h = Σ_σ C_σ e^{σ·t} is integrated exactly along the first axis (αe^t + βe^{−t} has one root),
  and by Gauss–Legendre along the others, on pieces split where the level crosses the cell's edges
  (closed-form roots), so each piece's integrand is analytic; pieces near a singular point of it
  are halved until two rules agree (compiled, :mod:`._compiled`, each cell at all the levels it
  cuts in one pass); cells are at most 1 scaled unit wide along the quadrature axes. Tail cells (40 scales beyond the outermost kink, 4e−18 of mass
  left out) carry a single exponential along their tail axis, integrated in closed form.

Screening: each term's ratio is within e^{±Σ_k |s_ijk|}, so ε_i ≤ M_i = max_j Σ_k |(T Δ_ij)_k|.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from ...errors import InputError
from .model import JointModel

#: scaled units beyond the outermost kink where the tail cells end: e^{−40} ≈ 4e−18 of mass is left out
TAIL = 40.0
#: widest cell (scaled units) along a quadrature axis: Gauss–Legendre on e^{±t} over width 1 with 6
#: nodes errs by ~1e−13 relative
MAX_CELL = 1.0
#: widest cell (scaled units) along the exact axis: a term is referred to the cell's left edge,
#: e^{−(p − lo)} e^{t}, and a point beside the right edge of a wider cell would underflow there (its
#: mass in the cell lost: a translation by 800 scales gave δ_i(0) = 0.88 instead of 1)
MAX_EXACT_CELL = 300.0
#: Gauss–Legendre nodes per piece inside a cut cell
QUAD_NODES = 6
#: pieces of a cut cell near a singular point are halved until two rules agree within this fraction
#: of ∫ Σ_σ |C_σ| e^{σ·t} over the cell (per unit length of the halved axis)
CUT_TOL = 1e-11
#: levels above this get the cells' masses in log space (e^600 × 1e−308 ≈ 4e−48: below, the plain
#: masses' underflow is negligible)
LOG_LEVEL = 600.0
#: vertex sums below this are recomputed in log space (the scaled products may have underflowed)
_TINY = 1e-280
#: cut cells whose density coefficients are formed at once (2^d n numbers each while formed)
COEF_CELLS = 4096
#: cells of the grid whose vertex values, masses and corner statistics are held at once (a dozen
#: arrays of 8 bytes a cell: about 50 MB)
SLAB_CELLS = 1 << 19
#: elements per block of the vertex contractions (memory: ~8 bytes each, a few arrays at once)
_BLOCK = 4_000_000


# --------------------------------------------------------------------------- vertex machinery
def _check_shifts(model: JointModel, shifts) -> np.ndarray:
    s = np.asarray(shifts, dtype=np.float64)
    if s.ndim == 2 and model.d == 1:
        s = s[:, :, None]
    if s.ndim == 2 and s.shape == (model.n, model.d):
        s = s[None]
    if s.ndim != 3 or s.shape[1:] != (model.n, model.d):
        raise InputError(f"shifts must have shape (m, {model.n}, {model.d}); got {s.shape}")
    if not np.all(np.isfinite(s)):
        raise InputError("shifts must be finite numbers")
    return s


def _contract(E: list) -> np.ndarray:
    """Σ_j Π_k E_k[r, g_k, j] for E_k of shape (R, G_k, n): the (R, G_1, …, G_d) product-grid sums."""
    if len(E) == 1:
        return E[0].sum(-1)
    if len(E) == 2:
        return E[0] @ E[1].transpose(0, 2, 1)
    R, G0, n = E[0].shape
    G1, G2 = E[1].shape[1], E[2].shape[1]
    kr = (E[0][:, :, None, :] * E[1][:, None, :, :]).reshape(R, G0 * G1, n)
    return (kr @ E[2].transpose(0, 2, 1)).reshape(R, G0, G1, G2)


def _log_sums_slow(grids: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """log Σ_j e^{−Σ_k |g_k − p_jk|} on one row's product grid, in log space (the underflow path)."""
    d = grids.shape[0]
    mesh = np.meshgrid(*grids, indexing="ij")
    out = np.full(mesh[0].shape, -np.inf)
    for p in pts:
        out = np.logaddexp(out, -sum(np.abs(mesh[k] - p[k]) for k in range(d)))
    return out


def _vertex_log_ratio(grids: np.ndarray, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """L = log p̂ − log p̂_i on the product grid of each row (scaled coordinates).

    grids (R, d, G); A, B (R, n, d) the two point sets. Returns (R, G, …, G). Each axis factor is
    scaled by e^{min_j |g − p_jk|} over both sets (the same for both densities, so L is unchanged);
    rows where a sum still comes out below 1e−280 are recomputed in log space.
    """
    R, d, G = grids.shape
    diffA = [np.abs(grids[:, k, :, None] - A[:, None, :, k]) for k in range(d)]
    diffB = [np.abs(grids[:, k, :, None] - B[:, None, :, k]) for k in range(d)]
    off = [np.minimum(diffA[k].min(-1), diffB[k].min(-1))[:, :, None] for k in range(d)]
    SA = _contract([np.exp(off[k] - diffA[k]) for k in range(d)])
    SB = _contract([np.exp(off[k] - diffB[k]) for k in range(d)])
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(SA) - np.log(SB)
    bad = ~(SA.reshape(R, -1).min(1) > _TINY) | ~(SB.reshape(R, -1).min(1) > _TINY)
    for r in np.flatnonzero(bad):
        L[r] = _log_sums_slow(grids[r], A[r]) - _log_sums_slow(grids[r], B[r])
    return L


def _rows_per_block(d: int, G: int, n: int) -> int:
    per_row = G ** d + G ** (d - 1) * n + 4 * G * n
    return max(1, _BLOCK // per_row)


def _eps_rows(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Exact ε_i for scaled points a (n, d) and scaled shifts s (R, n, d): max over the reduced grids."""
    R, n, d = s.shape
    out = np.zeros(R)
    step = _rows_per_block(d, n + 2, n)
    for k0 in range(0, R, step):
        sk = s[k0:k0 + step]
        r = len(sk)
        B = a[None] - sk
        A = np.broadcast_to(a, B.shape)
        lo = np.minimum(a.min(0), B.min(1)) - 1.0  # (r, d): beyond every kink, where L is constant
        hi = np.maximum(a.max(0), B.max(1)) + 1.0
        far = np.stack([lo, hi], axis=-1)  # (r, d, 2)
        gA = np.concatenate([np.broadcast_to(a.T, (r, d, n)), far], axis=-1)
        gB = np.concatenate([B.transpose(0, 2, 1), far], axis=-1)
        top = _vertex_log_ratio(gA, A, B).reshape(r, -1).max(1)       # sup L: kinks of p̂
        bottom = _vertex_log_ratio(gB, A, B).reshape(r, -1).min(1)    # inf L: kinks of p̂_i
        out[k0:k0 + step] = np.maximum(top, -bottom)
    return np.maximum(out, 0.0)


# ----------------------------------------------------------------------- δ on the cell grid
def _union_axis(vals: np.ndarray, refine: bool) -> np.ndarray:
    """Sorted kinks of one axis with tail ends TAIL beyond, gaps wider than MAX_CELL (``refine``: a
    quadrature axis) or MAX_EXACT_CELL (the exact axis) split evenly."""
    v = np.unique(vals)
    g = np.concatenate([[v[0] - TAIL], v, [v[-1] + TAIL]])
    gaps = np.diff(v)
    parts = np.ceil(gaps / (MAX_CELL if refine else MAX_EXACT_CELL)).astype(int)
    if parts.max(initial=1) <= 1:
        return g
    extra = [v[i] + gaps[i] * np.arange(1, parts[i]) / parts[i] for i in np.flatnonzero(parts > 1)]
    return np.concatenate([[v[0] - TAIL], np.sort(np.concatenate([v] + extra)), [v[-1] + TAIL]])


def _cdf_diff(lo: np.ndarray, hi: np.ndarray, p: np.ndarray) -> np.ndarray:
    """∫_lo^hi ½ e^{−|u − p_j|} du for cells [lo, hi] (C,) and points p (n,): (C, n), accurate."""
    lo, hi = lo[:, None], hi[:, None]
    w = hi - lo
    left = p[None, :] <= lo  # cell right of the point
    right = p[None, :] >= hi
    with np.errstate(over="ignore"):
        m_left = 0.5 * np.exp(-(lo - p)) * -np.expm1(-w)
        m_right = 0.5 * np.exp(-(p - hi)) * -np.expm1(-w)
        inside = 1.0 - 0.5 * np.exp(-(p - lo)) - 0.5 * np.exp(-(hi - p))
    return np.where(left, m_left, np.where(right, m_right, inside))


def _log_cdf_diff(lo: np.ndarray, hi: np.ndarray, p: np.ndarray) -> np.ndarray:
    """log of :func:`_cdf_diff` (C, n), finite however far the point (the masses e^ε multiplies at ε
    beyond 600, where the plain products underflow)."""
    lo, hi = lo[:, None], hi[:, None]
    w = hi - lo
    edge = np.log(0.5) + np.log(-np.expm1(-w))
    with np.errstate(over="ignore", divide="ignore"):
        inside = np.log(np.maximum(1.0 - 0.5 * np.exp(-(p - lo)) - 0.5 * np.exp(-(hi - p)), 0.0))
    return np.where(p <= lo, edge - (lo - p), np.where(p >= hi, edge - (p - hi), inside))


def _log_masses(lows: list, highs: list, P: np.ndarray) -> np.ndarray:
    """log of the cells' masses (1/n) Σ_j Π_k ∫ ½ e^{−|u_k − p_jk|} in log space, the first axis in
    blocks (at most :data:`_BLOCK` terms at once)."""
    n, d = P.shape
    lc = [_log_cdf_diff(lows[k], highs[k], P[:, k]) for k in range(d)]
    rest = lc[1][:, None, :] + lc[2][None, :, :] if d == 3 else lc[1]  # (G1[, G2], n)
    step = max(1, _BLOCK // max(1, rest.size))
    out = [logsumexp(lc[0][k0:k0 + step].reshape((-1,) + (1,) * (d - 1) + (n,)) + rest[None], axis=-1)
           for k0 in range(0, len(lc[0]), step)]
    return np.concatenate(out) - np.log(n)


def _cell_coefficients(lo: np.ndarray, hi: np.ndarray, P: np.ndarray):
    """((K, 2^d), (K,)): p(t) = e^{scale} Σ_σ A_σ e^{σ·t} on K cells [lo, hi] (K, d) (compiled:
    :func:`._compiled.cell_coefficients`)."""
    from ._compiled import cell_coefficients  # numba: loaded by the first cut cell only

    return cell_coefficients(np.ascontiguousarray(lo), np.ascontiguousarray(hi), np.ascontiguousarray(P))


def _cut_cells(A: tuple, B: tuple, width, cmin, cmax, eps, nodes: int, out: np.ndarray) -> None:
    """Adds to ``out`` (2, E) the integrals over the cut cells at every level each cuts (compiled:
    :func:`._compiled.cut_cells`); A, B the cells' (coefficients, log scales) of p̂ and p̂_i."""
    from ._compiled import cut_cells  # numba: loaded by the first cut cell only

    x, wts = np.polynomial.legendre.leggauss(nodes)
    cut_cells(np.ascontiguousarray(A[0]), np.ascontiguousarray(B[0]), A[1], B[1], np.ascontiguousarray(width),
              np.ascontiguousarray(cmin), np.ascontiguousarray(cmax), np.ascontiguousarray(eps, dtype=np.float64),
              x, wts, CUT_TOL, out)


def _cut_at_some_level(cmin: np.ndarray, cmax: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Whether some level lies strictly between each cell's corner min and max of L."""
    srt = np.sort(levels)
    return np.searchsorted(srt, cmax, side="left") > np.searchsorted(srt, cmin, side="right")


def _corner_stats(L: np.ndarray):
    """(min, max) of L over each cell's 2^d vertices; cells with a non-finite vertex get (−∞, ∞).

    One axis at a time (neighbours along axis k, then along the next): 2d passes, no 2^d copies."""
    lo = hi = L
    finite = np.isfinite(L)
    for k in range(L.ndim):
        first = tuple(slice(None, -1) if i == k else slice(None) for i in range(L.ndim))
        second = tuple(slice(1, None) if i == k else slice(None) for i in range(L.ndim))
        lo, hi = np.fmin(lo[first], lo[second]), np.fmax(hi[first], hi[second])
        finite = finite[first] & finite[second]
    return np.where(finite, lo, -np.inf), np.where(finite, hi, np.inf)


def _axis_tables(grids: list, a: np.ndarray, b: np.ndarray):
    """Per axis, what a slab of the grid needs: the vertex factors e^{off − |g − p|} of both point
    sets (the offset the nearer of them, so L is unchanged) and the cells' Laplace CDF differences."""
    d = a.shape[1]
    vertex, cdf = [], []
    for k in range(d):
        diffA = np.abs(grids[k][:, None] - a[None, :, k])
        diffB = np.abs(grids[k][:, None] - b[None, :, k])
        off = np.minimum(diffA.min(1), diffB.min(1))[:, None]
        vertex.append((np.exp(off - diffA)[None], np.exp(off - diffB)[None]))
        cdf.append((_cdf_diff(grids[k][:-1], grids[k][1:], a[:, k])[None],
                    _cdf_diff(grids[k][:-1], grids[k][1:], b[:, k])[None]))
    return vertex, cdf


def _slab(tables, grids, a, b, cells: slice, lev: np.ndarray, logs: bool, nodes: int, acc: dict) -> float:
    """One slab of cells along axis 0, levels ``lev`` ascending: returns |L|'s max over its vertices
    (NaN if one is not finite) and adds to ``acc`` its cells inside {L ≥ ε} or {L ≤ −ε}
    (:func:`_inside`) and the integrals over the cells a level cuts (:func:`_cut_sums`)."""
    vertex, cdf = tables
    planes = slice(cells.start, cells.stop + 1)  # the vertices of cells i0 … i1 − 1
    SA = _contract([vertex[0][0][:, planes]] + [v[0] for v in vertex[1:]])[0]
    SB = _contract([vertex[0][1][:, planes]] + [v[1] for v in vertex[1:]])[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(SA) - np.log(SB)
    del SA, SB
    fin = np.isfinite(L)
    top = float(np.abs(L[fin]).max(initial=0.0)) if fin.all() else np.nan
    del fin
    Lmin, Lmax = (x.ravel() for x in _corner_stats(L))
    del L
    masses = [_contract([cdf[0][s][:, cells]] + [c[s] for c in cdf[1:]])[0].ravel() / len(a) for s in (0, 1)]
    if logs:
        lows = [grids[0][cells]] + [g[:-1] for g in grids[1:]]
        highs = [grids[0][cells.start + 1:cells.stop + 1]] + [g[1:] for g in grids[1:]]
        log_masses = [_log_masses(lows, highs, p).ravel() for p in (a, b)]
    else:
        with np.errstate(divide="ignore"):
            log_masses = [np.log(m) for m in masses]
    if len(lev):
        _inside(acc["plus"], lev, Lmin, masses[0], log_masses[1])
        _inside(acc["minus"], lev, -Lmax, masses[1], log_masses[0])
    cut = np.flatnonzero(_cut_at_some_level(Lmin, Lmax, lev) | _cut_at_some_level(Lmin, Lmax, -lev))
    base = cells.start * (Lmin.size // max(1, cells.stop - cells.start))
    _cut_sums(a, b, grids, lev, nodes, (cut + base, Lmin[cut], Lmax[cut]), acc["cut"])
    return top


def _inside(sums: tuple, lev: np.ndarray, key: np.ndarray, mass: np.ndarray, log_other: np.ndarray) -> None:
    """Adds to ``sums`` ((E,) sums of ``mass``, (E,) log-sums of the other side's masses) the cells
    with ``key`` ≥ each level, as prefix sums over the cells in descending key order: a level's sum
    is the same to the bit whichever other levels are asked."""
    sel = np.flatnonzero(key >= lev[0])
    order = sel[np.argsort(-key[sel], kind="stable")]
    k = np.searchsorted(-key[order], -lev, side="right")
    sums[0][:] += np.r_[0.0, np.cumsum(mass[order])][k]
    with np.errstate(divide="ignore"):
        sums[1][:] = np.logaddexp(sums[1], np.r_[-np.inf, np.logaddexp.accumulate(log_other[order])][k])


def _delta_row(a: np.ndarray, b: np.ndarray, eps: np.ndarray, nodes: int):
    """Exact ε_i and δ_i(ε) for one individual (scaled coordinates).

    The grid is visited in slabs along axis 0 (:func:`_slab`), each reduced to its part of the sums
    per level: at most :data:`SLAB_CELLS` cells' values are held at once, whatever the grid."""
    d = a.shape[1]
    grids = [_union_axis(np.concatenate([a[:, k], b[:, k]]), refine=k > 0) for k in range(d)]
    order = np.argsort(eps, kind="stable")
    lev = np.asarray(eps, dtype=np.float64)[order]
    E = len(lev)
    acc = {side: (np.zeros(E), np.full(E, -np.inf)) for side in ("plus", "minus")}
    acc["cut"] = np.zeros((2, E))
    tables = _axis_tables(grids, a, b)
    plane = int(np.prod([len(g) - 1 for g in grids[1:]]))
    cells0 = len(grids[0]) - 1
    step = max(1, SLAB_CELLS // max(1, plane))
    # levels above LOG_LEVEL: e^ε times masses below 1e−308 is not negligible there
    logs = bool(E) and lev[-1] > LOG_LEVEL
    tops = [_slab(tables, grids, a, b, slice(i0, min(i0 + step, cells0)), lev, logs, nodes, acc)
            for i0 in range(0, cells0, step)]
    eps_i = float(max(tops)) if not np.isnan(tops).any() else np.nan
    (cA, lB), (cB, lA) = acc["plus"], acc["minus"]
    # e^ε times a mass, in log space (no overflow at ε > 709: inside cells it is below the other mass)
    plus = cA - np.exp(lev + lB) + acc["cut"][0]
    minus = cB - np.exp(lev + lA) + acc["cut"][1]
    delta = np.empty(E)
    delta[order] = np.clip(np.maximum(plus, minus), 0.0, 1.0)
    return eps_i, delta


def _cut_sums(a, b, grids, lev, nodes, cells: tuple, out: np.ndarray) -> None:
    """Adds to ``out`` (2, E) the integrals over ``cells`` (flat index ascending, corner min and max of
    L) at every level ``lev`` (ascending) each cuts, plus side (row 0) and minus side (row 1)."""
    d = a.shape[1]
    flat, cmin, cmax = cells
    if not len(flat):
        return
    idx = np.unravel_index(flat, tuple(len(g) - 1 for g in grids))
    lo_c = np.column_stack([grids[k][idx[k]] for k in range(d)])
    hi_c = np.column_stack([grids[k][idx[k] + 1] for k in range(d)])
    for u0 in range(0, len(flat), COEF_CELLS):
        # the cells' coefficients (2^d n numbers each while formed) a chunk of cells at a time
        u = slice(u0, u0 + COEF_CELLS)
        A = _cell_coefficients(lo_c[u], hi_c[u], a)
        B = _cell_coefficients(lo_c[u], hi_c[u], b)
        _cut_cells(A, B, hi_c[u] - lo_c[u], cmin[u], cmax[u], lev, nodes, out)
