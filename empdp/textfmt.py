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


#: characters a terminal acts on instead of showing: C0 (but for what ``keep`` allows), DEL, C1, and
#: Unicode's invisible direction and line controls, which reorder or hide what follows ("Trojan source")
_CONTROL = (frozenset(range(0x20)) | {0x7F} | frozenset(range(0x80, 0xA0))
            | {0x200E, 0x200F, 0x2028, 0x2029, 0x061C} | frozenset(range(0x202A, 0x202F))
            | frozenset(range(0x2066, 0x206A)))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(ch: str) -> str:
    code = ord(ch)
    return _NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def terminal_safe(text, multiline: bool = False) -> str:
    """``text`` (any value: its ``str``) with every control character shown escaped (``\\x1b``,
    ``\\r``, ``\\n``, ``\\u202e``), so a value from the data or a file (an id, a label, a column name,
    a path) can neither drive the terminal nor forge a line of output. ``multiline`` keeps newlines
    and tabs (messages of several lines); one-line cells escape them too."""
    text = str(text)
    keep = "\n\t" if multiline else ""
    if not any(ord(ch) in _CONTROL and ch not in keep for ch in text):
        return text
    return "".join(_shown(ch) if ord(ch) in _CONTROL and ch not in keep else ch for ch in text)


def bandwidth_choice(selected_by: str) -> str:
    """How a density model's bandwidth was set, in the words every output uses (terminal, report): given
    by the user (``--bandwidth``) or chosen by leave-one-out likelihood."""
    return "given (--bandwidth)" if selected_by == "fixed" else "chosen by leave-one-out likelihood"


def shorten(value, width: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``width`` characters (:func:`clip`): user values echoed
    in error messages (a 10,000-character --where must not fill the terminal)."""
    return clip(repr(value), width)


def clip(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters by a '…' in the middle (the end of a
    path, its file name, stays visible)."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]
