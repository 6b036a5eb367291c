"""The report's sections on grouped statistics, one statistic per group and database (docs/method.md#102-joint-queries):
summary, the risk curves and sweep, one row per group, the riskiest individuals, and the density of the
worst groups with and without the riskiest individual in them."""

from __future__ import annotations

import numpy as np
import polars as pl

from . import assessment as _a
from . import joint as _j
from . import plots
from .markup import Html, cards, code, explain, kv, num, p_badge, section, table, td, tr

#: ids of a grouped report's sections, in page order
GROUPED_SECTIONS = ("summary", "risk-curves", "at-risk", "sweep", "groups", "riskiest", "contours")
#: groups named in a row of the riskiest table before the rest are counted
NAMED_GROUPS = 3


def _rows_of(a, ids) -> np.ndarray:
    """The panel rows (:class:`empdp.loo.joint.GroupPanel`) of the individuals ``ids``."""
    panel = a.assessed.panel
    return panel.ids.search_sorted(pl.Series(list(ids), dtype=panel.ids.dtype)).to_numpy().astype(np.int64)


def _touched(a) -> np.ndarray:
    """(m, G) bool: the groups each individual's rows are in, in ``individuals``' row order."""
    return a.assessed.panel.touched[_rows_of(a, a.individuals[a.id_column])]


def _scale(a, g: int) -> float:
    """The kernel scale of group ``g``'s statistic in the model of that group alone, or of all groups (G ≤ 3)."""
    G = len(a.groups)
    if (g,) in a.models:
        return float(a.models[(g,)].scales[0])
    return float(a.models[tuple(range(G))].scales[g])


def summary(a, eps: float) -> str:
    G, k = len(a.groups), a.n_bound_only
    label = ("ε_all (everyone protected)" if not a.sole_contributors
             else f"ε_all (all but {a.sole_contributors:,} sole contributor(s) protected)")
    items = [(label, num(a.eps_all)), ("chosen ε", num(eps)), ("worst-case δ(ε)", num(a.delta[0])),
             ("total risk δ*(ε)", num(a.total_risk[0])), ("individuals at risk at ε", num(int(a.n_at_risk[0])))]
    if k:
        items[1:1] = [("ε bound (everyone, bounds included)", num(a.eps_all_bound))]
        items.append(("known only by a bound, above ε", num(int(a.n_unresolved[0]))))
    how = ("the groups' statistics as one joint release: every individual's ε<sub>i</sub> exact" if a.joint else
           "each individual jointly on the groups their rows are in (at most 3), every such ε<sub>i</sub> exact; "
           f"{k:,} individual(s) with rows in more than 3 groups have a certified bound only")
    rows = [("source", a.source), ("statistic of each group", Html("{} by {}").format(code(a.query), code(a.group_by))),
            ("groups", Html("{:,}: {}").format(G, ", ".join(str(g) for g in a.groups[:12]) + (" …" if G > 12 else ""))),
            ("databases", _a.databases(a)),
            ("individuals", Html("{:,} (id {})").format(_a.n_individuals(a), code(a.id_column))),
            ("assessed", Html(how)),
            ("density model", _j._model(a.models[tuple(range(G))]) if a.joint else
             "product Laplace kernels on the statistics of each set of groups, one scale per group (table below)"),
            ("total risk", "exact" if a.exact else f"certified to a relative {a.tolerance:g} (the midpoint of its "
                                                   "bracket is shown)"),
            ("sole contributors", a.sole_contributors)]
    note = _a.risk_note("The groups' statistics are published together, so an individual's risk is of the "
                        "vector of the groups their rows are in: each group's statistic can be empirically private "
                        "alone while together they expose the individual. ")
    return section("summary", "Summary", cards(items), kv(rows),
                   _a.warning_box(list(a.warnings) + list(a.warning_details)), note)


def sweep(a) -> str:
    E = len(a.epsilons)
    picks = range(E) if E <= _j.SWEEP_ROWS else np.unique(np.linspace(0, E - 1, _j.SWEEP_ROWS - 2).round().astype(int))
    head = ("<tr><th class='n'>ε</th><th class='n'>worst-case δ(ε)</th><th class='n'>total risk δ*(ε)</th>"
            "<th class='n'>at risk</th><th class='n'>unresolved</th></tr>")
    body = "".join(tr(a.epsilons[k], a.delta[k], a.total_risk[k], int(a.n_at_risk[k]), int(a.n_unresolved[k]))
                   for k in picks)
    text = (f"{'All' if E <= _j.SWEEP_ROWS else len(picks)} of the {E} assessed ε: the worst single "
            "δ<sub>i</sub>(ε), the total risk and the number of individuals with δ<sub>i</sub>(ε) > 0 (at risk), "
            "all over the individuals whose risk is exact; unresolved counts those known only by a bound that "
            "exceeds ε (they may be at risk there, and are left out of the other columns).")
    return section("sweep", "Risk by ε of the grouped release", table(head, body), explain(text))


def groups(a, eps: float) -> str:
    """One row per group: its individuals, its statistic over the databases, its kernel scale, the
    checks of its series, and the largest exact ε_i and the at-risk count among its individuals."""
    touched = _touched(a)
    eps_i = a.eps_i
    delta = a.individuals["delta_lo"].fill_null(0.0).to_numpy()
    largest = np.where(touched, np.nan_to_num(eps_i, nan=-1.0)[:, None], -1.0).max(axis=0, initial=-1.0)
    head = ("<tr><th>group</th><th class='n'>individuals</th><th class='n'>statistic: mean (min … max)</th>"
            "<th class='n'>kernel scale</th><th>autocorrelation, trend</th><th class='n'>largest ε<sub>i</sub></th>"
            f"<th class='n'>at risk at ε = {num(eps)}</th></tr>")
    body = []
    for g, value in enumerate(a.groups):
        mine = touched[:, g]
        q = a.q[:, g]
        known = eps_i[mine & np.isfinite(eps_i)]
        ind = a.independence[g] if g < len(a.independence) else {}
        worst = largest[g] >= 0 and largest[g] == largest.max()
        body.append(tr(td(Html("{}{}").format(code(value), " (worst)" if worst else ""), None), int(mine.sum()),
                       Html("{} ({} … {})").format(num(q.mean()), num(q.min()), num(q.max())), _scale(a, g),
                       td(Html("Ljung–Box {}; Mann–Kendall {}").format(p_badge(ind.get("ljung_box_p")),
                                                                      p_badge(ind.get("trend_p"))), None),
                       known.max() if len(known) else Html("–"), int((mine & (delta > 0)).sum())))
    text = ("Each group's statistic over the databases and the individuals with rows in it. The largest "
            "ε<sub>i</sub> is over those individuals whose ε<sub>i</sub> was computed (the riskiest ones, and "
            "everyone with --exact-all); an individual in several groups counts in each. At risk counts the "
            "individuals whose certified δ<sub>i</sub> at ε is above 0. The worst groups hold the individual "
            "with the largest ε<sub>i</sub>.")
    return section("groups", f"The {len(a.groups):,} groups", table(head, "".join(body)), explain(text))


def _named(a, touched_row) -> str:
    names = [str(a.groups[g]) for g in np.flatnonzero(touched_row)]
    more = len(names) - NAMED_GROUPS
    return ", ".join(names[:NAMED_GROUPS]) + (f" (+{more})" if more > 0 else "")


def riskiest(a, eps: float, rows, show) -> str:
    touched = a.assessed.panel.touched
    at = _rows_of(a, [r[a.id_column] for r in rows])
    head = ("<tr><th class='n'>#</th><th>id</th>"
            f"<th class='n'>δ<sub>i</sub> at ε = {num(eps)}</th><th class='n'>ε<sub>i</sub></th>"
            "<th class='n'>bound on ε<sub>i</sub></th><th class='n'>databases present</th><th>groups</th>"
            "<th>note</th></tr>")
    body = []
    for n, (r, k) in enumerate(zip(rows, at), 1):
        notes = ["sole contributor to a database"] if r["sole_contributor"] else []
        if r["sets_eps_all"]:
            notes.append("sets ε_all")
        eps_i = Html("∞") if r["sole_contributor"] else (r["eps_i"] if r["eps_i"] is not None else Html("bound only"))
        body.append(tr(n, td(code(show(r[a.id_column])), None), r["delta"], eps_i, r["eps_bound"],
                       Html("{} / {}").format(num(r["n_databases"]), num(a.n_databases)),
                       td(_named(a, touched[k]), None), td("; ".join(notes), None)))
    text = ("Ranked by δ<sub>i</sub>(ε) at the smallest assessed ε, ties by ε<sub>i</sub>; both are exact for "
            "every row whose risk is exact, and the individual that sets ε_all is always listed. ε<sub>i</sub> is of "
            "the joint release of the groups the individual's rows are in; the bound is the certified screening "
            "bound (for an individual in more than 3 groups, the sum of their groups' bounds, shown instead of "
            "ε<sub>i</sub>).")
    return section("riskiest", f"The {len(rows)} riskiest individuals", table(head, "".join(body)), explain(text))


def contours(a, eps: float, rows, show) -> str:
    """The density of the worst groups (those of the individual that sets ε_all, or of the riskiest)
    with and without the individuals drawn, in the model of those groups."""
    title = "The worst groups' density with and without the riskiest individual"
    panel = a.assessed.panel
    G, figures, drawn = len(a.groups), [], []
    for k in _j.drawn(a, rows):
        r = rows[k]
        if r["eps_i"] is None:  # known by a bound only: no model of all their groups
            continue
        row = int(_rows_of(a, [r[a.id_column]])[0])
        S = tuple(range(G)) if a.joint else tuple(int(g) for g in np.flatnonzero(panel.touched[row]))
        shifts = panel.stack(np.array([row]), S)[0]
        head = (f"id {show(r[a.id_column])} in {_named(a, panel.touched[row])}: εᵢ = {num(r['eps_i'], 3)}, "
                f"δᵢ(ε = {num(eps, 3)}) = {num(r['delta'], 3)}")
        figures.append(plots.joint_contours([f"{a.group_by} = {a.groups[g]}" for g in S], a.models[S], eps, head,
                                            shifts))
        drawn.append(len(S))
    if not figures:
        return section("contours", title, explain("No individual with an exact ε<sub>i</sub> and defined shifts "
                                                  "is among the riskiest to draw (they are sole contributors or "
                                                  "known by a bound only)."))
    text = ("For the riskiest individual and the one that sets ε_all: the density p̂ of the statistics of the "
            "groups their rows are in (blue; one group: a curve, three: the 2-D margins), and the same model "
            "p̂<sub>i</sub> with the individual removed from every database (dashed orange), in the statistics' "
            "own units. Blue dots are the observed values, orange crosses the values without the individual. "
            "With one or two groups the right panel is the log ratio log p̂ − log p̂<sub>i</sub>; where it leaves "
            "±ε the individual is at risk at ε, and its largest absolute value is ε<sub>i</sub>.")
    return section("contours", title, *figures, explain(text))


def sections(a, eps: float, show) -> list[str]:
    """The grouped report's sections (:data:`GROUPED_SECTIONS`), in page order."""
    rows = list(a.riskiest(_a.TOP_TABLE).iter_rows(named=True))
    return [summary(a, eps), _a.risk_curves(a, eps), _a.at_risk(a, eps), sweep(a), groups(a, eps),
            riskiest(a, eps, rows, show), contours(a, eps, rows, show)]
