"""Outputs are neutral and files read back are data (issue 33, findings 4, 5, 11, 14).

Fault injection: markup in every field of every file the report reads (a saved result of one
statistic and of a joint release, the JSON of each kind of audit), formula prefixes in ids written
to CSV, control characters in ids printed in the terminal, text where a saved result holds a number.
Each case ends in one line and exit 2, or in output where the payload is inert.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import polars as pl
import pytest
from helpers import CURATOR_KEY, SAMPLE, one_line_error, run

from empdp.errors import InputError

QUERY = ["--id", "countyid", "--by", "year", "--query", "mean(murdrate)"]
#: markup that would act in a browser if it reached the page unescaped, and text that would stop matplotlib
PAYLOADS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "'><svg onload=alert(1)>",
            "</style><script>alert(1)</script>", "]]><script>alert(1)</script>", "javascript:alert(1)",
            "<!--", "&lt;b&gt;entity&lt;/b&gt;", "$\\foo{$"]
#: the figures of the fault injection, reported by the last test of each suite
FIGURES: dict[str, list[int]] = {}


# ------------------------------------------------------------------ files made by the tool on small data

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A result of one statistic and of a joint release, and the JSON of every kind of audit, written by
    the CLI on 60 counties of the sample (the release audit also against an adversary, as built by the
    audit's own dataclasses)."""
    from test_report import _bucketed_release

    d = tmp_path_factory.mktemp("neutral")
    small = d / "small.parquet"
    sample = pl.read_parquet(SAMPLE)
    sample.filter(pl.col("countyid").is_in(sample["countyid"].unique().sort().head(60).implode())).write_parquet(small)
    env = {"EMPDP_KEY": CURATOR_KEY.decode()}
    for args in (["assess", small, *QUERY, "--save-result", d / "result.json", "-q"],
                 ["assess", small, *QUERY, "--query", "mean(popul)", "--save-result", d / "joint.json", "-q"],
                 ["calibrate", small, *QUERY, "-e", "0.3", "-o", d / "cal.json", "-q"]):
        assert run(*args, env=env).exit_code == 0
    out = {"result": d / "result.json", "joint": d / "joint.json"}
    for kind, args in (("mpl", ["mpl", "-m", "laplace", "--param", "epsilon=0.7", "--search-size", 2000,
                                "--final-size", 5000]),
                       ("renyi", ["renyi", "-m", "gaussian", "--param", "sigma=1", "--order", 2]),
                       ("release", ["release", d / "cal.json", small, "--top", 3])):
        res = run("audit", *args, "--seed", 1, "--json", env=env)
        assert res.exit_code == 0, res.output
        out[kind] = d / f"{kind}.json"
        out[kind].write_text(res.stdout)
    out["release-buckets"] = d / "release-buckets.json"
    out["release-buckets"].write_text(json.dumps(_bucketed_release()))
    return out


def _paths(obj, path=()):
    """Every field of a JSON document: each key of each object, the list itself and its first item."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield path + (k,)
            yield from _paths(v, path + (k,))
    elif isinstance(obj, list) and obj:
        yield path + (0,)
        yield from _paths(obj[0], path + (0,))


def _replaced(doc, path, value):
    doc = json.loads(json.dumps(doc))
    *parents, last = path
    d = doc
    for k in parents:
        d = d[k]
    d[last] = value
    return doc


# ------------------------------------------------------------------ what "inert" means in the page

class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, tuple]] = []
        self.values: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, tuple(sorted(a for a, _ in attrs))))
        self.values += [v or "" for _, v in attrs]

    def handle_endtag(self, tag):
        self.tags.append(("/" + tag, ()))

    def handle_comment(self, data):
        self.tags.append(("<!--", ()))


def _structure(text: str) -> _Tags:
    p = _Tags()
    p.feed(text)
    p.close()
    return p


#: the elements and attributes the report writes itself
ELEMENTS = {"html", "head", "meta", "title", "style", "body", "main", "header", "h1", "h2", "div", "code", "section",
            "p", "table", "thead", "tbody", "tr", "th", "td", "img", "span", "sub", "sup", "em", "strong", "ul", "li", "br",
            "footer"}
ATTRIBUTES = {"class", "id", "alt", "src", "lang", "charset", "name", "content"}


def assert_inert(text: str, payload: str) -> None:
    """Every element and attribute of ``text`` is one the report writes itself, no attribute is a
    script URL, and a payload with markup characters appears only escaped."""
    p = _structure(text)
    foreign = {t for t in p.tags if t[0].lstrip("/") not in ELEMENTS or not set(t[1]) <= ATTRIBUTES}
    assert not foreign, f"{payload!r} made elements {foreign}"
    assert not any(v.strip().lower().startswith("javascript:") for v in p.values)
    assert sum(t == ("style", ()) for t in p.tags) <= 1 and not any(t[0] == "script" for t in p.tags)
    if any(c in payload for c in "<>\"'&"):
        assert payload not in text, payload
    assert "<script>alert" not in text and not re.search(r"<[^>]*onerror=", text)


@pytest.fixture
def fast_figures(monkeypatch):
    """Figures as an empty ``<img>`` with their (escaped) alt text: the suites render hundreds of
    pages; :func:`test_every_text_field_at_once_with_real_figures` draws them for real."""
    from empdp.report import plots
    from empdp.report.markup import esc

    monkeypatch.setattr(plots, "_img", lambda fig, alt: f'<img alt="{esc(alt)}" src="data:image/png;base64,">')


# ------------------------------------------------------------------ markup in every field of a saved result

@pytest.mark.parametrize("kind", ["result", "joint"])
def test_markup_in_every_field_of_a_saved_result(files, tmp_path, kind, fast_figures):
    """Each field of a saved result replaced by each payload: load_result refuses it in one line naming
    the file, or the report holds it inert. (A field the loader accepts is rendered once with every
    payload loaded in turn and the last page checked for all: a page takes a second.)"""
    from empdp.assessment.result import load_result
    from empdp.report import report_html

    doc = json.loads(files[kind].read_text())
    tried = clean = 0
    for path in _paths(doc):
        accepted = []
        for payload in PAYLOADS:
            tried += 1
            bad = tmp_path / "bad.json"
            bad.write_text(json.dumps(_replaced(doc, path, payload)))
            try:
                load_result(bad)
            except InputError as exc:
                assert "\n" not in str(exc) and "bad.json" in str(exc), (path, exc)
                clean += 1
            else:
                accepted.append(payload)
        if accepted:
            bad.write_text(json.dumps(_replaced(doc, path, " ".join(accepted))))
            text = report_html(load_result(bad))
            for payload in accepted:
                assert_inert(text, payload)
                clean += 1
    FIGURES[kind] = [tried, clean]
    assert tried == clean and tried > 100


AUDITS = ["mpl", "renyi", "release", "release-buckets"]


@pytest.mark.parametrize("kind", AUDITS)
def test_markup_in_every_field_of_an_audit(files, kind, fast_figures):
    """Each field of each kind of audit JSON replaced by each payload: refused in one line naming the
    file and the field, or the audit section holds it inert (the section is all the audit reaches)."""
    from empdp.report import audit_kind
    from empdp.report.audit import audit as audit_section

    doc = json.loads(files[kind].read_text())
    tried = clean = 0
    for path in _paths(doc):
        for payload in PAYLOADS:
            tried += 1
            bad = _replaced(doc, path, payload)
            try:
                audit_kind(bad, "audit.json")
            except InputError as exc:
                assert "\n" not in str(exc) and ("audit.json" in str(exc) or "not an empdp audit" in str(exc))
                clean += 1
                continue
            assert_inert(audit_section(bad, str), payload)
            clean += 1
    FIGURES[kind] = [tried, clean]
    assert tried == clean and tried > 50


def test_script_in_a_numeric_audit_field_is_refused_by_report_and_assess(files, tmp_path):
    """The red team's case: a <script> in mpl_estimate, by 'empdp report --audit' and 'assess --report --audit'."""
    doc = json.loads(files["release"].read_text())
    bad = tmp_path / "audit.json"
    bad.write_text(json.dumps(_replaced(doc, ("mpl_estimate",), PAYLOADS[0])))
    out = tmp_path / "r.html"
    one_line_error(run("report", files["result"], "--audit", bad, "-o", out), "audit.json", "'mpl_estimate'")
    one_line_error(run("assess", SAMPLE, *QUERY, "--report", out, "--audit", bad), "audit.json", "'mpl_estimate'")
    assert not out.exists()


def test_every_text_field_at_once_with_real_figures(files, tmp_path):
    """Markup and matplotlib math in every text field a saved result's report shows (source, query,
    columns, labels, ids, warnings) and in an audit's texts, with the figures drawn: the report is
    written and holds them inert."""
    doc = json.loads(files["result"].read_text())
    payload = " ".join(PAYLOADS)
    id_col = doc["id"]
    doc["source"], doc["query"], doc["by"] = payload, payload, payload
    doc["labels"][0] = doc["labels"][-1] = payload
    doc["warnings"] = [payload]
    doc["individuals"][id_col] = [f"{payload} {k}" for k in range(len(doc["individuals"][id_col]))]
    bad = tmp_path / "result.json"
    bad.write_text(json.dumps(doc))
    audit = json.loads(files["release"].read_text())
    audit["noise"]["kind"] = audit["curator_kernel"]["kind"] = payload
    audit["warnings"] = [payload]
    audit["individuals"][0]["id"] = payload
    audit["extra_note"] = payload
    aud = tmp_path / "audit.json"
    aud.write_text(json.dumps(audit))
    out = tmp_path / "r.html"
    res = run("report", bad, "--audit", aud, "-o", out)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.count("data:image/png;base64,iVBOR") >= 3  # the figures were drawn
    for p in PAYLOADS:
        assert_inert(text, p)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # shown, as text


# ------------------------------------------------------------------ a string where a number belongs

@pytest.mark.parametrize("path", [("eps_all",), ("sweep", "delta", 0), ("independence", "ljung_box_p"),
                                  ("representativeness", "share_in_one_database"), ("model", "scale"),
                                  ("individuals", "eps_i", 0), ("individuals", "n_databases", 0),
                                  ("sole_contributors",), ("shifts", 0, 0), ("q", 1)])
def test_text_in_a_numeric_field_of_a_saved_result_is_one_line(files, tmp_path, path):
    doc = _replaced(json.loads(files["result"].read_text()), path, "12abc")
    bad = tmp_path / "saved.json"
    bad.write_text(json.dumps(doc))
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    one_line_error(run("report", bad, "-o", tmp_path / "r.html"), "saved.json", f"'{field}'", "'12abc'")
    assert not (tmp_path / "r.html").exists()


def test_text_in_a_numeric_field_of_a_joint_result_is_one_line(files, tmp_path):
    doc = _replaced(json.loads(files["joint"].read_text()), ("model", "scales", 0), "0.1")
    bad = tmp_path / "saved.json"
    bad.write_text(json.dumps(doc))
    one_line_error(run("report", bad, "-o", tmp_path / "r.html"), "saved.json", "'model.scales[0]'")


# ------------------------------------------------------------------ formulas in CSV

FORMULAS = ["=HYPERLINK(\"http://x\",\"y\")", "+cmd|' /C calc'!A0", "-2+3", "@SUM(1,2)", "\t=1+1", "\r=1+1"]


@pytest.fixture(scope="module")
def hostile_panel(tmp_path_factory):
    """A small panel whose ids start with every formula prefix, or hold control characters."""
    from conftest import random_panel

    df = random_panel(3, n_db=12, n_ind=12, p_absent=0.1, ties=False)
    hostile = FORMULAS + ["\x1b[31mred\x1b[0m", "a\r\nforged: line", "\x9b2J csi", "b\u202eevil"]
    names = {f"id {i}": hostile[i % len(hostile)] + f" {i}" for i in range(12)}
    df["id"] = df["id"].map(lambda v: names.get(v, v))
    path = tmp_path_factory.mktemp("hostile") / "panel.parquet"
    pl.from_pandas(df).write_parquet(path)
    return str(path)


def test_csv_neutral_quotes_formulas_in_text_columns_only(tmp_path):
    from empdp.io import write_frame

    df = pl.DataFrame({"id": FORMULAS + ["plain", "a=b", None], "n": [-1.5, -2, 3, 4, 5, 6, -7, 8, 9],
                       "k": pl.Series([-1, 2, 3, 4, 5, 6, -7, 8, 9])})
    path = tmp_path / "t.csv"
    write_frame(df, path)
    back = pl.read_csv(path)
    assert back["id"].to_list() == ["'" + v for v in FORMULAS] + ["plain", "a=b", None]
    assert back["n"].to_list() == df["n"].to_list() and back["k"].to_list() == df["k"].to_list()
    write_frame(df, tmp_path / "t.parquet")  # Parquet keeps the data as they are
    assert pl.read_parquet(tmp_path / "t.parquet")["id"].to_list() == df["id"].to_list()


def test_ids_with_formula_prefixes_are_quoted_in_the_out_csv(hostile_panel, tmp_path):
    import pandas as pd

    out = tmp_path / "rows.csv"
    res = run("assess", hostile_panel, "--id", "id", "--by", "year", "--query", "mean(x)", "--out", out, "-q")
    assert res.exit_code == 0, res.output
    ids = pd.read_csv(out, keep_default_na=False)["id"].tolist()
    assert all(not str(v).startswith(("=", "+", "-", "@", "\t", "\r")) for v in ids), ids
    assert sum(str(v).startswith("'") for v in ids) >= len(FORMULAS)
    numbers = pd.read_csv(out).select_dtypes("number")
    assert len(numbers.columns) >= 3 and not any(str(c).startswith("'") for c in numbers.columns)


# ------------------------------------------------------------------ control characters in the terminal

def test_terminal_safe_escapes_every_control_character():
    from empdp.textfmt import terminal_safe

    controls = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x202E, 0x2066, 0x200F]]
    one_line = terminal_safe("x" + "".join(controls) + "y")
    assert not any(c in one_line for c in controls) and one_line.startswith("x\\x00") and "\\x1b" in one_line
    assert terminal_safe("a\nb\tc\r", multiline=True) == "a\nb\tc\\r"
    assert terminal_safe("plain é ü 漢") == "plain é ü 漢"


def test_control_characters_in_ids_are_escaped_in_the_riskiest_table(hostile_panel):
    res = run("assess", hostile_panel, "--id", "id", "--by", "year", "--query", "mean(x)")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert not any(c in out for c in ("\x1b", "\r", "\x9b", "\u202e")), repr(out)
    assert "\\x1b[31mred" in out or "\\x9b2J" in out or "\\r\\nforged" in out
    assert not any(line.startswith("forged") for line in out.splitlines())


def test_figures(request):
    """Payload variants × fields tried, and how many ended clean (exit 2 one line, or inert output)."""
    tried = sum(t for t, _ in FIGURES.values())
    clean = sum(c for _, c in FIGURES.values())
    print(f"\nissue 33 fault injection: {tried} tried, {clean} clean; by file {FIGURES}")
    assert tried == clean
