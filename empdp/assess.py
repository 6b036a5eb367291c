"""``empdp assess``: per-individual empirical privacy risk (SPEC 1–4).

Data flow: source → :mod:`empdp.loo` (query values and shifts) →
:mod:`empdp.density` (the curator's model, fitted once) → screening bounds
M_i → :mod:`empdp.risk` (exact δ_i and ε_i for the individuals that need them).
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

from . import checks, risk
from .density import DEFAULT_KERNEL, DensityModel, select_density
from .errors import InputError
from .loo import LooEngine, _memory_limit_bytes, make_engine

Progress = Callable[[str, int, int], None]
#: (bytes one evaluation's grid may take, the databases' names) for risk.base_grid
GridBudget = tuple[float, list]
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
#: individuals of one evaluation stage from which ``workers="auto"`` evaluates in processes
PROCESS_ROWS = 100_000
WORKERS = ("threads", "processes", "auto")


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _check_threads(threads) -> int:
    if threads is None:
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise InputError(f"--threads must be a whole number >= 1, got {threads!r}")
    return int(threads)


def _evaluate_block(model: DensityModel, shifts: np.ndarray, eps, need_eps_i: bool, only, cap,
                    grid_budget: GridBudget | None = None):
    """Exact ε_i, δ_i and the exact-evaluation flags of one block of shift rows, on its own grid
    (refused, InputError, when it would not fit in ``grid_budget``)."""
    budget, labels = grid_budget or (None, None)
    grid = risk.base_grid(model, model.points[None, :] - shifts, budget=budget, labels=labels)
    return risk.evaluate(model, shifts, eps, grid=grid, plan=risk.grid_plan(model, grid), need_eps_i=need_eps_i,
                         return_exact=True, only=only, cap=cap)


_WORKER: dict = {}


def _start_worker(model: DensityModel, grid_budget: GridBudget | None = None) -> None:
    """Worker process set-up: the density model, and single-threaded BLAS (as in the threads)."""
    _WORKER["model"] = model
    _WORKER["grid_budget"] = grid_budget
    _WORKER["blas"] = threadpool_limits(limits=1, user_api="blas")


def _evaluate_in_worker(shifts: np.ndarray, eps, need_eps_i: bool, only, cap):
    return _evaluate_block(_WORKER["model"], shifts, eps, need_eps_i, only, cap, _WORKER.get("grid_budget"))


class _Done:
    """A result computed in the calling thread, read like a future's."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _Executors:
    """Where blocks are evaluated: in the calling thread, a thread pool, or worker processes.

    Threads share the GIL: on two cores they reach about 1.6× one thread on the exact
    evaluation (many numpy calls on a few hundred rows each), processes about 1.8×. Worker
    processes are started (with 'spawn': safe whatever threads DuckDB runs) on the first stage
    that has at least :data:`PROCESS_ROWS` individuals and kept until the assessment ends.
    """

    def __init__(self, stack: ExitStack, threads: int, workers: str, model: DensityModel,
                 grid_budget: GridBudget | None = None):
        self.stack, self.threads, self.workers, self.model = stack, threads, workers, model
        self.grid_budget = grid_budget
        self.pool = None
        if threads > 1:
            self.pool = stack.enter_context(ThreadPoolExecutor(threads, thread_name_prefix="empdp-eval"))
        self.procs = None

    def uses_processes(self, rows: int) -> bool:
        if self.threads < 2 or self.workers == "threads":
            return False
        return self.workers == "processes" or rows >= PROCESS_ROWS

    def submit(self, rows: int, take: Callable[[], np.ndarray], eps, need_eps_i: bool, only, cap):
        """Evaluate the block whose shift rows ``take()`` returns (a stage of ``rows`` individuals)."""
        if self.uses_processes(rows):
            if self.procs is None:
                ctx = multiprocessing.get_context("spawn")
                self.procs = self.stack.enter_context(ProcessPoolExecutor(
                    self.threads, mp_context=ctx, initializer=_start_worker,
                    initargs=(self.model, self.grid_budget)))
            return self.procs.submit(_evaluate_in_worker, take(), eps, need_eps_i, only, cap)
        budget = self.grid_budget
        if self.pool is not None:  # the rows are read in the thread that evaluates them
            return self.pool.submit(lambda: _evaluate_block(self.model, take(), eps, need_eps_i, only, cap, budget))
        return _Done(_evaluate_block(self.model, take(), eps, need_eps_i, only, cap, budget))


def _memory_limit(engine: LooEngine) -> int:
    """The memory limit in bytes: ``--memory-limit``, else its default (DuckDB's setting holds either)."""
    try:
        limit = _memory_limit_bytes(engine.panel.con)
    except Exception:  # noqa: BLE001 - an engine without a DuckDB connection: the default
        limit = 0
    return limit or DEFAULT_MEMORY_LIMIT


def _check_epsilons(epsilon) -> np.ndarray:
    eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
    if not len(eps) or np.any(~np.isfinite(eps)) or np.any(eps < 0):
        raise InputError("--epsilon values must be finite and >= 0")
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
        if self.kernel == "gaussian":
            d[d <= risk.GAUSSIAN_TOL] = 0.0  # below the stated tolerance: reported as 0
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
        individual is protected (δ_i = 0) from here on. Sole contributors can
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
        return 0.0 if self.model.kernel == "laplace" else float(risk.GAUSSIAN_TOL)

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
        codes, delta, eps_i = _Ranking(self, eps).top(int(k))
        ind = self.individuals[codes.tolist()] if len(codes) else self.individuals.head(0)
        setter = _eps_all_code(self)
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
                out_delta[ok] = np.where(out_delta[ok] <= risk.GAUSSIAN_TOL, 0.0, out_delta[ok])
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
           progress: Progress | None = None) -> Assessment:
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
        Skip individuals whose certified bound shows δ_i = 0 (SPEC 4.3).
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
        engine = make_engine(source, id=id, by=by, query=query, where=where, sql=sql,
                             memory_limit=memory_limit, drop_null_ids=drop_null_ids, threads=threads)
        plain = _assess(engine, eps=eps, kernel=kernel, bandwidth=bandwidth, exact_all=exact_all,
                        screening=screening, threads=threads, stack=stack, workers=workers, progress=progress)
        if not (adversary or adversary_sql):
            return plain
        knows = make_engine(source, id=id, by=by, query=adversary, sql=adversary_sql, memory_limit=memory_limit,
                            drop_null_ids=drop_null_ids, threads=threads)
        return _adversarial(plain, knows, eps=eps, kernel=kernel, bandwidth=bandwidth, buckets=buckets,
                            progress=progress)


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
    progress("reading and leave-one-out", 0, 3)
    q = engine.values()
    progress("reading and leave-one-out", 1, 3)
    model = select_density(q, kernel=kernel, bandwidth=bandwidth)
    progress("reading and leave-one-out", 2, 3)
    screen = engine.screen(model.bandwidths)
    progress("reading and leave-one-out", 3, 3)
    m, n = len(screen), len(q)
    if m == 0:
        raise InputError("no individual has rows the query uses (check --where and NULL values)")
    undefined = screen.undefined
    definable = np.flatnonzero(~undefined)
    eps_i = np.full(m, np.nan)
    eps_i[undefined] = np.inf
    eps_bound = risk.eps_upper_bound(model, screen.bound)
    eps_bound[undefined] = np.inf

    # each evaluation in flight holds its own grid: they share the memory limit, and a grid that
    # cannot fit is refused with the reason (the query values' span in bandwidths) before it is built
    labels = list(engine.panel.labels)
    grid_budget = (_memory_limit(engine) / threads, labels)
    risk.base_grid(model, budget=grid_budget[0], labels=labels)  # the query values alone: refused early
    cache = _ShiftCache(engine, max(1, FETCH_CELLS // n))
    executors = _Executors(stack, threads, workers, model, grid_budget)
    evaluated_delta = np.zeros(m, dtype=bool)
    exact = np.zeros(m, dtype=bool)  # evaluated exactly (ε_i, δ_i or both), not cleared by bounds
    acc = _Accumulator(m, model.kernel, 0 if eps is None else len(eps))

    def run(codes: np.ndarray, with_delta: bool, stage: str, release: bool = False,
            need_eps_i: bool = True) -> None:
        """Exact ε_i (and δ_i at ``eps``) for ``codes``: one scan per fetch chunk, one grid per batch.

        With ``need_eps_i=False`` only δ_i is computed (ε_i stays NaN), and only for the
        individuals whose bounds do not certify ε_i ≤ min(eps).
        """
        done = 0
        for a in range(0, len(codes), cache.capacity):
            chunk = codes[a:a + cache.capacity]
            cache.prefetch(chunk)

            def one(block, needed):
                only, cap = needed or (None, None)
                return executors.submit(len(codes), lambda: cache.take(block), eps if with_delta else None,
                                        need_eps_i, only, cap)

            def add(block, result):
                nonlocal done
                e_i, d, ex = result
                # a δ-only evaluation (NaN ε_i) keeps the exact ε_i the ε_all search found
                eps_i[block] = np.where(np.isnan(e_i), eps_i[block], e_i)
                exact[block] |= ex
                if with_delta:
                    acc.add(block, d)
                    evaluated_delta[block] = True
                done += len(block)
                progress(stage, done, len(codes))

            # blocks depend on the chunk only, never on ``threads``; block k is planned from the
            # summary of blocks 0 … k − LAG_BLOCKS − 1 exactly (results are added in order), so
            # the results are the same for any thread count, and the threads never wait for a wave
            size = min(EVAL_ROWS, max(MIN_EVAL_ROWS, -(-len(chunk) // 4)))
            blocks = [chunk[b:b + size] for b in range(0, len(chunk), size)]
            pending = deque()  # (index, block, future or result), in order
            for k, block in enumerate(blocks):
                while pending and pending[0][0] < k - LAG_BLOCKS:
                    _, b, res = pending.popleft()
                    add(b, res.result())
                needed = acc.needed() if with_delta else None  # the δ_i this block needs
                # the cache is only read while blocks are evaluated
                pending.append((k, block, one(block, needed)))
            for _, b, res in pending:
                add(b, res.result())
            if release:
                cache.keep(codes[a + cache.capacity:])

    def candidates(eps_min: float) -> np.ndarray:
        """Individuals whose δ_i can be positive at some ε ≥ eps_min (all of them without screening)."""
        if not screening:
            return definable
        if model.kernel == "laplace":
            need = screen.bound > eps_min
        else:
            need = risk.delta_upper_bound("gaussian", eps_min, screen.bound, screen.n_present, n) > risk.GAUSSIAN_TOL
        return np.flatnonzero(need & ~undefined)

    # ε_all: exact ε_i in decreasing order of the bound until the bound falls below the best so far.
    # With the ε values known, these individuals get their δ_i in the same evaluation, and the
    # first fetch brings the candidates too, so the table is scanned as few times as possible.
    order = definable[np.argsort(-eps_bound[definable], kind="stable")]
    exhaustive = not screening and eps is None  # every exact ε_i, not only those the bound leaves open
    want = order[:SEARCH_PREFETCH]
    if eps is not None:
        want = np.union1d(want, candidates(eps[0])[:cache.capacity])
    cache.prefetch(want)
    eps_all, pos, batch = 0.0, 0, SEARCH_BATCH
    falling = -eps_bound[order]  # ascending
    while pos < len(order) and (exhaustive or eps_bound[order[pos]] > eps_all):
        # a batch stops at the last bound above ε_all so far: the rows after it cannot raise ε_all
        # (at 10^6 × 100 the doubling batches went 60% past the ~20,000 rows that can)
        live = len(order) if exhaustive else int(np.searchsorted(falling, -eps_all, side="left"))
        end = min(pos + batch, live)
        todo = order[pos:end]
        run(todo[np.isnan(eps_i[todo])], eps is not None, "eps_all")
        eps_all = max(eps_all, float(np.nanmax(eps_i[order[:end]], initial=0.0)))
        pos, batch = end, batch * 2
    if eps is None:
        eps = default_epsilons(eps_all)
        acc = _Accumulator(m, model.kernel, len(eps))
    E = len(eps)

    # δ_i for the remaining individuals whose δ_i can be positive in the requested range
    need = candidates(eps[0])
    if exact_all:
        need = np.union1d(need, definable[np.isnan(eps_i[definable])])
    rest = need[~evaluated_delta[need]]
    cache.keep(rest)
    # with screening and no --out, ε_i is computed only where it is needed (ε_all above): these
    # individuals get their exact δ_i only, and those whose certified bounds on the grid show
    # ε_i ≤ min ε skip the exact evaluation (δ_i = 0)
    run(rest, True, "delta_i", release=True, need_eps_i=exact_all or not screening)
    # the result keeps the engine (for shifts_of), not up to 8 bytes × 10^8 cells
    engine.release_shifts()
    if len(definable):
        eps_all = max(eps_all, float(np.nanmax(eps_i[definable], initial=0.0)))
    max_delta, log_survive, at_risk, delta_first = acc.max_delta, acc.log_survive, acc.at_risk, acc.first
    sole = int(undefined.sum())
    if sole:
        max_delta[:] = 1.0
        log_survive[:] = -np.inf
        at_risk += sole
        delta_first[undefined] = 1.0
    total = np.maximum(-np.expm1(log_survive.astype(np.float64)), 0.0)

    indep, warn1 = checks.independence(q)
    rep, warn2 = checks.representativeness(screen.n_present, n)
    warnings = warn1 + warn2
    if sole:
        warnings.insert(0, f"{sole} individual(s) are the only contributor to some database: removing them "
                           f"leaves the query undefined, so their presence alone is revealed (delta_i = 1, "
                           f"eps_i = inf); no epsilon protects them")
    if engine.panel.n_null_ids:
        warnings.append(f"dropped {engine.panel.n_null_ids} rows with a NULL id")
    individuals = pl.DataFrame({
        engine.panel.id: screen.ids,
        "eps_i": pl.Series(eps_i, dtype=pl.Float64, nan_to_null=True),
        "eps_bound": eps_bound,
        "delta": delta_first,
        "n_databases": screen.n_present.astype(np.int64),
        "max_abs_shift": screen.max_abs_shift,
        "sole_contributor": undefined,
    })
    n_evaluated = int((exact & ~undefined).sum())
    return Assessment(
        source=engine.panel.description, query=engine.query.describe(), id_column=engine.panel.id,
        by_column=engine.panel.by, labels=list(engine.panel.labels), q=q, model=model, epsilons=eps,
        delta=max_delta, total_risk=total, n_at_risk=at_risk, eps_all=eps_all, individuals=individuals,
        independence=indep, representativeness=rep, warnings=warnings, sole_contributors=sole,
        n_evaluated=n_evaluated, screening=screening, engine=engine)


def _eps_all_code(a) -> int:
    """Row of the individual whose exact ε_i is ε_all (-1 when every ε_i is 0 or unknown)."""
    e = a.individuals["eps_i"].fill_null(np.nan).to_numpy().astype(float)
    e = np.where(a.individuals["sole_contributor"].to_numpy(), np.nan, e)
    if not np.isfinite(e).any() or np.nanmax(e) <= 0:
        return -1
    return int(np.nanargmax(e))


class _Ranking:
    """Branch and bound for :meth:`Assessment.riskiest`: exact values only where a row can rank.

    Upper bounds: δ_i(ε) ≤ δ_i(ε_min) for ε ≥ ε_min (δ_i decreases in ε; δ_i(ε_min) is exact for
    every individual) and the screening bound ``risk.delta_upper_bound``; ε_i ≤ ``eps_bound``.
    """

    BATCH = 256

    def __init__(self, a, eps: float):
        self.a, self.eps = a, eps
        ind = a.individuals
        self.sole = ind["sole_contributor"].to_numpy()
        self.bound = ind["eps_bound"].to_numpy().astype(float)
        known_eps = ind["eps_i"].fill_null(np.nan).to_numpy().astype(float)
        self.eps_i = known_eps.copy()
        self.delta = np.full(len(self.sole), np.nan)
        first = ind["delta"].to_numpy().astype(float)
        e0 = float(a.epsilons[0])
        n_present = ind["n_databases"].to_numpy()
        if a.buckets:  # each bucket's bound (n_iB/n_B) δ_kernel(ε; M_iB) is at most δ_kernel(ε; M_i)
            upper = risk.term_delta(a.model.kernel, eps, self.bound)
        else:
            upper = risk.delta_upper_bound(a.model.kernel, eps, self.bound, n_present, a.n_databases)
        if math.isclose(eps, e0, rel_tol=1e-12, abs_tol=0.0):
            self.delta[:] = first  # exact for every individual
            upper = first
        elif eps > e0:
            upper = np.minimum(upper, first)
        if a.model.kernel == "laplace":
            upper = np.where(self.bound <= eps, 0.0, upper)
        upper = np.where(self.sole, 1.0, upper)
        self.upper = upper
        self.delta[self.sole] = 1.0
        self.eps_i[self.sole] = np.inf

    def _evaluate(self, codes: np.ndarray) -> None:
        todo = codes[np.isnan(self.delta[codes]) | np.isnan(self.eps_i[codes])]
        if len(todo):
            self.eps_i[todo], self.delta[todo] = self.a.exact_risk(todo, self.eps)

    def top(self, k: int):
        m = len(self.sole)
        k = max(0, min(k, m))
        chosen = np.empty(0, dtype=np.int64)
        if k:
            # 1. by δ_i(ε): rows in decreasing order of their bound until the k-th exact δ beats the next bound
            order = np.argsort(-self.upper, kind="stable")
            pos = 0
            while pos < m:
                kth = np.sort(np.nan_to_num(self.delta[order[:pos]], nan=0.0))[::-1]
                kth = kth[k - 1] if len(kth) >= k else 0.0
                if self.upper[order[pos]] <= 0 or (len(order[:pos]) >= k and self.upper[order[pos]] < kth):
                    break
                end = min(m, pos + max(self.BATCH, k))
                self._evaluate(order[pos:end])
                pos = end
            looked = order[:pos]
            positive = looked[self.delta[looked] > 0]
            chosen = positive
            if len(chosen) < k:
                # 2. the rest at δ_i(ε) = 0, by exact ε_i: decreasing bounds until the next cannot enter
                rest = np.setdiff1d(np.arange(m), chosen)
                rest = rest[np.argsort(-self.bound[rest], kind="stable")]
                need, pos = k - len(chosen), 0
                while pos < len(rest):
                    seen = np.sort(np.nan_to_num(self.eps_i[rest[:pos]], nan=-1.0))[::-1]
                    if pos >= need and self.bound[rest[pos]] < seen[need - 1]:
                        break
                    end = min(len(rest), pos + max(self.BATCH, need))
                    self._evaluate(rest[pos:end])
                    pos = end
                chosen = np.concatenate([chosen, rest[:pos]])
            self._evaluate(chosen)
            rank = np.lexsort((-self.eps_i[chosen], -self.delta[chosen]))
            chosen = chosen[rank][:k]
        setter = _eps_all_code(self.a)
        if setter >= 0 and setter not in chosen:
            self._evaluate(np.array([setter]))
            chosen = np.append(chosen, setter)
        return chosen, self.delta[chosen], self.eps_i[chosen]
