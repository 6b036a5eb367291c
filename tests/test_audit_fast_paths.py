"""The audits' fast paths give the same results as the plain computations they replace.

Laplace noise as a difference of exponentials, samplers drawn in chunks, and the table lookup that
categorises integer answer vectors instead of sorting them.
"""

import numpy as np
import pytest
from scipy import stats

from empdp.audit import kde, samplers
from empdp.audit.mechanisms import dpsniper_mechanism


def test_laplace_noise_has_the_laplace_law():
    noise = samplers.laplace_noise(np.random.default_rng(0), 3.0, (200_000,))
    assert stats.kstest(noise, stats.laplace(scale=3.0).cdf).pvalue > 0.01
    assert noise.shape == (200_000,)
    # a wrong scale is seen: the test can fail
    assert stats.kstest(noise, stats.laplace(scale=3.1).cdf).pvalue < 1e-6


def test_chunked_sampler_stacks_every_row(monkeypatch):
    calls = []

    def base(database, size, rng):
        calls.append(size)
        return np.full((size, 2), database) + rng.random((size, 2))

    monkeypatch.setattr(samplers, "CHUNK_ROWS", 1000)
    out = samplers.in_chunks(base)(5.0, 2500, np.random.default_rng(1))
    assert out.shape == (2500, 2) and calls == [1000, 1000, 500]
    assert np.all((out >= 5) & (out < 6)) and len(np.unique(out[:, 0])) == 2500


@pytest.mark.parametrize("name", ["svt1", "numerical_svt", "laplace_parallel"])
def test_chunked_builtin_keeps_its_law(name, monkeypatch):
    """The same sampler in chunks of 700 rows and whole: the per-column means agree within noise."""
    mech, pairs = dpsniper_mechanism(name)
    whole = mech.sampler(pairs[0][1], 20_000, np.random.default_rng(2)).astype(float)
    monkeypatch.setattr(samplers, "CHUNK_ROWS", 700)
    parts = mech.sampler(pairs[0][1], 20_000, np.random.default_rng(3)).astype(float)
    assert parts.shape == whole.shape
    se = np.sqrt((whole.var(axis=0) + parts.var(axis=0)) / 20_000) + 1e-12
    assert np.all(np.abs(whole.mean(axis=0) - parts.mean(axis=0)) < 5 * se)


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.float64])
def test_dense_categories_match_a_sort(dtype):
    rng = np.random.default_rng(4)
    x = rng.integers(-1, 2, (3000, 6)).astype(dtype)
    y = rng.integers(-1, 3, (2000, 6)).astype(dtype)
    cats, (cx, cy) = kde.categorize(x, y)
    expect = np.unique(np.vstack([x, y]), axis=0)
    assert np.array_equal(cats, expect)  # the categories in the sort's order
    assert np.array_equal(cats[cx], x) and np.array_equal(cats[cy], y)


def test_categories_of_one_column_stay_in_value_order():
    x = np.array([[5.0], [-2.0], [5.0], [1e300]])
    cats, (codes,) = kde.categorize(x)
    assert cats[:, 0].tolist() == [-2.0, 5.0, 1e300]
    assert codes.tolist() == [1, 0, 1, 2]


def test_integer_bins_by_lookup_match_the_search():
    from empdp.audit import ratios

    rng = np.random.default_rng(5)
    u = rng.integers(-3, 40, (5000, 3))
    atoms = [np.array([-1.0, 7.0]), np.array([]), np.array([2.0])]
    edges = [np.array([0.0, 2.5, 10.0, 10.0, 30.0]), np.array([5.0]), np.array([-2.0, 20.0])]
    fast = ratios._lookup(u, atoms, edges)
    for j in range(3):
        assert np.array_equal(fast[:, j], ratios._bins(u[:, j].astype(float), atoms[j], edges[j]))
    assert ratios._lookup(u.astype(float), atoms, edges) is None  # floats are searched
    assert ratios._lookup(u * 10_000, atoms, edges) is None  # so are integers of a wide range
