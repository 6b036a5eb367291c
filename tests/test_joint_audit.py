"""``audit release`` of a joint calibration (issue 19 item 5): MPL on the d-dimensional release beside the
exact eps_i of its density; a correct calibration passes, an under-noised one is flagged."""

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from helpers import CURATOR_KEY, one_line_error, run
from test_joint_release import EPS, QUERIES, paper_panel

from empdp.audit import audit_release
from empdp.audit.common import draw
from empdp.audit.joint_release import exact_renyi, joint_release_mechanism
from empdp.audit.release import ReleaseAudit
from empdp.loo.joint import read_joint
from empdp.noise import calibrate

pytestmark = pytest.mark.usefixtures("curator_key")


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    table, K = paper_panel()
    path = tmp_path_factory.mktemp("joint_audit") / "paper.parquet"
    table.write_parquet(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(str(path), id="id", by="db", epsilon=EPS, query=QUERIES)
    return str(path), K, cal


def scaled(cal, f):
    """The calibration with noise scales f·λ_k and the matching weights: a consistent file with less noise."""
    b, t = cal.curator_scales, cal.t * f
    lam = t * b
    w = (b / lam) ** 2
    return dataclasses.replace(cal, t=t, noise=dict(cal.noise, scales=lam.tolist(), weights=w.tolist()),
                               expected_abs_noise=((1 - w) * lam).tolist())


def test_correct_joint_calibration_passes(paper):
    path, K, cal = paper
    res = audit_release(cal, path, rng=1)
    assert isinstance(res, ReleaseAudit) and res.statistics == QUERIES and res.d == 2 and res.ok
    assert res.exact_epsilon_max <= EPS and res.exact_epsilon_max == pytest.approx(EPS, rel=1e-8)
    assert res.individuals[0]["id"] == K  # the riskiest is the one the pair exposes
    assert res.mpl_lower_bound <= EPS
    d = res.to_dict()
    assert d["joint"] is True and d["d"] == 2 and d["statistics"] == QUERIES and d["order"] == 2.0
    # the Renyi bound sits just below the exact D_2 of the release (K's)
    assert d["renyi_consistent"] is True and d["exact_renyi_max"] == res.individuals[0]["exact_renyi"]
    assert 0.7 * d["exact_renyi_max"] <= d["renyi_lower_bound"] <= d["exact_renyi_max"]


@pytest.mark.parametrize("factor", [0.5, 0.1])
def test_under_noised_joint_release_is_flagged_by_exact_and_by_mpl(paper, factor):
    """Noise scales cut to a half or a tenth: the exact eps_i exceeds the target and so does MPL's bound."""
    path, K, cal = paper
    res = audit_release(scaled(cal, factor), path, rng=1)
    assert not res.ok
    assert res.exact_epsilon_max == pytest.approx(EPS / factor, rel=0.02)
    assert res.individuals[0]["id"] == K
    assert res.mpl_lower_bound > EPS  # the black-box bound alone catches it


def test_release_without_the_needed_noise_is_flagged(paper):
    path, K, cal = paper
    bare = dataclasses.replace(cal, t=1.0, noise=dict(cal.noise, kind="none", scales=[0.0, 0.0], weights=[1.0, 1.0]),
                               expected_abs_noise=[0.0, 0.0])
    res = audit_release(bare, path, rng=2)
    assert not res.ok and res.exact_epsilon_max > 100 * EPS and res.mpl_lower_bound > EPS


def test_the_audited_sampler_is_the_release_law(paper):
    """W·output: mean W·mean(q), per-axis variance var(Wq) + 2 b_k² + 2 (1 − w_k) λ_k², for r and for r_K."""
    path, K, cal = paper
    panel = read_joint(path, id="id", by="db", queries=QUERIES)
    mech = joint_release_mechanism(cal, panel.q, panel.shifts[[K]])
    rng = np.random.default_rng(0)
    for db, pts in ((-1, panel.q), (0, panel.q - panel.shifts[K])):
        y = draw(mech, db, 200000, rng)
        assert y.shape == (200000, 2)
        a = pts @ cal.whitening.T
        b, w, lam = cal.curator_scales, cal.noise_weights, cal.noise_scales
        var = a.var(axis=0) + 2 * b ** 2 + 2 * (1 - w) * lam ** 2
        np.testing.assert_allclose(y.var(axis=0), var, rtol=0.03)
        assert np.all(np.abs(y.mean(axis=0) - a.mean(axis=0)) <= 4 * np.sqrt(var / 200000))


def test_cli_audit_release_of_a_joint_calibration(paper, tmp_path):
    path, K, cal = paper
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    cal.save(good, key=CURATOR_KEY)
    scaled(cal, 0.5).save(bad, key=CURATOR_KEY)
    res = run("audit", "release", good, path, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["ok"] is True and body["joint"] is True and body["individuals"][0]["id"] == K
    res = run("audit", "release", bad, path, "--seed", 1)
    assert res.exit_code == 0 and "CHECK FAILED" in res.stdout
    row = f"\n  {K:>12d} "  # K's row in the table
    assert row in run("audit", "release", good, path, "--seed", 1).stdout
    res = run("audit", "release", good, path, "--seed", 1, "--hash-ids", env={"EMPDP_HASH_KEY": "k" * 20})
    assert res.exit_code == 0 and row not in res.stdout and "OK: the release meets its target" in res.stdout
    one_line_error(run("audit", "release", good, path, "--top", 0), "--top")


def test_bounds_on_a_correct_joint_release_cover_and_are_tight(paper):
    """Over 12 fixed seeds the MPL bound (alpha 0.05) stays below the exact eps of the release at least 9 times
    (more than 3 misses has probability 0.002 at the nominal level) and its median is within 40% of it; the
    Renyi bound likewise against the exact D_2."""
    path, K, cal = paper
    panel = read_joint(path, id="id", by="db", queries=QUERIES)

    class Loo:
        q, shifts, ids, sole = panel.q, panel.shifts, panel.ids.to_list(), panel.sole

    runs = [audit_release(cal, loo=Loo, top=1, rng=1000 + s, n_renyi=50000) for s in range(12)]
    lbs = np.array([r.mpl_lower_bound for r in runs])
    exact = runs[0].exact_epsilon_max
    assert all(r.exact_epsilon_max == exact for r in runs) and runs[0].individuals[0]["id"] == K
    assert (lbs > exact).sum() <= 3
    assert np.median(lbs) >= 0.6 * exact
    # the same for the Renyi bound against the exact D_2
    renyi = np.array([r.renyi_lower_bound for r in runs])
    exact_d = runs[0].exact_renyi_max
    assert (renyi > exact_d).sum() <= 3 and np.median(renyi) >= 0.6 * exact_d


def test_three_statistics_audited_in_three_dimensions(tmp_path):
    """d = 3: the correct release passes; with half the noise the exact eps doubles and MPL alone exceeds the target."""
    table, K = paper_panel()
    path = tmp_path / "p3.parquet"
    table.write_parquet(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(str(path), id="id", by="db", epsilon=EPS, query=[*QUERIES, "sum(c)"])
    good = audit_release(cal, str(path), rng=1, top=2)
    assert good.ok and good.d == 3 and good.individuals[0]["id"] == K
    bad = audit_release(scaled(cal, 0.5), str(path), rng=1, top=2)
    assert not bad.ok and bad.exact_epsilon_max == pytest.approx(2 * EPS, rel=0.01) and bad.mpl_lower_bound > EPS


def _laplace_renyi(delta: float, order: float) -> float:
    """D_alpha between Laplace(0, 1) and Laplace(delta, 1), closed form (docs/method.md#93-reference-mechanisms)."""
    a = order
    return math.log(a / (2 * a - 1) * math.exp((a - 1) * delta) + (a - 1) / (2 * a - 1) * math.exp(-a * delta)) / (a - 1)


@pytest.mark.parametrize("order", [1.5, 2.0, 3.5])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_exact_renyi_of_one_shifted_point_is_the_closed_form(d, order):
    """One kernel point shifted by delta: a product of independent Laplace laws, so D_alpha is the sum over axes."""
    delta = np.array([0.7, -0.3, 1.9][:d])
    a = np.full((1, d), 0.25)
    got = exact_renyi(a, a - delta, order)
    want = sum(_laplace_renyi(abs(x), order) for x in delta)
    np.testing.assert_allclose(got, [want, want], rtol=1e-12)


def test_exact_renyi_matches_a_dense_reference_in_two_dimensions():
    """Many points, both directions, against a dense midpoint rule (h = 0.005 over +-30 scales; its own error,
    from the kinks falling anywhere in its cells, is a few 1e-6 relative); and the same points on both sides
    give D = 0 to 1e-12 (the rule integrates each density to 1)."""
    rng = np.random.default_rng(4)
    a = rng.normal(0.0, 1.5, (12, 2))
    b = a - rng.normal(0.0, 0.4, (12, 2))
    order, h = 2.5, 0.005
    g = np.arange(-30 + h / 2, 30, h)
    Ea, Eb = ([np.exp(-np.abs(g[:, None] - p[None, :, k])) for k in range(2)] for p in (a, b))
    sums = np.zeros(2)
    for s in range(0, len(g), 500):  # rows in blocks: the full grid would hold 10^8 values per density
        r, ri = (E[0][s:s + 500] @ E[1].T / (len(a) * 4) for E in (Ea, Eb))
        sums += [np.sum(r ** order * ri ** (1 - order)), np.sum(ri ** order * r ** (1 - order))]
    ref = np.log(sums * h * h) / (order - 1)
    got = exact_renyi(a, b, order)
    np.testing.assert_allclose(got, ref, rtol=3e-5)
    assert got[0] != pytest.approx(got[1], rel=1e-3)  # the two directions differ, and each matches its own
    np.testing.assert_allclose(exact_renyi(a, a, order), [0.0, 0.0], atol=1e-12)
