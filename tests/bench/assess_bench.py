"""Benchmark of ``empdp assess`` at scale (issue 2). Prints its figures; not a timed test.

Synthetic panel: N individuals × D databases, one row per individual per
database, x = μ_i + noise with heavy-tailed individual effects μ_i (so some
individuals are at risk). Baseline: the time DuckDB alone takes for the
unavoidable per-(database, individual) aggregation of the same file
(``SELECT by, id, count(*), sum(x) ... GROUP BY by, id``, fully consumed),
measured in the same run: before the runs, just before each run (paired), and
after them. Each empdp run is a fresh ``empdp assess`` process; wall time and
peak RSS (the largest sampled sum over the process and its worker processes)
are reported.

    python tests/bench/assess_bench.py --individuals 1000000 --databases 100 --repeats 3
    python tests/bench/assess_bench.py --individuals 100000 --only a,b --repeats 3   # quick look
    python tests/bench/assess_bench.py --effects normal ...   # light tails: most individuals at risk at ε_all/10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb


_NORMAL = "sqrt(-2 * ln(random())) * cos(2 * pi() * random())"
EFFECTS = {
    # a few individuals far out in the tail (Student-t with 3 d.o.f.): at ε_all/10 few are at risk
    "t3": f"10 * {_NORMAL} / sqrt((pow({_NORMAL}, 2) + pow({_NORMAL}, 2) + pow({_NORMAL}, 2)) / 3)",
    # light tails: ε_all comes from the bulk, and at ε_all/10 most individuals are at risk
    "normal": f"10 * {_NORMAL}",
}


def make_data(path: Path, n_ind: int, n_db: int, effects: str = "t3", seed: int = 1) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"SELECT setseed({seed / 10})")
    tmp = str(path) + ".tmp"
    # x_ij = μ_i + N(0, 1), individual effects μ_i as chosen
    con.execute(f"""
        COPY (
          WITH ind AS (
            SELECT range AS id, {EFFECTS[effects]} AS mu
            FROM range({n_ind}))
          SELECT db.range::SMALLINT AS db, ind.id::INTEGER AS id,
                 ind.mu + sqrt(-2 * ln(random())) * cos(2 * pi() * random()) AS x
          FROM range({n_db}) db CROSS JOIN ind
        ) TO '{tmp}' (FORMAT parquet, ROW_GROUP_SIZE 1000000)""")
    os.replace(tmp, path)


def baseline(path: Path, memory_limit: str | None = None) -> float:
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    t = time.perf_counter()
    con.execute(f"SELECT count(*), sum(c), sum(s) FROM (SELECT db, id, count(*) AS c, sum(x) AS s "
                f"FROM read_parquet('{path}') GROUP BY db, id)").fetchall()
    return time.perf_counter() - t


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (worker processes included), from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):  # the process ended meanwhile
            continue
    return total


def run_empdp(args: list[str]) -> tuple[float, float, dict]:
    """Wall seconds, peak RSS in GB and the JSON summary of one ``empdp assess`` process.

    The peak is the largest sum of the resident sizes of the process and its worker processes,
    sampled every 50 ms (and at least the main process's own ru_maxrss)."""
    cmd = [sys.executable, "-m", "empdp.cli.main", "assess", *args, "--json"]
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        peak = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t
        proc.returncode = status
        out.seek(0), err.seek(0)
        if status != 0:
            raise SystemExit(f"empdp failed: {err.read().decode()[-2000:]}")
        return wall, max(peak, usage.ru_maxrss * 1024) / 1024**3, json.loads(out.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--individuals", type=int, default=1_000_000)
    ap.add_argument("--databases", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="runs of the baseline and of (a)")
    ap.add_argument("--slow-repeats", type=int, default=None, help="runs of (b) and (c) (default: --repeats)")
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--effects", choices=sorted(EFFECTS), default="t3",
                    help="individual effects: t3 (heavy tails, few at risk) or normal (most at risk at ε_all/10)")
    ap.add_argument("--only", default="a,a3,b,c", help="comma list of runs: a, a3 (3GB limit), b, c")
    opt = ap.parse_args()
    suffix = "" if opt.effects == "t3" else f"_{opt.effects}"
    path = Path(opt.data_dir) / f"panel_{opt.individuals}x{opt.databases}{suffix}.parquet"
    t = time.perf_counter()
    make_data(path, opt.individuals, opt.databases, opt.effects)
    print(f"data: {path} ({path.stat().st_size / 1e9:.2f} GB, {opt.individuals * opt.databases:,} rows, "
          f"prepared in {time.perf_counter() - t:.0f} s)")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"duckdb {duckdb.__version__}")
    common = [str(path), "--id", "id", "--by", "db", "--query", "mean(x)", "--kernel", "laplace"]
    base = [baseline(path) for _ in range(opt.repeats)]
    b_med = statistics.median(base)
    print(f"baseline DuckDB GROUP BY db, id: median {b_med:.1f} s  (runs: {', '.join(f'{x:.1f}' for x in base)})",
          flush=True)
    # ε_all from a run that asks for an ε no one exceeds (only the top of the M_i order is evaluated)
    w, rss, summary = run_empdp(common + ["-e", "1e9"])
    eps_all = summary["eps_all"]
    print(f"eps_all = {eps_all:.6g} (found in {w:.1f} s, peak RSS {rss:.2f} GB); "
          f"model: {summary['kernel']} b = {summary['bandwidth']:.4g}")
    runs = {
        "a": ("(a) eps = eps_all/2", ["-e", repr(eps_all / 2)], 3.0),
        "a3": ("(a) eps = eps_all/2, --memory-limit 2GB", ["-e", repr(eps_all / 2), "--memory-limit", "2GB"], 3.0),
        "b": ("(b) eps = eps_all/10", ["-e", repr(eps_all / 10)], 6.0),
        "c": ("(c) 50-value sweep [eps_all/10, eps_all]",
              [x for e in __import__("numpy").geomspace(eps_all / 10, eps_all, 50) for x in ("-e", repr(float(e)))],
              None),
    }
    # the machine drifts over a long benchmark (shared cores): every empdp run is paired with a
    # baseline run just before it, and each ratio is reported both ways: the median of the paired
    # ratios, and the run's median over the median of every baseline run
    medians, rows, paired = {}, [], []
    for key in opt.only.split(","):
        label, extra, target = runs[key]
        reps = opt.slow_repeats if key in ("b", "c") and opt.slow_repeats else opt.repeats
        res, pairs = [], []
        for _ in range(reps):
            pairs.append(baseline(path))
            res.append(run_empdp(common + extra))
        paired += pairs
        walls = [r[0] for r in res]
        med = statistics.median(walls)
        medians[key] = (med, walls)
        ratio = statistics.median(w / b for w, b in zip(walls, pairs))
        rows.append((key, label, target, med, walls, pairs, ratio, max(r[1] for r in res),
                     res[0][2]["sweep"][0]["n_at_risk"]))
        print(f"{label}: median {med:.1f} s; runs: {', '.join(f'{x:.1f}' for x in walls)} "
              f"(paired baselines: {', '.join(f'{x:.1f}' for x in pairs)})", flush=True)
    after = [baseline(path) for _ in range(opt.repeats)]
    b_all = statistics.median(base + paired + after)
    print(f"baseline again after the runs: {', '.join(f'{x:.1f}' for x in after)} s; "
          f"median of all {len(base + paired + after)} baseline runs: {b_all:.1f} s")
    for key, label, target, med, walls, pairs, ratio, rss, at_risk in rows:
        if target:
            tgt = f"target ≤ {target:g}×"
        else:  # (c) against (b): the ratio of medians, and the median of run-by-run ratios
            b_med, b_walls = medians.get("b", (float("nan"), []))
            by_run = statistics.median(w / v for w, v in zip(walls, b_walls)) if b_walls else float("nan")
            tgt = f"target ≤ 1.5× (b) = {1.5 * b_med:.1f} s; {med / b_med:.2f}× (b), run by run {by_run:.2f}×"
        print(f"{label}: median {med:.1f} s = {med / b_all:.2f}× baseline, {ratio:.2f}× its paired baselines "
              f"({tgt}); peak RSS {rss:.2f} GB; at risk at the smallest eps: {at_risk:,}; "
              f"runs: {', '.join(f'{x:.1f}' for x in walls)}")


if __name__ == "__main__":
    main()
