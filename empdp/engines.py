"""Where the leave-one-out runs: embedded DuckDB (the default) or Apache Spark (docs/spark.md).

An engine object holds its own settings (:class:`DuckDB`: memory limit and threads; :class:`Spark`:
master, Spark Connect URL, catalog table) and opens a source as a :class:`empdp.loo.LooEngine`, so
the stages take one engine and never ask which. For several statistics of one source (a joint query,
grouped statistics: :mod:`empdp.loo.joint`) it also opens the source once (``open_panel``), reads
decomposable statistics in one scan where it can (``open_set``), lists a column's groups
(``group_cells``) and reads one statistic, or one group's, on the opened source (``read``). A new
engine is one class here and one line in :data:`ENGINES` (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .data import open_panel
from .data.guard import filter_sql
from .data.sql import group_cells, group_filter
from .errors import InputError
from .loo import DecomposableSet, LooEngine, make_engine, open_decomposable_set, replace_db
from .loo.statistic import read_statistic


@dataclass(frozen=True)
class DuckDB:
    """Embedded DuckDB: ``memory_limit`` (e.g. ``"3GB"``; spills to disk beyond it) and ``threads``."""

    memory_limit: str | None = None
    threads: int | None = None
    name = "duckdb"

    def open(self, source: Any, **query) -> LooEngine:
        """The leave-one-out engine of ``source`` (``query``: id, by, query, where, sql, drop_null_ids, database;
        ``panel``: the source opened already by :meth:`open_panel`)."""
        return make_engine(source, memory_limit=self.memory_limit, threads=self.threads, **query)

    def open_panel(self, source: Any, *, id: str, by: str, drop_null_ids: bool = False, columns=(),
                   where: str | None = None):
        """``source`` opened once for several statistics (a :class:`empdp.data.Panel`; the caller closes it).
        ``columns`` and ``where`` are not read here: each statistic's engine checks its own columns."""
        return open_panel(source, id=id, by=by, drop_null_ids=drop_null_ids, memory_limit=self.memory_limit,
                          threads=self.threads)

    def open_set(self, source: Any, *, queries: list, **opened) -> DecomposableSet | None:
        """Decomposable ``queries`` read together in one scan (:func:`empdp.loo.open_decomposable_set`), or
        None when some query is not decomposable."""
        return open_decomposable_set(source, queries=queries, memory_limit=self.memory_limit, threads=self.threads,
                                     **opened)

    def group_cells(self, panel, column: str, where: str | None) -> tuple[list, int]:
        """The groups of ``column`` in every database (:func:`empdp.data.sql.group_cells`)."""
        return group_cells(panel, column, where)

    def read(self, source: Any, *, panel, group: tuple | None = None, presence: bool = False, **query):
        """One statistic (``query``: id, by, query, where, sql, drop_null_ids) on ``panel``, of the rows of one
        ``group`` (column, text as :meth:`group_cells` names it) if given: a
        :class:`empdp.loo.statistic.StatisticShifts`. The group is a filter added to the statistic's SQL."""
        if group is not None:
            query = _in_group(query, group_filter(*group))
        return read_statistic(self.open(source, panel=panel, **query), presence=presence)


def _in_group(query: dict, cond: str) -> dict:
    """``query`` (``query`` with ``where``, or ``sql`` over ``db``) on the rows where ``cond`` holds (one
    group's rows). ``sql`` reads them inside its text: the individuals it reads stay those of the whole
    database, with no shift where they are not in the group."""
    if query.get("sql") is not None:
        return {**query, "sql": replace_db(query["sql"], f"(SELECT * FROM db WHERE {cond}) AS db")}
    where = query.get("where")
    return {**query, "where": f"{filter_sql(where)} AND {cond}" if where else cond}


def _spark():
    """:mod:`empdp.spark`, or one line saying how to install PySpark (an optional extra, loaded only for
    this engine)."""
    try:
        from . import spark
    except ImportError:
        raise InputError("`engine` spark needs PySpark: pip install \"empdp[spark]\" (and Java 17)",
                         param="engine") from None
    return spark


@dataclass(frozen=True)
class Spark:
    """Apache Spark: a ``master`` URL (default ``local[*]``) or Spark Connect at ``remote``, and a catalog
    ``table`` read instead of a source path. Reading, aggregation and screening run on Spark, the exact
    evaluation on its executors."""

    master: str | None = None
    remote: str | None = None
    table: str | None = None
    name = "spark"

    def open(self, source: Any, **query) -> LooEngine:
        """The leave-one-out engine of ``source`` or :attr:`table` (``query`` as for :meth:`DuckDB.open`)."""
        return _spark().make_spark_engine(source, master=self.master, remote=self.remote, table=self.table,
                                          **query)

    def open_panel(self, source: Any, *, id: str, by: str, drop_null_ids: bool = False, columns=(),
                   where: str | None = None):
        """``source`` or :attr:`table` opened once for several statistics, in one scan that also checks the
        value ``columns`` on the rows ``where`` keeps (a :class:`empdp.spark.SparkPanel`)."""
        return _spark().open_spark_source(source, id=id, by=by, master=self.master, remote=self.remote,
                                          table=self.table, columns=columns, where=where,
                                          drop_null_ids=drop_null_ids)

    def open_set(self, source: Any, *, queries: list, **opened) -> None:
        """None: on Spark each statistic is its own GROUP BY on the cluster."""
        return None

    def group_cells(self, panel, column: str, where: str | None) -> tuple[list, int]:
        """The groups of ``column`` in every database, computed on Spark (:func:`empdp.spark.group_cells`)."""
        return _spark().group_cells(panel, column, where)

    def read(self, source: Any, *, panel, group: tuple | None = None, presence: bool = False, **query):
        """As :meth:`DuckDB.read`; the statistic's Δ table, cached on the cluster, is dropped once its rows are
        on the driver. A ``query``'s group is a filter on the panel's DataFrame (a Column: no SQL text, and the
        columns the panel checked as it opened are not scanned again); ``sql`` reads the group inside its
        text, as on DuckDB, with a condition no group value can end early (its text in hexadecimal)."""
        if group is not None and query.get("sql") is not None:
            query = _in_group(query, _spark().group_condition(*group))
        elif group is not None:
            panel = panel.group(*group)
        engine = self.open(source, panel=panel, **query)
        try:
            return read_statistic(engine, presence=presence)
        finally:
            engine.close()


#: every engine, by name
ENGINES = {e.name: e for e in (DuckDB, Spark)}


def engine_of(engine: Any = "duckdb", *, spark_master: str | None = None, spark_remote: str | None = None,
              table: str | None = None, memory_limit: str | None = None, threads: int | None = None):
    """An engine object from the keyword form of the entry points (an engine object is returned as it is):
    the class :data:`ENGINES` names, made with the settings among these that it has (Spark's ``master``,
    ``remote`` and ``table``; DuckDB's ``memory_limit`` and ``threads``)."""
    if isinstance(engine, tuple(ENGINES.values())):
        return engine
    if not isinstance(engine, str) or engine not in ENGINES:
        raise InputError(f"`engine` must be one of {', '.join(ENGINES)}, got {str(engine)[:40]!r}", param="engine")
    cls = ENGINES[engine]
    own = {f.name for f in fields(cls)}
    located = {"master": spark_master, "remote": spark_remote, "table": table}
    if any(v is not None for k, v in located.items() if k not in own):
        raise InputError("`spark_master`, `spark_remote` and `table` go with `engine` spark",
                         param=("spark_master", "spark_remote", "table", "engine"))
    given = {**located, "memory_limit": memory_limit, "threads": threads}
    return cls(**{k: v for k, v in given.items() if k in own and v is not None})


def open_engine(source: Any, *, engine: Any = "duckdb", spark_master: str | None = None,
                spark_remote: str | None = None, table: str | None = None, memory_limit: str | None = None,
                threads: int | None = None, **query) -> LooEngine:
    """The leave-one-out engine of ``source`` on ``engine`` (a name with its keywords, or an engine object;
    ``query``: id, by, query, where, sql, drop_null_ids, database, as for :func:`empdp.loo.make_engine`)."""
    return engine_of(engine, spark_master=spark_master, spark_remote=spark_remote, table=table,
                     memory_limit=memory_limit, threads=threads).open(source, **query)
