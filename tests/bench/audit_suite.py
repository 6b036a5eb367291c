"""DP-Sniper's benchmark side by side: MPL on its 20 mechanisms (docs/method.md#93-reference-mechanisms).

Each mechanism with DP-Sniper's parameters and input pairs (``DPSNIPER_SUITE``), every one
claimed 0.1-DP; MPL at 90% confidence (alpha = 0.1) with a time budget per run (default 20 s),
the median bound of 3 seeds, beside DP-Sniper's 90% bounds (Bichsel et al. 2021, reference
results of ``eth-sri/dp-sniper``, logistic regression / MLP, times on their machine) and the exact
ε over the pairs. The exact values are computed (and cached) before the timed runs; times are the
median and the largest over the seeds, from the call (the command line also counts its start-up).

    python tests/bench/audit_suite.py [--budget 20] [--seeds 3] [--only svt6,rappor] [--json out.json]

It takes about budget × seeds × 20 (20 minutes at the defaults).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from empdp.audit.mechanisms import DPSNIPER_SUITE, dpsniper_mechanism
from empdp.audit.mpl import mpl

#: DP-Sniper's 90% lower bounds (logistic regression, MLP) and times in seconds (logistic, MLP)
DPSNIPER = {
    "laplace": (0.097, 0.098, 21, 217), "truncated_geometric": (0.116, 0.116, 19, 162),
    "noisy_hist1": (0.098, 0.098, 38, 211), "noisy_hist2": (4.602, 4.601, 41, 254),
    "report_noisy_max1": (0.092, 0.093, 62, 492), "report_noisy_max2": (0.098, 0.098, 58, 423),
    "report_noisy_max3": (0.248, 0.249, 62, 437), "report_noisy_max4": (0.346, 0.353, 63, 451),
    "svt1": (0.086, 0.086, 126, 966), "svt2": (0.086, 0.085, 160, 825), "svt3": (0.172, 0.182, 160, 880),
    "svt4": (0.169, 0.170, 130, 815), "svt5": (1.761, 1.761, 59, 527), "svt6": (0.272, 0.270, 96, 584),
    "rappor": (0.293, 0.301, 145, 529), "one_time_rappor": (0.598, 0.600, 89, 408),
    "laplace_parallel": (0.035, 0.030, 104, 341), "svt34_parallel": (0.261, 0.262, 364, 1117),
    "prefix_sum": (0.504, 0.577, 97, 984), "numerical_svt": (0.034, 0.035, 152, 686),
}


def run_one(name: str, budget: float, seeds: int, alpha: float) -> dict:
    mech, pairs = dpsniper_mechanism(name)
    exact = mech.true_epsilon_over(pairs)  # cached: not part of the timed audits
    bounds, times, sizes = [], [], []
    for seed in range(seeds):
        t0 = time.perf_counter()
        res = mpl(mech, pairs, alpha=alpha, time_budget=budget, rng=seed)
        times.append(time.perf_counter() - t0)
        bounds.append(res.lower_bound)
        sizes.append((res.search_size, res.final_size))
    return {"name": name, "ours": statistics.median(bounds), "bounds": bounds, "seconds": statistics.median(times),
            "max_seconds": max(times), "times": times,
            "sizes": sizes, "exact_pairs": exact, "exact_mechanism": mech.epsilon,
            "dpsniper": max(DPSNIPER[name][:2])}


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    return "inf" if math.isinf(v) else f"{v:.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--only", default=None, help="comma-separated names")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(DPSNIPER_SUITE)
    print(f"MPL, alpha = {args.alpha}, budget {args.budget:g} s per run, median of {args.seeds} seeds")
    print(f"{'mechanism':20s} {'ours':>8s} {'DP-Sniper':>9s} {'exact(pairs)':>12s} {'exact(mech)':>11s} "
          f"{'s (ours)':>8s} {'max s':>6s} {'s (DPS)':>7s}  beats")
    rows, wins = [], 0
    for name in names:
        row = run_one(name, args.budget, args.seeds, args.alpha)
        rows.append(row)
        win = row["ours"] >= row["dpsniper"]
        wins += win
        print(f"{name:20s} {_fmt(row['ours']):>8s} {row['dpsniper']:9.3f} {_fmt(row['exact_pairs']):>12s} "
              f"{_fmt(row['exact_mechanism']):>11s} {row['seconds']:8.1f} {row['max_seconds']:6.1f} {DPSNIPER[name][2]:7d}  "
              f"{'yes' if win else 'no'}", flush=True)
    print(f"ours >= DP-Sniper's better bound on {wins} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
