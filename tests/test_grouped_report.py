"""The HTML report of grouped statistics (issue 37 item 5): a row per group, the riskiest individuals
with their groups, and the worst groups' density with and without the riskiest individual; the same
from the command line and the library, at the smallest assessed ε only."""

from __future__ import annotations

import base64
import re
import stat

import numpy as np
import polars as pl
import pytest
from helpers import html_sections, no_timestamp, run, table_rows
from test_joint_groups import EPS, grouped_table

from empdp.assessment.groups import assess_grouped
from empdp.errors import InputError
from empdp.report import GROUPED_SECTIONS, render_report, report_html, report_sections

PANEL = ["--id", "id", "--by", "year", "--query", "mean(x)", "--group-by", "region"]
EPS_ARGS = [a for e in EPS for a in ("-e", str(e))]


@pytest.fixture(scope="module", params=["ab", "abcde"], ids=["two groups", "five groups"])
def grouped(request, tmp_path_factory):
    """A panel of 2 (one joint query) or 5 groups (individuals 45, 46 in more than 3: bounded only),
    its report from the command line, and the library's assessment."""
    table = grouped_table(groups=request.param, movers=None if len(request.param) == 5 else {20: "ab"})
    folder = tmp_path_factory.mktemp("grouped_report")
    table.write_parquet(folder / "regions.parquet")
    res = run("assess", folder / "regions.parquet", *PANEL, *EPS_ARGS, "--report", folder / "r.html")
    assert res.exit_code == 0, res.output
    assert f"HTML report written to {folder / 'r.html'} (mode 0600)" in res.output
    lib = assess_grouped(str(folder / "regions.parquet"), id="id", by="year", group_by="region", query="mean(x)",
                         epsilon=EPS)
    return table, folder / "r.html", lib


def test_sections_and_the_library_report(grouped):
    _, path, lib = grouped
    html = path.read_text(encoding="utf-8")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tuple(html_sections(html)) == GROUPED_SECTIONS == tuple(report_sections(lib))
    lib_html = report_html(lib)
    assert no_timestamp(lib_html) == no_timestamp(html)
    assert "mean(x)</code> by <code>region" in html


def test_a_row_per_group_against_the_table(grouped):
    table, path, lib = grouped
    sec = html_sections(path.read_text(encoding="utf-8"))
    rows = table_rows(sec["groups"])
    assert [r[0].replace(" (worst)", "") for r in rows] == list(lib.groups)
    members = table.group_by("region").agg(pl.col("id").n_unique()).sort("region")["id"].to_list()
    assert [int(r[1].replace(",", "")) for r in rows] == members
    for g, r in enumerate(rows):  # the group's statistic over the databases: its mean (min … max)
        means = table.filter(pl.col("region") == lib.groups[g]).group_by("year").agg(pl.col("x").mean())["x"]
        assert r[2] == f"{means.mean():.4g} ({means.min():.4g} … {means.max():.4g})"
    # the worst groups are those of the individual that sets ε_all
    setter = lib.riskiest(10).filter(pl.col("sets_eps_all"))["id"][0]
    theirs = sorted(table.filter(pl.col("id") == setter)["region"].unique().to_list())
    assert sorted(r[0].replace(" (worst)", "") for r in rows if "(worst)" in r[0]) == theirs
    for r, g in zip(rows, lib.groups):
        if g in theirs:
            assert r[5] == f"{lib.eps_all:.4g}"


def test_the_riskiest_name_their_groups_and_bounds(grouped):
    table, path, lib = grouped
    sec = html_sections(path.read_text(encoding="utf-8"))
    rows = table_rows(sec["riskiest"])
    top = lib.riskiest(10)
    assert [r[1] for r in rows] == [str(i) for i in top["id"]]
    for r, i, e in zip(rows, top["id"], top["eps_i"]):
        groups = sorted(table.filter(pl.col("id") == i)["region"].unique().to_list())
        shown = r[6].split(" (+")[0].split(", ")
        assert shown == groups[:3] and (len(groups) <= 3 or r[6].endswith(f"(+{len(groups) - 3})"))
        assert r[3] == ("bound only" if e is None else f"{e:.4g}")
    if len(lib.groups) > 3:
        assert lib.n_bound_only == 2 and "known only by a bound" in sec["summary"]


def test_the_worst_groups_density_is_drawn(grouped):
    _, path, lib = grouped
    sec = html_sections(path.read_text(encoding="utf-8"))
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', sec["contours"])
    setter = lib.riskiest(10).filter(pl.col("sets_eps_all"))
    assert 1 <= len(images) <= 2 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert "log ratio" in sec["contours"] and setter["eps_i"][0] == lib.eps_all


def test_another_epsilon_is_refused_in_one_line(grouped, tmp_path):
    _, _, lib = grouped
    out = tmp_path / "r.html"
    with pytest.raises(InputError, match="a grouped result's table is exact at the smallest assessed epsilon") as e:
        render_report(lib, out, epsilon=2.0)
    assert "\n" not in str(e.value) and e.value.param == ("epsilon",) and not out.exists()


def test_scales_of_each_group(grouped):
    _, path, lib = grouped
    rows = table_rows(html_sections(path.read_text(encoding="utf-8"))["groups"])
    G = len(lib.groups)
    want = (lib.models[tuple(range(G))].scales if G <= 3 else
            np.array([lib.models[(g,)].scales[0] for g in range(G)]))
    assert [r[3] for r in rows] == [f"{b:.4g}" for b in want]
