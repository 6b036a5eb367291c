"""The drop-one-identifier loop on Apache Spark (docs/method.md#2-leave-one-out-shifts-and-query-forms, #51-screening-bound; docs/spark.md): :class:`SparkEngine`.

The same questions as :class:`empdp.loo.LooEngine`, with the same answers (1e-9 relative):
``values()``, ``screen(scale)`` and ``shifts(codes)``. Every per-row step runs on the executors:

* decomposable aggregates: one GROUP BY (database, id) of partial moments, the database totals
  (a few numbers per database, sent back as literals) minus the partials give Δ_ij in closed form;
* order statistics: each database's rows ranked by a window; an individual's leave-one-out
  k-th value is at rank k + #{t : r_t − (t − 1) ≤ k} (r_1 < … < r_c its own ranks: the rank
  arithmetic of :func:`empdp.loo.order._kth_excluding` in closed form), read from the few ranks each
  database needs;
* ``--sql``: Spark SQL once per database and individual (the last resort; slow).

The table of every present (database, id) pair and its Δ_ij is kept on the cluster
(``MEMORY_AND_DISK``); :meth:`SparkEngine.screen` aggregates it per individual and only the
rows of the individuals asked for in :meth:`SparkEngine.shifts` leave it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ..data.guard import check_spark
from ..errors import InputError
from ..loo import LooEngine, Screen
from ..loo.forms import FORMS, centred_partials, columns_for, mean_sql, partials_sql, totals_named
from ..query import Query, parse_query
from .executors import evaluate_buckets_on_executors, evaluate_on_executors
from .session import SparkPanel, _collect, _q, first_line, open_spark_panel, require_values, spark_session


def _lits(values) -> Any:
    """A Spark array literal of doubles, indexed by ``__j`` + 1 (the totals of every database)."""
    from pyspark.sql import functions as F

    return F.array(*[F.lit(float(v)) for v in values])


def _at(values, index="__j") -> Any:
    """The element of ``values`` (one per database) for each row's database."""
    from pyspark.sql import functions as F

    return F.element_at(_lits(values), F.col(index) + 1)


class SparkEngine(LooEngine):
    """Leave-one-out engine over a :class:`~empdp.spark.session.SparkPanel` for one :class:`Query`.

    Same interface as :class:`empdp.loo.LooEngine`; :attr:`holds_all_shifts` is always False
    (the Δ table stays on the cluster).
    """

    #: the candidates' risk is evaluated where their Δ rows are (:mod:`empdp.spark.executors`)
    on_executors = True

    def __init__(self, panel: SparkPanel, query: Query):
        super().__init__(panel, query)
        self._totals: dict | None = None
        self._ranked = None  # order statistics: the ranked rows (persisted)
        self._lookup: pa.Table | None = None  # order statistics: (j, r, x) at the ranks needed
        self._delta = None  # (__j, __i, delta, undef) of every present pair (persisted)
        self._ids: pl.Series | None = None

    @property
    def spark(self):
        return self.panel.spark

    def evaluate(self, model, codes, eps, *, need_eps_i: bool = True, return_exact: bool = False):
        return evaluate_on_executors(self, model, codes, eps, need_eps_i=need_eps_i, return_exact=return_exact)

    def evaluate_buckets(self, buckets, codes, eps):
        return evaluate_buckets_on_executors(self, buckets, codes, eps)

    def close(self) -> None:
        """Drop the cluster's cached tables (the session stays: other engines may share it)."""
        for df in (self._delta, self._ranked):
            if df is not None:
                try:
                    df.unpersist()
                except Exception:  # noqa: BLE001 - the session may be gone already
                    pass
        self._delta = self._ranked = None
        self.panel.close()

    def release_shifts(self) -> None:
        """Nothing to release on the driver: Δ rows are fetched per call."""

    # ------------------------------------------------------------------ values
    def _values(self) -> np.ndarray:
        """f(X^j) for every database, in label order, by the query form's Spark aggregation."""
        if self.query.is_decomposable:
            return self._decomposable_values()
        if self.query.is_order_statistic:
            return self._order_values()
        return self._sql_values()

    def _run(self, thunk):
        """Run a Spark action; a bad ``--where`` or ``--sql`` becomes one line."""
        try:
            return thunk()
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - AnalysisException, Py4JJavaError, ...
            msg = first_line(exc)
            if self.query.where:
                raise InputError(f"the filter `where` {self.query.where!r} is not valid here: {msg}", param="where") from None
            raise

    def _base(self):
        return self.panel.base(self.query.columns, self.query.where)

    def _partials(self) -> list:
        """The form's partial-moment aggregates (its entry in :data:`empdp.loo.forms.FORMS`)."""
        from pyspark.sql import functions as F

        return [F.expr(sql) for sql in partials_sql(self.query.form, self.query.columns, quote=_q)]

    def _null_count(self):
        from pyspark.sql import functions as F

        if not self.query.columns:
            return F.lit(0).cast("long").alias("__null")
        cond = None
        for c in self.query.columns:
            one = F.col(_q(c)).isNull()
            cond = one if cond is None else cond | one
        return F.sum(cond.cast("long")).alias("__null")

    def _per_database(self, df, aggs) -> dict:
        """Aggregate ``df`` per database; arrays of length n (0 where a database has no row)."""
        tab = self._run(lambda: _collect(df.groupBy("__j").agg(*aggs)))
        n = len(self.panel.labels)
        j = np.asarray(tab.column("__j").to_numpy(zero_copy_only=False), dtype=np.int64)
        out = {}
        for name in tab.column_names:
            if name == "__j":
                continue
            col = np.zeros(n)
            col[j] = np.asarray(tab.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
            out[name] = col
        return out

    def _decomposable_values(self) -> np.ndarray:
        from pyspark.sql import functions as F

        q, form = self.query, FORMS[self.query.form]
        aggs = self._partials()
        if form.centred:
            aggs.append(F.expr(mean_sql(_q(q.columns[0]))))
        base = self._base()
        t = self._per_database(base, aggs + [self._null_count()])
        self.n_null_values = int(np.nan_to_num(t.pop("__null")).sum())
        if form.centred:
            # centred sums about the database mean: accurate even for values like 1e9 + noise
            xc = F.col(_q(q.columns[0])).cast("double") - _at(t["m"])
            t.update(self._per_database(base, [F.coalesce(F.sum(xc), F.lit(0.0)).alias("s1"),
                                               F.coalesce(F.sum(xc * xc), F.lit(0.0)).alias("ss")]))
        val, ok = form.value(t)
        if not ok.all():
            bad = [str(self.panel.labels[k]) for k in np.flatnonzero(~ok)[:5]]
            raise InputError(f"query {q.describe()!r} is undefined on database(s) {', '.join(bad)} "
                             f"(no usable rows); filter those databases out")
        t["f"] = val
        self._totals = t
        return val

    def _decomposable_delta(self):
        """(__j, __i, delta, undef) of every present pair, as :meth:`LooEngine._delta_sql`: the form's
        own SQL, with each database's totals beside the partials of its pairs."""
        from pyspark.sql import functions as F

        q, form, t = self.query, FORMS[self.query.form], self._totals
        base = self._base()
        parts = self._partials()
        if form.centred:
            xc = F.col(_q(q.columns[0])).cast("double") - _at(t["m"])
            base = base.select("__j", "__i", xc.alias("__xc"))
            parts = [F.expr(sql) for sql in centred_partials()]
        # partitioned by id once: the GROUP BY (database, id), the screen's GROUP BY id and the
        # candidates' joins then need no further shuffle of the pairs
        p = base.repartition("__i").groupBy("__j", "__i").agg(*parts)
        totals = totals_named(form.delta + " " + form.undefined)
        p = p.select("*", *(_at(t[name]).alias(f"__t_{name}") for name in totals))
        delta = F.expr(columns_for(form.delta, lambda name: f"__t_{name}"))
        undef = F.expr(columns_for(form.undefined, lambda name: f"__t_{name}"))
        return p.select("__j", "__i", delta.cast("double").alias("delta"), undef.alias("undef"))

    # ------------------------------------------------------- order statistics
    def _order_values(self) -> np.ndarray:
        """Quantile of each database (DuckDB ``quantile_cont``), and the values at every rank that
        the leave-one-out quantiles read, gathered in two jobs."""
        from pyspark import StorageLevel
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        x, level, n = self.query.columns[0], float(self.query.q), len(self.panel.labels)
        base = self._base()
        # one job: each individual's usable rows c per database, then the (database, c) pairs
        per_id = base.groupBy("__j", "__i").agg(F.count(F.col(_q(x))).alias("c"), self._null_count())
        counts = self._run(lambda: _collect(per_id.groupBy("__j", "c").agg(
            F.count(F.lit(1)).alias("k"), F.sum("__null").alias("__null"))))
        cj = np.asarray(counts.column("__j").to_numpy(zero_copy_only=False), dtype=np.int64)
        cc = np.asarray(counts.column("c").to_numpy(zero_copy_only=False), dtype=np.int64)
        ck = np.asarray(counts.column("k").to_numpy(zero_copy_only=False), dtype=np.int64)
        self.n_null_values = int(np.nan_to_num(np.asarray(counts.column("__null").to_numpy(
            zero_copy_only=False), dtype=np.float64)).sum())
        N = np.bincount(cj, weights=cc * ck, minlength=n).astype(np.int64)
        if (N == 0).any():
            j = int(np.flatnonzero(N == 0)[0])
            raise InputError(f"query {self.query.describe()!r} is undefined on database {self.panel.labels[j]!s} "
                             f"(no usable rows); filter that database out")
        rows = base.filter(F.col(_q(x)).isNotNull()).select("__j", "__i", F.col(_q(x)).alias("x"))
        # r: rank in the database (ties in any order: the remaining multiset is the same);
        # t: rank among the individual's own rows; c: the individual's rows in the database
        by_db = Window.partitionBy("__j").orderBy("x")
        own = Window.partitionBy("__j", "__i").orderBy("r")
        ranked = (rows.withColumn("r", F.row_number().over(by_db) - 1)
                  .withColumn("t", F.row_number().over(own))
                  .withColumn("c", F.count(F.lit(1)).over(Window.partitionBy("__j", "__i"))))
        self._ranked = ranked.persist(StorageLevel.MEMORY_AND_DISK)
        # ranks needed: the database's own quantile and, per row count c of an individual,
        # k(c) … k(c) + c + 1 (its leave-one-out value lies among them)
        need_j, need_r = [], []
        for j in range(n):
            h = (N[j] - 1) * level
            k0 = int(math.floor(h))
            need_j += [j, j]
            need_r += [k0, min(k0 + 1, N[j] - 1)]
        for j, c in zip(cj, cc):
            remaining = N[j] - c
            if c == 0 or remaining == 0:
                continue
            k = int(math.floor((remaining - 1) * level))
            span = np.arange(k, min(k + c + 2, N[j]))
            need_j.extend([int(j)] * len(span))
            need_r.extend(span.tolist())
        need = pl.DataFrame({"__j": need_j, "r": need_r}, schema={"__j": pl.Int32, "r": pl.Int32}).unique()
        want = self.spark.createDataFrame(need.to_pandas())
        lookup = self._run(lambda: _collect(self._ranked.join(F.broadcast(want), ["__j", "r"])
                                            .select("__j", "r", "x").distinct()))
        self._lookup = lookup
        lj = np.asarray(lookup.column("__j").to_numpy(zero_copy_only=False), dtype=np.int64)
        lr = np.asarray(lookup.column("r").to_numpy(zero_copy_only=False), dtype=np.int64)
        lx = np.asarray(lookup.column("x").to_numpy(zero_copy_only=False), dtype=np.float64)
        value = {(a, b): v for a, b, v in zip(lj, lr, lx)}
        qv = np.empty(n)
        for j in range(n):
            h = (N[j] - 1) * level
            k0 = int(math.floor(h))
            frac = h - math.floor(h)
            lo, hi = value[(j, k0)], value[(j, min(k0 + 1, N[j] - 1))]
            qv[j] = lo + (hi - lo) * frac if frac > 0 else lo
        self._totals = {"N": N.astype(np.float64)}
        return qv

    def _order_delta(self):
        """(__j, __i, delta, undef) of every present pair for min, max, median and quantile."""
        from pyspark.sql import functions as F

        level = float(self.query.q)
        N = F.element_at(_lits(self._totals["N"]), F.col("__j") + 1)
        rest = (N - F.col("c")).cast("double")
        h = (rest - 1) * F.lit(level)
        k = F.floor(h)
        g = F.col("r") - (F.col("t") - 1)  # r_t − (t − 1): ascending in t
        per = (self._ranked.withColumn("k", k).withColumn("frac", h - F.floor(h)).withColumn("g", g)
               .groupBy("__j", "__i")
               .agg(F.first("c").alias("c"), F.first("k").alias("k"), F.first("frac").alias("frac"),
                    F.first(N).alias("N"),
                    F.sum((F.col("g") <= F.col("k")).cast("long")).alias("below"),
                    F.sum((F.col("g") <= F.col("k") + 1).cast("long")).alias("below1")))
        per = per.withColumn("lo_r", (F.col("k") + F.col("below")).cast("int")) \
                 .withColumn("hi_r", (F.col("k") + 1 + F.col("below1")).cast("int"))
        look = self.spark.createDataFrame(self._lookup.to_pandas())
        lo = F.broadcast(look.select(F.col("__j").alias("__lj"), F.col("r").alias("__lr"), F.col("x").alias("lo")))
        hi = F.broadcast(look.select(F.col("__j").alias("__hj"), F.col("r").alias("__hr"), F.col("x").alias("hi")))
        per = (per.join(lo, (per["__j"] == lo["__lj"]) & (per["lo_r"] == lo["__lr"]), "left")
               .join(hi, (per["__j"] == hi["__hj"]) & (per["hi_r"] == hi["__hr"]), "left"))
        undef = F.col("N") - F.col("c") == 0
        loo = F.when(F.col("frac") > 0, F.col("lo") + (F.col("hi") - F.col("lo")) * F.col("frac")).otherwise(F.col("lo"))
        delta = F.when(undef, F.lit(0.0)).otherwise(_at(self._q) - loo)
        return per.select("__j", "__i", delta.cast("double").alias("delta"), undef.alias("undef"))

    # ---------------------------------------------------------------- --sql
    def _sql_values(self) -> np.ndarray:
        from .sql import sql_values

        return sql_values(self)

    def _sql_delta(self):
        from .sql import sql_delta

        # the leave-one-out values only when shifts are asked for (not for an adversary statistic)
        return self.spark.createDataFrame(sql_delta(self, self.values()).to_pandas())

    # ---------------------------------------------------------------- screening
    def _delta_table(self):
        """The persisted (__j, __i, delta, undef) table of every present pair."""
        from pyspark import StorageLevel

        if self._delta is None:
            if self.query.is_decomposable:
                delta = self._decomposable_delta()
            elif self.query.is_order_statistic:
                delta = self._order_delta()
            else:
                delta = self._sql_delta()
            self._delta = delta.persist(StorageLevel.MEMORY_AND_DISK)
        return self._delta

    def _screen(self, scale: np.ndarray) -> Screen:
        from pyspark.sql import functions as F

        d = self._delta_table()
        ok = ~F.col("undef")
        a = F.abs(F.col("delta"))
        agg = d.groupBy("__i").agg(
            F.count(F.lit(1)).alias("n_present"), F.max(F.col("undef").cast("int")).alias("undefined"),
            F.coalesce(F.max(F.when(ok, a)), F.lit(0.0)).alias("max_abs_shift"),
            F.coalesce(F.max(F.when(ok, a / _at(scale))), F.lit(0.0)).alias("bound"))
        df = pl.from_arrow(self._run(lambda: _collect(agg))).sort("__i")
        self._ids = df["__i"].rename(self.panel.id)
        self._screened = True
        return Screen(ids=self._ids, n_present=df["n_present"].to_numpy().astype(np.int64),
                      undefined=df["undefined"].to_numpy().astype(bool),
                      max_abs_shift=df["max_abs_shift"].to_numpy().astype(np.float64),
                      bound=df["bound"].to_numpy().astype(np.float64))

    def wanted(self, codes: np.ndarray):
        """A DataFrame (__i, __row) of the individuals ``codes`` and their output rows."""
        if self._ids is None:
            raise RuntimeError("screen() must run before shifts()")
        codes = np.asarray(codes, dtype=np.int64)
        frame = pl.DataFrame({"__i": self._ids[codes], "__row": np.arange(len(codes), dtype=np.int64)})
        return self.spark.createDataFrame(frame.to_pandas())

    def shift_rows(self, codes: np.ndarray):
        """The cluster's (__row, __j, delta, undef) rows of the individuals ``codes``."""
        return self._delta_table().join(self.wanted(codes), "__i").select("__row", "__j", "delta", "undef")

    def _shift_rows(self, codes: np.ndarray) -> tuple:
        """(row, j, Δ, undefined) of the present pairs of ``codes``, collected from the cluster."""
        codes = np.asarray(codes, dtype=np.int64)
        if self._ids is not None and np.array_equal(codes, np.arange(len(self._ids))):
            # every individual in order (a joint or grouped read, a calibration): the whole Δ table, one job,
            # without sending every id to the cluster for a join
            tab = self._run(lambda: _collect(self._delta_table().select("__i", "__j", "delta", "undef")))
            rows = self._ids.search_sorted(pl.Series(tab.column("__i").combine_chunks(), dtype=self._ids.dtype))
            rows = rows.to_numpy()
        else:
            tab = self._run(lambda: _collect(self.shift_rows(codes)))
            rows = tab.column("__row").to_numpy(zero_copy_only=False)

        def column(name, dtype):
            return np.asarray(tab.column(name).to_numpy(zero_copy_only=False), dtype=dtype)

        return (np.asarray(rows, dtype=np.int64), column("__j", np.int64), column("delta", np.float64),
                column("undef", bool))


def open_spark_source(source: Any = None, *, id: str, by: str, master: str | None = None,
                      remote: str | None = None, table: str | None = None, columns=(), where: str | None = None,
                      drop_null_ids: bool = False, spark=None, database: str | None = None) -> SparkPanel:
    """Open ``source`` (or the catalog ``table``) on Spark as a checked :class:`SparkPanel`, in one scan:
    the value ``columns`` are checked finite on the rows ``where`` keeps. Several statistics' engines
    may share it (:func:`make_spark_engine` with ``panel``). Arguments as for :func:`make_spark_engine`."""
    check_spark(where, "where")  # Spark reads a backslash in a string otherwise than DuckDB's parser did
    if (source is None) == (table is None):
        raise InputError("give a source path (or DataFrame) or the Spark engine's `table`", param="table")
    from .session import is_dataframe, require_pyspark

    require_pyspark()
    if is_dataframe(source):
        spark = source.sparkSession
    elif spark is None:
        spark = spark_session(master=master, remote=remote)
    return open_spark_panel(spark, source, id=id, by=by, table=table, value_columns=columns, where=where,
                            drop_null_ids=drop_null_ids, database=database)


def make_spark_engine(source: Any = None, *, id: str, by: str, query: str | None = None,
                      where: str | None = None, sql: str | None = None, master: str | None = None,
                      remote: str | None = None, table: str | None = None, drop_null_ids: bool = False,
                      spark=None, database: str | None = None, panel: SparkPanel | None = None) -> SparkEngine:
    """Open ``source`` on Spark and parse the query into a :class:`SparkEngine`.

    Parameters
    ----------
    source : str, path or pyspark.sql.DataFrame, optional
        Parquet/CSV/JSON file, glob or (hive-partitioned) folder, or a DataFrame.
    table : str, optional
        A catalog or Delta table by name (instead of ``source``).
    master, remote : str, optional
        Spark master URL (default: the active session, else ``local[*]``) or a Spark Connect
        URL ``sc://HOST:PORT`` (default ``$SPARK_REMOTE``).
    spark : SparkSession, optional
        An existing session to use (a DataFrame source brings its own).
    database : str, optional
        Read only this database (its label as text): ``release SOURCE --database D``.
    panel : SparkPanel, optional
        The source opened already (:func:`open_spark_source`), shared by several statistics: the
        engine reads it, after checking its own value columns where the panel did not.

    Raises :class:`InputError` (one line) for bad input, a missing PySpark or Java, and a
    master or server that does not answer.
    """
    parsed = parse_query(query, where=where, sql=sql)
    if panel is None:
        panel = open_spark_source(source, id=id, by=by, master=master, remote=remote, table=table,
                                  columns=parsed.columns, where=parsed.where, drop_null_ids=drop_null_ids,
                                  spark=spark, database=database)
    else:
        check_spark(parsed.where, "where")
        require_values(panel, parsed.columns, parsed.where)
    return SparkEngine(panel, parsed)
