"""The HTML report and the saved result of a joint release (issue 19): the paper's example, the contour
grids against a direct evaluation of the model density, saved files read back or refused in one line."""

from __future__ import annotations

import base64
import json
import math
import re
import stat

import numpy as np
import pytest
from helpers import html_sections, no_timestamp, one_line_error, run, table_rows
from numpy.testing import assert_allclose
from scipy.integrate import quad
from test_joint_assess import paper_table

from empdp.assessment.joint import assess_joint
from empdp.assessment.result import JOINT_FORMAT, keep_shifts, load_result, save_result
from empdp.errors import InputError
from empdp.report import JOINT_SECTIONS, render_report, report_html
from empdp.report.contours import density_grid, log_margin

PANEL = ["--id", "id", "--by", "db"]


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """The paper's panel: individual K adds a steady x to each database; the second sum leaves K out."""
    table, K = paper_table()
    folder = tmp_path_factory.mktemp("joint_report")
    table.write_parquet(folder / "paper.parquet")
    sql = ["SELECT sum(x) FROM db", f"SELECT sum(x) FILTER (WHERE id <> {K}) FROM db"]
    res = run("assess", folder / "paper.parquet", *PANEL, "--sql", sql[0], "--sql", sql[1],
              "--report", folder / "r.html", "--save-result", folder / "r.json")
    assert res.exit_code == 0, res.output
    assert f"HTML report written to {folder / 'r.html'} (mode 0600)" in res.output
    assert f"result saved to {folder / 'r.json'} (mode 0600)" in res.output
    return folder, K, sql


@pytest.fixture(scope="module")
def assessed(paper):
    """The same assessment through the library."""
    folder, K, sql = paper
    return assess_joint(str(folder / "paper.parquet"), id="id", by="db", sql=sql)


@pytest.fixture(scope="module")
def live(assessed):
    """... with the shifts of its riskiest rows at hand."""
    return keep_shifts(assessed)


def test_the_papers_example(paper, live):
    """Individual 7 first in the table and setting ε_all, the contours embedded, no bound anywhere."""
    folder, K, sql = paper
    path = folder / "r.html"
    html = path.read_text(encoding="utf-8")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    sec = html_sections(html)
    assert tuple(sec) == JOINT_SECTIONS
    rows = table_rows(sec["riskiest"])
    top = live.riskiest(10)
    assert rows[0][1] == str(K) and rows[0][-1] == "sets ε_all" and len(rows) == 10
    assert top["id"][0] == K and rows[0][3] == f"{live.eps_all:.4g}" and live.eps_all == top["eps_i"][0]
    assert [r[3] for r in rows] == [f"{v:.4g}" for v in top["eps_i"]]  # each ε_i exact, as the library's
    assert f"<div class=\"v\">{live.eps_all:.4g}</div>" in sec["summary"] and "ε_all" in sec["summary"]
    for q in sql:
        assert f"<code>{q.replace('<', '&lt;').replace('>', '&gt;')}</code>" in sec["summary"]
    for word in ("total risk δ*(ε)", "at risk", "Warnings"):
        assert word in html
    assert "≤" not in sec["riskiest"] and "&lt;=" not in html and "eps_i <=" not in html
    # the sweep table: the assessed δ(ε), δ*(ε) and at-risk counts
    sweep = table_rows(sec["sweep"])
    assert sweep[0] == [f"{live.epsilons[0]:.4g}", f"{live.delta[0]:.4g}", f"{live.total_risk[0]:.4g}",
                        str(int(live.n_at_risk[0]))]
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', sec["contours"])
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "two statistics" in sec["contours"] and "log ratio" in sec["contours"]


def test_the_library_report_is_the_cli_report(paper, assessed):
    folder, _, _ = paper
    cli = (folder / "r.html").read_text(encoding="utf-8")
    assert no_timestamp(report_html(assessed)) == no_timestamp(cli)


def _direct_log_density(model, x, shifts=None) -> np.ndarray:
    """log p̂ written out: |det W| / n Σ_j Π_k e^{−|(W(x − q_j + Δ_j))_k| / b_k} / (2 b_k)."""
    W, b = model.whitening, model.scales
    pts = model.points - (0 if shifts is None else shifts)
    out = []
    for xv in np.atleast_2d(x):
        terms = [np.prod(np.exp(-np.abs(W @ (xv - p)) / b) / (2 * b)) for p in pts]
        out.append(math.log(abs(np.linalg.det(W)) * sum(terms) / len(pts)))
    return np.array(out)


def test_contour_grids_are_the_model_density_and_differ_for_7(live):
    """The grids hold p̂ and p̂_i at their (sheared) points; their log ratio never exceeds ε_i, and for
    7 it reaches most of it, while for an individual alone private the two densities nearly agree."""
    top = live.riskiest(10)  # exact ε_i: 7 first, then individuals each statistic alone protects
    eps_i = dict(zip(top["id"].to_list(), top["eps_i"].to_list()))
    K, calm = top["id"][0], top["id"][-1]
    for who in (K, calm):
        s = live.shifts_of([who])[0]
        g = density_grid(live.model, s)
        rng = np.random.default_rng(who)
        picks = [(int(a), int(b)) for a, b in zip(rng.integers(0, len(g.y), 6), rng.integers(0, len(g.x), 6))]
        picks.append(np.unravel_index(np.argmax(g.log_p), g.log_p.shape))
        for r, c in picks:
            x = g.points(np.array([[g.x[c], g.y[r]]]))
            assert_allclose(g.log_p[r, c], _direct_log_density(live.model, x)[0], rtol=1e-9)
            assert_allclose(g.log_p_i[r, c], _direct_log_density(live.model, x, s)[0], rtol=1e-9)
        ratio = np.abs(g.log_p - g.log_p_i).max()
        assert ratio <= eps_i[who] * (1 + 1e-9)
        if who == K:
            assert g.sheared and ratio >= 0.5 * eps_i[K] and ratio > 100
        else:
            assert ratio < 3


def _direct_margin(model, xy, axes, shifts) -> float:
    """The 2-D margin by adaptive quadrature over the third statistic, split at every kernel's kinks."""
    (c,) = [k for k in range(3) if k not in axes]
    x0 = np.zeros(3)
    x0[list(axes)] = xy
    pts = model.points - shifts
    kinks = []  # where (W(x − q_j))_k = 0 along the line x0 + z e_c
    for p in pts:
        w = model.whitening @ (x0 - p)
        kinks += [-w[k] / model.whitening[k, c] for k in range(3) if model.whitening[k, c] != 0]
    kinks = np.sort(kinks)
    lo, hi = kinks[0] - 60 * model.scales.max() / np.abs(model.whitening[:, c]).max(), \
        kinks[-1] + 60 * model.scales.max() / np.abs(model.whitening[:, c]).max()

    def f(z):
        x = x0.copy()
        x[c] = z
        return math.exp(_direct_log_density(model, x, shifts)[0])

    edges = np.concatenate([[lo], kinks, [hi]])
    return sum(quad(f, a, b, epsabs=0, epsrel=1e-11)[0] for a, b in zip(edges[:-1], edges[1:]) if b > a)


def test_three_statistics_margins_against_quadrature():
    from empdp.risk.joint.model import select_joint_model

    rng = np.random.default_rng(3)
    q = rng.normal(size=(12, 3)) @ np.array([[1, 0.6, 0.2], [0, 1, 0.5], [0, 0, 1.0]]) * [10, 1, 3]
    model = select_joint_model(q)
    s = rng.normal(size=(12, 3)) * [1, 0.1, 0.3]
    for axes in ((0, 1), (0, 2), (1, 2)):
        for k in range(2):
            xy = q[k, list(axes)] + [0.2, -0.1]
            got = math.exp(log_margin(model, xy[None], axes, shifts=s)[0])
            assert_allclose(got, _direct_margin(model, xy, axes, s), rtol=1e-8)


def test_three_statistics_report_draws_the_pairwise_margins(tmp_path):
    table, K = paper_table(K=3, n_db=8, n_ind=8)
    path = tmp_path / "small.parquet"
    table.write_parquet(path)
    res = run("assess", path, *PANEL, "--query", "sum(x)", "--query", "max(x)", "--query", "median(x)",
              "--bandwidth", "10,3,2", "-e", "0.5", "--report", tmp_path / "r.html", "-q")
    assert res.exit_code == 0, res.output
    sec = html_sections((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert "2-D margins" in sec["contours"] and "one panel per pair" in sec["contours"]
    assert len(re.findall(r"data:image/png;base64,", sec["contours"])) >= 1
    assert len(table_rows(sec["riskiest"])[0]) == 9  # #, id, δ_i, ε_i, databases, three shifts, note


def test_saved_result_reads_back_and_renders_the_same_report(paper, live):
    folder, K, _ = paper
    text = (folder / "r.json").read_text()
    d = json.loads(text, parse_constant=lambda t: pytest.fail(f"non-standard JSON {t}"))
    assert d["format"] == JOINT_FORMAT and stat.S_IMODE((folder / "r.json").stat().st_mode) == 0o600
    saved = load_result(folder / "r.json")
    assert saved.eps_all == live.eps_all and saved.n_individuals == 30 and saved.queries == live.queries
    for f in ("epsilons", "delta", "total_risk", "n_at_risk", "q"):
        assert_allclose(getattr(saved, f), getattr(live, f), rtol=0, atol=0)
    for f in ("whitening", "unwhitening", "scales"):
        assert_allclose(getattr(saved.model, f), getattr(live.model, f), rtol=0, atol=0)
    assert saved.riskiest(10).equals(live.riskiest(10).select(saved.riskiest(10).columns))
    assert_allclose(saved.shifts_of([K]), live.shifts_of([K]), rtol=0, atol=0)
    res = run("report", folder / "r.json", "-o", folder / "again.html")
    assert res.exit_code == 0, res.output
    assert no_timestamp((folder / "again.html").read_text()) == no_timestamp((folder / "r.html").read_text())
    res = run("report", folder / "r.json", "-o", folder / "again.json.html", "--json")
    assert json.loads(res.output)["sections"] == list(JOINT_SECTIONS)


def test_the_library_saves_a_live_joint_assessment(paper, assessed, tmp_path):
    folder, K, _ = paper
    save_result(assessed, tmp_path / "api.json")
    saved = load_result(tmp_path / "api.json")
    assert saved.riskiest(3)["id"][0] == K and saved.saved_ids[0] == K
    assert_allclose(saved.shifts_of([K])[0], assessed.shifts[assessed.individuals["id"].to_list().index(K)])
    assert no_timestamp(report_html(saved)) == no_timestamp((folder / "r.html").read_text())


def test_hashed_ids_and_a_result_without_shifts(paper, tmp_path):
    folder, K, sql = paper
    res = run("assess", folder / "paper.parquet", *PANEL, "--sql", sql[0], "--sql", sql[1], "--hash-ids",
              "--save-result", tmp_path / "h.json", "--without-shifts", "--report", tmp_path / "h.html",
              env={"EMPDP_HASH_KEY": "k" * 40})
    assert res.exit_code == 0, res.output
    html = (tmp_path / "h.html").read_text()
    assert f"<code>{K}</code>" not in html and len(re.findall(r"data:image/png", html_sections(html)["contours"])) == 1
    saved = json.loads((tmp_path / "h.json").read_text())
    assert saved["ids_hashed"] and str(K) not in map(str, saved["individuals"]["id"])
    assert saved["shifts"] == {"ids": [], "rows": []}
    res = run("report", tmp_path / "h.json", "-o", tmp_path / "h2.html")
    assert res.exit_code == 0, res.output
    contours = html_sections((tmp_path / "h2.html").read_text())["contours"]
    assert "data:image/png" not in contours and "saved without them" in contours


def _damage(d: dict, how: str) -> None:
    if how == "drop q":
        del d["q"]
    elif how == "short q row":
        d["q"][3] = d["q"][3][:1]
    elif how == "singular whitening":
        d["model"]["whitening"] = [[1.0, 1.0], [1.0, 1.0]]
    elif how == "negative scale":
        d["model"]["scales"][0] = -1.0
    elif how == "text in the sweep":
        d["sweep"]["delta"][0] = "much"
    elif how == "a shift row too short":
        d["shifts"]["rows"][0] = d["shifts"]["rows"][0][:-1]
    elif how == "a shift of nobody":
        d["shifts"]["ids"][0] = "nobody"
    elif how == "one statistic":
        d["queries"] = d["queries"][:1]
    elif how == "independence not a list of dicts":
        d["independence"] = 3
    elif how == "a column one short":
        d["individuals"]["sole_contributor"].pop()
    elif how == "a huge whitening":
        d["model"]["whitening"] = [[1e308, 0.0], [0.0, 1e308]]


@pytest.mark.parametrize("how", ["drop q", "short q row", "singular whitening", "negative scale", "text in the sweep",
                                 "a shift row too short", "a shift of nobody", "one statistic",
                                 "independence not a list of dicts", "a column one short", "a huge whitening"])
def test_a_damaged_result_is_one_line_and_writes_nothing(paper, tmp_path, how):
    folder, _, _ = paper
    d = json.loads((folder / "r.json").read_text())
    _damage(d, how)
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match="damaged or incomplete"):
        load_result(tmp_path / "r.json")
    res = run("report", tmp_path / "r.json", "-o", tmp_path / "r.html")
    one_line_error(res, "damaged or incomplete")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.parametrize("options, fragments", [
    (["-o", "{tmp}/r.txt"], ["-o", ".html"]),
    (["-o", "{tmp}/r.html", "-e", "1"], ["smallest assessed epsilon", "--epsilon 1"]),
    (["-o", "{tmp}/r.html", "--calibration", "{tmp}/cal.json"], ["--calibration", "joint"]),
    (["-o", "{tmp}/r.html", "--audit", "{tmp}/audit.json"], ["--audit", "joint"]),
    (["-o", "{tmp}/missing/r.html"], ["-o"]),
])
def test_bad_report_options_are_one_line_and_write_nothing(paper, tmp_path, options, fragments):
    folder, _, _ = paper
    res = run("report", folder / "r.json", *[o.format(tmp=tmp_path) for o in options])
    one_line_error(res, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_the_report_is_written_atomically(live, tmp_path, monkeypatch):
    """A failure while drawing leaves an existing report as it was and no temporary file beside it."""
    from empdp.report import plots

    path = tmp_path / "r.html"
    path.write_text("the previous report")

    def broken(*args, **kwargs):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(plots, "joint_contours", broken)
    with pytest.raises(RuntimeError, match="drawing failed"):
        render_report(live, path)
    assert path.read_text() == "the previous report" and [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_sole_contributor_is_listed_and_the_next_rows_drawn(tmp_path):
    """A sole contributor heads the table with ε_i = ∞ and no density (theirs is undefined); the riskiest
    other individual and the ε_all setter are drawn, from the live result and from the saved one alike."""
    from conftest import random_panel

    random_panel(0, n_db=8, n_ind=14).to_parquet(tmp_path / "solo.parquet")
    res = run("assess", tmp_path / "solo.parquet", "--id", "id", "--by", "year", "--query", "sum(x)",
              "--query", "mean(w)", "--report", tmp_path / "r.html", "--save-result", tmp_path / "r.json", "-q")
    assert res.exit_code == 0, res.output
    assert run("report", tmp_path / "r.json", "-o", tmp_path / "again.html", "-q").exit_code == 0
    html = (tmp_path / "r.html").read_text()
    assert no_timestamp(html) == no_timestamp((tmp_path / "again.html").read_text())
    sec = html_sections(html)
    rows = table_rows(sec["riskiest"])
    assert rows[0][1] == "solo" and rows[0][3] == "∞" and "sole contributor" in rows[0][-1]
    setter = [r[1] for r in rows if r[-1] == "sets ε_all"]
    assert setter and setter[0] != rows[1][1]  # two individuals to draw
    figures = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', sec["contours"])
    assert len(figures) == 2


def test_a_joint_query_of_one_statistic_draws_curves():
    table, K = paper_table()
    a = assess_joint(table, id="id", by="db", queries=["sum(x)"])
    sec = html_sections(report_html(a))
    assert tuple(sec) == JOINT_SECTIONS and "curves, not contours" in sec["contours"]
    top = a.riskiest(10)
    drawn = 1 + (not top["sets_eps_all"][0])  # the riskiest, and the ε_all setter when another
    assert len(re.findall(r"data:image/png;base64,", sec["contours"])) == drawn
