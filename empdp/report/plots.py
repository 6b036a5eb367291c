"""The report's matplotlib figures, each returned as an ``<img>`` with a base64 PNG ``data:`` URI."""

from __future__ import annotations

import base64
import io
import warnings

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .markup import esc, num

BLUE, ORANGE, RED, PURPLE, GREY = "#1f4e79", "#d9822b", "#b22222", "#6a3d9a", "#8a8f98"


def _figure(w: float = 9.0, h: float = 3.6, **kw) -> Figure:
    # an Agg canvas of our own, not pyplot: no global backend switch, no figure registry to leak into
    fig = Figure(figsize=(w, h), dpi=100, **kw)
    FigureCanvasAgg(fig)
    fig.set_layout_engine("constrained")
    return fig


def _text(value) -> str:
    """A value from the data or a file (an id, a statistic's name) as literal figure text: a ``$``
    would start matplotlib's math mode, where a stray ``\\`` or brace stops the report."""
    return str(value).replace("$", r"\$")


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
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _flat_note(ax, text: str) -> None:
    """Say in the plot why its curve lies flat on the axis."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=GREY, fontsize=10)


def risk_curves(a, eps: float) -> tuple[str, bool]:
    """δ(ε) and δ*(ε) against ε, and whether the δ axis is logarithmic (zeros not drawn)."""
    fig = _figure()
    ax = fig.add_subplot()
    e = a.epsilons
    pos = np.concatenate([a.delta[a.delta > 0], a.total_risk[a.total_risk > 0]])
    log = len(pos) > 0 and pos.max() / pos.min() > 20
    unc = getattr(a, "uncertainty", None)
    for k, (y, c, lab) in enumerate(((a.delta, RED, "δ(ε): worst single individual"),
                                     (a.total_risk, PURPLE, "δ*(ε): at least one individual"))):
        keep = y > 0 if log else np.ones(len(y), bool)
        ax.plot(e[keep], y[keep], color=c, lw=2, marker="o" if len(e) < 15 else None, ms=4, label=lab)
        if unc is not None:
            _band(ax, e, (unc.delta, unc.total_risk)[k], c, log, f"{unc.level:.0%} interval" if k == 0 else None)
    if unc is not None and np.all(np.isfinite(unc.eps_all)):
        ax.axvspan(*unc.eps_all, color=GREY, alpha=0.12, lw=0, label=f"ε_all, {unc.level:.0%} interval")
    if log:
        ax.set_yscale("log")
    ax.axvline(eps, color=BLUE, ls="--", lw=1.3, label=f"chosen ε = {num(eps, 3)}")
    if np.isfinite(a.eps_all) and a.eps_all > 0:
        ax.axvline(a.eps_all, color=GREY, ls=":", lw=1.3, label=f"ε_all = {num(a.eps_all, 3)}")
    ax.set_xlabel("privacy level ε")
    ax.set_ylabel("δ" + (" (log scale)" if log else ""))
    if not log:  # δ is a probability: never below 0, and a flat zero line sits on the axis, not mid-plot
        ax.set_ylim(bottom=0, top=None if len(pos) else 1)
    if not len(pos):
        _flat_note(ax, "δ = 0 at every ε shown")
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    return _img(fig, "delta and total risk against epsilon"), log


def _band(ax, e, bounds: np.ndarray, color: str, log: bool, label: str | None, step: bool = False) -> None:
    """The interval [lo, hi] at each ε as a shaded band (on a log axis, only where it is above 0)."""
    lo, hi = np.asarray(bounds, dtype=float).T
    where = hi > 0 if log else np.ones(len(e), bool)
    floor = hi[where].min(initial=np.inf) / 10 if log else 0.0
    ax.fill_between(e, np.maximum(lo, floor) if log else lo, hi, where=where, color=color, alpha=0.15, lw=0,
                    step="post" if step else None, label=label)


def at_risk(a, eps: float) -> str:
    """The number of individuals with δ_i(ε) > 0 against ε (and its interval, when estimated)."""
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    ax.plot(a.epsilons, a.n_at_risk, color=BLUE, lw=2, drawstyle="steps-post",
            marker="o" if len(a.epsilons) < 15 else None, ms=4)
    unc = getattr(a, "uncertainty", None)
    if unc is not None:
        _band(ax, a.epsilons, unc.n_at_risk, BLUE, False, f"{unc.level:.0%} interval", step=True)
    ax.axvline(eps, color=BLUE, ls="--", lw=1.3, label=f"chosen ε = {num(eps, 3)}")
    ax.set_xlabel("privacy level ε")
    ax.set_ylabel("individuals with δᵢ(ε) > 0")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of individuals
    ax.set_ylim(bottom=0, top=None if np.max(a.n_at_risk, initial=0) > 0 else 1)
    if not np.max(a.n_at_risk, initial=0) > 0:
        _flat_note(ax, "nobody at risk at any ε shown")
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    return _img(fig, "individuals at risk against epsilon")


def _model_of(a, row, shift):
    """The model that sets the row's ε_i, with its databases' values and the row's shifts there: the adversary
    bucket's (within its databases) when the assessment conditions on one, else the curator's over all."""
    buckets, k = getattr(a, "buckets", None), row.get("bucket")
    if buckets and k is not None and 0 <= int(k) < len(buckets):
        b = buckets[int(k)]
        return b.model, np.asarray(a.q)[b.databases], np.asarray(shift)[b.databases], f" (bucket {int(k)})"
    return a.model, a.q, shift, ""


def densities(a, eps: float, rows, shifts, pick) -> str:
    """For the rows ``pick``: p̂ and p̂_i over the query values, and their log ratio against ±ε, each from the
    model that sets the individual's ε_i (an adversary bucket's, within its databases)."""
    fig = _figure(3.4 * len(pick) + 0.8, 5.2)
    axes = fig.subplots(2, len(pick), squeeze=False, sharex="col", gridspec_kw={"height_ratios": [2.2, 1]})
    for c, k in enumerate(pick):
        m, q, s, where = _model_of(a, rows[k], shifts[k])
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
        top.set_title(f"id {_text(r['shown_id'])}{where}\nεᵢ = {num(r['eps_i'], 3)}, δᵢ(ε) = {num(r['delta'], 3)}",
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
    return _img(fig, "density with and without the riskiest individuals")


def databases_per_individual(a, hist: dict) -> str:
    """The histogram of the number of databases an individual appears in."""
    fig = _figure(9, 3.0)
    ax = fig.add_subplot()
    ax.bar(list(hist), list(hist.values()), color=BLUE, width=0.8)
    ax.set_xlabel("number of databases an individual appears in")
    ax.set_ylabel("individuals")
    ax.set_xlim(0.3, a.n_databases + 0.7)
    _style(ax)
    return _img(fig, "databases per individual")


def adversary_risk(a) -> str:
    """δ*(ε) given the adversary's statistic beside the unconditional δ*(ε)."""
    adv = a.adversary
    unc = adv["unconditional"]
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    ue = np.array([r["epsilon"] for r in unc["sweep"]])
    ut = np.array([r["total_risk"] for r in unc["sweep"]])
    ax.plot(a.epsilons, a.total_risk, color=RED, lw=2, label=f"δ*(ε) knowing {_text(adv['statistic'])}")
    ax.plot(ue, ut, color=GREY, lw=2, ls="--", label="δ*(ε) without that knowledge")
    ax.set_xlabel("privacy level ε")
    ax.set_ylabel("total risk δ*")
    ax.legend(frameon=False, fontsize=9)
    _style(ax)
    return _img(fig, "total risk with and without the adversary's knowledge")


def loss_curve(d: dict, lb, truth) -> str | None:
    """An MPL audit's empirical loss curve with its bound and the true ε; None without a 1-d curve."""
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


def _axis(names, k: int, width: int = 34) -> str:
    name = names[k] if len(names[k]) <= width else names[k][:width - 1] + "…"
    return f"statistic {k + 1}: {_text(name)}"


def joint_contours(names, model, eps: float, title: str, shifts) -> str:
    """Contours of the joint p̂ and p̂_i (the points shifted by ``shifts`` (n, d)) over each pair of
    statistics (:func:`empdp.report.contours.density_grid`), with the query points; for d = 2 beside
    the log ratio log p̂ − log p̂_i against ±ε."""
    from .contours import density_grid, kernel_extent, pairs

    if model.d == 1:
        return _joint_line(names, model, eps, title, shifts, 3 * kernel_extent(model, np.ones(1)))
    grids = [density_grid(model, shifts, axes) for axes in pairs(model.d)]
    panels = len(grids) + (model.d == 2)
    fig = _figure(4.4 * panels + 0.6, 4.6)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax, g in zip(axes, grids):
        top = max(g.p.max(), g.p_i.max())
        if top > 0:
            levels = top * np.array([0.02, 0.1, 0.25, 0.5, 0.75, 0.95])
            ax.contour(g.x, g.y, g.p, levels=levels, colors=BLUE, linewidths=1.4)
            ax.contour(g.x, g.y, g.p_i, levels=levels, colors=ORANGE, linewidths=1.3, linestyles="--")
        ax.plot([], [], color=BLUE, lw=1.4, label="p̂: all individuals")
        ax.plot([], [], color=ORANGE, lw=1.3, ls="--", label="p̂ᵢ: without this one")
        seen, moved = g.coordinates(model.points), g.coordinates(model.points - shifts)
        ax.plot(*seen.T, "o", color=BLUE, ms=3.5, label="q_j: observed")
        ax.plot(*moved.T, "x", color=ORANGE, ms=4, label="q_j − Δ_ij: without this one")
        _pair_labels(ax, names, g)
        _style(ax)
    if model.d == 2:
        g, ax = grids[0], axes[-1]
        lr = g.log_p - g.log_p_i
        span = max(float(np.abs(lr).max()), eps, 1e-12)
        mesh = ax.pcolormesh(g.x, g.y, lr, cmap="RdBu_r", vmin=-span, vmax=span, shading="auto")
        if 0 < eps < span:
            ax.contour(g.x, g.y, lr, levels=[-eps, eps], colors="black", linewidths=1.0, linestyles=":")
        ax.plot(*g.coordinates(model.points).T, "o", color="black", ms=2.5)
        fig.colorbar(mesh, ax=ax, label="log p̂ − log p̂ᵢ (dotted: ±ε)")
        _pair_labels(ax, names, g)
    fig.suptitle(_text(title), fontsize=10)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, frameon=False,
               fontsize=9)
    return _img(fig, "joint density with and without the riskiest individual")


def _pair_labels(ax, names, g) -> None:
    i, j = g.axes
    ax.set_xlabel(_axis(names, i))
    if g.sheared:  # the ridge's residual, in statistic j's units
        sign = "−" if g.intercept >= 0 else "+"
        ax.set_ylabel(f"statistic {j + 1} − {num(g.slope, 3)} × statistic {i + 1} {sign} {num(abs(g.intercept), 4)}",
                      fontsize=9)
    else:
        ax.set_ylabel(_axis(names, j))


def _joint_line(names, model, eps: float, title: str, shifts, pad: float) -> str:
    """A joint query of one statistic: p̂ and p̂_i over its values, and their log ratio against ±ε."""
    pts = np.concatenate([model.points, model.points - shifts])[:, 0]
    x = np.union1d(np.linspace(pts.min() - pad, pts.max() + pad, 700), pts)[:, None]
    lp, lpi = model.logpdf(x), model.logpdf(x, shifts=shifts)
    fig = _figure(9, 3.6)
    top, bot = fig.subplots(1, 2)
    top.plot(x, np.exp(lp), color=BLUE, lw=1.8, label="p̂: all individuals")
    top.plot(x, np.exp(lpi), color=ORANGE, lw=1.6, ls="--", label="p̂ᵢ: without this one")
    bot.plot(x, lp - lpi, color=PURPLE, lw=1.4)
    bot.axhspan(-eps, eps, color=BLUE, alpha=0.08, lw=0)
    bot.set_ylabel("log p̂ − log p̂ᵢ")
    for ax in (top, bot):
        ax.set_xlabel(_axis(names, 0))
        _style(ax)
    top.legend(frameon=False, fontsize=9)
    fig.suptitle(_text(title), fontsize=10)
    return _img(fig, "density with and without the riskiest individual")
