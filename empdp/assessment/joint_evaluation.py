"""Which individuals of a joint or grouped assessment are evaluated exactly, and the certified
totals (docs/method.md#102-joint-queries, issue 37's contract).

* ε_all needs only the largest ε_i: rows in decreasing order of the screening bound M_i ≥ ε_i, in
  doubling batches, until the next bound is at or below the largest ε_i found (:func:`search_eps_all`).
* δ_i(ε) = 0 for ε ≥ M_i; every other row starts from certified bounds (:mod:`empdp.risk.joint.bounds`)
  and is evaluated exactly only where the bounds cannot decide the worst case, the at-risk counts
  or the total risk to its tolerance (:class:`Certified`).
* Exact rows run in blocks of at most :data:`SWEEP_ROWS`, dealt round-robin, side by side in threads
  (NumPy and the compiled loops release the GIL); which rows are refined depends only on the bounds
  and the values found, not on the thread count.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
from threadpoolctl import threadpool_limits

from ..errors import InputError
from ..progress import Progress, no_progress
from ..risk.joint import JointModel, joint_risk
from ..risk.joint.bounds import chord_upper, delta_lower, delta_upper, eps_lower

#: individuals per call of the risk core when δ_i is made exact
SWEEP_ROWS = 64
#: first batch of the ε_all search (then doubling)
SEARCH_BATCH = 32
#: rows per call when only ε_i is needed
EPS_ROWS = 512


def _chunks(rows: np.ndarray, size: int) -> list:
    return [rows[k:k + size] for k in range(0, len(rows), size)]


def _deal(rows: np.ndarray, size: int, threads: int) -> list:
    """``rows`` dealt round-robin into blocks of at most ``size``, and at least 4 blocks a thread: the
    rows come widest bracket first, which are the costly ones, so contiguous blocks left the other
    threads idle (the first batch of 64 rows was one block)."""
    jobs = max(-(-len(rows) // size), min(len(rows), 4 * threads))
    return [rows[j::jobs] for j in range(jobs)]


def _map(fn, blocks: list, threads: int) -> list:
    """``fn`` of each block, in order, side by side in ``threads`` threads: the bounds are NumPy on
    large arrays (and release the GIL there), and each row's value does not depend on its block,
    so the results are the same bits as one block at a time."""
    if threads <= 1 or len(blocks) <= 1:
        return [fn(b) for b in blocks]
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, blocks))


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
                   threads: int, progress: Progress = no_progress, floor: float = 0.0) -> tuple[np.ndarray, float]:
    """ε_all = max ε_i over ``rows``, exactly, and the exact ε_i of the rows it evaluated (NaN for the others).

    ``floor``: a value of ε_all already found elsewhere (other rows of the release); the result is
    the larger of it and the rows' max ε_i, and rows whose bound is at or below it are not evaluated.

    Rows go in decreasing order of ``bound`` (M_i ≥ ε_i); a batch stops at the last bound above
    the largest ε_i so far, and the search stops when the next bound is at or below it: no row after
    that point can raise the maximum. ``progress("eps_all", done, total)``: total is the rows whose
    bound exceeds the largest ε_i so far (it shrinks as the search goes).
    """
    eps_i = np.full(len(bound), np.nan)
    order = rows[np.argsort(-bound[rows], kind="stable")]
    falling = -bound[order]  # ascending
    best, pos, batch = floor, 0, SEARCH_BATCH
    while pos < len(order) and bound[order[pos]] > best:
        live = int(np.searchsorted(falling, -best, side="left"))  # rows with bound > best
        todo = order[pos:min(pos + batch, live)]
        progress("eps_all", pos, live)
        eps_i[todo] = exact_eps(model, shifts, todo, threads)
        best = max(best, float(eps_i[todo].max()))
        pos, batch = pos + len(todo), 2 * batch
    progress("eps_all", pos, pos)
    return eps_i, best


# ------------------------------------------------------------------ certified totals (issue 37)
#: default relative width of the certified total-risk bracket: hi − lo ≤ max(tolerance × hi, FLOOR)
TOLERANCE = 1e-4
#: absolute floor of the bracket's width (a total risk below it needs no relative accuracy)
FLOOR = 1e-12
#: rows refined exactly in the first pass of the certification (then doubling, up to MAX_BATCH)
FIRST_BATCH = 64
MAX_BATCH = 4096
#: rows per batch when a ranking makes ε_i exact
RANK_BATCH = 256
#: a lower bound on ε_i is trusted to decide "at risk" only this far below it (its rounding)
EPS_MARGIN = 1e-9


def check_tolerance(tolerance) -> float:
    """The certified bracket's relative width: a number in [0, 1)."""
    try:
        tol = float(tolerance)
    except (TypeError, ValueError):
        tol = float("nan")
    if not (np.isfinite(tol) and 0.0 <= tol < 1.0):
        raise InputError(f"`tolerance` must be a number in [0, 1), e.g. 1e-4; got {tolerance!r}", param="tolerance")
    return tol


class Part:
    """The rows of one joint model: their shifts Δ (R, n, d), screening bounds M (R,) and the ε_i known
    so far (R,, NaN where not computed)."""

    def __init__(self, model: JointModel, shifts: np.ndarray, bound: np.ndarray, eps_i: np.ndarray):
        self.model, self.shifts, self.bound = model, shifts, np.asarray(bound, dtype=np.float64)
        self.eps_i = np.array(eps_i, dtype=np.float64)

    def scaled(self, rows: np.ndarray) -> np.ndarray:
        return self.shifts[rows] @ self.model.transform.T


class Certified:
    """Certified δ_i(ε) brackets of every row of some :class:`Part` s, refined exactly where they matter
    (docs/method.md#102-joint-queries, the contract of issue 37).

    Every row starts from the certified bounds of :mod:`empdp.risk.joint.bounds` ([lower, upper] on δ_i;
    0 from the screening bound on; ε_i exact where a lower and an upper bound on it do not decide
    whether δ_i(ε) > 0 at some swept ε, so the at-risk counts are exact). Then rows are evaluated
    exactly (lo = hi = δ_i), the widest brackets at the failing levels first, in doubling
    batches, until at every ε (a) the worst case max_i δ_i is an exact value no open upper bound
    exceeds and (b) the total risk's bracket [1 − Π(1 − lo_i), 1 − Π(1 − hi_i)] is at most
    max(``tolerance`` × hi, 1e−12) wide. With ``exact`` every row is evaluated exactly.

    ``fixed`` (F, E): exact δ_i of rows outside the parts (sole contributors: 1), in the totals.
    """

    def __init__(self, parts: list, eps: np.ndarray, *, tolerance: float = TOLERANCE, exact: bool = False,
                 threads: int = 1, progress: Progress = no_progress, fixed: np.ndarray | None = None):
        self.parts, self.eps, self.tolerance, self.threads = parts, np.asarray(eps, dtype=np.float64), tolerance, threads
        E = len(self.eps)
        fixed = np.zeros((0, E)) if fixed is None else fixed
        with np.errstate(divide="ignore"):
            self.fixed_log = np.log1p(-fixed).sum(axis=0)
        self.fixed_max = fixed.max(axis=0, initial=0.0)
        self.fixed_at_risk = (fixed > 0).sum(axis=0)
        sizes = [len(p.bound) for p in parts]
        self.start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        N = int(self.start[-1])
        self.lo, self.hi = np.zeros((N, E)), np.zeros((N, E))
        self.refined = np.zeros(N, dtype=bool)
        self.eps_lo = np.zeros(N)
        self.progress = progress
        self._bound_all(exact)
        if exact:
            self.refine(np.flatnonzero(self.live & ~self.refined))
        else:
            self._certify()
        live = int(self.live.sum())  # the rows the bounds decided are done too
        self.progress("delta_i", live, live)

    # ---- indexing
    def _local(self, rows: np.ndarray):
        """(part index, local rows) groups of global ``rows``."""
        which = np.searchsorted(self.start, rows, side="right") - 1
        return [(k, rows[which == k] - self.start[k]) for k in np.unique(which)]

    @property
    def eps_i(self) -> np.ndarray:
        return np.concatenate([p.eps_i for p in self.parts]) if self.parts else np.zeros(0)

    @property
    def bound(self) -> np.ndarray:
        return np.concatenate([p.bound for p in self.parts]) if self.parts else np.zeros(0)

    # ---- bounds
    def _bound_all(self, exact: bool) -> None:
        eps = self.eps
        self.live = self.bound > eps[0]  # δ_i = 0 at every swept ε from M_i on
        for k, p in enumerate(self.parts):
            rows = np.flatnonzero(p.bound > eps[0])
            if not len(rows):
                continue
            if p.model.d == 1 or exact:  # one statistic: the closed form is cheaper than any bound
                self.refine(rows + self.start[k])
                continue
            a = p.model.points @ p.model.transform.T
            blocks = _chunks(rows, EPS_ROWS)
            lo = np.concatenate(_map(lambda r: eps_lower(a, p.scaled(r)), blocks, self.threads))
            self.eps_lo[rows + self.start[k]] = lo * (1 - EPS_MARGIN)
            # ε_i decides δ_i(ε) > 0: exact where [lower bound, M_i] holds a swept ε and it is not known
            open_ = (np.searchsorted(eps, lo * (1 - EPS_MARGIN), side="left")
                     < np.searchsorted(eps, p.bound[rows], side="left")) & np.isnan(p.eps_i[rows])
            todo = rows[open_]
            if len(todo):
                p.eps_i[todo] = exact_eps(p.model, p.shifts, todo, self.threads)
            hi = np.concatenate(_map(lambda r: delta_upper(p.scaled(r), eps, p.eps_i[r]), blocks, self.threads))
            low = np.concatenate(_map(lambda r: delta_lower(a, p.scaled(r), eps), blocks, self.threads))
            self.hi[rows + self.start[k]] = hi
            self.lo[rows + self.start[k]] = np.minimum(low, hi)

    # ---- exact evaluation
    def refine(self, rows: np.ndarray, levels: np.ndarray | None = None) -> None:
        """Exact ε_i, and exact δ_i(ε) at the smallest ε and at ``levels`` (mask (E,); None: all), of
        global ``rows``. At the other levels the cut cells are not integrated (the cost of d = 3): the
        bracket keeps its lower bound and its upper bound takes the chord from the exact δ_i(ε_min)
        to ε_i (:func:`empdp.risk.joint.bounds.chord_upper`), or closes at 0 from ε_i on."""
        rows = np.asarray(rows, dtype=np.int64)
        only = cap = None
        if levels is not None and not np.all(levels):
            only = np.asarray(levels, dtype=bool).copy()
            only[0] = True
            cap = np.where(only, 0.0, np.inf)  # outside ``only``: never integrated
        with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max(1, self.threads)) as pool:
            jobs = []
            for k, local in self._local(rows):
                p = self.parts[k]
                for c in _deal(local, SWEEP_ROWS, self.threads):
                    jobs.append((k, c, pool.submit(joint_risk, p.model, p.shifts[c], self.eps, only=only, cap=cap)))
            for k, c, fut in jobs:
                e, d = fut.result()
                p, g = self.parts[k], c + self.start[k]
                p.eps_i[c] = np.where(np.isnan(p.eps_i[c]), e, p.eps_i[c])  # the search's, where it has one
                skipped = np.isnan(d)
                chord = chord_upper(d[:, 0], self.eps[0], p.eps_i[c], self.eps)
                self.hi[g] = np.where(skipped, np.minimum(self.hi[g], chord), d)
                self.lo[g] = np.where(skipped, np.minimum(self.lo[g], self.hi[g]), d)
                self.refined[g] = True
        self.progress("delta_i", int(self.refined.sum()), int(self.live.sum()))

    @property
    def closed(self) -> np.ndarray:
        """(N, E): δ_i(ε) known exactly (its bracket closed)."""
        return self.lo == self.hi

    # ---- the stopping rule
    def totals(self) -> np.ndarray:
        """The certified bracket (E, 2) of δ*(ε) = 1 − Π_i (1 − δ_i(ε))."""
        with np.errstate(divide="ignore"):
            lo = -np.expm1(self.fixed_log + np.log1p(-self.lo).sum(axis=0))
            hi = -np.expm1(self.fixed_log + np.log1p(-self.hi).sum(axis=0))
        return np.column_stack([np.maximum(lo, 0.0), np.maximum(hi, lo)]) + 0.0  # no −0.0

    def worst(self) -> np.ndarray:
        """max_i δ_i(ε), exact once no open row's upper bound exceeds it: the largest lower bound (an
        exact value, or an open row's whose bracket is then closed at it) and ``fixed``'s."""
        return np.maximum(self.lo.max(axis=0, initial=0.0), self.fixed_max)

    def _failing(self) -> np.ndarray:
        tot = self.totals()
        wide = tot[:, 1] - tot[:, 0] > np.maximum(self.tolerance * tot[:, 1], FLOOR)
        open_hi = np.where(self.closed, 0.0, self.hi).max(axis=0, initial=0.0)
        return wide | (open_hi > self.worst())

    def _certify(self) -> None:
        batch = FIRST_BATCH
        while True:
            failing = self._failing()
            if not failing.any():
                return
            width = self.hi[:, failing] - self.lo[:, failing]
            score = width.max(axis=1)
            free = np.flatnonzero(score > 0)
            if not len(free):
                return  # unreachable: a failing level has an open row with hi > lo
            take = free[np.argsort(-score[free], kind="stable")[:batch]]
            self.refine(take, failing)
            batch = min(2 * batch, MAX_BATCH)

    def top(self, k: int, level: int) -> None:
        """Refine until the ``k`` largest δ_i at ``eps[level]`` are exact values no open upper bound exceeds."""
        at = np.zeros(len(self.eps), dtype=bool)
        at[level] = True
        while True:
            closed = self.closed[:, level]
            exact = np.sort(self.lo[closed, level])[::-1]
            kth = exact[k - 1] if len(exact) >= k else 0.0
            open_ = np.flatnonzero(~closed & (self.hi[:, level] > kth))
            if not len(open_):
                return
            self.refine(open_[np.argsort(-self.hi[open_, level], kind="stable")[:max(k, FIRST_BATCH)]], at)

    def rank_zero(self, need: int, zero: np.ndarray) -> None:
        """Exact ε_i for the rows ``zero`` (mask, δ_i = 0 at the ranking's ε) that can be among the
        ``need`` largest ε_i of those rows: in decreasing order of their upper bound (ε_i or M_i) until the next bound is below
        the ``need``-th exact ε_i (branch and bound)."""
        if need <= 0:
            return
        eps_i, bound = self.eps_i, self.bound
        zero = np.flatnonzero(zero)
        upper = np.where(np.isnan(eps_i), bound, eps_i)
        order = zero[np.argsort(-upper[zero], kind="stable")]
        pos = 0
        while pos < len(order):
            known = np.sort(eps_i[order[:pos]])[::-1]
            if pos >= need and upper[order[pos]] < known[need - 1]:
                return
            end = min(len(order), pos + max(RANK_BATCH, need))
            todo = order[pos:end][np.isnan(eps_i[order[pos:end]])]
            for k, local in self._local(todo):
                p = self.parts[k]
                p.eps_i[local] = exact_eps(p.model, p.shifts, local, self.threads)
            eps_i = self.eps_i
            pos = end

    def fill_eps(self) -> None:
        """Exact ε_i of every row that has none yet."""
        for p in self.parts:
            todo = np.flatnonzero(np.isnan(p.eps_i))
            if len(todo):
                p.eps_i[todo] = exact_eps(p.model, p.shifts, todo, self.threads)

    def at_risk(self) -> np.ndarray:
        """(N, E) δ_i(ε) > 0, exactly: ε < ε_i (ε_i exact, or ε below its certified lower bound)."""
        eps_i = self.eps_i
        known = ~np.isnan(eps_i)
        limit = np.where(known, eps_i, self.eps_lo)
        return self.live[:, None] & (self.eps[None, :] < limit[:, None])

    def n_at_risk(self) -> np.ndarray:
        return self.at_risk().sum(axis=0) + self.fixed_at_risk


def bracket_columns(cert: Certified, owners: np.ndarray, base: np.ndarray, level: int = 0) -> dict:
    """The table's ``delta`` (exact where the bracket is closed, else null), ``delta_lo`` and
    ``delta_hi`` at ``eps[level]``: ``base`` (m,) for the rows outside ``cert`` (sole contributors: 1; NaN:
    unknown), ``owners`` the table row of each of ``cert``'s rows."""
    lo, hi = base.astype(np.float64).copy(), base.astype(np.float64).copy()
    lo[owners], hi[owners] = cert.lo[:, level], cert.hi[:, level]
    exact = np.where(lo == hi, lo, np.nan)
    return {"delta": pl.Series(exact, nan_to_null=True), "delta_lo": pl.Series(lo, nan_to_null=True),
            "delta_hi": pl.Series(hi, nan_to_null=True)}
