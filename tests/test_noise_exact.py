"""Exact ε_i(λ) and the minimal λ* (docs/method.md#82-the-minimal-scale-exact) against dense-grid references and docs/method.md#111-the-hausdorff-rule-does-not-guarantee-epsilon."""

import numpy as np
import pytest
from scipy.special import logsumexp

from empdp.noise.exact import (
    hausdorff_distance,
    laplace_kde_eps,
    minimal_lambda,
    winf_distance,
)


def dense_grid_eps(a, b, lam, size=20_001):
    """Slow reference: sup |log r − log r_i| by direct log-sum-exp on a dense grid plus the sample points."""
    pts = np.concatenate([a, b])
    x = np.concatenate([np.linspace(pts.min() - 30 * lam, pts.max() + 30 * lam, size), pts])
    log_r = logsumexp(-np.abs(x[:, None] - a) / lam, axis=1)
    log_ri = logsumexp(-np.abs(x[:, None] - b) / lam, axis=1)
    return np.abs(log_r - log_ri).max()


def random_sets(rng, count):
    for _ in range(count):
        n = int(rng.integers(2, 40))
        a = rng.normal(size=n) * rng.uniform(0.1, 10)
        shifts = rng.standard_t(2, size=n) * rng.uniform(0.01, 3) * (rng.random(n) < 0.6)
        yield a, a - shifts, rng.uniform(0.05, 3.0) * a.std()


def test_exact_eps_matches_dense_grid():
    rng = np.random.default_rng(20240611)
    for a, b, lam in random_sets(rng, 40):
        exact = laplace_kde_eps(a, b[None], lam)[0]
        assert exact == pytest.approx(dense_grid_eps(a, b, lam), rel=1e-9, abs=1e-13)


def test_exact_eps_is_the_sup_on_a_grid_without_the_points():
    # the grid misses the kinks: its max is below the exact sup and converges to it
    rng = np.random.default_rng(7)
    a = rng.normal(size=15)
    b = a - rng.normal(size=15) * (rng.random(15) < 0.5)
    x = np.linspace(-12, 12, 400_001)
    grid = np.abs(logsumexp(-np.abs(x[:, None] - a), axis=1) - logsumexp(-np.abs(x[:, None] - b), axis=1)).max()
    exact = laplace_kde_eps(a, b[None], 1.0)[0]
    assert grid <= exact + 1e-12
    assert exact - grid < 1e-4


def test_vectorised_rows_and_per_row_scales_match_single_rows():
    rng = np.random.default_rng(3)
    a = rng.normal(size=12)
    B = a - rng.normal(size=(50, 12)) * (rng.random((50, 12)) < 0.3)
    lam = rng.uniform(0.2, 2, size=50)
    rows = np.array([laplace_kde_eps(a, B[i : i + 1], lam[i])[0] for i in range(50)])
    np.testing.assert_allclose(laplace_kde_eps(a, B, lam), rows, rtol=1e-12)


def test_absent_individual_has_zero_eps_and_eps_decreases_with_lambda():
    a = np.array([0.0, 1.0, 3.0])
    assert laplace_kde_eps(a, a[None], 0.5)[0] == 0.0
    b = a - np.array([0.5, 0.0, 0.0])
    eps = [laplace_kde_eps(a, b[None], lam)[0] for lam in (0.1, 0.3, 1.0, 3.0, 10.0)]
    assert all(x > y for x, y in zip(eps, eps[1:]))


def test_winf_bound_holds():
    rng = np.random.default_rng(11)
    for a, b, lam in random_sets(rng, 40):
        assert laplace_kde_eps(a, b[None], lam)[0] <= winf_distance(a, b[None])[0] / lam * (1 + 1e-12)


def test_hausdorff_distance_reference():
    rng = np.random.default_rng(5)
    a = rng.normal(size=9)
    B = rng.normal(size=(20, 9))
    ref = [max(np.abs(a[:, None] - b).min(axis=1).max(), np.abs(b[:, None] - a).min(axis=1).max()) for b in B]
    np.testing.assert_allclose(hausdorff_distance(a, B), ref, rtol=1e-14)


@pytest.mark.parametrize(
    "a, b, lam, hausdorff_over_lam, eps_exact",
    [
        ([0, 0, 0, 1], [0, 1, 1, 1], 0.5, 0.0, 0.80),
        ([0, 0.1, 0.2, 5], [0, 4.9, 4.95, 5], 0.5, 0.4, 1.31),
    ],
)
def test_spec_10_1_counterexamples(a, b, lam, hausdorff_over_lam, eps_exact):
    a, b = np.array(a, float), np.array([b], float)
    assert hausdorff_distance(a, b)[0] / lam == pytest.approx(hausdorff_over_lam)
    eps = laplace_kde_eps(a, b, lam)[0]
    assert eps == pytest.approx(eps_exact, abs=0.005)
    target = max(hausdorff_over_lam, 0.4)  # the ε the Hausdorff rule claims for this λ
    search = minimal_lambda(a, b, target)
    # the Hausdorff rule λ = d_H/ε fails ...
    lam_h = search.lam_hausdorff
    assert lam_h == 0.0 or laplace_kde_eps(a, b, lam_h)[0] > target
    # ... while λ* holds and is larger than the Hausdorff λ
    assert search.eps_max <= target
    assert search.lam > lam_h
    assert search.lam <= search.lam_winf


def test_minimal_lambda_is_minimal_and_valid():
    rng = np.random.default_rng(2024)
    m, n = 3000, 30
    a = rng.normal(size=n) * 5
    B = a - rng.exponential(0.02, size=(m, n)) * (rng.random((m, n)) < 0.5)
    B[:4] -= rng.normal(size=(4, n))
    for epsilon in (0.1, 0.5, 2.0):
        s = minimal_lambda(a, B, epsilon)
        full = laplace_kde_eps(a, B, s.lam)
        assert full.max() <= epsilon
        np.testing.assert_array_equal(s.eps, full)
        assert laplace_kde_eps(a, B[[s.binding]], s.lam * (1 - 1e-6))[0] > epsilon
        assert s.lam <= s.lam_winf
        assert s.n_bisected < m  # W∞ pruning left most individuals alone


def test_minimal_lambda_without_any_difference_is_zero():
    a = np.array([1.0, 2.0, 2.0])
    s = minimal_lambda(a, np.tile(a[::-1], (4, 1)), 1.0)
    assert s.lam == 0.0 and s.binding is None and s.eps_max == 0.0


def test_noise_grows_as_epsilon_shrinks():
    rng = np.random.default_rng(9)
    a = rng.normal(size=20)
    B = a - rng.normal(size=(30, 20)) * (rng.random((30, 20)) < 0.2)
    lams = [minimal_lambda(a, B, e).lam for e in (0.05, 0.2, 1.0, 4.0)]
    assert all(x > y for x, y in zip(lams, lams[1:]))
