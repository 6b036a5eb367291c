"""Append-only, crash-safe, keyed release ledger with a total-ε budget (docs/release-security.md).

One SQLite file (mode 0600) in WAL mode with ``synchronous=FULL``. Every
record is a row of the ``chain`` table, and each carries
HMAC-SHA256(key, previous MAC + its own fields) under the curator key
(:mod:`empdp.keys`):

- record 0, the *genesis*, holds the key id and the budget (NULL: unlimited);
- a ``budget`` record fixes the budget of a ledger started without one;
- ``release`` records hold what was released, the ε it spent and the digest
  of the data it was computed from (``source_digest``).

So the budget is inside the chain, and ``meta`` holds only the format and the
*head*: the last record's number and a MAC over it, rewritten by every
release, which detects removed last records. Without the key, no edit,
deletion, insertion or rewritten chain verifies; a whole file rolled back to
an older copy is caught only against a head recorded elsewhere
(``--expect-head``).

The ledger trusts nothing it did not write. Before anything is read, the
file's whole schema (every table, view, index and trigger, by its SQL text)
must be one empdp wrote, to the letter: a trigger planted to swallow the
INSERT of a release (``RAISE(IGNORE)``) or to rewrite it is refused. A
ledger is created only at a path that does not exist and only with an
explicit budget (a number or :data:`UNLIMITED`): it is built complete in a
temporary file and linked into place, so no path ever holds half a ledger,
and an empty or foreign file is refused, never initialised.

A release is one ``BEGIN IMMEDIATE`` transaction that verifies the whole
chain, reads the ε spent, refuses when the budget would be exceeded
(sequential composition), draws the noise, appends the record, moves the
head, and reads the chain back and verifies it again before COMMIT; after
COMMIT a fresh read-only connection confirms the record is there. Only then
is the noisy value returned. A crash before COMMIT leaves no trace; after
COMMIT the record survives (the noisy value may be lost to the user, never
the ε). Reading (``ledger show|verify``) opens the file read-only, so it
works on a read-only file system. Second-format files (no
``source_digest``) are verified, and migrated by their next release; files of
the first format (an unkeyed SHA-256 chain; :mod:`.ledger_v1`) are shown and
verified only with ``allow_unsigned``, never extended.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import secrets
import sqlite3
import time
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Callable

from ..errors import BudgetExceededError, EmpdpError, InputError
from ..keys import KEY_ENV, key_id, same
from . import ledger_v1
from .ledger_format import CHAIN_FIELDS, FIELDS, FORMAT, FORMAT_V2, MIGRATE_V3, schema_made_by, schema_of
from .ledger_format import GENESIS as _GENESIS
from .ledger_format import SCHEMA as _SCHEMA
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
#: the budget that starts a ledger without a limit on the ε spent (``--budget unlimited``)
UNLIMITED = "unlimited"


@cache
def _known_schemas() -> dict[str, list]:
    """Each layout empdp ever wrote -> its exact schema (:func:`~.ledger_format.schema_made_by`)."""
    known = {"v3": [schema_made_by((*_SCHEMA, *MIGRATE_V3))], "v2": [schema_made_by(_SCHEMA)],
             "v1": [schema_made_by((s,)) for s in ledger_v1.SCHEMAS]}
    return known


def parse_budget(value) -> float | str | None:
    """A total-ε budget as given: None (keep the ledger's), :data:`UNLIMITED`, or a positive finite number.

    Raises
    ------
    InputError
        For anything else (NaN, infinity, zero, a negative number, other text).
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == UNLIMITED:
            return UNLIMITED
        try:
            value = float(text)
        except ValueError:
            value = None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        shown = str(value)[:40] if not isinstance(value, str) else value[:40]
        raise InputError(f"the budget must be a positive number of epsilon or 'unlimited'; got {shown!r}")
    return float(value)


class LedgerError(EmpdpError):
    """The ledger cannot be used: a lock timeout, a full disk (exit 1); subclasses are bad input."""


class LedgerFileError(LedgerError, InputError):
    """The ledger path is not an empdp ledger (corrupt, truncated, another file): bad input (exit 2)."""


class LedgerTamperedError(LedgerError, InputError):
    """The ledger's chain, budget or head does not verify under the key, or it needs a key: exit 2."""


def _fix_hint() -> str:
    return ("point --ledger at the right ledger file, or at a new path (with --budget) to start a new ledger "
            "(this file was left unchanged)")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class _Statements:
    """A connection wrapper that counts the process's ledger statements (building a new ledger aside, then
    appending to it), so a fault test can kill the process before the n-th."""

    n = 0  # over every connection of the process, in order

    def __init__(self, con: sqlite3.Connection):
        self.con = con
        self.kill_at = int(os.environ.get(_KILL_ENV, "0") or 0)

    def __call__(self, sql: str, params=()):
        _Statements.n += 1
        if _Statements.n == self.kill_at:  # pragma: no cover - runs only in the fault tests' child processes
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return self.con.execute(sql, params)


class Ledger:
    """The release ledger at ``path`` (mode 0600).

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
            raise InputError("`ledger` is empty (an unset shell variable?); give the ledger file's path",
                             param="ledger")
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
                or "not a database" in str(exc):
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
        if self.path.exists() and not self.path.is_file():
            raise LedgerFileError(f"ledger {str(self.path)!r} is not a regular file; {_fix_hint()}")

    def exists(self) -> bool:
        """Whether a file is at the ledger's path (checked like :meth:`check_path` first)."""
        self.check_path()
        return self.path.exists()

    def _connect(self, write: bool) -> tuple[sqlite3.Connection, str] | None:
        """An open connection and the file's layout ('v3', 'v2', 'v1'); None when no file is there.

        The schema is compared with the ones empdp writes before anything else is read from the
        file, and reads open it read-only (also on a read-only file system).
        """
        if not self.exists():
            return None
        if self.path.stat().st_size == 0:
            raise self._bad_file("it is an empty file (0 bytes); empdp creates a new ledger only at a path that "
                                 "does not exist")
        con = None
        try:
            con = sqlite3.connect(self.path, timeout=30, isolation_level=None) if write else self._read_only()
            con.execute("PRAGMA trusted_schema=OFF")  # nothing in the file may run functions with side effects
            layout = self._layout(con)
            status = con.execute("PRAGMA quick_check").fetchone()[0]
            if status != "ok":
                raise self._bad_file(f"corrupt: {status}")
            if write:
                _wal(con)
                con.execute("PRAGMA synchronous=FULL")
        except (sqlite3.DatabaseError, LedgerError) as exc:
            if con is not None:
                con.close()
            if isinstance(exc, LedgerError):
                raise
            raise self._translate(exc) from None
        return con, layout

    def _read_only(self) -> sqlite3.Connection:
        """A read-only connection; on a read-only file system (a WAL file whose shared-memory file cannot
        be created there) the file is opened as immutable, which no one can then change."""
        uri = self.path.absolute().as_uri()
        con = None
        try:
            con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30, isolation_level=None)
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return con
        except sqlite3.OperationalError as exc:
            if con is not None:
                con.close()
            if "unable to open" not in str(exc) and "readonly" not in str(exc).replace("-", "").replace(" ", ""):
                raise
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)

    def _layout(self, con) -> str:
        """'v3', 'v2' or 'v1', when the file's schema is exactly one empdp wrote; anything else is refused."""
        found = schema_of(con)
        for layout, schemas in _known_schemas().items():
            if found in schemas:
                return layout
        raise self._bad_file(_schema_difference(found, _known_schemas()["v3"][0]))

    # ------------------------------------------------------------------ reads
    def _read(self, fn):
        opened = self._connect(write=False)
        if opened is None:
            return fn(None, None)
        con, layout = opened
        try:
            con.execute("BEGIN")  # one snapshot for every SELECT: a writer may commit between them
            return fn(con, layout)
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            con.close()

    @staticmethod
    def _rows(con, table: str) -> list[dict]:
        cur = con.execute(f"SELECT * FROM {table} ORDER BY seq")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur]

    def chain(self) -> list[dict]:
        """Every record in order (genesis, budget and release records), unverified."""
        def fetch(con, layout):
            if con is None:
                return []
            if layout == "v1":
                return [{**r, "kind": "release"} for r in self._rows(con, "releases")]
            return self._rows(con, "chain")
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
        """Check schema, integrity, key, chain, budget and head (read-only); return a summary.

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
        LedgerFileError
            The path holds no ledger, or not one empdp wrote (its schema differs).
        LedgerTamperedError
            Naming the first record that does not verify, or why the ledger
            cannot be verified (no key, another key, unsigned, another head).
        """
        def check(con, layout):
            if con is None:
                raise self._bad_file("no file is there")
            status = con.execute("PRAGMA integrity_check").fetchone()[0]
            if status != "ok":
                raise self._bad_file(f"corrupt: {status}")
            summary, state = self._verify(con, layout)
            self._check_head(state["macs"], expect_head)
            return summary
        return self._read(check)

    def _check_head(self, macs: list, expect_head: str | None) -> None:
        if expect_head is not None and not any(same(str(expect_head).strip().lower(), m) for m in macs):
            raise self._tampered(f"the expected head {str(expect_head)[:80]!r} is not in this ledger (it was rolled "
                                 "back to an older copy, replaced or rewritten)")

    def _verify(self, con, layout: str) -> tuple[dict, dict]:
        """The summary and the state appends need (``prev``, ``last``, ``key``, ``macs``, ``rows``); raises on
        any mismatch."""
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
                raise self._tampered(f"{name} has the unknown kind {str(rec['kind'])[:40]!r}")
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
        fmt = FORMAT if layout == "v3" else FORMAT_V2
        summary = _summary(n, spent, budget, prev, key is not None, kid, fmt)
        return summary, {"layout": layout, "prev": prev, "last": last, "key": key, "rows": rows,
                         "macs": [r["mac"] for r in rows]}

    def _key_for(self, kid: str | None) -> bytes | None:
        """The key that verifies a ledger whose genesis names ``kid`` (None: unsigned), or a refusal."""
        if kid is None:
            if not self.allow_unsigned:
                raise self._tampered(f"it is not signed (made without a curator key), so edits to it cannot be "
                                     f"detected; start a new ledger with a key, or pass {_UNSAFE}")
            return None
        if self.key is None:
            raise self._tampered(f"it is signed with the curator key {str(kid)[:16]}; give it with --key-file FILE "
                                 f"or ${KEY_ENV}")
        if key_id(self.key) != kid:
            raise self._tampered(f"it was signed with another key (key id {str(kid)[:16]}; the key given has id "
                                 f"{key_id(self.key)})")
        return self.key

    def _verify_v1(self, con) -> tuple[dict, dict]:
        if not self.allow_unsigned:
            raise self._tampered("it has the first, unkeyed ledger format (its budget and records can be rewritten "
                                 f"undetected); start a new ledger, or pass {_UNSAFE} to show or verify it")
        rows = self._rows(con, "releases")
        n, spent, budget, prev = ledger_v1.verify(con, rows, self._tampered)
        summary = _summary(n, spent, budget, prev if n else None, False, None, ledger_v1.FORMAT)
        return summary, {"layout": "v1", "prev": prev, "macs": [r["hash"] for r in rows]}

    # ----------------------------------------------------------------- writes
    def check_release(self, budget=None, expect_head: str | None = None) -> dict | None:
        """Refuse, before any work, a release this ledger would refuse: the summary, or None for a new ledger.

        A path with no file becomes a new ledger only with an explicit ``budget`` (a number or
        :data:`UNLIMITED`); an existing ledger must verify (and hold ``expect_head``), and a budget
        given must agree with the one it has.
        """
        budget = parse_budget(budget)
        if not self.exists():
            if budget is None:
                raise LedgerFileError(
                    f"ledger {str(self.path)!r} does not exist; to start a new ledger there give its total-epsilon "
                    "budget, --budget N (or --budget unlimited), or point --ledger at the existing ledger")
            if expect_head is not None:
                raise self._tampered("it does not exist, so it cannot hold the expected head (was it deleted "
                                     "or moved?)")
            return None
        summary = self.verify(expect_head)
        if summary["format"] == ledger_v1.FORMAT:
            raise self._v1_read_only()
        _agree(self.path, budget, summary["budget"])
        return summary

    def append(self, fields: dict, draw: Callable[[], float], budget=None, expect_head: str | None = None) -> dict:
        """Atomically verify the ledger, check the budget, draw the noisy value and append the record.

        Parameters
        ----------
        fields : dict
            ``query``, ``source``, ``source_digest``, ``database``, ``epsilon``,
            ``lambda``, ``weight_zero``, ``private``, ``noise_added``,
            ``calibration_digest``.
        draw : callable
            Returns the noisy value (a number, or for a joint release a list,
            stored as JSON text under the record's MAC); called only once the
            release is allowed, inside the transaction.
        budget : float or ``"unlimited"``, optional
            Total-ε budget. Needed to create a ledger (a path with no file);
            on a ledger without one, a number is fixed by a chained record; a
            different value later is an error.
        expect_head : str, optional
            A head recorded elsewhere that must be in the ledger (catches a
            roll-back or a replaced file before anything is spent).

        Returns
        -------
        dict
            The record, plus ``budget_spent``, ``budget_left`` (None without
            budget), ``head`` and ``created`` (a new ledger was started).

        Raises
        ------
        BudgetExceededError
            When spent + ε would exceed the budget; nothing is written.
        LedgerTamperedError, LedgerFileError
            When the ledger does not verify, is not one empdp wrote, or there
            is no key and not ``allow_unsigned``; nothing is written.
        """
        eps = fields.get("epsilon")
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 < eps < 1e308:
            raise InputError(f"a release must spend a positive, finite epsilon; got {eps!r} (check the "
                             "calibration's 'epsilon')")
        eps = float(eps)
        budget = parse_budget(budget)
        if not isinstance(fields.get("source_digest"), str) or not fields["source_digest"]:
            raise InputError("a release must name the data it was computed from (its source_digest)")
        if self.key is None and not self.allow_unsigned:
            raise InputError(f"a release needs the curator key to sign the ledger: give `key_file` FILE or set "
                             f"${KEY_ENV} (or pass {_UNSAFE})", param="key_file")
        created = False
        if not self.exists():
            self.check_release(budget, expect_head)
            if isinstance(budget, float):
                _check_budget(0.0, eps, budget)  # refuse before creating the file
            created = self._create(budget)
        self._writing = True
        try:
            con, layout = self._connect(write=True)
        except BaseException:
            self._writing = False
            raise
        sql = _Statements(con)
        try:
            sql("BEGIN IMMEDIATE")
            try:
                rec = self._append(con, layout, sql, fields, eps, budget, draw, expect_head)
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
        self._confirm(rec)
        rec["created"] = created
        return rec

    def _append(self, con, layout, sql, fields, eps, budget, draw, expect_head) -> dict:
        if self._layout(con) != layout:  # changed by another process since it was opened: check it afresh
            raise self._bad_file("its schema changed while it was opened")
        summary, state = self._verify(con, layout)
        if layout == "v1":
            raise self._v1_read_only()
        self._check_head(state["macs"], expect_head)
        stored = summary["budget"]
        _agree(self.path, budget, stored)
        limit = stored if stored is not None else budget if isinstance(budget, float) else None
        spent = summary["spent"]
        if limit is not None:
            _check_budget(spent, eps, limit)
        if layout == "v2":  # the old records keep their MACs (ledger_format.record_mac)
            for statement in MIGRATE_V3:
                sql(statement)
            sql("UPDATE meta SET value = ? WHERE key = 'format'", (FORMAT,))
        rec = {k: fields.get(k) for k in FIELDS}
        rec["epsilon"], rec["private"] = eps, int(bool(fields["private"]))
        rec["noise_added"] = int(bool(fields.get("noise_added", True)))
        key, prev, seq = state["key"], state["prev"], state["last"]
        written = []
        if stored is None and isinstance(budget, float):
            seq += 1
            budget_rec = {"seq": seq, "kind": "budget", "time": _now(), "budget": budget}
            prev = self._insert(sql, key, prev, budget_rec)
            written.append(budget_rec)
        rec.update(seq=seq + 1, kind="release", time=_now(), noisy_value=_noisy(draw()))
        head = self._insert(sql, key, prev, rec)
        written.append(rec)
        sql("INSERT OR REPLACE INTO meta VALUES ('head', ?)",
            (json.dumps({"seq": rec["seq"], "mac": _head_mac(key, rec["seq"], head)}),))
        self._read_back(con, written, summary["n_releases"] + 1, head)
        rec["budget_spent"] = spent + eps
        rec["budget_left"] = None if limit is None else max(limit - rec["budget_spent"], 0.0)
        rec["head"] = head
        return rec

    def _read_back(self, con, written: list[dict], n_releases: int, head: str) -> None:
        """Inside the transaction: the chain read back verifies, ends with exactly the records just written,
        field for field, and its head is theirs; otherwise the release is rolled back."""
        summary, state = self._verify(con, "v3")
        tail = state["rows"][-len(written):]
        same_rows = len(state["rows"]) >= len(written) and all(
            row == {**_stored({k: rec.get(k) for k in CHAIN_FIELDS}), "prev_mac": rec["prev_mac"], "mac": rec["mac"]}
            for row, rec in zip(tail, written))
        if not (same_rows and summary["n_releases"] == n_releases and same(summary["head"], head)):
            raise self._tampered("the release did not read back as written (something in the file changed it); "
                                 "the transaction was rolled back")

    def _confirm(self, rec: dict) -> None:
        """After COMMIT, a fresh read-only connection must find the record: only then is the value returned."""
        def find(con, layout):
            if con is None:
                return None
            row = con.execute("SELECT mac FROM chain WHERE seq = ?", (rec["seq"],)).fetchone()
            return row[0] if row else None
        if not same(self._read(find), rec["mac"]):
            raise LedgerError(f"ledger {str(self.path)!r}: the release was committed but cannot be read back; "
                              "its value is withheld: check the ledger with 'empdp ledger verify'")

    def _create(self, budget) -> bool:
        """Build a whole new ledger (schema, genesis, head) in a temporary file and link it to the path.

        Returns False when another process linked its own first (that ledger is then used, and
        checked like any existing file). Nothing is ever at the path but a complete ledger.
        """
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(8)}.new")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        os.close(os.open(tmp, flags, 0o600))
        try:
            con = sqlite3.connect(tmp, isolation_level=None)
            try:
                sql = _Statements(con)
                sql("BEGIN IMMEDIATE")
                for statement in (*_SCHEMA, *MIGRATE_V3):
                    sql(statement)
                sql("INSERT INTO meta VALUES ('format', ?)", (FORMAT,))
                kid = key_id(self.key) if self.key is not None else None
                genesis = {"seq": 0, "kind": "genesis", "time": _now(),
                           "budget": budget if isinstance(budget, float) else None, "key_id": kid}
                last = self._insert(sql, self.key, _GENESIS, genesis)
                sql("INSERT INTO meta VALUES ('head', ?)", (json.dumps({"seq": 0, "mac": _head_mac(self.key, 0, last)}),))
                sql("COMMIT")
            finally:
                con.close()
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError as exc:
                raise LedgerError(f"cannot create the ledger {str(self.path)!r}: {exc.strerror or exc} (empdp "
                                  "needs a file system with hard links to create a ledger atomically)") from None
            _sync_folder(self.path.parent)
            return True
        finally:
            os.unlink(tmp)

    def _v1_read_only(self) -> LedgerFileError:
        return LedgerFileError(f"ledger {str(self.path)!r} has the first format ({ledger_v1.FORMAT}), which records "
                               "no curator key and no digest of the released data: it can be shown and verified, "
                               "not extended; start a new ledger at another path with --budget (the budget left)")

    @staticmethod
    def _insert(sql, key, prev: str, rec: dict) -> str:
        full = _stored({k: rec.get(k) for k in CHAIN_FIELDS})
        full["prev_mac"], full["mac"] = prev, _record_mac(key, prev, full)
        names = [*CHAIN_FIELDS, "prev_mac", "mac"]
        cur = sql(f"INSERT INTO chain ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                  [full[k] for k in names])
        if cur.rowcount != 1:
            raise LedgerTamperedError("the ledger did not store the record (an INSERT changed no row); nothing "
                                      "was released or recorded")
        rec["prev_mac"], rec["mac"] = prev, full["mac"]
        return full["mac"]


def _agree(path: Path, budget, stored: float | None) -> None:
    """A budget given for an existing ledger must be the one it has (or, on one without, a new number)."""
    if budget is None:
        return
    if budget == UNLIMITED and stored is not None or isinstance(budget, float) and stored is not None \
            and not math.isclose(budget, stored, rel_tol=1e-12):
        raise InputError(f"ledger {str(path)!r} has a total-epsilon budget of {stored:g}, not {budget}; a budget "
                         "cannot be changed once set")


def _schema_difference(found: list[tuple], expected: list[tuple]) -> str:
    """What makes a schema not an empdp ledger's, in a few words (extra, missing or changed objects)."""
    if not found:
        return "an SQLite database with no tables"
    have = {(t, n): s for t, n, _, s in found}
    want = {(t, n): s for t, n, _, s in expected}
    extra = [f"{t} {n!r}" for (t, n) in have if (t, n) not in want]
    missing = [f"{t} {n!r}" for (t, n) in want if (t, n) not in have]
    changed = [f"{t} {n!r}" for (t, n) in have if (t, n) in want and have[t, n] != want[t, n]]
    parts = [f"{label} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
             for label, names in (("an unexpected", extra), ("a changed", changed), ("no", missing)) if names]
    return "its schema is not one empdp writes: " + "; ".join(parts)


def _sync_folder(folder: Path) -> None:
    """fsync a folder so that a new name in it survives a crash (best effort where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
