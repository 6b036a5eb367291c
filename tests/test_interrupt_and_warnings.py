"""Issue 33, findings 12 and 13: a warning when fewer than 10 databases are assessed, on every
model; Ctrl-C is "Error: interrupted", exit 130, with nothing half-written and no worker left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest
from helpers import QUERY, SAMPLE, run

import empdp.data.panel as data_panel
from empdp.data.sql import sql_errors

# ----------------------------------------------------------------------------------------- Ctrl-C


def _interrupted_query(con):
    """A query DuckDB really interrupts: ``con.interrupt()`` from another thread while it runs."""
    threading.Timer(0.2, con.interrupt).start()
    con.execute("SELECT count(*) FROM range(10000000000) t(x) WHERE x % 7 = 3").fetchall()


def _raise(exc):
    def fail(con, sql):
        raise exc
    return fail


def _duckdb_interrupt(con, sql):
    _interrupted_query(con)


def _wrapped_interrupt(con, sql):
    # as the data layer reports a DuckDB error of user SQL: InputError(...) from None
    with sql_errors(context="`sql` failed on database 1990", param="sql"):
        _interrupted_query(con)


@pytest.mark.parametrize("fetch", [
    _raise(KeyboardInterrupt()),  # the signal's own exception, raised in Python code
    _raise(RuntimeError("Query interrupted")),  # DuckDB's, when SIGINT arrives while a query runs
    _duckdb_interrupt,  # duckdb.InterruptException from a real interrupted query
    _wrapped_interrupt,  # the same, turned into bad input by the data layer
], ids=["KeyboardInterrupt", "query-interrupted", "duckdb-interrupt", "wrapped-interrupt"])
def test_interrupt_is_one_line_exit_130(monkeypatch, tmp_path, fetch):
    monkeypatch.setattr(data_panel, "fetch_arrow", fetch)
    out, report, saved = tmp_path / "o.csv", tmp_path / "r.html", tmp_path / "s.json"
    res = run("assess", SAMPLE, *QUERY, "-q", "--bandwidth", "0.05", "--out", out, "--report", report,
              "--save-result", saved)
    assert res.exit_code == 130, res.output
    assert res.output == "Error: interrupted\n"
    assert list(tmp_path.iterdir()) == []


def test_duckdb_interrupt_class():
    """The exception a DuckDB interrupt raises (the class the CLI maps) is still this one."""
    con = duckdb.connect()
    with pytest.raises(duckdb.InterruptException):
        _interrupted_query(con)


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies excluded)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(name))
    return found


def _wait(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("group", [False, True], ids=["kill -INT", "Ctrl-C at a terminal"])
def test_ctrl_c_mid_assessment(tmp_path, group):
    """SIGINT while the worker processes evaluate: one line, exit 130, no output, no temporary, no
    worker left. The Gaussian kernel, every individual exact, in worker processes: tens of seconds.
    A terminal's Ctrl-C reaches the whole process group: the workers start with SIGINT blocked, so
    none prints a traceback of its own."""
    outs = [tmp_path / "o.csv", tmp_path / "r.html", tmp_path / "s.json"]
    cmd = [sys.executable, "-m", "empdp.cli.main", "assess", SAMPLE, *QUERY, "--kernel", "gaussian",
           "--no-screening", "--workers", "processes", "--threads", "2", "-q",
           "--out", outs[0], "--report", outs[1], "--save-result", outs[2]]
    # a session of its own: its process group holds the command and every process it starts
    proc = subprocess.Popen([str(c) for c in cmd], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        # the evaluation has started once the worker processes exist
        assert _wait(lambda: len(_group(proc.pid)) > 1 or proc.poll() is not None, 120)
        time.sleep(1.0)
        assert proc.poll() is None, "the assessment ended before it was interrupted"
        if group:
            os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: every process of the group
        else:
            proc.send_signal(signal.SIGINT)  # as `kill -INT`
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err == "Error: interrupted\n" and out == ""
    assert _wait(lambda: not _group(proc.pid), 10), "worker processes outlived the command"
    assert list(tmp_path.iterdir()) == []


def test_error_line_shows_control_characters_escaped(monkeypatch):
    """An error message quoting a value from the data can neither drive the terminal nor forge a line."""
    from empdp.errors import InputError

    monkeypatch.setattr(data_panel, "fetch_arrow", _raise(InputError("value '\x1b[2J\x9b31m' \r\nError: forged")))
    res = run("assess", SAMPLE, *QUERY, "-q", "--bandwidth", "0.05")
    assert res.exit_code == 2, res.output
    assert res.output == "Error: value '\\x1b[2J\\x9b31m' Error: forged\n"


# ------------------------------------------------------------------------ fewer than 10 databases

SMALL = "rests on only"


@pytest.fixture(scope="module")
def years(tmp_path_factory):
    """The sample cut to its first ``n`` years, with a two-valued group column ``half``."""
    folder = tmp_path_factory.mktemp("years")

    def cut(n: int) -> str:
        path = folder / f"first{n}.parquet"
        duckdb.execute(f"COPY (SELECT *, countyid % 2 AS half FROM read_parquet(?) WHERE year < 1980 + {n}) "
                       f"TO '{path}' (FORMAT parquet)", [SAMPLE])
        return str(path)
    return cut


def _warnings(path, *args) -> list[str]:
    res = run("assess", path, *QUERY[:4], *args, "--json")
    assert res.exit_code == 0, res.output
    return [w for w in json.loads(res.output)["warnings"] if SMALL in w]


@pytest.mark.parametrize("n, warned", [(2, True), (9, True), (10, False)])
def test_one_statistic_warns_below_10_databases(years, n, warned):
    found = _warnings(years(n), "--query", "mean(murdrate)", "--bandwidth", "0.05")
    assert found == ([f"the assessment rests on only {n} databases; with fewer than 10 databases a density model "
                      "fitted to the query values, and every risk computed from it, is unreliable; use more "
                      "databases if you can"] if warned else [])


def test_warning_reaches_terminal_and_report(years, tmp_path):
    report = tmp_path / "r.html"
    res = run("assess", years(5), *QUERY, "--bandwidth", "0.05", "--report", report)
    assert res.exit_code == 0, res.output
    assert "warning: the assessment rests on only 5 databases; with fewer than 10 databases" in " ".join(res.output.split())
    assert "the assessment rests on only 5 databases; with fewer than 10 databases" in report.read_text()


def test_joint_statistics_warn_below_10_databases(years):
    found = _warnings(years(5), "--query", "mean(murdrate)", "--query", "mean(density)")
    assert len(found) == 1 and found[0].startswith("the assessment rests on only 5 databases")  # once, not per statistic


def test_joint_calibration_warns_below_10_databases(years, tmp_path):
    res = run("calibrate", years(5), *QUERY[:4], "--query", "mean(murdrate)", "--query", "mean(density)", "-e", 1,
              "-o", tmp_path / "c.json", "--json")
    assert res.exit_code == 0, res.output
    assert any(w.startswith("the calibration rests on only 5 databases") for w in json.loads(res.stdout)["warnings"])


def test_grouped_statistic_warns_once_below_10_databases(years):
    found = _warnings(years(5), "--query", "mean(murdrate)", "--group-by", "half")
    assert len(found) == 1 and found[0].startswith("the assessment rests on only 5 databases")


def test_no_small_sample_warning_from_10_databases(years):
    assert _warnings(SAMPLE, "--query", "mean(murdrate)", "--bandwidth", "0.05") == []
    assert _warnings(years(10), "--query", "mean(murdrate)", "--group-by", "half") == []


def test_calibration_warns_below_10_databases(years, tmp_path):
    for extra in ([], ["--adversary", "sum(popul)", "--buckets", "1"]):
        res = run("calibrate", years(5), *QUERY, "-e", 1, "-o", tmp_path / "c.json", "--json", *extra)
        assert res.exit_code == 0, res.output
        assert [w for w in json.loads(res.stdout)["warnings"] if SMALL in w][0].startswith(
            "the calibration rests on only 5 databases"), extra
