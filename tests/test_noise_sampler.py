"""Secure exact sampler of w·δ0 + (1 − w)·Laplace(λ) (docs/method.md#84-secure-sampling)."""

import math

import numpy as np
import pytest
from scipy import stats

from empdp.noise.sampler import (
    NoiseSampler,
    SecureBits,
    SeededBits,
    bernoulli_exp,
    discrete_laplace,
    uniform_below,
)

SEED = 20240611


def mixture_ks(x, w, lam):
    """Two-sided KS statistic against F = w·1[x ≥ 0] + (1 − w)·Laplace(λ) (with its jump) and its p-value.

    The Kolmogorov p-value is conservative when F has a jump.
    """
    x = np.sort(x)
    n = x.size
    cdf = lambda t: w * (t >= 0) + (1 - w) * stats.laplace.cdf(t, scale=lam)  # noqa: E731
    cdf_left = lambda t: w * (t > 0) + (1 - w) * stats.laplace.cdf(t, scale=lam)  # noqa: E731
    u = np.union1d(x, [0.0])
    right = np.searchsorted(x, u, side="right") / n
    left = np.searchsorted(x, u, side="left") / n
    d = max(np.abs(right - cdf(u)).max(), np.abs(left - cdf_left(u)).max())
    return d, stats.kstwo.sf(d, n)


@pytest.mark.parametrize("w, lam", [(0.3, 2.0), (0.0, 0.013), (0.81, 150.0)])
def test_draws_pass_ks_against_the_mixture_and_atom_matches(w, lam):
    x = NoiseSampler(w, lam, seed=SEED).sample(100_000)
    d, p = mixture_ks(x, w, lam)
    assert p > 0.001, d
    zeros = int((x == 0).sum())
    if w:
        assert stats.binomtest(zeros, x.size, w).pvalue > 0.001
    else:  # only the discrete Laplace's own P(0) ≈ 1/(2t) < 5e-7
        assert zeros < 5


def test_ks_helper_detects_a_wrong_atom():
    x = NoiseSampler(0.3, 2.0, seed=SEED).sample(100_000)
    assert mixture_ks(x, 0.25, 2.0)[1] < 1e-6
    assert mixture_ks(x, 0.3, 2.2)[1] < 1e-6


def test_discrete_laplace_pmf():
    t = 3
    z = discrete_laplace(SeededBits(SEED), t, 200_000)
    support = np.arange(-15, 16)
    pmf = np.exp(-np.abs(support) / t)
    pmf /= np.exp(-np.abs(np.arange(-400, 401)) / t).sum()
    observed = np.array([(z == k).sum() for k in support])
    tail = z.size - observed.sum()
    expected = np.append(pmf * z.size, z.size * (1 - pmf.sum()))
    assert stats.chisquare(np.append(observed, tail), expected).pvalue > 0.001


def test_bernoulli_exp_and_uniform_below():
    bits = SeededBits(SEED)
    for num, den in [(0, 5), (1, 2), (3, 3), (1, 1)]:
        p = bernoulli_exp(bits, np.full(100_000, num), den).mean()
        assert p == pytest.approx(math.exp(-num / den), abs=5 * math.sqrt(0.25 / 100_000))
    u = uniform_below(bits, np.full(60_000, 6))
    assert u.min() == 0 and u.max() == 5
    assert stats.chisquare(np.bincount(u, minlength=6)).pvalue > 0.001


def test_scale_is_never_rounded_down_and_outputs_sit_on_the_grid():
    for lam in (0.013, 1.0, 3.7, 1e6):
        s = NoiseSampler(0.2, lam, seed=1)
        assert lam <= s.t * s.grid <= lam * (1 + 2**-19)
        assert s.grid <= lam * 2**-20
        x = s.sample(1000)
        np.testing.assert_array_equal(np.round(x / s.grid), x / s.grid)
        v = s.release(123.456789)
        assert v / s.grid == round(v / s.grid)  # value rounded to the grid, then exact integer addition


def test_without_seed_two_runs_differ_and_are_marked_private():
    a, b = NoiseSampler(0.1, 1.0), NoiseSampler(0.1, 1.0)
    assert a.private and b.private
    assert not np.array_equal(a.sample(50), b.sample(50))
    assert isinstance(a.bits, SecureBits)


def test_seed_is_reproducible_and_not_private():
    a, b = NoiseSampler(0.1, 1.0, seed=5), NoiseSampler(0.1, 1.0, seed=5)
    assert not a.private
    np.testing.assert_array_equal(a.sample(50), b.sample(50))
    assert a.release(1.5) == b.release(1.5)


def test_numpy_global_state_is_never_touched():
    np.random.seed(123)
    before = np.random.get_state()
    first = NoiseSampler(0.2, 1.0).sample(1000)
    NoiseSampler(0.2, 1.0, seed=9).sample(1000)
    after = np.random.get_state()
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2:] == after[2:]
    np.random.seed(123)  # reseeding NumPy does not reproduce the secure draws
    assert not np.array_equal(first, NoiseSampler(0.2, 1.0).sample(1000))


def test_no_noise_releases_the_value():
    s = NoiseSampler(1.0, 0.0)
    assert s.release(2.5) == 2.5
    assert not s.sample(10).any()
    with pytest.raises(ValueError):
        NoiseSampler(0.5, -1.0)
    with pytest.raises(ValueError):
        NoiseSampler(0.5, 1.0).release(float("nan"))
