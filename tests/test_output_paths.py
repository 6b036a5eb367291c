"""An output never overwrites an input (the data, a calibration, an audit, a saved result) or
another output of the same command: one line, exit 2, the input left as it was."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from click.testing import CliRunner

from empdp.cli.main import cli

QUERY = ["--id", "countyid", "--by", "year", "--query", "mean(murdrate)", "--kernel", "laplace",
         "--bandwidth", "0.05", "-e", "0.5"]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line_error(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0], res.output


@pytest.fixture
def data(tmp_path, sample_path):
    path = tmp_path / "data.parquet"
    shutil.copy(sample_path, path)
    return path


@pytest.fixture
def saved(tmp_path, data):
    path = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["assess", str(data), *QUERY, "--save-result", str(path), "-q"])
    assert res.exit_code == 0, res.output
    return path


def test_out_over_the_data_is_refused(data):
    before = _digest(data)
    res = CliRunner().invoke(cli, ["assess", str(data), *QUERY, "--out", str(data)])
    _one_line_error(res, "is the input")
    assert _digest(data) == before


def test_save_result_over_the_calibration_is_refused(tmp_path, data):
    cal = tmp_path / "cal.json"
    cal.write_text('{"format": "empdp-calibration/1"}')
    res = CliRunner().invoke(cli, ["assess", str(data), *QUERY, "--report", str(tmp_path / "r.html"),
                                   "--calibration", str(cal), "--save-result", str(cal)])
    _one_line_error(res, "--save-result")
    assert cal.read_text() == '{"format": "empdp-calibration/1"}'


def test_report_over_its_saved_result_is_refused(saved):
    html = saved.with_suffix(".html")
    saved.rename(html)  # a result file under an .html name: -o would overwrite it
    before = _digest(html)
    res = CliRunner().invoke(cli, ["report", str(html), "-o", str(html)])
    _one_line_error(res, "-o")
    assert _digest(html) == before


def test_a_symlink_to_the_data_is_refused(tmp_path, data):
    link = tmp_path / "link.csv"
    link.symlink_to(data)
    res = CliRunner().invoke(cli, ["assess", str(data), *QUERY, "--out", str(link)])
    _one_line_error(res, "--out")


def test_result_without_shifts_keeps_no_values(tmp_path, data):
    path = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["assess", str(data), *QUERY, "--save-result", str(path), "--without-shifts",
                                   "-q"])
    assert res.exit_code == 0, res.output
    import json

    d = json.loads(path.read_text())
    assert d["shifts"] == [] and len(d["individuals"]["countyid"]) > 0
    out = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["report", str(path), "-o", str(out), "-q"]).exit_code == 0
    assert "No individual with a defined leave-one-out value" in out.read_text()


def test_an_epsilon_beyond_700_is_one_line(saved):
    # e^epsilon overflows a double past 709: a huge epsilon crashed the report's plot (exit 1)
    out = saved.with_suffix(".html")
    _one_line_error(CliRunner().invoke(cli, ["report", str(saved), "-e", "1e308", "-o", str(out)]), "--epsilon")
    assert not out.exists()
    assert CliRunner().invoke(cli, ["report", str(saved), "-e", "700", "-o", str(out)]).exit_code == 0
