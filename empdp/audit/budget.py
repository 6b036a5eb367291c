"""Sample sizes chosen to fit a time budget (``--time-budget``; docs/method.md#9-audits).

Pilot runs of the whole audit, growing fourfold until one takes 4% of the budget, on a generator of their own (so that
they draw nothing from the audit's), give its cost as fixed + per-output time (from the last two);
the size is what the budget left after the pilots buys at that rate. The
chosen size therefore depends on the machine's speed and load, but it is
reported, and the audit rerun with that size and the same seed gives the same
result: the pilots never touch the seeded generator.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import numpy as np

from ..errors import InputError

#: seed of the pilots' own generator (their outputs are discarded)
PILOT_SEED = 20210524
#: sizes of the first two pilot runs; more follow, each 2 to PILOT_GROWTH times larger (aiming at
#: PILOT_SHARE of the budget from the last one's rate), until one takes PILOT_SHARE of the budget.
#: A long last pilot is what makes the forecast hold: costs that stop growing (a logistic fit on
#: at most 40,000 rows) made pilots of 4% forecast 2-3 times the real cost (runs of 7-12 s of 20).
#: At 12% the pilots' overshoot took 7-10 of the 20 s (SVT1, RAPPOR, LaplaceParallel); at 6% they
#: take 3.5-6 s and runs still end at 17-21 s
PILOT_SIZES = (1000, 4000)
PILOT_GROWTH = 4
PILOT_SHARE = 0.06
#: the range the cost's growth power is kept in (a noisy pair of pilots must not forecast wildly)
POWER_RANGE = (0.8, 1.3)
#: the same for stage 1 of a two-stage audit with a deadline: its fixed costs made the pilots fit p = 0.8
#: where runs 12 times larger grew linearly (SVT6: 8.1 s forecast, 11.2 s taken). Forecasting too much
#: costs little there, as stage 2 draws until the deadline
STAGE1_POWER_RANGE = (1.0, 1.3)
#: share of the budget planned for, pilots included (the rest absorbs the forecast's error; at 0.9 with
#: the shorter pilots, runs of 20 s took up to 24 s at a load of 5-6 on 2 cores)
SAFETY = 0.85
#: most seconds accepted (a day); the sizes are capped by memory well before
MAX_BUDGET = 86400.0
#: an audit with a deadline (``audit mpl``) ends stage 2 by END_SHARE of the budget less END_SECONDS (at
#: most END_SMALL of the budget) after its clock started. What follows stage 2 (the result, its JSON, the
#: interpreter's exit) took 0.4-0.8 s at 20 s, less for the small arrays of short budgets; the rest
#: absorbs the granularity of stage 2's clock checks (one chunk of outputs)
END_SHARE = 0.95
END_SECONDS = 0.6
END_SMALL = 0.1


#: most bytes of outputs stage 1 holds at once under a time budget (every pair's outputs of both databases)
MAX_STAGE1_BYTES = 4 * 10**8
#: narrow outputs (SVT's int8 answers) may have at most this many times the rows of float64 ones: they
#: are widened on the way (int64 row keys, float features), and this bounds those transient arrays
MAX_NARROWING = 4


def deadline(started: float, budget: float) -> float:
    """The ``time.perf_counter()`` value by which stage 2 must end, for a budget counted from ``started``."""
    return started + END_SHARE * budget - min(END_SECONDS, END_SMALL * budget)


def process_age() -> float:
    """Seconds since this process started (from Linux's ``/proc``; 0 where that is not available).

    The command line counts its budget from here, as ``time empdp audit ...`` does: the interpreter's
    start and the imports took 1-2.6 s of a 20 s budget that the plan never saw.
    """
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def stage2_rate(sizes, stage2_times, ratio: int) -> float:
    """Seconds per stage-2 output, from the last pilot (``N = ratio·n``): counting an event is linear in N."""
    return max(stage2_times[-1], 1e-9) / (ratio * sizes[-1])


def stage1_cap(probe: np.ndarray, copies: int) -> int:
    """Most outputs per database stage 1 may hold: ``copies`` samples of rows like ``probe`` (2-d: the
    audited outputs, after any feature) within MAX_STAGE1_BYTES. Counting bytes, not values, lets
    SVT's int8 answer vectors grow past the float64 cap that bound them (runs of 5-14 s of 20)."""
    width = probe.shape[1]
    row = max(width * probe.dtype.itemsize, width * 8 // MAX_NARROWING)
    return MAX_STAGE1_BYTES // (copies * row)


def given_sizes(sizes: dict, time_budget) -> dict:
    """How the sample sizes are chosen when no budget applies: ``sizes`` maps each size's option (e.g.
    ``"n, N: --search-size, --final-size"``) to its value or None. Sizes and a time budget together are
    refused in one line."""
    given = any(v is not None for v in sizes.values())
    if time_budget is not None and given:
        names = "; ".join(sizes)
        raise InputError(f"give sample sizes ({names}) or a time budget (`time_budget`), not both",
                         param="time_budget")
    return {"chosen_by": "given" if given else "default"}


def check_budget(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 1 <= seconds <= MAX_BUDGET:
        raise InputError(f"the time budget `time_budget` must be between 1 and {MAX_BUDGET:g} seconds, "
                         f"got {seconds!r}", param="time_budget")
    return float(seconds)


def size_for_budget(run: Callable[[int, np.random.Generator], object], budget: float, minimum: int,
                    maximum: int) -> tuple[int, dict]:
    """The size at which ``run(size, rng)`` should take about ``budget`` seconds, and a report of the choice.

    The cost is modelled as c·size^p through the last pilot runs (:func:`_growth_power`); the
    size is rounded to three significant digits and kept within [minimum, maximum] (maximum: memory).
    """
    sizes, times, pilot = run_pilots(run, budget, maximum)
    power = _growth_power(sizes[-3:], times[-3:])
    left = max(SAFETY * budget - pilot, 0.0)
    affordable = sizes[-1] * (left / max(times[-1], 1e-9)) ** (1 / power)
    size = round_size(min(max(affordable, minimum), maximum))
    return size, _report(budget, pilot, sizes, times, power, affordable, minimum, maximum)


def run_pilots(run: Callable[[int, np.random.Generator], object], budget: float, maximum: int):
    """Pilot runs of growing size until one takes PILOT_SHARE of the budget (fixed costs dominate small
    runs): (sizes, seconds of each, seconds of all)."""
    t_start = time.perf_counter()
    sizes, times = [], []
    size = PILOT_SIZES[0]
    while True:
        t0 = time.perf_counter()
        run(size, np.random.default_rng(PILOT_SEED))
        sizes.append(size)
        times.append(time.perf_counter() - t0)
        if len(sizes) >= 2 and (times[-1] >= PILOT_SHARE * budget or size * 2 > maximum):
            break
        size = _next_pilot(size, times[-1], budget) if len(sizes) >= 2 else PILOT_SIZES[1]
    return sizes, times, time.perf_counter() - t_start


def two_stage_sizes(sizes, stage1_times, stage2_times, ratio: int, budget: float, pilot: float,
                    share: float, minimum: int, maximum: tuple[int, int],
                    left: float | None = None) -> tuple[int, int, dict]:
    """Sizes (n, N) of a two-stage audit from pilots of ``n = sizes[i]``, ``N = ratio·n``: stage 1 is
    planned to take ``share`` of the seconds ``left`` (default: what the pilots left of SAFETY·budget)
    and stage 2 the rest, unless that gives N < ratio·n; then both stages share the time with N = ratio·n.

    Stage 1's cost is a fixed part (:func:`_fixed_cost`) and a part growing as n^p (:func:`_growth_power`,
    fitted to its own times); stage 2 only counts an event among fresh outputs, so its cost is linear in N
    and its rate is the last pilot's. A fixed N = ratio·n left stage 2 under a tenth of the time where
    stage 1 costs 50 times more per output (the Sparse Vector variants' score events), while the bound's
    error shrinks as 1/√N.
    """
    power = _growth_power(sizes[-3:], stage1_times[-3:], STAGE1_POWER_RANGE)
    left = max(SAFETY * budget - pilot if left is None else left, 0.0)
    t1, n_last = max(stage1_times[-1], 1e-9), sizes[-1]
    fixed = _fixed_cost(sizes[1:][-3:], stage1_times[1:][-3:])  # (the first pilot pays one-off work)
    rate = stage2_rate(sizes, stage2_times, ratio)

    def stage1(n):
        return fixed + (t1 - fixed) * (n / n_last) ** power

    affordable = _solve(stage1, share * left, n_last) if share * left > fixed else n_last * share * left / t1
    if left - stage1(affordable) < rate * ratio * affordable:  # stage 2 dear: N = ratio·n, both fit in
        affordable = _solve(lambda n: stage1(n) + rate * ratio * n, left, n_last)
    n = round_size(min(max(affordable, minimum), maximum[0]))
    N = round_size(min(max((left - stage1(n)) / rate, ratio * n if affordable >= minimum else 2 * n), maximum[1]))
    info = _report(budget, pilot, sizes, [a + b for a, b in zip(stage1_times, stage2_times)], power,
                   affordable, minimum, maximum[0])
    info["stage1_share"] = share
    info["last_pilot"]["stage2_seconds"] = round(stage2_times[-1], 3)
    return n, N, info


def _solve(cost: Callable[[float], float], seconds: float, start: float) -> float:
    """The size at which the increasing ``cost`` takes ``seconds`` (bisection in logs)."""
    lo, hi = start / 1e6, start * 1e6
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if cost(mid) < seconds else (lo, mid)
    return lo


def _report(budget, pilot, sizes, times, power, affordable, minimum, maximum) -> dict:
    return {"chosen_by": "time budget", "time_budget": budget, "pilot_seconds": round(pilot, 3),
            "last_pilot": {"size": sizes[-1], "seconds": round(times[-1], 3)}, "cost_power": round(power, 3),
            "capped_by": "memory" if affordable > maximum else "minimum size" if affordable < minimum else None}


#: most share of the last pilot's stage 1 counted as its fixed cost (what does not grow with n: the pairs'
#: score fits and thresholds on few outputs). svt3's pilots of 4,000-9,000 outputs took 0.95-1.39 s, of
#: which about 0.6 s fixed; through the origin, the plan forecast 9.9 s for the 6.25 s its stage 1 took
MAX_FIXED_SHARE = 0.6


def _fixed_cost(sizes, times) -> float:
    """The part of stage 1's time that does not grow with n: the intercept of a straight line through the
    pilots (least squares; none below two), within [0, MAX_FIXED_SHARE × the last pilot's time]."""
    if len(sizes) < 2:
        return 0.0
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(times, float), 1)
    if slope <= 0:  # no growth seen (a first pilot slowed by one-off work): nothing to split
        return 0.0
    return float(min(max(intercept, 0.0), MAX_FIXED_SHARE * times[-1]))


def _growth_power(sizes, times, within: tuple[float, float] = POWER_RANGE) -> float:
    """p in cost ∝ size^p fitted to the last (two or three) pilots in logs, within POWER_RANGE: costs
    that stop growing (a fit on capped rows) give p < 1 and sort-like ones p > 1, where a straight
    line through two pilots forecast 2-3 times too much or too little."""
    p = np.polyfit(np.log(sizes), np.log(np.maximum(times, 1e-9)), 1)[0]
    return float(min(max(p, within[0]), within[1]))


def _next_pilot(size: int, seconds: float, budget: float) -> int:
    """The next pilot's size: 2 to PILOT_GROWTH times this one, aiming at PILOT_SHARE of the budget (a
    fixed growth of 4 made the last pilot take up to 4 x PILOT_SHARE)."""
    aim = PILOT_SHARE * budget / max(seconds, 1e-9)
    return int(size * min(PILOT_GROWTH, max(1.5, 1.2 * aim)))


def round_size(value: float) -> int:
    """Three significant digits, so reported sizes are easy to give back with --search-size."""
    value = int(value)
    digits = max(0, len(str(value)) - 3)
    return max(1, value // 10 ** digits * 10 ** digits)
