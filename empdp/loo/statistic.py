"""One statistic read whole through its leave-one-out engine: the values and every individual's
shifts (what a joint or grouped panel is assembled from, :mod:`empdp.loo.joint`; each engine object's
``read``, :mod:`empdp.engines`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(kw_only=True)
class StatisticShifts:
    """One statistic read through its leave-one-out engine (:func:`read_statistic`).

    q : ndarray (n,); ids : polars Series (m), the individuals with rows it reads, sorted;
    shifts : ndarray (m, n); sole : ndarray (m,) bool; present : ndarray (m,) int, databases the
    individual is in; in_database : ndarray (m, n) bool with ``presence``, else None.
    """

    name: str
    q: np.ndarray
    ids: pl.Series
    shifts: np.ndarray
    sole: np.ndarray
    present: np.ndarray
    in_database: np.ndarray | None = None


def read_statistic(engine, *, presence: bool = False) -> StatisticShifts:
    """The values and every individual's shifts of an open leave-one-out engine (one statistic)."""
    engine.hold_presence = presence
    q = engine.values()
    s = engine.screen(np.ones(len(q)))
    codes = np.arange(len(s))
    shifts, inside = engine.shifts(codes, presence=True) if presence else (engine.shifts(codes), None)
    return StatisticShifts(name=engine.query.describe(), q=q, ids=s.ids, shifts=shifts, sole=s.undefined,
                           present=s.n_present, in_database=inside)
