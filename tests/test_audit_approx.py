"""(ε, δ) audits (``empdp audit approx``): exact ε(δ) curves, exact binomial bounds, the bound's
coverage and monotonicity on small fixed-seed runs, bad input, the CLI's JSON."""

import json
import math

import numpy as np
import pytest
from audit_cli_helpers import run
from helpers import one_line_error
from scipy import integrate, stats

from empdp.audit import approx
from empdp.audit.approx import check_delta, clopper_pearson_lower, clopper_pearson_upper
from empdp.audit.truth import gaussian_delta, gaussian_epsilon_delta, laplace_epsilon_delta
from empdp.errors import InputError

SMALL = dict(n=20_000, N=100_000)


# ----------------------------------------------------------------------------- exact curves

def _hockey_stick(eps, logpdf_p, logpdf_q, lo, hi, points):
    """∫ (p − e^ε q)_+ by quadrature: the independent reference for the closed forms."""
    def f(t):
        return max(0.0, math.exp(logpdf_p(t)) - math.exp(eps + logpdf_q(t)))

    return integrate.quad(f, lo, hi, points=points, limit=500, epsabs=1e-15, epsrel=1e-10)[0]


@pytest.mark.parametrize("sd", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5])
def test_gaussian_epsilon_delta_matches_quadrature(sd, delta):
    eps = gaussian_epsilon_delta(delta, 1.0, sd)
    # the optimal event is a half-line from the crossing point t* = 1/2 + ε σ²
    crossing = 0.5 + eps * sd ** 2
    got = _hockey_stick(eps, lambda t: stats.norm.logpdf(t, 1.0, sd), lambda t: stats.norm.logpdf(t, 0.0, sd),
                        -30 * sd, 30 * sd + 1, [crossing])
    assert got == pytest.approx(delta, rel=1e-6)
    # smaller ε leave more than δ: ε(δ) is the smallest ε that works
    assert _hockey_stick(eps * 0.99, lambda t: stats.norm.logpdf(t, 1.0, sd),
                         lambda t: stats.norm.logpdf(t, 0.0, sd), -30 * sd, 30 * sd + 1, [crossing]) > delta


def test_gaussian_curve_edges():
    assert gaussian_delta(0.0, 1.0, 1.0) == pytest.approx(2 * stats.norm.cdf(0.5) - 1)  # total variation
    assert gaussian_epsilon_delta(0.5, 1.0, 1.0) == 0.0  # δ above the total variation
    assert gaussian_delta(0.3, 0.0, 1.0) == 0.0
    assert gaussian_epsilon_delta(1e-5, 2.0, 2.0) == pytest.approx(gaussian_epsilon_delta(1e-5, 1.0, 1.0))


@pytest.mark.parametrize("eps0,delta", [(1.0, 1e-3), (0.3, 0.05)])
def test_laplace_epsilon_delta_matches_quadrature(eps0, delta):
    eps = laplace_epsilon_delta(delta, eps0)
    got = _hockey_stick(eps, lambda t: stats.laplace.logpdf(t, eps0), lambda t: stats.laplace.logpdf(t, 0.0),
                        -60, 60, [0.0, eps0, (eps + eps0) / 2])  # the kinks: centres and crossing
    assert got == pytest.approx(delta, rel=1e-6)


# ----------------------------------------------------------------------------- Clopper-Pearson

def test_clopper_pearson_closed_forms_and_scipy():
    n, level = 1000, 0.025
    assert clopper_pearson_upper(0, n, level) == pytest.approx(1 - level ** (1 / n))
    assert clopper_pearson_lower(n, n, level) == pytest.approx(level ** (1 / n))
    assert clopper_pearson_lower(0, n, level) == 0.0 and clopper_pearson_upper(n, n, level) == 1.0
    for k in (1, 7, 500, 999):
        assert clopper_pearson_lower(k, n, level) == pytest.approx(stats.beta.ppf(level, k, n - k + 1))
        assert clopper_pearson_upper(k, n, level) == pytest.approx(stats.beta.ppf(1 - level, k + 1, n - k))


def test_clopper_pearson_exact_coverage():
    """P(lower ≤ p) and P(upper ≥ p) ≥ 1 − level for every p, from the binomial law itself."""
    n, level = 40, 0.05
    k = np.arange(n + 1)
    lo, hi = clopper_pearson_lower(k, n, level), clopper_pearson_upper(k, n, level)
    for p in np.linspace(0.001, 0.999, 499):
        pmf = stats.binom.pmf(k, n, p)
        assert pmf[lo <= p].sum() >= 1 - level - 1e-12
        assert pmf[hi >= p].sum() >= 1 - level - 1e-12


# ----------------------------------------------------------------------------- the bound

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gaussian_bound_below_truth_and_not_trivial(seed):
    res = approx("gaussian", delta=1e-3, params={"sigma": 1.0}, rng=seed, **SMALL)
    truth = gaussian_epsilon_delta(1e-3, 1.0, 1.0)
    assert res.true_value == pytest.approx(truth)
    assert 0.6 * truth < res.lower_bound <= truth
    assert res.pair == (0.0, 1.0)  # the pair at the full sensitivity
    # the bound is the Clopper-Pearson one on the reported counts, each at level alpha/2
    assert res.p_lower == pytest.approx(clopper_pearson_lower(res.counts["event_database"], res.final_size, res.alpha / 2))
    assert res.q_upper == pytest.approx(clopper_pearson_upper(res.counts["other_database"], res.final_size, res.alpha / 2))
    assert res.lower_bound == pytest.approx(math.log((res.p_lower - res.delta) / res.q_upper))


def test_laplace_bound_below_its_curve():
    res = approx("laplace", delta=1e-2, params={"epsilon": 1.0}, rng=5, **SMALL)
    assert 0.8 < res.lower_bound <= laplace_epsilon_delta(1e-2, 1.0) == res.true_value


def test_monotone_in_delta():
    bounds = [approx("gaussian", delta=d, params={"sigma": 1.0}, rng=3, **SMALL).lower_bound
              for d in (1e-1, 1e-2, 1e-3, 1e-4)]
    assert all(a < b for a, b in zip(bounds, bounds[1:])), bounds


def test_seed_reproduces():
    a = approx("gaussian", delta=1e-3, rng=11, **SMALL).to_dict()
    b = approx("gaussian", delta=1e-3, rng=11, **SMALL).to_dict()
    assert a == b


def test_large_delta_gives_zero_with_a_warning():
    res = approx("gaussian", delta=0.9, params={"sigma": 1.0}, rng=0, **SMALL)
    assert res.lower_bound == 0.0
    assert any("the bound is 0" in w and "total variation" in w for w in res.warnings)


def test_vector_outputs_scored_and_below_pure_epsilon():
    res = approx("laplace_parallel", delta=1e-3, rng=1, n=5000, N=20000)
    assert res.event["score"] == "logistic regression"
    assert res.truth_kind.startswith("pure epsilon")
    assert 0 <= res.lower_bound <= res.true_value


def test_user_sampler_both_orders(tmp_path, monkeypatch):
    """An asymmetric user mechanism: only the reversed order (x′'s events) shows the loss."""
    (tmp_path / "onesided.py").write_text(
        "import numpy as np\n"
        "def sampler(database, size, rng):\n"
        "    # database 1 outputs 1 with probability 0.5, database 0 with probability 0.05\n"
        "    return (rng.random(size) < (0.5 if database == 1 else 0.05)).astype(float)\n")
    monkeypatch.chdir(tmp_path)
    res = approx("onesided:sampler", pairs=[[0, 1]], delta=1e-3, rng=2, **SMALL)
    assert res.reversed_pair and res.true_value is None
    assert math.log((0.5 - 1e-3) / 0.05) * 0.9 < res.lower_bound <= math.log((0.5 - 1e-3) / 0.05)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("value", [0, 1, -1, math.nan, math.inf, True, "1e-5", None])
def test_library_refuses_bad_delta(value):
    with pytest.raises(InputError, match="delta"):
        approx("gaussian", delta=value, **SMALL)
    if value is not None:
        with pytest.raises(InputError, match="strictly between 0 and 1"):
            check_delta(value)


def test_library_refuses_sizes_with_budget_and_small_N():
    with pytest.raises(InputError, match="not both"):
        approx("gaussian", delta=1e-3, n=1000, time_budget=5)
    with pytest.raises(InputError, match="must be larger than `n`"):
        approx("gaussian", delta=1e-3, n=5000, N=5000)


@pytest.mark.parametrize("value", ["0", "1", "-1", "nan", "inf", "1.5"])
def test_cli_bad_delta_one_line_exit_2(value):
    one_line_error(run("approx", "-m", "gaussian", "--delta", value, "--time-budget", 2),
                   "--delta must be a number strictly between 0 and 1")


@pytest.mark.parametrize("args,fragment", [
    (("approx", "-m", "gaussian"), "--delta"),
    (("approx", "-m", "gaussian", "--delta", "1e-3", "--search-size", 100, "--time-budget", 5), "not both"),
    (("approx", "-m", "gaussian", "--delta", "1e-3", "--alpha", "0.7"), "alpha"),
    (("approx", "-m", "nope", "--delta", "1e-3"), "unknown mechanism 'nope'"),
])
def test_cli_bad_input_one_line_exit_2(args, fragment):
    one_line_error(run(*args), fragment)


# ----------------------------------------------------------------------------- CLI

def test_cli_json_keys():
    res = run("approx", "-m", "gaussian", "--param", "sigma=1", "--delta", "1e-3", "--search-size", 20000,
              "--final-size", 100000, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert {"method", "lower_bound", "delta", "alpha", "sizes", "event", "pair", "event_database",
            "counts", "p_lower", "q_upper", "true_value", "true_value_kind", "warnings"} <= set(d)
    assert d["method"] == "approx" and d["delta"] == 1e-3 and d["alpha"] == 0.05
    assert d["sizes"] == {"chosen_by": "given", "search_size": 20000, "final_size": 100000}
    assert d["true_value"] == pytest.approx(gaussian_epsilon_delta(1e-3, 1.0, 1.0))
    assert 0 < d["lower_bound"] <= d["true_value"]
    assert d["event"]["score"] == "output" and d["event"]["direction"] in (">=", "<=")


def test_cli_terminal_output():
    res = run("approx", "-m", "gaussian", "--delta", "1e-3", "--search-size", 20000, "--final-size", 100000,
              "--seed", 1)
    assert res.exit_code == 0, res.output
    assert "Lower bound on epsilon at delta = 0.001 (gaussian)" in res.output
    assert "exact epsilon(delta), analytic Gaussian" in res.output and "the output" in res.output
