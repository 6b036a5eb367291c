"""The contract of issue 37 for joint queries (docs/method.md#102-joint-queries): the total risk is
certified to a bracket, the worst case and the at-risk counts are exact, and the bounds behind them
are certified (each checked against the exact values on random panels, and a broken bound caught)."""

from __future__ import annotations

import numpy as np
import pytest

import empdp.assessment.joint_evaluation as je
from empdp.assessment.joint import assess_joint
from empdp.errors import InputError
from empdp.risk.joint import joint_risk, select_joint_model
from empdp.risk.joint.bounds import delta_upper, eps_lower

SHAPES = ("t3", "bounded")


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    """Refine 4 rows at a time (not 64): on these small panels the bounds then decide rows, as they
    do on large ones."""
    monkeypatch.setattr(je, "FIRST_BATCH", 4)


def panel(d: int, shape: str, seed: int, n: int | None = None, m: int | None = None):
    """A model of n databases and m individuals' shifts: heavy-tailed effects (a few individuals far out)
    or bounded ones (everyone alike), present in about 80% of the databases. d = 3 is smaller (its
    exact δ_i, the reference here, takes seconds an individual)."""
    n = n or (14 if d == 2 else 7)
    m = m or (24 if d == 2 else 8)
    rng = np.random.default_rng([seed, d, SHAPES.index(shape)])
    q = rng.standard_normal((n, d)) @ (np.eye(d) + 0.6 * rng.standard_normal((d, d)))
    model = select_joint_model(q)
    if shape == "t3":
        size = 0.02 * rng.standard_t(3, size=(m, 1, d)) ** 2
    else:
        size = rng.uniform(0.0, 0.5, size=(m, 1, d))
    present = rng.random((m, n, 1)) < 0.8
    shifts = size * (1 + 0.3 * rng.standard_normal((m, n, d))) * present * model.points.std(axis=0)
    return model, shifts


def exact_of(model, shifts, eps):
    e, d = joint_risk(model, shifts, eps)
    return e, d


def certify(model, shifts, eps, tolerance):
    bound = np.abs(shifts @ model.transform.T).sum(-1).max(-1)
    part = je.Part(model, shifts, bound, np.full(len(shifts), np.nan))
    return je.Certified([part], eps, tolerance=tolerance)


def contract_holds(cert, eps_i, delta, tolerance) -> bool:
    """Every per-individual bracket holds the exact δ_i, the total's bracket holds the exact total and
    is within the tolerance, the worst case and the at-risk counts are the exact ones."""
    rel = 1e-12  # the exact values' own accuracy (docs/method.md#102-joint-queries)
    if not (np.all(cert.lo <= delta * (1 + rel) + 1e-15) and np.all(delta <= cert.hi * (1 + rel) + 1e-15)):
        return False
    with np.errstate(divide="ignore"):
        total = -np.expm1(np.log1p(-delta).sum(axis=0))
    lo, hi = cert.totals().T
    if not (np.all(lo <= total + 1e-12) and np.all(total <= hi + 1e-12)):
        return False
    if not np.all(hi - lo <= np.maximum(tolerance * hi, je.FLOOR) * (1 + 1e-9)):
        return False
    return np.allclose(cert.worst(), delta.max(axis=0), rtol=1e-12, atol=0) and np.array_equal(
        cert.n_at_risk(), (cert.eps[None, :] < eps_i[:, None]).sum(axis=0))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d", [2, 3])
def test_the_certified_bracket_contains_the_exact_values(d, shape):
    """Random panels of both shapes: with a loose tolerance (the bounds decide most rows) and the
    default one, the contract holds against δ_i computed exactly for every individual."""
    model, shifts = panel(d, shape, seed=11)
    eps_i = joint_risk(model, shifts)[0]
    eps = np.geomspace(eps_i.max() / 20, eps_i.max() * 1.25, 8)
    e, delta = exact_of(model, shifts, eps)
    for tol in (0.5, 1e-4):
        cert = certify(model, shifts, eps, tol)
        assert contract_holds(cert, e, delta, tol), (d, shape, tol)
    if (d, shape) == (2, "t3"):  # a few individuals far out: the bounds decide the others (teeth)
        loose = certify(model, shifts, eps, 0.5)
        assert not loose.refined[loose.live].all()


@pytest.mark.parametrize("bound, factor", [("delta_upper", 0.5), ("delta_lower", 3.0)])
def test_a_broken_bound_on_delta_is_caught(bound, factor, monkeypatch):
    """The same check with the upper bound on δ_i halved, or the lower one tripled: some bracket
    misses the exact δ_i."""
    model, shifts = panel(2, "t3", seed=11, m=60)
    eps_i = joint_risk(model, shifts)[0]
    eps = np.geomspace(eps_i.max() / 20, eps_i.max() * 1.25, 8)
    e, delta = exact_of(model, shifts, eps)
    original = getattr(je, bound)
    monkeypatch.setattr(je, bound, lambda *args: np.minimum(original(*args) * factor, 1.0))
    assert not contract_holds(certify(model, shifts, eps, 0.5), e, delta, 0.5)


def test_a_broken_lower_bound_on_eps_i_is_caught(monkeypatch):
    """A lower bound on ε_i raised by half: rows are counted at risk where they are not."""
    model, shifts = panel(2, "t3", seed=11, m=60)
    eps_i = joint_risk(model, shifts)[0]
    eps = np.geomspace(eps_i.max() / 20, eps_i.max() * 1.25, 8)
    e, delta = exact_of(model, shifts, eps)
    monkeypatch.setattr(je, "eps_lower", lambda *args: eps_lower(*args) * 1.5)
    assert not contract_holds(certify(model, shifts, eps, 0.5), e, delta, 0.5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("d", [2, 3])
def test_the_bounds_hold_for_every_individual(d, shape):
    """delta_upper ≥ δ_i (with and without the exact ε_i), eps_lower ≤ ε_i, row by row."""
    model, shifts = panel(d, shape, seed=5)
    T = model.transform
    su, a = shifts @ T.T, model.points @ T.T
    e = joint_risk(model, shifts)[0]
    eps = np.concatenate([[0.0], np.geomspace(e.max() / 50, e.max() * 1.1, 6)])
    delta = joint_risk(model, shifts, eps)[1]
    for hi in (delta_upper(su, eps), delta_upper(su, eps, e)):
        assert np.all(delta <= hi * (1 + 1e-12) + 1e-15)
    assert np.all(eps_lower(a, su) <= e * (1 + 1e-12))
    assert np.median(eps_lower(a, su) / e) > 0.5  # and it is not vacuous


@pytest.fixture(scope="module")
def paper():
    """The sum / sum-without-K panel (docs/method.md#102-joint-queries) and some background."""
    rng = np.random.default_rng(2)
    n_db, n_ind = 16, 30
    rows = []
    for j in range(n_db):
        for i in range(n_ind):
            x = float(rng.normal(10, 3)) + (5.0 if i == 7 else 0.0)
            rows.append((i, j, x, 0.0 if i == 7 else x))
    import polars as pl

    return pl.DataFrame(rows, schema=["id", "db", "x", "x_not_k"], orient="row")


def test_assess_joint_keeps_the_contract_and_exact_makes_every_row_exact(paper):
    """The library: certified by default, exact with ``exact=True``; the same ε_all, worst case and
    at-risk counts; the default's bracket holds the exact total within 1e-4 of hi."""
    kw = dict(id="id", by="db", queries=["sum(x)", "sum(x_not_k)"])
    certified = assess_joint(paper, **kw)
    exact = assess_joint(paper, **kw, exact=True)
    assert certified.eps_all == exact.eps_all
    np.testing.assert_array_equal(certified.delta, exact.delta)
    np.testing.assert_array_equal(certified.n_at_risk, exact.n_at_risk)
    lo, hi = certified.total_risk_bounds.T
    assert np.all(lo <= exact.total_risk) and np.all(exact.total_risk <= hi)
    assert np.all(hi - lo <= np.maximum(1e-4 * hi, 1e-12))
    np.testing.assert_array_equal(certified.total_risk, (lo + hi) / 2)
    ind = exact.individuals
    assert ind["delta"].equals(ind["delta_lo"]) and ind["delta"].equals(ind["delta_hi"])
    assert certified.to_dict()["tolerance"] == 1e-4 and exact.to_dict()["tolerance"] == 0.0
    assert certified.to_dict()["sweep"][0]["total_risk_bounds"] == [float(lo[0]), float(hi[0])]
    top = certified.riskiest(5)
    np.testing.assert_array_equal(top["delta"], exact.riskiest(5)["delta"])


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), "x"])
def test_a_bad_tolerance_is_refused_before_the_table_is_read(paper, bad):
    with pytest.raises(InputError, match=r"^`tolerance` must be a number in \[0, 1\)"):
        assess_joint(paper, id="id", by="db", queries=["sum(x)", "sum(x_not_k)"], tolerance=bad)


def test_the_rows_made_exact_are_shared_among_the_threads(monkeypatch):
    """A batch no larger than one block (the first batch: 64 rows) still runs on every thread, each
    block mixing the costly rows (widest brackets, first) with the others, and every row once."""
    model, shifts = panel(2, "bounded", seed=3, m=40)
    blocks = []

    def spy(model, shifts, eps, **kw):
        blocks.append(len(shifts))
        return joint_risk(model, shifts, eps, **kw)

    monkeypatch.setattr(je, "joint_risk", spy)
    eps = np.array([0.01, 0.1])
    bound = np.abs(shifts @ model.transform.T).sum(-1).max(-1)
    cert = je.Certified([je.Part(model, shifts, bound, np.full(len(shifts), np.nan))], eps, exact=True, threads=2)
    assert sum(blocks) == int(cert.live.sum()) > 8
    assert len(blocks) >= 8 and max(blocks) - min(blocks) <= 1
    assert [list(b) for b in je._deal(np.arange(10), 64, 1)] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


def test_the_bounds_in_blocks_on_two_threads_are_the_same_bits(monkeypatch):
    """The certified bounds run in row blocks side by side (issue 37, item 2): each row's bracket, and
    the lower bound on its ε_i, must not depend on its block or on the thread count, nor the order of
    the blocks' results on which thread ends first."""
    model, shifts = panel(2, "bounded", seed=4, m=40)
    eps = np.array([0.01, 0.05, 0.1])
    bound = np.abs(shifts @ model.transform.T).sum(-1).max(-1)

    monkeypatch.setattr(je.Certified, "_certify", lambda self: None)  # the bounds alone, no refinement

    def bounds(threads):
        part = je.Part(model, shifts, bound, np.full(len(shifts), np.nan))
        cert = je.Certified([part], eps, threads=threads)
        return cert.lo, cert.hi, cert.eps_lo, part.eps_i

    one = bounds(1)
    monkeypatch.setattr(je, "EPS_ROWS", 3)  # 14 blocks over 2 threads
    many = bounds(2)
    assert np.count_nonzero(one[1]) > 20
    for x, y in zip(one, many):
        assert np.array_equal(x, y, equal_nan=True)
