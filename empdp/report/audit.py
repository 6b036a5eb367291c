"""The report's audit section: an MPL or Rényi lower bound of one mechanism, or the audit of a
calibrated release (docs/method.md#94-release-audit), per adversary bucket when it has them."""

from __future__ import annotations

import math
from typing import Callable

from ..audit.common import SIZE_KEYS, STAGE1_MAX
from ..errors import InputError
from ..io import FLAG, SCALAR, TEXT, AnyOf, Kind, ListOf, Num, Obj, check_fields
from . import plots
from .markup import Html, code, esc, explain, extra_rows, kv, num, section, table, td, tr, verdict

AUDIT_KINDS = ("mpl", "renyi", "approx", "release")

_EXPLAIN = (
    "A black-box audit runs the mechanism many times on a pair of neighbouring inputs and estimates how far "
    "apart its output distributions are. The lower bound is a statistical guarantee that the true value is at "
    "least this large, with confidence 1 − α; a bound above the claimed ε shows the claim is false. The bounds "
    "are asymptotic: see the sample sizes.")


_NUM = Num(null=True)  # the audit's --json writes a non-finite number as null
_COUNT = Num(0, integer=True, null=True)
_ALPHA = Num(0, 1, null=True)
_KERNEL = Obj({"kind": TEXT, "scale": Num(0, null=True)}, optional=("kind", "scale"))
#: the fields of each kind of audit summary the section shows (others are shown as text), checked
#: before any is used: a file from elsewhere is data
_BOUND = {"lower_bound": _NUM, "estimate": _NUM, "stage1_max_loss": _NUM, "t_hat": _NUM,
          **dict.fromkeys(("search_size", "final_size", "sample_size"), _COUNT), "alpha": _ALPHA,
          "delta": Num(0, 1, null=True), **dict.fromkeys(("p_hat", "p_lower", "q_hat", "q_upper"), Num(0, 1, null=True)),
          "true_value": _NUM, "true_value_infinite": FLAG, "order": Num(gt=0, null=True), "direction": TEXT,
          "warnings": ListOf(TEXT),
          **dict.fromkeys(("loss", "loss_curve"), AnyOf(Kind(type(None)), Obj(
              {"t": ListOf(AnyOf(_NUM, ListOf(_NUM))), "loss": ListOf(_NUM)}, optional=("t", "loss"))))}
_RELEASE = {"target_epsilon": _NUM, "ok": FLAG, "order": Num(gt=0, null=True), "alpha": _ALPHA,
            **dict.fromkeys(("mpl_lower_bound", "stage1_max_loss", "exact_epsilon_max", "renyi_lower_bound",
                             "exact_renyi_max"), _NUM),
            **dict.fromkeys(("search_size", "final_size", "renyi_sample_size"), _COUNT),
            "noise": Obj({"kind": TEXT, "weight_zero": Num(0, 1, null=True), "scale": Num(0, null=True)},
                         optional=("kind", "weight_zero", "scale")),
            "curator_kernel": _KERNEL, "warnings": ListOf(TEXT), "adversary_statistic": TEXT,
            "worst_bucket": _COUNT, "ids_hashed": FLAG, "delta": Num(0, 1, null=True),
            **dict.fromkeys(("approx_lower_bound", "exact_epsilon_at_delta_max"), _NUM),
            "exact_curve": AnyOf(Kind(type(None)), Obj({"delta": ListOf(Num(0, 1)), "epsilon": ListOf(_NUM)})),
            "individuals": ListOf(Obj({"id": SCALAR, "bucket": _COUNT, "exact_epsilon": _NUM,
                                       "stage1_max_loss": _NUM, "mpl_estimate": _NUM, "exact_renyi": _NUM,
                                       "exact_epsilon_at_delta": _NUM},
                                      optional=("id", "bucket", "exact_epsilon", "stage1_max_loss", "mpl_estimate",
                                                "exact_renyi", "exact_epsilon_at_delta"))),
            "buckets": ListOf(Obj({"lo": _NUM, "hi": _NUM, "n_databases": _COUNT, "curator_kernel": _KERNEL,
                                   "alpha": _ALPHA, "ok": FLAG, **dict.fromkeys((
                                       "mpl_lower_bound", "exact_epsilon_max", "renyi_lower_bound",
                                       "exact_renyi_max"), _NUM)},
                                  optional=("lo", "hi", "n_databases", "curator_kernel", "alpha", "ok",
                                            "mpl_lower_bound", "exact_epsilon_max", "renyi_lower_bound",
                                            "exact_renyi_max")))}


#: keys of audit files written before each name followed its flag: checked as the new key is, then
#: renamed to it (a new key in the same file wins); None: dropped (Rényi's "N" repeated its "n")
OLD_KEYS = {"mpl": {"n": "search_size", "N": "final_size", "estimate": "stage1_max_loss",
                    "pair_estimates": "stage1_max_loss_by_pair"},
            "renyi": {"n": "sample_size", "N": None},
            "approx": {"n": "search_size", "N": "final_size", "epsilon_lower_bound": "lower_bound"},
            "release": {"n": "search_size", "N": "final_size", "n_renyi": "renyi_sample_size",
                        "mpl_estimate": "stage1_max_loss"}}
#: what each kind must hold (after renaming)
_KEY = {"mpl": "lower_bound", "renyi": "lower_bound", "approx": "lower_bound", "release": "mpl_lower_bound"}


def _schema(fields: dict, kind: str) -> Obj:
    """Every field optional (:func:`audit_kind` asks for the bound, under its new or old name); an old
    key checked as its new one is."""
    every = {_KEY[kind]: _NUM, **fields}
    every.update({o: every[n] for o, n in OLD_KEYS[kind].items() if n in every})
    return Obj(every, optional=tuple(every))


_SCHEMAS = {kind: _schema(_RELEASE if kind == "release" else _BOUND, kind) for kind in AUDIT_KINDS}


def _renamed(d: dict, old: dict) -> dict:
    """``d`` with its old keys renamed (``old``: old key to new, or None to drop)."""
    out = {k: v for k, v in d.items() if k not in old}
    for k, new in old.items():
        if k in d and new is not None and new not in d:
            out[new] = d[k]
    return out


def current_names(d: dict) -> dict:
    """An audit summary in today's names: the keys of files from earlier versions renamed (:data:`OLD_KEYS`),
    in its sample sizes and individuals too. ``d`` must be a checked summary (:func:`audit_kind`)."""
    kind = d.get("method", "mpl")
    old = OLD_KEYS[kind]
    out = _renamed(d, old)
    if isinstance(out.get("sizes"), dict):
        out["sizes"] = _renamed(out["sizes"], old)
    if isinstance(out.get("individuals"), list):
        out["individuals"] = [_renamed(r, old) if isinstance(r, dict) else r for r in out["individuals"]]
    return out


def _bound_names(kind: str) -> set:
    """The key of the bound of an audit of this kind, and its old names."""
    return {_KEY[kind]} | {old for old, new in OLD_KEYS[kind].items() if new == _KEY[kind]}


def audit_kind(d, path=None) -> str:
    """The kind of an audit summary (``mpl``, ``renyi``, ``approx`` or ``release``), checking it is one.

    Accepts what ``empdp audit mpl|renyi|approx|release --json`` prints (the ``method``
    key), also as written by earlier versions (:data:`OLD_KEYS`), and, as ``mpl``, a plain dict
    with a ``lower_bound``; every field the section shows is checked by type and range (``path``
    names the file in the error).

    Raises
    ------
    InputError
        ``d`` is not an audit summary.
    """
    kind = d.get("method", "mpl") if isinstance(d, dict) else None
    if kind not in AUDIT_KINDS or not _bound_names(kind) & set(d):
        raise InputError("not an empdp audit result: expected the JSON printed by "
                         "'empdp audit mpl|renyi|approx|release --json'")
    check_fields(d, _SCHEMAS[kind], "audit result", path, "; re-create it with 'empdp audit ... --json'")
    return kind


def audit(d: dict, show: Callable = str) -> str:
    """The ``audit`` section of an audit summary (see :func:`audit_kind`); ``show`` formats ids."""
    kind = audit_kind(d)
    d = current_names(d)
    return _release(d, show) if kind == "release" else _approx(d) if kind == "approx" else _bound(d, kind)


def _true_value(d: dict):
    return math.inf if d.get("true_value_infinite") else d.get("true_value")


def _vs_truth(lb, truth) -> str:
    ok = lb is not None and float(lb) <= float(truth)
    return Html("{} {}").format(num(truth), verdict(ok, "(bound holds)", "(bound exceeds the truth)"))


def _bound(d: dict, kind: str) -> str:
    """MPL (pure-DP ε, with its loss curve) or Rényi (D_α) lower bound of one mechanism."""
    lb, truth = d.get("lower_bound"), _true_value(d)
    renyi = kind == "renyi"
    rows = [(f"lower bound on {'D_α' if renyi else 'ε'} (confidence 1 − α)", num(lb)),
            ("point estimate", num(d.get("estimate"))) if renyi else
            (f"{STAGE1_MAX} (biased up: the maximum of noisy estimates)", num(d.get("stage1_max_loss"))),
            ("worst pair", d.get("pair", "–"))]
    rows += [("order α", num(d.get("order"))), ("direction", d.get("direction", "–"))] if renyi else \
        [("output t̂ where the loss peaks", num(d.get("t_hat")))]
    rows += [*_size_rows(d), ("α", num(d.get("alpha")))]
    if truth is not None:
        rows.append((f"true {'D_α' if renyi else 'ε'}", _vs_truth(lb, truth)))
    rows += extra_rows(d, {"method", "lower_bound", "estimate", "stage1_max_loss", "pair", "t_hat", *SIZE_KEYS,
                           "alpha", "true_value", "true_value_infinite", "loss", "order", "direction"})
    parts = [kv(rows)]
    curve = None if renyi else plots.loss_curve(d, lb, truth)
    if curve:
        parts.append(curve)
    parts.append(explain(_EXPLAIN))
    title = f"Audit: Rényi lower bound on D_α (order {num(d.get('order'))})" if renyi else \
        "Audit: MPL lower bound on ε"
    return section("audit", title, *parts)


def _approx(d: dict) -> str:
    """The (ε, δ) audit of one mechanism: the bound on ε at δ, the event and its two probabilities."""
    lb, truth = d.get("lower_bound"), d.get("true_value")
    rule = d.get("event") if isinstance(d.get("event"), dict) else {}
    rows = [(Html("lower bound on ε at δ = {} (confidence 1 − α)").format(num(d.get("delta"))), num(lb)),
            ("worst pair", d.get("pair", "–")),
            ("event", Html("{} {} {}").format(rule.get("score", "–"), rule.get("direction", ""),
                                              num(rule.get("threshold")))),
            ("P(event) on its database", Html("{} (lower bound {})").format(num(d.get("p_hat")),
                                                                            num(d.get("p_lower")))),
            ("P(event) on the other", Html("{} (upper bound {})").format(num(d.get("q_hat")), num(d.get("q_upper")))),
            *_size_rows(d), ("α", num(d.get("alpha")))]
    if truth is not None:
        rows.append((Html("true ε(δ) ({})").format(d.get("true_value_kind") or "exact"), _vs_truth(lb, truth)))
    rows += extra_rows(d, {"method", "lower_bound", "delta", "pair", "p_hat", "p_lower", "q_hat", "q_upper",
                           *SIZE_KEYS, "alpha", "true_value", "true_value_kind"})
    text = ("An (ε, δ) audit counts one event S among fresh outputs of both databases of a pair; every "
            "(ε, δ)-private mechanism has P(S | x) ≤ e^ε P(S | x′) + δ, so exact binomial bounds on the two "
            "probabilities give a lower bound on ε at δ with confidence 1 − α.")
    return section("audit", "Audit: lower bound on ε at δ", kv(rows), explain(text))


def _size_rows(d: dict) -> list:
    """One row per sample size, named as its key and its flag (``search_size``: "search size")."""
    return [(key.replace("_", " "), num(d[key])) for key in SIZE_KEYS if d.get(key) is not None]


def _release(d: dict, show: Callable) -> str:
    """The audit of a calibrated release (docs/method.md#94-release-audit): bounds beside the exact values, per individual."""
    ok, order = d.get("ok"), num(d.get("order"))
    noise, ck = d.get("noise") or {}, d.get("curator_kernel") or {}
    rows = [("result", verdict(ok, "the release meets its target ε", "CHECK FAILED")),
            ("target ε", num(d.get("target_epsilon"))),
            ("MPL lower bound ≤ exact max εᵢ", Html("{} ≤ {}").format(num(d.get("mpl_lower_bound")),
                                                                      num(d.get("exact_epsilon_max")))),
            (f"MPL {STAGE1_MAX} (biased up)", num(d.get("stage1_max_loss"))),
            (f"Rényi lower bound vs exact max D_{order}",
             Html("{} vs {}").format(num(d.get("renyi_lower_bound")), num(d.get("exact_renyi_max")))),
            *_at_delta_rows(d),
            ("noise", Html("{}, weight at 0 {}, scale {}").format(noise.get("kind", "–"), num(noise.get("weight_zero")),
                                                                  num(noise.get("scale")))),
            ("curator kernel", Html("{}, scale {}").format(ck.get("kind", "–"), num(ck.get("scale")))),
            *_size_rows(d), ("α", num(d.get("alpha")))]
    buckets = [b for b in d.get("buckets") or [] if isinstance(b, dict)]
    # an adversary audit gathers every bucket's individuals: each row says which bucket it is from
    by_bucket, at_delta = bool(buckets), d.get("delta") is not None
    head = ("<tr><th>id</th>" + ("<th class='n'>bucket</th>" if by_bucket else "")
            + f"<th class='n'>exact εᵢ</th><th class='n'>MPL {STAGE1_MAX}</th>"
            f"<th class='n'>exact D<sub>{order}</sub></th>"
            + ("<th class='n'>exact εᵢ(δ)</th>" if at_delta else "") + "</tr>")
    body = "".join(tr(td(code(show(r.get("id"))), None), *([r.get("bucket")] if by_bucket else []),
                      r.get("exact_epsilon"), r.get("stage1_max_loss"), r.get("exact_renyi"),
                      *([r.get("exact_epsilon_at_delta")] if at_delta else []))
                   for r in d.get("individuals") or [] if isinstance(r, dict))
    parts = [kv(rows), table(head, body)]
    if buckets:
        parts += _buckets(d, buckets, order)
    parts.append("".join(f'<div class="warn">{esc(w)}</div>' for w in d.get("warnings") or []))
    parts.append(explain(
        "The release's output distribution is sampled for the riskiest individuals, with and "
        "without each of them; the black-box lower bounds must lie below the exact values "
        "computed from the calibration, which must lie below the target. " + _EXPLAIN))
    return section("audit", "Audit of the calibrated release", *parts)


def _at_delta_rows(d: dict) -> list:
    """A curator kernel that is not pure DP: the (ε, δ) audit at its tolerance δ, which sets the verdict,
    and the exact curve ε(δ) (the largest εᵢ(δ) of the audited individuals); none for pure-DP kernels."""
    if d.get("delta") is None:
        return []
    curve = d.get("exact_curve") or {}
    points = Html(", ").join(Html("{} at δ = {}").format(num(e), num(dl))
                             for dl, e in zip(curve.get("delta") or [], curve.get("epsilon") or []))
    return [(Html("(ε, δ) lower bound ≤ exact max εᵢ(δ) ≤ target, at δ = {} (the kernel is not pure DP: this "
                  "sets the verdict)").format(num(d["delta"])),
             Html("{} ≤ {} ≤ {}").format(num(d.get("approx_lower_bound")), num(d.get("exact_epsilon_at_delta_max")),
                                          num(d.get("target_epsilon")))),
            ("exact curve ε(δ)", points)]


def _buckets(d: dict, buckets: list, order: str) -> list[str]:
    """The per-bucket table of an adversary release audit and what it means
    (the terminal shows the same as :func:`empdp.audit.release.describe_buckets`)."""
    stat = d.get("adversary_statistic") or "the adversary statistic"
    worst = d.get("worst_bucket")
    head = ("<tr><th class='n'>bucket</th><th class='n'>statistic from</th><th class='n'>to</th>"
            "<th class='n'>databases</th><th class='n'>curator kernel scale</th><th class='n'>α</th>"
            "<th class='n'>MPL lower bound</th><th class='n'>exact max εᵢ</th>"
            f"<th class='n'>Rényi lower bound</th><th class='n'>exact max D<sub>{order}</sub></th>"
            "<th>verdict</th></tr>")
    body = "".join(
        tr(Html("{}{}").format(k, " (worst)" if k == worst else ""), b.get("lo"), b.get("hi"), b.get("n_databases"),
           (b.get("curator_kernel") or {}).get("scale"), b.get("alpha"), b.get("mpl_lower_bound"),
           b.get("exact_epsilon_max"), b.get("renyi_lower_bound"), b.get("exact_renyi_max"),
           td(verdict(b.get("ok"), "meets the target", "needs more noise"), None))
        for k, b in enumerate(buckets))
    text = (f"The adversary knows <code>{esc(stat)}</code> of every database, so the release is audited group by "
            f"group: the {len(buckets)} groups of databases the calibration cut by it, each with its own curator "
            "kernel scale and the common noise. Each group is audited at α divided by the number of groups, so that "
            "all the bounds hold together; the figures above are the largest over the groups, and the release "
            "meets its target only if every group does.")
    if isinstance(worst, int) and not isinstance(worst, bool) and 0 <= worst < len(buckets):
        text += f" Group {worst} sets the verdict."
    return [table(head, body), explain(text)]
