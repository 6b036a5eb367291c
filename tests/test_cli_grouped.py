"""CLI contract of ``empdp assess --group-by COL`` (issue 19 item 6): the library's numbers in JSON
and ``--out``, bounds only in their own column, and bad input refused in one line with nothing written."""

import json

import numpy as np
import polars as pl
import pytest
from helpers import one_line_error, run
from test_joint_groups import EPS, grouped_table

from empdp.assessment.groups import assess_grouped

PANEL = ["--id", "id", "--by", "year", "--group-by", "region", "--query", "mean(x)"]
EPS_ARGS = [a for e in EPS for a in ("-e", e)]


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    """Five regions; individuals 45 and 46 have rows in 4 and 5 of them (bounded only)."""
    table = grouped_table()
    path = tmp_path_factory.mktemp("grouped") / "regions.parquet"
    table.write_parquet(path)
    return str(path), assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS,
                                     exact_all=True)  # as --out: every exact eps_i


def test_json_and_out_are_the_librarys(five, tmp_path):
    path, ref = five
    out = tmp_path / "risk.parquet"
    res = run("assess", path, *PANEL, *EPS_ARGS, "--out", out, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["group_by"] == "region" and summary["groups"] == list("abcde")
    assert summary["eps_all"] == pytest.approx(ref.eps_all, rel=1e-12)
    assert summary["n_bound_only"] == ref.n_bound_only == 2
    assert [s["n_unresolved"] for s in summary["sweep"]] == ref.n_unresolved.tolist()
    rows = pl.read_parquet(out)
    assert rows.columns == ["id", "eps_i", "eps_bound", "delta", "epsilon", "delta_lo", "delta_hi", "n_databases",
                            "groups", "sole_contributor"]
    assert rows["epsilon"].unique().to_list() == [min(EPS)]
    np.testing.assert_allclose(rows["eps_i"].fill_null(np.nan).to_numpy(), ref.eps_i, rtol=1e-12)
    bounded = rows.filter(pl.col("groups") > 3)
    assert sorted(bounded["id"].to_list()) == [45, 46]
    assert bounded["eps_i"].null_count() == 2 and (bounded["eps_bound"] > 0).all()  # a bound, not an eps_i


def test_terminal_labels_bounds_as_bounds(five):
    path, ref = five
    res = run("assess", path, *PANEL, *EPS_ARGS)
    assert res.exit_code == 0, res.output
    assert "5 groups" in res.output and "eps_all bound" in res.output
    assert "eps_i <=" not in res.output
    # the groups' notes are one summary line (each note is in warning_details, for -v)
    named = [w for w in ref.warning_details if "[region = " in w]
    assert named and not any(w.split(":")[0] in res.output for w in named)
    assert f"{len(ref.warning_details)} note(s) on the series of" in res.output
    top = ref.riskiest(10)
    bound_only = top.filter(pl.col("eps_i").is_null() & ~pl.col("sole_contributor"))
    assert ("bound only │" in res.output) == (bound_only.height > 0)  # an eps_i cell, not a number


@pytest.mark.parametrize("extra, fragments", [
    (["--query", "sum(x)"], ["one --query or one --sql"]),
    (["--kernel", "gaussian"], ["--kernel gaussian", "--group-by"]),
    (["--save-result", "r.json"], ["--save-result"]),
    (["--bandwidth", "variable"], ["--bandwidth variable"]),
    (["--bandwidth", "1,x"], ["--bandwidth"]),
    (["--bandwidth", "1,2"], ["--bandwidth", "per group"]),
])
def test_bad_input_is_one_line_and_writes_nothing(five, tmp_path, extra, fragments):
    path, _ = five
    out = tmp_path / "risk.parquet"
    res = run("assess", path, *PANEL, *extra, "--out", out)
    one_line_error(res, *fragments)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_null_group_is_refused(tmp_path):
    table = grouped_table(groups="ab", movers={}).with_columns(
        pl.when(pl.col("id") == 3).then(None).otherwise(pl.col("region")).alias("region"))
    path = tmp_path / "nulls.parquet"
    table.write_parquet(path)
    one_line_error(run("assess", path, *PANEL), "NULL")


def test_verbose_lists_the_notes_the_summary_line_counts(five):
    path, ref = five
    res = run("assess", path, *PANEL, *EPS_ARGS, "-v")
    assert res.exit_code == 0, res.output
    assert ref.warning_details and all(f"note: {w}" in res.output for w in ref.warning_details)
