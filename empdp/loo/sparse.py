"""Engines that compute every Δ_ij in memory at once (order statistics, generic SQL).

Their shifts are held sparsely: one entry per (individual, database) pair present.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import polars as pl

from .base import DuckDBEngine, Screen


@dataclass
class SparseShifts:
    """Δ_ij of every present (individual, database) pair.

    Attributes
    ----------
    ids : polars.Series
        The individuals' ids, sorted (``code`` indexes them).
    code, j : ndarray of int
        Individual code and database index of each entry.
    delta : ndarray
        Δ_ij (0 where undefined).
    undef : ndarray of bool
        f(X^j ∖ i) is undefined (i is a sole contributor of database j).
    """

    ids: pl.Series
    code: np.ndarray
    j: np.ndarray
    delta: np.ndarray
    undef: np.ndarray

    def screen(self, scale: np.ndarray) -> Screen:
        """The screening table (docs/method.md#51-screening-bound) of these entries."""
        code, j, delta, undef = self.code, self.j, self.delta, self.undef
        m = len(self.ids)
        n_present = np.bincount(code, minlength=m)
        undefined = np.zeros(m, dtype=bool)
        undefined[code[undef]] = True
        ok = ~undef
        max_abs = np.zeros(m)
        np.maximum.at(max_abs, code[ok], np.abs(delta[ok]))
        bound = np.zeros(m)
        np.maximum.at(bound, code[ok], np.abs(delta[ok]) / scale[j[ok]])
        return Screen(self.ids, n_present, undefined, max_abs, bound)

    def rows(self, codes: np.ndarray) -> tuple:
        """(output row, database, Δ, undefined) of the entries of the individuals ``codes``."""
        code = self.code
        pos = np.full(int(code.max()) + 1, -1, dtype=np.int64)
        pos[codes] = np.arange(len(codes))
        sel = pos[code] >= 0
        return pos[code[sel]], self.j[sel], self.delta[sel], self.undef[sel]


class InMemoryEngine(DuckDBEngine):
    """A strategy whose ``_compute()`` returns (f(X^j), :class:`SparseShifts`) in one go."""

    def __init__(self, panel, query):
        super().__init__(panel, query)
        self._sparse: SparseShifts | None = None

    @abstractmethod
    def _compute(self) -> tuple[np.ndarray, SparseShifts]:
        """The strategy's hook: every f(X^j) and every shift at once (order statistics, --sql)."""

    def _values(self) -> np.ndarray:
        q, self._sparse = self._compute()
        return q

    def _screen(self, scale: np.ndarray) -> Screen:
        return self._sparse.screen(scale)

    def _shift_rows(self, codes: np.ndarray) -> tuple:
        return self._sparse.rows(codes)
