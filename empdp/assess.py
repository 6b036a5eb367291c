"""``empdp assess``: per-individual empirical privacy risk (docs/method.md#1-data-model).

Data flow: source → :mod:`empdp.loo` (query values and shifts) →
:mod:`empdp.density` (the curator's model, fitted once) → screening bounds
M_i → :mod:`empdp.risk` (exact δ_i and ε_i for the individuals that need them).
"""

from __future__ import annotations

import math
import sys
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

from . import _onescale, checks, risk
from ._parallel import WORKERS, Executors, available_cores
from .density import DEFAULT_KERNEL, DensityModel, select_density
from .errors import InputError
from .loo import LooEngine, open_engine
from .ranking import Ranking, eps_all_code

Progress = Callable[[str, int, int], None]
#: the memory limit when DuckDB's cannot be read (bytes)
DEFAULT_MEMORY_LIMIT = 4 * 10**9

#: dense shift cells fetched from the engine in one scan and held at once (float64: 8 bytes each)
FETCH_CELLS = 100_000_000
#: individuals evaluated on one shared grid (risk.evaluate bounds its own working memory)
EVAL_ROWS = 8192
#: smallest block worth a thread of its own (smaller chunks are split in four for the threads)
MIN_EVAL_ROWS = 128
#: individuals fetched for the ε_all search up front, and the search's first batch
SEARCH_PREFETCH = 32768
SEARCH_BATCH = 256
#: blocks in flight between a block's results and their use in planning others (_Accumulator.needed)
LAG_BLOCKS = 8
#: Σ log(1 − δ_i(ε)) at or below which δ*(ε) = −expm1(·) is 1.0 in float64 (it is from about −38)
SATURATED = -60.0


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


def _check_threads(threads) -> int:
    if threads is None:
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise InputError(f"--threads must be a whole number >= 1, got {threads!r}")
    return int(threads)


def _memory_limit(engine: LooEngine) -> int:
    """The memory limit in bytes: ``--memory-limit``, else its default (DuckDB's setting holds either)."""
    return engine.memory_limit_bytes() or DEFAULT_MEMORY_LIMIT  # 0: an engine without one (Spark)


#: the largest ε any command takes: e^ε overflows a double just beyond 709
MAX_EPSILON = 700.0


def _check_epsilons(epsilon) -> np.ndarray:
    eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
    if not len(eps) or np.any(~np.isfinite(eps)) or np.any(eps < 0) or np.any(eps > MAX_EPSILON):
        raise InputError(f"--epsilon values must be in [0, {MAX_EPSILON:g}] (e^epsilon overflows beyond)")
    return np.unique(eps)


class _ShiftCache:
    """Dense shift rows fetched from the engine in as few scans as possible, kept until dropped."""

    def __init__(self, engine: LooEngine, capacity: int):
        self.engine, self.capacity = engine, capacity
        self.codes = np.empty(0, dtype=np.int64)
        self.rows = np.empty((0, len(engine.panel.labels)))

    def prefetch(self, codes: np.ndarray) -> None:
        """Fetch the rows of ``codes`` not yet held, in one scan of the table."""
        if self.engine.holds_all_shifts:  # the engine keeps every row: nothing to fetch
            return
        new = np.setdiff1d(np.asarray(codes, dtype=np.int64), self.codes)
        if len(new):
            codes = np.concatenate([self.codes, new])
            order = np.argsort(codes, kind="stable")
            self.codes, self.rows = codes[order], np.concatenate([self.rows, self.engine.shifts(new)])[order]

    def keep(self, codes: np.ndarray) -> None:
        """Drop held rows that are not in ``codes``."""
        if self.engine.holds_all_shifts:
            return
        mask = np.isin(self.codes, codes)
        self.codes, self.rows = self.codes[mask], self.rows[mask]

    def take(self, codes: np.ndarray) -> np.ndarray:
        if self.engine.holds_all_shifts:
            return self.engine.shifts(codes)
        self.prefetch(codes)
        return self.rows[np.searchsorted(self.codes, codes)]


class _Accumulator:
    """Running max δ_i(ε), Σ log(1 − δ_i(ε)) and at-risk counts over the evaluated individuals."""

    def __init__(self, m: int, kernel: str, E: int):
        self.kernel = kernel
        self.first = np.zeros(m)  # δ_i at the smallest ε
        # summed in extended precision: the total does not depend (in practice, to the last bit) on
        # how the individuals are split into blocks, e.g. with or without screening
        self.max_delta, self.log_survive = np.zeros(E), np.zeros(E, dtype=np.longdouble)
        self.at_risk = np.zeros(E, dtype=np.int64)

    def add(self, codes: np.ndarray, d: np.ndarray) -> None:
        """Add the δ_i of ``codes`` (NaN: positive, not computed; see :meth:`needed`)."""
        if self.kernel == "gaussian":  # below the stated tolerance: reported as 0 (the caller's array kept)
            d = np.where(d <= risk.EPS_TOLERANCE, 0.0, d)
        if not len(codes):
            return
        skipped = np.isnan(d)
        known = np.where(skipped, 0.0, d)
        self.max_delta = np.maximum(self.max_delta, known.max(axis=0))
        with np.errstate(divide="ignore"):
            self.log_survive += np.log1p(-known).sum(axis=0, dtype=np.longdouble)
        self.at_risk += ((d > 0) | skipped).sum(axis=0)
        self.first[codes] = d[:, 0]

    def needed(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The ε at which every δ_i of the next blocks is still needed, and the caps at the others
        (``only`` and ``cap`` of :func:`empdp.risk.evaluate`; None: every δ_i is needed).

        Once Σ log(1 − δ_i(ε)) ≤ :data:`SATURATED`, the total risk δ*(ε) is 1.0 in float64 whatever
        the other δ_i are; then only δ_i above the largest so far can change the summary, and
        δ_i(ε) ≤ δ_i(ε_min) shows which cannot. δ_i at the smallest ε are always computed (they
        are reported per individual), and whether δ_i > 0 is known at every ε. Laplace kernels
        only (for Gaussian kernels δ_i > 0 counts from the tolerance, not from sup |L|).
        """
        saturated = self.log_survive <= SATURATED
        saturated[0] = False
        if self.kernel != "laplace" or not saturated.any():
            return None
        return ~saturated, self.max_delta.copy()


@dataclass
class Assessment:
    """Result of :func:`assess`.

    Attributes
    ----------
    epsilons : ndarray (E,)
        The ε values assessed, ascending.
    delta, total_risk : ndarray (E,)
        Worst-case δ(ε) = max_i δ_i(ε) and total risk δ*(ε) = 1 − Π(1 − δ_i(ε)).
    n_at_risk : ndarray (E,)
        Individuals with δ_i(ε) > 0 (sole contributors included).
    eps_all : float
        max_i ε_i over individuals whose leave-one-out is defined: every such
        individual is protected (δ_i = 0) from here on (Gaussian kernels: δ_i ≤
        ``eps_tolerance`` from here on; nobody is "protected" exactly). Sole contributors can
        never be protected (ε_i = ∞) and are counted in ``sole_contributors``.
    individuals : polars.DataFrame
        One row per individual: the id column, ``eps_i`` (exact for every
        individual with ``exact_all`` or without screening; otherwise for those
        the ε_all search evaluated, else null), ``eps_bound`` (M_i-based upper bound on ε_i),
        ``delta`` (δ_i at the smallest ε), ``n_databases``, ``max_abs_shift``,
        ``sole_contributor``.
    """

    source: str
    query: str
    id_column: str
    by_column: str
    labels: list
    q: np.ndarray
    model: DensityModel
    epsilons: np.ndarray
    delta: np.ndarray
    total_risk: np.ndarray
    n_at_risk: np.ndarray
    eps_all: float
    individuals: pl.DataFrame
    independence: dict
    representativeness: dict
    warnings: list
    sole_contributors: int
    n_evaluated: int
    screening: bool
    engine: LooEngine | None = field(default=None, repr=False)
    #: with an adversary: the JSON ``adversary`` object, and the buckets (:mod:`empdp.adversary`)
    adversary: dict | None = None
    buckets: list | None = field(default=None, repr=False)

    @property
    def n_databases(self) -> int:
        return len(self.labels)

    @property
    def n_individuals(self) -> int:
        return self.individuals.height

    @property
    def eps_tolerance(self) -> float:
        """τ in the definition of ε_i: 0 for Laplace kernels (δ_i(ε) = 0 exactly for ε ≥ ε_i); for
        Gaussian kernels ε_i is the smallest ε with δ_i(ε) ≤ τ (their log-ratio is unbounded)."""
        return 0.0 if self.model.kernel == "laplace" else float(risk.EPS_TOLERANCE)

    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest individuals at ``epsilon`` (default: the smallest assessed ε).

        Ranked by exact δ_i(ε), ties by exact ε_i; sole contributors (δ_i = 1, ε_i = ∞) first.
        The individual that sets ε_all is always included (as an extra row when it is not among
        the ``k``). Every row's ``delta`` and ``eps_i`` are exact: they are computed here for the
        rows that need them, in decreasing order of certified upper bounds, until no other
        individual can enter the table. Columns: the id, ``epsilon`` (the ε of ``delta``),
        ``delta``, ``eps_i``, ``n_databases``, ``max_abs_shift``, ``sole_contributor`` and
        ``sets_eps_all``.
        """
        eps = float(self.epsilons[0] if epsilon is None else epsilon)
        if not (math.isfinite(eps) and eps >= 0):
            raise InputError(f"epsilon must be finite and >= 0, got {epsilon!r}")
        codes, delta, eps_i = Ranking(self, eps).top(int(k))
        ind = self.individuals[codes.tolist()] if len(codes) else self.individuals.head(0)
        setter = eps_all_code(self)
        return pl.DataFrame({
            self.id_column: ind[self.id_column],
            "epsilon": np.full(len(codes), eps),
            "delta": delta,
            "eps_i": eps_i,
            "n_databases": ind["n_databases"],
            "max_abs_shift": ind["max_abs_shift"],
            "sole_contributor": ind["sole_contributor"],
            "sets_eps_all": codes == setter,
        })

    def exact_risk(self, codes: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
        """Exact (ε_i, δ_i(eps)) of the individuals at rows ``codes`` (sole contributors: ∞, 1)."""
        codes = np.asarray(codes, dtype=np.int64)
        out_eps, out_delta = np.full(len(codes), np.inf), np.ones(len(codes))
        sole = self.individuals["sole_contributor"].to_numpy()[codes]
        ok = np.flatnonzero(~sole)
        if self.engine is None:  # loaded without its data: unknown
            out_eps[ok], out_delta[ok] = np.nan, np.nan
            return out_eps, out_delta
        if len(ok):
            shifts = self.engine.shifts(codes[ok])
            with threadpool_limits(limits=1, user_api="blas"):  # as in assess: the same bits
                if self.buckets:
                    from .adversary import bucket_risk

                    e, d, _, _ = bucket_risk(self.buckets, shifts, np.array([eps]))
                else:
                    e, d = risk.evaluate(self.model, shifts, np.array([eps]))
            out_eps[ok], out_delta[ok] = e, d[:, 0]
            if self.model.kernel != "laplace":
                out_delta[ok] = np.where(out_delta[ok] <= risk.EPS_TOLERANCE, 0.0, out_delta[ok])
        return out_eps, out_delta

    def shifts_of(self, ids) -> np.ndarray:
        """Dense shift rows Δ_i· (len(ids), n) of the given individuals (for plots)."""
        ids = list(ids)
        col = self.individuals[self.id_column]
        pos = {v: k for k, v in enumerate(col.to_list())}
        missing = [v for v in ids if v not in pos]
        if missing:
            raise InputError(f"unknown individual(s) {missing[:3]}")
        return self.engine.shifts(np.array([pos[v] for v in ids], dtype=np.int64))

    def epsilon_for_total_risk(self, target: float) -> float | None:
        """Smallest assessed ε with δ*(ε) ≤ target (None if no assessed ε reaches it)."""
        ok = np.flatnonzero(self.total_risk <= target)
        return float(self.epsilons[ok[0]]) if len(ok) else None

    def to_dict(self) -> dict:
        """The JSON summary of ``empdp assess --json``."""
        return {
            "source": self.source,
            "query": self.query,
            "id": self.id_column,
            "by": self.by_column,
            "n_databases": self.n_databases,
            "n_individuals": self.n_individuals,
            "kernel": self.model.kernel,
            "bandwidth": float(self.model.scale),
            "bandwidth_sensitivity": float(self.model.sensitivity),
            "density_model": self.model.describe(),
            "eps_all": _num(self.eps_all),
            "sweep": [{"epsilon": float(e), "delta": float(d), "total_risk": float(t), "n_at_risk": int(c)}
                      for e, d, t, c in zip(self.epsilons, self.delta, self.total_risk, self.n_at_risk)],
            "independence": {k: _num(v) for k, v in self.independence.items()},
            "representativeness": self.representativeness,
            "sole_contributors": int(self.sole_contributors),
            "n_evaluated": int(self.n_evaluated),
            "screening": self.screening,
            "eps_tolerance": self.eps_tolerance,
            **({"adversary": self.adversary} if self.adversary else {}),
            "warnings": list(self.warnings),
            "notes": ["total_risk assumes the individuals' risks are independent"]
            + ([f"kernel gaussian: eps_i is the smallest epsilon with delta_i <= eps_tolerance "
                f"({self.eps_tolerance:g}), and delta_i below it is reported as 0; the log-ratio of Gaussian "
                "densities is unbounded, so no epsilon makes delta_i exactly 0"] if self.eps_tolerance else []),
        }


def _num(v):
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def default_epsilons(eps_all: float, count: int = 50) -> np.ndarray:
    """A log-spaced sweep over [ε_all/20, 1.25 ε_all] (it covers ε_all)."""
    if not eps_all > 0 or not math.isfinite(eps_all):
        return np.geomspace(1e-3, 1.0, count)
    return np.geomspace(eps_all / 20, eps_all * 1.25, count)


def assess(source: Any, *, id: str, by: str, query: str | None = None, where: str | None = None,
           sql: str | None = None, epsilon=None, kernel: str = DEFAULT_KERNEL, bandwidth="auto",
           memory_limit: str | None = None, drop_null_ids: bool = False, exact_all: bool = False,
           screening: bool = True, threads: int | None = None, workers: str = "threads",
           adversary: str | None = None, adversary_sql: str | None = None, buckets: int | None = None,
           engine: str = "duckdb", spark_master: str | None = None, spark_remote: str | None = None,
           table: str | None = None, progress: Progress | None = None) -> Assessment:
    """Per-individual empirical privacy risk of releasing a query of repeated databases.

    Parameters
    ----------
    source
        Path (Parquet/CSV/JSON file, glob, hive folder, ``FILE.duckdb::TABLE``)
        or a pandas/polars/Arrow frame or DuckDB relation.
    id, by
        Columns naming the individual and the database.
    query, where, sql
        ``query`` (e.g. ``"mean(x)"``) with an optional SQL ``where`` filter,
        or ``sql`` reading the table ``db``.
    epsilon
        One ε or a list; default: 50 values log-spaced over [ε_all/20, 1.25 ε_all].
    kernel, bandwidth
        Density model; ``bandwidth`` a float fixes one global scale.
    exact_all
        Compute ε_i exactly for every individual (``--out`` does). Otherwise
        ε_i is computed where ε_all needs it, and the other individuals get
        their exact δ_i only, which takes fewer nodes.
    screening
        Skip individuals whose certified bound shows δ_i = 0 (docs/method.md#51-screening-bound).
        Turning it off changes no result, only the time.
    threads
        Threads for DuckDB and for the exact evaluation (default: every core
        this process may use). Results do not depend on it.
    workers
        ``"threads"`` (default) evaluates individuals in ``threads`` threads;
        ``"processes"`` in as many worker processes, ``"auto"`` in processes for
        stages of at least :data:`PROCESS_ROWS` individuals (about 15% faster
        on two cores; the CLI's default). Worker processes are started with
        'spawn', which imports the calling program's main module again: guard
        its work with ``if __name__ == "__main__":``. Results are the same.
    adversary, adversary_sql, buckets
        What the adversary knows about each database: a named query form
        (e.g. ``"count(*)"``) or SQL over ``db``, computed on the whole table
        (``where`` does not apply). The databases are cut into ``buckets``
        groups by it (default: as many as keep 10 databases each, at most 5)
        and the risk is the largest conditional risk over the buckets (see
        :mod:`empdp.adversary`); the plain assessment is kept beside it.
    engine, spark_master, spark_remote, table
        ``"duckdb"`` (embedded, the default) or ``"spark"``: read, aggregate and
        screen on Spark (``spark_master``, default ``local[*]``, or Spark Connect
        at ``spark_remote``), a catalog ``table`` instead of ``source``, and
        evaluate the candidates on the executors (docs/spark.md).
    """
    progress = progress or _no_progress
    eps = None if epsilon is None else _check_epsilons(epsilon)
    threads = _check_threads(threads)
    if workers not in WORKERS:
        raise InputError(f"--workers must be one of {', '.join(WORKERS)}, got {workers!r}")
    with ExitStack() as stack:
        # blocks of individuals are evaluated side by side, each with single-threaded BLAS (also
        # when threads=1, so that results do not depend on the thread count)
        stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
        if buckets is not None and not (adversary or adversary_sql):
            raise InputError("--buckets cuts the databases by what the adversary knows: give --adversary "
                             "QUERY or --adversary-sql too")
        if adversary and adversary_sql:
            raise InputError("give either --adversary or --adversary-sql, not both")
        if buckets is not None and (isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer))
                                    or buckets < 1):
            raise InputError(f"--buckets must be a whole number >= 1, got {buckets!r}")  # before the long part
        engine = _open(source, id=id, by=by, query=query, where=where, sql=sql, memory_limit=memory_limit,
                       drop_null_ids=drop_null_ids, threads=threads, engine=engine, spark_master=spark_master,
                       spark_remote=spark_remote, table=table)
        plain = _assess(engine, eps=eps, kernel=kernel, bandwidth=bandwidth, exact_all=exact_all,
                        screening=screening, threads=threads, stack=stack, workers=workers, progress=progress)
        if not (adversary or adversary_sql):
            return plain
        knows = _open(source, id=id, by=by, query=adversary, sql=adversary_sql, memory_limit=memory_limit,
                      drop_null_ids=drop_null_ids, threads=threads, engine="spark" if _on_spark(engine) else "duckdb",
                      spark_master=spark_master, spark_remote=spark_remote, table=table)
        return _adversarial(plain, knows, eps=eps, kernel=kernel, bandwidth=bandwidth, buckets=buckets,
                            progress=progress)


def _open(source, **options) -> LooEngine:
    """The leave-one-out engine of ``source``: embedded DuckDB, or Spark (docs/spark.md)."""
    return open_engine(source, **options)


def _on_spark(engine) -> bool:
    spark = sys.modules.get("empdp.spark")
    return spark is not None and isinstance(engine, spark.SparkEngine)


def _adversarial(plain: "Assessment", knows: LooEngine, *, eps, kernel, bandwidth, buckets,
                 progress) -> "Assessment":
    """The assessment conditional on the adversary statistic that ``knows`` computes (one bucket set)."""
    from . import adversary as adv

    statistic = knows.query.describe()
    try:
        g_values = knows.values()
    except InputError as exc:
        raise InputError(f"the adversary statistic {statistic}: {exc}") from None
    g = adv.align_statistic(knows.panel.labels, g_values, plain.labels, statistic)
    knows.close()
    n = len(plain.q)
    k = adv.check_buckets(buckets, n)
    groups, warnings = adv.fit_buckets(plain.q, g, k, kernel=kernel, bandwidth=bandwidth)
    engine = plain.engine
    res = adv.assess_buckets(engine, plain.q, groups, eps, default_epsilons=default_epsilons,
                             fetch_rows=max(1, FETCH_CELLS // n), progress=progress)
    screen, delta = res["screen"], res["delta"]
    with np.errstate(divide="ignore"):
        total = np.maximum(-np.expm1(np.log1p(-np.clip(delta, 0, 1)).sum(axis=0, dtype=np.longdouble)
                                     .astype(np.float64)), 0.0)
    undefined = screen.undefined
    individuals = pl.DataFrame({
        engine.panel.id: screen.ids,
        "eps_i": pl.Series(res["eps_i"], dtype=pl.Float64, nan_to_null=True),
        "eps_bound": np.where(undefined, np.inf, screen.bound),
        "delta": delta[:, 0],
        "n_databases": screen.n_present.astype(np.int64),
        "max_abs_shift": screen.max_abs_shift,
        "sole_contributor": undefined,
    }).with_columns(adv.bucket_column(res["which"], res["eps_i"]))
    return Assessment(
        source=plain.source, query=plain.query, id_column=plain.id_column, by_column=plain.by_column,
        labels=plain.labels, q=plain.q, model=plain.model, epsilons=res["eps"], delta=delta.max(axis=0),
        total_risk=total, n_at_risk=(delta > 0).sum(axis=0), eps_all=res["eps_all"], individuals=individuals,
        independence=plain.independence, representativeness=plain.representativeness,
        warnings=plain.warnings + warnings, sole_contributors=plain.sole_contributors,
        n_evaluated=res["n_evaluated"], screening=plain.screening, engine=engine,
        adversary=adv.summary(groups, plain.labels, statistic, plain), buckets=groups)


def _assess(engine: LooEngine, *, eps, kernel, bandwidth, exact_all, screening, threads, stack, workers,
            progress) -> Assessment:
    """The plain assessment in its named stages: model, screening, ε_all search, δ_i, summary."""
    checks.preload()  # the summary's trend test needs scipy.stats: imported while the table is read
    progress("reading and leave-one-out", 0, 3)
    q = engine.values()
    progress("reading and leave-one-out", 1, 3)
    model = select_density(q, kernel=kernel, bandwidth=bandwidth)
    progress("reading and leave-one-out", 2, 3)
    screen = engine.screen(model.bandwidths)
    progress("reading and leave-one-out", 3, 3)
    if len(screen) == 0:
        raise InputError("no individual has rows the query uses (check --where and NULL values)")
    ev = _Evaluation(engine, model, screen, eps, screening=screening, threads=threads, stack=stack,
                     workers=workers, progress=progress)
    ev.search_eps_all()
    ev.delta_stage(exact_all)
    # the result keeps the engine (for shifts_of), not up to 8 bytes × 10^8 cells
    engine.release_shifts()
    return ev.result(q)


class _Evaluation:
    """The exact evaluation of one assessment: which individuals, in which blocks, and the running summary.

    Blocks depend on the fetch chunk only, never on the thread count, and block k is planned from
    the summary of blocks 0 … k − LAG_BLOCKS − 1 exactly (results are added in order), so the
    results are the same for any thread count, and the threads never wait for a wave.
    """

    def __init__(self, engine: LooEngine, model: DensityModel, screen, eps, *, screening: bool, threads: int,
                 stack: ExitStack, workers: str, progress: Progress):
        self.engine, self.model, self.screen, self.eps = engine, model, screen, eps
        self.screening, self.progress = screening, progress
        m, self.n = len(screen), len(model.points)
        self.undefined = screen.undefined
        self.definable = np.flatnonzero(~self.undefined)
        self.eps_i = np.full(m, np.nan)
        self.eps_i[self.undefined] = np.inf
        self.eps_bound = risk.eps_upper_bound(model, screen.bound, screen.n_present)
        self.eps_bound[self.undefined] = np.inf
        # each evaluation in flight holds its own grid: they share the memory limit, and a grid that
        # cannot fit is refused with the reason (the query values' span in bandwidths) before it is built
        labels = list(engine.panel.labels)
        grid_budget = (_memory_limit(engine) / threads, labels)
        if not _onescale.applies(model):  # the one-scale model needs no grid
            risk.base_grid(model, budget=grid_budget[0], labels=labels)  # the query values alone: refused early
        self.cache = _ShiftCache(engine, max(1, FETCH_CELLS // self.n))
        self.executors = Executors(stack, threads, workers, model, grid_budget)
        self.evaluated_delta = np.zeros(m, dtype=bool)
        self.exact = np.zeros(m, dtype=bool)  # evaluated exactly (ε_i, δ_i or both), not cleared by bounds
        self.acc = _Accumulator(m, model.kernel, 0 if eps is None else len(eps))
        self.eps_all = 0.0

    # ------------------------------------------------------------------ stages
    def search_eps_all(self) -> None:
        """ε_all: exact ε_i in decreasing order of the bound until the bound falls below the best so far.

        With the ε values known, these individuals get their δ_i in the same evaluation, and the
        first fetch brings the candidates too, so the table is scanned as few times as possible.
        """
        eps_i, eps_bound, definable = self.eps_i, self.eps_bound, self.definable
        order = definable[np.argsort(-eps_bound[definable], kind="stable")]
        exhaustive = not self.screening and self.eps is None  # every exact ε_i, not only those left open
        want = order[:SEARCH_PREFETCH]
        if self.eps is not None:
            want = np.union1d(want, self.candidates(self.eps[0])[:self.cache.capacity])
        if not _on_spark(self.engine):  # Spark keeps the rows on the executors
            self.cache.prefetch(want)
        eps_all, pos, batch = 0.0, 0, SEARCH_BATCH
        falling = -eps_bound[order]  # ascending
        while pos < len(order) and (exhaustive or eps_bound[order[pos]] > eps_all):
            # a batch stops at the last bound above ε_all so far: the rows after it cannot raise ε_all
            # (at 10^6 × 100 the doubling batches went 60% past the ~20,000 rows that can)
            live = len(order) if exhaustive else int(np.searchsorted(falling, -eps_all, side="left"))
            end = min(pos + batch, live)
            todo = order[pos:end]
            # one bar for the whole search: done so far out of the rows that can still raise ε_all
            self.run(todo[np.isnan(eps_i[todo])], self.eps is not None, "eps_all", shown=(pos, live))
            eps_all = max(eps_all, float(np.nanmax(eps_i[order[:end]], initial=0.0)))
            pos, batch = end, batch * 2
        self.eps_all = eps_all
        if self.eps is None:
            self.eps = default_epsilons(eps_all)
            self.acc = _Accumulator(len(eps_i), self.model.kernel, len(self.eps))

    def delta_stage(self, exact_all: bool) -> None:
        """δ_i for the remaining individuals whose δ_i can be positive in the requested range.

        With screening and no ``exact_all``, ε_i is computed only where ε_all needs it: these
        individuals get their exact δ_i only, and those whose certified bounds on the grid show
        ε_i ≤ min ε skip the exact evaluation (δ_i = 0).
        """
        need = self.candidates(self.eps[0])
        if exact_all:
            need = np.union1d(need, self.definable[np.isnan(self.eps_i[self.definable])])
        rest = need[~self.evaluated_delta[need]]
        self.cache.keep(rest)
        self.run(rest, True, "delta_i", release=True, need_eps_i=exact_all or not self.screening)
        if len(self.definable):
            self.eps_all = max(self.eps_all, float(np.nanmax(self.eps_i[self.definable], initial=0.0)))

    def candidates(self, eps_min: float) -> np.ndarray:
        """Individuals whose δ_i can be positive at some ε ≥ eps_min (all of them without screening)."""
        if not self.screening:
            return self.definable
        screen = self.screen
        if self.model.kernel == "laplace":
            need = screen.bound > eps_min
        else:
            need = risk.delta_upper_bound("gaussian", eps_min, screen.bound, screen.n_present,
                                          self.n) > risk.EPS_TOLERANCE
        return np.flatnonzero(need & ~self.undefined)

    # ------------------------------------------------------------ evaluation
    def run(self, codes: np.ndarray, with_delta: bool, stage: str, release: bool = False,
            need_eps_i: bool = True, shown: tuple[int, int] | None = None) -> None:
        """Exact ε_i (and δ_i at ``eps``) for ``codes``: one scan per fetch chunk, one grid per batch.

        With ``need_eps_i=False`` only δ_i is computed (ε_i stays NaN), and only for the
        individuals whose bounds do not certify ε_i ≤ min(eps). ``shown`` = (rows done before,
        rows in the whole stage) when ``codes`` is one batch of a longer stage.
        """
        cache, done = self.cache, 0
        offset, total = shown if shown is not None else (0, len(codes))
        total = max(total, offset + len(codes))
        self.progress(stage, offset, total)
        if _on_spark(self.engine):  # the candidates are evaluated where their rows are: on the executors
            from .spark import evaluate_on_executors

            for a in range(0, len(codes), cache.capacity):
                chunk = codes[a:a + cache.capacity]
                result = evaluate_on_executors(self.engine, self.model, chunk, self.eps if with_delta else None,
                                               need_eps_i=need_eps_i, return_exact=True)
                done = self._add(chunk, result, with_delta, stage, done, offset, total)
            return
        for a in range(0, len(codes), cache.capacity):
            chunk = codes[a:a + cache.capacity]
            cache.prefetch(chunk)
            size = min(EVAL_ROWS, max(MIN_EVAL_ROWS, -(-len(chunk) // 4)))
            blocks = [chunk[b:b + size] for b in range(0, len(chunk), size)]
            pending = deque()  # (index, block, future or result), in order
            for k, block in enumerate(blocks):
                while pending and pending[0][0] < k - LAG_BLOCKS:
                    _, b, res = pending.popleft()
                    done = self._add(b, res.result(), with_delta, stage, done, offset, total)
                needed = self.acc.needed() if with_delta else None  # the δ_i this block needs
                # the cache is only read while blocks are evaluated
                pending.append((k, block, self._submit(len(codes), block, with_delta, need_eps_i, needed)))
            for _, b, res in pending:
                done = self._add(b, res.result(), with_delta, stage, done, offset, total)
            if release:
                cache.keep(codes[a + cache.capacity:])

    def _submit(self, rows: int, block: np.ndarray, with_delta: bool, need_eps_i: bool, needed):
        only, cap = needed or (None, None)
        return self.executors.submit(rows, lambda: self.cache.take(block), self.eps if with_delta else None,
                                     need_eps_i, only, cap)

    def _add(self, block: np.ndarray, result, with_delta: bool, stage: str, done: int, offset: int,
             total: int) -> int:
        e_i, d, ex = result
        # a δ-only evaluation (NaN ε_i) keeps the exact ε_i the ε_all search found
        self.eps_i[block] = np.where(np.isnan(e_i), self.eps_i[block], e_i)
        self.exact[block] |= ex
        if with_delta:
            self.acc.add(block, d)
            self.evaluated_delta[block] = True
        done += len(block)
        self.progress(stage, offset + done, total)
        return done

    # ---------------------------------------------------------------- summary
    def result(self, q: np.ndarray) -> Assessment:
        """The :class:`Assessment`: sweep summary, checks, warnings and the per-individual table."""
        engine, screen, undefined, acc = self.engine, self.screen, self.undefined, self.acc
        max_delta, log_survive, at_risk = acc.max_delta.copy(), acc.log_survive.copy(), acc.at_risk.copy()
        delta_first = acc.first.copy()
        sole = int(undefined.sum())
        if sole:
            max_delta[:] = 1.0
            log_survive[:] = -np.inf
            at_risk += sole
            delta_first[undefined] = 1.0
        total = np.maximum(-np.expm1(log_survive.astype(np.float64)), 0.0)
        indep, warn1 = checks.independence(q)
        rep, warn2 = checks.representativeness(screen.n_present, self.n)
        warnings = warn1 + warn2
        if sole:
            warnings.insert(0, f"{sole} individual(s) are the only contributor to some database: removing them "
                               f"leaves the query undefined, so their presence alone is revealed (delta_i = 1, "
                               f"eps_i = inf); no epsilon protects them")
        if engine.panel.n_null_ids:
            warnings.append(f"dropped {engine.panel.n_null_ids} rows with a NULL id")
        null_values = getattr(engine, "null_values_warning", None)  # a property of the engine
        if null_values:
            warnings.append(null_values)
        individuals = pl.DataFrame({
            engine.panel.id: screen.ids,
            "eps_i": pl.Series(self.eps_i, dtype=pl.Float64, nan_to_null=True),
            "eps_bound": self.eps_bound,
            "delta": delta_first,
            "n_databases": screen.n_present.astype(np.int64),
            "max_abs_shift": screen.max_abs_shift,
            "sole_contributor": undefined,
        })
        return Assessment(
            source=engine.panel.description, query=engine.query.describe(), id_column=engine.panel.id,
            by_column=engine.panel.by, labels=list(engine.panel.labels), q=q, model=self.model,
            epsilons=self.eps, delta=max_delta, total_risk=total, n_at_risk=at_risk, eps_all=self.eps_all,
            individuals=individuals, independence=indep, representativeness=rep, warnings=warnings,
            sole_contributors=sole, n_evaluated=int((self.exact & ~undefined).sum()), screening=self.screening,
            engine=engine)
