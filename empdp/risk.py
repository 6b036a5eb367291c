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
from .density import DensityModel, kernel_terms
from .errors import InputError

#: τ: for Gaussian kernels ε_i is the smallest ε with δ_i(ε) ≤ τ, and δ_i ≤ τ is reported as 0
EPS_TOLERANCE = 1e-12
GAUSSIAN_TOL = EPS_TOLERANCE  # the former name
_REACH = {"laplace": 46.0, "gaussian": 12.0}
_STEP = 1.0 / 6.0  # node spacing, in kernel scales, where the kernels carry mass


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
#: bytes per grid node and kernel term (+ 2) at the peak of a plan and its evaluation (measured:
#: 21–30 × 8 with a few rows, the matrix form's (2n × 3G) product and its chunks dominating)
GRID_NODE_BYTES = 8 * 32


#: a grid is refused for memory only beyond this many nodes per point (normal grids have a few
#: dozen: b/6 spacing within 4 scales); 5,000 daily databases make a large grid, not a wrong one
ABNORMAL_NODES_PER_POINT = 200


def grid_bytes(nodes: int, n: int) -> int:
    """Estimated peak memory of :func:`grid_plan` and :func:`evaluate` on a grid of ``nodes`` nodes."""
    return GRID_NODE_BYTES * int(nodes) * (n + 2)


def _check_grid(model: DensityModel, pts: np.ndarray, nodes: int, budget: float | None, labels=None) -> None:
    """Refuse (InputError) a grid of ``nodes`` nodes (around ``pts``), abnormally many per point,
    whose :func:`grid_bytes` exceed ``budget`` bytes, before it is built."""
    need = grid_bytes(nodes, len(model.points))
    if budget is None or need <= budget or nodes <= ABNORMAL_NODES_PER_POINT * len(pts):
        return  # a grid of normal size is not refused: many databases make it large, not wrong
    q, b = model.points, model.bandwidths
    span = float(pts.max() - pts.min())
    dev = np.abs(q - np.median(q))
    far = int(np.argmax(dev))
    outlier = ""
    if dev[far] > 10 * np.median(dev):  # one value far from the others' spread: name it
        name = f"database {labels[far]}" if labels is not None else "the database"
        outlier = f", or inspect {name}, whose value {q[far]:.6g} lies far from the others"
    raise InputError(
        f"the density grid would need ~{nodes:,} nodes, ~{need / 1e9:.3g} GB, over the memory limit "
        f"({budget / 1e9:.3g} GB): the query values and their leave-one-out values span {span:.4g}, "
        f"{span / b.min():.3g} times the smallest kernel bandwidth {b.min():.3g}; pass a larger --bandwidth "
        f"(or --bandwidth auto) or a larger --memory-limit{outlier}")


def base_grid(model: DensityModel, extra_points: np.ndarray | None = None, budget: float | None = None,
              labels=None) -> np.ndarray:
    """Shared nodes: every q_j, spacing b/6 where kernels carry mass, geometric in the tails.

    ``extra_points``: kinks that may need nodes, flat, or (rows, n) with column j the kinks of
    term j (q_j − Δ_ij): then a kink within 3 b_min of its own q_j is left out at once (its
    nearest q on either side is no farther, so the rule below leaves it out too; it spares
    that rule's searches on the ~10^6 kinks of a block).

    With ``budget`` (bytes), an abnormally large grid (over ABNORMAL_NODES_PER_POINT nodes per
    point, e.g. from a bandwidth of 10^-9 of the values' spread) whose plan and evaluation would
    need more (:func:`grid_bytes`) is refused with an :class:`~empdp.errors.InputError` before it is built
    (naming the outlying database by ``labels``, the databases' names, when given).
    """
    q, b = model.points, model.bandwidths
    pts, bws = q, b
    if extra_points is not None and np.size(extra_points):
        # only kinks outside the finely gridded neighbourhood of the q_j need nodes of their own
        g = b.min() * _STEP
        extra = np.asarray(extra_points, dtype=float)
        if extra.ndim == 2 and extra.shape[1] == len(q):
            extra = extra[np.abs(extra - q[None, :]) > 3.0 * b.min()]
        extra = extra.ravel()
        qs = np.argsort(q)
        k = np.clip(np.searchsorted(q[qs], extra), 1, len(q) - 1)
        near = np.minimum(np.abs(extra - q[qs][k - 1]) / b[qs][k - 1], np.abs(q[qs][k] - extra) / b[qs][k])
        extra = np.unique(np.round(extra[near > 3.0] / g) * g)
        pts, bws = np.r_[q, extra], np.r_[b, np.full(len(extra), b.min())]
    order = np.argsort(pts)
    pts, bws = pts[order], bws[order]
    reach = _REACH[model.kernel]
    template = np.r_[-np.geomspace(reach, 4, 24), np.linspace(-4, 4, 49)[1:-1], np.geomspace(4, reach, 24)]
    prov = np.unique((pts[:, None] + bws[:, None] * template[None, :]).ravel())
    prov = _fill_gaps(prov, pts, bws, reach, FAR_GAP[model.kernel])
    # local spacing: b/6 within 4 scales of the nearest point, growing like distance/24 beyond
    k = np.clip(np.searchsorted(pts, prov), 1, len(pts) - 1)
    dl, dr = np.abs(prov - pts[k - 1]), np.abs(pts[k] - prov)
    s_left = np.maximum(bws[k - 1], dl / 4)
    s_right = np.maximum(bws[k], dr / 4)
    spacing = _STEP * np.minimum(s_left, s_right)
    # place nodes at equal steps of ∫ dx / spacing(x)
    dens = 1.0 / spacing
    cum = np.r_[0.0, np.cumsum(np.diff(prov) * 0.5 * (dens[1:] + dens[:-1]))]
    _check_grid(model, pts, int(min(cum[-1], 2.0**62)) + 3 + len(q), budget, labels)
    nodes = np.interp(np.arange(0, np.floor(cum[-1]) + 1), cum, prov)
    return np.unique(np.r_[nodes, prov[0], prov[-1], q])


#: distance, in the kernel scales of a gap's end point, from which a gap between the points'
#: neighbourhoods gets nodes of its own (:func:`_fill_gaps`): that point's kernel is below e^{−684} there
FAR_GAP = {"laplace": 700.0, "gaussian": 37.0}


def _fill_gaps(prov: np.ndarray, pts: np.ndarray, bws: np.ndarray, reach: float, far: float) -> np.ndarray:
    """Provisional nodes in the far parts of the gaps between the points' neighbourhoods.

    Nodes are placed at equal steps of ∫ dx / spacing, by the trapezoid rule between provisional
    nodes. Across a gap without provisional nodes that integrand stays at its value at the gap's
    ends (spacing ≈ b · reach/24), so a gap of D kernel scales took ~D/2 nodes: 10^9 at a bandwidth
    of 10^−9 of the query values' spread, 23 GB of grid. With nodes from ``far`` (:data:`FAR_GAP`)
    scales of each end point on, at the template's geometric ratio up to the gap's middle, the spacing grows
    like distance/24 there, as :func:`base_grid` intends: ~50 ln(D / 2 far) nodes. A gap
    narrower than 2 far scales gets none, so its grid is unchanged. The wider spacing is
    where the end points' kernels are below e^{−700} (0 in float64 from the next node on) and
    every kernel is beyond 46 of its scales (mass < 1e-20): the integrals lose nothing there.
    """
    lo, hi = pts - reach * bws, pts + reach * bws
    top = np.maximum.accumulate(hi)  # pts are sorted: how far right the points up to k reach,
    low = np.minimum.accumulate(lo[::-1])[::-1]  # and how far left those from k on reach
    k = np.flatnonzero(low[1:] > top[:-1])  # no neighbourhood meets (top[k], low[k + 1])
    if not len(k):
        return prov
    a, c = pts[k], pts[k + 1]
    half = np.r_[0.5 * (c - a), 0.5 * (c - a)]
    start, sign = np.r_[a, c], np.r_[np.ones(len(k)), -np.ones(len(k))]
    d0 = np.r_[np.maximum(far * bws[k], top[k] - a), np.maximum(far * bws[k + 1], c - low[k + 1])]
    use = d0 < half
    if not use.any():
        return prov
    ratio = (reach / 4.0) ** (1.0 / 23.0)  # the template's geometric step
    count = np.zeros(len(use), dtype=np.intp)
    count[use] = np.ceil(np.log(half[use] / d0[use]) / np.log(ratio))
    side, m = _laplace.expand_ranges(np.zeros(len(count), dtype=np.intp), count)
    extra = np.r_[start[side] + sign[side] * d0[side] * ratio ** m, (0.5 * (a + c))[use[:len(k)] | use[len(k):]]]
    return np.unique(np.r_[prov, extra])


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
def _mass_poly(h, va, vc, da, dc, mass):
    """Coefficients (of t, …, t⁵) of ∫_0^{th} of the quartic-corrected Hermite model of a density
    on an interval of length h, as a polynomial in t ∈ [0, 1].

    The model is the cubic Hermite interpolant of the values va, vc and one-sided slopes da, dc
    at both ends, plus a multiple of the bubble t²(1−t)² that makes its integral over the whole
    interval the exact ``mass``.
    """
    A, B, Cc, D = h * va, h * h * da, h * vc, h * h * dc
    Q = 30 * (mass - (A + Cc) / 2 - (B - D) / 12)  # the bubble's weight times ∫ t²(1−t)² = 1/30
    return A, B / 2, Cc - A + (Q - 2 * B - D) / 3, (A - Cc - Q) / 2 + (B + D) / 4, Q / 5


def _cubic_root(a0, a1, a2, a3, rise, t, tol=1e-4):
    """t ∈ [0, 1] where a0 + a1 t + a2 t² + a3 t³ is zero, from the starting points ``t`` (the
    linear guesses); ``rise`` is the cubic's change from t = 0 to 1 (its sign: rising or falling).

    Two Newton steps, and the second one's size bounds the error: Newton converges
    quadratically, so when that step is at most ``tol`` (of the cell) the error left is of
    order tol² (times the cubic's |a''/a'|, O(1) on these cells). A root error e moves the
    partial masses by O(e²) of the cell's, the integrand vanishing at the root: about 1e-16
    of the cell's mass at tol = 1e-4. On these cells nearly every root gets there; the others
    (a larger or non-finite second step, or one that leaves [0, 1]) are found by
    :func:`_bracketed_root`, to tol².
    Each root depends on its own coefficients only.
    """
    t0 = t
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(2):
            H = ((a3 * t + a2) * t + a1) * t + a0
            dH = (3 * a3 * t + 2 * a2) * t + a1
            step = H / dH
            t = np.clip(t - step, 0.0, 1.0) if k == 0 else t - step
    # (a root the second step leaves outside [0, 1] is one of a model that is not monotone there)
    bad = np.flatnonzero(~((np.abs(step) <= tol) & (t >= 0.0) & (t <= 1.0)))
    if len(bad):
        t[bad] = _bracketed_root(*(v[bad] for v in (a0, a1, a2, a3)), rise[bad] > 0, t0[bad], tol=tol * tol)
    return t


def _bracketed_root(a0, a1, a2, a3, rising, t, tol=1e-8, iters=60):
    """:func:`_cubic_root` by Newton's method safeguarded by bisection (``rising``: the cubic's
    direction): a root stops once its step is at most ``tol``. Every root iterates until most
    have stopped; the last few go on alone.
    """
    out = t.copy()
    active = None  # the roots iterated (None: all)
    done = np.zeros(len(t), dtype=bool)  # of those, the ones already stopped
    lo, hi = np.zeros_like(t), np.ones_like(t)
    for _ in range(iters):
        H = ((a3 * t + a2) * t + a1) * t + a0
        dH = (3 * a3 * t + 2 * a2) * t + a1
        above = (H > 0) == rising  # the root lies left of t
        hi = np.where(above, t, hi)
        lo = np.where(above, lo, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = t - H / dH
        # a Newton step that stays in the bracket (or stays put, at an exact root) is taken
        step = np.where((newton >= lo) & (newton <= hi), newton, 0.5 * (lo + hi))  # NaN: bisect
        # a stopped root keeps its value: each root's result depends on itself only, not on
        # the roots it is iterated with
        if active is None:
            out = np.where(done, out, step)
        else:
            out[active] = np.where(done, out[active], step)
        done |= np.abs(step - t) <= tol
        t = step
        left = len(done) - np.count_nonzero(done)
        if left == 0:
            break
        if left <= len(done) // 4:  # few left: go on with those only
            keep = np.flatnonzero(~done)
            active = keep if active is None else active[keep]
            t, lo, hi, rising, a0, a1, a2, a3 = (v[keep] for v in (t, lo, hi, rising, a0, a1, a2, a3))
            done = np.zeros(len(active), dtype=bool)
    return out


#: cuts per step of :func:`_cut_sums` (its temporaries stay in cache)
CUT_CHUNK = 8192

#: the node fields of p̂ and of p̂_i: value, right and left slopes, CDF
_P = ("p", "pr", "pl", "F")
_PI = ("pi", "pir", "pil", "Fi")


def _cut_sums(nd: _Nodes, L, Lr, Ll, h, rr, kk, sign, num, den, eps, growth, first=None, count=None):
    """∫ (num − e^ε den) over the part of each cut interval where sign·L > ε, summed by row and level.

    Interval j (row ``rr[j]``, interval ``kk[j]``) is cut by the levels ``first[j]``, …,
    ``first[j] + count[j] − 1`` of ``eps`` (one level, ``eps[0]``, when ``count`` is None).
    On each, the cut point is the root of the cubic Hermite model of sign·L, and the masses
    left of it come from the quartic-corrected Hermite models of both densities. The models'
    coefficients are formed once per interval and shared by the levels that cut it.
    Returns the sums, (rows, len(eps)).
    """
    C, N = L.shape
    E = len(eps)
    a = rr * N + kk  # flat index of each interval's left node (and a + 1 of its right one)
    hh = h[rr, kk]
    la, lc = sign * L.ravel()[a], sign * L.ravel()[a + 1]
    hma, hmc = hh * (sign * Lr.ravel()[a]), hh * (sign * Ll.ravel()[a + 1])
    d = lc - la

    rising = d > 0  # the region sign·L > ε lies right of the root, else left of it
    flip = np.where(rising, -1.0, 1.0)

    def poly(f):
        """The mass inside the region as c0 + k1 t + … + k5 t⁵ (t the root), and the whole mass."""
        v, dr, dl, F = (getattr(nd, g).ravel() for g in f)
        mass = np.clip(F[a + 1] - F[a], 0, None)
        k = _mass_poly(hh, v[a], v[a + 1], dr[a], dl[a + 1], mass)
        return (np.where(rising, mass, 0.0), *(flip * c for c in k), mass)

    # per interval: la, d, then the cubic's a1..a3, then both densities' mass polynomials
    per = np.stack((la, d, hma, 3 * d - 2 * hma - hmc, hma + hmc - 2 * d, *poly(num), *poly(den)))
    if count is None:
        e = np.zeros(len(rr), dtype=np.intp)
        j = None
    else:
        j, e = _laplace.expand_ranges(first, count)
    contrib = np.empty(len(e))
    for c0 in range(0, len(e), CUT_CHUNK):  # cache-sized chunks: a dozen temporaries per step
        c1 = min(c0 + CUT_CHUNK, len(e))
        pc = per[:, c0:c1] if j is None else np.take(per, j[c0:c1], axis=1)
        la, d, a1, a2, a3 = pc[:5]
        level = eps[e[c0:c1]]
        with np.errstate(divide="ignore", invalid="ignore"):
            t0 = np.nan_to_num(np.clip((level - la) / d, 0, 1), nan=0.5)
        t = _cubic_root(la - level, a1, a2, a3, d, t0)

        def part(k0, k1, k2, k3, k4, k5, mass):
            return np.clip(k0 + t * (k1 + t * (k2 + t * (k3 + t * (k4 + t * k5)))), 0, mass)

        contrib[c0:c1] = part(*pc[5:12]) - growth[e[c0:c1]] * part(*pc[12:19])
    at = rr if j is None else rr[j]
    return np.bincount(at * E + e, weights=contrib, minlength=C * E).reshape(C, E)


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
