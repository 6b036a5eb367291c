"""The report page: its sections in order under a header, as one string or an owner-only file."""

from __future__ import annotations

import datetime as _dt

from .. import params
from ..assessment.result import keep_shifts
from ..errors import InputError
from ..io import atomic_path
from . import assessment as _a
from . import grouped as _g
from . import joint as _j
from .audit import audit as audit_section
from .audit import audit_kind
from .calibration import calibration as calibration_section
from .markup import CSS, esc, id_formatter

#: ids of the sections always present, in page order
SECTIONS = ("summary", "risk-curves", "at-risk", "riskiest", "densities", "representativeness")
#: ids of the optional sections
OPTIONAL_SECTIONS = ("adversary", "calibration", "audit")


def report_html(assessment, *, epsilon: float | None = None, calibration: dict | None = None,
                audit: dict | None = None, hash_ids=False, audit_hash_ids=None) -> str:
    """The risk report of an assessment as one self-contained HTML string.

    A joint assessment (:class:`empdp.assessment.joint.JointAssessment`, 2–3 statistics released
    together) gets the joint sections (:data:`empdp.report.joint.JOINT_SECTIONS`) at the smallest
    assessed ε, with the joint density's contours with and without the riskiest individual when the
    result holds their shifts (:func:`empdp.assessment.result.keep_shifts`). Grouped statistics
    (:class:`empdp.assessment.groups.GroupedAssessment`) get :data:`empdp.report.grouped.GROUPED_SECTIONS`
    at the smallest assessed ε: a row per group, and the worst groups' density with and without the
    riskiest individual.

    Parameters
    ----------
    assessment : empdp.assessment.assess.Assessment, JointAssessment or GroupedAssessment
        The result of :func:`empdp.assessment.assess.assess` (of any curator model), live or (one
        statistic or joint) loaded (:func:`empdp.assessment.result.load_result`).
    epsilon : float, optional
        The ε to mark and to evaluate the table at; default the smallest assessed ε.
    calibration : dict, optional
        A calibration summary (the JSON of ``empdp calibrate``): adds the ``calibration`` section.
    audit : dict, optional
        What ``empdp audit mpl|renyi|release --json`` prints, or an MPL summary (``lower_bound``,
        ``estimate``, ``pair``, ``t_hat``, ``n``, ``N``, ``alpha``, ``true_value``, optionally
        ``loss = {"t": [...], "loss": [...]}``): adds the ``audit`` section (see :func:`audit_kind`).
        A release audit against an adversary (``buckets``) gets a table of its buckets.
    hash_ids : bool, bytes, str or callable
        Replace ids by pseudonyms: a key (HMAC-SHA256, :func:`keyed_hash`), a callable, or ``True`` for a
        random per-report key.
    audit_hash_ids : as ``hash_ids``, optional
        For the audit section's ids (default: ``hash_ids``); differs when the result's ids were
        hashed when it was saved but the audit's were not.

    Returns
    -------
    str
        The HTML document: inline CSS, figures as base64 PNG ``data:`` URIs, no scripts or URLs.
    """
    a = assessment
    eps = float(a.epsilons[0] if epsilon is None else params.epsilons(epsilon)[0])
    if audit is not None:
        audit_kind(audit)
    a.kind.refuse([(name, name) for name, given in (("calibration", calibration), ("audit", audit))
                   if given is not None], a.n_statistics)
    if a.kind.key not in _REPORTS:
        raise InputError(f"the HTML report does not show {a.kind.named()} yet; use --json or --out",
                         param=a.kind.names)
    show = id_formatter(hash_ids)
    return _page(a.statistic, a, _REPORTS[a.kind.key](a, eps, show, calibration, audit, audit_hash_ids))


def _one_statistic(a, eps: float, show, calibration, audit, audit_hash_ids) -> list:
    """The sections of one statistic's report (with its adversary, calibration and audit sections)."""
    idx, exact = _a.sweep_index(a, eps)
    rows, shifts, note = _a.top_rows(a, eps, show, _a.TOP_TABLE)
    body = [_a.summary(a, eps, idx, exact), _a.risk_curves(a, eps), _a.at_risk(a, eps),
            _a.riskiest(a, eps, rows, note), _a.densities(a, eps, rows, shifts),
            _a.representativeness(a)]
    if getattr(a, "adversary", None):
        body.append(_a.adversary(a))
    if calibration is not None:
        body.append(calibration_section(calibration))
    if audit is not None:
        body.append(audit_section(audit, show if audit_hash_ids is None else id_formatter(audit_hash_ids)))
    return body


def _joint(a, eps: float, show, calibration, audit, audit_hash_ids) -> list:
    """The sections of a joint report, at the smallest assessed ε (calibration and audit are refused by
    the model, :data:`empdp.models.JOINT`)."""
    _j.check_epsilon(a, eps)
    return _j.sections(keep_shifts(a), eps, show)


def _grouped(a, eps: float, show, calibration, audit, audit_hash_ids) -> list:
    """The sections of a grouped report, at the smallest assessed ε (calibration and audit are refused by
    the model, :data:`empdp.models.GROUPED`)."""
    _j.check_epsilon(a, eps)
    return _g.sections(a, eps, show)


#: the report of each curator model (:mod:`empdp.models`)
_REPORTS = {"one": _one_statistic, "joint": _joint, "grouped": _grouped}
#: the sections of the models whose report has its own
_SECTIONS = {"joint": _j.JOINT_SECTIONS, "grouped": _g.GROUPED_SECTIONS}


def report_sections(a, calibration: dict | None = None, audit: dict | None = None) -> list[str]:
    """The ids of the sections :func:`report_html` writes for ``a`` (with these optional sections)."""
    if a.kind.key in _SECTIONS:
        return list(_SECTIONS[a.kind.key])
    return list(SECTIONS) + [s for s, d in (("adversary", a.adversary), ("calibration", calibration),
                                            ("audit", audit)) if d]


def _page(query: str, a, body: list) -> str:
    """The document around the sections: header, the sections, the footer."""
    try:
        from importlib.metadata import version
        ver = version("empdp")
    except Exception:  # not installed: the report still renders
        ver = "?"
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>empdp risk report: {esc(query)}</title><style>{CSS}</style></head><body><main>"
            f"<header><h1>Empirical privacy risk report</h1><div class=\"sub\"><code>{esc(query)}</code> over "
            f"{a.n_databases} databases of {esc(a.source)} · generated {when} by empdp {esc(ver)}</div></header>\n"
            + "\n".join(body)
            + "<footer>Method: Burchard et al., empirical differential privacy for repeated databases. "
              "This file is sensitive (it names the riskiest individuals): keep it private.</footer>"
              "</main></body></html>\n")


def render_report(assessment, path, *, epsilon: float | None = None, calibration: dict | None = None,
                  audit: dict | None = None, hash_ids=False, audit_hash_ids=None) -> None:
    """Write :func:`report_html` to ``path`` atomically, owner-only (mode 0600; docs/method.md).

    Parameters are those of :func:`report_html`; nothing is written if rendering fails.
    """
    text = report_html(assessment, epsilon=epsilon, calibration=calibration, audit=audit, hash_ids=hash_ids,
                       audit_hash_ids=audit_hash_ids)
    with atomic_path(path, private=True) as tmp:
        tmp.write_text(text, encoding="utf-8")
