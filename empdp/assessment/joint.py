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
from ..progress import READING, Progress, no_progress
from ..risk.joint import JointModel, joint_bound, select_joint_model
from . import checks
from .evaluation import default_epsilons
from .joint_evaluation import exact_eps, search_eps_all, sweep
from .parallel import available_cores
from .sweep import RiskSweep, check_rank_epsilon, ranked


@dataclass(kw_only=True)
class JointAssessment(RiskSweep):
    """Result of :func:`assess_joint`: as :class:`empdp.assessment.assess.Assessment`, for a vector of statistics.

    ``individuals`` has one row per individual: the id; ``eps_i``, exact (∞ for sole contributors)
    for every individual with ``exact_all``, otherwise for those evaluated exactly: the rows the
    ε_all search reached and every row whose δ_i can be positive in the swept range (M_i > min ε),
    else null (such an ε_i is at most ``eps_bound`` ≤ min ε, and the sweep does not depend on it);
    ``eps_bound`` (the screening bound M_i ≥ ε_i, a bound, not ε_i); ``delta`` (δ_i at the smallest ε,
    exact for everyone); ``n_databases``; ``max_abs_shift_1..d``; ``sole_contributor``.
    """

    queries: list
    model: JointModel
    warnings: list = field(default_factory=list)
    #: the independence checks of each statistic's series over the databases (as for one statistic)
    independence: list = field(default_factory=list)
    #: Δ_ij (m, n, d) of every individual (row order of ``individuals``), for exact values on demand
    shifts: np.ndarray | None = field(default=None, repr=False)

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
                f"{m.loglik:.6g}", f"eps_all {self.eps_all:.6g}"]

    @property
    def eps_i(self) -> np.ndarray:
        """``individuals["eps_i"]`` as floats: NaN where it was not evaluated (see the class docstring)."""
        return self.individuals["eps_i"].fill_null(np.nan).to_numpy().astype(float)

    #: rows per batch when :meth:`riskiest` makes ε_i exact
    RANK_BATCH = 256

    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest individuals at ``epsilon`` (default: the smallest assessed ε), as
        :meth:`empdp.assessment.Assessment.riskiest`: by exact δ_i(ε), ties by ε_i (sole contributors
        first), and the individual that sets ε_all even when it is not among them; every value is exact.

        δ_i at the smallest ε is exact for everyone (at another ε it is computed here for every row whose
        screening bound exceeds it), and every row with δ_i > 0 has its exact ε_i. Rows at δ_i = 0 are
        ranked by ε_i: those without one get it exactly, in decreasing order of ``eps_bound``, until the
        next bound cannot enter the table (branch and bound; written back to ``individuals``).
        """
        eps = float(self.epsilons[0]) if epsilon is None else check_rank_epsilon(epsilon)
        delta = self._delta_at(eps)
        self._rank_exact(k, delta)
        own = ["eps_bound", *[f"max_abs_shift_{j + 1}" for j in range(len(self.queries))]]
        return ranked(self, eps, delta, own, k)

    def _delta_at(self, eps: float) -> np.ndarray:
        """Exact δ_i(eps) of every individual (1 for sole contributors)."""
        delta = self.individuals["delta"].to_numpy().astype(float)
        if eps == float(self.epsilons[0]):
            return delta
        if self.shifts is None:
            raise InputError(f"this result has no shifts to rank at epsilon {eps:g}: rank at the smallest "
                             f"assessed epsilon, {float(self.epsilons[0]):g}")
        sole = self.individuals["sole_contributor"].to_numpy()
        bound = self.individuals["eps_bound"].to_numpy()
        delta = np.where(sole, 1.0, 0.0)
        need = np.flatnonzero(~sole & (bound > eps))
        if len(need):
            delta[need] = sweep(self.model, self.shifts, np.array([eps]), need, bound, available_cores())[1][:, 0]
        return delta

    def _rank_exact(self, k: int, delta: np.ndarray) -> None:
        """Exact ε_i for the rows at δ_i = 0 that can rank among the first ``k`` (see :meth:`riskiest`)."""
        eps_i = self.eps_i
        if self.shifts is None or not np.isnan(eps_i).any():
            return
        sole = self.individuals["sole_contributor"].to_numpy()
        need = k - int(((delta > 0) | sole).sum())
        if need <= 0:
            return
        zero = np.flatnonzero((delta <= 0) & ~sole)
        upper = np.where(np.isnan(eps_i), self.individuals["eps_bound"].to_numpy(), eps_i)
        order = zero[np.argsort(-upper[zero], kind="stable")]
        pos = 0
        while pos < len(order):
            if pos >= need and upper[order[pos]] < np.sort(eps_i[order[:pos]])[::-1][need - 1]:
                break
            end = min(len(order), pos + max(self.RANK_BATCH, need))
            todo = order[pos:end][np.isnan(eps_i[order[pos:end]])]
            eps_i[todo] = exact_eps(self.model, self.shifts, todo, available_cores())
            pos = end
        self.individuals = self.individuals.with_columns(pl.Series("eps_i", eps_i, dtype=pl.Float64,
                                                                   nan_to_null=True))

    def to_dict(self) -> dict:
        return {
            "source": self.source, "query": list(self.queries), "id": self.id_column, "by": self.by_column,
            "n_databases": self.n_databases, "n_individuals": self.individuals.height,
            "kernel": "laplace", "bandwidth": self.model.scales.tolist(), "density_model": self.model.describe(),
            "eps_all": jsonable(self.eps_all),
            "sweep": self.sweep_rows(),
            "independence": list(self.independence),
            "sole_contributors": int(self.sole_contributors), "warnings": list(self.warnings),
        }


def assess_joint(source: Any, *, id: str, by: str, queries: list[str] | None = None, sql: list[str] | None = None,
                 where: str | None = None, epsilon=None, bandwidth="auto", drop_null_ids: bool = False,
                 memory_limit: str | None = None, threads: int | None = None,
                 exact_all: bool = False, progress: Progress = no_progress) -> JointAssessment:
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
        Exact ε_i for every individual (``--out`` needs them); otherwise only where ε_all and the
        sweep need them (see :class:`JointAssessment`).
    progress
        ``progress(stage, done, total)`` after each piece of work (:mod:`empdp.progress`).

    Raises
    ------
    empdp.risk.joint.SingularCovarianceError
        A statistic is constant or an exact linear function of the others over the databases.
    """
    progress(READING, 0, 1)
    panel = read_joint(source, id=id, by=by, queries=queries, sql=sql, where=where, drop_null_ids=drop_null_ids,
                       memory_limit=memory_limit, threads=threads)
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
    delta = np.ones((m, len(eps)))
    delta[ok] = 0.0  # δ_i(ε) = 0 for ε ≥ M_i ≥ ε_i
    need = ok[bound[ok] > eps[0]]
    swept, delta[need] = sweep(model, shifts, eps, need, bound, cores, progress)
    eps_i[need] = np.where(np.isnan(eps_i[need]), swept, eps_i[need])  # the search's, where it has one
    if exact_all:
        rest = ok[np.isnan(eps_i[ok])]
        if len(rest):
            progress("eps_i", 0, len(rest))
            eps_i[rest] = exact_eps(model, shifts, rest, cores)
            progress("eps_i", len(rest), len(rest))
    eps_i[sole] = np.inf
    known = np.nan_to_num(delta, nan=0.0)  # NaN: positive, below the largest δ_i where δ* is 1.0
    with np.errstate(divide="ignore"):
        total = np.maximum(-np.expm1(np.log1p(-known).sum(axis=0, dtype=np.longdouble).astype(np.float64)), 0.0)
    individuals = pl.DataFrame({
        id: ids, "eps_i": pl.Series(eps_i, dtype=pl.Float64, nan_to_null=True), "eps_bound": bound,
        "delta": delta[:, 0], "n_databases": panel.present,
        **{f"max_abs_shift_{k + 1}": np.abs(shifts[:, :, k]).max(axis=1) for k in range(d)},
        "sole_contributor": sole,
    })
    few = checks.few_databases(len(q))  # one warning for the databases, not one per statistic
    warnings, independence = list(few), []
    for k, name in enumerate(names):  # each statistic's series: autocorrelation and trend, as for one
        checked, notes = checks.independence(q[:, k])
        independence.append(checked)
        warnings += [f"{name}: {w}" for w in notes if w not in few]
    if sole.any():
        warnings.append(f"{int(sole.sum())} individual(s) are the only contributor to some database: "
                        "delta_i = 1, eps_i = inf; no epsilon protects them")
    return JointAssessment(
        source=str(source) if isinstance(source, str) else type(source).__name__, queries=names,
        id_column=id, by_column=by, labels=labels, q=q, model=model, epsilons=eps, delta=known.max(axis=0),
        total_risk=total, n_at_risk=((delta > 0) | np.isnan(delta)).sum(axis=0), eps_all=eps_all,
        individuals=individuals, sole_contributors=int(sole.sum()), warnings=warnings, independence=independence,
        shifts=shifts)
