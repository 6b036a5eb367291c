"""Numbers for humans, one way everywhere: the terminal, the HTML report, log lines and messages."""

from __future__ import annotations

import math
import numbers

#: significant digits of every number printed for humans (``--json`` keeps full precision)
DIGITS = 4


def fmt(v, digits: int = DIGITS, *, missing: str = "-", infinity: str = "inf") -> str:
    """``v`` with ``digits`` significant digits; integers with thousands separators; booleans as
    yes/no; None and NaN as ``missing``; ±∞ as ``infinity`` (the report passes "–" and "∞");
    anything else as its text."""
    if v is None:
        return missing
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return "yes" if v else "no"
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    try:
        v = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(v):
        return missing
    if math.isinf(v):
        return infinity if v > 0 else "-" + infinity if infinity == "inf" else "−" + infinity
    return "0" if v == 0 else f"{v:.{digits}g}"
