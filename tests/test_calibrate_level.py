"""``calibrate --level`` (issue 38, item 4): noise at λ_L ≥ λ*, at which the target ε holds for a fraction L
of subsamples of the databases; reported beside λ*, checked when read back, and recorded by the release."""

from __future__ import annotations

import json

import pytest
from conftest import random_panel
from helpers import CURATOR_KEY, one_line_error, run

from empdp.noise import Ledger, load_calibration

QUERY = ["--id", "id", "--by", "year", "--query", "mean(x)"]
pytestmark = pytest.mark.usefixtures("curator_key")


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    path = tmp_path_factory.mktemp("level") / "p.parquet"
    random_panel(11, n_db=24, n_ind=40, ties=False).to_parquet(path)
    return str(path)


@pytest.fixture(scope="module")
def calibrations(panel, tmp_path_factory, curator_key_module):
    folder = tmp_path_factory.mktemp("cals")
    out = {}
    for name, extra in (("star", []), ("level", ["--level", "0.9", "--replicates", "60", "--seed", "2"])):
        path = folder / f"{name}.json"
        res = run("calibrate", panel, *QUERY, "-e", "0.05", "-o", path, "--json", *extra)
        assert res.exit_code == 0, res.output
        out[name] = (path, json.loads(next(line for line in res.output.splitlines() if line.startswith("{"))))
    return out


def test_the_noise_is_at_lambda_level_beside_lambda_star(calibrations):
    star, at = calibrations["star"][1], calibrations["level"][1]
    assert star["level"] is None and at["lambda"] == star["lambda"]  # lambda is lambda* in both
    level = at["level"]
    assert level["level"] == 0.9 and level["replicates"] == 60 and level["lambda_star"] == at["lambda"]
    assert level["lambda_level"] >= level["lambda_star"] and at["noise"]["scale"] == level["lambda_level"]
    assert at["verified_eps_max"] <= 0.05 and at["expected_abs_noise"] >= star["expected_abs_noise"]


def test_the_release_records_which_lambda(calibrations, tmp_path):
    path, at = calibrations["level"]
    ledger = tmp_path / "l.sqlite"
    res = run("release", path, "--value", "1", "--budget", "1", "--ledger", ledger, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(next(line for line in res.output.splitlines() if line.startswith("{")))
    assert out["level"] == 0.9 and out["lambda"] == at["level"]["lambda_level"]
    record = Ledger(ledger, key=CURATOR_KEY).records()[-1]
    assert record["lambda"] == at["level"]["lambda_level"] != at["lambda"]


@pytest.mark.parametrize("edit", [
    lambda lv: lv.update(lambda_level=lv["lambda_star"] / 2),  # noise below lambda*
    lambda lv: lv.update(level=1.5),
    lambda lv: lv.update(lambda_star=lv["lambda_star"] * 2),
    lambda lv: lv.pop("replicates"),
])
def test_an_edited_level_is_refused_even_unsigned(calibrations, tmp_path, edit):
    d = json.loads(calibrations["level"][0].read_text())
    d.pop("hmac", None), d.pop("digest", None), d.pop("key_id", None)
    edit(d["level"])
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    with pytest.raises(Exception, match="level"):
        load_calibration(path, allow_unsigned=True)


@pytest.mark.parametrize("args, fragments", [
    (["--level", "1.5"], ("--level", "between 0 and 1")),
    (["--level", "0.9", "--replicates", "5"], ("--replicates", "too few")),
    (["--replicates", "50"], ("--replicates goes with --level",)),
    (["--seed", "1"], ("--seed goes with --level",)),
    (["--level", "0.9", "--kernel", "gaussian"], ("--level", "Laplace")),
    (["--level", "0.9", "--adversary", "count(*)"], ("--level", "adversary")),
    (["--level", "0.9", "--query", "sum(x)"], ("--level", "does not apply to a joint query")),
])
def test_bad_level_input_is_one_line_and_writes_nothing(panel, tmp_path, args, fragments):
    res = run("calibrate", panel, *QUERY, "-e", "0.05", "-o", tmp_path / "c.json", *args)
    one_line_error(res, *fragments)
    assert not list(tmp_path.iterdir())
