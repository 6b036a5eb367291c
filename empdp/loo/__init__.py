"""The drop-one-identifier loop (docs/method.md#2-leave-one-out-shifts-and-query-forms): f(X^j) and the
shifts Δ_ij = f(X^j) − f(X^j ∖ i).

One engine per strategy, all answering the protocol of :class:`LooEngine` (``values``,
``screen``, ``shifts``); :func:`make_engine` picks the engine for the query's form:

* :mod:`.decomposable` — count, sum, mean, var, std, sum(a)/sum(b): partial moments in one
  DuckDB GROUP BY and closed forms, one entry per form in :data:`.forms.FORMS`; several such
  statistics with one filter share that GROUP BY (:class:`DecomposableSet`, joint queries);
* :mod:`.order` — min, max, median, quantile: rank arithmetic on each database's sorted values;
* :mod:`.sql` — ``--sql``: one correlated query per database.

The Spark engine (:mod:`empdp.spark`) implements the same protocol; :mod:`empdp.engines` opens either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ..data import Panel, open_panel
from ..errors import InputError
from ..query import DECOMPOSABLE, ORDER_STATISTICS, Query, parse_query
from .base import MAX_MAGNITUDE, DuckDBEngine, LooEngine, Screen
from .decomposable import DENSE_CELLS, DecomposableEngine, DecomposableSet
from .order import OrderStatisticEngine
from .sql import SqlEngine, replace_db

__all__ = ["DENSE_CELLS", "ENGINES", "MAX_MAGNITUDE", "DecomposableEngine", "DecomposableSet", "DuckDBEngine",
           "LooEngine", "LooResult", "OrderStatisticEngine", "Screen", "SqlEngine", "engine_for", "leave_one_out",
           "make_engine", "open_decomposable_set", "replace_db"]

#: query form → the engine class of its strategy
ENGINES: dict[str, type[DuckDBEngine]] = {
    **{form: DecomposableEngine for form in DECOMPOSABLE},
    **{form: OrderStatisticEngine for form in ORDER_STATISTICS},
    "sql": SqlEngine,
}


@dataclass
class LooResult:
    """Dense leave-one-out result for moderate sizes (all individuals at once).

    ``shifts[i, j]`` = f(X^j) − f(X^j ∖ i), 0 where i is absent from database j
    or where the leave-one-out value is undefined (``undefined[i]`` is then True).
    P̂ = {q_j} and P̂_i = {q_j − Δ_ij} (docs/method.md#81-target-densities).
    """

    labels: list
    q: np.ndarray
    shifts: np.ndarray
    present: np.ndarray
    undefined: np.ndarray
    ids: pl.Series
    query: str
    source: str


def engine_for(panel, query: Query) -> DuckDBEngine:
    """The engine of ``query``'s strategy over a DuckDB ``panel`` (every decomposable form, also one
    added to :data:`.forms.FORMS` after this module was loaded, is the decomposable engine's)."""
    return (DecomposableEngine if query.is_decomposable else ENGINES[query.form])(panel, query)


def make_engine(source: Any, *, id: str, by: str, query: str | None = None, where: str | None = None,
                sql: str | None = None, memory_limit: str | None = None,
                drop_null_ids: bool = False, threads: int | None = None, panel: Panel | None = None,
                database: str | None = None) -> DuckDBEngine:
    """Open ``source`` and parse the query into the engine of its strategy (a :class:`LooEngine`).

    With ``panel`` (``source`` opened already), the engine reads it instead: engines of several
    statistics share one opened source, one after the other, and the caller closes it. With
    ``database`` only that database is read (:func:`empdp.data.open_panel`), for its value alone.
    """
    parsed = parse_query(query, where=where, sql=sql)
    if panel is None:
        panel = open_panel(source, id=id, by=by, drop_null_ids=drop_null_ids, memory_limit=memory_limit,
                           threads=threads, database=database)
    return engine_for(panel, parsed)


def open_decomposable_set(source: Any, *, id: str, by: str, queries: list, where: str | None = None,
                          memory_limit: str | None = None, drop_null_ids: bool = False,
                          threads: int | None = None) -> DecomposableSet | None:
    """Open ``source`` once for several statistics read in one scan (:class:`DecomposableSet`), or
    None when some query is not a decomposable form or does not parse (then one engine each, which
    also reports the error)."""
    try:
        parsed = [parse_query(q, where=where) for q in queries]
    except InputError:
        return None
    if not all(q.is_decomposable for q in parsed):
        return None
    panel = open_panel(source, id=id, by=by, drop_null_ids=drop_null_ids, memory_limit=memory_limit,
                       threads=threads)
    try:
        return DecomposableSet(panel, parsed)
    except BaseException:
        panel.close()
        raise


def leave_one_out(source: Any, *, id: str, by: str, query: str | None = None, where: str | None = None,
                  sql: str | None = None, memory_limit: str | None = None,
                  drop_null_ids: bool = False) -> LooResult:
    """Every individual's leave-one-out shifts as a dense matrix (docs/method.md#2-leave-one-out-shifts-and-query-forms).

    Meant for up to ~10^7 (individual, database) cells; :func:`empdp.assessment.assess`
    screens first and fetches only the individuals it needs.
    """
    return loo_result(make_engine(source, id=id, by=by, query=query, where=where, sql=sql,
                                  memory_limit=memory_limit, drop_null_ids=drop_null_ids))


def loo_result(engine: LooEngine) -> LooResult:
    """Every individual's shifts from an open engine (DuckDB or Spark) as a :class:`LooResult`."""
    q = engine.values()
    screen = engine.screen(np.ones_like(q))
    shifts, present = engine.shifts(np.arange(len(screen)), presence=True)
    return LooResult(labels=list(engine.panel.labels), q=q, shifts=shifts, present=present,
                     undefined=screen.undefined, ids=screen.ids, query=engine.query.describe(),
                     source=engine.panel.description)
