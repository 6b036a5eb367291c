"""Joint and grouped statistics on the Spark engine (issue 37, item 6): read_joint and read_grouped
through ``Spark()`` give DuckDB's panels (the same labels, names, ids in the same order, sole
contributors and presence; values and shifts within 1e-9 relative), from a path, a catalog table and
the county sample; bad input on Spark is one line naming the parameter.

Every case is read once by both engines in a module fixture (Spark jobs from four threads at once:
on two cores a job costs mostly driver latency), and the tests compare.
"""

from __future__ import annotations

import os
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
import pytest

pytest.importorskip("pyspark", reason="the Spark engine needs PySpark: pip install 'empdp[spark]'")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("the Spark engine needs Java (a JRE 17) on PATH or JAVA_HOME", allow_module_level=True)

from conftest import local_spark  # noqa: E402
from test_joint_read import WHERE, random_panel  # noqa: E402

from empdp.engines import Spark  # noqa: E402
from empdp.errors import InputError  # noqa: E402
from empdp.loo.joint import read_grouped, read_joint  # noqa: E402
from empdp.spark import make_spark_engine, open_spark_source  # noqa: E402

RTOL = 1e-9
#: name → (panel, read_joint keywords): decomposable pairs and triples, one SQL of two columns, an order
#: statistic beside a mean, the county sample from its path
JOINT = {
    "two": ("seed1", dict(queries=["mean(x)", "var(y)"], where=WHERE)),
    "three": ("seed2", dict(queries=["count(*)", "sum(x)", "sum(y)/sum(w)"], where=WHERE)),
    "median-table": ("table", dict(queries=["quantile(x, 0.3)", "median(y)", "std(x)"], where=WHERE)),
    "sql": ("tiny", dict(sql="SELECT sum(x), avg(y) FROM db")),
    "sample": ("sample", dict(queries=["mean(murdrate)", "sum(murders)/sum(popul)"])),
}
#: name → (panel, read_grouped keywords): three groups, an order statistic, SQL, the sample's states
#: in three groups, group values that would end a quoted SQL string (in SQL, and from a catalog table)
GROUPED = {
    "mean": ("regions", dict(query="mean(x)", where="y > -6")),
    "median": ("regions", dict(query="median(y)")),
    "sql": ("tiny", dict(sql="SELECT avg(x) FROM db")),
    "sample": ("sample", dict(query="sum(murders)/sum(popul)")),
    "quotes-table": ("table-quoted", dict(query="var(x)", where="y > -6")),
}
KEYS = {"sample": ("countyid", "year")}


@pytest.fixture(scope="module")
def spark():
    yield from local_spark()


def _regions(frame: pl.DataFrame) -> pl.DataFrame:
    """Three groups by id, x in database 1 for every group (so that each group's mean(x) is defined)."""
    return frame.with_columns(x=pl.when(pl.col("db") == 1).then(pl.col("w") * 3).otherwise(pl.col("x")),
                              region=pl.col("id") % 3)


def _tiny() -> pl.DataFrame:
    """6 individuals in 3 databases, 1-2 rows each, no NULLs: generic SQL on Spark runs per database (and,
    where Spark cannot decorrelate it, per individual)."""
    rng = np.random.default_rng(11)
    rows = [(i, j, float(rng.normal(10, 3)), float(rng.normal(-2, 5)), float(rng.uniform(1, 2)))
            for i in range(6) for j in range(3) for _ in range(1 + (i + j) % 2)]
    return pl.DataFrame(rows, schema=["id", "db", "x", "y", "w"], orient="row")


#: group values that end a quoted SQL string early: a quote, a backslash
HOSTILE = ["back\\slash", "it's", "x' OR '1'='1"]


def _hostile(group: pl.Expr) -> pl.Expr:
    """Groups 0, 1, 2 named by :data:`HOSTILE` values."""
    return group.replace_strict(dict(enumerate(HOSTILE)))


@pytest.fixture(scope="module")
def panels(spark, sample_path, tmp_path_factory):
    """name → (DuckDB source, Spark source, Spark engine object, id, by); file panels are read from the
    same Parquet file by both engines (NULLs stay NULL), ``table*`` from a catalog table on Spark."""
    folder = tmp_path_factory.mktemp("spark_joint")
    frames = {
        "seed1": random_panel(1), "seed2": random_panel(2), "seed3": random_panel(3),
        "tiny": _tiny().with_columns(region=_hostile(pl.col("id") % 3)), "regions": _regions(random_panel(5)),
        "sample": pl.read_parquet(sample_path).filter(pl.col("year") < 1984).with_columns(
            region=pl.col("statefips") % 3),
        "quoted": _regions(random_panel(6)).with_columns(region=_hostile(pl.col("region"))),
    }
    out = {}
    for name, frame in frames.items():
        path = str(folder / f"{name}.parquet")
        frame.write_parquet(path)
        out[name] = (path, path, Spark(), *KEYS.get(name, ("id", "db")))
    views = {"table": ("seed3", "empdp_joint"), "table-quoted": ("quoted", "empdp_joint_quoted")}
    for name, (frame, view) in views.items():
        spark.read.parquet(out[frame][0]).createOrReplaceGlobalTempView(view)
        out[name] = (out[frame][0], None, Spark(table=f"global_temp.{view}"), "id", "db")
    yield out
    for _, view in views.values():
        spark.catalog.dropGlobalTempView(view)


def _both(read, panels, name, options):
    """(DuckDB's panel, Spark's panel) of one case."""
    local, remote, engine, id_, by = panels[name]
    return (read(local, id=id_, by=by, **options),
            read(remote, id=id_, by=by, engine=engine, **options))


@pytest.fixture(scope="module")
def computed(panels):
    jobs = {("joint", k): (read_joint, *v) for k, v in JOINT.items()}
    jobs |= {("grouped", k): (read_grouped, name, {"group_by": "region", **options})
             for k, (name, options) in GROUPED.items()}
    with ThreadPoolExecutor(4) as pool:
        futures = {key: pool.submit(_both, read, panels, name, options) for key, (read, name, options) in jobs.items()}
        return {key: fut.result() for key, fut in futures.items()}


def _close(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=RTOL * max(1.0, float(np.abs(a).max(initial=0.0))) * 1e-3)


def _same_statistics(a, b):
    """The fields every panel has: labels, names, ids in order, values, sole contributors, presence."""
    assert b.labels == a.labels and b.names == a.names
    assert b.ids.to_list() == a.ids.to_list() and b.ids.dtype == a.ids.dtype
    _close(a.q, b.q)
    np.testing.assert_array_equal(b.sole, a.sole)
    np.testing.assert_array_equal(b.present, a.present)


@pytest.mark.parametrize("case", list(JOINT))
def test_joint_panel_on_spark_equals_duckdb(computed, case):
    a, b = computed[("joint", case)]
    _same_statistics(a, b)
    assert b.shifts.shape == a.shifts.shape and a.shifts.any(axis=(0, 1)).all()
    _close(a.shifts, b.shifts)
    if case in ("two", "median-table"):  # the designed cases: a sole contributor, a filtered-out individual
        ids = a.ids.to_list()
        assert b.sole[ids.index(3)] and 39 not in ids


@pytest.mark.parametrize("case", list(GROUPED))
def test_grouped_panel_on_spark_equals_duckdb(computed, case):
    a, b = computed[("grouped", case)]
    _same_statistics(a, b)
    assert b.groups == a.groups and b.group_by == a.group_by and a.n_groups == 3
    np.testing.assert_array_equal(b.touched, a.touched)
    for g in range(a.n_groups):
        np.testing.assert_array_equal(b.rows[g], a.rows[g])
        _close(a.shifts[g], b.shifts[g])
        assert a.shifts[g].any()
    assert (a.present < len(a.labels)).any() or case in ("sql", "sample")  # some individuals are absent


@pytest.mark.parametrize("case", ["sql", "quotes-table"])
def test_quoted_group_values_are_read_as_values(computed, case):
    """Group values holding quotes and a backslash select their own rows on Spark (a Column filter; in
    SQL, the text in hexadecimal): each group's values are its own, not another group's or every row's."""
    a, b = computed[("grouped", case)]
    assert b.groups == HOSTILE
    assert len({tuple(np.round(b.q[:, g], 9)) for g in range(3)}) == 3


def _one_line(exc, *fragments, param="where"):
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text, text
    for fragment in fragments:
        assert fragment in text, text
    assert param in exc.value.param, exc.value.param


@pytest.fixture(scope="module")
def bad_panel(panels, tmp_path_factory):
    """The regions panel with NULL groups in database 2, group 2 absent from database 4, a map column and
    NaN in z (on rows with y > 0)."""
    frame = _regions(random_panel(5))
    frame = frame.with_columns(
        hole=pl.when((pl.col("db") == 4) & (pl.col("region") == 2)).then(pl.lit(None)).otherwise(pl.col("region")),
        nulls=pl.when(pl.col("db") == 2).then(pl.lit(None)).otherwise(pl.col("region")),
        z=pl.when(pl.col("y") > 0).then(float("nan")).otherwise(pl.col("w")))
    path = str(tmp_path_factory.mktemp("spark_joint_bad") / "bad.parquet")
    frame.write_parquet(path)
    return path


@pytest.mark.parametrize("options,fragments,as_duckdb", [
    (dict(group_by="nulls"), ("rows have a NULL group in column 'nulls'", "filter them out with `where`"), True),
    (dict(group_by="hole", where="hole IS NOT NULL"),
     ("group 2 of column 'hole' has no rows in database 4 that `where` keeps",), True),
    (dict(group_by="region", where="nope > 1"), ("`where`", "nope"), False),
    (dict(group_by="region", query="mean(z)"), ("column 'z' has", "NaN"), False),
])
def test_bad_grouped_input_on_spark_is_one_line(spark, bad_panel, options, fragments, as_duckdb):
    """A NULL group, a group missing from a database, a bad filter, NaN values: one line naming `where`
    (the same line as DuckDB's for the groups)."""
    options = {"query": "mean(x)", **options}
    with pytest.raises(InputError) as exc:
        read_grouped(bad_panel, id="id", by="db", engine=Spark(), **options)
    _one_line(exc, *fragments)
    if as_duckdb:
        with pytest.raises(InputError) as local:
            read_grouped(bad_panel, id="id", by="db", **options)
        assert str(local.value) == str(exc.value) and local.value.param == exc.value.param


def test_nan_in_any_statistic_of_a_joint_query_is_refused_on_spark(spark, bad_panel):
    """The shared panel checks every statistic's columns in its one scan: the second one's NaN too."""
    with pytest.raises(InputError) as exc:
        read_joint(bad_panel, id="id", by="db", queries=["mean(x)", "mean(z)"], engine=Spark())
    _one_line(exc, "column 'z' has", "NaN")
    # rows the filter removes are never read
    read_joint(bad_panel, id="id", by="db", queries=["mean(x)", "mean(z)"], where="y <= 0", engine="spark")


def test_an_engine_on_a_shared_panel_checks_the_columns_the_panel_did_not(spark, bad_panel):
    """make_spark_engine(panel=...) is refused like a fresh engine when its columns were not checked
    as the panel opened (another column, or the same column under another filter)."""
    panel = open_spark_source(bad_panel, id="id", by="db", columns=["x"])
    for options in (dict(query="mean(z)"), dict(query="mean(z)", where="y > -100")):
        with pytest.raises(InputError) as exc:
            make_spark_engine(bad_panel, id="id", by="db", panel=panel, **options)
        _one_line(exc, "column 'z' has", "NaN")
    assert make_spark_engine(bad_panel, id="id", by="db", panel=panel, query="mean(z)", where="y <= 0").values().size


def test_a_map_group_column_is_one_line(spark):
    frame = spark.createDataFrame([(i, j, float(i + j), {"k": i % 2}) for i in range(4) for j in range(3)],
                                  "id long, db long, x double, m map<string,long>")
    with pytest.raises(InputError) as exc:
        read_grouped(frame, id="id", by="db", group_by="m", query="mean(x)", engine=Spark())
    _one_line(exc, "`group_by` column 'm' holds maps", param="group_by")


@pytest.mark.parametrize("kind", ["joint", "grouped"])
def test_assess_joint_and_grouped_on_spark_equal_duckdb(spark, panels, kind):
    """End to end: empdp.assess with Execution(engine=Spark()) gives the DuckDB assessment of a joint
    query and of grouped statistics (enabled once assess_joint / assess_grouped take the engine)."""
    from empdp import Execution, assess

    path = panels["regions"][0]
    options = (dict(query=["mean(x)", "median(y)"]) if kind == "joint" else dict(query="mean(x)", group_by="region"))
    a = assess(path, id="id", by="db", where="y > -6", epsilon=[0.5, 1.0], **options)
    b = assess(path, id="id", by="db", where="y > -6", epsilon=[0.5, 1.0], execution=Execution(engine=Spark()),
               **options)
    assert b.eps_all == pytest.approx(a.eps_all, rel=1e-6)
    np.testing.assert_allclose(b.total_risk, a.total_risk, rtol=1e-6, atol=1e-12)
    np.testing.assert_array_equal(b.n_at_risk, a.n_at_risk)
    assert b.riskiest(5)["id"].to_list() == a.riskiest(5)["id"].to_list()


def test_joint_calibration_and_release_values_on_spark_equal_duckdb(spark, panels, tmp_path):
    """A joint calibration on Spark is DuckDB's, and release reads its statistics on Spark (the command
    line's `release --engine spark` of a joint calibration)."""
    from empdp import Data, Execution, calibrate
    from empdp.noise.source import database_values

    path = panels["regions"][0]
    data = Data(path, id="id", by="db")
    options = dict(query=["mean(x)", "sum(y)"], where="y > -6", epsilon=2.0)
    with warnings.catch_warnings():  # few databases, a sole contributor: the panel's own warnings
        warnings.simplefilter("ignore", UserWarning)
        a = calibrate(data, **options)
        b = calibrate(data, execution=Execution(engine=Spark()), **options)
    na, nb = a.to_dict()["noise"], b.to_dict()["noise"]
    assert nb["kind"] == na["kind"] and b.to_dict()["t"] == pytest.approx(a.to_dict()["t"], rel=1e-6)
    np.testing.assert_allclose(nb["scales"], na["scales"], rtol=1e-6)
    db = str(pl.read_parquet(path)["db"].max())
    np.testing.assert_allclose(database_values(b, path, db, engine=Spark()), database_values(a, path, db),
                               rtol=1e-12)
