"""Benchmark of the Spark engine against DuckDB on the same Parquet panel (issue 21, item 6).

Prints per-stage wall times; not a timed test. Each configuration runs in a fresh Python
process (a Spark local-mode JVM cannot change its core count): DuckDB with 1 and 2 threads,
Spark ``local[1]`` and ``local[2]``. Stages, for ``mean(x)`` (one row per individual and
database, the panels of ``assess_bench.py``):

  open        open and validate the source (Spark: one scan with the per-label counts)
  values      f(X^j) for every database
  screen      per-individual n_present, sole contributors, max |Δ|, M_i (Spark: the GROUP BY
              (database, id), the persisted Δ table, and the aggregation per individual)
  shifts      the dense Δ rows of the --candidates individuals with the largest M_i, on the driver
  evaluate    exact ε_i and δ_i(ε) of those candidates: DuckDB, ``risk.evaluate`` in blocks of
              8,192 on the driver (single-threaded BLAS); Spark, ``evaluate_on_executors``

    python tests/bench/spark_bench.py --rows 1e7                 # bench_data/panel_t3_100000x100.parquet
    python tests/bench/spark_bench.py --rows 1e8 --candidates 100000
"""

from __future__ import annotations

import argparse
import json
import os
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


def run_one(engine: str, cores: int, path: str, candidates: int) -> dict:
    """One configuration's stage times (seconds) in this process."""
    from threadpoolctl import threadpool_limits

    from empdp import risk
    from empdp.density import select_density

    times, t = {}, time.perf_counter()

    def lap(name):
        nonlocal t
        now = time.perf_counter()
        times[name] = round(now - t, 2)
        t = now

    if engine == "spark":
        from empdp.spark import evaluate_on_executors, make_spark_engine, spark_session

        spark = spark_session(f"local[{cores}]", config={"spark.driver.memory": "6g"})
        spark.sparkContext.setLogLevel("ERROR")
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
    eng.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--engines", default="duckdb,spark")
    ap.add_argument("--one", nargs=3, metavar=("ENGINE", "CORES", "PATH"), help=argparse.SUPPRESS)
    opt = ap.parse_args()
    if opt.one:
        engine, cores, path = opt.one
        print(json.dumps(run_one(engine, int(cores), path, opt.candidates)))
        return
    path = panel(opt.rows, opt.data_dir)
    print(f"# {path} ({opt.rows:.0e} rows), mean(x), {opt.candidates:,} candidates; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}")
    stages = ["session", "open", "values", "screen", "shifts", "evaluate"]
    print(f"{'engine':<8} {'cores':>5} " + " ".join(f"{s:>9}" for s in stages) + f" {'total':>8} {'sum eps_i':>12}")
    for engine in opt.engines.split(","):
        for cores in opt.cores.split(","):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--candidates", str(opt.candidates),
                                  "--one", engine, cores, str(path)], capture_output=True, text=True)
            wall = time.perf_counter() - t0
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode or not lines:
                print(f"{engine:<8} {cores:>5} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            res = json.loads(lines[-1])
            print(f"{engine:<8} {cores:>5} " + " ".join(f"{res.get(s, 0.0):>9.2f}" for s in stages)
                  + f" {wall:>8.1f} {res['eps_i_sum']:>12.6f}", flush=True)


if __name__ == "__main__":
    main()
