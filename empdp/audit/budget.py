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
import time
from typing import Callable

import numpy as np

from ..errors import InputError

#: seed of the pilots' own generator (their outputs are discarded)
PILOT_SEED = 20210524
#: sizes of the first two pilot runs; more follow, each PILOT_GROWTH times larger, until one takes
#: PILOT_SHARE of the budget
PILOT_SIZES = (1000, 4000)
PILOT_GROWTH = 4
PILOT_SHARE = 0.04
#: share of the budget planned for: the rate measured on small runs is a little optimistic
SAFETY = 0.8
#: most seconds accepted (a day); the sizes are capped by memory well before
MAX_BUDGET = 86400.0


def given_sizes(sizes: dict, time_budget) -> dict:
    """How the sample sizes are chosen when no budget applies: ``sizes`` maps each size's option (e.g.
    ``"n, N: --search-size, --final-size"``) to its value or None. Sizes and a time budget together are
    refused in one line."""
    given = any(v is not None for v in sizes.values())
    if time_budget is not None and given:
        names = "; ".join(sizes)
        raise InputError(f"give sample sizes ({names}) or a time budget (--time-budget), not both")
    return {"chosen_by": "given" if given else "default"}


def check_budget(seconds) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not 1 <= seconds <= MAX_BUDGET:
        raise InputError(f"the time budget (--time-budget) must be between 1 and {MAX_BUDGET:g} seconds, "
                         f"got {seconds!r}")
    return float(seconds)


def size_for_budget(run: Callable[[int, np.random.Generator], object], budget: float, minimum: int,
                    maximum: int) -> tuple[int, dict]:
    """The size at which ``run(size, rng)`` should take about ``budget`` seconds, and a report of the choice.

    The cost is modelled as a + b·size from the last two pilot runs; the size is rounded to
    three significant digits and kept within [minimum, maximum] (maximum: memory).
    """
    t_start = time.perf_counter()
    sizes, times = [], []
    size = PILOT_SIZES[0]
    while True:  # grow the pilot until it is long enough to time (fixed costs dominate small runs)
        t0 = time.perf_counter()
        run(size, np.random.default_rng(PILOT_SEED))
        sizes.append(size)
        times.append(time.perf_counter() - t0)
        if len(sizes) >= 2 and (times[-1] >= PILOT_SHARE * budget or size * PILOT_GROWTH > maximum):
            break
        size *= PILOT_GROWTH
    lo, hi = sizes[-2], sizes[-1]
    rate = max((times[-1] - times[-2]) / (hi - lo), times[-1] / hi / 20, 1e-12)
    fixed = max(times[-1] - rate * hi, 0.0)
    pilot = time.perf_counter() - t_start
    affordable = (SAFETY * budget - pilot - fixed) / rate
    size = _round(min(max(affordable, minimum), maximum))
    info = {"chosen_by": "time budget", "time_budget": budget, "pilot_seconds": round(pilot, 3),
            "seconds_per_output": rate, "fixed_seconds": round(fixed, 3),
            "capped_by": "memory" if affordable > maximum else "minimum size" if affordable < minimum else None}
    return size, info


def _round(value: float) -> int:
    """Three significant digits, so reported sizes are easy to give back with --search-size."""
    value = int(value)
    digits = max(0, len(str(value)) - 3)
    return max(1, value // 10 ** digits * 10 ** digits)
