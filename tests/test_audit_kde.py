"""Binned FFT KDE against the exact kernel sum; discrete helpers."""

import numpy as np
import pytest
from numpy.testing import assert_allclose

from empdp.audit import kde
from empdp.audit.kde import binned_kde, categorize, contains, grid_for, kde_at, looks_discrete, rule_of_thumb


def test_binned_kde_matches_exact_sum_1d_2d_3d():
    rng = np.random.default_rng(0)
    for d in (1, 2, 3):
        x = rng.standard_normal((4000, d)) * np.arange(1, d + 1)
        h = rule_of_thumb(x)
        grid = grid_for([x], h, step_frac=0.125 if d == 1 else 0.25)
        dens = binned_kde(x, h, grid)
        pts = grid.points()
        idx = rng.choice(len(pts), 200, replace=False)
        exact = kde_at(x, pts[idx], h)
        keep = exact > 1e-3 * exact.max()
        assert_allclose(dens.ravel()[idx][keep], exact[keep], rtol=0.02 if d == 1 else 0.06)
        assert abs(dens.sum() * grid.cell - 1) < 1e-3


def test_categorize_and_detection():
    a = np.array([[0, 1], [1, 1], [0, 1]])
    b = np.array([[1, 1], [2, 0]])
    cats, (ca, cb) = categorize(a, b)
    assert_allclose(cats[ca], a)
    assert_allclose(cats[cb], b)
    assert len(cats) == 3
    assert looks_discrete(np.array([0, 1, 1, 0]))
    assert looks_discrete(np.repeat([0.5, 1.5], 500))
    assert not looks_discrete(np.random.default_rng(1).normal(size=1000))


@pytest.mark.parametrize("table", [True, False])
def test_contains_matches_a_row_by_row_comparison(table, monkeypatch):
    """Event membership (stage 2's count): integer answer vectors by mixed-radix keys over the members'
    range (looked up in a table, or in the sorted keys when the range is too large for one), rows
    outside that range or not integer never members; other rows by categories."""
    if not table:
        monkeypatch.setattr(kde, "CONTAINS_TABLE", 0)
    rng = np.random.default_rng(4)
    rows = rng.integers(-1, 2, (3000, 6)).astype(np.int8)
    rows[:50] = 7  # outside the members' range
    rows[50:55, 2] = -5  # one coordinate below it
    members = rows[[60, 61, 75]]
    floats = rows.astype(float)
    floats[100:110] += 0.5  # not integers: never members
    floats[110:115, 3] = np.nan
    floats[115:120, 4] = -np.inf
    floats[120:125, 0] = 1e300
    for r in (rows, floats, rng.normal(size=(200, 6))):
        slow = np.array([any(np.array_equal(row, m) for m in members) for row in r])
        np.testing.assert_array_equal(contains(r, members), slow)
    assert contains(rows, members).sum() >= 3
    # members spanning their whole dtype, far from 0, or beyond float64's exact integers (categories then)
    wide = [rng.integers(-100, 101, (2000, 3)).astype(np.int8), rng.integers(0, 256, (2000, 3)).astype(np.uint8),
            rng.integers(-2 ** 62, 2 ** 62, (2000, 3)), rng.integers(0, 3, (2000, 3)).astype(float) * 1e20,
            rng.integers(0, 3, (2000, 3)) + 2 ** 53 - 1, rng.integers(0, 2, (2000, 3)).astype(bool)]
    for r in wide:
        members = r[[0, 5, 9]]
        slow = np.array([any(np.array_equal(row, m) for m in members) for row in r])
        np.testing.assert_array_equal(contains(r, members), slow, err_msg=str(r.dtype))
        assert slow.sum() >= 3
    # dtypes the compiled keys do not take (cast as NumPy cast them), strided rows, a span past 2^53
    small = rng.integers(-1, 2, (2000, 4))
    spans = np.array([[-(2 ** 53 - 1), 0], [2 ** 53 - 3, 1], [0, 1]] * 400, dtype=np.int64)
    for r in (small.astype(np.float16), small.astype(">i4"), small.astype(">f8"), small.astype(np.longdouble),
              np.asfortranarray(small), small[:, ::2], small[::-1], spans):
        members = r[[0, 5, 9]]
        slow = np.array([any(np.array_equal(row, m) for m in members) for row in r])
        np.testing.assert_array_equal(contains(r, members), slow, err_msg=str(r.dtype))


def test_contains_refuses_rows_of_another_width():
    """The compiled keys read one bound per column: rows wider or narrower than the event's members (a
    mechanism whose outputs change width) are bad input, not a silent miscount."""
    from empdp.errors import InputError

    rows = np.zeros((10, 3), dtype=np.int8)
    for other in (rows[:, :2], np.zeros((10, 4), dtype=np.int8)):
        with pytest.raises(InputError, match="must keep one width"):
            contains(other, rows[:2])
