"""The ledger's first format (``empdp-ledger/1``), before curator keys (docs/release-security.md).

Table ``releases``, the budget in ``meta`` outside the chain, and an unkeyed
SHA-256 chain: anyone with write access can rewrite it undetected, so
:class:`~empdp.noise.ledger.Ledger` reads and extends it only with
``allow_unsigned``.
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


def append(sql, prev: str, rec: dict, new_budget: float | None) -> dict:
    """Insert release ``rec`` (SQLite types, drawn value included) after link ``prev``; first the budget, if set now.

    Returns ``rec`` with ``prev_hash``, ``hash`` and ``seq``.
    """
    if new_budget is not None:
        sql("INSERT INTO meta VALUES ('budget', ?)", (repr(float(new_budget)),))
    rec["prev_hash"], rec["hash"] = prev, record_hash(prev, rec)
    cur = sql(f"INSERT INTO releases ({', '.join(FIELDS)}, prev_hash, hash) "
              f"VALUES ({', '.join('?' * (len(FIELDS) + 2))})",
              [rec[k] for k in FIELDS] + [rec["prev_hash"], rec["hash"]])
    rec["seq"] = cur.lastrowid
    return rec
