"""``empdp audit``: black-box lower bounds on a mechanism's ε (MPL) and Rényi ε(α) (docs/method.md)."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import click

from empdp.audit.common import SIZE_KEYS, STAGE1_MAX, short
from empdp.audit.mechanisms import BUILTIN_NAMES
from empdp.errors import InputError
from empdp.io import read_json
from empdp.textfmt import fmt, terminal_safe

from ._common import (
    emit_json,
    engine_options,
    engine_settings,
    key_options,
    output_options,
    progress_bars,
    setup_logging,
)


def _is_patterns(value: str) -> bool:
    """Exactly 'patterns' or 'patterns:K' with K an integer; any other value is a file path."""
    name, sep, k = value.partition(":")
    if name != "patterns":
        return False
    if not sep:
        return True
    try:
        int(k)
    except ValueError:
        return False
    return True


def _pairs(value):
    """--pairs: a JSON file of [x, x_prime] pairs, or 'patterns' / 'patterns:K'."""
    if value is None or _is_patterns(value):
        return value
    if not value.strip():
        raise InputError("--pairs is empty; give a JSON file of [x, x_prime] pairs, or 'patterns' / 'patterns:K'")
    data = read_json(value, "pairs file", " (or use --pairs patterns, or patterns:K for K queries)")
    if not isinstance(data, list):
        raise InputError(f"pairs file {short(value, 80)} must hold a JSON list of [x, x_prime] pairs")
    return data


def _region(value):
    if value is None:
        return None
    try:
        lo, hi = (float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected LO,HI (two numbers), got {short(value, 80)}", param_hint="--region") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):  # lo == hi is an empty region
        raise click.BadParameter(f"expected finite LO < HI (LO strictly below HI), got {short(value, 80)}",
                                 param_hint="--region")
    if max(abs(lo), abs(hi)) > MAX_REGION:  # its width would overflow in the evaluation grid
        raise click.BadParameter(f"LO and HI must lie within ±{MAX_REGION:g}, got {short(value, 80)}; the region "
                                 f"is where the outputs are, in their units", param_hint="--region")
    return (lo, hi)


#: largest |LO|, |HI| of --region (a wider region overflows the evaluation grid)
MAX_REGION = 1e100

SEED = click.IntRange(min=0)  # NumPy seeds are non-negative

_seed_option = click.option("--seed", type=SEED, default=None,
                            help="Seed for reproducible runs (an integer ≥ 0). Default: none, fresh randomness "
                                 "each run.")


def _size(ctx, name: str, value, alias: str, old):
    """A sample size given by its name or by its old, hidden alias (--n, --N): not both, unless equal."""
    if old is None:
        return value
    if value is not None and value != old:
        raise InputError(f"--{name.replace('_', '-')} and its old name {alias} disagree ({value} vs {old}); "
                         "give one")
    return old


def _clock_start() -> float | None:
    """Where a time budget counts from: the process's start when this process is the ``empdp`` command,
    as ``time empdp audit mpl`` measures it (the interpreter's start and the imports took 1-2.6 s of a
    20 s budget that the plan never saw); None, the library's call, for in-process callers (tests,
    notebooks), whose process may be hours old."""
    from empdp.audit.budget import process_age

    if os.path.basename(sys.argv[0]) != "empdp":
        return None
    return time.perf_counter() - process_age()


#: default --time-budget, seconds
TIME_BUDGET = 20.0


def _budget(ctx, budget, *sizes):
    """The time budget, or None when sample sizes are given (they fix the run; giving both is an error)."""
    given = any(v is not None for v in sizes)
    explicit = ctx.get_parameter_source("time_budget").name != "DEFAULT"
    if given and explicit:
        raise InputError("give sample sizes (--search-size/--final-size/--selection-size/--search-steps/"
                         "--duel-size/--refit-size, --sample-size) or --time-budget, not both")
    return None if given else budget


_budget_option = click.option(
    "--time-budget", "time_budget", type=float, default=TIME_BUDGET, show_default=True, metavar="SECONDS",
    help="Choose the sample sizes so that the audit takes about this long (pilot runs time the "
         "mechanism on this machine; the chosen sizes are in the output and, given back as sizes with "
         "the same --seed, reproduce the result). Ignored when sizes are given.")


_threads_option = click.option(
    "--threads", type=int, default=None, metavar="N",
    help="Threads drawing outputs (default: every core for the built-ins and releases, one for your own "
         "sampler: give more only if it is thread-safe). The results do not depend on it.")


def _common_options(f):
    f = output_options(f)
    f = _threads_option(f)
    f = _seed_option(f)
    f = click.option("--alpha", type=float, default=0.05, show_default=True,
                     help="Error level: the bound holds with probability ≈ 1 − alpha.")(f)
    f = click.option("--pairs", default=None, metavar="FILE|patterns[:K]",
                     help="JSON file with a list of [x, x_prime] (numbers or lists), or 'patterns' "
                          "(StatDP input patterns; 'patterns:K' for K queries). Default: the built-in's pairs.")(f)
    f = click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                     help="Mechanism parameter, repeatable: epsilon (pure-DP built-ins), sigma (Gaussian "
                          "noise multiplier: the noise sd is sigma x sensitivity), q (subsampling rate), p "
                          "(keep probability of randomized response), sensitivity (default 1; default pairs "
                          "differ by it); DP-Sniper's mechanisms also c, threshold, queries, n, copies, hashes, "
                          "filter_size, f (README, audits).")(f)
    f = click.option("--mechanism", "-m", required=True, metavar="NAME|module:function",
                     help=f"Built-in ({', '.join(BUILTIN_NAMES)}) or a sampler f(database, size, rng) importable "
                          "from the working directory or PYTHONPATH.")(f)
    return f


def _run_bound(bound, title, mechanism, params, pairs, threads, options, as_json, quiet, verbose, debug,
               printer=None):
    """Run ``bound`` (mpl, renyi or approx) with progress bars (the library logs its stages), then print
    (``printer(d, title)``, default :func:`_print_result`)."""
    from empdp.audit.mechanisms import parse_params

    setup_logging(verbose, quiet, debug)
    with progress_bars(enabled=not as_json and not quiet) as progress:
        res = bound(mechanism, _pairs(pairs), params=parse_params(params), progress=progress, threads=threads,
                    **options)
    d = res.to_dict()
    if as_json:
        emit_json(d)
    elif not quiet:
        (printer or _print_result)(d, title)


#: the sizes besides SIZE_KEYS a run reports and takes back (``audit mpl``)
GIVEN_BACK = ("selection_size", "search_steps", "duel_size", "refit_size")


def _size_rows(d: dict) -> list[tuple[str, str]]:
    """One terminal row per sample size in ``d``, worded as its key and flag; a time budget's choice said once."""
    sizes = d.get("sizes") or {}
    chosen = (f" (chosen for a {fmt(sizes['time_budget'])} s budget on this machine)"
              if sizes.get("chosen_by") == "time budget" else "")
    rows = [(key.replace("_", " "), f"{d[key]}") for key in SIZE_KEYS if d.get(key) is not None]
    # what else reproduces the run given back (--selection-size, --search-steps, --duel-size, --refit-size)
    rows += [(key.replace("_", " "), f"{sizes[key]}") for key in GIVEN_BACK if sizes.get(key) is not None]
    if rows:
        rows[-1] = (rows[-1][0], rows[-1][1] + chosen)
    return rows


def _print_result(d: dict, title: str):
    click.echo(title)
    if d.get("method") == "renyi":
        rows = [("lower bound", d["lower_bound"]), ("estimate", d["estimate"])]
    else:  # MPL's estimate is the largest of the noisy stage-1 losses, biased up
        rows = [("lower bound", d["lower_bound"]), ("loss at t_hat", d.get("loss_at_t_hat")),
                ("stage-1 max loss", d["stage1_max_loss"])]
    if d.get("true_value") is not None or d.get("true_value_infinite"):
        rows.append(("true value", math.inf if d.get("true_value_infinite") else d["true_value"]))
    rows += [("worst pair", json.dumps(d["pair"]))]
    rule = d.get("event_rule")
    if rule:
        rows.append(("worst outputs", f"the event {_scored(rule)} {rule['direction']} {fmt(rule['threshold'])}"))
    elif d.get("event"):
        rows.append(("worst outputs", f"an event of {d['event_size']} outputs, "
                                      f"most extreme {json.dumps(d['t_hat'])}"))
    elif d.get("t_hat") is not None:
        rows.append(("worst output t_hat", json.dumps(d["t_hat"])))
    if d.get("feature"):
        rows.append(("outputs audited as", d["feature"]))
    if d.get("direction"):
        rows.append(("direction", d["direction"]))
    rows += [*_size_rows(d), ("alpha", d["alpha"]),
             ("estimator", "frequencies (TDDE)" if d["discrete"] or rule
              else f"KDE, bandwidth {fmt((d.get('bandwidth') or [None])[0])}")]
    for k, v in rows:
        click.echo(f"  {k:20s} {fmt(v) if not isinstance(v, str) else terminal_safe(v)}")
    for w in d.get("warnings", []):
        click.echo(f"  warning: {terminal_safe(w)}", err=True)


@click.group("audit")
def audit():
    """Black-box lower bounds on a mechanism's privacy (MPL, Rényi, (epsilon, delta)) and release audits.

    \b
    Examples:
      empdp audit mpl -m laplace --param epsilon=0.7 --seed 1
      empdp audit mpl -m noisy_max --pairs patterns --json
      empdp audit renyi -m gaussian --param sigma=1 --order 2
      empdp audit approx -m gaussian --param sigma=1 --delta 1e-5
      empdp audit mpl -m mymodule:sampler --pairs pairs.json --region -1,1
      empdp audit release calibration.json data.parquet --top 5
    """


@audit.command("mpl")
@_common_options
@_budget_option
@click.option("--search-size", "search_size", type=int, default=None,
              help="Stage-1 outputs per database: the search for the worst output (old name --n). Default: "
                   "chosen by --time-budget; 20000 when only --final-size is given.")
@click.option("--final-size", "final_size", type=int, default=None,
              help="Stage-2 outputs per database, fresh, more than --search-size: the bound (old name --N). "
                   "Default: chosen by --time-budget (what stage 1 leaves of it); 50000 when only --search-size "
                   "is given.")
@click.option("--selection-size", "selection_size", type=int, default=None,
              help="Stage-2 outputs stage 1 weighs its candidates by. Default: --final-size. A --time-budget "
                   "run reports it (it plans it before stage 1 and --final-size after): give it back with "
                   "the other sizes and --seed to reproduce the run.")
@click.option("--search-steps", "search_steps", type=int, default=None,
              help="Steps stage 1 takes (a pair's search each). Default: all. A --time-budget run whose "
                   "stage 1 the clock stopped reports them: give them back with the sizes and --seed to "
                   "reproduce the run.")
@click.option("--duel-size", "duel_size", type=int, default=None,
              help="Most fresh outputs per database and pair of the duel that ends stage 1: the finalist pairs' "
                   "events (continuous outputs: with the point or score event ranked second), the refit's, and a vector "
                   "score event's rarer ones at 1/3, 1/10 and 1/30 of its mass, each measured as stage 2 would "
                   "and the best chosen on fresh outputs. Default: 5 x --search-size; 0: none. "
                   "A --time-budget run reports "
                   "it wherever the duel applies (less, or 0, when the clock left too little time): give it back with "
                   "the sizes and --seed to reproduce the run.")
@click.option("--refit-size", "refit_size", type=int, default=None,
              help="Fresh outputs per database of the refit that ends stage 1 on vector outputs (the tables "
                   "counted again, the event chosen again). Default: 6 x --search-size; 0: none. A "
                   "--time-budget run reports it wherever stage 1 chose a score event (less, or 0, when the "
                   "clock left too little time): give it back with the sizes and --seed to reproduce the run.")
@click.option("--n", "n_old", type=int, default=None, hidden=True)
@click.option("--N", "N_old", type=int, default=None, hidden=True)
@click.option("--region", default=None, metavar="LO,HI", callback=lambda ctx, param, value: _region(value),
              help="Region C searched for the worst output (LO < HI). Default: the built-in's region, else "
                   "the central 99% of the stage-1 outputs (discrete outputs: all observed values).")
@click.pass_context
def mpl_cmd(ctx, mechanism, params, pairs, alpha, seed, threads, time_budget, search_size, final_size, selection_size,
            search_steps, duel_size, refit_size, n_old, N_old, region, as_json, quiet, verbose, debug):
    """MPL lower bound on the pure-DP epsilon (Askin, Kutta, Dette 2022).

    Stage 1 searches for the output t_hat and the pair of databases with the
    largest privacy loss; stage 2 bounds the loss there from fresh outputs
    (docs/method.md#91-mpl-a-lower-bound-on-pure-dp-epsilon).

    \b
    Examples:
      empdp audit mpl -m laplace --param epsilon=0.7 --seed 1
      empdp audit mpl -m noisy_max --pairs patterns --json
      empdp audit mpl -m svt6 --search-size 50000 --final-size 200000
      empdp audit mpl -m prefix_sum --time-budget 60 --alpha 0.1
      empdp audit mpl -m mymodule:sampler --pairs pairs.json --region -1,1
    """
    from empdp.audit import mpl

    n = _size(ctx, "search_size", search_size, "--n", n_old)
    N = _size(ctx, "final_size", final_size, "--N", N_old)
    _run_bound(mpl, f"MPL lower bound on pure-DP epsilon ({mechanism})", mechanism, params, pairs, threads,
               dict(n=n, N=N, region=region, alpha=alpha, rng=seed, selection_size=selection_size,
                    search_steps=search_steps, duel_size=duel_size, refit_size=refit_size,
                    clock_start=_clock_start(), time_budget=_budget(ctx, time_budget, n, N, selection_size,
                                                                   search_steps, duel_size, refit_size)),
               as_json, quiet, verbose, debug)


@audit.command("renyi")
@_common_options
@click.option("--order", type=float, required=True, help="Rényi order alpha > 1.")
@_budget_option
@click.option("--sample-size", "sample_size", type=int, default=None,
              help="Outputs per database for the bound (old name --n). Default: chosen by --time-budget.")
@click.option("--n", "n_old", type=int, default=None, hidden=True)
@click.pass_context
def renyi_cmd(ctx, mechanism, params, pairs, alpha, seed, threads, order, time_budget, sample_size, n_old, as_json, quiet,
              verbose, debug):
    """Lower bound on the Rényi divergence D_alpha (Kutta, Askin, Dunsche 2024).

    With several candidates (pairs, both directions) a pilot on a fifth of the
    outputs picks at most four, which share the error level
    (docs/method.md#92-renyi-dp-lower-bound).

    \b
    Examples:
      empdp audit renyi -m gaussian --param sigma=1 --order 2 --seed 1
      empdp audit renyi -m subsampled_gaussian --order 3 --sample-size 200000
      empdp audit renyi -m randomized_response --param p=0.8 --order 10 --json
      empdp audit renyi -m mymodule:sampler --pairs pairs.json --order 2
    """
    from empdp.audit import renyi

    n = _size(ctx, "sample_size", sample_size, "--n", n_old)
    _run_bound(renyi, f"Renyi lower bound, order {order:g} ({mechanism})", mechanism, params, pairs, threads,
               dict(order=order, n=n, alpha=alpha, rng=seed, time_budget=_budget(ctx, time_budget, n)), as_json,
               quiet, verbose, debug)


@audit.command("approx")
@_common_options
@click.option("--delta", type=float, required=True, help="The delta at which epsilon is bounded, in (0, 1), e.g. 1e-5.")
@_budget_option
@click.option("--search-size", "search_size", type=int, default=None,
              help="Stage-1 outputs per database: the search for the event. Default: chosen by --time-budget; "
                   "200000 when only --final-size is given.")
@click.option("--final-size", "final_size", type=int, default=None,
              help="Stage-2 outputs per database, fresh, more than --search-size: the bound. Default: chosen by "
                   "--time-budget; 1000000 when only --search-size is given.")
@click.pass_context
def approx_cmd(ctx, mechanism, params, pairs, alpha, seed, threads, delta, time_budget, search_size, final_size, as_json,
               quiet, verbose, debug):
    """Lower bound on epsilon at a given delta, for (epsilon, delta)-DP mechanisms.

    Stage 1 picks an event S (a half-line of the output, or of a learned score
    for vector outputs) and a pair; stage 2 counts S among fresh outputs of
    both databases, with exact binomial bounds p_lo and q_hi, and reports
    log((p_lo - delta) / q_hi): every (epsilon, delta)-DP mechanism has
    p <= e^epsilon q + delta (docs/method.md#9-audits).

    \b
    Examples:
      empdp audit approx -m gaussian --param sigma=1 --delta 1e-5 --seed 1
      empdp audit approx -m gaussian --param sigma=0.5 --delta 1e-3 --time-budget 60 --json
      empdp audit approx -m mymodule:sampler --pairs pairs.json --delta 1e-6
    """
    from empdp.audit import approx

    _run_bound(approx, f"Lower bound on epsilon at delta = {delta:g} ({mechanism})", mechanism, params, pairs,
               threads,
               dict(delta=delta, n=search_size, N=final_size, alpha=alpha, rng=seed,
                    time_budget=_budget(ctx, time_budget, search_size, final_size)),
               as_json, quiet, verbose, debug, printer=_print_approx)


def _scored(rule: dict) -> str:
    """What an event rule thresholds: the output itself, or its score by name (the logistic regression,
    or a table of log ratios: any score stage 1 chose, not only the regression)."""
    return "the output" if rule["score"] == "output" else f"the score '{rule['score']}'"


def _print_approx(d: dict, title: str) -> None:
    """The terminal summary of an (epsilon, delta) audit (``ApproxResult.to_dict``)."""
    click.echo(title)
    rule = d["event"]
    what = _scored(rule)
    x_name = "x_prime" if d["event_database"] == "x_prime" else "x"
    rows = [("lower bound", d["lower_bound"])]
    if d.get("true_value") is not None:
        rows.append(("true value", f"{fmt(d['true_value'])} ({d['true_value_kind']})"))
    rows += [("worst pair", json.dumps(d["pair"])),
             ("event", f"{what} {rule['direction']} {fmt(rule['threshold'])}"),
             (f"P(event | {x_name})", f"{fmt(d['p_hat'])} (lower bound {fmt(d['p_lower'])})"),
             ("P(event | other)", f"{fmt(d['q_hat'])} (upper bound {fmt(d['q_upper'])})"),
             *_size_rows(d), ("alpha", d["alpha"])]
    for k, v in rows:
        click.echo(f"  {k:20s} {fmt(v) if not isinstance(v, str) else terminal_safe(v)}")
    for w in d.get("warnings", []):
        click.echo(f"  warning: {terminal_safe(w)}", err=True)


@audit.command("release")
@click.argument("calibration", type=click.Path(dir_okay=False), metavar="CALIBRATION_FILE")
@click.argument("source", metavar="[SOURCE]", required=False)
@click.option("--top", type=int, default=5, show_default=True, help="Riskiest individuals audited.")
@click.option("--order", type=float, default=2.0, show_default=True, help="Rényi order alpha > 1.")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="Error level of the bounds.")
@_seed_option
@_threads_option
@click.option("--hash-ids", is_flag=True, help="Replace ids by a keyed hash (HMAC-SHA256) in the output, "
                                               "as 'empdp assess --hash-ids' does.")
@click.option("--hash-key-file", metavar="FILE", help="File holding the --hash-ids key (default: $EMPDP_HASH_KEY).")
@engine_options("Re-read SOURCE with duckdb (embedded) or spark (see docs/spark.md).")
@key_options
@output_options
def release_cmd(calibration, source, top, order, alpha, seed, threads, hash_ids, hash_key_file, engine, spark_master,
                spark_remote, table, key_file, allow_unsigned, as_json, quiet, verbose, debug):
    """Audit a calibration from 'empdp calibrate' on its SOURCE.

    The calibration's signature is checked under the curator key
    (--key-file or $EMPDP_KEY) before any of its fields is used, since its
    query and filter run on SOURCE; an unsigned one needs --allow-unsigned.

    Runs MPL and the Rényi bound on the release distribution of the riskiest
    individuals and prints the exact values beside them
    (docs/method.md#94-release-audit). A joint calibration (2-3 statistics)
    gets both bounds on the released vector beside the exact eps_i and D of
    its density.

    \b
    Examples:
      empdp audit release calibration.json data.parquet --seed 1
      empdp audit release calibration.json data.parquet --top 10 --order 3 --json
      empdp audit release calibration.json data.parquet --hash-ids --hash-key-file key.txt
      empdp audit release calibration.json --table lake.claims --engine spark
    """
    from empdp.audit import audit_release
    from empdp.audit.release import describe_buckets
    from empdp.io import load_hash_key
    from empdp.keys import load_key
    from empdp.noise import load_calibration

    setup_logging(verbose, quiet, debug)
    engine_kw = engine_settings(source, engine, spark_master, spark_remote, table)
    key = load_hash_key(hash_key_file) if hash_ids or hash_key_file else None
    cal = load_calibration(calibration, key=load_key(key_file), allow_unsigned=allow_unsigned)
    if not cal.signed or load_key(key_file) is None:  # possible only with --allow-unsigned
        click.secho("Warning: --allow-unsigned: the calibration's signature was not verified; a forged file's "
                    "query and filter run on SOURCE", fg="yellow", err=True)
    loo = None
    if engine != "duckdb" or table is not None:  # read by the chosen engine, after the options are checked
        from empdp.noise.source import SourceShifts

        loo = SourceShifts(cal, source, **engine_kw)
    with progress_bars(enabled=not as_json and not quiet) as progress:
        res = audit_release(cal, source, loo=loo, top=top, order=order, alpha=alpha, rng=seed,
                            progress=progress, hash_key=key, threads=threads)
    d = res.to_dict()
    if as_json:
        emit_json(d)
        return
    if quiet:
        return
    if d.get("joint"):
        _print_joint_audit(d)
        return
    click.echo(f"Release audit: target epsilon {fmt(d['target_epsilon'])}, noise {terminal_safe(d['noise']['kind'])}, "
               f"curator kernel {d['curator_kernel']['kind']}")
    buckets = "buckets" in d  # an adversary calibration: audited bucket by bucket
    click.echo(f"  {'id':>12s} {'exact eps_i':>12s} {STAGE1_MAX:>16s} {'exact D_' + format(order, 'g'):>10s}"
               + ("  bucket" if buckets else ""))
    for row in d["individuals"]:
        click.echo(f"  {terminal_safe(row['id']):>12s} {fmt(row['exact_epsilon']):>12s} "
                   f"{fmt(row.get('stage1_max_loss')):>16s} {fmt(row['exact_renyi']):>10s}"
                   + (f"  {row.get('bucket', '')}" if buckets else ""))
    click.echo(f"  ({STAGE1_MAX}: {STAGE1_MAX_MEANS})")
    _echo_release_sizes(d)
    click.echo(f"  MPL lower bound   {fmt(d['mpl_lower_bound'])}  <=  exact max eps {fmt(d['exact_epsilon_max'])}"
               f"  <=  target {fmt(d['target_epsilon'])}")
    click.echo(f"  Renyi lower bound {fmt(d['renyi_lower_bound'])}  vs exact max D {fmt(d['exact_renyi_max'])}")
    for line in _at_delta_lines(d):
        click.echo(line)
    if not d["renyi_consistent"]:
        click.echo(f"  note: the Renyi lower bound exceeds the exact D; at level alpha = {d['alpha']:g} this happens "
                   f"by chance with probability at most alpha (rerun with another --seed); repeated, it means the "
                   f"release is not the calibrated one")
    click.echo("  OK: the release meets its target" if d["ok"] else "  CHECK FAILED: see the figures above")
    for line in describe_buckets(d):
        click.echo(line)
    for w in d.get("warnings", []):
        click.echo(f"  warning: {terminal_safe(w)}", err=True)


STAGE1_MAX_MEANS = "MPL's largest noisy loss estimate for the individual, biased up; a screening statistic, not a bound"


def _at_delta_lines(d: dict) -> list[str]:
    """A curator kernel that is not pure DP: the (epsilon, delta) audit at its tolerance delta, which sets the
    verdict, and the exact curve eps(delta) of the audited individuals (none for pure-DP kernels)."""
    if d.get("delta") is None:
        return []
    curve = d["exact_curve"]
    return [f"  (epsilon, delta) audit at delta = {fmt(d['delta'])} (the kernel is not pure DP; this sets the "
            f"verdict):",
            f"    lower bound {fmt(d['approx_lower_bound'])}  <=  exact max eps(delta) "
            f"{fmt(d['exact_epsilon_at_delta_max'])}  <=  target {fmt(d['target_epsilon'])}",
            "    exact curve, largest eps_i(delta) of the audited: "
            + ", ".join(f"{fmt(e)} at {fmt(dl)}" for dl, e in zip(curve["delta"], curve["epsilon"]))]


def _echo_release_sizes(d: dict) -> None:
    """The release audit's sample sizes: MPL's search and final sizes, the Rényi sample size."""
    click.echo("  " + ", ".join(f"{name} {value}" for name, value in _size_rows(d)))


def _print_joint_audit(d: dict) -> None:
    """The terminal summary of a joint release audit (``ReleaseAudit.to_dict`` of a joint calibration)."""
    click.echo(f"Release audit of {d['d']} statistics released together ({terminal_safe('; '.join(d['statistics']))}): target "
               f"epsilon {fmt(d['target_epsilon'])}, noise {terminal_safe(d['noise']['kind'])}, curator model product Laplace "
               f"{'whitened' if d['curator_model'].get('whitened') else 'axis-aligned'}")
    order = format(d["order"], "g")
    click.echo(f"  {'id':>12s} {'exact eps_i':>12s} {STAGE1_MAX:>16s} {'exact D_' + order:>10s}")
    for row in d["individuals"]:
        click.echo(f"  {terminal_safe(row['id']):>12s} {fmt(row['exact_epsilon']):>12s} "
                   f"{fmt(row.get('stage1_max_loss')):>16s} {fmt(row.get('exact_renyi')):>10s}")
    click.echo(f"  (exact: the released vector's density; {STAGE1_MAX}: {STAGE1_MAX_MEANS})")
    _echo_release_sizes(d)
    click.echo(f"  MPL lower bound   {fmt(d['mpl_lower_bound'])}  <=  exact max eps {fmt(d['exact_epsilon_max'])}"
               f"  <=  target {fmt(d['target_epsilon'])}")
    click.echo(f"  Renyi lower bound {fmt(d['renyi_lower_bound'])}  vs exact max D {fmt(d['exact_renyi_max'])}")
    if d["renyi_consistent"] is False:
        click.echo(f"  note: the Renyi lower bound exceeds the exact D; at level alpha = {d['alpha']:g} this happens "
                   f"by chance with probability at most alpha (rerun with another --seed); repeated, it means the "
                   f"release is not the calibrated one")
    click.echo("  OK: the release meets its target" if d["ok"] else "  CHECK FAILED: see the figures above")
    for w in d.get("warnings", []):
        click.echo(f"  warning: {terminal_safe(w)}", err=True)
