"""``empdp assess``."""

from __future__ import annotations

import click

import polars as pl

from empdp.assess import assess
from empdp.errors import InputError
from empdp.io import keyed_hash, load_hash_key

from ._common import emit_json, output_options, progress_bars, setup_logging, write_table


def parse_bandwidth(value: str):
    if value is None or value == "auto":
        return "auto"
    try:
        return float(value)
    except ValueError:
        raise InputError(f"--bandwidth must be 'auto' or a positive number; got {value!r}") from None


def query_options(f):
    """``--id --by (--query [--where] | --sql)`` shared by assess and calibrate."""
    f = click.option("--sql", help="Generic query over the table 'db' (one database), e.g. "
                                   "\"SELECT avg(x) FROM db WHERE y > 0\".")(f)
    f = click.option("--where", help="SQL filter applied before the aggregate, e.g. \"age >= 18\".")(f)
    f = click.option("--query", "query", help="count(*), sum(x), mean(x), var(x), std(x), sum(a)/sum(b), "
                                              "min(x), max(x), median(x) or quantile(x, q).")(f)
    f = click.option("--by", required=True, help="Column naming the database (year, month, file...).")(f)
    f = click.option("--id", "id_col", required=True, help="Column naming the individual.")(f)
    f = click.argument("source")(f)
    return f


@click.command("assess")
@query_options
@click.option("--epsilon", "-e", "epsilon", multiple=True, type=float,
              help="Privacy level(s) to assess; repeat for several. Default: 50 values "
                   "log-spaced over [eps_all/20, 1.25 eps_all].")
@click.option("--kernel", type=click.Choice(["auto", "laplace", "gaussian"]), default="auto", show_default=True,
              help="Kernel of the density model (auto: by held-out likelihood).")
@click.option("--bandwidth", default="auto", show_default=True,
              help="'auto' (variable bandwidths by held-out likelihood) or a fixed global kernel scale.")
@click.option("--out", "out", help="Write one row per individual to FILE.parquet or FILE.csv (mode 0600).")
@click.option("--report", "report", help="Write a self-contained HTML report to FILE.html (mode 0600).")
@click.option("--hash-ids", is_flag=True, help="Replace ids by a keyed hash (HMAC-SHA256) in every output.")
@click.option("--hash-key-file", help="File holding the --hash-ids key (default: $EMPDP_HASH_KEY).")
@click.option("--memory-limit", help="DuckDB memory limit, e.g. 3GB (spills to disk beyond it).")
@click.option("--drop-null-ids", is_flag=True, help="Drop rows whose id is NULL instead of failing.")
@click.option("--no-screening", is_flag=True, help="Evaluate every individual exactly (slower; same results).")
@output_options
def assess_cmd(source, id_col, by, query, where, sql, epsilon, kernel, bandwidth, out, report, hash_ids,
               hash_key_file, memory_limit, drop_null_ids, no_screening, as_json, quiet, verbose, debug):
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
    """
    setup_logging(verbose, quiet, debug)
    if out and not out.lower().endswith((".parquet", ".pq", ".csv")):
        raise InputError(f"--out {out!r} must end in .parquet or .csv")
    if report and not report.lower().endswith((".html", ".htm")):
        raise InputError(f"--report {report!r} must end in .html")
    key = load_hash_key(hash_key_file) if hash_ids or hash_key_file else None
    with progress_bars(not (as_json or quiet)) as progress:
        result = assess(source, id=id_col, by=by, query=query, where=where, sql=sql,
                        epsilon=list(epsilon) or None, kernel=kernel, bandwidth=parse_bandwidth(bandwidth),
                        memory_limit=memory_limit, drop_null_ids=drop_null_ids, exact_all=bool(out),
                        screening=not no_screening, progress=progress)
    show = (lambda v: keyed_hash(v, key)) if key else str
    if out:
        cols = [result.id_column, "eps_i", "delta", "n_databases", "max_abs_shift", "eps_bound",
                "sole_contributor"]
        table = result.individuals.select(cols)
        if key:
            table = table.with_columns(pl.col(result.id_column).map_elements(show, return_dtype=pl.Utf8))
        write_table(table, out)
    if report:
        from empdp.report import render_report

        render_report(result, report, epsilon=min(epsilon) if epsilon else None, hash_ids=key or False)
    if as_json:
        emit_json(result.to_dict())
    elif not quiet:
        from .render import print_assessment

        print_assessment(result, out=out, report=report, show_id=show)
