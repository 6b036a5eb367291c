"""Assess a joint release of 2–3 statistics from a table (docs/method.md#102-joint-queries-planned, issue 19).

Thin I/O over :mod:`empdp.joint`: the query values and shifts (:func:`.panel.read_joint`), the
joint model, exact ε_i for everyone and δ_i(ε) over a sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..assessment import checks
from ..assessment.assess import RiskSweep
from ..errors import InputError
from . import JointModel, joint_bound, joint_risk, select_joint_model
from .panel import read_joint


@dataclass(kw_only=True)
class JointAssessment(RiskSweep):
    """Result of :func:`assess_joint`: as :class:`empdp.assessment.assess.Assessment`, for a vector of statistics.

    ``individuals`` has the id, ``eps_i`` (exact; ∞ for sole contributors), ``delta`` (δ_i at the
    smallest ε), ``n_databases``, ``max_abs_shift_1..d`` and ``sole_contributor``.
    """

    queries: list
    model: JointModel
    warnings: list = field(default_factory=list)
    #: the independence checks of each statistic's series over the databases (as for one statistic)
    independence: list = field(default_factory=list)

    @property
    def eps_i(self) -> np.ndarray:
        return self.individuals["eps_i"].to_numpy()

    def riskiest(self, k: int = 10) -> pl.DataFrame:
        """The ``k`` riskiest individuals, as :meth:`empdp.assessment.Assessment.riskiest`: by δ_i at the
        smallest ε, ties by ε_i (sole contributors first), and the individual that sets ε_all even
        when it is not among them (column ``sets``); every value is exact."""
        ind = self.individuals
        eps_i, sole = ind["eps_i"].to_numpy(), ind["sole_contributor"].to_numpy()
        sets = ~sole & (eps_i == self.eps_all) & (self.eps_all > 0)
        ranked = ind.with_columns(pl.Series("sets", sets)).sort(["delta", "eps_i"], descending=True,
                                                                maintain_order=True)
        head = ranked.head(k)
        return head if head["sets"].any() else head.vstack(ranked.filter(pl.col("sets")).head(1))

    def to_dict(self) -> dict:
        return {
            "source": self.source, "query": list(self.queries), "id": self.id_column, "by": self.by_column,
            "n_databases": self.n_databases, "n_individuals": self.individuals.height,
            "kernel": "laplace", "bandwidth": self.model.scales.tolist(), "density_model": self.model.describe(),
            "eps_all": self.eps_all if math.isfinite(self.eps_all) else None,
            "sweep": [{"epsilon": float(e), "delta": float(d), "total_risk": float(t), "n_at_risk": int(c)}
                      for e, d, t, c in zip(self.epsilons, self.delta, self.total_risk, self.n_at_risk)],
            "independence": list(self.independence),
            "sole_contributors": int(self.sole_contributors), "warnings": list(self.warnings),
        }


def _default_epsilons(eps_all: float, count: int = 50) -> np.ndarray:
    from ..assessment.evaluation import default_epsilons

    return default_epsilons(eps_all, count)


#: individuals per call of the risk core in the sweep: the saturation test runs between calls
SWEEP_ROWS = 64
#: Σ log(1 − δ_i(ε)) at or below which δ*(ε) = −expm1(·) is 1.0 in float64 (from about −38)
SATURATED = -60.0


def _sweep(model: JointModel, shifts: np.ndarray, eps: np.ndarray, rows: np.ndarray, eps_i: np.ndarray):
    """δ_i(ε) of ``rows`` (riskiest first, in blocks), NaN where positive but not needed.

    Once Σ log(1 − δ_i(ε)) ≤ :data:`SATURATED` over the blocks so far, δ*(ε) is 1.0 whatever the
    others are, so the next blocks need δ_i(ε) only where it can exceed the largest so far (the
    ``only``/``cap`` of :func:`empdp.joint.joint_risk`); δ_i at the smallest ε is always computed
    (it is reported per individual), and whether δ_i > 0 is known from ε_i.
    """
    out = np.zeros((len(rows), len(eps)))
    order = np.argsort(-eps_i[rows], kind="stable")
    largest = np.zeros(len(eps))
    log_survive = np.zeros(len(eps), dtype=np.longdouble)
    for k in range(0, len(order), SWEEP_ROWS):
        at = order[k:k + SWEEP_ROWS]
        saturated = log_survive <= SATURATED
        saturated[0] = False
        only, cap = (~saturated, largest.copy()) if saturated.any() else (None, None)
        d = joint_risk(model, shifts[rows[at]], eps, only=only, cap=cap)[1]
        out[at] = d
        known = np.nan_to_num(d, nan=0.0)
        largest = np.maximum(largest, known.max(axis=0))
        with np.errstate(divide="ignore"):
            log_survive += np.log1p(-known).sum(axis=0, dtype=np.longdouble)
    return out


def assess_joint(source: Any, *, id: str, by: str, queries: list[str] | None = None, sql: list[str] | None = None,
                 where: str | None = None, epsilon=None, bandwidth="auto", drop_null_ids: bool = False,
                 memory_limit: str | None = None, threads: int | None = None) -> JointAssessment:
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

    Raises
    ------
    empdp.joint.SingularCovarianceError
        A statistic is constant or an exact linear function of the others over the databases.
    """
    panel = read_joint(source, id=id, by=by, queries=queries, sql=sql, where=where, drop_null_ids=drop_null_ids,
                       memory_limit=memory_limit, threads=threads)
    labels, q, names, ids, shifts, sole = panel.labels, panel.q, panel.names, panel.ids, panel.shifts, panel.sole
    m, d = len(ids), panel.d
    model = select_joint_model(q, bandwidth=bandwidth, names=names)
    ok = np.flatnonzero(~sole)
    eps_i = np.full(m, np.inf)
    eps_i[ok] = joint_risk(model, shifts[ok])[0]
    eps_all = float(eps_i[ok].max(initial=0.0))
    eps = _default_epsilons(eps_all) if epsilon is None else np.sort(np.atleast_1d(np.asarray(epsilon, float)))
    if not np.all(np.isfinite(eps) & (eps >= 0)):
        raise InputError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    delta = np.ones((m, len(eps)))
    need = ok[joint_bound(model, shifts[ok]) > eps[0]]
    delta[ok] = 0.0
    delta[need] = _sweep(model, shifts, eps, need, eps_i)
    known = np.nan_to_num(delta, nan=0.0)  # NaN: positive, below the largest δ_i where δ* is 1.0
    with np.errstate(divide="ignore"):
        total = np.maximum(-np.expm1(np.log1p(-known).sum(axis=0, dtype=np.longdouble).astype(np.float64)), 0.0)
    individuals = pl.DataFrame({
        id: ids, "eps_i": eps_i, "delta": delta[:, 0], "n_databases": panel.present,
        **{f"max_abs_shift_{k + 1}": np.abs(shifts[:, :, k]).max(axis=1) for k in range(d)},
        "sole_contributor": sole,
    })
    warnings, independence = [], []
    for k, name in enumerate(names):  # each statistic's series: autocorrelation and trend, as for one
        checked, notes = checks.independence(q[:, k])
        independence.append(checked)
        warnings += [f"{name}: {w}" for w in notes]
    if sole.any():
        warnings.append(f"{int(sole.sum())} individual(s) are the only contributor to some database: "
                        "delta_i = 1, eps_i = inf; no epsilon protects them")
    return JointAssessment(
        source=str(source) if isinstance(source, str) else type(source).__name__, queries=names,
        id_column=id, by_column=by, labels=labels, q=q, model=model, epsilons=eps, delta=known.max(axis=0),
        total_risk=total, n_at_risk=((delta > 0) | np.isnan(delta)).sum(axis=0), eps_all=eps_all,
        individuals=individuals,
        sole_contributors=int(sole.sum()), warnings=warnings, independence=independence)
