"""One name per concept in the audits (issue 34, item 7): the sample sizes are named as their flags
(``--search-size`` is ``search_size`` in the JSON and the Python attributes, "search size" in the
terminal and the report), and MPL's largest stage-1 loss is ``stage1_max_loss`` / "stage-1 max loss"
everywhere. The report still reads audit files written with the old keys."""

import json
import re

import polars as pl
import pytest
from helpers import CURATOR_KEY, QUERY, SAMPLE, run

from empdp.audit import mpl
from empdp.textfmt import fmt

ENV = {"EMPDP_KEY": CURATOR_KEY.decode()}
#: the old keys of each kind of audit JSON, by their new names
OLD = {"mpl": {"search_size": "n", "final_size": "N", "stage1_max_loss": "estimate"},
       "release": {"search_size": "n", "final_size": "N", "renyi_sample_size": "n_renyi",
                   "stage1_max_loss": "mpl_estimate"}}


def words(key: str) -> str:
    """How the terminal and the report write a JSON key: its words (stage1 as 'stage-1')."""
    return key.replace("stage1", "stage-1").replace("_", " ")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A saved result and a calibration of 60 counties; an MPL and a release audit, as JSON and as text."""
    d = tmp_path_factory.mktemp("names")
    small = d / "small.parquet"
    sample = pl.read_parquet(SAMPLE)
    sample.filter(pl.col("countyid").is_in(sample["countyid"].unique().sort().head(60).implode())).write_parquet(small)
    for args in (["assess", small, *QUERY, "--save-result", d / "result.json", "-q"],
                 ["calibrate", small, *QUERY, "-e", "0.3", "-o", d / "cal.json", "-q"]):
        assert run(*args, env=ENV).exit_code == 0
    out = {"dir": d}
    for kind, args in (("mpl", ["mpl", "-m", "laplace", "--param", "epsilon=0.7", "--search-size", 2000,
                                "--final-size", 5000]),
                       ("release", ["release", d / "cal.json", small, "--top", 2])):
        res = run("audit", *args, "--seed", 1, "--json", env=ENV)
        assert res.exit_code == 0, res.output
        out[kind] = json.loads(res.stdout)
        text = run("audit", *args, "--seed", 1, env=ENV)
        assert text.exit_code == 0, text.output
        out[kind + "_text"] = text.stdout
    return out


def report(runs, name: str, doc: dict) -> str:
    """The audit section of the report of the saved result with ``doc`` as its audit."""
    path = runs["dir"] / f"{name}.json"
    path.write_text(json.dumps(doc))
    html = runs["dir"] / f"{name}.html"
    res = run("report", runs["dir"] / "result.json", "--audit", path, "-o", html, "-q", env=ENV)
    assert res.exit_code == 0, res.output
    return re.search(r'<section id="audit">.*?</section>', html.read_text(), re.S).group(0)


@pytest.mark.parametrize("kind", ["mpl", "release"])
def test_json_terminal_and_report_use_one_name(runs, kind):
    d, text = runs[kind], runs[kind + "_text"]
    for new, old in OLD[kind].items():
        assert new in d and old not in d, (new, sorted(d))
        if new != "stage1_max_loss" or kind == "mpl":
            shown = str(d[new]) if isinstance(d[new], int) else fmt(d[new])  # sizes as given to their flags
            assert words(new) in text and shown in text, (new, text)
    assert "stage-1 max loss" in text and "stage-1 max " not in text.replace("stage-1 max loss", "")
    html = report(runs, kind, d)
    for new in OLD[kind]:
        assert words(new) in html, new
    assert "estimate" not in text.lower().replace("loss estimate", "")  # no other name for the same figure
    if kind == "release":  # each individual's row holds its stage-1 max loss under the same key
        assert all("stage1_max_loss" in row and "mpl_estimate" not in row for row in d["individuals"])


def test_python_attributes_are_the_json_keys():
    res = mpl("laplace", params={"epsilon": 0.7}, n=2000, N=5000, rng=1)
    d = res.to_dict()
    for key in ("search_size", "final_size", "stage1_max_loss", "lower_bound"):
        assert getattr(res, key) == d[key]
    assert (res.search_size, res.final_size) == (2000, 5000) == (d["sizes"]["search_size"], d["sizes"]["final_size"])
    assert not any(hasattr(res, old) for old in ("n", "N", "estimate"))


@pytest.mark.parametrize("kind", ["mpl", "release"])
def test_the_report_reads_audit_files_of_the_previous_version(runs, kind):
    new = runs[kind]
    old = {OLD[kind].get(k, k): v for k, v in new.items()}
    if kind == "release":
        old["individuals"] = [{("mpl_estimate" if k == "stage1_max_loss" else k): v for k, v in row.items()}
                              for row in new["individuals"]]
    assert report(runs, kind + "_old", old) == report(runs, kind + "_new", new)
