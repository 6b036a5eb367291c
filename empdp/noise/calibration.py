"""The calibration (docs/method.md#8-calibration-and-release): a release mechanism, its file and its releases.

A :class:`Calibration` is what :func:`~empdp.noise.compute.calibrate` computes: the
least noise reaching a target ε. This module holds what a calibration *is*: its
JSON file format (every field checked once, at the boundary; a digest against
accidental edits; an HMAC under the curator key against forgery,
docs/release-security.md), its secure noise (docs/method.md#84-secure-sampling)
and its releases through the ledger (docs/method.md#85-ledger-and-budget).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Callable, ClassVar

import numpy as np

from .. import kernels
from ..digest import VALUE_GIVEN
from ..errors import InputError
from ..io import read_json, write_text
from ..keys import KEY_ENV, key_id, mac, same
from ..models import ONE, CuratorModel
from ..params import MAX_EPSILON
from ..progress import Progress, no_progress
from ..textfmt import fmt
from .ledger import Ledger
from .sampler import NoiseSampler

FORMAT = "empdp-calibration/1"
#: the format of a joint calibration (:mod:`empdp.noise.joint`), named here so one-statistic readers can say so
JOINT_FORMAT = "empdp-joint-calibration/2"
#: every version of the joint calibration file ("/1": its expected |noise| per whitened axis, not per statistic)
JOINT_FORMATS = ("empdp-joint-calibration/1", JOINT_FORMAT)
log = logging.getLogger(__name__)


GUARANTEE = ("empirical differential privacy with respect to the distribution of the query over the "
             "databases, under the curator's density model (see the README); not classical DP")
#: the largest noise or kernel scale a calibration may hold: noise up to ~700 scales must stay a finite double
MAX_SCALE = 1e300
_UNSAFE = "--allow-unsigned (unsafe: see the README)"


def release_guarantee(epsilon: float, noise_added: bool, private: bool) -> str:
    """The one-sentence guarantee a release carries (its JSON ``guarantee``)."""
    if noise_added:
        text = (f"empirical differential privacy at epsilon {epsilon:g} with respect to the distribution of the "
                "query over the databases, under the curator's density model; not classical DP (see the README)")
    else:
        text = (f"no noise was added: the exact value was released, because under the curator's density model the "
                f"data's own spread already gives empirical epsilon {epsilon:g}; not classical DP, and no "
                "protection for a fixed database (see the README)")
    return text if private else "NOT PRIVATE (seeded noise, tests only): " + text


def _classical_note(kind: str) -> str:
    if kind == "laplace":
        return ("classical DP epsilon would be the query's global sensitivity / lambda, and that "
                "sensitivity is not known (only observed shifts are), so no classical bound is claimed")
    if kind == "none":
        return "infinite for a fixed database: no noise is added, the exact value is released"
    return ("infinite for a fixed database: the noise has an atom at 0, so with positive probability "
            "the exact value is released; the guarantee is empirical only")


class SignedFile(ABC):
    """What every calibration file shares (docs/release-security.md): its JSON (:meth:`to_dict`), a SHA-256
    ``digest`` against accidental edits, an HMAC-SHA256 under the curator key against forgery, and the
    checks made when it is read back (:meth:`_open`, :meth:`_sealed`) and before it releases anything
    (:meth:`check_signature`). :class:`Calibration` (one statistic) and
    :class:`empdp.noise.joint.JointCalibration` (2–3 statistics) are the two kinds."""

    #: (key_id, hmac, canonical text, fields, where) of the file this object was read from; None if computed here
    _signature = None

    @abstractmethod
    def _fields(self) -> dict:
        """The object's fields under their JSON names (what a change after loading is checked against)."""

    @abstractmethod
    def to_dict(self) -> dict:
        """The file's JSON without its digest and signature."""

    def to_json(self, key: bytes | None = None) -> str:
        """The file :meth:`save` writes: :meth:`to_dict` plus ``digest``, and with ``key`` its ``key_id`` and
        ``hmac`` (HMAC-SHA256 of the same canonical text as the digest)."""
        d = self.to_dict()
        out = {**d, "digest": self.digest}
        if key is not None:
            out["key_id"], out["hmac"] = key_id(key), mac(key, _canonical(d))
        return json.dumps(out, indent=2, sort_keys=True, allow_nan=False)

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the file this calibration was read from (of :meth:`to_dict` for one
        computed here): ties ledger records to the calibration file as it is, also one of an older format."""
        if self._signature is not None:
            return hashlib.sha256(self._signature[2].encode()).hexdigest() if self._signature[2] else ""
        return _digest(self.to_dict())

    def save(self, path, key: bytes | None = None) -> None:
        """Write the JSON (with its digest, signed with ``key`` if given) atomically, owner-only (0600)."""
        write_text(path, self.to_json(key) + "\n", private=True)

    @property
    def signed(self) -> bool:
        """Whether the file this calibration was read from carries an HMAC (True for one computed here)."""
        return self._signature is None or self._signature[1] is not None

    def check_signature(self, key: bytes | None, allow_unsigned: bool = False) -> None:
        """Refuse a calibration read from a file unless its HMAC verifies under ``key``.

        An unsigned file, or a signed one without a key to check it, passes only
        with ``allow_unsigned`` (unsafe). A calibration computed in this process
        needs no signature. Fields changed in Python after loading are refused.
        """
        if self._signature is not None:
            verify_signature(self._signature, self._fields(), key, allow_unsigned)

    @staticmethod
    def _open(d: dict, where: str, check: Callable[[dict, str], None], key: bytes | None,
              allow_unsigned: bool) -> tuple[dict, tuple, str]:
        """A file's dict without its digest and signature: its HMAC verified first, under ``key`` (unless
        ``allow_unsigned``, unsafe), before any field is used; then its fields checked (``check``) and its
        digest (if any) verified. Returns (fields, (key_id, hmac), the canonical text the HMAC covers)."""
        d = dict(d)
        stored = d.pop("digest", None)
        signature = d.pop("key_id", None), d.pop("hmac", None)
        check_mac(*signature, _canonical(d), where, key, allow_unsigned)
        check(d, where)
        if stored is not None and not (isinstance(stored, str) and stored == _digest(d)):
            raise InputError(f"{where} was edited after 'empdp calibrate' wrote it (its digest does not match "
                             "its contents); re-create it with 'empdp calibrate'")
        return d, signature, _canonical(d)

    def _sealed(self, signature: tuple, text: str, where: str):
        """Remember what the file held, for :meth:`check_signature` before each release (a change made in
        Python after loading is refused there)."""
        self._signature = (*signature, text, json.loads(json.dumps(self._fields())), where)
        return self


@dataclass(kw_only=True)
class Provenance:
    """What every calibration file records besides its mechanism (keyword-only): how private the
    released density was verified to be, the panel's sizes, and the query it was computed from
    (``source``, ``id``, ``by``, ``where``; the statistic itself is each class's own)."""

    verified_eps_max: float
    n_individuals: int
    n_sole_contributors: int
    n_databases: int
    source: str | None = None
    source_description: str | None = None
    id: str | None = None
    by: str | None = None
    where: str | None = None
    seconds: float = 0.0
    warnings: list = field(default_factory=list)


@dataclass
class Calibration(SignedFile, Provenance):
    """A calibrated release mechanism z = f(X) + y, y ~ h (docs/method.md#8-calibration-and-release).

    The attribute names are a contract (the audit of docs/method.md#94-release-audit reads them):
    ``epsilon``, ``lam`` (λ*), ``curator_kernel`` ({kind, scale}), ``noise``
    ({kind, weight_zero, scale}) and the query description ``source``, ``id``,
    ``by``, ``query``, ``where``, ``sql``.
    """

    epsilon: float
    lam: float
    lam_hausdorff: float
    lam_winf: float
    curator_kernel: dict
    noise: dict
    expected_abs_noise: float
    deconvolution: dict = field(default_factory=dict)
    query: str | None = None
    sql: str | None = None
    query_description: str | None = None
    n_bisected: int = 0
    #: calibrated at a level (``calibrate --level``): ``level`` L, ``lambda_level`` λ_L (the noise's scale,
    #: ≥ λ*, at which ε holds for a fraction L of subsamples of the databases), ``lambda_star``,
    #: ``replicates`` and ``method``; None: at λ* (``lam``)
    level: dict | None = None
    #: the curator model calibrated (:mod:`empdp.models`)
    kind: ClassVar[CuratorModel] = ONE

    # ------------------------------------------------------------- JSON
    def _fields(self) -> dict:
        d = asdict(self)
        d["lambda"] = d.pop("lam")
        d["lambda_hausdorff"] = d.pop("lam_hausdorff")
        d["lambda_winf"] = d.pop("lam_winf")
        return d

    def to_dict(self) -> dict:
        """The calibration JSON (docs/method.md#8-calibration-and-release, issue 3 contract) without its digest; ``lambda`` is λ*."""
        d = self._fields()
        d["expected_abs_noise_plain_laplace"] = self.lam
        d["classical_dp_epsilon"] = None
        d["classical_dp_explanation"] = _classical_note(self.noise.get("kind") if isinstance(self.noise, dict)
                                                        else None)
        d["guarantee"] = GUARANTEE
        d["format"] = FORMAT
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "calibration", *, key: bytes | None = None,
                  allow_unsigned: bool = False) -> "Calibration":
        """A calibration from its JSON dict, its signature and then every field checked (``where`` names it
        in errors).

        The ``hmac`` under the curator ``key`` is verified before any field is
        used: a file from elsewhere is data, and an unsigned or forged one is
        refused unless ``allow_unsigned`` (unsafe: then nothing tells a forged
        file apart). A ``digest`` is verified when present, so an accidentally
        edited file is refused; it catches edits, not forgery (anyone can
        recompute a SHA-256). The signature is checked again before
        :meth:`release`.
        """
        if isinstance(d, dict) and d.get("format") in JOINT_FORMATS:
            raise InputError(f"{where} is a joint calibration of {len(d.get('statistics') or [])} statistics; "
                             "this takes the calibration of one statistic (see the README, joint queries)")
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else None
            raise InputError(f"{where} is not an empdp calibration file (format {str(got)[:40]!r}, expected "
                             f"{FORMAT!r}); make one with 'empdp calibrate'")
        d, signature, text = cls._open(d, where, _check_fields, key, allow_unsigned)
        d["lam"], d["lam_hausdorff"], d["lam_winf"] = d.pop("lambda"), d.pop("lambda_hausdorff"), d.pop("lambda_winf")
        cal = cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclass_fields(cls)}})
        return cal._sealed(signature, text, where)

    @classmethod
    def load(cls, path, *, key: bytes | None = None, allow_unsigned: bool = False) -> "Calibration":
        """Read a calibration JSON written by :meth:`save`, refusing damaged or edited files.

        ``key`` and ``allow_unsigned`` as in :meth:`from_dict`.
        """
        d, where = read_calibration_file(path)
        return cls.from_dict(d, where, key=key, allow_unsigned=allow_unsigned)

    # ---------------------------------------------------------- sampling
    def sampler(self, seed: int | None = None) -> NoiseSampler:
        """The secure noise sampler of h (``seed``: tests only, not private)."""
        return NoiseSampler(self.noise["weight_zero"], self.noise["scale"], seed=seed)

    def sample(self, k: int, seed: int | None = None) -> np.ndarray:
        """``k`` draws of the noise y ~ h (from the CSPRNG unless ``seed``)."""
        return self.sampler(seed).sample(int(k))

    @property
    def noise_added(self) -> bool:
        """False when the calibration adds no noise (kind ``none``): releases are the exact value."""
        return self.noise.get("kind") != "none"

    def release(self, value: float, *, ledger=None, budget: float | str | None = None,
                seed: int | None = None, database: str | None = None, progress: Progress | None = None,
                key: bytes | None = None, allow_unsigned: bool = False, source: str | None = None,
                source_digest: str | None = None, expect_head: str | None = None) -> dict:
        """Release value + y, recorded in ``ledger`` under the total-ε ``budget`` (docs/method.md#85-ledger-and-budget).

        A calibration read from a file must carry a valid HMAC under ``key``
        and the ledger must verify under it (:meth:`check_signature`,
        :class:`~empdp.noise.ledger.Ledger`), unless ``allow_unsigned``
        (unsafe: files can then be forged). ``progress("noise and ledger",
        done, 1)`` brackets the draw and the ledger transaction, which waits up
        to 30 s for another writer's lock.

        ``ledger`` must exist unless ``budget`` is given (a number, or
        ``"unlimited"``): only then is a new ledger started. ``source`` and
        ``source_digest`` name the data ``value`` was computed from
        (:func:`empdp.digest.source_digest`, taken before it was read);
        without them the ledger records that the value was given.
        ``expect_head``: a chain head recorded elsewhere that must be in the
        ledger.

        Returns
        -------
        dict
            ``value`` (noisy), ``epsilon``, ``budget_spent``, ``budget_left``,
            ``private`` (False with a seed), ``noise_added`` (False: the exact
            value), ``guarantee`` (what ``private`` means), ``seq``, ``ledger``
            and ``head`` (the ledger's new chain head). Never the true value.

        Raises
        ------
        BudgetExceededError
            When the release would exceed the budget; nothing is written.
        InputError
            Bad fields, a bad signature, a ledger that does not verify.
        """
        _check_fields(self._fields(), "calibration")  # also objects built or changed in Python
        self.check_signature(key, allow_unsigned)
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise InputError(f"the value to release must be a number; got {value!r}") from None
        if not math.isfinite(value):
            raise InputError(f"the value to release must be finite; got {value}")
        sampler = self.sampler(seed)
        fields = dict(query=self.query_description or self.query or self.sql or "value",
                      **origin(source, source_digest), database=database,
                      epsilon=self.epsilon, weight_zero=self.noise["weight_zero"], private=sampler.private,
                      noise_added=self.noise_added, calibration_digest=self.digest)
        fields["lambda"] = self.noise["scale"]
        return record_release(fields, lambda: sampler.release(value), private=sampler.private, ledger=ledger,
                              budget=budget, key=key, allow_unsigned=allow_unsigned, progress=progress,
                              expect_head=expect_head)


def origin(source: str | None, digest: str | None) -> dict:
    """The ledger fields naming what a release was computed from: ``source`` and its digest, or that the
    value was given (:data:`empdp.digest.VALUE_GIVEN`)."""
    if (source is None) != (digest is None):
        raise InputError("give both the source a value was computed from and its digest, or neither")
    return {"source": None if source is None else str(source), "source_digest": digest or VALUE_GIVEN}


def record_release(fields: dict, draw: Callable[[], object], *, private: bool, ledger=None, budget=None,
                   key: bytes | None = None, allow_unsigned: bool = False, progress: Progress | None = None,
                   expect_head: str | None = None) -> dict:
    """Draw a release with ``draw`` and append it to ``ledger`` under ``budget``: one record, one ε spent.

    ``fields`` are the ledger record's (:meth:`empdp.noise.ledger.Ledger.append`); ``draw`` returns
    the noisy value (a number, or a list for a joint release) and runs only once the ledger has
    verified and the budget allows the release. Returns the release dict of :meth:`Calibration.release`.
    """
    epsilon, noise_added = fields["epsilon"], bool(fields["noise_added"])
    progress = progress or no_progress
    progress("noise and ledger", 0, 1)
    t0 = time.perf_counter()
    if ledger is None:
        if budget is not None or expect_head is not None:
            raise InputError("a budget or an expected head needs a ledger to count against; pass a ledger file")
        spent, rec = epsilon, {"noisy_value": draw(), "seq": None, "head": None, "created": False}
        left = None
    else:
        book = Ledger(ledger, key=key, allow_unsigned=allow_unsigned)
        rec = book.append(fields, draw, budget=budget, expect_head=expect_head)
        spent, left = rec["budget_spent"], rec["budget_left"]
    progress("noise and ledger", 1, 1)
    log.info("released with epsilon %s (%s); ledger %s: %s spent, seq %s, in %.2f s", fmt(epsilon),
             "CSPRNG" if private else "seeded, NOT private", ledger, fmt(spent), rec["seq"],
             time.perf_counter() - t0)
    return {"value": rec["noisy_value"], "epsilon": epsilon, "budget_spent": spent,
            "budget_left": left, "private": private, "noise_added": noise_added,
            "guarantee": release_guarantee(epsilon, noise_added, private), "seq": rec["seq"],
            "ledger": None if ledger is None else str(ledger), "head": rec["head"], "created": rec["created"]}


def read_calibration_file(path) -> tuple[dict, str]:
    """The JSON dict of a calibration file and its name for errors; a file that is not JSON is refused in one line."""
    where = f"calibration file {str(path)!r}"
    try:
        d = read_json(path, "calibration file")
    except InputError:
        raise
    except (RecursionError, ValueError, MemoryError) as exc:  # 10^5 nested brackets, a 5,000-digit integer
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0][:120]
        raise InputError(f"{where} is not a calibration file empdp can read ({why}); re-create it with "
                         "'empdp calibrate'") from None
    return d, where


def verify_signature(signature: tuple, current: dict, key: bytes | None, allow_unsigned: bool = False) -> None:
    """Refuse a calibration file's fields unless their HMAC verifies under ``key`` (docs/release-security.md).

    ``signature`` is (key_id, hmac, canonical text, fields when loaded, where); ``current`` the
    object's fields now (a change made in Python after loading is refused). An unsigned file, or a
    signed one without a key to check it, passes only with ``allow_unsigned`` (unsafe).
    """
    kid, stored, text, fields, where = signature
    if current != fields:
        raise InputError(f"{where} was changed after it was loaded; load it again")
    check_mac(kid, stored, text, where, key, allow_unsigned)


def check_mac(kid, stored, text: str, where: str, key: bytes | None, allow_unsigned: bool = False) -> None:
    """Refuse a calibration file whose ``hmac`` (``stored``, by key id ``kid``) does not verify under ``key``
    over its canonical ``text``; unsigned, or signed without a key to check it, only with ``allow_unsigned``."""
    if stored is None:
        if not allow_unsigned:
            raise InputError(f"{where} is not signed (it was made without a curator key), so a forged or edited "
                             f"file cannot be told apart; re-create it with 'empdp calibrate `key_file` FILE' "
                             f"(or ${KEY_ENV}), or pass {_UNSAFE}", param="key_file")
        return
    if key is None:
        if not allow_unsigned:
            raise InputError(f"{where} is signed with the curator key {str(kid)[:16]}; give it with `key_file` "
                             f"FILE or ${KEY_ENV}", param="key_file")
        return
    if not same(kid, key_id(key)):
        raise InputError(f"{where} was signed with another key (key id {str(kid)[:16]}; the key given has id "
                         f"{key_id(key)}); use the key it was made with, or re-create it with 'empdp calibrate'")
    if not same(stored, mac(key, text)):
        raise InputError(f"{where} was edited after 'empdp calibrate' signed it (its HMAC does not match its "
                         "contents); re-create it with 'empdp calibrate'")


def _canonical(d: dict) -> str:
    """The canonical JSON of a calibration dict: what its digest and HMAC cover ("" if not JSON)."""
    try:
        return json.dumps(d, indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # NaN or a non-JSON value: no file that save() wrote
        return ""


def _digest(d: dict) -> str:
    """SHA-256 of the canonical JSON of a calibration dict (the same text the digest had before files carried it)."""
    text = _canonical(d)
    return hashlib.sha256(text.encode()).hexdigest() if text else ""


_FIX = "re-create the file with 'empdp calibrate'"
_NOISE_KINDS = ("none", "laplace", "laplace_mixture")


def _number(d: dict, key: str, where: str, *, positive: bool = False, integer: bool = False,
            prefix: str = "", at_most: float = math.inf):
    """``d[key]`` if a finite number in [0, at_most] (> 0 with ``positive``), else a one-line InputError."""
    name = prefix + key
    if key not in d:
        raise InputError(f"{where}: field {name!r} is missing; {_FIX}")
    v = d[key]
    ok = isinstance(v, numbers.Integral if integer else numbers.Real) and not isinstance(v, bool)
    if not ok or not math.isfinite(v) or v < 0 or v > at_most or (positive and v == 0):
        need = ("a non-negative integer" if integer else
                f"a number in {'(' if positive else '['}0, {at_most:g}]" if at_most < math.inf
                else f"a finite number {'>' if positive else '>='} 0")
        shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
        raise InputError(f"{where}: field {name!r} must be {need}, got {shown}; {_FIX}")
    return v


def _check_fields(d: dict, where: str) -> None:
    """Check every field of a calibration dict (JSON names) once, at the boundary (docs/method.md#83-deconvolution-the-noise-law)."""
    eps = _number(d, "epsilon", where, positive=True, at_most=MAX_EPSILON)
    lam = _number(d, "lambda", where, at_most=MAX_SCALE)
    for key in ("lambda_hausdorff", "lambda_winf", "expected_abs_noise", "verified_eps_max"):
        _number(d, key, where)
    for key in ("n_individuals", "n_sole_contributors", "n_databases"):
        _number(d, key, where, integer=True)
    if d["verified_eps_max"] > eps:
        raise InputError(f"{where}: verified_eps_max {d['verified_eps_max']!r} exceeds epsilon {eps!r}, which "
                         f"no calibration writes; {_FIX}")
    for key, valid in (("curator_kernel", kernels.names()), ("noise", _NOISE_KINDS)):
        sub = d.get(key)
        if key not in d:
            raise InputError(f"{where}: field {key!r} is missing; {_FIX}")
        if not isinstance(sub, dict):
            raise InputError(f"{where}: field {key!r} must be an object with 'kind' and 'scale', got {sub!r}; {_FIX}")
        if sub.get("kind") not in valid:
            raise InputError(f"{where}: field '{key}.kind' must be one of {', '.join(valid)}, got {sub.get('kind')!r}; "
                             f"{_FIX}")
    _number(d["curator_kernel"], "scale", where, positive=True, prefix="curator_kernel.", at_most=MAX_SCALE)
    noise = d["noise"]
    kind, w = noise["kind"], _number(noise, "weight_zero", where, prefix="noise.", at_most=1.0)
    scale = _number(noise, "scale", where, positive=kind != "none", prefix="noise.", at_most=MAX_SCALE)
    # the weight that each kind has (NoiseSpec.mixture): none 1, laplace 0, laplace_mixture strictly between
    need = {"none": "1", "laplace": "0", "laplace_mixture": "in (0, 1)"}[kind]
    if not {"none": w == 1, "laplace": w == 0, "laplace_mixture": 0 < w < 1}[kind]:
        raise InputError(f"{where}: field 'noise.weight_zero' must be {need} for noise of kind {kind!r}, "
                         f"got {w!r}; {_FIX}")
    if lam == 0 and kind != "none":
        raise InputError(f"{where}: field 'lambda' must be > 0 when noise is added, got {lam!r}; {_FIX}")
    if not math.isclose(d["expected_abs_noise"], (1 - w) * scale, rel_tol=1e-9, abs_tol=1e-300):
        raise InputError(f"{where}: expected_abs_noise {d['expected_abs_noise']!r} does not match the noise "
                         f"(weight_zero {w!r}, scale {scale!r}); {_FIX}")
    for key in ("source", "source_description", "id", "by", "query", "where", "sql", "query_description"):
        if not isinstance(d.get(key), (str, type(None))):
            raise InputError(f"{where}: field {key!r} must be a string or null, got {d[key]!r}; {_FIX}")
    check_sql_fields(d.get("where"), [d.get("sql")], where)
    for key, typ, name in (("deconvolution", dict, "an object"), ("warnings", list, "a list")):
        if not isinstance(d.get(key, typ()), typ):
            raise InputError(f"{where}: field {key!r} must be {name}, got {d[key]!r}; {_FIX}")
    for key in ("n_bisected", "seconds"):
        if key in d:
            _number(d, key, where, integer=key == "n_bisected")
    if d.get("level") is not None:
        _check_level(d, where)


def _check_level(d: dict, where: str) -> None:
    """A calibration at a level: L in (0, 1), λ* as the file's ``lambda``, λ_L ≥ λ*, and the noise at λ_L."""
    level = d["level"]
    if not isinstance(level, dict) or not isinstance(level.get("method"), str):
        raise InputError(f"{where}: field 'level' must be an object with level, lambda_level, lambda_star, "
                         f"replicates and method; {_FIX}")
    L = _number(level, "level", where, prefix="level.", positive=True, at_most=1.0)
    lam_level = _number(level, "lambda_level", where, prefix="level.", at_most=MAX_SCALE)
    lam_star = _number(level, "lambda_star", where, prefix="level.", at_most=MAX_SCALE)
    _number(level, "replicates", where, prefix="level.", integer=True, positive=True)
    noise = d["noise"]
    if L >= 1 or lam_star != d["lambda"] or lam_level < lam_star or (
            noise["kind"] != "none" and noise["scale"] != lam_level):
        raise InputError(f"{where}: field 'level' does not match the calibration (level in (0, 1), lambda_star "
                         f"equal to lambda, lambda_level >= lambda_star and the noise's scale); {_FIX}")


def check_sql_fields(filter_text: str | None, selects: list, where: str) -> None:
    """The SQL a calibration file carries is data: its ``where`` must be one expression and each ``sql``
    one read-only SELECT over ``db`` (docs/user-sql.md), else one line naming the file and the field."""
    if filter_text is None and not any(selects):
        return
    from ..data.guard import check_filter, check_select  # DuckDB's parser, loaded only for such a field

    check_filter(filter_text, f"{where}: field 'where'")
    for text in selects:
        if text is not None:
            check_select(text.strip().rstrip(";").strip(), f"{where}: field 'sql'")
