"""The self-contained HTML risk report (docs/method.md).

One HTML file with inline CSS and matplotlib figures embedded as base64 PNG
``data:`` URIs: no scripts, no external references, so it can be mailed or
archived as is. Sections carry stable ``id`` attributes (:data:`SECTIONS`).
The report sits on top of the library: it only reads an
:class:`empdp.assess.Assessment` (live, or saved and loaded by
:mod:`empdp.result`) and optional calibration / audit dicts.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import math
import secrets
import warnings
from typing import Any, Callable

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .errors import InputError
from .io import atomic_path, keyed_hash
from .textfmt import DIGITS, fmt

#: ids of the sections always present, in page order
SECTIONS = ("summary", "risk-curves", "at-risk", "riskiest", "densities", "representativeness")
#: ids of the optional sections
OPTIONAL_SECTIONS = ("adversary", "calibration", "audit")
TOP_TABLE = 10
TOP_DENSITIES = 3

BLUE, ORANGE, RED, PURPLE, GREY = "#1f4e79", "#d9822b", "#b22222", "#6a3d9a", "#8a8f98"

CSS = """
:root{--ink:#1d2430;--muted:#5b6472;--line:#e3e6eb;--bg:#f7f8fa;--accent:#1f4e79;--warn:#8a5a00}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
 font:15px/1.55 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:28px 32px 48px}
header{border-bottom:3px solid var(--accent);margin-bottom:20px;padding-bottom:10px}
h1{font-size:26px;margin:0 0 4px} h2{font-size:19px;margin:0 0 12px;color:var(--accent)}
.sub{color:var(--muted);font-size:13px}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:20px 24px;margin:0 0 18px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin:0 0 16px}
.card{border:1px solid var(--line);border-radius:6px;padding:10px 14px;background:#fbfcfd}
.card .v{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums}
.card .k{font-size:13px;color:var(--muted)}
table{border-collapse:collapse;width:100%;font-size:14px;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f1f3f6;font-weight:600}
table.kv th{width:34%;background:none;font-weight:500;color:var(--muted)}
td.n,th.n{text-align:right}
img{max-width:100%;display:block;margin:6px auto}
.explain{color:var(--muted);font-size:14px;margin:8px 0 0;max-width:105ch}
.warn{background:#fff7e6;border:1px solid #f0c36d;border-radius:6px;padding:10px 14px;margin:12px 0;color:var(--warn)}
.warn ul{margin:4px 0 0 18px;padding:0}
.note{background:#eef3f9;border-radius:6px;padding:10px 14px;margin:12px 0;font-size:14px}
.ok{color:#2e7d32;font-weight:600} .bad{color:var(--red,#b22222);font-weight:600}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:24px}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;background:#f1f3f6;padding:1px 4px;border-radius:3px}
"""


# ---------------------------------------------------------------- small helpers

def _id_formatter(hash_ids) -> Callable[[Any], str]:
    """``False``: ids as is; a callable: applied; bytes/str: :func:`keyed_hash` key;
    ``True``: a random per-report key (consistent within the report only)."""
    if hash_ids is False or hash_ids is None:
        return str
    if callable(hash_ids):
        return lambda v: str(hash_ids(v))
    if hash_ids is True:
        key = secrets.token_bytes(32)
    elif isinstance(hash_ids, (bytes, str)):
        key = hash_ids.encode("utf-8") if isinstance(hash_ids, str) else hash_ids
    else:
        raise TypeError("hash_ids must be False, True, a key (bytes/str) or a callable")
    return lambda v: keyed_hash(v, key)


def _fmt(v, digits: int = DIGITS) -> str:
    """A number for humans in the report: ``∞``, ``–`` for missing (:func:`empdp.textfmt.fmt`)."""
    return fmt(v, digits, missing="–", infinity="∞")


def _inf_if_none(v):
    """The calibration JSON writes an infinite classical ε as null."""
    return math.inf if v is None else v


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _figure(w: float = 9.0, h: float = 3.6, **kw) -> Figure:
    # an Agg canvas of our own, not pyplot: no global backend switch, no figure registry to leak into
    fig = Figure(figsize=(w, h), dpi=100, **kw)
    FigureCanvasAgg(fig)
    fig.set_layout_engine("constrained")
    return fig


def _style(ax) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(True, color="#e6e8ec", lw=0.8)
    ax.set_axisbelow(True)


def _img(fig: Figure, alt: str) -> str:
    """Embed a figure as a base64 PNG ``data:`` URI (no metadata: it would carry a URL)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # ids in a script the plot font lacks (CJK, ...) are drawn as boxes in the figure titles; the
        # table beside the figure shows them in the browser's fonts, so the warning only adds noise
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from", category=UserWarning)
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None}, facecolor="white")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _section(sid: str, title: str, *parts: str) -> str:
    return f'<section id="{sid}">\n<h2>{_e(title)}</h2>\n' + "\n".join(parts) + "\n</section>"


def _explain(text: str) -> str:
    return f'<p class="explain">{text}</p>'


def _kv(rows) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _cards(items) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{k}</div><div class="v">{v}</div></div>' for k, v in items) + "</div>"


def _p_badge(p) -> str:
    if p is None or not np.isfinite(p):
        return "–"
    cls, word = ("bad", "rejected at 5%") if p < 0.05 else ("ok", "not rejected")
    return f'p = {_fmt(p, 3)} <span class="{cls}">({word})</span>'


def _at(a, eps: float):
    """Sweep values at ``eps``: exact when assessed, else at the largest assessed ε below it.

    δ(ε) and δ*(ε) decrease in ε, so the value at a smaller ε is an upper bound.
    Returns ``(index, exact)``; index is None when ``eps`` lies below the sweep.
    """
    hit = np.flatnonzero(np.isclose(a.epsilons, eps, rtol=1e-9, atol=0))
    if len(hit):
        return int(hit[0]), True
    below = np.flatnonzero(a.epsilons < eps)
    return (int(below[-1]), False) if len(below) else (None, False)


# ---------------------------------------------------------------- sections

def _summary(a, eps: float, idx, exact: bool) -> str:
    m = a.model
    model = f"{m.kernel} kernel, scale b = {_fmt(m.scale)}"
    model += (f", variable bandwidths (sensitivity a = {m.sensitivity:g})" if m.variable else ", fixed bandwidth")
    model += f"; {'fixed by the user' if m.selected_by == 'fixed' else 'chosen by leave-one-out log-likelihood'}"
    model += f" (LOO log-likelihood {_fmt(m.loglik)})"
    at = "" if exact or idx is None else f" (at assessed ε = {_fmt(a.epsilons[idx])} ≤ ε: an upper bound)"
    val = (lambda arr: _fmt(arr[idx])) if idx is not None else (lambda arr: "–")
    tol = getattr(a, "eps_tolerance", 0.0)
    if tol:  # Gaussian kernels: δ_i ≤ τ from ε_all, never "protected"
        label = f"ε_all (every δᵢ ≤ {_fmt(tol)} from here" + (
            f", except {a.sole_contributors:,} sole contributor(s))" if a.sole_contributors else ")")
    else:
        label = ("ε_all (everyone protected)" if not a.sole_contributors
                 else f"ε_all (all but {a.sole_contributors:,} sole contributor(s) protected)")
    cards = _cards([
        (label, _fmt(a.eps_all)),
        ("chosen ε", _fmt(eps)),
        ("worst-case δ(ε)", val(a.delta)),
        ("total risk δ*(ε)", val(a.total_risk)),
        ("individuals at risk at ε", _fmt(int(a.n_at_risk[idx])) if idx is not None else "–"),
    ])
    labels = a.labels
    dbs = f"{a.n_databases} (by <code>{_e(a.by_column)}</code>"
    dbs += f": {_e(labels[0])} … {_e(labels[-1])})" if labels else ")"
    ind = a.independence
    rows = [
        ("source", _e(a.source)), ("query", f"<code>{_e(a.query)}</code>"), ("databases", dbs),
        ("individuals", f"{a.n_individuals:,} (id <code>{_e(a.id_column)}</code>); "
                        f"{a.n_evaluated:,} evaluated exactly, the rest certified safe by screening"),
        ("density model", _e(model)),
        ("sole contributors", f"{a.sole_contributors:,}"),
        ("autocorrelation (Ljung–Box)", _p_badge(ind.get("ljung_box_p"))),
        ("trend (Mann–Kendall)", _p_badge(ind.get("trend_p"))),
    ]
    warn = ""
    if a.warnings:
        warn = '<div class="warn"><strong>Warnings</strong><ul>' + "".join(
            f"<li>{_e(w)}</li>" for w in a.warnings) + "</ul></div>"
    note = ('<div class="note">δ(ε) is the largest risk of any single individual; the total risk '
            'δ*(ε) = 1 − Π<sub>i</sub>(1 − δ<sub>i</sub>(ε)) is the chance that <em>at least one</em> '
            'individual is exposed, and <strong>assumes the individuals\' risks are independent</strong>. '
            'All figures are <em>empirical</em> privacy: they hold with respect to the variation between '
            'the databases, under the density model above, not for a fixed database.</div>')
    return _section("summary", "Summary", cards + (_explain(at) if at else ""), _kv(rows), warn, note)


def _risk_curves(a, eps: float) -> str:
    fig = _figure()
    ax = fig.add_subplot()
    e = a.epsilons
    pos = np.concatenate([a.delta[a.delta > 0], a.total_risk[a.total_risk > 0]])
    log = len(pos) > 0 and pos.max() / pos.min() > 20
    for y, c, lab in ((a.delta, RED, "δ(ε): worst single individual"),
                      (a.total_risk, PURPLE, "δ*(ε): at least one individual")):
        keep = y > 0 if log else np.ones(len(y), bool)
        ax.plot(e[keep], y[keep], color=c, lw=2, marker="o" if len(e) < 15 else None, ms=4, label=lab)
    if log:
        ax.set_yscale("log")
    ax.axvline(eps, color=BLUE, ls="--", lw=1.3, label=f"chosen ε = {_fmt(eps, 3)}")
    if np.isfinite(a.eps_all) and a.eps_all > 0:
        ax.axvline(a.eps_all, color=GREY, ls=":", lw=1.3, label=f"ε_all = {_fmt(a.eps_all, 3)}")
    ax.set_xlabel("privacy level ε")
    ax.set_ylabel("δ" + (" (log scale)" if log else ""))
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    reach = [(t, a.epsilon_for_total_risk(t)) for t in (0.5, 0.1, 0.01)]
    reach_txt = "; ".join(f"δ* ≤ {t:g} from ε = {_fmt(v, 3)}" if v is not None
                          else f"δ* ≤ {t:g} not reached in the assessed range" for t, v in reach)
    text = ("For each privacy level ε (horizontal axis), the red curve is the largest probability δ with which the "
            "release can shift the odds about a single individual by more than a factor e<sup>ε</sup>; the purple "
            "curve is the probability that this happens to at least one individual. Larger ε is a weaker promise, so both curves fall; "
            "beyond ε_all every individual has δ<sub>i</sub> = 0"
            + (" (points at δ = 0 are not drawn on the log scale)" if log else "") + f". {reach_txt}.")
    if len(e) < 5:
        text += (f" Only {len(e)} ε value(s) were assessed; assess a range of ε (or none, for the default "
                 "sweep) to see the whole curve.")
    return _section("risk-curves", "Risk against ε: δ(ε) and δ*(ε)", _img(fig, "delta and total risk against epsilon"),
                    _explain(text))


def _at_risk(a, eps: float) -> str:
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    ax.plot(a.epsilons, a.n_at_risk, color=BLUE, lw=2, drawstyle="steps-post",
            marker="o" if len(a.epsilons) < 15 else None, ms=4)
    ax.axvline(eps, color=BLUE, ls="--", lw=1.3, label=f"chosen ε = {_fmt(eps, 3)}")
    ax.set_xlabel("privacy level ε")
    ax.set_ylabel("individuals with δᵢ(ε) > 0")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    text = (f"How many of the {a.n_individuals:,} individuals are not fully protected (δ<sub>i</sub>(ε) > 0) at "
            "each ε. A steep fall means most individuals are protected at a modest ε and only a few outliers "
            "drive the worst case" + (f"; the {a.sole_contributors:,} sole contributor(s) are never protected"
                                      if a.sole_contributors else "") + ".")
    return _section("at-risk", "Individuals at risk against ε", _img(fig, "individuals at risk against epsilon"),
                    _explain(text))


def _has_shifts(a) -> bool:
    """A live result keeps its leave-one-out engine, a saved one (:mod:`empdp.result`) a few shift rows."""
    saved = getattr(a, "has_shifts", None)
    return bool(saved) if saved is not None else a.engine is not None


def _top_rows(a, eps: float, show: Callable, k: int):
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


def _riskiest(a, eps: float, rows, note: str) -> str:
    tol = getattr(a, "eps_tolerance", 0.0)
    head = ("<tr><th class='n'>#</th><th>id</th>"
            f"<th class='n'>δ<sub>i</sub> at ε = {_fmt(eps)}</th><th class='n'>ε<sub>i</sub></th>"
            "<th class='n'>databases present</th><th class='n'>largest shift</th><th>note</th></tr>")
    body = []
    for n, r in enumerate(rows, 1):
        notes = []
        if r["sole_contributor"]:
            eps_i = "∞"
            notes.append("sole contributor to a database")
        else:
            eps_i = _fmt(r["eps_i"])
        if r.get("sets_eps_all"):
            notes.append("sets ε_all")
        body.append(f"<tr><td class='n'>{n}</td><td><code>{_e(r['shown_id'])}</code></td>"
                    f"<td class='n'>{_fmt(r['delta'])}</td><td class='n'>{eps_i}</td>"
                    f"<td class='n'>{r['n_databases']} / {a.n_databases}</td>"
                    f"<td class='n'>{_fmt(r['max_abs_shift'])}</td><td>{_e('; '.join(notes))}</td></tr>")
    text = ("Ranked by δ<sub>i</sub>(ε) at the chosen ε, ties by ε<sub>i</sub>; both are exact for every row "
            "shown, and the individual that sets ε_all is always listed. ε<sub>i</sub> is the individual's "
            "empirical privacy loss: the largest factor (on the log scale) by which the query's distribution "
            "changes when the individual is removed from every database")
    text += (f"; with Gaussian kernels this log-ratio is unbounded, so ε<sub>i</sub> is the smallest ε at which "
             f"δ<sub>i</sub>(ε) ≤ {_fmt(tol)}." if tol else
             "; they are fully protected (δ<sub>i</sub> = 0) at any ε ≥ ε<sub>i</sub>.")
    text += (" The largest shift is the biggest change in the query value caused by removing them from one "
             "database.")
    if note:
        text += " " + _e(note)
    return _section("riskiest", f"The {len(rows)} riskiest individuals",
                    f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>", _explain(text))


def _densities(a, eps: float, rows, shifts) -> str:
    pick = [k for k, r in enumerate(rows) if shifts is not None and not r["sole_contributor"]
            and np.isfinite(shifts[k]).all()][:TOP_DENSITIES]
    if not pick:
        return _section("densities", "The query's density with and without the riskiest individuals",
                        _explain("No individual with a defined leave-one-out value is available to plot "
                                 "(the result was loaded without its data, or all are sole contributors)."))
    m, q = a.model, a.q
    fig = _figure(3.4 * len(pick) + 0.8, 5.2)
    axes = fig.subplots(2, len(pick), squeeze=False, sharex="col", gridspec_kw={"height_ratios": [2.2, 1]})
    for c, k in enumerate(pick):
        s = shifts[k]
        pts = np.concatenate([q, q - s])
        pad = 4 * float(np.median(m.bandwidths))  # not max: one outlier's wide kernel would flatten the view
        x = np.union1d(np.linspace(pts.min() - pad, pts.max() + pad, 700), pts)
        top, bot = axes[0, c], axes[1, c]
        top.plot(x, m.pdf(x), color=BLUE, lw=1.8, label="p̂: all individuals")
        top.plot(x, m.pdf(x, shifts=s), color=ORANGE, lw=1.6, ls="--", label="p̂ᵢ: without this one")
        tr = top.get_xaxis_transform()
        top.plot(q, np.zeros_like(q), "|", color=BLUE, ms=12, mew=1.2, transform=tr, clip_on=False)
        top.plot(q - s, np.full_like(q, 0.06), "|", color=ORANGE, ms=8, mew=1, transform=tr, clip_on=False)
        r = rows[k]
        top.set_title(f"id {r['shown_id']}\nεᵢ = {_fmt(r['eps_i'], 3)}, δᵢ(ε) = {_fmt(r['delta'], 3)}",
                      fontsize=10)
        lr = m.logpdf(x) - m.logpdf(x, shifts=s)
        bot.plot(x, lr, color=PURPLE, lw=1.4)
        bot.axhspan(-eps, eps, color=BLUE, alpha=0.08, lw=0)
        for y in (-eps, eps):
            bot.axhline(y, color=BLUE, ls="--", lw=1)
        bot.set_xlabel("query value")
        _style(top), _style(bot)
        if c == 0:
            top.set_ylabel("density")
            bot.set_ylabel("log p̂ − log p̂ᵢ")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside upper center", ncols=2, frameon=False)
    text = (f"For the {len(pick)} riskiest individuals (the paper's Figure 5): the blue curve is the curator's "
            "estimate p̂ of the query's distribution over databases, the dashed orange curve the same estimate "
            "p̂<sub>i</sub> with the individual removed from every database. Blue ticks mark the observed query "
            "values q<sub>j</sub>, orange ticks the values without the individual. The lower panels show the log "
            "ratio of the two curves; where it leaves the shaded band ±ε the individual is at risk at the chosen "
            "ε, and its largest absolute value is ε<sub>i</sub>.")
    return _section("densities", "The query's density with and without the riskiest individuals",
                    _img(fig, "density with and without the riskiest individuals"), _explain(text))


def _representativeness(a) -> str:
    rep = a.representativeness
    hist = {int(k): int(v) for k, v in rep.get("histogram", {}).items()}
    fig = _figure(9, 3.0)
    ax = fig.add_subplot()
    ax.bar(list(hist), list(hist.values()), color=BLUE, width=0.8)
    ax.set_xlabel("number of databases an individual appears in")
    ax.set_ylabel("individuals")
    ax.set_xlim(0.3, a.n_databases + 0.7)
    _style(ax)
    rows = [("median databases per individual", _fmt(rep.get("median_databases_per_individual"))),
            ("share in only one database", f"{100 * rep.get('share_in_one_database', 0):.1f}%"),
            ("share in all databases", f"{100 * rep.get('share_in_all_databases', 0):.1f}%")]
    text = ("How many of the databases each individual appears in. The method learns each individual's influence "
            "from the databases they appear in; individuals seen only once or twice have risk estimates that rest "
            "on very little data, and if most individuals appear only once the databases may not represent a "
            "stable population.")
    return _section("representativeness", "Representativeness", _img(fig, "databases per individual"), _kv(rows),
                    _explain(text))


def _adversary(a) -> str:
    """What the adversary's knowledge costs: each bucket's ε_all beside the unconditional risk."""
    adv = a.adversary
    unc = adv["unconditional"]
    head = ("<tr><th class='n'>bucket</th><th class='n'>statistic from</th><th class='n'>to</th>"
            "<th class='n'>databases</th><th class='n'>bandwidth</th><th class='n'>ε_all</th></tr>")
    body = "".join(f"<tr><td class='n'>{k}</td><td class='n'>{_fmt(b['lo'])}</td><td class='n'>{_fmt(b['hi'])}</td>"
                   f"<td class='n'>{b['n_databases']}</td><td class='n'>{_fmt(b['bandwidth'])}</td>"
                   f"<td class='n'>{_fmt(b['eps_all'])}</td></tr>" for k, b in enumerate(adv["buckets"]))
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    ue = np.array([r["epsilon"] for r in unc["sweep"]])
    ut = np.array([r["total_risk"] for r in unc["sweep"]])
    ax.plot(a.epsilons, a.total_risk, color=RED, lw=2, label=f"δ*(ε) knowing {adv['statistic']}")
    ax.plot(ue, ut, color=GREY, lw=2, ls="--", label="δ*(ε) without that knowledge")
    ax.set_xlabel("privacy level ε")
    ax.set_ylabel("total risk δ*")
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    text = (f"The adversary knows <code>{_e(adv['statistic'])}</code> of every database. The databases are "
            f"sorted by it and cut into {len(adv['buckets'])} groups; within each group the density model is "
            "fitted again and every individual's risk is taken conditionally on the group, and the reported "
            f"risk is the largest over the groups. Without the knowledge ε_all is {_fmt(unc['eps_all'])}; with "
            f"it, {_fmt(a.eps_all)}. Groups of fewer than 10 databases give unreliable estimates.")
    return _section("adversary", "What the adversary's knowledge costs",
                    f"<table><thead>{head}</thead><tbody>{body}</tbody></table>",
                    _img(fig, "total risk with and without the adversary's knowledge"), _explain(text))


def _extra_rows(d: dict, known) -> list:
    return [(k, _e(_fmt(v) if not isinstance(v, str) else v)) for k, v in d.items()
            if k not in known and (isinstance(v, (str, int, float, bool)) or v is None)]


def _calibration(c: dict) -> str:
    noise = c.get("noise") or {}
    ck = c.get("curator_kernel") or {}
    kind = noise.get("kind", "–")
    w, lam = noise.get("weight_zero"), noise.get("scale")
    if kind == "none":
        desc = ("no noise is added: the curator's density model is already ε-private for every individual "
                "(the assessment finds nobody at risk at this ε), so a release publishes the exact value")
    elif kind == "laplace_mixture":
        desc = (f"with probability {_fmt(w)} add nothing, otherwise add Laplace noise of scale {_fmt(lam)}")
    else:
        desc = f"{kind} noise of scale {_fmt(lam)}"
    query = c.get("query_description") or c.get("query") or c.get("sql")
    rows = [("query", _e(f"{query} on {c.get('source_description') or c.get('source')}")) if query else None,
            ("target ε", _fmt(c.get("epsilon"))),
            ("λ* (least Laplace smoothing that reaches ε)", _fmt(c.get("lambda"))),
            ("λ by W∞ bound (valid, larger)", _fmt(c.get("lambda_winf"))),
            ("λ by Hausdorff rule (paper; not a valid guarantee)", _fmt(c.get("lambda_hausdorff"))),
            ("curator kernel", _e(f"{ck.get('kind', '–')}, scale {_fmt(ck.get('scale'))}")),
            ("noise", _e(desc)),
            ("expected |noise| (expected error)", _fmt(c.get("expected_abs_noise"))),
            ("verified max εᵢ at λ*", _fmt(c.get("verified_eps_max"))),
            ("individuals", f"{_fmt(c.get('n_individuals'))} ({_fmt(c.get('n_sole_contributors'))} sole "
                            "contributor(s): no noise protects them)") if "n_individuals" in c else None,
            ("classical DP ε (fixed database)", "not claimed (see below)" if kind == "laplace"
             else _fmt(_inf_if_none(c.get("classical_dp_epsilon"))))]
    rows = [r for r in rows if r is not None]
    # the rest of the calibration JSON is bookkeeping (format, timings, the query's parts, notes shown below)
    rows += _extra_rows(c, {"epsilon", "lambda", "lambda_winf", "lambda_hausdorff", "curator_kernel", "noise",
                            "expected_abs_noise", "verified_eps_max", "classical_dp_epsilon", "classical_dp_explanation",
                            "guarantee", "format", "seconds", "n_bisected", "expected_abs_noise_plain_laplace",
                            "source", "source_description", "id", "by", "query", "where", "sql", "query_description",
                            "n_individuals", "n_sole_contributors", "n_databases"})
    parts = []
    if c.get("private") is False or c.get("seed") is not None:
        parts.append('<div class="warn"><strong>Not private:</strong> this calibration was made with a fixed '
                     'seed for testing; its noise is reproducible and must not be used for a release.</div>')
    parts.append(_kv(rows))
    parts += [f'<div class="warn">{_e(w)}</div>' for w in c.get("warnings") or []]
    classical = c.get("classical_dp_explanation") or "for a fixed database the atom at zero makes it infinite"
    parts.append(_explain(
        "The release adds noise to the statistic so that every individual is protected at the target ε. λ* is "
        "the smallest Laplace smoothing scale for which this holds, verified for every individual. The noise is "
        "the part of that smoothing the curator's own density estimate does not already provide, so with "
        "some probability nothing is added. The guarantee is " + _e(c.get("guarantee") or
                                                                    "empirical (with respect to the variation "
                                                                    "between databases)")
        + ". Classical DP ε: " + _e(classical) + "."))
    return _section("calibration", "Noise calibration", *parts)


AUDIT_KINDS = ("mpl", "renyi", "release")


def audit_kind(d) -> str:
    """The kind of an audit summary (``mpl``, ``renyi`` or ``release``), checking it is one.

    Accepts what ``empdp audit mpl|renyi|release --json`` prints (the ``method``
    key) and, as ``mpl``, a plain dict with a ``lower_bound``.

    Raises
    ------
    InputError
        ``d`` is not an audit summary.
    """
    kind = d.get("method", "mpl") if isinstance(d, dict) else None
    key = "mpl_lower_bound" if kind == "release" else "lower_bound"
    if kind not in AUDIT_KINDS or key not in d:
        raise InputError("not an empdp audit result: expected the JSON printed by "
                         "'empdp audit mpl|renyi|release --json'")
    for name in (key, "true_value", "estimate", "exact_epsilon_max", "target_epsilon"):
        v = d.get(name)
        if not (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))):
            raise InputError(f"audit result: field {name!r} must be a number or null, got "
                             f"{str(v)[:40]!r}; re-create it with 'empdp audit ... --json'")
    return kind


def _true_value(d: dict):
    return math.inf if d.get("true_value_infinite") else d.get("true_value")


def _vs_truth(lb, truth) -> str:
    ok = lb is not None and float(lb) <= float(truth)
    return (f"{_fmt(truth)} <span class='{'ok' if ok else 'bad'}'>"
            f"({'bound holds' if ok else 'bound exceeds the truth'})</span>")


def _loss_curve(d: dict, lb, truth) -> str | None:
    curve = d.get("loss") if isinstance(d.get("loss"), dict) else d.get("loss_curve")
    if not (isinstance(curve, dict) and len(curve.get("t") or ())):
        return None
    t = np.asarray(curve["t"], dtype=float)
    if t.ndim != 1:  # a multivariate output has no single axis to draw along
        return None
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    ax.plot(t, np.asarray(curve["loss"], dtype=float), color=PURPLE, lw=1.6, label="empirical loss ℓ̂(t)")
    if isinstance(d.get("t_hat"), (int, float)):
        ax.axvline(float(d["t_hat"]), color=GREY, ls=":", lw=1.2, label="t̂")
    for v, c, lab in ((lb, BLUE, "lower bound"), (truth, RED, "true ε")):
        if v is not None and np.isfinite(float(v)):
            ax.axhline(float(v), color=c, ls="--", lw=1.2, label=lab)
    ax.set_xlabel("mechanism output t")
    ax.set_ylabel("|log f̂ₓ(t) − log f̂ₓ′(t)|")
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    return _img(fig, "MPL loss curve")


_AUDIT_EXPLAIN = (
    "A black-box audit runs the mechanism many times on a pair of neighbouring inputs and estimates how far "
    "apart its output distributions are. The lower bound is a statistical guarantee that the true value is at "
    "least this large, with confidence 1 − α; a bound above the claimed ε shows the claim is false. The bounds "
    "are asymptotic: see the sample sizes.")


def _audit_bound(d: dict, kind: str) -> str:
    """MPL (pure-DP ε, with its loss curve) or Rényi (D_α) lower bound of one mechanism."""
    lb, truth = d.get("lower_bound"), _true_value(d)
    renyi = kind == "renyi"
    rows = [(f"lower bound on {'D_α' if renyi else 'ε'} (confidence 1 − α)", _fmt(lb)),
            ("point estimate" if renyi else "largest stage-1 loss (biased up: the maximum of noisy estimates)",
             _fmt(d.get("estimate"))), ("worst pair", _e(d.get("pair", "–")))]
    rows += [("order α", _fmt(d.get("order"))), ("direction", _e(d.get("direction", "–")))] if renyi else \
        [("output t̂ where the loss peaks", _fmt(d.get("t_hat")))]
    rows += [("samples n (search) / N (final)", f"{_fmt(d.get('n'))} / {_fmt(d.get('N'))}"),
             ("α", _fmt(d.get("alpha")))]
    if truth is not None:
        rows.append((f"true {'D_α' if renyi else 'ε'}", _vs_truth(lb, truth)))
    rows += _extra_rows(d, {"method", "lower_bound", "estimate", "pair", "t_hat", "n", "N", "alpha", "true_value",
                            "true_value_infinite", "loss", "order", "direction"})
    parts = [_kv(rows)]
    curve = None if renyi else _loss_curve(d, lb, truth)
    if curve:
        parts.append(curve)
    parts.append(_explain(_AUDIT_EXPLAIN))
    title = f"Audit: Rényi lower bound on D_α (order {_fmt(d.get('order'))})" if renyi else \
        "Audit: MPL lower bound on ε"
    return _section("audit", title, *parts)


def _audit_release(d: dict, show: Callable) -> str:
    """The audit of a calibrated release (docs/method.md#94-release-audit): bounds beside the exact values, per individual."""
    ok, order = d.get("ok"), _fmt(d.get("order"))
    noise, ck = d.get("noise") or {}, d.get("curator_kernel") or {}
    rows = [("result", f"<span class='{'ok' if ok else 'bad'}'>"
                       f"{'the release meets its target ε' if ok else 'CHECK FAILED'}</span>"),
            ("target ε", _fmt(d.get("target_epsilon"))),
            ("MPL lower bound ≤ exact max εᵢ", f"{_fmt(d.get('mpl_lower_bound'))} ≤ {_fmt(d.get('exact_epsilon_max'))}"),
            ("MPL largest stage-1 loss (biased up)", _fmt(d.get("mpl_estimate"))),
            (f"Rényi lower bound vs exact max D_{order}",
             f"{_fmt(d.get('renyi_lower_bound'))} vs {_fmt(d.get('exact_renyi_max'))}"),
            ("noise", _e(f"{noise.get('kind', '–')}, weight at 0 {_fmt(noise.get('weight_zero'))}, "
                         f"scale {_fmt(noise.get('scale'))}")),
            ("curator kernel", _e(f"{ck.get('kind', '–')}, scale {_fmt(ck.get('scale'))}")),
            ("samples n / N (MPL), Rényi", f"{_fmt(d.get('n'))} / {_fmt(d.get('N'))}, {_fmt(d.get('n_renyi'))}"),
            ("α", _fmt(d.get("alpha")))]
    head = (f"<tr><th>id</th><th class='n'>exact εᵢ</th><th class='n'>MPL stage-1 max</th>"
            f"<th class='n'>exact D<sub>{order}</sub></th></tr>")
    body = "".join(f"<tr><td><code>{_e(show(r.get('id')))}</code></td><td class='n'>{_fmt(r.get('exact_epsilon'))}</td>"
                   f"<td class='n'>{_fmt(r.get('mpl_estimate'))}</td><td class='n'>{_fmt(r.get('exact_renyi'))}</td></tr>"
                   for r in d.get("individuals") or [] if isinstance(r, dict))
    warn = "".join(f'<div class="warn">{_e(w)}</div>' for w in d.get("warnings") or [])
    return _section("audit", "Audit of the calibrated release", _kv(rows),
                    f"<table><thead>{head}</thead><tbody>{body}</tbody></table>", warn, _explain(
                        "The release's output distribution is sampled for the riskiest individuals, with and "
                        "without each of them; the black-box lower bounds must lie below the exact values "
                        "computed from the calibration, which must lie below the target. " + _AUDIT_EXPLAIN))


def _audit(d: dict, show: Callable = str) -> str:
    kind = audit_kind(d)
    return _audit_release(d, show) if kind == "release" else _audit_bound(d, kind)


# ---------------------------------------------------------------- entry points

def report_html(assessment, *, epsilon: float | None = None, calibration: dict | None = None,
                audit: dict | None = None, hash_ids=False, audit_hash_ids=None) -> str:
    """The risk report of an assessment as one self-contained HTML string.

    Parameters
    ----------
    assessment : empdp.assess.Assessment
        The result of :func:`empdp.assess.assess`.
    epsilon : float, optional
        The ε to mark and to evaluate the table at; default the smallest assessed ε.
    calibration : dict, optional
        A calibration summary (the JSON of ``empdp calibrate``): adds the ``calibration`` section.
    audit : dict, optional
        What ``empdp audit mpl|renyi|release --json`` prints, or an MPL summary (``lower_bound``,
        ``estimate``, ``pair``, ``t_hat``, ``n``, ``N``, ``alpha``, ``true_value``, optionally
        ``loss = {"t": [...], "loss": [...]}``): adds the ``audit`` section (see :func:`audit_kind`).
    hash_ids : bool, bytes, str or callable
        Replace ids by pseudonyms: a key (HMAC-SHA256, :func:`keyed_hash`), a callable, or ``True`` for a
        random per-report key.
    audit_hash_ids : as ``hash_ids``, optional
        For the audit section's ids (default: ``hash_ids``); differs when the result's ids were
        hashed when it was saved but the audit's were not.

    Returns
    -------
    str
        The HTML document: inline CSS, figures as base64 PNG ``data:`` URIs, no scripts or URLs.
    """
    a = assessment
    eps = float(a.epsilons[0] if epsilon is None else epsilon)
    if not (np.isfinite(eps) and 0 <= eps <= 700):
        raise InputError(f"--epsilon must be in [0, 700] (e^epsilon overflows beyond), got {epsilon!r}")
    if audit is not None:
        audit_kind(audit)
    show = _id_formatter(hash_ids)
    idx, exact = _at(a, eps)
    rows, shifts, note = _top_rows(a, eps, show, TOP_TABLE)
    body = [_summary(a, eps, idx, exact), _risk_curves(a, eps), _at_risk(a, eps),
            _riskiest(a, eps, rows, note), _densities(a, eps, rows, shifts),
            _representativeness(a)]
    if getattr(a, "adversary", None):
        body.append(_adversary(a))
    if calibration is not None:
        body.append(_calibration(calibration))
    if audit is not None:
        body.append(_audit(audit, show if audit_hash_ids is None else _id_formatter(audit_hash_ids)))
    try:
        from importlib.metadata import version
        ver = version("empdp")
    except Exception:  # not installed: the report still renders
        ver = "?"
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>empdp risk report: {_e(a.query)}</title><style>{CSS}</style></head><body><main>"
            f"<header><h1>Empirical privacy risk report</h1><div class=\"sub\"><code>{_e(a.query)}</code> over "
            f"{a.n_databases} databases of {_e(a.source)} · generated {when} by empdp {_e(ver)}</div></header>\n"
            + "\n".join(body)
            + "<footer>Method: Burchard et al., empirical differential privacy for repeated databases. "
              "This file is sensitive (it names the riskiest individuals): keep it private.</footer>"
              "</main></body></html>\n")


def render_report(assessment, path, *, epsilon: float | None = None, calibration: dict | None = None,
                  audit: dict | None = None, hash_ids=False, audit_hash_ids=None) -> None:
    """Write :func:`report_html` to ``path`` atomically, owner-only (mode 0600; docs/method.md).

    Parameters are those of :func:`report_html`; nothing is written if rendering fails.
    """
    text = report_html(assessment, epsilon=epsilon, calibration=calibration, audit=audit, hash_ids=hash_ids,
                       audit_hash_ids=audit_hash_ids)
    with atomic_path(path, private=True) as tmp:
        tmp.write_text(text, encoding="utf-8")
