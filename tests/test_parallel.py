"""Where blocks run (empdp.assessment.parallel): worker processes start from a fork server that has
imported the evaluation module, started while the stages before theirs run, and only when a stage
will use processes."""

from __future__ import annotations

import multiprocessing
import threading
from contextlib import ExitStack

import numpy as np
import polars as pl
import pytest

import empdp
from empdp.assessment import parallel
from empdp.density import DensityModel
from empdp.settings import Model


def _model(kernel: str, bandwidths) -> DensityModel:
    q = np.linspace(0.0, 1.0, 5)
    return DensityModel(kernel, 0.3, 0.0, q, np.asarray(bandwidths, dtype=float), loglik=0.0)


@pytest.fixture
def started(monkeypatch):
    calls = []
    from multiprocessing import forkserver

    monkeypatch.setattr(forkserver, "ensure_running", lambda: calls.append(1))
    return calls


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here")
@pytest.mark.parametrize("kernel,bandwidths,workers,threads,rows,starts", [
    ("gaussian", [0.3] * 5, "auto", 2, parallel.PROCESS_ROWS, True),
    ("gaussian", [0.3] * 5, "auto", 2, parallel.PROCESS_ROWS - 1, False),  # a stage too small for processes
    ("gaussian", [0.3] * 5, "threads", 2, 10**6, False),
    ("gaussian", [0.3] * 5, "auto", 1, 10**6, False),
    ("laplace", [0.3] * 5, "auto", 2, 10**6, False),  # one Laplace scale: the closed form, in threads
    ("laplace", [0.2, 0.3, 0.3, 0.3, 0.4], "auto", 2, 10**6, True),  # variable scales: the grid path
    ("gaussian", [0.3] * 5, "processes", 2, 10, True),
])
def test_fork_server_starts_only_for_stages_in_processes(started, kernel, bandwidths, workers, threads, rows, starts):
    with ExitStack() as stack:
        ex = parallel.Executors(stack, threads, workers, _model(kernel, bandwidths))
        ex.prepare(rows)
        if ex._starter is not None:  # (they start in the background)
            ex._starter.join()
        assert bool(started) == starts
        assert ex.uses_processes(rows) == starts


def test_prepare_starts_the_processes_without_holding_the_caller(monkeypatch):
    """The worker processes start in a thread of their own (a worker starts only once the fork server
    has imported): the caller goes on with the stages before theirs, and an early exit waits for them."""
    entered, release = threading.Event(), threading.Event()

    def slow_start(self):
        entered.set()
        release.wait(10)
        raise OSError("no processes in this test")

    monkeypatch.setattr(parallel.Executors, "_processes", slow_start)
    with ExitStack() as stack:
        ex = parallel.Executors(stack, 2, "processes", _model("gaussian", [0.3] * 5))
        ex.prepare(10)
        assert entered.wait(5) and ex._starter.is_alive()  # starting, and prepare has returned
        starter = ex._starter
        ex.prepare(10)  # once
        assert ex._starter is starter
        threading.Timer(0.2, release.set).start()
    assert not starter.is_alive()  # the exit waited for it


@pytest.mark.parametrize("shape", ["heavy", "bounded"])
def test_the_search_starts_processes_for_the_delta_stage_it_can_have(monkeypatch, shape):
    """With the default sweep (from ε_all/20), the processes are asked for after the ε_all search's first
    batch, for the individuals the δ stage can have at most (ε_all is at least the batch's): on a
    heavy-tailed panel a minority, for which processes may not pay; on a bounded one, everyone."""
    calls = []
    monkeypatch.setattr(parallel.Executors, "prepare", lambda self, rows: calls.append(rows))
    rng = np.random.default_rng(5)
    n, T = 1500, 40
    mu = 10 * rng.standard_t(3, n) if shape == "heavy" else rng.uniform(0, 2, n)
    df = pl.DataFrame({"id": np.repeat(np.arange(n), T), "db": np.tile(np.arange(T), n),
                       "x": np.repeat(mu, T) + rng.normal(size=n * T)})
    empdp.assess(df, id="id", by="db", query="mean(x)", model=Model(kernel="gaussian"))
    search, delta = calls  # the search's estimate, then the δ stage's own rows
    assert delta <= search
    assert (search < n // 2) if shape == "heavy" else (search == n)


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here")
def test_workers_come_from_a_fork_server_that_preloads_the_evaluation():
    ctx = parallel._context()
    assert ctx.get_start_method() == "forkserver"
    from multiprocessing import forkserver

    assert "empdp.risk.blocks" in forkserver._forkserver._preload_modules


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here")
def test_spawn_when_the_fork_server_cannot_start(monkeypatch):
    from multiprocessing import forkserver

    def refuse():
        raise OSError("no Unix socket here")

    monkeypatch.setattr(forkserver, "ensure_running", refuse)
    assert parallel._context().get_start_method() == "spawn"


_OWNER = """
import sys, time
from contextlib import ExitStack
import numpy as np
from empdp.assessment import parallel
from empdp.density import DensityModel

if __name__ == "__main__":
    q = np.linspace(0.0, 1.0, 5)
    model = DensityModel("gaussian", 0.3, 0.0, q, np.full(5, 0.3), loglik=0.0)
    with ExitStack() as stack:
        ex = parallel.Executors(stack, 2, "processes", model)
        futures = [ex.submit(10, lambda: np.full((3, 5), 0.01), np.array([0.1]), False, None, None)
                   for _ in range(4)]
        [f.result() for f in futures]
        print(" ".join(str(p) for p in ex.procs._processes), flush=True)
        time.sleep(600)
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/stat"), reason="reads /proc")
def test_workers_end_when_the_assessing_process_is_killed(tmp_path):
    """SIGKILL leaves a pool no chance to stop its workers (they hold both ends of their task pipes and
    would wait forever, keeping a fork server alive): each worker watches its owner and ends."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = []
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and _running(p) for p in workers):
            time.sleep(0.2)
        assert not any(os.path.exists(f"/proc/{p}") and _running(p) for p in workers)
    finally:
        proc.kill()
        for p in workers:  # (after a failure: leave nothing behind)
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
