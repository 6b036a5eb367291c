"""The calibration's statistic(s) read from a source: the value a release adds noise to, and (for
``audit release``) its leave-one-out. One reading path for every curator model: one open engine per
statistic, on database ``database`` only for a release."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..engines import engine_of
from ..errors import InputError
from ..loo import loo_result
from ..models import JOINT
from ..progress import Progress, no_progress
from .calibration import Calibration

log = logging.getLogger(__name__)


def _statistics(cal) -> list[dict]:
    """One ``{"query"|"sql": ...}`` per statistic of the calibration, in its order."""
    if cal.id is None or cal.by is None or (cal.query is None and cal.sql is None):
        raise InputError("this calibration has no stored query (it was made from arrays); pass `value`", param="value")
    if cal.kind is JOINT:
        return [{"query": s} for s in cal.query] if cal.query is not None else [{"sql": s} for s in cal.sql]
    return [{"query": cal.query, "sql": cal.sql}]


def database_values(cal, source: Any, database: str, memory_limit: str | None = None,
                    progress: Progress | None = None, engine="duckdb", **spark) -> list[float]:
    """The calibration's statistics on database ``database`` of ``source``, in its order (for ``release``).

    ``engine``: where the query runs, an engine object or name (:mod:`empdp.engines`; with a name,
    ``spark`` keywords as :func:`empdp.engines.engine_of` takes them). Only database ``database`` is
    read: a source may hold the new period alone. ``progress("reading", done, total)``.
    """
    items = _statistics(cal)
    engine = engine_of(engine, memory_limit=memory_limit, **spark)
    progress = progress or no_progress
    out = []
    for k, item in enumerate(items):
        progress("reading", k, len(items))
        t0 = time.perf_counter()
        eng = engine.open(source, id=cal.id, by=cal.by, where=cal.where, database=str(database), **item)
        try:
            labels = [str(x) for x in eng.panel.labels]
            if str(database) not in labels:
                shown = ", ".join(labels[:10]) + (" ..." if len(labels) > 10 else "")
                raise InputError(f"database {database!r} is not in {cal.by!r} of this source; it has: {shown}")
            out.append(float(eng.values()[labels.index(str(database))]))
            log.info("computed %s on database %s of %s (%d databases) in %.2f s", eng.query.describe(), database,
                     eng.panel.description, len(labels), time.perf_counter() - t0)
        finally:
            eng.close()
    progress("reading", len(items), len(items))
    return out


def query_value(cal: Calibration, source: Any, database: str, memory_limit: str | None = None,
                progress: Progress | None = None, engine="duckdb", **spark) -> float:
    """f(X) on database ``database`` of ``source`` with a one-statistic calibration's query."""
    return database_values(cal, source, database, memory_limit, progress, engine, **spark)[0]


def joint_query_value(cal, source: Any, database: str, memory_limit: str | None = None,
                      progress: Progress | None = None) -> list[float]:
    """The statistics of a joint calibration on database ``database`` of ``source``, in its order."""
    return database_values(cal, source, database, memory_limit, progress)


def release_value(cal, source: Any, database: str, *, memory_limit: str | None = None,
                  progress: Progress | None = None, engine="duckdb", **spark) -> tuple[float | list[float], str]:
    """The calibration's statistic(s) on database ``database`` of ``source`` (or a Spark ``table``), and the
    digest of the data they were computed from (:func:`empdp.digest.source_digest`), for ``release``.

    The digest is taken before the data are read; a file that changes while they are read (its size or
    modification time) is refused, so the digest recorded is that of the data released from.
    """
    from ..digest import source_digest, source_stamp

    engine = engine_of(engine, memory_limit=memory_limit, **spark)
    stamp = source_stamp(source)
    digest = source_digest(source, getattr(engine, "table", None))
    values = database_values(cal, source, database, memory_limit, progress, engine)
    if source_stamp(source) != stamp:
        raise InputError(f"the source {str(source)[:200]!r} changed while it was read; nothing was released: "
                         "release again once it is complete")
    return (values if cal.kind is JOINT else values[0]), digest


class SourceShifts:
    """The leave-one-out of a calibration's query on ``source``, read on first use (for ``audit release``).

    Has the ``q``, ``shifts``, ``ids``, ``undefined`` and ``labels`` of :class:`empdp.loo.LooResult`, read by
    ``engine`` (an engine object or name, :mod:`empdp.engines`; with a name, ``spark`` keywords as
    :func:`empdp.engines.engine_of` takes them). Reading waits for the first attribute:
    :func:`empdp.audit.audit_release` checks its options and the calibration before it asks, so
    bad options never cost a pass over the data.
    """

    def __init__(self, calibration: Calibration, source: Any = None, engine="duckdb", **spark):
        if not isinstance(calibration, Calibration):  # a file is loaded, and its signature checked, by the caller
            raise TypeError("SourceShifts takes a loaded Calibration (empdp.noise.load_calibration)")
        self._calibration, self._source, self._engine = calibration, source, engine_of(engine, **spark)
        self._result = None

    def _read(self):
        if self._result is None:
            cal = self._calibration
            if cal.id is None or cal.by is None:
                raise InputError("this calibration stores no query (it was made from arrays); nothing to read")
            eng = self._engine.open(self._source, id=cal.id, by=cal.by, query=cal.query, where=cal.where,
                                    sql=cal.sql)
            try:
                self._result = loo_result(eng)
            finally:
                eng.close()
        return self._result

    q = property(lambda self: self._read().q)
    shifts = property(lambda self: self._read().shifts)
    ids = property(lambda self: self._read().ids)
    undefined = property(lambda self: self._read().undefined)
    labels = property(lambda self: self._read().labels)
