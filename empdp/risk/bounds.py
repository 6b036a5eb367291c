"""Certified screening bounds on δ_i and ε_i from the largest scaled shift M_i = max_j |Δ_ij|/b_j
(docs/method.md#51-screening-bound), and the tolerance τ of Gaussian kernels."""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..density import DensityModel
from ..kernels import EPS_TOLERANCE

GAUSSIAN_TOL = EPS_TOLERANCE  # the former name


def term_delta(kernel, eps, mu):
    """δ(ε) of one kernel (object or name) against itself shifted by μ scales (the 1-d mechanism
    curve, :meth:`empdp.kernels.Kernel.term_delta`): Laplace (1 − e^{(ε−μ)/2})_+, Gaussian
    Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)."""
    return kernels.kernel(kernel).term_delta(eps, mu)


def delta_upper_bound(kernel, eps, bound, n_present, n):
    """Certified δ_i(ε) ≤ (n_i/n) δ_kernel(ε; M_i) (docs/method.md#51-screening-bound).

    (Σ a_j − e^ε Σ b_j)_+ ≤ Σ (a_j − e^ε b_j)_+ term by term, and each term is
    the kernel's own curve at sensitivity |Δ_ij|/b_j ≤ M_i, increasing in it.
    """
    return np.asarray(n_present) / n * term_delta(kernel, eps, bound)


def delta_terms_bound(kernel, eps: float, scaled: np.ndarray) -> np.ndarray:
    """Certified δ_i(ε) ≤ (1/n) Σ_j δ_kernel(ε; |Δ_ij|/b_j) for rows of ``scaled`` shifts |Δ_ij|/b_j
    (C, n): the term-by-term step of :func:`delta_upper_bound` before each term is raised to M_i.
    Costs a kernel curve per shift, not per row, and is much tighter where one database's shift
    stands out: on a bounded 10^7-row panel it shows ε_i(τ) below the ε_all found for 84% of the
    individuals whose M_i-bound does not."""
    return term_delta(kernel, eps, scaled).sum(axis=1) / scaled.shape[1]


def eps_upper_bound(model: DensityModel, bound: np.ndarray, n_present=None) -> np.ndarray:
    """Certified upper bound on ε_i from M_i (:meth:`empdp.kernels.Kernel.eps_bound`): M_i for
    kernels with exact ε_i (Laplace); for Gaussian kernels the smallest ε with
    (n_i/n) δ_kernel(ε; M_i) ≤ τ (:func:`delta_upper_bound`), which bounds ε_i(τ). ``n_present``
    (n_i, optional) tightens the Gaussian bound (n_i/n = 1 without it).
    """
    bound = np.asarray(bound, dtype=float)
    share = 1.0 if n_present is None else np.asarray(n_present, dtype=float) / len(model.points)
    return model.kernel.eps_bound(bound, share)


def gaussian_eps_bound(bound, share=1.0, tol: float = EPS_TOLERANCE) -> np.ndarray:
    """Smallest ε with share · δ_Gauss(ε; μ) ≤ tol, per μ = M_i (:meth:`empdp.kernels.Gaussian.eps_bound`)."""
    return kernels.Gaussian().eps_bound(bound, share, tol)
