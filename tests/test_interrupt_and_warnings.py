"""Issue 33, findings 12 and 13: a warning when fewer than 10 databases are assessed, on every
model; Ctrl-C is "Error: interrupted", exit 130, with nothing half-written and no worker left."""

from __future__ import annotations

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
    with sql_errors(context="--sql failed on database 1990"):
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
def test_ctrl_c_mid_assessment(tmp_path):
    """SIGINT while the worker processes evaluate: one line, exit 130, no output, no temporary, no
    worker left. The Gaussian kernel, every individual exact, in worker processes: tens of seconds."""
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
