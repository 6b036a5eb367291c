"""Decomposable aggregates in DuckDB (docs/method.md#2-leave-one-out-shifts-and-query-forms).

One GROUP BY (database, id) pass gives every individual's partial moments; the database totals
minus them give every Δ_ij in closed form (the form's entry in :data:`empdp.loo.forms.FORMS`).
This is the path that scales to 10^8 rows: when the m × n shifts fit in memory :meth:`screen`
streams them into one matrix kept for :meth:`shifts`; otherwise the Δ_ij stay in DuckDB, aggregated
there per individual for the screening table, and only the rows asked for leave it. They are the
rows' own when each row is one (individual, database) pair, else a Δ table made once (spilled under
DuckDB's memory limit).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from ..data import arrow_numpy, quote_ident
from ..data import shorten as short
from ..errors import InputError
from .base import MAX_MAGNITUDE, DuckDBEngine, Screen
from .forms import FORMS, GROUPED, ROW, Moments, bind, centred_partials, mean_sql, partials_sql

#: largest number of (individual, database) cells held as one dense Δ matrix (8 bytes each); it
#: must also fit in a third of DuckDB's memory limit, so that a low --memory-limit stays low
DENSE_CELLS = 100_000_000
#: estimated (individual, database) pairs over rows at or above which a table too large to hold is
#: taken to have one row per pair (checked exactly by the screening; HyperLogLog errs by a few percent)
UNIQUE_PAIRS = 0.9


class DecomposableEngine(DuckDBEngine):
    """count, sum, mean, var, std and sum(a)/sum(b): closed-form Δ_ij from partial moments in SQL."""

    def __init__(self, panel, query, tag: str = ""):
        super().__init__(panel, query)
        self.form = FORMS[query.form]
        #: suffix of the engine's partial-moment columns and totals table: the engines of a
        #: :class:`DecomposableSet` share one panel and one scan, and tell their moments apart by it
        self.tag = tag
        self._screened = False
        #: SQL of the Δ rows fetched from when the shifts are not held: the table :meth:`_screen` made,
        #: or the rows' own Δ (a table with one row per pair); None: the Δ of the individuals asked for
        self._source: str | None = None
        self._read_totals: pl.DataFrame | None = None  # the totals a DecomposableSet read for it

    def _base_sql(self) -> str:
        return self.panel.base_sql(self.query.columns, self.query.where)

    # ------------------------------------------------------------------ values
    def _totals_columns(self) -> list:
        """The per-database aggregates of :meth:`_values`, named with the engine's tag."""
        q, tag = self.query, self.tag
        cols = partials_sql(q.form, q.columns, tag)
        if self.form.centred:
            cols.append(f"{mean_sql(quote_ident(q.columns[0]))}{tag}")
        cols.append(f"{self._null_count()} AS __null{tag}")
        return cols

    def _values(self) -> np.ndarray:
        q, n = self.query, len(self.panel.labels)
        tot = self._read_totals
        if tot is None:
            tot = pl.from_arrow(self._arrow(totals_sql([self])))
        if self.tag:  # this engine's columns, untagged
            tot = tot.select("__j", *(pl.col(c).alias(c[:-len(self.tag)]) for c in tot.columns
                                      if c.endswith(self.tag)))
        self._read_totals = None
        self.n_null_values = int(tot["__null"].sum())
        tot = tot.drop("__null")
        # databases with no row passing the filter get zero totals
        tot = pl.DataFrame({"__j": np.arange(n, dtype=np.int32)}).join(
            tot.with_columns(pl.col("__j").cast(pl.Int32)), on="__j", how="left").with_columns(
            pl.exclude("__j").fill_null(0.0)).sort("__j")
        if self.form.centred:
            tot = self._centred_totals(tot)
        t = {c: tot[c].to_numpy().astype(np.float64) for c in tot.columns if c != "__j"}
        val, ok = self.form.value(t)
        if not ok.all():
            bad = [str(self.panel.labels[k]) for k in np.flatnonzero(~ok)[:5]]
            raise InputError(f"query {short(q.describe())} is undefined on database(s) {', '.join(bad)} "
                             f"(no usable rows); filter those databases out")
        self.panel.temp_table(f"__totals{self.tag}", tot.with_columns(pl.Series("f", val)).to_arrow())
        return val

    def _centred_totals(self, tot: pl.DataFrame) -> pl.DataFrame:
        """Add the sums ``s1``, ``ss`` of x − m about each database's mean m (accurate for 1e9 + noise)."""
        self.panel.temp_table(f"__totals{self.tag}", tot.to_arrow())
        x = quote_ident(self.query.columns[0])
        cen = pl.from_arrow(self._arrow(
            f"SELECT b.__j, coalesce(sum(b.{x}::DOUBLE - t.m), 0) AS s1, "
            f"coalesce(sum((b.{x}::DOUBLE - t.m) * (b.{x}::DOUBLE - t.m)), 0) AS ss "
            f"FROM ({self._base_sql()}) b JOIN __totals{self.tag} t USING (__j) GROUP BY b.__j"
        )).with_columns(pl.col("__j").cast(pl.Int32))
        return tot.join(cen, on="__j", how="left").with_columns(pl.exclude("__j").fill_null(0.0)).sort("__j")

    def _delta_sql(self, id_filter: str = "") -> str:
        """SQL of (__i, __j, delta, undef) for every (individual, database) pair present."""
        return delta_sql([self], id_filter)

    # ---------------------------------------------------------------- screening
    def _codes(self) -> pl.Series:
        """The table ``__ids`` (__i, __code): the individuals with rows the query reads, coded in id
        order; returns their ids."""
        self._execute(f"CREATE OR REPLACE TEMP TABLE __ids AS "
                      f"SELECT __i, (row_number() OVER (ORDER BY __i) - 1)::BIGINT AS __code "
                      f"FROM (SELECT DISTINCT __i FROM ({self._base_sql()}))")
        return pl.from_arrow(self._arrow("SELECT __i FROM __ids ORDER BY __code"))["__i"].rename(self.panel.id)

    def _screen(self, scale: np.ndarray) -> Screen:
        self._dense = self._inside = None
        self._source = None
        n = len(self.panel.labels)
        self._screened = True
        cells = min(DENSE_CELLS, self.memory_limit_bytes() // (3 * 8))
        # the individuals are coded (a DISTINCT over every row: 12 s of a 10^8-row panel on a loaded
        # host) only when their shifts may be held; an estimate of their number (HyperLogLog, within a
        # few percent, 1.8 s there) tells, and the Δ table's screening codes them otherwise. The
        # same scan estimates the (individual, database) pairs, which tells whether the rows may be
        # those pairs already
        estimate, pairs, rows = self.panel.fetchall(
            f"SELECT approx_count_distinct(__i), approx_count_distinct((__i, __j)), count(*) "
            f"FROM ({self._base_sql()})", where=self.query.where)[0]
        pairs = pairs >= UNIQUE_PAIRS * rows
        if estimate * n <= 1.1 * cells:
            ids = self._codes()
            if len(ids) * n <= cells:
                return self._dense_screen(ids, scale, pairs)
        # too large to hold: the Δ_ij stay in DuckDB, aggregated per individual for the screening
        # table; chosen rows leave it later
        one = bool(np.all(scale == scale[0]))
        if not one:
            self.panel.temp_table("__scale", pa.table({"__j": pa.array(np.arange(n, dtype=np.int32)),
                                                       "scale": pa.array(scale)}))
        df = None
        if pairs:
            # one row per pair, as most panels have: each row's Δ_ij comes from the row itself, with no
            # GROUP BY (database, id) of 10^8 groups, spilled, written to a table and scanned again
            # by every fetch (at 10^8 rows on a loaded host the table took 51 s and its screening
            # 9.5 s, against 19-20 s for this screening with its check). The screening checks every
            # individual's rows are in distinct databases; where some are not, the table is made below
            self._source = f"({delta_sql([self], moments=ROW)})"
            df = self._screening_table(one, check=True)
        if df is None:
            # the Δ table is made once, in DuckDB (which spills it under its memory limit). Each
            # fetch used to run the GROUP BY (database, id) of every row again: at 10^8 rows, three
            # of them in all
            self._execute(f"CREATE OR REPLACE TEMP TABLE {self._table} AS {self._delta_sql()}")
            self._source = self._table
            df = self._screening_table(one)
        max_abs = df["max_abs_shift"].to_numpy().astype(np.float64)
        return Screen(
            ids=df["__i"].rename(self.panel.id),
            n_present=df["n_present"].to_numpy(),
            undefined=df["undefined"].to_numpy().astype(bool),
            max_abs_shift=max_abs,
            bound=max_abs / scale[0] if one else df["bound"].to_numpy().astype(np.float64),
        )

    def _screening_table(self, one: bool, check: bool = False) -> pl.DataFrame | None:
        """The table ``__ids`` (the individuals coded in id order, as :meth:`_codes` does, with their
        screening columns) aggregated from the Δ rows of ``_source``, and its rows by code. With
        ``check``, None if some individual has two rows in one database (the rows are then not the
        (individual, database) pairs)."""
        n = len(self.panel.labels)
        # one scale for every database (the default model): max_j |Δ_ij| / b is max_j (|Δ_ij| / b),
        # division being monotone and correctly rounded, so the bound needs no join of every row
        bound, join = (("0.0", "") if one else
                       ("coalesce(max(abs(d.delta) / s.scale) FILTER (WHERE NOT d.undef), 0)",
                        "JOIN __scale s USING (__j)"))
        # the databases an individual's rows are in, as bits: as many as rows when no two share one
        dbs = f", bit_count(bitstring_agg(d.__j, 0, {n - 1}))::BIGINT AS n_databases" if check else ""
        self._execute(
            f"CREATE OR REPLACE TEMP TABLE __ids AS SELECT __i, (row_number() OVER (ORDER BY __i) - 1)::BIGINT "
            f"AS __code, * EXCLUDE (__i) FROM ("
            f"SELECT d.__i, count(*)::BIGINT AS n_present, bool_or(d.undef) AS undefined, "
            f"coalesce(max(abs(d.delta)) FILTER (WHERE NOT d.undef), 0) AS max_abs_shift, {bound} AS bound{dbs} "
            f"FROM {self._source} d {join} GROUP BY d.__i)")
        df = pl.from_arrow(self._arrow("SELECT * FROM __ids ORDER BY __code"))
        if not np.array_equal(df["__code"].to_numpy(), np.arange(len(df))):
            raise RuntimeError("screening table does not code every individual once")
        if check and not df["n_databases"].equals(df["n_present"]):
            return None
        return df

    def _dense_screen(self, ids: pl.Series, scale: np.ndarray, pairs: bool) -> Screen:
        """Every Δ_ij in one streamed pass into a dense (m, n) matrix kept for :meth:`shifts`;
        the screening table is then computed from it (no second scan of the table). With ``pairs``
        (the rows are estimated to be the (individual, database) pairs) each row's Δ_ij comes from
        the row itself, and the table is read again, grouped, if two rows share a cell."""
        got = read_dense([self], len(ids), presence=self.hold_presence, moments=ROW) if pairs else None
        dense, n_present, undefined, self._inside = got or read_dense([self], len(ids), presence=self.hold_presence)
        dense = dense[:, :, 0]
        max_abs, bound = _row_maxima(dense, 1.0 / scale)
        self._dense = dense
        return Screen(ids=ids, n_present=n_present, undefined=undefined[:, 0], max_abs_shift=max_abs, bound=bound)

    # ------------------------------------------------------------------- shifts
    def shifts(self, codes: np.ndarray, presence: bool = False):
        """Dense Δ rows (len(codes), n); see :meth:`LooEngine.shifts`. Without ``presence`` the
        rows not held in memory are streamed into the output (bounded memory)."""
        codes = np.asarray(codes, dtype=np.int64)
        if presence or self._dense is not None or not len(codes):
            return super().shifts(codes, presence)
        out = np.zeros((len(codes), len(self.panel.labels)))
        self._want(codes)
        n = out.shape[1]
        sql = (f"SELECT (w.__row * {n} + d.__j)::BIGINT AS flat, d.delta "
               f"FROM {self._rows()} d JOIN __want w USING (__i) WHERE NOT d.undef")
        flat_out = out.reshape(-1)
        for batch in self.panel.batches(sql, where=self.query.where):
            # an index assignment: np.put took twice as long on scattered cells (13 s of 10^8)
            flat_out[arrow_numpy(batch.column(0))] = arrow_numpy(batch.column(1))
        return out

    def _shift_rows(self, codes: np.ndarray) -> tuple:
        self._want(codes)
        sql = f"SELECT w.__row, d.__j, d.delta, d.undef FROM {self._rows()} d JOIN __want w USING (__i)"
        res = self._execute(sql).fetchnumpy()
        return (np.asarray(res["__row"], dtype=np.int64), np.asarray(res["__j"], dtype=np.int64),
                np.asarray(res["delta"], dtype=np.float64), np.asarray(res["undef"], dtype=bool))

    def _want(self, codes: np.ndarray) -> None:
        """The temp table ``__want`` (__i, __row): the ids of ``codes`` (through ``__ids``) and their
        output rows."""
        if not self._screened:
            raise RuntimeError("screen() must run before shifts()")
        self.panel.temp_table("__want_codes", pa.table({"__code": pa.array(codes, type=pa.int64()),
                                                         "__row": pa.array(np.arange(len(codes)))}))
        self._execute("CREATE OR REPLACE TEMP TABLE __want AS "
                      "SELECT c.__i, w.__row FROM __want_codes w JOIN __ids c USING (__code)")

    @property
    def _table(self) -> str:
        """The temp table of every present (individual, database, Δ, undefined), made by :meth:`_screen`
        when the shifts are not held in memory and a table's rows are not its pairs."""
        return f"__delta{self.tag}"

    def _rows(self) -> str:
        """The rows (__i, __j, delta, undef) to fetch those of ``__want`` from: those :meth:`_screen`
        screened, else (shifts held in memory, their presence asked for) the pairs of those individuals only."""
        if self._source is not None:
            return self._source
        return f"({self._delta_sql('SELECT __i FROM __want')})"

    # ---------------------------------------------------------------- SQL runs
    def _execute(self, sql: str):
        return self.panel.execute(sql, where=self.query.where)

    def _arrow(self, sql: str) -> pa.Table:
        return self.panel.arrow(sql, where=self.query.where)


# ------------------------------------------------------------ several statistics, one scan
class DecomposableSet:
    """Several decomposable statistics of one panel with one filter, read in one scan each for the
    totals and the shifts: the GROUP BY __j of :meth:`values` and the GROUP BY (__j, __i) of
    :meth:`read` aggregate every statistic's partial moments at once. Each statistic is a
    :class:`DecomposableEngine` (tag ``_k<k>_``) whose values, checks and shifts are exactly those it
    has alone.
    """

    def __init__(self, panel, queries):
        if len({q.where for q in queries}) > 1:
            raise ValueError("the statistics of one scan share their filter")
        self.panel = panel
        self.engines = [DecomposableEngine(panel, q, tag=f"_k{k}_") for k, q in enumerate(queries)]

    def close(self) -> None:
        """Release the panel (its connection and spill folder)."""
        self.panel.close()

    def values(self) -> np.ndarray:
        """f_k(X^j) of every database and statistic, (n, d), each checked as by :meth:`LooEngine.values`."""
        if self.engines[0]._q is None:
            tot = pl.from_arrow(self.engines[0]._arrow(totals_sql(self.engines)))
            for e in self.engines:
                e._read_totals = tot
        return np.column_stack([e.values() for e in self.engines])

    def read(self) -> tuple:
        """(ids, shifts, n_present, undefined) of every individual with rows the statistics read
        (sorted ids, m); shifts (m, n, d), Δ_ijk as each engine's :meth:`~LooEngine.shifts` gives
        them (0 where absent or undefined); n_present (m,) databases; undefined (m, d) bool, the
        sole contributors to some database by statistic. Refuses shifts out of range as
        :meth:`LooEngine.screen` does."""
        self.values()
        e0 = self.engines[0]
        ids = e0._codes()
        shifts, n_present, undefined, _ = read_dense(self.engines, len(ids))
        if not (len(ids) == 0 or -MAX_MAGNITUDE <= shifts.min() and shifts.max() <= MAX_MAGNITUDE):  # NaN too
            ones = np.ones(len(self.panel.labels))  # some statistic is out of range: which, and who
            for k, e in enumerate(self.engines):
                e._require_in_range(_row_maxima(shifts[:, :, k], ones)[0], ids)
        return ids, shifts, n_present, undefined


def _columns(engines: list) -> list:
    """The value columns of ``engines``, each once."""
    return list(dict.fromkeys(c for e in engines for c in e.query.columns))


def totals_sql(engines: list) -> str:
    """SQL of the per-database totals (``__j`` and each engine's tagged aggregates) of ``engines``,
    which share a panel and a filter."""
    e0 = engines[0]
    cols = ", ".join(c for e in engines for c in e._totals_columns())
    return f"SELECT __j, {cols} FROM ({e0.panel.base_sql(_columns(engines), e0.query.where)}) GROUP BY __j"


def delta_sql(engines: list, id_filter: str = "", moments: Moments = GROUPED) -> str:
    """SQL of (__i, __j, and per engine delta<tag>, undef<tag>) for every (individual, database)
    pair present: one GROUP BY (__j, __i) of every engine's partial moments, joined to each
    engine's totals ``__totals<tag>`` (written by its :meth:`~DecomposableEngine._values`). With the
    moments of each :data:`~.forms.ROW`, each row's own (right only where no two rows of an
    individual share a database)."""
    e0 = engines[0]
    base = e0.panel.base_sql(_columns(engines), e0.query.where)
    if id_filter:
        base = f"SELECT * FROM ({base}) WHERE __i IN ({id_filter})"
    centred = [e for e in engines if e.form.centred]
    if centred:
        xc = ", ".join(f"b.{quote_ident(e.query.columns[0])}::DOUBLE - t{e.tag}.m AS __xc{e.tag}" for e in centred)
        joins = " ".join(f"JOIN __totals{e.tag} t{e.tag} USING (__j)" for e in centred)
        base = f"SELECT b.*, {xc} FROM ({base}) b {joins}"
    parts = [c for e in engines for c in (centred_partials(e.tag, moments) if e.form.centred
                                         else partials_sql(e.query.form, e.query.columns, e.tag, moments=moments))]
    out = ", ".join(f"({bind(e.form.delta, e.tag)})::DOUBLE AS delta{e.tag}, "
                    f"({bind(e.form.undefined, e.tag)}) AS undef{e.tag}" for e in engines)
    joins = " ".join(f"JOIN __totals{e.tag} t{e.tag} USING (__j)" for e in engines)
    group = " GROUP BY __j, __i" if moments is GROUPED else ""
    return f"SELECT p.__i, p.__j, {out} FROM (SELECT __j, __i, {', '.join(parts)} FROM ({base}){group}) p {joins}"


def read_dense(engines: list, m: int, presence: bool = False, moments: Moments = GROUPED) -> tuple | None:
    """Every Δ_ij of ``engines`` (sharing a panel, after their values and the codes ``__ids`` of the
    m individuals) streamed in one pass into a dense (m, n, d) array: (shifts, n_present (m,),
    undefined (m, d), inside); undefined cells hold 0; with ``presence``, inside (m, n) bool marks the
    databases each individual is in (else None). With the moments of each :data:`~.forms.ROW`, None
    if two rows fell in one (individual, database) cell (then the rows are not the pairs)."""
    e0, d = engines[0], len(engines)
    n = len(e0.panel.labels)
    shifts = np.zeros((m, n, d))
    flat_out = shifts.reshape(-1)
    undefined = np.zeros((m, d), dtype=bool)
    # the cells seen: as many as rows where no two rows share one; without them, rows per individual
    seen = np.zeros((m, n), dtype=bool) if presence or moments is not GROUPED else None
    n_present, rows = (np.zeros(m, dtype=np.int64) if seen is None else None), 0
    cols = ", ".join(f"d.delta{e.tag}, d.undef{e.tag}" for e in engines)
    sql = (f"SELECT (c.__code * {n} + d.__j)::BIGINT AS flat, {cols} "
           f"FROM ({delta_sql(engines, moments=moments)}) d JOIN __ids c USING (__i)")
    for batch in e0.panel.batches(sql, rows=1 << 18, where=e0.query.where):
        flat = arrow_numpy(batch.column(0))
        rows += len(flat)
        if seen is None:
            n_present += np.bincount(flat // n, minlength=m)
        else:
            seen.reshape(-1)[flat] = True
        at = flat * d if d > 1 else flat
        for k in range(d):
            delta = arrow_numpy(batch.column(1 + 2 * k))
            undef = arrow_numpy(batch.column(2 + 2 * k))
            if undef.any():
                undefined[flat[undef] // n, k] = True
                flat_out[at[~undef] + k] = delta[~undef]
            else:  # (an index assignment: np.put took twice as long on 10^7 scattered cells)
                flat_out[at + k if k else at] = delta
    if seen is not None:
        n_present = seen.sum(axis=1, dtype=np.int64)
        if n_present.sum() != rows:  # two rows in one cell (the grouped rows are pairs, one a cell)
            return None
    return shifts, n_present, undefined, seen if presence else None


def _row_maxima(dense: np.ndarray, inv: np.ndarray) -> tuple:
    """max_j |Δ_ij| and max_j |Δ_ij| · inv_j of each row of ``dense`` (m, n), in row blocks: no
    temporary the size of the matrix."""
    m, n = dense.shape
    max_abs, bound = np.empty(m), np.empty(m)
    step = max(1, (1 << 22) // max(n, 1))
    for a in range(0, m, step):
        part = np.abs(dense[a:a + step])
        max_abs[a:a + step] = part.max(axis=1, initial=0.0)
        part *= inv
        bound[a:a + step] = part.max(axis=1, initial=0.0)
    return max_abs, bound
