"""Generic ``--sql`` on Spark (docs/method.md#2-leave-one-out-shifts-and-query-forms): per database, one correlated Spark SQL query gives every
individual's leave-one-out value; per-individual re-runs are the last resort.

The text is checked by DuckDB's parser (:mod:`empdp.data.guard`, through the query's parse and
:func:`~empdp.loo.sql.replace_db`) and refused with a backslash before Spark sees it; Spark's own
access to files is not switched off (docs/user-sql.md)."""

from __future__ import annotations

import uuid

import numpy as np
import polars as pl

from ..data.guard import check_spark
from ..errors import InputError
from ..loo import replace_db
from ..loo.sql import scalar_value
from .session import _q, first_line


def _scalar(spark, sql: str, label) -> float:
    check_spark(sql, "sql")
    try:
        rows = spark.sql(sql).collect()
    except Exception as exc:  # noqa: BLE001 - ParseException, AnalysisException, ...
        raise InputError(f"`sql` failed on database {label!s}: {first_line(exc)}", param="sql") from None
    return scalar_value(rows, label)


def _databases(engine):
    """Yield (j, label, view) with the temporary view ``view`` holding database j's rows."""
    from pyspark.sql import functions as F

    panel, spark = engine.panel, engine.spark
    view = f"empdp_db_{uuid.uuid4().hex[:12]}"
    src = panel.kept()
    try:
        for j, label in enumerate(panel.labels):
            src.filter(F.col("__j") == j).drop("__j", "__label").createOrReplaceTempView(view)
            yield j, label, view
    finally:
        spark.catalog.dropTempView(view)


def sql_values(engine) -> np.ndarray:
    """f(X^j) for every database (one Spark SQL query each)."""
    sql, qv = check_spark(engine.query.sql, "--sql"), np.empty(len(engine.panel.labels))
    for j, label, view in _databases(engine):
        qv[j] = _scalar(engine.spark, replace_db(sql, f"{view} AS db"), label)
    return qv


def sql_delta(engine, qv: np.ndarray) -> pl.DataFrame:
    """The (__j, __i, delta, undef) rows of every present pair: per database, one correlated Spark SQL
    query gives every individual's leave-one-out value (per-individual re-runs if Spark cannot
    decorrelate it)."""
    spark, sql = engine.spark, check_spark(engine.query.sql, "--sql")
    qi = _q(engine.panel.id)
    frames = []
    for j, _label, view in _databases(engine):
        loo_sql = replace_db(sql, f"(SELECT * FROM {view} WHERE {qi} IS DISTINCT FROM __ids.__id) AS db")
        try:
            df = pl.from_arrow(_arrow(spark.sql(
                f"SELECT __ids.__id AS __i, CAST((\n{loo_sql}\n) AS DOUBLE) AS v, "
                f"(SELECT count(*) FROM {view} WHERE {qi} IS DISTINCT FROM __ids.__id) AS rest "
                f"FROM (SELECT DISTINCT {qi} AS __id FROM {view}) __ids")))
        except Exception:  # noqa: BLE001 - Spark cannot decorrelate this query: one run per individual
            df = _loop(spark, sql, view, qi)
        frames.append(df.with_columns(pl.lit(j, dtype=pl.Int32).alias("__j"))
                      .select("__j", "__i", pl.col("v").cast(pl.Float64), pl.col("rest").cast(pl.Int64)))
    df = pl.concat(frames)
    v = df["v"].to_numpy()
    undef = (df["rest"].to_numpy() == 0) | ~np.isfinite(v)
    delta = np.where(undef, 0.0, qv[df["__j"].to_numpy()] - np.nan_to_num(v))
    return df.select("__j", "__i").with_columns(pl.Series("delta", delta), pl.Series("undef", undef))


def _loop(spark, sql: str, view: str, qi: str) -> pl.DataFrame:
    """Last resort: re-run the query once per individual of the database."""
    ids = [r[0] for r in spark.sql(f"SELECT DISTINCT {qi} FROM {view}").collect()]
    vals, rest = [], []
    for value in ids:
        cur = spark.table(view).filter(f"NOT ({qi} <=> {_literal(value)})")
        name = view + "_loo"
        cur.createOrReplaceTempView(name)
        r = spark.sql(replace_db(sql, f"{name} AS db")).collect()
        vals.append(None if r[0][0] is None else float(r[0][0]))
        rest.append(cur.count())
    spark.catalog.dropTempView(view + "_loo")
    return pl.DataFrame({"__i": ids, "v": pl.Series(vals, dtype=pl.Float64), "rest": rest})


def _literal(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _arrow(df):
    from .session import _collect

    return _collect(df)
