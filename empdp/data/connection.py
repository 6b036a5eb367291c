"""DuckDB connections: the memory limit and thread count they run under, and the owner-only
folder they spill to."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import weakref

import duckdb

from ..errors import InputError
from ..params import threads as check_threads
from .sql import first_line, quote_literal, shorten


def default_memory_limit() -> str:
    """DuckDB's share when the user sets none: 1 GB or 25% of physical memory, whichever is smaller.

    DuckDB's own default (80% of memory) lets a 10^8-row GROUP BY hold ~7 GB;
    with a limit it spills instead, at about the same speed, and leaves room
    for the density evaluation. A whole 10^8-row assessment holds the
    interpreter and libraries (~0.4 GB), DuckDB's share and the shift rows
    fetched at once (at most a sixth of the share): with a 2 GB share it
    peaked at 2.5–3.4 GB, with 1 GB under 2 GB. The GROUP BY alone took
    the same time under either share (44–47 s on a loaded host).
    """
    total = physical_memory()
    if total is None:
        return "1GB"
    return f"{max(256, min(1024, int(0.25 * total / 2**20)))}MB"


def spill_directory(con: duckdb.DuckDBPyConnection) -> str:
    """A fresh owner-only (0700) folder for ``con``'s spill files, removed with the connection.

    Spill files hold the user's rows, so they go neither to a '.tmp' in the working directory
    nor to a predictable path in the shared temporary folder (where another user could plant
    a symlink or read them). The folder is removed when ``con`` is garbage-collected, when
    :meth:`~empdp.data.Panel.close` runs, or at interpreter exit, whichever comes first.
    """
    path = tempfile.mkdtemp(prefix="empdp-duckdb-")  # mode 0700, a new random name
    _SPILL[con] = weakref.finalize(con, shutil.rmtree, path, ignore_errors=True)
    return path


#: the finalizer removing each live connection's spill folder
_SPILL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def close_connection(con: duckdb.DuckDBPyConnection) -> None:
    """Close ``con`` and remove its spill folder now (not at garbage collection)."""
    con.close()
    fin = _SPILL.pop(con, None)
    if fin is not None:
        fin()


#: smallest --memory-limit accepted: below it DuckDB cannot hold one vector per thread
MIN_MEMORY_LIMIT = 16 * 10**6
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*")
_SIZE_UNITS = {"B": 1, "BYTES": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None if the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory_limit(text: str) -> str:
    """Refuse a --memory-limit that is not a positive size like '3GB', '512MiB' or '50%'.

    DuckDB itself reads '-1GB' as no limit at all and fails late (out of memory, exit 1)
    under a limit of a few kilobytes: both are refused here, before any work.
    """
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).upper() if match else ""
    if not match or (unit not in _SIZE_UNITS and unit != "%"):
        raise InputError(f"`memory_limit` {shorten(text)} is not a size: give a positive number with a unit, "
                         f"like 3GB, 512MB or 2GiB (or a share of memory like 50%)", param="memory_limit")
    value = float(match.group(1))
    if unit == "%":
        if not 0 < value <= 100:
            raise InputError(f"`memory_limit` {shorten(text)}: a share of memory must be in (0%, 100%]",
                             param="memory_limit")
        return text
    size = value * _SIZE_UNITS[unit]
    if size < MIN_MEMORY_LIMIT:
        raise InputError(f"`memory_limit` {shorten(text)} is below the {MIN_MEMORY_LIMIT // 10**6} MB DuckDB "
                         f"needs to run; give at least 16MB (e.g. 1GB)", param="memory_limit")
    if size > 2**62:
        raise InputError(f"`memory_limit` {shorten(text)} is too large to be a size; leave it out for the default",
                         param="memory_limit")
    return text


def connect(memory_limit: str | None = None, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with a memory limit (e.g. ``'3GB'``; default
    :func:`default_memory_limit`) and, if given, a number of threads (default: DuckDB's, every core)."""
    if memory_limit is not None:
        check_memory_limit(memory_limit)
    threads = check_threads(threads)
    con = duckdb.connect(":memory:")
    # DuckDB's own progress bar writes to stdout and would corrupt --json output
    con.execute("SET enable_progress_bar = false")
    try:
        con.execute(f"SET memory_limit = {quote_literal(memory_limit or default_memory_limit())}")
    except duckdb.Error as exc:
        raise InputError(f"`memory_limit` {shorten(memory_limit)} is not a size like '3GB': "
                         f"{first_line(exc)}", param="memory_limit") from None
    if memory_limit:
        con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET temp_directory = {quote_literal(spill_directory(con))}")
    if threads:
        con.execute(f"SET threads = {threads}")
    return con


_UNITS = {"": 1, "B": 1, "BYTES": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}


def memory_limit_bytes(con: duckdb.DuckDBPyConnection) -> int:
    """DuckDB's memory limit in bytes (its setting reads like '1.8 GiB'; 0 for an unknown format)."""
    text = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        return 0
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])
