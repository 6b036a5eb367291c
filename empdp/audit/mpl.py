"""MPL: statistical lower bound for pure-DP ε (Askin, Kutta, Dette 2022; docs/method.md#91-mpl-a-lower-bound-on-pure-dp-epsilon).

Stage 1 (DPL, Alg. 3) estimates the local loss ℓ̂(t) = |ln f̂_x(t) − ln f̂_x′(t)|
for every pair from n outputs each (truncated KDE or truncated relative
frequencies) and locates its maximiser t̂ in the region C. Stage 2 (MPL,
Alg. 4) draws N fresh outputs for the selected pair and returns
LB = ℓ̂*(t̂) + Φ⁻¹(α) σ̂ / c_N (eq. 26), computed with an undersmoothed
bandwidth (condition C4).

Two deviations from the paper, stated in the result; both choose *what* stage 2
measures from stage-1 data only, so stage 2 stays independent and the coverage
argument of Theorem 2 is unchanged:

- by default the worst point and pair are selected by the *predicted* stage-2
  bound ℓ̂(t) − z σ̂(t)/c_N (less one stage-1 standard error for discrete outputs
  and in 2-3 dimensions, where hundreds to thousands of candidates compete)
  instead of by ℓ̂(t) alone (``selection="lb"``), so it no longer chases
  low-density outputs whose noisy loss is large and whose bound is poor (with the
  penalty, the median bound on a 2-d and a 3-d Laplace mechanism with ε = 1 rises
  from 0.59 to 0.82 and from 0.60 to 0.70). ``selection="max"`` is the paper's rule.
- for discrete outputs the candidates include likelihood-ratio *events*: the
  set S of the j outputs with the largest (or smallest) estimated ratio
  f̂_x/f̂_x′. An event is the post-processing t ↦ 1{t ∈ S}, whose loss
  |ln P_x(S) − ln P_x′(S)| never exceeds ε (the idea of DP-Sniper's threshold
  tests, Bichsel et al. 2021). When the loss is spread over many rare outputs,
  as for SVT6, an event has almost the loss of its worst output and much more
  mass, hence a far smaller σ̂.

Stage 1 ends with up to two closing steps on fresh outputs, which like the rest of stage 1 only choose
what stage 2 measures: for vector outputs a refit (:func:`_refit`), the selected pair's table scores
counted on more fresh outputs than stage 1 can hold and its event chosen on fresh outputs again; then a
duel (:func:`_duel`), where the finalists' events (of continuous outputs, with the point or score event
ranked second) and the refit's, and each score event's rarer rungs, are measured on fresh outputs as
stage 2 would measure them and the best chosen.

A mechanism may also carry a per-pair ``feature`` (post-processing to a
sufficient statistic, e.g. answer counts for SVT5/SVT6), applied before both stages.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Callable

import numpy as np

from ..errors import InputError
from ..io import jsonable
from ..params import available_cores
from .budget import (
    MAX_STAGE1_BYTES,
    PILOT_SIZES,
    check_budget,
    deadline,
    given_sizes,
    round_size,
    run_pilots,
    stage1_cap,
    stage2_rate,
    two_stage_sizes,
)
from .common import (
    MAX_COUNTED,
    MAX_SAMPLES,
    as_rng,
    check_level,
    check_size,
    detect_discrete,
    draw,
    draw_workers,
    exact_or_none,
    one_blas_thread,
    part_generators,
)
from .dpl import SCORE_PENALTY, Candidate, Plan, candidate, check_region, undersmoothed
from .events import ScoreRule, best_rule, load_optimizer
from .kde import GAUSS_R, as_samples, contains, kde_at, kernel_weights, rule_of_thumb, sigma_discrete
from .mechanisms import load_mechanism
from .pairs import resolve_pairs
from .ratios import FIT_ROWS, TableScores

log = logging.getLogger("empdp.audit")

#: Default undersmoothing exponent γ of the stage-2 bandwidth h = h_rot(N)·N^{-γ}.
UNDERSMOOTH = 0.03

#: Stage 1 with B ≥ 3 pairs runs in two rounds: n/2 outputs per database for every
#: pair, then the other half of the budget, B·n/2, shared by the best ⌈B/HALVING⌉
#: pairs (successive halving): the same number of outputs, spent where the loss is. Three finalists
#: (HALVING = 3) instead of two, tried at 20 s on seeds 0-3: svt34_parallel 0.3498 against 0.3518, svt3
#: 0.2287 against 0.2282 (medians; its seed 1 0.188 against 0.204).
HALVING = 4


@dataclass
class MPLResult:
    """Outcome of one MPL run (all values refer to the selected pair)."""

    lower_bound: float
    stage1_max_loss: float  # the largest stage-1 loss of the selected pair: biased up, not a bound
    pair: tuple
    pair_index: int
    t_hat: object
    event: list | None
    loss_at_t_hat: float
    sigma: float
    search_size: int  # stage-1 outputs per database (--search-size)
    final_size: int  # stage-2 outputs per database (--final-size)
    alpha: float
    discrete: bool
    tau: float
    bandwidth: list | None
    region: list | None
    selection: str
    true_value: float | None = None
    pairs_true_value: float | None = None
    feature: str | None = None
    event_rule: dict | None = None
    sizes: dict = field(default_factory=dict)
    duel: dict | None = None  # the entrants (and rungs), their events' losses on the duel's outputs, the winner (_duel)
    stage1_max_loss_by_pair: list = field(default_factory=list)
    loss_curve: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def to_dict(self, curve: bool = False) -> dict:
        """JSON-ready summary (non-finite numbers become null; see ``true_value_infinite``)."""
        out = {
            "method": "mpl",
            "lower_bound": self.lower_bound, "stage1_max_loss": self.stage1_max_loss,
            "pair": list(self.pair), "pair_index": self.pair_index, "t_hat": self.t_hat,
            "event": self.event, "event_size": 1 if self.event is None else len(self.event),
            "loss_at_t_hat": self.loss_at_t_hat, "sigma": self.sigma,
            "search_size": self.search_size, "final_size": self.final_size, "alpha": self.alpha, "discrete": self.discrete,
            "tau": self.tau, "bandwidth": self.bandwidth, "region": self.region,
            "selection": self.selection, "feature": self.feature, "event_rule": self.event_rule,
            "sizes": self.sizes, "duel": self.duel, "true_value": self.true_value,
            "true_value_infinite": self.true_value is not None and math.isinf(self.true_value),
            "pairs_true_value": self.pairs_true_value,
            "stage1_max_loss_by_pair": self.stage1_max_loss_by_pair, "warnings": self.warnings,
        }
        if curve:
            out["loss_curve"] = self.loss_curve
        return jsonable(out)


@dataclass
class _Stage1:
    candidates: list  # one Candidate per pair
    selected: int  # index of the pair stage 2 measures
    discrete: bool
    finalists: list = field(default_factory=list)  # the pairs of the last round, best stage-1 score first


@dataclass
class _Stage2:
    """Stage 2 (MPL, Alg. 4) at t̂: the loss from fresh outputs and its standard error."""

    loss: float
    sigma: float
    c_n: float
    lower_bound: float
    bandwidth: np.ndarray | None
    warnings: list
    size: int  # N, the fresh outputs per database it counted


@dataclass(frozen=True)
class _Deadline:
    """A time budget's end for stage 2 (``time.perf_counter()`` value), stage 2's cost per output, and
    the seconds per output of one stage-1 step (a pair's draw and search) the last pilot took."""

    end: float
    rate: float
    search_pace: float | None = None
    refit_pace: float = 0.0  # a refit's seconds per output it draws (0: none is expected)
    duel_pace: float = 0.0  # the last pilot's duel, seconds per output per database and pair (0: it had none)

    def refit_seconds(self, n: int) -> float:
        """The seconds a refit at n takes at ``refit_pace``."""
        return self.refit_pace * REFIT_RATIO * n

    def duel_seconds(self, n: int, pairs: int) -> float:
        """The seconds a duel of ``pairs`` pairs' entrants at n takes at most (all its rounds) at ``duel_pace``
        (a pair's entrants are counted on the same draws)."""
        return self.duel_pace * DUEL_RATIO * n * pairs

    def final_size(self, n: int, stoppable: bool, rate: float | None = None) -> int:
        """N to aim at for the time stage 1 left: chosen after stage 1, before any fresh output is drawn
        (so it depends on the clock, never on stage 2's outcomes), at least 2n, at most MAX_COUNTED.

        A ``stoppable`` stage 2 (counts of an event) aims at FINAL_HEADROOM times what the pilots' rate
        buys: that rate, timed on a small pilot, ran 1.5-2 times slow (fixed costs per chunk), and the
        clock stops it at the deadline anyway (:func:`_stage2_chunks`). A kernel density at t̂ is not
        stopped: its bandwidth is set by N before the outputs are drawn, and the reported N must
        reproduce it. It aims at what ``rate`` (its own pace, :func:`_kde_pace`) buys: the pilots'
        stage 2 counted an event where they chose one, 1.5 times faster than the kernel sums (a
        report_noisy_max3 run whose search chose t̂ took 24 s of a 20 s budget).
        """
        rate = self.rate if rate is None else rate
        affordable = (FINAL_HEADROOM if stoppable else 1.0) * (self.end - time.perf_counter()) / rate
        return round_size(min(max(affordable, 2 * n), MAX_COUNTED))


def _draw_pair(plan: Plan, pair, size, rng, post=None, one: bool = False):
    """Outputs of both databases of ``pair`` after the feature (then ``post`` of them), each part of a
    draw on its own thread (:func:`empdp.audit.common.draw`), or all on the calling one (``one``: a step
    of stage 1, which runs beside others)."""
    mech = replace(plan.mech, threads=1) if one else plan.mech

    def part(outputs):
        if plan.feature is not None:
            outputs = plan.feature(pair[0], pair[1], outputs)
        return outputs if post is None else post(outputs)

    return draw(mech, pair[0], size, rng, part), draw(mech, pair[1], size, rng, part)


def _resolve_feature(mech, feature):
    if isinstance(feature, str) and feature == "default":
        return mech.feature
    if feature is None or callable(feature):
        return feature
    raise InputError(f"feature must be 'default', None or a function (x, x_prime, outputs) -> array, "
                     f"got {feature!r}")


#: sample sizes when neither sizes nor a time budget are given
DEFAULT_N, DEFAULT_FINAL = 20000, 50000
#: the pilots of a time budget run with N = BUDGET_RATIO · n (stage 2's cost per output is timed on them)
BUDGET_RATIO = 5
#: with a time budget, stage 2 of an event aims at this many times the outputs the pilots' rate buys (the
#: deadline stops it): at 2, laplace_parallel's stage 2 drew all it aimed at and runs ended at 15 of 20 s
FINAL_HEADROOM = 8.0
#: with a time budget, stage 1 is planned to take this share of the time the pilots leave and stage 2 the
#: rest (module :mod:`empdp.audit.budget`): stage 1 must find the pair and the event (N = 2 · pairs · n
#: left it too few outputs to tell SVT's events of ~4% mass apart), stage 2's N sets the bound's error
STAGE1_SHARE = 0.75


@one_blas_thread
def mpl(mechanism, pairs=None, n: int | None = None, N: int | None = None, region=None, alpha: float = 0.05,
        rng=None, *, params: dict | None = None, tau: float | None = None, discrete: bool | None = None,
        bandwidth=None, undersmooth: float = UNDERSMOOTH, selection: str = "lb",
        events: bool = True, feature="default", time_budget: float | None = None,
        progress: Callable[[str, int, int], None] | None = None, clock_start: float | None = None,
        selection_size: int | None = None, search_steps: int | None = None, duel_size: int | None = None,
        refit_size: int | None = None, threads: int | None = None) -> MPLResult:
    """MPL lower bound on the pure-DP ε of ``mechanism`` over ``pairs`` (Askin et al. 2022, Alg. 4).

    Parameters
    ----------
    mechanism : sampler ``f(database, size, rng)``, built-in name, ``"module:function"`` or Mechanism.
    pairs : list of (x, x′) databases (numbers or lists), ``"patterns"``, or None for the
        mechanism's default pairs. With x fixed and x′ over its neighbourhood the bound is
        the data-centric ε_x.
    n, N : stage-1 and stage-2 sample sizes per database (N > n); default 20000 and 50000, or
        chosen by ``time_budget``.
    region : the bounded set C, (lo, hi) or one (lo, hi) per output dimension, lo < hi; (lo, hi)
        applies to every coordinate (a box). Default: the built-in's region, else the central
        99% of the stage-1 outputs. Discrete outputs use every observed value, or when a region
        is given the observed values inside the box (for vector outputs every coordinate, after
        the ``feature``); both the single outputs and the events are restricted to it.
    alpha : error level; P(LB ≤ ε) ≥ 1 − alpha asymptotically (Theorem 2).
    rng : numpy Generator or seed (None: fresh randomness).
    tau : density floor (default 20/n for frequencies, 10^-3 / output spread for densities).
    discrete : force the discrete (TDDE) or continuous (TKDE) estimator; default: detect.
    bandwidth : stage-1 bandwidth per dimension (default Silverman/Scott rule).
    undersmooth : γ of the stage-2 bandwidth h_rot(N)·N^{-γ} (condition C4).
    selection : ``"lb"`` (default) or ``"max"`` (the paper's argmax of ℓ̂), see module doc.
    events : also consider likelihood-ratio events for discrete outputs (``selection="lb"`` only).
    feature : ``"default"`` (the mechanism's own, if any), None (raw outputs), or a function
        ``(x, x_prime, outputs) -> array`` applied to the outputs of each pair (post-processing). It is
        applied to each part of a draw (at most 32,768 outputs) on the part's thread, so it must work row
        by row and, with more than one thread, be thread-safe.
    time_budget : seconds; instead of n and N, choose them so that the audit takes about this
        long, stage 1 about STAGE1_SHARE of it (module :mod:`empdp.audit.budget`: the sizes depend
        on the machine's speed, are reported in ``sizes``, and give the same result again with the
        same seed). N is chosen when stage 1 ends, for the time it left, and stage 2 stops drawing
        early (between chunks of outputs) if the clock says the next chunk would end past the budget.
    progress : optional callback ``progress(stage, done, total)``.
    clock_start : the ``time.perf_counter()`` value the time budget counts from (default: this call;
        the command line gives its process's start).
    selection_size : the stage-2 size stage 1 weighs its candidates by (default N). A time budget
        chooses it before stage 1 and N after, for the time left (``sizes["selection_size"]``): give
        both back, with n and the seed, to reproduce the run.
    search_steps : the steps stage 1 takes (default: all). A step is one pair's draw and search (each
        finalist's in the second round of successive halving); a time budget's stage 1 begins no step
        that would end, at its pace so far, past STAGE1_END_SHARE of the time it had left, and reports
        the steps it took in ``sizes["search_steps"]`` when it stopped early: give them back too.
    duel_size : the most fresh outputs per database and pair of the duel that ends stage 1 (:func:`_duel`;
        default DUEL_RATIO·n; 0: none). A time budget's
        run shrinks or skips it as it does the refit (below), and reports ``sizes["duel_size"]`` (0: none)
        wherever the duel applies: give it back too.
    refit_size : the fresh outputs per database of the refit that ends stage 1 on vector outputs
        (:func:`_refit`; default REFIT_RATIO·n; 0: none). A time budget's run shrinks it to what ends in the
        search's share of the time at the pilots' pace, skips it when that is less than n, and reports
        ``sizes["refit_size"]`` (0: none) wherever stage 1 chose a score event: give it back too.
    threads : threads drawing outputs at once (default: every core for the built-ins, one for a user's
        sampler, which must be thread-safe to be given more); the outputs do not depend on it.
    """
    started = time.perf_counter() if clock_start is None else clock_start
    mechanism, params = load_mechanism(mechanism, params, threads), None  # (its parameters are in it now)
    sizes = given_sizes({"n, N: --search-size, --final-size, --selection-size, --search-steps, --duel-size, "
                         "--refit-size": next((v for v in (n, N, selection_size, search_steps, duel_size, refit_size)
                                               if v is not None), None)},
                        time_budget)
    end = None
    if time_budget is not None:
        budget = check_budget(time_budget)
        plan = _resolve(mechanism, pairs, DEFAULT_N, DEFAULT_FINAL, region, alpha, params, tau, selection, events,
                        feature, bandwidth, undersmooth)
        n, N, sizes, end = _budget_sizes(plan, budget, started, discrete)
    n, N = DEFAULT_N if n is None else n, DEFAULT_FINAL if N is None else N
    plan = _resolve(mechanism, pairs, n, N, region, alpha, params, tau, selection, events, feature,
                    bandwidth, undersmooth)
    if selection_size is not None:
        plan = replace(plan, selection_N=check_size("selection_size", selection_size, counted=True))
    steps = None if search_steps is None else check_size("search_steps", search_steps, minimum=1, outputs=False)
    if refit_size is not None and refit_size != 0:  # (0: none; else enough to choose on: a third, ≥ 10)
        refit_size = check_size("refit_size", refit_size, minimum=30, counted=True)
    if duel_size is not None and duel_size != 0:  # (0: none; else at least a round of one)
        duel_size = check_size("duel_size", duel_size, minimum=8, counted=True)
    res = _run(plan, as_rng(rng), discrete, progress or _no_progress, end=end, steps=steps, duel_size=duel_size,
               refit_size=refit_size)
    res.sizes = {**sizes, "search_size": plan.n, "final_size": res.final_size, **res.sizes}
    return res


def _run(plan: Plan, rng, discrete, report, clock: list | None = None, end: _Deadline | None = None,
         steps: int | None = None, duel_size: int | None = None, refit_size: int | None = None) -> MPLResult:
    """Both stages; ``clock`` (the pilots') gets the seconds of each; with a deadline ``end``, stage 1
    stops early if its pace says so (:class:`_Steps`) and N is what the time left after stage 1 buys;
    ``steps`` (given back) stops stage 1 where a deadline did, ``duel_size`` and ``refit_size`` (given back)
    size the duel and the refit."""
    t0 = time.perf_counter()
    if end is not None:  # stage 1 weighs by the N planned now; stage 2 draws what the clock allows
        plan = replace(plan, selection_N=plan.weighed_N)
    # stage 1's last steps (the refit, then the duel) end early enough for stage 2's floor of more than n
    # outputs at the pilots' pace (a plan too large for the clock drew n outputs past the deadline: 1.7 s
    # of a 4 s budget, the search having taken its share); each ends in time for those after it (shrunk
    # when begun late: _closing_size), and the search ends by when the first must begin at its full size
    closing = None if end is None else t0 + STAGE1_END_SHARE * (end.end - t0) - end.rate * plan.n
    duel_latest = None if end is None else closing - end.duel_seconds(plan.n, _halving(len(plan.pairs), plan.n)[1])
    refit_latest = None if end is None else duel_latest - end.refit_seconds(plan.n)
    # (the search ends by refit_latest; the refit, shrunk if late, by duel_latest, the duel by closing)
    stop = _Steps(steps, refit_latest, None if end is None else end.search_pace)
    stage1 = _stage1(plan, rng, discrete, report, stop)
    t_refit = time.perf_counter()
    # (a pilot's: whether its search found a score event a refit could follow, so the plan allows for one)
    scored = clock is not None and any(_refits(c) or (c.alternative is not None and _refits(c.alternative))
                                       for c in stage1.candidates)
    best, refit = stage1.candidates[stage1.selected], None
    refits = _refits(best)
    if refits:
        if refit_size is None:
            refit_size = _closing_size(REFIT_RATIO, plan.n, duel_latest, 0.0 if end is None else end.refit_pace)
        if refit_size:
            refit = _refit(plan, best, plan.pairs[stage1.selected], refit_size, rng, report)
    t_duel = time.perf_counter()
    entrants = _entrants(stage1, refit)
    chosen, duel = (stage1.selected, refit or best), None
    duels = _duels(entrants, plan, stage1.discrete)
    if duels:
        if duel_size is None:
            pairs = len({k for k, *_ in entrants})  # (a pair's entrants are counted on the same draws)
            duel_size = _closing_size(DUEL_RATIO, plan.n, closing, 0.0 if end is None else end.duel_pace * pairs)
        if duel_size:
            won, duel = _duel(plan, entrants, duel_size, rng, report)
            chosen = won[:2]
    selected, best = chosen
    # (a runner-up's loss curve may be a grid of 128^3 points: none is kept past the duel)
    stage1 = replace(stage1, selected=selected, candidates=[
        replace(best if k == selected else c, alternative=None) for k, c in enumerate(stage1.candidates)])
    t1 = time.perf_counter()
    stoppable = stage1.discrete or best.rule is not None
    if end is not None:
        pace = None if stoppable else _kde_pace(plan, best, plan.pairs[stage1.selected], end)
        plan = replace(plan, N=end.final_size(plan.n, stoppable, pace))
    stage2 = _stage2(plan, stage1.discrete, best, plan.pairs[stage1.selected], rng, report,
                     end.end if end is not None and stoppable else None)
    if clock is not None:
        clock.append(_Clock(t_refit - t0, t1 - t_duel if duel else 0.0, t_duel - t_refit if refit else 0.0,
                            time.perf_counter() - t1, len(set(duel["pairs"])) * duel["outputs"] if duel else 0,
                            scored))
    res = _result(plan, stage1, stage2)
    res.duel = duel
    if plan.selection_N is not None:  # (a time budget's, or given): what reproduces stage 1's choice
        res.sizes["selection_size"] = plan.selection_N
    if stop.stopped:  # (by the clock, or given): what reproduces stage 1's outputs
        res.sizes["search_steps"] = stop.done
    if refits:  # (0: none, the clock's choice, or given)
        res.sizes["refit_size"] = refit_size
    if duels:  # (0: none, the clock's choice, or given)
        res.sizes["duel_size"] = duel_size
    if end is not None:
        res.sizes["final_size_aimed"] = plan.N  # above final_size when the deadline stopped stage 2
    return res


@dataclass(frozen=True)
class _Clock:
    """A pilot run's seconds in each step: the search, the duel and the refit (0 where it had none),
    stage 2; the outputs per database its duel drew over all its pairs; and whether its search found a
    score event of vector outputs (which a refit follows when it is selected)."""

    search: float
    duel: float
    refit: float
    stage2: float
    duel_outputs: int
    scored: bool = False


def _budget_sizes(plan: Plan, budget: float, started: float, discrete) -> tuple[int, int, dict, _Deadline]:
    """n and N for a time budget counted from ``started`` (a ``time.perf_counter()`` value), from pilot
    runs (:func:`empdp.audit.budget.two_stage_sizes`), and stage 2's deadline."""
    end = deadline(started, budget)
    exact_or_none(plan.mech.true_epsilon_over, plan.pairs)  # cached: a one-off cost, not the audit's
    probe = as_samples(_draw_pair(plan, plan.pairs[0], 2, np.random.default_rng(0))[0])
    if probe.shape[1] > 1 and plan.score_events:
        load_optimizer()  # (the logistic score's, once, before the pilots time the search)
    cap = max(PILOT_SIZES[-1], min(stage1_cap(probe, 2 * len(plan.pairs)), MAX_SAMPLES // BUDGET_RATIO))
    clock = []

    def run(size, rng):
        _run(replace(plan, n=size, N=BUDGET_RATIO * size), rng, discrete, _no_progress, clock)

    sizes, _, pilot = run_pilots(run, budget, cap)
    last = clock[-1]
    stage1 = [c.search + c.duel + c.refit for c in clock]  # (the duel and the refit are stage 1's last steps)
    stage2 = [c.stage2 for c in clock]
    log.debug("MPL pilots: sizes %s, stage 1 %s s (duels %s s, refits %s s), stage 2 %s s", sizes,
              [round(t, 3) for t in stage1], [round(c.duel, 3) for c in clock], [round(c.refit, 3) for c in clock],
              [round(t, 3) for t in stage2])
    n, N, info = two_stage_sizes(sizes, stage1, stage2, BUDGET_RATIO, budget, pilot, STAGE1_SHARE, PILOT_SIZES[-1],
                                 (cap, MAX_COUNTED), left=end - time.perf_counter())
    info["seconds_before_plan"] = round(time.perf_counter() - started, 3)  # start-up and pilots
    rows = sum(_step_rows(len(plan.pairs), sizes[-1]))
    # per core, as _Steps keeps it: the pilot's steps ran side by side on at most this many cores
    pace = last.search * min(draw_workers(plan.mech), len(plan.pairs), available_cores()) / rows
    # the refit's pace: the last pilot's; where it had none but its search found score events (which a
    # refit follows when selected), its search's (a refit draws and codes outputs, a search also fits its
    # scores); numbers never get one, nor do discrete vectors of few values (SVT's answers: no score
    # events), for which a refit's time held back cut svt6's search at a 5 s budget to its first 2 pairs
    refit_pace = (last.refit / (REFIT_RATIO * sizes[-1]) if last.refit
                  else pace / available_cores() if last.scored else 0.0)
    # the duel's: the last pilot's, per output drawn (a duel that stopped early drew fewer than its size);
    # none where the pilot had none (the paper's rule, or one finalist with an event that has no rungs)
    duel_pace = last.duel / last.duel_outputs if last.duel_outputs else 0.0
    return n, N, info, _Deadline(end, stage2_rate(sizes, stage2, BUDGET_RATIO), pace, refit_pace, duel_pace)


def _resolve(mechanism, pairs, n, N, region, alpha, params, tau, selection, events, feature,
             bandwidth, undersmooth) -> Plan:
    """Check the inputs once and fill in the defaults (the region from the mechanism)."""
    mech = load_mechanism(mechanism, params)
    pairs = resolve_pairs(mech, pairs, "mpl")
    n, N = check_size("n", n), check_size("N", N, counted=True)
    if N <= n:
        raise InputError(f"`N` (stage-2 outputs: {N}) must be larger than `n` (stage-1 outputs: {n}): stage 2 "
                         "measures the selected output with fresh, more numerous samples", param=("N", "n"))
    alpha = check_level(alpha)
    if region is not None:
        check_region(region)
    if selection not in ("lb", "max"):
        raise InputError(f"selection must be 'lb' or 'max', got {selection!r}")
    if tau is not None and not (isinstance(tau, (int, float)) and tau > 0):
        raise InputError(f"tau must be a positive number, got {tau!r}")
    feature = _resolve_feature(mech, feature)
    return Plan(mech=mech, pairs=pairs, n=n, N=N, alpha=alpha, zc=_normal_quantile(1 - alpha),
                 region=mech.region if region is None else region, tau=tau, selection=selection,
                 events=events and selection == "lb", bandwidth=bandwidth, undersmooth=undersmooth,
                 feature=feature, score_events=events and selection == "lb" and region is None)


#: with a time budget, stage 1 begins no step (:class:`_Steps`) that would end, at its pace so far, past this
#: share of the time from its start to stage 2's deadline: a planned stage 1 takes STAGE1_SHARE of it, but
#: the pilots' forecast of a stage 1 ten times their size can miss (laplace at the memory cap: 17.3 s where
#: 11 were planned, and a run of 21.2 s)
STAGE1_END_SHARE = 0.85


@dataclass
class _Steps:
    """Which steps stage 1 begins: all, the first ``given`` (a stopped run given back), or with a deadline
    ``end`` (a ``time.perf_counter()`` value) those its pace so far says end by it. The first step is
    always begun, every step begun is finished, and steps begin in order, so the steps taken are the
    first ``done``; the stop depends on the clock alone, and ``done`` is reported.

    Before any step has ended the pace is the pilots' (``prior``, seconds per output of a step): a step it
    does not vouch for waits for a running one to end (:meth:`waits`). With no pace at all, every step
    begun beside the first ran unchecked (all of a first round, on as many cores as pairs).

    ``load`` is the number of steps running once this one begins: beyond the machine's cores they share
    them, and a step takes ``load / cores`` times its pace (a user's sampler given more threads than
    cores); the pace is kept per core, each step's seconds divided by the share it began with."""

    given: int | None
    end: float | None
    prior: float | None = None
    done: int = 0
    stopped: bool = False
    _seconds: float = 0.0
    _rows: int = 0
    _cores: int = field(default_factory=available_cores)

    def _share(self, load: int) -> float:
        return max(1.0, load / self._cores)

    def _fits(self, pace: float, rows: int, load: int) -> bool:
        return time.perf_counter() + pace * rows * self._share(load) <= self.end

    def waits(self, rows: int, load: int = 1) -> bool:
        """Whether the next step must wait for a running one to end before :meth:`begin` decides: no step
        has ended yet, and the pilots' pace does not say this one ends by the deadline."""
        return self.given is None and self.end is not None and not self._rows and (
            self.prior is None or not self._fits(self.prior, rows, load))

    def begin(self, rows: int, load: int = 1) -> bool:
        """Whether to begin the next step, which searches ``rows`` outputs per database beside ``load`` − 1
        running ones."""
        if self.given is not None:
            go = self.done < self.given
        else:
            pace = self._seconds / self._rows if self._rows else self.prior or 0.0
            go = self.end is None or not self.done or self._fits(pace, rows, load)
        self.stopped = self.stopped or not go
        self.done += go
        return go

    def took(self, rows: int, seconds: float, load: int = 1) -> None:
        """A step of ``rows`` outputs per database, begun with ``load`` − 1 others running, ended after
        ``seconds``."""
        self._rows += rows
        self._seconds += seconds / self._share(load)


def _stage1(plan: Plan, rng, discrete: bool | None, report, stop: _Steps | None = None) -> _Stage1:
    """DPL on every pair and the choice of the pair for stage 2.

    With B ≥ 3 pairs it runs in two rounds (successive halving): n/2 outputs per
    database for every pair, then the rest of the budget to the best ⌈B/HALVING⌉.
    ``stop`` may end it after any step (a pair's search): the pairs searched so far compete, and
    finalists not searched again keep their first-round candidates. Steps run side by side on the
    draw's threads (:func:`_steps`), each with its own stream, so the result does not depend on how many.
    """
    stop = stop or _Steps(None, None)
    pairs, n = plan.pairs, plan.n
    t_start = time.perf_counter()
    n1, keep, extra = _halving(len(pairs), n)
    stage = f"MPL stage 1: {len(pairs)} pairs x 2 x {n:,} outputs"
    steps = len(pairs) + (keep if extra else 0)
    report(stage, 0, steps)
    streams = part_generators(rng, steps)
    stop.begin(n1)  # the first step is always taken: its outputs say whether the outputs are discrete
    t0 = time.perf_counter()
    first = [as_samples(v) for v in _draw_pair(plan, pairs[0], n1, streams[0])]
    is_discrete = detect_discrete(np.concatenate([np.ravel(v) for v in first]), discrete)
    kept = [None] * len(pairs)  # a first round's outputs, when a second adds to them

    def first_round(b):
        x, y = first if b == 0 else (as_samples(v) for v in _draw_pair(plan, pairs[b], n1, streams[b], one=True))
        kept[b] = (x, y) if extra else None
        return candidate(x, y, is_discrete, plan, logistic=not extra)

    cands = _steps(plan, first_round, range(len(pairs)), n1, stop, lambda done: report(stage, done, steps), t0)
    finalists = sorted(range(len(cands)), key=lambda k: -cands[k].score)[:keep]
    # (only a finalist's runner-up enters the duel; a point's loss curve may be a grid of 128^3 points)
    cands = [c if k in finalists else replace(c, alternative=None) for k, c in enumerate(cands)]
    if extra and not stop.stopped:  # the second round: more outputs for the finalists, added to their first ones

        def second_round(j):
            b = finalists[j]
            xs, ys = _draw_pair(plan, pairs[b], extra, streams[len(pairs) + j], one=True)
            x, y = np.concatenate([kept[b][0], as_samples(xs)]), np.concatenate([kept[b][1], as_samples(ys)])
            return candidate(x, y, is_discrete, plan)

        again = _steps(plan, second_round, range(len(finalists)), n1 + extra, stop,
                       lambda done: report(stage, len(pairs) + done, steps))
        for j, cand in enumerate(again):
            cands[finalists[j]] = cand
    kept.clear()  # (the first round's outputs: no longer needed)
    finalists.sort(key=lambda k: -cands[k].score)  # (a second round's scores)
    selected = finalists[0]
    log.info("MPL stage 1 (DPL): %d pairs x 2 x %d outputs%s%s, %s estimate, in %.2f s; selected pair %d, "
             "stage-1 max loss %.4g", len(cands), n1,
             f" (stopped by the clock after {stop.done} steps)" if stop.stopped else "",
             f", then {keep} pairs x 2 x {extra} more" if extra else "",
             "frequency" if is_discrete else "kernel density", time.perf_counter() - t_start, selected,
             cands[selected].max_loss)
    return _Stage1(cands, selected, is_discrete, finalists)


def _halving(pairs: int, n: int) -> tuple[int, int, int]:
    """Successive halving's rounds over ``pairs`` pairs at n: (outputs per database of the first round,
    finalists, outputs each finalist adds in the second; 0: one round)."""
    n1, keep = n, pairs
    if pairs >= 3 and n >= 200:
        n1, keep = n // 2, max(1, math.ceil(pairs / HALVING))
    return n1, keep, (pairs * (n - n1)) // keep


def _step_rows(pairs: int, n: int) -> list[int]:
    """The outputs per database each step of stage 1 searches (the finalists': both rounds' outputs)."""
    n1, keep, extra = _halving(pairs, n)
    return [n1] * pairs + ([n1 + extra] * keep if extra else [])


def _steps(plan: Plan, step, items, rows: int, stop: _Steps, done, first_began: float | None = None) -> list:
    """``step(item)`` for the first items ``stop`` lets begin, in order, at most as many at once as the
    mechanism's draws have threads; their results in order. ``first_began``: the first item was begun
    (by the caller, at that time). With one thread (a user's sampler, unless its user says it is
    thread-safe) every step runs on the calling thread."""
    workers = draw_workers(plan.mech)
    items = list(items)
    results = {}

    def begun(k):  # (the first item, by the caller)
        return k == 0 and first_began is not None

    def run(k):
        t0 = first_began if begun(k) else time.perf_counter()
        result = step(items[k])
        return result, time.perf_counter() - t0

    def record(k, outcome, load):
        results[k], seconds = outcome
        stop.took(rows, seconds, load)
        done(len(results))

    if workers == 1:
        for k in range(len(items)):
            if not begun(k) and not stop.begin(rows):
                break
            record(k, run(k), 1)
        return [results[k] for k in range(len(results))]
    running = {}

    def finish(future):
        k, load = running.pop(future)
        record(k, future.result(), load)

    with ThreadPoolExecutor(workers, thread_name_prefix="empdp-search") as pool:
        for k in range(len(items)):
            while len(running) >= workers or (running and stop.waits(rows, len(running) + 1)):
                finish(next(as_completed(running)))
            if not begun(k) and not stop.begin(rows, len(running) + 1):
                break
            running[pool.submit(run, k)] = (k, len(running) + 1)
        while running:
            finish(next(as_completed(running)))
    return [results[k] for k in range(len(results))]


#: the refit (:func:`_refit`) draws REFIT_RATIO·n fresh outputs per database: it counts the tables on two
#: thirds and chooses the event on a third, at most REFIT_CHOOSE_MAX (whose scores it holds: 13 scores of
#: 2 x 2^20 outputs, 220 MB). 24 instead of 6, tried at 20 s (medians, run by run): svt3 seeds 0-3 0.2428
#: against 0.2158 but seeds 4-9 0.2274 against 0.229 (two of them 0.13-0.16), svt34_parallel 0.2675 against
#: 0.2984, laplace_parallel 0.051 against 0.0654 (its time comes out of the search or stage 2)
REFIT_RATIO, REFIT_CHOOSE_MAX = 6, 1 << 20
#: the refit counts its tables over chunks of at most this many outputs per database, and of at most
#: MAX_STAGE1_BYTES of outputs and codes in all (the first chunk, which fixes the binnings, also holds
#: the binnings' working copies: REFIT_COPIES samples' worth)
REFIT_CHUNK, REFIT_COPIES = 1 << 18, 12


def _refits(best: Candidate) -> bool:
    """Whether stage 1's choice may be refitted: a score event on vector outputs (the table scores exist)."""
    return best.rule is not None and best.rule.scorer is not None


def _closing_size(ratio: int, n: int, by: float | None = None, pace: float = 0.0) -> int:
    """The outputs per database of one of stage 1's closing steps (the duel, the refit) at search size n:
    ``ratio``·n, or with a deadline ``by`` (a ``time.perf_counter()`` value, by which it must end to
    leave what follows it its time) as many as end by then at ``pace`` seconds per output per database
    (the pilots'), if that is at least n, else 0 (none). What the clock decides is reported and given back.

    All or nothing wasted the time kept for them: a laplace_parallel search stopped after its first pair,
    to leave the refit of 20 coordinates its time, then skipped the refit and the duel too (a stopped
    search skipped both), and stage 2 counted the search's own weak event (bound 0.006, true ε 0.1)."""
    if by is None:
        return ratio * n
    left = by - time.perf_counter()
    if left <= 0:
        return 0
    size = ratio * n if pace <= 0 else min(ratio * n, int(left / pace))
    return size if size >= n else 0


def _refit_parts(size: int) -> tuple[int, int]:
    """(outputs per database the refit counts its tables on, those it chooses the event on)."""
    choose = min(size // 3, REFIT_CHOOSE_MAX)
    return size - choose, choose


def _refit(plan: Plan, best: Candidate, pair, size: int, rng, report) -> Candidate:
    """Stage 1's last step on vector outputs: the selected pair's table scores (module
    :mod:`empdp.audit.ratios`) counted again on ``size`` fresh outputs per database less those that
    choose, streamed in chunks (one held at a time), and the event with the best predicted bound among
    theirs and stage 1's own, each with its threshold chosen on a third of them (at most
    REFIT_CHOOSE_MAX) fresh again.

    Stage 1 holds its outputs, so memory caps its tables' counts; the refit only counts. Where the
    loss lies in rare outputs, stage 1's tables are noise there: svt3's best events are values
    released late (1 output in 5,000), and at a 20 s budget the median bound over seeds 1-5 rose from
    0.157 to 0.204 (DP-Sniper's 0.182; tests/bench/closing_ab.py --step refit). Like stage 1 it only chooses what
    stage 2 measures on fresh outputs: the bound stays valid whatever the refit chooses.
    """
    t0 = time.perf_counter()
    fit, choose = _refit_parts(size)
    stage = f"MPL stage 1: refitting the scores on 2 x {size:,} fresh outputs"
    report(stage, 0, 1)
    probe = as_samples(_draw_pair(plan, pair, 2, rng)[0])  # (the width: the chunks' rows are set by bytes)
    first = max(min(FIT_ROWS, fit, stage1_cap(probe, REFIT_COPIES)), 2)
    tables = TableScores(*(as_samples(v) for v in _draw_pair(plan, pair, first, rng)))
    chunk = max(min(REFIT_CHUNK, MAX_STAGE1_BYTES // (2 * 4 * tables.columns)), 1)  # (codes: int32)
    codes = lambda outputs: tables.codes(as_samples(outputs))  # noqa: E731 (on the draw's threads)
    for start in range(first, fit, chunk):
        tables.add(*_draw_pair(plan, pair, min(chunk, fit - start), rng, codes))
    families = tables.scores()
    rules = [ScoreRule(s.name, 0.0, 1, s, refitted=True) for _, scores in families for s in scores] + [best.rule]
    block = max(MEMBER_VALUES // tables.width, 1)  # (rows scored at once, as stage 2 scores its members)

    def scored(outputs):  # every refitted score and stage 1's, side by side (on the draw's threads)
        outputs = as_samples(outputs)
        out = np.empty((len(outputs), len(rules)))
        for start in range(0, len(outputs), block):  # (a block's codes at a time: they are wide)
            rows = outputs[start:start + block]
            by_binning = tables.split(tables.codes(rows))
            columns = [s.score_codes(c) for (_, scores), c in zip(families, by_binning) for s in scores]
            out[start:start + block] = np.column_stack(columns + [best.rule.score(rows)])
        return out

    sx, sy = _draw_pair(plan, pair, choose, rng, scored)
    weight = plan.zc / math.sqrt(plan.weighed_N) + SCORE_PENALTY / math.sqrt(choose)
    rule, (crit, direction, threshold, cand, loss) = best_rule(
        ((rule, np.ascontiguousarray(sx[:, k]), np.ascontiguousarray(sy[:, k])) for k, rule in enumerate(rules)),
        best.tau, weight)
    report(stage, 1, 1)
    log.info("MPL stage 1 refit: %d scores counted on 2 x %d fresh outputs, chosen on 2 x %d, in %.2f s: %s "
             "(criterion %.4g)", len(rules) - 1, fit, choose, time.perf_counter() - t0,
             "stage 1's event" if rule is best.rule else rule.kind, crit)
    return replace(best, score=crit, t=np.array([threshold]), pts=cand[:, None], loss=loss,
                   rule=replace(rule, threshold=threshold, direction=direction), alternative=None)


#: with several entrants, or one score event of vector outputs,
#: stage 1 ends with a duel (:func:`_duel`): each entrant measured on at most DUEL_RATIO·n fresh
#: outputs per database, in rounds of DUEL_FIRST of them and then doubling, until the leader's predicted
#: bound leads every other's by DUEL_Z standard errors of their difference. A ratio of 20, tried at 20 s on
#: svt3 (whose search is capped by memory, leaving time to spare): seeds 0-3 0.2259 against 0.2283 (median)
DUEL_RATIO, DUEL_FIRST, DUEL_Z = 5, 1 / 8, 3.0
#: a score event's rungs: the same score's events at these shares of its mass, placed on the duel's first
#: round (its first RUNG_ROWS outputs of each database at most: what they keep is held) where those hold
#: at least RUNG_HITS outputs in them, and counted from its second round on. Rungs at a hundredth and a
#: three-hundredth too, tried at 20 s (medians, run by run): svt3 seeds 0-6 0.2323 against 0.2289,
#: svt34_parallel seeds 0-3 0.3574 against 0.3322 (seed 0 0.362 against 0.066, but 0.124 when run again),
#: the other vector rows within their noise: not kept, the gain being within the runs' spread
RUNGS, RUNG_HITS, RUNG_ROWS = (1 / 3, 1 / 10, 1 / 30), 10, 1 << 20
#: the duel picks the entrant whose predicted bound less DUEL_PICK standard errors of its own estimate is
#: the largest, DUEL_PICK_POINT for a point t̂ (a rare event, or a point's kernel sums, are estimated with
#: a large error: a lucky one should not carry the pick). A point's prediction is optimistic: under a time
#: budget its stage 2 gets about half an event's N (kernel sums cost more and are not stopped by the
#: clock), which the prediction does not charge. Medians at 20 s, seeds 0-4 (0-9 for svt3): with 1 for
#: every entrant against 2 for every entrant, report_noisy_max3 0.2477 against 0.2493 (a t̂ read at 0.259
#: by the duel, where no point's loss exceeds 0.25, won at 1); with these charges 0.2492, laplace 0.0998
#: and report_noisy_max4 0.7599 against 0.0998 and 0.759 (2 for all). Rows without points, where these
#: charges are 1 for all, gained against 2 for all: svt3 0.228 against 0.2268 (its lowest seed 0.204
#: against 0.178: a rung at 0.079 of its event's mass, whose stage 2 bound was 0.2045, lost to the refit's
#: event at 2), svt34_parallel 0.325 against 0.2765, laplace_parallel 0.0579 against 0.0533; the other
#: vector rows within their noise (prefix_sum 0.002 lower). Before the half-lines of numbers lost their
#: rungs, report_noisy_max3 had lost to them at 1 as well
DUEL_PICK, DUEL_PICK_POINT = 1.0, 2.0
#: the duel draws at most this many outputs per database at once (a round of 5n/2 at n = 2·10^7 is
#: 5·10^7: their values, a float per entrant, are counted a chunk at a time)
DUEL_CHUNK = 1 << 18


def _entrants(stage1: _Stage1, refit: Candidate | None) -> list[tuple[int, Candidate, bool, float]]:
    """The duel's entrants (pair, event, whether refitted, share of the mass of the event it was placed
    from: 1 here, see RUNGS): the search's finalists, best first, each with its own event, and the
    refit's event of the selected pair beside the search's; a finalist's runner-up (``Candidate.alternative``:
    t̂ beside a half-line) follows it."""
    found = []
    for k in stage1.finalists:
        cand = stage1.candidates[k]
        found += [(k, cand, False, 1.0)] + ([(k, cand.alternative, False, 1.0)] if cand.alternative else [])
    return found + ([(stage1.selected, refit, True, 1.0)] if refit is not None else [])


def _kernel(cand: Candidate) -> bool:
    """Whether stage 2 estimates a candidate by kernel densities at its t̂ (a point of continuous outputs)."""
    return cand.rule is None and cand.event is None and cand.bandwidth is not None


def _duels(entrants: list, plan: Plan, discrete: bool) -> bool:
    """Whether stage 1 ends with a duel: the predicted bound chooses (``selection="lb"``; the paper's
    rule chooses by the loss alone), every entrant is an event stage 2 would count or a point t̂ of
    continuous outputs (measured by kernel densities, as stage 2 would), and there are two entrants or
    more, or a score event of vector outputs (whose rungs are entrants too, :func:`_rungs`)."""
    lone = entrants[0][1].rule
    return plan.selection == "lb" and all(discrete or cand.rule is not None or _kernel(cand)
                                          for _, cand, *_ in entrants) and (
        len(entrants) >= 2 or (lone is not None and lone.scorer is not None))


def _duel_rounds(size: int) -> list[int]:
    """The duel's rounds of outputs per database and pair, ``size`` in all: DUEL_FIRST of it, the same
    again, then doubling, the last round taking what is left (an eighth, an eighth, a quarter, a half)."""
    rounds, drawn, step = [], 0, max(int(size * DUEL_FIRST), 1)
    while drawn + 2 * step <= size:  # (a round twice the last would still leave one: take this one)
        rounds.append(step)
        drawn += step
        step = drawn
    return rounds + [size - drawn]


def _duel(plan: Plan, entrants: list, size: int, rng, report) -> tuple[tuple, dict]:
    """Stage 1's choice among its entrants (:func:`_entrants`) and their rungs, made again on fresh
    outputs: each pair's outputs drawn once a round (:func:`_duel_rounds`), up to ``size`` per database,
    and every entrant of that pair counted on them; the one with the best predicted stage-2 bound, less
    DUEL_PICK standard errors of its own estimate (DUEL_PICK_POINT for a point t̂), is chosen.

    Stage 1 picks a pair by its estimates on the outputs that chose each pair's event; where the
    finalists' losses differ by less than that noise the pick is a coin toss (report_noisy_max1: best
    events of exact losses 0.0926 and 0.0946, estimated within 10^-5 of each other at n = 3.12·10^6).
    The refit chooses its event by a criterion that charges its threshold's choice on its third of the
    outputs, which weighs against rare events that stage 2 would measure well (svt3: the search's event
    measured 0.257 on the duel's outputs, the refit's 0.156 in stage 2). Stage 1 charges its own choice
    the same way, so a score event's rungs (RUNGS: its mass over 3, 10 and 30, where its score's values
    are not tied) enter the duel too: svt34_parallel's chosen events had a bound of 0.26-0.30 at their
    mass and 0.29-0.36 at a tenth or a third of it, on 10^7 fresh outputs of each database. The duel
    stops once the leader leads every other entrant by DUEL_Z standard errors, so a clear choice costs
    its first round (its second where rungs were placed). A point t̂ of continuous outputs (beside a
    half-line: ``Candidate.alternative``) is measured by kernel densities at stage 2's bandwidth, as stage 2
    would measure it. Like the rest of stage 1 it only chooses what
    stage 2 measures on fresh outputs: the bound keeps its level whatever the duel picks. Returns the
    winner (an entrant or a rung, as :func:`_entrants` gives them), and what the duel saw
    (``MPLResult.duel``).
    """
    t0 = time.perf_counter()
    entrants = list(entrants)
    groups: dict[int, list[int]] = {}  # pair index -> its entrants (counted on the same draws)
    for j, (k, *_) in enumerate(entrants):
        groups.setdefault(k, []).append(j)
    values = {k: _duel_values([entrants[j][1] for j in js], plan) for k, js in groups.items()}
    column = {j: i for js in groups.values() for i, j in enumerate(js)}  # an entrant's column of its pair's values
    levels = [_duel_level(cand) for _, cand, *_ in entrants]  # an entrant's event: its value ≥ its level
    # an event's counts, or a point's kernel sums, in each database
    hits, drawn = np.zeros((len(entrants), 2)), np.zeros(len(entrants), dtype=np.int64)
    found = len(entrants)
    stage = f"MPL stage 1: duel of {found} entrants on 2 x {size:,} fresh outputs of each pair at most"
    rounds = _duel_rounds(size)
    report(stage, 0, len(rounds))
    placing = min(rounds[0], RUNG_ROWS)  # (the first round's outputs the rungs are placed on)
    for r, count in enumerate(rounds):
        above = {}  # the values at or above each entrant's level among those outputs
        for k, js in groups.items():
            for start in range(0, count, DUEL_CHUNK):  # (a chunk's values at a time)
                vx, vy = _draw_pair(plan, plan.pairs[k], min(DUEL_CHUNK, count - start), rng, values[k])
                for j in js:
                    if levels[j] is None:  # (a point: its kernel weights)
                        hits[j] += (float(np.sum(vx[:, column[j]])), float(np.sum(vy[:, column[j]])))
                        drawn[j] += len(vx)
                        continue
                    inx, iny = vx[:, column[j]] >= levels[j], vy[:, column[j]] >= levels[j]
                    hits[j] += (int(np.count_nonzero(inx)), int(np.count_nonzero(iny)))
                    drawn[j] += len(inx)
                    if r == 0 and start < placing:
                        keep = slice(0, placing - start)
                        above.setdefault(j, []).append((vx[keep, column[j]][inx[keep]], vy[keep, column[j]][iny[keep]]))
        if r == 0 and len(rounds) > 1:  # (rungs are counted from the second round on)
            for j, parts in above.items():
                ax, ay = (np.concatenate(side) for side in zip(*parts))
                for share, level in _rungs(entrants[j][1], ax, ay, placing, levels[j]):
                    k, cand, again, _ = entrants[j]
                    entrants.append((k, _at_level(cand, level), again, share))
                    column[len(entrants) - 1] = column[j]
                    groups[k].append(len(entrants) - 1)
                    levels.append(level)
            above.clear()
            rungs = len(entrants) - found
            hits = np.concatenate([hits, np.zeros((rungs, 2))])
            drawn = np.concatenate([drawn, np.zeros(rungs, dtype=np.int64)])
        report(stage, r + 1, len(rounds))
        if r == 0 and len(entrants) > found:
            continue  # (the rungs have no count yet)
        predicted, loss, sigma, scale = _duel_scores(hits, drawn, [cand for _, cand, *_ in entrants], plan)
        error = sigma / (scale * np.sqrt(drawn))
        pick = np.array([DUEL_PICK_POINT if _kernel(cand) else DUEL_PICK for _, cand, *_ in entrants])
        lead = int(np.argmax(predicted - pick * error))
        gap = predicted[lead] - np.delete(predicted, lead)
        spread = np.sqrt(error[lead] ** 2 + np.delete(error, lead) ** 2)
        if np.all(gap > DUEL_Z * spread):  # (with one entrant and no rungs: nothing to choose)
            if r + 1 < len(rounds):
                report(stage, len(rounds), len(rounds))  # (settled: the rounds left are not needed)
            break
    names = [f"{k}{' refitted' if again else ''}{' t_hat' if _kernel(cand) else ''}"
             f"{'' if share == 1 else f' at {share:.2g} of its mass'}" for k, cand, again, share in entrants]
    log.info("MPL stage 1 duel: %d entrants and %d rungs on 2 x %d fresh outputs of each pair (of %d) in %.2f s: "
             "losses %s, %s%s", found, len(entrants) - found, drawn[0], size, time.perf_counter() - t0,
             dict(zip(names, (round(float(v), 5) for v in loss))), names[lead],
             "" if entrants[lead][0] == entrants[0][0] else f" (the search chose pair {entrants[0][0]})")
    seen = {"pairs": [k for k, *_ in entrants], "refitted": [again for _, _, again, _ in entrants],
            "t_hat": [_kernel(cand) for _, cand, *_ in entrants],
            "mass_shares": [share for *_, share in entrants], "losses": [float(v) for v in loss],
            "predicted_bounds": [float(v) for v in predicted], "standard_errors": [float(v) for v in error],
            "outputs": int(drawn[0]), "counted": [int(v) for v in drawn], "chosen": lead}
    return entrants[lead], seen


def _duel_level(cand: Candidate) -> float | None:
    """The level an entrant's duel value (:func:`_duel_values`) reaches on its event (None: a point)."""
    return (None if _kernel(cand) else cand.rule.direction * cand.rule.threshold if cand.rule is not None
            else 1.0)


def _duel_bandwidth(cand: Candidate, plan: Plan) -> np.ndarray:
    """The bandwidth at which the duel measures a point: stage 2's for the size stage 1 weighs by, stage 1's
    rescaled as stage 2 rescales its own (:func:`empdp.audit.dpl.undersmoothed`). At the duel's own size
    (wider) the estimate's error was smaller, but a peaked loss was smoothed away: 0.64 against 0.83 at
    stage 2's on the spike of tests/test_audit_duel.py."""
    return undersmoothed(cand.bandwidth, plan.weighed_N, cand.rows, len(cand.bandwidth), plan.undersmooth)


def _duel_values(cands: list, plan: Plan | None = None):
    """A part's outputs -> (outputs, len(cands)): each entrant's value, whose event is value ≥ its level
    (:func:`_duel_level`): a score event's score times its direction, another event's membership (1, 0);
    a point's kernel weight at its t̂ (at stage 2's bandwidth, :func:`_duel_bandwidth`), whose mean is the
    kernel density there."""
    members = [None if c.rule is not None or _kernel(c) else _members(c) for c in cands]
    widths = [_duel_bandwidth(c, plan) if _kernel(c) else None for c in cands]

    def values(outputs):
        outputs = as_samples(outputs)
        out = np.empty((len(outputs), len(cands)))
        block = max(MEMBER_VALUES // outputs.shape[1], 1)  # (scores are row by row, as stage 2 scores them)
        for i, (cand, member) in enumerate(zip(cands, members)):
            if widths[i] is not None:
                out[:, i] = kernel_weights(outputs, cand.t, widths[i])
                continue
            if member is not None:
                out[:, i] = member(outputs)
                continue
            for start in range(0, len(outputs), block):
                out[start:start + block, i] = cand.rule.direction * cand.rule.score(outputs[start:start + block])
        return out

    return values


def _rungs(cand: Candidate, above_x: np.ndarray, above_y: np.ndarray, rows: int,
           level: float) -> list[tuple[float, float]]:
    """A score event's rungs (share, level) from the first round's ``rows`` outputs of each database, of
    which ``above_x``, ``above_y`` are the values at or above the event's level: on the side with more of
    them, its events at RUNGS of its mass, each holding at least RUNG_HITS of them and twice the floor τ
    (which stage 2 puts under both frequencies: an event near it would lose its loss), and above the
    last (the score's values tied at the top give no rarer event). A rung's share is the share of the
    event its level keeps (more than RUNGS' where values are tied at it). A half-line of a number (the
    output itself scores it) gets none: the search chose it on all its outputs, not on a capped or
    refitted share, and report_noisy_max3's, whose loss is flat in the tail, only lost by its rungs."""
    if cand.rule is None or cand.rule.scorer is None:
        return []
    side = np.sort(above_x if len(above_x) >= len(above_y) else above_y)
    mass = len(side)
    out, last = [], level
    for share in RUNGS:
        keep = int(math.ceil(mass * share))
        if keep < max(RUNG_HITS, 2 * cand.tau * rows):
            break
        at = float(side[mass - keep])
        if at > last:
            out.append((float(np.count_nonzero(side >= at)) / mass, at))
            last = at
    return out


def _at_level(cand: Candidate, level: float) -> Candidate:
    """A score event's candidate at another level of its duel value: {direction·score ≥ level}."""
    threshold = cand.rule.direction * level
    return replace(cand, t=np.array([threshold]), rule=replace(cand.rule, threshold=threshold), alternative=None)


def _duel_scores(hits: np.ndarray, drawn: np.ndarray, cands: list, plan: Plan):
    """Each entrant's predicted stage-2 bound (as stage 1's criterion, without its search penalty), loss,
    σ̂ and the factor c with which its estimate's standard error is σ̂ / (c √drawn): an event's from its
    counts in ``drawn`` outputs per database (eq. 25, c = 1), a point's from its kernel sums at stage 2's
    bandwidth h as stage 2's (σ̂² = ∫K²(1/f_x + 1/f_x′), c = √(h^d))."""
    tau = np.array([c.tau for c in cands])
    fx, fy = np.maximum(hits[:, 0] / drawn, tau), np.maximum(hits[:, 1] / drawn, tau)
    loss = np.abs(np.log(fx) - np.log(fy))
    sigma, scale, c_n = sigma_discrete(fx, fy), np.ones(len(cands)), np.full(len(cands), math.sqrt(plan.weighed_N))
    for i, cand in enumerate(cands):
        if _kernel(cand):
            sigma[i] = math.sqrt(GAUSS_R ** len(cand.t) * (1 / fx[i] + 1 / fy[i]))
            scale[i] = math.sqrt(float(np.prod(_duel_bandwidth(cand, plan))))
            c_n[i] *= scale[i]
    return loss - plan.zc * sigma / c_n, loss, sigma, scale


#: stage 2 draws at most this many outputs per database at once (counts and kernel sums add up
#: over chunks), so that a time budget's large N needs no more memory than this, and its deadline is
#: checked often enough (a chunk of NumericalSVT's took 0.15-0.3 s)
STAGE2_CHUNK = 1 << 16


def _stage2_chunks(plan: Plan, pair, rng, end: float | None = None, post=as_samples):
    """Stage 2's fresh outputs of both databases, in chunks of STAGE2_CHUNK (one chunk up to it), as
    ``post`` of them (computed on the draw's threads).

    With a deadline ``end``, no chunk is begun that would end past it at the last chunk's pace, once
    more than n outputs are drawn (N > n, which a run given back its sizes requires: a stage 1 that
    overran on a loaded host left N = 786,432 below n = 1,110,000, and the rerun was refused). The
    stop depends on the clock alone, never on the outputs counted, so N stays independent of them;
    the outputs drawn are the first chunks of a run with a larger N (the reported N reproduces them).
    """
    last = 0.0
    for start in range(0, plan.N, STAGE2_CHUNK):
        t0 = time.perf_counter()
        if start > plan.n and end is not None and t0 + last > end:
            return
        yield _draw_pair(plan, pair, min(STAGE2_CHUNK, plan.N - start), rng, post)
        last = time.perf_counter() - t0


def _stage2(plan: Plan, is_discrete: bool, best: Candidate, pair, rng, report, end: float | None = None) -> _Stage2:
    """Fresh outputs of the selected pair and the confidence bound at t̂ (or on its event), eq. 26;
    with a deadline ``end``, perhaps fewer than ``plan.N`` (:func:`_stage2_chunks`)."""
    t_start = time.perf_counter()
    stage = f"MPL stage 2: 2 x {plan.N:,} fresh outputs" + (" at most, until the deadline" if end else "")
    report(stage, 0, 1)
    if is_discrete or best.rule is not None:
        members = _members(best)
        fx, fy, sigma, c_n, h2, warnings, N = _stage2_discrete(_stage2_chunks(plan, pair, rng, end, members), best)
    else:
        fx, fy, sigma, c_n, h2, warnings, N = _stage2_continuous(_stage2_chunks(plan, pair, rng, end), best, plan)
    if min(fx, fy) <= best.tau:
        warnings.append(f"the floor tau = {best.tau:.3g} binds at t_hat (a density estimate is at the "
                        "floor): too few samples there, the bound is unreliable "
                        "(docs/method.md#115-the-audits-are-asymptotic)")
    loss_star = abs(math.log(max(fx, best.tau)) - math.log(max(fy, best.tau)))
    lb = loss_star - plan.zc * sigma / c_n
    report(stage, 1, 1)
    where = ("t_hat" if best.event is None and best.rule is None else "a score event" if best.rule is not None
             else f"an event of {len(best.event)} outputs")
    log.info("MPL stage 2: 2 x %d fresh outputs at %s in %.2f s: loss %.4g, sigma/c_N %.3g, lower bound %.4g",
             N, where, time.perf_counter() - t_start, loss_star, sigma / c_n, lb)
    return _Stage2(loss=loss_star, sigma=sigma, c_n=c_n, lower_bound=lb, bandwidth=h2, warnings=warnings, size=N)


#: a score event's members are scored at most this many values (rows x coordinates) at a time: a table
#: score's codes and a logistic score's features are several times their outputs, and a draw's part of
#: 32,768 outputs of 1,000 coordinates (laplace_parallel with copies=1000) coded whole took 262 MB a thread
MEMBER_VALUES = 1 << 22


def _members(best: Candidate):
    """Which outputs fall on t̂ or in its event (a function of a part's outputs: one bool each)."""
    if best.rule is not None:
        def members(outputs):
            outputs = as_samples(outputs)
            block = max(MEMBER_VALUES // outputs.shape[1], 1)  # (scores are row by row: same members)
            return np.concatenate([np.asarray(best.rule.members(outputs[start:start + block]), bool)
                                   for start in range(0, max(len(outputs), 1), block)])

        return members
    target = best.t[None, :] if best.event is None else best.event
    return lambda outputs: contains(as_samples(outputs), target)


def _stage2_discrete(chunks, best: Candidate):
    """Frequencies of t̂ (or of its event) from chunks of membership (:func:`_members`), σ̂ = √(1/f_x +
    1/f_x′ − 2) (eq. 25), c_N = √N, and N."""
    hits_x = hits_y = N = 0
    for in_x, in_y in chunks:
        N += len(in_x)
        hits_x += int(np.sum(in_x))
        hits_y += int(np.sum(in_y))
    fx, fy = hits_x / N, hits_y / N
    sigma = float(sigma_discrete(max(fx, best.tau), max(fy, best.tau)))
    warnings = []
    if min(fx, fy) * N < 10:
        warnings.append(f"only {int(round(min(fx, fy) * N))} stage-2 outputs fall on t_hat (or its "
                        "event) in one sample; the normal approximation is poor (increase N)")
    return fx, fy, sigma, math.sqrt(N), None, warnings, N


#: a kernel density's stage 2 under a deadline is sized by its own pace: PROBE_PARTS parts of at most
#: PROBE_ROWS outputs per database (fewer where the pilots' pace puts each above PROBE_SHARE of the time
#: left), drawn and summed at t̂ first, the fastest part timed (a part takes a few ms: one was often slowed
#: by the host, or by starting the draw's threads, and with two the stage ended seconds early)
PROBE_ROWS, PROBE_PARTS, PROBE_SHARE = STAGE2_CHUNK, 4, 0.005
#: ... and that pace is charged a tenth more: it cannot stop at the deadline, and the host's load changes
PROBE_MARGIN = 1.1


def _kde_pace(plan: Plan, best: Candidate, pair, end: _Deadline) -> float:
    """Seconds per output per database of stage 2's kernel densities at t̂ (:func:`_stage2_continuous`),
    at least the pilots' rate. The probe's outputs come from a stream of their own and are dropped, so
    stage 2's outputs, and a run given back its sizes, are those of a run without the probe."""
    rows = int(min(PROBE_ROWS, max(256, PROBE_SHARE * (end.end - time.perf_counter()) / end.rate)))
    rng, pace = np.random.default_rng(0), math.inf
    h = np.ones(best.t.shape)  # (its cost does not depend on the bandwidth, set once in stage 2)
    for _ in range(PROBE_PARTS):
        t0 = time.perf_counter()
        for outputs in _draw_pair(plan, pair, rows, rng):
            kde_at(as_samples(outputs).astype(float), best.t, h)
        pace = min(pace, (time.perf_counter() - t0) / rows)
    log.debug("MPL stage 2: kernel densities at t_hat take %.3g s per output (the pilots' rate: %.3g)",
              pace, end.rate)
    return max(PROBE_MARGIN * pace, end.rate)


def _stage2_continuous(chunks, best: Candidate, plan: Plan):
    """KDEs at t̂ with the undersmoothed bandwidth, σ̂² = ∫K²(1/f_x + 1/f_x′) and c_N = √(N h^d).

    The bandwidth's spread comes from the first chunk (all outputs when N ≤ STAGE2_CHUNK), its size
    from ``plan.N`` (which a deadline never cuts here: :meth:`_Deadline.final_size`).
    """
    h2 = None
    fx = fy = 0.0
    N = 0
    for xs, ys in chunks:
        xs, ys = xs.astype(float), ys.astype(float)
        d = xs.shape[1]
        if h2 is None and plan.bandwidth is not None:
            h2 = undersmoothed(np.broadcast_to(np.asarray(plan.bandwidth, float), (d,)), plan.N, plan.n, d,
                                plan.undersmooth)
        elif h2 is None:
            h2 = (rule_of_thumb(xs, size=plan.N, undersmooth=plan.undersmooth)
                  + rule_of_thumb(ys, size=plan.N, undersmooth=plan.undersmooth)) / 2
        fx += float(kde_at(xs, best.t, h2)[0]) * len(xs)
        fy += float(kde_at(ys, best.t, h2)[0]) * len(ys)
        N += len(xs)
    fx, fy = fx / N, fy / N
    sigma = math.sqrt(GAUSS_R ** d * (1 / max(fx, best.tau) + 1 / max(fy, best.tau)))
    c_n = math.sqrt(N * float(np.prod(h2)))
    warnings = []
    near = min(fx, fy) * N * float(np.prod(h2)) * math.sqrt(2 * math.pi) ** d  # kernel-weighted outputs
    if near < 10:
        warnings.append(f"only about {near:.0f} stage-2 outputs of one sample lie within a bandwidth of "
                        "t_hat; the normal approximation is poor (increase N)")
    lo, hi = best.box  # the box stage 1 searched (its default comes from stage-1 outputs)
    if np.any(np.isclose(best.t, lo) | np.isclose(best.t, hi)):
        warnings.append("t_hat lies on the edge of the region C; the loss may be larger outside it")
    return fx, fy, sigma, c_n, h2, warnings, N


def _result(plan: Plan, stage1: _Stage1, stage2: _Stage2) -> MPLResult:
    """The result: stage 2's bound, stage 1's curve and region, the exact values when known."""
    b, is_discrete = stage1.selected, stage1.discrete
    best = stage1.candidates[b]
    warnings = stage2.warnings
    true_eps = plan.mech.epsilon
    pairs_true = exact_or_none(plan.mech.true_epsilon_over, plan.pairs)
    if true_eps is not None and pairs_true is not None and pairs_true > true_eps * (1 + 1e-6) + 1e-9:
        warnings.append(f"the exact epsilon over the audited pairs ({pairs_true:.4g}) exceeds the mechanism's "
                        f"({true_eps:.4g}): the pairs are not neighbours for its sensitivity, so the bound "
                        "may exceed the true value")
    if is_discrete:
        region_out = None if plan.region is None else np.asarray(plan.region, float).tolist()
    else:
        region_out = None if best.box is None else np.column_stack(best.box).tolist()
    feature = plan.feature
    return MPLResult(
        lower_bound=float(stage2.lower_bound), stage1_max_loss=best.max_loss, pair=tuple(plan.pairs[b]), pair_index=b,
        t_hat=_point(best.t), event=None if best.event is None else [_point(t) for t in best.event],
        loss_at_t_hat=float(stage2.loss), sigma=float(stage2.sigma), search_size=plan.n, final_size=stage2.size, alpha=plan.alpha,
        discrete=is_discrete, tau=float(best.tau),
        bandwidth=None if stage2.bandwidth is None else [float(v) for v in np.atleast_1d(stage2.bandwidth)],
        region=region_out, selection=plan.selection, true_value=true_eps,
        pairs_true_value=pairs_true,
        feature=None if feature is None else getattr(feature, "__name__", "feature"),
        event_rule=None if best.rule is None else {**best.rule.describe(), "refitted": best.rule.refitted},
        stage1_max_loss_by_pair=[c.max_loss for c in stage1.candidates], loss_curve=_loss_curve(best, is_discrete),
        warnings=warnings)


def _loss_curve(best: Candidate, is_discrete: bool) -> dict:
    """The stage-1 loss of the selected pair; 1-d continuous outputs sorted, as plain numbers."""
    pts = best.pts
    if not is_discrete and pts.shape[1] == 1:
        order = np.argsort(pts[:, 0])
        return {"t": pts[order, 0].tolist(), "loss": best.loss[order].tolist()}
    return {"t": pts.tolist(), "loss": best.loss.tolist()}


def _point(t):
    """An output as a number (scalar outputs) or a list."""
    t = np.asarray(t).tolist()
    return t[0] if isinstance(t, list) and len(t) == 1 else t


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def _normal_quantile(p: float) -> float:
    """Φ⁻¹(p) (the standard library's, to 1e-15; scipy.stats would cost the command ~0.5 s to import)."""
    return NormalDist().inv_cdf(float(p))
