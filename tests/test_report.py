"""The HTML risk report (issue 5): self-contained, complete, owner-only."""

from __future__ import annotations

import base64
import dataclasses
import re
import stat
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from empdp import risk
from empdp.report import SECTIONS, keyed_hash, render_report, report_html
from empdp.report.assessment import top_rows
from empdp.report.markup import num

SAMPLE = Path(__file__).resolve().parents[1] / "sample_data" / "countymurders.parquet"

CALIBRATION = {
    "epsilon": 0.05, "lambda": 0.081, "lambda_hausdorff": 0.11, "lambda_winf": 0.3,
    "curator_kernel": {"kind": "laplace", "scale": 0.05},
    "noise": {"kind": "laplace_mixture", "weight_zero": 0.381, "scale": 0.081},
    "expected_abs_noise": 0.0501, "verified_eps_max": 0.04999, "classical_dp_epsilon": None,
}
AUDIT = {
    "lower_bound": 0.83, "estimate": 0.97, "pair": "s=0 vs s'=0.1", "t_hat": 0.25, "n": 10_000,
    "N": 100_000, "alpha": 0.05, "true_value": 1.0,
    "loss": {"t": np.linspace(-1, 1, 101).tolist(), "loss": np.abs(np.linspace(-1, 1, 101)).tolist()},
}


@pytest.fixture(scope="module")
def result(sample_assessment):
    return sample_assessment


@pytest.fixture(scope="module")
def plain(result, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    render_report(result, path)
    return path, path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def full(result):
    return report_html(result, epsilon=0.05, calibration=CALIBRATION, audit=AUDIT)


def _section_ids(text: str) -> set[str]:
    return set(re.findall(r'<section id="([^"]+)"', text))


def test_no_external_references(plain, full):
    for text in (plain[1], full):
        assert "http://" not in text.lower() and "https://" not in text.lower()
        assert "<script" not in text.lower() and "<link" not in text.lower()
        # every embedded resource is inline
        assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'src="([^"]*)"', text))


def test_images_are_png(full):
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', full)
    # curves, at risk, densities, representativeness, MPL loss curve
    assert len(imgs) == 5
    for data in imgs:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_section_present(plain, full):
    assert _section_ids(plain[1]) == set(SECTIONS)
    assert _section_ids(full) == set(SECTIONS) | {"calibration", "audit"}  # "adversary": test_adversary.py


def test_optional_sections_one_at_a_time(result):
    assert _section_ids(report_html(result, calibration=CALIBRATION)) == set(SECTIONS) | {"calibration"}
    text = report_html(result, audit={k: v for k, v in AUDIT.items() if k != "loss"})
    assert _section_ids(text) == set(SECTIONS) | {"audit"}
    assert text.count("data:image/png") == 4  # no loss curve given, none drawn


def test_contents(result, plain, full):
    text = plain[1]
    top = result.riskiest(1)[result.id_column][0]
    assert f"<code>{top}</code>" in text
    assert result.query in text
    assert "independent" in text  # the δ* caveat (docs/method.md#114-total-risk-assumes-independent-individuals)
    for w in result.warnings:
        assert w in text
    # the user's ε is marked; λ*, the noise and the audit bound are shown
    assert "0.05" in full and "0.081" in full and "0.83" in full
    assert "bound holds" in full
    assert "∞" in re.search(r'<section id="calibration">.*?</section>', full, re.S).group(0)


def test_file_is_private(plain):
    path = plain[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]  # no temp file left behind


def test_failure_writes_nothing(result, tmp_path):
    with pytest.raises(ValueError, match="epsilon"):
        render_report(result, tmp_path / "r.html", epsilon=-1.0)
    assert list(tmp_path.iterdir()) == []


def test_hashed_ids(result):
    key = b"secret key"
    ids = result.riskiest(10)[result.id_column].to_list()
    text = report_html(result, hash_ids=key)
    for v in ids:
        assert f"<code>{v}</code>" not in text and f"id {v}" not in text
        assert f"<code>{keyed_hash(v, key)}</code>" in text
    text = report_html(result, hash_ids=True)  # random key: still no raw ids
    assert all(f"<code>{v}</code>" not in text for v in ids)


def test_table_delta_matches_assessment(result):
    # the table's δ_i and ε_i are exact: recomputed from the shifts, and equal to the assessment's column
    rows, shifts, _ = top_rows(result, float(result.epsilons[0]), str, 10)
    assert shifts.shape == (len(rows), result.n_databases) and len(rows) >= 10
    eps_i, d = risk.evaluate(result.model, shifts, result.epsilons[:1])
    assert_allclose([r["delta"] for r in rows], d[:, 0], atol=1e-12)
    assert_allclose([r["eps_i"] for r in rows], eps_i, rtol=1e-12)
    column = dict(zip(*result.individuals.select(result.id_column, "delta").to_dict(as_series=False).values()))
    assert_allclose([r["delta"] for r in rows], [column[r[result.id_column]] for r in rows], atol=1e-12)


def test_epsilon_between_sweep_points(result):
    eps = float(np.sqrt(result.epsilons[3] * result.epsilons[4]))
    text = report_html(result, epsilon=eps)
    assert "an upper bound" in text


def test_without_engine(result):
    # a result loaded without its data still renders; only the density panels are replaced by a note
    text = report_html(dataclasses.replace(result, engine=None))
    assert _section_ids(text) == set(SECTIONS)
    assert "No individual with a defined leave-one-out value" in text


RENYI = {"method": "renyi", "lower_bound": 0.82, "estimate": 0.93, "order": 2.0, "pair": [[0.0], [1.0]],
         "direction": "x||x'", "t_hat": None, "n": 5000, "N": 5000, "alpha": 0.05, "true_value": 1.0,
         "true_value_infinite": False}
RELEASE = {"method": "release", "target_epsilon": 0.1, "order": 2.0, "ok": False, "mpl_lower_bound": 0.02,
           "mpl_estimate": 0.24, "exact_epsilon_max": 0.1, "renyi_lower_bound": 0.0026, "exact_renyi_max": 0.0025,
           "individuals": [{"id": 2185, "exact_epsilon": 0.1, "exact_renyi": 0.001, "mpl_estimate": 0.24}],
           "n": 20000, "N": 50000, "n_renyi": 100000, "alpha": 0.05, "warnings": ["a warning of the audit"],
           "noise": CALIBRATION["noise"], "curator_kernel": CALIBRATION["curator_kernel"]}


def _audit_section(text: str) -> str:
    return re.search(r'<section id="audit">.*?</section>', text, re.S).group(0)


def test_audit_json_of_every_cli_kind(result):
    from empdp.report.audit import audit as audit_section

    renyi = _audit_section(audit_section(RENYI))
    assert "Rényi lower bound on D_α (order 2)" in renyi and "0.82" in renyi and "bound holds" in renyi
    release = _audit_section(audit_section(RELEASE, lambda v: f"pseudo-{v}"))
    assert "CHECK FAILED" in release and "<code>pseudo-2185</code>" in release and "2185</code>" not in \
        release.replace("pseudo-2185</code>", "")
    assert "a warning of the audit" in release
    # the CLI's MPL JSON names its curve loss_curve; an infinite truth is a flag, the value null
    mpl = dict(AUDIT, method="mpl", loss_curve=AUDIT["loss"], true_value=None, true_value_infinite=True)
    del mpl["loss"]
    text = audit_section(mpl)
    assert text.count("data:image/png") == 1 and "∞" in text and "bound holds" in text


def _bucketed_release() -> dict:
    """What 'empdp audit release --json' prints for a calibration against an adversary: two buckets,
    the second under-noised (built with the audit's own dataclasses, so the keys are the real ones)."""
    from empdp.audit.release import BucketAudit, ReleaseAudit

    def rows(k, eps):
        return [{"id": i, "exact_epsilon": e, "exact_renyi": e / 50, "mpl_estimate": e + 0.1}
                for i, e in zip((2185 + k, 32027 + k), (eps, eps / 2))]

    per = [BucketAudit(target_epsilon=0.2, individuals=rows(0, 0.19), mpl_lower_bound=0.0455, stage1_max_loss=0.29,
                       renyi_lower_bound=0.0066, exact_epsilon_max=0.19, exact_renyi_max=0.0038, lo=1.5e8, hi=1.9e8,
                       n_databases=9, curator_kernel={"kind": "laplace", "scale": 0.0192}, alpha=0.025),
           BucketAudit(target_epsilon=0.2, individuals=rows(1, 0.37), mpl_lower_bound=0.0651, stage1_max_loss=0.47,
                       renyi_lower_bound=0.0047, exact_epsilon_max=0.37, exact_renyi_max=0.0074, lo=1.97e8, hi=2.1e8,
                       n_databases=8, curator_kernel={"kind": "laplace", "scale": 0.0154}, alpha=0.025)]
    everyone = sorted(({**r, "bucket": k} for k, b in enumerate(per) for r in b.individuals),
                      key=lambda r: -r["exact_epsilon"])
    return ReleaseAudit(target_epsilon=0.2, individuals=everyone, mpl_lower_bound=0.0651, stage1_max_loss=0.47,
                        renyi_lower_bound=0.0066, exact_epsilon_max=0.37, exact_renyi_max=0.0074, search_size=20000,
                        final_size=50000, renyi_sample_size=100000, alpha=0.05, noise=CALIBRATION["noise"], curator_kernel=CALIBRATION[
                            "curator_kernel"], buckets=per, adversary_statistic="sum(popul)").to_dict()


def test_release_audit_against_an_adversary_has_a_row_per_bucket(result):
    from empdp.audit.release import describe_buckets
    from empdp.report.audit import audit as audit_section

    d = _bucketed_release()
    assert d["worst_bucket"] == 1 and not d["ok"]
    text = _audit_section(report_html(result, epsilon=0.2, audit=d))
    tables = re.findall(r"<table>.*?</table>", text, re.S)
    assert len(tables) == 2  # the individuals, then the buckets
    rows = re.findall(r"<tr>(.*?)</tr>", tables[1], re.S)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
    assert [c[0] for c in cells] == ["0", "1 (worst)"]
    for c, b in zip(cells, d["buckets"]):  # range, size, kernel scale, alpha and the figures, as the JSON has them
        assert c[1:10] == [num(b["lo"]), num(b["hi"]), str(b["n_databases"]), num(b["curator_kernel"]["scale"]),
                           num(b["alpha"]), num(b["mpl_lower_bound"]), num(b["exact_epsilon_max"]),
                           num(b["renyi_lower_bound"]), num(b["exact_renyi_max"])]
    assert "meets the target" in cells[0][10] and "needs more noise" in cells[1][10] and "class='bad'" in cells[1][10]
    # the terminal says the same of each bucket
    lines = describe_buckets(d)
    assert "FAILS" in lines[3] and lines[2].rstrip().endswith("ok") and "worst bucket: 1" in lines[-1]
    assert "<code>sum(popul)</code>" in text and "Group 1 sets the verdict" in text and "CHECK FAILED" in text
    # every individual row names its bucket
    ind = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in re.findall(r"<tr>(.*?)</tr>", tables[0], re.S)[1:]]
    assert [(r[0], r[1]) for r in ind] == [(f"<code>{r['id']}</code>", str(r["bucket"])) for r in d["individuals"]]
    # a plain release audit has neither
    plain = _audit_section(audit_section(RELEASE))
    assert plain.count("<table>") == 1 and ">bucket<" not in plain and "sets the verdict" not in plain


@pytest.mark.parametrize("bad", [{"method": "guess", "lower_bound": 1}, {"estimate": 1.0}, [1, 2], CALIBRATION])
def test_audit_of_the_wrong_kind_is_refused(result, bad):
    from empdp.errors import InputError
    from empdp.report import audit_kind

    with pytest.raises(InputError, match="not an empdp audit result"):
        audit_kind(bad)


def test_calibration_json_of_the_cli_shows_no_bookkeeping():
    from empdp.noise import calibrate_values
    from empdp.noise.calibration import _classical_note
    from empdp.report.calibration import calibration as calibration_section

    rng = np.random.default_rng(0)
    cal = calibrate_values(rng.normal(size=12), rng.normal(size=(5, 12)) * 0.1, epsilon=1.0, kernel="laplace",
                           bandwidth=0.01).to_dict()
    text = calibration_section(cal)
    assert "empdp-calibration/1" not in text and "n_bisected" not in text and "seconds" not in text
    assert f"{num(cal['lambda'])}" in text and "atom at 0" in text and "<td>∞</td>" in text
    # pure Laplace noise (the Gaussian fallback's w = 0): the classical ε is unknown, not ∞
    pure = dict(cal, noise={"kind": "laplace", "weight_zero": 0.0, "scale": cal["lambda"]},
                classical_dp_explanation=_classical_note("laplace"))
    text = calibration_section(pure)
    assert "not claimed" in text and "global sensitivity" in text and "<td>∞</td>" not in text


def test_ids_in_scripts_the_plot_font_lacks_render_without_warnings():
    import warnings

    import pandas as pd

    from empdp.assessment import assess

    rng = np.random.default_rng(0)
    names = ["北京", "上海", "東京", "서울", "Zürich", "Αθήνα"] + [f"c{i}" for i in range(20)]
    df = pd.DataFrame([(n, y, rng.normal() + (5 if n == "北京" else 0) * (y % 2)) for y in range(12) for n in names],
                      columns=["id", "year", "x"])
    a = assess(df, id="id", by="year", query="mean(x)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        html = report_html(a)
    assert "北京" in html


def test_flat_risk_curves_sit_on_a_sensible_axis(monkeypatch):
    """Issue 34: with every ε above ε_all the δ axis ran from -0.04 to 0.04 and the at-risk axis 0-0.05."""
    from types import SimpleNamespace

    from empdp.report import plots

    drawn = []
    monkeypatch.setattr(plots, "_img", lambda fig, alt: drawn.append(fig.axes[0]) or "")
    eps = np.linspace(1.0, 2.0, 5)
    flat = SimpleNamespace(epsilons=eps, delta=np.zeros(5), total_risk=np.zeros(5), n_at_risk=np.zeros(5, int),
                           eps_all=0.9)
    plots.risk_curves(flat, 1.5)
    plots.at_risk(flat, 1.5)
    (risk, count) = drawn
    assert risk.get_ylim() == (0.0, 1.0) and count.get_ylim() == (0.0, 1.0)
    assert all(t == int(t) for t in count.get_yticks())
    assert any("every ε shown" in t.get_text() for t in risk.texts)
    some = SimpleNamespace(epsilons=eps, delta=np.array([0.3, 0.2, 0.1, 0.05, 0.0]),
                           total_risk=np.array([0.5, 0.3, 0.15, 0.06, 0.0]), n_at_risk=np.array([4, 3, 2, 1, 0]),
                           eps_all=1.9)
    drawn.clear()
    plots.risk_curves(some, 1.5)
    plots.at_risk(some, 1.5)
    assert drawn[0].get_ylim()[0] == 0.0 and drawn[0].get_ylim()[1] >= 0.5 and not drawn[0].texts
    assert drawn[1].get_ylim()[0] == 0.0 and drawn[1].get_ylim()[1] >= 4
