"""Joint noise stated in each statistic's own units (issue 34, item 7): exact figures, calibrate, release, old files."""

import json
import math

import numpy as np
import pytest
from helpers import CURATOR_KEY, SAMPLE, run

from empdp.keys import key_id, mac
from empdp.noise import JointCalibration, Ledger, load_calibration
from empdp.noise.joint_exact import JointNoise

pytestmark = pytest.mark.usefixtures("curator_key")


def test_one_axis_has_the_closed_forms():
    """w δ_0 + (1 − w) Laplace(λ): E|y| = (1 − w) λ and P(|y| ≤ q) = w + (1 − w)(1 − e^{−q/λ})."""
    w, lam = 0.3, 2.0
    noise = JointNoise("laplace_mixture", np.array([w]), np.array([lam]), np.array([[1.0]]))
    assert noise.expected_abs() == pytest.approx([(1 - w) * lam], rel=1e-9)
    q = -lam * math.log(0.05 / (1 - w))
    assert noise.interval(0.95) == [pytest.approx([-q, q], rel=1e-8)]


@pytest.mark.parametrize("w, lam, winv", [
    ([0.3, 0.5], [2.0, 1.0], [[1.0, 0.5], [0.2, 3.0]]),
    ([0.9, 0.0], [1.0, 5.0], [[2.0, -1.0], [0.0, 1.0]]),
    ([0.2, 0.2, 0.4], [1.0, 2.0, 0.5], [[1.0, 0.3, 0.0], [0.1, 1.0, 0.2], [0.0, -0.5, 2.0]]),
])
def test_mixed_axes_match_a_simulation(w, lam, winv):
    noise = JointNoise("laplace_mixture", np.array(w), np.array(lam), np.array(winv))
    y = noise.sample(1_000_000, np.random.default_rng(7))
    assert noise.expected_abs() == pytest.approx(np.abs(y).mean(axis=0), rel=0.01)
    for k, (lo, hi) in enumerate(noise.interval(0.95)):
        assert lo == -hi and np.mean(np.abs(y[:, k]) <= hi) == pytest.approx(0.95, abs=0.002)


@pytest.fixture(scope="module")
def joint_cal(tmp_path_factory, curator_key_module):
    path = tmp_path_factory.mktemp("joint") / "j.json"
    res = run("calibrate", SAMPLE, "--id", "countyid", "--by", "year", "--query", "sum(murders)",
              "--query", "mean(murdrate)", "-e", 1, "-o", path)
    assert res.exit_code == 0, res.output
    return path, res.stdout


def test_calibrate_states_the_noise_of_each_statistic_in_its_units(joint_cal):
    path, terminal = joint_cal
    d = json.loads(path.read_text())
    n = d["noise"]
    noise = JointNoise(n["kind"], np.array(n["weights"]), np.array(n["scales"]), np.array(n["unwhitening"]))
    assert d["format"] == "empdp-joint-calibration/2" and isinstance(load_calibration(path, key=CURATOR_KEY),
                                                                     JointCalibration)
    assert d["expected_abs_noise"] == pytest.approx(noise.expected_abs(), rel=1e-9)
    total, rate = d["expected_abs_noise"]
    assert total > 100 and rate < 1  # murders and a rate per 10,000: units, not whitened axes
    assert [lo == -hi > -math.inf for lo, hi in d["noise_interval_95"]] == [True, True]
    assert "noise on sum(murders)    expected |noise| " in terminal and "95% within ±" in terminal
    assert "expected |z_k|" not in terminal


def test_release_says_the_size_of_the_noise_it_added(joint_cal, tmp_path):
    path, _ = joint_cal
    res = run("release", path, "--value", "1000,0.5", "--ledger", tmp_path / "l.sqlite", "--budget", 3)
    assert res.exit_code == 0, res.output
    assert "noise on sum(murders): expected |noise| " in res.stderr and "(its own units)" in res.stderr


def test_a_file_of_the_first_format_still_loads_and_releases(joint_cal, tmp_path):
    """The first format held E|z_k| per whitened axis: it loads (its figures per statistic derived), keeps
    its digest in the ledger, and releases."""
    path, _ = joint_cal
    d = json.loads(path.read_text())
    noise = d["noise"]
    old = {k: v for k, v in d.items() if k not in ("digest", "hmac", "key_id", "noise_interval_95")}
    old["format"] = "empdp-joint-calibration/1"
    old["expected_abs_noise"] = [(1 - w) * lam for w, lam in zip(noise["weights"], noise["scales"])]
    text = json.dumps(old, indent=2, sort_keys=True)
    import hashlib

    signed = {**old, "digest": hashlib.sha256(text.encode()).hexdigest(), "key_id": key_id(CURATOR_KEY),
              "hmac": mac(CURATOR_KEY, text)}
    first = tmp_path / "first.json"
    first.write_text(json.dumps(signed))
    cal = load_calibration(first, key=CURATOR_KEY)
    assert isinstance(cal, JointCalibration) and cal.digest == signed["digest"]
    assert cal.expected_abs_noise == pytest.approx(d["expected_abs_noise"], rel=1e-9)
    res = run("release", first, "--value", "1000,0.5", "--ledger", tmp_path / "l.sqlite", "--budget", 3)
    assert res.exit_code == 0, res.output
    assert Ledger(tmp_path / "l.sqlite", key=CURATOR_KEY).records()[0]["calibration_digest"] == signed["digest"]
