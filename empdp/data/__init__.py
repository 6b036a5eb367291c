"""Data layer (docs/method.md#1-data-model): any DuckDB-readable source as one validated relation.

Only this package (and the SQL it hands out) talks to DuckDB::

    panel.py        a source (file, glob, folder, FILE.duckdb::TABLE, frame) read and checked as a Panel
    connection.py   DuckDB connections: memory limit, threads, owner-only spill folder
    sql.py          quoting, DuckDB errors as one-line InputErrors, Arrow tables and batch streams
"""

from .connection import close_connection, connect, physical_memory
from .panel import Panel, open_panel
from .sql import arrow_batches, arrow_numpy, clip, quote_ident, shorten

__all__ = ["Panel", "arrow_batches", "arrow_numpy", "clip", "close_connection", "connect", "open_panel", "physical_memory",
           "quote_ident", "shorten"]
