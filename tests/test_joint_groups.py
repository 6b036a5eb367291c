"""Grouped statistics: one statistic per group and database, assessed per individual on the groups
their rows touch (issue 19 item 6)."""

import json

import numpy as np
import polars as pl
import pytest

from empdp.assessment.groups import assess_grouped
from empdp.errors import InputError
from empdp.risk.joint import select_joint_model
from empdp.settings import Execution

EPS = [0.05, 0.2, 0.6]


def grouped_table(groups="abcde", n_db=24, n_ind=50, movers=None, seed=0):
    """mean(x) by region each year: individual i lives in region groups[i % G]; a mover cycles through its
    regions, one per year; individual 0 also has a second row in the next region every year."""
    movers = {45: "abcd", 46: "abcde", 47: "ab", 48: "bc", 49: "ace"} if movers is None else movers
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_ind):
        home = groups[i % len(groups)]
        for j in range(n_db):
            if i in movers:
                rows.append((i, 2000 + j, movers[i][j % len(movers[i])], rng.normal(10, 3)))
            elif rng.random() < 0.85:
                rows.append((i, 2000 + j, home, rng.normal(10, 3)))
                if i == 0:
                    rows.append((i, 2000 + j, groups[1], rng.normal(10, 3)))
    return pl.DataFrame(rows, schema=["id", "year", "region", "x"], orient="row")


def test_two_groups_are_the_joint_query_of_the_filtered_statistics():
    from empdp.assessment.joint import assess_joint

    table = grouped_table(groups="ab", movers={20: "ab", 21: "ab"})
    filtered = [f"SELECT avg(x) FROM db WHERE region = '{g}'" for g in "ab"]
    joint = assess_joint(table, id="id", by="year", sql=filtered, epsilon=EPS, exact_all=True)
    for grouped in (assess_grouped(table, id="id", by="year", group_by="region", sql="SELECT avg(x) FROM db",
                                   epsilon=EPS),
                    assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS)):
        assert grouped.joint and grouped.groups == ["a", "b"]
        ind = grouped.individuals
        assert ind["id"].to_list() == joint.individuals["id"].to_list()
        np.testing.assert_allclose(grouped.q, joint.q, rtol=1e-12)
        np.testing.assert_allclose(grouped.eps_i, joint.eps_i, rtol=1e-12)
        np.testing.assert_allclose(ind["delta"].to_numpy(), joint.individuals["delta"].to_numpy(), atol=1e-12)
        np.testing.assert_allclose(grouped.delta, joint.delta, atol=1e-12)
        np.testing.assert_allclose(grouped.total_risk, joint.total_risk, atol=1e-12)
        np.testing.assert_array_equal(grouped.n_at_risk, joint.n_at_risk)
        assert grouped.eps_all == pytest.approx(joint.eps_all, rel=1e-12)
        np.testing.assert_allclose(ind["eps_bound"].to_numpy(), joint.individuals["eps_bound"].to_numpy(), rtol=1e-12)
        assert not grouped.n_unresolved.any() and grouped.n_bound_only == 0
        assert ind.filter(pl.col("id").is_in([0, 20, 21]))["groups"].to_list() == [2, 2, 2]
        # every key of the joint JSON, and the groups
        d = grouped.to_dict()
        assert set(joint.to_dict()) <= set(d) and d["group_by"] == "region" and d["groups"] == ["a", "b"]
        assert d["bandwidth"] == pytest.approx(joint.to_dict()["bandwidth"], rel=1e-12)


@pytest.fixture(scope="module")
def five():
    table = grouped_table()
    return table, assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS)


def test_an_individual_in_one_group_has_that_groups_one_statistic_risk(five):
    from empdp.assessment import assess

    table, grouped = five
    assert not grouped.joint
    ind = grouped.individuals
    for g in "ace":
        one = assess(table, id="id", by="year", query="mean(x)", where=f"region = '{g}'", epsilon=EPS, exact_all=True,
                     execution=Execution(screening=False))
        here = set(table.filter(pl.col("region") == g)["id"].to_list())
        only = ind.filter((pl.col("groups") == 1) & pl.col("id").is_in(list(here)))
        assert only.height >= 8
        ref = one.individuals.join(only.select("id"), on="id", how="semi").sort("id")
        np.testing.assert_allclose(only["eps_i"].to_numpy(), ref["eps_i"].to_numpy(), rtol=1e-9)
        np.testing.assert_allclose(only["delta"].to_numpy(), ref["delta"].to_numpy(), atol=1e-9)
        assert only["n_databases"].to_list() == ref["n_databases"].to_list()


def test_an_individual_in_four_or_more_groups_gets_a_labelled_bound(five):
    table, grouped = five
    ind = grouped.individuals
    bounded = ind.filter(pl.col("groups") > 3)
    assert sorted(bounded["id"].to_list()) == [45, 46]
    assert bounded["eps_i"].null_count() == 2 and ind["eps_i"].null_count() == 2
    assert np.all(ind["eps_bound"].to_numpy() >= np.nan_to_num(grouped.eps_i))  # a bound for everyone
    risks = grouped.group_risks
    for who in (45, 46):
        mine = risks.filter(pl.col("id") == who)
        assert mine.height == len({45: "abcd", 46: "abcde"}[who])
        bound = bounded.filter(pl.col("id") == who)["eps_bound"][0]
        assert bound == pytest.approx(mine["eps_bound"].sum(), rel=1e-12)  # Σ_g M_ig
        assert bound >= mine["eps_i"].max() > 0
        assert np.all(mine["eps_bound"].to_numpy() >= mine["eps_i"].to_numpy())
    # a bounded individual is out of δ(ε) and counted as unresolved while its bound exceeds ε
    assert grouped.n_unresolved.tolist() == [int((bounded["eps_bound"] > e).sum()) for e in EPS]
    assert grouped.eps_all_bound == pytest.approx(max(grouped.eps_all, bounded["eps_bound"].max()))
    d = json.loads(json.dumps(grouped.to_dict()))
    assert d["n_bound_only"] == 2 and [s["n_unresolved"] for s in d["sweep"]] == grouped.n_unresolved.tolist()
    assert d["eps_all"] == pytest.approx(np.nanmax(grouped.eps_i))


def test_group_risks_are_the_one_statistic_risks_of_each_group(five):
    from empdp.assessment import assess

    table, grouped = five
    one = assess(table, id="id", by="year", query="mean(x)", where="region = 'd'", epsilon=EPS[:1], exact_all=True,
                 execution=Execution(screening=False))
    ref = one.individuals.filter(pl.col("id").is_in([45, 46])).sort("id")
    mine = grouped.group_risks.filter(pl.col("group") == "d").sort("id")
    np.testing.assert_allclose(mine["eps_i"].to_numpy(), ref["eps_i"].to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(mine["delta"].to_numpy(), ref["delta"].to_numpy(), atol=1e-9)


def brute_force_panel(table: pl.DataFrame, groups: str):
    """q (n, G) and Δ (individual -> (n, G)) by recomputing mean(x) per group without each individual."""
    years = sorted(table["year"].unique().to_list())
    q = np.array([[table.filter((pl.col("year") == y) & (pl.col("region") == g))["x"].mean() for g in groups]
                  for y in years])
    shifts = {}
    for i in table["id"].unique().to_list():
        rest = table.filter(pl.col("id") != i)
        mine = table.filter(pl.col("id") == i)
        s = np.zeros_like(q)
        for (y, g) in set(zip(mine["year"].to_list(), mine["region"].to_list())):
            j, k = years.index(y), groups.index(g)
            s[j, k] = q[j, k] - rest.filter((pl.col("year") == y) & (pl.col("region") == g))["x"].mean()
        shifts[i] = s
    return q, shifts


def vertex_eps(model, shifts):
    """sup |log p̂ − log p̂_i| over every vertex of the kink grid in scaled coordinates (where the sup is
    attained, docs/method.md#102-joint-queries) and points far beyond, evaluated by logpdf."""
    T = model.transform
    a, b = model.points @ T.T, (model.points - shifts) @ T.T
    axes = [np.r_[a[:, k], b[:, k], a[:, k].min() - 60, a[:, k].max() + 60] for k in range(model.d)]
    u = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, model.d)
    x = u @ np.linalg.inv(T).T
    return np.abs(model.logpdf(x) - model.logpdf(x, shifts)).max()


def test_grouped_values_and_risks_match_a_brute_force_recomputation(five):
    table, grouped = five
    q, shifts = brute_force_panel(table, "abcde")
    np.testing.assert_allclose(grouped.q, q, rtol=1e-12)
    ind = grouped.individuals
    for who, groups in ((47, [0, 1]), (48, [1, 2]), (49, [0, 2, 4]), (0, [0, 1]), (3, [3])):
        model = select_joint_model(q[:, groups])
        ref = vertex_eps(model, shifts[who][:, groups])
        assert ind.filter(pl.col("id") == who)["groups"][0] == len(groups)
        assert ind.filter(pl.col("id") == who)["eps_i"][0] == pytest.approx(ref, rel=1e-6)


def test_a_null_group_is_refused_in_one_line():
    table = grouped_table().with_columns(
        pl.when((pl.col("id") == 3) & (pl.col("year") == 2004)).then(None).otherwise(pl.col("region")).alias("region"))
    with pytest.raises(InputError, match=r"^1 rows have a NULL group in column 'region'[^\n]*$"):
        assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)")
    # rows --where removes are never read
    a = assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", where="region IS NOT NULL",
                       epsilon=EPS)
    assert a.groups == list("abcde")


def test_a_group_missing_from_a_database_is_refused_in_one_line():
    table = grouped_table().filter(~((pl.col("region") == "c") & (pl.col("year") == 2007)))
    with pytest.raises(InputError, match=r"^group 'c' of column 'region' has no rows in database 2007: [^\n]*$"):
        assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)")
    with pytest.raises(InputError, match=r"^group 'c' [^\n]* database 2007 that `where` keeps: [^\n]*$"):
        assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", where="x > -100")


@pytest.mark.parametrize("options, match", [
    ({"group_by": "zone"}, "column 'zone' not found"),
    ({"group_by": "id"}, "is the `id` column"),
    ({"group_by": "region", "bandwidth": [1.0, 2.0]}, r"one per group \(5\); got 2"),
    ({"group_by": "region", "epsilon": -1}, "epsilon must be finite"),
    ({"group_by": "region", "where": "x > 0", "query": None, "sql": "SELECT avg(x) FROM db"}, "`where` goes with"),
])
def test_bad_input_is_one_line(options, match):
    with pytest.raises(InputError, match=match) as info:
        assess_grouped(grouped_table(), id="id", by="year", **{"query": "mean(x)", **options})
    assert "\n" not in str(info.value)


def test_too_many_groups_are_refused(monkeypatch):
    import empdp.loo.joint as jp

    monkeypatch.setattr(jp, "MAX_GROUPS", 4)
    with pytest.raises(InputError, match="has 5 groups; a grouped statistic takes at most 4"):
        assess_grouped(grouped_table(), id="id", by="year", group_by="region", query="mean(x)")


def test_the_only_contributor_to_a_group_is_exposed():
    table = grouped_table(groups="ab", movers={})
    # in 2003 only individual 1 has a row in region b
    table = table.filter(~((pl.col("year") == 2003) & (pl.col("region") == "b") & (pl.col("id") != 1)))
    table = pl.concat([table, pl.DataFrame({"id": [1], "year": [2003], "region": ["b"], "x": [9.0]})]).unique(
        maintain_order=True)
    a = assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS)
    row = a.individuals.filter(pl.col("id") == 1)
    assert row["sole_contributor"][0] and row["eps_i"][0] == np.inf and row["delta"][0] == 1.0
    assert a.sole_contributors == 1 and np.all(a.delta == 1.0)


def test_group_names_and_values_are_quoted_and_fixed_scales_match_the_joint_query():
    from empdp.assessment.joint import assess_joint

    table = grouped_table(groups="ab", movers={20: "ab"}).with_columns(
        pl.col("region").replace({"a": "O'Hare", "b": 'say "b"'}).alias('area "x"'))
    grouped = assess_grouped(table, id="id", by="year", group_by='area "x"', query="mean(x)", epsilon=EPS,
                             bandwidth=[0.4, 0.5])
    assert grouped.groups == ["O'Hare", 'say "b"']
    joint = assess_joint(table, id="id", by="year", sql=[f"SELECT avg(x) FROM db WHERE region = '{g}'" for g in "ab"],
                         epsilon=EPS, bandwidth=[0.4, 0.5], exact_all=True)
    np.testing.assert_allclose(grouped.eps_i, joint.eps_i, rtol=1e-12)
    np.testing.assert_allclose(grouped.total_risk, joint.total_risk, atol=1e-12)
    ints = assess_grouped(table.with_columns((pl.col("region") == "b").cast(pl.Int64).alias("zone")), id="id",
                          by="year", group_by="zone", query="mean(x)", epsilon=EPS, bandwidth=[0.4, 0.5])
    assert ints.groups == [0, 1] and ints.to_dict()["groups"] == [0, 1]
    np.testing.assert_allclose(ints.eps_i, joint.eps_i, rtol=1e-12)


def test_groups_whose_statistics_are_exactly_dependent_are_a_finding():
    from empdp.risk.joint import SingularCovarianceError

    rng = np.random.default_rng(5)
    # one row per individual and year, some moving: count(*) of the three regions always sums to 30
    rows = [(i, 2000 + j, "abc"[(i + (j if i < 6 else 0) * rng.integers(0, 2)) % 3]) for i in range(30)
            for j in range(20)]
    table = pl.DataFrame(rows, schema=["id", "year", "region"], orient="row")
    with pytest.raises(SingularCovarianceError, match=r"count\(\*\) \[region = a\].*exactly dependent") as info:
        assess_grouped(table, id="id", by="year", group_by="region", query="count(*)")
    assert info.value.involved == (0, 1, 2) and "\n" not in str(info.value)


def test_the_certified_grouped_total_brackets_the_exact_one(five):
    """Certified (default) and exact runs agree on ε_all, the worst case and the at-risk counts; the
    certified bracket holds the exact total risk and is no wider than the tolerance allows."""
    table, certified = five
    exact = assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS, exact=True)
    assert certified.eps_all == exact.eps_all
    np.testing.assert_array_equal(certified.delta, exact.delta)
    np.testing.assert_array_equal(certified.n_at_risk, exact.n_at_risk)
    np.testing.assert_array_equal(certified.n_unresolved, exact.n_unresolved)
    lo, hi = certified.total_risk_bounds.T
    assert np.all(lo <= exact.total_risk) and np.all(exact.total_risk <= hi)
    assert np.all(hi - lo <= np.maximum(1e-4 * hi, 1e-12))
    np.testing.assert_array_equal(exact.total_risk_bounds[:, 0], exact.total_risk_bounds[:, 1])
    ind = exact.individuals
    assert ind["delta"].equals(ind["delta_lo"]) and ind["delta"].equals(ind["delta_hi"])


def test_a_wrong_number_of_scales_is_refused_before_any_group_is_read(monkeypatch):
    import empdp.loo.joint as jp

    made = jp._engine

    def engine(*args, **kwargs):  # the real engine (frozen: its class), whose reading of a group fails the test
        real = made(*args, **kwargs)
        monkeypatch.setattr(type(real), "read", lambda *a, **k: pytest.fail("a group was read"))
        return real

    monkeypatch.setattr(jp, "_engine", engine)
    with pytest.raises(InputError, match=r"^`bandwidth` needs one scale, or one per group \(5\); got 3$"):
        assess_grouped(grouped_table(), id="id", by="year", group_by="region", query="mean(x)",
                       bandwidth=[0.1, 0.2, 0.3])


def test_grouped_results_do_not_depend_on_the_thread_count(monkeypatch):
    """The rows made exact run in blocks side by side; with small blocks and batches (so that which
    rows are refined matters) one thread and four give the same assessment."""
    import empdp.assessment.joint_evaluation as je

    monkeypatch.setattr(je, "SWEEP_ROWS", 2)
    monkeypatch.setattr(je, "FIRST_BATCH", 2)
    table = grouped_table()
    runs = [assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS, threads=t)
            for t in (1, 4)]
    assert runs[0].individuals.equals(runs[1].individuals)
    for field in ("delta", "total_risk", "total_risk_bounds", "n_at_risk", "n_unresolved"):
        np.testing.assert_array_equal(getattr(runs[0], field), getattr(runs[1], field))


def test_the_groups_notes_are_one_summary_line_with_the_details_kept(five):
    """Issue 37, item 5: one line in ``warnings`` for the groups' series notes, each note in
    ``warning_details`` (named by its group), both in the JSON."""
    _, grouped = five
    details = grouped.warning_details
    assert details and all("[region = " in w for w in details)
    summary = [w for w in grouped.warnings if "note(s) on the series of" in w]
    assert len(summary) == 1 and summary[0].startswith(f"{len(details)} note(s)")
    assert not any("[region = " in w for w in grouped.warnings)
    d = grouped.to_dict()
    assert d["warnings"] == grouped.warnings and d["warning_details"] == details
