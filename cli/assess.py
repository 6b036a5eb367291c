"""``empdp assess``."""

from __future__ import annotations

import logging
import time

import click
import polars as pl

from empdp import query as query_forms
from empdp.assessment.assess import assess
from empdp.errors import InputError
from empdp.io import keyed_hash, load_hash_key, output_batch, refuse_overwrite

from ._common import (
    check_output,
    emit_json,
    engine_options,
    engine_settings,
    log,
    output_options,
    progress_bars,
    setup_logging,
    write_table,
)
from .report import extras_options, load_extras


def parse_bandwidth(value: str):
    if value is None or value in ("auto", "variable"):
        return value or "auto"
    try:
        return float(value)
    except ValueError:
        raise InputError(f"--bandwidth must be auto, variable or a positive number; got {value!r}") from None


def query_options(f):
    """``SOURCE --id --by (--query [--where] | --sql)`` shared by assess and calibrate (SOURCE may be
    left out for ``--table``; :func:`engine_settings` checks that one of them is given)."""
    f = click.option("--sql", help="Generic query over the table 'db' (one database), e.g. "
                                   "\"SELECT avg(x) FROM db WHERE y > 0\".")(f)
    f = click.option("--where", help="SQL filter applied before the aggregate, e.g. \"age >= 18\".")(f)
    f = click.option("--query", "query", metavar="QUERY", help=f"One of {query_forms.HELP}.")(f)
    f = click.option("--by", required=True, help="Column naming the database (year, month, file...).")(f)
    f = click.option("--id", "id_col", required=True, help="Column naming the individual.")(f)
    f = click.argument("source", required=False)(f)
    return f


@click.command("assess")
@query_options
@click.option("--epsilon", "-e", "epsilon", multiple=True, type=float,
              help="Privacy level(s) to assess; repeat for several. Default: 50 values "
                   "log-spaced over [eps_all/20, 1.25 eps_all].")
@click.option("--kernel", type=click.Choice(["laplace", "gaussian", "auto"]), default="laplace", show_default=True,
              help="Kernel of the density model: laplace (the model calibrate deconvolves; exact eps_i), "
                   "gaussian (eps_i up to a stated tolerance) or auto (by held-out likelihood).")
@click.option("--bandwidth", default="auto", show_default=True,
              help="auto (one global scale by held-out likelihood, as calibrate), variable (Abramson variable "
                   "bandwidths; assess only) or a fixed global kernel scale.")
@click.option("--adversary", metavar="QUERY",
              help="What the adversary knows about each database, a named query over the whole table (e.g. "
                   "\"count(*)\", \"sum(popul)\"): the risk is then conditional on it.")
@click.option("--adversary-sql", metavar="SQL", help="The adversary statistic as SQL over the table 'db'.")
@click.option("--buckets", type=int, default=None,
              help="Cut the databases into this many groups by the adversary statistic (default: as many as "
                   "keep 10 databases each, at most 5).")
@engine_options("duckdb (embedded) or spark: read, aggregate and screen on Spark and evaluate on its executors "
                "(pip install \"empdp[spark]\"; see docs/spark.md).")
@click.option("-o", "--output", "--out", "out", metavar="FILE",
              help="Write one row per individual to FILE.parquet or FILE.csv (mode 0600).")
@click.option("--report", "report", metavar="FILE", help="Write a self-contained HTML report to FILE.html (mode 0600).")
@extras_options
@click.option("--save-result", "save_result", metavar="FILE.json",
              help="Keep the result for 'empdp report' (summary, model, sweep, riskiest rows and their shifts; "
                   "mode 0600). The shifts and query values reveal the riskiest individuals' values: keep the "
                   "file private, or add --without-shifts.")
@click.option("--without-shifts", is_flag=True,
              help="With --save-result: leave out the shift rows (the report then has no density plots).")
@click.option("--hash-ids", is_flag=True, help="Replace ids by a keyed hash (HMAC-SHA256) in every output.")
@click.option("--hash-key-file", metavar="FILE", help="File holding the --hash-ids key (default: $EMPDP_HASH_KEY).")
@click.option("--memory-limit", help="DuckDB memory limit, e.g. 3GB (spills to disk beyond it; "
                                     "default: 2GB or 25% of memory, whichever is smaller).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads for reading and for the exact evaluation (default: every core).")
@click.option("--workers", type=click.Choice(["auto", "threads", "processes"]), default="auto", show_default=True,
              help="Evaluate individuals in threads or in worker processes (auto: threads for the default "
                   "model, processes when there are many individuals for the others, about 15% faster there on "
                   "two cores). Same results either way.")
@click.option("--drop-null-ids", is_flag=True, help="Drop rows whose id is NULL instead of failing.")
@click.option("--no-screening", is_flag=True, help="Evaluate every individual exactly (slower; same results).")
@output_options
def assess_cmd(source, id_col, by, query, where, sql, epsilon, kernel, bandwidth, adversary, adversary_sql, buckets,
               engine, spark_master, spark_remote, table, out, report, calibration, audit,
               save_result, without_shifts, hash_ids, hash_key_file, memory_limit, threads, workers, drop_null_ids, no_screening,
               as_json, quiet, verbose, debug):
    """Per-individual empirical privacy risk of releasing QUERY of each database.

    Drops each individual from every database, re-computes the query, and
    compares the query's estimated density with and without them: δ_i(ε) per
    individual, worst case δ(ε), total risk δ*(ε), and ε_all, the ε from
    which everyone is protected.

    \b
    Examples:
      empdp assess sample_data/countymurders.parquet --id countyid --by year --query "mean(murdrate)"
      empdp assess data/*.parquet --id customer --by month --query "sum(kwh)" -e 0.5 -e 1 --out risk.parquet
      empdp assess panel.duckdb::sales --id shop --by day --sql "SELECT median(amount) FROM db" --json
      empdp assess data.parquet --id id --by year --query "mean(x)" --save-result r.json   # then: empdp report
      empdp assess --table lake.claims --engine spark --id patient --by month --query "mean(cost)"
    """
    setup_logging(verbose, quiet, debug)
    # every input is checked before the long computation, so bad input writes nothing
    engine_kw = engine_settings(source, engine, spark_master, spark_remote, table)
    check_output(out, "--out", (".parquet", ".pq", ".csv"), ".parquet or .csv")
    check_output(report, "--report", (".html", ".htm"), ".html")
    check_output(save_result, "--save-result", (".json",), ".json")
    outputs = {"--out": out, "--report": report, "--save-result": save_result}
    for option, path in outputs.items():  # never write over an input, nor two outputs to one file
        refuse_overwrite(path, source, calibration, audit, option=option)
        refuse_overwrite(path, *[p for o, p in outputs.items() if o != option and p], option=option)
    if without_shifts and not save_result:
        raise InputError("--without-shifts applies to --save-result: give --save-result FILE.json too")
    if (calibration or audit) and not report:
        raise InputError("--calibration and --audit add sections to the HTML report: give --report FILE.html "
                         "too (or use 'empdp report' on a --save-result file)")
    key = load_hash_key(hash_key_file) if hash_ids or hash_key_file else None
    cal, aud = load_extras(calibration, audit)
    started = time.perf_counter()
    show = (lambda v: keyed_hash(v, key)) if key else str
    with progress_bars(not (as_json or quiet), log) as progress:
        result = assess(source, id=id_col, by=by, query=query, where=where, sql=sql,
                        epsilon=list(epsilon) or None, kernel=kernel, bandwidth=parse_bandwidth(bandwidth),
                        memory_limit=memory_limit, threads=threads, workers=workers, drop_null_ids=drop_null_ids,
                        exact_all=bool(out), screening=not no_screening, adversary=adversary,
                        adversary_sql=adversary_sql, buckets=buckets, progress=progress, **engine_kw)
    log_summary(result, time.perf_counter() - started)
    # all outputs are committed together: a failure writing one leaves none of them
    with progress_bars(not (as_json or quiet), log) as progress, output_batch():
        if out:
            cols = [result.id_column, "eps_i", "delta", "n_databases", "max_abs_shift", "epsilon", "eps_bound",
                    "sole_contributor"]
            # the ε its delta column is at travels with the table
            if result.adversary:
                cols.append("bucket")  # the adversary bucket that sets the individual's eps_i
            rows = result.individuals.with_columns(pl.lit(float(result.epsilons[0])).alias("epsilon")).select(cols)
            if key:
                rows = rows.with_columns(pl.col(result.id_column).map_elements(show, return_dtype=pl.Utf8))
            _write(progress, out, write_table, rows, out)
        if report:
            from empdp.report import render_report

            _write(progress, report, render_report, result, report, epsilon=min(epsilon) if epsilon else None,
                   calibration=cal, audit=aud, hash_ids=key or False)
        if save_result:
            from empdp.assessment.result import save_result as save

            _write(progress, save_result, save, result, save_result, hash_ids=key, shifts=not without_shifts)
    if as_json:
        emit_json(result.to_dict())
    elif not quiet:
        from .render import print_assessment

        print_assessment(result, out=out, report=report, saved=save_result, show_id=show)


def _write(progress, path: str, write, *args, **kwargs) -> None:
    """One output as a progress stage (rendering the report takes seconds; the stage log times it)."""
    stage = f"writing {path}"
    progress(stage, 0, 0)
    write(*args, **kwargs)
    progress(stage, 1, 1)


def log_summary(r, seconds: float) -> None:
    """The facts of an assessment at INFO (sizes, model, eps_all), details at DEBUG; stderr only."""
    m = r.model
    log.info("%s of %s: %d databases (by %s), %d individuals (id %s), %d sole contributor(s)", r.query, r.source,
             r.n_databases, r.by_column, r.n_individuals, r.id_column, r.sole_contributors)
    log.info("density model: %s kernel, scale %.6g, %s bandwidths (sensitivity %g), %s among %d candidate(s), "
             "LOO log-likelihood %.6g", m.kernel, m.scale, "variable" if m.variable else "fixed", m.sensitivity,
             m.selected_by, len(m.candidates), m.loglik)
    log.info("eps_all %.6g; %d individual(s) evaluated exactly (screening %s); %d epsilon(s) in [%.4g, %.4g]; "
             "assessed in %.2f s", r.eps_all, r.n_evaluated, "on" if r.screening else "off", len(r.epsilons),
             r.epsilons[0], r.epsilons[-1], seconds)
    if not log.isEnabledFor(logging.DEBUG):
        return
    best = sorted(m.candidates, key=lambda c: -c["loglik"])[:5]
    log.debug("best candidates: %s", "; ".join(
        f"{c['kernel']} b={c['scale']:.4g} a={c['sensitivity']:g} loglik={c['loglik']:.4g}" for c in best))
    log.debug("bandwidths b_j in [%.4g, %.4g]; query values in [%.4g, %.4g]", m.bandwidths.min(),
              m.bandwidths.max(), r.q.min(), r.q.max())
    log.debug("independence: %s; representativeness: %s", r.independence,
              {k: v for k, v in r.representativeness.items() if k != "histogram"})
    for e, d, t, c in zip(r.epsilons, r.delta, r.total_risk, r.n_at_risk):
        log.debug("epsilon %.4g: delta %.4g, total risk %.4g, %d at risk", e, d, t, c)
