"""Calibrate and release 2-3 statistics together (issue 19 item 5): the released density is exactly
epsilon-private for everyone with the least noise factor t, the noise is the per-axis deconvolution mapped
back by W^-1 and drawn from the CSPRNG, the file is signed and refused when edited, and the ledger spends
epsilon once per released vector."""

import json
import warnings

import numpy as np
import polars as pl
import pytest
from helpers import CURATOR_KEY, one_line_error, parquet_file, run, set_field

from empdp.errors import BudgetExceededError, InputError
from empdp.loo.joint import read_joint
from empdp.noise import JointCalibration, Ledger, calibrate, calibrate_joint_values, load_calibration
from empdp.noise.joint_exact import joint_eps_at
from empdp.noise.ledger_format import SCHEMA
from empdp.noise.sampler import SecureBits
from empdp.risk.joint import JointModel

pytestmark = pytest.mark.usefixtures("curator_key")
PANEL = ["--id", "id", "--by", "db"]
QUERIES = ["sum(x)", "sum(x_not_k)"]
EPS = 1.0


def paper_panel(K=7, n_db=40, n_ind=30, seed=0):
    """Individual K adds a steady 5 to each database; ``x_not_k`` is x without K (Burchard et al. §3): each sum
    alone hides K, the pair exposes K. ``c`` is a third, independent statistic."""
    rng = np.random.default_rng(seed)
    x = rng.normal(5.0, 2.0, size=(n_ind, n_db))
    x[K] = 5.0 + rng.normal(0, 0.05, size=n_db)
    c = rng.integers(1, 4, size=(n_ind, n_db)).astype(float)
    ids, dbs = np.meshgrid(np.arange(n_ind), np.arange(n_db), indexing="ij")
    return pl.DataFrame({"id": ids.ravel(), "db": dbs.ravel(), "x": x.ravel(),
                         "x_not_k": np.where(ids.ravel() == K, 0.0, x.ravel()), "c": c.ravel()}), K


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    table, K = paper_panel()
    return parquet_file(tmp_path_factory, table, "joint_release", "paper.parquet"), K


@pytest.fixture(scope="module")
def calibrated(paper):
    path, K = paper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(path, id="id", by="db", epsilon=EPS, query=QUERIES)
    panel = read_joint(path, id="id", by="db", queries=QUERIES)
    return cal, panel


def _curator(cal, q) -> JointModel:
    return JointModel(q, cal.whitening, cal.unwhitening, cal.curator_scales, loglik=0.0, selected_by="test",
                      candidates=[])


def test_released_density_is_exactly_private_for_everyone_and_t_is_minimal(calibrated, paper):
    cal, panel = calibrated
    assert isinstance(cal, JointCalibration) and cal.d == 2 and cal.statistics == QUERIES
    assert cal.noise["kind"] == "laplace_mixture" and cal.curator_model["whitened"]
    model = _curator(cal, panel.q)
    # the released density is the product Laplace(t b_k) KDE of the whitened points: exact eps_i for everyone
    eps = joint_eps_at(model, panel.shifts, cal.t)
    assert eps.max() <= EPS and eps.max() == pytest.approx(EPS, rel=1e-8)
    assert int(np.argmax(eps)) == paper[1]  # K binds
    np.testing.assert_allclose(joint_eps_at(cal.release_model(panel.q), panel.shifts, 1.0), eps, rtol=1e-12)
    # t is the least factor: slightly less noise exposes K
    assert joint_eps_at(model, panel.shifts[[paper[1]]], cal.t * (1 - 1e-6)).max() > EPS
    # and the curator's own model is far from private (the paper's warning): noise was needed
    assert cal.curator_eps_max > 100 * EPS
    assert cal.verified_eps_max == pytest.approx(eps.max(), rel=1e-12)


def test_noise_per_whitened_axis_deconvolves_the_curator_kernel(calibrated):
    """ℓ_b ⋆ (w δ_0 + (1 − w) ℓ_λ) = ℓ_λ per axis, in Fourier terms, for the stored w_k, b_k, λ_k."""
    cal, _ = calibrated
    b, w, lam = cal.curator_scales, cal.noise_weights, cal.noise_scales
    np.testing.assert_allclose(lam, cal.t * b, rtol=1e-12)
    omega = np.logspace(-4, 3, 200)[:, None]
    lhs = 1 / (1 + (b * omega) ** 2) * (w + (1 - w) / (1 + (lam * omega) ** 2))
    np.testing.assert_allclose(lhs, 1 / (1 + (lam * omega) ** 2), rtol=1e-12)


def test_released_noise_is_mapped_back_by_the_unwhitening(calibrated):
    """Statistically (fixed seed): W·noise has on axis k an atom of mass w_k at 0 and Laplace(λ_k) otherwise;
    the noise in the statistics' units has covariance W^-1 diag(2 (1 − w_k) λ_k²) W^-T."""
    cal, _ = calibrated
    draws = 20000
    samplers = cal.samplers(seed=11)
    noise = np.array([np.subtract(cal.draw([0.0, 0.0], samplers), 0.0) for _ in range(draws)])
    z = noise @ cal.whitening.T
    lam, w = cal.noise_scales, cal.noise_weights
    np.testing.assert_allclose(np.abs(z).mean(axis=0), (1 - w) * lam, rtol=0.04)
    np.testing.assert_allclose(np.corrcoef(z, rowvar=False)[0, 1], 0.0, atol=0.03)  # independent axes
    cov = cal.unwhitening @ np.diag(2 * (1 - w) * lam ** 2) @ cal.unwhitening.T
    np.testing.assert_allclose(np.cov(noise, rowvar=False), cov, rtol=0.08)
    # two seeds differ, one seed repeats
    a, b = cal.samplers(seed=3), cal.samplers(seed=3)
    assert cal.draw([1.0, 2.0], a) == cal.draw([1.0, 2.0], b)


def test_release_noise_comes_from_the_csprng(calibrated):
    cal, _ = calibrated
    samplers = cal.samplers()
    assert all(isinstance(s.bits, SecureBits) for s in samplers) and len({id(s.bits) for s in samplers}) == 1
    out = cal.release([200.0, 190.0])
    assert out["private"] is True and out["noise_added"] is True and len(out["value"]) == 2
    assert cal.release([200.0, 190.0], seed=1)["private"] is False


def test_three_statistics(paper):
    path, K = paper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(path, id="id", by="db", epsilon=EPS, query=[*QUERIES, "sum(c)"])
    panel = read_joint(path, id="id", by="db", queries=[*QUERIES, "sum(c)"])
    eps = joint_eps_at(_curator(cal, panel.q), panel.shifts, cal.t)
    assert cal.d == 3 and eps.max() <= EPS and int(np.argmax(eps)) == K
    assert joint_eps_at(_curator(cal, panel.q), panel.shifts[[K]], cal.t * (1 - 1e-6)).max() > EPS
    out = cal.release([1.0, 2.0, 3.0], seed=5)
    assert len(out["value"]) == 3


def _signed(cal, tmp_path, name="joint.json"):
    path = tmp_path / name
    cal.save(path, key=CURATOR_KEY)
    return path


@pytest.mark.parametrize("edit", ["epsilon", "t", "noise_none", "weights", "strip_hmac", "recompute_digest"])
def test_tampered_joint_calibration_is_refused(calibrated, tmp_path, edit):
    cal, _ = calibrated
    path = _signed(cal, tmp_path)
    d = json.loads(path.read_text())
    assert load_calibration(path, key=CURATOR_KEY, allow_unsigned=False).t == cal.t  # the intact file loads
    if edit == "epsilon":
        d["epsilon"], d["verified_eps_max"] = 50.0, 0.5
    elif edit == "t":  # a smaller, consistent noise: only the HMAC can tell
        f = 0.5
        d["t"] *= f
        d["noise"]["scales"] = [v * f for v in d["noise"]["scales"]]
        d["noise"]["weights"] = [w / f ** 2 for w in d["noise"]["weights"]]
        d["expected_abs_noise"] = [(1 - w) * v for w, v in zip(d["noise"]["weights"], d["noise"]["scales"])]
    elif edit == "noise_none":
        d["noise"].update(kind="none", scales=[0.0, 0.0], weights=[1.0, 1.0])
        d["t"], d["expected_abs_noise"], d["noise_interval_95"] = 1.0, [0.0, 0.0], [[0.0, 0.0], [0.0, 0.0]]
    elif edit == "weights":
        d["noise"]["weights"] = [0.9, 0.9]
    elif edit == "strip_hmac":
        del d["hmac"], d["key_id"]
    if edit in ("t", "noise_none", "recompute_digest", "strip_hmac"):  # a forger recomputes the unkeyed digest
        import hashlib

        body = {k: v for k, v in d.items() if k not in ("digest", "hmac", "key_id")}
        d["digest"] = hashlib.sha256(json.dumps(body, indent=2, sort_keys=True).encode()).hexdigest()
        if edit == "recompute_digest":
            d["epsilon"] = d["epsilon"]  # unchanged contents, fresh digest: still valid
    path.write_text(json.dumps(d))
    if edit == "recompute_digest":
        assert load_calibration(path, key=CURATOR_KEY, allow_unsigned=False).t == cal.t
        return
    with pytest.raises(InputError):
        load_calibration(path, key=CURATOR_KEY, allow_unsigned=False)
    ledger = tmp_path / "l.sqlite"
    one_line_error(run("release", path, "--value", "1,2", "--ledger", ledger, "--budget", "unlimited"))
    assert not ledger.exists()


def test_calibration_changed_in_python_after_loading_is_refused(calibrated, tmp_path):
    cal, _ = calibrated
    loaded = load_calibration(_signed(cal, tmp_path), key=CURATOR_KEY, allow_unsigned=False)
    loaded.epsilon = 5.0
    with pytest.raises(InputError, match="changed after it was loaded"):
        loaded.release([1.0, 2.0], budget="unlimited", ledger=tmp_path / "l.sqlite", key=CURATOR_KEY)
    assert not (tmp_path / "l.sqlite").exists()


def test_ledger_spends_epsilon_once_per_vector_and_refuses_over_budget(calibrated, tmp_path):
    cal, _ = calibrated
    loaded = load_calibration(_signed(cal, tmp_path), key=CURATOR_KEY, allow_unsigned=False)
    ledger = tmp_path / "l.sqlite"
    outs = [loaded.release([200.0, 190.0], ledger=ledger, budget=2.5, key=CURATOR_KEY) for _ in range(2)]
    assert [o["budget_spent"] for o in outs] == [1.0, 2.0] and outs[1]["budget_left"] == 0.5
    with pytest.raises(BudgetExceededError):
        loaded.release([200.0, 190.0], ledger=ledger, budget=2.5, key=CURATOR_KEY)
    book = Ledger(ledger, key=CURATOR_KEY)
    summary = book.verify()
    assert summary["n_releases"] == 2 and summary["spent"] == 2.0
    records = book.records()
    assert len(records) == 2 and all(r["epsilon"] == 1.0 and r["noise_added"] == 1 for r in records)
    assert [json.loads(r["noisy_value"]) for r in records] == [o["value"] for o in outs]  # the vector, whole
    assert json.loads(records[0]["lambda"]) == cal.noise["scales"]
    assert records[0]["calibration_digest"] == loaded.digest


def test_release_without_noise_says_so(paper, tmp_path):
    """Above the curator model's eps_all no noise is needed: the exact vector is released, and says so."""
    path, _ = paper
    panel = read_joint(path, id="id", by="db", queries=QUERIES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = calibrate_joint_values(panel.q, panel.shifts, epsilon=EPS, names=QUERIES)
    eps = probe.curator_eps_max * 1.01
    with pytest.warns(UserWarning, match="no noise is added"):
        cal = calibrate_joint_values(panel.q, panel.shifts, epsilon=eps, names=QUERIES)
    assert cal.noise["kind"] == "none" and cal.t == 1.0 and not cal.noise_added
    # and just below eps_all noise is needed (the same exact eps_i decides both)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert calibrate_joint_values(panel.q, panel.shifts, epsilon=probe.curator_eps_max * 0.99,
                                      names=QUERIES).noise_added
    out = cal.release([200.0, 190.5], budget="unlimited", ledger=tmp_path / "l.sqlite", key=CURATOR_KEY)
    assert out["value"] == [200.0, 190.5] and out["noise_added"] is False
    assert out["guarantee"].startswith("no noise was added")
    assert Ledger(tmp_path / "l.sqlite", key=CURATOR_KEY).records()[0]["noise_added"] == 0
    cal_path = _signed(cal, tmp_path, "none.json")
    res = run("release", cal_path, "--value", "200,190.5", "--ledger", tmp_path / "cli.sqlite", "--budget", "unlimited", "--json")
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["noise_added"] is False and body["value"] == [200.0, 190.5]
    assert "NO NOISE WAS ADDED" in res.stderr and "exact vector" in res.stderr


def test_cli_round_trip(paper, tmp_path):
    path, K = paper
    cal_path = tmp_path / "joint.json"
    res = run("calibrate", path, *PANEL, "--query", QUERIES[0], "--query", QUERIES[1], "-e", EPS, "-o", cal_path,
              "--json")
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["format"] == "empdp-joint-calibration/2" and body["statistics"] == QUERIES
    assert body["query"] == QUERIES and len(body["noise"]["scales"]) == 2 and body["verified_eps_max"] <= EPS
    cal = load_calibration(cal_path, key=CURATOR_KEY, allow_unsigned=False)  # signed with $EMPDP_KEY
    assert isinstance(cal, JointCalibration) and cal.t == body["t"]
    ledger = tmp_path / "l.sqlite"
    res = run("release", cal_path, "--value", "200.5,190", "--ledger", ledger, "--budget", 3, "--json")
    assert res.exit_code == 0, res.output
    first = json.loads(res.stdout)
    assert len(first["value"]) == 2 and first["noise_added"] is True and first["budget_spent"] == 1.0
    res = run("release", cal_path, path, "--database", 3, "--ledger", ledger, "--seed", 2, "--json")
    assert res.exit_code == 0, res.output
    second = json.loads(res.stdout)
    assert second["private"] is False and second["budget_spent"] == 2.0
    # the seeded draw is the calibration's noise added to database 3's two statistics
    q3 = read_joint(path, id="id", by="db", queries=QUERIES).q[3]
    assert second["value"] == cal.draw(list(q3), cal.samplers(seed=2))
    res = run("release", cal_path, "--value", "1,2", "--ledger", ledger)  # plain output: the vector, comma-separated
    assert res.exit_code == 0 and len(res.stdout.strip().split(",")) == 2
    res = run("ledger", "show", ledger, "--json")
    records = json.loads(res.stdout)["records"]
    assert [r["noisy_value"] for r in records[:2]] == [first["value"], second["value"]]
    assert run("ledger", "verify", ledger).exit_code == 0
    res = run("calibrate", path, *PANEL, "--query", QUERIES[0], "--query", QUERIES[1], "--bandwidth", "0.5,0.5",
              "-e", EPS, "-o", tmp_path / "fixed.json", "--json")
    assert res.exit_code == 0, res.output
    fixed = json.loads(res.stdout)["curator_model"]
    assert fixed["whitened"] is False and fixed["scales"] == [0.5, 0.5]


@pytest.mark.parametrize("args, fragments", [
    (["--query", "sum(x)"] * 4, ["at most 3 statistics"]),
    (["--query", "sum(x)", "--query", "count(*)", "--bandwidth", "1,2,3"], ["3 scale(s) for 2 statistics"]),
    (["--query", "sum(x)", "--query", "count(*)", "--bandwidth", "1,abc"], ["--bandwidth"]),
    (["--query", "sum(x)", "--sql", "SELECT count(*) FROM db"], ["all as --query or all as --sql"]),
    (["--query", "sum(x)", "--query", "count(*)", "--kernel", "gaussian"], ["--kernel gaussian"]),
    (["--query", "sum(x)", "--query", "count(*)", "--adversary", "count(*)"], ["--adversary"]),
])
def test_bad_calibrate_input_is_one_line(paper, tmp_path, args, fragments):
    out = tmp_path / "cal.json"
    one_line_error(run("calibrate", paper[0], *PANEL, *args, "-e", 1, "-o", out), *fragments)
    assert not out.exists()


@pytest.mark.parametrize("value, fragments", [
    ("1,2,3", ["3 value(s)", "2 statistic(s)"]),
    ("1", ["1 value(s)", "2 statistic(s)"]),
    ("1,abc", ["value 2 is 'abc'"]),
    ("1,nan", ["finite"]),
    ("1,inf", ["finite"]),
])
def test_bad_release_value_is_one_line(calibrated, tmp_path, value, fragments):
    cal, _ = calibrated
    path = _signed(cal, tmp_path)
    ledger = tmp_path / "l.sqlite"
    one_line_error(run("release", path, "--value", value, "--ledger", ledger, "--budget", "unlimited"), *fragments)
    assert not ledger.exists()


def test_one_statistic_calibration_refuses_a_vector(tmp_path, paper):
    cal_path = tmp_path / "one.json"
    assert run("calibrate", paper[0], *PANEL, "--query", "sum(x)", "-e", 5, "-o", cal_path).exit_code == 0
    one_line_error(run("release", cal_path, "--value", "1,2", "--ledger", tmp_path / "l.sqlite", "--budget", "unlimited"),
                   "1 statistic(s)")
    assert not (tmp_path / "l.sqlite").exists()


@pytest.mark.parametrize("edit", [
    "UPDATE chain SET noisy_value = '[1.0,2.0]' WHERE seq = 1",        # the released vector replaced
    "UPDATE chain SET lambda = '[1e9,1e9]' WHERE seq = 1",             # the noise scales inflated
    "UPDATE chain SET noisy_value = 200.0 WHERE seq = 1",              # the vector made a number
])
def test_edited_joint_ledger_record_is_refused(calibrated, tmp_path, edit):
    """The vector's JSON text is under the record's HMAC: an edit without the key is caught by verify and release."""
    import sqlite3

    cal, _ = calibrated
    path = _signed(cal, tmp_path)
    ledger = tmp_path / "l.sqlite"
    assert run("release", path, "--value", "200,190", "--ledger", ledger, "--budget", "unlimited").exit_code == 0
    con = sqlite3.connect(ledger)
    con.execute("DROP TRIGGER chain_no_update")
    con.execute(edit)
    con.execute(next(st for st in SCHEMA if "chain_no_update" in st))  # the schema put back as empdp wrote it
    con.commit()
    con.close()
    one_line_error(run("ledger", "verify", ledger), "record 1")
    before = ledger.read_bytes()
    one_line_error(run("release", path, "--value", "200,190", "--ledger", ledger), "record 1")
    assert ledger.read_bytes() == before


def test_one_ledger_counts_joint_and_single_releases_together(calibrated, paper, tmp_path):
    """Sequential composition across kinds: a vector spends its epsilon once, beside one-statistic releases."""
    cal, _ = calibrated
    joint = _signed(cal, tmp_path)
    single = tmp_path / "one.json"
    assert run("calibrate", paper[0], *PANEL, "--query", "sum(x)", "-e", 0.5, "-o", single).exit_code == 0
    ledger = tmp_path / "l.sqlite"
    assert run("release", single, "--value", 200, "--ledger", ledger, "--budget", 2).exit_code == 0
    assert run("release", joint, "--value", "200,190", "--ledger", ledger).exit_code == 0
    res = run("release", joint, "--value", "200,190", "--ledger", ledger)  # 0.5 + 1 + 1 > 2
    assert res.exit_code == 1 and "over the budget" in res.output
    res = run("release", single, "--value", 201, "--ledger", ledger, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["budget_spent"] == 2.0
    summary = json.loads(run("ledger", "verify", ledger, "--json").stdout)
    assert summary["n_releases"] == 3 and summary["spent"] == 2.0


@pytest.mark.parametrize("bandwidth", ["auto", [0.5, 0.5]])
def test_no_noise_exactly_when_assess_finds_nobody_at_risk(paper, bandwidth):
    """One model from assess to release: calibrate adds no noise at epsilon exactly when the joint assessment
    with the same statistics and bandwidth puts nobody at risk there (both sides of eps_all, 1e-6 apart)."""
    from empdp.assessment.joint import assess_joint

    path, _ = paper
    eps_all = assess_joint(path, id="id", by="db", queries=QUERIES, bandwidth=bandwidth, epsilon=[1.0]).eps_all
    panel = read_joint(path, id="id", by="db", queries=QUERIES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        above = calibrate_joint_values(panel.q, panel.shifts, epsilon=eps_all * (1 + 1e-6), bandwidth=bandwidth)
        below = calibrate_joint_values(panel.q, panel.shifts, epsilon=eps_all * (1 - 1e-6), bandwidth=bandwidth)
    assert not above.noise_added and below.noise_added
    assert above.curator_eps_max == pytest.approx(eps_all, rel=1e-12)


@pytest.mark.parametrize("path, value, fragment", [
    (("curator_model", "whitening", 0, 0), "0.1", "curator_model.whitening"),
    (("curator_model", "whitening", 0), [1.0], "curator_model.whitening"),
    (("curator_model", "unwhitening", 1, 1), 7.0, "not the inverse"),
    (("curator_model", "scales"), [1.0], "curator_model.scales"),
    (("curator_model", "kind"), "gaussian", "curator_model.kind"),
    (("noise", "kind"), "laplace", "noise.kind"),
    (("noise", "weights", 0), 1.5, "noise.weights"),
    (("noise", "scales", 1), -1.0, "noise.scales"),
    (("noise", "unwhitening", 0, 0), 0.0, "noise.unwhitening"),
    (("statistics",), ["a", "b", "c", "d"], "statistics"),
    (("statistics",), ["a", "b", "c"], "curator_model.whitening"),
    (("t",), True, "'t'"),
    (("epsilon",), KeyError, "'epsilon'"),
    (("verified_eps_max",), 2.0, "exceeds epsilon"),
    (("query",), ["sum(x)"], "'query'"),
    (("expected_abs_noise",), [0.0, 0.0], "expected_abs_noise"),
])
def test_damaged_joint_calibration_field_is_one_line(calibrated, tmp_path, path, value, fragment):
    """Every field is checked at the boundary, even where no signature is asked for (--allow-unsigned)."""
    cal, _ = calibrated
    d = cal.to_dict()
    set_field(d, path, value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    ledger = tmp_path / "l.sqlite"
    one_line_error(run("release", bad, "--value", "1,2", "--ledger", ledger, "--budget", "unlimited", "--allow-unsigned"), fragment)
    assert not ledger.exists()


def test_undamaged_unsigned_joint_calibration_releases_only_with_allow_unsigned(calibrated, tmp_path):
    """The control of the damaged-field cases: the same file unedited passes with --allow-unsigned (unsafe)."""
    cal, _ = calibrated
    good = tmp_path / "good.json"
    good.write_text(json.dumps(cal.to_dict()))
    ledger = tmp_path / "l.sqlite"
    one_line_error(run("release", good, "--value", "1,2", "--ledger", ledger, "--budget", "unlimited"), "not signed")
    res = run("release", good, "--value", "1,2", "--ledger", ledger, "--budget", "unlimited", "--allow-unsigned", "--json")
    assert res.exit_code == 0 and len(json.loads(res.stdout)["value"]) == 2
