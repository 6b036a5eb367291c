"""Validation of the (ε, δ) audit on the Gaussian mechanism against its exact ε(δ) (docs/method.md#9-audits).

The Gaussian mechanism (sensitivity 1) with σ ∈ {0.5, 1, 2} at δ ∈ {1e-3, 1e-5}, its default
pairs, ``seeds`` seeds each within a time budget per audit: coverage of the exact ε(δ) (share of
seeds with bound ≤ truth; target ≥ 0.9) and tightness (median bound / truth; target ≥ 0.8).

    python tests/bench/approx_validation.py [--budget 10] [--seeds 20] [--alpha 0.05] [--json out.json]

It takes about budget × seeds × 6 × 0.7 (15 minutes at --budget 10).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from empdp.audit import approx
from empdp.audit.truth import gaussian_epsilon_delta

SIGMAS = (0.5, 1.0, 2.0)
DELTAS = (1e-3, 1e-5)
#: targets of issue 36, item 6
COVERAGE, TIGHTNESS = 0.9, 0.8


def run_case(sigma: float, delta: float, budget: float, seeds: int, alpha: float) -> dict:
    truth = gaussian_epsilon_delta(delta, 1.0, sigma)
    bounds, times, sizes = [], [], []
    for seed in range(seeds):
        t0 = time.perf_counter()
        res = approx("gaussian", delta=delta, params={"sigma": sigma}, alpha=alpha, rng=seed, time_budget=budget)
        times.append(time.perf_counter() - t0)
        bounds.append(res.lower_bound)
        sizes.append(res.final_size)
        assert abs(res.true_value - truth) < 1e-9
    ratios = [b / truth for b in bounds]
    return {"sigma": sigma, "delta": delta, "true": truth, "median_bound": statistics.median(bounds),
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "coverage": sum(b <= truth for b in bounds) / seeds, "median_N": statistics.median(sizes),
            "median_seconds": statistics.median(times), "bounds": bounds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=10.0, help="time budget per audit, seconds")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    print(f"(eps, delta) audit, Gaussian mechanism (sensitivity 1), {args.seeds} seeds, alpha = {args.alpha}, "
          f"--time-budget {args.budget:g} s per audit")
    head = (f"{'sigma':>5} {'delta':>6} {'true eps':>8} {'median LB':>9} {'LB/true':>7} {'min':>5} {'max':>5} "
            f"{'coverage':>8} {'median N':>9} {'s/audit':>7}  targets")
    print(head)
    rows, ok = [], True
    for sigma in SIGMAS:
        for delta in DELTAS:
            r = run_case(sigma, delta, args.budget, args.seeds, args.alpha)
            rows.append(r)
            good = r["coverage"] >= COVERAGE and r["median_ratio"] >= TIGHTNESS
            ok &= good
            print(f"{sigma:>5g} {delta:>6.0e} {r['true']:>8.4f} {r['median_bound']:>9.4f} {r['median_ratio']:>7.3f} "
                  f"{r['min_ratio']:>5.2f} {r['max_ratio']:>5.2f} {r['coverage']:>8.2f} {r['median_N']:>9.3g} "
                  f"{r['median_seconds']:>7.1f}  {'met' if good else 'NOT MET'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
