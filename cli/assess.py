"""``empdp assess``."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import click
import polars as pl

from empdp import kernels
from empdp import query as query_forms
from empdp.assessment.assess import assess
from empdp.errors import InputError
from empdp.io import keyed_hash, load_hash_key, output_batch, refuse_overwrite
from empdp.models import GROUPED, JOINT, MAX_DIM, ONE, model_for
from empdp.settings import Data, Execution, Intervals, Model, Precision

from ._common import (
    check_output,
    emit_json,
    engine_object,
    engine_options,
    engine_settings,
    given_options,
    log,
    output_options,
    progress_bars,
    setup_logging,
    write_table,
)
from .report import extras_options, load_extras


class KernelChoice(click.Choice):
    """``--kernel``: the kernels of the registry (:mod:`empdp.kernels`) and ``auto``, read when parsed."""

    def __init__(self):
        super().__init__(kernels.choices())

    @property
    def choices(self):
        return kernels.choices()

    @choices.setter
    def choices(self, value):  # click sets the choices it was given; the registry decides them
        pass


def query_options(f=None, *, joint: bool = False):
    """``SOURCE --id --by (--query [--where] | --sql)`` shared by assess and calibrate (SOURCE may be
    left out for ``--table``; :func:`engine_settings` checks that one of them is given). ``joint``:
    ``--query`` and ``--sql`` may be repeated, one statistic each (they are then tuples)."""
    if f is None:
        return lambda g: query_options(g, joint=joint)
    many = {"multiple": True} if joint else {}
    again = f" Repeat (up to {MAX_DIM} times) for statistics released together." if joint else ""
    f = click.option("--sql", **many, help="Generic query over the table 'db' (one database), e.g. "
                                           "\"SELECT avg(x) FROM db WHERE y > 0\"." + again)(f)
    f = click.option("--where", help="SQL filter applied before the aggregate, e.g. \"age >= 18\".")(f)
    f = click.option("--query", "query", metavar="QUERY", **many, help=f"One of {query_forms.HELP}." + again)(f)
    f = click.option("--by", required=True, help="Column naming the database (year, month, file...).")(f)
    f = click.option("--id", "id_col", required=True, help="Column naming the individual.")(f)
    f = click.argument("source", required=False)(f)
    return f


def uncertainty_options(f):
    """``--uncertainty`` and its settings (docs/method.md#71-uncertainty-of-the-estimates)."""
    f = click.option("--seed", type=int, default=None,
                     help="With --uncertainty: seed of the subsamples (same seed, same intervals).")(f)
    f = click.option("--uncertainty-rows", type=click.Choice(["riskiest", "all"]), default=None,
                     help="With --uncertainty: eps_i intervals (eps_i_lo, eps_i_hi) for the riskiest table's rows "
                          "(default) or, with --out, for every row (one exact evaluation per individual and "
                          "replicate: about --replicates times the eps_i stage).")(f)
    f = click.option("--level", type=float, default=None,
                     help="With --uncertainty: the intervals' level (default 0.9).")(f)
    f = click.option("--replicates", type=int, default=None,
                     help="With --uncertainty: subsamples of the databases (default 200).")(f)
    f = click.option("--uncertainty", is_flag=True,
                     help="Intervals for eps_all and, at each epsilon, for delta, total risk and the number at risk: "
                          "how far they move over other sets of databases from the same process (subsamples of "
                          "the databases; see docs/method.md).")(f)
    return f


@click.command("assess")
@query_options(joint=True)
@click.option("--epsilon", "-e", "epsilon", multiple=True, type=float,
              help="Privacy level(s) to assess; repeat for several. Default: 50 values "
                   "log-spaced over [eps_all/20, 1.25 eps_all].")
@click.option("--group-by", "group_by", metavar="COL",
              help="One statistic per group of COL and database (e.g. mean by region each year), released "
                   "together; see the README, \"Grouped statistics\".")
@click.option("--kernel", type=KernelChoice(), default=kernels.DEFAULT.name, show_default=True,
              help="Kernel of the density model: " + ", ".join(f"{k.name} ({k.summary})" for k in
                                                              kernels.KERNELS.values())
                   + " or auto (by held-out likelihood).")
@click.option("--bandwidth", default="auto", show_default=True,
              help="auto (one global scale by held-out likelihood, as calibrate), variable (Abramson variable "
                   "bandwidths; assess only) or a fixed global kernel scale; for 2-3 statistics auto or one "
                   "scale per statistic in its own units, B1,B2[,B3].")
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
                                     "default: 1GB or 25% of memory, whichever is smaller).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads for reading and for the exact evaluation (default: every core).")
@click.option("--workers", type=click.Choice(["auto", "threads", "processes"]), default="auto", show_default=True,
              help="Evaluate individuals in threads or in worker processes (auto: threads for the default "
                   "model, processes when there are many individuals for the others, a few percent faster there "
                   "on two cores). Same results either way.")
@click.option("--drop-null-ids", is_flag=True, help="Drop rows whose id is NULL instead of failing.")
@click.option("--no-screening", is_flag=True, help="Evaluate every individual exactly (slower; same results).")
@click.option("--tolerance", type=float, default=None,
              help="2-3 statistics: the total risk is certified to a bracket [lo, hi] with hi - lo <= tolerance x hi "
                   "(default 1e-4); --out's delta_lo, delta_hi bracket each individual's delta.")
@click.option("--exact", is_flag=True,
              help="2-3 statistics: every individual's delta exact (and the total risk), not certified brackets: "
                   "an exact evaluation of every individual at every epsilon (slower; see docs/method.md).")
@uncertainty_options
@output_options
def assess_cmd(source, id_col, by, query, where, sql, epsilon, group_by, kernel, bandwidth, adversary, adversary_sql, buckets,
               engine, spark_master, spark_remote, table, out, report, calibration, audit, key_file, allow_unsigned,
               save_result, without_shifts, hash_ids, hash_key_file, memory_limit, threads, workers, drop_null_ids, no_screening,
               tolerance, exact, uncertainty, replicates, level, uncertainty_rows, seed, as_json, quiet, verbose, debug):
    """Per-individual empirical privacy risk of releasing QUERY of each database.

    Drops each individual from every database, re-computes the query, and
    compares the query's estimated density with and without them: δ_i(ε) per
    individual, worst case δ(ε), total risk δ*(ε), and ε_all, the ε from
    which everyone is protected. With 2 or 3 --query (or --sql), of the
    statistics released together (--bandwidth auto or B1,B2[,B3]); with
    --group-by COL, of the statistic of each group of COL.

    \b
    Examples:
      empdp assess sample_data/countymurders.parquet --id countyid --by year --query "mean(murdrate)"
      empdp assess data/*.parquet --id customer --by month --query "sum(kwh)" -e 0.5 -e 1 --out risk.parquet
      empdp assess panel.duckdb::sales --id shop --by day --sql "SELECT median(amount) FROM db" --json
      empdp assess data.parquet --id id --by year --query "mean(x)" --save-result r.json   # then: empdp report
      empdp assess --table lake.claims --engine spark --id patient --by month --query "mean(cost)"
      empdp assess data.parquet --id id --by year --query "sum(x)" --query "count(*)"   # released together
      empdp assess data.parquet --id person --by year --query "mean(income)" --group-by region
      empdp assess data.parquet --id id --by year --query "mean(x)" --uncertainty --seed 1   # 90% intervals
    """
    setup_logging(verbose, quiet, debug)
    ctx = click.get_current_context()
    # every input is checked before the long computation, so bad input writes nothing
    model, d = model_for(list(query), list(sql), group_by)
    model.refuse(given_options(ctx, REFUSABLE), d)
    bandwidth = parse_bandwidth(bandwidth, model, d)
    engine = engine_object(engine_settings(source, engine, spark_master, spark_remote, table))
    data = Data(source, id_col, by, drop_null_ids=drop_null_ids)
    curator = Model(kernel=kernel, bandwidth=bandwidth, adversary=adversary, adversary_sql=adversary_sql,
                    buckets=buckets)
    execution = Execution(engine=engine, memory_limit=memory_limit, threads=threads, workers=workers,
                          screening=not no_screening)
    intervals = uncertainty_settings(uncertainty, replicates, level, uncertainty_rows, seed, adversary or adversary_sql,
                                     out, engine)
    precision = None if tolerance is None and not exact else Precision(1e-4 if tolerance is None else tolerance,
                                                                        exact)
    check_outputs(source, out, report, save_result, without_shifts, calibration, audit)
    if (calibration or audit) and not report:
        raise InputError("--calibration and --audit add sections to the HTML report: give --report FILE.html "
                         "too (or use 'empdp report' on a --save-result file)")
    key = load_hash_key(hash_key_file) if hash_ids or hash_key_file else None
    cal, aud = load_extras(calibration, audit, key_file, allow_unsigned)
    started = time.perf_counter()
    with progress_bars(not (as_json or quiet), log) as progress:
        result = assess(data, query=list(query) or None, sql=list(sql) or None, where=where, group_by=group_by,
                        epsilon=list(epsilon) or None, model=curator, exact_all=bool(out),
                        execution=replace(execution, progress=progress), precision=precision,
                        intervals=intervals)
    with result:
        log_summary(result, time.perf_counter() - started)
        # all outputs are committed together: a failure writing one leaves none of them
        with progress_bars(not (as_json or quiet), log) as progress, output_batch():
            if out:
                _write(progress, out, write_table, out_rows(result, key), out)
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
            from .render import print_result

            print_result(result, out=out, report=report, saved=save_result, show_id=_show_id(key))


#: the options some curator models do not take (:mod:`empdp.models`), in the command's order
REFUSABLE = ("kernel", "adversary", "adversary_sql", "buckets", "engine", "table", "report", "calibration", "audit",
             "save_result", "without_shifts", "workers", "no_screening", "uncertainty", "tolerance", "exact")


def uncertainty_settings(uncertainty: bool, replicates, level, rows, seed, adversary, out, engine) -> Intervals | None:
    """The intervals ``assess`` estimates, checked before any data are read (None without ``--uncertainty``)."""
    if not uncertainty:
        given = [flag for flag, value in (("--replicates", replicates), ("--level", level),
                                          ("--uncertainty-rows", rows), ("--seed", seed)) if value is not None]
        if given:
            raise InputError(f"{given[0]} goes with --uncertainty: add --uncertainty, or drop {given[0]}")
        return None
    if adversary:
        raise InputError("--uncertainty is estimated for the plain assessment of one statistic, not against an "
                         "adversary: drop --uncertainty, or --adversary/--adversary-sql")
    if engine != "duckdb":
        raise InputError("--uncertainty is not estimated on the Spark engine yet: drop --uncertainty, or assess "
                         "with --engine duckdb")
    if rows == "all" and not out:
        raise InputError("--uncertainty-rows all writes an interval for every row of --out FILE: add --out")
    return Intervals(replicates=200 if replicates is None else replicates, level=0.9 if level is None else level,
                     rng=seed, rows="all" if rows == "all" else 10)


def parse_bandwidth(value: str, model=ONE, d: int = 1):
    """``--bandwidth`` for the library: ``auto``; for one statistic ``variable`` or a positive scale; for
    2–3 statistics one positive scale per statistic in its own units, ``B1,B2[,B3]``; for grouped
    statistics one scale for every group or one per group (a count the library checks once it knows the
    groups)."""
    if value is None or value == "auto":
        return "auto"
    if model is ONE:
        if value == "variable":
            return value
        scales = _scales(value, "auto, variable or a positive number")
        if len(scales) != 1:
            raise InputError(f"--bandwidth must be auto, variable or a positive number; got {value!r}")
        return scales[0]
    form = ",".join(f"B{k + 1}" for k in range(d)) if model is JOINT else "B1,B2,..."
    what = f"{d} statistics" if model is JOINT else "grouped statistics"
    if value == "variable":
        raise InputError(f"--bandwidth variable (Abramson variable bandwidths) is for one statistic; for {what} "
                         f"give auto or one scale per {'statistic' if model is JOINT else 'group'}, {form}")
    scales = _scales(value, f"auto or positive numbers {form}")
    if model is JOINT and len(scales) != d:
        raise InputError(f"--bandwidth gives {len(scales)} scale(s) for {d} statistics: give one per statistic "
                         f"in its own units, {form}, or auto")
    return scales[0] if model is GROUPED and len(scales) == 1 else scales


def _scales(value: str, expected: str) -> list[float]:
    try:
        scales = [float(b) for b in value.split(",")]
    except ValueError:
        raise InputError(f"--bandwidth must be {expected}; got {value!r}") from None
    if not all(0 < b < float("inf") for b in scales):
        raise InputError(f"--bandwidth scales must be positive numbers; got {value!r}")
    return scales


def check_outputs(source, out, report, save_result, without_shifts, calibration=None, audit=None) -> None:
    """The output paths: the right suffixes, never over an input, never two outputs to one file."""
    check_output(out, "--out", (".parquet", ".pq", ".csv"), ".parquet or .csv")
    check_output(report, "--report", (".html", ".htm"), ".html")
    check_output(save_result, "--save-result", (".json",), ".json")
    outputs = {"--out": out, "--report": report, "--save-result": save_result}
    for option, path in outputs.items():
        refuse_overwrite(path, source, calibration, audit, option=option)
        refuse_overwrite(path, *[p for o, p in outputs.items() if o != option and p], option=option)
    if without_shifts and not save_result:
        raise InputError("--without-shifts applies to --save-result: give --save-result FILE.json too")


def _write(progress, path: str, write, *args, **kwargs) -> None:
    """One output as a progress stage (rendering the report takes seconds; the stage log times it)."""
    stage = f"writing {path}"
    progress(stage, 0, 0)
    write(*args, **kwargs)
    progress(stage, 1, 1)


def log_summary(r, seconds: float) -> None:
    """The facts of an assessment at INFO (sizes, model, eps_all), details at DEBUG; stderr only."""
    for line in r.log_lines():
        log.info("%s", line)
    log.info("%d epsilon(s) in [%.4g, %.4g]; assessed in %.2f s", len(r.epsilons), r.epsilons[0], r.epsilons[-1],
             seconds)
    for line in getattr(r, "warning_details", ()):  # the notes a warning summarises (grouped statistics)
        log.info("note: %s", line)
    if log.isEnabledFor(logging.DEBUG):
        for line in r.debug_lines():
            log.debug("%s", line)
        for e, dl, t, c in zip(r.epsilons, r.delta, r.total_risk, r.n_at_risk):
            log.debug("epsilon %.4g: delta %.4g, total risk %.4g, %d at risk", e, dl, t, c)


def _show_id(key: bytes | None):
    """How every output shows an id: as it is, or (``--hash-ids``) its keyed hash."""
    return (lambda v: keyed_hash(v, key)) if key else str


def out_rows(result, key: bytes | None) -> pl.DataFrame:
    """The ``--out`` table (:meth:`out_table`), with the ids hashed under ``key``."""
    rows = result.out_table()
    if key:
        rows = rows.with_columns(pl.col(result.id_column).map_elements(_show_id(key), return_dtype=pl.Utf8))
    return rows
