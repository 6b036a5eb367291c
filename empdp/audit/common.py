"""Pieces shared by the MPL and Rényi audits: generators, sampling, output checks."""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import InputError
from ..textfmt import clip, shorten
from .kde import as_samples, looks_discrete

#: the sample sizes in the audits' JSON and attributes, each named as its flag (--search-size is
#: "search_size", and "search size" in the terminal and the report)
SIZE_KEYS = ("search_size", "final_size", "sample_size", "renyi_sample_size")
#: MPL's largest stage-1 loss (JSON and attribute ``stage1_max_loss``) in the terminal and the report
STAGE1_MAX = "stage-1 max loss"


def one_blas_thread(audit):
    """Run ``audit`` with BLAS on one thread: the audits' matrices are small (a logistic fit's few dozen
    weights, one KDE grid), so BLAS threads gain nothing and, on a loaded host, spin against each
    other (svt3 at n = 4000 took 23 s with OpenBLAS's 2 threads and 3.9 s with one, same bound).
    A BLAS loaded later (scipy's own, on its first import) is limited where it is used
    (:func:`empdp.audit.events.fit_score`)."""

    @functools.wraps(audit)
    def run(*args, **kwargs):
        with threadpool_limits(limits=1, user_api="blas"):
            return audit(*args, **kwargs)

    return run


def as_rng(rng) -> np.random.Generator:
    """A NumPy Generator from a Generator, a seed, or None (fresh entropy)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        if rng < 0:  # NumPy's own ValueError would surface as an internal error
            raise InputError(f"the seed `rng` must be a non-negative integer, got {int(rng)}", param="rng")
        return np.random.default_rng(rng)
    raise InputError(f"rng must be a numpy Generator or a non-negative integer seed, got {type(rng).__name__}")


#: most outputs drawn per database: 10^8 doubles are 0.8 GB per array, and the bounds tighten
#: only as 1/sqrt(n)
MAX_SAMPLES = 10**8
#: most outputs per database of a stage that only counts them, chunk by chunk (MPL's stage 2): memory does
#: not bound it, and a time budget's clock stops it (report_noisy_max3 reached 10^8 in 14.6 s of 20 and
#: needs about 1.2·10^8 for DP-Sniper's bound)
MAX_COUNTED = 10**10
#: smallest error level: the normal quantiles the bounds use lose their meaning in double
#: precision far below it (1e-320 failed inside the statistics module)
MIN_ALPHA = 1e-12


def check_size(name: str, value, minimum: int = 10, outputs: bool = True, counted: bool = False) -> int:
    """A sample size (``outputs``: at most MAX_SAMPLES per database, or MAX_COUNTED for outputs only
    ``counted`` in chunks), or a count of steps (any size)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise InputError(f"{name} must be an integer ≥ {minimum}, got {short(value)}")
    if outputs and counted and value > MAX_COUNTED:
        raise InputError(f"{name} = {short(value)} is over {MAX_COUNTED:.0e} outputs per database (hours of "
                         f"drawing; the bound tightens only as 1/sqrt({name})): give at most {MAX_COUNTED:.0e}")
    if outputs and not counted and value > MAX_SAMPLES:
        raise InputError(f"{name} = {short(value)} is over {MAX_SAMPLES:.0e} outputs per database, more than "
                         f"memory holds (0.8 GB per array); the bound tightens only as 1/sqrt({name}): "
                         f"give at most {MAX_SAMPLES:.0e}")
    return int(value)


def check_level(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not MIN_ALPHA <= alpha < 0.5:
        raise InputError(f"alpha (the confidence bound's error level) must be in [{MIN_ALPHA:g}, 0.5), "
                         f"got {short(alpha)}")
    return float(alpha)


#: Largest Rényi order accepted: at higher orders D_α of n outputs rests on the single most
#: extreme output, and α·log f overflows near 10^300.
MAX_ORDER = 1e4


def check_order(order) -> float:
    """The Rényi order α: a finite number in (1, MAX_ORDER] (D_α divides by α − 1)."""
    if isinstance(order, bool) or not isinstance(order, (int, float)) or not math.isfinite(order) or order <= 1:
        raise InputError(f"the Rényi order must be a finite number > 1, got {short(order)}")
    if order > MAX_ORDER:
        raise InputError(f"the Rényi order {order:g} is above {MAX_ORDER:g}, where no sample of outputs "
                         "can bound D_α; for α → ∞ D_α is the pure-DP ε: use 'empdp audit mpl'")
    return float(order)


#: rows of one call of a sampler when a draw is larger: each part has its own generator, seeded from the
#: draw's (:func:`part_generators`), so the outputs are the same however many threads draw the parts, and a
#: part's noise stays in the CPU's cache through the comparisons and sums that follow (SVT's answers of
#: 2·10^6 rows: 1.6 s in one call, 0.93 s in parts of 2^15)
DRAW_PART = 1 << 15


def draw(mechanism, database, size: int, rng: np.random.Generator, post=None) -> np.ndarray:
    """Call the sampler and check its output: ``size`` rows of finite numbers (then ``post`` of them).

    Above :data:`DRAW_PART` rows the sampler is called once per part of that many rows, each with its
    own generator (:func:`part_generators`), on ``mechanism.threads`` threads at once (None: every core;
    a plain function: one). The parts are the same whatever the number of threads, so a seed gives the
    same outputs on any machine. ``post`` (a function of one part's outputs returning one row per
    output, e.g. a feature or an event's membership) runs on the part's thread too.
    """
    if size <= DRAW_PART:
        return _part(mechanism, database, size, rng, post)
    sizes = [min(DRAW_PART, size - start) for start in range(0, size, DRAW_PART)]
    calls = zip(sizes, part_generators(rng, len(sizes)))
    workers = draw_workers(mechanism)
    if workers == 1:
        return _stack([_part(mechanism, database, k, g, post) for k, g in calls])
    return _stack(list(_pool(workers).map(lambda call: _part(mechanism, database, *call, post), calls)))


def part_generators(rng: np.random.Generator, parts: int) -> list[np.random.Generator]:
    """``parts`` independent generators for the parts of one draw: one key of two 63-bit integers from ``rng`` (so
    consecutive draws differ and a seed reproduces them), and part k's stream from the key and k
    (NumPy's SeedSequence spawning: statistically independent streams)."""
    key = [int(v) for v in rng.integers(0, 2**63, size=2, dtype=np.int64)]
    return [np.random.Generator(np.random.PCG64(seq)) for seq in np.random.SeedSequence(key).spawn(parts)]


def _part(mechanism, database, size: int, rng, post):
    """One call of the sampler, its output checked (rows of finite numbers), then ``post`` of it."""
    try:
        with np.errstate(all="ignore"):  # overflowing outputs are refused below, without warnings
            arr = np.asarray(mechanism(database, size, rng))
    except InputError:
        raise
    except Exception as exc:  # a user sampler failing is bad input; one of ours failing is our error
        if getattr(mechanism, "ours", False):
            raise
        raise InputError(f"mechanism {getattr(mechanism, 'name', 'sampler')!r} failed on database "
                         f"{short(database)}: {one_line(f'{type(exc).__name__}: {exc}', 200)}") from None
    if arr.dtype.kind not in "biuf":
        raise InputError(f"mechanism output must be numeric, got dtype {arr.dtype}")
    if arr.ndim == 0 or arr.shape[0] != size:
        raise InputError(f"mechanism returned shape {arr.shape}; expected ({size},) or ({size}, d)")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise InputError("mechanism returned NaN or infinite outputs")
    return arr if post is None else post(arr)


def _stack(parts: list):
    """The parts' outputs as one array; parts of different shapes are refused (a sampler whose output's
    width changes between calls)."""
    if len({part.shape[1:] for part in parts}) > 1:
        raise InputError("mechanism returned outputs of different shapes for the same database "
                         f"({', '.join(sorted({str(part.shape) for part in parts}))})")
    return np.concatenate(parts)


def draw_workers(mechanism) -> int:
    """How many threads may call ``mechanism``'s sampler at once (its ``threads``; None: every core; a
    plain function: one)."""
    threads = getattr(mechanism, "threads", 1)
    if threads is None:
        from ..params import available_cores

        return available_cores()
    return max(1, int(threads))


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The draws' threads (kept between draws: a pool costs ~0.1 ms per thread to start)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="empdp-draw")
        return _POOLS[workers]


def detect_discrete(first: np.ndarray, discrete) -> bool:
    if discrete is None:
        return looks_discrete(first)
    return bool(discrete)


def continuous_dim(x: np.ndarray) -> int:
    d = as_samples(x).shape[1]
    if d > 3:
        raise InputError(f"continuous outputs must have dimension d ≤ 3 (got d = {d}); "
                         "discrete outputs may have any dimension")
    return d


#: How computing an exact reference value may fail on pairs it was not built for (a huge
#: or degenerate pair: overflow, a log of 0, an outcome table too large for memory).
EXACT_VALUE_FAILURES = (ArithmeticError, ValueError, MemoryError)


def exact_or_none(compute, *args):
    """``compute(*args)``, or None when it fails numerically (:data:`EXACT_VALUE_FAILURES`).

    The exact values beside a bound are a convenience for checking it: the audit
    reports them as unknown rather than fail. Any other exception is a bug and
    propagates.
    """
    try:
        return compute(*args)
    except EXACT_VALUE_FAILURES:
        return None


def one_line(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters (:func:`empdp.textfmt.clip`)."""
    return clip(text, width)


def short(value, width: int = 60) -> str:
    """A value's repr on one short line, for error messages (:func:`empdp.textfmt.shorten`)."""
    return shorten(value, width)
