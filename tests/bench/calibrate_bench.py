"""Benchmark of calibrate (issue 3 acceptance): synthetic 10^4 individuals × 41 databases, and the sample data.

Prints, as the median of ``--repeat`` runs: calibration time (end to end from
the Parquet source, and the numerical core alone), λ* vs λ_hausdorff vs
λ_winf, and the expected |noise| of the calibrated noise vs plain Laplace(λ*).

    python tests/bench/calibrate_bench.py [--repeat 3] [--epsilon 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import polars as pl

from empdp.loo import leave_one_out
from empdp.noise import calibrate, calibrate_values
from empdp.settings import Model

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "countymurders.parquet"


def synthetic(path: Path, individuals=10_000, databases=41, seed=0) -> None:
    """Household-style panel: each individual present in a database with prob. 0.8, heavy-tailed values."""
    rng = np.random.default_rng(seed)
    level = rng.lognormal(3.0, 1.0, size=individuals)  # persistent individual level
    ids, dbs, xs = [], [], []
    for j in range(databases):
        present = np.flatnonzero(rng.random(individuals) < 0.8)
        ids.append(present)
        dbs.append(np.full(present.size, 2000 + j))
        xs.append(level[present] * rng.lognormal(0.0, 0.3, size=present.size))
    pl.DataFrame({"hh": np.concatenate(ids), "year": np.concatenate(dbs), "kwh": np.concatenate(xs)}
                 ).write_parquet(path)


def bench(name, source, id, by, query, epsilon, kernel, repeat):
    loo = leave_one_out(source, id=id, by=by, query=query)
    total, core, cal = [], [], None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeat):
            t = time.perf_counter()
            cal = calibrate(source, id=id, by=by, query=query, epsilon=epsilon, model=Model(kernel=kernel))
            total.append(time.perf_counter() - t)
            t = time.perf_counter()
            calibrate_values(loo.q, loo.shifts, epsilon=epsilon, kernel=kernel, undefined=loo.undefined)
            core.append(time.perf_counter() - t)
    print(f"\n== {name}: {cal.n_individuals} individuals x {cal.n_databases} databases, {query}, "
          f"epsilon {epsilon}, kernel {kernel} -> {cal.curator_kernel['kind']} "
          f"(scale {cal.curator_kernel['scale']:.4g})")
    print(f"  calibration time, median of {repeat}: {statistics.median(total):.2f} s end to end, "
          f"{statistics.median(core):.2f} s numerical core")
    print(f"  lambda* {cal.lam:.5g} | lambda_hausdorff {cal.lam_hausdorff:.5g} (x{cal.lam_hausdorff / cal.lam:.2f}) "
          f"| lambda_winf {cal.lam_winf:.5g} (x{cal.lam_winf / cal.lam:.2f}); "
          f"{cal.n_bisected} individuals evaluated in the search")
    n = cal.noise
    print(f"  noise {n['kind']} (w={n['weight_zero']:.4g}, scale {n['scale']:.5g}): E|noise| "
          f"{cal.expected_abs_noise:.5g} vs plain Laplace(lambda*) {cal.lam:.5g} "
          f"({cal.expected_abs_noise / cal.lam:.1%}); verified max eps_i {cal.verified_eps_max:.6g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=0.5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.parquet"
        synthetic(path)
        for kernel in ("laplace", "auto"):
            bench("synthetic", str(path), "hh", "year", "mean(kwh)", args.epsilon, kernel, args.repeat)
    for kernel in ("laplace", "auto"):
        for eps in (args.epsilon, 0.1):
            bench("sample data", str(SAMPLE), "countyid", "year", "mean(murdrate)", eps, kernel, args.repeat)


if __name__ == "__main__":
    main()
