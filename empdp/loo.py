"""The drop-one-identifier loop (docs/method.md#2-leave-one-out-shifts-and-query-forms): f(X^j) and the shifts Δ_ij = f(X^j) − f(X^j ∖ i).

Three engines share one interface (:class:`LooEngine`):

* decomposable aggregates are computed in DuckDB from per-(database, id)
  partial moments, in closed form (one GROUP BY pass; scales to 10^8 rows);
* order statistics use rank arithmetic on each database's sorted values;
* generic SQL runs one set-based correlated query per database.

The engine answers three questions, in the order the risk layer needs them:
``values()`` (the n query values), ``screen(scale)`` (per individual: number of
databases, sole-contributor flag, largest |Δ_ij| and M_i = max_j |Δ_ij| / scale_j,
docs/method.md#51-screening-bound) and ``shifts(codes)`` (dense Δ rows of the chosen individuals only).
"""

from __future__ import annotations

import queue
import re
import threading
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from .data import Panel, clip, open_panel, quote_ident
from .data import shorten as short
from .errors import InputError
from .query import Query, parse_query

#: largest number of (individual, database) cells held as one dense Δ matrix (8 bytes each); it
#: must also fit in a third of DuckDB's memory limit, so that a low --memory-limit stays low
DENSE_CELLS = 100_000_000
#: largest |query value| and |shift| accepted: the density model squares differences of them,
#: and squares of larger numbers overflow a double (1.8e308)
MAX_MAGNITUDE = 1e150
_UNITS = {"": 1, "B": 1, "BYTES": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}


def _memory_limit_bytes(con: duckdb.DuckDBPyConnection) -> int:
    """DuckDB's memory limit in bytes (its setting reads like '1.8 GiB')."""
    text = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        return 0  # unknown format: do not hold the matrix
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


@dataclass
class Screen:
    """Per-individual screening table (rows ordered by id; ``code`` = row index).

    Attributes
    ----------
    ids : polars.Series
        The individuals' ids (original name and dtype).
    n_present : ndarray of int
        Number of databases in which the individual has rows (after ``where``).
    undefined : ndarray of bool
        Sole contributors: f(X^j ∖ i) is undefined in some database (docs/method.md#2-leave-one-out-shifts-and-query-forms).
    max_abs_shift : ndarray
        max_j |Δ_ij| over databases where it is defined.
    bound : ndarray
        M_i = max_j |Δ_ij| / scale_j (docs/method.md#51-screening-bound).
    """

    ids: pl.Series
    n_present: np.ndarray
    undefined: np.ndarray
    max_abs_shift: np.ndarray
    bound: np.ndarray

    def __len__(self) -> int:
        return len(self.n_present)


class LooEngine:
    """Leave-one-out engine over a :class:`~empdp.data.Panel` for one :class:`Query`."""

    def __init__(self, panel: Panel, query: Query):
        self.panel = panel
        self.query = query
        _require_workable_databases(panel)
        for col in query.columns:
            panel.require_numeric(col, query.where)
        #: rows the query skips because a value column is NULL (known after :meth:`values`)
        self.n_null_values = 0
        self._q: np.ndarray | None = None
        self._sparse: tuple | None = None  # in-memory engines: (ids, code, j, delta, undef)
        self._screened = False
        self._dense: np.ndarray | None = None  # every Δ row, when screen() could hold them

    def close(self) -> None:
        """Close the panel's DuckDB connection and remove its spill folder."""
        self.panel.close()

    @property
    def null_values_warning(self) -> str | None:
        """The warning to show when the query skipped rows with a NULL value (else None)."""
        if not self.n_null_values:
            return None
        cols = " or ".join(short(c) for c in dict.fromkeys(self.query.columns))
        return (f"{self.n_null_values:,} rows have a NULL {cols}: the query skips NULL values, as SQL "
                f"aggregates do; fill or filter them if they should count")

    # ------------------------------------------------------------------ values
    def values(self) -> np.ndarray:
        """f(X^j) for every database, in label order.

        Raises :class:`InputError` when a value overflows (or comes near the largest double):
        such values are arithmetic noise, not a query's values.
        """
        if self._q is None:
            # values near 1e308 overflow inside the aggregates: checked below, without warnings
            with np.errstate(all="ignore"):
                if self.query.is_decomposable:
                    q = self._decomposable_values()
                else:
                    self._sparse = self._in_memory()
                    q = self._q
            self._q = None
            self._require_in_range(q)
            self._q = q
        return self._q

    def _require_in_range(self, values: np.ndarray, ids: pl.Series | None = None) -> None:
        """Refuse query values (``ids`` None: one per database) or per-individual largest shifts
        that are not finite or exceed :data:`MAX_MAGNITUDE` (the density model squares them)."""
        values = np.asarray(values, dtype=np.float64)
        bad = ~(np.abs(values) <= MAX_MAGNITUDE)  # NaN too
        if not bad.any():
            return
        k = int(np.flatnonzero(bad)[0])
        where = (f"database {short(self.panel.labels[k])}" if ids is None
                 else f"individual {short(ids[k])} (and {int(bad.sum()) - 1} more)" if bad.sum() > 1
                 else f"individual {short(ids[k])}")
        cols = " and ".join(short(c) for c in dict.fromkeys(self.query.columns)) or "the columns it reads"
        what = "value" if ids is None else "largest leave-one-out shift"
        raise InputError(
            f"the query {short(self.query.describe())} overflows: its {what} on {where} is {values[k]:.4g}, "
            f"beyond what double precision carries through the risk model (|value| <= {MAX_MAGNITUDE:.0e}); "
            f"rescale {cols} (e.g. express it in larger units) and rerun")

    # ---------------------------------------------------------------- screening
    def screen(self, scale: np.ndarray) -> Screen:
        """Per-individual summary and screening bound M_i = max_j |Δ_ij| / scale_j."""
        scale = np.asarray(scale, dtype=np.float64)
        self.values()
        with np.errstate(all="ignore"):  # overflowing shifts are refused below, without warnings
            out = self._screen(scale)
        self._require_in_range(out.max_abs_shift, out.ids)
        return out

    def _screen(self, scale: np.ndarray) -> Screen:
        if self.query.is_decomposable:
            return self._decomposable_screen(scale)
        ids, code, j, delta, undef = self._sparse
        m = len(ids)
        n_present = np.bincount(code, minlength=m)
        undefined = np.zeros(m, dtype=bool)
        undefined[code[undef]] = True
        ok = ~undef
        max_abs = np.zeros(m)
        np.maximum.at(max_abs, code[ok], np.abs(delta[ok]))
        bound = np.zeros(m)
        np.maximum.at(bound, code[ok], np.abs(delta[ok]) / scale[j[ok]])
        self._screened = True
        return Screen(ids, n_present, undefined, max_abs, bound)

    def shifts(self, codes: np.ndarray, presence: bool = False):
        """Dense Δ rows (len(codes), n) for the given individuals (0 where absent or undefined).

        With ``presence``, also return the (len(codes), n) bool matrix of the
        databases in which each individual has rows.
        """
        codes = np.asarray(codes, dtype=np.int64)
        n = len(self.panel.labels)
        out = np.zeros((len(codes), n))
        if self._dense is not None and not presence:
            return self._dense[codes]
        if len(codes) and self.query.is_decomposable and not presence:
            self._decomposable_dense(codes, out)
            return out
        present = np.zeros((len(codes), n), dtype=bool)
        if len(codes):
            if self.query.is_decomposable:
                rows, j, delta, undef = self._decomposable_shifts(codes)
            else:
                _, code, j, delta, undef = self._sparse
                pos = np.full(int(code.max()) + 1, -1, dtype=np.int64)
                pos[codes] = np.arange(len(codes))
                sel = pos[code] >= 0
                rows, j, delta, undef = pos[code[sel]], j[sel], delta[sel], undef[sel]
            out[rows[~undef], j[~undef]] = delta[~undef]
            present[rows, j] = True
        return (out, present) if presence else out

    # ------------------------------------------------------- decomposable (SQL)
    def _agg_columns(self) -> list[str]:
        """Partial-moment SQL expressions per (group) for the query form."""
        q, form = self.query, self.query.form
        if form == "count":
            if not q.columns:
                return ["count(*)::DOUBLE AS c"]
            return [f"count({quote_ident(q.columns[0])})::DOUBLE AS c"]
        if form == "ratio":
            a, b = (quote_ident(c) for c in q.columns)
            return [f"count({a})::DOUBLE AS ca", f"coalesce(sum({a}::DOUBLE), 0) AS sa",
                    f"count({b})::DOUBLE AS cb", f"coalesce(sum({b}::DOUBLE), 0) AS sb"]
        x = quote_ident(q.columns[0])
        return [f"count({x})::DOUBLE AS c", f"coalesce(sum({x}::DOUBLE), 0) AS s"]

    def _decomposable_values(self) -> np.ndarray:
        q, form, n = self.query, self.query.form, len(self.panel.labels)
        cols = self._agg_columns()
        if form in ("var", "std"):
            cols.append(f"coalesce(avg({quote_ident(q.columns[0])}::DOUBLE), 0) AS m")
        cols.append(f"{self._null_count()} AS __null")
        sql = f"SELECT __j, {', '.join(cols)} FROM ({self.panel.base_sql(q.columns, q.where)}) GROUP BY __j"
        tot = pl.from_arrow(self._run(sql, fetch=True))
        self.n_null_values = int(tot["__null"].sum())
        tot = tot.drop("__null")
        # databases with no row passing the filter get zero totals
        tot = pl.DataFrame({"__j": np.arange(n, dtype=np.int32)}).join(
            tot.with_columns(pl.col("__j").cast(pl.Int32)), on="__j", how="left").with_columns(pl.exclude("__j").fill_null(0.0)).sort("__j")
        if form in ("var", "std"):
            # centred sums about the database mean: accurate even for values like 1e9 + noise
            self._register_totals(tot)
            x = quote_ident(q.columns[0])
            cen = pl.from_arrow(self._run(
                f"SELECT b.__j, coalesce(sum(b.{x}::DOUBLE - t.m), 0) AS s1, "
                f"coalesce(sum((b.{x}::DOUBLE - t.m) * (b.{x}::DOUBLE - t.m)), 0) AS ss "
                f"FROM ({self.panel.base_sql(q.columns, q.where)}) b JOIN __totals t USING (__j) GROUP BY b.__j",
                fetch=True)).with_columns(pl.col("__j").cast(pl.Int32))
            tot = tot.join(cen, on="__j", how="left").with_columns(pl.exclude("__j").fill_null(0.0)).sort("__j")
        t = {c: tot[c].to_numpy().astype(np.float64) for c in tot.columns if c != "__j"}
        if form == "count":
            val, ok = t["c"], np.ones(n, bool)
        elif form == "sum":
            val, ok = t["s"], t["c"] > 0
        elif form == "mean":
            ok = t["c"] > 0
            val = np.divide(t["s"], t["c"], out=np.zeros(n), where=ok)
        elif form in ("var", "std"):
            ok = t["c"] > 1
            with np.errstate(divide="ignore", invalid="ignore"):
                var = np.where(ok, (t["ss"] - t["s1"] ** 2 / t["c"]) / (t["c"] - 1), 0.0)
            var = np.maximum(var, 0.0)
            val = var if form == "var" else np.sqrt(var)
        else:  # ratio
            ok = (t["ca"] > 0) & (t["cb"] > 0) & (t["sb"] != 0)
            val = np.divide(t["sa"], t["sb"], out=np.zeros(n), where=ok)
        if not ok.all():
            bad = [str(self.panel.labels[k]) for k in np.flatnonzero(~ok)[:5]]
            raise InputError(f"query {short(q.describe())} is undefined on database(s) {', '.join(bad)} "
                             f"(no usable rows); filter those databases out")
        self._register_totals(tot.with_columns(pl.Series("f", val)))
        return val

    def _null_count(self) -> str:
        """SQL counting the rows (of one group) where a value column of the query is NULL."""
        if not self.query.columns:
            return "0::BIGINT"
        nulls = " OR ".join(f"{quote_ident(c)} IS NULL" for c in self.query.columns)
        return f"count(*) FILTER (WHERE {nulls})"

    def _register_totals(self, tot: pl.DataFrame) -> None:
        con = self.panel.con
        con.register("__totals_arrow", tot.to_arrow())
        con.execute("CREATE OR REPLACE TEMP TABLE __totals AS SELECT * FROM __totals_arrow")
        con.unregister("__totals_arrow")

    def _delta_sql(self, id_filter: str = "") -> str:
        """SQL of (__i, __j, delta, undef) for every (individual, database) pair present."""
        q, form = self.query, self.query.form
        parts = self._agg_columns()
        base = self.panel.base_sql(q.columns, q.where)
        if id_filter:
            base = f"SELECT * FROM ({base}) WHERE __i IN ({id_filter})"
        if form in ("var", "std"):
            x = quote_ident(q.columns[0])
            base = f"SELECT b.*, b.{x}::DOUBLE - t.m AS __xc FROM ({base}) b JOIN __totals t USING (__j)"
            parts = ["count(__xc)::DOUBLE AS c", "coalesce(sum(__xc), 0) AS s",
                     "coalesce(sum(__xc * __xc), 0) AS ss"]
        if form == "count":
            delta, undef = "p.c", "t.c - p.c <= 0"
        elif form == "sum":
            delta, undef = "p.s", "t.c - p.c <= 0"
        elif form == "mean":
            delta = "CASE WHEN t.c - p.c > 0 THEN (p.s - p.c * t.f) / (t.c - p.c) ELSE 0 END"
            undef = "t.c - p.c <= 0"
        elif form in ("var", "std"):
            loo = "((t.ss - p.ss) - (t.s1 - p.s) * (t.s1 - p.s) / (t.c - p.c)) / (t.c - p.c - 1)"
            loo = f"greatest({loo}, 0)"
            delta = (f"CASE WHEN t.c - p.c > 1 THEN t.f - "
                     f"{'sqrt(' + loo + ')' if form == 'std' else loo} ELSE 0 END")
            undef = "t.c - p.c <= 1"
        else:  # ratio
            undef = "(t.ca - p.ca <= 0) OR (t.cb - p.cb <= 0) OR (t.sb - p.sb = 0)"
            delta = f"CASE WHEN {undef} THEN 0 ELSE (p.sa - t.f * p.sb) / (t.sb - p.sb) END"
        return (f"SELECT p.__i, p.__j, ({delta})::DOUBLE AS delta, ({undef}) AS undef "
                f"FROM (SELECT __j, __i, {', '.join(parts)} FROM ({base}) GROUP BY __j, __i) p "
                f"JOIN __totals t USING (__j)")

    def _decomposable_screen(self, scale: np.ndarray) -> Screen:
        con = self.panel.con
        self._dense = None
        # codes: the individuals with rows the query reads, in id order
        self._run(f"CREATE OR REPLACE TEMP TABLE __ids AS "
                  f"SELECT __i, (row_number() OVER (ORDER BY __i) - 1)::BIGINT AS __code "
                  f"FROM (SELECT DISTINCT __i FROM ({self.panel.base_sql(self.query.columns, self.query.where)}))")
        ids = pl.from_arrow(_arrow(con, "SELECT __i FROM __ids ORDER BY __code"))["__i"].rename(self.panel.id)
        m, n = len(ids), len(self.panel.labels)
        self._screened = True
        if m * n <= min(DENSE_CELLS, _memory_limit_bytes(con) // (3 * 8)):
            return self._dense_screen(ids, scale)
        # too large to hold: aggregate per individual in DuckDB, fetch chosen rows later
        con.register("__scale_arrow", pa.table({"__j": pa.array(np.arange(n, dtype=np.int32)),
                                                 "scale": pa.array(scale)}))
        con.execute("CREATE OR REPLACE TEMP TABLE __scale AS SELECT * FROM __scale_arrow")
        con.unregister("__scale_arrow")
        sql = (f"SELECT c.__code, count(*)::BIGINT AS n_present, bool_or(d.undef) AS undefined, "
               f"coalesce(max(abs(d.delta)) FILTER (WHERE NOT d.undef), 0) AS max_abs_shift, "
               f"coalesce(max(abs(d.delta) / s.scale) FILTER (WHERE NOT d.undef), 0) AS bound "
               f"FROM ({self._delta_sql()}) d JOIN __scale s USING (__j) JOIN __ids c USING (__i) "
               f"GROUP BY c.__code ORDER BY c.__code")
        df = pl.from_arrow(self._run(sql, fetch=True))
        if not np.array_equal(df["__code"].to_numpy(), np.arange(m)):  # rows must line up with ``ids``
            raise RuntimeError("screening table does not cover every individual code")
        return Screen(
            ids=ids,
            n_present=df["n_present"].to_numpy(),
            undefined=df["undefined"].to_numpy().astype(bool),
            max_abs_shift=df["max_abs_shift"].to_numpy().astype(np.float64),
            bound=df["bound"].to_numpy().astype(np.float64),
        )

    def _dense_screen(self, ids: pl.Series, scale: np.ndarray) -> Screen:
        """Every Δ_ij in one streamed pass into a dense (m, n) matrix kept for :meth:`shifts`;
        the screening table is then computed from it (no second scan of the table)."""
        m, n = len(ids), len(self.panel.labels)
        dense = np.zeros((m, n))
        flat_out = dense.reshape(-1)
        n_present = np.zeros(m, dtype=np.int64)
        undefined = np.zeros(m, dtype=bool)
        sql = (f"SELECT (c.__code * {n} + d.__j)::BIGINT AS flat, d.delta, d.undef "
               f"FROM ({self._delta_sql()}) d JOIN __ids c USING (__i)")
        for batch in _arrow_batches(self.panel.con, sql):
            flat = batch.column(0).to_numpy()
            undef = batch.column(2).to_numpy(zero_copy_only=False)
            n_present += np.bincount(flat // n, minlength=m)
            if undef.any():
                undefined[flat[undef] // n] = True
                flat, delta = flat[~undef], batch.column(1).to_numpy()[~undef]
            else:
                delta = batch.column(1).to_numpy()
            np.put(flat_out, flat, delta)
        inv = 1.0 / scale
        max_abs, bound = np.empty(m), np.empty(m)
        step = max(1, (1 << 22) // max(n, 1))  # row blocks: no temporary the size of the matrix
        for a in range(0, m, step):
            part = np.abs(dense[a:a + step])
            max_abs[a:a + step] = part.max(axis=1, initial=0.0)
            part *= inv
            bound[a:a + step] = part.max(axis=1, initial=0.0)
        self._dense = dense
        return Screen(ids=ids, n_present=n_present, undefined=undefined, max_abs_shift=max_abs, bound=bound)

    @property
    def holds_all_shifts(self) -> bool:
        """True when :meth:`screen` kept every Δ row in memory (then :meth:`shifts` reads no table)."""
        return self._dense is not None

    def release_shifts(self) -> None:
        """Drop the held Δ matrix; later :meth:`shifts` calls fetch their rows from the table."""
        self._dense = None

    def _want(self, codes: np.ndarray) -> None:
        """The temp table ``__want`` (__i, __row): the individuals of ``codes`` and their output rows."""
        if not self._screened:
            raise RuntimeError("screen() must run before shifts()")
        con = self.panel.con
        con.register("__want_arrow", pa.table({"__code": pa.array(codes),
                                                "__row": pa.array(np.arange(len(codes)))}))
        con.execute("CREATE OR REPLACE TEMP TABLE __want AS SELECT i.__i, w.__row "
                    "FROM __want_arrow w JOIN __ids i USING (__code)")
        con.unregister("__want_arrow")

    def _decomposable_dense(self, codes: np.ndarray, out: np.ndarray) -> None:
        """Scatter the defined Δ_ij of ``codes`` into ``out`` as DuckDB streams them (bounded memory)."""
        self._want(codes)
        n = out.shape[1]
        sql = (f"SELECT (w.__row * {n} + d.__j)::BIGINT AS flat, d.delta "
               f"FROM ({self._delta_sql('SELECT __i FROM __want')}) d JOIN __want w USING (__i) WHERE NOT d.undef")
        flat_out = out.reshape(-1)
        for batch in _arrow_batches(self.panel.con, sql):
            np.put(flat_out, batch.column(0).to_numpy(), batch.column(1).to_numpy())

    def _decomposable_shifts(self, codes: np.ndarray):
        self._want(codes)
        sql = (f"SELECT w.__row, d.__j, d.delta, d.undef FROM ({self._delta_sql('SELECT __i FROM __want')}) d "
               f"JOIN __want w USING (__i)")
        res = self._run(sql).fetchnumpy()
        return (np.asarray(res["__row"], dtype=np.int64), np.asarray(res["__j"], dtype=np.int64),
                np.asarray(res["delta"], dtype=np.float64), np.asarray(res["undef"], dtype=bool))

    def _run(self, sql: str, fetch: bool = False):
        try:
            return _arrow(self.panel.con, sql) if fetch else self.panel.con.execute(sql)
        except duckdb.Error as exc:
            msg = str(exc).strip().splitlines()[0]
            if self.query.where and isinstance(exc, (duckdb.ParserException, duckdb.BinderException)):
                raise InputError(f"the filter --where {short(self.query.where)} is not valid here: {clip(msg, 200)}") from None
            raise

    # ----------------------------------------------------- in-memory engines
    def _in_memory(self):
        if self.query.is_order_statistic:
            self.n_null_values = int(self.panel.con.execute(
                f"SELECT {self._null_count()} FROM ({self.panel.base_sql(self.query.columns, self.query.where)})"
            ).fetchall()[0][0])
            q, ids, code, j, delta, undef = _order_statistic_loo(self.panel, self.query)
        else:
            q, ids, code, j, delta, undef = _sql_loo(self.panel, self.query)
        self._q = q
        return ids, code, j, delta, undef


#: bytes per pair of databases the density model holds at its peak (measured: 1.4 GB for 5,000
#: databases, 19 GB for 20,000); its bandwidth search compares every pair of query values
DENSITY_BYTES_PER_PAIR = 56


def _require_workable_databases(panel: Panel) -> None:
    """Refuse, before any scan, more databases than the density model can hold in memory.

    10^5 one-row databases failed after the scan with 'out of memory (74.5 GiB)' and the
    advice to raise --memory-limit, which bounds DuckDB, not the model.
    """
    from .data import physical_memory

    n, total = panel.n_databases, physical_memory()
    if total is None or n * n * DENSITY_BYTES_PER_PAIR <= 0.8 * total:
        return
    fits = int((0.8 * total / DENSITY_BYTES_PER_PAIR) ** 0.5)
    raise InputError(
        f"column {short(panel.by)} makes {n:,} databases; the density model compares every pair of their "
        f"query values, ~{n * n * DENSITY_BYTES_PER_PAIR / 2**30:,.0f} GiB, and this machine's memory "
        f"({total / 2**30:.1f} GiB) holds about {fits:,} databases: label the rows with a coarser --by "
        f"(e.g. month instead of day) or assess a sample of the databases")


def _quantile_sorted(v: np.ndarray, pos_lo: np.ndarray, frac: np.ndarray) -> np.ndarray:
    """Linear interpolation between order statistics (DuckDB ``quantile_cont``)."""
    lo = v[pos_lo]
    hi = v[np.minimum(pos_lo + 1, len(v) - 1)]
    return np.where(frac > 0, lo + (hi - lo) * frac, lo)


def _kth_excluding(ranks: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Index in the full sorted array of the k-th smallest value once the rows at
    ``ranks`` (g × c, ascending per row) are removed (rank arithmetic, docs/method.md#2-leave-one-out-shifts-and-query-forms)."""
    pos = k.copy()
    for t in range(ranks.shape[1]):
        pos += ranks[:, t] <= pos
    return pos


def _order_statistic_loo(panel: Panel, query: Query):
    x = query.columns[0]
    sql = f"SELECT __j, __i, {quote_ident(x)}::DOUBLE AS x FROM ({panel.base_sql([x], query.where)}) " \
          f"WHERE {quote_ident(x)} IS NOT NULL"
    df = pl.from_arrow(_arrow(panel.con, sql))
    ids, code = _factorize(df["__i"], panel.id)
    jj = df["__j"].to_numpy().astype(np.int64)
    xx = df["x"].to_numpy()
    n, level = len(panel.labels), float(query.q)
    qv = np.empty(n)
    out_code, out_j, out_delta, out_undef = [], [], [], []
    order = np.lexsort((xx, jj))
    bounds = np.searchsorted(jj[order], np.arange(n + 1))
    for j in range(n):
        rows = order[bounds[j]:bounds[j + 1]]
        N = len(rows)
        if N == 0:
            raise InputError(f"query {short(query.describe())} is undefined on database {panel.labels[j]!s} "
                             f"(no usable rows); filter that database out")
        v = xx[rows]  # sorted values of database j
        h = (N - 1) * level
        qv[j] = _quantile_sorted(v, np.array([int(np.floor(h))]), np.array([h - np.floor(h)]))[0]
        c = code[rows]
        by_owner = np.lexsort((np.arange(N), c))  # ranks grouped by individual, ascending
        c_sorted = c[by_owner]
        starts = np.flatnonzero(np.r_[True, c_sorted[1:] != c_sorted[:-1]])
        counts = np.diff(np.r_[starts, N])
        for cnt in np.unique(counts):
            grp = starts[counts == cnt]
            owners = c_sorted[grp]
            remaining = N - cnt
            if remaining == 0:
                out_code.append(owners)
                out_j.append(np.full(len(owners), j))
                out_delta.append(np.zeros(len(owners)))
                out_undef.append(np.ones(len(owners), bool))
                continue
            ranks = by_owner[grp[:, None] + np.arange(cnt)[None, :]]
            h = (remaining - 1) * level
            k = np.full(len(owners), int(np.floor(h)), dtype=np.int64)
            frac = h - np.floor(h)
            lo = v[_kth_excluding(ranks, k)]
            if frac > 0:
                hi = v[_kth_excluding(ranks, k + 1)]
                loo = lo + (hi - lo) * frac
            else:
                loo = lo
            out_code.append(owners)
            out_j.append(np.full(len(owners), j))
            out_delta.append(qv[j] - loo)
            out_undef.append(np.zeros(len(owners), bool))
    return (qv, ids, np.concatenate(out_code), np.concatenate(out_j),
            np.concatenate(out_delta), np.concatenate(out_undef))


def _sql_loo(panel: Panel, query: Query):
    """Generic ``--sql``: one correlated set-based query per database (docs/method.md#2-leave-one-out-shifts-and-query-forms)."""
    con, n = panel.con, len(panel.labels)
    qi = quote_ident(panel.id)
    src_j = (f"(SELECT s.*, l.__j, l.__label FROM __src s JOIN __labels l "
             f"ON s.{quote_ident(panel.by)} = l.__label)")
    rewritten = _replace_db(query.sql, f"(SELECT * FROM __dbj WHERE {qi} IS DISTINCT FROM __ids.__id) AS db")
    qv = np.empty(n)
    frames = []
    for j in range(n):
        con.execute(f"CREATE OR REPLACE TEMP TABLE __dbj AS SELECT * EXCLUDE (__j, __label) FROM {src_j} "
                    f"WHERE __j = {j} AND {qi} IS NOT NULL")
        con.execute("CREATE OR REPLACE TEMP VIEW db AS SELECT * FROM __dbj")
        qv[j] = _scalar(con, query.sql, panel.labels[j])
        try:
            df = pl.from_arrow(_arrow(con, f"SELECT __ids.__id AS __i, ({rewritten}) AS v, "
                                    f"(SELECT count(*) FROM __dbj WHERE {qi} IS DISTINCT FROM __ids.__id) AS rest "
                                    f"FROM (SELECT DISTINCT {qi} AS __id FROM __dbj) __ids"))
        except duckdb.Error:
            df = _sql_loo_loop(con, query.sql, qi)
        df = df.with_columns(pl.lit(j, dtype=pl.Int64).alias("__j"))
        frames.append(df.select("__i", "__j", pl.col("v").cast(pl.Float64), "rest"))
    df = pl.concat(frames)
    ids, code = _factorize(df["__i"], panel.id)
    jj = df["__j"].to_numpy()
    v = df["v"].to_numpy()
    undef = (df["rest"].to_numpy() == 0) | ~np.isfinite(v)
    delta = np.where(undef, 0.0, qv[jj] - np.nan_to_num(v))
    return qv, ids, code, jj, delta, undef


def _replace_db(sql: str, replacement: str) -> str:
    return re.sub(r"\bFROM\s+db\b", "FROM " + replacement, sql, flags=re.I)


def _scalar(con, sql: str, label) -> float:
    try:
        rows = con.execute(sql).fetchall()
    except duckdb.Error as exc:
        raise InputError(f"--sql failed on database {clip(str(label), 40)}: "
                         f"{clip(str(exc).strip().splitlines()[0], 200)}") from None
    if len(rows) != 1 or len(rows[0]) != 1:
        raise InputError(f"--sql must return one row with one numeric column; got "
                         f"{len(rows)} row(s) on database {label!s}")
    val = rows[0][0]
    try:
        val = float(val)
    except (TypeError, ValueError):
        raise InputError(f"--sql returned {short(val)} on database {label!s}; it must return a number") from None
    if not np.isfinite(val):
        raise InputError(f"--sql returned {val} on database {label!s}; the query must be defined "
                         f"on every database")
    return val


def _sql_loo_loop(con, sql: str, qi: str) -> pl.DataFrame:
    """Last resort: re-run the query once per individual."""
    ids = pl.from_arrow(_arrow(con, f"SELECT DISTINCT {qi} FROM __dbj")).to_series()
    con.execute(f"CREATE OR REPLACE TEMP TABLE __cur AS SELECT {qi} AS v FROM __dbj LIMIT 0")
    con.execute(f"CREATE OR REPLACE TEMP VIEW db AS SELECT * FROM __dbj WHERE {qi} IS DISTINCT FROM "
                f"(SELECT v FROM __cur)")
    vals, rest = [], []
    for value in ids.to_list():
        con.execute("DELETE FROM __cur")
        con.execute("INSERT INTO __cur VALUES (?)", [value])
        r = con.execute(sql).fetchall()
        vals.append(None if r[0][0] is None else float(r[0][0]))
        rest.append(con.execute("SELECT count(*) FROM db").fetchall()[0][0])
    return pl.DataFrame({"__i": ids, "v": pl.Series(vals, dtype=pl.Float64), "rest": rest})


def _arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql`` and fetch the result as an Arrow table (DuckDB 1.x and 2.x spellings)."""
    rel = con.sql(sql)
    fetch = getattr(rel, "to_arrow_table", None) or getattr(rel, "arrow")
    tab = fetch()
    return tab.read_all() if hasattr(tab, "read_all") else tab


#: record batches DuckDB may produce ahead of the consumer in :func:`_arrow_batches`
PREFETCH_BATCHES = 3


def _arrow_batches(con: duckdb.DuckDBPyConnection, sql: str, rows: int = 1 << 20,
                   prefetch: int = PREFETCH_BATCHES):
    """Run ``sql`` and stream the result as Arrow record batches (DuckDB 1.x and 2.x spellings).

    A reader pulled on demand leaves DuckDB idle while the caller works on a batch; with
    ``prefetch`` > 0 a background thread pulls up to that many batches ahead (on the 10^8-row
    dense screen, alternated runs: median 14.2 → 13.2 s). The connection is used by one thread
    at a time: the caller must not use it until the generator is exhausted or closed.
    """
    rel = con.sql(sql)
    reader = (getattr(rel, "to_arrow_reader", None) or getattr(rel, "fetch_arrow_reader"))(rows)
    if prefetch <= 0:
        yield from reader
        return
    ready: queue.Queue = queue.Queue(maxsize=prefetch)
    stop = threading.Event()
    end = object()

    def offer(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def pull() -> None:
        try:
            for batch in reader:
                if not offer(batch):
                    return
            offer(end)
        except BaseException as exc:  # handed to the consumer, raised there
            offer(exc)

    worker = threading.Thread(target=pull, name="empdp-fetch", daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # the consumer stopped early (or failed): the thread ends after its current batch
        worker.join()


def _factorize(ids: pl.Series, name: str) -> tuple[pl.Series, np.ndarray]:
    """Sorted unique ids and each row's code (index into them)."""
    uniq = ids.unique().sort()
    lookup = pl.DataFrame({"__i": uniq, "__code": np.arange(len(uniq), dtype=np.int64)})
    code = pl.DataFrame({"__i": ids}).join(lookup, on="__i", how="left", maintain_order="left")["__code"]
    return uniq.rename(name), code.to_numpy()


# --------------------------------------------------------------- convenience
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


def make_engine(source: Any, *, id: str, by: str, query: str | None = None, where: str | None = None,
                sql: str | None = None, memory_limit: str | None = None,
                drop_null_ids: bool = False, threads: int | None = None) -> LooEngine:
    """Open ``source`` and parse the query into a :class:`LooEngine`."""
    parsed = parse_query(query, where=where, sql=sql)
    panel = open_panel(source, id=id, by=by, drop_null_ids=drop_null_ids, memory_limit=memory_limit,
                       threads=threads)
    return LooEngine(panel, parsed)


def leave_one_out(source: Any, *, id: str, by: str, query: str | None = None, where: str | None = None,
                  sql: str | None = None, memory_limit: str | None = None,
                  drop_null_ids: bool = False) -> LooResult:
    """Every individual's leave-one-out shifts as a dense matrix (docs/method.md#2-leave-one-out-shifts-and-query-forms).

    Meant for up to ~10^7 (individual, database) cells; :func:`empdp.assess`
    screens first and fetches only the individuals it needs.
    """
    engine = make_engine(source, id=id, by=by, query=query, where=where, sql=sql,
                         memory_limit=memory_limit, drop_null_ids=drop_null_ids)
    q = engine.values()
    screen = engine.screen(np.ones_like(q))
    shifts, present = engine.shifts(np.arange(len(screen)), presence=True)
    return LooResult(labels=list(engine.panel.labels), q=q, shifts=shifts, present=present,
                     undefined=screen.undefined, ids=screen.ids, query=engine.query.describe(),
                     source=engine.panel.description)
