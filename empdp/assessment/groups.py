"""Grouped statistics: one statistic per group of a column and database, e.g. mean(x) by region each
year (docs/method.md#102-joint-queries, issue 19).

The release is the vector (f(X^j ∩ g))_g of the G groups. An individual changes only the groups
their rows are in (k of them):

* G ≤ 3: the vector is one joint query, exactly :func:`empdp.assessment.joint.assess_joint` of the
  statistic filtered to each group;
* G > 3 and k ≤ 3: the exact joint risk of those k groups' statistics (the joint model of their
  series, one model per set of groups; k = 1 is the group's one-statistic model);
* G > 3 and k > 3: each group's exact risk (``group_risks``) and the certified bound
  Σ_g M_ig ≥ ε_i (M_ig the screening bound of group g's model, docs/method.md#43-exact-screening)
  in the column ``eps_bound`` (a bound for everyone, as for a joint query); ``eps_i`` stays null.
  The bound holds for the groups' statistics modelled as independent releases (basic composition),
  which is what makes it cheap; it does not see a dependence between the groups' series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..errors import InputError
from ..io import jsonable
from ..loo.joint import GroupPanel, read_grouped
from ..models import GROUPED
from ..params import available_cores
from ..progress import READING, Progress, no_progress
from ..risk.joint import MAX_DIM, JointModel, joint_bound, joint_risk, select_joint_model
from . import checks
from .evaluation import default_epsilons
from .joint_evaluation import TOLERANCE, Certified, Part, bracket_columns, check_tolerance, search_eps_all
from .sweep import RiskSweep, check_rank_epsilon, ranked


@dataclass(kw_only=True)
class GroupedAssessment(RiskSweep):
    """Result of :func:`assess_grouped`: as :class:`empdp.assessment.joint.JointAssessment`, for one
    statistic per group.

    ``individuals`` has the id, ``eps_i`` (exact; ∞ for sole contributors; null where only a bound
    is known: the individual touches more than 3 of G > 3 groups; null also where it was not needed,
    as for a joint query, unless ``exact_all``), ``eps_bound`` (a certified bound ≥ ε_i, as in
    :class:`empdp.assessment.joint.JointAssessment`: the screening bound M_i of the individual's
    model, and for the bounded the sum Σ_g M_ig of their groups'), ``delta_lo``, ``delta_hi`` (a
    certified bracket of δ_i at the smallest ε) and ``delta`` (exact where the bracket is closed;
    null where open, or only bounded and the bound exceeds it), ``n_databases``, ``groups``
    (k, the groups the individual's rows are in) and ``sole_contributor``. ``group_risks`` has, for
    each bounded individual and group it touches, the group's exact ``eps_i``, its bound
    ``eps_bound`` (M_ig) and ``delta`` at the smallest ε.
    ``delta``, ``total_risk`` (the midpoint of ``total_risk_bounds``, certified as for a joint query)
    and ``n_at_risk`` cover the individuals whose risk is exact;
    ``n_unresolved`` counts, per ε, the bounded individuals whose bound exceeds it (they may be at
    risk there). ``eps_all`` is over exact ε_i; ``eps_all_bound`` ≥ every ε_i (bounds included).
    """

    query: str
    group_by: str
    groups: list
    names: list
    #: the density model of each set of groups (tuple of group positions); (0..G−1) when G ≤ 3
    models: dict
    group_risks: pl.DataFrame
    n_unresolved: np.ndarray
    eps_all_bound: float
    #: one line per kind of finding; the groups' notes summarised in one line, listed in ``warning_details``
    warnings: list = field(default_factory=list)
    warning_details: list = field(default_factory=list)
    #: the independence checks of each group's series over the databases (as for one statistic)
    independence: list = field(default_factory=list)
    #: as :class:`empdp.assessment.joint.JointAssessment`: the certified bracket of δ*(ε) (E, 2), its
    #: relative width, whether every δ_i is exact
    total_risk_bounds: np.ndarray | None = None
    tolerance: float = TOLERANCE
    exact: bool = False
    #: the per-individual brackets and the rows they belong to, refined on demand by :meth:`riskiest`
    certified: Certified | None = field(default=None, repr=False)
    assessed: "_Rows | None" = field(default=None, repr=False)

    kind = GROUPED

    @property
    def statistic(self) -> str:
        return f"{self.query} by {self.group_by}"

    def log_lines(self) -> list[str]:
        how = "one joint query" if self.joint else "each individual on the groups their rows are in"
        return [*super().log_lines(), f"{len(self.groups)} groups ({how}), {self.n_bound_only} bounded only",
                f"eps_all {self.eps_all:.6g}"]

    @property
    def joint(self) -> bool:
        """True when the groups are few enough (≤ 3) to be assessed as one joint query."""
        return len(self.groups) <= MAX_DIM

    @property
    def n_bound_only(self) -> int:
        """Individuals whose risk is only bounded (rows in more than 3 of G > 3 groups)."""
        return int(self.individuals["eps_i"].is_null().sum())

    @property
    def eps_i(self) -> np.ndarray:
        """Exact ε_i (NaN where only a bound is known)."""
        return self.individuals["eps_i"].fill_null(np.nan).to_numpy()

    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest individuals by exact δ_i at ``epsilon``, ties by ε_i, the individuals known
        only by a bound last; the individual that sets ε_all always included (as
        :meth:`empdp.assessment.Assessment.riskiest`). A grouped result keeps δ_i at its smallest
        assessed ε only, the one ``epsilon`` may be (default)."""
        eps = float(self.epsilons[0]) if epsilon is None else check_rank_epsilon(epsilon)
        if eps != float(self.epsilons[0]):
            raise InputError(f"a grouped result ranks at its smallest assessed epsilon, "
                             f"{float(self.epsilons[0]):g}; to rank at {eps:g}, assess with `epsilon` {eps:g}",
                             param="epsilon")
        if self.certified is not None:
            self._refine_top(k)
        return ranked(self, eps, self.individuals["delta"].fill_null(np.nan).to_numpy(), ["eps_bound", "groups"], k)

    def _refine_top(self, k: int) -> None:
        """Exact δ_i for the ``k`` largest at the smallest ε and any row whose bound may reach them, and
        exact ε_i for the rows at δ_i = 0 the table may rank (as :meth:`JointAssessment.riskiest`)."""
        cert, rows = self.certified, self.assessed
        cert.top(k, 0)
        owners = rows.owners
        sole = self.individuals["sole_contributor"].to_numpy()
        positive = int(sole.sum() + (cert.lo[:, 0] > 0).sum())
        cert.rank_zero(k - positive, cert.hi[:, 0] <= 0)
        rows.sync(cert)
        self.individuals = self.individuals.with_columns(
            pl.Series("eps_i", rows.eps_i, nan_to_null=True),
            *[v.alias(c) for c, v in bracket_columns(cert, owners, rows.base(self.epsilons[0])).items()])

    def _bounds(self) -> list:
        return [None] * len(self.epsilons) if self.total_risk_bounds is None else list(self.total_risk_bounds)

    def to_dict(self) -> dict:
        G = len(self.groups)
        if self.joint:
            full = self.models[tuple(range(G))]
            bandwidth, density = full.scales.tolist(), full.describe()
        else:
            bandwidth = [float(self.models[(g,)].scales[0]) for g in range(G)]
            density = {"kind": "laplace-product per set of groups", "models": [
                {"groups": [jsonable(self.groups[g]) for g in S], **m.describe()} for S, m in self.models.items()]}
        return {
            "source": self.source, "query": self.query, "group_by": self.group_by,
            "groups": [jsonable(g) for g in self.groups], "id": self.id_column, "by": self.by_column,
            "n_databases": self.n_databases, "n_individuals": self.individuals.height,
            "kernel": "laplace", "bandwidth": bandwidth, "density_model": density,
            "eps_all": jsonable(self.eps_all), "eps_all_bound": jsonable(self.eps_all_bound),
            "n_bound_only": self.n_bound_only,
            "tolerance": 0.0 if self.exact else self.tolerance,
            "sweep": [{"epsilon": float(e), "delta": float(d), "total_risk": float(t), "n_at_risk": int(c),
                       "n_unresolved": int(u), **({} if b is None else {"total_risk_bounds": [float(v) for v in b]})}
                      for e, d, t, c, u, b in zip(self.epsilons, self.delta, self.total_risk, self.n_at_risk,
                                                  self.n_unresolved, self._bounds())],
            "independence": list(self.independence),
            "sole_contributors": int(self.sole_contributors), "warnings": list(self.warnings),
            "warning_details": list(self.warning_details),
            "notes": ["total_risk assumes the individuals' risks are independent"] + ([] if self.joint else [
                "each individual is assessed on the groups their rows are in (jointly when at most 3); the "
                "model of those groups does not condition on the other groups' values",
                "an individual with rows in more than 3 groups has no exact eps_i: their eps_bound is the sum of "
                "their groups' screening bounds, a certified bound on epsilon_i for the groups released as "
                "independent statistics; delta, total_risk and n_at_risk leave out, at each epsilon, the "
                "n_unresolved such individuals whose bound exceeds it"]),
        }


def _fixed_scales(bandwidth, G: int):
    """None for ``"auto"``; else G fixed scales (one number is used for every group)."""
    if isinstance(bandwidth, str) and bandwidth == "auto":
        return None
    try:
        b = np.atleast_1d(np.asarray(bandwidth, dtype=np.float64))
    except (TypeError, ValueError):
        raise InputError(f"`bandwidth` must be auto, one scale, or one scale per group ({G}); got {bandwidth!r}",
                         param="bandwidth") from None
    if b.ndim != 1 or b.size not in (1, G):
        raise InputError(f"`bandwidth` needs one scale, or one per group ({G}); got {b.size}", param="bandwidth")
    return np.full(G, b[0]) if b.size == 1 else b


class _Models:
    """The joint model of each set of groups' series, fitted once (paired kernels for every individual)."""

    def __init__(self, panel: GroupPanel, scales):
        self.panel, self.scales, self.fitted = panel, scales, {}
        G = panel.n_groups  # the whole vector's model, or each group's (for the bounds and the JSON)
        for groups in [tuple(range(G))] if G <= MAX_DIM else [(g,) for g in range(G)]:
            self(groups)

    def __call__(self, groups: tuple) -> JointModel:
        if groups not in self.fitted:
            at = list(groups)
            self.fitted[groups] = select_joint_model(
                self.panel.q[:, at], bandwidth="auto" if self.scales is None else self.scales[at],
                names=[self.panel.names[g] for g in at])
        return self.fitted[groups]


def _subsets(panel: GroupPanel, rows: np.ndarray) -> list:
    """(groups, rows) of the individuals at ``rows`` by the set of groups their model covers: all G
    groups when G ≤ 3, else the groups their rows touch."""
    G = panel.n_groups
    if G <= MAX_DIM:
        return [(tuple(range(G)), rows)]
    if not len(rows):
        return []
    patterns, inverse = np.unique(panel.touched[rows], axis=0, return_inverse=True)
    inverse = inverse.ravel()
    return [(tuple(int(g) for g in np.flatnonzero(p)), rows[inverse == u]) for u, p in enumerate(patterns)]


def assess_grouped(source: Any, *, id: str, by: str, group_by: str, query: str | None = None,
                   sql: str | None = None, where: str | None = None, epsilon=None, bandwidth="auto",
                   drop_null_ids: bool = False, memory_limit: str | None = None,
                   threads: int | None = None, tolerance: float = TOLERANCE, exact: bool = False,
                   exact_all: bool = False, progress: Progress = no_progress,
                   engine: Any = "duckdb") -> GroupedAssessment:
    """Per-individual empirical risk of releasing one statistic per group of ``group_by`` and database.

    Parameters
    ----------
    source, id, by, where, drop_null_ids, memory_limit, threads, progress
        As for :func:`empdp.assessment.assess`; the exact evaluation runs in ``threads`` (default: the
        available cores; the results do not depend on it).
    group_by
        The group column (e.g. region): the release is the statistic of each group's rows. Every
        group must have rows in every database, and no row the statistic reads may have a NULL group.
    query or sql
        One query form (``"mean(x)"``, with ``where``) or one SQL over ``db``, computed per group.
    epsilon
        One ε or a list; default 50 values log-spaced over [ε_all/20, 1.25 ε_all].
    bandwidth
        ``"auto"`` (each set of groups: whitened product Laplace kernels, scales by leave-one-out
        likelihood; one group: the one-statistic Laplace model) or fixed scales in the statistic's
        units, one for every group or one per group in the order of ``groups``.
    tolerance, exact, exact_all
        As for :func:`empdp.assessment.joint.assess_joint`: the total risk certified to a bracket of
        relative width ``tolerance``, or every δ_i exact; ε_i exact for every exactly assessed
        individual (``--out``), otherwise where ε_all, the at-risk counts and the table need it.
    engine
        Where the groups are read, as for :func:`empdp.assessment.joint.assess_joint`.

    Raises
    ------
    empdp.errors.InputError
        Bad input (one line), among others a NULL group, a group missing from a database, or a
        set of groups whose statistics are exactly dependent over the databases
        (:class:`empdp.risk.joint.SingularCovarianceError`).
    """
    tolerance = check_tolerance(tolerance)
    given = None if epsilon is None else np.sort(np.atleast_1d(np.asarray(epsilon, float)))
    if given is not None and not np.all(np.isfinite(given) & (given >= 0)):
        raise InputError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    if not (isinstance(bandwidth, str) and bandwidth == "auto"):
        _fixed_scales(bandwidth, np.size(bandwidth))  # a malformed value is refused before the table is read
    progress(READING, 0, 1)
    panel = read_grouped(source, id=id, by=by, group_by=group_by, query=query, sql=sql, where=where,
                         drop_null_ids=drop_null_ids, memory_limit=memory_limit, threads=threads, engine=engine,
                         check=lambda G: _fixed_scales(bandwidth, G))  # the count, before the groups are read
    progress(READING, 1, 1)
    cores = available_cores() if threads is None else max(1, int(threads))
    models = _Models(panel, _fixed_scales(bandwidth, panel.n_groups))
    rows = _Rows.evaluate(panel, models, cores, progress)
    eps = default_epsilons(rows.eps_all) if epsilon is None else given
    cert = rows.certify(eps, tolerance, exact, cores, progress)
    if exact_all:
        progress("eps_i", 0, 1)
        cert.fill_eps()
        rows.sync(cert)
        progress("eps_i", 1, 1)
    unresolved = rows.bounded[:, None] & (eps[None, :] < rows.bound[:, None])  # below a bounded one's bound
    individuals = pl.DataFrame({
        id: panel.ids, "eps_i": pl.Series(rows.eps_i, nan_to_null=True), "eps_bound": rows.bound,
        **bracket_columns(cert, rows.owners, rows.base(eps[0])), "n_databases": panel.present,
        "groups": panel.touched.sum(axis=1), "sole_contributor": panel.sole,
    })
    warnings, independence, details = _checks(panel, rows.bounded)
    bounds = cert.totals()
    return GroupedAssessment(
        source=str(source) if isinstance(source, str) else type(source).__name__,
        query=(query if query is not None else sql).strip(), group_by=group_by, groups=panel.groups,
        names=panel.names, id_column=id, by_column=by, labels=panel.labels, q=panel.q, models=dict(models.fitted),
        epsilons=eps, delta=cert.worst(), total_risk=bounds.mean(axis=1), total_risk_bounds=bounds,
        tolerance=tolerance, exact=exact, n_at_risk=cert.n_at_risk(),
        n_unresolved=unresolved.sum(axis=0), eps_all=rows.eps_all,
        eps_all_bound=max(rows.eps_all, float(rows.bound[rows.bounded].max(initial=0.0))),
        individuals=individuals, group_risks=rows.group_risks(eps[0], id),
        sole_contributors=int(panel.sole.sum()), warnings=warnings, warning_details=details,
        independence=independence, certified=cert, assessed=rows)


@dataclass
class _Rows:
    """Every individual's exact ε_i or bound: ``exact`` rows by the model of their set of groups
    (``parts``: model, rows, shifts), ``bounded`` rows by each group's model (``per_group``: group,
    rows, shifts); sole contributors neither (ε_i = M_i = ∞)."""

    panel: GroupPanel
    models: _Models
    exact: np.ndarray
    bounded: np.ndarray
    eps_i: np.ndarray
    bound: np.ndarray
    parts: list
    per_group: list
    #: ε_all: the largest exact ε_i of the exactly assessed rows
    eps_all: float

    @classmethod
    def evaluate(cls, panel: GroupPanel, models: _Models, threads: int = 1,
                 progress: Progress = no_progress) -> "_Rows":
        """Screening bounds for everyone and ε_all exactly, by the search of
        :func:`empdp.assessment.joint_evaluation.search_eps_all` over every set of groups (the sets with
        the largest bounds first, each starting from the ε_all found so far)."""
        G, sole, k = panel.n_groups, panel.sole, panel.touched.sum(axis=1)
        exact = ~sole & ((k <= MAX_DIM) | (G <= MAX_DIM))
        bounded = ~sole & ~exact
        eps_i = np.where(exact, np.nan, np.where(bounded, np.nan, np.inf))
        bound = np.where(sole, np.inf, 0.0)
        parts = []
        for groups, rows in _subsets(panel, np.flatnonzero(exact)):
            model, shifts = models(groups), panel.stack(rows, groups)
            bound[rows] = joint_bound(model, shifts)
            parts.append((model, rows, shifts))
        parts.sort(key=lambda part: -bound[part[1]].max(initial=0.0))
        best = 0.0
        for model, rows, shifts in parts:
            found, best = search_eps_all(model, shifts, np.arange(len(rows)), bound[rows], threads, progress, best)
            eps_i[rows] = found
        per_group = []
        for g in range(G) if bounded.any() else ():
            rows = np.flatnonzero(bounded & panel.touched[:, g])
            shifts = panel.stack(rows, (g,))
            bound[rows] += joint_bound(models((g,)), shifts)  # Σ_g M_ig ≥ ε_i of the groups as independent releases
            per_group.append((g, rows, shifts))
        return cls(panel, models, exact, bounded, eps_i, bound, parts, per_group, best)

    def certify(self, eps: np.ndarray, tolerance: float, exact: bool, threads: int = 1,
                progress: Progress = no_progress) -> Certified:
        """The certified brackets of every exactly assessed row, all sets of groups in one release
        (:class:`empdp.assessment.joint_evaluation.Certified`: one total, one worst case); sole
        contributors at δ_i = 1. Writes the exact ε_i found back to ``eps_i``."""
        parts = [Part(model, shifts, self.bound[rows], self.eps_i[rows]) for model, rows, shifts in self.parts]
        cert = Certified(parts, eps, tolerance=tolerance, exact=exact, threads=threads, progress=progress,
                         fixed=np.ones((int(self.panel.sole.sum()), len(eps))))
        self.sync(cert)
        return cert

    @property
    def owners(self) -> np.ndarray:
        """The table row of each row of the certified brackets (parts in order)."""
        return np.concatenate([rows for _, rows, _ in self.parts]) if self.parts else np.zeros(0, dtype=np.int64)

    def base(self, eps0: float) -> np.ndarray:
        """δ_i at ``eps0`` of the rows outside the brackets: 1 for sole contributors, unknown (NaN) for
        the bounded below their bound, else 0."""
        return np.where(self.panel.sole, 1.0, np.where(self.bounded & (self.bound > eps0), np.nan, 0.0))

    def sync(self, cert: Certified) -> None:
        self.eps_i[self.owners] = cert.eps_i

    def group_risks(self, eps0: float, id: str) -> pl.DataFrame:
        """Each bounded individual's exact risk in each group it touches (the group's one-statistic model)."""
        panel, frames = self.panel, []
        for g, rows, shifts in self.per_group:
            model = self.models((g,))
            e, d = joint_risk(model, shifts, [eps0])
            frames.append(pl.DataFrame({id: panel.ids.gather(rows), "group": pl.Series([panel.groups[g]] * len(rows)),
                                        "eps_i": e, "eps_bound": joint_bound(model, shifts), "delta": d[:, 0]}))
        if frames:
            return pl.concat(frames).sort([id, "group"], maintain_order=True)
        return pl.DataFrame({id: panel.ids.head(0), "group": pl.Series([], dtype=pl.Null)}).with_columns(
            pl.lit(None, dtype=pl.Float64).alias(c) for c in ("eps_i", "eps_bound", "delta"))


def _checks(panel: GroupPanel, bounded: np.ndarray) -> tuple[list, list, list]:
    """(warnings, independence, details): each group's series tested as for one statistic, sole
    contributors, and the individuals only bounded. The groups' notes (one per group and check) are
    summarised in one line of ``warnings`` and listed in ``details``. Every group is in every
    database: the small-sample warning (:func:`empdp.assessment.checks.few_databases`) is given once."""
    few = checks.few_databases(len(panel.q))
    warnings, independence, details = list(few), [], []
    for g, name in enumerate(panel.names):
        checked, notes = checks.independence(panel.q[:, g])
        independence.append(checked)
        details += [f"{name}: {w}" for w in notes if w not in few]
    if details:
        groups = sum(any(d.startswith(f"{name}: ") for d in details) for name in panel.names)
        warnings.append(f"{len(details)} note(s) on the series of {groups} of the {panel.n_groups} groups "
                        "(autocorrelation, trend, individuals in one database): the risk estimates may be off "
                        "for them; each note is listed with -v")
    if panel.sole.any():
        warnings.append(f"{int(panel.sole.sum())} individual(s) are the only contributor to some group of some "
                        "database: delta_i = 1, eps_i = inf; no epsilon protects them")
    if bounded.any():
        warnings.append(f"{int(bounded.sum())} individual(s) have rows in more than {MAX_DIM} groups: their risk is "
                        "only bounded (eps_bound), per group in group_risks")
    return warnings, independence, details
