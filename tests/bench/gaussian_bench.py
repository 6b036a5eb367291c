"""Benchmark of the Gaussian kernel's default command against Laplace's (issue 18, item 4). Prints its
figures; not a timed test.

    python tests/bench/gaussian_bench.py                       # both panels at 10^7 rows, 3 pairs each
    python tests/bench/gaussian_bench.py --shapes bounded --runs 5

The commands, on the same file, each a fresh process of the installed ``empdp`` executable (as in
``assess_bench.py``; ``--empdp PATH`` to choose):

    A: empdp assess FILE --id id --by db --query "mean(x)" --kernel gaussian -q
    B: empdp assess FILE --id id --by db --query "mean(x)" --kernel laplace -q

run in turn, A B A B ... (the machine drifts: each ratio A/B is taken pair by pair). Printed per
panel: the median, min and max of wall and CPU seconds (user + system of the process and of every
descendant, worker processes and a fork server included, sampled from /proc every 50 ms) and peak
RSS (as in ``assess_bench.py``) of each command, and the median of the paired ratios. Target: the
median paired wall ratio ≤ 1.5 on both panels. Exit status 1 if a target fails.

Panels: ``assess_bench.py``'s, written once under --data-dir (reused if present): t3 (a few
individuals far out, few at risk) and bounded (nearly everyone at risk at the sweep's low end),
10^5 individuals × 100 databases by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import assess_bench  # noqa: E402  (the panels, the executable and the peak RSS of a process tree)

TARGET = 1.5


def run(exe: str, path: Path, kernel: str, timeout: float) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (GB) of one ``empdp assess ... --kernel KERNEL -q``."""
    cmd = [exe, "assess", str(path), "--id", "id", "--by", "db", "--query", "mean(x)", "--kernel", kernel, "-q"]
    t = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        peak, seen = 0, {}
        while True:
            ended = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            assess_bench.sample_tree_cpu(proc.pid, seen)  # (an ended command is a zombie: its final times)
            if ended is not None:
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            peak = max(peak, assess_bench._tree_rss(proc.pid))
            if time.perf_counter() - t > timeout:
                proc.kill()
                proc.wait()
                raise SystemExit(f"timed out after {timeout:.0f} s: {' '.join(cmd)}")
            time.sleep(0.05)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            raise SystemExit(f"empdp failed ({' '.join(cmd)}): {err.read().decode()[-2000:]}")
    # each process's own CPU as last sampled (every 50 ms; the command's at its end): a fork server's
    # workers are not the command's children, so RUSAGE_CHILDREN would miss them
    cpu = sum(seen.values())
    return wall, cpu, max(peak, usage.ru_maxrss * 1024) / 1024**3


def spread(values: list[float], unit: str = "s") -> str:
    return f"median {statistics.median(values):.2f} {unit} (min {min(values):.2f}, max {max(values):.2f})"


def bench_shape(exe: str, path: Path, runs: int, timeout: float) -> bool:
    """Paired runs on one panel; prints the figures, returns whether the target holds."""
    figures = {"gaussian": [], "laplace": []}
    for _ in range(runs):
        for kernel in figures:
            figures[kernel].append(run(exe, path, kernel, timeout))
    for kernel, rows in figures.items():
        wall, cpu, peak = zip(*rows)
        print(f"  {kernel:8s} wall {spread(list(wall))}; cpu {spread(list(cpu))}; peak {max(peak):.2f} GB")
    ratio = [g[0] / b[0] for g, b in zip(figures["gaussian"], figures["laplace"])]
    cpu_ratio = [g[1] / b[1] for g, b in zip(figures["gaussian"], figures["laplace"])]
    ok = statistics.median(ratio) <= TARGET
    print(f"  gaussian/laplace paired wall ratio: median {statistics.median(ratio):.2f} "
          f"(runs: {', '.join(f'{r:.2f}' for r in ratio)}); CPU ratio median {statistics.median(cpu_ratio):.2f}; "
          f"target <= {TARGET}: {assess_bench.verdict(ok)}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="bounded,t3", help="comma list of panel shapes: bounded, t3 (= heavy), normal")
    ap.add_argument("--individuals", type=int, default=100_000)
    ap.add_argument("--databases", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3, help="pairs of runs per panel")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds after which one run is killed (a failure)")
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--empdp", default=None, help="the empdp executable (default: the installed one)")
    opt = ap.parse_args()
    exe = assess_bench.find_empdp(opt.empdp)
    assess_bench.EMPDP = exe
    assess_bench.machine()
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    ok = True
    for shape in opt.shapes.split(","):
        shape = assess_bench.ALIASES.get(shape.strip(), shape.strip())
        path = assess_bench.panel_path(opt.data_dir, opt.individuals, opt.databases, shape)
        assess_bench.prepare(path, opt.individuals, opt.databases, shape)
        ok &= bench_shape(exe, path, opt.runs, opt.timeout)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
