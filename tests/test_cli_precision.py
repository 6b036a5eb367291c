"""``--tolerance`` and ``--exact`` of 2-3 statistics released together (issue 37's contract) through the
one path: the library's ``Precision``, the JSON, the terminal and ``--out``; one statistic refuses them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import polars as pl
import pytest
from helpers import one_line_error, run

import empdp
from empdp.errors import InputError

TWO = ["--id", "id", "--by", "db", "--query", "mean(x)", "--query", "mean(y)"]


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    rng = np.random.default_rng(3)
    rows = [(i, j, rng.normal() + 0.3 * (i % 5), rng.normal()) for i in range(40) for j in range(12)]
    path = tmp_path_factory.mktemp("precision") / "p.parquet"
    pd.DataFrame(rows, columns=["id", "db", "x", "y"]).to_parquet(path)
    return str(path)


def _json(panel, *extra):
    res = run("assess", panel, *TWO, "--json", *extra)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_tolerance_and_exact_reach_the_json(panel):
    loose, exact = _json(panel, "--tolerance", "1e-3"), _json(panel, "--exact")
    assert loose["tolerance"] == 1e-3 and exact["tolerance"] == 0.0
    for a, b in zip(loose["sweep"], exact["sweep"]):
        lo, hi = a["total_risk_bounds"]
        assert lo <= b["total_risk"] <= hi and hi - lo <= max(1e-3 * hi, 1e-12)  # the exact value is inside
        assert a["delta"] == b["delta"] and a["n_at_risk"] == b["n_at_risk"]  # exact either way
    assert exact["eps_all"] == loose["eps_all"]


def test_terminal_and_out_state_the_bracket(panel, tmp_path):
    out = tmp_path / "r.parquet"
    res = run("assess", panel, *TWO, "--out", out, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "certified to a relative 0.0001" in res.output
    table = pl.read_parquet(out)
    assert {"delta_lo", "delta_hi"} <= set(table.columns)
    assert (table["delta_lo"] <= table["delta_hi"]).all()


@pytest.mark.parametrize("args, fragments", [
    (["--tolerance", "2"], ("--tolerance", "[0, 1)")),
    (["--tolerance", "nan"], ("--tolerance",)),
])
def test_bad_tolerance_is_one_line_and_writes_nothing(panel, tmp_path, args, fragments):
    one_line_error(run("assess", panel, *TWO, *args, "--out", tmp_path / "r.parquet"), *fragments)
    assert not list(tmp_path.iterdir())


def test_one_statistic_refuses_precision(panel, tmp_path):
    res = run("assess", panel, "--id", "id", "--by", "db", "--query", "mean(x)", "--exact", "--out", tmp_path / "r.csv")
    one_line_error(res, "--exact", "does not apply to one statistic")
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match="does not apply to one statistic"):
        empdp.assess(panel, id="id", by="db", query="mean(x)", precision=empdp.Precision(exact=True))
    with pytest.raises(InputError) as info:
        empdp.Precision(tolerance=-1)
    assert info.value.param == ("tolerance",)
