"""assess_joint: the joint risk read from a table through the leave-one-out layer (issue 19)."""

import numpy as np
import polars as pl
import pytest

from empdp.assessment.joint import assess_joint
from empdp.risk.joint import SingularCovarianceError
from empdp.settings import Execution


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
    assert top.height == 3 and top["sets_eps_all"].sum() == 1 and top.filter(pl.col("sets_eps_all"))["id"][0] == K
    assert np.all(np.diff(top["delta"].to_numpy()) <= 0)  # ranked by exact δ_i at the smallest ε


def test_d1_matches_the_one_statistic_assessment():
    from empdp.assessment import assess

    table, _ = paper_table()
    eps = [0.05, 0.2, 0.5]
    one = assess(table, id="id", by="db", query="sum(x)", epsilon=eps, exact_all=True,
                 execution=Execution(screening=False))
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


def effects_table(n_ind=160, n_db=24, seed=1):
    """Two correlated statistics; individual effects 3 · Student-t(3), three of them far out."""
    rng = np.random.default_rng(seed)
    mu = 3 * rng.standard_t(3, size=(n_ind, 1))
    mu[:3, 0] = [80.0, -60.0, 45.0]  # far out: the rest are screened out at the sweep's low end
    x = mu + rng.normal(size=(n_ind, n_db))
    y = 0.5 * x + rng.normal(size=(n_ind, n_db)) + rng.standard_t(3, size=(n_ind, 1))
    ids, dbs = np.meshgrid(np.arange(n_ind), np.arange(n_db), indexing="ij")
    return pl.DataFrame({"id": ids.ravel(), "db": dbs.ravel(), "x": x.ravel(), "y": y.ravel()})


@pytest.fixture(scope="module")
def lazy_and_full():
    table = effects_table()
    kw = dict(id="id", by="db", queries=["sum(x)", "sum(y)"])
    return table, kw, assess_joint(table, **kw), assess_joint(table, **kw, exact_all=True)


def test_only_the_individuals_the_summary_needs_are_evaluated_and_nothing_else_changes(lazy_and_full):
    """ε_all from the rows in decreasing M_i until M_i ≤ the largest ε_i; δ_i only where M_i > min ε:
    the summary, δ_i and every ε_i given equal the exhaustive assessment's, and an ε_i left out
    (null) is one the screening bound shows is at most min ε."""
    _, _, lazy, full = lazy_and_full
    skipped = lazy.individuals["eps_i"].is_null().to_numpy()
    assert 0 < skipped.sum() < len(skipped) and not full.individuals["eps_i"].is_null().any()
    assert lazy.eps_all == full.eps_all
    for f in ("epsilons", "delta", "total_risk", "n_at_risk"):
        np.testing.assert_array_equal(getattr(lazy, f), getattr(full, f))
    for c in ("delta", "delta_lo", "delta_hi"):
        np.testing.assert_array_equal(lazy.individuals[c], full.individuals[c])
    np.testing.assert_array_equal(lazy.eps_i[~skipped], full.eps_i[~skipped])
    bound = lazy.individuals["eps_bound"].to_numpy()
    assert np.all(full.eps_i <= bound * (1 + 1e-12)) and np.all(bound[skipped] <= lazy.epsilons[0])


def test_riskiest_makes_the_eps_i_it_ranks_by_exact(lazy_and_full):
    """Past the rows with δ_i > 0 the table ranks by ε_i: the rows it shows are those of the exhaustive
    assessment, with exact values, though the assessment had left their ε_i out."""
    table, kw, _, full = lazy_and_full
    lazy = assess_joint(table, **kw)  # riskiest() fills ε_i in: a fresh one
    skipped = lazy.individuals["eps_i"].is_null().to_numpy()
    k = int((~skipped).sum()) + 12
    top_lazy, top_full = lazy.riskiest(k), full.riskiest(k)
    assert top_lazy["id"].to_list() == top_full["id"].to_list()
    np.testing.assert_array_equal(top_lazy["eps_i"], top_full["eps_i"])
    assert np.isin(top_lazy["id"].to_numpy(), np.flatnonzero(skipped)).any()  # it did have to fill some in


def test_the_results_do_not_depend_on_the_thread_count(lazy_and_full):
    table, kw, _, _ = lazy_and_full
    lazy, one = assess_joint(table, **kw, threads=2), assess_joint(table, **kw, threads=1)
    for f in ("delta", "total_risk", "total_risk_bounds", "n_at_risk"):
        np.testing.assert_array_equal(getattr(one, f), getattr(lazy, f))
    assert one.individuals.equals(lazy.individuals)


def _recorder():
    calls = []
    return calls, lambda stage, done, total: calls.append((stage, done, total))


def test_a_joint_assessment_reports_its_progress_stage_by_stage():
    """Reading, the ε_all search, the sweep and (for --out) the remaining exact ε_i each report done ≤ total
    and end with done = total (the CLI's bars and -v stage log come from these calls)."""
    from empdp.progress import READING

    table = effects_table()
    lazy = assess_joint(table, id="id", by="db", queries=["mean(x)", "mean(y)"])
    calls, progress = _recorder()
    joint = assess_joint(table, id="id", by="db", queries=["mean(x)", "mean(y)"], progress=progress, exact_all=True)
    stages = [c[0] for c in calls]
    assert [s for k, s in enumerate(stages) if k == 0 or s != stages[k - 1]] == [READING, "eps_all", "delta_i", "eps_i"]
    for stage in (READING, "eps_all", "delta_i", "eps_i"):
        mine = [c for c in calls if c[0] == stage]
        assert all(0 <= done <= total for _, done, total in mine)
        assert mine[-1][1] == mine[-1][2] > 0
    ind = joint.individuals
    need = (ind["eps_bound"].to_numpy() > joint.epsilons[0]) & ~ind["sole_contributor"].to_numpy()
    assert [c for c in calls if c[0] == "delta_i"][-1][1] == int(need.sum())  # each swept individual, once
    assert [c for c in calls if c[0] == "eps_i"][-1][1] == lazy.individuals["eps_i"].null_count() > 0


def test_the_public_assess_passes_its_progress_to_joint_and_grouped_assessments():
    from test_joint_groups import grouped_table

    from empdp import assess

    table, _ = paper_table()
    calls, progress = _recorder()
    assess(table, id="id", by="db", query=["sum(x)", "sum(x_not_k)"], epsilon=[0.5],
           execution=Execution(progress=progress))
    assert {"eps_all", "delta_i"} <= {c[0] for c in calls}
    calls.clear()
    assess(grouped_table(), id="id", by="year", group_by="region", query="mean(x)", epsilon=[0.5],
           execution=Execution(progress=progress))
    assert {"eps_all", "delta_i"} <= {c[0] for c in calls}
    final = [c for c in calls if c[0] == "delta_i"][-1]
    assert final[1] == final[2] > 0
