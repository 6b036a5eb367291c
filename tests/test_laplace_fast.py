"""The matrix form for Laplace kernels (empdp._laplace) against direct kernel sums."""

import numpy as np
import pytest
from reference import laplace_quadrature_delta

from empdp import risk
from empdp.density import DensityModel, select_density
from empdp.risk import cells as _cells
from empdp.risk import laplace as _laplace


def _case(seed, integer=False):
    rng = np.random.default_rng(seed)
    n = 30
    if integer:  # count-like data: ties between kinks and grid nodes
        q = rng.integers(40, 60, n).astype(float)
        shifts = rng.integers(-2, 3, (12, n)).astype(float)
    else:
        q = np.r_[rng.normal(0, 1, n - 2), 4.0, -3.5]
        shifts = rng.normal(0, 0.05, (12, n)) * rng.random((12, 1)) * 4
        shifts[:, rng.random(n) < 0.3] = 0.0
    shifts[0] = 0.0
    shifts[1, 0] = 3.0  # a large move of one database (falls back to the direct path if M > MAX_BOUND)
    return q, shifts


@pytest.mark.parametrize("bandwidth", [0.4, "auto", "variable"])
@pytest.mark.parametrize("integer", [False, True])
def test_grid_values_match_direct_sums(bandwidth, integer):
    q, shifts = _case(3, integer)
    model = select_density(q, kernel="laplace", bandwidth=bandwidth)
    b = model.bandwidths
    grid = risk.base_grid(model, (q[None, :] - shifts).ravel())
    plan = _laplace.GridPlan(q, b, grid)
    ok = (np.abs(shifts) / b).max(axis=1) <= _laplace.MAX_BOUND
    fast = plan.shifted(shifts[ok])
    slow = _laplace.direct(np.broadcast_to(grid, (ok.sum(), len(grid))).copy(), q[None, :] - shifts[ok], b)
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f, s, rtol=1e-9, atol=1e-12 * np.abs(s).max())
    # p̂ between grid nodes from the Taylor series, and exactly at nodes (both one-sided slopes)
    rng = np.random.default_rng(0)
    x = np.r_[grid, rng.uniform(grid[0] - 1, grid[-1] + 1, 400)][None, :]
    for f, s in zip(plan.shared_at(x), _laplace.direct(x, q, b)):
        np.testing.assert_allclose(f, s, rtol=1e-12, atol=1e-14 * np.abs(s).max())


def test_direct_matches_kernel_terms():
    from empdp.density import kernel_terms
    rng = np.random.default_rng(1)
    b = rng.uniform(0.2, 1.0, 7)
    c = rng.normal(size=(3, 7))
    x = np.c_[c[:, :2], rng.normal(size=(3, 5))]  # includes nodes at kinks
    got = _laplace.direct(x, c, b)
    want = [np.zeros(x.shape) for _ in range(4)]
    for j in range(7):
        for w, t in zip(want, kernel_terms("laplace", x - c[:, j:j + 1], b[j])):
            w += t / 7
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)


def test_direct_blocks_reuse_their_buffers_without_changing_a_bit(monkeypatch):
    rng = np.random.default_rng(2)
    b = rng.uniform(0.2, 1.0, 9)
    c = rng.normal(size=(23, 9))
    x = np.c_[c[:, :1], rng.normal(size=(23, 2))]  # one node at a kink per row
    whole = _laplace.direct(x, c, b)
    monkeypatch.setattr(_laplace, "DIRECT_CELLS", 4 * 3 * 9)  # blocks of 4 rows, the last one of 3
    for w, g in zip(whole, _laplace.direct(x, c, b)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("seed", [4, 6])
def test_node_log_ratio_is_that_of_the_merged_nodes(seed):
    q, shifts = _case(seed)
    model = select_density(q, kernel="laplace", bandwidth="variable")
    ok = (np.abs(shifts) / model.bandwidths).max(axis=1) <= _laplace.MAX_BOUND
    grid = risk.base_grid(model, (q[None, :] - shifts).ravel())
    plan = _laplace.GridPlan(q, model.bandwidths, grid)
    values, _, _ = _laplace.node_values(plan, shifts[ok], np.array([-0.05, 0.05]))
    assert values["x"].shape[1] > len(grid)  # kinks were inserted
    again = _laplace.log_ratio(*(values[f] for f in ("p", "pi", "pr", "pir", "pl", "pil")))
    for f, a in zip(("L", "Lr", "Ll"), again):
        np.testing.assert_array_equal(values[f], a)


@pytest.mark.parametrize("integer", [False, True])
def test_matrix_form_gives_the_direct_results(integer, monkeypatch):
    q, shifts = _case(5, integer)
    model = select_density(q, kernel="laplace", bandwidth="variable")
    eps = np.array([0.01, 0.1, 0.5])
    e_fast, d_fast = risk.evaluate(model, shifts, eps)
    monkeypatch.setattr(_laplace, "MAX_BOUND", -1.0)  # every row through the direct kernel sums
    e_slow, d_slow = risk.evaluate(model, shifts, eps)
    assert e_fast[0] == 0 and np.all(d_fast[0] == 0)
    np.testing.assert_allclose(e_fast, e_slow, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(d_fast, d_slow, atol=1e-9)
    assert d_slow.max() > 0.01  # the case has risk to compare


@pytest.mark.parametrize("seed", [0, 1])
def test_kinks_left_out_never_change_the_result(seed, monkeypatch):
    """A mean-like panel: narrow variable kernels, individuals moving every database by up to a
    few kernel scales. Cells holding a kink and a smooth extremum without a sign change of their
    end slopes occur (seed 1); the node selection must keep their kinks."""
    rng = np.random.default_rng(seed)
    q = np.sort(rng.normal(0, 0.004, 100))
    model = select_density(q, kernel="laplace", bandwidth="variable")
    mu = rng.standard_t(3, (400, 1)) * 10
    shifts = (mu + rng.normal(0, 1, (400, 100))) * 4e-5 * np.sign(rng.normal(size=(400, 1)))
    eps = np.array([0.05, 0.2, 0.6])
    e_fast, d_fast = risk.evaluate(model, shifts, eps)
    monkeypatch.setattr(_laplace, "MAX_BOUND", -1.0)
    e_slow, d_slow = risk.evaluate(model, shifts, eps)
    np.testing.assert_allclose(e_fast, e_slow, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(d_fast, d_slow, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_cells_left_out_never_change_the_result(seed, monkeypatch):
    """Kinks and extrema of L are nodes only in cells whose certified bounds can reach a level
    or ε_i; taking every cell must give the same ε_i and δ_i (fast and direct paths)."""
    rng = np.random.default_rng(seed)
    q = np.sort(rng.normal(0, 0.004, 100))
    model = select_density(q, kernel="laplace", bandwidth="variable")
    mu = rng.standard_t(3, (300, 1)) * 10
    shifts = (mu + rng.normal(0, 1, (300, 100))) * 4e-5 * np.sign(rng.normal(size=(300, 1)))
    shifts[:20] *= 40  # beyond MAX_BOUND: the direct path
    eps = np.geomspace(0.01, 1.0, 12)
    e_sel, d_sel = risk.evaluate(model, shifts, eps)
    kept = []
    real = _cells.matters

    def every_cell(lo, hi, *args, **kwargs):
        kept.append(real(lo, hi, *args, **kwargs).mean())
        return np.ones(np.shape(lo), dtype=bool)

    monkeypatch.setattr(_laplace, "matters", every_cell)
    e_all, d_all = risk.evaluate(model, shifts, eps)
    assert np.mean(kept) < 0.75  # the selection does leave cells out
    np.testing.assert_allclose(e_sel, e_all, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(d_sel, d_all, atol=1e-9)


def test_rows_cleared_by_their_bounds_have_no_risk():
    """need_eps_i=False: only δ_i is computed (ε_i is NaN), and rows whose certified sup |L| is at
    most min ε are skipped; their exact ε_i is indeed ≤ min ε, and every δ_i equals the full
    evaluation's although the δ-only nodes leave out what only sup |L| needs."""
    rng = np.random.default_rng(3)
    q = np.sort(rng.normal(0, 0.004, 100))
    model = select_density(q, kernel="laplace", bandwidth="variable")
    mu = rng.normal(0, 10, (600, 1))
    shifts = (mu + rng.normal(0, 1, (600, 100))) * 4e-5
    e_full, d_full = risk.evaluate(model, shifts, np.array([0.1, 0.3]))
    eps = np.array([np.quantile(e_full, 0.6), 0.3])
    e_full, d_full = risk.evaluate(model, shifts, eps)
    e_part, d_part, exact = risk.evaluate(model, shifts, eps, need_eps_i=False, return_exact=True)
    assert np.isnan(e_part).all()
    cleared = ~exact
    assert 0.3 < cleared.mean() < 0.6  # most rows below min ε are cleared by their bounds alone
    assert np.all(e_full[cleared] <= eps.min())
    assert (d_full[exact, 0] > 0).sum() > 100  # rows at risk, with cut intervals, are compared
    np.testing.assert_allclose(d_part, d_full, atol=1e-12)


@pytest.mark.parametrize("need_eps_i", [True, False])
def test_extrema_in_a_few_rows_give_the_full_insertion_results(need_eps_i, monkeypatch):
    """When few rows of a block have extrema of L to add, only those rows are widened (a second
    part); the results must equal inserting the extrema into every row."""
    rng = np.random.default_rng(7)
    q = np.sort(rng.normal(0, 0.004, 100))
    model = select_density(q, kernel="laplace", bandwidth="variable")
    mu = rng.normal(0, 10, (500, 1))
    shifts = (mu + rng.normal(0, 1, (500, 100))) * 4e-5
    eps = np.array([0.004, 0.02])
    parts = []
    real = risk.nodes._insert_extrema

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        parts.append(len(out))
        return out

    monkeypatch.setattr(risk.nodes, "_insert_extrema", spy)
    monkeypatch.setattr(risk.nodes, "EXTREMA_SHARE", 1.0)  # always a second part for the rows with extrema
    e_part, d_part = risk.evaluate(model, shifts, eps, need_eps_i=need_eps_i)
    assert 2 in parts  # some rows had extrema that matter
    monkeypatch.setattr(risk.nodes, "EXTREMA_SHARE", 0.0)  # always into every row
    e_all, d_all = risk.evaluate(model, shifts, eps, need_eps_i=need_eps_i)
    np.testing.assert_array_equal(e_part, e_all)
    np.testing.assert_allclose(d_part, d_all, rtol=1e-13, atol=1e-16)  # sums of other lengths: last bits
    assert (d_all[:, 0] > 0).sum() > 100


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("count", [1, 3, 8, 50])
def test_chunked_product_equals_the_full_one(integer, count):
    """The matrix form's product in grid chunks that skip B's zero blocks equals R @ B (ties of q
    with each other and with grid nodes included)."""
    q, shifts = _case(2, integer)
    model = select_density(q, kernel="laplace", bandwidth="variable")
    grid = risk.base_grid(model, (q[None, :] - shifts).ravel())
    plan = _laplace.GridPlan(model.points, model.bandwidths, grid)
    R = np.exp(np.concatenate([-shifts, shifts], axis=1) / np.r_[model.bandwidths, model.bandwidths])
    full = R @ plan.B
    order, chunks = _laplace._triangular_chunks(model.points, grid, plan.B, count)
    n, G = len(q), len(grid)
    got = np.full_like(full, np.nan)
    R_sorted = np.concatenate([R[:, n:][:, order], R[:, :n][:, order]], axis=1)  # left forms, then right
    for g0, g1, lo, hi, BB in chunks:
        part = R_sorted[:, lo:hi] @ BB
        w = g1 - g0
        for k in range(3):
            got[:, k * G + g0:k * G + g1] = part[:, k * w:(k + 1) * w]
    np.testing.assert_allclose(got, full, rtol=1e-13, atol=1e-13 * np.abs(full).max())
    assert sum(BB.size for *_, BB in chunks) < (0.8 if count > 2 else 1.01) * plan.B.size


def _dense_log_ratio(q, b, shifts, grid, per_cell=40):
    """L on ``per_cell`` interior points of every grid cell, by direct kernel sums: (C, G − 1, per_cell)."""
    t = (np.arange(per_cell) + 0.5) / per_cell
    x = (grid[:-1, None] + np.diff(grid)[:, None] * t[None, :]).ravel()
    p = _laplace.direct(x[None, :], q, b)[0][0]
    pi = _laplace.direct(np.broadcast_to(x, (len(shifts), len(x))).copy(), q[None, :] - shifts, b)[0]
    return (np.log(p)[None, :] - np.log(pi)).reshape(len(shifts), len(grid) - 1, per_cell)


def _bounds_case(kind: str, seed: int):
    """A panel-like case on its shared grid: (q, b, shifts, grid, plan, L, Lr, Ll, kink cells, K)."""
    rng = np.random.default_rng(seed)
    if kind == "integer":
        q, shifts = _case(4, integer=True)
    else:
        q = np.sort(rng.normal(0, 0.004, 60))
        mu = rng.normal(0, 10, (40, 1)) if kind != "spread" else rng.standard_t(2, (40, 1)) * 10
        shifts = (mu + rng.normal(0, 1, (40, 60))) * 4e-6  # M_i of a few hundredths, as in a large panel
        shifts[:5] *= rng.uniform(5, 300, (5, 1))  # larger moves: kink intervals over several cells
        shifts[5:10, rng.random(60) < 0.3] = 0.0  # absent from some databases
    bandwidth = float(np.std(q)) / 3 if kind == "fixed" else "variable"
    model = select_density(q, kernel="laplace", bandwidth=bandwidth)
    q, b = model.points, model.bandwidths
    shifts = shifts[(np.abs(shifts) / b).max(axis=1) <= _laplace.MAX_BOUND]
    grid = risk.base_grid(model, (q[None, :] - shifts).ravel())
    plan = _laplace.GridPlan(q, b, grid)
    p, pr, pl, _ = plan.shared
    pi, pir, pil, _ = plan.shifted(shifts)
    L = np.log(p) - np.log(pi)
    Lr, Ll = pr / p - pir / pi, pl / p - pil / pi
    cells = np.searchsorted(grid, q - shifts, side="right") - 1
    K = _cells.row_curvature(shifts, b, plan.curvature, cells)
    return q, b, shifts, grid, plan, L, Lr, Ll, cells, K


@pytest.mark.parametrize("kind", ["mean", "spread", "integer", "fixed"])
def test_cell_bounds_hold_between_the_grid_nodes(kind):
    """The certified bounds on L over each grid cell (row curvature from the kink intervals that
    reach the cell) hold at dense interior points, kinks of p̂_i inside the cells included; and
    they are tight enough to matter (the refined curvature is what clears rows and leaves kinks out)."""
    q, b, shifts, grid, plan, L, Lr, Ll, cells, K = _bounds_case(kind, 11)
    lo, hi = _cells.cell_bounds(L[:, :-1], L[:, 1:], Lr[:, :-1], Ll[:, 1:], np.diff(grid), K)
    dense = _dense_log_ratio(q, b, shifts, grid)
    tol = 1e-10 * (1 + np.abs(L).max())
    assert np.all(dense <= hi[:, :, None] + tol)
    assert np.all(dense >= lo[:, :, None] - tol)
    # the refined curvature is far below the coarse one (Var_w(s) ≥ 0, every term reweighted by
    # e^{2 M_i}) on the cells where either matters
    coarse = _cells.row_curvature(shifts, b, plan.curvature)
    used = coarse > 1e-6 * coarse.max()
    assert np.median(K[used] / coarse[used]) < 0.3


@pytest.mark.parametrize("kind", ["mean", "spread", "fixed"])
def test_lower_bounds_from_the_kinks_hold_and_tighten(kind):
    """The lower bounds on L that use the kinks' positions (tangents at each kink, L'' ≥ −K between
    them; min(La, Lc) − K h²/8 on cells without a kink) hold at dense interior points and at the
    kinks themselves, are never looser than :func:`cell_bounds`, and are much tighter on many cells."""
    q, b, shifts, grid, plan, L, Lr, Ll, cells, K = _bounds_case(kind, 12)
    lo, _ = _cells.cell_bounds(L[:, :-1], L[:, 1:], Lr[:, :-1], Ll[:, 1:], np.diff(grid), K)
    kinks, g = np.sort(q - shifts, axis=1), np.sort(cells, axis=1)
    on_node = (g >= 0) & (grid[np.clip(g, 0, len(grid) - 1)] == kinks)
    r, c = np.divmod(np.arange(lo.size), lo.shape[1])
    tight = _cells.cells_lower(r, c, L, Lr, Ll, grid, K, kinks, g, on_node, np.inf).reshape(lo.shape)
    assert np.all(tight >= lo)
    tol = 1e-10 * (1 + np.abs(L).max())
    assert np.all(_dense_log_ratio(q, b, shifts, grid) >= tight[:, :, None] - tol)
    inner = ~on_node & (g >= 0) & (g < len(grid) - 1)
    r, c = np.nonzero(inner)
    at_kink = np.log(_laplace.direct(kinks[r, c][:, None], q, b)[0][:, 0]) - np.log(
        _laplace.direct(kinks[r, c][:, None], (q[None, :] - shifts)[r], b)[0][:, 0])
    assert np.all(at_kink >= tight[r, g[r, c]] - tol)
    # the V of the two end tangents is often far below L: on a tenth of the cells with kinks the
    # kinks' positions take back at least a fifth of the bound (10-15% of them gain over 25% here)
    gain = (tight - lo)[r, g[r, c]] / np.maximum(np.abs(lo[r, g[r, c]]), 1e-300)
    assert np.quantile(gain, 0.9) > 0.2


@pytest.mark.parametrize("kind", ["mean", "spread", "fixed"])
def test_clearing_decides_as_bounding_every_cell(kind):
    """The clearing's first pass (hi and a crossing-free lower bound on every cell, full bounds
    only where that falls short) clears exactly the rows that the full bounds on every cell clear,
    at levels from "almost none" to "almost all"."""
    q, b, shifts, grid, plan, L, Lr, Ll, cells, K = _bounds_case(kind, 13)
    kinks, g = np.sort(q - shifts, axis=1), np.sort(cells, axis=1)
    on_node = (g >= 0) & (grid[np.clip(g, 0, len(grid) - 1)] == kinks)
    C, G1 = K.shape
    r, c = np.divmod(np.arange(C * G1), G1)
    _, hi = _cells.cell_bounds(L[:, :-1], L[:, 1:], Lr[:, :-1], Ll[:, 1:], np.diff(grid), K)
    rows = np.arange(C)
    cleared = []
    for level in np.quantile(np.abs(L).max(axis=1), [0.1, 0.5, 0.9]) * [1.0, 1.5, 3.0]:
        lo = _cells.cells_lower(r, c, L, Lr, Ll, grid, K, kinks, g, on_node, -level).reshape(C, G1)
        full = np.maximum(hi, -lo).max(axis=1) <= level
        fast = _cells._within(rows, L, Lr, Ll, grid, K, kinks, g, on_node, level)
        np.testing.assert_array_equal(fast, full)
        cleared.append(full.mean())
    assert min(cleared) < 0.5 < max(cleared)  # the levels test both outcomes


@pytest.mark.parametrize("shift", [-36.0, 30.0])
def test_far_kernel_variable_bandwidths_against_quadrature(shift):
    """Variable bandwidths, one kernel shifted ~28 of its scales (the direct path): near ε_i ≈ 28 the
    masses of p̂ where p̂_i's far kernel sits are multiplied by e^ε. From differences of a CDF near 1
    they lost 6.5e-5 of δ_i (shift to the right); from each kernel's tail they keep 1e-10."""
    q, b = np.array([0.0, 0.3, -0.2]), np.array([1.0, 0.7, 1.3])
    model = DensityModel("laplace", 1.0, 0.5, q, b, loglik=0.0)
    shifts = np.array([[0.0, 0.0, shift]])
    eps_i, _ = risk.evaluate(model, shifts)
    eps = np.array([0.9, 0.95, 0.98, 0.995]) * eps_i[0]
    _, delta = risk.evaluate(model, shifts, eps, need_eps_i=False)
    want = [laplace_quadrature_delta(q, b, shifts[0], e) for e in eps]
    assert min(want) > 1e-3
    np.testing.assert_allclose(delta[0], want, rtol=0, atol=1e-9)
