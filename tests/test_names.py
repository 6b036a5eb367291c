"""One name per quantity (issue 34, item 7): the README's glossary against what one run of each command
shows in the terminal, the JSON, ``--out``, the report and the Python attributes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from helpers import CURATOR_KEY, SAMPLE, run

import empdp

README = Path(__file__).resolve().parents[1] / "README.md"
QUERY = ["--id", "countyid", "--by", "year", "--query", "mean(murdrate)"]


def glossary() -> list[tuple[list[str], list[str]]]:
    """(names, terminal words) of each row of the README's glossary table."""
    text = README.read_text()
    table = text[text.index("## Glossary"):].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        words = [w.strip() for w in re.sub(r"`", "", cells[1]).split(",") if w.strip() and "(" not in w]
        rows.append((names, words))
    return rows


def keys(obj) -> set[str]:
    """Every key of a JSON document, at any depth."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in keys(v)}
    return set()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """One assessment of the sample: its JSON, terminal text, --out columns, report and live result."""
    tmp = tmp_path_factory.mktemp("names")
    out, report = tmp / "risk.parquet", tmp / "r.html"
    as_json = run("assess", SAMPLE, *QUERY, "--json")
    shown = run("assess", SAMPLE, *QUERY, "--out", out, "--report", report)
    assert as_json.exit_code == 0 and shown.exit_code == 0, as_json.output + shown.output
    result = empdp.assess(SAMPLE, id="countyid", by="year", query="mean(murdrate)")
    return {"json": json.loads(as_json.output), "terminal": shown.output, "out": pl.read_parquet(out).columns,
            "report": report.read_text(), "result": result}


ASSESS = {"id", "by", "n_databases", "n_individuals", "epsilon", "delta", "total_risk", "n_at_risk", "eps_i",
          "eps_bound", "eps_all", "eps_tolerance", "max_abs_shift", "sole_contributor", "sole_contributors",
          "sets_eps_all", "n_evaluated"}


def test_every_glossary_name_of_an_assessment_is_where_the_glossary_says(outputs):
    r = outputs["result"]
    python = {a for a in dir(r) if not a.startswith("_")} | set(r.riskiest(3).columns) | set(r.individuals.columns)
    found = keys(outputs["json"]) | set(outputs["out"]) | python
    named = {n for names, _ in glossary() for n in names}
    assert ASSESS <= named, ASSESS - named  # the glossary names them
    missing = {n for n in ASSESS if n not in found}
    assert not missing, f"glossary names that no output of assess has: {missing}"


def test_terminal_words_are_the_glossarys(outputs):
    words = {w for names, ws in glossary() if set(names) & ASSESS for w in ws if w.isascii()}
    shown = outputs["terminal"]
    # the words of the quantities a plain assessment shows (the adversary's need --adversary)
    expected = {w for w in words if w in {"eps_all", "delta", "eps_i", "total risk", "at risk", "epsilon",
                                          "sets eps_all", "sole contributors", "databases", "individuals",
                                          "largest shift"}}
    assert expected and all(w in shown for w in expected), [w for w in expected if w not in shown]


def test_out_is_the_individuals_table_with_its_epsilon(outputs):
    r = outputs["result"]
    cols = r.individuals.columns
    at = cols.index("delta") + 1
    assert outputs["out"] == [*cols[:at], "epsilon", *cols[at:]] == r.out_table().columns
    assert set(r.riskiest(3).columns) <= set(outputs["out"]) | {"sets_eps_all"}


def test_json_and_python_give_the_same_numbers_under_the_same_names(outputs):
    d, r = outputs["json"], outputs["result"]
    for name in ("eps_all", "n_databases", "n_individuals", "sole_contributors", "n_evaluated", "eps_tolerance"):
        assert d[name] == pytest.approx(getattr(r, name), rel=0, abs=0), name
    sweep = d["sweep"]
    for name in ("epsilon", "delta", "total_risk", "n_at_risk"):
        python = r.epsilons if name == "epsilon" else getattr(r, name)
        assert [row[name] for row in sweep] == pytest.approx(list(python), rel=0, abs=0), name


def test_calibration_names_are_the_glossarys(tmp_path, curator_key):
    out = tmp_path / "cal.json"
    res = run("calibrate", SAMPLE, *QUERY, "-e", "1", "-o", out)
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    for name in ("lambda", "expected_abs_noise", "verified_eps_max"):
        assert name in d, name
        assert any(name in names for names, _ in glossary()), f"{name} is not in the glossary"
    for words in ("verified_eps_max", "expected |noise|"):
        assert words in res.output, words
    cal = empdp.load_calibration(out, key=CURATOR_KEY)
    assert cal.lam == d["lambda"] and cal.verified_eps_max == d["verified_eps_max"]
