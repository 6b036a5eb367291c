"""The report's sections on the assessment itself: summary, risk curves, riskiest individuals,
their densities, representativeness, and what an adversary's knowledge costs."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import kernels
from ..assessment import uncertainty as unc_notes
from ..errors import InputError
from ..textfmt import bandwidth_choice, fmt
from . import plots
from .markup import Html, cards, code, esc, explain, kv, num, p_badge, section, table, td, tr

TOP_TABLE = 10
TOP_DENSITIES = 3


def sweep_index(a, eps: float):
    """Sweep values at ``eps``: exact when assessed, else at the largest assessed ε below it.

    δ(ε) and δ*(ε) decrease in ε, so the value at a smaller ε is an upper bound.
    Returns ``(index, exact)``; index is None when ``eps`` lies below the sweep.
    """
    hit = np.flatnonzero(np.isclose(a.epsilons, eps, rtol=1e-9, atol=0))
    if len(hit):
        return int(hit[0]), True
    below = np.flatnonzero(a.epsilons < eps)
    return (int(below[-1]), False) if len(below) else (None, False)


def databases(a) -> str:
    """How many databases, by which column, from which label to which."""
    labels = a.labels
    if labels:
        return Html("{} (by {}: {} … {})").format(a.n_databases, code(a.by_column), labels[0], labels[-1])
    return Html("{} (by {})").format(a.n_databases, code(a.by_column))


def kernel_of(a) -> kernels.Kernel:
    """The kernel of a result's density model; the product kernels of a joint or grouped model are Laplace."""
    return getattr(getattr(a, "model", None), "kernel", None) or kernels.Laplace()


def _tolerance(a) -> str:
    """τ of the result's kernel as the report writes numbers."""
    return fmt(kernel_of(a).tolerance)


def summary(a, eps: float, idx, exact: bool) -> str:
    m = a.model
    model = f"{m.kernel.label} kernel, scale b = {num(m.scale)}"
    model += (f", variable bandwidths (sensitivity a = {m.sensitivity:g})" if m.variable else ", fixed bandwidth")
    model += f"; {bandwidth_choice(m.selected_by)}"
    model += f" (LOO log-likelihood {num(m.loglik)})"
    upper = "" if exact or idx is None else f" (at assessed ε = {num(a.epsilons[idx])} ≤ ε: an upper bound)"
    val = (lambda arr: num(arr[idx])) if idx is not None else (lambda arr: "–")
    label = kernel_of(a).eps_all_label(a.sole_contributors, _tolerance(a))  # "protected" only if exact
    unc = getattr(a, "uncertainty", None)
    interval = [] if unc is None else [(f"ε_all, {unc.level:.0%} interval", f"{num(unc.eps_all[0])} – "
                                                                                  f"{num(unc.eps_all[1])}")]
    figures = cards([
        (label, num(a.eps_all)),
        *interval,
        ("chosen ε", num(eps)),
        ("worst-case δ(ε)", val(a.delta)),
        ("total risk δ*(ε)", val(a.total_risk)),
        ("individuals at risk at ε", num(int(a.n_at_risk[idx])) if idx is not None else "–"),
    ])
    ind = a.independence
    rows = [
        ("source", a.source), ("query", code(a.query)), ("databases", databases(a)),
        ("individuals", Html("{:,} (id {}); {:,} evaluated exactly, the rest certified safe by screening").format(
            a.n_individuals, code(a.id_column), a.n_evaluated)),
        ("density model", model),
        ("sole contributors", a.sole_contributors),
        ("autocorrelation (Ljung–Box)", p_badge(ind.get("ljung_box_p"))),
        ("trend (Mann–Kendall)", p_badge(ind.get("trend_p"))),
    ]
    if unc is not None:
        rows.append(("uncertainty", f"{unc.method}; {unc.replicates} replicates of {unc.size} databases: how far "
                                    "the estimates move over other sets of databases from the same process (the "
                                    "shaded bands below), not the density model's own assumptions; "
                                    + unc_notes.SWEEP_NOTE))
    warnings = [*a.warnings, *(unc.warnings if unc is not None else [])]
    return section("summary", "Summary", figures + (explain(upper) if upper else ""), kv(rows),
                   warning_box(warnings), risk_note())


def warning_box(warnings) -> str:
    """The assessment's warnings as a list in a box ('' without any)."""
    if not warnings:
        return ""
    return Html('<div class="warn"><strong>Warnings</strong><ul>' + "".join(
        f"<li>{esc(w)}</li>" for w in warnings) + "</ul></div>")


def risk_note(first: str = "") -> Html:
    """What δ(ε), δ*(ε) and 'empirical' mean, after ``first``."""
    return Html(f'<div class="note">{first}δ(ε) is the largest risk of any single individual; the total risk '
            'δ*(ε) = 1 − Π<sub>i</sub>(1 − δ<sub>i</sub>(ε)) is the chance that <em>at least one</em> '
            'individual is exposed, and <strong>assumes the individuals\' risks are independent</strong>. '
            'All figures are <em>empirical</em> privacy: they hold with respect to the variation between '
            'the databases, under the density model above, not for a fixed database.</div>')


def n_individuals(a) -> int:
    """Individuals assessed: a joint result counts its table's rows, a saved one keeps the full count."""
    return a.n_individuals if hasattr(a, "n_individuals") else a.individuals.height


def risk_curves(a, eps: float) -> str:
    img, log = plots.risk_curves(a, eps)
    e = a.epsilons
    reach = [(t, a.epsilon_for_total_risk(t)) for t in (0.5, 0.1, 0.01)]
    reach_txt = "; ".join(f"δ* ≤ {t:g} from ε = {num(v, 3)}" if v is not None
                          else f"δ* ≤ {t:g} not reached in the assessed range" for t, v in reach)
    text = ("For each privacy level ε (horizontal axis), the red curve is the largest probability δ with which the "
            "release can shift the odds about a single individual by more than a factor e<sup>ε</sup>; the purple "
            "curve is the probability that this happens to at least one individual. Larger ε is a weaker promise, so both curves fall; "
            + esc(kernel_of(a).beyond_eps_all(_tolerance(a)))
            + (" (points at δ = 0 are not drawn on the log scale)" if log else "") + f". {reach_txt}.")
    if len(e) < 5:
        text += (f" Only {len(e)} ε value(s) were assessed; assess a range of ε (or none, for the default "
                 "sweep) to see the whole curve.")
    return section("risk-curves", "Risk against ε: δ(ε) and δ*(ε)", img, explain(text))


def at_risk(a, eps: float) -> str:
    text = (f"How many of the {n_individuals(a):,} individuals are {esc(kernel_of(a).at_risk(_tolerance(a)))} at "
            "each ε. A steep fall means that from a modest ε on most individuals are no longer counted and only a "
            "few outliers drive the worst case" + (f"; the {a.sole_contributors:,} sole contributor(s) are never protected"
                                      if a.sole_contributors else "") + ".")
    return section("at-risk", "Individuals at risk against ε", plots.at_risk(a, eps), explain(text))


def _has_shifts(a) -> bool:
    """A live result keeps its leave-one-out engine, a saved one (:mod:`empdp.assessment.result`) a few shift rows."""
    saved = getattr(a, "has_shifts", None)
    return bool(saved) if saved is not None else a.engine is not None


def top_rows(a, eps: float, show: Callable, k: int):
    """The riskiest rows at ``eps`` (exact δ_i and ε_i, see ``riskiest``) and their shift vectors."""
    top = a.riskiest(k, eps)
    rows = list(top.iter_rows(named=True))
    shifts = None
    if rows and _has_shifts(a):
        try:
            shifts = a.shifts_of([r[a.id_column] for r in rows])
        except InputError:  # a saved result without these rows' shifts: no density plots
            shifts = None
    for r in rows:
        r["shown_id"] = show(r[a.id_column])
    return rows, shifts, _ranking_note(a, eps, k)


def _ranking_note(a, eps: float, k: int) -> str:
    note = getattr(a, "ranking_note", None)  # a saved result knows only its saved rows
    return note(eps, k) if callable(note) else ""


def riskiest(a, eps: float, rows, note: str) -> str:
    head = ("<tr><th class='n'>#</th><th>id</th>"
            f"<th class='n'>δ<sub>i</sub> at ε = {num(eps)}</th><th class='n'>ε<sub>i</sub></th>"
            "<th class='n'>databases present</th><th class='n'>largest shift</th><th>note</th></tr>")
    body = []
    for n, r in enumerate(rows, 1):
        notes = []
        if r["sole_contributor"]:
            eps_i = Html("∞")
            notes.append("sole contributor to a database")
        else:
            eps_i = r["eps_i"]
        if r.get("sets_eps_all"):
            notes.append("sets ε_all")
        body.append(tr(n, td(code(r["shown_id"]), None), r["delta"], eps_i,
                       Html("{} / {}").format(num(r["n_databases"]), num(a.n_databases)), r["max_abs_shift"],
                       td("; ".join(notes), None)))
    text = ("Ranked by δ<sub>i</sub>(ε) at the chosen ε, ties by ε<sub>i</sub>; both are exact for every row "
            "shown, and the individual that sets ε_all is always listed. ε<sub>i</sub> is the individual's "
            "empirical privacy loss: the largest factor (on the log scale) by which the query's distribution "
            "changes when the individual is removed from every database")
    text += esc(kernel_of(a).eps_i_meaning(_tolerance(a)))
    text += (" The largest shift is the biggest change in the query value caused by removing them from one "
             "database.")
    if note:
        text += " " + esc(note)
    return section("riskiest", f"The {len(rows)} riskiest individuals", table(head, "".join(body)), explain(text))


def densities(a, eps: float, rows, shifts) -> str:
    pick = [k for k, r in enumerate(rows) if shifts is not None and not r["sole_contributor"]
            and np.isfinite(shifts[k]).all()][:TOP_DENSITIES]
    if not pick:
        return section("densities", "The query's density with and without the riskiest individuals",
                       explain("No individual with a defined leave-one-out value is available to plot "
                               "(the result was loaded without its data, or all are sole contributors)."))
    text = (f"For the {len(pick)} riskiest individuals (the paper's Figure 5): the blue curve is the curator's "
            "estimate p̂ of the query's distribution over databases, the dashed orange curve the same estimate "
            "p̂<sub>i</sub> with the individual removed from every database. Blue ticks mark the observed query "
            "values q<sub>j</sub>, orange ticks the values without the individual. The lower panels show the log "
            "ratio of the two curves; where it leaves the shaded band ±ε the individual is at risk at the chosen "
            "ε; " + esc(kernel_of(a).log_ratio_peak(_tolerance(a))))
    return section("densities", "The query's density with and without the riskiest individuals",
                   plots.densities(a, eps, rows, shifts, pick), explain(text))


def representativeness(a) -> str:
    rep = a.representativeness
    hist = {int(k): int(v) for k, v in rep.get("histogram", {}).items()}
    rows = [("median databases per individual", num(rep.get("median_databases_per_individual"))),
            ("share in only one database", f"{100 * rep.get('share_in_one_database', 0):.1f}%"),
            ("share in all databases", f"{100 * rep.get('share_in_all_databases', 0):.1f}%")]
    text = ("How many of the databases each individual appears in. The method learns each individual's influence "
            "from the databases they appear in; individuals seen only once or twice have risk estimates that rest "
            "on very little data, and if most individuals appear only once the databases may not represent a "
            "stable population.")
    return section("representativeness", "Representativeness", plots.databases_per_individual(a, hist), kv(rows),
                   explain(text))


def adversary(a) -> str:
    """What the adversary's knowledge costs: each bucket's ε_all beside the unconditional risk."""
    adv = a.adversary
    unc = adv["unconditional"]
    head = ("<tr><th class='n'>bucket</th><th class='n'>statistic from</th><th class='n'>to</th>"
            "<th class='n'>databases</th><th class='n'>bandwidth</th><th class='n'>ε_all</th></tr>")
    body = "".join(tr(k, b["lo"], b["hi"], b["n_databases"], b["bandwidth"], b["eps_all"])
                   for k, b in enumerate(adv["buckets"]))
    text = (f"The adversary knows <code>{esc(adv['statistic'])}</code> of every database. The databases are "
            f"sorted by it and cut into {len(adv['buckets'])} groups; within each group the density model is "
            "fitted again and every individual's risk is taken conditionally on the group, and the reported "
            f"risk is the largest over the groups. Without the knowledge ε_all is {num(unc['eps_all'])}; with "
            f"it, {num(a.eps_all)}. Groups of fewer than 10 databases give unreliable estimates.")
    return section("adversary", "What the adversary's knowledge costs", table(head, body), plots.adversary_risk(a),
                   explain(text))
