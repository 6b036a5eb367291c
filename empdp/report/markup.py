"""The report's HTML building blocks: its stylesheet, escaping, numbers, sections, tables and cards."""

from __future__ import annotations

import html
import math
import numbers
import secrets
import string
from typing import Any, Callable

import numpy as np

from ..io import keyed_hash
from ..textfmt import DIGITS, fmt

CSS = """
:root{--ink:#1d2430;--muted:#5b6472;--line:#e3e6eb;--bg:#f7f8fa;--accent:#1f4e79;--warn:#8a5a00}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
 font:15px/1.55 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:28px 32px 48px}
header{border-bottom:3px solid var(--accent);margin-bottom:20px;padding-bottom:10px}
h1{font-size:26px;margin:0 0 4px} h2{font-size:19px;margin:0 0 12px;color:var(--accent)}
.sub{color:var(--muted);font-size:13px}
section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:20px 24px;margin:0 0 18px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin:0 0 16px}
.card{border:1px solid var(--line);border-radius:6px;padding:10px 14px;background:#fbfcfd}
.card .v{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums}
.card .k{font-size:13px;color:var(--muted)}
table{border-collapse:collapse;width:100%;font-size:14px;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#f1f3f6;font-weight:600}
table.kv th{width:34%;background:none;font-weight:500;color:var(--muted)}
td.n,th.n{text-align:right}
img{max-width:100%;display:block;margin:6px auto}
.explain{color:var(--muted);font-size:14px;margin:8px 0 0;max-width:105ch}
.warn{background:#fff7e6;border:1px solid #f0c36d;border-radius:6px;padding:10px 14px;margin:12px 0;color:var(--warn)}
.warn ul{margin:4px 0 0 18px;padding:0}
.note{background:#eef3f9;border-radius:6px;padding:10px 14px;margin:12px 0;font-size:14px}
.ok{color:#2e7d32;font-weight:600} .bad{color:var(--red,#b22222);font-weight:600}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:24px}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;background:#f1f3f6;padding:1px 4px;border-radius:3px}
"""


def id_formatter(hash_ids) -> Callable[[Any], str]:
    """``False``: ids as is; a callable: applied; bytes/str: :func:`keyed_hash` key;
    ``True``: a random per-report key (consistent within the report only)."""
    if hash_ids is False or hash_ids is None:
        return str
    if callable(hash_ids):
        return lambda v: str(hash_ids(v))
    if hash_ids is True:
        key = secrets.token_bytes(32)
    elif isinstance(hash_ids, (bytes, str)):
        key = hash_ids.encode("utf-8") if isinstance(hash_ids, str) else hash_ids
    else:
        raise TypeError("hash_ids must be False, True, a key (bytes/str) or a callable")
    return lambda v: keyed_hash(v, key)


class Html(str):
    """Markup the report wrote itself: the only text that enters the page unescaped.

    Every value from a file or the data enters through :func:`esc`, :func:`num`, :meth:`format`,
    :meth:`join` or a cell of :func:`kv`, :func:`cards` and :func:`td`, which escape anything that
    is not already ``Html`` (numbers included: a "number" read from a file may be any text).
    """

    def format(self, *args, **kwargs) -> Html:
        """``str.format`` with every argument that is not ``Html`` escaped after formatting."""
        return Html(_ESCAPING.vformat(self, args, kwargs))

    def join(self, parts) -> Html:
        return Html(str.join(self, (cell(p) for p in parts)))


class _Escaping(string.Formatter):
    def format_field(self, value, format_spec: str) -> str:
        return value if isinstance(value, Html) and not format_spec else esc(format(value, format_spec))


_ESCAPING = _Escaping()


def esc(s: Any) -> Html:
    """``s`` as text in the page (its ``str``, escaped); ``Html`` stays as it is."""
    return s if isinstance(s, Html) else Html(html.escape(str(s), quote=True))


def num(v, digits: int = DIGITS) -> Html:
    """A number for humans in the report: ``∞``, ``–`` for missing (:func:`empdp.textfmt.fmt`);
    escaped, since a field meant to hold a number may hold any text."""
    return esc(fmt(v, digits, missing="–", infinity="∞"))


def cell(v) -> Html:
    """A table or card cell: ``Html`` as is, a number through :func:`num`, anything else escaped."""
    if isinstance(v, Html):
        return v
    if v is None or isinstance(v, (numbers.Number, np.number, np.bool_)):
        return num(v)
    return esc(v)


def inf_if_none(v):
    """The calibration JSON writes an infinite classical ε as null."""
    return math.inf if v is None else v


def section(sid: str, title: str, *parts: str) -> Html:
    return Html(f'<section id="{esc(sid)}">\n<h2>{esc(title)}</h2>\n' + "\n".join(parts) + "\n</section>")


def explain(text: str) -> Html:
    """A paragraph of the report's own prose (its values entered through :func:`esc`/:func:`num`)."""
    return Html(f'<p class="explain">{text}</p>')


def kv(rows) -> Html:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in rows)
    return Html(f'<table class="kv">{body}</table>')


def table(head: str, body: str) -> Html:
    """A table: ``head`` and ``body`` are rows of ``<tr>`` markup (:func:`tr`)."""
    return Html(f"<table><thead>{head}</thead><tbody>{body}</tbody></table>")


class _Td(Html):
    """A whole ``<td>`` element (:func:`td`), which :func:`tr` takes as it is."""


def td(v, cls: str | None = "n") -> _Td:
    """One cell (:func:`cell`), right-aligned as a number unless ``cls`` says otherwise."""
    return _Td(f"<td class='{cls}'>{cell(v)}</td>" if cls else f"<td>{cell(v)}</td>")


def tr(*cells) -> Html:
    """One row: each cell a :func:`td`, or anything else (a value or ``Html``) in a right-aligned one."""
    return Html("<tr>" + "".join(c if isinstance(c, _Td) else td(c) for c in cells) + "</tr>")


def code(v) -> Html:
    """``v`` escaped, in code type (ids, column names, queries)."""
    return Html(f"<code>{esc(v)}</code>")


def cards(items) -> Html:
    return Html('<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{cell(k)}</div><div class="v">{cell(v)}</div></div>'
        for k, v in items) + "</div>")


def p_badge(p) -> Html:
    if not isinstance(p, numbers.Real) or not np.isfinite(p):
        return num(p)
    cls, word = ("bad", "rejected at 5%") if p < 0.05 else ("ok", "not rejected")
    return Html(f'p = {num(p, 3)} <span class="{cls}">({word})</span>')


def verdict(ok, yes: str, no: str) -> Html:
    """``yes`` in green when ``ok``, else ``no`` in red."""
    return Html(f"<span class='{'ok' if ok else 'bad'}'>{esc(yes if ok else no)}</span>")


def extra_rows(d: dict, known) -> list:
    """Key-value rows of the scalar fields of ``d`` the section does not show otherwise."""
    return [(k, v) for k, v in d.items()
            if k not in known and (isinstance(v, (str, int, float, bool)) or v is None)]
