"""The report's audit section: an MPL or Rényi lower bound of one mechanism, or the audit of a
calibrated release (docs/method.md#94-release-audit), per adversary bucket when it has them."""

from __future__ import annotations

import math
from typing import Callable

from ..errors import InputError
from ..io import FLAG, SCALAR, TEXT, AnyOf, Kind, ListOf, Num, Obj, check_fields
from . import plots
from .markup import Html, code, esc, explain, extra_rows, kv, num, section, table, td, tr, verdict

AUDIT_KINDS = ("mpl", "renyi", "release")

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
_BOUND = {"lower_bound": _NUM, "estimate": _NUM, "t_hat": _NUM, "n": _COUNT, "N": _COUNT, "alpha": _ALPHA,
          "true_value": _NUM, "true_value_infinite": FLAG, "order": Num(gt=0, null=True), "direction": TEXT,
          "warnings": ListOf(TEXT),
          **dict.fromkeys(("loss", "loss_curve"), AnyOf(Kind(type(None)), Obj(
              {"t": ListOf(AnyOf(_NUM, ListOf(_NUM))), "loss": ListOf(_NUM)}, optional=("t", "loss"))))}
_RELEASE = {"target_epsilon": _NUM, "ok": FLAG, "order": Num(gt=0, null=True), "alpha": _ALPHA,
            **dict.fromkeys(("mpl_lower_bound", "mpl_estimate", "exact_epsilon_max", "renyi_lower_bound",
                             "exact_renyi_max"), _NUM),
            **dict.fromkeys(("n", "N", "n_renyi"), _COUNT),
            "noise": Obj({"kind": TEXT, "weight_zero": Num(0, 1, null=True), "scale": Num(0, null=True)},
                         optional=("kind", "weight_zero", "scale")),
            "curator_kernel": _KERNEL, "warnings": ListOf(TEXT), "adversary_statistic": TEXT,
            "worst_bucket": _COUNT, "ids_hashed": FLAG,
            "individuals": ListOf(Obj({"id": SCALAR, "bucket": _COUNT, "exact_epsilon": _NUM,
                                       "mpl_estimate": _NUM, "exact_renyi": _NUM},
                                      optional=("id", "bucket", "exact_epsilon", "mpl_estimate", "exact_renyi"))),
            "buckets": ListOf(Obj({"lo": _NUM, "hi": _NUM, "n_databases": _COUNT, "curator_kernel": _KERNEL,
                                   "alpha": _ALPHA, "ok": FLAG, **dict.fromkeys((
                                       "mpl_lower_bound", "exact_epsilon_max", "renyi_lower_bound",
                                       "exact_renyi_max"), _NUM)},
                                  optional=("lo", "hi", "n_databases", "curator_kernel", "alpha", "ok",
                                            "mpl_lower_bound", "exact_epsilon_max", "renyi_lower_bound",
                                            "exact_renyi_max")))}


def _schema(fields: dict, key: str) -> Obj:
    """Every field optional but the bound ``key``."""
    return Obj({key: _NUM, **fields}, optional=tuple(fields))


_SCHEMAS = {"mpl": _schema(_BOUND, "lower_bound"), "renyi": _schema(_BOUND, "lower_bound"),
            "release": _schema(_RELEASE, "mpl_lower_bound")}


def audit_kind(d, path=None) -> str:
    """The kind of an audit summary (``mpl``, ``renyi`` or ``release``), checking it is one.

    Accepts what ``empdp audit mpl|renyi|release --json`` prints (the ``method``
    key) and, as ``mpl``, a plain dict with a ``lower_bound``; every field the section shows is
    checked by type and range (``path`` names the file in the error).

    Raises
    ------
    InputError
        ``d`` is not an audit summary.
    """
    kind = d.get("method", "mpl") if isinstance(d, dict) else None
    key = "mpl_lower_bound" if kind == "release" else "lower_bound"
    if kind not in AUDIT_KINDS or key not in d:
        raise InputError("not an empdp audit result: expected the JSON printed by "
                         "'empdp audit mpl|renyi|release --json'")
    check_fields(d, _SCHEMAS[kind], "audit result", path, "; re-create it with 'empdp audit ... --json'")
    return kind


def audit(d: dict, show: Callable = str) -> str:
    """The ``audit`` section of an audit summary (see :func:`audit_kind`); ``show`` formats ids."""
    kind = audit_kind(d)
    return _release(d, show) if kind == "release" else _bound(d, kind)


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
            ("point estimate" if renyi else "largest stage-1 loss (biased up: the maximum of noisy estimates)",
             num(d.get("estimate"))), ("worst pair", d.get("pair", "–"))]
    rows += [("order α", num(d.get("order"))), ("direction", d.get("direction", "–"))] if renyi else \
        [("output t̂ where the loss peaks", num(d.get("t_hat")))]
    rows += [("samples n (search) / N (final)", Html("{} / {}").format(num(d.get("n")), num(d.get("N")))),
             ("α", num(d.get("alpha")))]
    if truth is not None:
        rows.append((f"true {'D_α' if renyi else 'ε'}", _vs_truth(lb, truth)))
    rows += extra_rows(d, {"method", "lower_bound", "estimate", "pair", "t_hat", "n", "N", "alpha", "true_value",
                           "true_value_infinite", "loss", "order", "direction"})
    parts = [kv(rows)]
    curve = None if renyi else plots.loss_curve(d, lb, truth)
    if curve:
        parts.append(curve)
    parts.append(explain(_EXPLAIN))
    title = f"Audit: Rényi lower bound on D_α (order {num(d.get('order'))})" if renyi else \
        "Audit: MPL lower bound on ε"
    return section("audit", title, *parts)


def _release(d: dict, show: Callable) -> str:
    """The audit of a calibrated release (docs/method.md#94-release-audit): bounds beside the exact values, per individual."""
    ok, order = d.get("ok"), num(d.get("order"))
    noise, ck = d.get("noise") or {}, d.get("curator_kernel") or {}
    rows = [("result", verdict(ok, "the release meets its target ε", "CHECK FAILED")),
            ("target ε", num(d.get("target_epsilon"))),
            ("MPL lower bound ≤ exact max εᵢ", Html("{} ≤ {}").format(num(d.get("mpl_lower_bound")),
                                                                      num(d.get("exact_epsilon_max")))),
            ("MPL largest stage-1 loss (biased up)", num(d.get("mpl_estimate"))),
            (f"Rényi lower bound vs exact max D_{order}",
             Html("{} vs {}").format(num(d.get("renyi_lower_bound")), num(d.get("exact_renyi_max")))),
            ("noise", Html("{}, weight at 0 {}, scale {}").format(noise.get("kind", "–"), num(noise.get("weight_zero")),
                                                                  num(noise.get("scale")))),
            ("curator kernel", Html("{}, scale {}").format(ck.get("kind", "–"), num(ck.get("scale")))),
            ("samples n / N (MPL), Rényi", Html("{} / {}, {}").format(num(d.get("n")), num(d.get("N")),
                                                                      num(d.get("n_renyi")))),
            ("α", num(d.get("alpha")))]
    buckets = [b for b in d.get("buckets") or [] if isinstance(b, dict)]
    # an adversary audit gathers every bucket's individuals: each row says which bucket it is from
    by_bucket = bool(buckets)
    head = ("<tr><th>id</th>" + ("<th class='n'>bucket</th>" if by_bucket else "")
            + "<th class='n'>exact εᵢ</th><th class='n'>MPL stage-1 max</th>"
            f"<th class='n'>exact D<sub>{order}</sub></th></tr>")
    body = "".join(tr(td(code(show(r.get("id"))), None), *([r.get("bucket")] if by_bucket else []),
                      r.get("exact_epsilon"), r.get("mpl_estimate"), r.get("exact_renyi"))
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
