"""Calibrate and release 2–3 statistics together (docs/method.md#102-joint-queries, issue 19).

The joint release adds noise on each *whitened* axis of the curator's model y = W x,

    z_k ~ w_k δ_0 + (1 − w_k) Laplace(λ_k),   released = x + W^{−1} z,

with λ_k = t b_k and w_k = (b_k/λ_k)², t the least factor that makes every individual
ε-private, verified exactly on the d-dimensional log-ratio (:func:`empdp.noise.joint_exact.joint_minimal_lambda`).
A :class:`JointCalibration` is that mechanism: its file (digest and curator-key HMAC, the
:class:`~empdp.noise.calibration.SignedFile` a one-statistic calibration is too, docs/release-security.md), its secure
noise (one CSPRNG sampler per whitened axis, exact on a 2^-k grid, docs/method.md#84-secure-sampling)
and its releases, each one ledger record holding the vector and spending ε once.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import time
import warnings
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..assessment.checks import few_databases
from ..errors import InputError
from ..loo.joint import read_joint
from ..models import JOINT, CuratorModel
from ..params import MAX_EPSILON, target_epsilon
from ..progress import READING, Progress, no_progress
from ..risk.joint import JointModel, select_joint_model
from ..textfmt import fmt
from .calibration import (
    _FIX,
    GUARANTEE,
    JOINT_FORMAT,
    JOINT_FORMATS,
    MAX_SCALE,
    Calibration,
    Provenance,
    SignedFile,
    _number,
    check_sql_fields,
    origin,
    read_calibration_file,
    record_release,
)
from .joint_exact import JointNoise, joint_minimal_lambda
from .sampler import NoiseSampler, bits_source

FORMAT = JOINT_FORMAT
#: statistics a joint calibration holds (one statistic is a plain :class:`Calibration`)
MIN_DIM, MAX_DIM = 2, 3
log = logging.getLogger(__name__)

_CLASSICAL = ("infinite for a fixed database: the noise of each whitened axis has an atom at 0, so with positive "
              "probability the exact vector is released; the guarantee is empirical only")
_CLASSICAL_NONE = "infinite for a fixed database: no noise is added, the exact vector is released"


@dataclass
class JointCalibration(SignedFile, Provenance):
    """A calibrated joint release mechanism of d = 2 or 3 statistics (docs/method.md#102-joint-queries).

    Matrices and vectors are plain lists (what the JSON holds); :attr:`whitening`,
    :attr:`unwhitening`, :attr:`curator_scales`, :attr:`noise_weights` and :attr:`noise_scales`
    are their arrays.

    Attributes
    ----------
    epsilon : the target ε, spent once per released vector.
    t : the least factor with λ_k = t b_k (1 without noise).
    statistics : each statistic as its query form describes it.
    curator_model : ``{kind: "laplace-product", whitened, whitening (W), unwhitening (W^{-1}),
        scales (b_k, whitened units), selected_by}``: the density model the noise deconvolves.
    noise : ``{kind: "none" | "laplace_mixture", weights (w_k), scales (λ_k), unwhitening}``
        (:meth:`empdp.noise.joint_exact.JointNoise.to_dict`).
    expected_abs_noise : E|noise| of each statistic, in its own units (the noise is W^{−1} z).
    noise_interval_95 : each statistic's central 95% noise interval [−q, q], in its own units.
    verified_eps_max : the largest exact ε_i of the released density (≤ epsilon).
    curator_eps_max : the largest exact ε_i of the curator's own model (ε_all of ``assess``).
    """

    epsilon: float
    t: float
    statistics: list
    curator_model: dict
    noise: dict
    expected_abs_noise: list
    curator_eps_max: float
    noise_interval_95: list | None = None
    query: list | None = None
    sql: list | None = None
    n_evaluated: int = 0
    #: the curator model calibrated (:mod:`empdp.models`)
    kind: ClassVar[CuratorModel] = JOINT

    # ---------------------------------------------------------------- arrays
    @property
    def d(self) -> int:
        return len(self.statistics)

    #: the JSON's matrices and vectors as float arrays: W, W^{−1}, b_k, w_k and λ_k
    whitening = property(lambda self: _floats(self.curator_model["whitening"]))
    unwhitening = property(lambda self: _floats(self.curator_model["unwhitening"]))
    curator_scales = property(lambda self: _floats(self.curator_model["scales"]))
    noise_weights = property(lambda self: _floats(self.noise["weights"]))
    noise_scales = property(lambda self: _floats(self.noise["scales"]))

    @property
    def noise_added(self) -> bool:
        """False when the calibration adds no noise (kind ``none``): releases are the exact vector."""
        return self.noise.get("kind") != "none"

    @property
    def release_scales(self) -> np.ndarray:
        """The Laplace scale of the released density on each whitened axis: λ_k, or b_k without noise."""
        return self.noise_scales if self.noise_added else self.curator_scales

    def release_model(self, q):
        """The released density for the databases ``q`` (n, d), as a :class:`empdp.risk.joint.JointModel`: the product
        Laplace KDE of scales :attr:`release_scales` in the stored whitened coordinates (ℓ_{b_k} ⋆ h_k = ℓ_{λ_k})."""
        q = np.asarray(q, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] != self.d:
            raise InputError(f"the query values must have shape (n, {self.d}); got {q.shape}")
        return JointModel(q, self.whitening, self.unwhitening, self.release_scales, loglik=float("nan"),
                          selected_by="calibration", candidates=[])

    # ------------------------------------------------------------------ JSON
    def _fields(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def to_dict(self) -> dict:
        """The calibration JSON without its digest and signature."""
        d = self._fields()
        d["format"] = FORMAT
        d["guarantee"] = GUARANTEE
        d["classical_dp_epsilon"] = None
        d["classical_dp_explanation"] = _CLASSICAL if self.noise_added else _CLASSICAL_NONE
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "joint calibration", *, key: bytes | None = None,
                  allow_unsigned: bool = False) -> "JointCalibration":
        """A joint calibration from its JSON dict: the HMAC verified first, then every field and the digest,
        as :meth:`Calibration.from_dict`."""
        got = d.get("format") if isinstance(d, dict) else None
        if got not in JOINT_FORMATS:
            raise InputError(f"{where} is not an empdp joint calibration file (format {str(got)[:40]!r}, "
                             f"expected {FORMAT!r}); make one with 'empdp calibrate `query` Q1 `query` Q2'",
                             param="query")
        first = got != FORMAT  # its expected |noise| is per whitened axis: the figures per statistic are derived
        d, signature, text = cls._open(d, where, _check_first if first else _check_fields, key, allow_unsigned)
        if first:
            d.update(_noise_in_units(JointNoise(**{k: _floats(v) if k != "kind" else v
                                                   for k, v in d["noise"].items()})))
        cal = cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclass_fields(cls)}})
        return cal._sealed(signature, text, where)

    # --------------------------------------------------------------- release
    def samplers(self, seed: int | None = None) -> list[NoiseSampler]:
        """One secure sampler per whitened axis, all drawing from one CSPRNG source (``seed``: tests only)."""
        bits = bits_source(seed)
        return [NoiseSampler(float(w), float(lam) if w < 1 else 0.0, bits=bits)
                for w, lam in zip(self.noise["weights"], self.noise["scales"])]

    def check_values(self, values) -> list[float]:
        """``values`` as d finite floats, or a one-line InputError naming what is wrong."""
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            values = [values]
        values = list(np.asarray(values, dtype=object).ravel()) if isinstance(values, np.ndarray) else list(values)
        if len(values) != self.d:
            raise InputError(f"this calibration releases {self.d} statistics together ({', '.join(self.statistics)}); "
                             f"got {len(values)} value(s): give one per statistic, in that order")
        out = []
        for k, v in enumerate(values):
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
            if not ok or not math.isfinite(float(v)):
                shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
                raise InputError(f"value {k + 1} to release must be a finite number; got {shown}")
            out.append(float(v))
        return out

    def draw(self, values, samplers: list[NoiseSampler]) -> list[float]:
        """values + W^{−1} z: each whitened coordinate (W values)_k rounded to its sampler's grid and z_k added
        exactly there (docs/method.md#84-secure-sampling); mapping back by W^{−1} is post-processing."""
        if not self.noise_added:
            return list(values)
        y = self.whitening @ np.asarray(values, dtype=np.float64)
        for yk, s in zip(y, samplers):  # checked before any draw: a refusal reveals nothing of the noise
            if s.t and abs(yk) + 1000 * s.scale > 1e308:
                raise InputError(f"the values' magnitude ({abs(yk):.3g} on a whitened axis) plus the noise "
                                 f"(scale {s.scale:.3g}) could overflow a double; nothing was released")
        noisy = np.array([s.release(float(yk)) for yk, s in zip(y, samplers)])
        return [float(v) for v in self.unwhitening @ noisy]

    def release(self, values, *, ledger=None, budget: float | str | None = None, seed: int | None = None,
                database: str | None = None, progress: Progress | None = None, key: bytes | None = None,
                allow_unsigned: bool = False, source: str | None = None, source_digest: str | None = None,
                expect_head: str | None = None) -> dict:
        """Release the vector ``values`` + noise, one ledger record spending ε once (docs/method.md#85-ledger-and-budget).

        As :meth:`Calibration.release`; ``values`` holds one number per statistic, and the result's
        ``value`` is the list of the released numbers, in the statistics' order.
        """
        _check_fields(self._fields(), "joint calibration")  # also objects built or changed in Python
        self.check_signature(key, allow_unsigned)
        values = self.check_values(values)
        samplers = self.samplers(seed)
        private = samplers[0].private
        fields = dict(query="joint: " + "; ".join(self.statistics), **origin(source, source_digest),
                      database=database, epsilon=self.epsilon, weight_zero=list(self.noise["weights"]),
                      private=private, noise_added=self.noise_added, calibration_digest=self.digest)
        fields["lambda"] = list(self.noise["scales"])
        return record_release(fields, lambda: self.draw(values, samplers), private=private, ledger=ledger,
                              budget=budget, key=key, allow_unsigned=allow_unsigned, progress=progress,
                              expect_head=expect_head)


# ----------------------------------------------------------------------------- file checks
def _floats(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= MAX_SCALE


def _matrix(d: dict, key: str, dim: int, where: str, prefix: str) -> np.ndarray:
    v = d.get(key)
    if not (isinstance(v, list) and len(v) == dim
            and all(isinstance(row, list) and len(row) == dim and all(_real(x) for x in row) for row in v)):
        raise InputError(f"{where}: field '{prefix}{key}' must be a {dim} x {dim} matrix of finite numbers; {_FIX}")
    return np.asarray(v, dtype=np.float64)


def _vector(d: dict, key: str, dim: int, where: str, prefix: str, *, positive=False, at_most=MAX_SCALE) -> np.ndarray:
    v = d.get(key)
    if not isinstance(v, list) or len(v) != dim:
        raise InputError(f"{where}: field '{prefix}{key}' must be a list of {dim} numbers; {_FIX}")
    for k in range(dim):
        _number({key: v[k]}, key, where, positive=positive, prefix=prefix, at_most=at_most)
    return np.asarray(v, dtype=np.float64)


def _check_first(d: dict, where: str) -> None:
    """:func:`_check_fields` for a file of the first format (``empdp-joint-calibration/1``)."""
    _check_fields(d, where, whitened=True)


def _check_noise_in_units(d: dict, dim: int, kind: str, where: str) -> None:
    """Each statistic's expected |noise| and 95% interval [−q, q]: all 0 without noise; with noise every expected
    |noise| > 0 (W^{−1} has no zero row), and q may be 0 only where the atom at 0 holds 95%."""
    expected = _vector(d, "expected_abs_noise", dim, where, "")
    spans = d.get("noise_interval_95")
    if not (isinstance(spans, list) and len(spans) == dim and all(
            isinstance(v, list) and len(v) == 2 and _real(v[0]) and _real(v[1]) and v[0] == -v[1] <= 0
            for v in spans)):
        raise InputError(f"{where}: field 'noise_interval_95' must list {dim} intervals [-q, q]; {_FIX}")
    none = not expected.any() and not any(v[1] for v in spans)
    if (kind == "none" and not none) or (kind != "none" and not expected.all()):
        raise InputError(f"{where}: expected_abs_noise must be > 0 for every statistic when noise is added, and it "
                         f"and noise_interval_95 0 when none is; {_FIX}")


def _noise_in_units(noise) -> dict:
    """What a calibration states of its noise in each statistic's own units (the noise is W^{−1} z)."""
    if noise.kind == "none":
        d = len(noise.scales)
        return {"expected_abs_noise": [0.0] * d, "noise_interval_95": [[0.0, 0.0]] * d}
    return {"expected_abs_noise": noise.expected_abs(), "noise_interval_95": noise.interval(0.95)}


def _check_fields(d: dict, where: str, whitened: bool = False) -> None:
    """Check every field of a joint calibration dict once, at the boundary: shapes, ranges, and that the noise
    is the deconvolution of the curator model it names (w_k = (b_k/λ_k)², λ_k = t b_k, the same W^{−1})."""
    eps = _number(d, "epsilon", where, positive=True, at_most=MAX_EPSILON)
    stats = d.get("statistics")
    if not (isinstance(stats, list) and MIN_DIM <= len(stats) <= MAX_DIM and all(isinstance(s, str) for s in stats)):
        raise InputError(f"{where}: field 'statistics' must list {MIN_DIM} to {MAX_DIM} statistics; {_FIX}")
    dim = len(stats)
    t = _number(d, "t", where, positive=True, at_most=MAX_SCALE)
    for key in ("verified_eps_max", "curator_eps_max"):
        _number(d, key, where)
    for key in ("n_individuals", "n_sole_contributors", "n_databases", "n_evaluated"):
        _number(d, key, where, integer=True)
    if d["verified_eps_max"] > eps:
        raise InputError(f"{where}: verified_eps_max {d['verified_eps_max']!r} exceeds epsilon {eps!r}, which no "
                         f"calibration writes; {_FIX}")
    for key in ("curator_model", "noise"):
        if not isinstance(d.get(key), dict):
            raise InputError(f"{where}: field {key!r} must be an object; {_FIX}")
    cm, noise = d["curator_model"], d["noise"]
    if cm.get("kind") != "laplace-product":
        raise InputError(f"{where}: field 'curator_model.kind' must be 'laplace-product', got {cm.get('kind')!r}; {_FIX}")
    W = _matrix(cm, "whitening", dim, where, "curator_model.")
    Winv = _matrix(cm, "unwhitening", dim, where, "curator_model.")
    if not np.allclose(W @ Winv, np.eye(dim), rtol=0, atol=1e-8):
        raise InputError(f"{where}: 'curator_model.unwhitening' is not the inverse of 'curator_model.whitening'; {_FIX}")
    b = _vector(cm, "scales", dim, where, "curator_model.", positive=True)
    kind = noise.get("kind")
    if kind not in ("none", "laplace_mixture"):
        raise InputError(f"{where}: field 'noise.kind' must be one of none, laplace_mixture, got {kind!r}; {_FIX}")
    w = _vector(noise, "weights", dim, where, "noise.", at_most=1.0)
    lam = _vector(noise, "scales", dim, where, "noise.")
    if not np.array_equal(_matrix(noise, "unwhitening", dim, where, "noise."), Winv):
        raise InputError(f"{where}: 'noise.unwhitening' differs from the curator model's; {_FIX}")
    if kind == "none":
        ok = np.all(w == 1) and np.all(lam == 0) and t == 1
        need = "weights 1, scales 0 and t = 1"
    else:
        ok = (t > 1 and np.allclose(lam, t * b, rtol=1e-9, atol=0)
              and np.allclose(w, (b / np.where(lam > 0, lam, np.inf)) ** 2, rtol=1e-9, atol=1e-300))
        need = "scales t * b_k and weights (b_k / scale_k)^2 with t > 1"
    if not ok:
        raise InputError(f"{where}: noise of kind {kind!r} must have {need}: it must be the deconvolution of the "
                         f"curator model; {_FIX}")
    if whitened:  # the first format: the mean |z_k| on each whitened axis
        if not np.allclose(_vector(d, "expected_abs_noise", dim, where, ""), (1 - w) * lam, rtol=1e-9, atol=1e-300):
            raise InputError(f"{where}: expected_abs_noise does not match the noise; {_FIX}")
    else:
        _check_noise_in_units(d, dim, kind, where)
    for key in ("source", "source_description", "id", "by", "where"):
        if not isinstance(d.get(key), (str, type(None))):
            raise InputError(f"{where}: field {key!r} must be a string or null; {_FIX}")
    for key in ("query", "sql"):
        v = d.get(key)
        if not (v is None or (isinstance(v, list) and len(v) == dim and all(isinstance(s, str) for s in v))):
            raise InputError(f"{where}: field {key!r} must be null or a list of {dim} strings; {_FIX}")
    check_sql_fields(d.get("where"), d.get("sql") or [], where)
    if not isinstance(d.get("warnings", []), list):
        raise InputError(f"{where}: field 'warnings' must be a list; {_FIX}")
    if "seconds" in d:
        _number(d, "seconds", where)


def load_calibration(path, *, key: bytes | None = None, allow_unsigned: bool = False):
    """A :class:`Calibration` or :class:`JointCalibration` from its file, by its ``format``: its HMAC under
    ``key`` verified before any field is used (unsigned files only with ``allow_unsigned``, unsafe), then
    every field; damaged or edited files are refused."""
    d, where = read_calibration_file(path)
    if isinstance(d, dict) and d.get("format") in JOINT_FORMATS:
        return JointCalibration.from_dict(d, where, key=key, allow_unsigned=allow_unsigned)
    return Calibration.from_dict(d, where, key=key, allow_unsigned=allow_unsigned)


# ----------------------------------------------------------------------------- calibrate
def calibrate_joint_values(q, shifts, *, epsilon: float, bandwidth="auto", undefined=None, names=None,
                           progress: Progress | None = None) -> JointCalibration:
    """Calibrate the joint release of the (n, d) query values ``q`` with leave-one-out ``shifts`` (m, n, d).

    Parameters
    ----------
    q : (n, d) array_like, d = 2 or 3
        The statistics of each database.
    shifts : (m, n, d) array_like
        Δ_ij = q_j − q_j(without i), 0 where i is absent.
    epsilon : float
        Target empirical ε of the released vector.
    bandwidth : ``"auto"`` or d positive scales
        The curator's model (:func:`empdp.risk.joint.select_joint_model`): whitened product Laplace
        kernels by leave-one-out likelihood, or fixed scales in the statistics' units (W = I).
    undefined : (m,) bool, optional
        Sole contributors: excluded (no noise protects them), counted and warned about.
    names : d str, optional
        The statistics' descriptions (messages, the file's ``statistics``).

    Returns
    -------
    JointCalibration
        No noise exactly when the curator's model is already ε-private for everyone (``assess``
        with the same statistics and bandwidth finds nobody at risk at ε).
    """
    t0 = time.perf_counter()
    epsilon = target_epsilon(epsilon)
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 2 or not MIN_DIM <= q.shape[1] <= MAX_DIM:
        raise InputError(f"a joint calibration takes {MIN_DIM} to {MAX_DIM} statistics (q of shape (n, d)); got "
                         f"shape {q.shape}; calibrate one statistic with calibrate(query=...)")
    n, dim = q.shape
    s = np.asarray(shifts, dtype=np.float64)
    if s.ndim != 3 or s.shape[1:] != (n, dim):
        raise InputError(f"shifts must have shape (m, {n}, {dim}); got {s.shape}")
    if not (np.isfinite(q).all() and np.isfinite(s).all()):
        raise InputError("query values and leave-one-out shifts must be finite")
    undefined = np.zeros(len(s), bool) if undefined is None else np.asarray(undefined, bool)
    if len(undefined) and undefined.all():
        raise InputError(f"every individual ({len(undefined)}) is the only contributor to some database: no noise "
                         "level can protect them and there is nothing to calibrate")
    names = [f"statistic {k + 1}" for k in range(dim)] if names is None else [str(x) for x in names]
    progress = progress or no_progress
    progress("density model", 0, 1)
    model = select_joint_model(q, bandwidth=bandwidth, names=names)
    progress("density model", 1, 1)
    rows = ~undefined & (s != 0).any(axis=(1, 2))
    progress("noise scale search", 0, 1)
    found = joint_minimal_lambda(model, s[rows], epsilon)
    progress("noise scale search", 1, 1)
    eps_max = float(found.eps.max(initial=0.0))
    if eps_max > epsilon:  # pragma: no cover - joint_minimal_lambda verifies before it returns
        raise RuntimeError(f"verification failed: max eps_i = {eps_max} > {epsilon}")
    noise = found.noise
    notes = few_databases(len(q), "the calibration")
    if undefined.any():
        notes.append(f"{int(undefined.sum())} sole contributor(s) (the only individual in some database) cannot be "
                     "protected by any noise level: their presence alone is revealed; they are excluded")
    if noise.kind == "none":
        notes.append("no noise is added: the curator's joint density model is already epsilon-private for every "
                     "individual (assess with the same statistics finds nobody at risk at this epsilon), so the "
                     "exact vector is released")
    for note in notes:
        warnings.warn(note, stacklevel=2)
    log.info("joint calibration: %d statistics, t = %s, noise scales %s (whitened), verified_eps_max %s, "
             "%d individuals evaluated, in %.2f s", dim, fmt(found.t), [fmt(v) for v in noise.scales],
             fmt(eps_max), found.n_evaluated, time.perf_counter() - t0)
    curator = {"kind": "laplace-product", "whitened": bool(model.whitened), "whitening": model.whitening.tolist(),
               "unwhitening": model.unwhitening.tolist(), "scales": model.scales.tolist(),
               "selected_by": model.selected_by}
    return JointCalibration(
        epsilon=epsilon, t=float(found.t), statistics=names, curator_model=curator, noise=noise.to_dict(),
        **_noise_in_units(noise), verified_eps_max=eps_max,
        curator_eps_max=float(found.eps_curator.max(initial=0.0)), n_individuals=int(len(s)),
        n_sole_contributors=int(undefined.sum()), n_databases=int(n), n_evaluated=int(found.n_evaluated),
        seconds=time.perf_counter() - t0, warnings=notes)


def calibrate_joint(source: Any, *, id: str, by: str, epsilon: float, queries=None, sql=None,
                    where: str | None = None, bandwidth="auto", memory_limit: str | None = None,
                    drop_null_ids: bool = False, threads: int | None = None,
                    progress: Progress | None = None, engine: Any = "duckdb") -> JointCalibration:
    """Calibrate noise for 2–3 statistics of each database of ``source`` released together.

    ``queries`` (named query forms) or ``sql`` (SQL over ``db``): one per statistic; ``engine`` where they
    are read (:func:`empdp.loo.joint.read_joint`). The other parameters as for :func:`empdp.noise.calibrate`
    and :func:`calibrate_joint_values`.
    """
    progress = progress or no_progress
    t0 = time.perf_counter()
    progress(READING, 0, 0)
    panel = read_joint(source, id=id, by=by, queries=queries, sql=sql, where=where, drop_null_ids=drop_null_ids,
                       memory_limit=memory_limit, threads=threads, engine=engine)
    progress(READING, 1, 1)
    log.info("read %s: %d databases, %d individuals, %d statistics, in %.2f s", source, len(panel.labels),
             len(panel.ids), panel.d, time.perf_counter() - t0)
    cal = calibrate_joint_values(panel.q, panel.shifts, epsilon=epsilon, bandwidth=bandwidth, undefined=panel.sole,
                                 names=panel.names, progress=progress)
    cal.source = str(source) if isinstance(source, (str, Path)) else None
    cal.source_description = cal.source or type(source).__name__
    cal.id, cal.by, cal.where = id, by, where
    cal.query = None if queries is None else list(queries)
    cal.sql = None if sql is None else list(sql)
    cal.seconds = time.perf_counter() - t0
    return cal
