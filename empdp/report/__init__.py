"""The self-contained HTML risk report (docs/method.md).

One HTML file with inline CSS and matplotlib figures embedded as base64 PNG
``data:`` URIs: no scripts, no external references, so it can be mailed or
archived as is. Sections carry stable ``id`` attributes (:data:`SECTIONS`).
The report sits on top of the library: it only reads an
:class:`empdp.assessment.assess.Assessment` (live, or saved and loaded by
:mod:`empdp.assessment.result`) and optional calibration / audit dicts.

Modules, from the page down::

    page.py         report_html / render_report: the sections in order under a header
    assessment.py   summary, risk curves, riskiest individuals, densities, representativeness, adversary
    joint.py        the same for 2–3 statistics released together, with the joint density's contours
    grouped.py      the same for one statistic per group, with a row per group and the worst groups' density
    contours.py     p̂ and p̂_i on a grid over a pair of statistics (the 2-D margins for three)
    calibration.py  the noise a calibration chose
    audit.py        an MPL / Rényi bound, or a release audit (per adversary bucket)
    plots.py        the matplotlib figures, as embedded PNGs
    markup.py       stylesheet, escaping, numbers, tables
"""

from ..io import keyed_hash
from .assessment import TOP_DENSITIES, TOP_TABLE
from .audit import AUDIT_KINDS, audit_kind
from .grouped import GROUPED_SECTIONS
from .joint import JOINT_SECTIONS
from .page import OPTIONAL_SECTIONS, SECTIONS, render_report, report_html, report_sections

__all__ = ["AUDIT_KINDS", "GROUPED_SECTIONS", "JOINT_SECTIONS", "OPTIONAL_SECTIONS", "SECTIONS", "TOP_DENSITIES", "TOP_TABLE",
           "audit_kind", "keyed_hash", "render_report", "report_html", "report_sections"]
