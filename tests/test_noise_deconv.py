"""Deconvolution of the curator kernel (docs/method.md#83-deconvolution-the-noise-law)."""

import numpy as np
import pytest
from scipy.signal import fftconvolve
from scipy.special import logsumexp

from empdp.noise.deconv import (
    NoiseSpec,
    fourier_deconvolve,
    gaussian_fallback,
    laplace_closed_form,
    log_smoothed_kernel,
)
from empdp.noise.exact import laplace_kde_eps, minimal_lambda


@pytest.mark.parametrize("b, lam", [(0.3, 1.0), (0.9, 1.0), (0.05, 2.0), (1.0, 7.5)])
def test_fourier_reproduces_laplace_closed_form(b, lam):
    closed = laplace_closed_form(b, lam)
    d = fourier_deconvolve("laplace", b, lam)
    assert d.feasible, d.reason
    assert d.weight_zero == pytest.approx(closed.weight_zero, abs=1e-3)
    dx = d.x[1] - d.x[0]
    continuous = (1 - closed.weight_zero) * np.exp(-np.abs(d.x) / lam) / (2 * lam)
    assert np.abs(d.density - continuous).sum() * dx < 1e-3
    assert closed.expected_abs == pytest.approx((1 - (b / lam) ** 2) * lam)


def test_closed_form_without_noise_when_kernel_is_wide_enough():
    assert laplace_closed_form(1.2, 1.0) == NoiseSpec("none", 1.0, 0.0)
    assert laplace_closed_form(0.3, 0.0).kind == "none"
    assert laplace_closed_form(0.0, 2.0) == NoiseSpec("laplace", 0.0, 2.0)


def test_closed_form_really_convolves_to_the_target():
    # ℓ_b ⋆ (w δ0 + (1 − w) ℓ_λ) = ℓ_λ, checked by quadrature on a grid
    b, lam = 0.4, 1.3
    h = laplace_closed_form(b, lam)
    x = np.linspace(-40, 40, 160_001)
    dx = x[1] - x[0]
    lap = lambda s: np.exp(-np.abs(x) / s) / (2 * s)  # noqa: E731
    conv = h.weight_zero * lap(b) + (1 - h.weight_zero) * fftconvolve(lap(b), lap(lam), mode="same") * dx
    assert np.abs(conv - lap(lam)).sum() * dx < 1e-3


@pytest.mark.parametrize("sigma, lam", [(0.3, 1.0), (0.01, 1.0), (2.0, 1.0)])
def test_gaussian_kernel_is_reported_infeasible(sigma, lam):
    d = fourier_deconvolve("gaussian", sigma, lam)
    assert not d.feasible
    assert "docs/method.md#112-a-gaussian-curator-kernel-cannot-be-deconvolved" in d.reason
    assert d.max_abs_transform > 1


def test_wider_laplace_kernel_is_infeasible_in_fourier():
    assert not fourier_deconvolve("laplace", 1.5, 1.0).feasible


def direct_eps(noise, sigma, a, B, lo=-12, hi=12, size=60_001):
    """Reference: sup |log(P̂⋆k⋆h) − log(P̂_i⋆k⋆h)| by direct evaluation on a fine grid."""
    x = np.linspace(lo, hi, size)
    k = lambda u: log_smoothed_kernel(u, sigma, noise.weight_zero, noise.scale)  # noqa: E731
    log_r = logsumexp(k(x[:, None] - a), axis=1)
    return np.array([np.abs(log_r - logsumexp(k(x[:, None] - b), axis=1)).max() for b in B])


def test_smoothed_kernel_is_a_density_and_the_laplace_convolution():
    sigma, lam, w = 0.3, 0.8, 0.4
    x = np.linspace(-30, 30, 600_001)
    dx = x[1] - x[0]
    dens = np.exp(log_smoothed_kernel(x, sigma, w, lam))
    assert dens.sum() * dx == pytest.approx(1.0, abs=1e-6)
    g = np.exp(-0.5 * (x / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))
    ref = w * g + (1 - w) * fftconvolve(g, np.exp(-np.abs(x) / lam) / (2 * lam), mode="same") * dx
    assert np.abs(dens - ref).max() < 1e-4


def test_gaussian_fallback_eps_is_verified():
    rng = np.random.default_rng(0)
    n, m, epsilon, sigma = 20, 200, 1.0, 0.3
    a = rng.normal(size=n)
    B = a - rng.exponential(0.02, size=(m, n)) * (rng.random((m, n)) < 0.5)
    B[:3] -= rng.normal(size=(3, n)) * 0.5
    lam_star = minimal_lambda(a, B, epsilon).lam
    fb = gaussian_fallback(a, B, sigma, epsilon, lam_star)
    assert fb.eps_max <= epsilon
    assert fb.noise.expected_abs <= lam_star
    # independent check on the riskiest rows, finer and wider than the search grid
    risky = np.argsort(laplace_kde_eps(a, B, fb.noise.scale))[-5:]
    assert direct_eps(fb.noise, sigma, a, B[risky]).max() <= epsilon
    np.testing.assert_array_less(direct_eps(fb.noise, sigma, a, B[risky]) - 1e-9, fb.eps[risky])
