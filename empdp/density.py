"""The curator's density model of the query (docs/method.md#3-density-model).

p̂(x) = (1/n) Σ_j k_{b_j}(x − q_j) with a kernel of :mod:`empdp.kernels` and
variable bandwidths b_j = b · (g / p̃(q_j))^a (Abramson / Breiman et al. 1977),
chosen by leave-one-out log-likelihood. The bandwidths are fitted once and
reused for every p̂_i (paired kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from . import kernels
from .errors import InputError
from .kernels import Kernel
from .robust import SILVERMAN_IQR_PER_SD, robust_spread

#: the kernel of every command unless the user opts into another (see :func:`select_density`)
DEFAULT_KERNEL = kernels.DEFAULT.name
SENSITIVITIES = (0.0, 0.25, 0.5, 0.75, 1.0)


def kernel_logpdf(kernel, u: np.ndarray, b) -> np.ndarray:
    """log k_b(u) of a kernel (object or name; :meth:`empdp.kernels.Kernel.logpdf`)."""
    return kernels.kernel(kernel).logpdf(u, b)


def kernel_terms(kernel, u: np.ndarray, b):
    """Kernel value, right and left derivatives, and CDF at u (:meth:`empdp.kernels.Kernel.terms`)."""
    return kernels.kernel(kernel).terms(u, b)


def kernel_cdf(kernel, u: np.ndarray, b) -> np.ndarray:
    """The kernel's CDF at u (:meth:`empdp.kernels.Kernel.cdf`)."""
    return kernels.kernel(kernel).cdf(u, b)


def kernel_logcdf_both(kernel, u, b):
    """(log F, log (1−F)) of the kernel at u, accurate in both tails."""
    return kernels.kernel(kernel).logcdf_both(u, b)


@dataclass(kw_only=True)
class Selection:
    """How a density model was chosen, shared by :class:`DensityModel` and the joint model.

    Attributes
    ----------
    loglik : float
        Leave-one-out log-likelihood of the points under the model.
    selected_by : str
        ``'loo-likelihood'`` or ``'fixed'``.
    candidates : list of dict
        Every candidate tried with its log-likelihood, for the report.
    """

    loglik: float
    selected_by: str = "loo-likelihood"
    candidates: list = field(default_factory=list, repr=False)


@dataclass
class DensityModel(Selection):
    """A fitted KDE of the query values (docs/method.md#3-density-model).

    Attributes
    ----------
    kernel : Kernel
        The kernel (:mod:`empdp.kernels`; a name given here is converted).
    scale : float
        Global bandwidth b (Laplace scale, or Gaussian standard deviation).
    sensitivity : float
        Abramson sensitivity a (0 = fixed bandwidth).
    points : ndarray (n,)
        The query values q_j.
    bandwidths : ndarray (n,)
        Per-point bandwidths b_j (paired: reused for every p̂_i).
    loglik, selected_by, candidates
        As :class:`Selection` (keyword-only); each candidate is a (kernel, scale, sensitivity, loglik).
    """

    kernel: Kernel
    scale: float
    sensitivity: float
    points: np.ndarray
    bandwidths: np.ndarray

    def __post_init__(self):
        self.kernel = kernels.kernel(self.kernel)

    @property
    def variable(self) -> bool:
        return self.sensitivity > 0

    def logpdf(self, x, shifts=None) -> np.ndarray:
        """log p̂(x), or log p̂_i(x) when ``shifts`` (Δ_ij, shape (n,)) is given."""
        x = np.asarray(x, dtype=np.float64)
        pts = self.points if shifts is None else self.points - np.asarray(shifts)
        lk = self.kernel.logpdf(x[..., None] - pts, self.bandwidths)
        return logsumexp(lk, axis=-1) - np.log(len(pts))

    def pdf(self, x, shifts=None) -> np.ndarray:
        return np.exp(self.logpdf(x, shifts))

    def cdf(self, x, shifts=None) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        pts = self.points if shifts is None else self.points - np.asarray(shifts)
        return self.kernel.cdf(x[..., None] - pts, self.bandwidths).mean(axis=-1)

    def describe(self) -> dict:
        return {"kind": self.kernel.name, "scale": float(self.scale), "sensitivity": float(self.sensitivity),
                "variable": self.variable, "loglik": float(self.loglik), "selected_by": self.selected_by}


def _bandwidths(kernel, q: np.ndarray, b: float, a: float) -> np.ndarray:
    """Abramson variable bandwidths b_j = b (g / p̃(q_j))^a with a fixed-b pilot p̃."""
    if a == 0:
        return np.full(len(q), b)
    log_pilot = log_kernel_sums(kernel, q, np.full(len(q), b), self_term=True) - np.log(len(q))
    log_g = log_pilot.mean()
    return b * np.exp(a * (log_g - log_pilot))


def loo_loglik(kernel, q: np.ndarray, bandwidths: np.ndarray) -> float:
    """Σ_j log p̂_{−j}(q_j): leave-one-out log-likelihood with paired bandwidths."""
    n = len(q)
    return float(np.sum(log_kernel_sums(kernel, q, bandwidths, self_term=False) - np.log(n - 1)))


def log_kernel_sums(kernel, q: np.ndarray, bandwidths: np.ndarray, self_term: bool) -> np.ndarray:
    """log Σ_k k_{b_k}(q_j − q_k) for every j, over k ≠ j unless ``self_term``.

    The n × n matrix of terms this replaces made the bandwidth choice O(n²) in time and memory
    (75 s and 5 GB at 10^4 databases). One scale of a registered kernel is summed over the sorted
    values by :mod:`empdp.compiled`, O(n) after the sort: Laplace by exact running sums, Gaussian by
    box moments (the terms left out add up to below e^−40 of the sum), both equal to the matrix's
    sums to rounding. Per-point scales (variable bandwidths), a kernel without a compiled form and a
    Gaussian scale below 2^−50 of the values' span are summed in blocks of rows: the matrix's own
    sums, in O(n²) time but bounded memory.
    """
    kernel = kernels.kernel(kernel)
    q, bandwidths = np.asarray(q, dtype=np.float64), np.asarray(bandwidths, dtype=np.float64)
    one = float(bandwidths[0]) if kernel.code is not None and np.all(bandwidths == bandwidths[0]) else None
    if one is None or (np.ptp(q) / one >= MAX_BOXES and not isinstance(kernel, kernels.Laplace)):
        return _block_log_sums(kernel, q, bandwidths, self_term)
    from . import compiled  # numba: loaded by the fit only, never by --help or an audit

    order = np.argsort(q, kind="stable")
    if kernel.code == compiled.LAPLACE:
        sums = compiled.laplace_sums(q[order], one, self_term) - np.log(2 * one)
    else:
        sums = compiled.gauss_sums(q[order], one, self_term)
    out = np.empty(len(q))
    out[order] = sums
    return out


#: terms per row block of :func:`_block_log_sums` (2^20: 8 MB a block)
BLOCK_TERMS = 1 << 20
#: the box moments of one Gaussian scale (:func:`empdp.compiled.gauss_sums`) number their boxes in
#: floats: exact up to this many boxes of one scale
MAX_BOXES = 2.0**50


def _block_log_sums(kernel, q: np.ndarray, bandwidths: np.ndarray, self_term: bool) -> np.ndarray:
    """:func:`log_kernel_sums` of any kernel by its :meth:`~empdp.kernels.Kernel.logpdf`, a block of rows at a time."""
    n = len(q)
    rows = max(1, BLOCK_TERMS // n)
    out = np.empty(n)
    for start in range(0, n, rows):
        at = np.arange(start, min(n, start + rows))
        lk = kernel.logpdf(q[at, None] - q[None, :], bandwidths[None, :])
        if not self_term:
            lk[np.arange(len(at)), at] = -np.inf
        out[at] = logsumexp(lk, axis=1)
    return out


def reference_scale(q: np.ndarray) -> float:
    """Silverman's rule of thumb 0.9 · min(sd, IQR/1.34) · n^(−1/5) (sd if IQR is 0)."""
    spread = float(robust_spread(q, iqr_per_sd=SILVERMAN_IQR_PER_SD))
    return 0.9 * spread * len(q) ** (-0.2)


#: a fixed bandwidth outside these is refused: beyond them the kernels under- or overflow
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e-100, 1e100
#: the values of ``bandwidth`` besides a number (the default first)
BANDWIDTHS = ("auto", "variable")


def select_density(q, kernel=DEFAULT_KERNEL, bandwidth="auto", n_scales: int = 41) -> DensityModel:
    """Choose kernel, scale b and sensitivity a by leave-one-out log-likelihood.

    The default, a Laplace kernel of one global scale, is the model of every
    command (assess, calibrate, report, the release audit): its log-ratios
    are bounded, so ε_i exists exactly, and only it can be deconvolved into
    release noise, so the assessment and the calibration describe the same
    release (calibrate adds no noise at ε exactly when assess finds nobody at
    risk at ε).

    Parameters
    ----------
    q : array (n,)
        Query values of the n databases.
    kernel : a kernel or its name (default 'laplace'; :mod:`empdp.kernels`), or 'auto' (every
        registered kernel, chosen by likelihood)
    bandwidth : 'auto' (default), 'variable' or float
        'auto' chooses one global scale by likelihood; 'variable' also
        chooses an Abramson sensitivity a ∈ {0, .25, .5, .75, 1} (variable
        bandwidths; assessment only: no single noise law deconvolves them);
        a float fixes the global scale b with no variable part.
    """
    q = np.asarray(q, dtype=np.float64)
    tried = kernels.candidates(kernel)
    variable = bandwidth == "variable"
    if len(q) < 2:
        raise InputError("at least 2 databases are needed to fit the density model")
    if bandwidth not in BANDWIDTHS and bandwidth is not None:
        try:
            b = float(bandwidth)
        except (TypeError, ValueError):
            raise InputError(f"`bandwidth` must be auto, variable or a positive number; got {bandwidth!r}",
                             param="bandwidth") from None
        if not (np.isfinite(b) and MIN_BANDWIDTH <= b <= MAX_BANDWIDTH):
            raise InputError(f"`bandwidth` must be a number in [{MIN_BANDWIDTH:g}, {MAX_BANDWIDTH:g}] (in the "
                             f"query's units); got {str(bandwidth)[:40]!r}", param="bandwidth")
        fits = [(k, b, 0.0, loo_loglik(k, q, np.full(len(q), b))) for k in tried]
        best = max(fits, key=lambda f: f[3])
        return DensityModel(best[0], b, 0.0, q, np.full(len(q), b), loglik=best[3], selected_by="fixed",
                            candidates=_candidates(fits))
    h0 = reference_scale(q)
    if not h0 > 0:
        raise InputError("all databases give the same query value, so its spread (and any bandwidth) "
                         "is 0; pass --bandwidth to fix a kernel scale")
    scales = h0 * np.logspace(np.log10(0.1), np.log10(5.0), n_scales)
    sens = SENSITIVITIES if variable else (0.0,)
    fits = []
    for k in tried:
        for a in sens:
            for b in scales:
                bw = _bandwidths(k, q, b, a)
                fits.append((k, float(b), a, loo_loglik(k, q, bw)))
    best = max(fits, key=lambda f: (f[3], -f[2]))
    if not np.isfinite(best[3]):
        raise InputError("no kernel bandwidth gives a finite likelihood for these query values; "
                         "pass --bandwidth")
    return DensityModel(best[0], best[1], best[2], q, _bandwidths(best[0], q, best[1], best[2]),
                        loglik=best[3], selected_by="loo-likelihood",
                        candidates=_candidates(fits))


def _candidates(fits) -> list[dict]:
    """The candidates tried, for the report: kernels by name, as files store them."""
    return [{"kernel": k.name, "scale": b, "sensitivity": a, "loglik": ll} for k, b, a, ll in fits]
