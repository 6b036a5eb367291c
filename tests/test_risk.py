"""δ_i and ε_i against a brute-force dense-grid reference (docs/method.md#41-per-individual-risk), screening, invariants."""

import numpy as np
import pytest
from reference import brute_force_risk

from empdp import risk
from empdp.assessment.assess import assess
from empdp.density import DensityModel, select_density
from empdp.loo import leave_one_out
from empdp.risk import cuts as _cuts
from empdp.risk import delta_upper_bound, evaluate, term_delta, total_risk
from empdp.settings import Execution, Model

EPS = np.array([0.0, 0.02, 0.1, 0.25, 0.5, 1.0, 2.0])


def random_case(seed, n=20, m=6, scale=0.2):
    rng = np.random.default_rng(seed)
    q = np.r_[rng.normal(size=n - 2), 3.5, -2.8]  # two outlying databases: tails matter
    shifts = rng.normal(scale=scale, size=(m, n)) * (rng.random((m, n)) < 0.6)
    shifts[0] = 0.0
    shifts[0, -1] = 1.5  # an individual who moves an outlying database a lot
    shifts[1] = 0.0  # absent everywhere: δ = 0
    return q, shifts


MODELS = [("laplace", 0.35), ("laplace", "auto"), ("gaussian", 0.35), ("gaussian", "auto")]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kernel,bandwidth", MODELS)
def test_matches_brute_force_random(seed, kernel, bandwidth):
    q, shifts = random_case(seed)
    model = select_density(q, kernel=kernel, bandwidth=bandwidth)
    eps_i, delta = evaluate(model, shifts, EPS)
    for r in range(len(shifts)):
        ref_delta, ref_eps = brute_force_risk(model, shifts[r], EPS)
        np.testing.assert_allclose(delta[r], ref_delta, atol=1e-6, rtol=0)
        if kernel == "gaussian":
            continue  # ε_i(τ): against quadrature in test_gaussian_fast.py
        if bandwidth != "auto":
            assert abs(eps_i[r] - ref_eps) <= 1e-6
        else:
            assert abs(eps_i[r] - ref_eps) <= 1e-6 * max(1.0, ref_eps)
    assert np.all(delta[1] == 0) and eps_i[1] == 0


def test_variable_bandwidth_selected_in_auto():
    q, _ = random_case(0)
    from empdp.density import loo_loglik

    m = select_density(q, kernel="laplace", bandwidth="auto")
    assert m.selected_by == "loo-likelihood"
    # the chosen model maximises the held-out likelihood over every candidate tried, recomputed directly
    assert m.loglik == max(c["loglik"] for c in m.candidates)
    assert loo_loglik("laplace", q, m.bandwidths) == pytest.approx(m.loglik, rel=1e-12)
    # a fit with a forced variable part exercises the variable path in the brute-force test
    from empdp.density import _bandwidths

    bw = _bandwidths("laplace", q, 0.3, 1.0)
    model = DensityModel("laplace", 0.3, 1.0, q, bw, loglik=0.0)
    _, shifts = random_case(3)
    eps_i, delta = evaluate(model, shifts, EPS)
    for r in range(len(shifts)):
        ref_delta, ref_eps = brute_force_risk(model, shifts[r], EPS)
        np.testing.assert_allclose(delta[r], ref_delta, atol=1e-6, rtol=0)
        assert abs(eps_i[r] - ref_eps) <= 1e-6 * max(1, ref_eps)


@pytest.mark.parametrize("kernel,bandwidth", [("laplace", 0.3), ("laplace", "auto"), ("gaussian", "auto")])
def test_matches_brute_force_real_data(sample_path, kernel, bandwidth):
    r = leave_one_out(sample_path, id="countyid", by="year", query="sum(murders)/sum(popul)")
    q = r.q / r.q.std()  # same scale as the brute-force grid expects; shifts scaled alike
    shifts = r.shifts / r.q.std()
    model = select_density(q, kernel=kernel, bandwidth=bandwidth)
    top = np.argsort(-np.abs(shifts).max(axis=1))[:5]
    rows = np.r_[top, [0, 100, 1000]]
    eps = np.array([0.0, 0.01, 0.05, 0.2, 1.0])
    eps_i, delta = evaluate(model, shifts[rows], eps)
    for k, row in enumerate(rows):
        ref_delta, ref_eps = brute_force_risk(model, shifts[row], eps)
        np.testing.assert_allclose(delta[k], ref_delta, atol=1e-6, rtol=0)
        if kernel == "laplace":  # Gaussian ε_i(τ): against quadrature in test_gaussian_fast.py
            assert abs(eps_i[k] - ref_eps) <= 1e-6 * max(1, ref_eps)


def test_delta_vanishes_at_and_above_eps_i():
    q, shifts = random_case(4)
    model = select_density(q, kernel="laplace", bandwidth=0.4)
    eps_i, _ = evaluate(model, shifts)
    _, below = evaluate(model, shifts[2:3], [eps_i[2] * 0.98])
    again, at = evaluate(model, shifts[2:3], [eps_i[2]])
    # alone, the row has other nodes: its ε_i may differ in the last bits, and δ_i at an ε a few
    # ulps below ε_i is positive but far below 1e-15
    assert abs(again[0] - eps_i[2]) <= 1e-14 and below[0, 0] > 1e-6 and 0 <= at[0, 0] <= 1e-15
    _, above = evaluate(model, shifts[2:3], [again[0], again[0] * (1 + 1e-12)], need_eps_i=False)
    assert np.all(above == 0)


def test_delta_decreases_with_epsilon():
    q, shifts = random_case(5)
    model = select_density(q, kernel="gaussian", bandwidth="auto")
    _, d = evaluate(model, shifts, np.linspace(0, 2, 30))
    assert np.all(np.diff(d, axis=1) <= 1e-12)


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_screening_bound_is_certified(kernel):
    q, shifts = random_case(6)
    model = select_density(q, kernel=kernel, bandwidth=0.3)
    _, d = evaluate(model, shifts, EPS)
    M = (np.abs(shifts) / model.bandwidths).max(axis=1)
    bound = delta_upper_bound(kernel, EPS[None, :], M[:, None], (shifts != 0).sum(axis=1)[:, None], len(q))
    assert np.all(d <= bound + 1e-9)
    if kernel == "laplace":
        eps_i, _ = evaluate(model, shifts)
        assert np.all(eps_i <= M + 1e-12)


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
@pytest.mark.parametrize("eps,mu", [(0.0, 1.0), (0.5, 1.0), (0.2, 3.0), (1.5, 1.0), (0.1, 0.05)])
def test_term_delta_against_quadrature(kernel, eps, mu):
    from scipy import integrate, stats

    dist = stats.laplace if kernel == "laplace" else stats.norm
    def f(x):
        return max(dist.pdf(x) - np.exp(eps) * dist.pdf(x - mu), 0.0)

    ref = integrate.quad(f, -40, 40, points=[0.0, mu], limit=500, epsabs=1e-13)[0]
    assert term_delta(kernel, eps, mu) == pytest.approx(ref, abs=1e-9)


def test_total_risk_formula():
    d = np.array([[0.1, 0.0], [0.2, 0.5]])
    np.testing.assert_allclose(total_risk(d), [1 - 0.9 * 0.8, 0.5])


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_screening_off_changes_nothing(sample_path, kernel):
    kw = dict(id="countyid", by="year", query="mean(murdrate)", model=Model(kernel=kernel), epsilon=[0.05, 0.2, 1.0])
    a = assess(sample_path, **kw)
    b = assess(sample_path, **kw, execution=Execution(screening=False))
    assert b.n_evaluated == b.n_individuals > a.n_evaluated
    # the same numbers, up to rounding: without screening an individual is evaluated in another
    # block, and the matrix product's rounding depends on the block's rows (a few ulps of p̂_i).
    # δ_i is a difference of masses up to 1: an absolute rounding of one ulp of 1 (2.2e-16) is
    # allowed (a δ_i of 2e-6 moved by 1.4e-17, i.e. 6e-12 relative, after a change of the Taylor
    # coefficients' summation order)
    same = dict(rtol=1e-12, atol=2.2e-16)
    np.testing.assert_allclose(a.delta, b.delta, **same)
    np.testing.assert_allclose(a.total_risk, b.total_risk, **same)
    np.testing.assert_array_equal(a.n_at_risk, b.n_at_risk)
    # Gaussian ε_i(τ) is a root found to a bracket of 1e-10 relative: rounding of p̂_i can move it there
    rel_eps = 1e-12 if kernel == "laplace" else 1e-9
    assert a.eps_all == pytest.approx(b.eps_all, rel=rel_eps, abs=0)
    np.testing.assert_allclose(a.individuals["delta"].to_numpy(), b.individuals["delta"].to_numpy(), **same)
    ev = a.individuals["eps_i"].to_numpy()
    ok = np.isfinite(ev)
    assert ok.sum() >= 50  # the search's rows: its first batch at least
    np.testing.assert_allclose(ev[ok], b.individuals["eps_i"].to_numpy()[ok], rtol=rel_eps, atol=0)


def test_assess_summary_consistent(sample_path):
    r = assess(sample_path, id="countyid", by="year", query="mean(murdrate)", exact_all=True,
               model=Model(kernel="laplace", bandwidth=0.05))
    ei = r.individuals["eps_i"].to_numpy()
    assert r.eps_all == pytest.approx(ei.max())
    assert len(r.epsilons) == 50 and r.epsilons[0] < r.eps_all < r.epsilons[-1]
    assert r.delta[-1] == 0 and r.n_at_risk[-1] == 0
    # n_at_risk counts individuals whose ε_i exceeds ε (Laplace: δ_i > 0 iff ε < ε_i)
    for k in (0, 10, 30):
        assert r.n_at_risk[k] == int((ei > r.epsilons[k]).sum())


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_huge_epsilon_gives_zero_risk_without_overflow(kernel):
    rng = np.random.default_rng(5)
    model = select_density(rng.normal(0, 1, 40), kernel=kernel, bandwidth="auto")
    shifts = rng.normal(0, 0.05, (30, 40))
    assert np.all(term_delta(kernel, 1e9, 3.0) == 0)
    eps_i, delta = evaluate(model, shifts, np.array([0.01, 1e9]))
    assert np.all(np.isfinite(eps_i)) and np.all(delta[:, 1] == 0) and np.any(delta[:, 0] > 0)


def test_sweep_chunks_change_nothing(monkeypatch):
    """The sweep runs in cache-sized chunks of rows and of cuts; every row's δ_i must be exactly the
    same with any chunking (each root and each row's sums depend on that row only)."""
    from empdp import risk

    rng = np.random.default_rng(12)
    q = np.sort(rng.normal(0, 1, 50))
    model = select_density(q, kernel="laplace", bandwidth="auto")
    shifts = rng.normal(0, 0.05, (40, 50)) * rng.random((40, 1)) * 4
    grid = risk.base_grid(model, (q[None, :] - shifts).ravel())
    eps = np.geomspace(0.005, 0.5, 30)
    parts, _ = risk.node_values(model, shifts, grid, risk.grid_plan(model, grid), np.r_[-eps[::-1], eps])
    whole = [(risk.sweep_delta(nd, L, eps), risk.sweep_delta(nd, L, eps[:1])) for nd, L, _ in parts]
    assert sum(int((one > 0).sum()) for _, one in whole) > 20
    monkeypatch.setattr(risk.nodes, "SWEEP_CELLS", 1)  # one row per chunk
    monkeypatch.setattr(_cuts, "CUT_CHUNK", 7)
    for (nd, L, _), (many, one) in zip(parts, whole):
        np.testing.assert_array_equal(risk.sweep_delta(nd, L, eps), many)
        np.testing.assert_array_equal(risk.sweep_delta(nd, L, eps[:1]), one)


@pytest.mark.parametrize("la,lc", [(0.0, 1.0), (1.0, 0.0)])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_turn_cell_whose_extremum_lies_between_its_end_values(la, lc, sign):
    """A cell the sweep integrates around an extremum of L's model (cuts._turn_sums) whose exact L there
    lies between the cell's end values: each level between them crosses once, on the side whose end
    values hold it (not on the side a maximum's or minimum's rule would pick). Here both sides' models
    are the straight line from la to lc and the densities constant, so each region is an interval."""
    from types import SimpleNamespace

    x = np.array([[0.0, 1.0]])
    s = lc - la
    L, slope = sign * np.array([[la, lc]]), np.full((1, 2), sign * s)
    nd = SimpleNamespace(p=np.full((1, 2), 0.4), pr=np.zeros((1, 2)), pl=np.zeros((1, 2)),
                         pi=np.full((1, 2), 0.3), pir=np.zeros((1, 2)), pil=np.zeros((1, 2)))
    masses = {_cuts._P: np.array([[0.4, 0.0, 0.0]]), _cuts._PI: np.array([[0.3, 0.0, 0.0]])}
    turns = (np.array([0]), np.array([0]), np.array([0.5]), np.array([sign * 0.5 * (la + lc)]), np.array([sign * s]),
             {"p": np.array([0.4]), "pr": np.zeros(1), "pi": np.array([0.3]), "pir": np.zeros(1)})
    eps = np.array([0.25, 0.75])
    num, den = (_cuts._P, _cuts._PI) if sign > 0 else (_cuts._PI, _cuts._P)
    got = _cuts._turn_sums(nd, L, slope, slope, np.diff(x, axis=1), turns,
                           (np.array([0]), np.array([0]), np.array([0]), np.array([2])), sign, num, den, eps,
                           np.exp(eps), masses)
    # {sign·L > ε} is (ε, 1) on a rising cell, (0, 1 − ε) on a falling one: of length 1 − ε either way
    a, b = (0.4, 0.3) if sign > 0 else (0.3, 0.4)
    np.testing.assert_allclose(got[0], (a - np.exp(eps) * b) * (1 - eps), rtol=1e-12)


def _binned_every_interval(L, h, w_p, w_pi, eps, growth):
    """The sweep's binning over every interval and tail (the reference for the selected ones)."""
    C, N = L.shape
    E = len(eps)
    at = np.searchsorted(np.r_[-eps[::-1], eps], L, side="left")
    out = []
    for wn, wd, idx in ((w_p, w_pi, np.maximum(at - E, 0)), (w_pi, w_p, E - np.minimum(at, E))):
        start, stop = np.minimum(idx[:, :-1], idx[:, 1:]), np.maximum(idx[:, :-1], idx[:, 1:])
        first = np.concatenate([start, idx[:, :1], idx[:, -1:]], axis=1)
        d = np.zeros((C, E))
        for e in range(E):  # the intervals and tails inside at level e: those whose first level is above it
            inside = first > e
            d[:, e] = np.sum(wn, axis=1, where=inside) - growth[e] * np.sum(wd, axis=1, where=inside)
        cnt = np.where(h > 0, stop - start, 0)
        rr, kk = np.nonzero(cnt)
        out.append((d, (rr, kk, start[rr, kk], cnt[rr, kk])))
    return out


def test_binning_of_the_selected_intervals_is_that_of_every_interval():
    """The sweep bins only the intervals and tails with an end outside (−ε_1, ε_1]: the same cuts, in
    the same order, and the same sums as binning every one of them, also with nodes exactly on
    the levels ±ε, NaN log-ratios and empty intervals."""
    rng = np.random.default_rng(21)
    C, N, E = 30, 40, 12
    eps = np.geomspace(0.01, 1.0, E)
    L = rng.normal(0, 0.3, (C, N)) * rng.random((C, 1))
    L[:, ::3] *= 0.02  # many nodes inside (−ε_1, ε_1], next to nodes outside
    ties = rng.random((C, N)) < 0.2
    L[ties] = rng.choice(np.r_[-eps, eps, -eps[:1], eps[:1]], ties.sum())  # ±ε_1 twice as often
    L[0, 5] = np.nan
    h = rng.random((C, N - 1))
    h[rng.random((C, N - 1)) < 0.05] = 0.0
    w_p, w_pi = rng.random((C, N + 1)) * 1e-2, rng.random((C, N + 1)) * 1e-2
    growth = np.exp(eps)
    got, want = risk.nodes._binned(L, h, w_p, w_pi, eps, growth), _binned_every_interval(L, h, w_p, w_pi, eps, growth)
    for (d, cut), (d_ref, cut_ref) in zip(got, want):
        np.testing.assert_allclose(d, d_ref, rtol=1e-13, atol=1e-16)  # (the reference sums in another order)
        for a, b in zip(cut, cut_ref):
            np.testing.assert_array_equal(a, b)
    assert sum(len(cut[0]) for _, cut in got) > 100


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_one_level_equals_the_sweep_of_both_directions(kernel):
    """At a single ε, δ_i comes from masks over the intervals; with more levels, from masses binned
    by level and cut intervals shared by the levels that cut them. Both must give the same δ_i
    (and a level far above every |L| must give 0)."""
    from empdp import risk

    rng = np.random.default_rng(11)
    q = np.sort(rng.normal(0, 1, 60))
    model = select_density(q, kernel=kernel, bandwidth="auto")
    shifts = rng.normal(0, 0.05, (80, 60)) * rng.random((80, 1)) * 4
    grid = risk.base_grid(model, (q[None, :] - shifts).ravel())
    plan = risk.grid_plan(model, grid)
    cut = 0
    for eps in (0.0, 0.02, 0.1):
        levels = np.unique([-eps, eps])
        parts, kept = risk.node_values(model, shifts, grid, plan, levels)
        for nd, L, _ in parts:  # every row, and again those with extrema inserted
            one = risk.sweep_delta(nd, L, np.array([eps]))[:, 0]
            both = risk.sweep_delta(nd, L, np.array([eps, eps * 1.01 + 1e-3, 1e9]))
            np.testing.assert_allclose(one, both[:, 0], rtol=1e-12, atol=1e-15)
            assert np.all(both[:, 2] == 0) and np.all(both[:, 1] <= both[:, 0])
            cut += int((one > 0).sum())
    assert cut > 50


def test_cubic_roots_of_hermite_models(monkeypatch):
    """The cut points: two Newton steps for tame cells, the bracketed iteration for the rest
    (steep or non-monotone Hermite models); every root must solve the cubic inside [0, 1]."""

    rng = np.random.default_rng(13)
    m = 20_000
    la, d = rng.normal(0, 1, m), rng.normal(0, 1, m)
    # end slopes (times h) near the secant for most cells, wild for a fifth of them
    wild = rng.random(m) < 0.2
    hma = d * np.where(wild, rng.normal(0, 6, m), rng.uniform(0.95, 1.05, m))
    hmc = d * np.where(wild, rng.normal(0, 6, m), rng.uniform(0.95, 1.05, m))
    a2, a3 = 3 * d - 2 * hma - hmc, hma + hmc - 2 * d
    level = la + d * rng.uniform(0, 1, m)
    t0 = np.clip((level - la) / d, 0, 1)
    calls = []
    inner = _cuts._bracketed_root

    def counted(*args, **kw):
        calls.append(len(args[0]))
        return inner(*args, **kw)

    monkeypatch.setattr(_cuts, "_bracketed_root", counted)
    t = _cuts._cubic_root(la - level, hma, a2, a3, d, t0)
    assert 0 < sum(calls) < m // 2  # both paths are taken
    assert np.all((t >= 0) & (t <= 1))
    H = ((a3 * t + a2) * t + hma) * t + la - level
    dH = (3 * a3 * t + 2 * a2) * t + hma
    # the residual, in units of the cell: a root error below 1e-7 (1e-10 for nearly all tame cells)
    err = np.abs(H) / np.maximum(np.abs(dH), np.abs(d))
    assert np.quantile(err[~wild], 0.999) < 1e-10 and err.max() < 1e-7
    # deferred: the roots left for the bracketed search are returned for the caller to seek
    # (with others: each root depends on its own cubic only), and then come out the same
    calls.clear()
    td, far = _cuts._cubic_root(la - level, hma, a2, a3, d, t0, deferred=True)
    assert not calls and 0 < len(far) < m // 2
    sub = np.r_[far, np.flatnonzero(~wild)[:50]]  # with roots that Newton's steps settled
    td[far] = inner(*(v[sub] for v in (la - level, hma, a2, a3)), d[sub] > 0, t0[sub],
                    tol=_cuts.ROOT_TOL ** 2)[:len(far)]
    np.testing.assert_array_equal(td, t)


def test_levels_left_out_keep_the_sign_and_the_rows_above_the_cap():
    """``only``/``cap``: δ_i at the ε kept as before; at the others NaN exactly where δ_i > 0, except
    for rows whose δ_i at the smallest ε exceeds the cap there, which get their δ_i."""

    rng = np.random.default_rng(14)
    q = np.sort(rng.normal(0, 1, 50))
    model = select_density(q, kernel="laplace", bandwidth="auto")
    shifts = rng.normal(0, 0.05, (60, 50)) * rng.random((60, 1)) * 4
    eps = np.geomspace(0.005, 0.5, 20)
    _, full = evaluate(model, shifts, eps, need_eps_i=False)
    only = np.zeros(len(eps), dtype=bool)
    only[[0, 5, 19]] = True
    cap = np.full(len(eps), np.quantile(full[:, 0], 0.8))
    _, part = evaluate(model, shifts, eps, need_eps_i=False, only=only, cap=cap)
    np.testing.assert_allclose(part[:, only], full[:, only], rtol=1e-12, atol=1e-17)
    above = full[:, 0] > cap[0]
    assert 0 < above.sum() < len(above)
    np.testing.assert_allclose(part[above], full[above], rtol=1e-12, atol=1e-17)
    rest = part[~above][:, ~only]
    assert np.array_equal(np.isnan(rest), full[~above][:, ~only] > 0) and np.isnan(rest).sum() > 20
    assert np.all(rest[~np.isnan(rest)] == 0)
    with pytest.raises(ValueError):
        evaluate(model, shifts, eps, only=~only, cap=cap)  # the smallest ε must be kept
def test_saturated_levels_change_no_summary(sample_path, monkeypatch):
    """Once the total risk at an ε has saturated, later blocks skip δ_i there unless they can
    exceed the worst so far: the worst case and the at-risk counts must not change. (The
    threshold is raised here so that the small sample saturates; at the real one δ* is 1.0.)"""
    import importlib

    A = importlib.import_module("empdp.assessment.evaluation")
    kw = dict(id="countyid", by="year", query="mean(murdrate)", model=Model(kernel="laplace"),
              epsilon=list(np.geomspace(0.02, 0.5, 12)), execution=Execution(threads=1))
    monkeypatch.setattr(A, "EVAL_ROWS", 128)
    monkeypatch.setattr(A, "LAG_BLOCKS", 1)
    full = assess(sample_path, **kw)
    skipped = []
    evaluate = A.risk.evaluate

    def counting(*args, **kwargs):
        skipped.append(0 if kwargs.get("only") is None else int((~kwargs["only"]).sum()))
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(A.risk, "evaluate", counting)
    monkeypatch.setattr(A, "SATURATED", -0.05)
    part = assess(sample_path, **kw)
    assert sum(skipped) > 10
    np.testing.assert_array_equal(part.n_at_risk, full.n_at_risk)
    np.testing.assert_allclose(part.delta, full.delta, rtol=1e-12, atol=0)
    np.testing.assert_allclose(part.individuals["delta"].to_numpy(), full.individuals["delta"].to_numpy(),
                               rtol=1e-9, atol=1e-17)
    kept = np.log1p(-full.total_risk) > -0.05  # never saturated: every δ_i counted
    assert kept.any() and (~kept).any()
    np.testing.assert_allclose(part.total_risk[kept], full.total_risk[kept], rtol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_grid_from_kinks_by_term_equals_grid_from_flat_kinks(seed):
    """Kinks given by term ((rows, n)) are pre-filtered by their distance to their own q_j: the
    grid is exactly the one the flat kinks give (only kinks the nearest-q rule drops are dropped)."""
    rng = np.random.default_rng(seed)
    n = [5, 20, 100][seed % 3]
    q = rng.standard_t(2, n)
    model = select_density(q, kernel="laplace", bandwidth="auto")
    scale = [0.01, 0.3, 3.0, 30.0][seed % 4]
    shifts = rng.normal(scale=scale, size=(200, n)) * model.bandwidths
    kinks = model.points[None, :] - shifts
    flat, by_term = risk.base_grid(model, kinks.ravel()), risk.base_grid(model, kinks)
    np.testing.assert_array_equal(flat, by_term)
    assert (len(flat) > len(risk.base_grid(model))) == (scale > 1)  # only far kinks add nodes
