"""Assess a joint release of 2–3 statistics from a table (docs/method.md#102-joint-queries, issue 19).

Thin I/O over :mod:`empdp.risk.joint`: the query values and shifts (:func:`.panel.read_joint`), the
joint model, then ε_all and δ_i(ε) over a sweep, exact, evaluating only the individuals they need
(:mod:`._evaluation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..errors import InputError
from ..io import jsonable
from ..loo.joint import read_joint
from ..models import JOINT
from ..params import available_cores
from ..progress import READING, Progress, no_progress
from ..risk.joint import JointModel, joint_bound, select_joint_model
from . import checks
from .evaluation import default_epsilons
from .joint_evaluation import TOLERANCE, Certified, Part, bracket_columns, check_tolerance, exact_eps, search_eps_all
from .sweep import RiskSweep, check_rank_epsilon, ranked


@dataclass(kw_only=True)
class JointAssessment(RiskSweep):
    """Result of :func:`assess_joint`: as :class:`empdp.assessment.assess.Assessment`, for a vector of statistics.

    What is exact and what is certified (docs/method.md#102-joint-queries): ε_all, the worst case
    ``delta`` (max_i δ_i(ε)) and ``n_at_risk`` at every swept ε are exact; ``total_risk`` is the
    midpoint of ``total_risk_bounds`` (E, 2), a certified bracket of δ*(ε) at most
    max(``tolerance`` × hi, 1e−12) wide (every δ_i exact with ``exact``).

    ``individuals`` has one row per individual: the id; ``eps_i``, exact (∞ for sole contributors)
    for every individual with ``exact_all``, otherwise for those evaluated exactly (the rows the
    ε_all search reached, those whose δ_i was evaluated, those whose bounds could not decide whether
    they are at risk at some swept ε), else null; ``eps_bound`` (the screening bound M_i ≥ ε_i);
    ``delta_lo``, ``delta_hi`` (a certified bracket of δ_i at the smallest ε) and ``delta`` (exact
    where the bracket is closed, else null); ``n_databases``; ``max_abs_shift_1..d``;
    ``sole_contributor``.
    """

    queries: list
    model: JointModel
    warnings: list = field(default_factory=list)
    #: the independence checks of each statistic's series over the databases (as for one statistic)
    independence: list = field(default_factory=list)
    #: Δ_ij (m, n, d) of every individual (row order of ``individuals``), for exact values on demand
    shifts: np.ndarray | None = field(default=None, repr=False)
    #: relative width of the certified total-risk bracket, and whether every δ_i was made exact
    tolerance: float = TOLERANCE
    exact: bool = False
    #: (E, 2): the certified [lo, hi] of δ*(ε) at each swept ε (None: a result without one)
    total_risk_bounds: np.ndarray | None = None
    #: the per-individual brackets (rows ``rows`` of ``individuals``), refined on demand by :meth:`riskiest`
    certified: Certified | None = field(default=None, repr=False)
    rows: np.ndarray | None = field(default=None, repr=False)

    kind = JOINT

    @property
    def statistic(self) -> str:
        return " & ".join(self.queries)

    @property
    def n_statistics(self) -> int:
        return len(self.queries)

    def log_lines(self) -> list[str]:
        m = self.model
        return [*super().log_lines(),
                f"joint model: product Laplace kernels on {'whitened' if m.whitened else 'the statistics own'} "
                f"axes, scales {', '.join(f'{b:.6g}' for b in m.scales)}, {m.selected_by}, LOO log-likelihood "
                f"{m.loglik:.6g}", f"eps_all {self.eps_all:.6g}",
                "total risk: exact" if self.exact else f"total risk: certified to a relative {self.tolerance:g}"]

    @property
    def eps_i(self) -> np.ndarray:
        """``individuals["eps_i"]`` as floats: NaN where it was not evaluated (see the class docstring)."""
        return self.individuals["eps_i"].fill_null(np.nan).to_numpy().astype(float)

    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest individuals at ``epsilon`` (default: the smallest assessed ε), as
        :meth:`empdp.assessment.Assessment.riskiest`: by exact δ_i(ε), ties by ε_i (sole contributors
        first), and the individual that sets ε_all even when it is not among them; every value is exact.

        Rows are evaluated exactly until the ``k`` largest δ_i(ε) are exact and no other row's
        certified upper bound exceeds the k-th (branch and bound, written back to ``individuals`` at
        the smallest ε); every row with δ_i > 0 evaluated has its exact ε_i. Rows at δ_i = 0 are ranked
        by ε_i: those without one get it exactly, in decreasing order of ``eps_bound``, until the next
        bound cannot enter the table.
        """
        eps = float(self.epsilons[0]) if epsilon is None else check_rank_epsilon(epsilon)
        delta = self._delta_at(eps, k)
        self._rank_exact(k, delta)
        own = ["eps_bound", *[f"max_abs_shift_{j + 1}" for j in range(len(self.queries))]]
        return ranked(self, eps, delta, own, k)

    def _delta_at(self, eps: float, k: int) -> np.ndarray:
        """δ_i(eps) of every individual, exact for the ``k`` largest and any that may reach them (NaN
        for the others, below the k-th; 1 for sole contributors)."""
        at = np.flatnonzero(self.epsilons == eps)
        if self.certified is not None and len(at):
            self.certified.top(k, int(at[0]))
            if at[0] == 0:
                self._write_back()
            return self._column(self.certified, int(at[0]))
        if eps == float(self.epsilons[0]) and self.certified is None:
            return self.individuals["delta"].fill_null(np.nan).to_numpy().astype(float)
        if self.shifts is None:
            raise InputError(f"this result has no shifts to rank at epsilon {eps:g}: rank at the smallest "
                             f"assessed epsilon, {float(self.epsilons[0]):g}")
        sole = self.individuals["sole_contributor"].to_numpy()
        rows = np.flatnonzero(~sole)
        bound = self.individuals["eps_bound"].to_numpy()[rows]
        cert = Certified([Part(self.model, self.shifts[rows], bound, self.eps_i[rows])], np.array([eps]),
                         threads=available_cores(), fixed=np.ones((int(sole.sum()), 1)))
        cert.top(k, 0)
        return self._column(cert, 0, rows)

    def _column(self, cert: Certified, level: int, rows=None) -> np.ndarray:
        rows = self.rows if rows is None else rows
        sole = self.individuals["sole_contributor"].to_numpy()
        cols = bracket_columns(cert, rows, np.where(sole, 1.0, np.nan), level)
        eps_i = self.eps_i
        eps_i[rows] = np.where(np.isnan(eps_i[rows]), cert.eps_i, eps_i[rows])
        self.individuals = self.individuals.with_columns(pl.Series("eps_i", eps_i, dtype=pl.Float64,
                                                                   nan_to_null=True))
        return cols["delta"].fill_null(np.nan).to_numpy()

    def _write_back(self) -> None:
        sole = self.individuals["sole_contributor"].to_numpy()
        cols = bracket_columns(self.certified, self.rows, np.where(sole, 1.0, np.nan), 0)
        self.individuals = self.individuals.with_columns(*[s.alias(c) for c, s in cols.items()])

    def _rank_exact(self, k: int, delta: np.ndarray) -> None:
        """Exact ε_i for the rows at δ_i = 0 that can rank among the first ``k`` (see :meth:`riskiest`)."""
        sole = self.individuals["sole_contributor"].to_numpy()
        need = k - int(((delta > 0) | sole).sum())
        if self.certified is None or need <= 0 or not np.isnan(self.eps_i).any():
            return
        self.certified.rank_zero(need, delta[self.rows] <= 0)
        eps_i = self.eps_i
        eps_i[self.rows] = np.where(np.isnan(eps_i[self.rows]), self.certified.eps_i, eps_i[self.rows])
        self.individuals = self.individuals.with_columns(pl.Series("eps_i", eps_i, dtype=pl.Float64,
                                                                   nan_to_null=True))

    def sweep_rows(self) -> list[dict]:
        rows = super().sweep_rows()
        if self.total_risk_bounds is not None:
            for row, (lo, hi) in zip(rows, self.total_risk_bounds):
                row["total_risk_bounds"] = [float(lo), float(hi)]
        return rows

    def to_dict(self) -> dict:
        return {
            "source": self.source, "query": list(self.queries), "id": self.id_column, "by": self.by_column,
            "n_databases": self.n_databases, "n_individuals": self.individuals.height,
            "kernel": "laplace", "bandwidth": self.model.scales.tolist(), "density_model": self.model.describe(),
            "eps_all": jsonable(self.eps_all), "tolerance": 0.0 if self.exact else self.tolerance,
            "sweep": self.sweep_rows(),
            "independence": list(self.independence),
            "sole_contributors": int(self.sole_contributors), "warnings": list(self.warnings),
        }


def assess_joint(source: Any, *, id: str, by: str, queries: list[str] | None = None, sql: list[str] | None = None,
                 where: str | None = None, epsilon=None, bandwidth="auto", drop_null_ids: bool = False,
                 memory_limit: str | None = None, threads: int | None = None,
                 exact_all: bool = False, tolerance: float = TOLERANCE, exact: bool = False,
                 progress: Progress = no_progress, engine: Any = "duckdb") -> JointAssessment:
    """Per-individual empirical risk of releasing 1–3 statistics of each database together.

    Parameters
    ----------
    source, id, by, where, drop_null_ids, memory_limit, threads
        As for :func:`empdp.assessment.assess`.
    queries or sql
        One query form per statistic (``["sum(x)", "count(*)"]``) or one SQL over ``db`` per statistic.
    epsilon
        One ε or a list; default 50 values log-spaced over [ε_all/20, 1.25 ε_all].
    bandwidth
        ``"auto"`` (whitened product Laplace kernels, scales by leave-one-out likelihood) or one
        fixed scale per statistic in its own units (axis-aligned; reference runs).
    threads
        Also the threads the exact evaluation runs in (default: the available cores); the results
        do not depend on it.
    exact_all
        Exact ε_i for every individual; otherwise only where ε_all, the at-risk counts and the
        riskiest table need them (see :class:`JointAssessment`).
    tolerance
        The total risk δ*(ε) is certified to a bracket [lo, hi] with hi − lo ≤ max(tolerance × hi,
        1e−12) (``total_risk_bounds``; ``total_risk`` is its midpoint), from certified per-individual
        brackets refined exactly where they matter (:class:`.joint_evaluation.Certified`).
    exact
        Exact δ_i(ε) for every individual (``delta_lo`` = ``delta_hi`` = ``delta``); slower.
    progress
        ``progress(stage, done, total)`` after each piece of work (:mod:`empdp.progress`).
    engine
        Where the statistics are read: an engine object or name (:func:`empdp.loo.joint.read_joint`;
        ``Spark(table=...)`` reads a catalog table, ``source`` None). The risk is computed here.

    Raises
    ------
    empdp.risk.joint.SingularCovarianceError
        A statistic is constant or an exact linear function of the others over the databases.
    """
    tolerance = check_tolerance(tolerance)
    progress(READING, 0, 1)
    panel = read_joint(source, id=id, by=by, queries=queries, sql=sql, where=where, drop_null_ids=drop_null_ids,
                       memory_limit=memory_limit, threads=threads, engine=engine)
    progress(READING, 1, 1)
    labels, q, names, ids, shifts, sole = panel.labels, panel.q, panel.names, panel.ids, panel.shifts, panel.sole
    m, d = len(ids), panel.d
    cores = available_cores() if threads is None else max(1, int(threads))
    model = select_joint_model(q, bandwidth=bandwidth, names=names)
    ok = np.flatnonzero(~sole)
    bound = np.full(m, np.inf)
    bound[ok] = joint_bound(model, shifts[ok])
    eps_i, eps_all = search_eps_all(model, shifts, ok, bound, cores, progress)
    eps = default_epsilons(eps_all) if epsilon is None else np.sort(np.atleast_1d(np.asarray(epsilon, float)))
    if not np.all(np.isfinite(eps) & (eps >= 0)):
        raise InputError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    cert = Certified([Part(model, shifts[ok], bound[ok], eps_i[ok])], eps, tolerance=tolerance, exact=exact,
                     threads=cores, progress=progress, fixed=np.ones((int(sole.sum()), len(eps))))
    eps_i[ok] = cert.eps_i
    if exact_all:
        rest = ok[np.isnan(eps_i[ok])]
        if len(rest):
            progress("eps_i", 0, len(rest))
            eps_i[rest] = exact_eps(model, shifts, rest, cores)
            progress("eps_i", len(rest), len(rest))
    eps_i[sole] = np.inf
    individuals = pl.DataFrame({
        id: ids, "eps_i": pl.Series(eps_i, dtype=pl.Float64, nan_to_null=True), "eps_bound": bound,
        **bracket_columns(cert, ok, np.where(sole, 1.0, np.nan)), "n_databases": panel.present,
        **{f"max_abs_shift_{k + 1}": np.abs(shifts[:, :, k]).max(axis=1) for k in range(d)},
        "sole_contributor": sole,
    })
    few = checks.few_databases(len(q))  # one warning for the databases, not one per statistic
    warnings, independence = list(few), []
    bounds = cert.totals()
    for k, name in enumerate(names):  # each statistic's series: autocorrelation and trend, as for one
        checked, notes = checks.independence(q[:, k])
        independence.append(checked)
        warnings += [f"{name}: {w}" for w in notes if w not in few]
    if sole.any():
        warnings.append(f"{int(sole.sum())} individual(s) are the only contributor to some database: "
                        "delta_i = 1, eps_i = inf; no epsilon protects them")
    return JointAssessment(
        source=str(source) if isinstance(source, str) else type(source).__name__, queries=names,
        id_column=id, by_column=by, labels=labels, q=q, model=model, epsilons=eps, delta=cert.worst(),
        total_risk=bounds.mean(axis=1), n_at_risk=cert.n_at_risk(), eps_all=eps_all,
        individuals=individuals, sole_contributors=int(sole.sum()), warnings=warnings, independence=independence,
        shifts=shifts, tolerance=tolerance, exact=exact, total_risk_bounds=bounds, certified=cert, rows=ok)
