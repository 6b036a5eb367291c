"""Generic ``--sql`` per database (docs/method.md#2-leave-one-out-shifts-and-query-forms).

For each database one set-based, correlated DuckDB query evaluates the user's SQL once for every
id present, with ``db`` replaced by "this database's rows whose id is not this one". If DuckDB
cannot run that form, the query is re-run once per individual.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from ..data import clip, quote_ident
from ..data import shorten as short
from ..data.guard import check_select
from ..errors import InputError
from .base import factorize
from .sparse import InMemoryEngine, SparseShifts


class SqlEngine(InMemoryEngine):
    """Any ``SELECT ... FROM db`` returning one number: exact Δ_ij, one correlated query per database."""

    def _compute(self) -> tuple[np.ndarray, SparseShifts]:
        panel, sql = self.panel, self.query.sql
        n = len(panel.labels)
        qi = quote_ident(panel.id)
        src_j = (f"(SELECT s.*, l.__j, l.__label FROM __src s JOIN __labels l "
                 f"ON s.{quote_ident(panel.by)} = l.__label)")
        rewritten = replace_db(sql, f"(SELECT * FROM __dbj WHERE {qi} IS DISTINCT FROM __ids.__id) AS db")
        qv = np.empty(n)
        frames = []
        for j in range(n):
            panel.execute(f"CREATE OR REPLACE TEMP TABLE __dbj AS SELECT * EXCLUDE (__j, __label) FROM {src_j} "
                          f"WHERE __j = {j} AND {qi} IS NOT NULL")
            panel.execute("CREATE OR REPLACE TEMP VIEW db AS SELECT * FROM __dbj")
            qv[j] = _scalar(panel, sql, panel.labels[j])
            # the line breaks end a trailing '--' comment of the user's inside the parentheses
            tab = panel.try_arrow(f"SELECT __ids.__id AS __i, (\n{rewritten}\n) AS v, "
                                  f"(SELECT count(*) FROM __dbj WHERE {qi} IS DISTINCT FROM __ids.__id) AS rest "
                                  f"FROM (SELECT DISTINCT {qi} AS __id FROM __dbj) __ids")
            df = _loo_by_rerunning(panel, sql, qi) if tab is None else pl.from_arrow(tab)
            df = df.with_columns(pl.lit(j, dtype=pl.Int64).alias("__j"))
            frames.append(df.select("__i", "__j", pl.col("v").cast(pl.Float64), "rest"))
        df = pl.concat(frames)
        ids, code = factorize(df["__i"], panel.id)
        jj = df["__j"].to_numpy()
        v = df["v"].to_numpy()
        undef = (df["rest"].to_numpy() == 0) | ~np.isfinite(v)
        delta = np.where(undef, 0.0, qv[jj] - np.nan_to_num(v))
        return qv, SparseShifts(ids, code, jj, delta, undef)


def replace_db(sql: str, replacement: str) -> str:
    """``sql`` reading ``replacement`` where it reads the table ``db``.

    Both the user's ``sql`` and the rewritten text must be one read-only SELECT
    (:func:`~empdp.data.guard.check_select`): the rewrite is textual, and text it puts inside a
    comment of the user's (a group's value, say) must not become SQL of its own.
    """
    check_select(sql, "sql")
    # a function, not a template: the replacement (a group's value, say) is text, and a backslash in it
    # must stay a backslash, never a group reference of the pattern
    return check_select(re.sub(r"\bFROM\s+db\b", lambda _: "FROM " + replacement, sql, flags=re.I), "sql",
                        tables=None)


def _scalar(panel, sql: str, label) -> float:
    """The user's query on the current database: one finite number, else :class:`InputError`."""
    return scalar_value(panel.fetchall(sql, context=f"`sql` failed on database {clip(str(label), 40)}", param="sql"), label)


def scalar_value(rows, label) -> float:
    """The one finite number ``--sql`` must return on database ``label`` (``rows`` as fetched; the
    DuckDB and Spark engines share this check), else :class:`InputError`."""
    if len(rows) != 1 or len(rows[0]) != 1:
        raise InputError(f"`sql` must return one row with one numeric column; got "
                         f"{len(rows)} row(s) on database {label!s}", param="sql")
    val = rows[0][0]
    try:
        val = float(val)
    except (TypeError, ValueError):
        raise InputError(f"`sql` returned {short(val)} on database {label!s}; it must return a number",
                         param="sql") from None
    if not np.isfinite(val):
        raise InputError(f"`sql` returned {val} on database {label!s}; the query must be defined "
                         f"on every database", param="sql")
    return val


def _loo_by_rerunning(panel, sql: str, qi: str) -> pl.DataFrame:
    """Last resort: re-run the query once per individual."""
    ids = pl.from_arrow(panel.arrow(f"SELECT DISTINCT {qi} FROM __dbj")).to_series()
    panel.execute(f"CREATE OR REPLACE TEMP TABLE __cur AS SELECT {qi} AS v FROM __dbj LIMIT 0")
    panel.execute(f"CREATE OR REPLACE TEMP VIEW db AS SELECT * FROM __dbj WHERE {qi} IS DISTINCT FROM "
                  f"(SELECT v FROM __cur)")
    vals, rest = [], []
    for value in ids.to_list():
        panel.execute("DELETE FROM __cur")
        panel.execute("INSERT INTO __cur VALUES (?)", [value])
        r = panel.fetchall(sql)
        vals.append(None if r[0][0] is None else float(r[0][0]))
        rest.append(panel.fetchall("SELECT count(*) FROM db")[0][0])
    return pl.DataFrame({"__i": ids, "v": pl.Series(vals, dtype=pl.Float64), "rest": rest})
