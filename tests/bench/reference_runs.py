"""Fixed-scale reference runs on the sample data: every number they print, in one JSON (issue 34).

A refactor that must not change results is checked by running this script on the commit before it
and on the commit after it, then comparing the two files::

    git worktree add /tmp/ref OLD
    cd /tmp/ref && PYTHONPATH=/tmp/ref python /work/main/tests/bench/reference_runs.py --out /tmp/old.json
    cd /work/main && python tests/bench/reference_runs.py --out /tmp/new.json --compare /tmp/old.json

The runs go through the command line of the tree that provides the ``empdp`` package imported
here (``PYTHONPATH`` decides which), each in a fresh interpreter: assess one statistic with a
Laplace and a Gaussian kernel (summary, sweep, riskiest rows and the ``--out`` table) and with
variable Laplace bandwidths (the general path, on a grid), joint
statistics, an adversary, grouped statistics, calibrate with both kernels, release with a seed
and ``audit release`` with a seed. Two synthetic panels with many databases, made here from a fixed
seed (:func:`write_panel`), reach the paths whose cost grows with the number of databases n
(issue 35): 5 individuals × 10^4 databases (the default command, its ``--out`` table and a
calibration) and 5 × 2,000 (variable Laplace bandwidths, and a Gaussian kernel of one and of
variable bandwidths, all chosen by leave-one-out likelihood). Options that a tree does not know yet (e.g. ``--budget``) are
dropped and the run retried, so one script serves every commit of the issue.

``--compare OLD.json`` prints every number that differs (its absolute and relative difference),
every value present on one side only and every other differing value, and exits 1 if a number
differs by more than ``--rtol`` (default 0: bit-identical).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

#: a fixed curator key for the release's ledger and the calibration signatures (32 characters)
KEY = "reference-runs-curator-key-01234"
SOURCE = ["--id", "countyid", "--by", "year"]
#: the synthetic panels' columns and the statistic asked of them
PANEL = ["--id", "id", "--by", "db", "--query", "mean(x)"]
#: synthetic panel name -> (individuals, databases)
PANELS = {"long": (5, 10_000), "mid": (5, 2_000)}
ONE = [*SOURCE, "--query", "mean(murdrate)"]
#: outputs of an assessment kept besides its JSON: the --out table, the saved result (its riskiest rows)
BOTH = ("out", "saved")
#: run name -> (command line, files it also writes); calibrations are written to cal_<kind>.json
RUNS = {
    "assess_laplace": (["assess", "{data}", *ONE, "--kernel", "laplace", "--bandwidth", "0.05"], BOTH),
    "assess_gaussian": (["assess", "{data}", *ONE, "--kernel", "gaussian", "--bandwidth", "0.05"], BOTH),
    "assess_variable": (["assess", "{data}", *ONE, "--kernel", "laplace", "--bandwidth", "variable"], ("out",)),
    "assess_joint": (["assess", "{data}", *SOURCE, "--query", "mean(murdrate)", "--query", "sum(murders)",
                      "--bandwidth", "0.05,1000"], BOTH),
    "assess_adversary": (["assess", "{data}", *ONE, "--kernel", "laplace", "--bandwidth", "0.05",
                          "--adversary", "sum(popul)"], BOTH),
    "assess_grouped": (["assess", "{data}", *ONE, "--where", "statefips <= 6", "--group-by", "statefips",
                        "--bandwidth", "0.1"], ("out",)),
    "calibrate_laplace": (["calibrate", "{data}", *ONE, "-e", "0.5", "--kernel", "laplace", "--bandwidth", "0.05",
                           "-o", "{tmp}/cal_laplace.json"], ()),
    "calibrate_gaussian": (["calibrate", "{data}", *ONE, "-e", "0.5", "--kernel", "gaussian", "--bandwidth", "0.05",
                            "-o", "{tmp}/cal_gaussian.json"], ()),
    "release": (["release", "{tmp}/cal_laplace.json", "--value", "1", "--seed", "3", "--budget", "unlimited",
                 "--ledger", "{tmp}/ledger.sqlite"], ()),
    "audit_release": (["audit", "release", "{tmp}/cal_laplace.json", "{data}", "--seed", "1", "--top", "2"], ()),
    "long_default": (["assess", "{long}", *PANEL], ("out",)),
    "long_calibrate": (["calibrate", "{long}", *PANEL, "-e", "1", "-o", "{tmp}/cal_long.json"], ()),
    "mid_variable": (["assess", "{mid}", *PANEL, "--kernel", "laplace", "--bandwidth", "variable"], ("out",)),
    "mid_gaussian": (["assess", "{mid}", *PANEL, "--kernel", "gaussian"], ("out",)),
    "mid_gaussian_variable": (["assess", "{mid}", *PANEL, "--kernel", "gaussian", "--bandwidth", "variable"],
                              ("out",)),
}
#: calibrations kept whole: cal_<name>.json
CALIBRATIONS = ("laplace", "gaussian", "long")
#: options some commits do not have, or not with these values: dropped (with their value) when an
#: error names them
OPTIONAL = {"--budget": 1}
#: fields that differ between runs of the same numbers (times, paths, ledger chain and digests)
VOLATILE = ("elapsed", "seconds", "time", "path", "file", "created", "head", "hash", "mac", "digest", "source",
            "ledger", "signature", "version", "tree")

#: runs the ``empdp`` command of the tree at ROOT, whatever an editable install maps ``empdp.cli`` to
BOOT = """import importlib.util, sys
root = sys.argv.pop(1)
spec = importlib.util.spec_from_file_location("empdp.cli", root + "/cli/__init__.py",
                                              submodule_search_locations=[root + "/cli"])
mod = importlib.util.module_from_spec(spec); sys.modules["empdp.cli"] = mod; spec.loader.exec_module(mod)
from empdp.cli.main import main
sys.argv[0] = "empdp"; main()
"""


def tree_root() -> Path:
    """The tree whose ``empdp`` package this interpreter imports (``PYTHONPATH`` first)."""
    import empdp

    return Path(empdp.__file__).resolve().parents[1]


def empdp_cmd(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``empdp ARGS --json`` of the tree at ``root`` in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(root), EMPDP_KEY=KEY, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", BOOT, str(root), *args, "--json"], env=env,
                          capture_output=True, text=True, cwd=root)


def without(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` and its value."""
    at = args.index(option)
    return args[:at] + args[at + 1 + OPTIONAL[option]:]


def run_one(root: Path, args: list[str]) -> dict:
    """The JSON a command prints; options the tree refuses are dropped and the run retried."""
    res = empdp_cmd(root, args)
    for option in OPTIONAL:
        if res.returncode == 2 and option in args and option in res.stderr + res.stdout:
            args = without(args, option)
            res = empdp_cmd(root, args)
    if res.returncode != 0:
        raise SystemExit(f"empdp {' '.join(args)} failed ({res.returncode}):\n{res.stderr}{res.stdout}")
    return json.loads(res.stdout)


def table(path: Path) -> dict:
    """The ``--out`` table as columns of plain values, rows in id order."""
    frame = pl.read_parquet(path)
    frame = frame.sort(frame.columns[0])
    return {c: frame[c].to_list() for c in frame.columns}


def write_panel(path: Path, n_ind: int, n_db: int) -> str:
    """A synthetic panel (columns id, db, x), the same on every run: x = 50 + 10 z + u_i + t_j
    with z standard normal, a bounded individual effect u_i on [0, 20) and a slow seasonal
    swing t_j, so the statistic's density and the trend checks have something to find."""
    rng = np.random.default_rng([35, n_ind, n_db])
    effect = rng.uniform(0.0, 20.0, n_ind)
    season = 3.0 * np.sin(2 * np.pi * np.arange(n_db) / 365.25)
    x = 50.0 + 10.0 * rng.standard_normal((n_db, n_ind)) + effect[None, :] + season[:, None]
    pl.DataFrame({"id": np.tile(np.arange(n_ind, dtype=np.int32), n_db),
                  "db": np.repeat(np.arange(n_db, dtype=np.int32), n_ind),
                  "x": x.ravel()}).write_parquet(path)
    return str(path)


def reference(root: Path) -> dict:
    """Every run's JSON (and ``--out`` table) of the tree at ``root``."""
    data = str(root / "sample_data" / "countymurders.parquet")
    out = {"tree": str(root)}
    with tempfile.TemporaryDirectory() as tmp:
        panels = {name: write_panel(Path(tmp) / f"{name}.parquet", *shape) for name, shape in PANELS.items()}
        for name, (template, files) in RUNS.items():
            args = [a.format(data=data, tmp=tmp, **panels) for a in template]
            args += ["--out", f"{tmp}/{name}.parquet"] if "out" in files else []
            args += ["--save-result", f"{tmp}/{name}.json"] if "saved" in files else []
            print(f"{name}: empdp {' '.join(args[:3])} ...", file=sys.stderr, flush=True)
            out[name] = run_one(root, args)
            if "out" in files:
                out[name + ".out"] = table(Path(f"{tmp}/{name}.parquet"))
            if "saved" in files:
                out[name + ".saved"] = json.loads(Path(f"{tmp}/{name}.json").read_text())
        for kind in CALIBRATIONS:
            out[f"calibration_{kind}"] = json.loads(Path(f"{tmp}/cal_{kind}.json").read_text())
    return out


def flatten(value, prefix: str = "") -> dict:
    """``{dotted.path: leaf}`` of a JSON value."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{prefix}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{prefix}[{i}]").items()}
    return {prefix: value}


def volatile(path: str) -> bool:
    """Whether a field is one that changes between runs of the same numbers."""
    last = path.rsplit(".", 1)[-1].split("[")[0].lower()
    return any(word in last for word in VOLATILE)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def compare(new: dict, old: dict, rtol: float) -> int:
    """Print the differences between two reference files; 1 if a number differs beyond ``rtol``."""
    a, b = flatten(new), flatten(old)
    numbers = same = 0
    worst, failed = 0.0, False
    for path in sorted(set(a) | set(b)):
        if volatile(path):
            continue
        if path not in a or path not in b:
            print(f"only in {'new' if path in a else 'old'}: {path} = {a.get(path, b.get(path))!r}")
            continue
        x, y = a[path], b[path]
        if is_number(x) and is_number(y):
            numbers += 1
            if x == y or (math.isnan(x) and math.isnan(y)):
                same += 1
                continue
            diff = abs(x - y)
            rel = diff / max(abs(x), abs(y))
            worst = max(worst, rel)
            failed |= rel > rtol
            print(f"differs: {path}: new {x!r} old {y!r} (abs {diff:.3g}, rel {rel:.3g})")
        elif x != y:
            print(f"differs: {path}: new {x!r} old {y!r}")
    print(f"{numbers} numbers compared, {same} bit-identical, largest relative difference {worst:.3g}")
    return int(failed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write the reference numbers to")
    ap.add_argument("--compare", metavar="OLD.json", help="report every number that differs from this file")
    ap.add_argument("--rtol", type=float, default=0.0, help="relative difference allowed (default: none)")
    args = ap.parse_args()
    ref = reference(tree_root())
    Path(args.out).write_text(json.dumps(ref, indent=1, sort_keys=True))
    if args.compare:
        return compare(ref, json.loads(Path(args.compare).read_text()), args.rtol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
