"""``empdp calibrate`` and ``empdp release`` (SPEC 6, 8)."""

from __future__ import annotations

import warnings
from pathlib import Path

import click

from empdp.errors import InputError
from empdp.noise import Calibration, calibrate as calibrate_source, query_value

from ._common import check_output, emit_json, log, output_options, progress_bars, setup_logging
from .assess import parse_bandwidth, query_options


def _warn(message: str) -> None:
    click.secho("Warning: " + message, fg="yellow", err=True)


@click.command("calibrate")
@query_options
@click.option("--epsilon", "-e", "epsilon", type=float, required=True, help="Target empirical epsilon.")
@click.option("--kernel", type=click.Choice(["laplace", "gaussian", "auto"]), default="laplace", show_default=True,
              help="Curator kernel. Laplace (default) deconvolves in closed form: the least noise, exactly. A "
                   "Gaussian kernel cannot be deconvolved, so a verified Laplace-mixture fallback is searched "
                   "(slower, about 1% above its least feasible scale); auto picks by held-out likelihood and "
                   "often picks Gaussian.")
@click.option("--bandwidth", default="auto", show_default=True,
              help="'auto' (fixed scale by held-out likelihood) or a fixed kernel scale.")
@click.option("-o", "--output", "output", required=True, help="Write the calibration to this JSON file.")
@click.option("--memory-limit", help="DuckDB memory limit, e.g. 3GB.")
@click.option("--drop-null-ids", is_flag=True, help="Drop rows whose id is NULL instead of failing.")
@output_options
def calibrate(source, id_col, by, query, where, sql, epsilon, kernel, bandwidth, output, memory_limit,
              drop_null_ids, as_json, quiet, verbose, debug):
    """The least noise that makes releasing QUERY epsilon-empirically private (SPEC 6).

    Finds the exact minimal Laplace scale lambda* over every individual,
    deconvolves the curator kernel to get the noise (for a Laplace kernel:
    nothing with probability w = (b/lambda*)^2, else Laplace(lambda*)),
    verifies the result and writes it to a JSON file for ``empdp release``.

    \b
    Examples:
      empdp calibrate sample_data/countymurders.parquet --id countyid --by year \\
          --query "mean(murdrate)" --epsilon 1 -o cal.json
      empdp calibrate data/*.parquet --id customer --by month --query "sum(kwh)" \\
          -e 0.5 -o kwh.json --json
    """
    setup_logging(verbose, quiet, debug)
    check_output(output, "-o", (".json",), ".json")
    with warnings.catch_warnings(), progress_bars(not (as_json or quiet)) as progress:
        warnings.simplefilter("ignore")  # the notes are shown below and kept in the JSON
        cal = calibrate_source(source, id=id_col, by=by, query=query, where=where, sql=sql, epsilon=epsilon,
                               kernel=kernel, bandwidth=parse_bandwidth(bandwidth), memory_limit=memory_limit,
                               drop_null_ids=drop_null_ids, progress=progress)
    cal.save(output)
    log.info("wrote %s (lambda* %.6g, noise %s) after %.2f s of calibration", output, cal.lam, cal.noise["kind"],
             cal.seconds)
    for note in cal.warnings:
        _warn(note)
    if as_json:
        emit_json(cal.to_dict())
    elif not quiet:
        _print_calibration(cal, output)


def _print_calibration(cal: Calibration, output: str) -> None:
    n = cal.noise
    noise = {"none": "none (the curator kernel already suffices)",
             "laplace": f"Laplace(scale {n['scale']:.6g})",
             "laplace_mixture": f"0 with probability {n['weight_zero']:.4g}, else Laplace(scale {n['scale']:.6g})"}
    rows = [
        ("query", f"{cal.query_description} on {cal.source_description} ({cal.n_databases} databases)"),
        ("target epsilon", f"{cal.epsilon:g}"),
        ("lambda* (exact, minimal)", f"{cal.lam:.6g}"),
        ("lambda by Hausdorff rule", f"{cal.lam_hausdorff:.6g}  (paper's rule; not valid, SPEC 10.1)"),
        ("lambda by W-infinity bound", f"{cal.lam_winf:.6g}  (valid, loose)"),
        ("curator kernel", f"{cal.curator_kernel['kind']}, scale {cal.curator_kernel['scale']:.6g}"),
        ("noise", noise.get(n["kind"], n["kind"])),
        ("expected |noise|", f"{cal.expected_abs_noise:.6g}  (plain Laplace(lambda*): {cal.lam:.6g})"),
        ("verified max eps_i", f"{cal.verified_eps_max:.6g}"),
        ("individuals", f"{cal.n_individuals} ({cal.n_sole_contributors} sole contributors, unprotectable)"),
        ("classical DP epsilon", "none: " + cal.to_dict()["classical_dp_explanation"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    click.echo(f"Guarantee: {cal.to_dict()['guarantee']}.")
    click.echo(f"Wrote {output}")


@click.command("release")
@click.argument("calibration", type=click.Path(dir_okay=False))
@click.argument("source", required=False)
@click.option("--value", type=float, help="The new statistic to release (never printed).")
@click.option("--database", help="With SOURCE: compute the query on this database label.")
@click.option("--ledger", help="Ledger file (default: CALIBRATION with suffix .ledger.sqlite).")
@click.option("--budget", type=float, help="Total epsilon budget of the ledger (fixed by its first use).")
@click.option("--seed", type=int, help="Reproducible noise for TESTS ONLY: the release is marked not private.")
@click.option("--memory-limit", help="DuckDB memory limit, e.g. 3GB.")
@output_options
def release(calibration, source, value, database, ledger, budget, seed, memory_limit, as_json, quiet, verbose,
            debug):
    """Add calibrated noise to a new statistic and record it in the ledger (SPEC 6.4-6.5).

    The noise comes from the operating system's CSPRNG on an exact 2^-k grid.
    A release that would take the ledger past its total-epsilon budget is
    refused (exit 1) and nothing is written. The true value is never printed.

    \b
    Examples:
      empdp release cal.json --value 0.4711 --ledger releases.sqlite --budget 3
      empdp release cal.json new_year.parquet --database 2024 --json
    """
    setup_logging(verbose, quiet, debug)
    if (value is None) == (database is None) or (database is None) != (source is None):
        raise InputError("give either --value X, or SOURCE with --database LABEL")
    cal = Calibration.load(calibration)
    log.info("calibration %s: epsilon %g, noise %s (weight at 0 %.4g, scale %.6g)", calibration, cal.epsilon,
             cal.noise["kind"], cal.noise["weight_zero"], cal.noise["scale"])
    ledger = ledger or str(Path(calibration).with_suffix(".ledger.sqlite"))
    check_output(ledger, "--ledger")  # before the query is computed
    with progress_bars(not (as_json or quiet)) as progress:  # the library logs its stages
        if value is None:
            value = query_value(cal, source, database, memory_limit=memory_limit, progress=progress)
        out = cal.release(value, ledger=ledger, budget=budget, seed=seed, database=database, progress=progress)
    if as_json:
        emit_json({k: out[k] for k in ("value", "epsilon", "budget_spent", "budget_left", "private")})
    elif not quiet:
        left = "unlimited" if out["budget_left"] is None else f"{out['budget_left']:g} left"
        click.echo(f"{out['value']!r}")
        click.echo(f"epsilon {out['epsilon']:g}; ledger {ledger}: {out['budget_spent']:g} spent, {left}",
                   err=True)
    if not out["private"]:
        _warn("released with --seed: reproducible noise, NOT PRIVATE (tests only)")
