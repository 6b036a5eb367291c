"""Uncertainty of the assessment (issue 38): intervals by subsampling databases, λ_L for calibrate.

The slow coverage validation is tests/bench/uncertainty_validation.py; here the properties every
interval has, the checks of the options, the restriction to the individuals that can matter, and
λ_L against a brute-force recomputation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from empdp.assessment import uncertainty as U
from empdp.density import select_density
from empdp.errors import InputError


def synthetic(n: int, seed: int, size: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """mean(x) of a stationary process: a fixed population (bounded effects) plus N(0, 10²) per
    database; the exact leave-one-out shifts of the mean."""
    rng = np.random.default_rng(seed)
    mu = np.random.default_rng(0).uniform(0, 20, size)
    x = mu[:, None] + 10 * rng.standard_normal((size, n))
    q = x.mean(axis=0)
    return q, (x - q) / (size - 1)


def run(n=30, seed=1, bandwidth="auto", eps=(0.01, 0.1, 0.5), **kw):
    q, shifts = synthetic(n, seed)
    model = select_density(q, bandwidth=bandwidth)
    return q, shifts, model, U.estimate(q, shifts, model=model, epsilons=np.array(eps), **kw)


@pytest.mark.parametrize("seed", [1, 2])
def test_intervals_contain_the_point_estimate(seed):
    q, shifts, model, unc = run(seed=seed, replicates=60, level=0.8, rng=seed)
    rows = U.Rows.all(shifts)
    eps_all, delta, total, at_risk = U.replicate(model, rows, slice(None), np.array([0.01, 0.1, 0.5]))
    assert unc.eps_all[0] <= eps_all <= unc.eps_all[1] and unc.eps_all[0] < unc.eps_all[1]
    for iv, point in ((unc.delta, delta), (unc.total_risk, total), (unc.n_at_risk, at_risk)):
        assert np.all(iv[:, 0] <= point) and np.all(point <= iv[:, 1]), (iv, point)
    assert np.all((0 <= unc.delta) & (unc.delta <= 1)) and np.all((0 <= unc.total_risk) & (unc.total_risk <= 1))
    d = unc.to_dict()
    assert d["method"] == U.METHOD and d["replicates"] == 60 and d["level"] == 0.8
    assert len(d["sweep"]["delta"]) == 3 and all(len(p) == 2 for p in d["sweep"]["n_at_risk"])


@pytest.mark.parametrize("kernel, bandwidth", [("gaussian", "auto"), ("laplace", "variable")])
def test_other_models_are_refitted_alike_and_contain_the_point(kernel, bandwidth):
    """Gaussian kernels (ε_i at a tolerance) and variable bandwidths: each replicate re-selects the
    same kind of model, and the intervals hold the full sample's estimates."""
    q, shifts = synthetic(20, 3, size=4)
    model = select_density(q, kernel=kernel, bandwidth=bandwidth)
    eps = np.array([0.05, 0.5])
    unc = U.estimate(q, shifts, model=model, epsilons=eps, replicates=10, level=0.8, rng=3)
    assert all(m.kernel.name == kernel for m in unc.plan.models)
    if bandwidth == "variable":
        assert U.bandwidth_option(model) == "variable" and any(m.sensitivity > 0 for m in unc.plan.models)
    eps_all, delta, total, at_risk = U.replicate(model, U.Rows.all(shifts), slice(None), eps)
    assert unc.eps_all[0] <= eps_all <= unc.eps_all[1]
    assert np.all(unc.total_risk[:, 0] <= total) and np.all(total <= unc.total_risk[:, 1])


def test_the_interval_is_the_log_scale_basic_interval():
    """One size: lo = t·e^{−(Q_hi − med)}, hi = t·e^{−(Q_lo − med)} of the replicates' logs, by hand."""
    reps = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    lo, hi = U.basic_interval(3.0, reps, 0.5, np.full(5, 4), 12)
    logs = np.log(reps)
    q1, q3 = np.quantile(logs, [0.25, 0.75])
    assert lo == pytest.approx(3.0 * math.exp(-(q3 - math.log(4.0))))
    assert hi == pytest.approx(3.0 * math.exp(-(q1 - math.log(4.0))))
    # a zero replicate: the linear scale
    lo, hi = U.basic_interval(3.0, np.array([0.0, 1.0, 2.0]), 0.5, np.full(3, 4), 12)
    assert (lo, hi) == pytest.approx((3.0 - 0.5, 3.0 + 0.5))


def _sized(beta: float, sizes, n: int, u: np.ndarray, scale: float = 0.7) -> np.ndarray:
    """Replicates (len(sizes) · len(u),) whose deviations at size b are u · C b^−β √(1 − b/n) about
    a median that differs by size: what an estimator of rate b^β gives on subsamples of one panel."""
    return np.concatenate([1.0 + 0.1 * b + u * scale * b**-beta * math.sqrt(1 - b / n) for b in sizes])


@pytest.mark.parametrize("beta", [0.5, 0.15, 0.0, -0.2])
def test_the_spread_is_carried_to_n_at_the_rate_of_the_subsamples(beta):
    """Deviations whose spread falls (or grows) as b^−β, less the finite-panel factor √(1 − b/n), are
    carried to n exactly: the interval is t minus the quantiles of u · C n^−β, whatever the sizes."""
    sizes, n = (6, 10, 14, 20), 40
    u = np.random.default_rng(1).standard_normal(50)
    reps = _sized(beta, sizes, n, u - np.median(u))
    lo, hi = U.basic_interval(2.0, np.exp(reps), 0.9, np.repeat(sizes, 50), n)
    q_lo, q_hi = np.quantile(np.tile(u - np.median(u), 4) * 0.7 * n**-beta, [0.05, 0.95])
    assert (math.log(lo), math.log(hi)) == pytest.approx((math.log(2.0) - q_hi, math.log(2.0) - q_lo), rel=1e-9)


def test_a_mean_gets_its_root_n_spread_from_subsamples():
    """The sample mean of n = 100 draws: its subsamples' spreads give the spread at n, 2 · 1.2816/√n
    (10–90%), within 20% on average over panels; one size's spread taken as it is (no rate) is 1.3×
    too wide."""
    rng = np.random.default_rng(5)
    found, plain = [], []
    for _ in range(20):
        x = rng.standard_normal(100)
        subsets = U.draw_subsets(100, 400, 1, rng)
        means = np.array([x[s].mean() for s in subsets])
        dev = U.deviations_at_n(means, U.subset_sizes(subsets), 100)
        found.append(np.subtract(*np.quantile(dev, [0.9, 0.1])))
        one = means[U.subset_sizes(subsets) == 35]
        plain.append(np.subtract(*np.quantile(one, [0.9, 0.1])))
    truth = 2 * 1.2816 / 10
    assert np.mean(found) == pytest.approx(truth, rel=0.2)
    assert np.mean(plain) > 1.2 * truth


def test_spreads_that_give_no_rate_are_carried_as_they_are():
    """A quantity that does not vary at some size (a count of 0 there) keeps its deviations unscaled."""
    values = np.r_[np.zeros(20), np.arange(20.0)]
    sizes = np.r_[np.full(20, 5), np.full(20, 10)]
    dev = U.deviations_at_n(values, sizes, 30)
    np.testing.assert_array_equal(dev, values - np.r_[np.zeros(20), np.full(20, 9.5)])


def test_intervals_narrow_as_n_grows_on_a_stationary_process():
    """With one fixed kernel scale the estimate converges, and its interval narrows (with the scale
    re-selected per n, ε_all's spread does not shrink: the bench measures it)."""
    def width(n):
        return sum(np.diff(run(n=n, seed=s, bandwidth=2.0, replicates=50, level=0.8, rng=s)[3].eps_all)[0]
                   for s in range(3))
    assert width(200) < 0.6 * width(20)


def test_same_seed_same_intervals_other_seed_other_intervals():
    a, b, c = (run(replicates=40, level=0.8, rng=seed)[3] for seed in (7, 7, 8))
    for field in ("eps_all", "delta", "total_risk", "n_at_risk"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert all(np.array_equal(x, y) for x, y in zip(a.plan.subsets, b.plan.subsets, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a.plan.subsets, c.plan.subsets, strict=True))
    gen = run(replicates=40, level=0.8, rng=np.random.default_rng(7))[3]  # a Generator seeded alike
    np.testing.assert_array_equal(gen.eps_all, a.eps_all)
    threaded = run(replicates=40, level=0.8, rng=7, threads=2)[3]  # replicates side by side: the same bits
    for field in ("eps_all", "delta", "total_risk", "n_at_risk"):
        np.testing.assert_array_equal(getattr(threaded, field), getattr(a, field))


@pytest.mark.parametrize("kw, param, fragment", [
    (dict(replicates=0), "replicates", "whole number >= 1"),
    (dict(replicates=-3), "replicates", "whole number >= 1"),
    (dict(replicates=2.5), "replicates", "whole number >= 1"),
    (dict(replicates=True), "replicates", "whole number >= 1"),
    (dict(replicates=10), ("replicates", "level"), "at least 20"),
    (dict(level=1.5), "level", "strictly between 0 and 1"),
    (dict(level=1.0), "level", "strictly between 0 and 1"),
    (dict(level=0), "level", "strictly between 0 and 1"),
    (dict(level=float("nan")), "level", "strictly between 0 and 1"),
    (dict(level="0.9"), "level", "strictly between 0 and 1"),
])
def test_bad_options_are_one_line_errors_naming_the_parameter(kw, param, fragment):
    q, shifts = synthetic(20, 1)
    with pytest.raises(InputError) as err:
        U.estimate(q, shifts, model=select_density(q), epsilons=[0.1], rng=1, **{"replicates": 200, **kw})
    assert err.value.param == ((param,) if isinstance(param, str) else param)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InputError):  # the calibration level checks the same options
        U.calibration_level(q, shifts, 0.5, rng=1, **{"replicates": 200, **kw})


def test_too_few_databases_is_refused():
    q, shifts = synthetic(8, 1)
    with pytest.raises(InputError, match="at least 9 databases") as err:
        U.estimate(q, shifts, model=select_density(q), epsilons=[0.1], replicates=20, level=0.8, rng=1)
    assert err.value.param == ("uncertainty",)


def test_subsets_keep_four_shares_in_turn_in_blocks_when_asked():
    subsets = U.draw_subsets(30, 50, 1, np.random.default_rng(0))
    sizes = U.subset_sizes(subsets)
    np.testing.assert_array_equal(sizes, np.tile([4, 8, 10, 15], 13)[:50])  # 0.15, 0.25, 0.35, 0.5 of 30
    assert all(len(set(s)) == len(s) and np.all(np.diff(s) > 0) and s.min() >= 0 and s.max() < 30 for s in subsets)
    blocks = U.draw_subsets(31, 50, 3, np.random.default_rng(0))
    np.testing.assert_array_equal(U.subset_sizes(blocks), np.tile([6, 6, 12, 15], 13)[:50])  # of 10 blocks
    for s in blocks:
        runs = s.reshape(-1, 3)
        assert np.all(np.diff(runs, axis=1) == 1)  # consecutive databases kept together
        assert np.all((runs[:, 0] - runs[0, 0]) % 3 == 0)  # on one grid of blocks per replicate
    np.testing.assert_array_equal(U.subset_sizes(U.draw_subsets(10, 4, 3, 0)), [3, 3, 3, 6])  # at least 3
    np.testing.assert_array_equal(U.subset_sizes(U.draw_subsets(10, 4, 2, 0)), [4, 4, 4, 4])  # one size: no rate


def test_autocorrelated_values_get_blocks_and_the_warnings():
    rng = np.random.default_rng(3)
    walk = np.cumsum(rng.standard_normal(40))
    assert U.block_length(walk) == 3 and U.block_length(rng.standard_normal(40)) == 1
    q, shifts = synthetic(12, 1)
    unc = U.estimate(q + 0.5 * np.arange(12), shifts, model=select_density(q), epsilons=[0.1], replicates=20,
                     level=0.8, rng=1)
    text = " ".join(unc.warnings)
    assert "only 12 databases" in text and "trend" in text
    assert U.warnings_for(synthetic(40, 1)[0], block=1, size=12) == []
    assert "blocks of 3" in U.warnings_for(synthetic(40, 1)[0], block=3, size=12)[0]
    cal = U.calibration_level(q + 0.5 * np.arange(12), shifts, 0.5, replicates=10, level=0.8, rng=1)
    assert cal.warnings == unc.warnings and cal.to_dict()["warnings"] == cal.warnings


def test_individual_intervals_contain_eps_i():
    q, shifts, model, unc = run(replicates=40, level=0.8, rng=2)
    from empdp import risk

    eps_i, _ = risk.evaluate(model, shifts[:6])
    rows = np.vstack([shifts[:6], np.zeros(len(q))])
    lo, hi = U.individual_intervals(unc, rows, np.r_[eps_i, 0.0])
    assert np.all(lo[:6] <= eps_i) and np.all(eps_i <= hi[:6]) and np.all(lo[:6] < hi[:6])
    assert lo[6] == hi[6] == 0.0  # never shifted: no risk in any replicate
    lo, hi = U.individual_intervals(unc, shifts[:1], [np.inf])
    assert lo[0] == hi[0] == np.inf  # a sole contributor


def test_restricting_to_individuals_that_can_matter_changes_nothing(sample_assessment):
    """from_assessment fetches only the individuals whose reach can pass a replicate's ε floor; the
    intervals equal those from every individual's shifts."""
    a = sample_assessment
    sole = a.individuals["sole_contributor"].to_numpy()
    every = a.engine.shifts(np.flatnonzero(~sole))
    fast = U.from_assessment(a, replicates=20, level=0.8, rng=4)
    slow = U.estimate(a.q, every, model=a.model, epsilons=a.epsilons, replicates=20, level=0.8, rng=4,
                      sole=int(sole.sum()), n_individuals=len(sole), point=a)
    np.testing.assert_allclose(fast.eps_all, slow.eps_all, rtol=1e-12)
    for field in ("delta", "total_risk", "n_at_risk"):
        np.testing.assert_allclose(getattr(fast, field), getattr(slow, field), rtol=1e-9, atol=1e-15)
    assert fast.eps_all[0] <= a.eps_all <= fast.eps_all[1]
    assert any("17 databases" in w for w in fast.warnings)


# ------------------------------------------------------------------------ calibration level
def _brute_eps(points: np.ndarray, shifted: np.ndarray, lam: float) -> float:
    """max_i sup_x |log p − log p_i| of Laplace mixtures of scale λ, on the kinks and the far tails."""
    xs = np.r_[points, shifted.ravel(), points.min() - 60 * lam, points.max() + 60 * lam]

    def logp(centres):
        z = -np.abs(xs[:, None] - centres[None, :]) / lam
        top = z.max(axis=1)
        return top + np.log(np.exp(z - top[:, None]).sum(axis=1))

    base = logp(points)
    return max(float(np.abs(base - logp(row)).max()) for row in shifted)


def _brute_lambda(q, shifts, epsilon):
    rows = (q - shifts)[(shifts != 0).any(axis=1)]
    if not len(rows):
        return 0.0
    lo, hi = 1e-6, 1e3
    for _ in range(200):  # ε_i(λ) falls as λ grows: bisection on the largest
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if _brute_eps(q, rows, mid) <= epsilon else (mid, hi)
    return hi


def test_calibration_level_against_brute_force_recomputation():
    rng = np.random.default_rng(11)
    q = rng.normal(0, 1, 9)
    shifts = rng.normal(0, 0.05, (4, 9)) * (rng.random((4, 9)) < 0.7)
    subsets = np.sort(np.argsort(rng.random((20, 9)), axis=1)[:, :4], axis=1)  # one size: no rate to carry
    res = U.calibration_level(q, shifts, 0.3, level=0.8, subsets=subsets)
    lam_star = _brute_lambda(q, shifts, 0.3)
    lams = np.array([_brute_lambda(q[s], shifts[:, s], 0.3) for s in subsets])
    assert res.lam_star == pytest.approx(lam_star, rel=1e-6)
    np.testing.assert_allclose(res.lams, lams, rtol=1e-6)
    logs = np.sort(np.log(lams))
    at_level = logs[math.ceil(0.8 * len(logs)) - 1]  # the least λ that holds in 80% of the replicates
    expected = max(lam_star, lam_star * math.exp(at_level - np.median(logs)))
    assert res.lam == pytest.approx(expected, rel=1e-6)
    assert res.lam > res.lam_star  # the replicates' spread raises it
    assert res.to_dict()["lambda_level"] == res.lam
    given = U.calibration_level(q, shifts, 0.3, level=0.8, subsets=subsets, lam_star=2 * res.lam_star)
    assert given.lam_star == 2 * res.lam_star  # a λ* found before is used, not found again
    assert given.lam == pytest.approx(2 * res.lam, rel=1e-12)


def test_calibration_level_carries_the_replicates_spread_to_n():
    """Subsamples of several sizes: λ_L = λ* · e^{Q_L} of the deviations carried to n databases."""
    q, shifts = synthetic(30, 4)
    res = U.calibration_level(q, shifts, 0.5, replicates=40, level=0.8, rng=2)
    subsets = U.draw_subsets(30, 40, U.block_length(q), np.random.default_rng(2))
    assert np.unique(U.subset_sizes(subsets)).size == 4
    dev = U.deviations_at_n(np.log(res.lams), U.subset_sizes(subsets), 30)
    expected = res.lam_star * math.exp(np.sort(dev)[math.ceil(0.8 * 40) - 1])
    assert res.lam == pytest.approx(max(res.lam_star, expected), rel=1e-12) and res.lam > res.lam_star


def test_calibration_level_excludes_sole_contributors_and_is_reproducible():
    q, shifts = synthetic(15, 2)
    undefined = np.zeros(len(shifts), bool)
    undefined[0] = True
    shifts[0, 3] = 50.0  # would dominate λ* if counted
    a = U.calibration_level(q, shifts, 0.5, replicates=20, level=0.8, rng=5, undefined=undefined)
    b = U.calibration_level(q, shifts[1:], 0.5, replicates=20, level=0.8, rng=5)
    assert a.lam == b.lam and a.lam_star == b.lam_star
    with pytest.raises(InputError) as err:
        U.calibration_level(q, shifts, -1, replicates=20, level=0.8, rng=5)
    assert err.value.param == ("epsilon",)
