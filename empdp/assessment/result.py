"""Assessment results on disk: ``empdp assess --save-result`` and ``empdp report`` (docs/method.md).

A result file is one strict-JSON object (``"format": "empdp-result/1"``) with
everything the HTML report draws, so a report can be rendered again later,
with a calibration or an audit beside it, without the data:

- ``summary``: :meth:`empdp.assessment.assess.Assessment.to_dict` (the ``--json`` output,
  for other tools; loading rebuilds it from the fields below);
- the database labels, the query values q_j and the density model (kernel,
  scale, sensitivity, per-point bandwidths b_j, candidates);
- the sweep arrays ε, δ(ε), δ*(ε) and the number at risk;
- the ``TABLE_ROWS`` riskiest rows of the per-individual table (riskiest
  first; ``--out`` writes the whole table) and the dense shift rows Δ_i· of
  the first ``SHIFT_ROWS`` of them, which the riskiest-individuals table and
  the density plots (the paper's Figure 5) need.

A joint assessment (2–3 statistics released together) is saved as ``"format":
"empdp-joint-result/1"`` with the same parts, q_j and the shifts as (n, d) rows, and
the joint model (whitening, its inverse and the scales) instead of the bandwidths.

It names the riskiest individuals and their influence, so it is written
atomically and owner-only (mode 0600); with ``hash_ids`` the ids are replaced
by keyed pseudonyms before anything is written. Non-finite numbers are stored
as the strings ``"inf"``/``"-inf"`` and NaN as null.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np
import polars as pl

from .. import kernels, risk
from ..data import clip as _clip
from ..density import DensityModel
from ..errors import InputError
from ..io import FLAG, SCALAR, TEXT, Kind, ListOf, MapOf, Num, Obj, atomic_path, check_fields, keyed_hash, read_json
from ..risk.buckets import bucket_risk
from ..risk.joint import MAX_DIM, JointModel
from .adversary import Bucket
from .assess import Assessment
from .joint import JointAssessment

FORMAT = "empdp-result/1"
#: the result of a joint release of 2–3 statistics (:class:`SavedJointAssessment`)
JOINT_FORMAT = "empdp-joint-result/1"
#: riskiest rows of the per-individual table kept in the file
TABLE_ROWS = 1000
#: of those, rows whose dense shifts Δ_i· are kept (at least the report's table, ``report.TOP_TABLE``)
SHIFT_ROWS = 20
_FLOAT_COLUMNS = ("eps_i", "delta", "max_abs_shift")


@dataclass(kw_only=True)
class SavedAssessment(Assessment):
    """An :class:`~empdp.assessment.assess.Assessment` read back by :func:`load_result`.

    Everything the report and the terminal summary use behaves as on the live
    result, except: ``individuals`` holds only the saved riskiest rows
    (riskiest first; ``n_individuals`` is still the full count), and
    :meth:`shifts_of` knows only the first :data:`SHIFT_ROWS` of them.
    """

    total_individuals: int = 0
    saved_shifts: np.ndarray | None = field(default=None, repr=False)
    ids_hashed: bool = False

    @property
    def n_individuals(self) -> int:
        return self.total_individuals

    @property
    def has_shifts(self) -> bool:
        return self.saved_shifts is not None and len(self.saved_shifts) > 0

    def riskiest(self, k: int = 10, epsilon: float | None = None) -> pl.DataFrame:
        """The ``k`` riskiest saved individuals at ``epsilon`` (columns as on a live result).

        At the saved ε (the smallest assessed) the rows were ranked and made exact when the file
        was written. At another ε the rows whose shifts are saved get their exact δ_i(ε) and are
        ranked again; :meth:`ranking_note` says when rows without saved shifts could rank higher.
        The individual that sets ε_all stays in the table.
        """
        eps = float(self.epsilons[0] if epsilon is None else epsilon)
        table = self.individuals.with_columns(pl.lit(eps).alias("epsilon"))
        if not self._at_saved_epsilon(eps):
            shifted = min(table.height, 0 if self.saved_shifts is None else len(self.saved_shifts))
            delta = np.full(table.height, np.nan)
            sole = table["sole_contributor"].to_numpy()
            delta[:shifted] = 1.0
            ok = np.flatnonzero(~sole[:shifted] & np.isfinite(self.saved_shifts[:shifted]).all(axis=1))
            if len(ok):
                if self.buckets:
                    _, d, _, _ = bucket_risk(self.buckets, self.saved_shifts[ok], np.array([eps]))
                else:
                    _, d = risk.evaluate(self.model, self.saved_shifts[ok], np.array([eps]))
                delta[ok] = np.where(d[:, 0] <= self.eps_tolerance, 0.0, d[:, 0]) if self.eps_tolerance \
                    else d[:, 0]
            table = table.head(shifted).with_columns(pl.Series("delta", delta[:shifted]))
            table = table.sort(["delta", "eps_i"], descending=True, nulls_last=True)
        top = table.head(k)
        setter = table.filter(pl.col("sets_eps_all"))
        if setter.height and not top["sets_eps_all"].any():
            top = pl.concat([top, setter.head(1)])
        return top.select([self.id_column, "epsilon", "delta", "eps_i", "n_databases", "max_abs_shift",
                           "sole_contributor", "sets_eps_all", *(["bucket"] if "bucket" in top.columns else [])])

    def _at_saved_epsilon(self, eps: float) -> bool:
        return math.isclose(eps, float(self.epsilons[0]), rel_tol=1e-12, abs_tol=0.0)

    def ranking_note(self, eps: float, k: int = 10) -> str:
        """Why the top ``k`` at ``eps`` may not be the whole population's top rows ('' when certified).

        For ε above the saved one, δ_i(ε) ≤ δ_i(saved ε): rows without saved shifts cannot outrank
        a k-th exact δ_i(ε) at least as large as their saved δ_i.
        """
        if self._at_saved_epsilon(eps):
            return ""
        top = self.riskiest(k, eps)
        kept = 0 if self.saved_shifts is None else len(self.saved_shifts)
        first = self.individuals["delta"].to_numpy()
        others = first[kept:] if kept < len(first) else first[-1:] if self.total_individuals > len(first) else []
        plain = top.filter(~pl.col("sets_eps_all"))["delta"].to_numpy()
        if eps > float(self.epsilons[0]) and len(plain) >= k and (
                not len(others) or plain[k - 1] >= float(np.nanmax(others))):
            return ""
        return (f"This result was saved with δ_i at ε = {float(self.epsilons[0]):.4g}; at ε = {eps:.4g} the table "
                "ranks the saved individuals whose shifts the file keeps (render the report from the data, "
                "'empdp assess --report -e', for the whole population).")

    def shifts_of(self, ids) -> np.ndarray:
        """Saved dense shift rows Δ_i· (len(ids), n) of the given individuals."""
        ids = list(ids)
        known = self.individuals[self.id_column].head(0 if self.saved_shifts is None else len(self.saved_shifts))
        pos = {v: k for k, v in enumerate(known.to_list())}
        missing = [v for v in ids if v not in pos]
        if missing:
            raise InputError(f"the result file keeps the shifts of its {len(pos)} riskiest individuals only; "
                             f"not of {missing[:3]}")
        return self.saved_shifts[[pos[v] for v in ids]]


# ------------------------------------------------------------------ encoding

def _enc(values) -> list:
    """Floats for strict JSON: ±inf as strings, NaN and None as null."""
    out = []
    for v in np.asarray(values, dtype=float).ravel().tolist():
        out.append(None if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else v)
    return out


def _dec(values) -> np.ndarray:
    """Inverse of :func:`_enc` (null becomes NaN)."""
    if not isinstance(values, list):
        raise TypeError(f"expected a list of numbers, got {type(values).__name__}")
    return np.array([math.nan if v is None else float(v) for v in values], dtype=float)


def _scalar(v):
    """A JSON-native label or id; anything else (dates, decimals) as its string."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return _enc([v])[0]
    return str(v)


def _plain(obj):
    """Numbers of nested dicts/lists made JSON-safe (the summary, checks and candidates)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return _enc([obj])[0]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    return obj


# ------------------------------------------------------------------ save

def result_dict(a: Assessment, *, hash_ids: bytes | None = None, shifts: bool = True) -> dict:
    """The content of a result file (see the module docstring); ids hashed with the key ``hash_ids``.

    ``shifts=False`` leaves the shift rows out: with them and the query values anyone can
    reconstruct the riskiest individuals' values (for a mean, x = q_j + (n_j − 1)·Δ_ij).
    """
    top = a.riskiest(TABLE_ROWS)
    ids = top[a.id_column].to_list()
    rows = ids[:SHIFT_ROWS] if shifts else []
    shifts = a.shifts_of(rows) if rows else np.zeros((0, a.n_databases))
    show = _shown(hash_ids)
    m = a.model
    return _common(a, FORMAT, hash_ids) | {
        "query": a.query,
        "q": _enc(a.q),
        "model": _model_dict(m) | {"candidates": _plain(m.candidates)},
        "representativeness": _plain(a.representativeness),
        "n_evaluated": int(a.n_evaluated),
        "screening": bool(a.screening),
        "individuals": _table_dict(top, a.id_column, show, _FLOAT_COLUMNS)
        | {"sets_eps_all": [bool(v) for v in top["sets_eps_all"]]},
        "individuals_epsilon": _enc(a.epsilons[:1])[0],
        "shifts": [_enc(row) for row in shifts],
        **({"adversary": _plain(a.adversary), "bucket_models": [_model_dict(b.model) | {"databases": [
            int(j) for j in b.databases]} for b in a.buckets]} if a.adversary else {}),
    }


def _shown(hash_ids: bytes | None):
    """How the file writes an id: its keyed hash, or as it is."""
    return (lambda v: keyed_hash(v, hash_ids)) if hash_ids else _scalar


def _common(a, fmt: str, hash_ids: bytes | None) -> dict:
    """The parts of a result file every assessment has (one statistic or several)."""
    from .. import __version__

    return {
        "format": fmt, "empdp_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ids_hashed": bool(hash_ids) or bool(getattr(a, "ids_hashed", False)),
        "summary": _plain(a.to_dict()),
        "source": a.source, "id": a.id_column, "by": a.by_column, "labels": [_scalar(v) for v in a.labels],
        "sweep": {"epsilon": _enc(a.epsilons), "delta": _enc(a.delta), "total_risk": _enc(a.total_risk),
                  "n_at_risk": [int(v) for v in a.n_at_risk]},
        "eps_all": _enc([a.eps_all])[0], "independence": _plain(a.independence), "warnings": list(a.warnings),
        "sole_contributors": int(a.sole_contributors), "n_individuals": int(a.n_individuals),
    }


def _table_dict(top: pl.DataFrame, id_col: str, show, floats) -> dict:
    """The saved rows of the per-individual table."""
    return {id_col: [show(v) for v in top[id_col]], **{c: _enc(top[c].to_numpy()) for c in floats},
            "n_databases": [int(v) for v in top["n_databases"]],
            "sole_contributor": [bool(v) for v in top["sole_contributor"]]}


def _model_dict(m: DensityModel) -> dict:
    return {"kernel": m.kernel.name, "scale": float(m.scale), "sensitivity": float(m.sensitivity),
            "bandwidths": _enc(m.bandwidths), "loglik": _enc([m.loglik])[0], "selected_by": m.selected_by}


def save_result(a: Assessment, path, *, hash_ids: bytes | None = None, shifts: bool = True) -> None:
    """Write the result file of ``a`` to ``path`` atomically, owner-only (mode 0600).

    Parameters
    ----------
    a : Assessment or JointAssessment
        A live result of :func:`empdp.assessment.assess` (it needs its data for the shift rows), or of
        :func:`empdp.assessment.joint.assess_joint`.
    hash_ids : bytes, optional
        Key of :func:`empdp.io.keyed_hash`: ids are saved as pseudonyms.
    shifts : bool
        Keep the shift rows of the riskiest individuals (the report's density plots need them).
        They reveal those individuals' values to anyone who reads the file: ``False`` for a
        file to share.
    """
    if isinstance(a, JointAssessment):
        content = joint_result_dict(keep_shifts(a), hash_ids=hash_ids, shifts=shifts)
    else:
        content = result_dict(a, hash_ids=hash_ids, shifts=shifts)
    text = json.dumps(content, allow_nan=False)
    with atomic_path(path, private=True) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")


# ------------------------------------------------------------------ load

def _kind_hint(d: Any) -> str:
    fmt = d.get("format") if isinstance(d, dict) else None
    if isinstance(fmt, str) and fmt.startswith("empdp-calibration"):
        return "; it is a calibration file (give it with --calibration)"
    if isinstance(d, dict) and d.get("method") in ("mpl", "renyi", "release"):
        return "; it is an audit result (give it with --audit)"
    return ""


# What each field of a result file must hold, checked before any is used (a file from elsewhere is data).
# Floats are written by _enc: ±inf as "inf"/"-inf", NaN as null.
_P = Num(0, 1, null=True)  # a probability
_COUNT = Num(0, integer=True)
_EPS = Num(0, null=True, inf=True)
_FLOAT = Num(null=True, inf=True)
_SWEEP = Obj({"epsilon": ListOf(Num(0), min=1), "delta": ListOf(_P), "total_risk": ListOf(_P),
              "n_at_risk": ListOf(_COUNT)})
_SELECTED = Kind(choices=("fixed", "loo-likelihood"))
_INDEPENDENCE = Obj({"ljung_box_p": _P, "trend_p": _P})
#: the fields every result has (:func:`_common`)
_COMMON = {"ids_hashed": FLAG, "source": TEXT, "id": TEXT, "by": TEXT, "labels": ListOf(SCALAR, min=2),
           "sweep": _SWEEP, "eps_all": _EPS, "warnings": ListOf(TEXT), "sole_contributors": _COUNT,
           "n_individuals": _COUNT}


def _model_schema(**more) -> Obj:
    return Obj({"kernel": Kind(choices=kernels.names()), "scale": Num(gt=0, hi=1e300),
                "sensitivity": Num(0, 1e300), "bandwidths": ListOf(Num(gt=0, hi=1e300)), "loglik": _FLOAT,
                "selected_by": _SELECTED, "candidates": ListOf(Obj({})), **more}, optional=("candidates",))


def _table_schema(id_col, floats) -> Obj:
    return Obj({**({id_col: ListOf(SCALAR, same_kind=True)} if isinstance(id_col, str) else {}), "eps_i": ListOf(_EPS),
                "delta": ListOf(_P), **{c: ListOf(Num(0, null=True, inf=True)) for c in floats[2:]},
                "n_databases": ListOf(_COUNT), "sole_contributor": ListOf(FLAG), "sets_eps_all": ListOf(FLAG)},
               optional=("sets_eps_all",))


def _result_schema(d: dict) -> Obj:
    """The fields a result of one statistic must hold (its id column names a column of its table)."""
    buckets = ListOf(Obj({"lo": Num(), "hi": Num(), "n_databases": _COUNT, "eps_all": _EPS,
                          "bandwidth": Num(gt=0), "databases": ListOf(SCALAR)}), min=1)
    unconditional = Obj({"eps_all": _EPS, "sweep": ListOf(Obj({"epsilon": Num(0), "total_risk": _P}))})
    return Obj({**_COMMON, "query": TEXT, "independence": _INDEPENDENCE, "q": ListOf(Num()),
                "model": _model_schema(),
                "representativeness": Obj({"median_databases_per_individual": Num(0, null=True),
                                           "share_in_one_database": Num(0, 1), "share_in_all_databases": Num(0, 1),
                                           "histogram": MapOf(_COUNT)}),
                "n_evaluated": _COUNT, "screening": FLAG, "individuals": _table_schema(d.get("id"), _FLOAT_COLUMNS),
                "individuals_epsilon": Num(0, null=True), "shifts": ListOf(ListOf(_FLOAT)),
                "adversary": Obj({"statistic": TEXT, "buckets": buckets, "unconditional": unconditional}),
                "bucket_models": ListOf(_model_schema(databases=ListOf(_COUNT)), min=1)},
               optional=("ids_hashed", "individuals_epsilon", "adversary", "bucket_models"))


def _joint_schema(d: dict) -> Obj:
    """The fields a joint result (2–3 statistics) must hold."""
    dim = len(d["queries"]) if isinstance(d.get("queries"), list) else 0
    matrix = ListOf(ListOf(Num()))
    return Obj({"queries": ListOf(TEXT, 2, MAX_DIM), **_COMMON, "independence": ListOf(_INDEPENDENCE),
                "q": matrix, "model": Obj({"whitening": matrix, "unwhitening": matrix, "scales": ListOf(Num(gt=0)),
                                           "loglik": _FLOAT, "selected_by": _SELECTED,
                                           "candidates": ListOf(Obj({}))}, optional=("candidates",)),
                "individuals": _table_schema(d.get("id"), _joint_float_columns(dim)),
                "shifts": Obj({"ids": ListOf(SCALAR, same_kind=True), "rows": ListOf(ListOf(ListOf(_FLOAT)))})},
               optional=("ids_hashed",))


def load_result(path) -> SavedAssessment | SavedJointAssessment:
    """Read a result file written by :func:`save_result` (of one statistic, or of a joint release).

    Raises
    ------
    InputError
        The file is missing, not JSON, not an empdp result, or damaged.
    """
    d = read_json(path, "result file", " (write one with 'empdp assess ... --save-result FILE')")
    joint = isinstance(d, dict) and d.get("format") == JOINT_FORMAT
    if not isinstance(d, dict) or d.get("format") not in (FORMAT, JOINT_FORMAT):
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise InputError(f"{str(path)!r} is not an empdp result file (format {got!r}, expected {FORMAT!r})"
                         + _kind_hint(d))
    check_fields(d, _joint_schema(d) if joint else _result_schema(d), "result file", path,
                 "; re-create it with 'empdp assess ... --save-result FILE'")
    try:
        return _joint_from_dict(d) if joint else _from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, pl.exceptions.PolarsError) as exc:
        what = f"missing {exc}" if isinstance(exc, KeyError) else _clip(" ".join(str(exc).split()), 160)
        raise InputError(f"result file {str(path)!r} is damaged or incomplete: {what}") from None


def _representativeness(rep: dict) -> dict:
    """JSON turned the histogram's keys (numbers of databases) into strings: turn them back."""
    rep = dict(rep)
    rep["histogram"] = {int(k): int(v) for k, v in rep.get("histogram", {}).items()}
    return rep


def _sweep(sweep: dict) -> tuple:
    """ε, δ(ε), δ*(ε) and the at-risk counts of a file's sweep, checked."""
    eps, delta, total = _dec(sweep["epsilon"]), _dec(sweep["delta"]), _dec(sweep["total_risk"])
    at_risk = np.asarray(sweep["n_at_risk"], dtype=np.int64)
    if not (len(eps) == len(delta) == len(total) == len(at_risk) >= 1) or not np.all(np.isfinite(eps)):
        raise ValueError("the sweep arrays differ in length or hold a non-finite epsilon")
    return eps, delta, total, at_risk


def _table(ind: dict, id_col: str, floats) -> pl.DataFrame:
    """The saved rows of the per-individual table (the columns :func:`_table_dict` writes)."""
    return pl.DataFrame({
        id_col: pl.Series(id_col, list(ind[id_col])),
        **{c: pl.Series(c, _dec(ind[c]), dtype=pl.Float64, nan_to_null=True) for c in floats},
        "n_databases": pl.Series("n_databases", ind["n_databases"], dtype=pl.Int64),
        "sole_contributor": pl.Series("sole_contributor", ind["sole_contributor"], dtype=pl.Boolean),
    }).select([id_col, "eps_i", "delta", "n_databases", *floats[2:], "sole_contributor"])


def _from_dict(d: dict) -> SavedAssessment:
    labels, q = list(d["labels"]), _dec(d["q"])
    n = len(labels)
    md = d["model"]
    bandwidths = _dec(md["bandwidths"])
    eps, delta, total, at_risk = _sweep(d["sweep"])
    if not (len(q) == len(bandwidths) == n and n >= 2):
        raise ValueError(f"{len(q)} query values and {len(bandwidths)} bandwidths for {n} databases")
    ind, id_col = d["individuals"], d["id"]
    table = _table(ind, id_col, _FLOAT_COLUMNS).with_columns(
        # files written before the table was ranked exactly did not mark the ε_all individual
        pl.Series("sets_eps_all", ind.get("sets_eps_all", [False] * len(ind[id_col])), dtype=pl.Boolean))
    shifts = np.array([_dec(row) for row in d["shifts"]], dtype=float).reshape(-1, n)
    if len(shifts) > table.height:
        raise ValueError(f"{len(shifts)} shift rows for {table.height} individuals")
    model = DensityModel(kernel=md["kernel"], scale=float(md["scale"]), sensitivity=float(md["sensitivity"]),
                         points=q, bandwidths=bandwidths, loglik=float(_dec([md["loglik"]])[0]),
                         selected_by=md["selected_by"], candidates=list(md.get("candidates", [])))
    adversary, buckets = d.get("adversary"), None
    if adversary is not None:
        buckets = []
        for bd, bm in zip(adversary["buckets"], d["bucket_models"]):
            cols = np.asarray(bm["databases"], dtype=np.int64)
            bw = _dec(bm["bandwidths"])
            if len(bw) != len(cols) or cols.min(initial=0) < 0 or cols.max(initial=0) >= n:
                raise ValueError("a bucket's databases and bandwidths do not match")
            buckets.append(Bucket(cols, float(bd["lo"]), float(bd["hi"]), DensityModel(
                kernel=bm["kernel"], scale=float(bm["scale"]), sensitivity=float(bm["sensitivity"]),
                points=q[cols], bandwidths=bw, loglik=float(_dec([bm["loglik"]])[0]),
                selected_by=bm["selected_by"]), float(bd["eps_all"])))
    return SavedAssessment(
        source=d["source"], query=d["query"], id_column=id_col, by_column=d["by"], labels=labels, q=q,
        model=model, epsilons=eps, delta=delta, total_risk=total, n_at_risk=at_risk,
        eps_all=float(_dec([d["eps_all"]])[0]), individuals=table, independence=dict(d["independence"]),
        representativeness=_representativeness(d["representativeness"]), warnings=list(d["warnings"]),
        sole_contributors=int(d["sole_contributors"]), n_evaluated=int(d["n_evaluated"]),
        screening=bool(d["screening"]), engine=None, total_individuals=int(d["n_individuals"]),
        saved_shifts=shifts, ids_hashed=bool(d.get("ids_hashed", False)), adversary=adversary, buckets=buckets)



# ------------------------------------------------------------------ joint releases (2–3 statistics)

@dataclass(kw_only=True)
class SavedJointAssessment(JointAssessment):
    """A :class:`~empdp.assessment.joint.JointAssessment` with the shift rows Δ_i (n, d) of its riskiest
    individuals, which the report's contours and the result file need: a live one's (:func:`keep_shifts`),
    or one read back by :func:`load_result` (``individuals`` then holds the saved riskiest rows only;
    ``n_individuals`` is still the full count)."""

    total_individuals: int = 0
    saved_ids: list = field(default_factory=list)
    saved_shifts: np.ndarray | None = field(default=None, repr=False)
    ids_hashed: bool = False

    @property
    def n_individuals(self) -> int:
        return self.total_individuals

    def shifts_of(self, ids) -> np.ndarray:
        """Saved shift rows (len(ids), n, d) of the given individuals."""
        pos = {v: k for k, v in enumerate(self.saved_ids)}
        missing = [v for v in ids if v not in pos]
        if missing:
            raise InputError(f"the result keeps the shifts of its {len(pos)} riskiest individuals only; "
                             f"not of {missing[:3]}")
        return self.saved_shifts[[pos[v] for v in ids]]


def keep_shifts(a: JointAssessment) -> SavedJointAssessment:
    """``a`` with the shift rows Δ_i (n, d) of its :data:`SHIFT_ROWS` riskiest individuals, taken from
    those it holds (``a.shifts``; none when it holds none), for the report's contours and the file."""
    if isinstance(a, SavedJointAssessment):
        return a
    ids = a.riskiest(SHIFT_ROWS)[a.id_column].to_list() if a.shifts is not None else []
    pos = {v: k for k, v in enumerate(a.individuals[a.id_column].to_list())}
    shifts = a.shifts[[pos[v] for v in ids]] if ids else np.zeros((0, a.n_databases, a.model.d))
    fields = {f.name: getattr(a, f.name) for f in dataclass_fields(a)}
    return SavedJointAssessment(**fields, total_individuals=a.individuals.height, saved_ids=ids, saved_shifts=shifts)


def _rows(values) -> list:
    return [_enc(row) for row in np.asarray(values, dtype=float)]


def joint_result_dict(a: SavedJointAssessment, *, hash_ids: bytes | None = None, shifts: bool = True) -> dict:
    """The content of a joint result file: as :func:`result_dict`, for 2–3 statistics."""
    top = a.riskiest(TABLE_ROWS)
    kept = [v for v in top[a.id_column] if v in set(a.saved_ids)][:SHIFT_ROWS] if shifts else []
    show = _shown(hash_ids)
    m = a.model
    return _common(a, JOINT_FORMAT, hash_ids) | {
        "queries": list(a.queries), "q": _rows(a.q),
        "model": {"whitening": _rows(m.whitening), "unwhitening": _rows(m.unwhitening), "scales": _enc(m.scales),
                  "loglik": _enc([m.loglik])[0], "selected_by": m.selected_by, "candidates": _plain(m.candidates)},
        "individuals": _table_dict(top, a.id_column, show, _joint_float_columns(m.d)),
        "shifts": {"ids": [show(v) for v in kept], "rows": [_rows(s) for s in a.shifts_of(kept)] if kept else []},
    }


def _joint_float_columns(d: int) -> tuple:
    return ("eps_i", "delta", *[f"max_abs_shift_{k + 1}" for k in range(d)])


def _matrix(values, shape: tuple, what: str, finite: bool = True) -> np.ndarray:
    if not isinstance(values, list):
        raise TypeError(f"{what} is not a list")
    out = np.array([_dec(row) for row in values], dtype=float).reshape(-1, *shape[1:]) if values else \
        np.zeros((0, *shape[1:]))
    if (shape[0] is not None and out.shape[0] != shape[0]) or (finite and not np.all(np.isfinite(out))):
        raise ValueError(f"{what} has shape {out.shape} or a non-finite value; expected {shape}")
    return out


def _joint_model(md: dict, q: np.ndarray) -> JointModel:
    d = q.shape[1]
    W, Winv = _matrix(md["whitening"], (d, d), "the whitening"), _matrix(md["unwhitening"], (d, d), "its inverse")
    scales = _dec(md["scales"])
    if scales.shape != (d,) or not np.all(np.isfinite(scales) & (scales > 0)):
        raise ValueError(f"the model needs {d} positive scales")
    with np.errstate(all="ignore"):  # a hand-edited matrix may overflow: then it does not match
        matches = np.linalg.cond(W) <= 1e12 and np.allclose(W @ Winv, np.eye(d), rtol=0, atol=1e-6)
    if not matches:
        raise ValueError("the whitening and its inverse do not match")
    if md["selected_by"] not in ("fixed", "loo-likelihood"):
        raise ValueError(f"unknown model selection {md['selected_by']!r}")
    return JointModel(q, W, Winv, scales, loglik=float(_dec([md["loglik"]])[0]), selected_by=md["selected_by"],
                      candidates=list(md.get("candidates", [])))


def _joint_from_dict(d: dict) -> SavedJointAssessment:
    labels, queries = list(d["labels"]), [str(v) for v in d["queries"]]
    n, dim = len(labels), len(queries)
    if not (2 <= dim <= MAX_DIM and n > dim):
        raise ValueError(f"{dim} statistics over {n} databases")
    q = _matrix(d["q"], (n, dim), "the query values")
    eps, delta, total, at_risk = _sweep(d["sweep"])
    id_col = d["id"]
    table = _table(d["individuals"], id_col, _joint_float_columns(dim))
    sd = d["shifts"]
    saved_ids = list(sd["ids"])
    # a sole contributor's shift is undefined where they are alone: the report draws no such row
    shifts = np.array([_matrix(rows, (n, dim), "a shift row", finite=False) for rows in sd["rows"]]).reshape(-1, n, dim)
    if len(shifts) != len(saved_ids) or not set(saved_ids) <= set(table[id_col].to_list()):
        raise ValueError(f"{len(shifts)} shift rows for {len(saved_ids)} saved ids, or ids not in the table")
    independence = [dict(v) for v in d["independence"]]
    if len(independence) != dim:
        raise ValueError(f"{len(independence)} independence checks for {dim} statistics")
    return SavedJointAssessment(
        source=str(d["source"]), queries=queries, id_column=id_col, by_column=d["by"], labels=labels, q=q,
        model=_joint_model(d["model"], q), epsilons=eps, delta=delta, total_risk=total, n_at_risk=at_risk,
        eps_all=float(_dec([d["eps_all"]])[0]), individuals=table, sole_contributors=int(d["sole_contributors"]),
        warnings=[str(w) for w in d["warnings"]], independence=independence,
        total_individuals=int(d["n_individuals"]), saved_ids=saved_ids, saved_shifts=shifts,
        ids_hashed=bool(d.get("ids_hashed", False)))
