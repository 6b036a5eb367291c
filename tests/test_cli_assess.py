"""CLI contract of ``empdp assess`` (CliRunner): JSON, --out, sources and bad input."""

import json
import os
import stat

import duckdb
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import random_panel

from empdp.cli.main import cli
from empdp.settings import Model

BASE = ["--id", "countyid", "--by", "year", "--query", "mean(murdrate)"]


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def one_line_error(res, code=2):
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


def test_json_contract(sample_path):
    res = run(["assess", sample_path, *BASE, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)  # pure JSON, nothing else on stdout
    for key in ("n_databases", "n_individuals", "query", "kernel", "bandwidth", "eps_all", "sweep",
                "independence", "sole_contributors"):
        assert key in out
    assert out["n_databases"] == 17 and out["n_individuals"] == 2197
    assert set(out["independence"]) >= {"ljung_box_p", "trend_p"}
    sweep = out["sweep"]
    assert len(sweep) == 50
    eps = [s["epsilon"] for s in sweep]
    assert eps == sorted(eps) and eps[0] < out["eps_all"] <= eps[-1]
    assert set(sweep[0]) == {"epsilon", "delta", "total_risk", "n_at_risk"}
    assert sweep[-1]["delta"] == 0 and sweep[-1]["n_at_risk"] == 0


def test_fixed_model_is_exactly_reproducible(sample_path):
    args = ["assess", sample_path, *BASE, "--kernel", "laplace", "--bandwidth", "0.5", "--json", "-e", "0.001"]
    a, b = run(args), run(args)
    assert a.output == b.output
    out = json.loads(a.output)
    assert out["kernel"] == "laplace" and out["bandwidth"] == 0.5
    assert out["density_model"]["variable"] is False


def test_results_do_not_depend_on_the_thread_count(sample_path, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("empdp.assessment.evaluation"), "EVAL_ROWS", 256)  # several blocks, so that threads really run side by side
    args = ["assess", sample_path, *BASE, "--kernel", "laplace", "--json", "-e", "0.05", "-e", "0.3"]
    one, two = run(args + ["--threads", "1"]), run(args + ["--threads", "2"])
    assert one.exit_code == 0, one.output
    assert one.output == two.output
    assert json.loads(one.output)["sweep"][0]["n_at_risk"] > 0
    # worker processes (spawned, the blocks' shift rows pickled to them) give the same bits
    procs = run(args + ["--threads", "2", "--workers", "processes"])
    assert procs.exit_code == 0, procs.output
    assert procs.output == one.output


def test_bad_thread_count(sample_path):
    line = one_line_error(run(["assess", sample_path, *BASE, "--threads", "0"]))
    assert "--threads" in line


def test_out_table(sample_path, tmp_path):
    path = tmp_path / "risk.parquet"
    res = run(["assess", sample_path, *BASE, "-e", "0.2", "-e", "0.1", "--out", str(path), "--json"])
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(path)
    assert df.columns == ["countyid", "eps_i", "eps_bound", "delta", "epsilon", "n_databases", "max_abs_shift",
                          "sole_contributor"]
    assert df.schema["countyid"] == pl.Int64 and df.height == 2197
    assert df["eps_i"].null_count() == 0  # --out computes every ε_i exactly
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    summary = json.loads(res.output)
    assert summary["sweep"][0]["epsilon"] == 0.1  # delta column is at the smallest ε, and says so
    assert (df["epsilon"] == 0.1).all()
    assert df["delta"].max() == pytest.approx(summary["sweep"][0]["delta"])
    csv = tmp_path / "risk.csv"
    assert run(["assess", sample_path, *BASE, "-e", "0.1", "--out", str(csv), "-q"]).exit_code == 0
    assert pl.read_csv(csv).height == 2197


def test_human_output(sample_path):
    res = run(["assess", sample_path, *BASE, "--kernel", "laplace", "--bandwidth", "0.05"])
    assert res.exit_code == 0
    for text in ("mean(murdrate)", "databases", "2197", "eps_all", "riskiest individuals", "risk by epsilon"):
        assert text in res.output


# ------------------------------------------------------------------ sources
@pytest.fixture
def frames(tmp_path):
    df = random_panel(1)
    return df, tmp_path


def _summary(source, where=None):
    args = ["assess", str(source), "--id", "id", "--by", "year", "--query", "mean(x)", "--json",
            "--kernel", "laplace", "--bandwidth", "0.5", "-e", "0.1"]
    res = run(args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    return out["eps_all"], out["sweep"][0]["delta"], out["n_individuals"]


def test_every_source_kind_gives_the_same_answer(frames):
    df, tmp = frames
    ref = _summary_from_frame(df)
    df.to_parquet(tmp / "t.parquet")
    df.to_csv(tmp / "t.csv", index=False)
    df.to_json(tmp / "t.json", orient="records", lines=True)
    (tmp / "parts").mkdir()
    for year, part in df.groupby("year"):
        part.to_parquet(tmp / "parts" / f"p{year}.parquet")
    hive = tmp / "hive"
    for year, part in df.groupby("year"):
        (hive / f"year={year}").mkdir(parents=True)
        part.drop(columns="year").to_parquet(hive / f"year={year}" / "data.parquet")
    con = duckdb.connect(str(tmp / "t.duckdb"))
    con.register("df", df)
    con.execute("CREATE TABLE panel AS SELECT * FROM df")
    con.close()
    for source in (tmp / "t.parquet", tmp / "t.csv", tmp / "t.json", str(tmp / "parts" / "*.parquet"), hive,
                   f"{tmp / 't.duckdb'}::panel"):
        got = _summary(source)
        assert got == pytest.approx(ref, rel=1e-12), source


def _summary_from_frame(df):
    from empdp.assessment.assess import assess

    results = []
    for frame in (df, pl.from_pandas(df), pl.from_pandas(df).to_arrow()):
        r = assess(frame, id="id", by="year", query="mean(x)", epsilon=0.1,
                   model=Model(kernel="laplace", bandwidth=0.5))
        results.append((r.eps_all, r.delta[0], r.n_individuals))
    assert results[0] == results[1] == results[2]
    return results[0]


# ---------------------------------------------------------------- bad input
def test_missing_file(tmp_path):
    out = tmp_path / "o.parquet"
    res = run(["assess", str(tmp_path / "nope.parquet"), "--id", "a", "--by", "b", "--query", "count(*)",
               "--out", str(out)])
    assert "not found" in one_line_error(res)
    assert not out.exists()


def test_missing_column(sample_path, tmp_path):
    out = tmp_path / "o.parquet"
    res = run(["assess", sample_path, "--id", "countyid", "--by", "year", "--query", "mean(nope)",
               "--out", str(out)])
    line = one_line_error(res)
    assert "'nope'" in line and "murdrate" in line
    assert not out.exists() and not list(tmp_path.iterdir())


def _write(tmp_path, df, name="t.parquet"):
    path = tmp_path / name
    df.to_parquet(path)
    return str(path)


def test_null_ids(tmp_path):
    df = random_panel(2)
    df.loc[3, "id"] = None
    src = _write(tmp_path, df)
    line = one_line_error(run(["assess", src, "--id", "id", "--by", "year", "--query", "sum(x)"]))
    assert "NULL id" in line and "--drop-null-ids" in line
    res = run(["assess", src, "--id", "id", "--by", "year", "--query", "sum(x)", "--drop-null-ids", "--json"])
    assert res.exit_code == 0
    assert any("dropped 1 rows" in w for w in json.loads(res.output)["warnings"])


def test_non_numeric_value_column(tmp_path):
    df = random_panel(2)
    df["x"] = df["x"].astype(str)
    src = _write(tmp_path, df)
    line = one_line_error(run(["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)"]))
    assert "not a number" in line


def test_single_database(tmp_path):
    df = random_panel(2)
    src = _write(tmp_path, df[df.year == 2000])
    assert "at least 2 databases" in one_line_error(run(["assess", src, "--id", "id", "--by", "year",
                                                         "--query", "mean(x)"]))


def test_empty_table(tmp_path):
    df = random_panel(2).iloc[:0]
    src = _write(tmp_path, df)
    assert "no rows" in one_line_error(run(["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)"]))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_values(tmp_path, bad):
    df = random_panel(2)
    df.loc[5, "x"] = bad
    src = str(tmp_path / "t.parquet")
    pl.from_pandas(df, nan_to_null=False).write_parquet(src)  # keep NaN as NaN (pandas would write NULL)
    line = one_line_error(run(["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)"]))
    assert ("NaN" in line or "infinite" in line) and "'x'" in line


def test_column_names_with_quotes_and_spaces(tmp_path):
    df = random_panel(2).rename(columns={"id": 'the "id"', "year": "data base", "x": "my value"})
    src = _write(tmp_path, df)
    res = run(["assess", src, "--id", 'the "id"', "--by", "data base", "--query", 'mean("my value")', "--json",
               "-e", "0.1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n_databases"] == 6
    line = one_line_error(run(["assess", src, "--id", 'the "id"', "--by", "data base", "--query",
                               'mean("no such")']))
    assert "'no such'" in line


@pytest.mark.parametrize("args,needle", [
    (["--query", "avg(x"], "cannot parse"),
    (["--query", "mean(x)", "--sql", "SELECT 1 FROM db"], "exactly one"),
    (["--query", "mean(x)", "--where", "nonsense ((("], "not valid"),
    (["--sql", "SELECT avg(x) FROM other"], "table db"),
    (["--query", "mean(x)", "--bandwidth", "wide"], "--bandwidth"),
    (["--query", "mean(x)", "--out", "x.txt"], ".parquet or .csv"),
])
def test_bad_options(tmp_path, args, needle):
    src = _write(tmp_path, random_panel(2))
    line = one_line_error(run(["assess", src, "--id", "id", "--by", "year", *args]))
    assert needle in line


def test_usage_error_is_one_line(sample_path):
    line = one_line_error(run(["assess", sample_path, "--by", "year"]))
    assert "--id" in line


@pytest.mark.parametrize("extra, words", [([], "chosen by leave-one-out likelihood"),
                                          (["--bandwidth", "0.05"], "given (--bandwidth)")])
def test_the_bandwidth_says_how_it_was_set(extra, words):
    """Issue 34: 'scale 0.01985, fixed' was printed for a bandwidth chosen by likelihood."""
    from helpers import SAMPLE

    res = run(["assess", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)", *extra])
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("density model")]
    assert words in line and "fixed" not in line
