"""read_joint reads decomposable statistics in one scan (empdp.loo.DecomposableSet): its values, shifts,
ids, sole contributors and presence are bit-identical to one leave-one-out engine per statistic, on a
panel with NULL values, NULL ids, individuals absent from databases or filtered out entirely, a WHERE
filter and sole contributors; a misaligned statistic (swapped columns, shifted rows) fails here.
read_grouped opens the source once for all groups and equals a fresh engine per group."""

import numpy as np
import polars as pl
import pytest

from empdp import engines
from empdp.errors import InputError
from empdp.loo import DecomposableSet, leave_one_out
from empdp.loo.joint import read_grouped, read_joint

WHERE = "g <> 'drop'"


def random_panel(seed: int, string_ids: bool = False) -> pl.DataFrame:
    """40 individuals with 0-3 rows in each of 6 databases; x, y, w with NULLs; rows with g = 'drop'
    are filtered out by WHERE. Individual 3 is the only one left in database 0 after WHERE (2 rows);
    in database 1 only individual 5 has x (2 rows); individual 39's rows are all dropped."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(40):
        for j in range(6):
            for _ in range(rng.choice(4, p=[0.3, 0.4, 0.2, 0.1])):
                rows.append((i, j, rng.normal(10, 3), rng.normal(-2, 5), rng.uniform(1, 2),
                             "drop" if i == 39 or rng.uniform() < 0.1 else "keep"))
    df = pl.DataFrame(rows, schema=["id", "db", "x", "y", "w", "g"], orient="row")
    k = rng.uniform(size=len(df))
    df = df.with_columns(
        g=pl.when(pl.col("db") == 0).then(pl.lit("drop")).otherwise(pl.col("g")),
        x=pl.when(pl.Series(k < 0.1) | (pl.col("db") == 1)).then(None).otherwise(pl.col("x")),
        y=pl.when(pl.Series((k > 0.5) & (k < 0.6))).then(None).otherwise(pl.col("y")),
    )
    df = pl.concat([df, pl.DataFrame([(3, 0, 7.0, 1.5, 1.2, "keep"), (3, 0, 9.0, 2.5, 1.1, "keep"),
                                      (5, 1, 12.0, 0.5, 1.3, "keep"), (5, 1, 8.0, -1.0, 1.4, "keep")],
                                     schema=df.schema, orient="row")])
    if string_ids:
        df = df.with_columns(id=pl.format("p{}", pl.col("id")))
    return df.sample(fraction=1.0, shuffle=True, seed=seed)


def both_paths(monkeypatch, source, queries, **kw):
    """read_joint through the one-scan set and through one engine per statistic."""
    taken = []
    real = engines.open_decomposable_set

    def spy(*a, **k):
        taken.append(real(*a, **k))
        return taken[-1]

    with monkeypatch.context() as m:
        m.setattr(engines, "open_decomposable_set", spy)
        shared = read_joint(source, id="id", by="db", queries=queries, **kw)
    assert [type(t) for t in taken] == [DecomposableSet]
    with monkeypatch.context() as m:
        m.setattr(engines, "open_decomposable_set", lambda *a, **k: None)
        single = read_joint(source, id="id", by="db", queries=queries, **kw)
    return shared, single


def assert_identical(a, b):
    assert a.labels == b.labels and a.names == b.names
    assert a.ids.equals(b.ids, check_dtypes=True, check_names=True)
    for field in ("q", "shifts", "sole", "present"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.shape == y.shape, field
        np.testing.assert_array_equal(x, y, err_msg=field, strict=True)
    assert a.shifts.flags.c_contiguous


@pytest.mark.parametrize("queries", [
    ["mean(x)", "mean(y)"],
    ["count(*)", "sum(x)", "var(y)"],
    ["std(x)", "sum(x)/sum(w)", "mean(y)"],
    ["var(x)", "std(y)", "count(y)"],
    ["sum(y)/sum(w)", "mean(x)"],
    ["mean(x)"],
])
@pytest.mark.parametrize("where", [WHERE, None])
def test_one_scan_equals_one_engine_per_statistic(monkeypatch, tmp_path, queries, where):
    path = tmp_path / "panel.parquet"
    random_panel(len(queries) + (where is None)).write_parquet(path)
    shared, single = both_paths(monkeypatch, str(path), queries, where=where)
    assert_identical(shared, single)
    assert shared.d == len(queries) and shared.shifts.any(axis=(0, 1)).all()
    if where:  # the panel's designed cases are there: a sole contributor, a filtered-out individual
        ids = shared.ids.to_list()
        assert shared.sole[ids.index(3)] and 39 not in ids
        assert shared.present.min() >= 1 and (shared.present < len(shared.labels)).any()
    if where and "mean(x)" in queries:  # only individual 5 has x in database 1
        assert shared.sole[shared.ids.to_list().index(5)]


def test_one_scan_equals_one_engine_per_statistic_with_null_and_string_ids(monkeypatch):
    frame = random_panel(7, string_ids=True)
    frame = pl.concat([frame, frame.head(5).with_columns(id=pl.lit(None, dtype=pl.String))])
    shared, single = both_paths(monkeypatch, frame, ["mean(y)", "var(x)", "sum(x)/sum(w)"], where=WHERE,
                                drop_null_ids=True)
    assert_identical(shared, single)


def test_mixed_forms_keep_one_engine_per_statistic(monkeypatch, tmp_path):
    path = tmp_path / "panel.parquet"
    random_panel(3).write_parquet(path)
    taken = []
    real = engines.open_decomposable_set
    monkeypatch.setattr(engines, "open_decomposable_set", lambda *a, **k: taken.append(real(*a, **k)))
    out = read_joint(str(path), id="id", by="db", queries=["mean(x)", "median(y)"])
    assert taken == [None] and out.names == ["mean(x)", "median(y)"]


@pytest.mark.parametrize("queries,what", [
    (["mean(x)", "sum(big)"], "overflows: its value"),
    (["mean(y)", "sum(huge)", "mean(x)"], "overflows: its largest leave-one-out shift"),
    (["mean(x)", "mean(word)"], "not a number"),
    (["mean(x)", "mean(nope)"], "not found"),
    (["mean(x)", "bogus(y)"], "bogus"),
])
def test_one_scan_refuses_as_one_engine_per_statistic(monkeypatch, tmp_path, queries, what):
    path = tmp_path / "panel.parquet"
    frame = random_panel(4).with_row_index("row")
    first = frame.filter(pl.col("db") == 2).unique("id", keep="first", maintain_order=True)["row"][:2]
    frame.with_columns(  # huge: +1e160 and -1e160 on rows of two individuals in database 2, which sums to 0
        big=pl.col("w") * 1e200, word=pl.lit("a"),
        huge=pl.when(pl.col("row") == first[0]).then(1e160).when(pl.col("row") == first[1]).then(-1e160).otherwise(0.0),
    ).write_parquet(path)
    errors = []
    for patch in (False, True):
        with monkeypatch.context() as m:
            if patch:
                m.setattr(engines, "open_decomposable_set", lambda *a, **k: None)
            with pytest.raises(InputError) as exc:
                read_joint(str(path), id="id", by="db", queries=queries)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and what in errors[0]


@pytest.mark.parametrize("query", ["mean(x)", "var(y)", "sum(x)/sum(w)", "median(y)"])
@pytest.mark.parametrize("where", ["y > -6", None])
def test_grouped_statistics_on_one_panel_equal_one_engine_per_group(tmp_path, query, where):
    """read_grouped opens the source once and reads each group's presence from the held shifts: the
    same values, shifts, rows and presence as a fresh engine on each group's rows (leave_one_out,
    which reads presence from the table)."""
    path = tmp_path / "panel.parquet"
    random_panel(5).with_columns(  # x in database 1 for every group, so that each group's mean(x) is defined
        x=pl.when(pl.col("db") == 1).then(pl.col("w") * 3).otherwise(pl.col("x")), region=pl.col("id") % 3,
    ).write_parquet(path)
    grouped = read_grouped(str(path), id="id", by="db", group_by="region", query=query, where=where)
    assert grouped.groups == [0, 1, 2]
    inside = np.zeros((len(grouped.ids), len(grouped.labels)), dtype=bool)
    for g, value in enumerate(grouped.groups):
        cond = f"CAST(region AS VARCHAR) = '{value}'"
        ref = leave_one_out(str(path), id="id", by="db", query=query, where=f"({where}) AND {cond}" if where else cond)
        rows = grouped.rows[g]
        assert grouped.ids.gather(rows).equals(ref.ids, check_names=True, check_dtypes=True)
        np.testing.assert_array_equal(grouped.q[:, g], ref.q, strict=True)
        np.testing.assert_array_equal(grouped.shifts[g], ref.shifts, strict=True)
        assert (grouped.sole[rows] >= ref.undefined).all() and grouped.touched[rows, g].all()
        assert grouped.touched[:, g].sum() == len(rows)
        inside[rows] |= ref.present
    np.testing.assert_array_equal(grouped.present, inside.sum(axis=1), strict=True)
    assert (inside.sum(axis=1) < len(grouped.labels)).any()  # some individuals are absent from databases


def test_one_sql_returning_two_or_three_columns_is_those_statistics_released_together():
    """Issue 37, item 3: ``sql`` as one string with 2-3 numeric columns gives the same panel and the
    same assessment as the same statistics given as a list of one-column SQL strings."""
    from empdp.assessment.joint import assess_joint

    table = random_panel(7).filter(pl.col("g") == "keep").drop_nulls(["x", "y"])
    one = "SELECT sum(x), sum(x) FILTER (WHERE id <> 7), avg(y) FROM db"
    many = ["SELECT sum(x) FROM db", "SELECT sum(x) FILTER (WHERE id <> 7) FROM db", "SELECT avg(y) FROM db"]
    a = read_joint(table, id="id", by="db", sql=one)
    b = read_joint(table, id="id", by="db", sql=many)
    assert a.d == 3
    np.testing.assert_allclose(a.q, b.q, rtol=1e-12)
    np.testing.assert_allclose(a.shifts, b.shifts, rtol=1e-12, atol=1e-12)
    assert a.ids.equals(b.ids) and np.array_equal(a.sole, b.sole)
    two, listed = (assess_joint(table, id="id", by="db", sql=s, epsilon=[0.5, 1.0], exact=True)
                   for s in (one.replace(", avg(y)", ""), many[:2]))
    assert two.eps_all == pytest.approx(listed.eps_all, rel=1e-12)
    np.testing.assert_allclose(two.total_risk, listed.total_risk, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(two.n_at_risk, listed.n_at_risk)


def test_one_sql_with_too_many_columns_is_one_line():
    with pytest.raises(InputError, match=r"^`sql` returns 4 columns: at most 3 statistics"):
        read_joint(random_panel(1), id="id", by="db", sql="SELECT sum(x), sum(y), avg(x), avg(y) FROM db")


@pytest.mark.parametrize("value", ["back\\slash", "x\\g<0>"])
def test_a_backslash_in_a_group_value_of_sql(tmp_path, value):
    """A group value holding a backslash (or a regex group reference) selects its own rows in ``sql`` as in
    a query form: the same values and shifts as ``mean(x)`` per group."""
    path = tmp_path / "panel.parquet"
    random_panel(5).with_columns(
        x=pl.when(pl.col("db") == 1).then(pl.col("w") * 3).otherwise(pl.col("x")),
        region=(pl.col("id") % 3).replace_strict({0: value, 1: "b", 2: "c"}),
    ).write_parquet(path)
    options = dict(id="id", by="db", group_by="region")
    a = read_grouped(str(path), query="mean(x)", **options)
    b = read_grouped(str(path), sql="SELECT avg(x) FROM db", **options)
    assert b.groups == a.groups == sorted([value, "b", "c"])
    np.testing.assert_allclose(b.q, a.q, rtol=1e-12)
    for g in range(3):
        np.testing.assert_allclose(b.stack(a.rows[g], [g])[:, :, 0], a.shifts[g], rtol=1e-12, atol=1e-12)
