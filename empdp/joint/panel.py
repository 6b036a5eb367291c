"""Read a joint query's values and leave-one-out shifts from a table (docs/method.md#102-joint-queries-planned).

One leave-one-out engine per statistic (:func:`empdp.loo.open_engine`); the d-dimensional query
values q_j and shifts Δ_ij aligned by database and individual. Shared by the joint assessment and
the joint calibration and release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ..errors import InputError
from ..loo import open_engine
from .model import MAX_DIM


@dataclass(kw_only=True)
class JointPanel:
    """The statistics of every database and every individual's leave-one-out shifts.

    labels : the databases' labels, in order (n)
    names : each statistic as described by its query form (d)
    q : ndarray (n, d), the statistics of each database
    ids : polars Series (m), every individual with a row in some database, sorted
    shifts : ndarray (m, n, d), Δ_ij = q_j − q_j(without i) (0 where i is absent from j)
    sole : ndarray (m,) bool, the only contributor to some database (Δ_ij undefined)
    present : ndarray (m,) int, databases the individual is in
    """

    labels: list
    names: list
    q: np.ndarray
    ids: pl.Series
    shifts: np.ndarray
    sole: np.ndarray
    present: np.ndarray

    @property
    def d(self) -> int:
        return self.q.shape[1]


def statistics(queries, sql) -> list[dict]:
    """One ``{"query": ...}`` or ``{"sql": ...}`` per statistic, 1 to :data:`MAX_DIM` of them."""
    if (queries is None) == (sql is None):
        raise InputError("give the statistics as queries=[...] or sql=[...], not both")
    items = [queries] if isinstance(queries, str) else [sql] if isinstance(sql, str) else list(queries or sql)
    if not 1 <= len(items) <= MAX_DIM:
        raise InputError(f"a joint query has 1 to {MAX_DIM} statistics; got {len(items)}")
    return [{"query": s} if queries is not None else {"sql": s} for s in items]


def read_joint(source: Any, *, id: str, by: str, queries=None, sql=None, where: str | None = None,
               drop_null_ids: bool = False, memory_limit: str | None = None,
               threads: int | None = None) -> JointPanel:
    """The :class:`JointPanel` of 1–3 statistics (``queries`` or ``sql``, one per statistic) of ``source``."""
    stats = statistics(queries, sql)
    engines = []
    try:
        for st in stats:
            engines.append(open_engine(source, id=id, by=by, where=where, drop_null_ids=drop_null_ids,
                                       memory_limit=memory_limit, threads=threads, **st))
        labels = list(engines[0].panel.labels)
        for e in engines[1:]:
            if list(e.panel.labels) != labels:
                raise InputError("the statistics see different databases; check the query filters")
        q = np.column_stack([e.values() for e in engines])
        names = [e.query.describe() for e in engines]
        screens = [e.screen(np.ones(len(labels))) for e in engines]
        ids = pl.concat([s.ids for s in screens]).unique().sort()
        m, n, d = len(ids), len(labels), len(engines)
        pos = {v: k for k, v in enumerate(ids.to_list())}
        shifts = np.zeros((m, n, d))
        sole = np.zeros(m, dtype=bool)
        present = np.zeros(m, dtype=np.int64)
        for k, (e, s) in enumerate(zip(engines, screens)):
            rows = np.array([pos[v] for v in s.ids.to_list()], dtype=np.int64)
            shifts[rows, :, k] = e.shifts(np.arange(len(s)))
            sole[rows] |= s.undefined
            present[rows] = np.maximum(present[rows], s.n_present)
    finally:
        for e in engines:
            e.close()
    return JointPanel(labels=labels, names=names, q=q, ids=ids, shifts=shifts, sole=sole, present=present)
