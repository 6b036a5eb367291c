"""Query expressions (docs/method.md#2-leave-one-out-shifts-and-query-forms): parse ``mean(x)``, ``sum(a)/sum(b)``, ``quantile(x, 0.9)``...

A :class:`Query` names its form and columns; :mod:`empdp.loo` turns it into
leave-one-out shifts. Semantics follow DuckDB's aggregates so that results can
be checked by re-running the query: ``var``/``std`` are the sample versions
(``var_samp``/``stddev_samp``), ``median`` and ``quantile`` interpolate
linearly (``quantile_cont``, numpy's default, R type 7), NULL values are
ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .data import shorten
from .data.guard import check_filter, check_select
from .errors import InputError

DECOMPOSABLE = ("count", "sum", "mean", "var", "std", "ratio")
ORDER_STATISTICS = ("min", "max", "median", "quantile")
FORMS = DECOMPOSABLE + ORDER_STATISTICS + ("sql",)

_ALIASES = {"avg": "mean", "variance": "var", "var_samp": "var", "stddev": "std",
            "stddev_samp": "std", "sd": "std", "quantile_cont": "quantile"}
_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_]*)'
_CALL = re.compile(rf"^\s*([A-Za-z_]+)\s*\(\s*(\*|{_IDENT})\s*(?:,\s*([0-9.eE+-]+)\s*)?\)\s*$")
_RATIO = re.compile(rf"^\s*sum\s*\(\s*({_IDENT})\s*\)\s*/\s*sum\s*\(\s*({_IDENT})\s*\)\s*$", re.I)
_SQL_DB = re.compile(r"\bFROM\s+db\b", re.I)

HELP = ("count(*), sum(x), mean(x), var(x), std(x), sum(a)/sum(b), min(x), max(x), "
        "median(x), quantile(x, q)")


def _unquote(ident: str) -> str:
    if ident.startswith('"'):
        return ident[1:-1].replace('""', '"')
    return ident


@dataclass(frozen=True)
class Query:
    """A parsed query.

    Attributes
    ----------
    form : str
        One of :data:`FORMS`.
    columns : tuple of str
        Value columns (numerator then denominator for ``ratio``).
    q : float or None
        Quantile level (0 for min, 1 for max, 0.5 for median).
    where : str or None
        SQL filter applied before the aggregate.
    sql : str or None
        Generic SQL over the table ``db`` (form ``"sql"``).
    text : str
        The query as the user wrote it.
    """

    form: str
    columns: tuple = ()
    q: float | None = None
    where: str | None = None
    sql: str | None = None
    text: str = ""

    @property
    def is_decomposable(self) -> bool:
        return self.form in DECOMPOSABLE

    @property
    def is_order_statistic(self) -> bool:
        return self.form in ORDER_STATISTICS

    def describe(self) -> str:
        text = self.text
        if self.where:
            text += f" WHERE {self.where}"
        return text


def parse_query(query: str | None = None, *, where: str | None = None, sql: str | None = None) -> Query:
    """Parse ``--query``/``--where`` or ``--sql`` into a :class:`Query`.

    Raises :class:`InputError` naming the accepted forms when the expression is
    not understood, and when ``where`` is not one SQL expression or ``sql`` not one read-only
    SELECT over ``db`` (:mod:`empdp.data.guard`, docs/user-sql.md).
    """
    if (query is None) == (sql is None):
        raise InputError("give exactly one of `query` EXPR or `sql` 'SELECT ... FROM db'", param=("query", "sql"))
    if sql is not None:
        if where:
            raise InputError("`where` goes with `query`; put the filter inside `sql` instead",
                             param=("where", "query", "sql"))
        if not _SQL_DB.search(sql):
            raise InputError("`sql` must read the table 'db' (one database), e.g. "
                             "`sql` 'SELECT avg(x) FROM db'", param="sql")
        body = check_select(sql.strip().rstrip(";").strip(), "sql")
        return Query(form="sql", sql=body, text=sql.strip())
    check_filter(where, "where")
    text = query.strip()
    m = _RATIO.match(text)
    if m:
        return Query(form="ratio", columns=(_unquote(m.group(1)), _unquote(m.group(2))),
                     where=where, text=text)
    m = _CALL.match(text)
    if not m:
        raise InputError(f"cannot parse query {shorten(query)}; use one of {HELP}, or `sql`", param="sql")
    name, arg, level = m.group(1).lower(), m.group(2), m.group(3)
    name = _ALIASES.get(name, name)
    if name not in FORMS or name in ("ratio", "sql"):
        raise InputError(f"unknown aggregate {shorten(m.group(1))} in {shorten(query)}; use one of {HELP}, or `sql`",
                         param="sql")
    if arg == "*" and name != "count":
        raise InputError(f"{name}(*) is not defined; name a column, e.g. {name}(x)")
    if name == "quantile":
        if level is None:
            raise InputError(f"quantile needs a level, e.g. quantile(x, 0.9); got {shorten(query)}")
        qv = float(level)
        if not 0.0 <= qv <= 1.0:
            raise InputError(f"quantile level must be in [0, 1]; got {level}")
    elif level is not None:
        raise InputError(f"{name}() takes one column; got {shorten(query)}")
    else:
        qv = {"min": 0.0, "max": 1.0, "median": 0.5}.get(name)
    columns = () if arg == "*" else (_unquote(arg),)
    return Query(form=name, columns=columns, q=qv, where=where, text=text)
