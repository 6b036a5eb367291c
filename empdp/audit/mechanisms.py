"""Reference mechanisms for the audits (docs/method.md#93-reference-mechanisms) and loading of user samplers.

The built-ins' samplers are in :mod:`empdp.audit.samplers`; this module pairs
them with their defaults, pairs, regions and true values.

A mechanism is a sampler ``f(database, size, rng) -> array`` of shape (size,)
or (size, d). A database is a number or a list of numbers; the additive-noise
mechanisms release the sum of its entries. Each built-in carries its
parameters, the papers' default pairs, its evaluation region for MPL and its
true privacy values (module ``truth``): the mechanism carries its privacy
relation (STYLE 6) so the tests and the validation script can check
coverage P(LB ≤ truth) and tightness LB / truth.

Sources: Askin, Kutta, Dette 2022, section V (MPL suite); Kutta, Askin,
Dunsche 2024, section IV (Rényi suite); Lyu, Su, Li 2017 (SVT variants).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from ..params import threads as check_threads
from . import samplers, sniper, truth
from .common import one_line, short
from .patterns import answer_counts, neighbour_pairs, scale_pairs, statdp_patterns
from .samplers import stat as _stat
from .samplers import vec as _vec

Sampler = Callable[[Any, int, np.random.Generator], np.ndarray]


@dataclass
class Mechanism:
    """A sampler with its defaults and (for built-ins) its true privacy values.

    ``epsilon`` is the mechanism's pure-DP ε over all adjacent inputs
    (``math.inf`` when it is not ε-DP for any ε, None when unknown).
    ``pair_epsilon(x, x2)`` and ``renyi_divergence(order, x, x2)`` (the
    divergence D_α(M(x) ‖ M(x2))) are exact values for one pair, when known.
    ``feature(x, x2, outputs)`` is an optional per-pair post-processing that MPL
    applies before estimating (a sufficient statistic for the pair, see
    :func:`answer_counts`); post-processing never raises ε, so the bound stays valid.
    ``inputs`` says what a database is, for checking pairs: ``"queries"`` (a vector
    of query answers, compared entry by entry; StatDP patterns apply), ``"bits"``
    (a 0/1 vector, compared entry by entry), ``"records"`` (one value per
    individual, of which a statistic is released) or None (a user sampler: any
    numbers, any lengths). ``input_length`` is the vector length the mechanism is
    calibrated for, if it has one. ``threads`` is how many threads may call the
    sampler at once, each on its own part of a draw with its own generator
    (:func:`empdp.audit.common.draw`): None is every core (the built-ins and the
    releases), 1 a user's sampler unless its user says it is thread-safe.
    ``ours`` marks empdp's own samplers (the built-ins and the releases'): their failure is an
    internal error, where a user's sampler failing is bad input (:func:`empdp.audit.common.draw`).
    """

    name: str
    sampler: Sampler
    params: dict = field(default_factory=dict)
    mpl_pairs: list | None = None
    renyi_pairs: list | None = None
    region: tuple | None = None
    epsilon: float | None = None
    pair_epsilon: Callable | None = None
    renyi_divergence: Callable | None = None
    pattern_dim: int | None = None
    ordered_queries: bool = False
    feature: Callable | None = None
    inputs: str | None = None
    input_length: int | None = None
    threads: int | None = 1
    ours: bool = False

    def __call__(self, database, size, rng):
        return self.sampler(database, size, rng)

    def true_epsilon_over(self, pairs) -> float | None:
        """max over ``pairs`` of the exact ε_{x,x'} (None if not computable)."""
        if self.pair_epsilon is None:
            return None
        return _cached(("eps", self.name, repr(sorted(self.params.items())), repr(pairs)),
                       lambda: _max_known(self.pair_epsilon(x, y) for x, y in pairs))

    def true_renyi_over(self, order: float, pairs, both_directions: bool = True) -> float | None:
        """max over ``pairs`` (and both directions) of the exact D_α (None if unknown)."""
        if self.renyi_divergence is None:
            return None

        def compute():
            vals = [self.renyi_divergence(order, x, y) for x, y in pairs]
            if both_directions:
                vals += [self.renyi_divergence(order, y, x) for x, y in pairs]
            return _max_known(vals)

        key = ("renyi", self.name, repr(sorted(self.params.items())), repr(pairs), order, both_directions)
        return _cached(key, compute)


_EXACT: dict = {}


def _max_known(values) -> float | None:
    """The maximum of exact per-pair values, where a pair may be unknown (None).

    One infinite value makes the maximum ∞ whatever the unknown ones are;
    otherwise an unknown value makes it unknown.
    """
    values = list(values)
    if any(v is not None and math.isinf(v) for v in values):
        return math.inf
    if any(v is None for v in values):
        return None
    return max(values)


def _cached(key, compute):
    """Exact values are costly (quadrature); repeated audits of one mechanism reuse them."""
    if key not in _EXACT:
        if len(_EXACT) > 4096:
            _EXACT.clear()
        _EXACT[key] = compute()
    return _EXACT[key]


# ----------------------------------------------------------------------------- default pairs

def _laplace_pairs(sensitivity=1.0):
    return scale_pairs([(0.0, b / 10) for b in range(1, 11)], sensitivity)


_PAPER_RENYI_PAIR = [([0.0] * 10, [1.0] + [0.0] * 9)]  # Kutta et al. 2024, eq. (21)


def _paper_renyi_pair(sensitivity=1.0):
    """Kutta et al.'s pair with the changed individual contributing the sensitivity."""
    return scale_pairs(_PAPER_RENYI_PAIR, sensitivity)


def _scaled_region(region, sensitivity):
    """The evaluation region C in units of the sensitivity (the output scales with it)."""
    return region if sensitivity == 1 else tuple(v * sensitivity for v in region)


# ----------------------------------------------------------------------------- registry

_DEFAULTS: dict[str, dict[str, float]] = {
    "laplace": {"epsilon": 1.0, "sensitivity": 1.0},
    "gaussian": {"sigma": 1.0, "sensitivity": 1.0},
    "noisy_max": {"epsilon": 1.0, "sensitivity": 1.0},
    "noisy_max_value": {"epsilon": 1.0, "sensitivity": 1.0},
    "exponential": {"epsilon": 1.0},
    "svt2": {"epsilon": 1.0, "sensitivity": 1.0},
    "svt4": {"epsilon": 1.0, "sensitivity": 1.0},
    "svt5": {"epsilon": 1.0, "sensitivity": 1.0},
    "svt6": {"epsilon": 1.0, "sensitivity": 1.0},
    "randomized_response": {"p": 0.75},
    "shuffled_rr": {"p": 0.75},
    "subsampled_laplace": {"epsilon": 1.0, "q": 0.2, "sensitivity": 1.0},
    "subsampled_gaussian": {"sigma": 1.0, "q": 0.2, "sensitivity": 1.0},
    "noisy_gd": {"sigma": 0.1, "lr": 0.1, "steps": 20},
    # DP-Sniper's suite (Bichsel et al. 2021) with its parameters; its Laplace, ReportNoisyMax1,
    # SVT2, SVT4, SVT5 and SVT6 are laplace, noisy_max, svt2, svt4, svt5 and svt6 above (DPSNIPER_SUITE)
    "truncated_geometric": {"epsilon": 0.1, "n": 5},
    "noisy_hist1": {"epsilon": 0.1},
    "noisy_hist2": {"epsilon": 0.1},
    "report_noisy_max2": {"epsilon": 0.1},
    "report_noisy_max3": {"epsilon": 0.1, "queries": 5},
    "report_noisy_max4": {"epsilon": 0.1, "queries": 5},
    "svt1": {"epsilon": 0.1, "c": 1, "threshold": 0.5},
    "svt3": {"epsilon": 0.1, "c": 1, "threshold": 1.0},
    "rappor": {"hashes": 4, "filter_size": 20, "f": 0.75, "p": 0.45, "q": 0.55},
    "one_time_rappor": {"hashes": 4, "filter_size": 20, "f": 0.95},
    "laplace_parallel": {"epsilon": 0.005, "copies": 20},
    "svt34_parallel": {"epsilon": 0.1, "c": 2, "threshold": 1.0},
    "prefix_sum": {"epsilon": 0.1, "queries": 10},
    "numerical_svt": {"epsilon": 0.1, "c": 2, "threshold": 1.0},
}

BUILTIN_NAMES = tuple(_DEFAULTS)

#: most noisy_gd steps audited: the sampler costs steps × outputs (10^12 steps ran for hours)
MAX_STEPS = 10_000
#: range of the scale parameters (epsilon, sigma, sensitivity): beyond it the noise scale or the
#: outputs overflow or underflow a double
PARAM_RANGE = (1e-100, 1e100)


#: integer parameters and their largest values: noisy_gd's steps, the truncated geometric's n (count
#: range), the Sparse Vector variants' c (answers above before abort; the exact laws enumerate the
#: outcomes), the number of queries or parallel copies, RAPPOR's hashes and Bloom filter size
INTEGER_PARAMS = {"steps": MAX_STEPS, "n": 1000, "c": 10, "queries": 1000, "copies": 1000, "hashes": 64,
                  "filter_size": 1000}


def _check_sniper_params(name: str, p: dict) -> None:
    """Ranges of the DP-Sniper mechanisms' own parameters (the common ones are checked in ``builtin``)."""
    if name == "truncated_geometric" and not 1e-9 <= p["epsilon"] < 2:
        raise InputError(f"parameter epsilon={p['epsilon']:g} of truncated_geometric must be in [1e-9, 2): "
                         "its noise ratio is 2^-k with k = ceil(ln(2/epsilon)) >= 1")
    if "f" in p and not 0 < p["f"] <= 1:
        raise InputError(f"parameter f (RAPPOR's permanent randomization) must be in (0, 1], got {p['f']:g}")
    if name == "rappor":
        for key in ("p", "q"):
            if not 0 < p[key] < 1:
                raise InputError(f"parameter {key} (RAPPOR's instantaneous report probability) must be in (0, 1), "
                                 f"got {p[key]:g}")
    if "c" in p and "queries" in p and p["c"] > p["queries"]:
        raise InputError(f"parameter c={p['c']:g} exceeds queries={p['queries']:g}")


def builtin(name: str, **params) -> Mechanism:
    """A built-in reference mechanism by name, with parameters overriding the defaults."""
    if name not in _DEFAULTS:
        raise InputError(f"unknown mechanism {short(name)}; built-ins: {', '.join(BUILTIN_NAMES)}"
                         " (or give module:function)")
    unknown = set(params) - set(_DEFAULTS[name])
    if unknown:
        raise InputError(f"mechanism {name!r} has no parameter {short(sorted(unknown)[0])}; "
                         f"valid: {', '.join(_DEFAULTS[name])}")
    p = {**_DEFAULTS[name], **params}
    for key, value in p.items():
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise InputError(f"parameter {key}={short(value)} must be a finite number")
    for key in ("epsilon", "sigma", "sensitivity", "lr"):
        if key in p and p[key] <= 0:
            raise InputError(f"parameter {key} must be > 0, got {p[key]:g}")
    for key in ("epsilon", "sigma", "sensitivity"):
        if key in p and not PARAM_RANGE[0] <= p[key] <= PARAM_RANGE[1]:
            raise InputError(f"parameter {key}={p[key]:g} is outside [{PARAM_RANGE[0]:g}, {PARAM_RANGE[1]:g}], "
                             f"where the noise scale and the outputs overflow or vanish in double precision")
    if "lr" in p and p["lr"] >= 2:
        raise InputError(f"parameter lr={p['lr']:g} must be below 2: gradient descent on the quadratic loss "
                         f"diverges for lr >= 2 (its outputs overflow)")
    if "lr" in p and p["lr"] < PARAM_RANGE[0]:
        raise InputError(f"parameter lr={p['lr']:g} is below {PARAM_RANGE[0]:g}, where the steps vanish in "
                         f"double precision")
    if "q" in p and not 0 < p["q"] <= 1:
        raise InputError(f"parameter q (subsampling rate) must be in (0, 1], got {p['q']}")
    if "p" in p and name in ("randomized_response", "shuffled_rr") and not 0.5 < p["p"] < 1:
        raise InputError(f"parameter p (keep probability) must be in (0.5, 1), got {p['p']}")
    _check_sniper_params(name, p)
    if "steps" in p and p["steps"] > MAX_STEPS:
        raise InputError(f"parameter steps={p['steps']:g} is over {MAX_STEPS:,}: each step redraws every sampled "
                         f"output, so the audit would take {p['steps'] / 300:.2g} s or more (1,000 steps take "
                         f"~3 s at the default sample sizes); audit at most {MAX_STEPS:,} steps")
    for key, cap in INTEGER_PARAMS.items():
        if key in p and (p[key] < 1 or int(p[key]) != p[key] or p[key] > cap):
            raise InputError(f"parameter {key} must be an integer in [1, {cap:,}], got {p[key]:g}")
    return replace(_BUILDERS[name](p), threads=None, ours=True)


# Default pairs and regions scale with the ``sensitivity`` parameter: adjacent inputs
# differ by at most the sensitivity, so the pairs stay neighbouring and the exact ε or
# D_α over them is the mechanism's (``scale_pairs``). At sensitivity 1 they are the papers'.

def _build_laplace(p):
    eps, sens = p["epsilon"], p["sensitivity"]
    return Mechanism(
        "laplace", samplers.laplace(eps, sens), p, _laplace_pairs(sens), _paper_renyi_pair(sens),
        _scaled_region((-1.0, 1.0), sens), eps, inputs="records",
        pair_epsilon=lambda x, y: abs(_stat(x) - _stat(y)) * eps / sens,
        renyi_divergence=lambda a, x, y: truth.laplace_renyi(a, abs(_stat(x) - _stat(y)) * eps / sens))


def _build_gaussian(p):
    sens = p["sensitivity"]
    sd = p["sigma"] * sens
    return Mechanism(
        "gaussian", samplers.gaussian(p["sigma"], sens), p, _laplace_pairs(sens), _paper_renyi_pair(sens),
        _scaled_region((-1.0, 1.0), sens), math.inf, inputs="records",
        pair_epsilon=lambda x, y: math.inf if _stat(x) != _stat(y) else 0.0,
        renyi_divergence=lambda a, x, y: truth.gaussian_renyi(a, abs(_stat(x) - _stat(y)), sd))


def _build_noisy_max(p):
    scale = 2.0 * p["sensitivity"] / p["epsilon"]
    return Mechanism(
        "noisy_max", samplers.noisy_max(p["epsilon"], p["sensitivity"]), p,
        statdp_patterns(6, sensitivity=p["sensitivity"]), None, None,
        p["epsilon"], pattern_dim=6, inputs="queries",
        pair_epsilon=lambda x, y: truth.discrete_epsilon(truth.noisy_max_pmf(x, scale),
                                                         truth.noisy_max_pmf(y, scale)))


def _build_noisy_max_value(p):
    k = 3
    sens = p["sensitivity"]
    pairs = scale_pairs([((0.0,) * k, (b / 10,) * k) for b in range(1, 11)], sens)
    return Mechanism(
        "noisy_max_value", samplers.noisy_max_value(p["epsilon"], sens, k), p, pairs, None,
        _scaled_region((-1.0, 1.0), sens), p["epsilon"], pattern_dim=k, inputs="queries", input_length=k,
        pair_epsilon=lambda x, y: truth.noisy_max_value_epsilon(x, y, k * sens / p["epsilon"]))


def _build_exponential(p):
    lam = truth.exponential_lambda(p["epsilon"])
    pairs = [(1.0, 1.0 + b / 10) for b in range(1, 11)]
    return Mechanism(
        "exponential", samplers.exponential(p["epsilon"]), p, pairs, None, (0.0, 2.0), p["epsilon"],
        inputs="records",
        pair_epsilon=lambda x, y: truth.exponential_pair_epsilon(_stat(x), _stat(y), lam))


def _build_svt(variant):
    def build(p):
        eps, sens = p["epsilon"], p["sensitivity"]
        pair = renyi_div = None
        if variant in (2, 4):
            if variant == 4:
                e4 = eps * 4.0 / 7.0
                rho, nu = sens / (e4 / 4), sens / (e4 * 3 / 4)
            else:
                rho, nu = 2 * sens / eps, 4 * sens / eps

            def pair(x, y, rho=rho, nu=nu):
                return truth.discrete_epsilon(truth.svt_pmf(x, rho, nu), truth.svt_pmf(y, rho, nu))
        elif variant == 5:  # no query noise: the answers are a cut of the queries (exact law)
            def pair(x, y, rho=2 * sens / eps):
                return truth.svt5_pair_values(x, y, rho)

            def renyi_div(a, x, y, rho=2 * sens / eps):
                return truth.svt5_pair_values(x, y, rho, order=a)
        elif variant == 6:  # every answer vector is possible under every input: finite for fixed m
            def pair(x, y, rho=2 * sens / eps):
                return sniper.svt_free_pair_epsilon(x, y, rho, rho, 1.0)
        # SVT6's D_α is not computed here.
        return Mechanism(f"svt{variant}", samplers.svt(variant, eps, 1.0, 1, sens), p,
                         statdp_patterns(10, ordered=True, sensitivity=sens),
                         None, None, eps if variant in (2, 4) else math.inf, pair_epsilon=pair,
                         renyi_divergence=renyi_div, pattern_dim=10, ordered_queries=True,
                         feature=answer_counts if variant in (5, 6) else None, inputs="queries")

    return build


def _build_rr(p):
    pr = p["p"]
    return Mechanism(
        "randomized_response", samplers.randomized_response(pr), p, [(0, 1)], [(0, 1)], None,
        math.log(pr / (1 - pr)), inputs="bits",
        pair_epsilon=lambda x, y: truth.discrete_epsilon(truth.rr_pmf(x, pr), truth.rr_pmf(y, pr)),
        renyi_divergence=lambda a, x, y: truth.discrete_renyi(a, truth.rr_pmf(x, pr), truth.rr_pmf(y, pr)))


def _build_shuffled_rr(p):
    pr = p["p"]
    pair = [([0] * 10, [1] + [0] * 9)]
    # post-processing of local RR, so ε ≤ ln(p/(1−p)); attained at the output "no ones"
    # for any pair differing in one bit: P_x(0)/P_x'(0) = p/(1−p)
    return Mechanism(
        "shuffled_rr", samplers.shuffled_rr(pr), p, pair, pair, None, math.log(pr / (1 - pr)), inputs="bits",
        pair_epsilon=lambda x, y: truth.discrete_epsilon(truth.shuffled_rr_pmf(x, pr),
                                                         truth.shuffled_rr_pmf(y, pr)),
        renyi_divergence=lambda a, x, y: truth.discrete_renyi(
            a, truth.shuffled_rr_pmf(x, pr), truth.shuffled_rr_pmf(y, pr)))


def _build_subsampled(noise):
    def build(p):
        if noise == "laplace":
            scale = p["sensitivity"] / p["epsilon"]
            eps = math.log1p(p["q"] * math.expm1(p["epsilon"]))
        else:
            scale = p["sigma"] * p["sensitivity"]
            eps = math.inf
        sens = p["sensitivity"]
        return Mechanism(
            f"subsampled_{noise}",
            samplers.subsampled(noise, p["q"], p.get("epsilon", 1.0), p.get("sigma", 1.0), sens),
            p, _paper_renyi_pair(sens), _paper_renyi_pair(sens), _scaled_region((-2.0, 3.0), sens), eps,
            inputs="records",
            pair_epsilon=(lambda x, y: truth.mixture_epsilon(noise, x, y, p["q"], scale))
            if noise == "laplace" else None,
            renyi_divergence=lambda a, x, y: truth.mixture_renyi(noise, a, x, y, p["q"], scale))

    return build


def _build_noisy_gd(p):
    def div(a, x, y):
        with np.errstate(all="ignore"):  # a vanishing sd gives D = inf, which is the truth
            mu_x, sd = truth.noisy_gd_moments(_vec(x).mean(), p["sigma"], p["lr"], int(p["steps"]))
            mu_y, _ = truth.noisy_gd_moments(_vec(y).mean(), p["sigma"], p["lr"], int(p["steps"]))
            return truth.gaussian_renyi(a, abs(mu_x - mu_y), sd)

    return Mechanism("noisy_gd", samplers.noisy_gd(p["sigma"], p["lr"], p["steps"]), p, _PAPER_RENYI_PAIR,
                     _PAPER_RENYI_PAIR, None, math.inf, renyi_divergence=div, inputs="records")


# ----------------------------------------------------------------------------- DP-Sniper's suite
# Definitions, parameters and pairs of Bichsel et al. 2021 (``dpsniper/mechanisms``,
# ``dpsniper/experiments/exp_default.py``); the samplers and exact laws are in ``sniper``.

def _build_truncated_geometric(p):
    eps, n = p["epsilon"], int(p["n"])
    laws = [sniper.truncated_geometric_pmf(c, eps, n) for c in range(n + 1)]
    # Balcer and Vadhan 2018, Thm 4.7: ln(1 + 2^-k); the exact maximum over adjacent counts
    true_eps = max(truth.discrete_epsilon(laws[c], laws[c + 1]) for c in range(n)) if n > 0 else 0.0
    return Mechanism(
        "truncated_geometric", sniper.truncated_geometric(eps, n), p, neighbour_pairs(1), None,
        None, true_eps, inputs="records",
        pair_epsilon=lambda x, y: truth.discrete_epsilon(laws[sniper._count(x, n)], laws[sniper._count(y, n)]))


def _build_noisy_hist(variant):
    def build(p):
        scale = 1.0 / p["epsilon"] if variant == 1 else p["epsilon"]  # NoisyHist2 divides where it should not
        return Mechanism(f"noisy_hist{variant}", sniper.noisy_hist(scale), p, neighbour_pairs(5), None, None,
                         1.0 / scale, inputs="histogram",
                         pair_epsilon=lambda x, y: float(np.abs(_vec(x) - _vec(y)).sum()) / scale)

    return build


def _build_report_noisy_max(variant):
    noise = "laplace" if variant == 3 else "exponential"

    def build(p):
        eps, scale = p["epsilon"], 2.0 / p["epsilon"]
        k = int(p.get("queries", 5))
        if variant == 2:  # argmax of exponential noise: ε-DP
            true_eps = eps

            def pair(x, y):
                return truth.discrete_epsilon(sniper.noisy_max_exponential_pmf(x, scale),
                                              sniper.noisy_max_exponential_pmf(y, scale))
        elif variant == 3:  # the max value: every one of the k densities moves (Askin et al. 2022, Example 1)
            true_eps = k * eps / 2

            def pair(x, y):
                return truth.noisy_max_value_epsilon(x, y, scale)
        else:  # the max of exponential noise: supports [max q, ∞) differ
            true_eps, pair = math.inf, sniper.noisy_max_exponential_value_epsilon
        output = "index" if variant == 2 else "value"
        return Mechanism(f"report_noisy_max{variant}", sniper.report_noisy_max(eps, noise, output), p,
                         statdp_patterns(k), None, None, true_eps, pair_epsilon=pair, pattern_dim=k,
                         inputs="queries", input_length=None if variant == 2 else k)

    return build


def _svt_pair(rho_scale, nu_scale, threshold, c):
    """Exact ε of an aborting SVT on a pair, from the law of its answers (None when too many outcomes)."""
    def pair(x, y):
        m = _vec(x).size
        if sum(math.comb(m, j) for j in range(c + 1)) > MAX_OUTCOMES:
            return None
        return sniper.law_epsilon(sniper.svt_abort_law(x, rho_scale, nu_scale, threshold, c),
                                  sniper.svt_abort_law(y, rho_scale, nu_scale, threshold, c))

    return pair


#: most outcomes an exact SVT law enumerates (beyond, the exact value is reported unknown)
MAX_OUTCOMES = 1 << 14


def _build_svt1(p):
    eps, c, t = p["epsilon"], int(p["c"]), p["threshold"]
    rho, nu = 2.0 / eps, 4.0 * c / eps  # Lyu et al. 2017, Alg. 1: ε1 = ε2 = ε/2, ν ~ Lap(2c/ε2)
    return Mechanism("svt1", sniper.svt_abort(eps, c, t, rho, nu), p, statdp_patterns(10), None, None, eps,
                     pair_epsilon=_svt_pair(rho, nu, t, c), pattern_dim=10, ordered_queries=True,
                     inputs="queries")


def _build_svt3(p, name="svt3", sampler=sniper.svt3, exact=sniper.svt3_pair_epsilon):
    """SVT3, or with the svt34_parallel arguments SVT3 and SVT4 side by side.

    Not ε-DP for any ε (Lyu et al. 2017): on (1, …, 1) against (2, …, 2) the output "the last c
    queries above, their values towards −∞" has loss m·ε/(2c), growing with the number of queries m.
    Over one pair the exact ε is finite (:func:`sniper.svt3_loss_range`).
    """
    eps, c, t = p["epsilon"], int(p["c"]), p["threshold"]

    def pair(x, y):
        m = _vec(x).size
        if sum(math.comb(m, j) for j in range(c + 1)) > MAX_OUTCOMES:
            return None
        return exact(x, y, eps, c, t)

    return Mechanism(name, sampler(eps, c, t), p, statdp_patterns(10), None, None, math.inf,
                     pair_epsilon=pair, pattern_dim=10, ordered_queries=True, inputs="queries")


def _build_svt34_parallel(p):
    return _build_svt3(p, "svt34_parallel", sniper.svt34_parallel, sniper.svt34_parallel_pair_epsilon)


def _build_numerical_svt(p):
    eps, c, t = p["epsilon"], int(p["c"]), p["threshold"]

    def pair(x, y):
        m = _vec(x).size
        if sum(math.comb(m, j) for j in range(c + 1)) > MAX_OUTCOMES:
            return None
        return sniper.numerical_svt_pair_epsilon(x, y, eps, c, t)

    return Mechanism("numerical_svt", sniper.numerical_svt(eps, c, t), p, statdp_patterns(10), None, None, eps,
                     pair_epsilon=pair, pattern_dim=10, ordered_queries=True, inputs="queries")


def _build_rappor(one_time):
    def build(p):
        h, size, f = int(p["hashes"]), int(p["filter_size"]), p["f"]
        pq = (None, None) if one_time else (p["p"], p["q"])
        bit = sniper.rappor_bit_epsilon(f, *pq)
        return Mechanism(
            "one_time_rappor" if one_time else "rappor", sniper.rappor(h, size, f, *pq), p, neighbour_pairs(1),
            None, None, bit * min(2 * h, size), inputs="value",
            pair_epsilon=lambda x, y: sniper.rappor_pair_epsilon(x, y, h, size, f, *pq))

    return build


def _build_laplace_parallel(p):
    eps, k = p["epsilon"], int(p["copies"])
    return Mechanism("laplace_parallel", sniper.laplace_parallel(eps, k), p, neighbour_pairs(1), None, None,
                     k * eps, inputs="records", pair_epsilon=lambda x, y: k * eps * abs(_stat(x) - _stat(y)))


def _build_prefix_sum(p):
    eps, k = p["epsilon"], int(p["queries"])
    # the running sums are an invertible linear map of the noisy answers: their ε adds over the queries
    return Mechanism("prefix_sum", sniper.prefix_sum(eps), p, statdp_patterns(k), None, None, k * eps,
                     pair_epsilon=lambda x, y: eps * float(np.abs(_vec(x) - _vec(y)).sum()), pattern_dim=k,
                     ordered_queries=True, inputs="queries", input_length=k)


_BUILDERS = {
    "laplace": _build_laplace,
    "gaussian": _build_gaussian,
    "noisy_max": _build_noisy_max,
    "noisy_max_value": _build_noisy_max_value,
    "exponential": _build_exponential,
    "svt2": _build_svt(2),
    "svt4": _build_svt(4),
    "svt5": _build_svt(5),
    "svt6": _build_svt(6),
    "randomized_response": _build_rr,
    "shuffled_rr": _build_shuffled_rr,
    "subsampled_laplace": _build_subsampled("laplace"),
    "subsampled_gaussian": _build_subsampled("gaussian"),
    "noisy_gd": _build_noisy_gd,
    "truncated_geometric": _build_truncated_geometric,
    "noisy_hist1": _build_noisy_hist(1),
    "noisy_hist2": _build_noisy_hist(2),
    "report_noisy_max2": _build_report_noisy_max(2),
    "report_noisy_max3": _build_report_noisy_max(3),
    "report_noisy_max4": _build_report_noisy_max(4),
    "svt1": _build_svt1,
    "svt3": _build_svt3,
    "rappor": _build_rappor(one_time=False),
    "one_time_rappor": _build_rappor(one_time=True),
    "laplace_parallel": _build_laplace_parallel,
    "svt34_parallel": _build_svt34_parallel,
    "prefix_sum": _build_prefix_sum,
    "numerical_svt": _build_numerical_svt,
}

#: DP-Sniper's 20 mechanisms (Bichsel et al. 2021, each claimed 0.1-DP) as built-ins here:
#: its name, our built-in, the parameters that make it DP-Sniper's and its input pairs
#: (None: the built-in's defaults). DP-Sniper also audits each pair swapped, which the
#: symmetric loss of MPL makes redundant. SVT4 there is Lyu et al.'s original scaling, 7/4·0.1-DP;
#: our svt4 is scaled to be ε-DP, so DP-Sniper's SVT4 is svt4 at epsilon = 0.175.
DPSNIPER_SUITE = {
    "laplace": ("laplace", {"epsilon": 0.1}, "neighbours:1"),
    "truncated_geometric": ("truncated_geometric", {}, None),
    "noisy_hist1": ("noisy_hist1", {}, None),
    "noisy_hist2": ("noisy_hist2", {}, None),
    "report_noisy_max1": ("noisy_max", {"epsilon": 0.1}, "patterns:5"),
    "report_noisy_max2": ("report_noisy_max2", {}, None),
    "report_noisy_max3": ("report_noisy_max3", {}, None),
    "report_noisy_max4": ("report_noisy_max4", {}, None),
    "svt1": ("svt1", {}, None),
    "svt2": ("svt2", {"epsilon": 0.1}, "patterns:10"),
    "svt3": ("svt3", {}, None),
    "svt4": ("svt4", {"epsilon": 0.175}, "patterns:10"),
    "svt5": ("svt5", {"epsilon": 0.1}, "patterns:10"),
    "svt6": ("svt6", {"epsilon": 0.1}, "patterns:10"),
    "rappor": ("rappor", {}, None),
    "one_time_rappor": ("one_time_rappor", {}, None),
    "laplace_parallel": ("laplace_parallel", {}, None),
    "svt34_parallel": ("svt34_parallel", {}, None),
    "prefix_sum": ("prefix_sum", {}, None),
    "numerical_svt": ("numerical_svt", {}, None),
}


def dpsniper_mechanism(name: str) -> tuple[Mechanism, list]:
    """DP-Sniper's mechanism ``name`` (a key of :data:`DPSNIPER_SUITE`) and its input pairs."""
    ours, params, pairs = DPSNIPER_SUITE[name]
    mech = builtin(ours, **params)
    if pairs is None:
        return mech, mech.mpl_pairs
    kind, _, dim = pairs.partition(":")
    if kind == "neighbours":
        return mech, neighbour_pairs(int(dim))
    return mech, statdp_patterns(int(dim))


# ----------------------------------------------------------------------------- loading

def load_mechanism(spec, params: dict | None = None, threads: int | None = None) -> Mechanism:
    """Resolve a mechanism: a Mechanism, a built-in name, ``module:function``, or a callable.

    User samplers are imported from the working directory or ``PYTHONPATH``;
    ``params`` are passed to them as keyword arguments. ``threads`` (default: the
    mechanism's own, :attr:`Mechanism.threads`) is how many threads draw its outputs.
    """
    mech = _load(spec, params)
    threads = check_threads(threads)
    return mech if threads is None else replace(mech, threads=threads)


def _load(spec, params: dict | None) -> Mechanism:
    params = dict(params or {})
    if isinstance(spec, Mechanism):
        if params:
            raise InputError("parameters can only be given with a mechanism name")
        return spec
    if callable(spec):
        fn = spec
        name = getattr(spec, "__name__", "sampler")
    elif isinstance(spec, str) and spec in _DEFAULTS:
        return builtin(spec, **params)
    elif isinstance(spec, str) and ":" in spec:
        module_name, _, attr = spec.partition(":")
        if not module_name.strip() or not attr.strip():
            raise InputError(f"mechanism {short(spec)} must be module:function with both parts "
                             "(e.g. mymech:sample for def sample(database, size, rng) in mymech.py)")
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except (Exception, SystemExit) as exc:  # the module's own errors (SyntaxError too) are bad input
            raise InputError(f"cannot import module {short(module_name)} for mechanism {short(spec)}: "
                             f"{one_line(f'{type(exc).__name__}: {exc}', 200)}") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise InputError(f"module {short(module_name)} has no callable {short(attr)}")
        name = spec
    else:
        raise InputError(f"unknown mechanism {short(spec)}; built-ins: {', '.join(BUILTIN_NAMES)}"
                         " (or give module:function)")
    if params:
        base = fn

        def fn(database, size, rng, _base=base, _params=params):
            return _base(database, size, rng, **_params)

    return Mechanism(name, fn, params)


def parse_params(items) -> dict:
    """Parse ``KEY=VALUE`` strings into a dict of numbers (or strings when not numeric)."""
    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise InputError(f"--param expects KEY=VALUE, got {short(item)}")
        try:
            num = float(value)
            out[key.strip()] = int(num) if num.is_integer() and "." not in value and "e" not in value.lower() else num
        except ValueError:
            out[key.strip()] = value
    return out
