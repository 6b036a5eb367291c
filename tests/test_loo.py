"""Leave-one-out values equal re-running the query without the individual (DuckDB)."""

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import random_panel

from empdp.errors import InputError
from empdp.loo import leave_one_out
from empdp.query import parse_query
from empdp.settings import Model

FORMS = [
    ("count(*)", "count(*)"),
    ("sum(x)", "sum(x)"),
    ("mean(x)", "avg(x)"),
    ("var(x)", "var_samp(x)"),
    ("std(x)", "stddev_samp(x)"),
    ("sum(x)/sum(w)", "sum(x)/sum(w)"),
    ("min(x)", "min(x)"),
    ("max(x)", "max(x)"),
    ("median(x)", "median(x)"),
    ("quantile(x, 0.3)", "quantile_cont(x, 0.3)"),
    ("quantile(x, 0.9)", "quantile_cont(x, 0.9)"),
]


def check_against_duckdb(df, result, ref_expr, where=None):
    con = duckdb.connect()
    con.register("t", df)
    cond = f" AND ({where})" if where else ""
    n_checked = 0
    for a, ident in enumerate(result.ids.to_list()):
        for j, label in enumerate(result.labels):
            full = con.execute(f"SELECT {ref_expr} FROM t WHERE year = ?{cond}", [label]).fetchall()[0][0]
            loo, rest = con.execute(f"SELECT {ref_expr}, count(*) FROM t WHERE year = ? AND id <> ?{cond}",
                                    [label, ident]).fetchall()[0]
            assert result.q[j] == pytest.approx(full, rel=1e-12, abs=1e-12)
            present = con.execute(f"SELECT count(*) FROM t WHERE year = ? AND id = ?{cond}",
                                  [label, ident]).fetchall()[0][0] > 0
            assert result.present[a, j] == present
            if not present:
                assert result.shifts[a, j] == 0.0
                continue
            if rest == 0 or loo is None:
                assert result.undefined[a], (ident, label)
                continue
            assert result.shifts[a, j] == pytest.approx(full - loo, rel=1e-9, abs=1e-12)
            n_checked += 1
    return n_checked


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [True, False])
@pytest.mark.parametrize("expr,ref", FORMS)
def test_named_forms_match_requery(expr, ref, seed, ties):
    df = random_panel(seed, ties=ties)
    result = leave_one_out(df, id="id", by="year", query=expr)
    assert check_against_duckdb(df, result, ref) > 20
    # the sole contributor of the last database is flagged, never dropped
    solo = result.ids.to_list().index("solo")
    assert result.undefined[solo]


def check_against_pandas(df, result, fn):
    """Compare every q_j, presence flag and Δ_ij with a brute-force loop: ``fn(rows)`` is the query
    on a pandas frame (None where undefined), run on each database with and without each id. A
    database left with no row is undefined for every form (a sole contributor, docs/method.md#1-data-model).
    Returns the number of defined Δ_ij compared."""
    n_checked = 0
    for a, ident in enumerate(result.ids.to_list()):
        undefined = False
        for j, label in enumerate(result.labels):
            rows = df[df["year"] == label]
            full, mine = fn(rows), rows["id"] == ident
            assert full is not None and result.q[j] == pytest.approx(full, rel=1e-12, abs=1e-12)
            assert result.present[a, j] == mine.any(), (ident, label)
            if not mine.any():
                assert result.shifts[a, j] == 0.0
                continue
            loo = fn(rows[~mine]) if (~mine).any() else None
            if loo is None:
                undefined = True
                assert result.shifts[a, j] == 0.0
                continue
            assert result.shifts[a, j] == pytest.approx(full - loo, rel=1e-9, abs=1e-12), (ident, label)
            n_checked += 1
        assert result.undefined[a] == undefined, ident
    return n_checked


BRUTE_FORCE = {
    "mean(x)": lambda d: d["x"].mean() if len(d) else None,
    "count(*)": lambda d: float(len(d)),
    "median(x)": lambda d: d["x"].median() if len(d) else None,  # linear interpolation, as quantile_cont
}


@pytest.mark.parametrize("seed", [3, 5])
@pytest.mark.parametrize("expr", sorted(BRUTE_FORCE))
def test_where_filter(expr, seed):
    """--where keeps only the rows that pass it, for the query and for every leave-one-out value."""
    df = random_panel(seed)
    result = leave_one_out(df, id="id", by="year", query=expr, where="flag = 1")
    kept = df[df["flag"] == 1]
    assert result.ids.to_list() == sorted(kept["id"].unique())  # ids with no kept row are not individuals
    assert check_against_pandas(kept, result, BRUTE_FORCE[expr]) > 20
    assert result.undefined[result.ids.to_list().index("solo")]  # their one kept row is all of 2005


def _weighted_per_id(d):
    """``SELECT sum(x * w) / count(DISTINCT id) FROM db WHERE w > 0.6`` in pandas (None when NULL)."""
    d = d[d["w"] > 0.6]
    return float((d["x"] * d["w"]).sum() / d["id"].nunique()) if len(d) else None


@pytest.mark.parametrize("seed", [4, 6])
def test_generic_sql_matches_requery(seed):
    df = random_panel(seed)
    result = leave_one_out(df, id="id", by="year", sql="SELECT sum(x * w) / count(DISTINCT id) FROM db WHERE w > 0.6")
    assert check_against_pandas(df, result, _weighted_per_id) > 20
    assert result.undefined[result.ids.to_list().index("solo")]


def test_absent_everywhere_has_no_shift():
    df = random_panel(5)
    result = leave_one_out(df, id="id", by="year", query="mean(x)", where="id <> 'id 3'")
    assert "id 3" not in result.ids.to_list()


def test_large_mean_is_numerically_stable():
    rng = np.random.default_rng(0)
    import pandas as pd

    n = 2000
    df = pd.DataFrame({"id": np.tile(np.arange(n), 3), "year": np.repeat([1, 2, 3], n),
                       "x": 1e9 + rng.normal(size=3 * n)})
    r = leave_one_out(df, id="id", by="year", query="var(x)")
    x = df[df.year == 1].x.to_numpy() - 1e9  # exact (Sterbenz), so the reference is accurate
    loo = np.var(np.delete(x, 7), ddof=1)
    assert r.shifts[7, 0] == pytest.approx(np.var(x, ddof=1) - loo, rel=1e-6)


@pytest.mark.parametrize("bad", ["avg(x", "foo(x)", "sum(*)", "quantile(x)", "quantile(x, 2)", "mean(x, 0.5)"])
def test_unparseable_queries(bad):
    with pytest.raises(InputError):
        parse_query(bad)


def test_quoted_column_names():
    q = parse_query('sum("my ""odd"" col") / sum("other col")')
    assert q.form == "ratio" and q.columns == ('my "odd" col', "other col")


@pytest.mark.parametrize("expr", ["count(*)", "mean(x)", "var(x)", "sum(x)/sum(w)"])
def test_engine_dense_rows_match_leave_one_out(expr):
    """The streamed dense rows (the assess path) equal the long-form rows, in any requested order."""
    from empdp.loo import make_engine

    df = random_panel(4)
    full = leave_one_out(df, id="id", by="year", query=expr)
    engine = make_engine(df, id="id", by="year", query=expr)
    engine.values()
    engine.screen(np.ones(len(full.labels)))
    codes = np.random.default_rng(0).permutation(len(full.ids))[:9]
    assert engine.holds_all_shifts  # small: screen() kept the matrix
    got = engine.shifts(codes)
    # the long-form path leave_one_out uses (its own GROUP BY: sums may differ in the last bit)
    want, _ = engine.shifts(codes, presence=True)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    defined = ~full.undefined[codes]
    np.testing.assert_allclose(got[defined], full.shifts[codes][defined], rtol=1e-13, atol=1e-15)
    assert np.any(got != 0)


@pytest.mark.parametrize("expr", ["count(*)", "sum(x)", "mean(x)", "std(x)", "sum(x)/sum(w)"])
def test_screen_from_the_held_matrix_equals_the_sql_screen(expr, monkeypatch):
    """Below DENSE_CELLS, screen() keeps every Δ row and computes the table in numpy; above it,
    DuckDB aggregates per individual and rows are fetched on demand. Both give the same answers."""
    from empdp.loo import decomposable, make_engine

    df = random_panel(7)
    scale = np.linspace(0.5, 2.0, df["year"].nunique())
    held = make_engine(df, id="id", by="year", query=expr)
    held.values()
    a = held.screen(scale)
    monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    fetched = make_engine(df, id="id", by="year", query=expr)
    fetched.values()
    b = fetched.screen(scale)
    assert held.holds_all_shifts and not fetched.holds_all_shifts
    assert a.ids.to_list() == b.ids.to_list() and a.ids.name == "id"
    np.testing.assert_array_equal(a.n_present, b.n_present)
    np.testing.assert_array_equal(a.undefined, b.undefined)
    assert a.undefined.any()  # the sole contributor
    np.testing.assert_allclose(a.max_abs_shift, b.max_abs_shift, rtol=1e-13)
    np.testing.assert_allclose(a.bound, b.bound, rtol=1e-13)
    codes = np.arange(len(a))[::-1]
    np.testing.assert_allclose(held.shifts(codes), fetched.shifts(codes), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("scales", ["one", "several"])
def test_the_sql_screen_bound_is_the_largest_shift_over_its_scale_to_the_bit(scales, monkeypatch):
    """With one scale (the default model) the Δ table's screen divides the largest |Δ_ij| once instead
    of joining every row to its database's scale: the same number as DuckDB's max(|Δ_ij| / b_j), bit for
    bit (division is monotone and correctly rounded)."""
    from empdp.loo import decomposable, make_engine

    df = random_panel(11)
    n = df["year"].nunique()
    scale = np.full(n, 0.37) if scales == "one" else np.linspace(0.3, 1.7, n)
    monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    engine = make_engine(df, id="id", by="year", query="mean(x)")
    engine.values()
    got = engine.screen(scale)
    engine.panel.temp_table("__s", pa.table({"__j": pa.array(np.arange(n, dtype=np.int32)), "s": pa.array(scale)}))
    want = engine.panel.arrow(f"SELECT c.__code, coalesce(max(abs(d.delta) / s.s) FILTER (WHERE NOT d.undef), 0) AS b "
                              f"FROM {engine._table} d JOIN __s s USING (__j) JOIN __ids c USING (__i) "
                              f"GROUP BY c.__code ORDER BY c.__code")
    assert np.any(got.bound > 0)
    np.testing.assert_array_equal(got.bound, want.column("b").to_numpy())


def test_fetched_rows_come_from_the_table_the_screen_made(tmp_path, monkeypatch):
    """Above DENSE_CELLS the screen makes the Δ table once, and every later fetch (rows, rows with
    their presence) reads it: the file is not aggregated again (at 10^8 rows each fetch repeated the
    GROUP BY of every row), so the rows come back even once the file is gone."""
    from empdp.loo import decomposable, make_engine

    df = random_panel(5)
    path = tmp_path / "panel.parquet"
    df.to_parquet(path)
    scale = np.ones(df["year"].nunique())
    held = make_engine(df, id="id", by="year", query="std(x)")
    held.values()
    held.screen(scale)
    monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    fetched = make_engine(str(path), id="id", by="year", query="std(x)")
    fetched.values()
    fetched.screen(scale)
    path.unlink()
    codes = np.arange(df["id"].nunique())[::-2]
    np.testing.assert_allclose(fetched.shifts(codes), held.shifts(codes), rtol=1e-13, atol=1e-15)
    rows, present = fetched.shifts(codes, presence=True)
    np.testing.assert_allclose(rows, held.shifts(codes), rtol=1e-13, atol=1e-15)
    assert present.any() and not present.all()


def _one_row_per_pair(seed: int, second: bool = False) -> pd.DataFrame:
    """random_panel with one row per (individual, database): NULL values, a −0.0 and the sole
    contributor kept (with ``second``, a second individual beside it: a variance needs two rows)."""
    df = random_panel(seed, ties=False).drop_duplicates(["id", "year"]).reset_index(drop=True)
    df.loc[[1, 4], "x"] = np.nan
    df.loc[2, "x"] = -0.0
    if second:
        df.loc[len(df)] = ["second", df["year"].max(), 4.0, 1.0, 1]
    return df


def _fetching_engine(df, expr: str, scale, tables: list):
    """An engine screened as a table too large to hold is (rows fetched on demand); ``tables``
    gets the temp tables the screen made."""
    from empdp.loo import make_engine

    engine = make_engine(df, id="id", by="year", query=expr)
    engine.values()
    screen = engine.screen(scale)
    tables.extend(r[0] for r in engine.panel.fetchall("SELECT table_name FROM duckdb_tables() WHERE temporary"))
    return engine, screen


def _spy_reads(monkeypatch) -> list:
    """The moments of each dense read (read_dense) and whether it gave the matrix."""
    from empdp.loo import decomposable

    reads, read = [], decomposable.read_dense

    def spied(*a, **k):
        got = read(*a, **k)
        reads.append((k.get("moments", decomposable.GROUPED), got is not None))
        return got
    monkeypatch.setattr(decomposable, "read_dense", spied)
    return reads


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("expr", ["count(*)", "count(x)", "sum(x)", "mean(x)", "var(x)", "std(x)", "sum(x)/sum(w)"])
def test_rows_that_are_pairs_give_their_own_shifts_to_the_bit(expr, held, monkeypatch):
    """Where the table's rows are its (individual, database) pairs, each row's Δ_ij comes from the
    row itself: a table too large to hold makes no Δ table (no GROUP BY of 10^8 groups, spilled,
    then scanned again by every fetch), and one held in memory is streamed without the GROUP BY.
    Screening and shifts equal those of the grouped Δ_ij bit for bit."""
    from empdp.loo import decomposable

    df = _one_row_per_pair(3, second=expr[:3] in ("var", "std"))
    scale = np.linspace(0.5, 2.0, df["year"].nunique())
    if not held:
        monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    reads = _spy_reads(monkeypatch)
    made_rows, made_grouped = [], []
    rows, a = _fetching_engine(df, expr, scale, made_rows)
    monkeypatch.setattr(decomposable, "UNIQUE_PAIRS", float("inf"))  # as if the estimate saw duplicates
    grouped, b = _fetching_engine(df, expr, scale, made_grouped)
    assert rows.holds_all_shifts == grouped.holds_all_shifts == held
    if held:
        assert reads == [(decomposable.ROW, True), (decomposable.GROUPED, True)]
    else:
        assert "__delta" not in made_rows and "__delta" in made_grouped
    assert a.ids.to_list() == b.ids.to_list()
    for field in ("n_present", "undefined", "max_abs_shift", "bound"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.undefined.any() and (a.max_abs_shift > 0).any()
    codes = np.arange(len(a))[::-1]
    np.testing.assert_array_equal(rows.shifts(codes), grouped.shifts(codes))
    for x, y in zip(rows.shifts(codes, presence=True), grouped.shifts(codes, presence=True)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("held", [False, True])
def test_rows_sharing_a_database_are_grouped_though_the_estimate_missed_them(held, monkeypatch):
    """The screening (or the dense read) checks exactly that no individual has two rows in one
    database: where the estimate of the pairs let a table with such rows through, the Δ_ij are
    grouped and the answers are those of the grouped path."""
    from empdp.loo import decomposable

    df = random_panel(8, ties=False)  # individuals with up to three rows in a database
    scale = np.ones(df["year"].nunique())
    if not held:
        monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    reads = _spy_reads(monkeypatch)
    monkeypatch.setattr(decomposable, "UNIQUE_PAIRS", 0.0)  # the estimate lets every table through
    made = []
    engine, a = _fetching_engine(df, "mean(x)", scale, made)
    if held:
        assert reads == [(decomposable.ROW, False), (decomposable.GROUPED, True)]
    else:
        assert "__delta" in made
    monkeypatch.setattr(decomposable, "UNIQUE_PAIRS", float("inf"))
    grouped, b = _fetching_engine(df, "mean(x)", scale, [])
    np.testing.assert_array_equal(a.n_present, b.n_present)
    np.testing.assert_array_equal(a.max_abs_shift, b.max_abs_shift)
    codes = np.arange(len(a))
    np.testing.assert_array_equal(engine.shifts(codes), grouped.shifts(codes))


def test_low_memory_limit_does_not_hold_the_matrix(monkeypatch):
    """A third of DuckDB's memory limit caps the held matrix (a low --memory-limit stays low)."""
    from empdp.loo import make_engine

    df = random_panel(1)
    n = df["year"].nunique()
    engine = make_engine(df, id="id", by="year", query="mean(x)", memory_limit="64MB")
    assert 60e6 < engine.memory_limit_bytes() <= 64e6  # DuckDB reports '61.0 MiB'
    engine.values()
    m = df["id"].nunique()
    # just too small for the m × n doubles (8 bytes each) in a third of the limit
    monkeypatch.setattr(engine, "memory_limit_bytes", lambda: 24 * m * n - 1)
    engine.screen(np.ones(n))
    assert not engine.holds_all_shifts
    assert engine.shifts(np.array([0, 1])).shape == (2, n)
    monkeypatch.setattr(engine, "memory_limit_bytes", lambda: 24 * m * n)
    engine.screen(np.ones(n))
    assert engine.holds_all_shifts


def test_assessment_does_not_keep_the_held_matrix():
    """assess() evaluates from the held matrix, then drops it: the result (which keeps the engine
    for shifts_of) does not hold 8 bytes per cell, and shifts_of fetches the same rows."""
    from empdp.assessment import assess

    df = random_panel(3, ties=False)
    full = leave_one_out(df, id="id", by="year", query="mean(x)")
    a = assess(df, id="id", by="year", query="mean(x)", epsilon=[0.1], model=Model(kernel="laplace", bandwidth=0.5))
    assert not a.engine.holds_all_shifts
    ids = full.ids.to_list()[:4]
    defined = ~full.undefined[:4]
    np.testing.assert_allclose(a.shifts_of(ids)[defined], full.shifts[:4][defined], rtol=1e-13, atol=1e-15)


def test_streamed_batches_arrive_whole_and_in_order_with_prefetch():
    """The background thread that pulls DuckDB's batches ahead hands over every row, in order;
    a consumer that stops early ends it; an error in the query reaches the consumer."""
    from empdp.data import arrow_batches

    con = duckdb.connect()
    sql = "SELECT range AS v FROM range(10000)"
    for prefetch in (0, 1, 3):
        got = np.concatenate([b.column(0).to_numpy() for b in arrow_batches(con, sql, rows=1000, prefetch=prefetch)])
        np.testing.assert_array_equal(got, np.arange(10000))
    stream = arrow_batches(con, sql, rows=100, prefetch=2)
    first = next(stream)
    stream.close()  # returns once the thread has stopped: the connection is free again
    assert first.num_rows == 100
    assert con.execute("SELECT 41 + 1").fetchall() == [(42,)]
    bad = "SELECT CASE WHEN range < 5000 THEN range ELSE error('boom at ' || range) END AS v FROM range(10000)"
    raised = []
    for prefetch in (0, 2):  # the same error as without the thread (Arrow's reader wraps DuckDB's)
        with pytest.raises(Exception, match="boom") as info:
            for _ in arrow_batches(con, bad, rows=100, prefetch=prefetch):
                pass
        raised.append(type(info.value))
    assert raised[0] is raised[1]


@pytest.mark.parametrize("query", ["mean(x)", "sum(x)/sum(w)", "median(x)"])
def test_database_labels_of_any_type_give_the_same_results(query):
    """Integer labels map to database indices by an offset (contiguous) or a list lookup (gaps),
    other types by a join: the same data under each labelling gives the same values, in label order."""
    from empdp.data import open_panel

    df = random_panel(3)
    years = sorted(df["year"].unique())
    relabel = {
        "contiguous": (dict(zip(years, years)), True),
        "gaps": (dict(zip(years, [-7, 0, 3, 40, 41, 900][:len(years)])), True),
        "wide": (dict(zip(years, [10**9 + 10**5 * k ** 2 for k in range(len(years))])), False),
        "text": (dict(zip(years, [f"db{y}" for y in years])), False),
        "date": (dict(zip(years, pd.to_datetime([f"{y}-03-01" for y in years]).date)), False),
    }
    ref = None
    for name, (mapping, fast) in relabel.items():
        d = df.assign(year=df["year"].map(mapping))
        assert (open_panel(d, id="id", by="year").label_index is not None) == fast, name
        r = leave_one_out(d, id="id", by="year", query=query)
        if ref is None:
            ref = r
            continue
        np.testing.assert_array_equal(r.q, ref.q, err_msg=name)
        np.testing.assert_array_equal(r.shifts, ref.shifts, err_msg=name)


# ----------------------------------------------------- overflow (issue 23, item 7)

def _huge_panel(scale):
    rows = [(f"i{i}", y, scale * (0.5 + 0.05 * i) * (1 if y % 2 else 0.9)) for y in range(2000, 2006)
            for i in range(10)]
    return pd.DataFrame(rows, columns=["id", "year", "x"])


@pytest.mark.parametrize("expr", ["mean(x)", "sum(x)", "var(x)", "std(x)", "median(x)", "max(x)",
                                  "sum(x)/sum(x)", "quantile(x, 0.3)"])
def test_values_near_the_largest_double_are_refused_without_warnings(expr):
    """Values near 1e308 overflowed into NumPy warning dumps, then 'all databases give the same
    query value' (mean, sum, var) or a NaN delta with exit 0 (median)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any RuntimeWarning fails the test
        with pytest.raises(InputError, match=r"overflows: .* database 2000 .*rescale 'x'"):
            leave_one_out(_huge_panel(1.7e308), id="id", by="year", query=expr)


def test_overflowing_shifts_are_refused_and_name_the_individual():
    """Values that cancel in the query (q small) still give shifts beyond double precision."""
    df = _huge_panel(1.0)
    df.loc[(df["id"] == "i3"), "x"] = 1e160
    df.loc[(df["id"] == "i4"), "x"] = -1e160
    with pytest.raises(InputError, match=r"largest leave-one-out shift on individual 'i3' \(and 1 more\)"):
        leave_one_out(df, id="id", by="year", query="sum(x)")


def test_cli_refuses_overflow_in_one_line(tmp_path):
    from click.testing import CliRunner

    from empdp.cli.main import cli

    path = tmp_path / "big.parquet"
    _huge_panel(1.7e308).to_parquet(path)
    res = CliRunner().invoke(cli, ["assess", str(path), "--id", "id", "--by", "year", "--query", "median(x)",
                                   "-e", "1"])
    assert res.exit_code == 2 and res.output.startswith("Error: ") and res.output.count("\n") == 1, res.output


def test_every_query_form_has_one_engine_and_each_decomposable_form_one_table_entry():
    from empdp import query
    from empdp.loo import ENGINES, DecomposableEngine
    from empdp.loo.forms import FORMS as TABLE

    assert set(ENGINES) == set(query.FORMS)
    assert set(TABLE) == set(query.DECOMPOSABLE) == {f for f, e in ENGINES.items() if e is DecomposableEngine}


@pytest.mark.parametrize("pairs", [True, False])
def test_the_rows_fetched_at_once_stay_within_a_sixth_of_the_memory_limit(pairs, monkeypatch, sample_path):
    """At 10^8 rows one fetch of every shift row (0.8 GB) came on top of DuckDB's whole share and
    the assessment peaked at 3.4 GB: each fetch now holds at most a sixth of the limit, from the
    table's own rows (its pairs) or from a spilled Δ table. (A third from the table's own rows,
    where DuckDB keeps no table, was no faster at 10^8 rows, measured quietly: 30.1 and 32.7 s
    against 33.2 and 31.2 s, 1.3 GB against 1.1 GB; a fetch's cost follows the individuals it asks
    for, its join's table.)"""
    from empdp.assessment import assess, evaluation
    from empdp.loo import decomposable

    class Limited:
        def __init__(self, limit):
            self.limit = limit

        def memory_limit_bytes(self):
            return self.limit

    assert evaluation.fetch_rows(Limited(10**9), 100) == 10**9 // 48 // 100
    assert evaluation.fetch_rows(Limited(10**12), 100) == evaluation.FETCH_CELLS // 100
    # no limit to read (Spark): the evaluation's default of 4 GB
    assert evaluation.fetch_rows(Limited(0), 100) == min(evaluation.FETCH_CELLS, evaluation.DEFAULT_MEMORY_LIMIT // 48) // 100
    assert evaluation.fetch_rows(Limited(64), 100) == 1
    monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    if not pairs:  # as if the estimate saw rows sharing a database: the Δ table is made
        monkeypatch.setattr(decomposable, "UNIQUE_PAIRS", float("inf"))
    sizes = []
    shifts = decomposable.DecomposableEngine.shifts

    def counted(self, codes, presence=False):
        out = shifts(self, codes, presence)
        sizes.append(out.nbytes)
        return out
    monkeypatch.setattr(decomposable.DecomposableEngine, "shifts", counted)
    held = []  # the rows held after each fetch: the search's and the δ stage's together stay within it
    prefetch = evaluation._ShiftCache.prefetch

    def holding(self, codes):
        prefetch(self, codes)
        held.append(sum(rows.nbytes for _, rows in self.parts))
    monkeypatch.setattr(evaluation._ShiftCache, "prefetch", holding)
    # DuckDB's smallest limit (16 MB) holds the sample's 2,197 × 17 cells (0.3 MB) many times: a
    # limit of 0.6 MB as the evaluation reads it, a sixth of it 0.1 MB, is three fetches or more
    monkeypatch.setattr(evaluation, "_memory_limit", lambda engine: 600_000)
    res = assess(sample_path, id="countyid", by="year", query="mean(murdrate)", exact_all=True)
    assert res.n_individuals == 2197 and len(sizes) >= 3
    assert max(sizes) <= 100_000 and 50_000 < max(held) <= 100_000


def test_each_row_is_fetched_once_when_the_search_and_the_delta_stage_share_the_cache(monkeypatch, sample_path):
    """A fetch scans the whole Δ table whatever it takes: the ε_all search fills the cache in its first
    fetch, and the δ stage starts with the rows held. At 10^8 rows (10^6 individuals, all at risk)
    a first fetch of 32,768 rows left the search two more scans, and the δ stage dropped the search's
    rows and made five, each ~4 s: here every individual's row is fetched once, in the fewest scans."""
    from empdp.assessment import assess, evaluation
    from empdp.loo import decomposable

    monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    monkeypatch.setattr(evaluation, "FETCH_CELLS", 500 * 17)  # 17 databases: 500 rows at once
    fetched = []
    shifts = decomposable.DecomposableEngine.shifts

    def counted(self, codes, presence=False):
        fetched.append(np.asarray(codes).copy())
        return shifts(self, codes, presence)
    monkeypatch.setattr(decomposable.DecomposableEngine, "shifts", counted)
    res = assess(sample_path, id="countyid", by="year", query="mean(murdrate)", exact_all=True)
    every = np.concatenate(fetched)
    assert res.n_individuals == 2197 and len(every) == len(np.unique(every)) == 2197
    assert len(fetched) == 5  # ⌈2,197 / 500⌉


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_assess_with_rows_fetched_in_small_chunks_equals_the_held_matrix(kernel, monkeypatch, sample_path):
    """An assessment whose Δ rows are fetched from the table (above DENSE_CELLS), through a shift cache
    of 40 rows (many fetches, parts, takes and drops), gives the results of the held matrix."""
    from empdp.assessment import assess, evaluation
    from empdp.loo import decomposable

    path = sample_path
    kw = dict(id="countyid", by="year", query="mean(murdrate)", model=Model(kernel=kernel), exact_all=True)
    held = assess(path, **kw)
    monkeypatch.setattr(decomposable, "DENSE_CELLS", 0)
    monkeypatch.setattr(evaluation, "FETCH_CELLS", 40 * 17)  # 17 databases: 40 rows
    fetches = []
    prefetch = evaluation._ShiftCache.prefetch

    def counted(self, codes):
        before = len(self.parts)
        prefetch(self, codes)
        fetches.append(len(self.parts) - before)
    monkeypatch.setattr(evaluation._ShiftCache, "prefetch", counted)
    fetched = assess(path, **kw)
    assert sum(fetches) > 20  # 2,197 individuals, 40 rows at a time
    a, b = held.individuals, fetched.individuals
    assert a.select("countyid", "n_databases", "max_abs_shift", "sole_contributor").equals(
        b.select("countyid", "n_databases", "max_abs_shift", "sole_contributor"))
    # the screening bound M_i comes from DuckDB's max(|Δ| / b) there, from numpy's max(|Δ|) · (1 / b) here;
    # Gaussian rows are evaluated on their block's grid and certificate, and blocks follow the fetches
    exact = kernel == "laplace"
    np.testing.assert_allclose(a["eps_bound"], b["eps_bound"], rtol=1e-15 if exact else 1e-12)
    np.testing.assert_allclose(a["eps_i"], b["eps_i"], rtol=0 if exact else 1e-9)
    np.testing.assert_allclose(a["delta"], b["delta"], rtol=0, atol=0 if exact else 1e-14)
    np.testing.assert_allclose(held.total_risk, fetched.total_risk, rtol=0, atol=0 if exact else 1e-14)

