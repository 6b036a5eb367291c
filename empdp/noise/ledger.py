"""Append-only, crash-safe, keyed release ledger with a total-ε budget (docs/release-security.md).

One SQLite file (mode 0600) in WAL mode with ``synchronous=FULL``. Every
record is a row of the ``chain`` table, and each carries
HMAC-SHA256(key, previous MAC + its own fields) under the curator key
(:mod:`empdp.keys`):

- record 0, the *genesis*, holds the key id and the budget (NULL: none yet);
- a ``budget`` record fixes the budget of a ledger started without one;
- ``release`` records hold what was released and the ε it spent.

So the budget is inside the chain, and ``meta`` holds only the format and the
*head*: the last record's number and a MAC over it, rewritten by every
release, which detects removed last records. Without the key, no edit,
deletion, insertion or rewritten chain verifies; a whole file rolled back to
an older copy is caught only against a head recorded elsewhere
(``empdp ledger verify --expect-head``).

A release is one ``BEGIN IMMEDIATE`` transaction that (first use) creates the
schema and the genesis, verifies the whole chain, reads the ε spent, refuses
when the budget would be exceeded (sequential composition), draws the noise,
appends the record and moves the head. A crash before COMMIT leaves no trace
(a file killed during creation holds no records and is initialised afresh);
after COMMIT the record survives (the noisy value may be lost to the user,
never the ε). A file that is not a ledger is refused as bad input before
anything is written to it. Ledgers of the first format (an unkeyed SHA-256
chain, the budget outside it; :mod:`.ledger_v1`) are read and extended only
with ``allow_unsigned``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..errors import BudgetExceededError, EmpdpError, InputError
from ..keys import KEY_ENV, key_id, same
from . import ledger_v1
from .ledger_format import CHAIN_FIELDS, FIELDS, FORMAT
from .ledger_format import GENESIS as _GENESIS
from .ledger_format import SCHEMA as _SCHEMA
from .ledger_format import V2_COLUMNS as _V2_COLUMNS
from .ledger_format import head_mac as _head_mac
from .ledger_format import record_mac as _record_mac
from .ledger_format import stored as _stored

#: SQLite primary result codes that mean "this file is not (or no longer) a usable database"
_BAD_FILE_CODES = {11: "SQLITE_CORRUPT", 14: "SQLITE_CANTOPEN", 26: "SQLITE_NOTADB"}
#: relative slack on the budget comparison so that e.g. 3 × 0.1 fits a budget of 0.3
_BUDGET_RTOL = 1e-9
_UNSAFE = "--allow-unsigned (unsafe: see the README)"
#: test hook: a child process started by the fault tests dies (SIGKILL) before the n-th SQL statement
_KILL_ENV = "EMPDP_TEST_KILL_AT_STATEMENT"


class LedgerError(EmpdpError):
    """The ledger cannot be used: a lock timeout, a full disk (exit 1); subclasses are bad input."""


class LedgerFileError(LedgerError, InputError):
    """The ledger path is not an empdp ledger (corrupt, truncated, another file): bad input (exit 2)."""


class LedgerTamperedError(LedgerError, InputError):
    """The ledger's chain, budget or head does not verify under the key, or it needs a key: exit 2."""


def _fix_hint() -> str:
    return ("point --ledger at the right ledger file, or at a new path to start a new ledger "
            "(this file was left unchanged)")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class _Statements:
    """A connection wrapper that counts statements, so a fault test can kill the process before the n-th."""

    def __init__(self, con: sqlite3.Connection):
        self.con, self.n = con, 0
        self.kill_at = int(os.environ.get(_KILL_ENV, "0") or 0)

    def __call__(self, sql: str, params=()):
        self.n += 1
        if self.n == self.kill_at:  # pragma: no cover - runs only in the fault tests' child processes
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return self.con.execute(sql, params)


class Ledger:
    """The release ledger at ``path`` (created on first write, mode 0600).

    Parameters
    ----------
    path : str or Path
        SQLite file. Must not be empty or a symbolic link.
    key : bytes, optional
        The curator key (:func:`empdp.keys.load_key`). Needed to write and to
        verify a keyed ledger.
    allow_unsigned : bool
        Accept (and create, without a key) unkeyed ledgers, which anyone with
        write access can rewrite undetected. Unsafe; for old files and tests.
    """

    def __init__(self, path, key: bytes | None = None, allow_unsigned: bool = False):
        if path is None or not str(path).strip():
            raise InputError("--ledger is empty (an unset shell variable?); give the ledger file's path")
        self.path = Path(path)
        self.key = key
        self.allow_unsigned = bool(allow_unsigned)
        self._writing = False

    # ----------------------------------------------------------- files
    def _bad_file(self, why) -> LedgerFileError:
        return LedgerFileError(f"ledger {str(self.path)!r} is not a readable empdp ledger ({why}); {_fix_hint()}")

    def _tampered(self, why: str) -> LedgerTamperedError:
        done = "; nothing was released or recorded" if self._writing else ""
        return LedgerTamperedError(f"ledger {str(self.path)!r}: {why}{done}")

    def _translate(self, exc: sqlite3.DatabaseError) -> EmpdpError:
        """A corrupt, truncated or foreign file is bad input; anything else (a lock timeout, a full disk) is not."""
        code = getattr(exc, "sqlite_errorcode", None)
        if (code is not None and code & 0xFF in _BAD_FILE_CODES) or "malformed" in str(exc) \
                or "not a database" in str(exc) or "no such column" in str(exc) or "has no column" in str(exc):
            return self._bad_file(exc)
        return LedgerError(f"ledger {str(self.path)!r}: {exc}")

    def check_path(self) -> None:
        """Refuse a symbolic link (also a dangling one), a folder or a missing folder, before any work."""
        if os.path.islink(self.path):
            raise LedgerFileError(f"ledger {str(self.path)!r} is a symbolic link, which empdp does not follow; "
                                  "give the real file's path")
        if not self.path.parent.is_dir():
            raise InputError(f"ledger folder {str(self.path.parent)!r} does not exist")
        if self.path.is_dir():
            raise LedgerFileError(f"ledger {str(self.path)!r} is a folder, not a file; {_fix_hint()}")

    def _create_file(self) -> None:
        """Create the empty file owner-only without following a link planted meanwhile."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            os.close(os.open(self.path, flags, 0o600))
        except FileExistsError:  # another process was first: it is checked like any existing file
            self.check_path()

    def _connect(self, write: bool) -> sqlite3.Connection | None:
        self.check_path()
        if not self.path.exists():
            if not write:
                return None
            self._create_file()
        existing = self.path.stat().st_size > 0
        con = None
        try:
            con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            if existing:  # read before anything writes, so a damaged or foreign file is never touched
                status = con.execute("PRAGMA quick_check").fetchone()[0]
                if status != "ok":
                    raise self._bad_file(f"corrupt: {status}")
                self._layout(con)
            if write:
                _wal(con)
                con.execute("PRAGMA synchronous=FULL")
        except (sqlite3.DatabaseError, LedgerError) as exc:
            if con is not None:
                con.close()
            if isinstance(exc, LedgerError):
                raise
            raise self._translate(exc) from None
        return con

    def _layout(self, con) -> str:
        """'empty' (new, or killed during creation), 'v2', 'v1' (first format); a foreign file is refused."""
        objects = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        if not objects:
            return "empty"
        if {"meta", "chain"} <= objects:
            if {r[1] for r in con.execute("PRAGMA table_info(chain)")} == _V2_COLUMNS:
                empty = all(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0 for t in ("meta", "chain"))
                return "empty" if empty else "v2"
        elif {"meta", "releases"} <= objects:
            if {r[1] for r in con.execute("PRAGMA table_info(releases)")} == ledger_v1.COLUMNS:
                return "v1"
        elif objects <= {"meta", "chain", "releases"} and all(
                con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0 for t in objects & {"meta", "chain"}):
            return "empty"  # part of a schema and no records: nothing to lose
        raise self._bad_file("an SQLite database with other tables")

    # ------------------------------------------------------------------ reads
    def _read(self, fn):
        con = self._connect(write=False)
        if con is None:
            return fn(None)
        try:
            con.execute("BEGIN")  # one snapshot for every SELECT: a writer may commit between them
            return fn(con)
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            con.close()

    def _rows(self, con, table: str) -> list[dict]:
        cur = con.execute(f"SELECT * FROM {table} ORDER BY seq")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur]

    def chain(self) -> list[dict]:
        """Every record in order (genesis, budget and release records), unverified."""
        def fetch(con):
            layout = "empty" if con is None else self._layout(con)
            if layout == "v2":
                return self._rows(con, "chain")
            return [] if layout == "empty" else [{**r, "kind": "release"} for r in self._rows(con, "releases")]
        return self._read(fetch)

    def records(self) -> list[dict]:
        """The release records in order, unverified (use :meth:`verify` to check them)."""
        return [r for r in self.chain() if r["kind"] == "release"]

    def spent(self) -> float:
        """Total ε of all verified releases (sequential composition)."""
        return self.verify()["spent"]

    def budget(self) -> float | None:
        """The verified total-ε budget (None: unlimited so far)."""
        return self.verify()["budget"]

    def verify(self, expect_head: str | None = None) -> dict:
        """Check integrity, key, chain, budget and head; return a summary.

        Parameters
        ----------
        expect_head : str, optional
            A head recorded elsewhere earlier: it must be this ledger's head or
            the MAC of one of its records (the ledger may have grown since).

        Returns
        -------
        dict
            ``n_releases``, ``spent``, ``budget``, ``head`` (the last MAC, to
            record elsewhere), ``signed``, ``key_id``, ``format``.

        Raises
        ------
        LedgerTamperedError
            Naming the first record that does not verify, or why the ledger
            cannot be verified (no key, another key, unsigned).
        """
        def check(con):
            if con is None:
                return _summary(0, 0.0, None, None, bool(self.key), None, FORMAT)
            status = con.execute("PRAGMA integrity_check").fetchone()[0]
            if status != "ok":
                raise self._bad_file(f"corrupt: {status}")
            return self._verify(con)[0]
        summary = self._read(check)
        if expect_head is not None:
            macs = {r.get("mac") or r.get("hash") for r in self.chain()}
            if not any(same(expect_head.strip().lower(), m) for m in macs):
                raise self._tampered(f"the expected head {expect_head!r} is not in this ledger (it was rolled back "
                                     "to an older copy, replaced or rewritten)")
        return summary

    def _verify(self, con) -> tuple[dict, dict]:
        """The summary and the state appends need (``prev``, ``limit`` source); raises on any mismatch."""
        layout = self._layout(con)
        if layout == "empty":
            return _summary(0, 0.0, None, None, bool(self.key), None, FORMAT), {"layout": layout}
        if layout == "v1":
            return self._verify_v1(con)
        rows = self._rows(con, "chain")
        if not rows or rows[0]["seq"] != 0 or rows[0]["kind"] != "genesis":
            raise self._tampered("its genesis record (record 0, which holds the budget) is missing")
        kid = rows[0]["key_id"]
        key = self._key_for(kid)
        prev, budget, spent, n = _GENESIS, None, 0.0, 0
        for expected, rec in enumerate(rows):
            name = "the genesis record (record 0)" if expected == 0 else f"record {expected}"
            if rec["seq"] != expected:
                raise self._tampered(f"record {expected} is missing")
            if not (same(rec["prev_mac"], prev) and same(rec["mac"], _record_mac(key, prev, rec))):
                raise self._tampered(f"{name} does not match its {'HMAC' if key else 'hash'} (it was edited, "
                                     f"inserted or re-chained{' without the key' if key else ''})")
            if expected and rec["kind"] == "genesis" or rec["key_id"] != (kid if expected == 0 else None):
                raise self._tampered(f"{name} is not a valid record")
            if rec["kind"] in ("genesis", "budget") and rec["budget"] is not None:
                b = rec["budget"]
                if budget is not None or not (isinstance(b, float) and math.isfinite(b) and b > 0):
                    raise self._tampered(f"{name} sets the budget {'twice' if budget is not None else f'to {b!r}'}")
                budget = b
            elif rec["kind"] == "release":
                eps = rec["epsilon"]
                if not (isinstance(eps, float) and 0 < eps < 1e308):
                    raise self._tampered(f"{name} spends epsilon {eps!r}, not a positive number")
                spent, n = spent + eps, n + 1
            elif rec["kind"] != ("genesis" if expected == 0 else "budget"):
                raise self._tampered(f"{name} has the unknown kind {rec['kind']!r}")
            prev = rec["mac"]
        last = rows[-1]["seq"]
        head = {r[0]: r[1] for r in con.execute("SELECT key, value FROM meta")}
        try:
            stored = json.loads(head.get("head", "null"))
            ok = stored["seq"] == last and same(stored["mac"], _head_mac(key, last, prev))
        except (ValueError, TypeError, KeyError, RecursionError):
            ok, stored = False, None
        if not ok:
            told = stored.get("seq") if isinstance(stored, dict) else None
            why = (f"its last records were removed (the head names record {told}, the chain ends at {last})"
                   if isinstance(told, int) and told > last else "its head (meta) does not match the chain")
            raise self._tampered(why)
        summary = _summary(n, spent, budget, prev, key is not None, kid, FORMAT)
        return summary, {"layout": layout, "prev": prev, "last": last, "key": key}

    def _key_for(self, kid: str | None) -> bytes | None:
        """The key that verifies a ledger whose genesis names ``kid`` (None: unsigned), or a refusal."""
        if kid is None:
            if not self.allow_unsigned:
                raise self._tampered(f"it is not signed (made without a curator key), so edits to it cannot be "
                                     f"detected; start a new ledger with a key, or pass {_UNSAFE}")
            return None
        if self.key is None:
            raise self._tampered(f"it is signed with the curator key {kid}; give it with --key-file FILE or "
                                 f"${KEY_ENV}")
        if key_id(self.key) != kid:
            raise self._tampered(f"it was signed with another key (key id {kid}; the key given has id "
                                 f"{key_id(self.key)})")
        return self.key

    def _verify_v1(self, con) -> tuple[dict, dict]:
        if not self.allow_unsigned:
            raise self._tampered("it has the first, unkeyed ledger format (its budget and records can be rewritten "
                                 f"undetected); start a new ledger, or pass {_UNSAFE} to use it")
        n, spent, budget, prev = ledger_v1.verify(con, self._rows(con, "releases"), self._tampered)
        summary = _summary(n, spent, budget, prev if n else None, False, None, ledger_v1.FORMAT)
        return summary, {"layout": "v1", "prev": prev}

    # ----------------------------------------------------------------- writes
    def append(self, fields: dict, draw: Callable[[], float], budget: float | None = None) -> dict:
        """Atomically verify the ledger, check the budget, draw the noisy value and append the record.

        Parameters
        ----------
        fields : dict
            ``query``, ``source``, ``database``, ``epsilon``, ``lambda``,
            ``weight_zero``, ``private``, ``noise_added``, ``calibration_digest``.
        draw : callable
            Returns the noisy value (a number, or for a joint release a list,
            stored as JSON text under the record's MAC); called only once the
            release is allowed, inside the transaction.
        budget : float, optional
            Total-ε budget. Fixed in the chain by the first release naming
            one; a different value later is an error.

        Returns
        -------
        dict
            The record, plus ``budget_spent``, ``budget_left`` (None without
            budget) and ``head``.

        Raises
        ------
        BudgetExceededError
            When spent + ε would exceed the budget; nothing is written.
        LedgerTamperedError
            When the ledger does not verify, or there is no key and not
            ``allow_unsigned``; nothing is written.
        """
        eps = fields.get("epsilon")
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < 1e308:
            raise InputError(f"a release must spend a positive, finite epsilon; got {eps!r} (check the "
                             "calibration's 'epsilon')")
        eps = float(eps)
        if budget is not None and not (isinstance(budget, numbers.Real) and math.isfinite(budget) and budget > 0):
            raise InputError(f"--budget must be a positive number; got {budget!r}")
        if self.key is None and not self.allow_unsigned:
            raise InputError(f"a release needs the curator key to sign the ledger: give --key-file FILE or set "
                             f"${KEY_ENV} (or pass {_UNSAFE})")
        self.check_path()
        if budget is not None and not self.path.exists():
            _check_budget(0.0, eps, budget)  # refuse before creating the file
        self._writing = True
        con = self._connect(write=True)
        sql = _Statements(con)
        try:
            sql("BEGIN IMMEDIATE")
            try:
                rec = self._append(con, sql, fields, eps, budget, draw)
                sql("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            con.close()
            self._writing = False
        return rec

    def _append(self, con, sql, fields, eps, budget, draw) -> dict:
        if self._layout(con) == "empty":  # first use: schema and genesis in this transaction
            self._initialise(con, sql, budget)
        summary, state = self._verify(con)
        stored, spent = summary["budget"], summary["spent"]
        if budget is not None and stored is not None and not math.isclose(budget, stored, rel_tol=1e-12):
            raise InputError(f"ledger {str(self.path)!r} has a total-epsilon budget of {stored:g}, "
                             f"not {budget:g}; a budget cannot be changed once set")
        limit = stored if stored is not None else budget
        if limit is not None:
            _check_budget(spent, eps, limit)
        rec = {k: fields.get(k) for k in FIELDS}
        rec["epsilon"], rec["private"] = eps, int(bool(fields["private"]))
        rec["noise_added"] = int(bool(fields.get("noise_added", True)))
        if state["layout"] == "v1":
            rec["time"], rec["noisy_value"] = _now(), _noisy(draw())
            rec = ledger_v1.append(sql, state["prev"], _stored(rec), budget if stored is None else None)
            head = rec["hash"]
        else:
            key, prev, seq = state["key"], state["prev"], state["last"]
            if stored is None and budget is not None:
                seq += 1
                prev = self._insert(sql, key, prev, {"seq": seq, "kind": "budget", "time": _now(), "budget": budget})
            rec.update(seq=seq + 1, kind="release", time=_now(), noisy_value=_noisy(draw()))
            head = self._insert(sql, key, prev, rec)
            sql("INSERT OR REPLACE INTO meta VALUES ('head', ?)",
                (json.dumps({"seq": rec["seq"], "mac": _head_mac(key, rec["seq"], head)}),))
        rec["budget_spent"] = spent + eps
        rec["budget_left"] = None if limit is None else max(limit - rec["budget_spent"], 0.0)
        rec["head"] = head
        return rec

    def _initialise(self, con, sql, budget) -> None:
        for name in ("meta", "chain"):  # a schema left by a process killed mid-creation holds no records
            sql(f"DROP TABLE IF EXISTS {name}")
        sql("DROP VIEW IF EXISTS releases")
        sql("DROP TABLE IF EXISTS releases")
        for statement in _SCHEMA:
            sql(statement)
        sql("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
        kid = key_id(self.key) if self.key is not None else None
        genesis = {"seq": 0, "kind": "genesis", "time": _now(), "budget": None if budget is None else float(budget),
                   "key_id": kid}
        last = self._insert(sql, self.key, _GENESIS, genesis)
        sql("INSERT INTO meta VALUES ('head', ?)", (json.dumps({"seq": 0, "mac": _head_mac(self.key, 0, last)}),))

    @staticmethod
    def _insert(sql, key, prev: str, rec: dict) -> str:
        full = _stored({k: rec.get(k) for k in CHAIN_FIELDS})
        full["prev_mac"], full["mac"] = prev, _record_mac(key, prev, full)
        names = [*CHAIN_FIELDS, "prev_mac", "mac"]
        sql(f"INSERT INTO chain ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
            [full[k] for k in names])
        rec["prev_mac"], rec["mac"] = prev, full["mac"]
        return full["mac"]


def _noisy(value):
    """The drawn release: a float, or for a joint release the list of its floats (stored as JSON text)."""
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else float(value)


def _summary(n, spent, budget, head, signed, kid, fmt) -> dict:
    return {"n_releases": n, "spent": spent, "budget": budget, "head": head, "signed": signed, "key_id": kid,
            "format": fmt}


def _check_budget(spent: float, eps: float, budget: float) -> None:
    if spent + eps > budget * (1 + _BUDGET_RTOL):
        raise BudgetExceededError(
            f"release refused: epsilon {eps:g} would bring the total to {spent + eps:g}, over the budget "
            f"of {budget:g} ({max(budget - spent, 0):g} left); nothing was released or recorded")


def _wal(con: sqlite3.Connection, wait: float = 30.0) -> None:
    """Switch to WAL mode, waiting like every other statement does for another writer's lock.

    Changing the journal mode can fail at once with 'database is locked' while another process
    holds the file (SQLite's busy timeout does not always cover it): concurrent first use of a
    new ledger under load hit it. Retried with a short back-off for up to ``wait`` seconds.
    """
    deadline = time.monotonic() + wait
    delay = 0.01
    while True:
        try:
            con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
