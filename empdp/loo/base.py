"""The leave-one-out protocol every engine answers (docs/method.md#2-leave-one-out-shifts-and-query-forms).

:class:`LooEngine` names the three questions, in the order the risk layer asks them:
``values()`` (f(X^j) for the n databases), ``screen(scale)`` (per individual: databases present,
sole-contributor flag, largest |Δ_ij| and M_i = max_j |Δ_ij| / scale_j, docs/method.md#51-screening-bound)
and ``shifts(codes)`` (dense Δ rows of the chosen individuals). It also holds what every strategy
shares: the range check of values and shifts, the NULL-value warning and the held Δ matrix.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import polars as pl

from ..data import Panel, quote_ident
from ..data import shorten as short
from ..errors import InputError
from ..query import Query

#: largest |query value| and |shift| accepted: the density model squares differences of them,
#: and squares of larger numbers overflow a double (1.8e308)
MAX_MAGNITUDE = 1e150


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
        Sole contributors: f(X^j ∖ i) is undefined in some database (docs/method.md#1-data-model).
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


class LooEngine(ABC):
    """Leave-one-out engine for one :class:`~empdp.query.Query` over one panel (the protocol).

    Subclasses (one per strategy) implement ``_values()`` (f(X^j), also setting
    :attr:`n_null_values`), ``_screen(scale)`` and ``_shift_rows(codes)`` (the (row, database,
    Δ, undefined) entries of the individuals ``codes``). The public methods add the checks.
    """

    #: True for an engine that evaluates individuals where their Δ rows are (Spark's executors): the
    #: assessment then calls :meth:`evaluate` and :meth:`evaluate_buckets` instead of fetching shifts
    on_executors = False

    def evaluate(self, model, codes, eps, *, need_eps_i: bool = True, return_exact: bool = False):
        """Exact ε_i and δ_i(eps) of the individuals ``codes`` where their rows are (engines with
        :attr:`on_executors` only; the others give their shifts to :func:`empdp.risk.evaluate`)."""
        raise TypeError(f"{type(self).__name__} gives shift rows; it does not evaluate individuals itself")

    def evaluate_buckets(self, buckets, codes, eps):
        """:func:`empdp.risk.buckets.bucket_risk` of the individuals ``codes`` where their rows are
        (engines with :attr:`on_executors` only)."""
        raise TypeError(f"{type(self).__name__} gives shift rows; it does not evaluate individuals itself")

    def __init__(self, panel: Panel, query: Query):
        self.panel = panel
        self.query = query
        #: rows the query skips because a value column is NULL (known after :meth:`values`)
        self.n_null_values = 0
        self._q: np.ndarray | None = None
        self._dense: np.ndarray | None = None  # every Δ row, when screen() could hold them
        self._inside: np.ndarray | None = None  # with ``hold_presence``: where each held row's individual is

    def close(self) -> None:
        """Release the panel (its connection and spill folder)."""
        self.panel.close()

    def memory_limit_bytes(self) -> int:
        """The engine's memory limit in bytes; 0 when it sets none of its own (then the caller's default)."""
        return 0

    @property
    def null_values_warning(self) -> str | None:
        """The warning to show when the query skipped rows with a NULL value (else None)."""
        if not self.n_null_values:
            return None
        cols = " or ".join(short(c) for c in dict.fromkeys(self.query.columns))
        return (f"{self.n_null_values:,} rows have a NULL {cols}: the query skips NULL values, as SQL "
                f"aggregates do; fill or filter them if they should count")

    @property
    def holds_all_shifts(self) -> bool:
        """True when :meth:`screen` kept every Δ row in memory (then :meth:`shifts` reads no table)."""
        return self._dense is not None

    #: set before :meth:`screen` when :meth:`shifts` will be asked for ``presence``: an engine
    #: that holds every Δ row then holds the databases each individual is in too (m × n bools)
    #: and answers from memory instead of reading the table again
    hold_presence = False

    def release_shifts(self) -> None:
        """Drop the held Δ matrix; later :meth:`shifts` calls fetch their rows again."""
        self._dense = self._inside = None

    def values(self) -> np.ndarray:
        """f(X^j) for every database, in label order.

        Raises :class:`InputError` when a value overflows (or comes near the largest double):
        such values are arithmetic noise, not a query's values.
        """
        if self._q is None:
            # values near 1e308 overflow inside the aggregates: checked below, without warnings
            with np.errstate(all="ignore"):
                q = self._values()
            self._require_in_range(q)
            self._q = q
        return self._q

    def screen(self, scale: np.ndarray) -> Screen:
        """Per-individual summary and screening bound M_i = max_j |Δ_ij| / scale_j."""
        scale = np.asarray(scale, dtype=np.float64)
        self.values()
        with np.errstate(all="ignore"):  # overflowing shifts are refused below, without warnings
            out = self._screen(scale)
        self._require_in_range(out.max_abs_shift, out.ids)
        return out

    def shifts(self, codes: np.ndarray, presence: bool = False):
        """Dense Δ rows (len(codes), n) for the given individuals (0 where absent or undefined).

        With ``presence``, also return the (len(codes), n) bool matrix of the
        databases in which each individual has rows.
        """
        codes = np.asarray(codes, dtype=np.int64)
        if self._dense is not None and (not presence or self._inside is not None):
            return (self._dense[codes], self._inside[codes]) if presence else self._dense[codes]
        n = len(self.panel.labels)
        out = np.zeros((len(codes), n))
        present = np.zeros((len(codes), n), dtype=bool)
        if len(codes):
            rows, j, delta, undef = self._shift_rows(codes)
            out[rows[~undef], j[~undef]] = delta[~undef]
            present[rows, j] = True
        return (out, present) if presence else out

    # the strategy's hooks (template methods): each engine class defines these three, and a class
    # without them cannot be instantiated
    @abstractmethod
    def _values(self) -> np.ndarray:
        """f(X^j) of every database, in label order."""

    @abstractmethod
    def _screen(self, scale: np.ndarray) -> Screen:
        """The screening table with M_i = max_j |Δ_ij| / scale_j."""

    @abstractmethod
    def _shift_rows(self, codes: np.ndarray) -> tuple:
        """(row, j, Δ, undefined) of the present (individual, database) pairs of ``codes``."""

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


class DuckDBEngine(LooEngine):
    """A :class:`LooEngine` over a DuckDB :class:`~empdp.data.Panel`: the value columns are checked
    (numeric, finite on the rows ``where`` keeps) before any scan."""

    def __init__(self, panel: Panel, query: Query):
        super().__init__(panel, query)
        for col in query.columns:
            panel.require_numeric(col, query.where)

    def memory_limit_bytes(self) -> int:
        """DuckDB's memory limit in bytes (``--memory-limit`` or its default)."""
        return self.panel.memory_limit_bytes()

    def _null_count(self) -> str:
        """SQL counting the rows (of one group) where a value column of the query is NULL."""
        if not self.query.columns:
            return "0::BIGINT"
        nulls = " OR ".join(f"{quote_ident(c)} IS NULL" for c in self.query.columns)
        return f"count(*) FILTER (WHERE {nulls})"


def factorize(ids: pl.Series, name: str) -> tuple[pl.Series, np.ndarray]:
    """Sorted unique ids (named ``name``) and each row's code (index into them)."""
    uniq = ids.unique().sort()
    lookup = pl.DataFrame({"__i": uniq, "__code": np.arange(len(uniq), dtype=np.int64)})
    code = pl.DataFrame({"__i": ids}).join(lookup, on="__i", how="left", maintain_order="left")["__code"]
    return uniq.rename(name), code.to_numpy()
