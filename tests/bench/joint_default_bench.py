"""Benchmark of the joint default command (issue 19, item 7). Prints its figures; not a timed test.

    python tests/bench/joint_default_bench.py --rows 1e7 --runs 3             # both shapes, d = 2 and 3
    python tests/bench/joint_default_bench.py --rows 1e7 --generate-only      # only write the panels

The command: ``empdp assess FILE --id id --by db --query "mean(x)" --query "mean(y)" [--query "mean(z)"] -q``
(no --epsilon, no --bandwidth: the whitened joint model and the default 50-level sweep over
[ε_all/20, 1.25 ε_all]; ``--json`` is added only to read the summary). Each run is a fresh process of
the installed ``empdp`` executable, paired with a baseline run just before it: DuckDB's ``GROUP BY
db, id`` of the same file (the query alone, as in ``assess_bench.py``). Targets (issue 19): the
median of the paired ratios ≤ 10× for d = 2 and ≤ 30× for d = 3. Peak RSS as in ``assess_bench.py``.
A run slower than --timeout seconds (default 1800) is killed and counted as failing: the exact d = 3
evaluation costs seconds per individual at risk (n = 100), and the bounded panel puts every
individual at risk at the sweep's low end.

Panels (written once under --data-dir, one row per individual and database; e1, e2, e3 independent
N(0, 1) per row):
  t3       x = μ_i + e1, y = ν_i + 0.6 e1 + 0.8 e2, z = ρ_i + e3, effects 10 · Student-t(3): a few
           individuals far out
  bounded  x = 50 + 10 e1 + u_i, y = 20 + 5 (0.6 e1 + 0.8 e2) + v_i, z = 10 + 3 e3 + w_i, effects
           uniform on [0, 20): nearly everyone at risk at the sweep's low end
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import assess_bench  # noqa: E402  (the process runner, baseline and RSS sampling of the one-statistic bench)

SHAPES = {
    "t3": "x = mu_i + e1, y = nu_i + 0.6 e1 + 0.8 e2, z = rho_i + e3; effects 10 t(3)",
    "bounded": "x = 50 + 10 e1 + u_i, y = 20 + 5 (0.6 e1 + 0.8 e2) + v_i, z = 10 + 3 e3 + w_i; effects U[0, 20)",
}
SCHEMA = pa.schema([("db", pa.int16()), ("id", pa.int32()), ("x", pa.float64()), ("y", pa.float64()),
                    ("z", pa.float64())])
TARGET = {2: 10.0, 3: 30.0}


def panel_path(data_dir: str, n_ind: int, n_db: int, shape: str) -> Path:
    return Path(data_dir) / f"joint_{shape}_{n_ind}x{n_db}.parquet"


def make_panel(path: Path, n_ind: int, n_db: int, shape: str, seed: int = 1) -> bool:
    """Write the panel unless it exists (True if written), one database per row group."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, n_ind, n_db, list(SHAPES).index(shape)])
    if shape == "t3":
        eff = 10 * rng.standard_t(3, size=(3, n_ind))
        base, sd = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    else:
        eff = rng.uniform(0.0, 20.0, size=(3, n_ind))
        base, sd = (50.0, 20.0, 10.0), (10.0, 5.0, 3.0)
    tmp = path.with_name(path.name + ".tmp")
    ids = np.arange(n_ind, dtype=np.int32)
    with pq.ParquetWriter(tmp, SCHEMA, compression="snappy") as writer:
        for j in range(n_db):
            e1, e2, e3 = rng.standard_normal((3, n_ind))
            cols = [base[0] + sd[0] * e1 + eff[0], base[1] + sd[1] * (0.6 * e1 + 0.8 * e2) + eff[1],
                    base[2] + sd[2] * e3 + eff[2]]
            writer.write_table(pa.table({"db": np.full(n_ind, j, dtype=np.int16), "id": ids, "x": cols[0],
                                         "y": cols[1], "z": cols[2]}, schema=SCHEMA))
    os.replace(tmp, path)
    return True


def command(path: Path, d: int) -> list[str]:
    return [str(path), "--id", "id", "--by", "db", *[a for c in "xyz"[:d] for a in ("--query", f"mean({c})")],
            "-q"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1e7")
    ap.add_argument("--databases", type=int, default=100)
    ap.add_argument("--shapes", default="t3,bounded")
    ap.add_argument("--dims", default="2,3")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds after which an empdp run is killed and reported as slower than that")
    ap.add_argument("--empdp", default=None, help="the empdp executable (default: the installed one)")
    opt = ap.parse_args()
    n_db = opt.databases
    n_ind = max(1, int(float(opt.rows)) // n_db)
    shapes = opt.shapes.split(",")
    paths = {}
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"unknown shape {s!r}: choose among {', '.join(SHAPES)}")
        paths[s] = panel_path(opt.data_dir, n_ind, n_db, s)
        t = time.perf_counter()
        made = make_panel(paths[s], n_ind, n_db, s)
        print(f"data: {paths[s]} ({n_ind:,} × {n_db} = {n_ind * n_db:,} rows, "
              f"{'written in %.0f s' % (time.perf_counter() - t) if made else 'reused'}); {SHAPES[s]}", flush=True)
    if opt.generate_only:
        return 0
    assess_bench.EMPDP = assess_bench.find_empdp(opt.empdp)
    assess_bench.machine()
    print(f"load average before: {os.getloadavg()}")
    failed, table = 0, []
    for s in shapes:
        for d in [int(k) for k in opt.dims.split(",")]:
            cmd = command(paths[s], d)
            print(f"\n== {s}, d = {d}: empdp assess {' '.join(cmd)}", flush=True)
            walls, bases, rsss, summary = [], [], [], None
            for r in range(opt.runs):
                bases.append(assess_bench.baseline(paths[s]))
                w, rss, summary = assess_bench.run_empdp(cmd, opt.timeout)
                walls.append(w), rsss.append(rss)
                print(f"   run {r + 1}: baseline {bases[-1]:.2f} s, empdp {'>' if summary is None else ''}{w:.2f} s = "
                      f"{w / bases[-1]:.2f}×, peak RSS {rss:.2f} GB, load {os.getloadavg()[0]:.2f}", flush=True)
                if summary is None:
                    break
            paired = statistics.median(w / b for w, b in zip(walls, bases))
            med, b_med = statistics.median(walls), statistics.median(bases)
            ok = summary is not None and paired <= TARGET[d]
            failed += not ok
            if summary is None:
                print(f"   FAIL  killed after {opt.timeout:.0f} s (> {opt.timeout / b_med:.0f}× the baseline)")
                table.append((s, d, med, b_med, paired, max(rsss), -1, -1))
                continue
            low = summary["sweep"][0]
            print(f"   eps_all {summary['eps_all']:.4g}; {low['n_at_risk']:,} of {summary['n_individuals']:,} at "
                  f"risk at eps = {low['epsilon']:.4g}")
            print(f"   {assess_bench.verdict(ok)}  median {med:.2f} s over median baseline {b_med:.2f} s; median of "
                  f"paired ratios {paired:.2f}× ≤ {TARGET[d]:g}×; peak RSS {max(rsss):.2f} GB")
            table.append((s, d, med, b_med, paired, max(rsss), low["n_at_risk"], summary["n_individuals"]))
    print(f"\nsummary ({n_ind:,} × {n_db} rows; median of {opt.runs}; load average after {os.getloadavg()}):")
    print("   shape    d  empdp s  baseline s  paired ratio  target  peak GB  at risk (low end)")
    for s, d, med, b_med, paired, rss, risk, n in table:
        at_risk = f"{risk:,}/{n:,}" if n >= 0 else "killed"
        print(f"   {s:8s} {d} {med:8.2f} {b_med:11.2f} {paired:12.2f}× {TARGET[d]:6g}× {rss:8.2f}  {at_risk}")
    print("all targets PASS" if not failed else f"{failed} target(s) FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
