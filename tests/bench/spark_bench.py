"""Benchmark of the Spark engine against DuckDB on the same Parquet panel (issue 21, item 6).

Prints per-stage wall times, the median of ``--repeat`` runs (default 3); not a timed test.
Each run is a fresh Python process (a Spark local-mode JVM cannot change its core count):
DuckDB with 1 and 2 threads, Spark ``local[1]`` and ``local[2]``. For Spark it also prints,
per stage, the executors' task time, the bytes read from the source and written to the
shuffle (from Spark's status store), and the driver's peak memory (the Python process's
resident set; the JVM heap, which in local mode also holds the executors). Stages, for
``mean(x)`` (one row per individual and database, the panels of ``assess_bench.py``):

  open        open and validate the source (Spark: one scan with the per-label counts)
  values      f(X^j) for every database
  screen      per-individual n_present, sole contributors, max |Δ|, M_i (Spark: the GROUP BY
              (database, id), the persisted Δ table, and the aggregation per individual)
  shifts      the dense Δ rows of the --candidates individuals with the largest M_i, on the driver
  evaluate    exact ε_i and δ_i(ε) of those candidates: DuckDB, ``risk.evaluate`` in blocks of
              8,192 on the driver (single-threaded BLAS); Spark, ``evaluate_on_executors``

    python tests/bench/spark_bench.py --rows 1e7                 # bench_data/panel_t3_100000x100.parquet
    python tests/bench/spark_bench.py --rows 1e8 --candidates 100000 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def panel(rows: float, data_dir: str) -> Path:
    from assess_bench import panel_path, prepare

    n_db = 100
    n_ind = int(rows) // n_db
    path = panel_path(data_dir, n_ind, n_db, "t3")
    prepare(path, n_ind, n_db, "t3")
    return path


class SparkMetrics:
    """Per-stage executor task time and input/shuffle bytes of the jobs run since the last call."""

    def __init__(self, spark):
        self.sc = spark.sparkContext
        self.seen: set = set()

    def since_last(self) -> dict:
        jsc = self.sc._jsc.sc()
        jsc.listenerBus().waitUntilEmpty()  # the status store is updated from the listener bus
        store, tracker = jsc.statusStore(), self.sc.statusTracker()
        out = {"task_s": 0.0, "input_mb": 0.0, "shuffle_mb": 0.0}
        for job in tracker.getJobIdsForGroup(None):
            info = tracker.getJobInfo(job)
            for stage in (info.stageIds if info else []):
                if stage in self.seen:
                    continue
                try:
                    data = store.lastStageAttempt(stage)
                except Exception:  # noqa: BLE001 - a stage never submitted
                    continue
                if data.status().toString() not in ("COMPLETE", "FAILED"):
                    continue
                self.seen.add(stage)
                out["task_s"] += data.executorRunTime() / 1e3
                out["input_mb"] += data.inputBytes() / 1e6
                out["shuffle_mb"] += data.shuffleWriteBytes() / 1e6
        return out

    def jvm_heap_peak_mb(self) -> float:
        mf = self.sc._jvm.java.lang.management.ManagementFactory
        pools = mf.getMemoryPoolMXBeans()
        return sum(pools.get(k).getPeakUsage().getUsed() for k in range(pools.size())
                   if pools.get(k).getType().toString() == "Heap memory") / 1e6


def run_one(engine: str, cores: int, path: str, candidates: int) -> dict:
    """One configuration's stage times (seconds) in this process, and Spark's per-stage metrics."""
    from threadpoolctl import threadpool_limits

    from empdp import risk
    from empdp.density import select_density

    times, t = {}, time.perf_counter()
    metrics = None

    def lap(name):
        nonlocal t
        now = time.perf_counter()
        times[name] = round(now - t, 2)
        if metrics is not None:
            for key, value in metrics.since_last().items():
                times[f"{name}:{key}"] = round(value, 2)
        t = time.perf_counter()

    if engine == "spark":
        from empdp.spark import evaluate_on_executors, make_spark_engine, spark_session

        spark = spark_session(f"local[{cores}]", config={"spark.driver.memory": "6g"})
        spark.sparkContext.setLogLevel("ERROR")
        metrics = SparkMetrics(spark)
        lap("session")
        eng = make_spark_engine(path, id="id", by="db", query="mean(x)")
    else:
        from empdp.loo import make_engine

        eng = make_engine(path, id="id", by="db", query="mean(x)", threads=cores)
    lap("open")
    q = eng.values()
    lap("values")
    model = select_density(q, kernel="laplace")
    lap("model")
    screen = eng.screen(model.bandwidths)
    lap("screen")
    codes = np.sort(np.argsort(-screen.bound, kind="stable")[:candidates])
    eps = np.quantile(screen.bound[codes], [0.1, 0.5, 0.9])
    rows = eng.shifts(codes)
    lap("shifts")
    if engine == "spark":
        eps_i, delta = evaluate_on_executors(eng, model, codes, eps)
    else:
        with threadpool_limits(limits=1, user_api="blas"):
            parts = [risk.evaluate(model, rows[a:a + 8192], eps) for a in range(0, len(codes), 8192)]
        eps_i = np.concatenate([p[0] for p in parts])
    lap("evaluate")
    times["individuals"] = len(screen)
    times["candidates"] = len(codes)
    times["eps_i_sum"] = float(np.nansum(eps_i))  # the engines agree (printed side by side)
    times["driver_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # Linux: KiB
    if metrics is not None:
        times["jvm_heap_peak_mb"] = metrics.jvm_heap_peak_mb()
    eng.close()
    return times


STAGES = ["session", "open", "values", "screen", "shifts", "evaluate"]


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in runs)


def _print_spark_metrics(label: str, runs: list[dict]) -> None:
    """Executors' task seconds, source MB read and shuffle MB written per stage (medians)."""
    cells = []
    for stage in STAGES[1:]:
        cells.append(f"{stage} {_median(runs, stage + ':task_s'):.1f} s / {_median(runs, stage + ':input_mb'):.1f} MB in"
                     f" / {_median(runs, stage + ':shuffle_mb'):.1f} MB shuffled")
    print(f"  {label}: " + "; ".join(cells))
    print(f"  {label}: driver peak RSS {_median(runs, 'driver_rss_mb'):.0f} MB (Python), JVM heap peak "
          f"{_median(runs, 'jvm_heap_peak_mb'):.0f} MB (driver and, in local mode, the executors)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--engines", default="duckdb,spark")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration; the median is printed")
    ap.add_argument("--one", nargs=3, metavar=("ENGINE", "CORES", "PATH"), help=argparse.SUPPRESS)
    opt = ap.parse_args()
    if opt.one:
        engine, cores, path = opt.one
        print(json.dumps(run_one(engine, int(cores), path, opt.candidates)))
        return
    path = panel(opt.rows, opt.data_dir)
    print(f"# {path} ({opt.rows:.0e} rows), mean(x), {opt.candidates:,} candidates; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}; median of {opt.repeat} run(s), seconds")
    print(f"{'engine':<8} {'cores':>5} " + " ".join(f"{s:>9}" for s in STAGES) + f" {'total':>8} {'sum eps_i':>12}"
          + "  totals of the runs")
    spark_runs = {}
    for engine in opt.engines.split(","):
        for cores in opt.cores.split(","):
            runs, walls = [], []
            for _ in range(opt.repeat):
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, __file__, "--candidates", str(opt.candidates),
                                      "--one", engine, cores, str(path)], capture_output=True, text=True)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
                if out.returncode or not lines:
                    print(f"{engine:<8} {cores:>5} failed: {out.stderr.strip().splitlines()[-1:]}")
                    break
                runs.append(json.loads(lines[-1]))
                walls.append(time.perf_counter() - t0)
            if not runs:
                continue
            print(f"{engine:<8} {cores:>5} " + " ".join(f"{_median(runs, s):>9.2f}" for s in STAGES)
                  + f" {statistics.median(walls):>8.1f} {runs[0]['eps_i_sum']:>12.6f}  "
                  + ", ".join(f"{w:.1f}" for w in walls), flush=True)
            if engine == "spark":
                spark_runs[f"local[{cores}]"] = runs
    if spark_runs:
        print("# Spark per stage (medians): executors' task time / source read / shuffle written")
        for label, runs in spark_runs.items():
            _print_spark_metrics(label, runs)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
