"""Per-individual time of the joint risk core (d = 2, 3) on synthetic data: prints, not a test.

    python tests/bench/joint_bench.py [--individuals 10000] [--databases 100] [--rows 64]

Times ε_i alone (the ε_all search) and ε_i with δ_i over the default 50-level sweep, on ``--rows``
individuals of a panel of sum(x) and sum(x·z) (d = 2) and count-weighted third statistic (d = 3);
and the default command's core as :func:`empdp.assessment.joint.assess_joint` runs it (the ε_all search
in decreasing M_i, then δ_i for the rows with M_i > ε_min, riskiest bound first; levels where δ* is
already 1.0 only for rows that can exceed the largest δ_i) over ``--sweep`` individuals (d = 2).
Single-threaded BLAS; the median of 3 runs. The whole command at 10^7 rows: ``joint_default_bench.py``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from empdp.risk.joint import joint_risk, select_joint_model


def panel(individuals: int, databases: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 1.0, size=(individuals, databases))
    cols = [x, x * rng.normal(size=x.shape), x * rng.uniform(size=x.shape)][:d]
    S = np.stack(cols, axis=-1)  # Δ_ij of sums: the individual's own values
    return S.sum(axis=0), S


def timed(f, runs: int = 3) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return float(np.median(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--individuals", type=int, default=10_000)
    ap.add_argument("--databases", type=int, default=100)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--sweep", type=int, default=512)
    args = ap.parse_args()
    with threadpool_limits(limits=1, user_api="blas"):
        for d in args.dims:
            q, S = panel(args.individuals, args.databases, d)
            model = select_joint_model(q)
            rows = S[:args.rows if d == 2 else max(1, args.rows // 16)]
            e, _ = joint_risk(model, rows)
            eps = np.geomspace(e.max() / 20, e.max() * 1.25, 50)
            t_eps = timed(lambda: joint_risk(model, rows)) / len(rows)
            runs = 3 if d == 2 else 1
            t_delta = timed(lambda: joint_risk(model, rows[:8], eps), runs) / min(8, len(rows))
            t_few = timed(lambda: joint_risk(model, rows[:8], eps[[0, 24, 49]]), runs) / min(8, len(rows))
            print(f"d = {d}, n = {args.databases} databases: eps_i {t_eps * 1e3:8.2f} ms/individual; "
                  f"eps_i + delta_i at 3 eps {t_few * 1e3:8.1f} ms; at 50 eps {t_delta * 1e3:8.1f} ms")
            if d == 2 and args.sweep:
                sweep(model, S[:args.sweep])


def sweep(model, S) -> None:
    """The default command's core on ``len(S)`` individuals: the ε_all search, then the certified sweep
    of the rows with M_i > ε_min (one thread, as the rest of this bench)."""
    from empdp.assessment.evaluation import default_epsilons
    from empdp.assessment.joint_evaluation import Certified, Part, search_eps_all
    from empdp.risk.joint import joint_bound

    bound = joint_bound(model, S)
    rows = np.arange(len(S))
    t = time.perf_counter()
    e, eps_all = search_eps_all(model, S, rows, bound, 1)
    t_eps = time.perf_counter() - t
    eps = default_epsilons(eps_all)
    t = time.perf_counter()
    cert = Certified([Part(model, S, bound, e)], eps)
    t_sweep = time.perf_counter() - t
    print(f"    default command's core over {len(S)} individuals: eps_all search {t_eps:.2f} s "
          f"({np.isfinite(e).sum()} evaluated), certified sweep {t_sweep:.2f} s: {int(cert.live.sum())} with "
          f"M_i > eps_min, {int(cert.refined.sum())} made exact")


if __name__ == "__main__":
    main()
