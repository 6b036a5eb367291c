"""Uncertainty of an assessment: intervals for ε_all and the sweep by subsampling databases
(docs/method.md, "Uncertainty of the estimates").

ε_all, δ(ε), δ*(ε) and the at-risk counts are estimates from the n databases at hand. The
interval says how far they move over *other sets of n databases from the same process*. Each of
B replicates keeps b of the databases (without replacement; whole blocks of consecutive databases
when they are autocorrelated), re-selects the density model on their query values and recomputes
the estimate from the leave-one-out shifts already computed (their columns of the kept databases;
nothing is read again). Why this method (Politis, Romano and Wolf 1999, subsampling):

- ε_all is a maximum (over individuals and over the line), for which the plain bootstrap is
  inconsistent (Bickel and Freedman 1981); resampling *with* replacement also puts ties among the
  query values, where the leave-one-out likelihood of the bandwidth grows without bound as the
  scale shrinks. Subsampling without replacement has neither problem.
- The rate at which the estimate's spread changes with n is not known and differs by process
  (measured on log ε_all: it shrinks for bounded effects, hardly for heavy-tailed database
  effects). So the replicates keep databases in turn at :data:`SHARES` of n, and the rate is
  estimated from their spreads at those sizes (Bertail, Politis and Romano 1999): the log of each
  size's 10–90% range, corrected for sampling a finite panel without replacement (the factor
  √(1 − b/n) of a mean), is regressed on log b, and the line gives the spread at n.
- The interval is the basic (pivotal) one on the log scale: each replicate's deviation from its
  size's median, scaled by the ratio of the spread at n to its size's spread, and the full
  estimate t minus the (1 ± L)/2 quantiles of those deviations.
- Serial dependence: when the query values are autocorrelated (Ljung–Box p < 0.05), whole blocks
  of consecutive databases (length ≈ n^(1/3)) are kept or dropped together.
- Validated for ε_all (tests/bench/uncertainty_validation.py: coverage 0.86–0.95 at level 0.9 in
  11 of 12 stationary cases from 20 databases). The δ*(ε) interval covers less (0.66–0.86): small
  subsamples often give δ* = 0, and the linear scale it then falls back to cannot reach δ*'s
  multiplicative spread.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import risk
from ..density import DensityModel, reference_scale, select_density
from ..errors import InputError
from ..noise.exact import minimal_lambda
from ..params import target_epsilon, whole
from . import checks

#: the name of the method in the JSON ``uncertainty`` object
METHOD = ("subsampling of databases at 0.15-0.5 n (blocks when autocorrelated), rate of convergence estimated "
          "from the spreads at those sizes, log-scale basic interval")
#: the validation (tests/bench/uncertainty_validation.py) holds its target from this many databases on
MIN_VALIDATED = 20
#: what the validation found of the sweep's intervals (docs/method.md#71-uncertainty-of-the-estimates): shown
#: wherever they are
SWEEP_NOTE = ("only the eps_all interval is validated; the intervals of delta, total risk and the number at risk "
              "are not (in simulation at level 0.9 the total risk's interval covered 0.66-0.86 of the time: too "
              "narrow)")
#: the shares of the databases (or of their blocks) the replicates keep, in turn: four sizes, so that
#: the spread's rate of change with the number of databases can be estimated
SHARES = (0.15, 0.25, 0.35, 0.5)
#: the largest |β| of the estimated rate b^β: no estimate here converges faster than a mean (√b), and
#: a steeper slope from four noisy spreads is noise (per panel, β̂ varies by ±0.3 on the validation's processes)
MAX_RATE = 0.5
#: the spread of a size's replicates: their 10–90% range (wider quantiles are too noisy at B/4)
SPREAD = (0.1, 0.9)
#: a replicate must keep this many databases to fit a density model
MIN_KEPT = 3
#: fewer databases than this give subsamples that are most of the panel, or too few to fit
MIN_DATABASES = 9
#: the individuals evaluated exactly in every replicate's sweep (those with the largest reach); beyond
#: them a uniform sample of :data:`SAMPLE_ROWS` stands for the rest (weighted by the inverse share)
EXACT_ROWS, SAMPLE_ROWS = 2048, 2048
#: the candidate scales of :func:`empdp.density.select_density` (its default ``n_scales``)
SCALES = 41
#: rows a replicate evaluates at once in the search for its ε_all
SEARCH_BATCH = 256


@dataclass(frozen=True)
class Plan:
    """The replicates: which databases each keeps and the density model re-selected on them.

    Attributes
    ----------
    subsets : list of ndarray
        Database indices kept by each replicate (ascending), at the sizes of :data:`SHARES` in turn.
    models : list of DensityModel
        The model re-selected on each replicate's query values.
    block : int
        Consecutive databases kept or dropped together (1: none).
    n : int
        Databases of the full panel.
    """

    subsets: np.ndarray
    models: list
    block: int
    n: int

    @property
    def sizes(self) -> np.ndarray:
        """The databases each replicate keeps (B,)."""
        return subset_sizes(self.subsets)

    @property
    def min_bandwidth(self) -> float:
        """The smallest kernel scale of any replicate: bounds every replicate's M_i from max |Δ_ij|."""
        return min(float(model.bandwidths.min()) for model in self.models)


@dataclass
class Uncertainty:
    """Intervals of one assessment's estimates (:func:`estimate`, :func:`from_assessment`).

    Attributes
    ----------
    method : str
        :data:`METHOD`.
    replicates, level : int, float
        B and the interval's level L.
    eps_all : ndarray (2,)
        [lo, hi] of ε_all.
    delta, total_risk, n_at_risk : ndarray (E, 2)
        [lo, hi] of δ(ε), δ*(ε) and the at-risk count at each swept ε.
    block : int
        Block length.
    sizes : tuple of int
        The distinct numbers of databases the replicates keep.
    sampled : tuple of int or None
        (individuals evaluated, individuals that can be at risk) when the sweep's replicates
        sampled individuals (more than :data:`EXACT_ROWS` can be at risk), else None.
    warnings : list of str
        :func:`warnings_for` lines.
    """

    method: str
    replicates: int
    level: float
    eps_all: np.ndarray
    delta: np.ndarray
    total_risk: np.ndarray
    n_at_risk: np.ndarray
    block: int
    sizes: tuple
    sampled: tuple | None = None
    warnings: list = field(default_factory=list)
    plan: Plan | None = field(default=None, repr=False)
    eps_all_replicates: np.ndarray | None = field(default=None, repr=False)

    @property
    def size(self) -> str:
        """The databases per replicate, as text: "6–20"."""
        return size_text(self.sizes)

    def to_dict(self) -> dict:
        """The JSON ``uncertainty`` object."""
        pairs = lambda a: [[float(lo), float(hi)] for lo, hi in a]  # noqa: E731
        return {"method": self.method, "replicates": self.replicates, "level": self.level,
                "eps_all": [float(v) for v in self.eps_all],
                "sweep": {"delta": pairs(self.delta), "total_risk": pairs(self.total_risk),
                          "n_at_risk": [[int(lo), int(hi)] for lo, hi in self.n_at_risk]},
                "databases_per_replicate": [int(v) for v in self.sizes], "block_length": self.block,
                **({"sampled_individuals": list(self.sampled)} if self.sampled else {}),
                "warnings": list(self.warnings), "validated": ["eps_all"], "notes": [SWEEP_NOTE]}


# ------------------------------------------------------------------------ checks and plan
def check_options(replicates, level) -> tuple[int, float]:
    """``replicates`` and ``level`` checked once, with one-line errors naming the parameter."""
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating, np.integer)) \
            or not (0 < float(level) < 1):
        raise InputError(f"`level` must be a number strictly between 0 and 1 (e.g. 0.9 for a 90% interval); "
                         f"got {level!r}", param="level")
    if isinstance(replicates, bool) or not isinstance(replicates, (int, np.integer)) or replicates < 1:
        raise InputError(f"`replicates` must be a whole number >= 1 (e.g. 200); got {replicates!r}",
                         param="replicates")
    least = math.ceil(2 / (1 - float(level)) - 1e-9)
    if replicates < least:
        raise InputError(f"`replicates` {replicates} is too few for a {float(level):g} interval: its tails need at "
                         f"least {least} (2 / (1 - level)); use more replicates or a lower `level`",
                         param=("replicates", "level"))
    return int(replicates), float(level)


def block_length(q: np.ndarray) -> int:
    """1 when the query values show no autocorrelation (Ljung–Box p ≥ 0.05), else ≈ n^(1/3)."""
    p, _ = checks.ljung_box(np.asarray(q, dtype=float))
    return 1 if p >= 0.05 else max(2, round(len(q) ** (1 / 3)))


def draw_subsets(n: int, replicates: int, block: int, rng) -> list:
    """B subsamples: replicate k keeps round(s K) of the K = ⌊n/block⌋ blocks of consecutive databases
    (s = :data:`SHARES` [k mod 4]; at least :data:`MIN_KEPT` databases, at most K − 1 blocks), at a
    random offset. On few databases the shares may round to one size; then no rate is estimated
    (:func:`deviations_at_n`)."""
    rng = np.random.default_rng(rng)
    k = n // block
    least = math.ceil(MIN_KEPT / block)
    if n < MIN_DATABASES or k - 1 < least:
        raise InputError(f"the uncertainty needs at least {max(MIN_DATABASES, (least + 1) * block)} databases "
                         f"(subsamples of {MIN_KEPT} or more of them, fewer than all); this source has {n}",
                         param="uncertainty")
    keeps = [min(max(round(share * k), least), k - 1) for share in SHARES]
    offsets = rng.integers(0, n - k * block + 1, size=replicates)
    order = np.argsort(rng.random((replicates, k)), axis=1)
    out = []
    for r in range(replicates):
        chosen = np.sort(order[r, :keeps[r % len(keeps)]])
        out.append(offsets[r] + (chosen[:, None] * block + np.arange(block)).ravel())
    return out


def subset_sizes(subsets) -> np.ndarray:
    """The databases each subsample keeps."""
    return np.array([len(s) for s in subsets])


def size_text(sizes) -> str:
    """Subsample sizes as text for messages: "6–20" (one size: "6")."""
    return f"{min(sizes)}–{max(sizes)}" if min(sizes) < max(sizes) else f"{min(sizes)}"


def bandwidth_option(model: DensityModel):
    """The ``bandwidth`` option that selected ``model``: its scale when fixed, else 'auto' or 'variable'."""
    if model.selected_by == "fixed":
        return float(model.scale)
    return "variable" if len({c["sensitivity"] for c in model.candidates}) > 1 else "auto"


def refit(model: DensityModel, q: np.ndarray, bandwidth=None) -> DensityModel:
    """The density model re-selected on ``q`` as ``model`` was (same kernel and bandwidth option).

    The kernel is kept: ε_i of different kernels are different quantities (Gaussian: at a tolerance).
    Values too alike to select a scale (all equal) keep the full model's scale.
    """
    bandwidth = bandwidth_option(model) if bandwidth is None else bandwidth
    try:
        if bandwidth == "auto" and len(q) <= MATRIX_FIT:
            return _matrix_fit(model.kernel, q)
        return select_density(q, kernel=model.kernel, bandwidth=bandwidth)
    except InputError:
        return select_density(q, kernel=model.kernel, bandwidth=float(model.scale))


#: replicates of at most this many databases select their scale from one (scales, n, n) array
MATRIX_FIT = 200


def _matrix_fit(kernel, q: np.ndarray) -> DensityModel:
    """:func:`empdp.density.select_density` with ``bandwidth='auto'``, every candidate scale's
    leave-one-out likelihood from one array: the same candidates and choice (the first best), in
    a tenth of the time for tens of databases (there the per-candidate calls cost 11 ms a fit, most
    of a replicate's time)."""
    h0 = reference_scale(q)
    if not h0 > 0:
        raise InputError("all query values are equal")
    scales = h0 * np.logspace(np.log10(0.1), np.log10(5.0), SCALES)
    terms = kernel.logpdf(q[None, :, None] - q[None, None, :], scales[:, None, None])
    terms[:, np.arange(len(q)), np.arange(len(q))] = -np.inf
    top = terms.max(axis=2, keepdims=True)  # (scipy's logsumexp costs more than the sums here)
    sums = np.log(np.exp(terms - top).sum(axis=2)) + top[..., 0]
    loglik = (sums - np.log(len(q) - 1)).sum(axis=1)
    k = int(np.argmax(loglik))
    if not np.isfinite(loglik[k]):
        raise InputError("no finite likelihood")
    return DensityModel(kernel, float(scales[k]), 0.0, q, np.full(len(q), scales[k]), loglik=float(loglik[k]))


def make_plan(q, model: DensityModel, replicates: int, rng, bandwidth=None, block: int | None = None) -> Plan:
    """Draw the subsamples and re-select the density model on each."""
    q = np.asarray(q, dtype=float)
    block = block_length(q) if block is None else int(block)
    subsets = draw_subsets(len(q), replicates, block, rng)
    return Plan(subsets, [refit(model, q[s], bandwidth) for s in subsets], block, len(q))


# ------------------------------------------------------------------------ one replicate
@dataclass(frozen=True)
class Rows:
    """The shifts the replicates use and how the sweep weighs them.

    ``shifts`` (k, n) holds every individual whose ε_i can reach the smallest ε that matters
    (sole contributors excluded). ``sweep`` indexes the rows the sweep evaluates, each standing for
    ``weight`` individuals (1 for the rows evaluated exactly; the inverse sampling share otherwise).
    """

    shifts: np.ndarray
    sweep: np.ndarray
    weight: np.ndarray

    @classmethod
    def all(cls, shifts) -> "Rows":
        shifts = np.atleast_2d(np.asarray(shifts, dtype=float))
        return cls(shifts, np.arange(len(shifts)), np.ones(len(shifts)))


def _bounds(model: DensityModel, shifts: np.ndarray) -> np.ndarray:
    """Certified upper bounds on each row's ε_i under ``model`` (docs/method.md#51-screening-bound)."""
    scaled = (np.abs(shifts) / model.bandwidths).max(axis=1, initial=0.0)
    return model.kernel.eps_bound(scaled, 1.0)


def replicate(model: DensityModel, rows: Rows, columns, eps: np.ndarray, sole: int = 0):
    """ε_all, δ(ε), δ*(ε) and the at-risk count of one replicate (the databases ``columns``).

    ε_all is exact: rows in decreasing order of their bound until it falls to the largest ε_i found.
    The sweep sums the rows ``rows.sweep`` whose bound passes the smallest ε, with their weights.
    Sole contributors count as in the assessment (δ_i = 1 at every ε, not in ε_all).
    """
    shifts = rows.shifts[:, columns]
    bound = _bounds(model, shifts)
    cand = rows.sweep[bound[rows.sweep] > eps[0]]
    eps_i = np.full(len(shifts), np.nan)
    delta, survive, at_risk = np.zeros(len(eps)), np.zeros(len(eps)), np.zeros(len(eps))
    if len(cand):
        e, d = risk.evaluate(model, shifts[cand], eps)
        d = model.kernel.reported_delta(d)
        eps_i[cand] = e
        w = rows.weight[np.searchsorted(rows.sweep, cand)]
        delta = d.max(axis=0)
        with np.errstate(divide="ignore"):
            survive = (w[:, None] * np.log1p(-np.clip(d, 0, 1))).sum(axis=0)
        at_risk = (w[:, None] * (d > 0)).sum(axis=0)
    eps_all = _search(model, shifts, bound, eps_i)
    if sole:
        delta, survive, at_risk = np.ones(len(eps)), np.full(len(eps), -np.inf), at_risk + sole
    return eps_all, delta, np.maximum(-np.expm1(survive), 0.0), at_risk


def _search(model: DensityModel, shifts: np.ndarray, bound: np.ndarray, eps_i: np.ndarray) -> float:
    """max_i ε_i: rows not yet evaluated, by decreasing bound, until the bound is at most the best so far."""
    best = float(np.nanmax(eps_i, initial=0.0))
    todo = np.flatnonzero(np.isnan(eps_i))
    todo = todo[np.argsort(-bound[todo], kind="stable")]
    pos, batch = 0, SEARCH_BATCH
    while pos < len(todo) and bound[todo[pos]] > best:
        rows = todo[pos:pos + batch]
        rows = rows[bound[rows] > best]
        best = max(best, float(risk.evaluate(model, shifts[rows])[0].max(initial=0.0)))
        pos, batch = pos + batch, batch * 2
    return best


# ------------------------------------------------------------------------ intervals
def basic_interval(point, reps: np.ndarray, level: float, sizes, n: int) -> np.ndarray:
    """The basic interval on the log scale of the replicates ``reps`` (B, ...) of sizes ``sizes`` (B,)
    around ``point``, the estimate from all ``n`` databases.

    [t − Q_hi, t − Q_lo] on the log scale, with t the log estimate and Q_lo, Q_hi the (1 ∓ L)/2
    quantiles of the replicates' deviations carried to n databases (:func:`deviations_at_n`). Where
    the point or a replicate is not positive, the same on the linear scale. Returns (..., 2).
    """
    reps = np.asarray(reps, dtype=float)
    point = np.asarray(point, dtype=float)
    positive = (point > 0) & (reps > 0).all(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(positive, np.log(np.where(positive, reps, 1.0)), reps)
        centre = np.where(positive, np.log(np.where(positive, point, 1.0)), point)
    lo_q, hi_q = np.quantile(deviations_at_n(scaled, sizes, n), [(1 - level) / 2, (1 + level) / 2], axis=0)
    ends = np.stack([centre - hi_q, centre - lo_q], axis=-1)
    with np.errstate(over="ignore"):  # an end beyond e^709 is infinite (the callers clip δ and the counts)
        return np.where(positive[..., None], np.exp(ends), ends)


def deviations_at_n(values: np.ndarray, sizes, n: int) -> np.ndarray:
    """Each replicate's deviation from the median of its size's replicates, scaled to ``n`` databases.

    The scale is the ratio of the spread at n to the size's own spread (:func:`log_spread_at`); it is
    1 where the spreads do not give a rate (fewer than two sizes, or a size whose replicates do not
    vary). ``values`` (B, ...), ``sizes`` (B,).
    """
    sizes = np.asarray(sizes)
    groups = np.unique(sizes)
    members = [sizes == g for g in groups]
    med = np.stack([np.median(values[m], axis=0) for m in members])
    hi, lo = SPREAD[1], SPREAD[0]
    spread = np.stack([np.subtract(*np.quantile(values[m], [hi, lo], axis=0)) for m in members])
    usable = (len(groups) > 1) & np.all(np.isfinite(spread) & (spread > 0), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(np.where(usable, spread, 1.0))
        factor = np.where(usable, np.exp(log_spread_at(n, groups, logs) - logs), 1.0)
    at = np.searchsorted(groups, sizes)
    return (values - med[at]) * factor[at]


def log_spread_at(n: int, sizes: np.ndarray, log_spread: np.ndarray) -> np.ndarray:
    """The log spread at ``n`` databases from the log spreads (G, ...) of subsamples of ``sizes`` (G,).

    Subsamples of one panel share their databases, so their spread is smaller than that of
    independent sets of b databases: by √(1 − b/n) for a mean (sampling without replacement). Less
    that, the log spread is taken to be linear in log b, as for an estimator converging at the rate
    b^β (Bertail, Politis and Romano 1999), and the least-squares line, its slope within
    ±:data:`MAX_RATE`, is read at n.
    """
    x = np.log(sizes.astype(float))
    x = (x - x.mean()).reshape((-1,) + (1,) * (log_spread.ndim - 1))
    y = log_spread - 0.5 * np.log1p(-sizes / n).reshape(x.shape)
    slope = np.clip((x * (y - y.mean(axis=0))).sum(axis=0) / (x**2).sum(), -MAX_RATE, MAX_RATE)
    return y.mean(axis=0) + slope * (math.log(n) - np.log(sizes.astype(float)).mean())


def estimate(q, rows: Rows | np.ndarray, *, model: DensityModel, epsilons, replicates: int = 200,
             level: float = 0.9, rng=None, bandwidth=None, block: int | None = None, sole: int = 0,
             n_individuals: int | None = None, point=None, plan: Plan | None = None, threads: int = 1) -> Uncertainty:
    """Intervals for ε_all and the sweep of an assessment of the query values ``q``.

    Parameters
    ----------
    q : (n,) array_like
        The query values f(X^j).
    rows : Rows or (k, n) array_like
        Leave-one-out shifts of the individuals that can matter (all of them when an array).
    model : DensityModel
        The assessment's model; each replicate re-selects one the same way (:func:`refit`).
    epsilons : (E,) array_like
        The assessment's sweep, ascending.
    replicates, level, rng
        B subsamples, the interval's level L, and the random generator (or seed).
    bandwidth
        The assessment's ``bandwidth`` option (default: read from ``model``).
    block
        Block length (default: :func:`block_length` of ``q``).
    sole, n_individuals
        Sole contributors (counted as in the assessment) and all individuals (caps the counts).
    point
        The assessment's estimates (attributes ``eps_all``, ``delta``, ``total_risk``,
        ``n_at_risk``); by default computed here from ``rows``.
    plan
        Replicates drawn before (:func:`make_plan`); then ``replicates``, ``rng`` and ``block`` are unused.
    threads
        Replicates evaluated side by side (the results do not depend on it: each replicate's
        databases and model are drawn before any is evaluated).

    Returns
    -------
    Uncertainty
    """
    replicates, level = check_options(replicates, level)
    q = np.asarray(q, dtype=float)
    eps = np.asarray(epsilons, dtype=float)
    rows = rows if isinstance(rows, Rows) else Rows.all(rows)
    plan = plan or make_plan(q, model, replicates, rng, bandwidth, block)
    if point is None:
        full = replicate(model, rows, slice(None), eps, sole)
    else:
        full = (point.eps_all, point.delta, point.total_risk, point.n_at_risk)
    with ThreadPoolExecutor(whole(threads, "threads")) as pool:
        reps = list(pool.map(lambda k: replicate(plan.models[k], rows, plan.subsets[k], eps, sole),
                             range(len(plan.subsets))))
    return summarise(plan, full, reps, level, n_individuals or len(rows.shifts) + sole, q, rows)


def summarise(plan: Plan, full, reps, level: float, n_individuals: int, q, rows: Rows) -> Uncertainty:
    """The :class:`Uncertainty` of the full estimates ``full`` and the replicates' ``reps``."""
    stack = [np.array([r[k] for r in reps]) for k in range(4)]
    interval = lambda k: basic_interval(full[k], stack[k], level, plan.sizes, plan.n)  # noqa: E731
    eps_all = np.maximum(interval(0), 0.0)
    delta, total = np.clip(interval(1), 0.0, 1.0), np.clip(interval(2), 0.0, 1.0)
    count = interval(3)
    count = np.clip(np.stack([np.floor(count[:, 0] + 1e-9), np.ceil(count[:, 1] - 1e-9)], axis=1), 0,
                    n_individuals).astype(np.int64)
    sampled = None if len(rows.sweep) >= len(rows.weight) and np.all(rows.weight == 1) else \
        (int(len(rows.sweep)), int(round(rows.weight.sum())))
    unc = Uncertainty(METHOD, len(plan.subsets), level, eps_all, delta, total, count, plan.block,
                      tuple(int(v) for v in np.unique(plan.sizes)), sampled, plan=plan, eps_all_replicates=stack[0])
    unc.warnings = warnings_for(q, block=plan.block, size=unc.size)
    return unc


def warnings_for(q, *, block: int, size: str) -> list[str]:
    """The conditions under which the interval is not validated (docs/method.md), as warning lines:
    fewer than :data:`MIN_VALIDATED` databases, a trend, blocks (``block`` > 1) for autocorrelation.
    ``size`` is the databases the replicates keep, as text (:func:`size_text`)."""
    q = np.asarray(q, dtype=float)
    n, out = len(q), []
    if n < MIN_VALIDATED:
        out.append(f"the uncertainty interval rests on only {n} databases (subsamples of {size}): its "
                   f"coverage was validated from {MIN_VALIDATED} databases on, not below")
    p = checks.trend_test(q)
    if p < 0.05:
        out.append(f"the query values trend over the databases (Mann-Kendall p = {p:.2g}): they are not draws of "
                   "one process, and the uncertainty interval (variation over other databases from the same "
                   "process) does not describe next period's value; it is too narrow")
    if block > 1:
        out.append(f"the query values are autocorrelated (Ljung-Box p < 0.05): replicates keep blocks of "
                   f"{block} consecutive databases; with dependence the interval is less reliable")
    return out


# ------------------------------------------------------------------------ from an assessment
def from_assessment(a, *, replicates: int = 200, level: float = 0.9, rng=None, bandwidth=None,
                    block: int | None = None, threads: int = 1) -> Uncertainty:
    """:func:`estimate` for a one-statistic :class:`~empdp.assessment.assess.Assessment`.

    The shifts come from the assessment's engine (its aggregated leave-one-out table, not the
    source), only for individuals who can matter in some replicate: a replicate's bound on ε_i is
    at most max_j |Δ_ij| over its smallest kernel scale, so the others have δ_i = 0 throughout the
    sweep and cannot set any replicate's ε_all. When more than :data:`EXACT_ROWS` individuals can be
    at risk, the sweep evaluates the :data:`EXACT_ROWS` of largest reach and a uniform sample of
    :data:`SAMPLE_ROWS` of the others, weighted (ε_all stays exact).
    """
    replicates, level = check_options(replicates, level)
    if a.adversary or a.engine is None:
        raise InputError("the uncertainty is computed for the plain assessment of one statistic with its data "
                         "(not against an adversary, not from a saved assessment)", param="uncertainty")
    rng = np.random.default_rng(rng)
    plan = make_plan(a.q, a.model, replicates, rng, bandwidth, block)
    ind = a.individuals
    sole = ind["sole_contributor"].to_numpy()
    reach = a.model.kernel.eps_bound(ind["max_abs_shift"].to_numpy() / plan.min_bandwidth, 1.0)
    reach = np.where(sole, -np.inf, reach)
    eps = np.asarray(a.epsilons, dtype=float)
    need = np.flatnonzero(reach > min(eps[0], _floor(a, plan, reach)))
    need = need[np.argsort(-reach[need], kind="stable")]
    rows = _sweep_rows(a.engine.shifts(need), reach[need] > eps[0], rng)
    return estimate(a.q, rows, model=a.model, epsilons=eps, level=level, plan=plan, sole=int(sole.sum()),
                    n_individuals=len(ind), point=a, replicates=replicates, threads=threads)


def _floor(a, plan: Plan, reach: np.ndarray) -> float:
    """A lower bound on every replicate's ε_all: its largest ε_i among the rows of largest reach."""
    top = np.argsort(-reach, kind="stable")[:SEARCH_BATCH]
    top = top[reach[top] > 0]
    if not len(top):
        return 0.0
    shifts = a.engine.shifts(np.sort(top))
    return min(float(risk.evaluate(m, shifts[:, s])[0].max(initial=0.0)) for m, s in zip(plan.models, plan.subsets))


def _sweep_rows(shifts: np.ndarray, pool: np.ndarray, rng) -> Rows:
    """:class:`Rows` of ``shifts`` (ordered by decreasing reach), the sweep over the rows ``pool``
    marks: all of them, or the first :data:`EXACT_ROWS` and a weighted uniform sample of the rest."""
    pool = np.flatnonzero(pool)
    if len(pool) <= EXACT_ROWS + SAMPLE_ROWS:
        return Rows(shifts, pool, np.ones(len(pool)))
    rest = pool[EXACT_ROWS:]
    sample = np.sort(rng.choice(rest, SAMPLE_ROWS, replace=False))
    weight = np.r_[np.ones(EXACT_ROWS), np.full(SAMPLE_ROWS, len(rest) / SAMPLE_ROWS)]
    return Rows(shifts, np.r_[pool[:EXACT_ROWS], sample], weight)


def individual_intervals(unc: Uncertainty, shifts, eps_i) -> tuple[np.ndarray, np.ndarray]:
    """``eps_i_lo``, ``eps_i_hi`` of individuals with leave-one-out ``shifts`` (k, n) and exact ``eps_i``.

    Each replicate's ε_i of every row (one exact evaluation per row and replicate), then the basic
    interval. Infinite ε_i (sole contributors) stay infinite at both ends.
    """
    plan = unc.plan
    shifts = np.atleast_2d(np.asarray(shifts, dtype=float))
    eps_i = np.asarray(eps_i, dtype=float)
    finite = np.isfinite(eps_i)
    lo, hi = np.full(len(eps_i), np.inf), np.full(len(eps_i), np.inf)
    if finite.any():
        reps = np.array([risk.evaluate(m, shifts[finite][:, s])[0] for m, s in zip(plan.models, plan.subsets)])
        iv = np.maximum(basic_interval(eps_i[finite], reps, unc.level, plan.sizes, plan.n), 0.0)
        lo[finite], hi[finite] = iv[:, 0], iv[:, 1]
    return lo, hi


# ------------------------------------------------------------------------ calibration
@dataclass(frozen=True)
class CalibrationLevel:
    """λ_L of :func:`calibration_level` beside λ* and the replicates' own λ*."""

    lam: float
    lam_star: float
    level: float
    replicates: int
    lams: np.ndarray = field(repr=False)
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"lambda_level": self.lam, "lambda_star": self.lam_star, "level": self.level,
                "replicates": self.replicates, "method": METHOD, "warnings": list(self.warnings)}


def calibration_level(q, shifts, epsilon: float, *, level: float = 0.9, replicates: int = 200, rng=None,
                      undefined=None, block: int | None = None, subsets=None,
                      lam_star: float | None = None) -> CalibrationLevel:
    """λ_L: the noise scale at which the target ε holds for a fraction L of other sets of databases.

    λ*_r = max_i min{λ : ε_i(λ) ≤ ε} is computed exactly on each subsample r (sole contributors
    excluded, as in calibrate). The least λ at which ε holds in a fraction L of other sets of n
    databases is the L-quantile of λ* over them, estimated as the intervals are (:func:`basic_interval`,
    log scale): λ_L = λ* · e^{Q_L}, Q_L the L-quantile of the replicates' deviations carried to n
    databases (:func:`deviations_at_n`), never below λ*.

    ``subsets`` (a list of index arrays, or a (B, m) array) replaces the draw; ``lam_star``, when the
    caller has found λ* already, is used instead of computing it again.
    """
    epsilon = target_epsilon(epsilon)
    q = np.asarray(q, dtype=float)
    shifts = np.atleast_2d(np.asarray(shifts, dtype=float)).reshape(-1, q.size)
    block = block_length(q) if block is None else int(block)
    if subsets is None:
        replicates, level = check_options(replicates, level)
        subsets = draw_subsets(len(q), replicates, block, rng)
    else:
        level = check_options(len(subsets), level)[1]
    ok = np.ones(len(shifts), bool) if undefined is None else ~np.asarray(undefined, bool)
    points = q - shifts[ok]
    lam_star = _lambda(q, points, epsilon) if lam_star is None else float(lam_star)
    lams = np.array([_lambda(q[s], points[:, s], epsilon) for s in subsets])
    sizes = subset_sizes(subsets)
    return CalibrationLevel(level_scale(lam_star, lams, level, sizes, len(q)), lam_star, level, len(subsets), lams,
                            warnings_for(q, block=block, size=size_text(sizes)))


def level_scale(lam_star: float, lams: np.ndarray, level: float, sizes, n: int) -> float:
    """λ_L from λ* and the replicates' λ*_r of ``sizes`` databases out of ``n`` (:func:`calibration_level`)."""
    positive = lam_star > 0 and np.all(lams > 0)
    values = np.log(lams) if positive else lams
    top = float(np.quantile(deviations_at_n(values, sizes, n), level, method="inverted_cdf"))
    return max(lam_star, lam_star * math.exp(top) if positive else lam_star + top)


def _lambda(a: np.ndarray, points: np.ndarray, epsilon: float) -> float:
    """λ* of the points P̂ = ``a`` and the rows P̂_i of ``points`` that differ from it (0: none do)."""
    points = points[(points != a).any(axis=1)]
    return float(minimal_lambda(a, points, epsilon).lam) if len(points) else 0.0
