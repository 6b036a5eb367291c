"""δ_i(ε) and ε_i for blocks of individuals: the closed form of the default model
(:mod:`empdp.risk.onescale`) or the general path on a grid (:mod:`empdp.risk.nodes`)."""

from __future__ import annotations

import numpy as np

from ..density import DensityModel
from ..errors import InputError
from ..kernels import Gaussian, Laplace
from . import gaussian as _gaussian
from . import laplace as _laplace
from . import onescale as _onescale
from .bounds import EPS_TOLERANCE, delta_terms_bound
from .grid import base_grid
from .nodes import individual_eps, node_values, sweep_delta

#: cells per evaluation block: rows × max(nodes, n²) for the matrix form, rows × nodes otherwise.
#: Large enough that numpy, not the interpreter, dominates (blocks run side by side in threads);
#: the direct kernel sums inside a block are chunked to stay in cache (_laplace.DIRECT_CELLS).
BLOCK_CELLS = 8_000_000
#: the same for Gaussian kernels: their many (rows × nodes) temporaries stay small enough to be reused
#: (fresh pages cost more than the arithmetic there: 8192 rows at once took 93 µs a row of system time)
GAUSSIAN_BLOCK_CELLS = 600_000
#: Gaussian rows shifted by M scales are evaluated on ⌈M / FINE_SHIFT⌉ times the nodes (see evaluate_on_grid),
#: at most MAX_PARTS times: beyond M = 256 the densities are so far apart that δ_i ≈ 1 up to ε ≈ M²/2,
#: far beyond the cap of L (±700), and a grid proportional to M would only cost memory
FINE_SHIFT = 4.0
MAX_PARTS = 64


#: the exact evaluation's shared plan for each kernel: the matrix form for Laplace kernels, the series
#: form for Gaussian ones (a kernel registered in :mod:`empdp.kernels` without a form here is refused)
PLANS = {Laplace: _laplace.GridPlan, Gaussian: _gaussian.SeriesPlan}


def grid_plan(model: DensityModel, grid: np.ndarray):
    """The shared plan for ``grid`` of the model's kernel (:data:`PLANS`)."""
    form = PLANS.get(type(model.kernel))
    if form is None:
        raise InputError(f"kernel {model.kernel.name!r} has no exact risk evaluation (its numerical form is "
                         "not in empdp.risk.exact.PLANS); use --kernel laplace or gaussian")
    return form(model.points, model.bandwidths, grid)


def evaluate(model: DensityModel, shifts: np.ndarray, eps: np.ndarray | None = None,
             grid: np.ndarray | None = None, plan: _laplace.GridPlan | None = None,
             need_eps_i: bool = True, return_exact: bool = False, only: np.ndarray | None = None,
             cap: np.ndarray | None = None, eps_floor: float = 0.0):
    """ε_i and δ_i(ε) for each row of ``shifts`` (C, n).

    Laplace kernels of one global scale (the default model) are evaluated in closed form by
    :mod:`empdp.risk.onescale`: every row exactly, with ε_i even when ``need_eps_i`` is False, and
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
    most the cap). ``eps_floor`` > 0 asks for ε_i only above it: Gaussian rows whose ε_i(τ) is
    at most ``eps_floor`` may get NaN instead (the search for ε_all needs no more; other
    models' ε_i cost nothing extra and stay exact). Where not computed, δ_i is NaN if it is positive (sup |L|
    > ε: the nodes are placed so that their largest |L| decides it, see
    :func:`empdp._cells.matters`) and 0 otherwise. Those ε need far fewer
    nodes than every crossing: on a 50-value sweep with 29 of them saturated,
    the evaluation took 124 µs a row instead of 150.
    """
    shifts = np.atleast_2d(np.asarray(shifts, dtype=np.float64))
    if _onescale.applies(model):  # the default model: exact in closed form, every row and every ε
        eps_i, delta = _onescale.evaluate(model.points, float(model.bandwidths[0]), shifts, eps, only, cap)
        return (eps_i, delta, np.ones(len(shifts), dtype=bool)) if return_exact else (eps_i, delta)
    return evaluate_on_grid(model, shifts, eps, grid, plan, need_eps_i, return_exact, only, cap, eps_floor)


def evaluate_on_grid(model: DensityModel, shifts: np.ndarray, eps: np.ndarray | None = None,
                     grid: np.ndarray | None = None, plan: _laplace.GridPlan | None = None,
                     need_eps_i: bool = True, return_exact: bool = False, only: np.ndarray | None = None,
                     cap: np.ndarray | None = None, eps_floor: float = 0.0):
    """:func:`evaluate` on a grid with certified bounds: the general path (variable bandwidths,
    Gaussian kernels), also valid for one scale (the tests compare it with the closed form)."""
    shifts = np.atleast_2d(np.asarray(shifts, dtype=np.float64))
    C, n = shifts.shape
    if grid is None:
        grid = base_grid(model, model.points[None, :] - shifts)
    fast = np.zeros(C, dtype=bool)
    plan = plan if plan is not None else grid_plan(model, grid)
    scaled = (np.abs(shifts) / model.bandwidths).max(axis=1, initial=0.0)
    gaussian = isinstance(plan, _gaussian.SeriesPlan)  # the series form, ε_i at a tolerance
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
    skip = same
    if gaussian and eps is None and eps_floor > 0:
        # rows whose term-by-term bound shows δ_i(floor) ≤ τ are not evaluated: their ε_i(τ) is at most
        # the floor (NaN, as from tolerance_eps). In the search for ε_all on a bounded 10^7-row panel,
        # 84% of the rows after the first batch; a bound costs ~5% of an exact evaluation. (Not for δ_i:
        # the stage's candidates are those the screening bound leaves, and this one clears ~3% of them.)
        cleared = ~same & (delta_terms_bound(model.kernel, eps_floor, np.abs(shifts) / model.bandwidths)
                           <= EPS_TOLERANCE)
        eps_i[cleared], exact[cleared] = np.nan, False
        skip = same | cleared
    # rows of Gaussian kernels evaluated directly (shifts of more than MAX_SHIFT scales) get the q_j among
    # their nodes, and each grid interval cut into ⌈M / FINE_SHIFT⌉ equal parts: where p̂_i's kernels sit
    # M scales from p̂'s, the densities change by up to e^{M/6} across a node interval, too fast for the
    # cut intervals' Hermite models. The error falls like the parts' fourth power: a row of the t3 panel
    # shifted by M = 16.7 scales in every database had δ_i off by 1e-5 on the grid and the q_j, 1.4e-7
    # with 2 parts, 1e-8 with 3, 2.3e-9 with 4 (against 8 parts and brute-force quadrature); at M = 4,
    # 3.8e-9 with the q_j alone
    groups = [(fast & ~skip, plan, grid), (~fast & ~skip, None, grid)]
    if gaussian:
        direct = ~fast & ~skip
        parts = np.where(direct, np.minimum(np.ceil(scaled / FINE_SHIFT), MAX_PARTS), 0).astype(np.int64)
        groups[1:] = [(direct & (parts == k), None, _subdivided(grid, int(k), model.points))
                      for k in np.unique(parts[direct])]
    for rows, use, nodes_at in ((np.flatnonzero(m), u, g) for m, u, g in groups):
        width = max(n * n, len(grid) + n) if use is not None and not gaussian else len(nodes_at) + n
        if gaussian and use is not None:
            rows = rows[np.argsort(scaled[rows], kind="stable")]  # blocks of like shifts: fewer terms
        step = max(1, (GAUSSIAN_BLOCK_CELLS if gaussian else BLOCK_CELLS) // width)
        for k in range(0, len(rows), step):
            r = rows[k:k + step]
            parts, kept = node_values(model, shifts[r], nodes_at, use, levels, clear, need_eps_i, sup_levels)
            if len(kept) < len(r):  # certified sup |L| ≤ min ε: ε_i not computed, δ_i = 0
                eps_i[r], delta[r], exact[r] = np.nan, 0.0, False
                r = r[kept]
                exact[r] = True
            for nd, L, sub in parts:  # a later part replaces its rows' results
                rs = r if sub is None else r[sub]
                eps_i[rs] = individual_eps(model, nd, L, shifts[rs], eps_floor) if need_eps_i else np.nan
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
                    delta[np.ix_(over, skipped)] = _delta_on_crossings(model, shifts[over], nodes_at, use,
                                                                       eps[skipped])
    if delta is not None:
        # Laplace: exact, δ_i(ε) = 0 for ε ≥ ε_i; Gaussian: δ_i(ε) ≤ δ_i(ε_i(τ)) ≤ τ, reported as 0
        delta[eps_i[:, None] <= eps[None, :]] = 0.0
    return (eps_i, delta, exact) if return_exact else (eps_i, delta)


def _subdivided(grid: np.ndarray, parts: int, points: np.ndarray) -> np.ndarray:
    """The grid with each interval cut into ``parts`` equal parts, and the ``points``."""
    if parts <= 1:
        return np.union1d(grid, points)
    t = np.arange(parts) / parts
    return np.union1d(np.r_[(grid[:-1, None] + np.diff(grid)[:, None] * t[None, :]).ravel(), grid[-1]], points)


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
