"""Per-individual risk (docs/method.md#4-risk): δ_i(ε), ε_i, screening bounds.

For a chunk of individuals (rows of a dense shift matrix D) we evaluate, on
nodes that contain every kink of both densities, p̂ and p̂_i with their
one-sided derivatives and CDFs, exactly. Between consecutive nodes both
densities are smooth; interior extrema of L = log p̂ − log p̂_i are located
and added as nodes, so L is monotone on every interval. Then

    δ_i(ε) = max( ∫_{L>ε} (p̂ − e^ε p̂_i),  ∫_{L<−ε} (p̂_i − e^ε p̂) )

is a sum of exact CDF differences over intervals entirely inside the region,
plus, on the one or two intervals a level ε cuts, a partial integral whose
endpoint is the root of a cubic Hermite model of L and whose mass comes from a
quartic-corrected Hermite model of the density matched to the exact interval
mass. The error there is second order in the root error (the integrand
vanishes at the root), far below 1e-9 at the node spacing used. Tails beyond
the outermost nodes carry less than 1e-17 of mass (Laplace: 46 scales;
Gaussian: 12 standard deviations) and are added with the log-ratio frozen at
its end value.

ε_i, Laplace kernels: sup_x |L(x)|, the largest |L| over the nodes (which
include the interior extrema) and the exact tail limits; δ_i(ε) = 0 exactly
for ε ≥ ε_i.

ε_i, Gaussian kernels: L grows without bound in the tails (linearly, where one
kernel dominates), so sup |L| = ∞ and δ_i(ε) > 0 for every ε. ε_i is reported
at the tolerance τ = :data:`EPS_TOLERANCE` (1e-12) instead:

    ε_i(τ) = min { ε ≥ 0 : δ_i(ε) ≤ τ },

the root of a non-increasing function, bracketed by the certified bound
:func:`eps_upper_bound` and found by safeguarded Newton steps on log δ_i to a
relative 1e-10 (:func:`empdp._gaussian.tolerance_eps`). Near τ the masses are
those of far tails, integrated from Hermite models of the log-densities. δ_i
at or below τ is reported as 0, so δ_i(ε) = 0 is reported for ε ≥ ε_i(τ); the
outputs state τ (``eps_tolerance``). For Gaussian kernels p̂_i is evaluated on
a block's shared grid by a series with a certified remainder, one matrix
product per block (:mod:`empdp._gaussian`), rows with large shifts directly.
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_ndtr, ndtr

from . import _gaussian, _laplace, _onescale
from ._cuts import _P, _PI, _cut_sums
from ._grid import base_grid
from .density import DensityModel, kernel_terms

#: τ: for Gaussian kernels ε_i is the smallest ε with δ_i(ε) ≤ τ, and δ_i ≤ τ is reported as 0
EPS_TOLERANCE = 1e-12
GAUSSIAN_TOL = EPS_TOLERANCE  # the former name


# ------------------------------------------------------------------ bounds
def term_delta(kernel: str, eps, mu):
    """δ(ε) of one kernel against itself shifted by μ scales (the 1-d mechanism curve).

    Laplace: (1 − e^{(ε−μ)/2})_+ ; Gaussian: Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ).
    """
    eps, mu = np.broadcast_arrays(np.asarray(eps, float), np.asarray(mu, float))
    out = np.zeros(eps.shape)
    pos = mu > 0
    if kernel == "laplace":
        out[pos] = np.clip(-np.expm1(np.minimum(eps[pos] - mu[pos], 0.0) / 2), 0, 1)
    else:
        m, e = mu[pos], eps[pos]
        # e^ε Φ(·) as exp(ε + log Φ(·)): no overflow for large ε
        out[pos] = np.clip(ndtr(m / 2 - e / m) - np.exp(e + log_ndtr(-m / 2 - e / m)), 0, 1)
    return out


def delta_upper_bound(kernel: str, eps, bound, n_present, n):
    """Certified δ_i(ε) ≤ (n_i/n) δ_kernel(ε; M_i) (docs/method.md#51-screening-bound).

    (Σ a_j − e^ε Σ b_j)_+ ≤ Σ (a_j − e^ε b_j)_+ term by term, and each term is
    the kernel's own curve at sensitivity |Δ_ij|/b_j ≤ M_i, increasing in it.
    """
    return np.asarray(n_present) / n * term_delta(kernel, eps, bound)


def eps_upper_bound(model: DensityModel, bound: np.ndarray, n_present=None) -> np.ndarray:
    """Certified upper bound on ε_i from M_i: M_i for Laplace kernels; for Gaussian kernels the
    smallest ε with (n_i/n) δ_kernel(ε; M_i) ≤ τ (:func:`delta_upper_bound`), which bounds
    ε_i(τ). ``n_present`` (n_i, optional) tightens the Gaussian bound (n_i/n = 1 without it).
    """
    bound = np.asarray(bound, dtype=float)
    if model.kernel == "laplace":
        return bound
    share = 1.0 if n_present is None else np.asarray(n_present, dtype=float) / len(model.points)
    return gaussian_eps_bound(bound, share)


def gaussian_eps_bound(bound, share=1.0, tol: float = EPS_TOLERANCE) -> np.ndarray:
    """Smallest ε with share · δ_Gauss(ε; μ) ≤ tol, per μ = M_i (bisection on the monotone curve,
    returning the upper end: the bound holds there). ∞ where μ is ∞."""
    mu, share = np.broadcast_arrays(np.asarray(bound, dtype=float), np.asarray(share, dtype=float))
    out = np.zeros(mu.shape)
    finite = np.isfinite(mu)
    out[~finite] = np.inf
    pos = finite & (mu > 0) & (share > tol)
    m, w = mu[pos], share[pos]
    # δ(ε; μ) ≤ Φ(μ/2 − ε/μ) ≤ tol once ε ≥ μ(μ/2 + 7.1) (Φ(−7.2) < 1e-12): a valid upper end
    lo, hi = np.zeros(len(m)), m * (m / 2 + 7.2) + 1e-300
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        over = w * term_delta("gaussian", mid, m) > tol
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
        if np.all(hi - lo <= 1e-12 * hi):
            break
    out[pos] = hi
    return out


# ------------------------------------------------------------------- nodes
class _Nodes:
    """Densities on each row's nodes: x, and for p̂ and p̂_i value, one-sided slopes, CDF."""

    FIELDS = _laplace.FIELDS

    def __init__(self, **arrays):
        for f in self.FIELDS:
            setattr(self, f, arrays[f])
        # slopes of L once known (set by node_values)
        self.Lr, self.Ll = arrays.get("Lr"), arrays.get("Ll")



def _evaluate(model: DensityModel, x: np.ndarray, kinks: np.ndarray) -> _Nodes:
    """Exact p̂, p̂_i, slopes and CDFs at x (C, G); ``kinks`` (C, n) = q_j − Δ_ij."""
    q, b, kern = model.points, model.bandwidths, model.kernel
    acc = {f: np.zeros(x.shape) for f in _Nodes.FIELDS[1:]}
    for j in range(len(q)):
        for names, u in ((("p", "pr", "pl", "F"), x - q[j]), (("pi", "pir", "pil", "Fi"), x - kinks[:, j:j + 1])):
            for name, term in zip(names, kernel_terms(kern, u, b[j])):
                acc[name] += term
    n = len(q)
    return _Nodes(x=x, **{f: a / n for f, a in acc.items()})


def _take_rows(nd: _Nodes, rows) -> _Nodes:
    """The nodes of some rows (an index array, or a slice: views), with their slopes of L."""
    out = _Nodes(**{f: getattr(nd, f)[rows] for f in _Nodes.FIELDS})
    if nd.Lr is not None:
        out.Lr, out.Ll = nd.Lr[rows], nd.Ll[rows]
    return out


def _log_ratio(nd: _Nodes):
    return _laplace.log_ratio(nd.p, nd.pi, nd.pr, nd.pir, nd.pl, nd.pil)


def _hermite_extremum(La, Lc, ma, mc, h):
    """t ∈ (0, 1) where the cubic Hermite model of L has zero slope."""
    A = 6 * La + 3 * h * ma - 6 * Lc + 3 * h * mc
    B = -6 * La - 4 * h * ma + 6 * Lc - 2 * h * mc
    C = h * ma
    with np.errstate(divide="ignore", invalid="ignore"):
        disc = np.sqrt(np.maximum(B * B - 4 * A * C, 0))
        r1 = (-B - disc) / (2 * A)
        r2 = (-B + disc) / (2 * A)
        lin = -C / B
    cand = np.where(np.abs(A) < 1e-14 * (np.abs(B) + np.abs(C) + 1e-300), lin, np.nan)
    for r in (r1, r2):
        cand = np.where(np.isnan(cand) & (r > 0) & (r < 1), r, cand)
    return np.where(np.isfinite(cand) & (cand > 0) & (cand < 1), cand, 0.5)


def _interval_curvature(rows, xa, xc, grid: np.ndarray, K_grid: np.ndarray, K_far: float) -> np.ndarray:
    """K of the grid cell holding each interval [xa, xc] of ``rows`` (K_far outside the grid)."""
    g = np.searchsorted(grid, xa, side="right") - 1
    inside = (g >= 0) & (g < len(grid) - 1)
    g = np.clip(g, 0, len(grid) - 2)
    inside &= xc <= grid[g + 1]
    return np.where(inside, K_grid[rows, g], K_far)


#: above this share of a block's rows with extrema to add, they are inserted into every row
EXTREMA_SHARE = 0.25


def _insert_extrema(nd: _Nodes, L, Lr, Ll, evaluate_at, curvature_at=None,
                    levels: np.ndarray | None = None,
                    need_eps_i: bool = True, certified: np.ndarray | None = None,
                    sup_levels: np.ndarray | None = None) -> list:
    """Add the interior extrema of L as nodes (L is then monotone between nodes).

    Returns a list of parts ``(nodes, L, rows)`` (the nodes carry L's slopes
    as ``Lr``, ``Ll``): the first has every row (``rows`` = None), as given;
    when some rows have extrema to add, a second part holds just those rows
    with their extrema inserted, and its results replace the first part's
    for them. (Few rows have
    extrema that matter: widening every row would cost a full copy.)

    With ``curvature_at(rows, ks)`` (Laplace kernels: K with L'' ≥ −K on those
    intervals between kinks) only the extrema of intervals whose certified
    bounds (:func:`empdp._laplace.cell_bounds`) can reach a level of
    ``levels`` or the row's largest |L| are added: elsewhere the interval
    lies on one side of every level and below ε_i, and its exact masses suffice.
    With ``need_eps_i=False`` only the levels count (ε_i is not asked for).
    At ``sup_levels`` only whether sup |L| exceeds them counts (:func:`empdp._laplace.matters`).
    Intervals starting at a node where ``certified`` is True were shown by the
    same bounds not to matter (see :func:`empdp._laplace.node_values`).
    """
    C = nd.x.shape[0]
    h = np.diff(nd.x, axis=1)
    ma, mc = Lr[:, :-1], Ll[:, 1:]
    turn = (h > 0) & (((ma > 0) & (mc < 0)) | ((ma < 0) & (mc > 0)))
    if certified is not None:
        turn &= ~certified[:, :-1]
    rows, ks = np.nonzero(turn)
    if curvature_at is not None and len(rows):
        row_top = np.abs(L).max(axis=1)
        top = row_top if need_eps_i else np.full(C, np.inf)
        lo, hi = _laplace.cell_bounds(L[rows, ks], L[rows, ks + 1], ma[rows, ks], mc[rows, ks], h[rows, ks],
                                      curvature_at(rows, ks))
        matters = _laplace.matters(lo, hi, top[rows], levels, sup_levels, row_top[rows])
        rows, ks = rows[matters], ks[matters]
    if not len(rows):
        nd.Lr, nd.Ll = Lr, Ll
        return [(nd, L, None)]
    t = _hermite_extremum(L[rows, ks], L[rows, ks + 1], ma[rows, ks], mc[rows, ks], h[rows, ks])
    xe = nd.x[rows, ks] + t * h[rows, ks]
    values = dict(zip(_Nodes.FIELDS, (xe, *evaluate_at(rows, xe))))
    part, rows = np.unique(rows, return_inverse=True)  # the rows with extrema, renumbered
    if len(part) > EXTREMA_SHARE * C:  # many rows: insert into all of them
        part, rows = np.arange(C), part[rows]
    values.update(zip(("L", "Lr", "Ll"), _log_ratio(_Nodes(**values))))
    base = {f: getattr(nd, f) for f in _Nodes.FIELDS} | {"L": L, "Lr": Lr, "Ll": Ll}
    if len(part) < C:
        base = {f: a[part] for f, a in base.items()}
    merged = _laplace.insert_after(base, len(part), rows, ks, values)
    ext = _Nodes(**merged)
    ext.Lr, ext.Ll = merged["Lr"], merged["Ll"]
    if len(part) == C:
        return [(ext, merged["L"], None)]
    nd.Lr, nd.Ll = Lr, Ll
    return [(nd, L, None), (ext, merged["L"], part)]


def node_values(model: DensityModel, shifts: np.ndarray, grid: np.ndarray,
                plan: _laplace.GridPlan | None = None, levels: np.ndarray | None = None,
                clear_below: float | None = None,
                need_eps_i: bool = True, sup_levels: np.ndarray | None = None) -> tuple[list, np.ndarray]:
    """Nodes with exact densities for each row of ``shifts``, extrema of L inserted.

    With a :class:`empdp._laplace.GridPlan` (Laplace kernels, rows with
    M_i ≤ MAX_BOUND) the grid part uses the matrix form, and a kink of p̂_i
    becomes a node only where a certified bracket on L over its cell could
    cross one of ``levels`` (sorted ±ε; None: ε_i only) or exceed the row's
    largest |L| (see :func:`empdp._laplace.node_values`); there, rows whose
    certified sup |L| is at most ``clear_below`` are dropped. With
    ``need_eps_i=False`` the nodes serve δ_i at ``levels`` only: nodes that
    could matter only for sup |L| are left out. At ``sup_levels`` (sorted
    ε > 0) the nodes decide only whether sup |L| exceeds them (their largest
    |L| does), not every crossing. Returns the parts of
    :func:`_insert_extrema` (nodes with L's slopes, L = log p̂ − log p̂_i on
    them, the part's rows among those kept) and the indices of the rows kept.
    """
    C = shifts.shape[0]
    rows = np.arange(C)
    K_grid = certified = None
    series = _gaussian.series_nodes(plan, shifts) if isinstance(plan, _gaussian.SeriesPlan) else None
    if series is not None:
        nd = _Nodes(**series)
        kinks = model.points[None, :] - shifts

        def evaluate_at(r, xe):
            e = _evaluate(model, xe[:, None], kinks[r])
            return [getattr(e, f)[:, 0] for f in _Nodes.FIELDS[1:]]
        L, Lr, Ll = _log_ratio(nd)
    elif plan is not None and not isinstance(plan, _gaussian.SeriesPlan):
        values, rows, K_grid = _laplace.node_values(plan, shifts, levels, clear_below, need_eps_i, sup_levels)
        nd = _Nodes(**values)
        L, Lr, Ll = values["L"], values["Lr"], values["Ll"]
        certified = values["certified"]
        shifts = shifts[rows]
        kinks = model.points[None, :] - shifts
        b = model.bandwidths

        def evaluate_at(r, xe):
            a = plan.shared_at(xe[:, None])
            c = _laplace.direct(xe[:, None], kinks[r], b)
            return [v[:, 0] for v in (*a, *c)]
    else:
        kinks = model.points[None, :] - shifts
        if model.kernel == "laplace":
            x = np.sort(np.concatenate([np.broadcast_to(grid, (C, len(grid))), kinks], axis=1), axis=1)
        else:
            x = np.broadcast_to(grid, (C, len(grid))).copy()
        nd = _evaluate(model, x, kinks)

        def evaluate_at(r, xe):
            e = _evaluate(model, xe[:, None], kinks[r])
            return [getattr(e, f)[:, 0] for f in _Nodes.FIELDS[1:]]
        L, Lr, Ll = _log_ratio(nd)
    curvature_at = None
    if model.kernel == "laplace":
        b = model.bandwidths
        if K_grid is None:
            K_grid = _laplace.row_curvature(shifts, b, _laplace.cell_curvature(model.points, b, grid))

        def curvature_at(r, k):
            return _interval_curvature(r, nd.x[r, k], nd.x[r, k + 1], grid, K_grid, 1.0 / b.min() ** 2)
    return _insert_extrema(nd, L, Lr, Ll, evaluate_at, curvature_at, levels, need_eps_i, certified,
                           sup_levels), rows


def individual_eps(model: DensityModel, nd: _Nodes, L: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """ε_i = sup_x |log p̂ − log p̂_i| (Laplace kernels), or ε_i(τ), the smallest ε with δ_i(ε) ≤ τ
    (Gaussian kernels; see the module docstring)."""
    if model.kernel == "laplace":
        absL = np.abs(L)
        return np.maximum(absL.max(axis=1), _laplace._tail_limits(model.points, model.bandwidths, shifts))
    b = model.bandwidths
    upper = gaussian_eps_bound((np.abs(shifts) / b).max(axis=1), np.count_nonzero(shifts, axis=1) / len(b))
    return _gaussian.tolerance_eps(nd.x, nd.p, nd.pr, nd.pi, nd.pir, upper, EPS_TOLERANCE)


# ------------------------------------------------------------------- sweep
def sweep_delta(nd: _Nodes, L: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """δ_i(ε) for every row and every ε in ``eps`` (ascending, ≥ 0):

        max( ∫_{L>ε} (p̂ − e^ε p̂_i),  ∫_{L<−ε} (p̂_i − e^ε p̂) ),

    both directions from one pass over the intervals ({L < −ε} is {−L > ε}). Whole
    intervals and the tails (L frozen at the end nodes) add exact CDF differences, binned by
    the first level that no longer covers them; the intervals a level cuts add
    :func:`_cut_sums`.
    """
    Lr, Ll = nd.Lr, nd.Ll
    if Lr is None:
        _, Lr, Ll = _log_ratio(nd)
    C, N = L.shape
    step = max(1, SWEEP_CELLS // N)
    if C <= step:
        return _sweep(nd, L, Lr, Ll, eps)
    out = np.empty((C, len(eps)))
    for r in range(0, C, step):  # cache-sized row chunks (contiguous views)
        rows = slice(r, r + step)
        out[rows] = _sweep(_take_rows(nd, rows), L[rows], Lr[rows], Ll[rows], eps)
    return out


#: nodes per row chunk of :func:`sweep_delta`: its dozens of (rows × nodes) temporaries stay in cache
SWEEP_CELLS = 32_768


def _sweep(nd: _Nodes, L, Lr, Ll, eps):
    """:func:`sweep_delta` on one chunk of rows."""
    C, N = L.shape
    E = len(eps)
    h = np.diff(nd.x, axis=1)
    # masses of the intervals, then of the two tails
    w_p = np.concatenate([np.clip(np.diff(nd.F, axis=1), 0, None), nd.F[:, :1], 1 - nd.F[:, -1:]], axis=1)
    w_pi = np.concatenate([np.clip(np.diff(nd.Fi, axis=1), 0, None), nd.Fi[:, :1], 1 - nd.Fi[:, -1:]], axis=1)
    # L is clipped to ±700, so e^ε beyond e^700 changes nothing (and must not overflow)
    growth = np.exp(np.minimum(eps, 700.0))
    if E == 1:
        # one level: masks instead of the binning below (the same sums)
        e0 = float(eps[0])
        La, Lc = L[:, :-1], L[:, 1:]
        lo_v, hi_v = np.minimum(La, Lc), np.maximum(La, Lc)
        # each interval lies in {L > ε} if its lower end does, in {L < −ε} if its upper end does;
        # the tails by their end values (one buffer serves both tests)
        ends = np.concatenate([lo_v, L[:, :1], L[:, -1:]], axis=1)
        up = ends > e0
        ends[:, :-2] = hi_v
        down = ends < -e0
        d1 = np.sum(w_p, axis=1, where=up) - growth[0] * np.sum(w_pi, axis=1, where=up)
        d2 = np.sum(w_pi, axis=1, where=down) - growth[0] * np.sum(w_p, axis=1, where=down)
        out = [d1[:, None], d2[:, None]]
        cuts = [np.nonzero((lo_v <= e0) & (hi_v > e0) & (h > 0)),
                np.nonzero((lo_v < -e0) & (hi_v >= -e0) & (h > 0))]
        for k, (sign, num, den) in enumerate(((1.0, _P, _PI), (-1.0, _PI, _P))):
            rr, kk = cuts[k]
            if len(rr):
                out[k] = out[k] + _cut_sums(nd, L, Lr, Ll, h, rr, kk, sign, num, den, eps, growth)
        return np.clip(np.maximum(*out), 0.0, 1.0)
    # the levels ±ε in one ascending list: one search serves both directions, and since
    # searchsorted is monotone, an interval's range of levels is that of its end nodes
    at = np.searchsorted(np.r_[-eps[::-1], eps], L, side="left")
    rows = np.arange(C)[:, None] * (E + 1)
    out = []
    for sign, num, den, wn, wd, idx in ((1.0, _P, _PI, w_p, w_pi, np.maximum(at - E, 0)),
                                        (-1.0, _PI, _P, w_pi, w_p, E - np.minimum(at, E))):
        # idx: the number of levels below sign·L at each node (ties go either way: an interval
        # whose end sits on a level adds the same mass whole or cut)
        start, stop = np.minimum(idx[:, :-1], idx[:, 1:]), np.maximum(idx[:, :-1], idx[:, 1:])
        # an interval (or tail) lies inside {sign·L > ε} for the levels below ``first``
        first = np.concatenate([start, idx[:, :1], idx[:, -1:]], axis=1)
        flat = (rows + first).ravel()
        bn = np.bincount(flat, weights=wn.ravel(), minlength=C * (E + 1)).reshape(C, E + 1)
        bd = np.bincount(flat, weights=wd.ravel(), minlength=C * (E + 1)).reshape(C, E + 1)
        d = np.cumsum(bn[:, ::-1], axis=1)[:, -2::-1] - growth * np.cumsum(bd[:, ::-1], axis=1)[:, -2::-1]
        # intervals cut by the levels start ≤ e < stop
        cnt = np.where(h > 0, stop - start, 0)
        rr, kk = np.nonzero(cnt)
        if len(rr):
            d += _cut_sums(nd, L, Lr, Ll, h, rr, kk, sign, num, den, eps, growth,
                           first=start[rr, kk], count=cnt[rr, kk])
        out.append(d)
    return np.clip(np.maximum(*out), 0.0, 1.0)


#: cells per evaluation block: rows × max(nodes, n²) for the matrix form, rows × nodes otherwise.
#: Large enough that numpy, not the interpreter, dominates (blocks run side by side in threads);
#: the direct kernel sums inside a block are chunked to stay in cache (_laplace.DIRECT_CELLS).
BLOCK_CELLS = 8_000_000


def grid_plan(model: DensityModel, grid: np.ndarray):
    """The shared plan for ``grid``: the matrix form (Laplace kernels, :class:`empdp._laplace.GridPlan`)
    or the series form (Gaussian kernels, :class:`empdp._gaussian.SeriesPlan`)."""
    if model.kernel == "laplace":
        return _laplace.GridPlan(model.points, model.bandwidths, grid)
    return _gaussian.SeriesPlan(model.points, model.bandwidths, grid)


def evaluate(model: DensityModel, shifts: np.ndarray, eps: np.ndarray | None = None,
             grid: np.ndarray | None = None, plan: _laplace.GridPlan | None = None,
             need_eps_i: bool = True, return_exact: bool = False, only: np.ndarray | None = None,
             cap: np.ndarray | None = None):
    """ε_i and δ_i(ε) for each row of ``shifts`` (C, n).

    Laplace kernels of one global scale (the default model) are evaluated in closed form by
    :mod:`empdp._onescale`: every row exactly, with ε_i even when ``need_eps_i`` is False, and
    ``grid`` and ``plan`` unused. Other models go to :func:`evaluate_on_grid`, described here.

    Returns ``(eps_i, delta)`` with ``delta`` of shape (C, len(eps)) or None.
    ``plan`` (from :func:`grid_plan` on the same ``grid``) is built when missing.
    With ``need_eps_i=False`` (and ``eps`` given) only δ_i is computed: ε_i
    is NaN, and rows whose certified bounds show ε_i ≤ min(eps) get δ_i = 0
    without their exact evaluation. ``return_exact`` adds a third value: which
    rows were evaluated exactly (the others were cleared by their bounds).

    ``only`` (a mask over ``eps``, True at the smallest ε) asks for δ_i at
    those ε, and at the others only for rows whose δ_i at the smallest ε
    exceeds ``cap`` there (δ_i decreases with ε: the other rows' δ_i(ε) are at
    most the cap). Where not computed, δ_i is NaN if it is positive (sup |L|
    > ε: the nodes are placed so that their largest |L| decides it, see
    :func:`empdp._laplace.matters`) and 0 otherwise. Those ε need far fewer
    nodes than every crossing: on a 50-value sweep with 29 of them saturated,
    the evaluation took 124 µs a row instead of 150.
    """
    shifts = np.atleast_2d(np.asarray(shifts, dtype=np.float64))
    if _onescale.applies(model):  # the default model: exact in closed form, every row and every ε
        eps_i, delta = _onescale.evaluate(model.points, float(model.bandwidths[0]), shifts, eps, only, cap)
        return (eps_i, delta, np.ones(len(shifts), dtype=bool)) if return_exact else (eps_i, delta)
    return evaluate_on_grid(model, shifts, eps, grid, plan, need_eps_i, return_exact, only, cap)


def evaluate_on_grid(model: DensityModel, shifts: np.ndarray, eps: np.ndarray | None = None,
                     grid: np.ndarray | None = None, plan: _laplace.GridPlan | None = None,
                     need_eps_i: bool = True, return_exact: bool = False, only: np.ndarray | None = None,
                     cap: np.ndarray | None = None):
    """:func:`evaluate` on a grid with certified bounds: the general path (variable bandwidths,
    Gaussian kernels), also valid for one scale (the tests compare it with the closed form)."""
    shifts = np.atleast_2d(np.asarray(shifts, dtype=np.float64))
    C, n = shifts.shape
    if grid is None:
        grid = base_grid(model, model.points[None, :] - shifts)
    fast = np.zeros(C, dtype=bool)
    plan = plan if plan is not None else grid_plan(model, grid)
    scaled = (np.abs(shifts) / model.bandwidths).max(axis=1, initial=0.0)
    gaussian = model.kernel == "gaussian"
    if not gaussian:
        fast = scaled <= _laplace.MAX_BOUND
    else:
        fast = scaled <= _gaussian.MAX_SHIFT
    levels = clear = sup_levels = None
    skipped = np.empty(0, dtype=np.intp)
    need_eps_i = need_eps_i or eps is None
    if eps is not None:
        eps = np.asarray(eps, dtype=np.float64)
        order = np.argsort(eps)
        wanted = np.ones(len(eps), dtype=bool) if only is None else np.asarray(only, dtype=bool)
        computed, skipped = order[wanted[order]], order[~wanted[order]]  # ascending ε
        if len(skipped) and (not wanted[order[0]] or cap is None):
            raise ValueError("only must keep the smallest epsilon, and comes with cap")
        # the nodes hold every crossing of the ε computed; at the others they decide sup |L| > ε
        levels = np.unique(np.r_[-eps[computed], eps[computed]])
        sup_levels = eps[skipped] if len(skipped) else None
        clear = None if need_eps_i else float(eps.min())
    eps_i = np.empty(C)
    delta = None if eps is None else np.empty((C, len(eps)))
    exact = np.ones(C, dtype=bool)
    same = ~shifts.any(axis=1)  # p̂_i ≡ p̂: exactly no risk
    eps_i[same] = 0.0
    if delta is not None:
        delta[same] = 0.0
    for rows, use in ((np.flatnonzero(fast & ~same), plan), (np.flatnonzero(~fast & ~same), None)):
        width = max(n * n, len(grid) + n) if use is not None and not gaussian else len(grid) + n
        if gaussian and use is not None:
            rows = rows[np.argsort(scaled[rows], kind="stable")]  # blocks of like shifts: fewer terms
        step = max(1, BLOCK_CELLS // width)
        for k in range(0, len(rows), step):
            r = rows[k:k + step]
            parts, kept = node_values(model, shifts[r], grid, use, levels, clear, need_eps_i, sup_levels)
            if len(kept) < len(r):  # certified sup |L| ≤ min ε: ε_i not computed, δ_i = 0
                eps_i[r], delta[r], exact[r] = np.nan, 0.0, False
                r = r[kept]
                exact[r] = True
            for nd, L, sub in parts:  # a later part replaces its rows' results
                rs = r if sub is None else r[sub]
                eps_i[rs] = individual_eps(model, nd, L, shifts[rs]) if need_eps_i else np.nan
                if eps is not None:
                    d = np.empty((len(rs), len(eps)))
                    d[:, computed] = sweep_delta(nd, L, eps[computed])  # never empty: min ε is kept
                    if len(skipped):
                        top = np.abs(L).max(axis=1, keepdims=True)
                        d[:, skipped] = np.where(top > eps[skipped], np.nan, 0.0)
                    delta[rs] = d
            if len(skipped) and len(r):  # rows above a cap get their δ_i there, on nodes for it
                over = r[(delta[r][:, order[:1]] > cap[skipped][None, :]).any(axis=1)]
                if len(over):
                    delta[np.ix_(over, skipped)] = _delta_on_crossings(model, shifts[over], grid, use,
                                                                       eps[skipped])
    if delta is not None:
        # Laplace: exact, δ_i(ε) = 0 for ε ≥ ε_i; Gaussian: δ_i(ε) ≤ δ_i(ε_i(τ)) ≤ τ, reported as 0
        delta[eps_i[:, None] <= eps[None, :]] = 0.0
    return (eps_i, delta, exact) if return_exact else (eps_i, delta)


def _delta_on_crossings(model: DensityModel, shifts: np.ndarray, grid: np.ndarray,
                        plan: _laplace.GridPlan | None, eps: np.ndarray) -> np.ndarray:
    """δ_i at ``eps`` (ascending) on nodes that hold every crossing of ±ε."""
    parts, _ = node_values(model, shifts, grid, plan, np.unique(np.r_[-eps, eps]), None, False)
    out = np.empty((len(shifts), len(eps)))
    for nd, L, sub in parts:  # a later part replaces its rows' results
        out[slice(None) if sub is None else sub] = sweep_delta(nd, L, eps)
    return out


def total_risk(delta: np.ndarray, axis=0) -> np.ndarray:
    """δ* = 1 − Π(1 − δ_i), computed as −expm1(Σ log1p(−δ_i)) (docs/method.md#41-per-individual-risk)."""
    with np.errstate(divide="ignore"):
        return -np.expm1(np.sum(np.log1p(-np.clip(delta, 0, 1)), axis=axis))
