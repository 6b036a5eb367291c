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
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from . import samplers, truth
from .common import one_line, short
from .patterns import answer_counts, scale_pairs, statdp_patterns
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
    calibrated for, if it has one.
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
}

BUILTIN_NAMES = tuple(_DEFAULTS)

#: most noisy_gd steps audited: the sampler costs steps × outputs (10^12 steps ran for hours)
MAX_STEPS = 10_000
#: range of the scale parameters (epsilon, sigma, sensitivity): beyond it the noise scale or the
#: outputs overflow or underflow a double
PARAM_RANGE = (1e-100, 1e100)


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
    if "p" in p and not 0.5 < p["p"] < 1:
        raise InputError(f"parameter p (keep probability) must be in (0.5, 1), got {p['p']}")
    if "steps" in p and (p["steps"] < 1 or int(p["steps"]) != p["steps"]):
        raise InputError(f"parameter steps must be a positive integer, got {p['steps']}")
    if "steps" in p and p["steps"] > MAX_STEPS:
        raise InputError(f"parameter steps={p['steps']:g} is over {MAX_STEPS:,}: each step redraws every sampled "
                         f"output, so the audit would take {p['steps'] / 300:.2g} s or more (1,000 steps take "
                         f"~3 s at the default sample sizes); audit at most {MAX_STEPS:,} steps")
    return _BUILDERS[name](p)


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
        # SVT6 has neither: every answer vector has positive probability under every input
        # (D_α and the fixed-m ε are finite), and their exact values are not computed here.
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
}


# ----------------------------------------------------------------------------- loading

def load_mechanism(spec, params: dict | None = None) -> Mechanism:
    """Resolve a mechanism: a Mechanism, a built-in name, ``module:function``, or a callable.

    User samplers are imported from the working directory or ``PYTHONPATH``;
    ``params`` are passed to them as keyword arguments.
    """
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
