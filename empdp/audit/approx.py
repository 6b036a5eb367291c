"""(ε, δ) audit: a lower confidence bound on ε at a given δ (docs/method.md#9-audits).

A mechanism is (ε, δ)-DP when P(M(x) ∈ S) ≤ e^ε P(M(x′) ∈ S) + δ for all
neighbours x, x′ and events S (the hockey-stick divergence E_ε(M(x) ‖ M(x′))
is at most δ). For any one event with p = P(M(x) ∈ S) > δ and
q = P(M(x′) ∈ S) this gives ε ≥ log((p − δ)/q), and the smallest ε the
mechanism can claim at δ, ε(δ), is at least that.

Stage 1 chooses the event from its own outputs of every pair: a half-line
{s(t) ≥ c} or {s(t) ≤ c} of a score s (the output itself for one-dimensional
continuous outputs; otherwise the logistic-regression score of
:mod:`empdp.audit.events`), either database in the role of x, with the
threshold c that maximises the bound stage 2 is predicted to give. The
prediction floors q̂ at (k + 1)/(n + 1) (k stage-1 outputs in the event), so
that an event no output of x′ reached in stage 1 does not look certain.
With several pairs, stage 1 first spends n outputs per database shared over
all pairs, ranked by the bound their own outputs would give, then n more on
the most promising one, whose event is chosen for N outputs.

Stage 2 counts the chosen event among N fresh outputs of each database and
takes exact one-sided binomial (Clopper-Pearson) bounds, each at level α/2: a
lower bound p_lo on p and an upper bound q_hi on q. The event is fixed before
stage 2 draws, so with probability at least 1 − α both hold and
ε_LB = log((p_lo − δ)/q_hi) ≤ ε(δ) (0 when p_lo ≤ δ). The bound is exact
in finite samples: no normal approximation.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Callable

import numpy as np

from ..errors import InputError
from ..io import jsonable
from .budget import PILOT_SIZES, check_budget, given_sizes, size_for_budget
from .common import (
    MAX_SAMPLES,
    as_rng,
    check_level,
    check_size,
    detect_discrete,
    draw,
    exact_or_none,
    one_blas_thread,
    short,
)
from .events import ScoreRule, fit_score
from .kde import as_samples
from .mechanisms import Mechanism, load_mechanism
from .pairs import resolve_pairs
from .samplers import stat
from .truth import gaussian_epsilon_delta, laplace_epsilon_delta

log = logging.getLogger("empdp.audit")

#: sample sizes when neither sizes nor a time budget are given
DEFAULT_N, DEFAULT_FINAL = 200_000, 1_000_000
#: with a time budget, n = N / BUDGET_RATIO (stage 2's counts set the bound; tail events need many)
BUDGET_RATIO = 5
#: most stage-1 values held at once (the finalist's outputs of both databases: 400 MB, twice that sorted)
MAX_STAGE1_VALUES = 5 * 10**7
#: stage 2 draws at most this many outputs per database at once (only counts are kept)
STAGE2_CHUNK = 1 << 20
#: thresholds compared per score: this many quantiles spread evenly, and as many more in each tail
#: at geometrically spaced counts (1, 2, 4, ... outputs beyond), where the events of small δ lie
EVEN_THRESHOLDS = 1024
TAIL_THRESHOLDS = 400


def check_delta(delta) -> float:
    """δ: a number strictly between 0 and 1."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)) \
            or not math.isfinite(delta) or not 0 < delta < 1:
        raise InputError(f"`delta` must be a number strictly between 0 and 1 (e.g. 1e-5), got {short(delta)}",
                         param="delta")
    return float(delta)


@dataclass
class ApproxResult:
    """Outcome of one (ε, δ) audit: the bound and the event it rests on."""

    lower_bound: float  # on ε at δ
    delta: float
    alpha: float
    pair: tuple
    pair_index: int
    reversed_pair: bool
    event: dict
    counts: dict
    p_hat: float
    q_hat: float
    p_lower: float
    q_upper: float
    predicted: float
    search_size: int  # stage-1 outputs per database (--search-size)
    final_size: int  # stage-2 outputs per database (--final-size)
    sizes: dict = field(default_factory=dict)
    true_value: float | None = None
    pairs_true_value: float | None = None
    truth_kind: str | None = None
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready summary (non-finite numbers become null)."""
        return jsonable({
            "method": "approx", "lower_bound": self.lower_bound, "delta": self.delta,
            "alpha": self.alpha, "pair": list(self.pair), "pair_index": self.pair_index,
            "event_database": "x_prime" if self.reversed_pair else "x", "event": self.event,
            "counts": self.counts, "p_hat": self.p_hat, "q_hat": self.q_hat, "p_lower": self.p_lower,
            "q_upper": self.q_upper, "stage1_predicted_bound": self.predicted,
            "search_size": self.search_size, "final_size": self.final_size,
            "sizes": self.sizes, "true_value": self.true_value, "pairs_true_value": self.pairs_true_value,
            "true_value_kind": self.truth_kind, "warnings": self.warnings,
        })


@dataclass(frozen=True)
class _Plan:
    mech: Mechanism
    pairs: list
    delta: float
    n: int
    N: int
    alpha: float
    discrete: bool | None


@dataclass
class _Event:
    """A stage-1 choice: the score rule with its threshold, the pair and which database plays x."""

    predicted: float
    rule: ScoreRule
    pair_index: int
    reverse: bool


@one_blas_thread
def approx(mechanism, pairs=None, delta: float | None = None, n: int | None = None, N: int | None = None,
           alpha: float = 0.05, rng=None, *, params: dict | None = None, discrete: bool | None = None,
           time_budget: float | None = None,
           progress: Callable[[str, int, int], None] | None = None, threads: int | None = None) -> ApproxResult:
    """Lower confidence bound on ε at ``delta`` for ``mechanism`` over ``pairs`` (module doc).

    Parameters
    ----------
    mechanism : sampler ``f(database, size, rng)``, built-in name, ``"module:function"`` or Mechanism.
    pairs : list of (x, x′) databases, ``"patterns"``, or None for the mechanism's default pairs.
        Both orders of each pair are audited.
    delta : δ, strictly between 0 and 1.
    n, N : stage-1 and stage-2 outputs per database (N > n); default 200,000 and 1,000,000, or
        chosen by ``time_budget``.
    alpha : error level: P(bound ≤ ε(δ)) ≥ 1 − alpha, exactly (Clopper-Pearson, α/2 for each count).
    rng : numpy Generator or seed (None: fresh randomness).
    discrete : force or forbid treating outputs as discrete (default: detect); discrete and
        vector outputs are scored by a logistic regression, 1-d continuous ones by themselves.
    time_budget : seconds; instead of n and N, choose N (and n = N/5, at most what memory holds)
        so that the audit takes about this long (:mod:`empdp.audit.budget`; the sizes are reported
        in ``sizes`` and, given back with the same seed, reproduce the result).
    progress : optional callback ``progress(stage, done, total)``.
    threads : threads drawing outputs at once (default: every core for the built-ins, one for a user's
        sampler, which must be thread-safe to be given more); the outputs do not depend on it.
    """
    mechanism, params = load_mechanism(mechanism, params, threads), None  # (its parameters are in it now)
    sizes = given_sizes({"n, N: --search-size, --final-size": n if n is not None else N}, time_budget)
    if time_budget is not None:
        plan = _resolve(mechanism, pairs, delta, DEFAULT_N, DEFAULT_FINAL, alpha, params, discrete)
        N, sizes = _budget_sizes(plan, check_budget(time_budget))
        n = _search_size(plan, N)
    n, N = DEFAULT_N if n is None else n, DEFAULT_FINAL if N is None else N
    plan = _resolve(mechanism, pairs, delta, n, N, alpha, params, discrete)
    res = _run(plan, as_rng(rng), progress or _no_progress)
    res.sizes = {**sizes, "search_size": plan.n, "final_size": plan.N}
    return res


def _resolve(mechanism, pairs, delta, n, N, alpha, params, discrete) -> _Plan:
    mech = load_mechanism(mechanism, params)
    pairs = resolve_pairs(mech, pairs, "mpl")
    if delta is None:
        raise InputError("give `delta`, the δ at which ε is bounded, e.g. 1e-5", param="delta")
    delta = check_delta(delta)
    n, N = check_size("n", n), check_size("N", N)
    if N <= n:
        raise InputError(f"`N` (stage-2 outputs: {N}) must be larger than `n` (stage-1 outputs: {n}): stage 2 "
                         "counts the chosen event among fresh, more numerous outputs", param=("N", "n"))
    return _Plan(mech, pairs, delta, n, N, check_level(alpha), discrete)


def _budget_sizes(plan: _Plan, budget: float) -> tuple[int, dict]:
    """N for a time budget, from pilot runs (:mod:`empdp.audit.budget`); n follows (:func:`_search_size`).

    The budget sizes N, not n: stage 2 is drawn in chunks, so N can grow after
    memory has capped stage 1.
    """
    def run(size, pilot_rng):
        _run(replace(plan, n=_search_size(plan, size), N=size), pilot_rng, _no_progress)

    return size_for_budget(run, budget, BUDGET_RATIO * PILOT_SIZES[-1], MAX_SAMPLES)


def _search_size(plan: _Plan, N: int) -> int:
    """n = N / BUDGET_RATIO, at most what memory holds for stage 1 (MAX_STAGE1_VALUES)."""
    dim = as_samples(draw(plan.mech, plan.pairs[0][0], 2, np.random.default_rng(0))).shape[1]
    return max(10, min(N // BUDGET_RATIO, MAX_STAGE1_VALUES // (2 * dim)))


def _run(plan: _Plan, rng, report) -> ApproxResult:
    best = _stage1(plan, rng, report)
    return _stage2(plan, best, rng, report)


# ----------------------------------------------------------------------------- stage 1

def _stage1(plan: _Plan, rng, report) -> _Event:
    """Choose the pair, the order and the event; with B ≥ 2 pairs in two rounds (module doc)."""
    t_start = time.perf_counter()
    pairs, n = plan.pairs, plan.n
    first = max(PILOT_SIZES[0], n // len(pairs)) if len(pairs) > 1 else n
    stage = f"(eps, delta) stage 1: {len(pairs)} pairs"
    steps = len(pairs) + (len(pairs) > 1)
    report(stage, 0, steps)
    samples, best, discrete = {}, None, plan.discrete
    for b, pair in enumerate(pairs):
        x, y = _draw(plan, pair, first, rng)
        if discrete is None:
            discrete = detect_discrete(np.concatenate([np.ravel(x), np.ravel(y)]), None)
        event = _best_event(x, y, discrete, plan, b, first if len(pairs) > 1 else plan.N)
        if best is None or event.predicted > best.predicted:
            best, samples = event, {b: (x, y)}
        report(stage, b + 1, steps)
    if len(pairs) > 1:  # the second round: n more outputs for the most promising pair
        x0, y0 = samples[best.pair_index]
        x, y = _draw(plan, pairs[best.pair_index], n, rng)
        best = _best_event(np.concatenate([x0, x]), np.concatenate([y0, y]), discrete, plan, best.pair_index,
                           plan.N)
        report(stage, steps, steps)
    log.info("(eps, delta) stage 1: %d pairs x 2 x %d outputs%s in %.2f s; pair %d, predicted bound %.4g",
             len(pairs), first, f", then 2 x {n} more on one" if len(pairs) > 1 else "",
             time.perf_counter() - t_start, best.pair_index, best.predicted)
    return best


def _draw(plan: _Plan, pair, size: int, rng) -> tuple[np.ndarray, np.ndarray]:
    return as_samples(draw(plan.mech, pair[0], size, rng)), as_samples(draw(plan.mech, pair[1], size, rng))


def _best_event(x: np.ndarray, y: np.ndarray, discrete: bool, plan: _Plan, b: int, size: int) -> _Event:
    """The half-line of the pair's score with the largest bound predicted for ``size`` outputs, either order.

    The first round ranks pairs by what their own outputs would certify (``size``
    = n): predictions for N outputs rest on a few stage-1 outputs in the tails,
    and their noise would pick a pair by chance.
    """
    rule = fit_score(x, y, discrete)
    sx, sy = np.sort(rule.score(x)), np.sort(rule.score(y))
    cand = _thresholds(sx, sy)
    best = _Event(-math.inf, replace(rule, threshold=float(cand[0])), b, False)
    for direction in (1, -1):
        kx, ky = _counts(sx, cand, direction), _counts(sy, cand, direction)
        for reverse, (kp, kq) in ((False, (kx, ky)), (True, (ky, kx))):
            pred = _predicted(kp, kq, len(sx), size, plan)
            i = int(np.argmax(pred))
            if pred[i] > best.predicted:
                best = _Event(float(pred[i]), replace(rule, threshold=float(cand[i]), direction=direction),
                              b, reverse)
    return best


def _thresholds(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """Candidate thresholds: even quantiles of each sorted score, and its tails at 1, 2, 4, ... outputs."""
    cand = []
    for s in (sx, sy):
        n = len(s)
        tail = np.unique(np.geomspace(1, max(1, n // 2), TAIL_THRESHOLDS).astype(int))
        cand += [s[np.linspace(0, n - 1, EVEN_THRESHOLDS).astype(int)], s[n - tail], s[tail - 1]]
    return np.unique(np.concatenate(cand))


def _counts(s_sorted: np.ndarray, cand: np.ndarray, direction: int) -> np.ndarray:
    """Outputs in {s ≥ c} (direction +1) or {s ≤ c} (−1), per candidate c."""
    if direction > 0:
        return len(s_sorted) - np.searchsorted(s_sorted, cand, side="left")
    return np.searchsorted(s_sorted, cand, side="right")


def _predicted(kp: np.ndarray, kq: np.ndarray, n: int, size: int, plan: _Plan) -> np.ndarray:
    """The bound from ``size`` outputs whose frequencies were stage 1's (n outputs).

    q is floored at (k + 1)/(n + 1): an event that no stage-1 output of the other
    database reached is not taken for impossible. The binomial bounds are
    approximated by Poisson ones (Wilson-Hilferty): stage 1 only ranks events,
    and the exact inverse beta function at thousands of thresholds would cost
    more than the sampling.
    """
    z = NormalDist().inv_cdf(1 - plan.alpha / 2)
    kp_n, kq_n = np.floor(kp / n * size), np.floor((kq + 1) / (n + 1) * size)
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.where(kp_n > 0, kp_n * np.clip(1 - 1 / (9 * kp_n) - z / (3 * np.sqrt(kp_n)), 0, None) ** 3, 0)
        hi = (kq_n + 1) * (1 - 1 / (9 * (kq_n + 1)) + z / (3 * np.sqrt(kq_n + 1))) ** 3
        lo, hi = lo / size, np.minimum(hi / size, 1.0)
        return np.where(lo > plan.delta, np.log((lo - plan.delta) / hi), -math.inf)


# ----------------------------------------------------------------------------- stage 2

def _stage2(plan: _Plan, best: _Event, rng, report) -> ApproxResult:
    """Count the event among N fresh outputs of each database; the Clopper-Pearson bound."""
    t_start = time.perf_counter()
    pair = plan.pairs[best.pair_index]
    stage = f"(eps, delta) stage 2: 2 x {plan.N:,} fresh outputs"
    chunks = math.ceil(plan.N / STAGE2_CHUNK)
    report(stage, 0, chunks)
    hits = [0, 0]
    for j, start in enumerate(range(0, plan.N, STAGE2_CHUNK)):
        x, y = _draw(plan, pair, min(STAGE2_CHUNK, plan.N - start), rng)
        hits[0] += int(np.count_nonzero(best.rule.members(x)))
        hits[1] += int(np.count_nonzero(best.rule.members(y)))
        report(stage, j + 1, chunks)
    kp, kq = (hits[1], hits[0]) if best.reverse else (hits[0], hits[1])
    p_lo = float(clopper_pearson_lower(kp, plan.N, plan.alpha / 2))
    q_hi = float(clopper_pearson_upper(kq, plan.N, plan.alpha / 2))
    bound = max(0.0, math.log((p_lo - plan.delta) / q_hi)) if p_lo > plan.delta else 0.0
    log.info("(eps, delta) stage 2: 2 x %d fresh outputs in %.2f s: %d and %d in the event, bound %.4g",
             plan.N, time.perf_counter() - t_start, kp, kq, bound)
    warnings = []
    if bound == 0:
        warnings.append(f"the bound is 0: the chosen event's probability is not shown to exceed delta = "
                        f"{plan.delta:g} plus its probability under the other database (lower bound {p_lo:.3g}, "
                        f"upper bound {q_hi:.3g}); delta may be at or above the outputs' total variation "
                        "distance, or N (--final-size, --time-budget) too small")
    true_value, pairs_true, kind = _truth(plan)
    return ApproxResult(
        lower_bound=bound, delta=plan.delta, alpha=plan.alpha, pair=tuple(pair),
        pair_index=best.pair_index, reversed_pair=best.reverse, event=best.rule.describe(),
        counts={"event_database": kp, "other_database": kq}, p_hat=kp / plan.N, q_hat=kq / plan.N,
        p_lower=p_lo, q_upper=q_hi, predicted=best.predicted, search_size=plan.n, final_size=plan.N, true_value=true_value,
        pairs_true_value=pairs_true, truth_kind=kind, warnings=warnings)


# ----------------------------------------------------------------------------- exact binomial bounds

def _special():
    return importlib.import_module("scipy.special")  # lazily: the audit command stays light


def clopper_pearson_lower(k, n: int, level: float):
    """Exact one-sided lower confidence bound on a binomial p from k of n: P(bound ≤ p) ≥ 1 − level."""
    k = np.asarray(k, float)
    with np.errstate(all="ignore"):
        out = _special().betaincinv(np.maximum(k, 1), n - k + 1, level)
    return np.where(k > 0, out, 0.0)


def clopper_pearson_upper(k, n: int, level: float):
    """Exact one-sided upper confidence bound on a binomial p from k of n: P(bound ≥ p) ≥ 1 − level."""
    k = np.asarray(k, float)
    with np.errstate(all="ignore"):
        out = _special().betaincinv(k + 1, np.maximum(n - k, 1), 1 - level)
    return np.where(k < n, out, 1.0)


# ----------------------------------------------------------------------------- exact values

def _truth(plan: _Plan) -> tuple[float | None, float | None, str | None]:
    """The exact ε(δ) of the built-ins that have one (over all neighbours, and over the audited pairs)."""
    mech, p = plan.mech, plan.mech.params
    if mech.name == "gaussian" and mech.inputs == "records":
        sd = p["sigma"] * p["sensitivity"]
        shift = max(abs(stat(x) - stat(y)) for x, y in plan.pairs)
        return (exact_or_none(gaussian_epsilon_delta, plan.delta, p["sensitivity"], sd),
                exact_or_none(gaussian_epsilon_delta, plan.delta, shift, sd), "exact epsilon(delta), analytic Gaussian")
    if mech.name == "laplace" and mech.inputs == "records":
        eps_pairs = exact_or_none(mech.true_epsilon_over, plan.pairs)
        return (laplace_epsilon_delta(plan.delta, mech.epsilon),
                None if eps_pairs is None else laplace_epsilon_delta(plan.delta, eps_pairs),
                "exact epsilon(delta), Laplace")
    if mech.epsilon is not None and math.isfinite(mech.epsilon):
        return mech.epsilon, exact_or_none(mech.true_epsilon_over, plan.pairs), \
            "pure epsilon (an upper bound on epsilon(delta))"
    return None, None, None


def _no_progress(stage: str, done: int, total: int) -> None:
    pass
