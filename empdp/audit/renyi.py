"""Rényi-DP lower bound (Kutta, Askin, Dunsche 2024; docs/method.md#92-renyi-dp-lower-bound).

For α > 1, D_α(f ‖ g) = (α − 1)⁻¹ log ∫ f^α g^{1−α}. The denominator density
is floored smoothly, s(z) = η⁻¹ log(e^{ηz} + e^{ητ}) ≥ z; since 1 − α < 0 the
floored divergence is a lower bound of the true one. The plug-in estimate
T̂ = ∫ f̂^α s(ĝ)^{1−α} (relative frequencies, or binned Gaussian KDEs with a
mildly undersmoothed bandwidth) gets a delta-method standard error
σ̂_T² = Var_f̂(w₁)/n + Var_ĝ(w₂)/m with w₁ = α f̂^{α−1} s(ĝ)^{1−α} and
w₂ = (1 − α) f̂^α s(ĝ)^{−α} s′(ĝ); then LB = D̂ − z_{1−α_conf} σ̂_T / ((α − 1) T̂).

Three refinements of docs/method.md#92-renyi-dp-lower-bound, each measured in tests/bench/audit_validation.py:
the floor τ is tied to the noise of the estimate (20/n for frequencies, the
density where the KDE's relative error is 1/2 for densities; both times
α(α − 1)/6 above α = 3, since the plug-in raises that noise to the power α);
σ̂ is computed
from densities at the ordinary rule-of-thumb bandwidth (a smooth nuisance
functional; at the undersmoothed one, noise in the tails inflates it); and
D̂ is corrected for its second-order bias (b_T/T − Var T̂/(2T²))/(α − 1),
b_T = ½ Σ [φ_ff Var f̂ + φ_gg Var ĝ] (φ = f^α s(g)^{1−α} is convex, so T̂ runs
high by O(1/(n h)); for small
divergences such as the subsampled Laplace mechanism, D ≈ 0.05, that is one
standard error and the uncorrected bound exceeds D in 15% of runs). The
correction is applied where ĝ ≥ 4τ only: closer to the floor the expansion
overshoots; and not at all when T̂'s relative standard error exceeds 1/2 (high
orders, few outputs), where the expansion fails: the result then says so.

Several candidates (pairs, and both directions of each, since RDP bounds
both) go through a pilot on n/5 fresh outputs per database: the candidates
whose pilot confidence interval (±2σ̂) reaches the best pilot lower end stay
in play (at most four), get n fresh outputs per database, and share the
error level (Bonferroni); the result is the largest of their bounds. The
pilot uses its own outputs, so the final bound keeps its level. A clear
winner (e.g. the subsampled Gaussian, where D_α(M(x′) ‖ M(x)) is three
times the reverse) is bounded at the full level α; symmetric pairs (Laplace,
randomized response) keep both directions and split α, as a Bonferroni
correction over all candidates would.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable, NamedTuple

import numpy as np

from ..errors import InputError
from ..io import jsonable
from .budget import PILOT_SIZES, check_budget, given_sizes, size_for_budget
from .common import (
    as_rng,
    check_level,
    check_order,
    check_size,
    continuous_dim,
    detect_discrete,
    draw,
    exact_or_none,
    one_blas_thread,
)
from .kde import GAUSS_R, as_samples, binned_kde, categorize, frequencies, make_grid, rule_of_thumb
from .mechanisms import Mechanism, load_mechanism
from .pairs import resolve_pairs

log = logging.getLogger("empdp.audit")

#: Defaults after tuning (tests/bench/audit_validation.py). The docs/method.md#92-renyi-dp-lower-bound trial used
#: τ = 10^-3, η = 1/τ; a sharper softmax (η = 10/τ: s(2τ) = 2τ instead of 2.3τ) and a floor
#: tied to the noise of the estimate remove most of the floor's downward bias without
#: hurting coverage. Frequencies: τ = TAU_COUNTS/n (20 outputs). Densities: τ = TAU_NOISE
#: · R(K)^d / (n Π h), the density at which the KDE's relative standard error is
#: 1/√TAU_NOISE = 1/2 (≈ 2·10^-4 per unit spread at n = 10^5); lower floors leave σ̂
#: short of the spread of D̂ (by 20% for the Gaussian, α = 3, at 10^-4).
TAU_COUNTS = 20.0
BIAS_MIN_FLOORS = 4.0
#: The bias correction needs both of its terms, b_T/T and Var T̂/T², at most this large
#: (σ̂_T/T̂ ≤ 0.5); beyond, the second-order expansion is not to be trusted.
BIAS_TERMS_MAX = 0.25
#: σ̂_T/T̂ above this: the normal approximation behind the bound is poor (a warning).
REL_SE_WARN = 0.3
TAU_NOISE = 4.0
#: Both floors grow with α(α − 1)/6 above α = 3: the plug-in's convexity bias at a point is
#: about α(α − 1)/2 times the relative variance of the estimate there, so a floor tuned for
#: α ≤ 3 lets noisy points dominate T̂ at high orders (Laplace, α = 10, n = 10^5: the
#: bound exceeded D_α in 23% of runs).
FLOOR_ORDER_BASE = 6.0
ETA_FACTOR = 10.0
UNDERSMOOTH = 0.05
GRID = 2000
#: γ of the bandwidth at which σ̂ is computed (0: the plain rule of thumb; see _estimates).
VAR_UNDERSMOOTH = 0.0

#: Pilot selection: candidates whose pilot D̂ ± PILOT_Z σ̂ interval reaches the best
#: pilot lower end D̂ − PILOT_Z σ̂ stay in play, at most MAX_FINALISTS of them.
PILOT_Z = 2.0
MAX_FINALISTS = 4


@dataclass
class RenyiResult:
    """Outcome of one Rényi lower bound: D_α(M(x) ‖ M(x′)) ≥ lower_bound with prob. ≈ 1 − alpha."""

    lower_bound: float
    estimate: float
    order: float
    pair: tuple
    pair_index: int
    direction: str
    sigma: float
    sample_size: int  # outputs per database (--sample-size)
    alpha: float
    discrete: bool
    tau: float
    eta: float
    bandwidth: list | None
    selection: str
    bias_corrected: bool = True
    true_value: float | None = None
    candidates: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    sizes: dict = field(default_factory=dict)

    @property
    def t_hat(self):
        return None

    def to_dict(self) -> dict:
        return jsonable({
            "method": "renyi", "lower_bound": self.lower_bound, "estimate": self.estimate,
            "order": self.order, "pair": list(self.pair), "pair_index": self.pair_index,
            "direction": self.direction, "t_hat": None, "sigma": self.sigma, "sample_size": self.sample_size,
            "alpha": self.alpha, "discrete": self.discrete, "tau": self.tau,
            "eta": self.eta, "bandwidth": self.bandwidth, "selection": self.selection,
            "bias_corrected": self.bias_corrected,
            "true_value": self.true_value,
            "true_value_infinite": self.true_value is not None and math.isinf(self.true_value),
            "candidates": self.candidates, "warnings": self.warnings, "sizes": self.sizes,
        })


def _floor(z, tau, eta):
    """s(z) = η⁻¹ log(e^{ηz} + e^{ητ}) and s′(z) = 1/(1 + e^{η(τ − z)})."""
    return np.logaddexp(eta * z, eta * tau) / eta, _special().expit(eta * (z - tau))


class Divergence(NamedTuple):
    """D̂ and σ̂_D of one floored divergence, with what the warnings need."""

    estimate: float
    sigma: float
    floor_share: float  # the fraction of T̂ from points where ĝ < τ (the floor binds there)
    rel_se: float  # σ̂_T / T̂
    corrected: bool  # the bias correction was applied


def floored_divergence(f, g, weight, order: float, tau: float, eta: float, n: int, m: int,
                       var_densities=None, noise: float | None = None):
    """D̂ and σ̂_D from densities (or probabilities) f, g on common points with cell weights.

    ``var_densities`` = (f_v, g_v), when given, are the densities under which the
    delta-method variance is computed (default: f, g themselves). With ``noise`` = c
    (∫K_h² for a KDE, 1 for frequencies) the second-order bias of D̂ is removed:
    E log T̂ − log T ≈ b_T/T − Var T̂/(2T²), b_T = ½ Σ [∂²φ/∂f² Var f̂ + ∂²φ/∂g² Var ĝ],
    φ = f^α s(g)^{1−α}, Var f̂ ≈ f (c − f)/n (φ is convex, so T̂ runs high by O(1/(n h))).
    The expansion holds only while both terms are small; when either exceeds
    BIAS_TERMS_MAX (high orders or few outputs, where T̂ is dominated by a few points)
    the correction is not applied: it would overshoot, by orders of magnitude at α ≥ 25.
    Sums run on a log scale (every term divided by the largest), so that high orders
    neither overflow nor underflow.
    Returns a :class:`Divergence` (D̂, σ̂_D, floor_share, rel_se, corrected).
    """
    a = order
    top, T, integrand, _, _ = _integral(f, g, weight, a, tau, eta)
    if not T > 0:
        raise InputError("the two output samples do not overlap: the Rényi estimate is undefined")
    fv, gv = (f, g) if var_densities is None else var_densities
    top_v, Tv, phi_v, w1, w2 = _integral(fv, gv, weight, a, tau, eta)

    def var(p, w):
        mass = float(np.sum(p * weight))
        mean = float(np.sum(p * w * weight)) / mass
        return max(float(np.sum(p * w * w * weight)) / mass - mean * mean, 0.0)

    var_t = var(fv, w1) / n + var(gv, w2) / m  # Var T̂ · e^{−2 top_v}
    D = (top + math.log(T)) / (a - 1)
    rel_se = math.sqrt(var_t) / Tv if Tv > 0 else math.inf
    corrected = False
    if noise is not None:  # E log T̂ ≈ log T + bias_T/T − Var T̂/(2T²)
        shift = math.exp(top_v - top) / T
        bias_rel = _bias(fv, gv, phi_v, weight, a, tau, eta, noise, n, m) * shift
        var_rel = var_t * shift * shift
        if abs(bias_rel) <= BIAS_TERMS_MAX and max(var_rel, rel_se * rel_se) <= BIAS_TERMS_MAX:
            D -= (bias_rel - var_rel / 2) / (a - 1)
            corrected = True
    sigma_d = rel_se / (a - 1)
    share = float(np.sum(integrand * weight * (g < tau))) / T
    return Divergence(D, sigma_d, share, rel_se, corrected)


def _bias(f, g, scaled, weight, a, tau, eta, c, n, m):
    """½ Σ weight·[φ_ff Var f̂ + φ_gg Var ĝ] for φ = f^α s(g)^{1−α}, Var f̂ = f(c − f)/n, on the
    scale of ``scaled`` = φ e^{−top} (the integrand :func:`_integral` returns)."""
    s, ds = _floor(g, tau, eta)
    pos = f > 0
    term_f = a * (a - 1) * scaled / np.where(pos, f, 1.0) * np.maximum(c - f, 0.0) / n
    phi_gg = (1 - a) * scaled / s * (-a * ds * ds / s + eta * ds * (1 - ds))
    term_g = phi_gg * g * np.maximum(c - g, 0.0) / m
    reliable = g >= BIAS_MIN_FLOORS * tau  # the expansion fails where ĝ is within noise of the floor
    return 0.5 * float(np.sum((term_f + term_g) * weight * reliable))


def _integral(f, g, weight, a, tau, eta):
    """The terms of T = Σ f^α s(g)^{1−α}·weight on a log scale: (top, T e^{−top}, integrand
    e^{−top}, w₁ e^{−top}, w₂ e^{−top}) with top the largest log term and w₁ = ∂/∂f,
    w₂ = ∂/∂g of the integrand (docs/method.md#92-renyi-dp-lower-bound). top = −inf when f is 0 everywhere."""
    s, ds = _floor(g, tau, eta)
    pos = f > 0
    logf = np.where(pos, np.log(np.where(pos, f, 1.0)), -np.inf)
    logs = np.log(s)
    logterm = a * (logf - logs) + logs
    top = float(np.max(logterm)) if logterm.size else -math.inf
    if not math.isfinite(top):
        return top, 0.0, np.zeros_like(f), np.zeros_like(f), np.zeros_like(f)
    integrand = np.exp(logterm - top)
    w1 = np.where(pos, a * np.exp(logterm - top - np.where(pos, logf, 0.0)), 0.0)
    w2 = (1 - a) * np.exp(logterm - top - logs) * ds
    return top, float(np.sum(integrand * weight)), integrand, w1, w2


def _grid_sizes(d: int, grid_size: int):
    return {1: grid_size, 2: 256, 3: 80}[d]


def _estimates(x, y, order, discrete, tau, eta, h, grid_size, directions, h_var=None,
               bias_correction: bool = True):
    """D̂ and σ̂_D for (x ‖ y) and, when asked, (y ‖ x), from one pair of samples.

    For densities, D̂ uses the (undersmoothed) bandwidth ``h`` and σ̂ the densities at
    ``h_var`` (default ``h``): the variance is a smooth nuisance functional, best
    estimated at the ordinary rule-of-thumb bandwidth; at the undersmoothed one the
    noise of f̂, ĝ in the tails inflates it (subsampled Gaussian, α = 3: σ̂ 20% above
    the spread of D̂ over repetitions).
    """
    out = []
    var_dens = None
    if discrete:
        cats, (cx, cy) = categorize(x, y)
        k = len(cats)
        fx, fy = frequencies(cx, k), frequencies(cy, k)
        weight = np.ones(k)
        noise = 1.0
    else:
        pooled = np.vstack([x, y])
        pad = 6 * (h if h_var is None else np.maximum(h, h_var))
        lo, hi = pooled.min(axis=0) - pad, pooled.max(axis=0) + pad
        d = x.shape[1]
        sizes = np.minimum(np.maximum(_grid_sizes(d, grid_size), np.ceil((hi - lo) / (h / 4)) + 1),
                           {1: 1 << 15, 2: 512, 3: 128}[d]).astype(int)
        grid = make_grid(lo, hi, sizes)
        fx, fy = binned_kde(x, h, grid).ravel(), binned_kde(y, h, grid).ravel()
        weight = np.full(fx.size, grid.cell)
        noise = GAUSS_R ** d / float(np.prod(h))
        if h_var is not None and not np.allclose(h_var, h):
            var_dens = binned_kde(x, h_var, grid).ravel(), binned_kde(y, h_var, grid).ravel()
    for forward in directions:
        f, g, nf, ng = (fx, fy, len(x), len(y)) if forward else (fy, fx, len(y), len(x))
        vd = None if var_dens is None else (var_dens if forward else var_dens[::-1])
        out.append(floored_divergence(f, g, weight, order, tau, eta, nf, ng, vd,
                                      noise if bias_correction else None))
    return out


#: outputs per database when neither a size nor a time budget is given
DEFAULT_N = 100000
#: most outputs per database under a time budget (a 2-d KDE of 10^7 outputs holds ~0.5 GB)
MAX_BUDGET_N = 10**7


@one_blas_thread
def renyi(mechanism, pairs=None, order: float = 2.0, n: int | None = None, alpha: float = 0.05, rng=None,
          *, params: dict | None = None, tau: float | None = None, eta: float | None = None,
          discrete: bool | None = None, bandwidth=None, undersmooth: float = UNDERSMOOTH,
          grid_size: int = GRID, both_directions: bool = True, bias_correction: bool = True,
          time_budget: float | None = None,
          progress: Callable[[str, int, int], None] | None = None, threads: int | None = None) -> RenyiResult:
    """Lower confidence bound on the Rényi divergence of order ``order`` over ``pairs``.

    Parameters
    ----------
    mechanism : sampler ``f(database, size, rng)``, built-in name, ``"module:function"`` or Mechanism.
    pairs : list of (x, x′), ``"patterns"``, or None for the mechanism's default pairs.
    order : α > 1.
    n : outputs per database (default 100000, or chosen by ``time_budget``).
    alpha : error level of the bound (P(LB ≤ D_α) ≈ 1 − alpha for large n).
    rng : numpy Generator or seed (None: fresh randomness).
    tau, eta : floor of the denominator density and sharpness of the floor (default
        τ = 20/n for frequencies, 4·R(K)^d/(n Π h) for densities (≈ 2·10^-4 per unit
        output spread at n = 10^5), both times max(1, α(α − 1)/6); η = 10/τ).
    discrete : force relative frequencies (True) or KDE (False); default: detect.
    bandwidth : KDE bandwidth per dimension (default 1.06 σ̂ n^{-1/5} · n^{-undersmooth}).
    both_directions : audit D_α(M(x) ‖ M(x′)) and D_α(M(x′) ‖ M(x)) (RDP bounds both).
    bias_correction : remove the second-order bias of D̂ (module doc); False is the estimator of
        docs/method.md#92-renyi-dp-lower-bound without it.
    time_budget : seconds; instead of n, choose n so that the audit takes about this long (module
        :mod:`empdp.audit.budget`: n depends on the machine's speed, is reported in ``sizes``,
        and gives the same result again with the same seed).
    progress : optional callback ``progress(stage, done, total)``.
    threads : threads drawing outputs at once (default: every core for the built-ins, one for a user's
        sampler, which must be thread-safe to be given more); the outputs do not depend on it.
    """
    mechanism, params = load_mechanism(mechanism, params, threads), None  # (its parameters are in it now)
    sizes = given_sizes({"n, --sample-size": n}, time_budget)
    args = (mechanism, pairs, order)
    kwargs = dict(alpha=alpha, params=params, tau=tau, eta=eta, discrete=discrete, bandwidth=bandwidth,
                  undersmooth=undersmooth, grid_size=grid_size, both_directions=both_directions,
                  bias_correction=bias_correction)
    if time_budget is not None:
        plan = _resolve(mechanism, pairs, order, DEFAULT_N, alpha, params, tau, eta, discrete, bandwidth,
                        undersmooth, grid_size, both_directions, bias_correction)
        exact_or_none(plan.mech.true_renyi_over, plan.order, plan.pairs, len(plan.directions) == 2)  # cached

        def run(size, pilot_rng):
            renyi(*args, n=size, rng=pilot_rng, **kwargs)

        n, sizes = size_for_budget(run, check_budget(time_budget), PILOT_SIZES[-1], MAX_BUDGET_N)
    res = _run(*args, n=DEFAULT_N if n is None else n, rng=rng, progress=progress, **kwargs)
    res.sizes = {**sizes, "sample_size": res.sample_size}
    return res


def _run(mechanism, pairs, order, n, alpha, rng, params, tau, eta, discrete, bandwidth, undersmooth,
         grid_size, both_directions, bias_correction, progress) -> RenyiResult:
    plan = _resolve(mechanism, pairs, order, n, alpha, params, tau, eta, discrete, bandwidth, undersmooth,
                    grid_size, both_directions, bias_correction)
    rng = as_rng(rng)
    report = progress or _no_progress
    candidates: list[dict] = []
    if len(plan.pairs) * len(plan.directions) == 1:
        selection, finalists = "single", [(0, True)]
    else:
        selection, finalists = "pilot", _pilot(plan, rng, report, candidates)
    best = _final(plan, finalists, rng, report, candidates)
    return _result(plan, best, selection, candidates)


@dataclass(frozen=True)
class _Plan:
    """The checked inputs of one Rényi run."""

    mech: Mechanism
    pairs: list
    order: float
    n: int
    alpha: float
    tau: float | None
    eta: float | None
    discrete: bool | None
    bandwidth: object
    undersmooth: float
    grid_size: int
    directions: tuple  # True: D_α(M(x) ‖ M(x′)); False: the reverse
    bias_correction: bool

    @property
    def floor_growth(self) -> float:
        """max(1, α(α − 1)/6): both floors grow with the order (FLOOR_ORDER_BASE)."""
        return max(1.0, self.order * (self.order - 1) / FLOOR_ORDER_BASE)


@dataclass
class _Samples:
    """One pair's outputs, ready to estimate: the estimator, bandwidths and floor they call for."""

    discrete: bool
    x: np.ndarray
    y: np.ndarray
    h: np.ndarray | None  # bandwidth of D̂ (densities)
    h_var: np.ndarray | None  # bandwidth of σ̂ (densities)
    tau: float
    eta: float


@dataclass
class _Bound:
    """A finalist's bound D̂ − z σ̂_D, with what the result and its warnings report."""

    lower_bound: float
    divergence: Divergence
    pair_index: int
    forward: bool
    samples: _Samples


def _resolve(mechanism, pairs, order, n, alpha, params, tau, eta, discrete, bandwidth, undersmooth, grid_size,
             both_directions, bias_correction) -> _Plan:
    """Check the inputs once."""
    mech = load_mechanism(mechanism, params)
    pairs = resolve_pairs(mech, pairs, "renyi")
    order = check_order(order)
    n = check_size("n", n, 50)
    alpha = check_level(alpha)
    if tau is not None and not (isinstance(tau, (int, float)) and tau > 0):
        raise InputError(f"tau must be a positive number, got {tau!r}")
    if eta is not None and not (isinstance(eta, (int, float)) and eta > 0):
        raise InputError(f"eta must be a positive number, got {eta!r}")
    return _Plan(mech=mech, pairs=pairs, order=order, n=n, alpha=alpha, tau=tau, eta=eta, discrete=discrete,
                 bandwidth=bandwidth, undersmooth=undersmooth, grid_size=grid_size,
                 directions=(True, False) if both_directions else (True,), bias_correction=bias_correction)


def _sample(plan: _Plan, pair, size: int, rng) -> _Samples:
    """``size`` fresh outputs of each database of ``pair``, with the estimator settings they call for."""
    xs = draw(plan.mech, pair[0], size, rng)
    ys = draw(plan.mech, pair[1], size, rng)
    disc = detect_discrete(np.concatenate([np.ravel(xs), np.ravel(ys)]), plan.discrete)
    x, y = as_samples(xs), as_samples(ys)
    h = h_var = None
    if disc:
        t = plan.tau if plan.tau is not None else TAU_COUNTS * plan.floor_growth / len(x)
    else:
        x, y = x.astype(float), y.astype(float)
        d = continuous_dim(x)
        if plan.bandwidth is not None:
            h = h_var = np.broadcast_to(np.asarray(plan.bandwidth, float), (d,))
        else:
            u = plan.undersmooth
            h = (rule_of_thumb(x, undersmooth=u) + rule_of_thumb(y, undersmooth=u)) / 2
            h_var = h * len(x) ** (u - VAR_UNDERSMOOTH)
        t = plan.tau if plan.tau is not None else \
            TAU_NOISE * plan.floor_growth * GAUSS_R ** d / (len(x) * float(np.prod(h)))
    e = plan.eta if plan.eta is not None else ETA_FACTOR / t
    return _Samples(disc, x, y, h, h_var, t, e)


def _divergences(plan: _Plan, smp: _Samples, directions) -> list[Divergence]:
    return _estimates(smp.x, smp.y, plan.order, smp.discrete, smp.tau, smp.eta, smp.h, plan.grid_size,
                      directions, smp.h_var, plan.bias_correction)


def _direction(forward: bool) -> str:
    return "x||x'" if forward else "x'||x"


def _pilot(plan: _Plan, rng, report, candidates: list) -> list:
    """Every (pair, direction) on n/5 fresh outputs; the finalists, (pair index, forward) pairs:
    those whose pilot D̂ ± PILOT_Z σ̂ reaches the best pilot lower end, at most MAX_FINALISTS."""
    t_start = time.perf_counter()
    pairs = plan.pairs
    n_sel = max(50, plan.n // 5)
    stage = f"Renyi pilot: {len(pairs)} pairs x 2 x {n_sel:,} outputs"
    report(stage, 0, len(pairs))
    pilot = []  # (D̂, σ̂, pair index, forward)
    for b, pair in enumerate(pairs):
        smp = _sample(plan, pair, n_sel, rng)
        for fwd, div in zip(plan.directions, _divergences(plan, smp, plan.directions)):
            pilot.append((div.estimate, div.sigma, b, fwd))
            candidates.append({"pair_index": b, "direction": _direction(fwd),
                               "estimate": div.estimate, "sigma": div.sigma, "stage": "pilot"})
        report(stage, b + 1, len(pairs))
    floor_best = max(D - PILOT_Z * s for D, s, _, _ in pilot)
    alive = sorted((c for c in pilot if c[0] + PILOT_Z * c[1] >= floor_best), key=lambda c: -c[0])
    finalists = [(b, fwd) for _, _, b, fwd in alive[:MAX_FINALISTS]]
    log.info("Renyi pilot: %d candidates from %d pairs x 2 x %d outputs in %.2f s; %d kept",
             len(pilot), len(pairs), n_sel, time.perf_counter() - t_start, len(finalists))
    return finalists


def _final(plan: _Plan, finalists: list, rng, report, candidates: list) -> _Bound:
    """n fresh outputs per database for the finalists, which share the level (Bonferroni): the best bound."""
    z = _normal_quantile(1 - plan.alpha / len(finalists))
    t_start = time.perf_counter()
    final_pairs = sorted({b for b, _ in finalists})
    stage = f"Renyi bound: {len(final_pairs)} pairs x 2 x {plan.n:,} outputs"
    report(stage, 0, len(final_pairs))
    best = None
    for k, b in enumerate(final_pairs):
        dirs = tuple(fwd for fwd in plan.directions if (b, fwd) in finalists)
        smp = _sample(plan, plan.pairs[b], plan.n, rng)
        for fwd, div in zip(dirs, _divergences(plan, smp, dirs)):
            lb = div.estimate - z * div.sigma
            candidates.append({"pair_index": b, "direction": _direction(fwd), "estimate": div.estimate,
                               "sigma": div.sigma, "lower_bound": lb, "stage": "final"})
            if best is None or lb > best.lower_bound:
                best = _Bound(lb, div, b, fwd, smp)
        report(stage, k + 1, len(final_pairs))
    log.info("Renyi bound: %d candidate(s) at level alpha/%d, %d pairs x 2 x %d outputs, %s, in %.2f s",
             len(finalists), len(finalists), len(final_pairs), plan.n,
             "frequencies" if best.samples.discrete else "binned KDE", time.perf_counter() - t_start)
    return best


def _result(plan: _Plan, best: _Bound, selection: str, candidates: list) -> RenyiResult:
    """The best finalist's bound, its warnings and the exact value when known."""
    div, smp = best.divergence, best.samples
    warnings = []
    if div.rel_se > REL_SE_WARN or (plan.bias_correction and not div.corrected):
        warnings.append(f"the estimated integral has a relative standard error of {div.rel_se:.2g}: at order "
                        f"{plan.order:g} and n = {plan.n:,} it rests on a few outputs, the normal approximation "
                        "behind the bound is poor" + ("" if div.corrected or not plan.bias_correction else
                                                      " and the bias correction was not applied")
                        + "; increase n or lower the order")
    if div.floor_share > 0.05:
        warnings.append(f"{div.floor_share:.0%} of the estimated integral comes from outputs where the "
                        f"denominator density is below the floor tau = {smp.tau:.3g}: the bound is loose "
                        "there; more samples would tighten it (docs/method.md#115-the-audits-are-asymptotic)")
    x_db, y_db = plan.pairs[best.pair_index]
    true_value = exact_or_none(plan.mech.true_renyi_over, plan.order, plan.pairs, len(plan.directions) == 2)
    return RenyiResult(
        lower_bound=float(best.lower_bound), estimate=float(div.estimate), order=plan.order,
        pair=(x_db, y_db) if best.forward else (y_db, x_db), pair_index=best.pair_index,
        direction=_direction(best.forward), sigma=float(div.sigma), sample_size=plan.n, alpha=plan.alpha,
        discrete=smp.discrete, tau=float(smp.tau), eta=float(smp.eta),
        bandwidth=None if smp.h is None else [float(v) for v in smp.h],
        selection=selection, bias_corrected=plan.bias_correction and div.corrected, true_value=true_value,
        candidates=candidates, warnings=warnings)


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def _normal_quantile(p: float) -> float:
    """Φ⁻¹(p) (the standard library's, to 1e-15; scipy.stats would cost the command ~0.5 s to import)."""
    return NormalDist().inv_cdf(float(p))


def _special():
    """scipy.special, imported on first use (it costs an audit command ~0.4 s that MPL never needs)."""
    from scipy import special

    return special
