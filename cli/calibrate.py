"""``empdp calibrate`` and ``empdp release`` (docs/method.md#8-calibration-and-release)."""

from __future__ import annotations

import warnings
from pathlib import Path

import click

from empdp import kernels
from empdp.errors import InputError
from empdp.keys import KEY_ENV, key_id, load_key
from empdp.models import model_for
from empdp.noise import Calibration, JointCalibration, Ledger, load_calibration, release_value
from empdp.noise import calibrate as calibrate_source
from empdp.noise.ledger import UNLIMITED, parse_budget
from empdp.params import target_epsilon
from empdp.settings import Data, Execution, Model
from empdp.textfmt import fmt, terminal_safe

from . import _common as common
from ._common import given_options
from .assess import KernelChoice, parse_bandwidth, query_options


def _warn(message: str) -> None:
    click.secho("Warning: " + message, fg="yellow", err=True)


@click.command("calibrate")
@query_options(joint=True)
@click.option("--epsilon", "-e", "epsilon", type=float, required=True, help="Target empirical epsilon.")
@click.option("--adversary", metavar="QUERY",
              help="What the adversary knows about each database (a named query over the whole table): every "
                   "adversary bucket's release is made epsilon-private, as 'assess --adversary' measures it.")
@click.option("--adversary-sql", metavar="SQL", help="The adversary statistic as SQL over the table 'db'.")
@click.option("--buckets", type=int, default=None,
              help="With --adversary: groups of databases (default: as many as keep 10 each, at most 5).")
@common.engine_options("duckdb (embedded) or spark: compute the leave-one-out (and the adversary statistic) on Spark "
                "(see docs/spark.md).")
@click.option("--kernel", type=KernelChoice(), default=kernels.DEFAULT.name, show_default=True,
              help="Curator kernel. Laplace (default) deconvolves in closed form: the least noise, exactly. A "
                   "Gaussian kernel cannot be deconvolved, so a verified Laplace-mixture fallback is searched "
                   "(slower, about 1% above its least feasible scale); auto picks by held-out likelihood and "
                   "often picks Gaussian.")
@click.option("--bandwidth", default="auto", show_default=True,
              help="'auto' (fixed scale by held-out likelihood) or a fixed kernel scale; for 2-3 statistics auto "
                   "(whitened product Laplace kernels) or one scale per statistic in its own units, B1,B2[,B3].")
@click.option("-o", "--output", "output", metavar="FILE", required=True,
              help="Write the calibration to FILE.json (mode 0600).")
@click.option("--memory-limit", help="DuckDB memory limit, e.g. 3GB.")
@click.option("--drop-null-ids", is_flag=True, help="Drop rows whose id is NULL instead of failing.")
@click.option("--key-file", type=click.Path(dir_okay=False), metavar="FILE",
              help=f"Sign the calibration with the curator key in this file (default: ${KEY_ENV}); 'empdp "
                   "release' refuses unsigned calibrations unless --allow-unsigned.")
@click.option("--level", type=float, default=None,
              help="Calibrate so that the target epsilon holds for this fraction of subsamples of the databases "
                   "(e.g. 0.9), not only for the databases at hand: lambda_L >= lambda*, reported beside it (one "
                   "statistic, Laplace kernel; see docs/method.md).")
@click.option("--replicates", type=int, default=None, help="With --level: subsamples of the databases (default 200).")
@click.option("--seed", type=int, default=None, help="With --level: seed of the subsamples.")
@common.output_options
def calibrate(source, id_col, by, query, where, sql, epsilon, adversary, adversary_sql, buckets, engine, spark_master,
              spark_remote, table, kernel, bandwidth,
              output, memory_limit,
              drop_null_ids, key_file, level, replicates, seed, as_json, quiet, verbose, debug):
    """The least noise that makes releasing QUERY epsilon-empirically private (docs/method.md#8-calibration-and-release).

    Finds the exact minimal Laplace scale lambda* over every individual,
    deconvolves the curator kernel to get the noise (for a Laplace kernel:
    nothing with probability w = (b/lambda*)^2, else Laplace(lambda*)),
    verifies the result and writes it to a JSON file for ``empdp release``.

    \b
    Examples:
      empdp calibrate sample_data/countymurders.parquet --id countyid --by year \\
          --query "mean(murdrate)" --epsilon 1 -o cal.json --key-file curator.key
      EMPDP_KEY=... empdp calibrate data/*.parquet --id customer --by month \\
          --query "sum(kwh)" -e 0.5 -o kwh.json --json
      empdp calibrate panel.parquet --id id --by db --query "sum(x)" --query "count(*)" \\
          -e 1 -o joint.json --key-file curator.key     # 2-3 statistics released together

    With --query (or --sql) given 2 or 3 times the statistics are released
    together: noise on each whitened axis of the joint model, the least
    common factor t verified exactly (see the README, joint queries).
    """
    common.setup_logging(verbose, quiet, debug)
    engine_kw = common.engine_settings(source, engine, spark_master, spark_remote, table)
    target_epsilon(epsilon)  # before the data are read
    model, d = model_for(list(query), list(sql))
    model.refuse(given_options(click.get_current_context(), ("kernel", "adversary", "adversary_sql", "buckets",
                                                             "engine", "table", "level")), d)
    at_level = _level(level, replicates, seed, kernel, adversary or adversary_sql)
    bandwidth = parse_bandwidth(bandwidth, model, d)
    data = Data(source, id_col, by, drop_null_ids=drop_null_ids)
    curator = Model(kernel=kernel, bandwidth=bandwidth, adversary=adversary, adversary_sql=adversary_sql,
                    buckets=buckets)
    key = load_key(key_file)
    common.check_output(output, "-o", (".json",), ".json")
    with warnings.catch_warnings(), common.progress_bars(not (as_json or quiet)) as progress:
        warnings.simplefilter("ignore")  # the notes are shown below and kept in the JSON
        execution = Execution(engine=common.engine_object(engine_kw), memory_limit=memory_limit, progress=progress)
        cal = calibrate_source(data, query=list(query) or None, where=where, sql=list(sql) or None,
                               epsilon=epsilon, model=curator, execution=execution, **at_level)
    _finish(cal, output, key, as_json, quiet)


def _calibrated_at(cal) -> dict:
    """For a calibration at a level, which scale the release used: ``lambda`` (λ_L, the noise's scale, the
    ledger's ``lambda``) and the ``level``; nothing otherwise (the release JSON keeps its keys)."""
    if isinstance(cal, JointCalibration) or not cal.level:
        return {}
    return {"lambda": cal.noise["scale"], "level": cal.level["level"]}


def _level(level, replicates, seed, kernel: str, adversary) -> dict:
    """``calibrate``'s keywords of a calibration at a level, checked before any data are read."""
    if level is None:
        given = [flag for flag, value in (("--replicates", replicates), ("--seed", seed)) if value is not None]
        if given:
            raise InputError(f"{given[0]} goes with --level: add --level, or drop {given[0]}")
        return {}
    from empdp.assessment.uncertainty import check_options

    if adversary:
        raise InputError("--level calibrates the plain release of one statistic, not against an adversary: drop "
                         "--level, or --adversary/--adversary-sql")
    if not all(k.deconvolves for k in kernels.candidates(kernel)):  # auto may choose one that does not
        raise InputError("--level calibrates the closed-form noise of the Laplace curator kernel: drop --level, or "
                         "use --kernel laplace")
    replicates, level = check_options(200 if replicates is None else replicates, level)
    return {"level": level, "replicates": replicates, "rng": seed}


def _finish(cal, output: str, key, as_json: bool, quiet: bool) -> None:
    """Save the calibration (signed with ``key``), show its notes, and print it or its JSON."""
    cal.save(output, key=key)
    scale = fmt(cal.lam) if isinstance(cal, Calibration) else f"t {fmt(cal.t)}"
    common.log.info("wrote %s (lambda* %s, noise %s, %s) after %.2f s of calibration", output, scale,
             cal.noise["kind"], f"signed with key {key_id(key)}" if key else "unsigned", cal.seconds)
    for note in cal.warnings:
        _warn(note)
    if key is None:
        _warn(f"no curator key: {output} is unsigned, and 'empdp release' refuses it unless --allow-unsigned "
              f"(unsafe); give --key-file FILE or set ${KEY_ENV}")
    if as_json:
        common.emit_json(cal.to_dict())
    elif not quiet and isinstance(cal, JointCalibration):
        _print_joint(cal, output)
    elif not quiet:
        _print_calibration(cal, output)


def _print_calibration(cal: Calibration, output: str) -> None:
    n = cal.noise
    noise = {"none": "none (the curator kernel already suffices)",
             "laplace": f"Laplace(scale {fmt(n['scale'])})",
             "laplace_mixture": f"0 with probability {fmt(n['weight_zero'])}, else Laplace(scale {fmt(n['scale'])})"}
    rows = [
        ("query", f"{cal.query_description} on {cal.source_description} ({fmt(cal.n_databases)} databases)"),
        ("target epsilon", fmt(cal.epsilon)),
        ("lambda* (exact, minimal)", fmt(cal.lam)),
        *([(f"lambda at level {cal.level['level']:g}", f"{fmt(cal.level['lambda_level'])}  (the noise's scale: epsilon "
            f"holds for {cal.level['level']:.0%} of {cal.level['replicates']} subsamples of the databases)")]
          if cal.level else []),
        ("lambda by Hausdorff rule", f"{fmt(cal.lam_hausdorff)}  (paper's rule; not valid: see docs/method.md"
                                     "#111-the-hausdorff-rule-does-not-guarantee-epsilon)"),
        ("lambda by W-infinity bound", f"{fmt(cal.lam_winf)}  (valid, loose)"),
        ("curator kernel", f"{cal.curator_kernel['kind']}, scale {fmt(cal.curator_kernel['scale'])}"),
        ("noise", noise.get(n["kind"], n["kind"])),
        ("expected |noise|", f"{fmt(cal.expected_abs_noise)}  (plain Laplace(lambda*): {fmt(cal.lam)})"),
        ("verified_eps_max", f"{fmt(cal.verified_eps_max)}  (the largest exact eps_i of the release)"),
        ("individuals", f"{fmt(cal.n_individuals)} ({fmt(cal.n_sole_contributors)} sole contributors, "
                        "unprotectable)"),
    ]
    _print_rows(rows, cal, output)


def _print_rows(rows: list, cal, output: str) -> None:
    """The calibration's table (aligned ``(name, value)`` rows), its classical-DP note and guarantee, the file."""
    rows = [*rows, ("classical DP epsilon", "none: " + cal.to_dict()["classical_dp_explanation"])]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {terminal_safe(value)}")  # names and queries from the data or a file
    click.echo(f"Guarantee: {cal.to_dict()['guarantee']}.")
    click.echo(f"Wrote {terminal_safe(output)}")


def _print_joint(cal: JointCalibration, output: str) -> None:
    n, b = cal.noise, cal.curator_model
    axes = range(cal.d)
    noise = ("none (the curator's joint model already suffices)" if n["kind"] == "none" else
             "on whitened axis k: 0 with probability w_k, else Laplace(lambda_k); mapped back by W^-1")
    rows = [
        ("statistics", f"{'; '.join(cal.statistics)} on {cal.source_description} ({fmt(cal.n_databases)} databases)"),
        ("target epsilon", f"{fmt(cal.epsilon)} (spent once per released vector)"),
        ("curator model", f"product Laplace, {'whitened' if b['whitened'] else 'axis-aligned (fixed scales)'}, "
                          f"scales b_k {', '.join(fmt(v) for v in b['scales'])}"),
        ("t (exact, minimal)", f"{fmt(cal.t)}  (lambda_k = t b_k)"),
        ("noise", noise),
    ]
    if n["kind"] != "none":
        rows += [("lambda_k", ", ".join(fmt(n["scales"][k]) for k in axes)),
                 ("w_k", ", ".join(fmt(n["weights"][k]) for k in axes))]
        rows += [(f"noise on {name}", noise_words(cal, k)) for k, name in enumerate(cal.statistics)]
    rows += [
        ("verified_eps_max", f"{fmt(cal.verified_eps_max)}  (the largest exact eps_i of the release; curator model alone: "
                             f"{fmt(cal.curator_eps_max)})"),
        ("individuals", f"{fmt(cal.n_individuals)} ({fmt(cal.n_sole_contributors)} sole contributors, "
                        "unprotectable)"),
    ]
    _print_rows(rows, cal, output)


def noise_words(cal: JointCalibration, k: int) -> str:
    """Statistic ``k``'s noise in its own units: its expected size and its central 95% interval."""
    q = cal.noise_interval_95[k][1]
    return f"expected |noise| {fmt(cal.expected_abs_noise[k])}, 95% within ±{fmt(q)}  (its own units)"


def _values(text: str, d: int) -> float | list[float]:
    """--value: one number, or d comma-separated numbers for a joint calibration of d statistics."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != d:
        what = f"{d} numbers V1,V2{',V3' if d == 3 else ''}, one per statistic" if d > 1 else "one number"
        raise InputError(f"--value gives {len(parts)} value(s) but the calibration releases {d} statistic(s): "
                         f"give {what}")
    out = []
    for k, p in enumerate(parts):
        try:
            out.append(float(p))
        except ValueError:
            shown = p if len(p) <= 40 else p[:37] + "..."
            raise InputError(f"--value must be {'numbers' if d > 1 else 'a number'}; value {k + 1} is "
                             f"{shown!r}") from None
    return out if d > 1 else out[0]


@click.command("release")
@click.argument("calibration", type=click.Path(dir_okay=False))
@click.argument("source", required=False)
@click.option("--value", metavar="V[,V2[,V3]]",
              help="The new statistic to release (never printed); for a joint calibration one value per "
                   "statistic, comma-separated, in the calibration's order.")
@click.option("--database", help="With SOURCE: compute the query on this database label.")
@click.option("--ledger", metavar="FILE", help="Ledger file the release is appended to (default: CALIBRATION with "
                                                "suffix .ledger.sqlite); not a symbolic link. A new ledger is "
                                                "started only at a path with no file, and only with --budget.")
@click.option("--budget", metavar="EPS|unlimited",
              help="Total epsilon budget of the ledger: needed to start a new ledger (a number, or 'unlimited'); "
                   "on an existing ledger it must be the one it has (a ledger started unlimited takes one once).")
@click.option("--expect-head", metavar="HEX", help="A chain head recorded earlier: refuse to release unless it is in "
                                                   "the ledger (catches a ledger rolled back or replaced).")
@click.option("--seed", type=int, help="Reproducible noise for TESTS ONLY: the release is marked not private "
                                       "(default: none, the operating system's CSPRNG).")
@click.option("--memory-limit", help="DuckDB memory limit, e.g. 3GB.")
@common.engine_options("With SOURCE: compute the query with duckdb (embedded) or spark (see docs/spark.md).")
@common.key_options
@common.output_options
def release(calibration, source, value, database, ledger, budget, expect_head, seed, memory_limit, engine,
            spark_master, spark_remote, table, key_file, allow_unsigned, as_json, quiet, verbose, debug):
    """Add calibrated noise to a new statistic and record it in the ledger (docs/method.md#84-secure-sampling).

    Before anything is released, the calibration's HMAC and the whole ledger
    (its schema, records, budget and head) are verified under the curator
    key; any mismatch is refused (exit 2) and nothing is written. The noise
    comes from the operating system's CSPRNG on an exact 2^-k grid. A release
    that would take the ledger past its total-epsilon budget is refused
    (exit 1) and nothing is written. The ledger records the SHA-256 digest of
    SOURCE (or that the value was given); with SOURCE only database LABEL is
    needed in it. The noisy value is printed only once the record is
    committed and read back; the true value is never printed.

    \b
    Examples:
      empdp release cal.json --value 0.4711 --ledger releases.sqlite --budget 3 --key-file curator.key
      empdp release cal.json --value 0.52 --ledger releases.sqlite --expect-head 3f2a...c9
      EMPDP_KEY=... empdp release cal.json new_year.parquet --database 2024 --json
      empdp release cal.json --table lake.claims --engine spark --database 2024-06 --key-file curator.key
      empdp release joint.json --value 812.5,40 --ledger releases.sqlite    # a joint calibration: one per statistic
    """
    common.setup_logging(verbose, quiet, debug)
    if ledger is not None and not ledger.strip():
        raise InputError("--ledger is empty (an unset shell variable?); give the ledger file's path")
    if (value is None) == (database is None) or (database is None) != (source is None and table is None):
        raise InputError("give either --value X, or SOURCE (or --table DB.NAME with --engine spark) with "
                         "--database LABEL")
    engine_kw = common.engine_settings(source, engine, spark_master, spark_remote, table, required=value is None)
    if seed is not None and not 0 <= seed < 2 ** 128:
        raise InputError(f"--seed must be an integer in [0, 2^128); got {str(seed)[:40]}")
    try:
        budget = parse_budget(budget)
    except InputError as exc:
        raise InputError(f"--budget: {exc}") from None
    ledger = ledger or str(Path(calibration).with_suffix(".ledger.sqlite"))
    Ledger(ledger).check_path()  # no symbolic link, no folder
    common.check_output(ledger, "--ledger")  # before the query is computed
    key = load_key(key_file)
    if key is None and not allow_unsigned:
        raise InputError(f"release needs the curator key that signed the calibration and signs the ledger: give "
                         f"--key-file FILE or set ${KEY_ENV} (or pass --allow-unsigned: unsafe, see the README)")
    cal = load_calibration(calibration, key=key, allow_unsigned=allow_unsigned)
    joint = isinstance(cal, JointCalibration)
    if value is not None:
        value = _values(value, cal.d if joint else 1)
    common.log.info("calibration %s: epsilon %s, noise %s (weight at 0 %s, scale %s), %s", calibration,
                    fmt(cal.epsilon), cal.noise["kind"], cal.noise["weights" if joint else "weight_zero"],
                    cal.noise["scales" if joint else "scale"],
                    "signature verified" if key and cal.signed else "NOT verified (--allow-unsigned)")
    book = Ledger(ledger, key=key, allow_unsigned=allow_unsigned)
    # a tampered, foreign or missing ledger is refused before the query is computed (and again inside)
    summary = book.check_release(budget, expect_head)
    if key is None or not cal.signed or (summary is not None and not summary["signed"]):  # --allow-unsigned only
        _warn("--allow-unsigned: the calibration or ledger is not verified under a curator key; edits to them "
              "are not detected")
    origin = {}
    with common.progress_bars(not (as_json or quiet)) as progress:  # the library logs its stages
        if value is None:
            value, digest = release_value(cal, source, database, memory_limit=memory_limit, progress=progress,
                                          **engine_kw)
            origin = {"source": source if source is not None else table, "source_digest": digest}
        out = cal.release(value, ledger=ledger, budget=budget, seed=seed, database=database, progress=progress,
                          key=key, allow_unsigned=allow_unsigned, expect_head=expect_head, **origin)
    if as_json:
        common.emit_json({**{k: out[k] for k in ("value", "epsilon", "budget_spent", "budget_left", "private",
                                                 "noise_added", "guarantee", "seq")}, **_calibrated_at(cal)})
    elif not quiet:
        left = "unlimited" if out["budget_left"] is None else f"{fmt(out['budget_left'])} left"
        shown = ",".join(repr(v) for v in out["value"]) if joint else repr(out["value"])
        click.echo(shown)  # the released value itself, in full (a joint release: comma-separated, in order)
        click.echo(f"epsilon {fmt(out['epsilon'])}; ledger {terminal_safe(ledger)}: {fmt(out['budget_spent'])} spent, {left}; "
                   f"record {out['seq']}, chain head {out['head']}", err=True)
        at = _calibrated_at(cal)
        if at:
            click.echo(f"noise calibrated at level {at['level']:g}: lambda_L {fmt(at['lambda'])} (lambda* "
                       f"{fmt(cal.lam)}), recorded in the ledger as the release's lambda", err=True)
    if joint and out["noise_added"] and not quiet:  # the size of what was added, in each statistic's units
        for k, name in enumerate(cal.statistics):
            click.echo(f"noise on {terminal_safe(name)}: {noise_words(cal, k)}", err=True)
    if out["created"]:
        limit = "no budget limit (unlimited)" if budget == UNLIMITED else f"a total-epsilon budget of {fmt(budget)}"
        click.echo(f"Started a new ledger {terminal_safe(ledger)} with {limit}", err=True)
    if not out["noise_added"]:
        _warn(f"NO NOISE WAS ADDED: the exact {'vector' if joint else 'value'} was released (the calibration found that the data's own spread "
              f"already gives epsilon {fmt(cal.epsilon)} under the curator's density model; see the README)")
    if not out["private"]:
        _warn("released with --seed: reproducible noise, NOT PRIVATE (tests only)")
