"""MPL with and without one of stage 1's closing steps (docs/audit.md), run by run on the same seeds.

The refit ("Vector outputs") counts the selected pair's table scores on 4 x n fresh outputs per database
and chooses the event on 2 x n more; the duel ("Stage 1's duel") counts its entrants' events (the finalist
pairs' and the refit's, and a score event's rungs) on up to 5 x n fresh outputs of each pair and chooses
the best. Both pay with stage 2's outputs. This prints, per
mechanism of DP-Sniper's suite, the median bound over the seeds with the step and without it (switched
off), each run with the same time budget, seed after seed alternating so that the machine's load falls
on both alike.

    python tests/bench/closing_ab.py [--step refit|duel] [--budget 20] [--seeds 5]
        [--only svt3,svt34_parallel] [--json out.json]

It takes about 2 x budget x seeds per mechanism (7 minutes for two mechanisms at the defaults).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics

from empdp.audit.mechanisms import dpsniper_mechanism
from empdp.audit.mpl import mpl

mpl_mod = importlib.import_module("empdp.audit.mpl")


#: each step's switch: whether it applies (switched off: never)
SWITCHES = {"refit": "_refits", "duel": "_duels"}


def run_one(name: str, step: str, budget: float, seeds: int, alpha: float) -> dict:
    mech, pairs = dpsniper_mechanism(name)
    mech.true_epsilon_over(pairs)  # cached: not part of the timed audits
    switch = SWITCHES[step]
    applies = getattr(mpl_mod, switch)
    rows = {"with": [], "without": []}
    for seed in range(1, seeds + 1):
        for mode in ("with", "without"):
            setattr(mpl_mod, switch, applies if mode == "with" else (lambda *_: False))
            try:
                res = mpl(mech, pairs, alpha=alpha, time_budget=budget, rng=seed)
            finally:
                setattr(mpl_mod, switch, applies)
            rows[mode].append({"bound": res.lower_bound, "pair": res.pair_index, "search_size": res.search_size,
                               "final_size": res.final_size, "score": (res.event_rule or {}).get("score")})
    return {"name": name, **{f"median_{m}": statistics.median(r["bound"] for r in rows[m]) for m in rows},
            "runs": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=sorted(SWITCHES), default="refit")
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--only", default="svt3,svt34_parallel", help="comma-separated names")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    print(f"MPL, alpha = {args.alpha}, budget {args.budget:g} s per run, seeds 1-{args.seeds}")
    print(f"{'mechanism':20s} {'with ' + args.step:>10s} {'without':>8s}  bounds with / without")
    out = []
    for name in args.only.split(","):
        row = run_one(name, args.step, args.budget, args.seeds, args.alpha)
        out.append(row)
        bounds = ["/".join(f"{r['bound']:.4f}" for r in pair) for pair in zip(*row["runs"].values())]
        print(f"{name:20s} {row['median_with']:10.4f} {row['median_without']:8.4f}  {' '.join(bounds)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
