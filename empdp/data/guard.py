"""User SQL as one expression or one SELECT, checked by DuckDB's own parser (docs/user-sql.md).

Every piece of SQL text that does not come from this code (``--where``, ``--sql``,
``--adversary-sql``, the joint and grouped statistics, and the SQL-bearing fields of files)
passes here before it becomes part of a statement:

* :func:`filter_sql` — a filter: exactly one expression over the source's columns, returned
  parenthesised on lines of its own, so that it stays one expression wherever it is pasted;
* :func:`check_select` — a query: exactly one SELECT reading only the table ``db`` (and its
  own CTEs), with no data-modifying or COPY part, no table function but a few generators.

The parse is DuckDB's (``json_serialize_sql``, the text bound as a parameter, never run), so
what is checked is what DuckDB would run; the engine's external access is switched off after
the source is opened (:func:`lock_down`), which stops file reads a check could miss.
"""

from __future__ import annotations

import functools
import json
import re
import threading

import duckdb

from ..errors import InputError
from .sql import clip, first_line, shorten

#: query nodes a read-only SELECT is built from (DuckDB 2.x also parses INSERT, UPDATE, DELETE and
#: COPY into a CTE of a SELECT statement, and runs them)
READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
#: table functions user SQL may call: generators of values, reading no file and no catalog
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
#: clauses a filter (one expression parsed as ``SELECT <expr>``) must not carry
_FILTER_CLAUSES = ("where_clause", "having", "qualify", "sample")
#: what user SQL may be, for the messages
ALLOWED_FILTER = 'one SQL expression over the source\'s columns, e.g. "age >= 18 AND region <> \'x\'"'
ALLOWED_SELECT = "one SELECT statement reading the table db, e.g. 'SELECT avg(x) FROM db'"
DOC = "(docs/user-sql.md)"

_PARSER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _parser() -> duckdb.DuckDBPyConnection:
    """An in-memory connection that only parses (it runs ``json_serialize_sql`` on bound text)."""
    con = duckdb.connect(":memory:")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _named(option: str) -> tuple[str, tuple]:
    """How a message names where the text came from, and the library parameter it is: ``option`` is a
    parameter (``sql``, ``where``, ``adversary_sql``: written in backquotes, which the command line shows
    as its flag) or a description (a file's field)."""
    if re.fullmatch(r"[a-z_]+", option):
        return f"`{option}`", (option,)
    return option, ()


def _refuse(option: str, text: str, found: str, allowed: str) -> InputError:
    shown, param = _named(option)
    return InputError(f"{shown} {shorten(text, 60)}: {found}; give {allowed} {DOC}", param=param)


def _not_text(option: str, text) -> InputError:
    shown, param = _named(option)
    return InputError(f"{shown} must be SQL text, got {type(text).__name__}", param=param)


def _one_select(sql: str, option: str, allowed: str, *, what: str, text: str) -> dict:
    """The parse tree of ``sql`` (``text`` as parsed), which must be exactly one SELECT statement."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise _refuse(option, text, f"not valid SQL ({first_line(exc, 120)})", allowed) from None
    if len(statements) > 1:
        kinds = ", ".join(_kind(s) for s in statements[1:4])
        raise _refuse(option, text, f"it breaks out of {what} into a second statement ({kinds}), which is "
                                    "not allowed", allowed)
    if not statements:
        raise _refuse(option, text, "it is empty", allowed)
    if _kind(statements[0]) != "SELECT":
        raise _refuse(option, text, f"{_kind(statements[0])} is not allowed", allowed)
    with _PARSER_LOCK:
        tree = json.loads(_parser().execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error") or len(tree.get("statements", ())) != 1:
        raise _refuse(option, text, f"not one SELECT ({clip(tree.get('error_message', ''), 100)})", allowed)
    return tree["statements"][0]["node"]


def _kind(statement) -> str:
    """A statement's kind in words: 'SELECT', 'COPY', 'ATTACH', ..."""
    return str(getattr(statement.type, "name", statement.type)).replace("_STATEMENT", "").replace("_", " ")


def _walk(node):
    """Every dict in a parse tree (JSON), depth first."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _cte_names(tree) -> set:
    return {entry.get("key") for d in _walk(tree) if isinstance(d.get("cte_map"), dict)
            for entry in d["cte_map"].get("map", ()) if isinstance(entry, dict)}


def _check_tree(tree, text: str, option: str, allowed: str, tables) -> None:
    """Refuse any part of a SELECT's parse tree that writes, or reads anything but ``tables``.

    ``tables`` : the table names the text may read (besides its own CTEs); None for SQL this
    code built around user text (its internal tables), where only writes and table functions
    are refused.
    """
    ctes = _cte_names(tree)
    for d in _walk(tree):
        kind = d.get("type")
        if not isinstance(kind, str):
            continue
        if kind.endswith("_NODE") and kind not in READ_NODES:
            raise _refuse(option, text, f"{kind.removesuffix('_NODE').removesuffix('_QUERY')} is not allowed "
                                        "(only reading)", allowed)
        if kind == "TABLE_FUNCTION":
            name = str((d.get("function") or {}).get("function_name", "?"))
            if name.lower() not in TABLE_FUNCTIONS:
                raise _refuse(option, text, f"the table function {clip(name, 40)} is not allowed (user SQL reads "
                                            "only the source's table)", allowed)
        if kind == "BASE_TABLE" and tables is not None:
            name = str(d.get("table_name", ""))
            qualified = d.get("schema_name") or d.get("catalog_name")
            if qualified or (name not in ctes and name.lower() not in tables):
                shown = ".".join(p for p in (d.get("catalog_name"), d.get("schema_name"), name) if p)
                raise _refuse(option, text, f"the table {clip(shown, 60)!r} is not allowed "
                                            f"(it may read {' and '.join(tables) or 'no table'})", allowed)


@functools.lru_cache(maxsize=256)
def _checked_select(text: str, option: str, tables: tuple | None) -> str:
    tree = _one_select(text, option, ALLOWED_SELECT, what="the SELECT", text=text)
    _check_tree(tree, text, option, ALLOWED_SELECT, tables)
    return text


def check_select(text: str, option: str = "sql", *, tables: tuple | None = ("db",)) -> str:
    """``text`` if it is one read-only SELECT over ``tables``, else :class:`InputError` naming ``option``.

    Parameters
    ----------
    text : str
        The user's query (a trailing ';' is allowed: it ends the one statement).
    option : str
        The library parameter the text came from (``sql``, ``adversary_sql``), or a description of the
        file field, for the message.
    tables : tuple of str or None
        The tables it may read besides its own CTEs; None for SQL built by this code around
        user text already checked (its internal tables): then only its shape is checked.
    """
    if not isinstance(text, str):
        raise _not_text(option, text)
    return _checked_select(text, option, None if tables is None else tuple(t.lower() for t in tables))


@functools.lru_cache(maxsize=256)
def _checked_filter(text: str, option: str) -> str:
    node = _one_select(f"SELECT (\n{text}\n)", option, ALLOWED_FILTER, what="the expression", text=text)
    bare = _one_select(f"SELECT\n{text}\n", option, ALLOWED_FILTER, what="the expression", text=text)
    extra = [c for c in _FILTER_CLAUSES if bare.get(c)]
    if (bare.get("type") != "SELECT_NODE" or len(bare.get("select_list", ())) != 1 or extra
            or (bare.get("from_table") or {}).get("type", "EMPTY") != "EMPTY" or bare.get("modifiers")
            or bare.get("group_expressions") or bare.get("cte_map", {}).get("map")):
        raise _refuse(option, text, "it is not one expression (it carries "
                                    f"{', '.join(extra) or 'a clause or a list'})", ALLOWED_FILTER)
    if _strip(bare["select_list"][0]) != _strip(node["select_list"][0]):
        raise _refuse(option, text, "it is not one self-contained expression", ALLOWED_FILTER)
    if bare["select_list"][0].get("alias"):
        raise _refuse(option, text, "an alias (AS) is not allowed in a filter", ALLOWED_FILTER)
    _check_tree(bare, text, option, ALLOWED_FILTER, tables=())
    return f"(\n{text}\n)"


def _strip(tree):
    """A parse tree without the text positions (which differ by the parentheses)."""
    if isinstance(tree, dict):
        return {k: _strip(v) for k, v in tree.items() if not k.startswith("query_location")}
    if isinstance(tree, list):
        return [_strip(v) for v in tree]
    return tree


def filter_sql(text: str, option: str = "where") -> str:
    """The filter ``text`` as SQL to paste where an expression goes: ``(\\n text \\n)``, after
    checking that it is exactly one expression (:data:`ALLOWED_FILTER`), else :class:`InputError`.

    The line breaks end a trailing ``--`` comment inside the parentheses; the parse of the text
    alone must equal its parse inside them, so it cannot close them and reopen its own.
    """
    if not isinstance(text, str):
        raise _not_text(option, text)
    return _checked_filter(text, option)


def check_filter(text: str | None, option: str = "where") -> str | None:
    """``text`` (or None) if it is one expression (:func:`filter_sql`), else :class:`InputError`."""
    if text is not None and text != "":  # no filter, as everywhere a filter is optional
        filter_sql(text, option)
    return text


def lock_down(con: duckdb.DuckDBPyConnection, files=()) -> None:
    """From now on ``con`` reads only the source opened on it: external access off (no file,
    extension, COPY or ATTACH) except the source's own ``files``, and the configuration locked
    so that no later statement can turn it back on."""
    if files:
        con.execute("SET allowed_paths = ?", [sorted(set(files))])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def check_spark(text: str | None, option: str) -> str | None:
    """``text`` for Spark SQL, after the DuckDB checks: also without a backslash, which escapes a
    quote in Spark's strings but not in DuckDB's, so that text DuckDB reads as one string cannot
    end early for Spark (docs/user-sql.md#with---engine-spark)."""
    if text and "\\" in text:
        shown, param = _named(option)
        raise InputError(f"{shown} {shorten(text, 60)}: a backslash is not allowed on the Spark engine (Spark and "
                         f"DuckDB read it differently in strings); write the value without one {DOC}", param=param)
    return text


def select_width(sql: str) -> int:
    """How many columns one SELECT over ``db`` returns (1 when its select list cannot be counted
    before it runs, e.g. ``*``: the engine then checks its one column)."""
    check_select(sql, "sql")
    with duckdb.connect(":memory:") as con:  # parses only: the text is a bound parameter
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    node = tree["statements"][0]["node"] if not tree.get("error") and tree.get("statements") else {}
    items = node.get("select_list", []) if node.get("type") == "SELECT_NODE" else []
    if not items or any(e.get("class") == "STAR" for e in items):
        return 1
    return len(items)
