"""The curator's kernels (docs/method.md#3-density-model): one class per kernel holding everything
that depends on it, and the registry that maps the names users type to them.

A kernel k_b (scale b) knows its density, log-density, CDF and tails; whether it has a kink at its
centre; its one-dimensional privacy curve δ_k(ε; μ) against itself shifted by μ scales, hence the
certified screening bounds on δ_i and ε_i (docs/method.md#51-screening-bound); whether ε_i is
exact (bounded log-ratios: Laplace) or the smallest ε with δ_i(ε) ≤ τ (Gaussian); whether it
deconvolves into a release noise law in closed form, and the release density k ⋆ h for the noise
h = w·δ_0 + (1 − w)·ℓ_λ; and the words used for users where these differ.

Names are compared here only: elsewhere a kernel is an object from :func:`kernel`, and files keep
its :attr:`Kernel.name`. Add a kernel with a subclass of :class:`Kernel` and one line in
:data:`KERNELS`: the density model (a fixed kernel or ``auto``), ``--kernel``, the screening bounds,
the reported δ_i and the words then use it. The exact per-individual evaluation has one numerical
form per kernel (:data:`empdp.risk.exact.PLANS`: the matrix form for Laplace, the series form for
Gaussian kernels) and refuses a kernel without one.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from .errors import InputError

#: τ: for kernels with unbounded log-ratios (Gaussian) ε_i is the smallest ε with δ_i(ε) ≤ τ, and
#: δ_i ≤ τ is reported as 0
EPS_TOLERANCE = 1e-12
_SQRT2PI = float(np.sqrt(2 * np.pi))


def _special():
    """scipy.special, imported on first use: an audit imports this module without paying for SciPy."""
    import scipy.special

    return scipy.special


class Kernel(ABC):
    """A curator kernel k_b of scale b, centred at 0 (vectorised over ``u`` and ``b``).

    A kernel equals its :attr:`name` as well as itself, so saved results and callers that pass
    names keep working; the package itself converts names with :func:`kernel` at its boundaries.
    """

    #: the name users type (``--kernel``) and files store; the name in sentences
    name: str
    label: str
    #: bounded log-ratios: ε_i = sup |log p̂ − log p̂_i| exists, δ_i(ε) = 0 exactly for ε ≥ ε_i, and
    #: ε_i ≤ M_i = max_j |Δ_ij|/b_j (else ε_i is the smallest ε with δ_i(ε) ≤ :attr:`tolerance`)
    exact_eps: bool
    #: a kink at the centre: one-sided slopes differ there, and grids hold every q_j and kink
    kinked: bool
    #: the least noise deconvolves in closed form, k_b ⋆ h = ℓ_λ with h = w·δ_0 + (1 − w)·ℓ_λ,
    #: w = (b/λ)² (:func:`empdp.noise.deconv.laplace_closed_form`: Laplace kernels); else calibration
    #: searches the verified Laplace-mixture fallback (docs/method.md#83-deconvolution-the-noise-law)
    deconvolves: bool
    #: scales beyond which the kernel's mass is negligible (< 1e-20; grids reach this far), and the
    #: scales from which its density is below e^{−684} (gaps between points get nodes of their own)
    reach: float
    far_gap: float
    #: one line for ``--kernel`` help: what choosing this kernel means
    summary: str
    #: the kernel's code in the compiled kernel sums of the density fit (:mod:`empdp.compiled`);
    #: None: the fit sums the kernel's :meth:`logpdf` in row blocks (O(n²) time, bounded memory)
    code: int | None = None

    @property
    def tolerance(self) -> float:
        """τ in the definition of ε_i: 0 when ε_i is exact."""
        return 0.0 if self.exact_eps else EPS_TOLERANCE

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            return other == self.name
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ------------------------------------------------------------------ densities
    @abstractmethod
    def logpdf(self, u, b) -> np.ndarray:
        """log k_b(u)."""

    @abstractmethod
    def terms(self, u, b):
        """Value, right and left derivatives, and CDF at u (the derivatives differ at a kink)."""

    @abstractmethod
    def cdf(self, u, b) -> np.ndarray:
        """K_b(u) = ∫_{−∞}^u k_b."""

    @abstractmethod
    def logcdf_both(self, u, b):
        """(log K_b(u), log (1 − K_b(u))), accurate in both tails."""

    @abstractmethod
    def tail_terms(self, u, b):
        """:meth:`terms` with the CDF's smaller tail: (value, right slope, left slope or None when it is
        the right one, F, G, K) with K = whether the centre lies at or left of u and G = F − K (F left
        of the centre, F − 1 at or right of it) to full relative precision."""

    # ------------------------------------------------------------------ screening
    @abstractmethod
    def curve(self, eps: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """δ_k(ε; μ) for μ > 0: the kernel against itself shifted by μ scales, in [0, 1]."""

    def term_delta(self, eps, mu) -> np.ndarray:
        """δ(ε) of one kernel against itself shifted by μ scales (0 where μ = 0), broadcast."""
        eps, mu = np.broadcast_arrays(np.asarray(eps, float), np.asarray(mu, float))
        out = np.zeros(eps.shape)
        pos = mu > 0
        out[pos] = self.curve(eps[pos], mu[pos])
        return out

    @abstractmethod
    def eps_bound(self, bound, share) -> np.ndarray:
        """Certified upper bound on ε_i from M_i = ``bound`` and n_i/n = ``share``."""

    def reported_delta(self, d: np.ndarray) -> np.ndarray:
        """δ_i as reported: below the tolerance τ it is 0 (``d`` itself when ε_i is exact)."""
        return d if self.exact_eps else np.where(d <= self.tolerance, 0.0, d)

    # ------------------------------------------------------------------ release
    @abstractmethod
    def characteristic(self, scale: float):
        """F k(ω) of the kernel of scale ``scale``, as a function of ω."""

    @abstractmethod
    def release_logpdf(self, x, b: float, w: float, lam: float) -> np.ndarray:
        """log of k_b ⋆ h at ``x`` for the release noise h = w·δ_0 + (1 − w)·ℓ_λ (no noise: w ≥ 1 or λ ≤ 0)."""

    @abstractmethod
    def sample(self, rng, b: float, size: int) -> np.ndarray:
        """``size`` draws of k_b."""

    # ------------------------------------------------------------------ words
    def eps_all_label(self, sole: int, tol_text: str) -> str:
        """The label of ε_all beside its value (``tol_text``: τ as the caller formats numbers)."""
        if not self.exact_eps:
            return f"ε_all (every δᵢ ≤ {tol_text} from here" + (
                f", except {sole:,} sole contributor(s))" if sole else ")")
        return ("ε_all (everyone protected)" if not sole
                else f"ε_all (all but {sole:,} sole contributor(s) protected)")

    def beyond_eps_all(self, tol_text: str) -> str:
        """What holds for every individual from ε_all on."""
        if self.exact_eps:
            return "beyond ε_all every individual has δᵢ = 0"
        return (f"beyond ε_all every individual has δᵢ ≤ {tol_text} (reported as 0); the log-ratio of "
                f"{self.label} densities is unbounded, so no ε makes δᵢ exactly 0")

    def at_risk(self, tol_text: str) -> str:
        """Who counts as at risk at ε."""
        if self.exact_eps:
            return "not fully protected (δᵢ(ε) > 0)"
        return f"at risk (δᵢ(ε) > {tol_text}; δᵢ at or below it is reported as 0)"

    def eps_i_meaning(self, tol_text: str) -> str:
        """What ε_i means, after 'the largest factor by which the query's distribution changes'."""
        if self.exact_eps:
            return "; they are fully protected (δᵢ = 0) at any ε ≥ εᵢ."
        return (f"; with {self.label} kernels this log-ratio is unbounded, so εᵢ is the smallest ε at which "
                f"δᵢ(ε) ≤ {tol_text}.")

    def log_ratio_peak(self, tol_text: str) -> str:
        """What the largest |log p̂ − log p̂ᵢ| of a density plot is."""
        if self.exact_eps:
            return "its largest absolute value is εᵢ."
        return (f"with {self.label} kernels it grows without bound in the tails, so its largest value on the "
                f"plot is not εᵢ: εᵢ is the smallest ε with δᵢ(ε) ≤ {tol_text}.")

    def eps_note(self) -> str | None:
        """The note an assessment's JSON carries about ε_i (None when ε_i is exact)."""
        if self.exact_eps:
            return None
        return (f"kernel {self.name}: eps_i is the smallest epsilon with delta_i <= eps_tolerance "
                f"({self.tolerance:g}), and delta_i below it is reported as 0; the log-ratio of {self.label} "
                "densities is unbounded, so no epsilon makes delta_i exactly 0")


class Laplace(Kernel):
    """ℓ_b(u) = e^{−|u|/b}/(2b): bounded log-ratios (exact ε_i), a kink at 0, closed-form deconvolution."""

    name, label = "laplace", "Laplace"
    exact_eps = kinked = deconvolves = True
    reach, far_gap = 46.0, 700.0
    summary = "the model calibrate deconvolves; exact eps_i"
    code = 0

    def logpdf(self, u, b):
        return -np.abs(u) / b - np.log(2 * b)

    def terms(self, u, b):
        e = np.exp(-np.abs(u) / b)
        val = e / (2 * b)
        neg = u < 0
        d_right = np.where(neg, val, -val) / b
        d_left = np.where(u > 0, -val, val) / b
        cdf = np.where(neg, 0.5 * e, 1.0 - 0.5 * e)
        return val, d_right, d_left, cdf

    def cdf(self, u, b):
        e = 0.5 * np.exp(-np.abs(u) / b)
        return np.where(u < 0, e, 1.0 - e)

    def logcdf_both(self, u, b):
        a = np.abs(u) / b
        small = np.log(0.5) - a
        big = np.log1p(-0.5 * np.exp(-a))
        return np.where(u < 0, small, big), np.where(u < 0, big, small)

    def tail_terms(self, u, b):
        terms = self.terms(u, b)  # the smaller tail is b times the value: ½ e^{−|u|/b}
        tail = terms[0] * b
        return (*terms, np.where(u < 0, tail, -tail), u >= 0)

    def curve(self, eps, mu):
        """(1 − e^{(ε−μ)/2})_+."""
        return np.clip(-np.expm1(np.minimum(eps - mu, 0.0) / 2), 0, 1)

    def eps_bound(self, bound, share=1.0):
        """M_i itself: each term's ratio lies in [e^{−|Δ_ij|/b_j}, e^{|Δ_ij|/b_j}]."""
        return np.asarray(bound, dtype=float)

    def characteristic(self, scale):
        return lambda w: 1.0 / (1.0 + (scale * w) ** 2)

    def release_logpdf(self, x, b, w, lam):
        """ℓ_b ⋆ h in closed form: ℓ_b ⋆ ℓ_λ = (λ e^{−|x|/λ} − b e^{−|x|/b}) / (2(λ² − b²))."""
        log_k = -np.abs(x) / b - math.log(2 * b)
        if not (w < 1 and lam > 0):
            return log_k
        if abs(lam - b) < 1e-12 * lam:  # ℓ_b ⋆ ℓ_b
            log_conv = np.log1p(np.abs(x) / b) - np.abs(x) / b - math.log(4 * b)
        else:
            hi, lo = max(lam, b), min(lam, b)
            ax = np.abs(x)
            log_conv = (math.log(hi) - ax / hi + np.log1p(-(lo / hi) * np.exp(-ax / lo + ax / hi))
                        - math.log(2 * (hi * hi - lo * lo)))
        if w <= 0:
            return log_conv
        return np.logaddexp(math.log(w) + log_k, math.log1p(-w) + log_conv)

    def sample(self, rng, b, size):
        return rng.laplace(0.0, b, size)


class Gaussian(Kernel):
    """φ_b(u) = e^{−u²/2b²}/(b√2π): unbounded log-ratios, so ε_i is stated at the tolerance τ; no
    closed-form deconvolution (docs/method.md#112-a-gaussian-curator-kernel-cannot-be-deconvolved)."""

    name, label = "gaussian", "Gaussian"
    exact_eps = kinked = deconvolves = False
    reach, far_gap = 12.0, 37.0
    summary = "eps_i up to a stated tolerance"
    code = 1

    def logpdf(self, u, b):
        return -0.5 * (u / b) ** 2 - np.log(b) - 0.5 * np.log(2 * np.pi)

    def terms(self, u, b):
        z = u / b
        val = np.exp(-0.5 * z * z) / (b * np.sqrt(2 * np.pi))
        d = -z / b * val
        return val, d, d, _special().ndtr(z)

    def cdf(self, u, b):
        return _special().ndtr(u / b)

    def logcdf_both(self, u, b):
        log_ndtr = _special().log_ndtr
        return log_ndtr(u / b), log_ndtr(-u / b)

    def tail_terms(self, u, b):
        z = u / b  # one ndtr for both tails: the smaller one, Φ(−|z|), to full relative precision
        val = np.exp(-0.5 * z * z) / (b * _SQRT2PI)
        tail = _special().ndtr(-np.abs(z))
        left = z < 0  # the centre lies right of the node
        return val, -z / b * val, None, np.where(left, tail, 1.0 - tail), np.where(left, tail, -tail), ~left

    def curve(self, eps, mu):
        """Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), e^ε Φ(·) as exp(ε + log Φ(·)): no overflow for large ε."""
        sp = _special()
        return np.clip(sp.ndtr(mu / 2 - eps / mu) - np.exp(eps + sp.log_ndtr(-mu / 2 - eps / mu)), 0, 1)

    def eps_bound(self, bound, share=1.0, tol: float = EPS_TOLERANCE):
        """Smallest ε with share · δ_Gauss(ε; μ) ≤ tol, per μ = M_i, to a relative 1e-12 (the upper end
        of the final bracket is returned: the bound holds there). ∞ where μ is ∞.

        Newton's method on log δ, safeguarded by bisection, from the bracket [0, μ(μ/2 + z)] with
        Φ(−z) = tol (δ ≤ Φ(μ/2 − ε/μ) ≤ tol at its upper end): ~7 evaluations of the curve a row
        instead of bisection's ~40 (0.2 s at 10^5 individuals, before the first exact evaluation)."""
        sp = _special()
        mu, share = np.broadcast_arrays(np.asarray(bound, dtype=float), np.asarray(share, dtype=float))
        out = np.zeros(mu.shape)
        finite = np.isfinite(mu)
        out[~finite] = np.inf
        pos = finite & (mu > 0) & (share > tol)
        m, w = mu[pos], share[pos]
        z = -float(sp.ndtri(tol)) + 1e-6
        lo, hi = np.zeros(len(m)), m * (m / 2 + z) + 1e-300
        eps = hi.copy()
        side = np.zeros(len(m))  # +1: the last point was above tol, −1: at or below
        log_tol = np.log(tol / w)
        rows = np.arange(len(m))
        for _ in range(200):
            e, mm = eps[rows], m[rows]
            a, b = mm / 2 - e / mm, -mm / 2 - e / mm
            grown = np.exp(e + sp.log_ndtr(b))  # e^ε Φ(b): the slope is −e^ε Φ(b)
            d = np.clip(sp.ndtr(a) - grown, 0.0, 1.0)
            above = w[rows] * d > tol
            low, up = np.where(above, e, lo[rows]), np.where(above, hi[rows], e)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = (np.log(d) - log_tol[rows]) * d / -grown
            sgn = np.where(above, 1.0, -1.0)
            step = np.where(side[rows] == sgn, 2.0 * step, step)  # log δ may be convex: do not creep
            nxt = e - step
            small = np.abs(step) <= 0.25e-12 * up  # too small to cut the bracket: step over the root
            nxt = np.where(small, e + sgn * 0.25e-12 * up, nxt)
            ok = np.isfinite(nxt) & (nxt > low) & (nxt < up)
            nxt = np.where(ok, nxt, 0.5 * (low + up))
            side[rows] = np.where(ok, sgn, 0.0)
            lo[rows], hi[rows], eps[rows] = low, up, nxt
            rows = rows[up - low > 1e-12 * up]
            if not len(rows):
                break
        out[pos] = hi
        return out

    def characteristic(self, scale):
        return lambda w: np.exp(-0.5 * (scale * w) ** 2)

    def smoothed_logpdf(self, u, sigma, w, lam):
        """log of k′ = w·g_σ + (1 − w)·(g_σ ⋆ ℓ_λ), the kernel of P̂ ⋆ k ⋆ h (0 ≤ w < 1, λ > 0).

        g_σ ⋆ ℓ_λ is the exponentially modified Gaussian, written with log Φ for
        stability: (1/2λ)e^{σ²/2λ²}[e^{−u/λ}Φ(u/σ − σ/λ) + e^{u/λ}Φ(−u/σ − σ/λ)].
        The one copy: calibration certifies ε with it (the verified fallback) and the release
        audit computes the exact values with it.
        """
        log_ndtr = _special().log_ndtr
        u = np.asarray(u, dtype=float)
        r = sigma / lam
        emg = (
            -np.log(2 * lam)
            + 0.5 * r * r
            + np.logaddexp(-u / lam + log_ndtr(u / sigma - r), u / lam + log_ndtr(-u / sigma - r))
        )
        if w <= 0:
            return emg
        gauss = -0.5 * (u / sigma) ** 2 - np.log(sigma * np.sqrt(2 * np.pi))
        return np.logaddexp(np.log(w) + gauss, np.log1p(-w) + emg)

    def release_logpdf(self, x, b, w, lam):
        if w < 1 and lam > 0:  # the exponentially modified Gaussian, mixed with the atom at 0
            return self.smoothed_logpdf(x, b, w, lam)
        return -0.5 * (x / b) ** 2 - math.log(b * math.sqrt(2 * math.pi))

    def sample(self, rng, b, size):
        return rng.normal(0.0, b, size)


#: the registry: name -> kernel (the first is the default of every command)
KERNELS: dict[str, Kernel] = {"laplace": Laplace(), "gaussian": Gaussian()}
#: the kernel of every command unless the user opts into another (docs/method.md#3-density-model)
DEFAULT = KERNELS["laplace"]
#: the model-selection choice besides a kernel's name: the kernel of largest held-out likelihood
AUTO = "auto"


def names() -> tuple[str, ...]:
    """The registered kernels' names, the default first."""
    return tuple(KERNELS)


def choices() -> tuple[str, ...]:
    """What ``--kernel`` takes: every registered name, then ``auto``."""
    return (*KERNELS, AUTO)


def kernel(k) -> Kernel:
    """The kernel named ``k`` (a :class:`Kernel` is returned as it is); an InputError naming the valid ones."""
    if isinstance(k, Kernel):
        return k
    found = KERNELS.get(k) if isinstance(k, str) else None
    if found is None:
        raise InputError(f"unknown `kernel` {str(k)[:40]!r}; use one of {', '.join(KERNELS)}", param="kernel")
    return found


def candidates(choice) -> tuple[Kernel, ...]:
    """The kernels a model-selection ``choice`` leaves: one, or every kernel for ``auto``."""
    if isinstance(choice, str) and choice == AUTO:
        return tuple(KERNELS.values())
    if not isinstance(choice, Kernel) and choice not in KERNELS:
        raise InputError(f"unknown `kernel` {str(choice)[:40]!r}; use one of {', '.join(choices())}",
                         param="kernel")
    return (kernel(choice),)


def is_laplace(choice) -> bool:
    """Whether a ``--kernel`` choice is the Laplace kernel (``auto`` is not): the joint, grouped and
    adversary calibrations are built on it."""
    return not (isinstance(choice, str) and choice == AUTO) and isinstance(kernel(choice), Laplace)
