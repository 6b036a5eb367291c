"""Noise calibration and release (SPEC 6): exact λ*, deconvolution, secure sampling, ledger."""

from .deconv import NoiseSpec, fourier_deconvolve, gaussian_fallback, laplace_closed_form
from .exact import hausdorff_distance, laplace_kde_eps, minimal_lambda, winf_distance
from .sampler import NoiseSampler

__all__ = [
    "NoiseSampler",
    "NoiseSpec",
    "fourier_deconvolve",
    "gaussian_fallback",
    "hausdorff_distance",
    "laplace_closed_form",
    "laplace_kde_eps",
    "minimal_lambda",
    "winf_distance",
]
