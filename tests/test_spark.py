"""The Spark engine gives the DuckDB engine's answers (1e-9 relative), in Spark local mode.

Every (data set, query) pair is computed once by both engines in a module fixture (Spark jobs
from four threads at once: on two cores a job costs ~0.5 s of driver latency, not work), and
the tests compare: database values, the screening table (ids, n_present, sole contributors,
max |Δ|, M_i) and the dense Δ rows and presence of every individual.
"""

from __future__ import annotations

import shutil
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("pyspark", reason="the Spark engine needs PySpark: pip install 'empdp[spark]'")
if not shutil.which("java"):
    import os

    if not os.environ.get("JAVA_HOME"):
        pytest.skip("the Spark engine needs Java (a JRE 17) on PATH or JAVA_HOME", allow_module_level=True)

from conftest import local_spark, random_panel  # noqa: E402

from empdp import risk  # noqa: E402
from empdp.density import select_density  # noqa: E402
from empdp.errors import InputError  # noqa: E402
from empdp.loo import make_engine  # noqa: E402
from empdp.settings import Execution, Model
from empdp.spark import evaluate_on_executors, make_spark_engine  # noqa: E402

RTOL = 1e-9
RANDOM_FORMS = ["count(*)", "sum(x)", "mean(x)", "var(x)", "std(x)", "sum(x)/sum(w)", "min(x)", "max(x)",
                "median(x)", "quantile(x, 0.3)", "quantile(x, 0.9)"]
SAMPLE_FORMS = ["count(*)", "sum(murdrate)", "mean(murdrate)", "var(murdrate)", "std(murdrate)",
                "sum(murders)/sum(popul)", "min(murdrate)", "max(murdrate)", "median(murdrate)",
                "quantile(murdrate, 0.9)"]
# (name, form, where): random panels with ties (seed 0) and without (seed 1), a filter, the sample;
# --sql (one correlated Spark SQL query per database) on a smaller panel
CASES = ([("random0", f, None) for f in RANDOM_FORMS]
         + [("random1", f, None) for f in ("var(x)", "median(x)", "quantile(x, 0.3)")]
         + [("random1", "mean(x)", "flag = 1"), ("random1", "median(x)", "flag = 1")]
         + [("sample", f, None) for f in SAMPLE_FORMS])
SQL = "SELECT avg(x) * count(*) FROM db WHERE w > 0.8"


@pytest.fixture(scope="module")
def spark():
    yield from local_spark()


@pytest.fixture(scope="module")
def sources(spark, sample_path):
    frames = {"random0": random_panel(0), "random1": random_panel(1, ties=False),
              "small": random_panel(3, n_db=2, n_ind=6)}
    out = {name: (df, spark.createDataFrame(df), "id", "year") for name, df in frames.items()}
    # the sample as a cached DataFrame: read once for its ten queries (paths are read in the tests below)
    out["sample"] = (sample_path, spark.read.parquet(sample_path).cache(), "countyid", "year")
    return out


def _both(sources, name, form=None, where=None, sql=None):
    """(DuckDB result, Spark result): values, screen and every individual's Δ row and presence."""
    local, remote, id_, by = sources[name]
    results = []
    for engine in (make_engine(local, id=id_, by=by, query=form, where=where, sql=sql),
                   make_spark_engine(remote, id=id_, by=by, query=form, where=where, sql=sql)):
        q = engine.values()
        scale = np.linspace(0.5, 2.0, len(q)) * (np.std(q) + 1.0)
        screen = engine.screen(scale)
        shifts, present = engine.shifts(np.arange(len(screen)), presence=True)
        results.append((q, screen, shifts, present, engine.n_null_values))
        engine.close()
    return results


@pytest.fixture(scope="module")
def computed(sources):
    jobs = {(name, form, where): (name, form, where, None) for name, form, where in CASES}
    jobs[("small", "sql", None)] = ("small", None, None, SQL)
    with ThreadPoolExecutor(4) as pool:
        futures = {key: pool.submit(_both, sources, *args) for key, args in jobs.items()}
        return {key: fut.result() for key, fut in futures.items()}


def _close(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=RTOL * max(1.0, float(np.abs(a).max(initial=0.0))) * 1e-3)


@pytest.mark.parametrize("case", CASES + [("small", "sql", None)],
                         ids=lambda c: f"{c[0]}-{c[1]}" + (f"-where-{c[2]}" if c[2] else ""))
def test_spark_equals_duckdb(computed, case):
    (q0, s0, d0, p0, nul0), (q1, s1, d1, p1, nul1) = computed[case]
    _close(q0, q1)
    assert s1.ids.to_list() == s0.ids.to_list()
    np.testing.assert_array_equal(s1.n_present, s0.n_present)
    np.testing.assert_array_equal(s1.undefined, s0.undefined)
    _close(s0.max_abs_shift, s1.max_abs_shift)
    _close(s0.bound, s1.bound)
    np.testing.assert_array_equal(p1, p0)
    _close(d0, d1)
    assert nul1 == nul0
    if case[0] == "random0" and case[2] is None:
        assert s1.undefined[s1.ids.to_list().index("solo")]  # the sole contributor is flagged, not dropped


def test_a_new_query_form_is_one_registry_entry_on_both_engines(spark, monkeypatch):
    """A decomposable form added once (its entry in loo.forms.FORMS and its name in query.py) runs on
    DuckDB and on Spark, and gives the values and shifts of the same statistic computed another way."""
    import pandas as pd

    from empdp import query
    from empdp.loo import forms

    abs_sum = forms.Form(lambda cols, m: [f"CAST({m.count(cols[0])} AS DOUBLE) AS c",
                                          f"coalesce({m.sum(f'abs(CAST({cols[0]} AS DOUBLE))')}, 0) AS s"],
                         lambda t: (t["s"], t["c"] > 0), "p.s", "t.c - p.c <= 0")
    monkeypatch.setitem(forms.FORMS, "abssum", abs_sum)
    monkeypatch.setattr(query, "DECOMPOSABLE", (*query.DECOMPOSABLE, "abssum"))
    monkeypatch.setattr(query, "FORMS", (*query.FORMS, "abssum"))
    rng = np.random.default_rng(4)
    df = pd.DataFrame({"id": rng.integers(0, 12, 90), "year": rng.integers(0, 5, 90), "x": rng.normal(size=90)})
    df["ax"] = df["x"].abs()
    reference = make_engine(df, id="id", by="year", query="sum(ax)")
    want_q = reference.values()
    want = reference.shifts(np.arange(len(reference.screen(np.ones(5)))))
    for engine in (make_engine(df, id="id", by="year", query="abssum(x)"),
                   make_spark_engine(spark.createDataFrame(df), id="id", by="year", query="abssum(x)")):
        np.testing.assert_allclose(engine.values(), want_q, rtol=1e-12)
        rows = np.arange(len(engine.screen(np.ones(5))))
        np.testing.assert_allclose(engine.shifts(rows), want, rtol=1e-12, atol=1e-15)
        engine.close()


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_executor_evaluation_equals_local_blocks(spark, sample_path, kernel):
    engine = make_spark_engine(sample_path, id="countyid", by="year", query="mean(murdrate)")
    q = engine.values()
    model = select_density(q, kernel=kernel, bandwidth=0.05)
    screen = engine.screen(model.bandwidths)
    codes = np.argsort(-screen.bound, kind="stable")[:300]
    codes = codes[~screen.undefined[codes]]
    eps = np.array([0.01, 0.1, 0.5]) * float(screen.bound.max())
    got_eps, got_delta = evaluate_on_executors(engine, model, codes, eps, block_rows=128)
    only_delta = evaluate_on_executors(engine, model, codes, eps, need_eps_i=False, block_rows=128,
                                       return_exact=True)
    rows = engine.shifts(codes)
    for a in range(0, len(codes), 128):
        with threadpool_limits(limits=1, user_api="blas"):  # as on the executors (and in assess)
            want_eps, want_delta = risk.evaluate(model, rows[a:a + 128], eps)
            want_only = risk.evaluate(model, rows[a:a + 128], eps, need_eps_i=False, return_exact=True)
        np.testing.assert_array_equal(got_eps[a:a + 128], want_eps)
        np.testing.assert_array_equal(got_delta[a:a + 128], want_delta)
        for got, want in zip(only_delta, want_only):
            np.testing.assert_array_equal(got[a:a + 128], want)
    assert (got_delta[:, 0] > 0).any()  # the comparison is not between zeros
    engine.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kwargs,message", [
    ({"source": "no/such/file.parquet"}, "not found"),
    ({"source": "tests/conftest.py"}, "cannot tell the format"),
    ({"table": "no_such_db.no_such_table"}, "cannot read table"),
    ({"source": "SAMPLE", "query": "mean(nope)"}, "column 'nope' not found"),
    ({"source": "SAMPLE", "where": "nope > 1"}, "`where`"),
    ({"source": "SAMPLE", "remote": "sc://127.0.0.1:PORT"}, "cannot reach the Spark Connect server"),
    ({"source": "SAMPLE", "master": "spark://127.0.0.1:PORT"}, "cannot reach the Spark master"),
])
def test_bad_input_is_one_line(spark, sample_path, kwargs, message):
    kwargs = dict(kwargs)
    if kwargs.get("source") == "SAMPLE":
        kwargs["source"] = sample_path
    for key in ("remote", "master"):
        if key in kwargs:
            kwargs[key] = kwargs[key].replace("PORT", str(_closed_port()))
    args = {"id": "countyid", "by": "year", "query": "mean(murdrate)", **kwargs}
    with pytest.raises(InputError) as err:
        engine = make_spark_engine(**args)
        engine.values()
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("query", ["mean(x)", "median(x)"])
def test_assess_on_spark_is_the_duckdb_assessment(spark, tmp_path, query):
    """The whole assessment through --engine spark (screening on Spark, candidates on the executors):
    the same eps_all, sweep, per-individual table and riskiest rows as the embedded engine."""
    from empdp.assessment import assess

    path = tmp_path / "p.parquet"
    random_panel(3, n_db=8, n_ind=40, ties=False).to_parquet(path)
    for eps in ([0.1, 0.5], None):
        a = assess(str(path), id="id", by="year", query=query, epsilon=eps)
        b = assess(str(path), id="id", by="year", query=query, epsilon=eps, execution=Execution(engine="spark"))
        assert b.eps_all == pytest.approx(a.eps_all, rel=RTOL)
        np.testing.assert_allclose(b.epsilons, a.epsilons, rtol=RTOL)
        np.testing.assert_allclose(b.delta, a.delta, rtol=RTOL, atol=1e-15)
        np.testing.assert_allclose(b.total_risk, a.total_risk, rtol=RTOL, atol=1e-15)
        np.testing.assert_array_equal(b.n_at_risk, a.n_at_risk)
        np.testing.assert_allclose(b.individuals["delta"].to_numpy(), a.individuals["delta"].to_numpy(),
                                   rtol=RTOL, atol=1e-15)
        assert b.riskiest(5)["id"].to_list() == a.riskiest(5)["id"].to_list()


def test_no_local_worker_processes_on_spark(spark, tmp_path, monkeypatch):
    """On Spark the executors evaluate the individuals: no stage asks for worker processes here (the
    embedded engine's stages ask, and Executors.prepare decides)."""
    from empdp.assessment import assess, parallel

    asked = []
    monkeypatch.setattr(parallel.Executors, "prepare", lambda self, rows: asked.append(rows))
    path = tmp_path / "p.parquet"
    random_panel(3, n_db=8, n_ind=40, ties=False).to_parquet(path)
    options = dict(id="id", by="year", query="mean(x)", model=Model(kernel="gaussian"))
    assess(str(path), **options, execution=Execution(engine="spark", workers="auto"))
    assert asked == []
    assess(str(path), **options, execution=Execution(workers="auto"))
    assert asked


def test_calibrate_on_spark_is_the_duckdb_calibration(spark, tmp_path):
    """calibrate --engine spark: the same lambda*, noise and verified epsilon as the embedded engine."""
    import warnings

    from empdp import calibrate

    path = tmp_path / "p.parquet"
    random_panel(4, n_db=8, n_ind=30, ties=False).to_parquet(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sole contributors, noted by both
        a = calibrate(str(path), id="id", by="year", query="mean(x)", epsilon=0.3)
        b = calibrate(str(path), id="id", by="year", query="mean(x)", epsilon=0.3, execution=Execution(engine="spark"))
    assert b.lam == pytest.approx(a.lam, rel=RTOL)
    assert b.noise["kind"] == a.noise["kind"] and b.noise["scale"] == pytest.approx(a.noise["scale"], rel=RTOL)
    assert b.verified_eps_max == pytest.approx(a.verified_eps_max, rel=RTOL)
    assert (b.n_individuals, b.n_sole_contributors) == (a.n_individuals, a.n_sole_contributors)


def test_adversary_on_spark_is_the_duckdb_assessment(spark, tmp_path, monkeypatch):
    """assess and calibrate --adversary on Spark: the statistic per database from Spark, every bucket's
    risk evaluated on the executors; the embedded engine's eps_all, sweep, per-individual table and
    lambda* (1e-9 relative)."""
    import warnings

    import empdp.spark.engine
    from empdp import calibrate
    from empdp.assessment import assess

    calls = []
    on_executors = empdp.spark.engine.evaluate_buckets_on_executors
    monkeypatch.setattr(empdp.spark.engine, "evaluate_buckets_on_executors",
                        lambda *a, **k: calls.append(len(a[2])) or on_executors(*a, **k))
    path = tmp_path / "p.parquet"
    random_panel(5, n_db=10, n_ind=30, ties=False).to_parquet(path)
    options = dict(id="id", by="year", query="mean(x)", model=Model(adversary="sum(w)", buckets=2))
    a = assess(str(path), **options)
    b = assess(str(path), **options, execution=Execution(engine="spark"))
    assert calls  # the buckets were evaluated on the executors
    assert b.eps_all == pytest.approx(a.eps_all, rel=RTOL)
    np.testing.assert_allclose(b.epsilons, a.epsilons, rtol=RTOL)
    np.testing.assert_allclose(b.delta, a.delta, rtol=RTOL, atol=1e-15)
    np.testing.assert_array_equal(b.n_at_risk, a.n_at_risk)
    ia, ib = a.individuals.sort("id"), b.individuals.sort("id")
    for col in ("eps_i", "delta", "eps_bound"):
        np.testing.assert_allclose(ib[col].to_numpy(), ia[col].to_numpy(), rtol=RTOL, atol=1e-15)
    assert ib["bucket"].to_list() == ia["bucket"].to_list()
    assert [g["n_databases"] for g in b.adversary["buckets"]] == [g["n_databases"] for g in a.adversary["buckets"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sole contributors and small buckets, noted by both
        ca = calibrate(str(path), epsilon=0.3, **options)
        cb = calibrate(str(path), epsilon=0.3, **options, execution=Execution(engine="spark"))
    assert cb.lam == pytest.approx(ca.lam, rel=RTOL) and cb.noise["kind"] == ca.noise["kind"]
    assert cb.verified_eps_max == pytest.approx(ca.verified_eps_max, rel=RTOL)
    # --adversary-sql: one Spark SQL query per database (no leave-one-out of the statistic)
    from empdp.assessment.adversary import read_statistic

    sql = dict(id="id", by="year", adversary=None, adversary_sql="SELECT sum(w) - count(*) FROM db")
    ga, _ = read_statistic(str(path), a.labels, **sql)
    gb, _ = read_statistic(str(path), a.labels, engine="spark", **sql)
    np.testing.assert_allclose(gb, ga, rtol=RTOL)


def _cli(*args):
    from click.testing import CliRunner

    from empdp.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], env={"EMPDP_KEY": "k" * 32, "SPARK_REMOTE": None})


@pytest.fixture(scope="module")
def cli_panel(spark, tmp_path_factory):
    """A panel as a file and as the catalog table ``global_temp.empdp_panel`` of the module's session."""
    df = random_panel(6, n_db=8, n_ind=30, ties=False)
    path = tmp_path_factory.mktemp("cli") / "p.parquet"
    df.to_parquet(path)
    spark.createDataFrame(df).createOrReplaceGlobalTempView("empdp_panel")
    yield path, "global_temp.empdp_panel"
    spark.catalog.dropGlobalTempView("empdp_panel")


def test_cli_table_release_and_audit_on_spark(cli_panel, tmp_path):
    """assess, calibrate, release and audit release read a catalog table with --engine spark (--table),
    and give what the embedded engine gives on the same rows."""
    import json

    path, table = cli_panel
    q = ["--id", "id", "--by", "year", "--query", "mean(x)"]
    a = _cli("assess", path, *q, "-e", "0.3", "--json")
    b = _cli("assess", "--table", table, "--engine", "spark", *q, "-e", "0.3", "--json")
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ja, jb = json.loads(a.output), json.loads(b.output)
    assert jb["eps_all"] == pytest.approx(ja["eps_all"], rel=RTOL)
    assert jb["sweep"][0]["delta"] == pytest.approx(ja["sweep"][0]["delta"], rel=RTOL)
    cal = tmp_path / "cal.json"
    res = _cli("calibrate", "--table", table, "--engine", "spark", *q, "-e", "0.2", "-o", cal, "-q")
    assert res.exit_code == 0, res.output
    released = []
    for source in (["--table", table, "--engine", "spark"], [path]):
        res = _cli("release", cal, *source, "--database", "2003", "--seed", "7", "--ledger",
                   tmp_path / f"l{len(released)}.sqlite", "--budget", "unlimited", "--json")
        assert res.exit_code == 0, res.output
        released.append(json.loads(res.output.splitlines()[0])["value"])
    assert released[0] == pytest.approx(released[1], rel=RTOL)
    # the audit's options are checked before Spark reads anything
    res = _cli("audit", "release", cal, "--table", "global_temp.no_such_table", "--engine", "spark", "--top", "0")
    assert res.exit_code == 2 and "--top" in res.output, res.output
    audits = [_cli("audit", "release", cal, *source, "--seed", "3", "--top", "2", "--json")
              for source in (["--table", table, "--engine", "spark"], [path])]
    assert all(r.exit_code == 0 for r in audits), audits[0].output + audits[1].output
    ja, jb = (json.loads(r.output) for r in audits)
    assert [d["id"] for d in jb["individuals"]] == [d["id"] for d in ja["individuals"]]
    assert jb["exact_epsilon_max"] == pytest.approx(ja["exact_epsilon_max"], rel=RTOL)
    assert jb["mpl_lower_bound"] == pytest.approx(ja["mpl_lower_bound"], rel=RTOL)
    # the Python API takes the same engine options as the command
    from empdp.audit import audit_release
    from empdp.engines import Spark

    api = audit_release(str(cal), engine=Spark(table=table), top=2, rng=3, key=b"k" * 32).to_dict()
    assert api["exact_epsilon_max"] == pytest.approx(ja["exact_epsilon_max"], rel=RTOL)
    assert [d["id"] for d in api["individuals"]] == [d["id"] for d in ja["individuals"]]


@pytest.mark.parametrize("case", ["no table", "table without spark", "unreachable master", "unreadable path",
                                  "source and table", "master without spark"])
def test_cli_bad_engine_input_is_one_line_and_writes_nothing(cli_panel, tmp_path, case):
    path, table = cli_panel
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not a parquet file")
    source, extra, message = {
        "no table": (["--table", "global_temp.no_such_table"], ["--engine", "spark"], "cannot read table"),
        "table without spark": (["--table", table], [], "only Spark reads: add --engine spark"),
        "unreachable master": ([path], ["--engine", "spark", "--spark-master", f"spark://127.0.0.1:{_closed_port()}"],
                               "cannot reach the Spark master"),
        "unreadable path": ([bad], ["--engine", "spark"], "cannot read"),
        "source and table": ([path, "--table", table], ["--engine", "spark"], "not both"),
        "master without spark": ([path], ["--spark-master", "local[1]"], "goes with --engine spark"),
    }[case]
    q = ["--id", "id", "--by", "year", "--query", "mean(x)"]
    cal = tmp_path / "cal.json"
    runs = {"assess": ["assess", *source, *q, *extra, "--out", tmp_path / "out.parquet"],
            "calibrate": ["calibrate", *source, *q, *extra, "-e", "0.3", "-o", cal]}
    if case in ("no table", "table without spark", "unreadable path"):
        good = _cli("calibrate", path, *q, "-e", "0.3", "-o", tmp_path / "good.json", "-q")
        assert good.exit_code == 0, good.output
        runs["release"] = ["release", tmp_path / "good.json", *source, *extra, "--database", "2003",
                           "--ledger", tmp_path / "l.sqlite", "--budget", "unlimited"]
        runs["audit release"] = ["audit", "release", tmp_path / "good.json", *source, *extra]
    for name, args in runs.items():
        res = _cli(*args)
        assert res.exit_code == 2, (name, res.output)
        line = res.output.strip()
        assert line.startswith("Error: ") and "\n" not in line and message in line, (name, line)
    assert not any(p.exists() for p in (tmp_path / "out.parquet", cal, tmp_path / "l.sqlite"))
