"""The decomposable query forms, one table entry each (docs/method.md#2-leave-one-out-shifts-and-query-forms).

A form is computed from per-group partial moments (row counts c, sums s, ...). The same SQL
gives the totals of database j (group ``__j``) and the partials of individual i in it (group
``__j, __i``); the form's closed form turns the totals into f(X^j) (NumPy) and the totals
minus the partials into Δ_ij = f(X^j) − f(X^j ∖ i) (SQL over the totals ``t`` and the
partials ``p``, with ``t.f`` = f(X^j)). A new decomposable form is one entry of :data:`FORMS`
and its name in :data:`empdp.query.DECOMPOSABLE`; every engine computes it from this entry (the
SQL is the standard SQL that both DuckDB and Spark read: ``CAST``, ``CASE``, ``greatest``, ``sqrt``,
with columns quoted by the engine that runs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..data import quote_ident


@dataclass(frozen=True)
class Moments:
    """How the partial moments' SQL sums a group's rows: ``count(e)`` (``e`` None: every row) and
    ``sum(e)``, as aggregates (:data:`GROUPED`) or of each row alone (:data:`ROW`).

    A group of one row has the moments of that row, so the two spellings give the same numbers to the
    bit: a count of one row is 0 or 1, the DOUBLE sum of one DOUBLE is that value plus 0.0 (as the sum
    starts from 0: −0.0 becomes 0.0; NULL stays NULL, which the forms coalesce to 0). A table with one
    row per (individual, database) needs no GROUP BY for its partials
    (:func:`empdp.loo.decomposable.delta_sql`).
    """

    count: Callable[[str | None], str]
    sum: Callable[[str], str]


#: the partial moments of a group of rows, summed by SQL aggregates
GROUPED = Moments(count=lambda e: f"count({e or '*'})", sum=lambda e: f"sum({e})")
#: the partial moments of one row: its count (1, or 0 where the value is NULL) and its value
ROW = Moments(count=lambda e: "1" if e is None else f"CAST({e} IS NOT NULL AS BIGINT)",
              sum=lambda e: f"({e} + CAST(0 AS DOUBLE))")


@dataclass(frozen=True)
class Form:
    """How one decomposable form gets f(X^j) and every Δ_ij from partial moments.

    Attributes
    ----------
    partials : callable
        (Quoted value columns, :class:`Moments`) → SQL of the partial moments, each ``AS`` its name.
    value : callable
        Dict of per-database totals (arrays named as the partials) → (f(X^j), defined).
    delta, undefined : str
        SQL of Δ_ij and of "f(X^j ∖ i) is undefined", over ``t.*`` and ``p.*``.
    centred : bool
        Moments about each database's mean ``t.m`` (``c``, ``s``, ``ss`` of x − t.m; the totals
        ``s1``, ``ss``): accurate for values like 1e9 + noise (var, std).
    """

    partials: Callable[[tuple, Moments], list]
    value: Callable[[dict], tuple]
    delta: str
    undefined: str
    centred: bool = False


def _count_partials(cols: tuple, m: Moments) -> list:
    return [f"CAST({m.count(cols[0] if cols else None)} AS DOUBLE) AS c"]


def _sum_partials(cols: tuple, m: Moments) -> list:
    return [f"CAST({m.count(cols[0])} AS DOUBLE) AS c", f"coalesce({m.sum(f'CAST({cols[0]} AS DOUBLE)')}, 0) AS s"]


def _ratio_partials(cols: tuple, m: Moments) -> list:
    a, b = cols
    return [f"CAST({m.count(a)} AS DOUBLE) AS ca", f"coalesce({m.sum(f'CAST({a} AS DOUBLE)')}, 0) AS sa",
            f"CAST({m.count(b)} AS DOUBLE) AS cb", f"coalesce({m.sum(f'CAST({b} AS DOUBLE)')}, 0) AS sb"]


def centred_partials(tag: str = "", moments: Moments = GROUPED) -> list:
    """The partial moments of the centred values ``__xc`` = x − t.m (forms with ``centred``), each
    name and ``__xc`` ending in ``tag`` (:func:`partials_sql`)."""
    xc, m = f"__xc{tag}", moments
    return [f"CAST({m.count(xc)} AS DOUBLE) AS c{tag}", f"coalesce({m.sum(xc)}, 0) AS s{tag}",
            f"coalesce({m.sum(f'{xc} * {xc}')}, 0) AS ss{tag}"]


def _mean(t: dict) -> tuple:
    ok = t["c"] > 0
    return np.divide(t["s"], t["c"], out=np.zeros(len(ok)), where=ok), ok


def _var(t: dict) -> tuple:
    ok = t["c"] > 1
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.where(ok, (t["ss"] - t["s1"] ** 2 / t["c"]) / (t["c"] - 1), 0.0)
    return np.maximum(var, 0.0), ok


def _std(t: dict) -> tuple:
    var, ok = _var(t)
    return np.sqrt(var), ok


def _ratio(t: dict) -> tuple:
    ok = (t["ca"] > 0) & (t["cb"] > 0) & (t["sb"] != 0)
    return np.divide(t["sa"], t["sb"], out=np.zeros(len(ok)), where=ok), ok


#: the sample variance without individual i, from centred totals minus partials
_LOO_VAR = "greatest(((t.ss - p.ss) - (t.s1 - p.s) * (t.s1 - p.s) / (t.c - p.c)) / (t.c - p.c - 1), 0)"
_NO_ROW_LEFT = "t.c - p.c <= 0"
_RATIO_UNDEFINED = "(t.ca - p.ca <= 0) OR (t.cb - p.cb <= 0) OR (t.sb - p.sb = 0)"

#: form → partial moments and closed-form leave-one-out (docs/method.md#2-leave-one-out-shifts-and-query-forms)
FORMS: dict[str, Form] = {
    "count": Form(_count_partials, lambda t: (t["c"], np.ones(len(t["c"]), bool)), "p.c", _NO_ROW_LEFT),
    "sum": Form(_sum_partials, lambda t: (t["s"], t["c"] > 0), "p.s", _NO_ROW_LEFT),
    "mean": Form(_sum_partials, _mean,
                 "CASE WHEN t.c - p.c > 0 THEN (p.s - p.c * t.f) / (t.c - p.c) ELSE 0 END", _NO_ROW_LEFT),
    "var": Form(_sum_partials, _var, f"CASE WHEN t.c - p.c > 1 THEN t.f - {_LOO_VAR} ELSE 0 END",
                "t.c - p.c <= 1", centred=True),
    "std": Form(_sum_partials, _std, f"CASE WHEN t.c - p.c > 1 THEN t.f - sqrt({_LOO_VAR}) ELSE 0 END",
                "t.c - p.c <= 1", centred=True),
    "ratio": Form(_ratio_partials, _ratio,
                  f"CASE WHEN {_RATIO_UNDEFINED} THEN 0 ELSE (p.sa - t.f * p.sb) / (t.sb - p.sb) END",
                  _RATIO_UNDEFINED),
}


def partials_sql(form: str, columns: tuple, tag: str = "", quote: Callable[[str], str] = quote_ident,
                 moments: Moments = GROUPED) -> list:
    """The partial moments of ``form`` over the (unquoted) value ``columns``, each named
    ``AS <name><tag>``: statistics read in one scan tell their moments apart by the tag. ``quote``
    quotes a column name as the engine's SQL reads it (DuckDB's by default); ``moments`` says whether
    they sum a group's rows (aggregates) or are those of one row."""
    return [f"{sql}{tag}" for sql in FORMS[form].partials(tuple(quote(c) for c in columns), moments)]


def mean_sql(column: str) -> str:
    """The database mean ``m`` about which a ``centred`` form's moments are taken (``column`` quoted)."""
    return f"coalesce(avg(CAST({column} AS DOUBLE)), 0) AS m"


def totals_named(sql: str) -> list[str]:
    """The totals ``t.<name>`` a form's ``delta`` or ``undefined`` SQL reads, in order of first use."""
    return list(dict.fromkeys(_TOTAL.findall(sql)))


def columns_for(sql: str, total: Callable[[str], str]) -> str:
    """A form's ``delta`` or ``undefined`` SQL with its partials ``p.<name>`` as plain columns and each
    total ``t.<name>`` as ``total(name)``: for an engine that puts the totals beside the partials."""
    return _PARTIAL.sub(r"\1", _TOTAL.sub(lambda m: total(m.group(1)), sql))


_TOTAL = re.compile(r"(?<![\w.])t\.(\w+)")
_PARTIAL = re.compile(r"(?<![\w.])p\.(\w+)")


def bind(sql: str, tag: str) -> str:
    """A form's ``delta`` or ``undefined`` SQL for the statistic tagged ``tag``: its totals are the
    table aliased ``t<tag>`` and its partials the columns ``p.<name><tag>`` (unchanged for tag "")."""
    if not tag:
        return sql
    return _PARTIAL.sub(lambda m: f"p.{m.group(1)}{tag}", _TOTAL.sub(lambda m: f"t{tag}.{m.group(1)}", sql))
