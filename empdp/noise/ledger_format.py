"""What a ledger file holds (docs/release-security.md): its schema, its records' fields and how they are MACed.

Shared by :mod:`.ledger` (the second, keyed format) and :mod:`.ledger_v1`
(the first, unkeyed one), whose record encoding and genesis link the second
format kept.
"""

from __future__ import annotations

import json
import sqlite3

from ..keys import mac

FORMAT = "empdp-ledger/3"
#: the second format: the third's records without ``source_digest`` (a second-format file is migrated
#: by adding that column, and its old records keep their MACs)
FORMAT_V2 = "empdp-ledger/2"
#: what a release record holds (the dict :meth:`Ledger.append` takes, plus time and noisy value)
FIELDS = ("time", "query", "source", "database", "epsilon", "lambda", "weight_zero",
          "noisy_value", "private", "noise_added", "calibration_digest", "source_digest")
#: the columns a second-format record's MAC covers, in order
CHAIN_FIELDS_V2 = ("seq", "kind", "time", "budget", "key_id", "query", "source", "database", "epsilon", "lambda",
                   "weight_zero", "noisy_value", "private", "noise_added", "calibration_digest")
#: every column of a record but its links: a third-format record's MAC covers them all, in this order
CHAIN_FIELDS = (*CHAIN_FIELDS_V2, "source_digest")
SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE chain (
        seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, time TEXT NOT NULL, budget REAL, key_id TEXT,
        query TEXT, source TEXT, database TEXT, epsilon REAL, lambda REAL, weight_zero REAL,
        noisy_value REAL, private INTEGER, noise_added INTEGER, calibration_digest TEXT,
        prev_mac TEXT NOT NULL, mac TEXT NOT NULL)""",
    "CREATE VIEW releases AS SELECT * FROM chain WHERE kind = 'release'",
    """CREATE TRIGGER chain_no_update BEFORE UPDATE ON chain
       BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END""",
    """CREATE TRIGGER chain_no_delete BEFORE DELETE ON chain
       BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END""",
    """CREATE TRIGGER chain_positive_epsilon BEFORE INSERT ON chain
       WHEN NEW.kind = 'release' AND NOT (NEW.epsilon > 0 AND NEW.epsilon < 1e308)
       BEGIN SELECT RAISE(ABORT, 'a release must spend a positive, finite epsilon'); END""",
)
#: the third format: the second's schema and this column (so that a migrated second-format file and a
#: new one have the same schema, to the letter)
MIGRATE_V3 = ("ALTER TABLE chain ADD COLUMN source_digest TEXT",)
#: the link before the first record
GENESIS = "0" * 64
#: the columns SQLite stores as REAL and as INTEGER (everything else but NULL is TEXT)
REAL = {"budget", "epsilon", "lambda", "weight_zero", "noisy_value"}
INTEGER = {"seq", "private", "noise_added"}


def body(rec: dict, names) -> str:
    """The text a record's hash or HMAC covers: its ``names`` fields as compact JSON."""
    return json.dumps([rec[k] for k in names], separators=(",", ":"), allow_nan=False)


def record_mac(key: bytes | None, prev: str, rec: dict) -> str:
    """A record's link: HMAC(key, previous MAC + its fields); SHA-256 without a key.

    A record without ``source_digest`` (genesis and budget records, and the releases of a
    second-format file) is MACed over the second format's fields: a list of 15 values, never
    equal to a third-format record's 16, so neither can be passed off as the other.
    """
    names = CHAIN_FIELDS if rec.get("source_digest") is not None else CHAIN_FIELDS_V2
    return mac(key, prev + body(rec, names))


def schema_of(con: sqlite3.Connection) -> list[tuple]:
    """Every object of a database's schema (tables, views, indexes, triggers) with its SQL text, sorted."""
    return sorted(con.execute("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master"))


def schema_made_by(statements) -> list[tuple]:
    """The schema ``statements`` make in an empty database (:func:`schema_of`): what a ledger file of
    that format must hold, object for object and letter for letter."""
    con = sqlite3.connect(":memory:")
    try:
        for statement in statements:
            con.executescript(statement)
        return schema_of(con)
    finally:
        con.close()


def head_mac(key: bytes | None, seq: int, last: str) -> str:
    """The MAC of the head: the last record's number and MAC, so that removing last records is noticed."""
    return mac(key, f"head:{seq}:{last}")


def vector_text(values) -> str:
    """A joint release's vector (noisy value, noise scales or weights) as the compact JSON text its REAL
    column holds: SQLite keeps text that is not a number as TEXT, and the MAC covers that text."""
    return json.dumps([float(v) for v in values], separators=(",", ":"), allow_nan=False)


def read_vector(value):
    """A REAL column's value as written: a number, or the list of a joint release (:func:`vector_text`)."""
    if isinstance(value, str) and value.startswith("["):
        try:
            return [float(v) for v in json.loads(value)]
        except (ValueError, TypeError, RecursionError):
            return value
    return value


def stored(rec: dict) -> dict:
    """``rec`` with the types SQLite gives back (REAL, TEXT, INTEGER), so that its MAC verifies when read.

    A list in a REAL column (a joint release's vector) is stored as its JSON text (:func:`vector_text`).
    """
    out = dict(rec)
    for k, v in rec.items():
        if isinstance(v, (list, tuple)) and k in REAL:  # a joint release: its vector as JSON text
            out[k] = vector_text(v)
        elif v is not None and k in REAL:
            out[k] = float(v)
        elif v is not None and k in INTEGER:
            out[k] = int(v)
        elif v is not None:
            out[k] = str(v)
    return out
