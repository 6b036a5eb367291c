"""assess_joint: the joint risk read from a table through the leave-one-out layer (issue 19)."""

import numpy as np
import polars as pl
import pytest

from empdp.joint import SingularCovarianceError
from empdp.joint.assess import assess_joint


def paper_table(K=7, n_db=40, n_ind=30, seed=0, steady=0.05):
    """x per (individual, database); x_not_k = x except for individual K (sum(x) FILTER (WHERE id <> K))."""
    rng = np.random.default_rng(seed)
    x = rng.normal(5.0, 2.0, size=(n_ind, n_db))
    x[K] = 5.0 + rng.normal(0, steady, size=n_db) if steady else 5.0
    ids, dbs = np.meshgrid(np.arange(n_ind), np.arange(n_db), indexing="ij")
    return pl.DataFrame({"id": ids.ravel(), "db": dbs.ravel(), "x": x.ravel(),
                         "x_not_k": np.where(ids.ravel() == K, 0.0, x.ravel())}), K


def test_the_papers_warning_each_statistic_private_together_they_expose_k():
    table, K = paper_table()
    joint = assess_joint(table, id="id", by="db", queries=["sum(x)", "sum(x_not_k)"])
    e = joint.eps_i
    assert int(np.argmax(e)) == K and joint.eps_all == e[K]
    marginal = [assess_joint(table, id="id", by="db", queries=[qk]).eps_i[K] for qk in ("sum(x)", "sum(x_not_k)")]
    assert e[K] >= 10 * max(marginal)
    d = joint.to_dict()
    assert d["query"] == ["sum(x)", "sum(x_not_k)"] and len(d["sweep"]) == 50
    assert len(d["independence"]) == 2 and {"ljung_box_p", "trend_p"} <= set(d["independence"][1])
    assert np.all(np.diff(joint.delta) <= 1e-12)  # δ(ε) falls with ε
    assert joint.delta[-1] == 0.0  # 1.25 ε_all: everyone protected
    assert {"max_abs_shift_1", "max_abs_shift_2"} <= set(joint.individuals.columns)
    top = joint.riskiest(3)
    assert top.height == 3 and top["sets"].sum() == 1 and top.filter(pl.col("sets"))["id"][0] == K
    assert np.all(np.diff(top["delta"].to_numpy()) <= 0)  # ranked by exact δ_i at the smallest ε


def test_d1_matches_the_one_statistic_assessment():
    from empdp.assessment import assess

    table, _ = paper_table()
    eps = [0.05, 0.2, 0.5]
    one = assess(table, id="id", by="db", query="sum(x)", epsilon=eps, exact_all=True, screening=False)
    joint = assess_joint(table, id="id", by="db", queries=["sum(x)"], epsilon=eps)
    np.testing.assert_allclose(joint.eps_i, one.individuals["eps_i"].to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(joint.delta, one.delta, atol=1e-9)
    np.testing.assert_allclose(joint.total_risk, one.total_risk, atol=1e-9)
    # the independence checks of the statistic's series, as the one-statistic assessment reports them
    assert joint.to_dict()["independence"] == [one.independence]


def test_a_statistic_that_is_an_exact_function_of_the_other_is_a_finding():
    table, K = paper_table(steady=0.0)  # K contributes exactly 5 everywhere: sum(x_not_k) = sum(x) − 5
    with pytest.raises(SingularCovarianceError, match="exactly dependent") as info:
        assess_joint(table, id="id", by="db", queries=["sum(x)", "sum(x_not_k)"])
    assert info.value.involved == (0, 1)


def test_the_sweep_skips_only_what_cannot_change_the_summary(monkeypatch):
    """Forced saturation after the first block: the largest δ_i and δ_i at the smallest ε are unchanged,
    and every δ_i left out (NaN) is positive and at most the largest."""
    import empdp.joint.assess as ja
    from empdp.joint import joint_risk, select_joint_model

    rng = np.random.default_rng(3)
    q = rng.normal(size=(12, 2))
    S = rng.normal(size=(40, 12, 2)) * 0.5
    model = select_joint_model(q)
    e = joint_risk(model, S)[0]
    eps = np.geomspace(e.max() / 20, e.max() * 1.25, 10)
    full = joint_risk(model, S, eps)[1]
    monkeypatch.setattr(ja, "SWEEP_ROWS", 8)
    monkeypatch.setattr(ja, "SATURATED", -0.05)
    part = ja._sweep(model, S, eps, np.arange(40), e)
    skipped = np.isnan(part)
    assert skipped.any()
    np.testing.assert_array_equal(part[~skipped], full[~skipped])
    np.testing.assert_array_equal(np.nan_to_num(part, nan=0.0).max(axis=0), full.max(axis=0))
    assert not skipped[:, 0].any()
    assert np.all(full[skipped] > 0) and np.all(full[skipped] <= full.max(axis=0)[np.nonzero(skipped)[1]])
