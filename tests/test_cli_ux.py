"""Terminal behaviour of the CLI (issue 5): progress bars, -v logging, and 'empdp report'.

Bars are drawn only when stderr is a terminal; CliRunner's streams are not, so
the tests that need bars force the check (``stderr_is_terminal``) to True.
"""

from __future__ import annotations

import json
import logging
import re
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import empdp.cli._common as common
from empdp.cli.main import cli
from empdp.report import SECTIONS
from empdp.report.markup import num

SAMPLE = str(Path(__file__).resolve().parents[1] / "sample_data" / "countymurders.parquet")
QUERY = ["--id", "countyid", "--by", "year", "--query", "mean(murdrate)"]
# a fixed model keeps each run to a couple of seconds
ASSESS = ["assess", SAMPLE, *QUERY, "--kernel", "laplace", "--bandwidth", "0.05"]
CALIBRATE = ["calibrate", SAMPLE, *QUERY, "-e", "0.1"]
BAR = "━"  # rich's bar glyph
ESC = "\x1b["


def run(args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setattr(common, "stderr_is_terminal", lambda: True)


def one_line_error(res):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    return lines[0]


# ------------------------------------------------------------------ progress bars
def test_json_stays_pure_on_a_terminal(terminal, tmp_path):
    res = run([*ASSESS, "-e", "0.05", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["n_individuals"] == 2197
    assert res.stderr == ""  # no bars under --json
    res = run([*CALIBRATE, "-o", tmp_path / "c.json", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["epsilon"] == 0.1
    assert BAR not in res.stderr and ESC not in res.stderr


def test_bars_on_a_terminal_go_to_stderr(terminal, tmp_path):
    res = run([*ASSESS, "-e", "0.05", "--report", tmp_path / "r.html"])
    assert res.exit_code == 0, res.output
    for stage in ("reading and leave-one-out", f"writing {tmp_path / 'r.html'}"):  # library and CLI stages
        assert stage in res.stderr
    assert BAR in res.stderr
    assert ESC not in res.stdout and "eps_all" in res.stdout  # the human output is untouched
    res = run([*CALIBRATE, "-o", tmp_path / "c.json"])
    assert res.exit_code == 0, res.output
    assert "lambda search" in res.stderr and BAR in res.stderr
    assert ESC not in res.stdout and "lambda*" in res.stdout


def test_quiet_silences_bars_on_a_terminal(terminal):
    res = run([*ASSESS, "-e", "0.05", "-q"])
    assert res.exit_code == 0 and res.stdout == "" and res.stderr == ""


def test_no_bars_when_stderr_is_not_a_terminal():
    res = run([*ASSESS, "-e", "0.05"])
    assert res.exit_code == 0
    assert BAR not in res.stderr and ESC not in res.stderr


# ------------------------------------------------------------------ -v logging
def _lines(text: str, level: str) -> list[str]:
    """The lines of ``level``, without their timestamp ('INFO 12:34:56.789 empdp.cli: ...')."""
    stamp = re.compile(r"^(\w+) \d\d:\d\d:\d\d\.\d{3} ")
    return [stamp.sub(r"\1 ", ln) for ln in text.splitlines() if ln.startswith(level + " ")]


def test_log_lines_carry_a_timestamp():
    res = run([*ASSESS, "-e", "0.05", "--json", "-v"])
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("INFO ")]
    assert lines and all(re.match(r"INFO \d\d:\d\d:\d\d\.\d{3} empdp", ln) for ln in lines), lines


def test_verbose_assess_logs_stages_and_facts_on_stderr_only():
    res = run([*ASSESS, "-e", "0.05", "--json", "-v"])
    assert res.exit_code == 0, res.output
    json.loads(res.stdout)  # logs never reach stdout
    info = "\n".join(_lines(res.stderr, "INFO"))
    assert re.search(r"INFO empdp\.cli: reading and leave-one-out: 3/3, done in \d+\.\d\d s", info)
    # the risk stages' names are the library's; each ends in one timed line with its item count
    assert len(re.findall(r"INFO empdp\.cli: [\w -]+: [\d,]+/[\d,]+, done in \d+\.\d\d s", info)) >= 2
    assert "17 databases (by year), 2197 individuals (id countyid), 0 sole contributor(s)" in info
    assert "density model: laplace kernel, scale 0.05, fixed bandwidths" in info
    assert re.search(r"eps_all 0\.06\d+; \d+ individual\(s\) evaluated exactly", info)
    assert not _lines(res.stderr, "DEBUG")
    assert not run([*ASSESS, "-e", "0.05", "--json"]).stderr  # silent without -v


def test_very_verbose_adds_debug_and_quiet_wins():
    res = run([*ASSESS, "-e", "0.05", "-e", "0.1", "--json", "-vv"])
    assert res.exit_code == 0, res.output
    debug = "\n".join(_lines(res.stderr, "DEBUG"))
    assert "best candidates: laplace b=0.05" in debug and "epsilon 0.1: delta" in debug
    res = run([*ASSESS, "-e", "0.05", "-q", "-vv"])
    assert res.exit_code == 0 and res.output == ""


def test_verbose_calibrate_and_release(tmp_path, monkeypatch):
    monkeypatch.setenv("EMPDP_KEY", "a curator key of the test, 32 bytes")  # signs the calibration and ledger
    cal = tmp_path / "c.json"
    res = run([*CALIBRATE, "-o", cal, "--json", "-v"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["epsilon"] == 0.1
    info = "\n".join(_lines(res.stderr, "INFO"))
    assert "read " in info and "17 databases, 2197 individuals" in info
    assert "curator kernel: laplace" in info
    assert re.search(r"INFO empdp\.noise\.compute: lambda\* = 0\.0386\d* ", info)
    assert "noise: laplace_mixture" in info and f"wrote {cal}" in info
    res = run(["release", cal, "--value", 0.4711, "--ledger", tmp_path / "l.sqlite", "--budget", "unlimited", "--json",
               "-v"])
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)) >= {"value", "epsilon"}
    assert "released with epsilon 0.1 (CSPRNG)" in res.stderr
    assert "0.4711" not in res.stderr  # the true value is never printed


def test_logging_is_restored_after_a_command():
    root = logging.getLogger("empdp")
    before = (list(root.handlers), root.level, root.propagate)
    assert run([*ASSESS, "-e", "0.05", "--json", "-vv"]).exit_code == 0
    assert (list(root.handlers), root.level, root.propagate) == before


# ------------------------------------------------------------------ empdp report
@pytest.fixture(scope="module")
def files(tmp_path_factory, curator_key_module):
    """A saved result with its live report, a calibration and an MPL audit of the real commands."""
    tmp = tmp_path_factory.mktemp("report")
    res = run(["audit", "mpl", "-m", "laplace", "--param", "epsilon=0.7", "--seed", "1", "--n", "2000",
               "--N", "5000", "--json"])
    assert res.exit_code == 0, res.output
    (tmp / "audit.json").write_text(res.stdout)
    res = run([*CALIBRATE, "-o", tmp / "cal.json", "-q"])
    assert res.exit_code == 0, res.output
    res = run([*ASSESS, "-e", "0.05", "--save-result", tmp / "r.json", "--report", tmp / "live.html",
               "--calibration", tmp / "cal.json", "--audit", tmp / "audit.json", "-q"])
    assert res.exit_code == 0, res.output
    return tmp


def _sections(html: str) -> set:
    return set(re.findall(r'<section id="([^"]+)"', html))


def _riskiest_ids(html: str) -> list:
    table = re.search(r'<section id="riskiest">.*?</section>', html, re.S).group(0)
    return re.findall(r"<td><code>([^<]+)</code></td>", table)


def test_assess_report_takes_calibration_and_audit(files):
    html = (files / "live.html").read_text()
    assert _sections(html) == set(SECTIONS) | {"calibration", "audit"}
    bound = json.loads((files / "audit.json").read_text())["lower_bound"]
    assert "Audit: MPL lower bound on ε" in html and num(bound) in html  # the audit's bound
    lam = json.loads((files / "cal.json").read_text())["lambda"]
    assert f"{lam:.4g}" in html


def test_report_round_trip(files):
    out = files / "again.html"
    res = run(["report", files / "r.json", "--calibration", files / "cal.json", "--audit", files / "audit.json",
               "-o", out])
    assert res.exit_code == 0, res.output
    assert res.stdout == f"HTML report written to {out} (mode 0600)\n"
    html, live = out.read_text(), (files / "live.html").read_text()
    assert _sections(html) == set(SECTIONS) | {"calibration", "audit"}
    assert "http://" not in html and "https://" not in html
    assert "No individual with a defined leave-one-out value" not in html  # the density plots are drawn
    assert _riskiest_ids(html) == _riskiest_ids(live) and len(_riskiest_ids(html)) == 10
    for path in (out, files / "r.json", files / "live.html"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_report_json_and_hashed_ids(files, monkeypatch):
    key = "k" * 32
    monkeypatch.setenv("EMPDP_HASH_KEY", key)
    out = files / "hashed.html"
    res = run(["report", files / "r.json", "--hash-ids", "-o", out, "--json", "-e", "0.1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"report": str(out), "sections": list(SECTIONS)}
    from empdp.io import keyed_hash

    raw = _riskiest_ids((files / "live.html").read_text())
    assert _riskiest_ids(out.read_text()) == [keyed_hash(int(v), key.encode()) for v in raw]


def test_assess_saves_hashed_ids(tmp_path, monkeypatch):
    monkeypatch.setenv("EMPDP_HASH_KEY", "k" * 32)
    res = run([*ASSESS, "-e", "0.05", "--hash-ids", "--save-result", tmp_path / "r.json", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["ids_hashed"] is True
    assert all(isinstance(v, str) and len(v) == 16 for v in d["individuals"]["countyid"])


@pytest.mark.parametrize("case, needle", [
    ("missing", "does not exist"),
    ("garbled", "not valid JSON"),
    ("calibration as result", "is a calibration file"),
    ("result as audit", "not an empdp audit result"),
    ("audit as calibration", "not an empdp calibration"),
    ("bad extension", "must end in .html"),
    ("missing folder", "does not exist"),
    ("negative epsilon", "--epsilon must be in [0, 700]"),
])
def test_report_bad_input_writes_nothing(files, tmp_path, case, needle):
    result, out = files / "r.json", tmp_path / "out.html"
    extra = []
    if case == "missing":
        result = tmp_path / "nope.json"
    elif case == "garbled":
        result = tmp_path / "garbled.json"
        result.write_text('{"format": "empdp-result/1", ')
    elif case == "calibration as result":
        result = files / "cal.json"
    elif case == "result as audit":
        extra = ["--audit", files / "r.json"]
    elif case == "audit as calibration":
        extra = ["--calibration", files / "audit.json"]
    elif case == "bad extension":
        out = tmp_path / "out.txt"
    elif case == "missing folder":
        out = tmp_path / "no" / "out.html"
    else:
        extra = ["-e", "-1"]
    before = set(tmp_path.iterdir())
    line = one_line_error(run(["report", result, "-o", out, *extra]))
    assert needle in line
    assert set(tmp_path.iterdir()) == before


@pytest.mark.parametrize("args, needle", [
    (["--calibration", "CAL"], "give --report FILE.html too"),
    (["--save-result", "r.txt"], "--save-result 'r.txt' must end in .json"),
    (["--report", "r.html", "--audit", "RESULT"], "not an empdp audit result"),
])
def test_assess_bad_report_options_write_nothing(files, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    args = [str(files / "cal.json") if a == "CAL" else str(files / "r.json") if a == "RESULT" else a for a in args]
    line = one_line_error(run([*ASSESS, "--out", "t.parquet", *args]))
    assert needle in line
    assert list(tmp_path.iterdir()) == []
