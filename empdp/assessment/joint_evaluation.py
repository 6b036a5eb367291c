"""Which individuals of a joint assessment are evaluated exactly, in which blocks, and the running
summary of their δ_i (docs/method.md#6-sweeps-and-the-epsilon_all-search, as for one statistic).

* ε_all needs only the largest ε_i: rows in decreasing order of the screening bound M_i ≥ ε_i, in
  doubling batches, until the next bound is at or below the largest ε_i found (:func:`search_eps_all`).
* δ_i(ε) = 0 for ε ≥ M_i, so the sweep evaluates only rows with M_i > min ε (:func:`sweep`), riskiest
  bound first, in blocks of :data:`SWEEP_ROWS`; once Σ log(1 − δ_i(ε)) ≤ :data:`SATURATED`, δ*(ε) is 1.0
  whatever the rest are, and the next blocks need δ_i(ε) only where it can exceed the largest so far.
* Blocks run side by side in threads (NumPy releases the GIL). Block k is planned from the blocks
  before k − :data:`LAG`, whatever the thread count, so the results do not depend on it.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from ..progress import Progress, no_progress
from ..risk.joint import JointModel, joint_risk

#: individuals per call of the risk core in the sweep: the saturation test runs between calls
SWEEP_ROWS = 64
#: first batch of the ε_all search (then doubling)
SEARCH_BATCH = 32
#: rows per call when only ε_i is needed
EPS_ROWS = 512
#: Σ log(1 − δ_i(ε)) at or below which δ*(ε) = −expm1(·) is 1.0 in float64 (from about −38)
SATURATED = -60.0
#: blocks of the sweep in flight beyond the ones the next block's plan has seen
LAG = 2


def _chunks(rows: np.ndarray, size: int) -> list:
    return [rows[k:k + size] for k in range(0, len(rows), size)]


def exact_eps(model: JointModel, shifts: np.ndarray, rows: np.ndarray, threads: int) -> np.ndarray:
    """Exact ε_i of ``rows`` (blocks of at most :data:`EPS_ROWS`, split over the threads)."""
    if not len(rows):
        return np.zeros(0)
    size = min(EPS_ROWS, max(1, -(-len(rows) // threads)))
    blocks = _chunks(rows, size)
    with threadpool_limits(limits=1, user_api="blas"):
        if threads == 1 or len(blocks) == 1:
            return np.concatenate([joint_risk(model, shifts[b])[0] for b in blocks])
        with ThreadPoolExecutor(threads) as pool:
            return np.concatenate(list(pool.map(lambda b: joint_risk(model, shifts[b])[0], blocks)))


def search_eps_all(model: JointModel, shifts: np.ndarray, rows: np.ndarray, bound: np.ndarray,
                   threads: int, progress: Progress = no_progress) -> tuple[np.ndarray, float]:
    """ε_all = max ε_i over ``rows``, exactly, and the exact ε_i of the rows it evaluated (NaN for the others).

    Rows go in decreasing order of ``bound`` (M_i ≥ ε_i); a batch stops at the last bound above
    the largest ε_i so far, and the search stops when the next bound is at or below it: no row after
    that point can raise the maximum. ``progress("eps_all", done, total)``: total is the rows whose
    bound exceeds the largest ε_i so far (it shrinks as the search goes).
    """
    eps_i = np.full(len(bound), np.nan)
    order = rows[np.argsort(-bound[rows], kind="stable")]
    falling = -bound[order]  # ascending
    best, pos, batch = 0.0, 0, SEARCH_BATCH
    while pos < len(order) and bound[order[pos]] > best:
        live = int(np.searchsorted(falling, -best, side="left"))  # rows with bound > best
        todo = order[pos:min(pos + batch, live)]
        progress("eps_all", pos, live)
        eps_i[todo] = exact_eps(model, shifts, todo, threads)
        best = max(best, float(eps_i[todo].max()))
        pos, batch = pos + len(todo), 2 * batch
    progress("eps_all", pos, pos)
    return eps_i, best


class Summary:
    """Running max δ_i(ε) and Σ log(1 − δ_i(ε)) over the blocks added so far (one sweep, or several
    sweeps of one release, e.g. the sets of groups of a grouped statistic)."""

    def __init__(self, E: int):
        self.largest = np.zeros(E)
        self.log_survive = np.zeros(E, dtype=np.longdouble)

    def add(self, d: np.ndarray) -> None:
        known = np.nan_to_num(d, nan=0.0)
        self.largest = np.maximum(self.largest, known.max(axis=0, initial=0.0))
        with np.errstate(divide="ignore"):
            self.log_survive += np.log1p(-known).sum(axis=0, dtype=np.longdouble)

    def needed(self):
        """(only, cap) for :func:`empdp.risk.joint.joint_risk`, or (None, None) while nothing is saturated."""
        saturated = self.log_survive <= SATURATED
        saturated[0] = False  # δ_i at the smallest ε is reported per individual
        return (~saturated, self.largest.copy()) if saturated.any() else (None, None)


def sweep(model: JointModel, shifts: np.ndarray, eps: np.ndarray, rows: np.ndarray, key: np.ndarray,
          threads: int = 1, progress: Progress = no_progress,
          summary: Summary | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact ε_i (R,) and δ_i(ε) (R, E) of ``rows``, NaN where δ_i is positive but not needed.

    Rows are evaluated in decreasing order of ``key`` (a bound on ε_i: the riskiest first, so the
    total risk saturates early), :data:`SWEEP_ROWS` per call. Once Σ log(1 − δ_i(ε)) ≤
    :data:`SATURATED` over the blocks a plan has seen, δ*(ε) is 1.0 whatever the others are, so
    the next blocks need δ_i(ε) only where its chord bound exceeds the largest so far (``only`` and
    ``cap`` of :func:`empdp.risk.joint.joint_risk`); δ_i at the smallest ε is always computed (it is
    reported per individual), and whether δ_i > 0 is known from the exact ε_i.

    ``summary`` carries the running totals in from other rows of the same release (and is updated);
    ``progress("delta_i", done, len(rows))`` after each block.
    """
    E = len(eps)
    eps_i, out = np.full(len(rows), np.nan), np.zeros((len(rows), E))
    order = np.argsort(-key[rows], kind="stable")
    summary = Summary(E) if summary is None else summary
    done = 0

    def take(at, result):
        nonlocal done
        eps_i[at], out[at] = result[0], result[1]
        summary.add(result[1])
        done += len(at)
        progress("delta_i", done, len(rows))

    def run(at, only, cap):
        return joint_risk(model, shifts[rows[at]], eps, only=only, cap=cap)

    progress("delta_i", 0, len(rows))
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max(1, threads)) as pool:
        pending = deque()
        for k, at in enumerate(_chunks(order, SWEEP_ROWS)):
            while pending and pending[0][0] < k - LAG:
                _, b, fut = pending.popleft()
                take(b, fut.result())
            only, cap = summary.needed()
            pending.append((k, at, pool.submit(run, at, only, cap)))
        for _, b, fut in pending:
            take(b, fut.result())
    return eps_i, out
