"""The ledger's first format (``empdp-ledger/1``), before curator keys (docs/release-security.md).

Table ``releases``, the budget in ``meta`` outside the chain, and an unkeyed
SHA-256 chain: anyone with write access can rewrite it undetected, so
:class:`~empdp.noise.ledger.Ledger` shows and verifies it only with
``allow_unsigned``, and never extends it (it records no curator key and no
digest of the released data).
"""

from __future__ import annotations

from typing import Callable

from ..keys import mac
from .ledger_format import GENESIS, body

FORMAT = "empdp-ledger/1"
#: what a first-format record's hash covers, in order
FIELDS = ("time", "query", "source", "database", "epsilon", "lambda", "weight_zero",
          "noisy_value", "private", "calibration_digest")
COLUMNS = {"seq", *FIELDS, "prev_hash", "hash"}
_TABLES = """
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
_POSITIVE = """
CREATE TRIGGER IF NOT EXISTS releases_positive_epsilon BEFORE INSERT ON releases
WHEN NOT (NEW.epsilon > 0 AND NEW.epsilon < 1e308)
BEGIN SELECT RAISE(ABORT, 'a release must spend a positive, finite epsilon'); END;
"""
#: the schemas first-format files were written with (the positive-epsilon trigger came in a later release)
SCHEMAS = (_TABLES, _TABLES + _POSITIVE)


def record_hash(prev_hash: str, record: dict) -> str:
    """The first format's unkeyed SHA-256 link."""
    return mac(None, prev_hash + body(record, FIELDS))


def verify(con, rows: list[dict], tampered: Callable[[str], Exception]) -> tuple[int, float, float | None, str]:
    """Check the chain of ``rows`` (table ``releases`` in order); return (releases, ε spent, budget, last hash).

    ``tampered(why)`` makes the error raised for the first record that does not verify.
    """
    prev, spent = GENESIS, 0.0
    for expected, rec in enumerate(rows, start=1):
        if rec["seq"] != expected:
            raise tampered(f"record {expected} is missing")
        if rec["prev_hash"] != prev or rec["hash"] != record_hash(prev, rec):
            raise tampered(f"record {expected} does not match its hash (it was edited)")
        if not (isinstance(rec["epsilon"], float) and 0 < rec["epsilon"] < 1e308):
            raise tampered(f"record {expected} spends epsilon {rec['epsilon']!r}, not a positive number, "
                           "so its total cannot be trusted")
        spent, prev = spent + rec["epsilon"], rec["hash"]
    row = con.execute("SELECT value FROM meta WHERE key = 'budget'").fetchone()
    budget = float(row[0]) if row else None
    return len(rows), spent, budget, prev
