"""``empdp calibrate`` / ``empdp release`` and the Python API (docs/method.md#8-calibration-and-release, issue 3 contract)."""

import json
import warnings

import numpy as np
import polars as pl
import pytest
from helpers import CURATOR_KEY, QUERY, SAMPLE, one_line_error, run, write_key

from empdp import risk
from empdp.density import DensityModel
from empdp.loo import leave_one_out
from empdp.noise import Calibration, Ledger, calibrate_values
from empdp.noise import calibrate as calibrate_api
from empdp.settings import Model

RELEASE_KEYS = {"value", "epsilon", "budget_spent", "budget_left", "private", "noise_added", "guarantee", "seq"}
KEY = CURATOR_KEY


pytestmark = pytest.mark.usefixtures("curator_key")  # $EMPDP_KEY = KEY (tests/conftest.py)


@pytest.fixture(scope="module")
def cal_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    key_file = write_key(path.with_name("curator.key"), KEY + b"\n")
    res = run("calibrate", SAMPLE, *QUERY, "--epsilon", 0.1, "--kernel", "laplace", "-o", path, "--json",
              "--key-file", key_file)
    assert res.exit_code == 0, res.output
    return path


def test_calibrate_json_contract(cal_path):
    d = json.loads(cal_path.read_text())
    for key in ("epsilon", "lambda", "lambda_hausdorff", "lambda_winf", "curator_kernel", "noise",
                "expected_abs_noise", "verified_eps_max", "n_individuals", "query", "source",
                "classical_dp_epsilon", "classical_dp_explanation"):
        assert key in d
    assert d["epsilon"] == 0.1 and d["n_individuals"] == 2197 and d["n_databases"] == 17
    assert d["curator_kernel"]["kind"] == "laplace"
    assert d["verified_eps_max"] <= 0.1
    assert d["lambda"] <= d["lambda_winf"]
    b, lam = d["curator_kernel"]["scale"], d["lambda"]
    assert d["noise"] == {"kind": "laplace_mixture", "weight_zero": pytest.approx((b / lam) ** 2), "scale": lam}
    assert d["expected_abs_noise"] == pytest.approx((1 - (b / lam) ** 2) * lam)
    assert d["classical_dp_epsilon"] is None and "atom at 0" in d["classical_dp_explanation"]
    assert (d["source"], d["id"], d["by"], d["query"]) == (SAMPLE, "countyid", "year", "mean(murdrate)")


def test_lambda_star_is_minimal_by_the_assessment_risk(cal_path):
    """λ* checked by other code than the search's: the assessment's ε_i (:func:`empdp.risk.evaluate`, its own
    exact integration) of P̂ ⋆ ℓ_λ against P̂_i ⋆ ℓ_λ, a Laplace KDE of the fixed bandwidth λ
    (docs/method.md#82-the-minimal-scale-exact): every ε_i ≤ ε at λ*, some ε_i > ε just below it."""
    cal = Calibration.load(cal_path, key=KEY)
    loo = leave_one_out(SAMPLE, id="countyid", by="year", query="mean(murdrate)")
    n = loo.q.size

    def eps_i(lam):
        model = DensityModel("laplace", lam, 0.0, loo.q, np.full(n, lam), loglik=0.0)
        return risk.evaluate(model, loo.shifts[~np.asarray(loo.undefined)])[0]

    at_star = eps_i(cal.lam)
    assert at_star.max() <= 0.1
    assert at_star.max() == pytest.approx(cal.verified_eps_max, rel=1e-9)
    assert eps_i(cal.lam * (1 - 1e-6)).max() > 0.1


def test_load_round_trip_and_digest(cal_path):
    cal = Calibration.load(cal_path, key=KEY)
    assert json.loads(cal.to_json(key=KEY)) == json.loads(cal_path.read_text())
    assert cal.digest == Calibration.load(cal_path, key=KEY).digest
    assert (cal.curator_kernel["kind"], cal.noise["kind"]) == ("laplace", "laplace_mixture")


def test_release_json_budget_and_refusal(cal_path, tmp_path):
    ledger = tmp_path / "l.sqlite"
    outs = []
    for _ in range(3):
        res = run("release", cal_path, "--value", 0.47, "--ledger", ledger, "--budget", 0.3, "--json")
        assert res.exit_code == 0, res.output
        outs.append(json.loads(res.stdout))
    assert res.stderr == "" and outs[0] and "Started a new ledger" not in res.output  # said only once, below
    assert set(outs[0]) == RELEASE_KEYS
    assert [o["budget_spent"] for o in outs] == pytest.approx([0.1, 0.2, 0.3])
    assert outs[-1]["budget_left"] == pytest.approx(0.0) and all(o["private"] for o in outs)
    res = run("release", cal_path, "--value", 0.47, "--ledger", ledger, "--json")
    assert one_line_error(res, code=1).startswith("Error: release refused")
    assert Ledger(ledger, key=KEY).verify()["n_releases"] == 3


def test_release_prints_only_the_noisy_value(cal_path, tmp_path):
    # with probability w the mixture adds nothing, so pin the draw with a seed (non-zero noise here)
    noisy = Calibration.load(cal_path, key=KEY).sampler(seed=4).release(0.4711)
    assert abs(noisy - 0.4711) > 1e-4
    res = run("release", cal_path, "--value", 0.4711, "--seed", 4, "--ledger", tmp_path / "l.sqlite", "--budget",
              "unlimited")
    assert res.exit_code == 0
    assert float(res.output.splitlines()[0]) == noisy
    assert "0.4711" not in res.output


def test_release_from_source_database_with_seed_is_marked_not_private(cal_path, tmp_path):
    ledger = tmp_path / "l.sqlite"
    res = run("release", cal_path, SAMPLE, "--database", 1985, "--seed", 7, "--ledger", ledger, "--budget",
              "unlimited", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["private"] is False and "NOT PRIVATE" in res.output
    assert f"Started a new ledger {ledger} with no budget limit (unlimited)" in res.stderr
    loo = leave_one_out(SAMPLE, id="countyid", by="year", query="mean(murdrate)")
    true = loo.q[loo.labels.index(1985)]
    assert out["value"] == Calibration.load(cal_path, key=KEY).sampler(seed=7).release(true)
    assert out["value"] != true
    (rec,) = Ledger(ledger, key=KEY).records()
    assert rec["private"] == 0 and rec["database"] == "1985" and rec["noisy_value"] == out["value"]


@pytest.mark.parametrize("args, message", [
    (["--value", 1, "--database", 1985], "either --value"),
    ([], "either --value"),
    ([SAMPLE, "--database", 1700, "--budget", "unlimited"], "is not in 'year'"),
])
def test_release_bad_input_exits_2(cal_path, args, message):
    one_line_error(run("release", cal_path, *args), message)
    assert not cal_path.with_suffix(".ledger.sqlite").exists()


def test_release_missing_or_bad_calibration(tmp_path):
    one_line_error(run("release", tmp_path / "nope.json", "--value", 1), "nope.json")
    (tmp_path / "x.json").write_text("{}")
    one_line_error(run("release", tmp_path / "x.json", "--value", 1), "not an empdp calibration")


@pytest.mark.parametrize("args, message", [
    (["--epsilon", -1, "-o", "c.json"], "--epsilon must be a positive number"),
    (["--epsilon", 1, "-o", "c.txt"], "must end in .json"),
    (["--epsilon", 1, "--bandwidth", "wide", "-o", "c.json"], "--bandwidth"),
])
def test_calibrate_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    one_line_error(run("calibrate", SAMPLE, *QUERY, *args), message)
    assert list(tmp_path.iterdir()) == []


def test_sole_contributors_are_counted_and_warned(tmp_path):
    rng = np.random.default_rng(1)
    rows = [(i, j, float(rng.normal(10, 2))) for j in range(8) for i in range(30)]
    rows.append((999, 8, 3.0))  # alone in database 8
    rows += [(i, 9, float(rng.normal(10, 2))) for i in range(30)]
    src = tmp_path / "panel.parquet"
    pl.DataFrame(rows, schema=["pid", "db", "x"], orient="row").write_parquet(src)
    res = run("calibrate", src, "--id", "pid", "--by", "db", "--query", "sum(x)", "-e", 0.5,
              "--kernel", "laplace", "-o", tmp_path / "c.json", "--json")
    assert res.exit_code == 0, res.output
    assert "Warning: 1 sole contributor" in res.output
    d = json.loads(res.output.splitlines()[-1])
    assert d["n_sole_contributors"] == 1 and d["verified_eps_max"] <= 0.5


def test_python_api_sample_and_release():
    cal = calibrate_api(SAMPLE, id="countyid", by="year", query="mean(murdrate)", epsilon=0.1, model=Model(kernel="laplace"))
    assert cal.sample(5).shape == (5,)
    out = cal.release(0.5)  # noise is exactly 0 with probability w, so no inequality here
    assert out["private"] and out["budget_left"] is None
    assert abs(out["value"] - 0.5) < 50 * cal.lam
    seeded = cal.release(0.5, seed=4)
    assert not seeded["private"] and seeded["value"] != 0.5


def test_gaussian_kernel_uses_verified_fallback():
    rng = np.random.default_rng(4)
    q = rng.normal(size=15)
    shifts = rng.normal(size=(40, 15)) * 0.05 * (rng.random((40, 15)) < 0.3)
    with pytest.warns(UserWarning, match="cannot be deconvolved"):
        cal = calibrate_values(q, shifts, epsilon=0.5, kernel="gaussian", bandwidth=0.05)
    assert cal.deconvolution["feasible"] is False
    assert cal.verified_eps_max <= 0.5
    assert cal.expected_abs_noise <= cal.lam
    assert cal.noise["kind"] in ("laplace", "laplace_mixture")


def test_default_kernel_is_laplace_with_the_closed_form(tmp_path):
    # 'auto' picks a Gaussian kernel on these data, which cannot be deconvolved (docs/method.md#112-a-gaussian-curator-kernel-cannot-be-deconvolved)
    res = run("calibrate", SAMPLE, *QUERY, "--epsilon", 0.1, "-o", tmp_path / "c.json", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["curator_kernel"]["kind"] == "laplace"
    assert d["deconvolution"]["method"].startswith("closed form") and "cannot be deconvolved" not in res.output
    auto = run("calibrate", SAMPLE, *QUERY, "--epsilon", 0.1, "--kernel", "auto", "-o", tmp_path / "a.json", "--json")
    assert json.loads(auto.stdout)["curator_kernel"]["kind"] == "gaussian"
    assert "closed form" in run("calibrate", "--help").output


def test_help_names_files_and_states_defaults():
    calibrate_help = " ".join(run("calibrate", "--help").output.split())
    assert "-o, --output FILE" in calibrate_help and "--key-file FILE" in calibrate_help
    release_help = " ".join(run("release", "--help").output.split())
    assert "--ledger FILE" in release_help and "--key-file FILE" in release_help
    assert "needed to start a new ledger" in release_help and "'unlimited'" in release_help
    assert "TESTS ONLY" in release_help and "CSPRNG" in release_help


def test_numbers_shown_to_four_significant_digits(cal_path, tmp_path):
    cal = Calibration.load(cal_path, key=KEY)
    res = run("calibrate", SAMPLE, *QUERY, "--epsilon", 0.1, "-o", tmp_path / "c.json")
    assert res.exit_code == 0, res.output
    assert f"lambda* (exact, minimal)    {cal.lam:.4g}" in res.stdout and f"{cal.lam:.6g}" not in res.stdout
    assert "2,197 (0 sole contributors" in res.stdout
    res = run("release", cal_path, "--value", 1, "--seed", 1, "--ledger", tmp_path / "l.sqlite", "--budget", 1 / 3)
    assert res.exit_code == 0, res.output
    assert "epsilon 0.1; ledger" in res.stderr and "0.1 spent, 0.2333 left" in res.stderr


def _recorder():
    calls = []
    return calls, lambda stage, done, total: calls.append((stage, done, total))


def test_library_reports_progress_stages():
    rng = np.random.default_rng(4)
    q = rng.normal(size=15)
    shifts = rng.normal(size=(40, 15)) * 0.05 * (rng.random((40, 15)) < 0.3)
    for kernel, stages in (("laplace", ["density model", "lambda search"]),
                           ("gaussian", ["density model", "lambda search", "Gaussian fallback"])):
        calls, progress = _recorder()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calibrate_values(q, shifts, epsilon=0.5, kernel=kernel, progress=progress)
        assert list(dict.fromkeys(c[0] for c in calls)) == stages
        for stage in stages:  # every stage ends complete, and never counts backwards
            mine = [c for c in calls if c[0] == stage]
            assert mine[-1][1] == mine[-1][2] > 0
            assert [c[1] for c in mine] == sorted(c[1] for c in mine)
        search = [c for c in calls if c[0] == "lambda search"]
        assert len(search) > 20 and all(d <= t for _, d, t in search if t > 0)
