"""Order statistics by rank arithmetic (docs/method.md#2-leave-one-out-shifts-and-query-forms).

min, max, median and quantile(x, q) interpolate linearly, as DuckDB's ``quantile_cont``. Each
database's values are sorted once; an individual's leave-one-out k-th value is found from the
ranks of their own rows, vectorised over the individuals with the same number of rows.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..data import quote_ident
from ..data import shorten as short
from ..errors import InputError
from .base import factorize
from .sparse import InMemoryEngine, SparseShifts


class OrderStatisticEngine(InMemoryEngine):
    """min, max, median and quantile: exact Δ_ij from each database's sorted values."""

    def _compute(self) -> tuple[np.ndarray, SparseShifts]:
        panel, query = self.panel, self.query
        x = query.columns[0]
        base = panel.base_sql(query.columns, query.where)
        self.n_null_values = int(panel.fetchall(f"SELECT {self._null_count()} FROM ({base})",
                                                where=query.where)[0][0])
        rows = pl.from_arrow(panel.arrow(f"SELECT __j, __i, {quote_ident(x)}::DOUBLE AS x "
                                         f"FROM ({panel.base_sql([x], query.where)}) WHERE {quote_ident(x)} IS NOT NULL",
                                         where=query.where))
        ids, code = factorize(rows["__i"], panel.id)
        q, code, j, delta, undef = order_statistic_loo(code, rows["__j"].to_numpy().astype(np.int64),
                                                       rows["x"].to_numpy(), float(query.q), panel.labels, query)
        return q, SparseShifts(ids, code, j, delta, undef)


def order_statistic_loo(code: np.ndarray, jj: np.ndarray, xx: np.ndarray, level: float, labels: list, query):
    """f(X^j) and every (code, j, Δ, undefined) entry of the quantile at ``level`` of rows (code, j, x)."""
    n = len(labels)
    qv = np.empty(n)
    out_code, out_j, out_delta, out_undef = [], [], [], []
    order = np.lexsort((xx, jj))
    bounds = np.searchsorted(jj[order], np.arange(n + 1))
    for j in range(n):
        rows = order[bounds[j]:bounds[j + 1]]
        N = len(rows)
        if N == 0:
            raise InputError(f"query {short(query.describe())} is undefined on database {labels[j]!s} "
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
            out_code.append(owners)
            out_j.append(np.full(len(owners), j))
            remaining = N - cnt
            if remaining == 0:  # the individual's rows are all of database j
                out_delta.append(np.zeros(len(owners)))
                out_undef.append(np.ones(len(owners), bool))
                continue
            ranks = by_owner[grp[:, None] + np.arange(cnt)[None, :]]
            out_delta.append(qv[j] - _quantile_excluding(v, ranks, remaining, level))
            out_undef.append(np.zeros(len(owners), bool))
    return (qv, np.concatenate(out_code), np.concatenate(out_j),
            np.concatenate(out_delta), np.concatenate(out_undef))


def _quantile_excluding(v: np.ndarray, ranks: np.ndarray, remaining: int, level: float) -> np.ndarray:
    """The quantile at ``level`` of the sorted ``v`` without the rows at ``ranks`` (one row per individual)."""
    h = (remaining - 1) * level
    k = np.full(len(ranks), int(np.floor(h)), dtype=np.int64)
    frac = h - np.floor(h)
    lo = v[_kth_excluding(ranks, k)]
    if frac > 0:
        hi = v[_kth_excluding(ranks, k + 1)]
        return lo + (hi - lo) * frac
    return lo


def _quantile_sorted(v: np.ndarray, pos_lo: np.ndarray, frac: np.ndarray) -> np.ndarray:
    """Linear interpolation between order statistics (DuckDB ``quantile_cont``)."""
    lo = v[pos_lo]
    hi = v[np.minimum(pos_lo + 1, len(v) - 1)]
    return np.where(frac > 0, lo + (hi - lo) * frac, lo)


def _kth_excluding(ranks: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Index in the full sorted array of the k-th smallest value once the rows at
    ``ranks`` (g × c, ascending per row) are removed (rank arithmetic,
    docs/method.md#2-leave-one-out-shifts-and-query-forms)."""
    pos = k.copy()
    for t in range(ranks.shape[1]):
        pos += ranks[:, t] <= pos
    return pos
