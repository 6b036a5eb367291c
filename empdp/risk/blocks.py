"""One block of individuals evaluated exactly, in the calling process or in a worker process.

A worker process imports this module only (numpy, scipy and :mod:`empdp.risk`, 0.41 s), not the
assessment around it (polars, DuckDB, the leave-one-out engines: 0.70 s in all), so the
stages evaluated in processes start sooner (:mod:`empdp.assessment.parallel`).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

from .. import risk  # through the package: tests count its calls (risk.evaluate)
from ..density import DensityModel
from . import onescale as _onescale

#: (bytes one evaluation's grid may take, the databases' names) for risk.base_grid
GridBudget = tuple[float, list]


class PlanCache:
    """The last grid plan built for one model, for the next block on the same grid.

    A block's grid holds the points' neighbourhoods and only the kinks far from them, so most
    blocks of a stage share one grid; its plan (the Gaussian series' columns: ~6 ms for 100
    databases, 3 µs a row of a 2,048-row block) is then built once. The plan is read-only once
    built (the series' columns are extended by replacement), so threads share it. Kept by whoever
    owns the blocks' lifetime (an assessment's executors, a worker process), not globally.
    """

    def __init__(self, model: DensityModel):
        self.model = model
        self._lock = threading.Lock()
        self._grid = self._plan = None

    def plan(self, grid: np.ndarray):
        with self._lock:
            if self._grid is not None and np.array_equal(self._grid, grid):
                return self._plan
        plan = risk.grid_plan(self.model, grid)
        with self._lock:
            self._grid, self._plan = grid, plan
        return plan


def evaluate_block(model: DensityModel, shifts: np.ndarray, eps, need_eps_i: bool, only, cap,
                   grid_budget: GridBudget | None = None, eps_floor: float = 0.0, plans: PlanCache | None = None):
    """Exact ε_i (above ``eps_floor``, see :func:`empdp.risk.evaluate`), δ_i and the exact-evaluation
    flags of one block of shift rows, on its own grid (refused, InputError, when it would not fit in
    ``grid_budget``); its plan from ``plans`` when that holds one for the same grid."""
    if _onescale.applies(model):  # no grid: the closed form needs none (see empdp.risk.onescale)
        return risk.evaluate(model, shifts, eps, need_eps_i=need_eps_i, return_exact=True, only=only, cap=cap)
    budget, labels = grid_budget or (None, None)
    grid = risk.base_grid(model, model.points[None, :] - shifts, budget=budget, labels=labels)
    plan = risk.grid_plan(model, grid) if plans is None else plans.plan(grid)
    return risk.evaluate(model, shifts, eps, grid=grid, plan=plan, need_eps_i=need_eps_i,
                         return_exact=True, only=only, cap=cap, eps_floor=eps_floor)


_WORKER: dict = {}


#: seconds between a worker's checks that the process it works for is still there
WATCH_INTERVAL = 0.5


def start_worker(model: DensityModel, grid_budget: GridBudget | None = None, owner: int | None = None) -> None:
    """Worker process set-up: the density model, its plan cache, single-threaded BLAS (as in the
    threads), and with ``owner`` (the assessing process's id) a watch that ends this worker when
    that process is gone. A process killed outright (SIGKILL) cannot stop its pool, and the
    workers would wait for work forever: they, and a fork server they keep alive, hold both ends
    of their task pipes."""
    _WORKER["model"] = model
    _WORKER["grid_budget"] = grid_budget
    _WORKER["plans"] = PlanCache(model)
    _WORKER["blas"] = threadpool_limits(limits=1, user_api="blas")
    if owner is not None:
        threading.Thread(target=_watch, args=(owner,), daemon=True, name="empdp-owner-watch").start()


def _watch(owner: int) -> None:
    while _alive(owner):
        time.sleep(WATCH_INTERVAL)
    os._exit(1)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an ended process not yet reaped by its parent does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): the signal test above decides
        return True


def warm_worker(terms: int = 16) -> None:
    """In a worker set up by :func:`start_worker`, before its first block: the plan of the model's own
    grid (the grid of every block whose kinks lie near the points, as on panels of small shifts) and
    its series' columns, while the assessing process still runs the stages before the δ stage. A
    grid over the memory budget is refused here as in :func:`evaluate_block` (the error is not read:
    the block that needs such a grid raises it)."""
    model = _WORKER["model"]
    if _onescale.applies(model):
        return
    budget, labels = _WORKER.get("grid_budget") or (None, None)
    plan = _WORKER["plans"].plan(risk.base_grid(model, budget=budget, labels=labels))
    if hasattr(plan, "columns"):
        plan.columns(terms)


def evaluate_in_worker(shifts: np.ndarray, eps, need_eps_i: bool, only, cap, eps_floor: float = 0.0):
    """:func:`evaluate_block` in a worker process set up by :func:`start_worker`."""
    return evaluate_block(_WORKER["model"], shifts, eps, need_eps_i, only, cap, _WORKER.get("grid_budget"),
                          eps_floor, _WORKER.get("plans"))
