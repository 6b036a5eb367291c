"""The release audit of a curator kernel that is not pure DP (Gaussian; issue 36, item 6): the (ε, δ)
audit at the kernel's tolerance δ, which sets the verdict, beside the exact curve ε(δ) of the released
density, checked against quadrature; and the report reads 'audit approx' JSON."""

import json
import math
import re
import warnings

import numpy as np
import pytest
from audit_cli_helpers import run
from helpers import CURATOR_KEY
from numpy.testing import assert_allclose
from scipy import integrate, optimize, special

from empdp.audit import audit_release
from empdp.audit.release import exact_values
from empdp.audit.truth import gaussian_epsilon_delta
from empdp.kernels import EPS_TOLERANCE
from empdp.textfmt import fmt

DELTAS = (1e-2, 1e-4, 1e-6)


def gauss_laplace_pdf(x, b, lam):
    """N(0, b²) ⋆ Laplace(λ) in closed form (the exponentially modified Gaussian, both sides, in logs)."""
    c = 0.5 * (b / lam) ** 2 - math.log(2 * lam)
    right = np.exp(c - x / lam + special.log_ndtr(x / b - b / lam))
    left = np.exp(c + x / lam + special.log_ndtr(-x / b - b / lam))
    return right + left


def release_pdf(x, points, b, w, lam):
    """r(x) = (1/n) Σ_j (φ_b ⋆ (w δ_0 + (1 − w) Laplace(λ)))(x − p_j), one point at a time."""
    u = x - np.asarray(points, float)
    gauss = np.exp(-0.5 * (u / b) ** 2) / (b * math.sqrt(2 * math.pi))
    mixed = gauss if w >= 1 else w * gauss + (1 - w) * gauss_laplace_pdf(u, b, lam)
    return float(np.mean(mixed))


def quadrature_epsilon(delta, q, shifted, b, w, lam):
    """ε(δ) both ways by adaptive quadrature of ∫ (p − e^ε p′)_+ and root finding (the slow reference)."""
    lo, hi = min(q.min(), shifted.min()) - 60 * max(b, lam), max(q.max(), shifted.max()) + 60 * max(b, lam)
    knots = np.sort(np.concatenate([q, shifted]))

    def hockey(eps, p, p2):
        def f(x):
            return max(release_pdf(x, p, b, w, lam) - math.exp(eps) * release_pdf(x, p2, b, w, lam), 0.0)

        return integrate.quad(f, lo, hi, points=knots, limit=400, epsabs=1e-14, epsrel=1e-10)[0]

    def excess(eps):
        return max(hockey(eps, q, shifted), hockey(eps, shifted, q)) - delta

    return optimize.brentq(excess, 0.0, 20.0, xtol=1e-10)


@pytest.mark.parametrize("w, lam", [(0.5, 0.4), (1.0, 0.0)])
def test_exact_curve_matches_quadrature(w, lam):
    """With release noise (w < 1) and without it (a Gaussian release, pure ε = ∞ but ε(δ) finite)."""
    q = np.array([0.0, 0.3, 0.9, 1.4, 2.0])
    shifted = q - np.array([0.0, 0.0, 0.6, 0.0, 0.0])
    eps, _, curve = exact_values(q, shifted, "gaussian", 0.25, w, lam, 2.0, DELTAS)
    reference = [quadrature_epsilon(d, q, shifted, 0.25, w, lam) for d in DELTAS]
    assert_allclose(curve, reference, rtol=1e-5, atol=1e-7)
    assert np.all(np.diff(curve) > 0)  # ε(δ) grows as δ shrinks
    assert math.isinf(eps) if w >= 1 else curve[-1] <= eps + 1e-9


def test_exact_curve_of_two_gaussians_is_the_analytic_one():
    """One database each: N(0, b²) against N(μ, b²), whose ε(δ) is known in closed form (Balle & Wang 2018)."""
    _, _, curve = exact_values(np.array([0.0]), np.array([0.7]), "gaussian", 1.0, 1.0, 0.0, 2.0,
                               (1e-2, 1e-5, 1e-9))
    assert_allclose(curve, [gaussian_epsilon_delta(d, 0.7, 1.0) for d in (1e-2, 1e-5, 1e-9)], rtol=1e-5)


class Loo:
    """A leave-one-out as audit_release takes it: 15 databases, 10 individuals (the Gaussian kernel's
    calibration takes a minute on 40 and 30)."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.q = rng.normal(0, 1, 15)
        self.shifts = np.zeros((10, 15))
        self.shifts[np.arange(10), rng.integers(0, 15, 10)] = rng.normal(0, 0.5, 10)
        self.ids = [f"id{i}" for i in range(10)]


@pytest.fixture(scope="module")
def gaussian_audit():
    from empdp.noise import calibrate_values

    loo = Loo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate_values(loo.q, loo.shifts, epsilon=0.5, kernel="gaussian")
    return cal, audit_release(cal, loo=loo, top=2, n=4000, N=20000, n_renyi=4000, rng=1)


def test_a_gaussian_release_is_audited_at_delta(gaussian_audit):
    cal, res = gaussian_audit
    d = res.to_dict()
    assert d["delta"] == EPS_TOLERANCE  # the tolerance at which the Gaussian kernel's eps_i is stated
    assert 0 <= d["approx_lower_bound"] <= d["exact_epsilon_at_delta_max"] <= 0.5 + 1e-9
    curve = d["exact_curve"]
    assert curve["delta"][-1] == EPS_TOLERANCE and curve["epsilon"][-1] == d["exact_epsilon_at_delta_max"]
    assert np.all(np.diff(curve["epsilon"]) >= 0) and len(curve["delta"]) >= 5
    rows = d["individuals"]
    assert max(r["exact_epsilon_at_delta"] for r in rows) == d["exact_epsilon_at_delta_max"]
    assert all(r["exact_epsilon_at_delta"] <= r["exact_epsilon"] + 1e-9 for r in rows)  # ε(δ) ≤ pure ε
    assert d["ok"]


def test_the_verdict_of_a_gaussian_release_rests_on_epsilon_at_delta(gaussian_audit):
    import dataclasses

    _, res = gaussian_audit
    # the pure ε of a Gaussian release may exceed the target: ε(δ) at the tolerance is what was calibrated
    assert dataclasses.replace(res, exact_epsilon_max=math.inf, mpl_lower_bound=9.0).ok
    assert not dataclasses.replace(res, approx_lower_bound=res.target_epsilon * 1.5).ok
    assert not dataclasses.replace(res, exact_epsilon_at_delta_max=res.target_epsilon * 1.01).ok


def test_a_laplace_release_has_no_delta_part():
    from empdp.noise import calibrate_values

    loo = Loo(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate_values(loo.q, loo.shifts, epsilon=0.5, kernel="laplace")
    d = audit_release(cal, loo=loo, top=1, n=2000, N=5000, n_renyi=2000, rng=1).to_dict()
    assert d["delta"] is None and d["approx_lower_bound"] is None and d["exact_curve"] is None
    assert "exact_epsilon_at_delta" not in d["individuals"][0]


def test_cli_text_json_and_report_of_a_gaussian_release(tmp_path):
    """calibrate --kernel gaussian, audit release (text and JSON) and report --audit, through the CLI."""
    import polars as pl
    from helpers import QUERY, SAMPLE
    from helpers import run as empdp

    env = {"EMPDP_KEY": CURATOR_KEY.decode()}
    small = tmp_path / "small.parquet"
    sample = pl.read_parquet(SAMPLE)
    sample.filter(pl.col("countyid").is_in(sample["countyid"].unique().sort().head(40).implode())).write_parquet(small)
    for args in (["assess", small, *QUERY, "--save-result", tmp_path / "result.json", "-q"],
                 ["calibrate", small, *QUERY, "-e", "0.5", "--kernel", "gaussian", "-o", tmp_path / "cal.json", "-q"]):
        assert empdp(*args, env=env).exit_code == 0
    audit = ["release", tmp_path / "cal.json", small, "--top", 2, "--seed", 1]
    text = run(*audit, env=env)
    assert text.exit_code == 0, text.output
    assert "(epsilon, delta) audit at delta = 1e-12" in text.stdout and "exact curve" in text.stdout
    res = run(*audit, "--json", env=env)
    d = json.loads(res.stdout)
    assert d["delta"] == EPS_TOLERANCE and d["approx_lower_bound"] <= d["exact_epsilon_at_delta_max"] <= 0.5 + 1e-9
    assert f"lower bound {fmt(d['approx_lower_bound'])}" in text.stdout
    (tmp_path / "audit.json").write_text(res.stdout)
    html = tmp_path / "r.html"
    out = empdp("report", tmp_path / "result.json", "--audit", tmp_path / "audit.json", "-o", html, "-q", env=env)
    assert out.exit_code == 0, out.output
    section = re.search(r'<section id="audit">.*?</section>', html.read_text(), re.S).group(0)
    assert "(ε, δ) lower bound" in section and "exact curve ε(δ)" in section and "exact εᵢ(δ)" in section


def test_report_reads_an_approx_audit(tmp_path, sample_assessment):
    res = run("approx", "-m", "gaussian", "--param", "sigma=1", "--delta", "1e-3", "--search-size", 20000,
              "--final-size", 100000, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    from empdp.report import audit_kind, report_html

    assert audit_kind(d) == "approx"
    section = re.search(r'<section id="audit">.*?</section>', report_html(sample_assessment, audit=d), re.S).group(0)
    assert "lower bound on ε at δ" in section and "search size" in section and "final size" in section
    # as the previous version wrote it
    old = {{"lower_bound": "epsilon_lower_bound", "search_size": "n", "final_size": "N"}.get(k, k): v
           for k, v in d.items()}
    assert audit_kind(old) == "approx"
    assert re.search(r'<section id="audit">.*?</section>', report_html(sample_assessment, audit=old),
                     re.S).group(0) == section
