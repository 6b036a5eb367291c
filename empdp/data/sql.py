"""SQL text and DuckDB's results: quoting, one-line error messages, Arrow tables and batch streams."""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa

from ..errors import InputError
from ..textfmt import clip, shorten  # (light: messages that need no engine use them from there)


def quote_ident(name: str) -> str:
    """Quote a column or table name for DuckDB SQL (handles quotes and spaces)."""
    return '"' + str(name).replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def first_line(exc: BaseException, width: int = 200) -> str:
    """The first line of an engine error, cut to ``width`` (DuckDB echoes long paths and SQL)."""
    return clip(str(exc).strip().splitlines()[0], width) if str(exc).strip() else type(exc).__name__


#: DuckDB's errors that mean bad input: SQL that does not parse or bind, a value that does not convert
BAD_INPUT_ERRORS = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
                    duckdb.ConversionException, duckdb.InvalidInputException)


@contextmanager
def sql_errors(where: str | None = None, context: str | None = None, param: str | None = None):
    """DuckDB's bad-input errors (:data:`BAD_INPUT_ERRORS`) as a one-line :class:`InputError`.

    A parser or binder error with a ``--where`` filter names the filter; with ``context``, every
    DuckDB error is reported after it (e.g. "`sql` failed on database 2001", naming the library
    parameter ``param``, which the command line shows as its flag). A permission error (SQL reaching a
    file or setting on a locked-down connection) is bad input too.
    """
    try:
        yield
    except duckdb.PermissionException as exc:
        # the connection is locked down (empdp.data.guard.lock_down): user SQL reached outside the source
        raise InputError(f"{context + ': ' if context else ''}the SQL reaches outside the source ({first_line(exc, 120)}); "
                         "user SQL may read only the source's table (docs/user-sql.md)", param=param) from None
    except duckdb.Error as exc:
        if context:
            raise InputError(f"{context}: {first_line(exc)}", param=param) from None
        if not isinstance(exc, BAD_INPUT_ERRORS):
            raise
        if where and isinstance(exc, (duckdb.ParserException, duckdb.BinderException)):
            raise InputError(f"the filter `where` {shorten(where)} is not valid here: {first_line(exc)}",
                             param="where") from None
        raise InputError(f"the query or filter is not valid SQL for this source: {first_line(exc)}") from None


def fetch_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql`` and fetch the result as an Arrow table (DuckDB 1.x and 2.x spellings)."""
    rel = con.sql(sql)
    fetch = getattr(rel, "to_arrow_table", None) or getattr(rel, "arrow")
    tab = fetch()
    return tab.read_all() if hasattr(tab, "read_all") else tab


#: record batches DuckDB may produce ahead of the consumer in :func:`arrow_batches`
PREFETCH_BATCHES = 3


def arrow_batches(con: duckdb.DuckDBPyConnection, sql: str, rows: int = 1 << 20,
                  prefetch: int = PREFETCH_BATCHES) -> Iterator[pa.RecordBatch]:
    """Run ``sql`` and stream the result as Arrow record batches (DuckDB 1.x and 2.x spellings).

    A reader pulled on demand leaves DuckDB idle while the caller works on a batch; with
    ``prefetch`` > 0 a background thread pulls up to that many batches ahead. The connection
    is used by one thread at a time: the caller must not use it until the generator is
    exhausted or closed.
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


def arrow_numpy(column) -> np.ndarray:
    """A pyarrow column of a fixed-width number or boolean type, without nulls, as a numpy array (read
    only where zero-copy), from its buffers: pyarrow's own ``to_numpy()`` imports pandas when that is
    installed (0.2-0.35 s, a quarter of ``assess`` on the sample data). Columns with nulls or of
    other types go through pyarrow's conversion."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if column.null_count or not (pa.types.is_boolean(kind) or pa.types.is_integer(kind)
                                 or pa.types.is_floating(kind)):
        return column.to_numpy(zero_copy_only=False)
    data = column.buffers()[1]
    if pa.types.is_boolean(kind):  # bit-packed, least significant bit first
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little",
                             count=column.offset + len(column))
        return bits[column.offset:].astype(bool)
    dtype = np.dtype(kind.to_pandas_dtype())  # (a numpy type for these: pandas is not imported)
    return np.frombuffer(data, dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)


def group_cells(panel, column: str, where: str | None = None) -> tuple[list, int]:
    """The groups of ``column`` in every database of ``panel`` (a :class:`empdp.data.Panel`), on the
    rows ``where`` keeps (grouped statistics, docs/method.md#102-joint-queries).

    Returns ``(cells, n_null)``: one ``(text, value, database index, rows)`` per group present in a
    database, ordered by the group's value (its text, ``CAST(column AS VARCHAR)``, names the group
    in the filters :func:`group_filter` writes), and the number of kept rows whose group is NULL.
    """
    panel.require_column(column)
    qc = quote_ident(column)
    base = panel.base_sql([column], where)
    n_null = panel.fetchall(f"SELECT count(*) FILTER (WHERE {qc} IS NULL) FROM ({base})", where=where)[0][0]
    cells = panel.fetchall(f"SELECT CAST({qc} AS VARCHAR) AS t, any_value({qc}), __j, count(*) FROM ({base}) "
                           f"WHERE {qc} IS NOT NULL GROUP BY t, __j ORDER BY any_value({qc}), t, __j", where=where)
    return cells, int(n_null)


def group_filter(column: str, text: str) -> str:
    """SQL keeping the rows of one group of ``column`` (named by its text, as :func:`group_cells`)."""
    return f"CAST({quote_ident(column)} AS VARCHAR) = {quote_literal(text)}"
