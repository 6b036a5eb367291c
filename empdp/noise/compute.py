"""The calibrate computation (docs/method.md#8-calibration-and-release): the least noise that reaches a target ε.

:func:`calibrate` reads the source, runs the leave-one-out engine and calls
:func:`calibrate_values`, the pure numerical core, in named steps:

1. :func:`_check_inputs`: ε, the query values, the shifts and the sole contributors;
2. :func:`_curator_model`: the curator's fixed-scale KDE (docs/method.md#3-density-model);
3. :func:`_lambda_search`: λ* = max_i min{λ : ε_i(λ) ≤ ε}, exactly (docs/method.md#82-the-minimal-scale-exact);
4. :func:`_noise`: the noise h with k ⋆ h = ℓ_λ* in closed form (Laplace kernel), or the verified
   feasible-family fallback (Gaussian kernel; docs/method.md#83-deconvolution-the-noise-law);
5. :func:`_verify`: max_i ε_i over the released density P̂ ⋆ k ⋆ h is at most ε;
6. the :class:`~empdp.noise.calibration.Calibration` that holds the result.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import kernels, params
from ..assessment.adversary import read_statistic
from ..assessment.checks import few_databases
from ..density import select_density
from ..engines import engine_of
from ..errors import InputError
from ..loo import loo_result
from ..models import JOINT, ONE, given, model_for, statistics
from ..params import target_epsilon
from ..progress import READING, Progress, no_progress
from ..settings import Data, Execution, Model
from ..textfmt import fmt
from .adversary import calibrate_buckets
from .calibration import Calibration
from .deconv import NoiseSpec, fourier_deconvolve, gaussian_fallback, laplace_closed_form
from .exact import LambdaSearch, laplace_kde_eps, minimal_lambda
from .joint import JointCalibration, calibrate_joint

#: the curator kernel by default: it deconvolves in closed form (a Gaussian one needs the fallback)
DEFAULT_KERNEL = kernels.DEFAULT.name
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Inputs:
    """The checked inputs of :func:`calibrate_values`.

    ``B`` holds the leave-one-out points P̂_i = {q_j − Δ_ij} of the individuals
    that can be at risk: not sole contributors (no λ protects them) and with
    some non-zero shift (the others have ε_i = 0 at every λ).
    """

    epsilon: float
    q: np.ndarray
    B: np.ndarray
    n_individuals: int
    n_sole: int


@dataclass(frozen=True)
class _NoiseStep:
    """The noise h, the verified max_i ε_i of the release with it, and how it was found."""

    noise: NoiseSpec
    eps_max: float
    deconvolution: dict
    notes: list = field(default_factory=list)


def _check_inputs(q, shifts, epsilon, undefined, bandwidth) -> _Inputs:
    """Refuse bad input once, here, with one-line errors (docs/method.md#82-the-minimal-scale-exact)."""
    epsilon = target_epsilon(epsilon)
    q = np.asarray(q, dtype=float)
    shifts = np.atleast_2d(np.asarray(shifts, dtype=float)).reshape(-1, q.size)
    if not (np.isfinite(q).all() and np.isfinite(shifts).all()):
        raise InputError("query values and leave-one-out shifts must be finite")
    undefined = np.zeros(len(shifts), bool) if undefined is None else np.asarray(undefined, bool)
    if len(undefined) and undefined.all():  # λ* would be 0 over nobody: a vacuous "no noise needed"
        raise InputError(f"every individual ({len(undefined)}) is the only contributor to some database: "
                         "removing any of them leaves a database empty, so no noise level can protect "
                         "them and there is nothing to calibrate; use a source with several individuals "
                         "per database")
    if bandwidth == "variable":
        raise InputError("`bandwidth` variable is for assess only: no single noise law deconvolves kernels of "
                         "different widths; calibrate with `bandwidth` auto (the default, the model assess uses "
                         "by default) or a number", param="bandwidth")
    rows = ~undefined & (shifts != 0).any(axis=1)
    return _Inputs(epsilon, q, q - shifts[rows], int(len(shifts)), int(undefined.sum()))


def _curator_model(q, kernel, bandwidth, progress: Progress):
    """The curator's KDE of the query values, of one fixed scale (``variable=False``)."""
    t = time.perf_counter()
    progress("density model", 0, 1)
    density = select_density(q, kernel=kernel, bandwidth=bandwidth)
    progress("density model", 1, 1)
    log.info("curator kernel: %s, scale %s (%s, %d candidate(s), LOO log-likelihood %s) in %.2f s",
             density.kernel, fmt(density.scale), density.selected_by, len(density.candidates), fmt(density.loglik),
             time.perf_counter() - t)
    return density


def _lambda_search(inputs: _Inputs, progress: Progress) -> LambdaSearch:
    """λ*, the least Laplace scale of the target densities P̂ ⋆ ℓ_λ, P̂_i ⋆ ℓ_λ with every ε_i ≤ ε."""
    t = time.perf_counter()
    search = minimal_lambda(inputs.q, inputs.B, inputs.epsilon, progress=progress)
    log.info("lambda* = %s (W-infinity bound %s, Hausdorff rule %s): %d of %d individuals evaluated, in %.2f s",
             fmt(search.lam), fmt(search.lam_winf), fmt(search.lam_hausdorff), search.n_bisected, len(inputs.B),
             time.perf_counter() - t)
    return search


def _laplace_noise(inputs: _Inputs, b: float, search: LambdaSearch, raised: bool = False) -> _NoiseStep:
    """Laplace curator kernel ℓ_b: no noise, or the closed form w·δ_0 + (1 − w)·ℓ_λ*, w = (b/λ*)² (``search.lam``
    raised to λ_L above λ* with ``raised``: noise whenever λ_L > b)."""
    q, B, epsilon = inputs.q, inputs.B, inputs.epsilon
    # No noise exactly when the curator's own model P̂ ⋆ ℓ_b is ε-private for everyone: the
    # question assess answers (nobody at risk at ε), decided on the same exact ε_i, not on
    # b ≥ λ*, which holds only up to the bisection's tolerance. ε_i(λ) falls as λ grows
    # (ℓ_λ' = ℓ_λ ⋆ h for λ' > λ, and smoothing both densities by h cannot raise their
    # ratio), so otherwise λ* > b and the closed form applies.
    at_b = laplace_kde_eps(q, B, b) if len(B) else np.zeros(0)
    if float(at_b.max(initial=0.0)) <= epsilon and not (raised and search.lam > b):
        noise = laplace_closed_form(b, 0.0)
        eps_max = float(at_b.max(initial=0.0))
    else:
        noise = laplace_closed_form(b, search.lam)
        eps_max = float(search.eps.max(initial=0.0))
    return _NoiseStep(noise, eps_max, {"method": "closed form (Laplace kernel)", "feasible": True})


def _gaussian_noise(inputs: _Inputs, kernel, b: float, search: LambdaSearch, progress: Progress) -> _NoiseStep:
    """A kernel that cannot be deconvolved: the least-E|y| verified member of w·δ_0 + (1 − w)·ℓ_λ′."""
    check = fourier_deconvolve(kernel, b, max(search.lam, b))
    deconv = {"method": "feasible family w*delta_0 + (1-w)*Laplace(lambda') (Gaussian kernel)",
              "feasible": check.feasible, "reason": check.reason}
    note = ("a Gaussian curator kernel cannot be deconvolved "
            "(docs/method.md#112-a-gaussian-curator-kernel-cannot-be-deconvolved): " + check.reason
            + "; using the verified feasible-family fallback")
    fb = gaussian_fallback(inputs.q, inputs.B, b, inputs.epsilon, search.lam, progress=progress)
    deconv["grid_slack"] = fb.slack
    return _NoiseStep(fb.noise, fb.eps_max, deconv, [note])


def _noise(inputs: _Inputs, kernel, b: float, search: LambdaSearch, progress: Progress,
           raised: bool = False) -> _NoiseStep:
    """The release noise h for curator kernel ``kernel`` of scale ``b`` (docs/method.md#83-deconvolution-the-noise-law):
    the closed form where the kernel deconvolves (Laplace), else the verified fallback."""
    t = time.perf_counter()
    step = (_laplace_noise(inputs, b, search, raised) if kernel.deconvolves
            else _gaussian_noise(inputs, kernel, b, search, progress))
    n = step.noise
    log.info("noise: %s, weight at 0 %s, scale %s, E|y| %s; verified_eps_max %s (%s) in %.2f s", n.kind,
             fmt(n.weight_zero), fmt(n.scale), fmt(n.expected_abs), fmt(step.eps_max), step.deconvolution["method"],
             time.perf_counter() - t)
    return step


def _verify(step: _NoiseStep, epsilon: float) -> None:
    """The searches verify before they return; a release above ε would be a bug, never a result."""
    if step.eps_max > epsilon:  # pragma: no cover
        raise RuntimeError(f"verification failed: max eps_i = {step.eps_max} > {epsilon}")


def _at_level(inputs: _Inputs, search: LambdaSearch, level: dict, shifts,
              undefined) -> tuple[LambdaSearch, dict, list]:
    """λ_L (:func:`empdp.assessment.uncertainty.calibration_level`): the least scale at which ε holds in a
    fraction ``level["level"]`` of subsamples of the databases, never below λ*; the search at λ_L (its
    ε_i verified there: ε_i(λ) falls as λ grows), the calibration's ``level`` record and the warnings of
    the subsamples (too few databases, a trend, blocks), as ``assess --uncertainty`` gives them."""
    from ..assessment.uncertainty import calibration_level

    found = calibration_level(inputs.q, shifts, inputs.epsilon, level=level["level"],
                              replicates=level["replicates"], rng=level.get("rng"), undefined=undefined,
                              lam_star=float(search.lam))  # λ* is found already: not again
    lam = max(float(found.lam), float(search.lam))
    eps = laplace_kde_eps(inputs.q, inputs.B, lam) if len(inputs.B) and lam > 0 else np.zeros(len(inputs.B))
    record = {"level": found.level, "lambda_level": lam, "lambda_star": float(search.lam),
              "replicates": found.replicates, "method": found.to_dict()["method"]}
    return replace(search, lam=lam, eps=eps), record, list(found.warnings)


def calibrate_values(q, shifts, *, epsilon: float, kernel: str = DEFAULT_KERNEL, bandwidth="auto",
                     undefined=None, density=None, progress: Progress | None = None,
                     level: dict | None = None) -> Calibration:
    """Calibrate noise for query values ``q`` and leave-one-out ``shifts`` (docs/method.md#81-target-densities).

    Parameters
    ----------
    q : (n,) array_like
        f(X^j), the points of P̂.
    shifts : (m, n) array_like
        Δ_ij = f(X^j) − f(X^j ∖ i), 0 where i is absent; P̂_i = {q_j − Δ_ij}.
    epsilon : float
        Target empirical ε.
    kernel, bandwidth :
        Curator kernel choice, passed to :func:`empdp.density.select_density`
        with fixed scale (``variable=False``), unless ``density`` is given.
        The default Laplace kernel deconvolves in closed form; ``"auto"``
        may pick a Gaussian one, which needs the verified fallback
        (docs/method.md#112-a-gaussian-curator-kernel-cannot-be-deconvolved).
    undefined : (m,) bool array_like, optional
        Sole contributors: excluded from λ* (no λ protects them), counted
        and warned about.
    progress : callable, optional
        ``progress(stage, done, total)`` for the stages "density model",
        "lambda search" and (Gaussian kernel) "Gaussian fallback".
    level : dict, optional
        ``{"level": L, "replicates": B, "rng": seed}``: calibrate at λ_L, the least scale at which the
        target ε holds for a fraction L of subsamples of the databases (docs/method.md, "Uncertainty of
        the estimates"), reported beside λ* as the calibration's ``level``; Laplace kernels only.

    Returns
    -------
    Calibration
    """
    t0 = time.perf_counter()
    inputs = _check_inputs(q, shifts, epsilon, undefined, bandwidth)
    progress = progress or no_progress
    if density is None:
        density = _curator_model(inputs.q, kernel, bandwidth, progress)
    curator, b = kernels.kernel(density.kernel), float(density.scale)  # a name (e.g. a duck-typed model) too
    notes = few_databases(int(inputs.q.size), "the calibration")
    if inputs.n_sole:
        notes.append(f"{inputs.n_sole} sole contributor(s) (the only individual in some database) "
                     "cannot be protected by any noise level: their presence alone is revealed; they are "
                     "excluded from lambda")
    search = _lambda_search(inputs, progress)
    at_level = None
    if level is not None:
        if not curator.deconvolves:
            raise InputError(f"`level` calibrates the closed-form noise of a Laplace curator kernel; the "
                             f"{curator.name} kernel has none: drop `level`, or use the Laplace kernel",
                             param=("level", "kernel"))
        search, at_level, level_notes = _at_level(inputs, search, level, shifts, undefined)
        notes += level_notes
    step = _noise(inputs, curator, b, search, progress,
                  raised=at_level is not None and at_level["lambda_level"] > at_level["lambda_star"])
    notes += step.notes
    if step.noise.kind == "none":
        notes.append("no noise is added: the curator's density model is already epsilon-private for every "
                     "individual (assess with the same options finds nobody at risk at this epsilon), so the "
                     "exact value is released")
    _verify(step, inputs.epsilon)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return Calibration(
        epsilon=inputs.epsilon, lam=search.lam if at_level is None else at_level["lambda_star"],
        lam_hausdorff=search.lam_hausdorff, lam_winf=search.lam_winf,
        curator_kernel={"kind": curator.name, "scale": b}, noise=step.noise.to_dict(),
        expected_abs_noise=step.noise.expected_abs, verified_eps_max=step.eps_max,
        n_individuals=inputs.n_individuals, n_sole_contributors=inputs.n_sole, n_databases=int(inputs.q.size),
        deconvolution=step.deconvolution, n_bisected=search.n_bisected, seconds=time.perf_counter() - t0,
        warnings=notes, level=at_level)


def calibrate(data: Any, *, id: str | None = None, by: str | None = None, epsilon: float,
              query: str | list | None = None, sql: str | list | None = None, where: str | None = None,
              model: Model | None = None, execution: Execution | None = None, level: float | None = None,
              replicates: int = 200, rng=None) -> Calibration | JointCalibration:
    """Calibrate release noise for ``query`` over the databases of ``data`` (docs/method.md#8-calibration-and-release).

    ``data``, ``id``, ``by``, ``query``, ``sql``, ``where``, ``model`` and ``execution`` are those of
    :func:`empdp.assess` (of ``execution``, the engine, memory limit, threads and progress apply); see
    :func:`calibrate_values`. ``query`` (or ``sql``) may be a list of 2–3 statistics released
    together: the result is then a :class:`~empdp.noise.joint.JointCalibration`
    (:func:`~empdp.noise.joint.calibrate_joint`). ``progress`` also gets the stage "reading and
    leave-one-out" (size unknown: total 0). With an adversary in ``model`` (and its buckets), every
    adversary bucket's released density is made ε-private (:mod:`empdp.noise.adversary`), as
    ``assess`` with the same model measures it.

    ``level`` L (with ``replicates`` subsamples drawn by ``rng``) calibrates at λ_L instead of λ*: the
    least scale at which the target ε holds for a fraction L of subsamples of the databases, reported
    beside λ* (``calibration.level``; one statistic with a Laplace kernel, no adversary).
    """
    data = Data.of(data, id, by)
    model, execution = model or Model(), execution or Execution()
    kernel, adversary, adversary_sql, buckets = model.kernel, model.adversary, model.adversary_sql, model.buckets
    curator, d = model_for(query, sql)
    engine = engine_of(execution.engine, memory_limit=execution.memory_limit, threads=execution.threads)
    curator.refuse(given(kernel=kernel, adversary=adversary, adversary_sql=adversary_sql, buckets=buckets,
                         engine=engine.name, level=level), d)
    at = None
    if level is not None:
        from ..assessment.uncertainty import check_options

        if adversary or adversary_sql:
            raise InputError("`level` calibrates the plain release of one statistic, not against an adversary",
                             param=("level", "adversary"))
        replicates, level = check_options(replicates, level)
        at = {"level": level, "replicates": replicates, "rng": rng}
    request = dict(data=data, statistics=statistics(query, sql), where=where, epsilon=epsilon, model=model,
                   engine=engine, memory_limit=execution.memory_limit, level=at,
                   progress=execution.progress or no_progress)
    return _PATHS[curator.key](**request)


def _calibrate_joint(*, data: Data, statistics, where, epsilon, model: Model, engine, memory_limit, progress, **_):
    """2–3 statistics released together (:func:`empdp.noise.joint.calibrate_joint`)."""
    queries, sqls = statistics
    return calibrate_joint(data.source, id=data.id, by=data.by, epsilon=epsilon, queries=queries or None,
                           sql=sqls or None, where=where, bandwidth=model.bandwidth, memory_limit=memory_limit,
                           drop_null_ids=data.drop_null_ids, progress=progress, engine=engine)


def _calibrate_one(*, data: Data, statistics, where, epsilon, model: Model, engine, level, progress,
                   **_) -> Calibration:
    """One statistic, against an adversary's buckets or not."""
    queries, sqls = statistics
    query, sql = (queries or [None])[0], (sqls or [None])[0]
    source, id, by, drop_null_ids = data.source, data.id, data.by, data.drop_null_ids
    kernel, bandwidth, adversary, adversary_sql, buckets = (model.kernel, model.bandwidth, model.adversary,
                                                            model.adversary_sql, model.buckets)
    params.adversary(adversary, adversary_sql, buckets)
    t0 = time.perf_counter()
    progress(READING, 0, 0)
    loo = loo_result(engine.open(source, id=id, by=by, query=query, where=where, sql=sql,
                                 drop_null_ids=drop_null_ids))
    progress(READING, 1, 1)
    log.info("read %s: %d databases, %d individuals (%d sole contributors), query %s, in %.2f s", loo.source,
             loo.q.size, len(loo.shifts), int(np.sum(loo.undefined)), loo.query, time.perf_counter() - t0)
    if adversary or adversary_sql:
        # the statistic is read by the engine that read the query (Spark: one number per database)
        g, statistic = read_statistic(source, loo.labels, id=id, by=by, adversary=adversary,
                                      adversary_sql=adversary_sql, engine=engine, drop_null_ids=drop_null_ids)
        checked = _check_inputs(loo.q, loo.shifts, epsilon, loo.undefined, bandwidth)
        cal = calibrate_buckets(loo.q, loo.shifts, g, epsilon=checked.epsilon, buckets=buckets,
                                labels=loo.labels, statistic=statistic, bandwidth=bandwidth,
                                undefined=loo.undefined, kernel=kernel)
    else:
        cal = calibrate_values(loo.q, loo.shifts, epsilon=epsilon, kernel=kernel, bandwidth=bandwidth,
                               undefined=loo.undefined, progress=progress, level=level)
    cal.source = str(source) if isinstance(source, (str, Path)) else None
    cal.source_description, cal.query_description = loo.source, loo.query
    cal.id, cal.by, cal.query, cal.where, cal.sql = id, by, query, where, sql
    cal.seconds = time.perf_counter() - t0
    return cal


#: each curator model's calibration (:mod:`empdp.models`; grouped statistics are refused by their model)
_PATHS = {ONE.key: _calibrate_one, JOINT.key: _calibrate_joint}


