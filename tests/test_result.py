"""Saved assessment results (empdp.assessment.result): a loaded result renders and reads as the live one."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import random_panel
from numpy.testing import assert_allclose, assert_array_equal

from empdp import risk
from empdp.assessment.assess import assess
from empdp.assessment.result import FORMAT, SHIFT_ROWS, TABLE_ROWS, load_result, save_result
from empdp.errors import InputError
from empdp.io import keyed_hash
from empdp.report import TOP_TABLE, report_html
from empdp.settings import Model

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "countymurders.parquet"


def _strict(text: str):
    """Parse JSON refusing NaN/Infinity, which strict JSON readers reject."""
    def bad(token):
        raise ValueError(f"non-standard JSON constant {token}")
    return json.loads(text, parse_constant=bad)


def _no_timestamp(html: str) -> str:
    return re.sub(r"generated \S+ \S+ UTC", "", html)


@pytest.fixture(scope="module")
def live(sample_assessment):
    return sample_assessment


@pytest.fixture(scope="module")
def saved(live, tmp_path_factory):
    path = tmp_path_factory.mktemp("result") / "r.json"
    save_result(live, path)
    return path, load_result(path)


def test_file_is_strict_json_owner_only_and_complete(saved):
    path, _ = saved
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp file left behind
    d = _strict(path.read_text())
    assert d["format"] == FORMAT and d["n_individuals"] == 2197
    assert len(d["individuals"]["countyid"]) == min(TABLE_ROWS, 2197)
    assert len(d["shifts"]) == SHIFT_ROWS and all(len(row) == 17 for row in d["shifts"])


def test_loaded_result_reads_as_the_live_one(live, saved):
    _, r = saved
    assert json.dumps(r.to_dict(), sort_keys=True) == json.dumps(live.to_dict(), sort_keys=True)
    for name in ("q", "epsilons", "delta", "total_risk", "n_at_risk"):
        assert_array_equal(getattr(r, name), getattr(live, name))
    assert_array_equal(r.model.bandwidths, live.model.bandwidths)
    assert (r.model.kernel, r.model.scale, r.model.loglik) == (live.model.kernel, live.model.scale, live.model.loglik)
    assert (r.n_individuals, r.n_databases, r.labels) == (live.n_individuals, live.n_databases, live.labels)
    assert r.riskiest(TOP_TABLE).equals(live.riskiest(TOP_TABLE))
    ids = live.riskiest(SHIFT_ROWS)["countyid"].to_list()
    assert_array_equal(r.shifts_of(ids[::-1]), live.shifts_of(ids[::-1]))
    assert r.epsilon_for_total_risk(0.1) == live.epsilon_for_total_risk(0.1)


def test_loaded_result_renders_the_same_report(live, saved):
    _, r = saved
    assert SHIFT_ROWS >= TOP_TABLE  # the report's table and density plots need these rows
    eps = float(live.epsilons[0])  # the ε the saved table was ranked at
    assert _no_timestamp(report_html(r, epsilon=eps)) == _no_timestamp(report_html(live, epsilon=eps))


def test_loaded_result_at_another_epsilon_is_exact_and_says_what_it_ranks(live, saved):
    # at another ε the saved rows with shifts get exact δ_i(ε); rows beyond them may rank higher in
    # the population, and the report says so instead of showing a wrong ranking as the truth
    _, r = saved
    eps = float(live.epsilons[5])
    top = r.riskiest(TOP_TABLE, eps)
    _, d = risk.evaluate(live.model, live.shifts_of(top["countyid"].to_list()), np.array([eps]))
    assert_allclose(top["delta"].to_numpy(), d[:, 0], atol=1e-12)
    assert (np.diff(top.filter(~pl.col("sets_eps_all"))["delta"].to_numpy()) <= 0).all()
    assert r.ranking_note(eps, TOP_TABLE) in report_html(r, epsilon=eps).replace("&#x27;", "'")
    assert r.ranking_note(float(live.epsilons[0]), TOP_TABLE) == ""


def test_shifts_beyond_the_saved_rows_are_refused(live, saved):
    _, r = saved
    beyond = live.riskiest(SHIFT_ROWS + 1)["countyid"][-1]
    with pytest.raises(InputError, match="riskiest individuals only"):
        r.shifts_of([beyond])


def test_sole_contributors_and_string_ids_survive(tmp_path):
    a = assess(random_panel(0), id="id", by="year", query="mean(x)", model=Model(kernel="laplace", bandwidth=0.5))
    save_result(a, tmp_path / "r.json")
    r = load_result(tmp_path / "r.json")
    top = r.riskiest(1).row(0, named=True)
    assert top["id"] == "solo" and top["sole_contributor"] and top["eps_i"] == np.inf
    assert r.riskiest(a.n_individuals).equals(a.riskiest(a.n_individuals))
    assert r.sole_contributors == 1 and r.total_risk[0] == 1.0


def test_hashed_ids_are_never_written(live, tmp_path):
    key = b"a key of at least sixteen bytes"
    path = tmp_path / "r.json"
    save_result(live, path, hash_ids=key)
    text = path.read_text()
    top = live.riskiest(SHIFT_ROWS)["countyid"].to_list()
    d = _strict(text)
    assert d["ids_hashed"] is True
    assert d["individuals"]["countyid"][:SHIFT_ROWS] == [keyed_hash(v, key) for v in top]
    r = load_result(path)
    assert r.ids_hashed and r.shifts_of([keyed_hash(top[0], key)]).shape == (1, 17)
    html = report_html(r)
    assert all(f"<code>{v}</code>" not in html for v in top[:TOP_TABLE])


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not an empdp result file"),
    ('{"format": "empdp-calibration/1"}', "calibration file (give it with --calibration)"),
    ('{"method": "mpl", "lower_bound": 1}', "audit result (give it with --audit)"),
])
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match=re.escape(message)):
        load_result(path)


@pytest.mark.parametrize("damage", ["drop q", "short bandwidths", "a column one short", "text in the sweep"])
def test_damaged_files(saved, tmp_path, damage):
    d = _strict(saved[0].read_text())
    if damage == "drop q":
        del d["q"]
    elif damage == "short bandwidths":
        d["model"]["bandwidths"] = d["model"]["bandwidths"][:-1]
    elif damage == "a column one short":
        d["individuals"]["sole_contributor"].pop()
    else:
        d["sweep"]["delta"][0] = "much"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match="damaged or incomplete"):
        load_result(path)
