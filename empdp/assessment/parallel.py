"""Where blocks of individuals are evaluated: the calling thread, a thread pool, or worker processes.

The assessment (:mod:`empdp.assessment.assess`) cuts the individuals into blocks whose composition never
depends on the thread count, so the results do not either; this module only runs them.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Callable

import numpy as np

from .. import worker_signals as _worker_signals
from ..density import DensityModel
from ..risk import blocks as _blocks
from ..risk import onescale as _onescale
from ..risk.blocks import GridBudget, PlanCache, evaluate_block, evaluate_in_worker, start_worker, warm_worker

#: individuals of one evaluation stage from which ``workers="auto"`` evaluates in processes (Gaussian
#: kernels, bounded 10^7-row panel, paired whole commands against threads: 0.97 at 10^5 individuals,
#: 0.99 at 5 × 10^4)
PROCESS_ROWS = 50_000


def _context():
    """How worker processes start: from a fresh interpreter, never as a fork of this process (DuckDB
    may be running threads in it). 'forkserver' where the platform has it: one server process
    imports :mod:`empdp.risk.blocks` once and forks each worker from itself, so the workers start
    without an interpreter or imports of their own (0.41 s and 0.8 CPU-s for two spawned workers
    on this machine); else 'spawn', also when the server cannot start (it needs a Unix socket in
    the temporary directory). The server also preloads the main module, as 'spawn' imports it in
    each worker. Starts the server if it is not running."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        # first the module that makes the server (and so its workers) ignore Ctrl-C: the command handles it
        ctx.set_forkserver_preload([_worker_signals.__name__, "__main__", _blocks.__name__])
        try:
            forkserver.ensure_running()
            return ctx
        except OSError:
            pass
    return multiprocessing.get_context("spawn")


class _Done:
    """A result computed in the calling thread, read like a future's."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class Executors:
    """Where blocks are evaluated: in the calling thread, a thread pool, or worker processes.

    Threads share the GIL: on two cores they reach about 1.6× one thread on the grid path's
    exact evaluation (many numpy calls on a few hundred rows each), processes about 1.8×. With
    ``workers="auto"``, worker processes are started (from a fresh interpreter, :func:`_context`:
    safe whatever threads DuckDB runs) on the first stage that has at least :data:`PROCESS_ROWS`
    individuals, for models on the grid path only, and kept until the assessment ends.
    """

    def __init__(self, stack: ExitStack, threads: int, workers: str, model: DensityModel,
                 grid_budget: GridBudget | None = None):
        self.stack, self.threads, self.workers, self.model = stack, threads, workers, model
        self.grid_budget = grid_budget
        self.pool = None
        if threads > 1:
            self.pool = stack.enter_context(ThreadPoolExecutor(threads, thread_name_prefix="empdp-eval"))
        self.procs = None
        self._starter: threading.Thread | None = None
        self.plans = PlanCache(model)  # blocks evaluated here share a plan while their grid is the same

    def prepare(self, rows: int) -> None:
        """Start the worker processes now, in the background, when a stage of up to ``rows``
        individuals will run in them: the fork server imports, they start and build the plan of the
        model's own grid (:func:`empdp.risk.blocks.warm_worker`) while the stages before it run (the
        ε_all search, in threads). On a bounded 10^7-row panel the first block started ~0.15 s into
        the δ stage, and ran 25% slower than the others; started in the calling thread, they held
        it for ~0.25 s (a worker starts once the fork server has imported)."""
        if self.procs is None and self._starter is None and self.uses_processes(rows):
            self._starter = threading.Thread(target=self._start, name="empdp-start-workers", daemon=True)
            # (registered before the pool it may enter: on an early exit the pool shuts down first,
            # or, still starting, is waited for and then shut down)
            self.stack.callback(self._starter.join)
            self._starter.start()

    def _start(self) -> None:
        try:
            pool = self._processes()
            for _ in range(self.threads):
                pool.submit(warm_worker)
        except Exception:  # (shut down meanwhile, or no processes here: the stage that needs them says why)
            pass

    def _processes(self) -> ProcessPoolExecutor:
        """The worker processes, started on first use (waiting for :meth:`prepare`'s start)."""
        starter = self._starter
        if starter is not None and starter is not threading.current_thread():
            starter.join()
        if self.procs is None:
            self.procs = self.stack.enter_context(ProcessPoolExecutor(
                self.threads, mp_context=_context(), initializer=start_worker,
                initargs=(self.model, self.grid_budget, os.getpid())))
        return self.procs

    def uses_processes(self, rows: int) -> bool:
        if self.threads < 2 or self.workers == "threads":
            return False
        if self.workers == "processes":
            return True
        # the closed form (one-scale Laplace) spends its time in long numpy loops that release the
        # GIL: threads beat processes, which pay for shipping every shift row (10^7 rows: 4.4 s vs 6.0 s)
        return rows >= PROCESS_ROWS and not _onescale.applies(self.model)

    def submit(self, rows: int, take: Callable[[], np.ndarray], eps, need_eps_i: bool, only, cap,
               eps_floor: float = 0.0):
        """Evaluate the block whose shift rows ``take()`` returns (a stage of ``rows`` individuals)."""
        if self.uses_processes(rows):
            return self._processes().submit(evaluate_in_worker, take(), eps, need_eps_i, only, cap, eps_floor)
        budget = self.grid_budget
        if self.pool is not None:  # the rows are read in the thread that evaluates them
            return self.pool.submit(lambda: evaluate_block(self.model, take(), eps, need_eps_i, only, cap, budget,
                                                            eps_floor, self.plans))
        return _Done(evaluate_block(self.model, take(), eps, need_eps_i, only, cap, budget, eps_floor, self.plans))
