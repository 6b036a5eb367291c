"""Append-only, crash-safe release ledger with a total-ε budget (SPEC 6.5).

One SQLite file in WAL mode with ``synchronous=FULL``: a release is one
``BEGIN IMMEDIATE`` transaction that reads the ε spent so far, refuses when
the budget would be exceeded (sequential composition), draws the noise and
appends the record. A crash before COMMIT leaves no trace; after COMMIT the
record survives (the noisy value may be lost to the user, never the ε).
Triggers forbid UPDATE and DELETE, and every record carries the SHA-256 of
its predecessor's hash plus its own fields, so :meth:`Ledger.verify` detects
edits made behind SQLite's back. A release must spend a positive, finite ε
(checked before the file is opened and by a trigger), so nothing can refund
the budget. A file that is not a ledger (corrupt, truncated, another
database) is refused as bad input before anything is written to it.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
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
CREATE TRIGGER IF NOT EXISTS releases_positive_epsilon BEFORE INSERT ON releases
WHEN NOT (NEW.epsilon > 0 AND NEW.epsilon < 1e308)
BEGIN SELECT RAISE(ABORT, 'a release must spend a positive, finite epsilon'); END;
"""
#: the columns an empdp ledger's ``releases`` table has
_COLUMNS = {"seq", *FIELDS, "prev_hash", "hash"}
#: SQLite primary result codes that mean "this file is not (or no longer) a usable database"
_BAD_FILE_CODES = {11: "SQLITE_CORRUPT", 14: "SQLITE_CANTOPEN", 26: "SQLITE_NOTADB"}
_GENESIS = "0" * 64
#: relative slack on the budget comparison so that e.g. 3 × 0.1 fits a budget of 0.3
_BUDGET_RTOL = 1e-9


class LedgerError(EmpdpError):
    """The ledger's hash chain is broken or its accounting cannot be trusted (exit 1)."""


class LedgerFileError(LedgerError, InputError):
    """The ledger path is not an empdp ledger (corrupt, truncated, another file): bad input (exit 2)."""


def _fix_hint() -> str:
    return ("point --ledger at the right ledger file, or at a new path to start a new ledger "
            "(this file was left unchanged)")


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

    def _bad_file(self, why) -> LedgerFileError:
        return LedgerFileError(f"ledger {str(self.path)!r} is not a readable empdp ledger ({why}); {_fix_hint()}")

    def _translate(self, exc: sqlite3.DatabaseError) -> EmpdpError:
        """A corrupt, truncated or foreign file is bad input; anything else (a lock timeout, a full disk) is not."""
        code = getattr(exc, "sqlite_errorcode", None)
        if (code is not None and code & 0xFF in _BAD_FILE_CODES) or "malformed" in str(exc) \
                or "not a database" in str(exc) or "no such column" in str(exc) or "has no column" in str(exc):
            return self._bad_file(exc)
        return LedgerError(f"ledger {str(self.path)!r}: {exc}")

    def _connect(self) -> sqlite3.Connection:
        if not self.path.parent.is_dir():
            raise InputError(f"ledger folder {str(self.path.parent)!r} does not exist")
        if self.path.is_dir():
            raise LedgerFileError(f"ledger {str(self.path)!r} is a folder, not a file; {_fix_hint()}")
        existing = self.path.exists() and self.path.stat().st_size > 0
        con = None
        try:
            con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            if existing:  # read before anything writes, so a damaged or foreign file is never touched
                self._probe(con)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.executescript(_SCHEMA)
        except (sqlite3.DatabaseError, LedgerError) as exc:
            if con is not None:
                con.close()
            if isinstance(exc, LedgerError):
                raise
            raise self._translate(exc) from None
        return con

    def _probe(self, con) -> None:
        """Refuse a file that fails SQLite's quick check or holds tables that are not a ledger's."""
        status = con.execute("PRAGMA quick_check").fetchone()[0]
        if status != "ok":
            raise self._bad_file(f"corrupt: {status}")
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return
        columns = {r[1] for r in con.execute("PRAGMA table_info(releases)")}
        if not {"meta", "releases"} <= tables or columns != _COLUMNS:
            raise self._bad_file("an SQLite database with other tables")

    # ------------------------------------------------------------------ reads
    def _read(self, fn):
        if not self.path.exists():
            return fn(None)
        con = self._connect()
        try:
            return fn(con)
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            con.close()

    def _spent(self, con) -> float:
        """Σ ε, refusing a ledger with a record that spent nothing or less (older empdp, edited calibration)."""
        bad = con.execute("SELECT seq, epsilon FROM releases WHERE NOT (epsilon > 0 AND epsilon < 1e308) "
                          "ORDER BY seq LIMIT 1").fetchone()
        if bad:
            raise LedgerError(f"ledger {str(self.path)!r}: record {bad[0]} spends epsilon {bad[1]!r}, not a "
                              "positive number, so its total cannot be trusted; start a new ledger with --ledger")
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
        eps = fields.get("epsilon")
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (math.isfinite(eps) and eps > 0):
            raise InputError(f"a release must spend a positive, finite epsilon; got {eps!r} (check the "
                             "calibration's 'epsilon')")
        eps = float(eps)
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
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
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
