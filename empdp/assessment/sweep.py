"""What every assessment holds (:class:`RiskSweep`): one statistic, several released together, grouped
statistics, or against an adversary."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from ..errors import InputError
from ..models import CuratorModel


@dataclass(kw_only=True)
class RiskSweep(ABC):
    """What every assessment holds, of one statistic or of several released together
    (:class:`Assessment`, :class:`empdp.assessment.joint.JointAssessment`): the source's databases and
    query values ``q``, the ε swept with δ(ε), δ*(ε) and the at-risk counts, ε_all, and one row
    per individual."""

    source: str
    id_column: str
    by_column: str
    labels: list
    q: np.ndarray
    epsilons: np.ndarray
    delta: np.ndarray
    total_risk: np.ndarray
    n_at_risk: np.ndarray
    eps_all: float
    individuals: pl.DataFrame
    sole_contributors: int

    @property
    def n_databases(self) -> int:
        return len(self.labels)

    def epsilon_for_total_risk(self, target: float) -> float | None:
        """Smallest assessed ε with δ*(ε) ≤ target (None if no assessed ε reaches it)."""
        ok = np.flatnonzero(self.total_risk <= target)
        return float(self.epsilons[ok[0]]) if len(ok) else None

    #: the result's curator model (:mod:`empdp.models`): what each stage dispatches on
    kind: ClassVar[CuratorModel]

    @abstractmethod
    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest individuals at ``epsilon`` (default: the smallest assessed ε), every value
        exact; columns: the id, :data:`RISKIEST_COLUMNS`, the kind's own, ``sole_contributor``,
        ``sets_eps_all``."""

    def out_table(self) -> pl.DataFrame:
        """The ``--out`` table: ``individuals`` with ``epsilon`` (the ε its ``delta`` is at: the smallest
        assessed) after ``delta``; the other columns in ``individuals``' order."""
        cols = self.individuals.columns
        at = cols.index("delta") + 1
        return self.individuals.with_columns(pl.lit(float(self.epsilons[0])).alias("epsilon")) \
            .select([*cols[:at], "epsilon", *cols[at:]])

    def log_lines(self) -> list[str]:
        """What the assessment was (sizes, model) in a few lines, for the log."""
        return [f"{self.statistic} of {self.source}: {self.n_databases} databases (by {self.by_column}), "
                f"{self.individuals.height} individuals (id {self.id_column}), {self.sole_contributors} sole "
                "contributor(s)"]

    def debug_lines(self) -> list[str]:
        """Details for the debug log (the sweep is logged beside them)."""
        return []

    @property
    def n_statistics(self) -> int:
        """How many statistics are released together (joint queries: 2-3; otherwise 1 query)."""
        return 1

    @property
    @abstractmethod
    def statistic(self) -> str:
        """What is released, in words (the query, or the statistics joined by ' & ')."""

    def sweep_rows(self) -> list[dict]:
        """The sweep as JSON holds it: one object per assessed ε."""
        return [{"epsilon": float(e), "delta": float(d), "total_risk": float(t), "n_at_risk": int(c)}
                for e, d, t, c in zip(self.epsilons, self.delta, self.total_risk, self.n_at_risk)]

    def estimate_uncertainty(self, replicates: int = 200, level: float = 0.9, rng=None, *, rows=10):
        """Intervals of the estimates over subsamples of the databases: one statistic's results have
        them (:meth:`empdp.assessment.assess.Assessment.estimate_uncertainty`); this model refuses."""
        self.kind.refuse([("uncertainty", "uncertainty")], self.n_statistics)
        raise InputError(f"the uncertainty of {self.kind.named(self.n_statistics)} is not estimated",
                         param="uncertainty")

    def close(self) -> None:
        """Release what the result holds beyond its values (a live engine, kept shifts); the values stay."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: the columns every ``riskiest`` table starts with, in order (then the kind's own, then the flags)
RISKIEST_COLUMNS = ("epsilon", "delta", "eps_i", "n_databases")


def ranked(result: RiskSweep, eps: float, delta: np.ndarray, own: list[str], k: int) -> pl.DataFrame:
    """The riskiest table of a joint or grouped result: ``k`` rows by exact δ_i(``eps``), ties by ε_i
    (null ε_i, known only by a bound, last), the individual that sets ε_all always included (as an
    extra row when it is not among the ``k``). Columns: the id, :data:`RISKIEST_COLUMNS`, the
    result's ``own`` columns, ``sole_contributor`` and ``sets_eps_all`` (as
    :meth:`empdp.assessment.Assessment.riskiest`)."""
    ind = result.individuals
    own = [c for c in own if c in ind.columns]  # a saved result keeps the table's columns it was written with
    eps_i = ind["eps_i"].fill_null(np.nan).to_numpy()
    sole = ind["sole_contributor"].to_numpy()
    sets = ~sole & (eps_i == result.eps_all) & (result.eps_all > 0)
    table = ind.with_columns(pl.lit(float(eps)).alias("epsilon"), pl.Series("delta", delta, dtype=pl.Float64,
                                                                          nan_to_null=True),
                             pl.Series("sets_eps_all", sets)) \
        .select([result.id_column, *RISKIEST_COLUMNS, *own, "sole_contributor", "sets_eps_all"]) \
        .sort(["delta", "eps_i"], descending=True, nulls_last=True, maintain_order=True)
    head = table.head(k)
    return head if head["sets_eps_all"].any() else head.vstack(table.filter(pl.col("sets_eps_all")).head(1))


def check_rank_epsilon(epsilon) -> float:
    """The ε of a riskiest table: finite and ≥ 0."""
    eps = float(epsilon)
    if not (np.isfinite(eps) and eps >= 0):
        raise InputError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return eps
