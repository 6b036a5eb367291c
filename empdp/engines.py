"""Where the leave-one-out runs: embedded DuckDB (the default) or Apache Spark (docs/spark.md).

An engine object holds its own settings (:class:`DuckDB`: memory limit and threads; :class:`Spark`:
master, Spark Connect URL, catalog table) and opens a source as a :class:`empdp.loo.LooEngine`, so
the stages take one engine and never ask which. A new engine is one class here and one line in
:data:`ENGINES` (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .errors import InputError
from .loo import LooEngine, make_engine


@dataclass(frozen=True)
class DuckDB:
    """Embedded DuckDB: ``memory_limit`` (e.g. ``"3GB"``; spills to disk beyond it) and ``threads``."""

    memory_limit: str | None = None
    threads: int | None = None
    name = "duckdb"

    def open(self, source: Any, **query) -> LooEngine:
        """The leave-one-out engine of ``source`` (``query``: id, by, query, where, sql, drop_null_ids, database)."""
        return make_engine(source, memory_limit=self.memory_limit, threads=self.threads, **query)


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
        try:
            from .spark import make_spark_engine
        except ImportError:  # PySpark is an optional extra: loaded only for this engine
            raise InputError("`engine` spark needs PySpark: pip install \"empdp[spark]\" (and Java 17)",
                             param="engine") from None
        return make_spark_engine(source, master=self.master, remote=self.remote, table=self.table, **query)


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
