"""MPL's refit (empdp.audit.mpl._refit): the selected pair's table scores counted again on fresh
outputs streamed in chunks, and the best event among theirs and stage 1's chosen on more fresh ones."""

import importlib
import json
import time
from dataclasses import replace

import numpy as np
from audit_cli_helpers import run

from empdp.audit import mpl

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


def test_refit_choice_caps_the_scores_it_holds(monkeypatch):
    monkeypatch.setattr(mpl_mod, "REFIT_CHOOSE_MAX", 4096)
    res = mpl("prefix_sum", n=3000, N=20_000, rng=2)
    assert res.sizes["refit_size"] == 4 * 3000 + 4096


def test_refit_draws_fresh_outputs_after_stage1(monkeypatch):
    """The refit takes its outputs from the run's generator after stage 1 and before stage 2, so stage
    1's search is the same with or without it (the same pair's candidate before the refit)."""
    seen = []
    refit = mpl_mod._refit

    def spy(plan, best, pair, rng, report):
        seen.append(best.rule.describe())
        return refit(plan, best, pair, rng, report)

    monkeypatch.setattr(mpl_mod, "_refit", spy)
    mpl("svt3", n=3000, N=20_000, rng=4)
    monkeypatch.setattr(mpl_mod, "_refits", lambda best: False)
    plain = mpl("svt3", n=3000, N=20_000, rng=4)
    assert len(seen) == 1 and "refit_size" not in plain.sizes
    # stage 1 drew the same outputs and chose the same event either way: the refit's outputs are its own
    assert seen == [plain.event_rule]


def test_refit_replaces_a_poor_stage1_score(monkeypatch):
    """Stage 1's score made useless (constant): without the refit its event is every output and the bound
    nil; the refit's tables find prefix_sum's loss (exact ε 1). How much the refit gains where stage 1's
    tables are noise (svt3's rare events) needs stage-1 sizes of a 20 s budget: tests/bench/refit_ab.py."""
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
    assert took < 6.5, took  # (a loaded host overruns somewhat)
    if "search_steps" not in s:  # (a loaded host's clock may stop the search, and then no refit runs)
        assert s["refit_size"] == 4 * s["search_size"] + min(2 * s["search_size"], mpl_mod.REFIT_CHOOSE_MAX)
    again = mpl("svt3", n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                search_steps=s.get("search_steps"), alpha=0.1, rng=2)
    assert again.lower_bound == res.lower_bound and again.sizes.get("refit_size") == s.get("refit_size")


def test_terminal_names_the_score_stage1_chose():
    """The terminal called every score event's score "the logistic-regression score", also the tables'."""
    out = run("mpl", "-m", "prefix_sum", "--search-size", 3000, "--final-size", 20_000, "--seed", 3)
    data = run("mpl", "-m", "prefix_sum", "--search-size", 3000, "--final-size", 20_000, "--seed", 3, "--json")
    assert out.exit_code == 0 and data.exit_code == 0, out.output + data.output
    rule = json.loads(data.output)["event_rule"]
    assert f"the score '{rule['score']}' {rule['direction']}" in out.output
    assert rule["score"] != "logistic regression" or "logistic regression" in out.output


def test_refit_scores_are_fitted_on_more_outputs_than_stage1_holds(monkeypatch):
    """The tables' counts are the refit's 4n outputs per database, whatever stage 1 held."""
    counted = []
    tables = mpl_mod.TableScores

    class Spy(tables):
        def scores(self):
            counted.append(int(sum(c.sum() for c in self.counts[0][0])))
            return super().scores()

    monkeypatch.setattr(mpl_mod, "TableScores", Spy)
    mpl("laplace_parallel", n=2000, N=10_000, rng=1)
    assert counted == [4 * 2000 * 20]  # (the first binning: a count per coordinate; 20 of them)

