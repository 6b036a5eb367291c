"""The settings objects of the entry points: what to read, which curator model, how to run.

:func:`empdp.assess` and :func:`empdp.calibrate` take the statistic and its ε flat (what nearly every
call changes) and the rest grouped::

    empdp.assess("panel.parquet", id="cust", by="day", query="mean(amount)",
                 model=empdp.Model(kernel="gaussian"), execution=empdp.Execution(threads=4))

``data`` may also be a :class:`Data` (the table with its keys). Each object checks its values when
it is made, with the one validator of each concept (:mod:`empdp.params`), so a mistake is reported
before any work and names the parameter (the command line shows its flag instead). The adversary
options are checked by the curator models that take them: the others refuse them, naming the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import params
from .engines import engine_of
from .errors import InputError
from .kernels import DEFAULT as _DEFAULT_KERNEL
from .kernels import candidates
from .progress import Progress


@dataclass(frozen=True)
class Data:
    """The table of repeated databases and its keys.

    Attributes
    ----------
    source
        Path (Parquet/CSV/JSON file, glob, hive folder, ``FILE.duckdb::TABLE``), a pandas/polars/Arrow
        frame or a DuckDB relation; ``None`` with a Spark engine that names a catalog ``table``.
    id, by
        The columns naming the individual and the database.
    drop_null_ids
        Drop rows whose id is NULL (otherwise they are refused).
    """

    source: Any
    id: str
    by: str
    drop_null_ids: bool = False

    def __post_init__(self):
        for name in ("id", "by"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InputError(f"`{name}` must be a column name, got {value!r}", param=name)

    @classmethod
    def of(cls, data: Any, id: str | None, by: str | None) -> "Data":
        """``data`` as it is when it is a :class:`Data` (then ``id`` and ``by`` must not be given again),
        else the table ``data`` keyed by ``id`` and ``by``."""
        if isinstance(data, Data):
            if id is not None or by is not None:
                raise InputError("`id` and `by` are given by the Data object: do not give them again",
                                 param=("id", "by"))
            return data
        return cls(data, id, by)


@dataclass(frozen=True)
class Model:
    """The curator's density model, and what the adversary knows (docs/method.md).

    Attributes
    ----------
    kernel, bandwidth
        The kernel's name (``"laplace"``, ``"gaussian"``) and ``"auto"`` (chosen by leave-one-out
        likelihood), ``"variable"``, or a number fixing one global scale.
    adversary, adversary_sql, buckets
        What the adversary knows about each database: a named query form (e.g. ``"count(*)"``) or SQL
        over ``db``, computed on the whole table; the databases are cut into ``buckets`` groups by it
        and the risk is the largest conditional risk over the buckets.
    """

    kernel: str = _DEFAULT_KERNEL.name
    bandwidth: Any = "auto"
    adversary: str | None = None
    adversary_sql: str | None = None
    buckets: int | None = None

    def __post_init__(self):
        # the kernel registry refuses unknown names with the list of known ones; the adversary options are
        # checked by the models that take them (the others refuse them first, naming the model)
        candidates(self.kernel)


@dataclass(frozen=True)
class Execution:
    """Where and how the work runs; no result depends on it.

    Attributes
    ----------
    engine
        ``"duckdb"`` (embedded, the default), ``"spark"``, or an engine object
        (:class:`empdp.engines.DuckDB`, :class:`empdp.engines.Spark`).
    memory_limit, threads
        DuckDB's memory limit (e.g. ``"4GB"``) and the threads of DuckDB and of the exact evaluation
        (default: every core this process may use).
    workers
        ``"threads"``, ``"processes"`` or ``"auto"``: how individuals are evaluated side by side
        (:func:`empdp.assess`).
    screening
        Skip individuals whose certified bound shows δ_i = 0; turning it off changes only the time.
    progress
        A callable ``progress(stage, done, total)`` (:mod:`empdp.progress`).
    """

    engine: Any = "duckdb"
    memory_limit: str | None = None
    threads: int | None = None
    workers: str = "threads"
    screening: bool = True
    progress: Progress | None = None

    def __post_init__(self):
        if isinstance(self.engine, str):
            engine_of(self.engine)  # a name the registry knows (an object is checked where it is used)
        if self.threads is not None:
            params.whole(self.threads, "threads")
        params.workers(self.workers)



@dataclass(frozen=True)
class Intervals:
    """Intervals of the estimates (docs/method.md#71-uncertainty-of-the-estimates): ``replicates``
    subsamples of the databases drawn by ``rng``, intervals at ``level``; ``rows`` riskiest individuals
    (or ``"all"``) get ``eps_i_lo``, ``eps_i_hi``."""

    replicates: int = 200
    level: float = 0.9
    rng: Any = None
    rows: Any = 10

    def __post_init__(self):
        from .assessment.uncertainty import check_options  # numpy and the risk modules: not for --help

        check_options(self.replicates, self.level)
        rows = self.rows
        if rows != "all" and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise InputError(f"`rows` must be a count of riskiest individuals or 'all', got {rows!r}", param="rows")


@dataclass(frozen=True)
class Precision:
    """How exactly 2–3 statistics released together are assessed (one statistic's risk is always exact):
    the total risk δ*(ε) certified to a bracket [lo, hi] with hi − lo ≤ max(``tolerance`` × hi, 1e-12),
    and each individual's δ_i as a certified bracket (``delta_lo``, ``delta_hi``); ``exact`` computes
    every δ_i exactly instead (docs/method.md#102-joint-queries; it costs an exact evaluation of every
    individual at every ε)."""

    tolerance: float = 1e-4
    exact: bool = False

    def __post_init__(self):
        from .assessment.joint_evaluation import check_tolerance  # the joint modules: not for --help

        check_tolerance(self.tolerance)
        if not isinstance(self.exact, bool):
            raise InputError(f"`exact` must be True or False, got {self.exact!r}", param="exact")
