"""Exact privacy values of the reference mechanisms against quadrature / enumeration (STYLE 7)."""

import itertools
import math

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy import integrate, stats

from empdp.audit import builtin, truth
from empdp.audit.release import release_kernel_logpdf


def quad_renyi(order, f, g, lo, hi, points=None):
    val = integrate.quad(lambda t: f(t) ** order * g(t) ** (1 - order), lo, hi, points=points,
                         limit=400, epsabs=1e-13, epsrel=1e-11)[0]
    return math.log(val) / (order - 1)


@pytest.mark.parametrize("order", [1.5, 2, 3, 7])
@pytest.mark.parametrize("eps", [0.1, 1.0, 2.5])
def test_laplace_renyi_closed_form(order, eps):
    f, g = stats.laplace(0, 1 / eps).pdf, stats.laplace(1, 1 / eps).pdf
    ref = quad_renyi(order, f, g, -80 / eps, 80 / eps, points=[0, 1])
    assert_allclose(truth.laplace_renyi(order, eps), ref, rtol=1e-7)


@pytest.mark.parametrize("order", [2, 3, 5])
def test_gaussian_renyi_closed_form(order):
    f, g = stats.norm(0, 1.3), stats.norm(0.7, 1.3)
    val = integrate.quad(lambda t: math.exp(order * f.logpdf(t) + (1 - order) * g.logpdf(t)), -60, 60,
                         limit=400, epsabs=1e-13)[0]
    assert_allclose(truth.gaussian_renyi(order, 0.7, 1.3), math.log(val) / (order - 1), rtol=1e-8)


def test_randomized_response_closed_form():
    p = 0.8
    for order in (2, 3):
        assert_allclose(truth.rr_renyi(order, p),
                        truth.discrete_renyi(order, truth.rr_pmf(0, p), truth.rr_pmf(1, p)), rtol=1e-12)
    assert_allclose(truth.discrete_epsilon(truth.rr_pmf(0, p), truth.rr_pmf(1, p)), math.log(4))


@pytest.mark.parametrize("eps", [0.2, 0.7, 1.5])
def test_exponential_mechanism_epsilon(eps):
    lam = truth.exponential_lambda(eps)

    def density(s):
        z = integrate.quad(lambda t: math.exp(-lam * abs(s - t)), 0, 200 / lam, points=[s])[0]
        return lambda t: math.exp(-lam * abs(s - t)) / z

    t = np.linspace(0, 6 / lam + 3, 3001)
    worst = 0.0
    for s, s2 in itertools.combinations(np.linspace(1, 2, 6), 2):
        f, g = density(s), density(s2)
        worst = max(worst, max(abs(math.log(f(v)) - math.log(g(v))) for v in t))
        assert truth.exponential_pair_epsilon(s, s2, lam) == pytest.approx(
            max(abs(math.log(f(v)) - math.log(g(v))) for v in np.append(t, [s, s2])), abs=1e-9)
    assert_allclose(worst, eps, rtol=1e-9)


def test_noisy_max_and_svt_laws_against_quad():
    q, scale = np.array([1.0, 0.0, 2.0]), 1.7
    lap = stats.laplace(scale=scale)
    for k in range(3):
        others = np.delete(q, k)
        ref = integrate.quad(lambda t: lap.pdf(t - q[k]) * np.prod(lap.cdf(t - others)), -80, 80,
                             points=[0, 1, 2], limit=400)[0]
        assert_allclose(truth.noisy_max_pmf(q, scale)[k], ref, atol=1e-10)
    rho, nu = stats.laplace(scale=2.0), stats.laplace(scale=4.0)
    pmf = truth.svt_pmf(q, 2.0, 4.0, threshold=1.0)
    ref0 = integrate.quad(lambda r: rho.pdf(r) * nu.sf(1 + r - q[0]), -150, 150, points=[0, 0, 1], limit=400)[0]
    refn = integrate.quad(lambda r: rho.pdf(r) * np.prod(nu.cdf(1 + r - q)), -150, 150, points=[-1, 0, 1],
                          limit=400)[0]
    assert_allclose([pmf[0], pmf[-1]], [ref0, refn], atol=1e-10)
    assert_allclose(pmf.sum(), 1.0, atol=1e-10)


def test_svt_sampler_matches_exact_law():
    mech = builtin("svt2", epsilon=1.0)
    q = [1, 1, 0, 2, 1, 0, 1, 1, 2, 0]
    out = mech(q, 200_000, np.random.default_rng(3))
    first = np.where((out == 1).any(axis=1), (out == 1).argmax(axis=1), 10)
    emp = np.bincount(first, minlength=11) / len(first)
    exact = truth.svt_pmf(q, 2.0, 4.0)
    assert np.max(np.abs(emp - exact) / np.sqrt(exact * (1 - exact) / len(first))) < 4.5


def test_shuffled_rr_against_enumeration():
    p, bits = 0.7, [1, 0, 0, 1]
    ref = np.zeros(5)
    for out in itertools.product([0, 1], repeat=4):
        ref[sum(out)] += np.prod([p if o == b else 1 - p for o, b in zip(out, bits)])
    assert_allclose(truth.shuffled_rr_pmf(bits, p), ref, atol=1e-15)


def test_subsampled_laplace_epsilon_and_renyi():
    q, eps = 0.3, 1.0
    x, y = [0.0] * 4, [1.0, 0, 0, 0]
    assert_allclose(truth.mixture_epsilon("laplace", x, y, q, 1 / eps), math.log1p(q * math.expm1(eps)),
                    rtol=1e-10)
    f = stats.laplace(0, 1 / eps).pdf

    def g(t):
        return (1 - q) * f(t) + q * f(t - 1)

    for order in (2, 3):
        assert_allclose(truth.mixture_renyi("laplace", order, y, x, q, 1 / eps),
                        quad_renyi(order, g, f, -100, 100, points=[0, 1]), rtol=1e-8)


def test_noisy_gd_moments_match_simulation():
    mech = builtin("noisy_gd")
    out = mech([1.0] + [0.0] * 9, 200_000, np.random.default_rng(0))
    mean, sd = truth.noisy_gd_moments(0.1, 0.1, 0.1, 20)
    assert abs(out.mean() - mean) < 5 * sd / math.sqrt(len(out))
    assert abs(out.std() / sd - 1) < 0.01


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_release_kernel_is_the_convolution(kernel):
    b, lam, w = 0.5, 2.0, 0.3
    k = (lambda u: np.exp(-abs(u) / b) / (2 * b)) if kernel == "laplace" else stats.norm(0, b).pdf
    for t in (0.0, 1.3, -4.0):
        conv = integrate.quad(lambda u: k(u) * np.exp(-abs(t - u) / lam) / (2 * lam), -60, 60,
                              points=[0, t], limit=400)[0]
        assert_allclose(np.exp(release_kernel_logpdf(t, kernel, b, w, lam)), w * k(t) + (1 - w) * conv,
                        rtol=1e-9)
    # Laplace curator kernel with the closed-form noise gives exactly Laplace(λ) (docs/method.md#83-deconvolution-the-noise-law)
    x = np.linspace(-9, 9, 11)
    assert_allclose(release_kernel_logpdf(x, "laplace", b, (b / lam) ** 2, lam),
                    -np.abs(x) / lam - math.log(2 * lam), atol=1e-12)


def test_exact_renyi_values_at_high_orders():
    """Laplace: D_α → ε as α → ∞ (the closed form overflowed e^{(α−1)ε} near α = 700);
    subsampling with q = 1 is the plain Gaussian mechanism, D_α = α Δ²/(2σ²) (the quadrature's
    integrand overflowed at α = 50)."""
    assert truth.laplace_renyi(1e4, 1.0) == pytest.approx(1 + math.log(1e4 / (2e4 - 1)) / (1e4 - 1), rel=1e-12)
    assert truth.laplace_renyi(3, -1.0) == truth.laplace_renyi(3, 1.0)
    x, y = builtin("subsampled_gaussian").renyi_pairs[0]
    for order in (50, 200):
        assert truth.mixture_renyi("gaussian", order, x, y, 1.0, 1.0) == pytest.approx(order / 2, rel=1e-9)
    assert math.isfinite(builtin("subsampled_gaussian").true_renyi_over(50, [(x, y)], True))
