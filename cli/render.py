"""Human-readable terminal output (rich tables)."""

from __future__ import annotations

import numpy as np
import polars as pl
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from empdp.textfmt import bandwidth_choice, fmt, terminal_safe
from empdp.textfmt import fmt as _fmt


def shown(value) -> str:
    """A value from the data or a file (id, label, column name, query, path, warning) as rich markup
    that prints as itself: control characters shown escaped (:func:`terminal_safe`), brackets not
    read as styles."""
    return escape(terminal_safe(value))


def print_assessment(result, out: str | None = None, report: str | None = None, show_id=str, top: int = 10,
                     console: Console | None = None, saved: str | None = None) -> None:
    """Summary, a few sweep rows, and the riskiest individuals."""
    con = console or Console(highlight=False, soft_wrap=True)
    m = result.model
    con.print(f"[bold]empdp assess[/bold]  {shown(result.source)}")
    summary = Table.grid(padding=(0, 2))
    summary.add_row("query", shown(result.query))
    summary.add_row("databases", f"{result.n_databases}  (by {shown(result.by_column)})")
    summary.add_row("individuals", f"{result.n_individuals}  (id {shown(result.id_column)})")
    bw = (f"{m.kernel}, scale {_fmt(m.scale)}" + (f", variable (a = {m.sensitivity:g})" if m.variable else "")
          + f", {bandwidth_choice(m.selected_by)}")
    summary.add_row("density model", bw + ("  (unconditional; each adversary bucket has its own, below)"
                                           if result.adversary else ""))
    summary.add_row("eps_all", _eps_all(result.eps_all, result.sole_contributors, result.eps_tolerance,
                                        getattr(result, "uncertainty", None)))
    summary.add_row("sole contributors", str(result.sole_contributors))
    ind = result.independence
    summary.add_row("independence", f"Ljung-Box p = {_fmt(ind['ljung_box_p'], 3)}, trend p = {_fmt(ind['trend_p'], 3)}")
    con.print(summary)
    unc = getattr(result, "uncertainty", None)
    for w in [*result.warnings, *(unc.warnings if unc is not None else [])]:
        con.print(f"[yellow]warning:[/yellow] {shown(w)}")

    if result.adversary:
        _print_adversary(con, result)

    con.print(_sweep(result, "risk by epsilon" + (" (conditional on the adversary statistic)" if result.adversary
                                                  else "")))

    top_df = result.riskiest(top)
    tol = f" (eps_i: smallest epsilon with delta_i <= {result.eps_tolerance:g})" if result.eps_tolerance else ""
    t = Table(title=f"riskiest individuals at epsilon = {_fmt(result.epsilons[0])}, by delta{tol}",
              title_justify="left")
    unc = getattr(result, "uncertainty", None)
    interval = f"eps_i {unc.level:.0%} interval" if unc is not None else None
    for col in (shown(result.id_column), "delta", "eps_i", *([interval] if interval else []), "databases",
                "largest shift", ""):
        t.add_column(col, justify="right" if col else "left")
    bounds = {}
    if interval:
        ind = result.individuals.filter(pl.col("eps_i_lo").is_not_null())
        bounds = dict(zip(ind[result.id_column].to_list(), zip(ind["eps_i_lo"], ind["eps_i_hi"])))
    for row in top_df.iter_rows(named=True):
        eps_i = "inf (sole)" if row["sole_contributor"] else _fmt(row["eps_i"])
        lo_hi = bounds.get(row[result.id_column])
        extra = [f"{_fmt(lo_hi[0])}–{_fmt(lo_hi[1])}" if lo_hi else ""] if interval else []
        t.add_row(shown(show_id(row[result.id_column])), _fmt(row["delta"]), eps_i, *extra, str(row["n_databases"]),
                  _fmt(row["max_abs_shift"]), "sets eps_all" if row["sets_eps_all"] else "")
    con.print(t)
    _written(con, out, report, saved)


def _eps_all(eps_all: float, sole: int, tolerance: float | None = None, uncertainty=None) -> str:
    """ε_all, its interval when estimated, and what it means, sole contributors (whom no ε protects) set apart."""
    except_sole = f", except the {sole} sole contributor(s), who never are" if sole else ""
    if tolerance:  # Gaussian kernels: protected only up to the tolerance
        meaning = f"from here every individual's delta_i <= {tolerance:g}{except_sole}"
    else:
        meaning = f"every individual protected (delta_i = 0) from here{except_sole}"
    interval = ""
    if uncertainty is not None:
        lo, hi = uncertainty.eps_all
        interval = f" ({uncertainty.level:.0%} interval {_fmt(lo)}–{_fmt(hi)})"
    return f"{_fmt(eps_all)}{interval}  ({meaning})"


def _sweep(result, title: str) -> Table:
    """δ(ε), δ*(ε) and the number at risk at every ε, or at 10 of them spread over the sweep; and the
    individuals known only by a bound above ε (grouped statistics' ``n_unresolved``) when there are any."""
    sweep = Table(title=title, title_justify="left")
    unresolved = getattr(result, "n_unresolved", None)
    unresolved = unresolved if unresolved is not None and np.any(unresolved) else None
    for col in ("epsilon", "delta (worst)", "total risk", "at risk") + (("unresolved (bound only)",)
                                                                       if unresolved is not None else ()):
        sweep.add_column(col, justify="right")
    E = len(result.epsilons)
    rows = range(E) if E <= 12 else np.unique(np.linspace(0, E - 1, 10).round().astype(int))
    for k in rows:
        sweep.add_row(_fmt(result.epsilons[k]), _fmt(result.delta[k]), _fmt(result.total_risk[k]),
                      str(int(result.n_at_risk[k])), *(() if unresolved is None else (str(int(unresolved[k])),)))
    return sweep


def _written(con, out: str | None, report: str | None = None, saved: str | None = None) -> None:
    if out:
        con.print(f"per-individual table written to {shown(out)} (mode 0600)")
    if report:
        con.print(f"HTML report written to {shown(report)} (mode 0600)")
    if saved:
        con.print(f"result saved to {shown(saved)} (mode 0600); render it with 'empdp report {shown(saved)} -o FILE.html'")


def print_joint_assessment(result, out: str | None = None, show_id=str, top: int = 10,
                           console: Console | None = None, report: str | None = None,
                           saved: str | None = None) -> None:
    """Summary of a joint assessment (2–3 statistics released together): the statistics, the model,
    ε_all, a few sweep rows, and the riskiest individuals with exact δ_i at the smallest ε and ε_i."""
    con = console or Console(highlight=False, soft_wrap=True)
    m, d = result.model, result.model.d
    con.print(f"[bold]empdp assess[/bold]  {shown(result.source)}  (joint query, {d} statistics)")
    summary = Table.grid(padding=(0, 2))
    for k, q in enumerate(result.queries):
        summary.add_row("statistics" if k == 0 else "", f"{k + 1}. {shown(q)}")
    summary.add_row("databases", f"{len(result.labels)}  (by {shown(result.by_column)})")
    summary.add_row("individuals", f"{result.individuals.height}  (id {shown(result.id_column)})")
    r = np.corrcoef(result.q, rowvar=False)
    summary.add_row("correlation", ", ".join(f"{i + 1}-{j + 1}: {_fmt(r[i, j])}"
                                             for i in range(d) for j in range(i + 1, d)) + "  (over the databases)")
    scales = ", ".join(_fmt(b) for b in m.scales)
    summary.add_row("density model", f"product Laplace, whitened axes, scales {scales} (whitened units), "
                                     f"{bandwidth_choice(m.selected_by)}" if m.whitened else
                    f"product Laplace, the statistics' own axes, scales {scales}, {bandwidth_choice(m.selected_by)}")
    summary.add_row("eps_all", _eps_all(result.eps_all, result.sole_contributors))
    summary_end(con, summary, result, "risk by epsilon of the joint release")
    shifts = [(f"shift {k + 1}", lambda row, k=k: _fmt(row[f"max_abs_shift_{k + 1}"])) for k in range(d)]
    riskiest_table(con, result, top, show_id, "(shift k: the largest shift of statistic k)",
                   [("delta", lambda row: _fmt(row["delta"])), ("eps_i", eps_i_cell),
                    ("databases", lambda row: str(row["n_databases"])), *shifts])
    _written(con, out, report, saved)


def summary_end(con, summary: Table, result, sweep_title: str) -> None:
    """The summary's last rows (sole contributors; for several statistics how exact the total risk is),
    the summary, the warnings and the sweep table."""
    summary.add_row("sole contributors", str(result.sole_contributors))
    if getattr(result, "total_risk_bounds", None) is not None or getattr(result, "exact", False):
        summary.add_row("total risk", "exact (--exact)" if result.exact else
                        f"certified to a relative {result.tolerance:g} (its bracket: JSON total_risk_bounds; "
                        "each delta's: --out delta_lo, delta_hi); eps_all, delta and at risk are exact")
    con.print(summary)
    for w in result.warnings:
        con.print(f"[yellow]warning:[/yellow] {shown(w)}")
    con.print(_sweep(result, sweep_title))


def eps_i_cell(row) -> str:
    """A row's exact ε_i, ∞ for a sole contributor, or 'bound only' where only a bound is known."""
    if row["sole_contributor"]:
        return "inf (sole)"
    return "bound only" if row["eps_i"] is None else _fmt(row["eps_i"])


def riskiest_table(con, result, top: int, show_id, note: str, columns: list) -> None:
    """The riskiest individuals (:meth:`riskiest`) at the smallest ε: the id, then ``columns``
    (header, row → text), and which individual sets ε_all."""
    t = Table(title=f"riskiest individuals at epsilon = {_fmt(result.epsilons[0])}, by delta {note}".rstrip(),
              title_justify="left")
    for col in (shown(result.id_column), *[c for c, _ in columns], ""):
        t.add_column(col, justify="right" if col else "left")
    for row in result.riskiest(top).iter_rows(named=True):
        t.add_row(shown(show_id(row[result.id_column])), *[cell(row) for _, cell in columns],
                  "sets eps_all" if row["sets_eps_all"] else "")
    con.print(t)


def _print_adversary(con, result) -> None:
    """The buckets side by side with the unconditional risk: what the adversary's knowledge costs."""
    adv = result.adversary
    t = Table(title=f"adversary knows {shown(adv['statistic'])}: eps_all by bucket "
                    f"(unconditional eps_all {_fmt(adv['unconditional']['eps_all'])})", title_justify="left")
    for col in ("bucket", "statistic from", "to", "databases", "bandwidth", "eps_all"):
        t.add_column(col, justify="right")
    for k, b in enumerate(adv["buckets"]):
        t.add_row(str(k), _fmt(b["lo"]), _fmt(b["hi"]), str(b["n_databases"]), _fmt(b["bandwidth"]),
                  _fmt(b["eps_all"]))
    con.print(t)


def print_grouped_assessment(result, out: str | None = None, show_id=str, top: int = 10,
                             console: Console | None = None, report: str | None = None,
                             saved: str | None = None) -> None:
    """Summary of a grouped assessment: the groups, ε_all (and its bound when some individuals are only
    bounded), the sweep (with the unresolved counts, :func:`.render._sweep`), and the riskiest individuals (exact values; bounds
    only in the eps_bound column)."""
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
    _written(con, out, report, saved)


#: the terminal summary of each curator model (:mod:`empdp.models`)
PRINTERS = {"one": print_assessment, "joint": print_joint_assessment, "grouped": print_grouped_assessment}


def print_result(result, **options) -> None:
    """The terminal summary of any assessment, by its curator model."""
    PRINTERS[result.kind.key](result, **options)
