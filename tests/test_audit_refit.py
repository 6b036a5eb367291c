"""MPL's refit (empdp.audit.mpl._refit): the selected pair's table scores counted again on fresh
outputs streamed in chunks, and the best event among theirs and stage 1's chosen on more fresh ones."""

import importlib
import json
import time
from dataclasses import replace

import numpy as np
import pytest
from audit_cli_helpers import run

from empdp.audit import mpl
from empdp.errors import InputError

mpl_mod = importlib.import_module("empdp.audit.mpl")


def test_refit_runs_on_vector_score_events_and_reproduces():
    res = mpl("svt3", n=3000, N=20_000, alpha=0.1, rng=1)
    assert res.sizes["refit_size"] == 6 * 3000  # 4n to count the tables, 2n to choose the event
    assert res.event_rule is not None
    again = mpl("svt3", n=3000, N=20_000, alpha=0.1, rng=1)
    assert again.lower_bound == res.lower_bound and again.event_rule == res.event_rule
    # numbers (a point or a half-line) and answer vectors of few values (DPL's events) have no tables
    for name in ("laplace", "noisy_max", "svt1"):
        assert "refit_size" not in mpl(name, n=3000, N=20_000, rng=1).sizes, name


def _refit_draws(monkeypatch) -> list:
    """The sizes of the draws the refit makes (per database), recorded while it runs."""
    sizes, inside = [], []
    draw_pair, refit = mpl_mod._draw_pair, mpl_mod._refit

    def spy_draw(plan, pair, size, *args, **kwargs):
        if inside:
            sizes.append(size)
        return draw_pair(plan, pair, size, *args, **kwargs)

    def spy_refit(*args, **kwargs):
        inside.append(True)
        try:
            return refit(*args, **kwargs)
        finally:
            inside.clear()

    monkeypatch.setattr(mpl_mod, "_draw_pair", spy_draw)
    monkeypatch.setattr(mpl_mod, "_refit", spy_refit)
    return sizes


def test_refit_counts_in_chunks_and_caps_the_scores_it_holds(monkeypatch):
    """n = 3000: 18,000 fresh outputs per database, two thirds counted (after a probe of 2, the first
    chunk fixes the binnings, the rest in chunks), a third, at most REFIT_CHOOSE_MAX, to choose on; the
    tables count every output drawn to count, and the result does not depend on the threads."""
    monkeypatch.setattr(mpl_mod, "FIT_ROWS", 1000)
    monkeypatch.setattr(mpl_mod, "REFIT_CHUNK", 3000)
    sizes = _refit_draws(monkeypatch)
    counted = []
    tables = mpl_mod.TableScores

    class Spy(tables):
        def scores(self):
            counted.append(int(sum(c.sum() for c in self.counts[0][0])))  # (the per-column binning's first)
            return super().scores()

    monkeypatch.setattr(mpl_mod, "TableScores", Spy)
    res = mpl("prefix_sum", n=3000, N=20_000, rng=2)
    assert sizes == [2, 1000, 3000, 3000, 3000, 2000, 6000] and res.sizes["refit_size"] == 18_000
    assert counted == [12_000 * 10]  # (a count per coordinate: prefix_sum has 10)
    assert mpl("prefix_sum", n=3000, N=20_000, rng=2, threads=1).lower_bound == res.lower_bound
    sizes.clear()
    monkeypatch.setattr(mpl_mod, "REFIT_CHOOSE_MAX", 4096)
    assert mpl("prefix_sum", n=3000, N=20_000, rng=2).sizes["refit_size"] == 18_000
    assert sizes[-1] == 4096 and sum(sizes[1:-1]) == 18_000 - 4096


def test_refit_size_given_back_or_none(monkeypatch):
    res = mpl("svt3", n=3000, N=20_000, alpha=0.1, rng=1, refit_size=0)
    assert res.sizes["refit_size"] == 0 and not res.event_rule["refitted"]
    sizes = _refit_draws(monkeypatch)
    res = mpl("svt3", n=3000, N=20_000, alpha=0.1, rng=1, refit_size=600)
    assert res.sizes["refit_size"] == 600 and sizes == [2, 400, 200]
    for bad in (5, -1, 2.5, True):
        with pytest.raises(InputError, match="refit_size"):
            mpl("svt3", n=3000, N=20_000, rng=1, refit_size=bad)
    with pytest.raises(InputError, match="not both"):
        mpl("svt3", refit_size=0, time_budget=5)
    cli = run("mpl", "-m", "svt3", "--refit-size", 7, "--search-size", 3000, "--final-size", 20_000)
    assert cli.exit_code == 2 and "refit_size" in cli.output


def test_a_budget_skips_the_refit_it_has_no_time_for_and_reports_it(monkeypatch):
    """The search's share of the time nil: the clock stops the search after its first step, and the
    refit, which would end past that share, is skipped and reported as 0; given back, the run is
    reproduced."""
    monkeypatch.setattr(mpl_mod, "STAGE1_END_SHARE", 0.0)
    res = mpl("prefix_sum", time_budget=3, alpha=0.1, rng=5)
    s = res.sizes
    assert s["search_steps"] == 1 and s["refit_size"] == 0 and s["duel_size"] == 0 and not res.event_rule["refitted"]
    again = mpl("prefix_sum", n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                search_steps=1, refit_size=0, duel_size=s["duel_size"], alpha=0.1, rng=5)
    assert again.lower_bound == res.lower_bound


def test_a_search_the_clock_stopped_is_still_refitted_in_the_time_kept_for_it(monkeypatch):
    """The search ends early to leave the refit its time: a search the clock stopped after its first step
    (here every later step is said not to fit) is still refitted, and the run's sizes reproduce it."""
    monkeypatch.setattr(mpl_mod._Steps, "_fits", lambda self, pace, rows, load: False)
    res = mpl("prefix_sum", time_budget=4, alpha=0.1, rng=5)
    s = res.sizes
    assert s["search_steps"] == 1 and s["refit_size"] >= s["search_size"]
    monkeypatch.undo()
    again = mpl("prefix_sum", n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                search_steps=1, refit_size=s["refit_size"], duel_size=s.get("duel_size"), alpha=0.1, rng=5)
    assert again.lower_bound == res.lower_bound


def test_refit_draws_fresh_outputs_after_stage1(monkeypatch):
    """The refit takes its outputs from the run's generator after stage 1 and before stage 2, so stage
    1's search is the same with or without it (the same pair's candidate before the refit)."""
    seen = []
    refit = mpl_mod._refit

    def spy(plan, best, *args):
        seen.append(best.rule.describe())
        return refit(plan, best, *args)

    monkeypatch.setattr(mpl_mod, "_refit", spy)
    mpl("svt3", n=3000, N=20_000, rng=4)
    monkeypatch.setattr(mpl_mod, "_refits", lambda best: False)
    plain = mpl("svt3", n=3000, N=20_000, rng=4, duel_size=0)  # (the duel may choose another entrant or a rung)
    assert len(seen) == 1 and "refit_size" not in plain.sizes
    # stage 1 drew the same outputs and chose the same event either way: the refit's outputs are its own
    assert [{**rule, "refitted": False} for rule in seen] == [plain.event_rule]


def test_refit_replaces_a_poor_stage1_score(monkeypatch):
    """Stage 1's score made useless (constant): without the refit its event is every output and the bound
    nil; the refit's tables find prefix_sum's loss (exact ε 1). How much the refit gains where stage 1's
    tables are noise (svt3's rare events) needs stage-1 sizes of a 20 s budget: tests/bench/closing_ab.py --step refit."""
    original = mpl_mod.candidate

    def constant(x, y, is_discrete, plan, logistic=True):
        cand = original(x, y, is_discrete, plan, logistic)
        return replace(cand, rule=replace(cand.rule, scorer=_Constant()))

    monkeypatch.setattr(mpl_mod, "candidate", constant)
    res = mpl("prefix_sum", n=3000, N=20_000, alpha=0.1, rng=1)
    assert res.event_rule["score"].startswith("log ratios") and 0.3 < res.lower_bound < 1.0
    monkeypatch.setattr(mpl_mod, "_refits", lambda best: False)
    assert mpl("prefix_sum", n=3000, N=20_000, alpha=0.1, rng=1).lower_bound <= 0.0


class _Constant:
    name = "constant"

    def score(self, outputs):
        return np.zeros(len(outputs))


def test_budget_with_a_refit_ends_in_time_and_reproduces():
    t0 = time.perf_counter()
    res = mpl("svt3", time_budget=4, alpha=0.1, rng=2)
    took = time.perf_counter() - t0
    s = res.sizes
    assert took < 5.5, took  # (a loaded host overruns somewhat; the other budget tests allow as much)
    # (a loaded host's clock may stop the search, or leave less time for the refit: shrunk, or 0)
    assert s["refit_size"] == 0 or s["search_size"] <= s["refit_size"] <= 6 * s["search_size"]
    again = mpl("svt3", n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                search_steps=s.get("search_steps"), refit_size=s["refit_size"], alpha=0.1, rng=2)
    assert again.lower_bound == res.lower_bound and again.sizes["refit_size"] == s["refit_size"]


def test_terminal_names_the_score_stage1_chose():
    """The terminal called every score event's score "the logistic-regression score", also the tables'."""
    out = run("mpl", "-m", "prefix_sum", "--search-size", 3000, "--final-size", 20_000, "--seed", 3)
    data = run("mpl", "-m", "prefix_sum", "--search-size", 3000, "--final-size", 20_000, "--seed", 3, "--json")
    assert out.exit_code == 0 and data.exit_code == 0, out.output + data.output
    rule = json.loads(data.output)["event_rule"]
    assert f"the score '{rule['score']}' {rule['direction']}" in out.output


def test_stage2_scores_wide_outputs_a_block_at_a_time(monkeypatch):
    """A score event's members are computed a block of rows at a time (wide outputs' codes are several
    times their size): the same members, so the same bound, as scoring a part whole."""
    scored_rows = []
    members = mpl_mod.ScoreRule.members

    def spy(self, outputs):
        scored_rows.append(len(outputs))
        return members(self, outputs)

    monkeypatch.setattr(mpl_mod.ScoreRule, "members", spy)
    whole = mpl("laplace_parallel", n=3000, N=40_000, rng=6, refit_size=0)
    assert max(scored_rows) > 1000
    scored_rows.clear()
    monkeypatch.setattr(mpl_mod, "MEMBER_VALUES", 20 * 1000)  # 1,000 rows of laplace_parallel's 20 coordinates
    blocked = mpl("laplace_parallel", n=3000, N=40_000, rng=6, refit_size=0)
    assert max(scored_rows) == 1000 and blocked.lower_bound == whole.lower_bound
