"""The curator kernels as objects (issue 34, deliverable 1): each kernel against closed forms and
quadrature, the registry, no kernel names compared outside empdp/kernels.py, a test-only kernel
picked up where kernels are chosen, and the report's words for a Gaussian kernel."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from helpers import SAMPLE, one_line_error, run
from numpy.testing import assert_allclose
from scipy import integrate, special, stats

from empdp import kernels, risk
from empdp.density import DensityModel, select_density
from empdp.errors import InputError
from empdp.settings import Model

ROOT = Path(__file__).resolve().parents[1]
KERNELS = list(kernels.KERNELS.values())
SCALES = (0.3, 1.0, 4.0)


def pdf(k, u, b):
    return float(np.exp(k.logpdf(np.float64(u), b)))


def quad(f, *cuts):
    """∫ f over the real line, split at ``cuts`` (kinks): each piece smooth, so quad converges."""
    ends = [-np.inf, *sorted(cuts), np.inf]
    return sum(integrate.quad(f, a, c, limit=400, epsabs=1e-13, epsrel=1e-12)[0] for a, c in zip(ends, ends[1:]))


# ---------------------------------------------------------------------------- each kernel


@pytest.mark.parametrize("k", KERNELS, ids=str)
@pytest.mark.parametrize("b", SCALES)
def test_density_integrates_to_one_and_cdf_is_its_integral(k, b):
    assert quad(lambda u: pdf(k, u, b), 0.0) == pytest.approx(1.0, abs=1e-10)
    for u in (-3.0 * b, -0.2 * b, 0.0, 0.7 * b, 5.0 * b):
        left = sum(integrate.quad(lambda t: pdf(k, t, b), a, c, limit=400)[0]
                   for a, c in ((-np.inf, min(u, 0.0)), (min(u, 0.0), u)))
        assert float(k.cdf(np.float64(u), b)) == pytest.approx(left, abs=1e-10)


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_values_slopes_and_tails_agree(k):
    b = 0.8
    u = np.array([-30.0, -3.0, -0.5, -1e-3, 1e-3, 0.5, 3.0, 30.0]) * b
    val, right, left, cdf = k.terms(u, b)
    assert_allclose(np.log(val), k.logpdf(u, b), rtol=1e-13)
    assert_allclose(cdf, k.cdf(u, b), rtol=1e-14)
    h = 1e-6 * b
    assert_allclose(right, (np.exp(k.logpdf(u + h, b)) - val) / h, rtol=1e-5, atol=1e-6)
    assert_allclose(left, (val - np.exp(k.logpdf(u - h, b))) / h, rtol=1e-5, atol=1e-6)
    log_f, log_s = k.logcdf_both(u, b)
    assert_allclose(np.exp(log_f), cdf, rtol=1e-12)
    assert_allclose(np.exp(log_s), k.cdf(-u, b), rtol=1e-12)  # the upper tail, by symmetry
    tv, tr, tl, tf, g, centre_left = k.tail_terms(u, b)
    assert_allclose(tv, val, rtol=1e-14)
    assert_allclose(tr, right, rtol=1e-14)
    assert_allclose(tf, cdf, rtol=1e-14)
    assert_allclose(g + centre_left, cdf, atol=1e-15)  # F = G + K
    assert (tl is None) == (not k.kinked)
    if k.kinked:  # the one-sided slopes differ at the kink only
        v0, r0, l0, _ = k.terms(np.float64(0.0), b)
        assert r0 == pytest.approx(-l0) and r0 < 0


@pytest.mark.parametrize("k", KERNELS, ids=str)
@pytest.mark.parametrize("mu", (0.1, 1.0, 3.0))
@pytest.mark.parametrize("eps", (0.0, 0.3, 1.5))
def test_privacy_curve_is_the_kernel_against_itself_shifted(k, mu, eps):
    """δ_k(ε; μ) = ∫ (k(x) − e^ε k(x − μ))_+ dx, by quadrature (b = 1)."""
    def excess(x):
        return max(pdf(k, x, 1.0) - math.exp(eps) * pdf(k, x - mu, 1.0), 0.0)

    cuts = [0.0, mu, (mu + eps) / 2, mu / 2 + eps / mu]  # the kinks and where k(x) = e^ε k(x − μ)
    ref = quad(excess, *[c for c in cuts if abs(c) < 60])
    assert float(k.term_delta(eps, mu)) == pytest.approx(ref, abs=1e-9)
    assert float(k.term_delta(eps, 0.0)) == 0.0


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_screening_bounds_hold(k):
    """The log-ratio of a term shifted by Δ: bounded by |Δ|/b when ε_i is exact (ε_i ≤ M_i); else the
    certified ε bound leaves at most the tolerance τ of δ."""
    b, mu = 1.0, np.array([0.05, 0.5, 2.0, 8.0])
    x = np.linspace(-40, 40, 20001)
    for m in mu:
        lr = np.abs(k.logpdf(x, b) - k.logpdf(x + m * b, b))
        if k.exact_eps:
            assert lr.max() <= m * (1 + 1e-12)
            assert k.tolerance == 0.0
        else:
            assert lr.max() > m  # unbounded: grows in the tails
            assert k.tolerance == kernels.EPS_TOLERANCE
    bound = k.eps_bound(mu, 0.5)
    assert np.all(0.5 * k.term_delta(bound, mu) <= k.tolerance)
    if k.exact_eps:
        assert_allclose(bound, mu)
    d = np.array([0.0, 1e-13, 1e-11])
    assert_allclose(k.reported_delta(d), d if k.exact_eps else [0.0, 0.0, 1e-11])


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_characteristic_function_is_the_fourier_transform(k):
    b = 0.7
    for w in (0.0, 0.5, 2.0):
        ref = quad(lambda u: pdf(k, u, b) * math.cos(w * u), 0.0)
        assert float(k.characteristic(b)(w)) == pytest.approx(ref, abs=1e-9)


@pytest.mark.parametrize("k", KERNELS, ids=str)
@pytest.mark.parametrize("w, lam", [(1.0, 0.0), (0.0, 1.3), (0.4, 1.3), (0.4, 0.7)])
def test_release_density_is_the_kernel_convolved_with_the_noise(k, w, lam):
    """k_b ⋆ (w δ_0 + (1 − w) ℓ_λ) by quadrature, at b = 0.7 (λ = b included: its own closed form)."""
    b = 0.7
    for x in (-2.5, 0.0, 0.3, 4.0):
        conv = 0.0
        if w < 1:
            conv = quad(lambda t: pdf(k, x - t, b) * math.exp(-abs(t) / lam) / (2 * lam), 0.0, x)
        ref = w * pdf(k, x, b) + (1 - w) * conv
        assert float(np.exp(k.release_logpdf(np.array([x]), b, w, lam))[0]) == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_samples_follow_the_cdf(k):
    """Kolmogorov–Smirnov at α = 0.001 on 20,000 draws (fixed seed)."""
    draws = k.sample(np.random.default_rng(7), 1.5, 20_000)
    assert stats.kstest(draws, lambda u: k.cdf(u, 1.5)).pvalue > 0.001


# ---------------------------------------------------------------------------- the registry


def test_registry_names_and_lookups():
    assert kernels.names()[0] == kernels.DEFAULT.name == "laplace"
    assert kernels.choices() == (*kernels.names(), "auto")
    for name, k in kernels.KERNELS.items():
        assert kernels.kernel(name) is k and kernels.kernel(k) is k and k.name == name and str(k) == name
    assert kernels.candidates("auto") == tuple(kernels.KERNELS.values())
    assert kernels.is_laplace("laplace") and not kernels.is_laplace("gaussian") and not kernels.is_laplace("auto")


@pytest.mark.parametrize("bad", ["bogus", "Laplace", "", 3, None])
def test_registry_refuses_unknown_kernels_in_one_line(bad):
    for call in (kernels.kernel, kernels.candidates,
                 lambda k: select_density([0.1, 0.5, 0.9], kernel=k, bandwidth=0.2)):
        with pytest.raises(InputError) as err:
            call(bad)
        msg = str(err.value)
        assert "\n" not in msg and "unknown `kernel`" in msg and "laplace, gaussian" in msg


def test_cli_refuses_an_unknown_kernel_naming_the_choices():
    res = run("assess", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
              "--kernel", "bogus")
    one_line_error(res, "--kernel", "bogus", "laplace", "gaussian", "auto")


def test_saved_kernel_names_become_objects():
    q = np.array([0.0, 1.0, 3.0])
    model = DensityModel("gaussian", 1.0, 0.0, q, np.ones(3), loglik=0.0)
    assert model.kernel is kernels.KERNELS["gaussian"] and model.describe()["kind"] == "gaussian"
    with pytest.raises(InputError, match="unknown `kernel`"):
        DensityModel("cauchy", 1.0, 0.0, q, np.ones(3), loglik=0.0)


# ---------------------------------------------------------------------------- no names compared elsewhere

#: comparisons with these operands name something else: the noise laws of the release ('none',
#: 'laplace', 'laplace_mixture') and of the audited mechanisms
OTHER_CONCEPTS = {"noise", "kind", "mech.name"}


def _named(node) -> set:
    """Kernel names among a comparison operand's string constants (a tuple/list/set literal too)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in items if isinstance(e, ast.Constant) and e.value in kernels.KERNELS}


def name_comparisons(source: str) -> list[str]:
    """Comparisons (==, !=, in, not in) of an expression with a kernel name, as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        named = [o for o in operands if _named(o)]
        others = [ast.unparse(o) for o in operands if not _named(o)]
        if named and not (set(others) <= OTHER_CONCEPTS):
            found.append(ast.unparse(node))
    return found


def test_no_module_outside_the_registry_compares_kernel_names():
    offenders = {}
    for path in sorted([*ROOT.glob("empdp/**/*.py"), *ROOT.glob("cli/*.py")]):
        if path == ROOT / "empdp" / "kernels.py":
            continue
        found = name_comparisons(path.read_text())
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, offenders


def test_the_name_check_finds_the_old_comparisons():
    old = ('if model.kernel == "laplace": pass\nok = kernel != "gaussian"\n'
           'x = a if p["kernel"] not in ("laplace", "gaussian") else b\nif noise == "laplace": pass\n')
    assert name_comparisons(old) == ["model.kernel == 'laplace'", "kernel != 'gaussian'",
                                     "p['kernel'] not in ('laplace', 'gaussian')"]


# ---------------------------------------------------------------------------- a new kernel


class Logistic(kernels.Kernel):
    """A test-only kernel: k_b(u) = 1 / (4b cosh²(u/2b)), whose log-ratio under a shift Δ is at most |Δ|/b."""

    name, label = "logistic", "logistic"
    exact_eps, kinked, deconvolves = True, False, False
    reach, far_gap = 50.0, 700.0
    summary = "a test kernel"

    def logpdf(self, u, b):
        a = np.abs(u) / b
        return -a - 2 * np.log1p(np.exp(-a)) - np.log(b)

    def cdf(self, u, b):
        return special.expit(u / b)

    def terms(self, u, b):
        val = np.exp(self.logpdf(u, b))
        d = -np.tanh(u / (2 * b)) / b * val
        return val, d, d, self.cdf(u, b)

    def logcdf_both(self, u, b):
        return -np.logaddexp(0, -u / b), -np.logaddexp(0, u / b)

    def tail_terms(self, u, b):
        val, d, _, cdf = self.terms(u, b)
        right = u >= 0
        return val, d, None, cdf, np.where(right, cdf - 1.0, cdf), right

    def curve(self, eps, mu):
        x = np.linspace(-80, 80, 160_001)
        k = np.exp(self.logpdf(x, 1.0))
        out = [np.trapezoid(np.clip(k - np.exp(e) * np.exp(self.logpdf(x - m, 1.0)), 0, None), x)
               for e, m in zip(np.ravel(eps), np.ravel(mu))]
        return np.clip(np.reshape(out, np.shape(eps)), 0, 1)

    def eps_bound(self, bound, share=1.0):
        return np.asarray(bound, dtype=float)

    def characteristic(self, scale):
        return lambda w: np.where(w == 0, 1.0, np.pi * scale * w / np.sinh(np.pi * scale * w + 1e-300))

    def release_logpdf(self, x, b, w, lam):
        raise NotImplementedError("the test kernel is not released")

    def sample(self, rng, b, size):
        return rng.logistic(0.0, b, size)


@pytest.fixture
def logistic(monkeypatch):
    k = Logistic()
    monkeypatch.setitem(kernels.KERNELS, k.name, k)
    return k


def test_the_test_kernel_is_a_density(logistic):
    test_density_integrates_to_one_and_cdf_is_its_integral(logistic, 0.6)
    test_values_slopes_and_tails_agree(logistic)


def test_a_registered_kernel_is_chosen_and_evaluated_by_the_density_model(logistic):
    q = np.random.default_rng(3).logistic(0.0, 1.0, 40)
    model = select_density(q, kernel="logistic", bandwidth=0.5)
    assert model.kernel is logistic and model.describe()["kind"] == "logistic"
    assert quad(lambda x: float(model.pdf(x)), *q) == pytest.approx(1.0, abs=1e-8)
    x = np.linspace(-3, 3, 7)
    assert_allclose(model.pdf(x), np.mean([np.exp(logistic.logpdf(x - p, 0.5)) for p in q], axis=0), rtol=1e-12)
    assert_allclose(model.cdf(x), np.mean([logistic.cdf(x - p, 0.5) for p in q], axis=0), rtol=1e-12)
    chosen = select_density(q, kernel="auto", bandwidth=0.5)
    assert {c["kernel"] for c in chosen.candidates} == {"laplace", "gaussian", "logistic"}


def test_a_kernel_without_an_exact_risk_evaluation_is_refused_not_misread(logistic):
    """The exact evaluation has a form per kernel (the Laplace matrix form, the Gaussian series); a new
    kernel without one is refused by name, never evaluated with another kernel's formulas."""
    q = np.array([0.0, 0.4, 1.1, 1.5, 2.3])
    model = select_density(q, kernel="logistic", bandwidth=0.5)
    with pytest.raises(InputError, match="'logistic' has no exact risk evaluation"):
        risk.evaluate(model, np.array([[0.0, 0.1, 0.0, -0.2, 0.0]]), np.array([0.1]))


def test_a_registered_kernel_is_a_kernel_choice_of_the_cli(logistic):
    for command in ("assess", "calibrate"):
        assert "laplace|gaussian|logistic|auto" in run(command, "--help").output
    # accepted by --kernel, and refused by the joint model (product Laplace kernels) by its own reason
    res = run("assess", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
              "--query", "sum(murders)", "--kernel", "logistic")
    one_line_error(res, "--kernel logistic", "product Laplace kernels")


# ---------------------------------------------------------------------------- words for users


@pytest.fixture(scope="module")
def small_panel(tmp_path_factory):
    rng = np.random.default_rng(11)
    rows = [(i, j, float(rng.lognormal(0, 0.5))) for j in range(12) for i in range(30) if rng.random() < 0.8]
    path = tmp_path_factory.mktemp("kernels") / "panel.parquet"
    pl.DataFrame(rows, schema=["person", "year", "x"], orient="row").write_parquet(path)
    return str(path)


def _report(path, kernel):
    from empdp.assessment import assess
    from empdp.report import report_html

    a = assess(path, id="person", by="year", query="mean(x)", model=Model(kernel=kernel, bandwidth=0.05))
    return a, report_html(a)


def test_a_gaussian_report_never_says_everyone_is_protected(small_panel):
    """Gaussian log-ratios are unbounded: δ_i is only below τ from ε_all on, never 0 (the report said
    "beyond ε_all every individual has δ_i = 0" and counted those "not fully protected")."""
    a, html = _report(small_panel, "gaussian")
    assert a.eps_tolerance == kernels.EPS_TOLERANCE
    for claim in ("every individual has δ<sub>i</sub> = 0", "every individual has δᵢ = 0", "fully protected",
                  "everyone protected", "protected)"):
        assert claim not in html, claim
    assert "beyond ε_all every individual has δᵢ ≤ 1e-12 (reported as 0)" in html
    assert "at risk (δᵢ(ε) &gt; 1e-12" in html
    assert "ε_all (every δᵢ ≤ 1e-12 from here" in html
    assert "its largest absolute value is ε" not in html  # the plotted log-ratio's peak is not ε_i
    assert "its largest value on the plot is not εᵢ: εᵢ is the smallest ε with δᵢ(ε) ≤ 1e-12" in html


def test_a_laplace_report_says_everyone_is_protected_beyond_eps_all(small_panel):
    _, html = _report(small_panel, "laplace")
    assert "beyond ε_all every individual has δᵢ = 0" in html
    assert "not fully protected (δᵢ(ε) &gt; 0)" in html
    assert "its largest absolute value is εᵢ." in html
