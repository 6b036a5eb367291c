"""MPL stage 1, DPL (Askin, Kutta, Dette 2022, Alg. 3; docs/method.md#91-mpl-a-lower-bound-on-pure-dp-epsilon).

On one pair of output samples: the truncated density estimates (frequencies
or a binned KDE, floored at τ), the empirical loss ℓ̂(t) = |ln f̂_x(t) − ln f̂_x′(t)|
over the region C, and the candidate t̂ (or likelihood-ratio event) that stage 2
measures, chosen by the predicted stage-2 bound (module :mod:`empdp.audit.mpl`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..errors import InputError
from .common import continuous_dim
from .events import ScoreRule, best_rule, best_threshold, fit_score
from .kde import (
    GAUSS_R,
    binned_kde,
    categorize,
    frequencies,
    grid_for,
    rule_of_thumb,
    scale_estimate,
    sigma_discrete,
)
from .mechanisms import Mechanism
from .ratios import ratio_scores

#: Stage-1 standard errors subtracted from a candidate's predicted bound when choosing t̂
#: (see ``_stage1_discrete`` and ``_stage1_continuous``); 0 gives the plain predicted bound.
SELECT_PENALTY = 1.0
#: the same for score events: about the expected maximum of the ~10^3 correlated threshold
#: estimates in standard errors (√(2 ln 1024) ≈ 3.7); with 1 the search chased tail events whose
#: noisy stage-1 loss was large (Laplace at ε = 0.1: a tail of 0.4% mass, bound below 0)
SCORE_PENALTY = 3.0


@dataclass(frozen=True)
class Plan:
    """The checked inputs of one MPL run (``region`` is the user's, else the mechanism's, else None)."""

    mech: Mechanism
    pairs: list
    n: int
    N: int
    alpha: float
    zc: float
    region: object
    tau: float | None
    selection: str
    events: bool
    bandwidth: object
    undersmooth: float
    feature: Callable | None
    score_events: bool = False
    #: the stage-2 size stage 1 weighs its candidates by (their predicted bound's error); None: N. A
    #: time budget fixes it before stage 1, then draws what the clock allows (N may differ)
    selection_N: int | None = None

    @property
    def weighed_N(self) -> int:
        """The stage-2 size of stage 1's selection criterion."""
        return self.selection_N or self.N


@dataclass
class Candidate:
    """Stage 1 (DPL, Alg. 3) on one pair: its loss curve and its best point or event."""

    score: float  # the selection criterion (predicted stage-2 bound, or the loss for "max")
    t: np.ndarray  # the selected output t̂ (most extreme member of an event)
    event: np.ndarray | None  # the outputs of a likelihood-ratio event, or None for a point
    pts: np.ndarray  # the points of the loss curve
    loss: np.ndarray
    tau: float  # the floor used
    box: tuple | None  # (lo, hi) corners of the region searched (continuous outputs)
    rule: ScoreRule | None = None  # a score event {s(t) ≥ c} or {s(t) ≤ c} instead of t̂ (module events)
    bandwidth: np.ndarray | None = None  # a point's kernel bandwidth, on ``rows`` outputs per database
    rows: int = 0
    # the pair's other candidate, which stage 1's estimates ranked second: t̂ beside a score event (or the
    # reverse); stage 1's duel measures both on fresh outputs (mpl._duel)
    alternative: Candidate | None = None

    @property
    def max_loss(self) -> float:
        return float(self.loss.max())


def check_region(region):
    """The region C as a (2,) or (d, 2) float array; InputError unless finite with lo < hi."""
    bad = InputError(f"region must be (lo, hi) or one (lo, hi) per output dimension, finite with "
                     f"lo < hi, got {region!r}")
    try:
        arr = np.asarray(region, dtype=float)
    except (ValueError, TypeError):
        raise bad from None
    if arr.shape[-1:] != (2,) or arr.ndim > 2 or arr.size == 0 or not np.all(np.isfinite(arr)) \
            or np.any(arr[..., 0] >= arr[..., 1]):
        raise bad
    return arr


def _region_bounds(region, d: int, pooled: np.ndarray | None):
    """Lower and upper corners of the box C in d output dimensions ((lo, hi) applies to each)."""
    if region is None:
        return np.quantile(pooled, 0.005, axis=0), np.quantile(pooled, 0.995, axis=0)
    arr = check_region(region)
    if arr.shape == (2,):
        arr = np.tile(arr, (d, 1))
    if arr.shape != (d, 2):
        raise InputError(f"region has {arr.shape[0]} (lo, hi) rows but the outputs have {d} dimensions; "
                         f"give one (lo, hi) for all or one per dimension, got {region!r}")
    return arr[:, 0], arr[:, 1]


def _default_tau(discrete: bool, n: int, scale: np.ndarray) -> float:
    """Floor τ: 20/n for frequencies, 10^-3 per unit of output scale for densities.

    The paper uses τ = 10^-3 at n = 2·10^4 and 10^-4 at n = 10^5 (SVT); 20/n
    gives 10^-3 and 2·10^-4. For densities the floor scales with 1/spread so
    that it means the same for any unit of the output.
    """
    if discrete:
        return 20.0 / n
    return 1e-3 / float(np.prod(scale))


def _stage1_continuous(x, y, h, lo, hi, tau, zc, c_n2, against_events: bool):
    """Loss on the grid points inside the box [lo, hi] and each point's selection criterion:
    the predicted stage-2 bound, in 2-3 dimensions less SELECT_PENALTY stage-1 standard errors
    (the winner's curse: thousands of grid points compete there and the noisiest tail points
    won). In 1-d a few dozen bandwidths compete, and alone a penalty would only hold back the
    search for growing losses in the tails that exposes mechanisms that are not pure DP; but
    ``against_events`` (a half-line score event competes, judged less SCORE_PENALTY standard
    errors) the points take the same penalty: without it their inflated criterion beat the event
    where the event was better (ReportNoisyMax3 at n = 3·10^5, N = 1.5·10^6: a point in 8 of 9
    seeds, median bound 0.227; the half-line in 9 of 9, 0.240, true 0.25; Laplace 0.097 either way)."""
    grid = grid_for([x, y], h, lo, hi)
    fx = np.maximum(binned_kde(x, h, grid), tau)
    fy = np.maximum(binned_kde(y, h, grid), tau)
    pts = grid.points()
    inside = np.all((pts >= lo - 1e-12) & (pts <= hi + 1e-12), axis=1)
    fx, fy, pts = fx.ravel()[inside], fy.ravel()[inside], pts[inside]
    loss = np.abs(np.log(fx) - np.log(fy))
    sigma = np.sqrt(GAUSS_R ** x.shape[1] * (1 / fx + 1 / fy))
    c_n1 = math.sqrt(len(x) * float(np.prod(h)))
    penalty = SELECT_PENALTY if x.shape[1] > 1 else SCORE_PENALTY if against_events else 0.0
    return pts, loss, loss - (zc / c_n2 + penalty / c_n1) * sigma


def _stage1_discrete(x, y, tau, zc, N, region, events: bool):
    """Loss per observed output and the best candidate (point or likelihood-ratio event).

    Returns (outputs (K, d), loss (K,), criterion of the best candidate, indices of
    the outputs forming it). The criterion is the predicted stage-2 bound, less
    ``SELECT_PENALTY`` stage-1 standard errors: among hundreds of candidates the
    largest estimate is mostly noise when its mass is small (winner's curse).
    """
    cats, (cx, cy) = categorize(x, y)
    k = len(cats)
    px, py = frequencies(cx, k), frequencies(cy, k)
    keep = np.ones(k, dtype=bool)
    if region is not None:  # a box: every coordinate of an output within its (lo, hi)
        lo, hi = _region_bounds(region, cats.shape[1], None)
        keep = np.all((cats >= lo) & (cats <= hi), axis=1)
        if not keep.any():
            raise InputError(f"no observed output lies in the region {region!r} (for vector outputs, "
                             "a box applied to every coordinate); widen it or omit it")
    fx, fy = np.maximum(px, tau), np.maximum(py, tau)
    ratio = np.log(fx) - np.log(fy)
    loss = np.abs(ratio)
    scale = zc / math.sqrt(N) + SELECT_PENALTY / math.sqrt(len(x))
    crit = np.where(keep, loss - scale * sigma_discrete(fx, fy), -np.inf)
    i = int(np.argmax(crit))
    best_crit, members = float(crit[i]), np.array([i])
    if events:
        for sign in (1.0, -1.0):
            order = np.argsort(-sign * ratio, kind="stable")
            order = order[keep[order]]
            ex, ey = np.maximum(np.cumsum(px[order]), tau), np.maximum(np.cumsum(py[order]), tau)
            c = np.abs(np.log(ex) - np.log(ey)) - scale * sigma_discrete(ex, ey)
            j = int(np.argmax(c))
            if c[j] > best_crit:
                best_crit, members = float(c[j]), order[:j + 1]
    return cats, np.where(keep, loss, 0.0), best_crit, members


def score_candidate(x, y, is_discrete: bool, plan: Plan, logistic: bool = True) -> Candidate:
    """The best score event (module :mod:`empdp.audit.events`) by its predicted stage-2 bound, less
    SCORE_PENALTY stage-1 standard errors.

    Vector outputs have several scores, the logistic regression of :func:`fit_score` and the
    per-coordinate log ratios of module :mod:`empdp.audit.ratios`: each is fitted on the first half
    of the stage-1 outputs and judged, threshold and all, on the second, so a score that fits its own
    noise is not preferred. Without ``logistic`` the regression is not among them (it was most of stage
    1's cost, and the first round of successive halving only ranks the pairs).

    In that first round the threshold is chosen and judged on the same held-out half, so a rare
    threshold's lucky count can rank a poor pair first (svt34_parallel at n = 156,000: pair 0, exact ε 0.1,
    scored 0.140 and pairs of 0.43-0.49 scored 0.06-0.08). Choosing it on one quarter and judging it on
    another fixed that run (0.065 -> 0.306) but lost more elsewhere, at 20 s over seeds 0-4: svt34_parallel
    0.295 against 0.333, svt3 0.2045 against 0.234 (its seed 0 0.088 against 0.251). It is not done.
    """
    half = len(x) // 2 if x.shape[1] > 1 else 0
    fit_x, fit_y, x, y = x[:half], y[:half], x[half:], y[half:]
    # the floor is the whole stage 1's, as without the split: stage 2 keeps it, and 20/(n/2) would cap
    # a loss whose event is rare under x′ (noisy_hist2's 10) at ln(n/40) instead of ln(n/20)
    tau = plan.tau if plan.tau is not None else _default_tau(True, half + len(x), None)
    weight = plan.zc / math.sqrt(plan.weighed_N) + SCORE_PENALTY / math.sqrt(len(x))
    rule = (fit_score(x, y, is_discrete) if not half
            else _best_score(fit_x, fit_y, x, y, is_discrete, tau, weight, logistic))
    rule, crit, cand, loss = best_threshold(rule, x, y, tau, weight)
    return Candidate(score=crit, t=np.array([rule.threshold]), event=None, pts=cand[:, None], loss=loss, tau=tau,
                     box=None, rule=rule)


#: L-BFGS steps of the logistic score in MPL, where it is one candidate among several and its fit was a
#: third of a small run's cost (100 steps: svt3's pilots of 4,000 outputs took 7 s on a loaded host)
LOGISTIC_STEPS = 30
#: most held-out stage-1 rows on which the scores of vector outputs are compared (the winner's threshold
#: is then chosen on all of them): scoring every candidate on every row cost more than stage 2. On 20,000
#: rows the comparison was mostly noise where the best event is rare (RAPPOR's: 2% mass) and picked a
#: poor score; on 150,000, RAPPOR's median bound over 3 seeds rose from 0.239 to 0.269 (true 0.300) and
#: OneTimeRappor's from 0.569 to 0.587 (0.600), at n = 300,000, N = 1.5·10^6
COMPARE_ROWS = 150_000


def _best_score(fit_x, fit_y, x, y, is_discrete: bool, tau: float, weight: float,
                logistic: bool = True) -> ScoreRule:
    """The score (fitted on ``fit_x``, ``fit_y``) whose best event has the largest criterion on the first
    COMPARE_ROWS of ``x``, ``y`` (the ratio scores of one binning share its bins)."""
    cx, cy = x[:COMPARE_ROWS], y[:COMPARE_ROWS]
    cw = weight - SCORE_PENALTY / math.sqrt(len(x)) + SCORE_PENALTY / math.sqrt(len(cx))

    def scored():
        if logistic:
            rule = fit_score(fit_x, fit_y, is_discrete, LOGISTIC_STEPS)
            yield rule, rule.score(cx), rule.score(cy)
        for binning, scores in ratio_scores(fit_x, fit_y):
            codes_x, codes_y = binning.codes(cx), binning.codes(cy)
            for score in scores:
                yield ScoreRule(score.name, 0.0, 1, score), score.score_codes(codes_x), score.score_codes(codes_y)

    return best_rule(scored(), tau, cw)[0]


#: discrete outputs with at least this many distinct values among the first SPARSE_ROWS get score
#: events too: their frequencies are too thin for the likelihood-ratio events alone (RAPPOR's
#: 2^20 bit vectors); with fewer (SVT's answers, 1-d outputs) those events are all there are
SPARSE_LEVELS, SPARSE_ROWS = 500, 5000


def _sparse(x) -> bool:
    return x.shape[1] > 1 and len(np.unique(x[:SPARSE_ROWS], axis=0)) >= SPARSE_LEVELS


def candidate(x, y, is_discrete: bool, plan: Plan, logistic: bool = True) -> Candidate:
    """The best of DPL's candidate (continuous outputs of at most 3 dimensions, or discrete ones) and,
    when ``plan.score_events``, a score event (continuous outputs of any dimension; discrete vectors of
    many distinct values get the score event alone); ``logistic`` as in :func:`score_candidate`."""
    d = x.shape[1]
    use_score = plan.score_events and (not is_discrete or _sparse(x))
    # sparse discrete outputs have too few repeats for DPL's frequencies, and a score event is judged on
    # held-out outputs where DPL's criterion is not: comparing them favoured DPL's noisy points (RAPPOR)
    use_dpl = not use_score if is_discrete else d <= 3
    point = dpl(x, y, is_discrete, plan) if use_dpl else None
    if use_score:
        scored = score_candidate(x, y, is_discrete, plan, logistic)
        if point is None:
            return scored
        # both are judged less SCORE_PENALTY stage-1 standard errors, yet the points' noisy maximum still
        # won where the half-line was better (report_noisy_max3 at n = 7.8·10^6: t̂ in 2 of 8 seeds, stage 2's
        # error 3 times the event's): the runner-up enters the duel beside the winner
        if scored.score > point.score:
            return replace(scored, alternative=point)
        return replace(point, alternative=scored)
    if point is None:
        raise InputError(f"continuous outputs of dimension {d} > 3 are audited by score events only, which "
                         "need the default selection and events and no region; drop --region (or "
                         "selection='max', events=False)")
    return point


def undersmoothed(h, N: int, n: int, d: int, gamma: float):
    """Stage-2 bandwidth from a stage-1 one: rescaled from n to N outputs, times N^-γ (condition C4)."""
    return h * (N / n) ** (-1.0 / (d + 4)) * N ** (-gamma)


def dpl(x, y, is_discrete: bool, plan: Plan) -> Candidate:
    """DPL on one pair (Alg. 3): the loss curve and the best candidate with its selection score.

    ``plan`` is MPL's checked input (its floor, region, selection rule, bandwidth, N and z).
    """
    n = len(x)
    members = h = None
    # the rows stage 2 rescales the bandwidth from: these, or n for a given one (mpl._stage2_continuous)
    rows = n if plan.bandwidth is None else plan.n
    if is_discrete:
        t0 = plan.tau if plan.tau is not None else _default_tau(True, n, None)
        pts, loss, crit, members = _stage1_discrete(x, y, t0, plan.zc, plan.weighed_N, plan.region, plan.events)
        i = int(members[0]) if plan.selection == "lb" else int(np.argmax(loss))
        score = crit if plan.selection == "lb" else float(loss[i])
        box = None
    else:
        x, y = x.astype(float), y.astype(float)
        d = continuous_dim(x)
        pooled = np.vstack([x, y])
        box = _region_bounds(plan.region, d, pooled)
        h = (np.broadcast_to(np.asarray(plan.bandwidth, float), (d,)) if plan.bandwidth is not None
             else (rule_of_thumb(x) + rule_of_thumb(y)) / 2)
        t0 = plan.tau if plan.tau is not None else _default_tau(False, n, scale_estimate(pooled))
        h2 = undersmoothed(h, plan.weighed_N, rows, d, plan.undersmooth)  # (stage 2's bandwidth)
        pts, loss, crit = _stage1_continuous(x, y, h, *box, t0, plan.zc, math.sqrt(plan.weighed_N * np.prod(h2)),
                                             plan.score_events)
        if len(pts) == 0:
            raise InputError(f"the region {np.column_stack(box).tolist()} holds no evaluation point "
                             "of the density estimate; widen it or omit it")
        scores = crit if plan.selection == "lb" else loss
        i = int(np.argmax(scores))
        score = float(scores[i])
    if members is None or plan.selection != "lb":
        members = np.array([i])
    return Candidate(score=score, t=pts[i], event=pts[members] if len(members) > 1 else None, pts=pts,
                     loss=loss, tau=t0, box=box, bandwidth=h, rows=rows)
