"""Generic ``--sql`` on Spark (docs/method.md#2-leave-one-out-shifts-and-query-forms): per database, one correlated Spark SQL query gives every
individual's leave-one-out value; per-individual re-runs are the last resort."""

from __future__ import annotations

import uuid

import numpy as np
import polars as pl

from ..errors import InputError
from ..loo import _replace_db
from ..loo.sql import scalar_value
from .session import _q, first_line


def _scalar(spark, sql: str, label) -> float:
    try:
        rows = spark.sql(sql).collect()
    except Exception as exc:  # noqa: BLE001 - ParseException, AnalysisException, ...
        raise InputError(f"--sql failed on database {label!s}: {first_line(exc)}") from None
    return scalar_value(rows, label)


def sql_values(engine):
    """f(X^j) for every database and the (__j, __i, delta, undef) rows of every present pair."""
    from pyspark.sql import functions as F

    panel, spark, sql = engine.panel, engine.spark, engine.query.sql
    view = f"empdp_db_{uuid.uuid4().hex[:12]}"
    qi = _q(panel.id)
    n = len(panel.labels)
    qv = np.empty(n)
    frames = []
    lab = panel._label_df
    src = panel.df.filter(F.col(qi).isNotNull())
    src = src.join(F.broadcast(lab), src[_q(panel.by)] == lab["__label"])
    loo_sql = _replace_db(sql, f"(SELECT * FROM {view} WHERE {qi} IS DISTINCT FROM __ids.__id) AS db")
    try:
        for j in range(n):
            part = src.filter(F.col("__j") == j).drop("__j", "__label")
            part.createOrReplaceTempView(view)
            qv[j] = _scalar(spark, _replace_db(sql, f"{view} AS db"), panel.labels[j])
            try:
                df = pl.from_arrow(_arrow(spark.sql(
                    f"SELECT __ids.__id AS __i, CAST(({loo_sql}) AS DOUBLE) AS v, "
                    f"(SELECT count(*) FROM {view} WHERE {qi} IS DISTINCT FROM __ids.__id) AS rest "
                    f"FROM (SELECT DISTINCT {qi} AS __id FROM {view}) __ids")))
            except Exception:  # noqa: BLE001 - Spark cannot decorrelate this query: one run per individual
                df = _loop(spark, sql, view, qi)
            frames.append(df.with_columns(pl.lit(j, dtype=pl.Int32).alias("__j"))
                          .select("__j", "__i", pl.col("v").cast(pl.Float64), pl.col("rest").cast(pl.Int64)))
    finally:
        spark.catalog.dropTempView(view)
    df = pl.concat(frames)
    v = df["v"].to_numpy()
    undef = (df["rest"].to_numpy() == 0) | ~np.isfinite(v)
    delta = np.where(undef, 0.0, qv[df["__j"].to_numpy()] - np.nan_to_num(v))
    rows = df.select("__j", "__i").with_columns(pl.Series("delta", delta), pl.Series("undef", undef))
    return qv, rows


def _loop(spark, sql: str, view: str, qi: str) -> pl.DataFrame:
    """Last resort: re-run the query once per individual of the database."""
    ids = [r[0] for r in spark.sql(f"SELECT DISTINCT {qi} FROM {view}").collect()]
    vals, rest = [], []
    for value in ids:
        cur = spark.table(view).filter(f"NOT ({qi} <=> {_literal(value)})")
        name = view + "_loo"
        cur.createOrReplaceTempView(name)
        r = spark.sql(_replace_db(sql, f"{name} AS db")).collect()
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
