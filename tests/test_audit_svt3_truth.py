"""Exact ε of SVT3 and SVT34Parallel on a pair (``sniper.svt3_loss_range``) against a brute-force
reference: the output density by cumulative trapezoid on a fine grid of the threshold, checked against
the sampler (Monte Carlo) and the answer patterns' law, and its log ratio maximised over every grid
point of the released values."""

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy import stats

from empdp.audit import builtin, sniper
from empdp.audit.mechanisms import dpsniper_mechanism
from empdp.audit.patterns import statdp_patterns

SUITE_PAIRS = statdp_patterns(10)
#: the trapezoid's error on the log ratio is ~3e-7 at the reference's step (ρ/1000)
TOL = 1e-6


class ReferenceLaw:
    """SVT3's output density on a grid s of the threshold T + ρ and of the released values: an answer
    pattern with queries above at A (values v_a) and below at B has density
    Π_a f_ν(v_a − q_a) · G(min_a v_a), G(w) = ∫_{s ≤ w} p_ρ(s − T) Π_{i∈B} F_ν(s − q_i) ds."""

    def __init__(self, q, s, rho, nu, threshold):
        self.q, self.s, self.nu = np.asarray(q, float), s, nu
        self.log_rho = stats.laplace.logpdf(s, threshold, rho)
        self.log_below = stats.laplace.logcdf(s[None, :], self.q[:, None], nu)

    def log_g(self, above, stop):
        below = [i for i in range(stop) if i not in above]
        dens = np.exp(self.log_rho + self.log_below[below].sum(axis=0))
        with np.errstate(divide="ignore"):
            return np.log(np.concatenate([[0.0], np.cumsum((dens[1:] + dens[:-1]) * np.diff(self.s) / 2)]))

    def value_logpdf(self, a):
        return stats.laplace.logpdf(self.s, self.q[a], self.nu)


def reference(x, y, epsilon, c, threshold):
    """(max L, max −L) over every pattern and every grid point of its released values, the laws on a
    grid of step ρ/1000 from 40ρ below the smallest query or threshold to 40ρ above the largest."""
    rho, nu = 2 / epsilon, 2 * c / epsilon
    x, y = np.asarray(x, float), np.asarray(y, float)
    lo, hi = min(x.min(), y.min(), threshold), max(x.max(), y.max(), threshold)
    s = np.arange(lo - 40 * rho, hi + 40 * rho, rho / 1000)
    laws = [ReferenceLaw(q, s, rho, nu, threshold) for q in (x, y)]
    keep = s >= lo - 1  # G's relative error from starting at 0 is e^-40 or less there
    up = down = 0.0
    for above, stop in sniper.abort_patterns(x.size, c):
        d = (laws[0].log_g(above, stop)[keep] - laws[1].log_g(above, stop)[keep])
        ells = [(laws[0].value_logpdf(a) - laws[1].value_logpdf(a))[keep] for a in above]
        for sign in (1, -1):
            best = _grid_max(sign * d, [sign * ell for ell in ells])
            up, down = (max(up, best), down) if sign > 0 else (up, max(down, best))
    return up, down


def _grid_max(d, ells):
    """max over grid points v of Σ_a ell_a(v_a) + d(min_a v_a), for at most two values (the larger
    value's index ranges over the grid above the smaller's, both orders)."""
    if not ells:
        return d[-1]  # the pattern without values: G at the grid's end is its probability
    if len(ells) == 1:
        return float((ells[0] + d).max())
    (a, b), best = ells, -math.inf
    for first, second in ((a, b), (b, a)):
        above = np.maximum.accumulate(second[::-1])[::-1]  # max of second over v ≥ the first's v
        best = max(best, float((first + d + above).max()))
    return best


def svt4_loss_range(x, y, epsilon, c, threshold):
    laws = [sniper.svt_abort_law(q, 4 / epsilon, 4 / (3 * epsilon), threshold, c) for q in (x, y)]
    loss = np.log([laws[0][k] for k in laws[0]]) - np.log([laws[1][k] for k in laws[0]])
    return loss.max(), -loss.min()


# ----------------------------------------------------------------------------- the reference law itself

@pytest.mark.parametrize("c", [1, 2])
def test_reference_law_matches_the_sampler_and_the_pattern_law(c):
    """The reference density integrates to svt_abort_law's pattern masses, and its value bins match
    10^6 draws of the svt3 sampler (within 4.5 standard errors each)."""
    eps, t, q = 1.0, 1.0, [1.0, 0.0, 2.0, 1.5]
    rho, nu = 2 / eps, 2 * c / eps
    s = np.arange(-40 * rho, 2 + 40 * rho, rho / 1000)
    law = ReferenceLaw(q, s, rho, nu, t)
    masses = sniper.svt_abort_law(q, rho, nu, t, c)
    outputs = sniper.svt3(eps, c, t)(q, 10**6, np.random.default_rng(5))
    edges = np.array([-np.inf, -2.0, 0.0, 1.0, 2.0, 4.0, np.inf])
    for a in range(len(q)):  # the patterns with one value: query a above, the others below
        above, stop = (a,), len(q) if c > 1 else a + 1
        answers = np.zeros(len(q), int)
        answers[a], answers[stop:] = 1, -1
        dens = np.exp(law.value_logpdf(a) + law.log_g(above, stop))
        assert_allclose(np.trapezoid(dens, s), masses[tuple(answers)], rtol=1e-6)
        cells = np.cumsum(np.concatenate([[0.0], (dens[1:] + dens[:-1]) * np.diff(s) / 2]))
        expected = np.diff(np.interp(np.clip(edges, s[0], s[-1]), s, cells))
        codes = np.where(outputs == -1000.0, 0, np.where(outputs == -2000.0, -1, 1))
        hit = np.all(codes == answers, axis=1)
        counts = np.histogram(outputs[hit, a], bins=edges)[0]
        n = outputs.shape[0]
        assert np.all(np.abs(counts - n * expected) <= 4.5 * np.sqrt(n * expected * (1 - expected)) + 1), (a, counts)


# ----------------------------------------------------------------------------- SVT3

@pytest.mark.parametrize("pair", range(len(SUITE_PAIRS)))
def test_svt3_loss_range_on_the_suites_pairs(pair):
    """DP-Sniper's SVT3 (ε = 0.1, c = 1, T = 1) on each StatDP pattern, both directions."""
    x, y = SUITE_PAIRS[pair]
    assert_allclose(sniper.svt3_loss_range(x, y, 0.1, 1, 1.0), reference(x, y, 0.1, 1, 1.0), atol=TOL)


@pytest.mark.parametrize("x, y, epsilon, c, threshold", [
    ([0.5, 1.0, 0.0, 1.5, 0.2, 1.0], [1.5, 0.0, 0.7, 1.5, -0.8, 2.0], 0.5, 2, 0.5),
    ([0.7, 2.5, 1.5, 2.2], [0.5, 1.5, 1.7, 2.5], 0.3, 2, 1.0),
    # its supremum is inside a cell of the starting grid (5e-4 above the grid's best)
    ([1.2, 0.1, -0.4, 2.9, 1.1], [2.0, -0.5, -1.3, 2.9, 1.6], 3.0, 1, 1.0),
    # sup −L is far above the queries (the threshold's right tail): 0.0892, 0.0759 at 1 + max q
    ([1.7, 0.7], [1.9, 1.4], 0.3, 1, 1.0)])
def test_svt3_loss_range_at_other_parameters(x, y, epsilon, c, threshold):
    """Two released values (c = 2), other ε and T, mixed differences, a maximum between the kinks, one
    in the tail."""
    assert_allclose(sniper.svt3_loss_range(x, y, epsilon, c, threshold), reference(x, y, epsilon, c, threshold),
                    atol=TOL)


def test_the_check_has_power_against_a_wrong_noise_scale():
    """The reference separates the true scales from one off by 5%: a wrong ν in the exact value fails."""
    x, y = SUITE_PAIRS[3]
    exact = sniper.svt3_loss_range(x, y, 0.1, 1, 1.0)
    wrong = sniper.svt3_loss_range(x, y, 0.1 / 1.05, 1, 1.0)
    assert np.max(np.abs(np.subtract(exact, wrong))) > 100 * TOL


def test_svt3_is_not_dp_for_any_epsilon():
    """Its ε over all inputs is ∞: the pair (1, ..., 1), (2, ..., 2) has ε = m·ε/(2c), growing with the
    number of queries m (the pattern with the last query above, its value towards −∞)."""
    mech, pairs = dpsniper_mechanism("svt3")
    assert mech.epsilon == math.inf
    assert mech.true_epsilon_over(pairs) == pytest.approx(0.5, abs=TOL)
    for m in (5, 20):
        assert mech.pair_epsilon([1] * m, [2] * m) == pytest.approx(m * 0.1 / 2, abs=TOL)
    assert sniper.svt3_pair_epsilon([1] * 8, [2] * 8, 0.1, 2, 1.0) == pytest.approx(8 * 0.1 / 4, abs=TOL)


def test_svt3_exact_value_is_unknown_where_it_would_take_too_long():
    assert builtin("svt3", epsilon=1e6).pair_epsilon([1.0, 1.0], [2.0, 0.0]) is None
    assert builtin("svt3", c=2).pair_epsilon([1.0] * 200, [2.0] * 200) is None  # 20,101 patterns
    for value in (math.nan, math.inf, 1e300):
        assert builtin("svt3").pair_epsilon([value, 1.0], [1.0, 1.0]) is None


def test_inputs_of_different_lengths_are_told_apart():
    """Their outputs have different lengths: ε = ∞ (as svt1's pattern laws give), not an IndexError."""
    for name in ("svt3", "svt34_parallel"):
        assert builtin(name).pair_epsilon([1.0, 1.0, 1.0], [1.0, 2.0]) == math.inf


# ----------------------------------------------------------------------------- SVT34Parallel

@pytest.mark.parametrize("pair", range(len(SUITE_PAIRS)))
def test_svt34_parallel_on_the_suites_pairs(pair):
    """ε = 0.1, c = 2, T = 1: SVT3's range from the reference plus SVT4's from its pattern law."""
    x, y = SUITE_PAIRS[pair]
    svt3, svt4 = reference(x, y, 0.1, 2, 1.0), svt4_loss_range(x, y, 0.1, 2, 1.0)
    expected = max(svt3[0] + svt4[0], svt3[1] + svt4[1])
    assert sniper.svt34_parallel_pair_epsilon(x, y, 0.1, 2, 1.0) == pytest.approx(expected, abs=TOL)


def test_svt34_parallel_truth_table():
    mech, pairs = dpsniper_mechanism("svt34_parallel")
    assert mech.epsilon == math.inf
    assert mech.true_epsilon_over(pairs) == pytest.approx(0.48744638, abs=1e-7)
