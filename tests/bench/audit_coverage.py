"""Coverage of MPL's lower bound on DP-Sniper's mechanisms: how often it stays at or below the true ε.

Eight of the 20 mechanisms (``DPSNIPER_SUITE``, every one claimed 0.1-DP), five with vector outputs
(``svt6``'s answers, ``prefix_sum``'s 10 noisy prefix sums, ``noisy_hist1``'s 5 noisy bins,
``laplace_parallel``'s 20 Laplace copies, ``rappor``'s 20 bits; all audited through score events), each audited
over many seeds at 90% confidence (``--alpha 0.1``) under a time budget per run. The truth is the
exact ε over the audited pairs, the quantity MPL bounds (docs/method.md#93-reference-mechanisms);
the target is coverage ≥ 1 − α = 0.9 (issue 36, item 5). Each coverage is printed with its 90%
Clopper–Pearson interval: where the audit is tight (truncated_geometric, whose every output has the
loss ε, report_noisy_max2, and Laplace's half-lines) the bound sits at the truth and its coverage is
exactly 1 − α in the limit, so over 20 seeds the measured value falls below 0.9 a third of the time
(17 of 20 is P = 0.32 at a true 0.9); more seeds (``--only truncated_geometric --seeds 100``) narrow the
interval around it. At the stage-2 event a run selects, the bound's coverage is 0.8992-0.9006
(4·10^5 simulated stage-2 samples of truncated_geometric's events at N = 1.2-2·10^6): the 0.85 and
0.80 of earlier sessions, and report_noisy_max2's 0.85 where it had 1.00, are that coin, not a bias.

    python tests/bench/audit_coverage.py [--budget 5] [--seeds 20] [--only laplace,svt6] [--json out.json]

It takes about budget × seeds × 8 (14 minutes at the defaults).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from scipy.stats import beta

from empdp.audit.kde import as_samples
from empdp.audit.mechanisms import dpsniper_mechanism
from empdp.audit.mpl import mpl

#: scalar continuous, discrete, report noisy max, SVT with its answer counts, and vector outputs of every
#: kind the score events meet: prefix sums (dependent coordinates), noisy bins of which one differs,
#: exchangeable copies, bits (all with a finite exact ε)
MECHANISMS = ("laplace", "truncated_geometric", "report_noisy_max2", "svt6", "prefix_sum", "noisy_hist1",
              "laplace_parallel", "rappor")


def run_one(name: str, budget: float, seeds: int, alpha: float) -> dict:
    """``seeds`` audits of ``name`` (seeds 1000, 1001, ...: not the suite's) and how many cover the truth."""
    mech, pairs = dpsniper_mechanism(name)
    truth = mech.true_epsilon_over(pairs)  # cached: not part of the timed audits
    dim = as_samples(mech.sampler(pairs[0][0], 2, np.random.default_rng(0))).shape[1]
    bounds, times = [], []
    for seed in range(1000, 1000 + seeds):
        t0 = time.perf_counter()
        bounds.append(mpl(mech, pairs, alpha=alpha, time_budget=budget, rng=seed).lower_bound)
        times.append(time.perf_counter() - t0)
    covered = sum(b <= truth for b in bounds)
    return {"name": name, "dim": dim, "truth": truth, "bounds": bounds, "median": statistics.median(bounds),
            "min": min(bounds), "max": max(bounds), "coverage": covered / seeds,
            "interval": _clopper_pearson(covered, seeds), "seconds": statistics.median(times)}


def _clopper_pearson(k: int, n: int, level: float = 0.9) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval of a binomial proportion k / n."""
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=5.0)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--only", default=None, help="comma-separated names")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(MECHANISMS)
    print(f"MPL coverage, alpha = {args.alpha} (target >= {1 - args.alpha:g}), budget {args.budget:g} s per run, "
          f"{args.seeds} seeds")
    print(f"{'mechanism':20s} {'dim':>3s} {'true eps':>8s} {'median LB':>9s} {'min':>7s} {'max':>7s} "
          f"{'coverage':>8s} {'90% CI':>11s} {'s':>5s}")
    rows = []
    for name in names:
        row = run_one(name, args.budget, args.seeds, args.alpha)
        rows.append(row)
        print(f"{name:20s} {row['dim']:3d} {row['truth']:8.4f} {row['median']:9.4f} {row['min']:7.4f} "
              f"{row['max']:7.4f} {row['coverage']:8.2f} {row['interval'][0]:5.2f}-{row['interval'][1]:4.2f} "
              f"{row['seconds']:5.1f}", flush=True)
    print(f"coverage >= {1 - args.alpha:g} on {sum(r['coverage'] >= 1 - args.alpha for r in rows)} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
