"""Read a joint query's values and leave-one-out shifts from a table (docs/method.md#102-joint-queries).

Read through an engine object (:mod:`empdp.engines`: DuckDB by default, or Spark). On DuckDB decomposable
statistics (count, sum, mean, var, std, ratio) are read together, one scan for all
(:class:`empdp.loo.DecomposableSet`); other forms, and every form on Spark, through one leave-one-out
engine per statistic (the engine object's ``read``) on the one opened source. The d-dimensional query values q_j and
shifts Δ_ij aligned by database and individual. Shared by the joint assessment, the joint
calibration and release, and the grouped statistics (one statistic per group of a column,
:func:`read_grouped`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import polars as pl

from ..data.guard import check_filter, check_select, select_width
from ..data.sql import shorten
from ..engines import engine_of
from ..errors import InputError
from ..query import parse_query
from ..risk.joint.model import MAX_DIM
from .statistic import StatisticShifts, read_statistic  # noqa: F401 (assembled here; re-exported)

#: the most groups a grouped statistic may have: each group is one leave-one-out pass over the table
MAX_GROUPS = 100


@dataclass(kw_only=True)
class Statistics:
    """What a joint and a grouped panel share: the databases, the statistics and the individuals.

    labels : the databases' labels, in order (n)
    names : each statistic as described by its query form (d)
    q : ndarray (n, d), the statistics of each database
    ids : polars Series (m), every individual with a row in some database, sorted
    sole : ndarray (m,) bool, the only contributor to some database (Δ_ij undefined)
    present : ndarray (m,) int, databases the individual is in
    """

    labels: list
    names: list
    q: np.ndarray
    ids: pl.Series
    sole: np.ndarray
    present: np.ndarray


@dataclass(kw_only=True)
class JointPanel(Statistics):
    """The statistics of every database and every individual's leave-one-out shifts (the fields of
    :class:`Statistics` and) shifts : ndarray (m, n, d), Δ_ij = q_j − q_j(without i) (0 where i is
    absent from j)."""

    shifts: np.ndarray

    @property
    def d(self) -> int:
        return self.q.shape[1]


def split_columns(sql: str) -> list[str]:
    """One SELECT per column of ``sql`` (2 to :data:`MAX_DIM` columns: the statistics released
    together, issue 19's interface), each reading that column of ``sql``'s one row; ``[sql]`` for
    one column."""
    width = select_width(sql)
    if width == 1:
        return [sql]
    if width > MAX_DIM:
        raise InputError(f"`sql` returns {width} columns: at most {MAX_DIM} statistics are released together",
                         param="sql")
    body = sql.strip().rstrip(";")
    names = ", ".join(f"c{k + 1}" for k in range(width))
    return [f"SELECT c{k + 1} FROM ({body}) AS _columns({names})" for k in range(width)]


def statistics(queries, sql) -> list[dict]:
    """One ``{"query": ...}`` or ``{"sql": ...}`` per statistic, 1 to :data:`MAX_DIM` of them; one
    ``sql`` returning 2–3 columns is those columns' statistics (:func:`split_columns`)."""
    if (queries is None) == (sql is None):
        raise InputError("give the statistics as queries=[...] or sql=[...], not both")
    if sql is not None:
        one = [sql] if isinstance(sql, str) else list(sql)
        if len(one) == 1 and isinstance(one[0], str):
            sql = split_columns(one[0])
    items = [queries] if isinstance(queries, str) else [sql] if isinstance(sql, str) else list(queries or sql)
    if not 1 <= len(items) <= MAX_DIM:
        raise InputError(f"a joint query has 1 to {MAX_DIM} statistics; got {len(items)}")
    return [{"query": s} if queries is not None else {"sql": s} for s in items]


def read_joint(source: Any, *, id: str, by: str, queries=None, sql=None, where: str | None = None,
               drop_null_ids: bool = False, memory_limit: str | None = None, threads: int | None = None,
               engine: Any = "duckdb") -> JointPanel:
    """The :class:`JointPanel` of 1–3 statistics (``queries`` or ``sql``, one per statistic) of ``source``,
    read through ``engine`` (:func:`empdp.engines.engine_of`: a name, made with ``memory_limit`` and
    ``threads``, or an engine object such as ``Spark(table="db.claims")``, whose catalog table replaces
    ``source``)."""
    engine = _engine(engine, memory_limit, threads)
    stats = statistics(queries, sql)
    opened = dict(id=id, by=by, drop_null_ids=drop_null_ids)
    shared = engine.open_set(source, queries=[st["query"] for st in stats], where=where, **opened) if queries else None
    if shared is not None:
        try:
            q = shared.values()
            ids, shifts, present, undefined = shared.read()
        finally:
            shared.close()
        return JointPanel(labels=list(shared.panel.labels), names=[e.query.describe() for e in shared.engines],
                          q=q, ids=ids, shifts=shifts, sole=undefined.any(axis=1), present=present)
    panel = engine.open_panel(source, columns=_columns(stats, where), where=where, **opened)
    try:  # one engine per statistic on the one panel, one after the other
        labels = list(panel.labels)
        read = [engine.read(source, panel=panel, where=where, **opened, **st) for st in stats]
    finally:
        panel.close()
    ids = pl.concat([r.ids for r in read]).unique().sort()
    m, n, d = len(ids), len(labels), len(read)
    shifts = np.zeros((m, n, d))
    sole = np.zeros(m, dtype=bool)
    present = np.zeros(m, dtype=np.int64)
    for k, r in enumerate(read):
        rows = _positions(ids, r.ids)
        shifts[rows, :, k] = r.shifts
        sole[rows] |= r.sole
        present[rows] = np.maximum(present[rows], r.present)
    return JointPanel(labels=labels, names=[r.name for r in read], q=np.column_stack([r.q for r in read]),
                      ids=ids, shifts=shifts, sole=sole, present=present)


def _engine(engine: Any, memory_limit: str | None, threads: int | None):
    """The engine object of ``engine`` (a name made with ``memory_limit`` and ``threads``, or an object)."""
    return engine_of(engine, memory_limit=memory_limit, threads=threads)


def _columns(stats: list, where: str | None) -> list:
    """The value columns the statistics read (parsed before the source is opened: an engine that checks
    columns as it opens, like Spark's, checks them all in that one scan)."""
    parsed = [parse_query(st.get("query"), where=where, sql=st.get("sql")) for st in stats]
    return list(dict.fromkeys(c for q in parsed for c in q.columns))


def _positions(ids: pl.Series, some: pl.Series) -> np.ndarray:
    """Rows of ``some`` (a subset of the sorted ``ids``) in ``ids``."""
    return ids.search_sorted(some).to_numpy().astype(np.int64)


# --------------------------------------------------------------------------- grouped statistics
@dataclass(kw_only=True)
class GroupPanel(Statistics):
    """One statistic per group of a column and database, and each individual's shifts in the groups
    their rows touch (docs/method.md#102-joint-queries).

    labels : the databases' labels (n); group_by : the group column; groups : the groups' values (G),
    ordered by value; names : each group's statistic, described (G); q : ndarray (n, G);
    ids : polars Series (m), sorted; rows : per group, the positions in ``ids`` of its individuals
    (ascending); shifts : per group, ndarray (m_g, n); touched : ndarray (m, G) bool, the groups an
    individual's rows are in; sole : ndarray (m,) bool, the only contributor to some group of some
    database; present : ndarray (m,) int, databases the individual has rows in.
    """

    group_by: str
    groups: list
    rows: list
    shifts: list
    touched: np.ndarray

    @property
    def n_groups(self) -> int:
        return self.q.shape[1]

    def stack(self, rows: np.ndarray, groups) -> np.ndarray:
        """Shifts (len(rows), n, len(groups)) of the individuals at ``rows`` in ``groups`` (0 where untouched)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros((len(rows), len(self.labels), len(groups)))
        for k, g in enumerate(groups):
            have = self.rows[g]
            at = np.minimum(np.searchsorted(have, rows), max(len(have) - 1, 0))
            hit = (have[at] == rows) if len(have) else np.zeros(len(rows), dtype=bool)
            out[hit, :, k] = self.shifts[g][at[hit]]
        return out


def read_grouped(source: Any, *, id: str, by: str, group_by: str, query: str | None = None, sql: str | None = None,
                 where: str | None = None, drop_null_ids: bool = False, memory_limit: str | None = None,
                 threads: int | None = None, check: Callable[[int], None] | None = None,
                 engine: Any = "duckdb") -> GroupPanel:
    """The :class:`GroupPanel` of one statistic (``query`` with ``where``, or ``sql`` over ``db``) per
    group of column ``group_by``: one leave-one-out engine per group, its rows filtered to the group.
    ``check`` is called with the number of groups before any group is read (options that depend on it).
    The source is opened and checked once; the groups' engines share it, one after the other. ``engine``
    as for :func:`read_joint`.

    Raises :class:`InputError` (one line) when the group column is missing or has NULLs on the rows
    the query reads, when a group has no rows in some database (the released vector would differ
    between databases), or with more than :data:`MAX_GROUPS` groups.
    """
    if (query is None) == (sql is None):
        raise InputError("give the grouped statistic as query=... or sql=..., not both")
    text = query if query is not None else sql
    if not isinstance(text, str):
        raise InputError("a grouped statistic is one query; the groups make the vector")
    if sql is not None and where:
        raise InputError("`where` goes with `query`; put the filter inside `sql` instead",
                         param=("where", "query", "sql"))
    check_filter(where, "where")
    if sql is not None:
        check_select(sql, "sql")
    if group_by in (id, by):
        raise InputError(f"`group_by` column {shorten(group_by)} is the {'`id`' if group_by == id else '`by`'} "
                         "column; group by another column", param=("group_by", "id", "by"))
    engine = _engine(engine, memory_limit, threads)
    st = {"query": query, "where": where} if query is not None else {"sql": sql}
    opened = dict(id=id, by=by, drop_null_ids=drop_null_ids)
    base = engine.open_panel(source, columns=_columns([st], where), where=where, **opened)
    try:
        labels = list(base.labels)
        cells, n_null = engine.group_cells(base, group_by, where)
        if n_null:
            raise InputError(f"{n_null:,} rows have a NULL group in column {shorten(group_by)}; every row the "
                             f"statistic reads must be in a group: fill them, or filter them out with `where`",
                             param="where")
        groups = _groups(cells, labels, group_by, where)
        if check is not None:
            check(len(groups))
        read = []
        for gtext, value in groups:
            try:  # each group's engine on the one panel: opened and checked once, not once a group
                read.append(engine.read(source, panel=base, group=(group_by, gtext), presence=True, **opened, **st))
            except InputError as exc:
                raise InputError(f"group {shorten(value)} of {shorten(group_by)}: {exc}", param=exc.param) from None
    finally:
        base.close()
    ids = pl.concat([r.ids for r in read]).unique().sort()
    m, n, G = len(ids), len(labels), len(read)
    touched = np.zeros((m, G), dtype=bool)
    sole = np.zeros(m, dtype=bool)
    inside = np.zeros((m, n), dtype=bool)
    rows = []
    for g, r in enumerate(read):
        at = _positions(ids, r.ids)
        rows.append(at)
        touched[at, g] = True
        sole[at] |= r.sole
        inside[at] |= r.in_database
    return GroupPanel(labels=labels, group_by=group_by, groups=[v for _, v in groups],
                      names=[f"{text.strip()} [{group_by} = {v}]" for _, v in groups],
                      q=np.column_stack([r.q for r in read]), ids=ids, rows=rows,
                      shifts=[r.shifts for r in read], touched=touched, sole=sole, present=inside.sum(axis=1))


def _groups(cells: list, labels: list, group_by: str, where: str | None) -> list:
    """(text, value) of each group, after checking that every group is in every database."""
    seen: dict = {}
    for gtext, value, j, _ in cells:
        seen.setdefault(gtext, (value, set()))[1].add(int(j))
    if not seen:
        raise InputError(f"no rows to group by {shorten(group_by)}" + (" (check `where`)" if where else ""),
                         param="where")
    if len(seen) > MAX_GROUPS:
        raise InputError(f"column {shorten(group_by)} has {len(seen):,} groups; a grouped statistic takes at most "
                         f"{MAX_GROUPS} (each group is one pass over the table): group by a coarser column")
    for gtext, (value, js) in seen.items():
        missing = [labels[j] for j in range(len(labels)) if j not in js]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise InputError(
                f"group {shorten(value)} of column {shorten(group_by)} has no rows in database {shorten(missing[0])}"
                f"{more}{' that `where` keeps' if where else ''}: the released vector has no value for it there, and "
                "the groups must be the same in every database (see docs/method.md, grouped statistics); filter "
                "that group out with `where`, or assess only the databases it is in", param="where")
    return [(gtext, value) for gtext, (value, _) in seen.items()]
