"""Append-only, crash-safe release ledger with a total-ε budget (SPEC 6.5).

One SQLite file in WAL mode with ``synchronous=FULL``: a release is one
``BEGIN IMMEDIATE`` transaction that reads the ε spent so far, refuses when
the budget would be exceeded (sequential composition), draws the noise and
appends the record. A crash before COMMIT leaves no trace; after COMMIT the
record survives (the noisy value may be lost to the user, never the ε).
Triggers forbid UPDATE and DELETE, and every record carries the SHA-256 of
its predecessor's hash plus its own fields, so :meth:`Ledger.verify` detects
edits made behind SQLite's back.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..errors import BudgetExceededError, EmpdpError, InputError

FIELDS = ("time", "query", "source", "database", "epsilon", "lambda", "weight_zero",
          "noisy_value", "private", "calibration_digest")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    seq INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    query TEXT NOT NULL,
    source TEXT,
    database TEXT,
    epsilon REAL NOT NULL,
    lambda REAL NOT NULL,
    weight_zero REAL NOT NULL,
    noisy_value REAL NOT NULL,
    private INTEGER NOT NULL,
    calibration_digest TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"""
_GENESIS = "0" * 64
#: relative slack on the budget comparison so that e.g. 3 × 0.1 fits a budget of 0.3
_BUDGET_RTOL = 1e-9


class LedgerError(EmpdpError):
    """The ledger file is unreadable or its hash chain is broken (exit 1)."""


def _record_hash(prev_hash: str, record: dict) -> str:
    body = json.dumps([record[k] for k in FIELDS], separators=(",", ":"), allow_nan=False)
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


class Ledger:
    """The release ledger at ``path`` (created on first write).

    Parameters
    ----------
    path : str or Path
        SQLite file.
    """

    def __init__(self, path):
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        if not self.path.parent.is_dir():
            raise InputError(f"ledger folder {str(self.path.parent)!r} does not exist")
        try:
            con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"cannot open ledger {str(self.path)!r}: {exc}") from None
        return con

    # ------------------------------------------------------------------ reads
    def _read(self, fn):
        if not self.path.exists():
            return fn(None)
        con = self._connect()
        try:
            return fn(con)
        finally:
            con.close()

    @staticmethod
    def _spent(con) -> float:
        return float(con.execute("SELECT coalesce(sum(epsilon), 0) FROM releases").fetchone()[0])

    @staticmethod
    def _budget(con) -> float | None:
        row = con.execute("SELECT value FROM meta WHERE key = 'budget'").fetchone()
        return float(row[0]) if row else None

    def spent(self) -> float:
        """Total ε of all recorded releases (sequential composition)."""
        return self._read(lambda con: 0.0 if con is None else self._spent(con))

    def budget(self) -> float | None:
        """The total-ε budget fixed by the first release that named one (None: unlimited)."""
        return self._read(lambda con: None if con is None else self._budget(con))

    def records(self) -> list[dict]:
        """All records in order, with ``seq``, ``prev_hash`` and ``hash``."""
        def fetch(con):
            if con is None:
                return []
            cur = con.execute("SELECT * FROM releases ORDER BY seq")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur]
        return self._read(fetch)

    def verify(self) -> dict:
        """Check integrity, sequence and hash chain; return ``{"n_releases", "spent", "budget"}``.

        Raises
        ------
        LedgerError
            If SQLite's integrity check fails, a sequence number is missing or
            a record's hash does not match its content and predecessor.
        """
        def check(con):
            if con is None:
                return {"n_releases": 0, "spent": 0.0, "budget": None}
            status = con.execute("PRAGMA integrity_check").fetchone()[0]
            if status != "ok":
                raise LedgerError(f"ledger {str(self.path)!r} is corrupt: {status}")
            return {"spent": self._spent(con), "budget": self._budget(con)}
        summary = self._read(check)
        prev = _GENESIS
        records = self.records()
        for expected_seq, rec in enumerate(records, start=1):
            if rec["seq"] != expected_seq:
                raise LedgerError(f"ledger {str(self.path)!r}: record {expected_seq} is missing")
            if rec["prev_hash"] != prev or rec["hash"] != _record_hash(prev, rec):
                raise LedgerError(f"ledger {str(self.path)!r}: record {rec['seq']} was altered")
            prev = rec["hash"]
        return {"n_releases": len(records), **summary}

    # ----------------------------------------------------------------- writes
    def append(self, fields: dict, draw: Callable[[], float], budget: float | None = None) -> dict:
        """Atomically check the budget, draw the noisy value and append the record.

        Parameters
        ----------
        fields : dict
            ``query``, ``source``, ``database``, ``epsilon``, ``lambda``,
            ``weight_zero``, ``private``, ``calibration_digest``.
        draw : callable
            Returns the noisy value; called only once the release is allowed,
            inside the transaction.
        budget : float, optional
            Total-ε budget. Fixed in the ledger by the first release naming
            one; a different value later is an error.

        Returns
        -------
        dict
            The record, plus ``budget_spent`` and ``budget_left`` (None without budget).

        Raises
        ------
        BudgetExceededError
            When spent + ε would exceed the budget; nothing is written.
        """
        eps = float(fields["epsilon"])
        if budget is not None and not (math.isfinite(budget) and budget > 0):
            raise InputError(f"--budget must be a positive number; got {budget!r}")
        if budget is not None and not self.path.exists():
            _check_budget(0.0, eps, budget)  # refuse before creating the file
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                stored = self._budget(con)
                if budget is not None and stored is not None and not math.isclose(budget, stored, rel_tol=1e-12):
                    raise InputError(f"ledger {str(self.path)!r} has a total-epsilon budget of {stored:g}, "
                                     f"not {budget:g}; a budget cannot be changed once set")
                limit = stored if stored is not None else budget
                spent = self._spent(con)
                if limit is not None:
                    _check_budget(spent, eps, limit)
                if stored is None and budget is not None:
                    con.execute("INSERT INTO meta VALUES ('budget', ?)", (repr(float(budget)),))
                prev = con.execute("SELECT hash FROM releases ORDER BY seq DESC LIMIT 1").fetchone()
                prev = prev[0] if prev else _GENESIS
                rec = {k: fields.get(k) for k in FIELDS}
                rec["time"] = datetime.now(timezone.utc).isoformat(timespec="microseconds")
                rec["epsilon"], rec["private"] = eps, int(bool(fields["private"]))
                rec["noisy_value"] = float(draw())
                rec["prev_hash"], rec["hash"] = prev, _record_hash(prev, rec)
                cur = con.execute(f"INSERT INTO releases ({', '.join(FIELDS)}, prev_hash, hash) "
                            f"VALUES ({', '.join('?' * (len(FIELDS) + 2))})",
                            [rec[k] for k in FIELDS] + [rec["prev_hash"], rec["hash"]])
                rec["seq"] = cur.lastrowid
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:
            con.close()
        spent += eps
        rec["budget_spent"] = spent
        rec["budget_left"] = None if limit is None else max(limit - spent, 0.0)
        return rec


def _check_budget(spent: float, eps: float, budget: float) -> None:
    if spent + eps > budget * (1 + _BUDGET_RTOL):
        raise BudgetExceededError(
            f"release refused: epsilon {eps:g} would bring the total to {spent + eps:g}, over the budget "
            f"of {budget:g} ({max(budget - spent, 0):g} left); nothing was released or recorded")
