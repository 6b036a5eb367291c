"""The general path's exact node values and sweep (docs/method.md#52-exact-delta-and-epsilon-for-one-individual):
p̂ and p̂_i with slopes and CDFs on nodes that hold every kink, the interior extrema of L added as
nodes, ε_i as the largest |L|, and δ_i(ε) at many ε in one pass over the intervals."""

from __future__ import annotations

import numpy as np

from ..density import DensityModel
from . import cells as _cells
from . import gaussian as _gaussian
from . import laplace as _laplace
from .bounds import EPS_TOLERANCE
from .cuts import _P, _PI, _cell_ends, _cut_sums, _end, _turn_sums


class _Nodes:
    """Densities on each row's nodes: x, and for p̂ and p̂_i value, one-sided slopes, CDF."""

    FIELDS = _laplace.FIELDS

    def __init__(self, **arrays):
        for f in self.FIELDS:
            setattr(self, f, arrays[f])
        # slopes of L once known (set by node_values)
        self.Lr, self.Ll = arrays.get("Lr"), arrays.get("Ll")
        # nodes evaluated directly (no plan): the CDFs as tails, G = F − K (K: the share of the
        # kernels centred at or left of the node), to full relative precision where the nodes' masses
        # are tiny, for p̂ (G, K) and p̂_i (Gi, Ki) (see _masses)
        self.G, self.K, self.Gi, self.Ki = (arrays.get(f) for f in TAILS)
        # extrema of L left inside their intervals (rows, intervals, t, L, L', densities; see _insert_extrema)
        self.turns = None


#: the tail fields of directly evaluated nodes and of the matrix form's (see _Nodes)
TAILS = _laplace.TAILS


def _evaluate(model: DensityModel, x: np.ndarray, kinks: np.ndarray, survival: bool = False) -> _Nodes:
    """Exact p̂, p̂_i, slopes and CDFs at x (C, G); ``kinks`` (C, n) = q_j − Δ_ij. With ``survival``,
    also the CDFs as tails: G = Σ_{c > x} Φ((x − c)/b) − Σ_{c ≤ x} Φ̄((x − c)/b),
    each kernel's smaller tail, and K the share of the centres c ≤ x, so that F = G + K (for p̂:
    ``G``, ``K``; for p̂_i: ``Gi``, ``Ki``)."""
    q, b, kern = model.points, model.bandwidths, model.kernel
    acc = {f: np.zeros(x.shape) for f in _Nodes.FIELDS[1:] + (TAILS if survival else ())}
    for j in range(len(q)):
        for names, u in ((("p", "pr", "pl", "F", "G", "K"), x - q[j]),
                         (("pi", "pir", "pil", "Fi", "Gi", "Ki"), x - kinks[:, j:j + 1])):
            terms = kern.tail_terms(u, b[j]) if survival else kern.terms(u, b[j])
            for name, term in zip(names, terms):
                if term is not None:
                    acc[name] += term
            if terms[2] is None:  # one slope (a smooth kernel): the left slope is the right one
                acc[names[2]] += terms[1]
    n = len(q)
    return _Nodes(x=x, **{f: a / n for f, a in acc.items()})


def _log_ratio(nd: _Nodes):
    if nd.pl is nd.pr and nd.pil is nd.pir:  # one slope (Gaussian kernels): computed once
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = nd.pr / nd.p - nd.pir / nd.pi
            return _laplace.finite_log_ratio(np.log(nd.p) - np.log(nd.pi), slope, slope)
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
                    sup_levels: np.ndarray | None = None, modelled=None) -> list:
    """Add the interior extrema of L as nodes (L is then monotone between nodes).

    Returns a list of parts ``(nodes, L, rows)`` (the nodes carry L's slopes
    as ``Lr``, ``Ll``): the first has every row (``rows`` = None), as given;
    when some rows have extrema to add, a second part holds just those rows
    with their extrema inserted, and its results replace the first part's
    for them. (Few rows have
    extrema that matter: widening every row would cost a full copy.)

    With ``curvature_at(rows, ks)`` (Laplace kernels: K with L'' ≥ −K on those
    intervals between kinks) only the extrema of intervals whose certified
    bounds (:func:`empdp._cells.cell_bounds`) can reach a level of
    ``levels`` or the row's largest |L| are added: elsewhere the interval
    lies on one side of every level and below ε_i, and its exact masses suffice.
    With ``need_eps_i=False`` only the levels count (ε_i is not asked for).
    At ``sup_levels`` only whether sup |L| exceeds them counts (:func:`empdp._cells.matters`).
    Intervals starting at a node where ``certified`` is True were shown by the
    same bounds not to matter (see :func:`empdp.risk.laplace.node_values`).

    With ``modelled`` (δ_i only: ``need_eps_i`` False, no ``sup_levels``; ``modelled(rows, x)``
    gives L, L' and the densities' values and slopes at x, exactly) the extrema that matter are
    not inserted as nodes: the nodes keep them as ``turns`` (rows, intervals, the extremum's place
    t ∈ (0, 1) on the interval's cubic Hermite model of L, and those values there), and
    :func:`sweep_delta` integrates these intervals' cuts apart (:func:`empdp.risk.cuts._turn_sums`).
    Without the CDFs at the extrema (an ndtr per kernel) and the rebuilt node arrays, ~8 µs a row
    less on a bounded 10^7-row panel.
    """
    C = nd.x.shape[0]
    h = np.diff(nd.x, axis=1)
    ma, mc = Lr[:, :-1], Ll[:, 1:]
    turn = (h > 0) & (((ma > 0) & (mc < 0)) | ((ma < 0) & (mc > 0)))
    if certified is not None:
        turn &= ~certified[:, :-1]
    rows, ks = np.nonzero(turn)
    ends = _cell_ends(L, Lr, Ll, h, rows, ks)
    if curvature_at is not None and len(rows):
        row_top = np.abs(L).max(axis=1)
        top = row_top if need_eps_i else np.full(C, np.inf)
        lo, hi = _cells.cell_bounds(*ends, curvature_at(rows, ks))
        matters = _cells.matters(lo, hi, top[rows], levels, sup_levels, row_top[rows])
        rows, ks = rows[matters], ks[matters]
        ends = tuple(v[matters] for v in ends)
    if not len(rows):
        nd.Lr, nd.Ll = Lr, Ll
        return [(nd, L, None)]
    t = _hermite_extremum(*ends)
    xe = _end(nd.x, rows, ks) + t * ends[4]
    if modelled:  # L, the densities and their slopes there, exactly (no CDFs: the interval is not split)
        nd.Lr, nd.Ll, nd.turns = Lr, Ll, (rows, ks, t, *modelled(rows, xe))
        return [(nd, L, None)]
    values = dict(zip(_Nodes.FIELDS + TAILS, (xe, *evaluate_at(rows, xe))))
    part, rows = np.unique(rows, return_inverse=True)  # the rows with extrema, renumbered
    if len(part) > EXTREMA_SHARE * C:  # many rows: insert into all of them
        part, rows = np.arange(C), part[rows]
    # one slope (Gaussian kernels: the left slopes are the right ones) is inserted once
    alias = {"pl": "pr", "pil": "pir", "Ll": "Lr"} if nd.pl is nd.pr and nd.pil is nd.pir else {}
    if alias:
        values["pl"], values["pil"] = values["pr"], values["pir"]
    values.update(zip(("L", "Lr", "Ll"), _log_ratio(_Nodes(**values))))
    base = {f: getattr(nd, f) for f in _Nodes.FIELDS} | {"L": L, "Lr": Lr, "Ll": Ll}
    if nd.G is not None:
        base |= {f: getattr(nd, f) for f in TAILS}
    base = {f: a for f, a in base.items() if f not in alias}
    if len(part) < C:
        base = {f: a[part] for f, a in base.items()}
    # fields shared by every row (broadcast views) are inserted from their one row
    base = {f: a[0] if a.ndim == 2 and a.strides[0] == 0 else a for f, a in base.items()}
    merged = _cells.insert_after(base, len(part), rows, ks, values)
    merged.update({f: merged[g] for f, g in alias.items()})
    ext = _Nodes(**merged)
    ext.Lr, ext.Ll = merged["Lr"], merged["Ll"]  # (and the tails when given)
    if len(part) == C:
        return [(ext, merged["L"], None)]
    nd.Lr, nd.Ll = Lr, Ll
    return [(nd, L, None), (ext, merged["L"], part)]


def node_values(model: DensityModel, shifts: np.ndarray, grid: np.ndarray,
                plan: _laplace.GridPlan | None = None, levels: np.ndarray | None = None,
                clear_below: float | None = None,
                need_eps_i: bool = True, sup_levels: np.ndarray | None = None) -> tuple[list, np.ndarray]:
    """Nodes with exact densities for each row of ``shifts``, extrema of L inserted.

    With a :class:`empdp.risk.laplace.GridPlan` (Laplace kernels, rows with
    M_i ≤ MAX_BOUND) the grid part uses the matrix form, and a kink of p̂_i
    becomes a node only where a certified bracket on L over its cell could
    cross one of ``levels`` (sorted ±ε; None: ε_i only) or exceed the row's
    largest |L| (see :func:`empdp.risk.laplace.node_values`); there, rows whose
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
    curvature_at = modelled = None
    if isinstance(plan, _gaussian.SeriesPlan):
        # without ε_i, only extrema that may cross a level count: certified by L'' ≥ −K per cell
        series = _gaussian.series_nodes(plan, shifts, curvature=not need_eps_i and levels is not None)
        nd = _Nodes(**series)
        if series["K"] is not None:
            K_cells = series["K"]

            def curvature_at(r, k):
                return K_cells[r, k]  # the nodes are the grid's: interval k is cell k
        kinks = model.points[None, :] - shifts

        def evaluate_at(r, xe, cdf=True):  # every kernel at once (a loop over kernels: a numpy call each)
            x = xe[:, None]
            p = _gaussian.direct(x, np.broadcast_to(model.points, (len(xe), n)), model.bandwidths, cdf)
            pi = _gaussian.direct(x, kinks[r], model.bandwidths, cdf)
            if not cdf:  # L, L' and the densities' values and slopes
                p, pr, pi, pir = (v[:, 0] for v in (*p, *pi))
                with np.errstate(divide="ignore", invalid="ignore"):
                    slope = pr / p - pir / pi
                    Le, Se = _laplace.finite_log_ratio(np.log(p) - np.log(pi), slope, slope)[:2]
                return Le, Se, dict(p=p, pr=pr, pi=pi, pir=pir)
            return [v[:, 0] for v in (p[0], p[1], p[1], p[2], pi[0], pi[1], pi[1], pi[2])]
        n = len(model.points)
        if not need_eps_i and sup_levels is None:
            def modelled(r, xe):
                return evaluate_at(r, xe, cdf=False)
        L, Lr, Ll = _log_ratio(nd)
    elif plan is not None:
        values, rows, K_grid = _laplace.node_values(plan, shifts, levels, clear_below, need_eps_i, sup_levels)
        nd = _Nodes(**values)
        L, Lr, Ll = values["L"], values["Lr"], values["Ll"]
        certified = values["certified"]
        shifts = shifts[rows]
        kinks = model.points[None, :] - shifts
        b = model.bandwidths

        def evaluate_at(r, xe):  # (with the CDFs' tails where the plan keeps them: TAILS after FIELDS)
            a = plan.shared_at(xe[:, None])
            c = _laplace.direct(xe[:, None], kinks[r], b, tails=plan.tails is not None)
            return [v[:, 0] for v in (*a[:4], *c[:4], *a[4:], *c[4:])]
    else:
        kinks = model.points[None, :] - shifts
        if model.kernel.kinked:  # every kink is a node
            x = np.sort(np.concatenate([np.broadcast_to(grid, (C, len(grid))), kinks], axis=1), axis=1)
        else:
            x = np.broadcast_to(grid, (C, len(grid))).copy()
        nd = _evaluate(model, x, kinks, survival=True)

        def evaluate_at(r, xe):
            e = _evaluate(model, xe[:, None], kinks[r], survival=True)
            extra = [getattr(e, f)[:, 0] for f in TAILS] if e.G is not None else []
            return [getattr(e, f)[:, 0] for f in _Nodes.FIELDS[1:]] + extra
        L, Lr, Ll = _log_ratio(nd)
    if model.kernel.kinked:  # the kinks' curvature bounds where extrema of L may hide
        b = model.bandwidths
        if K_grid is None:
            K_grid = _cells.row_curvature(shifts, b, _cells.cell_curvature(model.points, b, grid))

        def curvature_at(r, k):
            return _interval_curvature(r, nd.x[r, k], nd.x[r, k + 1], grid, K_grid, 1.0 / b.min() ** 2)
    return _insert_extrema(nd, L, Lr, Ll, evaluate_at, curvature_at, levels, need_eps_i, certified,
                           sup_levels, modelled), rows


def individual_eps(model: DensityModel, nd: _Nodes, L: np.ndarray, shifts: np.ndarray,
                   floor: float = 0.0) -> np.ndarray:
    """ε_i = sup_x |log p̂ − log p̂_i| (Laplace kernels), or ε_i(τ), the smallest ε with δ_i(ε) ≤ τ
    (Gaussian kernels; see the module docstring), there NaN where ε_i(τ) ≤ ``floor`` (> 0)."""
    if model.kernel.exact_eps:
        absL = np.abs(L)
        return np.maximum(absL.max(axis=1), _cells.tail_limits(model.points, model.bandwidths, shifts))
    b = model.bandwidths
    upper = model.kernel.eps_bound((np.abs(shifts) / b).max(axis=1), np.count_nonzero(shifts, axis=1) / len(b))
    return _gaussian.tolerance_eps(nd.x, nd.p, nd.pr, nd.pi, nd.pir, upper, EPS_TOLERANCE, floor)


def sweep_delta(nd: _Nodes, L: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """δ_i(ε) for every row and every ε in ``eps`` (ascending, ≥ 0):

        max( ∫_{L>ε} (p̂ − e^ε p̂_i),  ∫_{L<−ε} (p̂_i − e^ε p̂) ),

    both directions from one pass over the intervals ({L < −ε} is {−L > ε}). Whole
    intervals and the tails (L frozen at the end nodes) add exact CDF differences, binned by
    the first level that no longer covers them (in cache-sized chunks of rows); the intervals a
    level cuts add :func:`_cut_sums`, all rows' at once (a chunk's ~3,000 cuts would pay its
    hundred numpy calls each time).
    """
    Lr, Ll = nd.Lr, nd.Ll
    if Lr is None:
        _, Lr, Ll = _log_ratio(nd)
    C, N = L.shape
    E = len(eps)
    # L is clipped to ±700, so e^ε beyond e^700 changes nothing (and must not overflow)
    growth = np.exp(np.minimum(eps, 700.0))
    step = max(1, SWEEP_CELLS // N)
    h = np.diff(nd.x, axis=1)
    # masses of the intervals, then of the two tails
    w_p, w_pi = _masses(nd.F, nd.G, nd.K), _masses(nd.Fi, nd.Gi, nd.Ki)
    whole = [np.empty((C, E)), np.empty((C, E))]  # per direction: the intervals and tails inside
    cuts = [[], []]  # per direction: (rows, intervals, first level, levels) of the cut intervals
    for r in range(0, C, step):  # cache-sized row chunks (contiguous views)
        rows = slice(r, r + step)
        for k, (d, cut) in enumerate(_binned(L[rows], h[rows], w_p[rows], w_pi[rows], eps, growth)):
            whole[k][rows] = d
            cuts[k].append((cut[0] + r, *cut[1:]))
    masses = {_P: w_p, _PI: w_pi}
    turns = None
    if nd.turns is not None:  # intervals holding an extremum
        turns = np.zeros((C, N), dtype=bool)
        turns[nd.turns[0], nd.turns[1]] = True
    for k, (sign, num, den) in enumerate(((1.0, _P, _PI), (-1.0, _PI, _P))):
        rr, kk = (np.concatenate(v) for v in list(zip(*cuts[k]))[:2])
        first = count = None
        if E > 1:
            first, count = (np.concatenate(v) for v in list(zip(*cuts[k]))[2:])
        if turns is not None:  # their cuts and the levels they cross twice: from the models of their sides
            at = turns[rr, kk]
            whole[k] += _turn_sums(nd, L, Lr, Ll, h, nd.turns, (rr[at], kk[at]) + ((None, None) if E == 1 else
                                   (first[at], count[at])), sign, num, den, eps, growth, masses=masses)
            rr, kk = rr[~at], kk[~at]
            if E > 1:
                first, count = first[~at], count[~at]
        if len(rr):
            whole[k] += _cut_sums(nd, L, Lr, Ll, h, rr, kk, sign, num, den, eps, growth, masses, first=first,
                                  count=count)
    return np.clip(np.maximum(*whole), 0.0, 1.0)


#: nodes per row chunk of :func:`sweep_delta`'s binning: its dozens of (rows × nodes) temporaries stay in cache
SWEEP_CELLS = 32_768


def _binned(L, h, w_p, w_pi, eps, growth):
    """For one chunk of rows (L, node spacings ``h``, masses of p̂ and p̂_i from :func:`_masses`),
    per direction (+: {L > ε}, −: {L < −ε}): the sums over the intervals and tails wholly inside the
    region at each ε, and the intervals the levels cut (rows, intervals, index of the first level,
    number of levels)."""
    C, N = L.shape
    E = len(eps)
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
        out = []
        for d, cut in ((d1, (lo_v <= e0) & (hi_v > e0) & (h > 0)), (d2, (lo_v < -e0) & (hi_v >= -e0) & (h > 0))):
            rr, kk = np.nonzero(cut)
            out.append((d[:, None], (rr, kk, None, None)))
        return out
    # only the intervals and tails with an end node outside (−ε_1, ε_1] lie inside, or are cut by, some
    # level's region (on a bounded 10^7-row panel, 24% of them): the others go to the bin of no level
    # and are never cut, so the selected ones give the same sums (in the same order) and cuts
    e0 = float(eps[0])
    big = ~((L > -e0) & (L <= e0))
    sel = np.empty((C, N + 1), dtype=bool)  # intervals, then the tails left and right (as w_p, w_pi)
    np.logical_or(big[:, :-1], big[:, 1:], out=sel[:, :-2])
    sel[:, -2], sel[:, -1] = big[:, 0], big[:, -1]
    r, c = np.nonzero(sel)
    inner = c < N - 1
    a = np.where(inner, c, (c - (N - 1)) * (N - 1))  # an interval's left node; a tail's own node
    L_flat = L.ravel()
    # the levels ±ε in one ascending list: one search serves both directions, and since
    # searchsorted is monotone, an interval's range of levels is that of its end nodes
    levels = np.r_[-eps[::-1], eps]
    at_a = np.searchsorted(levels, np.take(L_flat, r * N + a), side="left")
    at_b = np.where(inner, np.searchsorted(levels, np.take(L_flat, r * N + np.minimum(a + 1, N - 1)), side="left"),
                    at_a)
    w = r * (N + 1) + c
    wp, wpi = np.take(w_p.ravel(), w), np.take(w_pi.ravel(), w)
    cuttable = inner & (np.take(h.ravel(), r * (N - 1) + np.minimum(c, N - 2)) > 0)
    out = []
    for wn, wd, ia, ib in ((wp, wpi, np.maximum(at_a - E, 0), np.maximum(at_b - E, 0)),
                           (wpi, wp, E - np.minimum(at_a, E), E - np.minimum(at_b, E))):
        # ia, ib: the number of levels below sign·L at each end node (ties go either way: an interval
        # whose end sits on a level adds the same mass whole or cut); an interval (or tail) lies
        # inside {sign·L > ε} for the levels below ``start``, and the levels start ≤ e < stop cut it
        start, stop = np.minimum(ia, ib), np.maximum(ia, ib)
        # binned level-major from the top level down (bin E − start), so that the sums over the
        # bins above each level run down the columns: the levels above e are the bins before E − e
        flat = (E - start) * C + r
        bn = np.bincount(flat, weights=wn, minlength=C * (E + 1)).reshape(E + 1, C)
        bd = np.bincount(flat, weights=wd, minlength=C * (E + 1)).reshape(E + 1, C)
        d = (np.cumsum(bn, axis=0)[E - 1::-1] - growth[:, None] * np.cumsum(bd, axis=0)[E - 1::-1]).T
        cnt = np.where(cuttable, stop - start, 0)
        j = np.flatnonzero(cnt)
        out.append((d, (r[j], c[j], start[j], cnt[j])))
    return out


def _masses(F: np.ndarray, G: np.ndarray | None = None, K: np.ndarray | None = None) -> np.ndarray:
    """Masses (C, N + 1) of the N − 1 node intervals, then of the tails left and right, from the
    CDF ``F`` at the nodes, or when given from its tails F = G + K (see :func:`_evaluate`): an
    interval's mass is ΔG + ΔK, where G sums only the kernels' tails, small wherever the mass is.
    Differences of F lose the digits that e^ε multiplies: near F = 1 (a mass of 1e-37 under e^77,
    1.4e-3 of δ_i on the t3 panel at 16 scales), and in a gap between the points' clusters, where
    F stays at the share of the kernels on one side (an outlying database 56 scales away: 5e-3 of
    δ_i at ε = 44, whether F or 1 − F was differenced)."""
    if G is None:
        return np.concatenate([np.clip(np.diff(F, axis=1), 0, None), F[:, :1], 1 - F[:, -1:]], axis=1)
    inner = np.diff(G, axis=1) + np.diff(K, axis=1)
    return np.concatenate([np.clip(inner, 0, None), F[:, :1], (1.0 - K[:, -1:]) - G[:, -1:]], axis=1)
