"""The report's sections on a joint release of 2–3 statistics (docs/method.md#102-joint-queries,
issue 19): summary, the risk curves and sweep, the riskiest individuals, and the joint density with
and without the riskiest individual (contours)."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..textfmt import bandwidth_choice
from . import assessment as _a
from . import plots
from .markup import Html, cards, code, explain, kv, num, p_badge, section, table, td, tr

#: ids of a joint report's sections, in page order
JOINT_SECTIONS = ("summary", "risk-curves", "at-risk", "sweep", "riskiest", "contours")
#: sweep rows the table shows at most (spread over the sweep)
SWEEP_ROWS = 12


def check_epsilon(a, eps: float) -> None:
    """A joint or grouped result holds every individual's δ_i at the smallest assessed ε only: the table
    is there."""
    if not np.isclose(eps, a.epsilons[0], rtol=1e-12, atol=0):
        raise InputError(f"a {a.kind.key} result's table is exact at the smallest assessed epsilon, "
                         f"{float(a.epsilons[0]):.6g}, only; got `epsilon` {eps:.6g}: assess again with `epsilon` "
                         f"{eps:.6g}", param="epsilon")


def _model(m) -> str:
    scales = ", ".join(num(b) for b in m.scales)
    if m.whitened:
        text = (f"product Laplace kernels on whitened axes (the statistics decorrelated over the databases), "
                f"scales b = {scales} in whitened units")
    else:
        text = f"product Laplace kernels on the statistics' own axes, scales b = {scales} in their units"
    how = bandwidth_choice(m.selected_by)
    return f"{text}; {how} (LOO log-likelihood {num(m.loglik)})"


def summary(a, eps: float) -> str:
    m = a.model
    label = ("ε_all (everyone protected)" if not a.sole_contributors
             else f"ε_all (all but {a.sole_contributors:,} sole contributor(s) protected)")
    figures = cards([
        (label, num(a.eps_all)),
        ("chosen ε", num(eps)),
        ("worst-case δ(ε)", num(a.delta[0])),
        ("total risk δ*(ε)", num(a.total_risk[0])),
        ("individuals at risk at ε", num(int(a.n_at_risk[0]))),
    ])
    stats = Html("<br>").join(Html("{}. {}").format(k + 1, code(q)) for k, q in enumerate(a.queries))
    r = np.corrcoef(a.q, rowvar=False)
    corr = ", ".join(f"{i + 1}–{j + 1}: {num(r[i, j], 6)}" for i in range(m.d) for j in range(i + 1, m.d))
    rows = [("source", a.source), ("statistics, released together", stats), ("databases", _a.databases(a)),
            ("individuals", Html("{:,} (id {}), every ε<sub>i</sub> exact").format(_a.n_individuals(a),
                                                                                code(a.id_column))),
            ("correlation over the databases", corr), ("density model", _model(m)),
            ("sole contributors", a.sole_contributors)]
    for k, ind in enumerate(a.independence):
        rows.append((f"statistic {k + 1}: autocorrelation, trend",
                     Html("Ljung–Box {}; Mann–Kendall {}").format(p_badge(ind.get("ljung_box_p")),
                                                                   p_badge(ind.get("trend_p")))))
    note = _a.risk_note("The statistics are released together, so the risk is of the vector: each statistic "
                        "can be empirically private alone while the pair exposes an individual (Burchard et al. "
                        "§3). ")
    return section("summary", "Summary", figures, kv(rows), _a.warning_box(a.warnings), note)


def sweep(a) -> str:
    E = len(a.epsilons)
    picks = range(E) if E <= SWEEP_ROWS else np.unique(np.linspace(0, E - 1, SWEEP_ROWS - 2).round().astype(int))
    head = ("<tr><th class='n'>ε</th><th class='n'>worst-case δ(ε)</th><th class='n'>total risk δ*(ε)</th>"
            "<th class='n'>at risk</th></tr>")
    body = "".join(tr(a.epsilons[k], a.delta[k], a.total_risk[k], int(a.n_at_risk[k])) for k in picks)
    text = (f"{'All' if E <= SWEEP_ROWS else len(picks)} of the {E} assessed ε: the worst single δ<sub>i</sub>(ε), "
            "the total risk and the number of individuals with δ<sub>i</sub>(ε) > 0 (at risk).")
    return section("sweep", "Risk by ε of the joint release", table(head, body), explain(text))


def riskiest(a, rows, show) -> str:
    d = a.model.d
    head = ("<tr><th class='n'>#</th><th>id</th>"
            f"<th class='n'>δ<sub>i</sub> at ε = {num(a.epsilons[0])}</th><th class='n'>ε<sub>i</sub></th>"
            "<th class='n'>databases present</th>"
            + "".join(f"<th class='n'>largest shift {k + 1}</th>" for k in range(d)) + "<th>note</th></tr>")
    body = []
    for n, r in enumerate(rows, 1):
        notes = ["sole contributor to a database"] if r["sole_contributor"] else []
        if r["sets_eps_all"]:
            notes.append("sets ε_all")
        eps_i = Html("∞") if r["sole_contributor"] else r["eps_i"]
        body.append(tr(n, td(code(show(r[a.id_column])), None), r["delta"], eps_i,
                       Html("{} / {}").format(num(r["n_databases"]), num(a.n_databases)),
                       *[r[f"max_abs_shift_{k + 1}"] for k in range(d)], td("; ".join(notes), None)))
    text = ("Ranked by δ<sub>i</sub>(ε) at the smallest assessed ε, ties by ε<sub>i</sub>; both are exact for "
            "every row, and the individual that sets ε_all is always listed. ε<sub>i</sub> is the largest "
            "factor (on the log scale) by which the joint distribution of the statistics changes when the "
            "individual is removed from every database; they are fully protected (δ<sub>i</sub> = 0) at any "
            "ε ≥ ε<sub>i</sub>. Largest shift k is the biggest change in statistic k caused by removing them "
            "from one database.")
    return section("riskiest", f"The {len(rows)} riskiest individuals", table(head, "".join(body)), explain(text))


def _shifts(a, rows):
    """The shift rows (len(rows), n, d) of ``rows``, or None when the result keeps none of them."""
    get = getattr(a, "shifts_of", None)
    if get is None or not rows:
        return None
    try:
        return get([r[a.id_column] for r in rows])
    except InputError:  # a saved result without these rows' shifts
        return None


def drawn(a, rows) -> list[int]:
    """Rows whose density is drawn: the riskiest that is no sole contributor (whose shifts are defined),
    and the ε_all setter if another."""
    defined = [k for k, r in enumerate(rows) if not r["sole_contributor"]]
    setter = [k for k in defined if rows[k]["sets_eps_all"]]
    return sorted(set(defined[:1] + setter[:1]))


def contours(a, eps: float, rows, show) -> str:
    title = "The joint density with and without the riskiest individual"
    pick = drawn(a, rows)
    shifts = _shifts(a, [rows[k] for k in pick])
    if shifts is None or not np.isfinite(shifts).all():
        return section("contours", title, explain(
            "No individual with saved leave-one-out shifts is available to draw (the result was saved "
            "without them, or the riskiest are sole contributors)."))
    d = a.model.d
    figures = []
    for k, s in zip(pick, shifts):
        r = rows[k]
        head = (f"id {show(r[a.id_column])}: εᵢ = {num(r['eps_i'], 3)}, "
                f"δᵢ(ε = {num(eps, 3)}) = {num(r['delta'], 3)}")
        figures.append(plots.joint_contours(a.queries, a.model, eps, head, s))
    what = {1: "the density p̂ of the statistic over the databases (left; one statistic: curves, not contours)",
            2: "the density p̂ of the two statistics over the databases",
            3: "the 2-D margins of the density p̂ of the three statistics, one panel per pair (the third "
               "statistic integrated out)"}[d]
    text = (f"Contours of {what} (blue), and of the same model p̂<sub>i</sub> with the individual removed "
            "from every database (dashed orange: each database's point q<sub>j</sub> moved by the "
            "individual's shifts Δ<sub>ij</sub>, with the same kernels), at the same levels (2, 10, 25, 50, "
            "75 and 95% of the larger peak), in the statistics' own units. Blue dots are the observed "
            "q<sub>j</sub>, orange crosses the values without the individual.")
    if d <= 2:
        text += (" The right panel is the log ratio log p̂ − log p̂<sub>i</sub>; where it leaves the band "
                 f"±ε ({'dotted' if d == 2 else 'shaded'}) the individual is at risk at ε, and its largest absolute value is "
                 "ε<sub>i</sub>.")
    else:
        text += (" A margin can hide a change that the full three-dimensional density shows: ε<sub>i</sub> "
                 "and δ<sub>i</sub> are of the full density.")
    return section("contours", title, *figures, explain(text))


def sections(a, eps: float, show) -> list[str]:
    """The joint report's sections (:data:`JOINT_SECTIONS`), in page order."""
    rows = list(a.riskiest(_a.TOP_TABLE).iter_rows(named=True))
    return [summary(a, eps), _a.risk_curves(a, eps), _a.at_risk(a, eps), sweep(a), riskiest(a, rows, show),
            contours(a, eps, rows, show)]
