"""Append-only, crash-safe ledger with a total-ε budget (docs/method.md#85-ledger-and-budget)."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from empdp.errors import BudgetExceededError, InputError
from empdp.noise.ledger import Ledger as _Ledger
from empdp.noise.ledger import LedgerError
from empdp.noise.ledger_format import SCHEMA

KEY = b"noise-ledger-curator-key-0123456789"


def Ledger(path, key=KEY, **kw):
    """The ledger under this module's curator key."""
    return _Ledger(path, key=key, **kw)

FIELDS = dict(query="mean(x)", source="s.parquet", database=None, epsilon=0.1, weight_zero=0.2,
              private=True, calibration_digest="abc", source_digest="sha256:" + "ab" * 32)
FIELDS["lambda"] = 1.5


def test_budget_accumulates_and_refuses_without_writing(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    for k in range(3):
        rec = ledger.append(FIELDS, lambda: 1.0 + k, budget=0.3)  # 3 × 0.1 fits 0.3 despite rounding
    assert rec["budget_spent"] == pytest.approx(0.3) and rec["budget_left"] == pytest.approx(0.0)
    drawn = []
    with pytest.raises(BudgetExceededError, match="over the budget"):
        ledger.append(FIELDS, lambda: drawn.append(1) or 0.0, budget=0.3)
    assert drawn == []  # no noise drawn for a refused release
    summary = ledger.verify()
    assert (summary["n_releases"], summary["spent"], summary["budget"]) == (3, pytest.approx(0.3), 0.3)
    assert summary["signed"] and summary["head"] == ledger.chain()[-1]["mac"]
    with pytest.raises(BudgetExceededError):  # the stored budget applies when none is given
        ledger.append(FIELDS, lambda: 0.0)
    with pytest.raises(InputError, match="cannot be changed"):
        ledger.append(FIELDS, lambda: 0.0, budget=5.0)


def test_refused_first_release_creates_no_file(tmp_path):
    path = tmp_path / "l.sqlite"
    with pytest.raises(BudgetExceededError):
        Ledger(path).append({**FIELDS, "epsilon": 2.0}, lambda: 0.0, budget=1.0)
    assert not path.exists()


def test_append_only_and_tamper_evident(tmp_path):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    for v in (1.0, 2.0, 3.0):
        ledger.append(FIELDS, lambda: v, budget="unlimited")
    con = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("UPDATE chain SET epsilon = 0")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        con.execute("DELETE FROM chain")
    con.execute("DROP TRIGGER chain_no_update")  # someone bypasses the guard ...
    con.execute("UPDATE chain SET noisy_value = 9 WHERE seq = 2")
    con.commit()
    with pytest.raises(LedgerError, match="no trigger 'chain_no_update'"):  # the schema check notices ...
        ledger.verify()
    con.execute(next(s for s in SCHEMA if "chain_no_update" in s))  # ... so the trigger is put back as it was
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="record 2 does not match its HMAC"):  # ... and the keyed chain notices
        ledger.verify()


def test_unlimited_ledger_and_garbage_file(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    rec = ledger.append(FIELDS, lambda: 4.0, budget="unlimited")
    assert rec["budget_left"] is None and rec["seq"] == 1 and rec["noisy_value"] == 4.0
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(LedgerError):
        Ledger(bad).append(FIELDS, lambda: 0.0)


CHILD = textwrap.dedent("""
    import sys
    from empdp.noise.ledger import Ledger
    from empdp.noise.sampler import NoiseSampler
    ledger, sampler = Ledger(sys.argv[1], key=sys.argv[2].encode()), NoiseSampler(0.3, 1.0)
    fields = dict(query="q", source=None, database=None, epsilon=0.001, weight_zero=0.3,
                  private=True, calibration_digest="d", source_digest="value given")
    fields["lambda"] = 1.0
    while True:
        ledger.append(fields, lambda: sampler.release(1.0), budget=1e6)
""")


def test_ledger_survives_sigkill_mid_release_loop(tmp_path):
    path = tmp_path / "l.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), KEY.decode()], stderr=subprocess.PIPE)
    deadline = time.time() + 60
    try:
        while not path.exists() or Ledger(path).verify()["n_releases"] < 30:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "the child wrote too slowly"
            time.sleep(0.05)
        time.sleep(0.137)  # kill at an arbitrary point of the loop
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ledger = Ledger(path)
    summary = ledger.verify()  # integrity check, contiguous sequence, hash chain
    n = summary["n_releases"]
    assert n >= 30
    assert summary["spent"] == pytest.approx(0.001 * n)
    assert summary["budget"] == 1e6
    rec = ledger.append({**FIELDS, "epsilon": 0.5}, lambda: 7.0)  # and it keeps working
    assert rec["seq"] == n + 1
    assert ledger.verify()["spent"] == pytest.approx(0.001 * n + 0.5)
