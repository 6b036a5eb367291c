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

from empdp.assess import assess
from empdp.report import OPTIONAL_SECTIONS, SECTIONS, _top_rows, keyed_hash, render_report, report_html

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
def result():
    # a fixed model (no bandwidth search) keeps this fast
    return assess(str(SAMPLE), id="countyid", by="year", query="mean(murdrate)", kernel="laplace", bandwidth=0.05)


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
    assert _section_ids(full) == set(SECTIONS) | set(OPTIONAL_SECTIONS)


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
    assert "independent" in text  # the δ* caveat (SPEC 10.3)
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
    # δ_i recomputed for the table at the smallest ε equals the assessment's column
    rows, shifts, exact = _top_rows(result, float(result.epsilons[0]), str, 10)
    assert exact and shifts.shape == (10, result.n_databases)
    assert_allclose([r["delta_eps"] for r in rows], [r["delta"] for r in rows], atol=1e-9)


def test_epsilon_between_sweep_points(result):
    eps = float(np.sqrt(result.epsilons[3] * result.epsilons[4]))
    text = report_html(result, epsilon=eps)
    assert "an upper bound" in text


def test_without_engine(result):
    # a result loaded without its data still renders; only the density panels are replaced by a note
    text = report_html(dataclasses.replace(result, engine=None))
    assert _section_ids(text) == set(SECTIONS)
    assert "No individual with a defined leave-one-out value" in text
