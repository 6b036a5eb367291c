"""Audit of a calibrated release (docs/method.md#94-release-audit).

The release mechanism's output distribution (empirical sense) is
r = P̂ ⋆ k ⋆ h: pick a database j uniformly, add curator-kernel noise k
(smoothed bootstrap), add the release noise y ~ h; likewise r_i from
P̂_i = {q_j − Δ_ij}. We run MPL and the Rényi bound on (r, r_i) for the
riskiest individuals and put the exact values beside them: sup |log r − log r_i|
and D_α by quadrature on a fine grid. A built-in cross-check that the
release meets its target ε and that the audits are calibrated (LB ≤ exact).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from .. import kernels
from ..engines import engine_of
from ..errors import InputError
from ..io import jsonable, keyed_hash
from ..models import JOINT
from ..params import threads as check_threads
from ..textfmt import fmt
from .approx import approx
from .common import as_rng, check_level, check_order, check_size
from .mechanisms import Mechanism, load_mechanism
from .mpl import mpl
from .renyi import renyi

log = logging.getLogger("empdp.audit")


# ----------------------------------------------------------------------------- release density

def release_kernel_logpdf(x, kernel, b: float, w: float, lam: float) -> np.ndarray:
    """log of k ⋆ h at ``x`` for h = w·δ_0 + (1 − w)·Laplace(λ) and the curator kernel k (object or
    name) of scale b: :meth:`empdp.kernels.Kernel.release_logpdf`, for a Gaussian k the kernel
    calibration certifies (docs/method.md#94-release-audit).
    """
    return kernels.kernel(kernel).release_logpdf(np.asarray(x, float), b, w, lam)


def release_logdensity(x, points, kernel, b, w, lam, chunk: int = 4096) -> np.ndarray:
    """log r(x) for r = (1/n) Σ_j (k ⋆ h)(x − p_j), evaluated in chunks of x."""
    x = np.asarray(x, float)
    points = np.asarray(points, float)
    out = np.empty(x.size)
    for s in range(0, x.size, chunk):
        z = x[s:s + chunk, None] - points[None, :]
        out[s:s + chunk] = _special().logsumexp(release_kernel_logpdf(z, kernel, b, w, lam), axis=1)
    return out - math.log(points.size)


def exact_values(q, shifted, kernel, b, w, lam, order: float, deltas=(), grid_points: int = 20000):
    """Exact ε_i = sup_x |log r − log r_i|, D_α both ways and ε_i(δ) at each of ``deltas``, on a fine
    grid with all points.

    For Laplace-based release densities the log-ratio is constant in the far
    tails, so a grid reaching 40 scales beyond the points captures the sup;
    with a purely Gaussian release (no noise, Gaussian kernel) ε_i = ∞, while
    ε_i(δ) (:func:`epsilon_at_delta`) is finite.
    """
    scale = max(b, lam if w < 1 else 0.0)
    pts = np.concatenate([q, shifted])
    lo, hi = pts.min() - 40 * scale, pts.max() + 40 * scale
    x = np.unique(np.concatenate([np.linspace(lo, hi, grid_points), pts]))
    lr = release_logdensity(x, q, kernel, b, w, lam)
    li = release_logdensity(x, shifted, kernel, b, w, lam)
    diff = lr - li
    if not kernels.kernel(kernel).exact_eps and (w >= 1 or lam <= 0) and not np.allclose(np.sort(q), np.sort(shifted)):
        eps = math.inf
    else:
        eps = float(np.max(np.abs(diff)))

    def div(la, lb):
        y = np.exp(order * la + (1 - order) * lb)
        return math.log(float(np.trapezoid(y, x))) / (order - 1)

    return eps, max(div(lr, li), div(li, lr)), epsilon_at_delta(x, lr, li, deltas)


#: bisection steps of :func:`epsilon_at_delta` (the bracket [0, max |log r − log r_i|] shrinks 2^-60)
BISECTIONS = 60


def hockey_stick(x, lp, lq, eps) -> np.ndarray:
    """δ(ε) = ∫ (p − e^ε q)_+ for each ε of ``eps``, by the trapezoid rule on the grid ``x`` (log-densities
    ``lp``, ``lq`` there; Balle & Wang 2018, eq. 4)."""
    eps = np.atleast_1d(np.asarray(eps, float))
    y = np.maximum(np.exp(lp)[None, :] - np.exp(eps[:, None] + lq[None, :]), 0.0)
    return np.trapezoid(y, x, axis=1)


def epsilon_at_delta(x, lr, li, deltas) -> np.ndarray:
    """The exact curve ε(δ) of the pair (r, r_i): for each δ the smallest ε ≥ 0 with
    max(δ_{r‖r_i}(ε), δ_{r_i‖r}(ε)) ≤ δ (the hockey-stick divergence both ways, :func:`hockey_stick`),
    by bisection; δ(ε) falls with ε and is 0 at ε = max |lr − li| on the grid."""
    deltas = np.asarray(deltas, float)
    lo, hi = np.zeros(deltas.size), np.full(deltas.size, float(np.max(np.abs(lr - li))))
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        above = np.maximum(hockey_stick(x, lr, li, mid), hockey_stick(x, li, lr, mid)) > deltas
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return hi


def release_mechanism(q, shifts_top, kernel, b, w, lam) -> Mechanism:
    """Sampler of the release: database −1 is r = P̂ ⋆ k ⋆ h, database k is r_k for top individual k."""
    q = np.asarray(q, float)
    shifts_top = np.atleast_2d(np.asarray(shifts_top, float))
    kernel = kernels.kernel(kernel)

    def sample(database, size, rng):
        k = int(database)
        pts = q if k < 0 else q - shifts_top[k]
        y = pts[rng.integers(0, q.size, size)]
        y = y + kernel.sample(rng, b, size)
        if w < 1 and lam > 0:
            noisy = rng.random(size) >= w
            y = y + np.where(noisy, rng.laplace(0.0, lam, size), 0.0)
        return y

    return Mechanism("release", sample, threads=None, ours=True)  # each part with its own generator


# ----------------------------------------------------------------------------- audit

@dataclass
class _Bounds:
    """The audit figures of one released density against the target ε: bounds beside exact values."""

    target_epsilon: float
    individuals: list
    mpl_lower_bound: float
    stage1_max_loss: float  # MPL's largest stage-1 loss: biased up, not a bound
    renyi_lower_bound: float
    exact_epsilon_max: float
    #: None where the exact D_α could not be computed (a joint release beyond the quadrature's budget)
    exact_renyi_max: float | None
    #: a curator kernel that is not pure DP (Gaussian) is audited at δ too: the δ (its ε_i's tolerance),
    #: the (ε, δ) audit's lower bound on ε(δ) and the exact max ε_i(δ); None for pure-DP kernels
    delta: float | None = None
    approx_lower_bound: float | None = None
    exact_epsilon_at_delta_max: float | None = None
    #: the exact curve: the largest ε_i(δ) of the audited individuals at each δ of CURVE_DELTAS
    exact_curve: dict | None = None

    @property
    def ok(self) -> bool:
        """The exact ε ≤ target and the black-box bound does not contradict it: pure ε and MPL, or for a
        kernel that is not pure DP, ε(δ) and the (ε, δ) audit at its tolerance δ."""
        tol = 1e-9 * max(1.0, self.target_epsilon)
        if self.delta is not None:
            return (self.exact_epsilon_at_delta_max <= self.target_epsilon + tol
                    and self.approx_lower_bound <= self.target_epsilon)
        return self.exact_epsilon_max <= self.target_epsilon + tol and self.mpl_lower_bound <= self.target_epsilon

    @property
    def renyi_consistent(self) -> bool | None:
        """The Rényi lower bound does not exceed the exact D_α of the audited individuals (None: D_α
        was not computed).

        Not part of :attr:`ok` (there is no Rényi target): a bound above the
        exact value is the bound's allowed miss (probability ≤ alpha), or a
        sign that the release is not the one calibrated.
        """
        if self.exact_renyi_max is None:
            return None
        return self.renyi_lower_bound <= self.exact_renyi_max * (1 + 1e-9) + 1e-12

    def _figures(self) -> dict:
        return {"ok": self.ok, "renyi_consistent": self.renyi_consistent,
                "mpl_lower_bound": self.mpl_lower_bound, "stage1_max_loss": self.stage1_max_loss,
                "exact_epsilon_max": self.exact_epsilon_max, "renyi_lower_bound": self.renyi_lower_bound,
                "exact_renyi_max": self.exact_renyi_max, "individuals": self.individuals, "delta": self.delta,
                "approx_lower_bound": self.approx_lower_bound,
                "exact_epsilon_at_delta_max": self.exact_epsilon_at_delta_max, "exact_curve": self.exact_curve}


@dataclass
class BucketAudit(_Bounds):
    """The audit of one adversary bucket: the release density of its databases, P̂_B ⋆ k_B ⋆ h.

    ``alpha`` is the bucket's error level: the overall level over the number of buckets.
    """

    lo: float = 0.0
    hi: float = 0.0
    n_databases: int = 0
    curator_kernel: dict = field(default_factory=dict)
    alpha: float = 0.05

    def to_dict(self) -> dict:
        return jsonable({"lo": self.lo, "hi": self.hi, "n_databases": self.n_databases,
                         "curator_kernel": self.curator_kernel, "alpha": self.alpha, **self._figures()})


@dataclass
class ReleaseAudit(_Bounds):
    """MPL and Rényi bounds for a calibrated release beside the exact grid values.

    For a calibration against an adversary (``calibrate --adversary``) each bucket is audited
    apart (``buckets``); the figures here are then the largest over the buckets, ``individuals``
    gathers every bucket's (each with its ``bucket``), and the release passes when every bucket does.
    """

    order: float = 2.0
    search_size: int = 0  # MPL's stage-1 outputs per database
    final_size: int = 0  # MPL's stage-2 outputs per database
    renyi_sample_size: int = 0
    alpha: float = 0.05
    noise: dict = field(default_factory=dict)
    curator_kernel: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    #: the ids in ``individuals`` are keyed pseudonyms (``hash_key`` was given)
    ids_hashed: bool = False
    #: per adversary bucket, in the calibration's order (empty without an adversary)
    buckets: list = field(default_factory=list)
    adversary_statistic: str | None = None
    #: a joint release (2–3 statistics): their names and the curator's joint model (None for one statistic)
    statistics: list | None = None
    curator_model: dict | None = None

    @property
    def d(self) -> int:
        """The number of statistics released together."""
        return len(self.statistics) if self.statistics else 1

    @property
    def ok(self) -> bool:
        """Exact ε ≤ target and the MPL bound does not contradict it (in every adversary bucket)."""
        return _Bounds.ok.fget(self) and all(b.ok for b in self.buckets)

    @property
    def renyi_consistent(self) -> bool:
        """The Rényi bound stays at or below the exact D_α (in every adversary bucket); see :class:`_Bounds`."""
        if self.buckets:
            return all(b.renyi_consistent for b in self.buckets)
        return _Bounds.renyi_consistent.fget(self)

    @property
    def worst_bucket(self) -> int | None:
        """The adversary bucket that sets the verdict: a failing one first, then the largest exact ε, then MPL bound."""
        if not self.buckets:
            return None
        return max(range(len(self.buckets)), key=lambda k: (not self.buckets[k].ok, self.buckets[k].exact_epsilon_max,
                                                            self.buckets[k].mpl_lower_bound))

    def to_dict(self) -> dict:
        d = {"method": "release", "target_epsilon": self.target_epsilon, "order": self.order, **self._figures(),
             "search_size": self.search_size, "final_size": self.final_size,
             "renyi_sample_size": self.renyi_sample_size, "alpha": self.alpha, "noise": self.noise,
             "curator_kernel": self.curator_kernel, "warnings": self.warnings, "ids_hashed": self.ids_hashed}
        if self.statistics:  # a joint release: no (ε, δ) part (its kernel is pure DP)
            for key in ("delta", "approx_lower_bound", "exact_epsilon_at_delta_max", "exact_curve"):
                d.pop(key)
            d.update(joint=True, d=self.d, statistics=self.statistics, curator_model=self.curator_model)
        if self.buckets:
            d.update(adversary_statistic=self.adversary_statistic, worst_bucket=self.worst_bucket,
                     buckets=[b.to_dict() for b in self.buckets])
        return jsonable(d)


def describe_buckets(d: dict) -> list[str]:
    """Terminal lines for the buckets of an adversary release audit (``to_dict`` output); none without.

    One row per bucket (its range of the adversary statistic, size, exact max ε_i, MPL bound,
    verdict), then the worst bucket.
    """
    buckets = d.get("buckets") or []
    if not buckets:
        return []
    stat = d.get("adversary_statistic") or "the adversary statistic"
    lines = [f"  adversary knows {stat}: {len(buckets)} bucket(s), each audited apart at alpha "
             f"{fmt(buckets[0]['alpha'])} (alpha / buckets)",
             f"  {'bucket':>6s} {'range':>17s} {'databases':>9s} {'exact max eps':>13s} {'MPL bound':>9s}  verdict"]
    for k, b in enumerate(buckets):
        lines.append(f"  {k:>6d} {'[' + fmt(b['lo']) + ', ' + fmt(b['hi']) + ']':>17s} {b['n_databases']:>9d} "
                     f"{fmt(b['exact_epsilon_max']):>13s} {fmt(b['mpl_lower_bound']):>9s}  "
                     f"{'ok' if b['ok'] else 'FAILS'}")
    k = d["worst_bucket"]
    b = buckets[k]
    lines.append(f"  worst bucket: {k} ({stat} in [{fmt(b['lo'])}, {fmt(b['hi'])}]): MPL lower bound "
                 f"{fmt(b['mpl_lower_bound'])}, exact max eps {fmt(b['exact_epsilon_max'])}, target "
                 f"{fmt(d['target_epsilon'])}: {'meets it' if b['ok'] else 'needs more noise'}")
    return lines


class OneDensity:
    """The release density of one statistic, P̂ ⋆ k ⋆ h (curator kernel k of scale ``b``, noise h =
    w·δ_0 + (1 − w)·Laplace(λ)), and of each individual's P̂_i: what :func:`_audit_density` audits."""

    def __init__(self, q, shifts, *, kernel, b, w, lam, order):
        self.q, self.shifts, self.kernel, self.b, self.w, self.lam, self.order = q, shifts, kernel, b, w, lam, order
        kern = kernels.kernel(kernel)
        #: a kernel that is not pure DP is audited at δ, its ε_i's tolerance, too
        self.delta = None if kern.exact_eps else kern.tolerance
        self.deltas = () if self.delta is None else sorted({*CURVE_DELTAS, self.delta}, reverse=True)
        noisy = w < 1 and lam > 0
        self._rank_scale = (max(lam, b) if kern.exact_eps else lam) if noisy else b

    def choose(self, rows: np.ndarray, top: int, report) -> tuple[list, dict]:
        """The ``top`` riskiest of ``rows`` and their exact figures. Ranked by the exact Laplace-KDE ε at
        the release's scale (a proxy); the shortlist of 4 × top is then ranked by the exact ε_i on the
        grid, or by ε_i(δ) at the kernel's tolerance δ for a kernel that is not pure DP."""
        from ..noise.exact import laplace_kde_eps

        q, shifts = self.q, self.shifts
        rank_eps = laplace_kde_eps(q, q[None, :] - shifts[rows], self._rank_scale)
        shortlist = rows[np.argsort(-rank_eps, kind="stable")[:4 * top]]
        stage = f"exact values: {len(shortlist)} individuals"
        exact = {}
        for j, k in enumerate(shortlist):
            exact[int(k)] = exact_values(q, q - shifts[k], self.kernel, self.b, self.w, self.lam, self.order,
                                         self.deltas)
            report(stage, j + 1, len(shortlist))
        at = None if self.delta is None else self.deltas.index(self.delta)
        chosen = sorted(exact, key=lambda k: -(exact[k][0] if at is None else exact[k][2][at]))[:top]
        self._curves = np.array([exact[k][2] for k in chosen])
        figures = {k: {"exact_epsilon": exact[k][0], "exact_renyi": exact[k][1]} for k in chosen}
        for k, curve in zip(chosen, self._curves):
            if at is not None:
                figures[k]["exact_epsilon_at_delta"] = float(curve[at])
        return chosen, figures

    def mechanism(self, chosen: list) -> Mechanism:
        return release_mechanism(self.q, self.shifts[np.array(chosen)], self.kernel, self.b, self.w, self.lam)

    def exact_renyi(self, chosen: list, figures: dict) -> None:
        """Nothing to add: :meth:`choose` computed D_α with ε_i on the same grid."""

    def at_delta(self, mech, pairs, **sizes) -> tuple[dict, list]:
        """The (ε, δ) audit beside the exact curve ε(δ), for a kernel that is not pure DP."""
        if self.delta is None:
            return {}, []
        return _approx_figures(mech, pairs, self.delta, self.deltas, self._curves, **sizes)


def _audit_density(density, rows, name, *, target, top, order, n, N, n_renyi, alpha, rng,
                   progress, threads) -> tuple[_Bounds, list]:
    """Audit a release density (:class:`OneDensity`, or :class:`~empdp.audit.joint_release.JointDensity`
    for 2–3 statistics released together) for the individuals ``rows``: the ``top`` riskiest get their
    exact values (the density's own), MPL and the Rényi bound, and for a kernel that is not pure DP the
    (ε, δ) audit at δ and the exact curve ε(δ). Returns the figures and the bounds' warnings.
    """
    report = progress or (lambda stage, done, total: None)
    t0 = time.perf_counter()
    chosen, figures = density.choose(rows, top, report)
    log.info("release audit: exact values of %d of %d individuals in %.2f s", len(chosen), len(rows),
             time.perf_counter() - t0)
    mech = load_mechanism(density.mechanism(chosen), threads=threads)
    pairs = [(-1, k) for k in range(len(chosen))]
    m = mpl(mech, pairs, n=n, N=N, alpha=alpha, rng=rng, progress=progress)
    for k, est in zip(chosen, m.stage1_max_loss_by_pair):
        figures[k]["stage1_max_loss"] = est
    density.exact_renyi(chosen, figures)
    r = renyi(mech, pairs, order=order, n=n_renyi, alpha=alpha, rng=rng, progress=progress)
    at_delta, notes = density.at_delta(mech, pairs, n=n, N=N, alpha=alpha, rng=rng, progress=progress)
    individuals = [{"id": name(k), **figures[k]} for k in chosen]
    renyis = [row["exact_renyi"] for row in individuals]
    if None in renyis:
        notes = notes + [f"the exact D_{order:g} was not computed for some individuals (too many quadrature "
                         "nodes, or points too many scales apart): renyi_consistent is null"]
    bounds = _Bounds(target_epsilon=target, individuals=individuals, mpl_lower_bound=m.lower_bound,
                     stage1_max_loss=m.stage1_max_loss, renyi_lower_bound=r.lower_bound,
                     exact_epsilon_max=max(row["exact_epsilon"] for row in individuals),
                     exact_renyi_max=None if None in renyis else max(renyis), **at_delta)
    return bounds, m.warnings + r.warnings + notes


#: the δ of the exact curve ε(δ) reported for a curator kernel that is not pure DP (with its tolerance)
CURVE_DELTAS = (1e-2, 1e-3, 1e-4, 1e-6, 1e-9)


def _approx_figures(mech, pairs, delta, deltas, curves, **sizes) -> tuple[dict, list]:
    """The (ε, δ) audit of the release at δ (:func:`empdp.audit.approx.approx`) beside the exact
    ε_i(δ): ``curves`` holds each audited individual's ε_i at each of ``deltas``."""
    a = approx(mech, pairs, delta=delta, **sizes)
    worst = curves.max(axis=0)
    return ({"delta": delta, "approx_lower_bound": a.lower_bound,
             "exact_epsilon_at_delta_max": float(worst[list(deltas).index(delta)]),
             "exact_curve": {"delta": [float(v) for v in deltas], "epsilon": [float(v) for v in worst]}},
            a.warnings)


def _figures_of(bounds: _Bounds) -> dict:
    return {f.name: getattr(bounds, f.name) for f in fields(_Bounds)}


def _read_shifts(cal, source, loo, engine):
    """The leave-one-out of the calibration's query: ``loo`` as given, or read from ``source`` (or the
    Spark engine's ``table``) by ``engine`` (an engine object, :mod:`empdp.engines`; docs/spark.md)."""
    if loo is not None:
        return loo
    if source is None and getattr(engine, "table", None) is None:
        raise InputError("give the source the calibration was made from")
    if cal.id is None or cal.by is None or (cal.kind is JOINT and cal.query is None and cal.sql is None):
        raise InputError("this calibration stores no query (it was made from arrays); pass loo=")
    if cal.kind is JOINT:
        from ..loo.joint import read_joint

        return read_joint(source, id=cal.id, by=cal.by, queries=cal.query, sql=cal.sql, where=cal.where,
                          engine=engine)
    if engine.name != "duckdb":
        from ..noise.source import SourceShifts

        return SourceShifts(cal, source, engine)
    from ..loo import leave_one_out

    return leave_one_out(source, id=cal.id, by=cal.by, query=cal.query, where=cal.where, sql=cal.sql)


def audit_release(calibration, source=None, *, loo=None, top: int = 5, order: float = 2.0,
                  n: int = 20000, N: int = 50000, n_renyi: int = 100000, alpha: float = 0.05,
                  rng=None, progress: Callable[[str, int, int], None] | None = None,
                  hash_key: bytes | None = None, engine="duckdb", key: bytes | None = None,
                  allow_unsigned: bool = False, threads: int | None = None) -> ReleaseAudit:
    """Audit the release described by ``calibration`` on the databases of ``source`` (docs/method.md#94-release-audit).

    Every curator model takes the same path (:func:`_audit_density`) with its own release density: one
    statistic (:class:`OneDensity`) or 2–3 statistics released together
    (:class:`~empdp.audit.joint_release.JointDensity`: MPL and the Rényi bound on the d-dimensional
    release beside the exact ε_i and D_α of its density; the result then names the ``statistics``).

    A calibration against an adversary (``calibrate --adversary``) is audited per adversary bucket
    (docs/method.md#101-adversarial-knowledge): bucket B's release density is P̂_B ⋆ ℓ_{b_B} ⋆ h, its
    databases, its curator scale and the common noise law h; each bucket's bounds run at level
    alpha / K, so that all K hold together with probability ≥ 1 − alpha.

    Parameters
    ----------
    calibration : :class:`empdp.noise.Calibration` or a path to its JSON. A file's HMAC is verified
        under the curator ``key`` before any of its fields is used (an unsigned or forged file is
        refused unless ``allow_unsigned``, unsafe): its query and filter are then run on ``source``.
    source : the data source the calibration was made from (re-read with its query), or
        ``loo``: an object with ``q`` (n,), ``shifts`` (m, n) and optionally ``ids``, ``undefined``
        (and ``labels``, the databases, for a calibration against an adversary); for a joint
        calibration ``q`` (n, d), ``shifts`` (m, n, d) and optionally ``sole``.
    top : number of riskiest individuals audited (by exact ε_i of the release), per bucket.
    order : Rényi order α > 1.
    n, N : MPL sample sizes; n_renyi : Rényi sample size per database.
    progress : optional callback ``progress(stage, done, total)``.
    hash_key : with a key (:func:`empdp.io.load_hash_key`), the ids are reported as keyed
        pseudonyms (:func:`empdp.io.keyed_hash`, as ``assess --hash-ids`` writes them).
    engine : where ``source`` is read, as for :func:`empdp.calibrate`: ``"duckdb"``, ``"spark"`` or
        ``empdp.engines.Spark(master=..., remote=..., table=...)`` (a Spark catalog ``table`` instead
        of ``source``; docs/spark.md).
    threads : threads drawing the release's outputs at once (default: every core); the outputs do not
        depend on it.
    """
    from ..noise import Calibration, JointCalibration, load_calibration

    # check the options before the calibration is read and the exact values computed
    # (order = 1 would otherwise fail in exact_values, after the slow part)
    order, alpha = check_order(order), check_level(alpha)
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise InputError(f"`top` must be a positive integer, got {top!r}", param="top")
    top = int(top)
    n, N, n_renyi = check_size("n", n), check_size("N", N), check_size("n_renyi", n_renyi, 50)
    rng, threads = as_rng(rng), check_threads(threads)
    cal = calibration if isinstance(calibration, (Calibration, JointCalibration)) else \
        load_calibration(calibration, key=key, allow_unsigned=allow_unsigned)
    engine = engine_of(engine)
    loo = _read_shifts(cal, source, loo, engine)
    q, shifts, ids, undefined = _arrays(loo, cal)
    usable = ~undefined & (shifts != 0).reshape(len(shifts), -1).any(axis=1)
    if not usable.any():
        raise InputError("no individual changes the query: nothing to audit")
    warnings = []
    if undefined.any():
        warnings.append(f"{int(undefined.sum())} sole contributor(s) are not audited (no noise protects them)")
    name = (lambda k: keyed_hash(ids[k], hash_key)) if hash_key else (lambda k: ids[k])
    sizes = dict(target=float(cal.epsilon), top=top, order=order, n=n, N=N, n_renyi=n_renyi, rng=rng,
                 threads=threads)
    run = dict(order=float(order), search_size=n, final_size=N, renyi_sample_size=n_renyi, alpha=alpha,
               noise=dict(cal.noise), ids_hashed=bool(hash_key))
    if cal.kind is JOINT:  # 2-3 statistics released together: MPL in d dimensions
        from .joint_release import JointDensity

        bounds, notes = _audit_density(JointDensity(cal, q, shifts, order), np.flatnonzero(usable), name, alpha=alpha,
                                       progress=progress, **sizes)
        model = dict(cal.curator_model)
        return ReleaseAudit(**_figures_of(bounds), warnings=warnings + notes, statistics=list(cal.statistics),
                            curator_model=model, curator_kernel={"kind": model.get("kind"),
                                                                 "scales": model.get("scales")}, **run)
    release = dict(kernel=cal.curator_kernel["kind"], w=float(cal.noise["weight_zero"]),
                   lam=float(cal.noise["scale"]), order=order)
    run["curator_kernel"] = dict(cal.curator_kernel)
    statistic, groups = _stored_buckets(cal, loo)
    if not groups:
        density = OneDensity(q, shifts, b=float(cal.curator_kernel["scale"]), **release)
        bounds, notes = _audit_density(density, np.flatnonzero(usable), name, alpha=alpha, progress=progress,
                                       **sizes)
        return ReleaseAudit(**_figures_of(bounds), warnings=warnings + notes, **run)
    per, notes = _audit_buckets(groups, statistic, q, shifts, usable, name, alpha=alpha, progress=progress,
                                release=release, **sizes)
    everyone = sorted(({**row, "bucket": k} for k, a in enumerate(per) for row in a.individuals),
                      key=lambda row: -row["exact_epsilon"])
    return ReleaseAudit(target_epsilon=float(cal.epsilon), individuals=everyone, **_largest(per),
                        warnings=warnings + notes, buckets=per, adversary_statistic=statistic, **run)


def _largest(per: list) -> dict:
    """The figures of a release audited bucket by bucket: the largest over the buckets (at δ, over those
    audited at δ; the exact curve point by point)."""
    figures = {key: max(getattr(a, key) for a in per) for key in
               ("mpl_lower_bound", "stage1_max_loss", "renyi_lower_bound", "exact_epsilon_max", "exact_renyi_max")}
    at_delta = [a for a in per if a.delta is not None]
    if at_delta:
        curves = np.array([a.exact_curve["epsilon"] for a in at_delta])
        figures.update(delta=at_delta[0].delta,
                       approx_lower_bound=max(a.approx_lower_bound for a in at_delta),
                       exact_epsilon_at_delta_max=max(a.exact_epsilon_at_delta_max for a in at_delta),
                       exact_curve={"delta": at_delta[0].exact_curve["delta"],
                                    "epsilon": curves.max(axis=0).tolist()})
    return figures


def _arrays(loo, cal):
    """``q`` (n,) or for a joint calibration (n, d), ``shifts`` (m, n[, d]), ``ids`` and ``undefined`` (sole
    contributors) of a leave-one-out, with defaults for the optional ones; checked against the calibration."""
    q = np.asarray(loo.q, float)
    if cal.kind is JOINT:
        shifts = np.asarray(loo.shifts, float)
        if q.ndim != 2 or q.shape[1] != cal.d or shifts.shape[1:] != q.shape:
            raise InputError(f"the source gives {q.shape[1] if q.ndim == 2 else 1} statistics over {q.shape[0]} "
                             f"databases, but the calibration has {cal.d} over {cal.n_databases}")
    else:
        shifts = np.atleast_2d(np.asarray(loo.shifts, float)).reshape(-1, q.size)
    ids = getattr(loo, "ids", None)
    undefined = getattr(loo, "undefined", getattr(loo, "sole", None))
    return (q, shifts, list(ids if ids is not None else range(len(shifts))),
            np.asarray(undefined if undefined is not None else np.zeros(len(shifts), bool), bool))


def _stored_buckets(cal, loo):
    """The adversary statistic and the calibration's buckets on ``loo``'s databases (``("", [])`` without)."""
    from ..noise.adversary import stored_buckets

    if not (isinstance(cal.deconvolution, dict) and cal.deconvolution.get("adversary")):
        return "", []
    labels = getattr(loo, "labels", None)
    if labels is None:
        raise InputError("this calibration protects against an adversary: its buckets name databases, so "
                         "the leave-one-out must carry the databases' labels (loo.labels)")
    return stored_buckets(cal.deconvolution, list(labels))


def _audit_buckets(groups, statistic, q, shifts, usable, name, *, alpha, progress, target, release, **sizes):
    """Each bucket's release density P̂_B ⋆ ℓ_{b_B} ⋆ h audited apart, at level alpha / K (Bonferroni)."""
    per, warnings = [], []
    level = alpha / len(groups)
    for k, g in enumerate(groups):
        qb, sb = q[g.databases], shifts[:, g.databases]
        rows = np.flatnonzero(usable & (sb != 0).any(axis=1))
        if not len(rows):  # the release there is the same with or without anyone: ε = 0 exactly
            bounds, notes = _Bounds(target, [], 0.0, 0.0, 0.0, 0.0, 0.0), [
                "no individual changes the query on its databases: nothing to audit there"]
        else:
            stage = None if progress is None else (lambda s, d, t, k=k: progress(f"bucket {k}: {s}", d, t))
            bounds, notes = _audit_density(OneDensity(qb, sb, b=g.scale, **release), rows, name, alpha=level,
                                           progress=stage, target=target, **sizes)
        per.append(BucketAudit(**_figures_of(bounds), lo=g.lo, hi=g.hi, n_databases=int(len(g.databases)),
                               curator_kernel={"kind": release["kernel"], "scale": g.scale}, alpha=level))
        warnings += [f"bucket {k} ({statistic} in [{fmt(g.lo)}, {fmt(g.hi)}]): {note}" for note in notes]
    return per, warnings


def _special():
    """scipy.special, imported on first use (it costs an audit command ~0.4 s that MPL never needs)."""
    from scipy import special

    return special
