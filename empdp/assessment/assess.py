"""``empdp assess``: per-individual empirical privacy risk (docs/method.md#1-data-model).

Data flow: source → :mod:`empdp.loo` (query values and shifts) →
:mod:`empdp.density` (the curator's model, fitted once) → screening bounds
M_i → :mod:`empdp.risk` (exact δ_i and ε_i for the individuals that need them).
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

from .. import params, risk
from ..density import DensityModel, select_density
from ..engines import engine_of
from ..errors import InputError
from ..io import jsonable
from ..loo import LooEngine
from ..models import GROUPED, JOINT, ONE, given, model_for, statistics
from ..params import available_cores
from ..progress import READING, no_progress
from ..risk.buckets import bucket_risk
from ..settings import Data, Execution, Intervals, Model, Precision
from . import adversary as adversary_model
from . import checks
from .adversary import read_statistic
from .evaluation import Evaluation, default_epsilons, fetch_rows
from .groups import assess_grouped
from .joint import assess_joint
from .ranking import Ranking, eps_all_code
from .sweep import RiskSweep

if TYPE_CHECKING:
    from .uncertainty import Uncertainty


@dataclass(kw_only=True)
class Assessment(RiskSweep):
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
        individual with ``exact_all`` or without screening; otherwise where the
        ε_all search needed it, and with the default one-scale Laplace model for
        every individual whose δ_i was computed; else null: with Gaussian kernels
        and the default sweep, the search gives ε_i(τ) only to individuals that can
        raise ε_all; :meth:`riskiest` computes it for its rows), ``eps_bound``
        (M_i-based upper bound on ε_i),
        ``delta`` (δ_i at the smallest ε), ``n_databases``, ``max_abs_shift``,
        ``sole_contributor``.
    """

    query: str
    model: DensityModel
    independence: dict
    representativeness: dict
    warnings: list
    n_evaluated: int
    screening: bool
    engine: LooEngine | None = field(default=None, repr=False)
    #: with an adversary: the JSON ``adversary`` object, and the buckets (:mod:`empdp.assessment.adversary`)
    adversary: dict | None = None
    buckets: list | None = field(default=None, repr=False)
    #: the intervals of :meth:`estimate_uncertainty` (:class:`empdp.assessment.uncertainty.Uncertainty`)
    uncertainty: Any = field(default=None, repr=False)

    kind = ONE

    @property
    def n_individuals(self) -> int:
        return self.individuals.height

    @property
    def statistic(self) -> str:
        return self.query

    def close(self) -> None:
        """Close the leave-one-out engine the result keeps (for exact values on demand); the values stay."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def log_lines(self) -> list[str]:
        m = self.model
        return [*super().log_lines(),
                f"density model: {m.kernel} kernel, scale {m.scale:.6g}, {'variable' if m.variable else 'fixed'} "
                f"bandwidths (sensitivity {m.sensitivity:g}), {m.selected_by} among {len(m.candidates)} "
                f"candidate(s), LOO log-likelihood {m.loglik:.6g}",
                f"eps_all {self.eps_all:.6g}; {self.n_evaluated} individual(s) evaluated exactly (screening "
                f"{'on' if self.screening else 'off'})"]

    def debug_lines(self) -> list[str]:
        m = self.model
        best = sorted(m.candidates, key=lambda c: -c["loglik"])[:5]
        return ["best candidates: " + "; ".join(f"{c['kernel']} b={c['scale']:.4g} a={c['sensitivity']:g} "
                                                f"loglik={c['loglik']:.4g}" for c in best),
                f"bandwidths b_j in [{m.bandwidths.min():.4g}, {m.bandwidths.max():.4g}]; query values in "
                f"[{self.q.min():.4g}, {self.q.max():.4g}]",
                f"independence: {self.independence}; representativeness: "
                f"{ {k: v for k, v in self.representativeness.items() if k != 'histogram'} }"]

    @property
    def eps_tolerance(self) -> float:
        """τ in the definition of ε_i: 0 for Laplace kernels (δ_i(ε) = 0 exactly for ε ≥ ε_i); for
        Gaussian kernels ε_i is the smallest ε with δ_i(ε) ≤ τ (their log-ratio is unbounded)."""
        return float(self.model.kernel.tolerance)

    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest individuals at ``epsilon`` (default: the smallest assessed ε).

        Ranked by exact δ_i(ε), ties by exact ε_i; sole contributors (δ_i = 1, ε_i = ∞) first.
        The individual that sets ε_all is always included (as an extra row when it is not among
        the ``k``). Every row's ``delta`` and ``eps_i`` are exact: they are computed here for the
        rows that need them, in decreasing order of certified upper bounds, until no other
        individual can enter the table. Columns: the id, ``epsilon`` (the ε of ``delta``),
        ``delta``, ``eps_i``, ``n_databases``, ``max_abs_shift``, ``sole_contributor`` and
        ``sets_eps_all``; against an adversary also ``bucket``, the bucket whose model sets ε_i.
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
            **({"bucket": ind["bucket"]} if "bucket" in ind.columns else {}),
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
                    e, d, _, _ = bucket_risk(self.buckets, shifts, np.array([eps]))
                else:
                    e, d = risk.evaluate(self.model, shifts, np.array([eps]))
            out_eps[ok], out_delta[ok] = e, self.model.kernel.reported_delta(d[:, 0])
        return out_eps, out_delta

    def estimate_uncertainty(self, replicates: int = 200, level: float = 0.9, rng=None, *,
                             rows: int | str = 10, threads: int = 1) -> "Uncertainty":
        """Intervals for ε_all and, at each swept ε, for δ, δ* and the at-risk count, at ``level`` from
        ``replicates`` subsamples of the databases (docs/method.md#71-uncertainty-of-the-estimates); kept
        as :attr:`uncertainty` (the JSON's ``uncertainty``).

        Each of the ``rows`` riskiest individuals (:meth:`riskiest`), or with ``rows="all"`` every
        individual whose ε_i is known (one exact evaluation per individual and replicate: B times the
        ε_i stage's cost), gets ``eps_i_lo`` and ``eps_i_hi`` in :attr:`individuals` (null elsewhere).
        The interval covers the variation of the estimates over other sets of databases from the same
        process, not the density model's own assumptions. ``threads`` evaluate replicates side by side
        (the same bits at any count). Called after :func:`assess` returned, the engine reads the shift
        rows it needs again; ``assess(..., intervals=Intervals(...))`` computes them while they are held.
        """
        from .uncertainty import from_assessment, individual_intervals

        Intervals(replicates, level, rng, rows)  # checked as the settings object checks them
        if self.engine is not None and self.engine.on_executors:
            raise InputError("the intervals are not estimated on the Spark engine yet: assess on DuckDB",
                             param=("uncertainty", "engine"))
        unc = from_assessment(self, replicates=int(replicates), level=float(level), rng=rng, threads=threads)
        ind = self.individuals
        eps_i = ind["eps_i"].fill_null(np.nan).to_numpy()
        if rows == "all":
            codes = np.flatnonzero(np.isfinite(eps_i) & ~ind["sole_contributor"].to_numpy())
        else:
            top = self.riskiest(int(rows))[self.id_column].to_list()
            position = {v: k for k, v in enumerate(ind[self.id_column].to_list())}
            codes = np.array(sorted(position[v] for v in top), dtype=np.int64)
            eps_i = self.individuals["eps_i"].fill_null(np.nan).to_numpy()  # riskiest() fills its rows in
            codes = codes[np.isfinite(eps_i[codes])]
        lo, hi = np.full(len(ind), np.nan), np.full(len(ind), np.nan)
        if len(codes):
            lo[codes], hi[codes] = individual_intervals(unc, self.engine.shifts(codes), eps_i[codes])
        self.individuals = self.individuals.with_columns(pl.Series("eps_i_lo", lo, nan_to_null=True),
                                                         pl.Series("eps_i_hi", hi, nan_to_null=True))
        self.uncertainty = unc
        return unc

    def shifts_of(self, ids) -> np.ndarray:
        """Dense shift rows Δ_i· (len(ids), n) of the given individuals (for plots)."""
        ids = list(ids)
        col = self.individuals[self.id_column]
        pos = {v: k for k, v in enumerate(col.to_list())}
        missing = [v for v in ids if v not in pos]
        if missing:
            raise InputError(f"unknown individual(s) {missing[:3]}")
        return self.engine.shifts(np.array([pos[v] for v in ids], dtype=np.int64))

    def to_dict(self) -> dict:
        """The JSON summary of ``empdp assess --json``."""
        return {
            "source": self.source,
            "query": self.query,
            "id": self.id_column,
            "by": self.by_column,
            "n_databases": self.n_databases,
            "n_individuals": self.n_individuals,
            "kernel": self.model.kernel.name,
            "bandwidth": float(self.model.scale),
            "bandwidth_sensitivity": float(self.model.sensitivity),
            "density_model": self.model.describe(),
            "eps_all": jsonable(self.eps_all),
            "sweep": self.sweep_rows(),
            "independence": jsonable(self.independence),
            "representativeness": self.representativeness,
            "sole_contributors": int(self.sole_contributors),
            "n_evaluated": int(self.n_evaluated),
            "screening": self.screening,
            "eps_tolerance": self.eps_tolerance,
            **({"adversary": self.adversary} if self.adversary else {}),
            **({"uncertainty": self.uncertainty.to_dict()} if self.uncertainty is not None else {}),
            "warnings": list(self.warnings),
            "notes": ["total_risk assumes the individuals' risks are independent"]
            + [note for note in (self.model.kernel.eps_note(),) if note],
        }


def assess(data: Any, *, id: str | None = None, by: str | None = None, query: str | list | None = None,
           sql: str | list | None = None, where: str | None = None, group_by: str | None = None, epsilon=None,
           model: Model | None = None, execution: Execution | None = None, exact_all: bool = False,
           precision: Precision | None = None, intervals: Intervals | None = None):
    """Per-individual empirical privacy risk of releasing a query of repeated databases.

    Parameters
    ----------
    data, id, by
        The table (path: Parquet/CSV/JSON file, glob, hive folder, ``FILE.duckdb::TABLE``; or a
        pandas/polars/Arrow frame or DuckDB relation) and the columns naming the individual and the
        database; or a :class:`empdp.Data` holding all three.
    query, where, sql
        ``query`` (e.g. ``"mean(x)"``) with an optional SQL ``where`` filter,
        or ``sql`` reading the table ``db``. A list of 2–3 of either assesses the
        statistics released together; a :class:`~empdp.assessment.joint.JointAssessment` is returned.
    group_by
        A column: one statistic per group and database, released together (a
        :class:`~empdp.assessment.groups.GroupedAssessment` is returned).
    epsilon
        One ε or a list; default: 50 values log-spaced over [ε_all/20, 1.25 ε_all].
    model
        The curator's density model and the adversary (:class:`empdp.Model`; default: one Laplace
        scale chosen by leave-one-out likelihood, no adversary). With an adversary, the databases are
        cut into buckets by what it knows and the risk is the largest conditional risk over the
        buckets (:mod:`empdp.assessment.adversary`); the plain assessment is kept beside it.
    execution
        Engine, memory, threads, workers, screening and progress (:class:`empdp.Execution`); no result
        depends on it. With ``workers="processes"`` (or ``"auto"``, which uses processes for stages of
        at least :data:`PROCESS_ROWS` individuals off the one-scale Laplace closed form), worker
        processes start from a fresh interpreter (a fork server, or 'spawn' where there is none),
        which imports the calling program's main module again: guard its work with
        ``if __name__ == "__main__":``. On Spark (``engine="spark"`` or
        ``empdp.engines.Spark(master=..., remote=..., table=...)``) the table is read, aggregated
        and screened on Spark, and the candidates are evaluated on the executors (docs/spark.md).
    exact_all
        Compute ε_i exactly for every individual (``--out`` does). Otherwise
        ε_i is computed where ε_all needs it, and the other individuals get
        their exact δ_i only, which takes fewer nodes.
    precision
        :class:`empdp.Precision` of 2–3 statistics released together: the total risk certified to a
        relative ``tolerance`` (default 1e-4), or every δ_i exact (one statistic is always exact).
    intervals
        :class:`empdp.Intervals`: also the intervals of the estimates over subsamples of the
        databases (:meth:`Assessment.estimate_uncertainty`), from the leave-one-out shifts while they
        are held (one statistic, no adversary, the DuckDB engine).

    Returns
    -------
    Assessment, or for several statistics a JointAssessment or GroupedAssessment
    """
    data = Data.of(data, id, by)
    model, execution = model or Model(), execution or Execution()
    curator, d = model_for(query, sql, group_by)
    cores = available_cores() if execution.threads is None else execution.threads
    engine = engine_of(execution.engine, memory_limit=execution.memory_limit, threads=cores)
    curator.refuse(given(kernel=model.kernel, adversary=model.adversary, adversary_sql=model.adversary_sql,
                         buckets=model.buckets, engine=engine.name, workers=execution.workers,
                         screening=execution.screening, uncertainty=intervals, precision=precision), d)
    if intervals is not None and (model.adversary or model.adversary_sql or engine.name != "duckdb"):
        raise InputError("`intervals` are estimated for the plain assessment of one statistic on the DuckDB "
                         "engine (not against an adversary, not on Spark yet)", param=("uncertainty", "engine"))
    request = _Request(data=data, queries=statistics(query, sql), where=where, group_by=group_by,
                       epsilon=epsilon, model=model, execution=execution, engine=engine, cores=cores,
                       exact_all=exact_all, precision=precision or Precision(), intervals=intervals,
                       progress=execution.progress or no_progress)
    return _PATHS[curator.key](request)


@dataclass(frozen=True)
class _Request:
    """One checked request of :func:`assess`, as each curator model's path takes it."""

    data: Data
    queries: tuple  # (queries, sqls): the statistics as lists
    where: str | None
    group_by: str | None
    epsilon: Any
    model: Model
    execution: Execution
    engine: Any
    cores: int
    exact_all: bool
    precision: Precision
    intervals: Intervals | None
    progress: Any

    def several(self) -> dict:
        """The keywords of the paths of 2–3 statistics (joint, grouped)."""
        data, execution = self.data, self.execution
        return dict(id=data.id, by=data.by, where=self.where, epsilon=self.epsilon, bandwidth=self.model.bandwidth,
                    drop_null_ids=data.drop_null_ids, memory_limit=execution.memory_limit,
                    threads=execution.threads, engine=self.engine, progress=self.progress,
                    tolerance=self.precision.tolerance,
                    exact=self.precision.exact, exact_all=self.exact_all)


def _assess_one(r: _Request) -> "Assessment":
    """One statistic (and its adversary buckets)."""
    queries, sqls = r.queries
    query, sql = _one(queries or None), _one(sqls or None)
    model, data = r.model, r.data
    params.adversary(model.adversary, model.adversary_sql, model.buckets)
    eps = None if r.epsilon is None else params.epsilons(r.epsilon)
    with ExitStack() as stack:
        # blocks of individuals are evaluated side by side, each with single-threaded BLAS (also
        # when threads=1, so that results do not depend on the thread count)
        stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
        checks.preload()  # the compiled kernels and scipy.stats: loaded while DuckDB opens the table
        loo = r.engine.open(data.source, id=data.id, by=data.by, query=query, where=r.where, sql=sql,
                            drop_null_ids=data.drop_null_ids)
        plain = _assess(loo, eps=eps, model=model, exact_all=r.exact_all, screening=r.execution.screening,
                        threads=r.cores, stack=stack, workers=r.execution.workers, progress=r.progress,
                        intervals=r.intervals)
        if not (model.adversary or model.adversary_sql):
            return plain
        g, statistic = read_statistic(data.source, plain.labels, id=data.id, by=data.by, adversary=model.adversary,
                                      adversary_sql=model.adversary_sql, engine=r.engine,
                                      drop_null_ids=data.drop_null_ids)
        return _adversarial(plain, g, statistic, eps=eps, model=model, progress=r.progress)


def _assess_joint(r: _Request):
    queries, sqls = r.queries
    return assess_joint(r.data.source, queries=queries or None, sql=sqls or None, **r.several())


def _assess_grouped(r: _Request):
    queries, sqls = r.queries
    return assess_grouped(r.data.source, group_by=r.group_by, query=(queries or [None])[0],
                          sql=(sqls or [None])[0], **r.several())


#: each curator model's path through the assessment (:mod:`empdp.models`)
_PATHS = {ONE.key: _assess_one, JOINT.key: _assess_joint, GROUPED.key: _assess_grouped}


def _one(statistic):
    """The one statistic of a one-statistic request (given as it is, or as a list of one)."""
    return statistic[0] if isinstance(statistic, (list, tuple)) else statistic


def _adversarial(plain: "Assessment", g: np.ndarray, statistic: str, *, eps, model: Model,
                 progress) -> "Assessment":
    """The assessment conditional on the adversary statistic ``g`` (one value per database; one bucket set)."""
    n = len(plain.q)
    k = adversary_model.check_buckets(model.buckets, n)
    groups, warnings = adversary_model.fit_buckets(plain.q, g, k, kernel=model.kernel, bandwidth=model.bandwidth)
    engine = plain.engine
    res = adversary_model.assess_buckets(engine, plain.q, groups, eps, default_epsilons=default_epsilons,
                             fetch_rows=fetch_rows(engine, n), progress=progress)
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
    }).with_columns(adversary_model.bucket_column(res["which"], res["eps_i"]))
    return Assessment(
        source=plain.source, query=plain.query, id_column=plain.id_column, by_column=plain.by_column,
        labels=plain.labels, q=plain.q, model=plain.model, epsilons=res["eps"], delta=delta.max(axis=0),
        total_risk=total, n_at_risk=(delta > 0).sum(axis=0), eps_all=res["eps_all"], individuals=individuals,
        independence=plain.independence, representativeness=plain.representativeness,
        warnings=plain.warnings + warnings, sole_contributors=plain.sole_contributors,
        n_evaluated=res["n_evaluated"], screening=plain.screening, engine=engine,
        adversary=adversary_model.summary(groups, plain.labels, statistic, plain), buckets=groups)


def _assess(engine: LooEngine, *, eps, model: Model, exact_all, screening, threads, stack, workers,
            progress, intervals: Intervals | None = None) -> Assessment:
    """The plain assessment in its named stages: model, screening, ε_all search, δ_i, summary."""
    checks.preload()  # (started already when the assessment opened the table itself)
    progress(READING, 0, 3)
    q = engine.values()
    progress(READING, 1, 3)
    density = select_density(q, kernel=model.kernel, bandwidth=model.bandwidth)
    progress(READING, 2, 3)
    screen = engine.screen(density.bandwidths)
    progress(READING, 3, 3)
    if len(screen) == 0:
        raise InputError("no individual has rows the query uses (check `where` and NULL values)", param="where")
    ev = Evaluation(engine, density, screen, eps, screening=screening, threads=threads, stack=stack,
                     workers=workers, progress=progress)
    ev.search_eps_all()
    ev.delta_stage(exact_all)
    result = Assessment(**ev.result(q))
    if intervals is not None:  # while the shift rows are held: the replicates read nothing again
        result.estimate_uncertainty(intervals.replicates, intervals.level, intervals.rng, rows=intervals.rows,
                                    threads=threads)
    # the result keeps the engine (for shifts_of), not up to 8 bytes × 10^8 cells
    engine.release_shifts()
    return result
