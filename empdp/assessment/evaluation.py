"""The exact evaluation of one assessment: which individuals are evaluated, in which blocks, and
the running summary of their δ_i (docs/method.md#6-sweeps-and-the-epsilon_all-search).

:func:`empdp.assessment.assess.assess` runs the stages of :class:`Evaluation` in order: the ε_all search
(exact ε_i in decreasing order of the screening bound), then δ_i for every individual whose δ_i can
be positive in the requested range, then the summary. Blocks of individuals go to
:mod:`empdp.assessment.parallel`; their exact risk comes from :func:`empdp.risk.evaluate`.
"""

from __future__ import annotations

import math
from collections import deque
from contextlib import ExitStack

import numpy as np
import polars as pl

from .. import risk
from ..density import DensityModel
from ..loo import LooEngine
from ..progress import Progress
from ..risk import onescale as _onescale
from . import checks
from .parallel import Executors

#: the memory limit when DuckDB's cannot be read (bytes)
DEFAULT_MEMORY_LIMIT = 4 * 10**9

#: dense shift cells fetched from the engine in one scan and held at once (float64: 8 bytes each),
#: at most; :func:`fetch_rows` also keeps them within a sixth of the memory limit (:data:`FETCH_SHARE`)
FETCH_SHARE = 6
FETCH_CELLS = 100_000_000
#: individuals evaluated on one shared grid (risk.evaluate bounds its own working memory)
EVAL_ROWS = 8192
#: smallest block worth a thread of its own (smaller chunks are split in four for the threads)
MIN_EVAL_ROWS = 128
#: the ε_all search's first batch
SEARCH_BATCH = 256
#: the same for Gaussian kernels, whose exact ε_i(τ) costs a search each: after the first batch,
#: only rows that can raise ε_all get it (see search_eps_all), so a smaller first batch pays less
GAUSSIAN_SEARCH_BATCH = 64
#: blocks in flight between a block's results and their use in planning others (_Accumulator.needed)
LAG_BLOCKS = 8
#: Σ log(1 − δ_i(ε)) at or below which δ*(ε) = −expm1(·) is 1.0 in float64 (it is from about −38)
SATURATED = -60.0


def _block_count(rows: int) -> int:
    """Blocks for a chunk of ``rows`` individuals: at most :data:`EVAL_ROWS` each and at least
    :data:`MIN_EVAL_ROWS` (at least four blocks: one per thread), of equal sizes and a multiple of
    four in number, so that two or four workers finish together (10^5 rows in blocks of 8,192 left
    a last block of 1,696 to one worker, 0.1 s alone on a bounded 10^7-row panel). The count
    depends on ``rows`` only, never on the threads."""
    count = max(1, min(4, rows // MIN_EVAL_ROWS), -(-rows // EVAL_ROWS))
    return count if count < 4 else -(-count // 4) * 4


def default_epsilons(eps_all: float, count: int = 50) -> np.ndarray:
    """A log-spaced sweep over [ε_all/20, 1.25 ε_all] (it covers ε_all)."""
    if not eps_all > 0 or not math.isfinite(eps_all):
        return np.geomspace(1e-3, 1.0, count)
    return np.geomspace(eps_all / 20, eps_all * 1.25, count)


def _memory_limit(engine: LooEngine) -> int:
    """The memory limit in bytes: ``--memory-limit``, else its default (DuckDB's setting holds either)."""
    return engine.memory_limit_bytes() or DEFAULT_MEMORY_LIMIT  # 0: an engine without one (Spark)


def fetch_rows(engine: LooEngine, n: int) -> int:
    """Individuals whose dense shift rows (``n`` databases each) are fetched in one scan and held at once:
    :data:`FETCH_CELLS` cells at most, and no more than a sixth of the memory limit. The rows are held
    beside DuckDB's own share: at 10^8 rows (10^6 individuals, all at risk) one fetch of every row
    was 0.8 GB on top of a 2 GB limit; a quarter of the limit still peaked at 3.06 GB with
    --memory-limit 2GB."""
    cells = min(FETCH_CELLS, _memory_limit(engine) // (FETCH_SHARE * 8))
    return max(1, cells // max(n, 1))


class _ShiftCache:
    """Dense shift rows fetched from the engine in as few scans as possible, kept until dropped.

    Each fetch is kept as it came, a part of sorted codes and their rows: merging the parts into one
    sorted array copied every held row twice, and at 10^8 rows (10^6 individuals, 800 MB of
    rows) that transient set the memory-limited run's peak."""

    def __init__(self, engine: LooEngine, capacity: int):
        self.engine, self.capacity = engine, capacity
        self.parts = []  # (sorted codes, their rows), one per fetch; a code is in one part at most

    def _find(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each code, the part that holds it (−1: none) and its row there."""
        part, row = np.full(len(codes), -1), np.zeros(len(codes), dtype=np.intp)
        for k, (held, _) in enumerate(self.parts):
            # a binary search in the part's sorted codes (a hashed set difference over the 10^6 held
            # codes cost 0.3 s a block, 48 s of a 10^8-row assessment, under the GIL)
            pos = np.minimum(np.searchsorted(held, codes), len(held) - 1)
            hit = held[pos] == codes
            part[hit], row[hit] = k, pos[hit]
        return part, row

    def prefetch(self, codes: np.ndarray) -> None:
        """Fetch the rows of ``codes`` not yet held, in one scan of the table."""
        if self.engine.holds_all_shifts:  # the engine keeps every row: nothing to fetch
            return
        codes = np.asarray(codes, dtype=np.int64)
        new = np.unique(codes[self._find(codes)[0] < 0])
        if len(new):
            self.parts.append((new, self.engine.shifts(new)))

    def held(self) -> np.ndarray:
        """The codes whose rows are held, sorted."""
        if not self.parts:
            return np.zeros(0, dtype=np.int64)
        return np.sort(np.concatenate([codes for codes, _ in self.parts]))

    def keep(self, codes: np.ndarray) -> None:
        """Drop held rows that are not in ``codes``."""
        if self.engine.holds_all_shifts:
            return
        parts = []
        for held, rows in self.parts:
            mask = np.isin(held, codes)
            if mask.all():
                parts.append((held, rows))
            elif mask.any():
                parts.append((held[mask], rows[mask]))
        self.parts = parts

    def take(self, codes: np.ndarray) -> np.ndarray:
        if self.engine.holds_all_shifts:
            return self.engine.shifts(codes)
        self.prefetch(codes)
        part, row = self._find(np.asarray(codes, dtype=np.int64))
        if (part < 0).any():  # (prefetch fetched them: a code missing here is a bug, not bad input)
            raise RuntimeError("shift cache: rows of some individuals were not fetched")
        out = np.empty((len(codes), len(self.engine.panel.labels)))
        for k, (_, rows) in enumerate(self.parts):
            at = np.flatnonzero(part == k)
            out[at] = rows[row[at]]
        return out


class _Accumulator:
    """Running max δ_i(ε), Σ log(1 − δ_i(ε)) and at-risk counts over the evaluated individuals."""

    def __init__(self, m: int, kernel, E: int):
        self.kernel = kernel
        self.first = np.zeros(m)  # δ_i at the smallest ε
        # summed in extended precision: the total does not depend (in practice, to the last bit) on
        # how the individuals are split into blocks, e.g. with or without screening
        self.max_delta, self.log_survive = np.zeros(E), np.zeros(E, dtype=np.longdouble)
        self.at_risk = np.zeros(E, dtype=np.int64)

    def add(self, codes: np.ndarray, d: np.ndarray) -> None:
        """Add the δ_i of ``codes`` (NaN: positive, not computed; see :meth:`needed`)."""
        d = self.kernel.reported_delta(d)  # below a stated tolerance: 0 (the caller's array kept)
        if not len(codes):
            return
        skipped = np.isnan(d)
        known = np.where(skipped, 0.0, d)
        self.max_delta = np.maximum(self.max_delta, known.max(axis=0))
        with np.errstate(divide="ignore"):
            self.log_survive += np.log1p(-known).sum(axis=0, dtype=np.longdouble)
        self.at_risk += ((d > 0) | skipped).sum(axis=0)
        self.first[codes] = d[:, 0]

    def needed(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The ε at which every δ_i of the next blocks is still needed, and the caps at the others
        (``only`` and ``cap`` of :func:`empdp.risk.evaluate`; None: every δ_i is needed).

        Once Σ log(1 − δ_i(ε)) ≤ :data:`SATURATED`, the total risk δ*(ε) is 1.0 in float64 whatever
        the other δ_i are; then only δ_i above the largest so far can change the summary, and
        δ_i(ε) ≤ δ_i(ε_min) shows which cannot. δ_i at the smallest ε are always computed (they
        are reported per individual), and whether δ_i > 0 is known at every ε. Laplace kernels
        only, and kernels with exact ε_i (for Gaussian kernels δ_i > 0 counts from the tolerance, not
        from sup |L|).
        """
        saturated = self.log_survive <= SATURATED
        saturated[0] = False
        if not self.kernel.exact_eps or not saturated.any():
            return None
        return ~saturated, self.max_delta.copy()


#: ε_i from which the log-ratio and e^ε leave double precision (|L| is capped at 700; Gaussian log-densities
#: are floored at −745): ε_i and ε_all there are lower bounds, said in the warnings
EPS_LIMIT = 700.0


class Evaluation:
    """The exact evaluation of one assessment: which individuals, in which blocks, and the running summary.

    Blocks depend on the fetch chunk only, never on the thread count, and block k is planned from
    the summary of blocks 0 … k − LAG_BLOCKS − 1 exactly (results are added in order), so the
    results are the same for any thread count, and the threads never wait for a wave.
    """

    def __init__(self, engine: LooEngine, model: DensityModel, screen, eps, *, screening: bool, threads: int,
                 stack: ExitStack, workers: str, progress: Progress):
        self.engine, self.model, self.screen, self.eps = engine, model, screen, eps
        self.screening, self.progress = screening, progress
        m, self.n = len(screen), len(model.points)
        self.undefined = screen.undefined
        self.definable = np.flatnonzero(~self.undefined)
        self.eps_i = np.full(m, np.nan)
        self.eps_i[self.undefined] = np.inf
        self.eps_bound = risk.eps_upper_bound(model, screen.bound, screen.n_present)
        self.eps_bound[self.undefined] = np.inf
        # each evaluation in flight holds its own grid: they share the memory limit, and a grid that
        # cannot fit is refused with the reason (the query values' span in bandwidths) before it is built
        labels = list(engine.panel.labels)
        grid_budget = (_memory_limit(engine) / threads, labels)
        if not _onescale.applies(model):  # the one-scale model needs no grid
            risk.base_grid(model, budget=grid_budget[0], labels=labels)  # the query values alone: refused early
        self.cache = _ShiftCache(engine, fetch_rows(engine, self.n))
        self.executors = Executors(stack, threads, workers, model, grid_budget)
        self.evaluated_delta = np.zeros(m, dtype=bool)
        self.exact = np.zeros(m, dtype=bool)  # evaluated exactly (ε_i, δ_i or both), not cleared by bounds
        self.acc = _Accumulator(m, model.kernel, 0 if eps is None else len(eps))
        self.eps_all = 0.0

    # ------------------------------------------------------------------ stages
    def search_eps_all(self) -> None:
        """ε_all: exact ε_i in decreasing order of the bound until the bound falls below the best so far.

        With the ε values known, these individuals get their δ_i in the same evaluation, and the
        first fetch brings the candidates too, so the table is scanned as few times as possible.
        """
        eps_i, eps_bound, definable = self.eps_i, self.eps_bound, self.definable
        order = definable[np.argsort(-eps_bound[definable], kind="stable")]
        exhaustive = not self.screening and self.eps is None  # every exact ε_i, not only those left open
        if exhaustive:
            self._prepare(len(definable))  # worker processes start meanwhile (if they will run)
        elif self.eps is not None:
            self._prepare(len(self.candidates(self.eps[0])))
        # one fetch, as many rows as the cache holds at once: the rows of largest bound, then, with a
        # given sweep, as many of its candidates as fit. A fetch scans the whole table whatever it
        # takes, and the δ stage starts with the rows held: at 10^8 rows (10^6 individuals, all at
        # risk) a first fetch of 32,768 rows left the search two more scans, the δ stage five
        capacity = self.cache.capacity
        want = order[:capacity]
        if self.eps is not None:
            more = np.setdiff1d(self.candidates(self.eps[0]), want)
            want = np.union1d(want, more[:capacity - len(want)])
        if not self.engine.on_executors:  # Spark keeps the rows on the executors
            self.cache.prefetch(want)
        eps_all, pos = 0.0, 0
        batch = SEARCH_BATCH if self.model.kernel.exact_eps else GAUSSIAN_SEARCH_BATCH
        # with the default sweep the search's rows get their δ_i later, and ε_i only matters where it
        # can raise ε_all: rows whose ε_i is at most ε_all so far may keep NaN (Gaussian kernels: no
        # search for ε_i(τ) there, ~90% of the rows on a 10^7-row panel)
        floors = self.eps is None and not exhaustive
        falling = -eps_bound[order]  # ascending
        while pos < len(order) and (exhaustive or eps_bound[order[pos]] > eps_all):
            # a batch stops at the last bound above ε_all so far: the rows after it cannot raise ε_all
            # (at 10^6 × 100 the doubling batches went 60% past the ~20,000 rows that can)
            live = len(order) if exhaustive else int(np.searchsorted(falling, -eps_all, side="left"))
            end = min(pos + batch, live)
            todo = order[pos:end]
            # one bar for the whole search: done so far out of the rows that can still raise ε_all
            self.run(todo[np.isnan(eps_i[todo])], self.eps is not None, "eps_all", shown=(pos, live),
                     eps_floor=eps_all if floors else 0.0)
            eps_all = max(eps_all, float(np.nanmax(eps_i[order[:end]], initial=0.0)))
            if pos == 0 and self.eps is None and not exhaustive:
                # the default sweep starts at ε_all/20, ε_all is at least this: at most these rows get to
                # the δ stage (a heavy-tailed panel has few, for which worker processes would not pay)
                self._prepare(len(self.candidates(default_epsilons(eps_all)[0] if eps_all > 0 else 0.0)))
            pos, batch = end, batch * 2
        self.eps_all = eps_all
        if self.eps is None:
            self.eps = default_epsilons(eps_all)
            self.acc = _Accumulator(len(eps_i), self.model.kernel, len(self.eps))

    def delta_stage(self, exact_all: bool) -> None:
        """δ_i for the remaining individuals whose δ_i can be positive in the requested range.

        With screening and no ``exact_all``, ε_i is computed only where ε_all needs it: these
        individuals get their exact δ_i only, and those whose certified bounds on the grid show
        ε_i ≤ min ε skip the exact evaluation (δ_i = 0).
        """
        need = self.candidates(self.eps[0])
        if exact_all:
            need = np.union1d(need, self.definable[np.isnan(self.eps_i[self.definable])])
        rest = need[~self.evaluated_delta[need]]
        # the rows held (the search's) first, in one chunk with no scan; the held and the fetched rows
        # together stay within the cache's capacity, and the held rows not wanted go
        held = np.isin(rest, self.cache.held(), assume_unique=True)
        rest = np.concatenate([rest[held], rest[~held]])
        self.cache.keep(rest[:self.cache.capacity])
        self._prepare(len(rest))  # (when the search's estimate did not start them)
        self.run(rest, True, "delta_i", release=True, need_eps_i=exact_all or not self.screening)
        if len(self.definable):
            self.eps_all = max(self.eps_all, float(np.nanmax(self.eps_i[self.definable], initial=0.0)))

    def candidates(self, eps_min: float) -> np.ndarray:
        """Individuals whose δ_i can be positive at some ε ≥ eps_min (all of them without screening)."""
        if not self.screening:
            return self.definable
        screen = self.screen
        if self.model.kernel.exact_eps:  # δ_i = 0 for ε ≥ M_i
            need = screen.bound > eps_min
        else:
            need = risk.delta_upper_bound(self.model.kernel, eps_min, screen.bound, screen.n_present,
                                          self.n) > self.model.kernel.tolerance
        return np.flatnonzero(need & ~self.undefined)

    # ------------------------------------------------------------ evaluation
    def _prepare(self, rows: int) -> None:
        """Start the worker processes for a stage of up to ``rows`` individuals, if it will use them
        (:meth:`Executors.prepare`); not on Spark, whose executors evaluate the individuals."""
        if not self.engine.on_executors:
            self.executors.prepare(rows)

    def run(self, codes: np.ndarray, with_delta: bool, stage: str, release: bool = False,
            need_eps_i: bool = True, shown: tuple[int, int] | None = None, eps_floor: float = 0.0) -> None:
        """Exact ε_i (and δ_i at ``eps``) for ``codes``: one scan per fetch chunk, one grid per batch.

        With ``need_eps_i=False`` only δ_i is computed (ε_i stays NaN), and only for the
        individuals whose bounds do not certify ε_i ≤ min(eps); ``eps_floor`` > 0 computes ε_i only
        above it (NaN where certified ≤ it; :func:`empdp.risk.evaluate`). ``shown`` = (rows done before,
        rows in the whole stage) when ``codes`` is one batch of a longer stage.
        """
        cache, done = self.cache, 0
        offset, total = shown if shown is not None else (0, len(codes))
        total = max(total, offset + len(codes))
        self.progress(stage, offset, total)
        if self.engine.on_executors:  # the candidates are evaluated where their rows are
            for a in range(0, len(codes), cache.capacity):
                chunk = codes[a:a + cache.capacity]
                result = self.engine.evaluate(self.model, chunk, self.eps if with_delta else None,
                                               need_eps_i=need_eps_i, return_exact=True)
                done = self._add(chunk, result, with_delta, stage, done, offset, total)
            return
        for a in range(0, len(codes), cache.capacity):
            chunk = codes[a:a + cache.capacity]
            cache.prefetch(chunk)
            blocks = np.array_split(chunk, _block_count(len(chunk)))
            pending = deque()  # (index, block, future or result), in order
            for k, block in enumerate(blocks):
                while pending and pending[0][0] < k - LAG_BLOCKS:
                    _, b, res = pending.popleft()
                    done = self._add(b, res.result(), with_delta, stage, done, offset, total)
                needed = self.acc.needed() if with_delta else None  # the δ_i this block needs
                # the cache is only read while blocks are evaluated
                pending.append((k, block, self._submit(len(codes), block, with_delta, need_eps_i, needed,
                                                       eps_floor)))
            for _, b, res in pending:
                done = self._add(b, res.result(), with_delta, stage, done, offset, total)
            if release:  # only the next fetch's rows stay (see delta_stage)
                cache.keep(codes[a + cache.capacity:a + 2 * cache.capacity])

    def _submit(self, rows: int, block: np.ndarray, with_delta: bool, need_eps_i: bool, needed,
                eps_floor: float = 0.0):
        only, cap = needed or (None, None)
        return self.executors.submit(rows, lambda: self.cache.take(block), self.eps if with_delta else None,
                                     need_eps_i, only, cap, eps_floor)

    def _add(self, block: np.ndarray, result, with_delta: bool, stage: str, done: int, offset: int,
             total: int) -> int:
        e_i, d, ex = result
        # a δ-only evaluation (NaN ε_i) keeps the exact ε_i the ε_all search found
        self.eps_i[block] = np.where(np.isnan(e_i), self.eps_i[block], e_i)
        self.exact[block] |= ex
        if with_delta:
            self.acc.add(block, d)
            self.evaluated_delta[block] = True
        done += len(block)
        self.progress(stage, offset + done, total)
        return done

    # ---------------------------------------------------------------- summary
    def result(self, q: np.ndarray) -> dict:
        """The fields of :class:`empdp.assessment.assess.Assessment`: sweep summary, checks, warnings and the
        per-individual table."""
        engine, screen, undefined, acc = self.engine, self.screen, self.undefined, self.acc
        max_delta, log_survive, at_risk = acc.max_delta.copy(), acc.log_survive.copy(), acc.at_risk.copy()
        delta_first = acc.first.copy()
        sole = int(undefined.sum())
        if sole:
            max_delta[:] = 1.0
            log_survive[:] = -np.inf
            at_risk += sole
            delta_first[undefined] = 1.0
        total = np.maximum(-np.expm1(log_survive.astype(np.float64)), 0.0)
        indep, warn1 = checks.independence(q)
        rep, warn2 = checks.representativeness(screen.n_present, self.n)
        warnings = warn1 + warn2
        if sole:
            warnings.insert(0, f"{sole} individual(s) are the only contributor to some database: removing them "
                               f"leaves the query undefined, so their presence alone is revealed (delta_i = 1, "
                               f"eps_i = inf); no epsilon protects them")
        if engine.panel.n_null_ids:
            warnings.append(f"dropped {engine.panel.n_null_ids} rows with a NULL id")
        null_values = getattr(engine, "null_values_warning", None)  # a property of the engine
        if null_values:
            warnings.append(null_values)
        if self.eps_all >= EPS_LIMIT:
            beyond = max(1, int(np.count_nonzero(self.eps_i[np.isfinite(self.eps_i)] >= EPS_LIMIT)))
            warnings.append(f"{beyond} individual(s) have eps_i of {EPS_LIMIT:g} or more, where "
                            f"e^eps and the densities' ratio leave double precision: eps_all = {self.eps_all:.6g} "
                            f"and their eps_i are lower bounds, and the sweep does not resolve their risk above "
                            f"eps = {EPS_LIMIT:g}")
        individuals = pl.DataFrame({
            engine.panel.id: screen.ids,
            "eps_i": pl.Series(self.eps_i, dtype=pl.Float64, nan_to_null=True),
            "eps_bound": self.eps_bound,
            "delta": delta_first,
            "n_databases": screen.n_present.astype(np.int64),
            "max_abs_shift": screen.max_abs_shift,
            "sole_contributor": undefined,
        })
        return dict(
            source=engine.panel.description, query=engine.query.describe(), id_column=engine.panel.id,
            by_column=engine.panel.by, labels=list(engine.panel.labels), q=q, model=self.model,
            epsilons=self.eps, delta=max_delta, total_risk=total, n_at_risk=at_risk, eps_all=self.eps_all,
            individuals=individuals, independence=indep, representativeness=rep, warnings=warnings,
            sole_contributors=sole, n_evaluated=int((self.exact & ~undefined).sum()), screening=self.screening,
            engine=engine)
