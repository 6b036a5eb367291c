"""``empdp assess --group-by COL``: one statistic per group and database, released together
(:func:`empdp.joint.groups.assess_grouped`; README, "Grouped statistics")."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from empdp import kernels
from empdp.errors import InputError
from empdp.io import load_hash_key, output_batch
from empdp.textfmt import fmt

from ._common import emit_json, engine_settings, log, progress_bars, write_table
from .assess import _out_rows, _show_id, _write, check_outputs, parse_joint_bandwidth

#: the --out columns of a grouped assessment
OUT_COLUMNS = ["eps_i", "eps_bound", "delta", "n_databases", "groups", "epsilon", "sole_contributor"]


def refuse_grouped_options(p: dict) -> None:
    """Refuse, before anything is read, what a grouped assessment does not take: one line naming it and why."""
    if len(p["query"]) + len(p["sql"]) != 1:
        raise InputError("--group-by computes one statistic per group: give one --query or one --sql "
                         f"(got {len(p['query'])} --query and {len(p['sql'])} --sql)")
    refused = (  # in the command's order, so the first one given is named
        (not kernels.is_laplace(p["kernel"]), f"--kernel {p['kernel']}",
         "grouped statistics use product Laplace kernels, whose eps_i are exact; drop --kernel"),
        (p["adversary"] is not None or p["adversary_sql"] is not None or p["buckets"] is not None,
         "--adversary/--buckets", "the adversary model conditions one statistic without groups"),
        (p["engine"] != "duckdb", f"--engine {p['engine']}", "grouped statistics read through DuckDB only so far"),
        (p["table"] is not None, "--table", "a catalog table is read by Spark, and grouped statistics read "
                                            "through DuckDB only so far; give a file, glob or folder as SOURCE"),
        (p["report"] is not None, "--report", "the HTML report does not show grouped statistics yet; use --json "
                                              "or --out"),
        (p["calibration"] is not None, "--calibration", "it adds a section to --report, which --group-by "
                                                        "does not take"),
        (p["audit"] is not None, "--audit", "it adds a section to --report, which --group-by does not take"),
        (p["save_result"] is not None, "--save-result", "'empdp report' does not read grouped results; use "
                                                        "--json or --out"),
        (p["without_shifts"], "--without-shifts", "it goes with --save-result, which --group-by does not take"),
        (p["workers"] != "auto", f"--workers {p['workers']}", "the grouped evaluation runs in this process"),
        (p["no_screening"], "--no-screening", "every individual's eps_i is exact (or labelled a bound) already"),
    )
    for given, option, why in refused:
        if given:
            raise InputError(f"{option} does not apply with --group-by: {why}")


def assess_grouped_command(p: dict) -> None:
    """``empdp assess ... --group-by COL``; ``p`` are the command's parameters. Every input is checked
    first, so bad input writes nothing."""
    from empdp.joint.groups import assess_grouped

    refuse_grouped_options(p)
    bandwidth = parse_joint_bandwidth(p["bandwidth"], None)
    engine_settings(p["source"], p["engine"], p["spark_master"], p["spark_remote"], p["table"])
    out = p["out"]
    check_outputs(p["source"], out, None, None, False)
    key = load_hash_key(p["hash_key_file"]) if p["hash_ids"] or p["hash_key_file"] else None
    statistic = {"query": p["query"][0]} if p["query"] else {"sql": p["sql"][0]}
    started = time.perf_counter()
    with progress_bars(not (p["as_json"] or p["quiet"]), log) as progress:
        result = assess_grouped(p["source"], id=p["id_col"], by=p["by"], group_by=p["group_by"], **statistic,
                                where=p["where"], epsilon=list(p["epsilon"]) or None, bandwidth=bandwidth,
                                drop_null_ids=p["drop_null_ids"], memory_limit=p["memory_limit"],
                                threads=p["threads"], progress=progress)
    log.info("%s by %s of %s: %d groups (%s), %d databases, %d individuals, %d bounded only; eps_all %.6g; "
             "assessed in %.2f s", result.query, result.group_by, result.source, len(result.groups),
             "one joint query" if result.joint else "each individual on the groups their rows are in",
             result.n_databases, result.individuals.height, result.n_bound_only, result.eps_all,
             time.perf_counter() - started)
    if out:
        with progress_bars(not (p["as_json"] or p["quiet"]), log) as progress, output_batch():
            _write(progress, out, write_table, _out_rows(result, [result.id_column, *OUT_COLUMNS], key), out)
    if p["as_json"]:
        emit_json(result.to_dict())
    elif not p["quiet"]:
        print_grouped_assessment(result, out=out, show_id=_show_id(key))


def print_grouped_assessment(result, out: str | None = None, show_id=str, top: int = 10,
                             console: Console | None = None) -> None:
    """Summary of a grouped assessment: the groups, ε_all (and its bound when some individuals are only
    bounded), the sweep (with the unresolved counts, :func:`.render._sweep`), and the riskiest individuals (exact values; bounds
    only in the eps_bound column)."""
    from .render import _eps_all, _written, eps_i_cell, riskiest_table, shown, summary_end

    con = console or Console(highlight=False, soft_wrap=True)
    G = len(result.groups)
    con.print(f"[bold]empdp assess[/bold]  {shown(result.source)}  ({shown(result.query)} by {shown(result.group_by)}, "
              f"{G} groups)")
    summary = Table.grid(padding=(0, 2))
    groups = ", ".join(shown(g) for g in result.groups[:8]) + (", ..." if G > 8 else "")
    summary.add_row("groups", f"{G}: {groups}")
    summary.add_row("assessed", "as one joint query of the groups' statistics" if result.joint else
                    "each individual jointly on the groups their rows are in (at most 3; more: a bound)")
    summary.add_row("databases", f"{result.n_databases}  (by {shown(result.by_column)})")
    summary.add_row("individuals", f"{result.individuals.height}  (id {shown(result.id_column)})")
    if result.n_bound_only:  # eps_all is over the exact eps_i; only the bound covers everyone
        summary.add_row("eps_all", f"{fmt(result.eps_all)}  (over the individuals with exact eps_i)")
        summary.add_row("eps_all bound", f"{_eps_all(result.eps_all_bound, result.sole_contributors)}; "
                                         f"{result.n_bound_only} individual(s) in more than 3 groups are only "
                                         "bounded (eps_bound)")
    else:
        summary.add_row("eps_all", _eps_all(result.eps_all, result.sole_contributors))
    summary_end(con, summary, result, "risk by epsilon of the release of every group")
    riskiest_table(con, result, top, show_id, "", [
        ("delta", lambda row: "-" if row["delta"] is None else fmt(row["delta"])), ("eps_i", eps_i_cell),
        ("eps_bound", lambda row: fmt(row["eps_bound"])), ("groups", lambda row: str(row["groups"])),
        ("databases", lambda row: str(row["n_databases"]))])
    _written(con, out)
