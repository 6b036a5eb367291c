"""DP-Sniper's 20 mechanisms as built-ins: samplers against their definitions, exact ε against
independent computations (closed forms, quadrature, enumeration), and their input checks."""

import itertools
import math

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy import integrate, stats

from empdp.audit import builtin, samplers, sniper, truth
from empdp.audit.mechanisms import DPSNIPER_SUITE, dpsniper_mechanism
from empdp.audit.mpl import mpl
from empdp.errors import InputError

RNG = np.random.default_rng

# ----------------------------------------------------------------------------- the suite


def test_the_suite_has_dpsnipers_twenty_with_their_true_values():
    """All 20 build with their pairs; the exact ε over the pairs never exceeds the mechanism's."""
    assert len(DPSNIPER_SUITE) == 20
    expected = {"laplace": 0.1, "truncated_geometric": math.log(1 + 2 ** -3), "noisy_hist1": 0.1,
                "noisy_hist2": 10.0, "report_noisy_max3": 0.25, "report_noisy_max4": math.inf,
                "svt5": math.inf, "rappor": 0.3000625, "one_time_rappor": 0.6005008,
                "laplace_parallel": 0.1, "prefix_sum": 1.0, "svt3": 0.5, "svt34_parallel": 0.4874464}
    for name in DPSNIPER_SUITE:
        mech, pairs = dpsniper_mechanism(name)
        value = mech.true_epsilon_over(pairs)
        assert value is not None and value <= mech.epsilon * (1 + 1e-9), name
        if name in expected:
            assert_allclose(value, expected[name], rtol=1e-6)
    assert dpsniper_mechanism("svt4")[0].epsilon == pytest.approx(0.175)  # Lyu et al.'s (1 + 6c)/4 · 0.1


# ----------------------------------------------------------------------------- truncated geometric


def test_murmur3_matches_mmh3_reference_values():
    """mmh3.hash values from its documentation and the MurmurHash3 test vectors."""
    assert sniper.murmur3_32(b"foo") == -156908512
    assert sniper.murmur3_32(b"hello") == 613153351
    assert sniper.murmur3_32(b"", 1) == 0x514E28B7
    assert sniper.murmur3_32(b"") == 0


@pytest.mark.parametrize("c", [0, 1, 3, 5])
def test_truncated_geometric_is_a_folded_two_sided_geometric(c):
    """GeoSample's CDF gives P(z) ∝ α^|z−c| inside, the tails folded onto 0 and n, α = 2^k/(2^k+1)."""
    eps, n = 0.1, 5
    k = sniper.geometric_k(eps)
    a = 2 ** k / (2 ** k + 1)
    ref = np.array([(1 - a) / (1 + a) * a ** abs(z - c) for z in range(n + 1)])
    ref[0], ref[n] = a ** c / (1 + a), a ** (n - c) / (1 + a)
    assert_allclose(sniper.truncated_geometric_pmf(c, eps, n), ref, rtol=1e-12)
    draws = builtin("truncated_geometric")(c, 200_000, RNG(c))
    freq = np.bincount(draws, minlength=n + 1) / len(draws)
    assert np.all(np.abs(freq - ref) <= 4 * np.sqrt(ref * (1 - ref) / len(draws)) + 1e-4)


def test_truncated_geometric_epsilon_is_balcer_vadhan_closed_form():
    for eps in (0.05, 0.1, 0.5, 1.0):
        m = builtin("truncated_geometric", epsilon=eps, n=6)
        assert_allclose(m.epsilon, math.log(1 + 2.0 ** -math.ceil(math.log(2 / eps))), rtol=1e-12)


# ----------------------------------------------------------------------------- additive noise


@pytest.mark.parametrize("name,scale", [("noisy_hist1", 10.0), ("noisy_hist2", 0.1)])
def test_noisy_hist_adds_laplace_to_every_bin(name, scale):
    x = [3, 0, 1, 7, 2]
    out = builtin(name)(x, 100_000, RNG(1))
    assert out.shape == (100_000, 5)
    assert_allclose(out.mean(axis=0), x, atol=5 * math.sqrt(2) * scale / math.sqrt(1e5))
    assert_allclose(out.std(axis=0), math.sqrt(2) * scale, rtol=0.02)
    m = builtin(name)
    assert m.pair_epsilon(x, [3, 1, 1, 7, 2]) == pytest.approx(1 / scale)


def test_laplace_parallel_is_independent_copies():
    m = builtin("laplace_parallel")
    out = m(1.0, 50_000, RNG(2))
    assert out.shape == (50_000, 20)
    assert_allclose(out.mean(axis=0), 1.0, atol=5 * math.sqrt(2) * 200 / math.sqrt(5e4))
    assert_allclose(out.std(axis=0), math.sqrt(2) * 200, rtol=0.03)
    corr = np.corrcoef(out[:, :3].T)
    assert np.max(np.abs(corr - np.eye(3))) < 0.03
    assert m.epsilon == pytest.approx(0.1) and m.pair_epsilon(1, 0) == pytest.approx(0.1)


def test_prefix_sum_increments_are_laplace_around_the_queries():
    q = np.arange(10.0)
    out = builtin("prefix_sum")(q, 50_000, RNG(3))
    inc = np.diff(np.concatenate([np.zeros((len(out), 1)), out], axis=1), axis=1)
    assert_allclose(inc.mean(axis=0), q, atol=5 * math.sqrt(2) * 10 / math.sqrt(5e4))
    assert stats.kstest(inc[:, 4] - 4, stats.laplace(0, 10).cdf).pvalue > 1e-3
    assert builtin("prefix_sum").epsilon == pytest.approx(1.0)


# ----------------------------------------------------------------------------- report noisy max


def _exp_argmax_quad(q, scale):
    """P(argmax = k) for exponential noise by scipy quadrature (independent of the library's nodes)."""
    q = np.asarray(q, float)
    out = []
    for k in range(q.size):
        def integrand(t, k=k):
            dens = stats.expon(q[k], scale).pdf(t)
            return dens * np.prod([stats.expon(q[i], scale).cdf(t) for i in range(q.size) if i != k])
        out.append(integrate.quad(integrand, q[k], q.max() + 80 * scale, points=sorted(set(q)), limit=400)[0])
    return np.array(out)


def test_report_noisy_max2_law_sampler_and_epsilon():
    q, scale = [1, 0, 2, 1, 1], 20.0
    law = sniper.noisy_max_exponential_pmf(q, scale)
    assert_allclose(law, _exp_argmax_quad(q, scale), rtol=1e-6)
    draws = builtin("report_noisy_max2")(q, 200_000, RNG(4))
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.all(np.abs(freq - law) <= 4 * np.sqrt(law / 2e5))
    m, pairs = dpsniper_mechanism("report_noisy_max2")
    assert 0.09 < m.true_epsilon_over(pairs) <= 0.1 + 1e-9


@pytest.mark.parametrize("name,noise", [("report_noisy_max3", "laplace"), ("report_noisy_max4", "expon")])
def test_report_noisy_max_values_follow_the_law_of_the_max(name, noise):
    q = np.array([1.0, 0.0, 2.0, 1.0, 1.0])
    draws = builtin(name)(q, 50_000, RNG(5))
    dist = stats.laplace if noise == "laplace" else stats.expon
    cdf = lambda t: np.prod([dist(v, 20.0).cdf(t) for v in q], axis=0)  # noqa: E731
    assert stats.kstest(draws, cdf).pvalue > 1e-3


def test_report_noisy_max3_epsilon_is_k_times_half_epsilon():
    """All queries up by one: in the left tail the density ratio is e^{k/scale} (k = 5, scale = 20)."""
    m = builtin("report_noisy_max3")
    assert m.epsilon == pytest.approx(0.25)
    assert m.pair_epsilon([1] * 5, [2] * 5) == pytest.approx(0.25, rel=1e-9)


def test_report_noisy_max4_is_infinite_where_the_support_moves():
    m = builtin("report_noisy_max4")
    assert m.pair_epsilon([1] * 5, [2] + [1] * 4) == math.inf
    assert m.pair_epsilon([1] * 5, [0] + [1] * 4) == math.inf  # ties at the max: 5 vs 4
    assert m.pair_epsilon([1, 0], [1, 0.5]) is None  # same support and ties: not computed


# ----------------------------------------------------------------------------- sparse vector


def _abort_law_quad(q, rho_scale, nu_scale, threshold, c):
    """The law of aborting SVT's answers, each outcome by scipy quadrature of its defining integral."""
    q = np.asarray(q, float)
    rho, nu = stats.laplace(0, rho_scale), stats.laplace(0, nu_scale)
    law = {}
    for answers in itertools.product((-1, 0, 1), repeat=q.size):
        a = np.array(answers)
        ones = np.flatnonzero(a == 1)
        stop = ones[c - 1] + 1 if len(ones) >= c else q.size
        if len(ones) > c or np.any(a[:stop] == -1) or np.any(a[stop:] != -1):
            continue

        def integrand(r, a=a, stop=stop):
            z = threshold + r - q[:stop]
            terms = np.where(a[:stop] == 1, nu.sf(z), nu.cdf(z))
            return rho.pdf(r) * np.prod(terms)
        law[answers] = integrate.quad(integrand, -80 * rho_scale, 80 * rho_scale, points=[0.0], limit=500)[0]
    return law


def test_svt_abort_law_against_quadrature_and_the_c1_law():
    q, rho_s, nu_s, t = [1.0, 0.0, 2.0], 2.0, 3.0, 1.0
    for c in (1, 2):
        law = sniper.svt_abort_law(q, rho_s, nu_s, t, c)
        ref = _abort_law_quad(q, rho_s, nu_s, t, c)
        assert set(law) == set(ref)
        assert_allclose([law[k] for k in ref], list(ref.values()), rtol=1e-7, atol=1e-12)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-10)
    c1 = sniper.svt_abort_law(q, rho_s, nu_s, t, 1)
    pmf = truth.svt_pmf(q, rho_s, nu_s, t)  # the existing c = 1 implementation
    firsts = [(0,) * k + (1,) + (-1,) * (2 - k) for k in range(3)] + [(0, 0, 0)]
    assert_allclose([c1[k] for k in firsts], pmf, rtol=1e-9)


@pytest.mark.parametrize("name,rho,nu,t,c,special", [
    ("svt1", 20.0, 40.0, 0.5, 1, None),
    ("svt3", 20.0, 20.0, 1.0, 1, (-1000.0, -2000.0)),
    ("numerical_svt", 30.0, 120.0, 1.0, 2, (0.0, -1000.0)),
])
def test_svt_samplers_answer_with_the_exact_law(name, rho, nu, t, c, special):
    q = [1.0, 0.0, 2.0, 1.0]
    out = builtin(name)(q, 200_000, RNG(6))
    if special is not None:  # values above, codes for below and aborted
        answers = np.where(out == special[0], 0, np.where(out == special[1], -1, 1))
    else:
        answers = out
    law = sniper.svt_abort_law(q, rho, nu, t, c)
    keys, counts = np.unique(answers, axis=0, return_counts=True)
    freq = {tuple(k.tolist()): v / len(out) for k, v in zip(keys, counts)}
    assert set(freq) <= set(law)
    for k, p in law.items():
        assert abs(freq.get(k, 0.0) - p) < 4 * math.sqrt(p * (1 - p) / len(out)) + 1e-4, (k, p)


def _pattern_freq(out) -> dict:
    keys, counts = np.unique(out, axis=0, return_counts=True)
    return {tuple(k.tolist()): v / len(out) for k, v in zip(keys, counts)}


def test_svt4_and_svt2_samplers_answer_with_the_exact_law():
    """The built-in svt4 (scaled to be ε-DP: ρ ~ Lap(4/ε′), ν ~ Lap(4/(3ε′)), ε′ = 4ε/7) and svt2 at c = 1
    against the exact abort law (the compiled sampler draws no noise after the abort)."""
    q = [1.0, 0.0, 2.0, 1.0]
    e4 = 0.7 * 4 / 7
    for name, eps, rho, nu in (("svt4", 0.7, 4 / e4, 4 / (3 * e4)), ("svt2", 0.5, 4.0, 8.0)):
        out = builtin(name, epsilon=eps)(q, 200_000, RNG(11))
        assert out.dtype == np.int8 and out.shape == (200_000, 4)
        law, freq = sniper.svt_abort_law(q, rho, nu, 1.0, 1), _pattern_freq(out)
        assert set(freq) <= set(law)
        for k, p in law.items():
            assert abs(freq.get(k, 0.0) - p) < 4 * math.sqrt(p * (1 - p) / len(out)) + 1e-4, (name, k, p)


def _svt2_reference(q, size, rng, rho_scale, nu_scale, c, threshold=1.0):
    """Lyu et al.'s Alg. 2 query by query (fresh ρ after each answer above), as plain numpy."""
    q = np.asarray(q, float)
    out = np.empty((size, q.size), dtype=np.int8)
    rho = rng.laplace(0, rho_scale, size)
    count = np.zeros(size, dtype=int)
    for j in range(q.size):
        above = q[j] + rng.laplace(0, nu_scale, size) >= threshold + rho
        out[:, j] = np.where(count >= c, -1, above)
        fresh = rng.laplace(0, rho_scale, size)
        rho = np.where(above & (count < c), fresh, rho)
        count += above & (count < c)
    return out


def test_svt2_with_several_answers_above_draws_a_fresh_threshold():
    """svt2 at c = 2 (no closed law here) against a plain reference of Alg. 2: the same pattern
    frequencies within their sampling error (both samples' variances)."""
    q = [1.0, 0.0, 2.0, 1.0, 0.5]
    size = 200_000
    out = samplers.svt(2, epsilon=1.0, c=2)(q, size, RNG(12))  # (the built-in svt2 has c = 1)
    ref = _svt2_reference(q, size, RNG(13), 2 * 2 / 1.0, 2 * 2 * 2 / 1.0, 2)
    got, want = _pattern_freq(out), _pattern_freq(ref)
    assert set(got) <= set(want) | {k for k, v in got.items() if v < 1e-4}
    for k, p in want.items():
        assert abs(got.get(k, 0.0) - p) < 4 * math.sqrt(2 * p * (1 - p) / size) + 1e-4, (k, p)
    # a fresh threshold matters: with ρ kept, the patterns' law differs detectably
    kept = sniper.svt_abort_law(q, 4.0, 8.0, 1.0, 2)
    assert max(abs(got.get(k, 0.0) - p) for k, p in kept.items()) > 10 * math.sqrt(0.25 / size)


def test_svt3_and_numerical_svt_release_noisy_values():
    q = np.array([1.0, 0.0, 2.0, 1.0])
    out = builtin("numerical_svt")(q, 100_000, RNG(7))
    above = (out != 0) & (out != -1000)
    resid = (out - q[None, :])[above]  # fresh Lap(3c/ε) noise, independent of the comparison
    assert stats.kstest(resid, stats.laplace(0, 60).cdf).pvalue > 1e-3
    out3 = builtin("svt3")(q, 100_000, RNG(8))
    above3 = out3 > -1000
    assert np.all(out3[above3] >= 1 - 200)  # the comparison's own noisy answer (is above T + ρ)


def test_svt34_parallel_is_svt3_beside_the_original_svt4():
    q = [1.0, 0.0, 2.0]
    out = builtin("svt34_parallel")(q, 200_000, RNG(9))
    right = out[:, 3:].astype(int)
    law = sniper.svt_abort_law(q, 40.0, 40 / 3, 1.0, 2)
    for k, p in law.items():
        f = np.mean(np.all(right == np.array(k), axis=1))
        assert abs(f - p) < 4 * math.sqrt(p * (1 - p) / len(out)) + 1e-4
    left = np.where(out[:, :3] == -1000, 0, np.where(out[:, :3] == -2000, -1, 1))
    law3 = sniper.svt_abort_law(q, 20.0, 40.0, 1.0, 2)
    for k, p in law3.items():
        f = np.mean(np.all(left == np.array(k), axis=1))
        assert abs(f - p) < 4 * math.sqrt(p * (1 - p) / len(out)) + 1e-4


def test_svt6_epsilon_by_counts_equals_the_full_law():
    """The count-tuple law gives the ε of the 2^m answer vectors (enumerated by quadrature)."""
    x, y, rho = [1.0, 1.0, 0.0, 2.0], [0.0, 1.0, 1.0, 2.0], 2.0
    dens = stats.laplace(0, rho)

    def law(q):
        out = []
        for a in itertools.product((0, 1), repeat=4):
            def integrand(r, a=a):
                z = 1.0 + r - np.asarray(q)
                return dens.pdf(r) * np.prod(np.where(np.array(a) == 1, dens.sf(z), dens.cdf(z)))
            out.append(integrate.quad(integrand, -80 * rho, 80 * rho, points=[-1.0, 0.0, 1.0], limit=500)[0])
        return np.array(out)

    ref = truth.discrete_epsilon(law(x), law(y))
    assert_allclose(sniper.svt_free_pair_epsilon(x, y, rho, rho, 1.0), ref, rtol=1e-7)


def test_numerical_svt_epsilon_adds_the_released_values():
    """sup over outputs of |L(pattern)| + Σ_above |Δ_j| ε/(3c), checked by brute force on the law."""
    eps, c = 0.1, 2
    x, y = [1.0, 1.0, 1.0], [2.0, 0.0, 1.0]
    px = _abort_law_quad(x, 3 / eps, 6 * c / eps, 1.0, c)
    py = _abort_law_quad(y, 3 / eps, 6 * c / eps, 1.0, c)
    shift = np.abs(np.subtract(x, y)) * eps / (3 * c)
    ref = max(abs(math.log(px[a] / py[a])) + shift[np.array(a) == 1].sum() for a in px)
    assert_allclose(sniper.numerical_svt_pair_epsilon(x, y, eps, c, 1.0), ref, rtol=1e-6)


# ----------------------------------------------------------------------------- RAPPOR


@pytest.mark.parametrize("name", ["rappor", "one_time_rappor"])
def test_rappor_bits_follow_the_two_randomizations(name):
    m = builtin(name)
    f = m.params["f"]
    # P(report 1 | Bloom bit b), enumerating the permanent choice (1 w.p. f/2, 0 w.p. f/2, keep 1 − f)
    perm = {b: {1: f / 2 + (1 - f) * b, 0: f / 2 + (1 - f) * (1 - b)} for b in (0, 1)}
    if name == "rappor":
        p, q = m.params["p"], m.params["q"]
        one = {b: perm[b][1] * q + perm[b][0] * p for b in (0, 1)}
    else:
        one = {b: perm[b][1] for b in (0, 1)}
    bits = sniper.bloom_bits(1, 4, 20)
    assert sorted(np.flatnonzero(bits).tolist()) == [3, 10, 13]  # mmh3 of "1", seeds 0-3, mod 20
    out = m(1, 200_000, RNG(10))
    expect = np.where(bits == 1, one[1], one[0])
    assert_allclose(out.mean(axis=0), expect, atol=4 * math.sqrt(0.25 / 2e5))
    diff = (sniper.bloom_bits(1, 4, 20) != sniper.bloom_bits(2, 4, 20)).sum()
    bit_eps = max(math.log(one[1] / one[0]), math.log((1 - one[0]) / (1 - one[1])))
    assert m.pair_epsilon(1, 2) == pytest.approx(diff * bit_eps, rel=1e-12)


# ----------------------------------------------------------------------------- checks and audits


@pytest.mark.parametrize("name,params,match", [
    ("rappor", {"p": 1.2}, "instantaneous"),
    ("one_time_rappor", {"f": 0}, "permanent"),
    ("svt1", {"c": 1.5}, "integer"),
    ("prefix_sum", {"queries": 0}, "integer"),
    ("truncated_geometric", {"epsilon": 3}, "ceil"),
])
def test_bad_parameters_are_one_line_errors(name, params, match):
    with pytest.raises(InputError, match=match):
        builtin(name, **params)


def test_bad_databases_are_input_errors():
    with pytest.raises(InputError, match="count"):
        builtin("truncated_geometric")(7, 10, RNG(0))
    with pytest.raises(InputError, match="histogram"):
        mpl("noisy_hist1", pairs="patterns", n=100, N=200)
    with pytest.raises(InputError, match="same length"):
        mpl("noisy_hist1", pairs=[([1, 1], [1, 1, 0])], n=100, N=200)
    with pytest.raises(InputError, match="Bloom"):
        mpl("rappor", pairs="patterns", n=100, N=200)


def test_discrete_suite_members_are_audited_below_their_truth():
    """A quick MPL run on two low-dimensional members: the bound is below the exact ε over its pairs."""
    for name in ("truncated_geometric", "report_noisy_max2"):
        mech, pairs = dpsniper_mechanism(name)
        res = mpl(mech, pairs, n=20_000, N=100_000, rng=1)
        assert res.pairs_true_value is not None
        assert 0 < res.lower_bound <= res.pairs_true_value


# ----------------------------------------------------------------------------- outputs of any dimension


def test_vector_outputs_beyond_three_dimensions_are_audited_by_score_events():
    """5-d continuous (noisy_hist1) and 20-bit (rappor) outputs: an event of per-coordinate log ratios
    from stage 1, counted on fresh stage-2 outputs; below the exact ε, and well above 0."""
    for name, n, N in (("noisy_hist1", 20_000, 100_000), ("rappor", 20_000, 100_000)):
        mech, pairs = dpsniper_mechanism(name)
        res = mpl(mech, pairs, n=n, N=N, alpha=0.1, rng=3)
        # which score wins (logistic or a log-ratio table) is the held-out comparison's call, seed by seed
        assert res.event_rule["score"] == "logistic regression" or "log ratios of the" in res.event_rule["score"]
        assert 0.4 * res.pairs_true_value < res.lower_bound <= res.pairs_true_value, (name, res.lower_bound)
    with pytest.raises(InputError, match="score events"):  # a region rules them out: no estimator left
        mpl("noisy_hist1", n=500, N=1000, region=(-5, 5))


def test_score_event_bounds_cover_the_truth_on_rappor():
    """Coverage at α = 0.1 over 8 seeds on a vector-output mechanism: at most 2 of 8 above the truth."""
    mech, pairs = dpsniper_mechanism("rappor")
    lbs = [mpl(mech, pairs, n=5000, N=40_000, alpha=0.1, rng=s).lower_bound for s in range(8)]
    assert sum(lb > mech.true_epsilon_over(pairs) for lb in lbs) <= 2, lbs


def test_score_features_of_code_only_columns_warn_nothing():
    """SVT4's answers beside SVT3's values: a column of codes only has no plain values to centre."""
    import warnings

    from empdp.audit.events import _Features

    x = np.array([[1.0, -1.0, 0.5], [0.0, 1.0, 0.2], [-1.0, 0.0, 0.3]] * 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.all(np.isfinite(_Features.fit(x).transform(x)))


def test_report_noisy_max3_is_measured_on_a_half_line_not_a_noisy_point():
    """A 1-d point competes with the half-line score event under the same stage-1 penalty: without it
    the point's winner's-curse criterion won although its stage-2 error is twice the half-line's (at
    these sizes the old rule picked a point on all 4 seeds, bounds 0.07-0.25; true 0.25). With the half-line
    the bounds of 12 seeds spread over 0.20-0.26, sd ~0.015 (draws in parts, stage-1 steps with their own
    streams): a 90% bound exceeds the truth on about 1 seed in 10, here seed 0 by 0.007."""
    mech, pairs = dpsniper_mechanism("report_noisy_max3")
    bounds = []
    for seed in range(4):
        res = mpl(mech, pairs, n=60000, N=300000, alpha=0.1, rng=seed)
        assert res.event_rule is not None
        bounds.append(res.lower_bound)
    assert 0.18 < min(bounds) and max(bounds) <= 0.25 + 0.025  # above the truth by at most ~1.7 sd
