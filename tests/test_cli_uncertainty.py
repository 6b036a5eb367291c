"""``empdp assess --uncertainty`` (issue 38): the JSON's ``uncertainty`` object, the headline, the
``--out`` interval columns, reproducibility by ``--seed``, and bad input in one line."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import random_panel
from helpers import one_line_error, run

import empdp
from empdp.errors import InputError

QUERY = ["--id", "id", "--by", "year", "--query", "mean(x)"]


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    path = tmp_path_factory.mktemp("unc") / "p.parquet"
    random_panel(7, n_db=24, n_ind=40, ties=False).to_parquet(path)
    return str(path)


def _json(panel, *extra):
    res = run("assess", panel, *QUERY, "--uncertainty", "--replicates", "40", "--seed", "3", "--json", *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_json_holds_the_intervals_around_the_estimates(panel):
    d = _json(panel)
    u = d["uncertainty"]
    assert u["replicates"] == 40 and u["level"] == 0.9 and u["method"].startswith("subsampling")
    assert u["validated"] == ["eps_all"] and u["notes"][0].startswith("only the eps_all interval is validated")
    lo, hi = u["eps_all"]
    assert lo <= d["eps_all"] <= hi and lo < hi
    E = len(d["sweep"])
    for key in ("delta", "total_risk", "n_at_risk"):
        pairs = np.array(u["sweep"][key], dtype=float)
        assert pairs.shape == (E, 2) and np.all(pairs[:, 0] <= pairs[:, 1])
        point = np.array([row[key] for row in d["sweep"]], dtype=float)
        assert np.all(pairs[:, 0] <= point * (1 + 1e-12) + 1e-300) and np.all(point <= pairs[:, 1] * (1 + 1e-12) + 1e-300)
    assert _json(panel) == d  # the same seed, the same intervals


def test_headline_and_out_columns(panel, tmp_path):
    out = tmp_path / "r.parquet"
    res = run("assess", panel, *QUERY, "--uncertainty", "--replicates", "40", "--seed", "3", "--out", out,
              env={"COLUMNS": "200"})  # one line per row: the headline and the table's header unwrapped
    assert res.exit_code == 0, res.output
    assert "(90% interval " in res.output and "eps_i 90% interval" in res.output
    table = pl.read_parquet(out)
    shown = table.filter(pl.col("eps_i_lo").is_not_null())
    assert 1 <= shown.height <= 11  # the riskiest table's rows (and the one that sets eps_all)
    assert (shown["eps_i_lo"] <= shown["eps_i"] * (1 + 1e-12)).all()
    assert (shown["eps_i"] <= shown["eps_i_hi"] * (1 + 1e-12)).all()
    every = tmp_path / "all.parquet"
    assert run("assess", panel, *QUERY, "--uncertainty", "--replicates", "40", "--seed", "3", "--uncertainty-rows",
               "all", "--out", every, "-q").exit_code == 0
    full = pl.read_parquet(every)
    known = full.filter(pl.col("eps_i").is_finite() & ~pl.col("sole_contributor"))
    assert known["eps_i_lo"].null_count() == 0 and known.height > shown.height


@pytest.mark.parametrize("args, fragments", [
    (["--uncertainty", "--replicates", "0"], ("--replicates", ">= 1")),
    (["--uncertainty", "--level", "1.5"], ("--level", "between 0 and 1")),
    (["--uncertainty", "--replicates", "5"], ("--replicates", "too few")),
    (["--replicates", "50"], ("--replicates goes with --uncertainty",)),
    (["--uncertainty", "--adversary", "count(*)"], ("--uncertainty", "adversary")),
    (["--uncertainty", "--uncertainty-rows", "all"], ("--out",)),
    (["--uncertainty", "--query", "sum(x)"], ("--uncertainty", "does not apply to a joint query")),
])
def test_bad_input_is_one_line_and_writes_nothing(panel, tmp_path, args, fragments):
    report = tmp_path / "r.html" if "--uncertainty-rows" not in args else None
    res = run("assess", panel, *QUERY, *args, *(["--report", report] if report else []))
    one_line_error(res, *fragments)
    assert not list(tmp_path.iterdir())


def test_library_refuses_joint_and_names_parameters(panel):
    joint = empdp.assess(panel, id="id", by="year", query=["mean(x)", "sum(x)"], epsilon=[0.5])
    with pytest.raises(InputError, match="does not apply to a joint query"):
        joint.estimate_uncertainty(replicates=40)
    one = empdp.assess(panel, id="id", by="year", query="mean(x)")
    with pytest.raises(InputError) as info:
        one.estimate_uncertainty(replicates=40, level=1.5)
    assert info.value.param == ("level",)


def test_report_shows_the_intervals(panel, tmp_path):
    page = tmp_path / "r.html"
    res = run("assess", panel, *QUERY, "--uncertainty", "--replicates", "40", "--seed", "3", "--report", page, "-q")
    assert res.exit_code == 0, res.output
    html = page.read_text()
    assert "ε_all, 90% interval" in html and "replicates of" in html and "other sets of databases" in html
    assert "only the eps_all interval is validated" in html  # the sweep's bands are not: the page says so
    plain = tmp_path / "plain.html"
    assert run("assess", panel, *QUERY, "--report", plain, "-q").exit_code == 0
    assert "90% interval" not in plain.read_text()
