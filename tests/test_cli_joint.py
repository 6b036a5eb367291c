"""CLI contract of ``empdp assess`` with 2–3 statistics released together (issue 19): exit codes,
JSON, ``--out``, the terminal summary, and one ``--query`` staying the one-statistic assessment."""

import io
import json
import re

import polars as pl
import pytest
from helpers import one_line_error, parquet_file, run
from test_joint_assess import paper_table

from empdp.settings import Execution, Model

PANEL = ["--id", "id", "--by", "db"]


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """The paper's panel as a file: K contributes a steady x to every database; ``x_not_k`` is x but K's."""
    table, K = paper_table()
    return parquet_file(tmp_path_factory, table, "joint", "paper.parquet"), K


@pytest.fixture(scope="module")
def paper_run(paper, tmp_path_factory):
    """``SELECT sum(x)`` and ``SELECT sum(x) FILTER (WHERE id <> K)`` assessed jointly: JSON and --out."""
    path, K = paper
    sql = ["SELECT sum(x) FROM db", f"SELECT sum(x) FILTER (WHERE id <> {K}) FROM db"]
    out = tmp_path_factory.mktemp("joint") / "risk.parquet"
    res = run("assess", path, *PANEL, "--sql", sql[0], "--sql", sql[1], "--out", out, "--json")
    assert res.exit_code == 0, res.output
    return sql, json.loads(res.output), pl.read_parquet(out)


def test_the_papers_warning_through_the_cli(paper, paper_run, tmp_path):
    """Each statistic alone protects K at a tenth of the ε the pair needs; together K is the riskiest."""
    path, K = paper
    sql, summary, rows = paper_run
    riskiest = rows.sort("eps_i", descending=True).row(0, named=True)
    assert riskiest["id"] == K and riskiest["eps_i"] == summary["eps_all"]
    for k, one in enumerate(sql):
        single = tmp_path / f"one{k}.parquet"
        res = run("assess", path, *PANEL, "--sql", one, "--out", single, "--json")
        assert res.exit_code == 0, res.output
        eps_k = pl.read_parquet(single).filter(pl.col("id") == K)["eps_i"].item()
        assert summary["eps_all"] >= 10 * eps_k


def test_json_keys(paper_run):
    sql, summary, _ = paper_run
    assert set(summary) == {"source", "query", "id", "by", "n_databases", "n_individuals", "kernel", "bandwidth",
                            "density_model", "eps_all", "tolerance", "sweep", "independence", "sole_contributors",
                            "warnings"}
    assert summary["query"] == sql and len(summary["bandwidth"]) == 2 and len(summary["independence"]) == 2
    assert summary["n_databases"] == 40 and summary["n_individuals"] == 30
    assert summary["density_model"]["whitened"] is True and summary["density_model"]["selected_by"] == "loo-likelihood"
    assert len(summary["sweep"]) == 50 and set(summary["sweep"][0]) == {"epsilon", "delta", "total_risk", "n_at_risk",
                                                                         "total_risk_bounds"}
    assert summary["tolerance"] == 1e-4
    for row in summary["sweep"]:  # the certified bracket, its midpoint, and its width within the tolerance
        lo, hi = row["total_risk_bounds"]
        assert lo <= row["total_risk"] <= hi and hi - lo <= max(1e-4 * hi, 1e-12)
    assert summary["sweep"][-1]["delta"] == 0  # 1.25 eps_all: everyone protected


def test_out_columns_and_fixed_scales(tmp_path):
    table, _ = paper_table(K=3, n_db=8, n_ind=8)  # small: three statistics, two epsilons
    path, out = tmp_path / "small.parquet", tmp_path / "risk.csv"
    table.write_parquet(path)
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "max(x)", "--query", "median(x)",
              "--bandwidth", "10,3,2", "-e", "0.5", "-e", "0.2", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    rows = pl.read_csv(out)
    assert rows.columns == ["id", "eps_i", "eps_bound", "delta", "epsilon", "delta_lo", "delta_hi", "n_databases",
                            "max_abs_shift_1", "max_abs_shift_2", "max_abs_shift_3", "sole_contributor"]
    closed = rows.filter(pl.col("delta").is_not_null())  # exact where the bracket is closed
    assert (closed["delta_lo"] == closed["delta"]).all() and (closed["delta_hi"] == closed["delta"]).all()
    assert (rows["delta_lo"] <= rows["delta_hi"]).all()
    assert rows.height == 8 and rows["epsilon"].unique().to_list() == [0.2]  # the ε of the delta column
    summary = json.loads(res.output)
    assert summary["query"] == ["sum(x)", "max(x)", "median(x)"] and summary["bandwidth"] == [10.0, 3.0, 2.0]
    assert summary["density_model"]["whitened"] is False
    assert [s["epsilon"] for s in summary["sweep"]] == [0.2, 0.5]


def test_terminal_summary_names_the_riskiest(paper, tmp_path):
    path, K = paper
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "sum(x_not_k)", "--out", tmp_path / "r.parquet")
    assert res.exit_code == 0, res.output
    text = res.output
    for fragment in ("(joint query, 2 statistics)", "1. sum(x)", "2. sum(x_not_k)", "product Laplace, whitened axes", "eps_all",
                     "risk by epsilon of the joint release", "shift 2", "per-individual table written to"):
        assert fragment in text, text
    rows = [ln for ln in text[text.index("riskiest individuals"):].splitlines() if "│" in ln]
    cells = [[c.strip() for c in ln.strip().strip("│").split("│")] for ln in rows]
    assert [str(K), "sets eps_all"] in [[c[0], c[-1]] for c in cells], text


def test_one_query_is_the_one_statistic_assessment(paper):
    """One --query goes the one-statistic way: the same bytes as that assessment rendered directly."""
    from rich.console import Console

    from empdp.assessment import assess
    from empdp.cli.render import print_assessment
    from empdp.io import jsonable

    path, _ = paper
    args = ["assess", path, *PANEL, "--query", "sum(x)", "--bandwidth", "3", "-e", "0.1", "-e", "0.5"]
    one = assess(path, id="id", by="db", query="sum(x)", epsilon=[0.1, 0.5], model=Model(bandwidth=3.0),
                 execution=Execution(workers="auto"))
    assert run(*args, "--json").output == json.dumps(jsonable(one.to_dict()), allow_nan=False) + "\n"
    text = io.StringIO()
    print_assessment(one, console=Console(file=text, highlight=False, soft_wrap=True))
    assert run(*args).output == text.getvalue()


def test_a_statistic_that_is_a_function_of_the_other_is_one_line(tmp_path):
    table, _ = paper_table(steady=0.0)  # K adds exactly 5 to every database: sum(x_not_k) = sum(x) − 5
    path, out = tmp_path / "flat.parquet", tmp_path / "risk.parquet"
    table.write_parquet(path)
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "sum(x_not_k)", "--out", out)
    one_line_error(res, "exactly dependent", "release fewer statistics")
    assert not out.exists()


REFUSED = "does not apply to a joint query of 2 statistics"


@pytest.mark.parametrize("options, fragments", [
    (["--bandwidth", "1"], ["--bandwidth gives 1 scale(s) for 2 statistics"]),
    (["--bandwidth", "1,2,3"], ["--bandwidth gives 3 scale(s) for 2 statistics"]),
    (["--bandwidth", "1,-2"], ["positive"]),
    (["--bandwidth", "variable"], ["--bandwidth variable"]),
    (["--query", "mean(x)", "--query", "max(x)"], ["--query given 4 times", "at most 3"]),
    (["--sql", "SELECT max(x) FROM db"], ["not both"]),
    (["--kernel", "gaussian"], ["--kernel gaussian", REFUSED]),
    (["--adversary", "count(*)"], ["--adversary", REFUSED]),
    (["--report", "{tmp}/r.html", "--calibration", "{tmp}/cal.json"], ["--calibration", REFUSED, "no calibration section"]),
    (["--report", "{tmp}/r.html", "--audit", "{tmp}/audit.json"], ["--audit", REFUSED, "no audit section"]),
    (["--report", "{tmp}/r.txt"], ["--report", ".html"]),
    (["--save-result", "{tmp}/r.csv"], ["--save-result", ".json"]),
    (["--without-shifts"], ["--without-shifts applies to --save-result"]),
    (["--workers", "processes"], ["--workers processes", REFUSED]),
    (["--no-screening"], ["--no-screening", REFUSED]),
])
def test_bad_joint_input_is_one_line_and_writes_nothing(paper, tmp_path, options, fragments):
    path, _ = paper
    options = [o.format(tmp=tmp_path) for o in options]
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "sum(x_not_k)", *options,
              "--out", tmp_path / "risk.parquet")
    one_line_error(res, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_out_has_every_eps_i_exact(tmp_path):
    """--out holds each individual's exact eps_i, also of those the sweep at -e 20 need not evaluate."""
    table, K = paper_table(n_ind=400)
    path, out = tmp_path / "wide.parquet", tmp_path / "risk.parquet"
    table.write_parquet(path)
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "sum(x_not_k)", "-e", "20", "--out", out,
              "--json")
    assert res.exit_code == 0, res.output
    rows = pl.read_parquet(out)
    assert rows.height == 400 and rows["eps_i"].null_count() == 0 and rows["eps_i"].min() > 0
    assert rows.sort("eps_i", descending=True)["id"][0] == K


def test_hashed_ids_and_the_log(paper, tmp_path):
    """--hash-ids reaches the joint --out table; -v logs the sizes, model and eps_all to stderr, and each
    stage (reading, the eps_all search, the sweep) with its items and time."""
    path, K = paper
    out = tmp_path / "risk.csv"
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "sum(x_not_k)", "-e", "20", "-v",
              "--hash-ids", "--out", out, env={"EMPDP_HASH_KEY": "k" * 40})
    assert res.exit_code == 0, res.output
    assert "joint model: product Laplace kernels on whitened axes" in res.output
    for stage in ("reading and leave-one-out", "eps_all", "delta_i"):
        assert re.search(rf"INFO [\d:.]* ?empdp\.cli: {stage}: [\d,]+/[\d,]+, done in \d+\.\d\d s", res.output), stage
    ids = pl.read_csv(out)["id"].to_list()
    assert len(set(ids)) == 30 and str(K) not in ids and all(len(v) == 16 for v in ids)
