"""Adversarial knowledge: risk conditional on a statistic of each database the adversary knows.

Checked against a brute-force bucketed reference (the buckets cut by hand from the statistic,
each bucket's model fitted by hand, δ_i and ε_i by dense quadrature), with selected and with
fixed bandwidths; --buckets 1 reproduces the plain assessment; a constructed panel where the
knowledge raises an individual's risk by a large factor, and one where it does not; bad input.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from numpy.testing import assert_allclose
from reference import brute_force_risk

from empdp.assessment import assess
from empdp.cli.main import cli
from empdp.density import select_density
from empdp.settings import Model

EPS = np.array([0.05, 0.2, 0.6])


def season_panel(seed: int, n_db: int = 24, n_ind: int = 30, spike: float = 0.0) -> pd.DataFrame:
    """Databases of two seasons with different levels; individual 'k' contributes ``spike`` more in
    the high season only, where the query's spread is small: conditioning on the season exposes k."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in range(n_db):
        high = j % 2
        for i in range(n_ind):
            x = 10 + 30 * high + rng.normal(0, 1 if high else 8)
            rows.append((f"c{i}", 2000 + j, x, high))
        rows.append(("k", 2000 + j, 10 + 30 * high + rng.normal(0, 1) + spike * high, high))
    return pd.DataFrame(rows, columns=["id", "db", "x", "season"])


def _reference(df, bandwidth):
    """Brute-force risk knowing the season: the two buckets are the two seasons, cut by hand;
    δ_i = max_B δ_i^B, ε_i = max_B ε_i^B, with each bucket's own model."""
    from empdp.loo import leave_one_out

    loo = leave_one_out(df, id="id", by="db", query="mean(x)")
    season = df.groupby("db")["season"].max().to_numpy()
    seasons = [np.flatnonzero(season == 0), np.flatnonzero(season == 1)]
    assert len(seasons[0]) == len(seasons[1])  # equal halves: the buckets are exactly the seasons
    delta = np.zeros((2, len(loo.shifts), len(EPS)))
    eps_i = np.zeros((2, len(loo.shifts)))
    for k, cols in enumerate(seasons):
        model = select_density(loo.q[cols], kernel="laplace", bandwidth=bandwidth)
        for r in range(len(loo.shifts)):
            delta[k, r], eps_i[k, r] = brute_force_risk(model, loo.shifts[r, cols], EPS, points=60_001)
    return loo, delta, eps_i


@pytest.mark.parametrize("bandwidth", ["auto", 1.5])
def test_matches_a_brute_force_bucketed_reference(bandwidth):
    df = season_panel(1, n_db=20, n_ind=6, spike=4.0)
    a = assess(df, id="id", by="db", query="mean(x)", epsilon=EPS, exact_all=True,
               model=Model(adversary="max(season)", buckets=2, bandwidth=bandwidth))
    loo, per_delta, per_eps = _reference(df, bandwidth)
    delta, eps_i = per_delta.max(axis=0), per_eps.max(axis=0)
    buckets = a.to_dict()["adversary"]["buckets"]
    assert_allclose([b["eps_all"] for b in buckets], per_eps.max(axis=1), rtol=1e-6)
    setter = a.individuals["bucket"].to_numpy()
    assert (setter == per_eps.argmax(axis=0)).all()
    ids = a.individuals["id"].to_list()
    assert ids == loo.ids.to_list()
    got_eps = a.individuals["eps_i"].to_numpy()
    assert_allclose(a.individuals["delta"].to_numpy(), delta[:, 0], atol=1e-6)
    assert_allclose(got_eps, eps_i, rtol=1e-6)
    assert_allclose(a.delta, delta.max(axis=0), atol=1e-6)
    assert a.eps_all == pytest.approx(eps_i.max(), rel=1e-6)
    # every individual's δ_i at each ε, through the exact per-row path the table uses
    for k, e in enumerate(EPS):
        _, d = a.exact_risk(np.arange(a.n_individuals), e)
        assert_allclose(d, delta[:, k], atol=1e-6)


def test_one_bucket_is_the_plain_assessment():
    df = season_panel(2)
    plain = assess(df, id="id", by="db", query="mean(x)", epsilon=EPS)
    one = assess(df, id="id", by="db", query="mean(x)", epsilon=EPS, model=Model(adversary="max(season)", buckets=1))
    np.testing.assert_array_equal(one.delta, plain.delta)
    np.testing.assert_array_equal(one.total_risk, plain.total_risk)
    np.testing.assert_array_equal(one.n_at_risk, plain.n_at_risk)
    assert one.eps_all == plain.eps_all
    np.testing.assert_array_equal(one.individuals["delta"].to_numpy(), plain.individuals["delta"].to_numpy())


def test_knowing_the_season_exposes_the_individual_who_stands_out_in_it():
    # k adds 4 in the high season, where the query's spread is 1/8 of the low season's: in the
    # pooled model the two seasons' clusters hide k; within the high season k moves every point
    df = season_panel(3, spike=4.0)
    plain = assess(df, id="id", by="db", query="mean(x)")
    known = assess(df, id="id", by="db", query="mean(x)", model=Model(adversary="max(season)", buckets=2))
    eps = dict(zip(known.individuals["id"].to_list(), known.individuals["eps_i"].to_list()))
    top = known.riskiest(1)
    assert top["id"][0] == "k"
    plain_k = plain.exact_risk(np.array([plain.individuals["id"].to_list().index("k")]), 1.0)[0][0]
    assert eps["k"] > 5 * plain_k, (eps["k"], plain_k)
    d = known.to_dict()["adversary"]
    assert d["statistic"] == "max(season)" and [b["n_databases"] for b in d["buckets"]] == [12, 12]
    assert d["buckets"][1]["lo"] == d["buckets"][1]["hi"] == 1.0
    assert d["unconditional"]["eps_all"] == pytest.approx(plain.eps_all)
    assert known.individuals.filter(known.individuals["id"] == "k")["bucket"][0] == 1


def test_knowledge_unrelated_to_the_query_changes_little():
    # the adversary knows a coin flip per database, unrelated to anyone's contribution
    df = season_panel(4, spike=0.0)
    df = df.assign(season=0)  # one season: the query is one cluster
    rng = np.random.default_rng(0)
    flip = dict(zip(sorted(df["db"].unique()), rng.integers(0, 2, df["db"].nunique())))
    df["coin"] = df["db"].map(flip)
    plain = assess(df, id="id", by="db", query="mean(x)")
    known = assess(df, id="id", by="db", query="mean(x)", model=Model(adversary="max(coin)", buckets=2))
    assert known.eps_all < 3 * plain.eps_all


@pytest.fixture
def panel_file(tmp_path):
    path = tmp_path / "p.parquet"
    df = season_panel(5)
    df["empty"] = np.where(df["db"] == 2003, np.nan, 1.0)
    df["word"] = "a"
    df.to_parquet(path)
    return str(path)


def _run(path, *extra):
    return CliRunner().invoke(cli, ["assess", path, "--id", "id", "--by", "db", "--query", "mean(x)", *extra])


def _one_line_error(res, needle):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0], res.output


@pytest.mark.parametrize("extra,needle", [
    (["--adversary", "max(season)", "--buckets", "0"], "--buckets"),
    (["--adversary", "max(season)", "--buckets", "13"], "--buckets"),
    (["--buckets", "2"], "--adversary"),
    (["--adversary", "mean(empty)"], "adversary statistic"),
    (["--adversary", "count(*)"], "same"),
    (["--adversary", "max(word)"], "word"),
])
def test_bad_adversary_input_is_one_line(panel_file, extra, needle):
    _one_line_error(_run(panel_file, *extra), needle)


def test_cli_json_and_small_bucket_warning(panel_file):
    res = _run(panel_file, "--adversary", "max(season)", "--buckets", "3", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert [b["n_databases"] for b in d["adversary"]["buckets"]] == [8, 8, 8]
    assert any("fewer than 10 databases" in w for w in d["warnings"])
    human = _run(panel_file, "--adversary", "max(season)", "--buckets", "2")
    assert human.exit_code == 0 and "adversary" in human.output and "unconditional" in human.output


def test_saved_result_and_report_keep_the_buckets(tmp_path):
    from empdp.assessment.result import load_result, save_result
    from empdp.report import report_html

    a = assess(season_panel(3, spike=4.0), id="id", by="db", query="mean(x)",
               model=Model(adversary="max(season)", buckets=2))
    save_result(a, tmp_path / "r.json")
    r = load_result(tmp_path / "r.json")
    assert r.adversary == json.loads(json.dumps(a.adversary))
    eps = 0.5  # not the saved ε: the saved rows are re-evaluated with the bucket models
    assert_allclose(r.riskiest(3, eps)["delta"].to_numpy(), a.riskiest(3, eps)["delta"].to_numpy(), atol=1e-12)
    html = report_html(r)
    assert 'id="adversary"' in html and "max(season)" in html
    assert 'id="adversary"' not in report_html(assess(season_panel(3), id="id", by="db", query="mean(x)"))


# ------------------------------------------------------------------ calibration against the adversary
def _calibrate(df, eps, **kw):
    import warnings

    from empdp import calibrate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate(df, id="id", by="db", query="mean(x)", epsilon=eps,
                         model=Model(adversary="max(season)", **kw))



@pytest.mark.parametrize("bandwidth", ["auto", 1.0])
def test_calibrate_with_adversary_adds_no_noise_exactly_when_assess_finds_nobody_at_risk(bandwidth):
    df = season_panel(3, spike=4.0)
    a = assess(df, id="id", by="db", query="mean(x)",
               model=Model(adversary="max(season)", buckets=2, bandwidth=bandwidth))
    for factor, nobody in ((1 - 1e-6, False), (1 + 1e-6, True)):
        eps = a.eps_all * factor
        found = int(assess(df, id="id", by="db", query="mean(x)", epsilon=[eps],
                           model=Model(adversary="max(season)", buckets=2, bandwidth=bandwidth)).n_at_risk[0]) == 0
        cal = _calibrate(df, eps, buckets=2, bandwidth=bandwidth)
        assert found is nobody and (cal.noise["kind"] == "none") is nobody
        assert cal.verified_eps_max <= eps


def test_one_noise_law_makes_every_bucket_private():
    # brute force: the released density of every bucket, P̂_B ⋆ ℓ_b_B ⋆ h, on a dense grid
    from empdp.loo import leave_one_out

    df = season_panel(3, spike=4.0)
    eps = 0.5
    cal = _calibrate(df, eps, buckets=2)
    loo = leave_one_out(df, id="id", by="db", query="mean(x)")
    w, lam = cal.noise["weight_zero"], cal.noise["scale"]
    assert 0 < w < 1
    worst = 0.0
    for b in cal.deconvolution["adversary"]["buckets"]:
        cols = np.array([loo.labels.index(v) for v in b["databases"]])
        s = b["scale"]
        x = np.linspace(loo.q[cols].min() - 60 * lam, loo.q[cols].max() + 60 * lam, 40_001)

        def released(points):  # (ℓ_s ⋆ (w δ0 + (1 − w) ℓ_λ)) at each point, averaged
            u = np.abs(x[:, None] - points[None, :])
            lap = lambda t: np.exp(-u / t) / (2 * t)  # noqa: E731
            conv = (lam * lap(lam) * lam - s * lap(s) * s) / (lam ** 2 - s ** 2)  # ℓ_s ⋆ ℓ_λ
            return (w * lap(s) + (1 - w) * conv).mean(axis=1)

        p = released(loo.q[cols])
        for r in np.flatnonzero(~loo.undefined):
            pi = released(loo.q[cols] - loo.shifts[r, cols])
            worst = max(worst, float(np.abs(np.log(p) - np.log(pi)).max()))
    assert worst <= eps * (1 + 1e-9), worst
    assert worst > 0.5 * eps  # the noise is not grossly more than needed


def test_adversary_calibration_releases_and_is_audited_per_bucket(tmp_path):
    from empdp.audit import audit_release

    df = season_panel(3, spike=4.0)
    cal = _calibrate(df, 0.5, buckets=2)
    out = cal.release(1.0, seed=1)  # a test draw: the noise law is an ordinary one
    assert out["noise_added"] is True and out["private"] is False
    path = tmp_path / "d.parquet"
    df.to_parquet(path)
    res = audit_release(cal, str(path), top=1, n=2000, N=5000, n_renyi=2000, rng=1)
    assert len(res.buckets) == 2 and res.ok


def test_cli_calibrate_with_adversary(panel_file, tmp_path):
    out = tmp_path / "cal.json"
    res = CliRunner().invoke(cli, ["calibrate", panel_file, "--id", "id", "--by", "db", "--query", "mean(x)",
                                   "-e", "0.5", "--adversary", "max(season)", "--buckets", "2", "-o", str(out),
                                   "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["deconvolution"]["adversary"]["statistic"] == "max(season)"
    assert [b["n_databases"] for b in d["deconvolution"]["adversary"]["buckets"]] == [12, 12]
    bad = CliRunner().invoke(cli, ["calibrate", panel_file, "--id", "id", "--by", "db", "--query", "mean(x)",
                                   "-e", "0.5", "--buckets", "2", "-o", str(tmp_path / "c2.json")])
    _one_line_error(bad, "--adversary")


def test_out_is_complete_with_an_adversary(tmp_path):
    """Issue 34: 'assess --adversary ... --out' left eps_i and bucket empty for 916 of 2,197 counties (those
    screened out of both stages); without an adversary no row is empty."""
    import polars as pl
    from helpers import SAMPLE

    out = tmp_path / "o.parquet"
    res = CliRunner().invoke(cli, ["assess", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
                                   "--adversary", "sum(popul)", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    table = pl.read_parquet(out)
    assert table.height == 2197 and table["eps_i"].null_count() == 0
    positive = table.filter(pl.col("eps_i") > 0)
    assert positive.height > 2000 and positive["bucket"].null_count() == 0
    assert (table["eps_i"] <= table["eps_bound"] * (1 + 1e-9)).all()  # each ε_i under its screening bound


def test_report_density_panels_plot_the_model_that_sets_eps_i(monkeypatch):
    """Issue 34: a panel titled with the bucket's ε_i (0.349) plotted the pooled model, whose log ratio peaks at
    the unconditional ε_i (0.21). Each panel's log ratio now peaks at the ε_i in its title."""
    from helpers import SAMPLE

    from empdp.report import assessment as sections
    from empdp.report import plots

    a = assess(SAMPLE, id="countyid", by="year", query="mean(murdrate)",
               model=Model(adversary="sum(popul)", buckets=2, kernel="laplace"))
    rows, shifts, _ = sections.top_rows(a, float(a.epsilons[0]), str, 3)
    figures = []
    monkeypatch.setattr(plots, "_img", lambda fig, alt: figures.append(fig) or "")
    plots.densities(a, float(a.epsilons[0]), rows, shifts, [0, 1, 2])
    bottoms = figures[0].axes[3:6] if len(figures[0].axes) >= 6 else figures[0].axes[1::2]
    for r, ax in zip(rows, bottoms):
        peak = max(float(np.max(np.abs(line.get_ydata()))) for line in ax.get_lines()[:1])
        assert r["bucket"] is not None and f"(bucket {r['bucket']})" in " ".join(x.get_title() for x in figures[0].axes)
        assert peak == pytest.approx(r["eps_i"], rel=1e-6)
