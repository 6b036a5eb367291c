"""MPL's duel (empdp.audit.mpl._duel): stage 1's entrants (the finalist pairs' events, and the refit's
beside the search's) counted on fresh outputs, in rounds, and the best predicted stage-2 bound chosen."""

import importlib
import json
import math
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from audit_cli_helpers import run

from empdp.audit import mpl
from empdp.audit.mechanisms import dpsniper_mechanism
from empdp.errors import InputError

mpl_mod = importlib.import_module("empdp.audit.mpl")

#: P(output 1) = 0.5·e^{-LOSS[d]} under database d: the event {1} of the pair (0, d) has loss LOSS[d]
LOSS = {0: 0.0, 1: 0.08, 2: 0.1}


def bernoulli(database, size, rng):
    return (rng.random(size) < 0.5 * math.exp(-LOSS[int(database)])).astype(np.int64)


PAIRS = [(0, 1), (0, 2)]  # exact ε 0.08 and 0.1 (the event {1}; {0} has less)
RNM1 = dpsniper_mechanism("report_noisy_max1")  # (DP-Sniper's ReportNoisyMax1 and its 8 pairs)


def test_duel_rounds_start_at_an_eighth_then_double():
    assert mpl_mod._duel_rounds(800) == [100, 100, 200, 400]
    assert mpl_mod._duel_rounds(1000) == [125, 125, 250, 500]
    assert mpl_mod._duel_rounds(81) == [10, 10, 20, 41] and mpl_mod._duel_rounds(10_005) == [1250, 1250, 2500, 5005]
    for size in (1, 7, 8, 80, 999, 123_457):
        rounds = mpl_mod._duel_rounds(size)
        assert sum(rounds) == size and all(r > 0 for r in rounds)


def test_the_duel_picks_the_pair_the_search_cannot_tell():
    """At n = 2,000 the two pairs' stage-1 estimates (standard error about 0.05) cannot tell losses of
    0.08 and 0.1 apart; the duel's 400,000 outputs (about 0.003) can, every seed."""
    searched = [mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=seed, duel_size=0).pair_index for seed in range(8)]
    assert 0 in searched  # (without the duel the search picks the lesser pair on some seeds)
    for seed in range(8):
        res = mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=seed, duel_size=400_000)
        assert res.pair_index == 1 and res.sizes["duel_size"] == 400_000, seed
        assert sorted(res.duel["pairs"]) == [0, 1] and res.duel["outputs"] <= 400_000
        losses = dict(zip(res.duel["pairs"], res.duel["losses"]))
        assert abs(losses[1] - 0.1) < 0.02 and losses[0] < 0.1  # (a noisy search may give pair 0 a poor event)
        assert res.to_dict()["duel"] == res.duel


def test_a_clear_choice_costs_the_first_round():
    """Pair (0, 0) has no loss at all: the first round (an eighth) already settles it."""
    res = mpl(bernoulli, [(0, 0), (0, 2)], n=2000, N=100_000, rng=3, duel_size=400_000)
    assert res.pair_index == 1 and res.duel["outputs"] == 50_000


def test_duel_draws_its_own_outputs_between_the_stages(monkeypatch):
    """The search is the same with or without the duel (its outputs come after stage 1's, from the same
    generator, so stage 2's are fresh and differ from a run without it); the duel's draws are its
    rounds, per finalist."""
    sizes, inside, searched = [], [], []
    draw_pair, duel = mpl_mod._draw_pair, mpl_mod._duel

    def spy_draw(plan, pair, size, *args, **kwargs):
        if inside:
            sizes.append((tuple(pair), size))
        return draw_pair(plan, pair, size, *args, **kwargs)

    def spy_duel(plan, entrants, *args):
        searched.append(entrants[0][0])  # (the search's choice: its best finalist)
        inside.append(True)
        try:
            return duel(plan, entrants, *args)
        finally:
            inside.clear()

    monkeypatch.setattr(mpl_mod, "_draw_pair", spy_draw)
    monkeypatch.setattr(mpl_mod, "_duel", spy_duel)
    res = mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=11, duel_size=8000)
    rounds = mpl_mod._duel_rounds(8000)
    drawn = [size for _, size in sizes]
    assert len(drawn) % 2 == 0 and drawn[::2] == drawn[1::2] == rounds[:len(drawn) // 2]
    assert sum(drawn[::2]) == res.duel["outputs"]
    monkeypatch.setattr(mpl_mod, "_duels", lambda *_: False)
    plain = mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=11)
    assert searched == [plain.pair_index] and plain.duel is None and "duel_size" not in plain.sizes
    assert plain.stage1_max_loss_by_pair == res.stage1_max_loss_by_pair


def test_duel_size_default_given_back_or_none():
    res = mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=2)
    assert res.sizes["duel_size"] == 5 * 2000
    none = mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=2, duel_size=0)
    assert none.sizes["duel_size"] == 0 and none.duel is None
    for bad in (5, -1, 2.5, True):
        with pytest.raises(InputError, match="duel_size"):
            mpl(bernoulli, PAIRS, n=2000, N=100_000, rng=1, duel_size=bad)
    with pytest.raises(InputError, match="not both"):
        mpl("noisy_max", duel_size=0, time_budget=5)
    # one pair, or the paper's rule (the loss alone chooses): no duel
    assert "duel_size" not in mpl(bernoulli, [(0, 2)], n=2000, N=100_000, rng=1).sizes
    assert "duel_size" not in mpl("laplace", n=2000, N=20_000, rng=1, selection="max").sizes
    # points of continuous outputs are measured as stage 2 measures them, by kernel densities
    points = mpl("laplace", n=2000, N=20_000, rng=1, events=False)
    assert points.sizes["duel_size"] == 10_000 and all(points.duel["t_hat"]) and len(points.duel["t_hat"]) >= 2


def test_cli_duel_size_is_reported_and_given_back():
    first = run("mpl", "-m", "noisy_max", "--pairs", "patterns", "--search-size", 3000, "--final-size", 30_000,
                "--seed", 4, "--json")
    assert first.exit_code == 0, first.output
    d = json.loads(first.output)
    assert d["sizes"]["duel_size"] == 15_000 and len(d["duel"]["pairs"]) >= 2
    again = run("mpl", "-m", "noisy_max", "--pairs", "patterns", "--search-size", 3000, "--final-size", 30_000,
                "--duel-size", 15_000, "--seed", 4, "--json")
    assert json.loads(again.output)["lower_bound"] == d["lower_bound"]
    text = run("mpl", "-m", "noisy_max", "--pairs", "patterns", "--search-size", 3000, "--final-size", 30_000,
               "--seed", 4)
    assert "duel size" in text.output and "15000" in text.output
    bad = run("mpl", "-m", "noisy_max", "--duel-size", 7, "--search-size", 3000, "--final-size", 30_000)
    assert bad.exit_code == 2 and "duel_size" in bad.output
    both = run("mpl", "-m", "noisy_max", "--duel-size", 0, "--time-budget", 5)
    assert both.exit_code == 2 and "not both" in both.output


def test_closing_steps_shrink_to_the_time_left_or_are_skipped():
    """A closing step (the refit, the duel) takes ratio·n outputs, or what ends by its deadline at the
    pilots' pace when less, or none when that is fewer than n (or the deadline has passed)."""
    now = time.perf_counter()
    assert mpl_mod._closing_size(5, 100) == 500 and mpl_mod._closing_size(5, 100, now + 100) == 500  # (no pace)
    assert mpl_mod._closing_size(5, 100, now + 100, 0.1) == 500  # (1,000 would fit)
    assert 240 <= mpl_mod._closing_size(5, 100, now + 25, 0.1) <= 250  # (shrunk to what fits)
    assert mpl_mod._closing_size(5, 100, now + 5, 0.1) == 0  # (50 < n would fit)
    assert mpl_mod._closing_size(5, 100, now - 1) == 0


def test_a_budget_reports_a_duel_the_clock_skipped_and_reproduces_it(monkeypatch):
    """The clock's decision (here: no time for the duel, and time for every step of the search) is
    reported as 0 and given back."""
    monkeypatch.setattr(mpl_mod._Steps, "_fits", lambda self, pace, rows, load: True)
    closing = mpl_mod._closing_size
    monkeypatch.setattr(mpl_mod, "_closing_size",
                        lambda ratio, *args: 0 if ratio == mpl_mod.DUEL_RATIO else closing(ratio, *args))
    res = mpl(*RNM1, time_budget=3, alpha=0.1, rng=5)
    s = res.sizes
    assert s["duel_size"] == 0 and res.duel is None
    monkeypatch.setattr(mpl_mod, "_closing_size", closing)
    again = mpl(*RNM1, n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                duel_size=0, alpha=0.1, rng=5, **({"search_steps": s["search_steps"]} if "search_steps" in s else {}))
    assert again.lower_bound == res.lower_bound


def test_a_budget_reports_its_duel_and_its_sizes_reproduce_it():
    """How much time the clock left for the duel depends on the machine: either way it is reported (its
    size, shrunk to the time left, 0 when skipped) and the sizes given back reproduce the run, duel and all."""
    res = mpl(*RNM1, time_budget=4, alpha=0.1, rng=6)
    s = res.sizes
    if "duel_size" not in s:  # (a loaded host's clock stopped the search at one pair: no finalists to duel)
        assert s["search_steps"] == 1 and res.duel is None
    else:
        assert s["duel_size"] == 0 or s["search_size"] <= s["duel_size"] <= 5 * s["search_size"]
        assert (res.duel is None) == (s["duel_size"] == 0)
    again = mpl(*RNM1, n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                duel_size=s.get("duel_size"), alpha=0.1, rng=6, **({"search_steps": s["search_steps"]}
                                                                    if "search_steps" in s else {}))
    assert again.lower_bound == res.lower_bound and again.duel == res.duel


def test_a_budget_reserves_time_for_a_duel_only_where_its_pilots_had_one(monkeypatch):
    """The search's deadline leaves room for the duel at the last pilot's pace per output and pair it drew; where
    the pilots had no duel (one pair, or the paper's rule) it leaves none, as before the duel."""
    seen = []
    run_ = mpl_mod._run

    def spy(plan, *args, **kwargs):
        end = kwargs.get("end")
        if end is not None:
            seen.append(end)
        return run_(plan, *args, **kwargs)

    monkeypatch.setattr(mpl_mod, "_run", spy)
    asked = []
    duel_seconds = mpl_mod._Deadline.duel_seconds
    monkeypatch.setattr(mpl_mod._Deadline, "duel_seconds",
                        lambda self, n, pairs: asked.append(pairs) or duel_seconds(self, n, pairs))
    mpl(*RNM1, time_budget=3, alpha=0.1, rng=1)
    assert asked == [2]  # (the search's two finalist pairs of eight: the refit's entrant shares its pair's draws)
    assert seen[-1].duel_pace > 0 and seen[-1].duel_seconds(1000, 2) == seen[-1].duel_pace * 5 * 1000 * 2
    assert seen[-1].duel_seconds(1000, 1) == seen[-1].duel_pace * 5 * 1000  # (a pair's entrants share its draws)
    mpl("laplace", [(0, 1)], time_budget=3, alpha=0.1, rng=1, events=False)  # (one pair's point: no duel)
    assert seen[-1].duel_pace == 0.0 and seen[-1].duel_seconds(1000, 3) == 0.0
    mpl(bernoulli, PAIRS, time_budget=3, rng=1, selection="max")  # (the paper's rule: no duel)
    assert seen[-1].duel_pace == 0.0


def test_the_refits_event_duels_beside_the_searchs():
    """On vector outputs the refit's event of the selected pair is one more entrant: it wins where it is
    better, and where it is useless (here made to keep every output: loss 0) the search's own event
    goes to stage 2, where before the duel the refit's replaced it."""
    res = mpl("prefix_sum", n=3000, N=20_000, alpha=0.1, rng=1)
    found = res.duel["mass_shares"].count(1.0)  # (the entrants; their rungs come after them)
    assert found == 3 and res.duel["refitted"][:3] == [False, False, True]
    assert res.duel["pairs"][2] == res.duel["pairs"][0]  # (the refit is the search's selected pair's)
    refit = mpl_mod._refit

    def useless(plan, best, *args):
        cand = refit(plan, best, *args)
        return replace(cand, rule=replace(cand.rule, scorer=_Constant(), threshold=0.0, direction=1))

    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.setattr(mpl_mod, "_refit", useless)
        res = mpl("prefix_sum", n=3000, N=20_000, alpha=0.1, rng=1)
    finally:
        monkeypatch.undo()
    assert res.duel["losses"][2] == 0.0 and not res.event_rule["refitted"] and res.lower_bound > 0.3
    assert len(res.duel["mass_shares"]) > 3 and all(share < 1 for share in res.duel["mass_shares"][3:])


class _Constant:
    name = "constant"

    def score(self, outputs):
        return np.zeros(len(outputs))


def gaussian_pair(database, size, rng):
    """Four coordinates N(database, 1) (past a density's three: score events): the log ratio of (0, 0.3)
    grows along their sum without bound, so the rarer an event {score ≥ c}, the larger its loss."""
    return rng.standard_normal((size, 4)) + float(database)


def _rungs(cand, vx, vy, level):
    return mpl_mod._rungs(cand, vx[vx >= level], vy[vy >= level], len(vx), level)


def test_rungs_sit_at_shares_of_the_mass_above_the_event_and_not_on_ties():
    assert _rungs(SimpleNamespace(rule=None), np.arange(100.0), np.arange(100.0), 0.0) == []  # (no score)
    assert _rungs(SimpleNamespace(rule=mpl_mod.ScoreRule("output", 0.0, 1), tau=1e-4), np.arange(3000.0),
                  np.arange(3000.0), 0.0) == []  # (a half-line of a number: none)
    rule = SimpleNamespace(rule=mpl_mod.ScoreRule("sum", 0.0, 1, _Sum()), tau=1e-4)
    vx, vy = np.arange(3000.0), np.arange(3000.0) - 1000  # (x has more at every level)
    rungs = _rungs(rule, vx, vy, 1500.0)  # 1,500 values of x at or above: rungs keep 500, 150, 50
    assert rungs == [(1 / 3, 2500.0), (1 / 10, 2850.0), (1 / 30, 2950.0)]
    assert [s for s, _ in _rungs(rule, vx, vy, 2800.0)] == [0.335, 0.1]  # (200 above: 67, 20 and 7 < RUNG_HITS)
    tied = np.concatenate([np.zeros(2900), np.ones(100)])  # the top 100 values tied: no rarer event there
    assert _rungs(rule, tied, tied, 1.0) == []
    assert _rungs(rule, tied, tied, 0.0) == [(1 / 30, 1.0)]  # (3,000: a thirtieth is the tie)
    floored = SimpleNamespace(rule=rule.rule, tau=0.01)  # (twice the floor is 60 of the 3,000 values)
    assert [s for s, _ in _rungs(floored, vx, vy, 1500.0)] == [1 / 3, 1 / 10]
    half = np.concatenate([np.arange(1500.0), np.full(1500, 5000.0)])  # (a third's level is tied with half)
    assert _rungs(rule, half, half, 0.0) == [(0.5, 5000.0)]  # (the share it keeps, not the one aimed at)


def test_a_rung_of_a_lower_event_counts_as_stage_2_does():
    """An event {score ≤ c} (direction −1) is {−score ≥ −c} in the duel's values; a rung's candidate
    keeps the outputs stage 2 counts for it (:func:`empdp.audit.mpl._members`), fewer than its parent's."""
    cand = mpl_mod.Candidate(score=0.0, t=np.array([0.5]), event=None, pts=np.zeros((1, 1)), loss=np.zeros(1),
                             tau=1e-4, box=None, rule=mpl_mod.ScoreRule("output", 0.5, -1))
    outputs = np.linspace(-1, 1, 201)[:, None]
    values = mpl_mod._duel_values([cand])(outputs)[:, 0]
    level = mpl_mod._duel_level(cand)
    rung = mpl_mod._at_level(cand, -0.2)  # (a higher level of −score: a lower threshold)
    members = mpl_mod._members(rung)(outputs)
    assert level == -0.5 and rung.rule.threshold == 0.2 and rung.rule.direction == -1 and rung.t.tolist() == [0.2]
    assert np.array_equal(members, values >= -0.2) and np.array_equal(members, outputs[:, 0] <= 0.2)
    assert np.array_equal(mpl_mod._members(cand)(outputs), values >= level)
    assert 0 < np.count_nonzero(members) < np.count_nonzero(values >= level)


class _Sum:
    name = "sum"

    def score(self, outputs):
        return np.asarray(outputs, float).sum(axis=1)


def test_a_lone_score_event_duels_its_rungs_and_the_rarer_wins_where_the_loss_grows():
    """One entrant, {z1 + … + z4 ≥ c} at a tenth of the mass of x′ = 0.3 (where the log ratio grows
    along the sum without bound): its rungs at a third, a tenth and a thirtieth of that mass have larger
    losses (about 1.1, 1.4, 1.6 against 0.8), the duel measures them from its second round on and, with
    2·10^6 outputs planned for stage 2, takes one of them."""
    plan = mpl_mod._resolve(gaussian_pair, [(0, 0.3)], 20_000, 2_000_000, None, 0.1, None, None, "lb", True, None,
                            None, None)
    cand = mpl_mod.Candidate(score=0.0, t=np.array([3.8]), event=None, pts=np.zeros((1, 1)), loss=np.zeros(1),
                             tau=1e-3, box=None, rule=mpl_mod.ScoreRule("sum", 3.8, 1, _Sum()))
    assert mpl_mod._duels([(0, cand, False, 1.0)], plan, False)
    half_line = replace(cand, rule=mpl_mod.ScoreRule("output", 3.8, 1))  # (a number's: no rungs, no duel alone)
    assert not mpl_mod._duels([(0, half_line, False, 1.0)], plan, False)
    assert mpl_mod._duels([(0, half_line, False, 1.0), (0, cand, True, 1.0)], plan, False)
    for seed in range(5):
        won, seen = mpl_mod._duel(plan, [(0, cand, False, 1.0)], 400_000, np.random.default_rng(seed),
                                  lambda *_: None)
        shares, losses, chosen = seen["mass_shares"], seen["losses"], seen["chosen"]
        assert shares[0] == 1.0 and len(shares) == 4 and shares[chosen] < 1, (seed, shares)
        assert losses[1] > losses[0] + 0.15 and losses[chosen] > losses[0] + 0.3, (seed, losses)
        assert won[1].rule.threshold > 3.8 and won[1].rule.scorer is cand.rule.scorer and won[3] == shares[chosen]
        assert seen["counted"] == [seen["outputs"]] + [seen["outputs"] - 50_000] * 3


def test_stage_2_measures_the_rung_the_duel_chose():
    """End to end: the search's and the refit's events enter with their rungs (counted from the second
    round), and stage 2 counts the chosen one's event: its loss there is the duel's within the duel's noise."""
    for seed in range(3):
        res = mpl(gaussian_pair, [(0, 0.3)], n=20_000, N=2_000_000, alpha=0.1, rng=seed, duel_size=400_000)
        shares, counted, chosen = res.duel["mass_shares"], res.duel["counted"], res.duel["chosen"]
        assert shares[:2] == [1.0, 1.0] and len(shares) >= 3, shares  # (the search's and the refit's, then rungs)
        assert counted[:2] == [res.duel["outputs"]] * 2 and all(c == counted[0] - 50_000 for c in counted[2:])
        error = res.duel["standard_errors"][chosen]  # (about 0.06: the chosen reading is the best of several)
        assert abs(res.loss_at_t_hat - res.duel["losses"][chosen]) < 4 * error, (seed, res.loss_at_t_hat, res.duel)


def test_rungs_are_placed_on_at_most_rung_rows_of_the_first_round(monkeypatch):
    """What the first round keeps for the rungs (the values at or above each level) comes from its first
    RUNG_ROWS outputs only, over chunks: a round of 5n/8 outputs at n = 2·10^7 would hold gigabytes."""
    seen = []
    rungs = mpl_mod._rungs

    def spy(cand, above_x, above_y, rows, level):
        seen.append((len(above_x), len(above_y), rows))
        return rungs(cand, above_x, above_y, rows, level)

    monkeypatch.setattr(mpl_mod, "_rungs", spy)
    monkeypatch.setattr(mpl_mod, "RUNG_ROWS", 3000)
    monkeypatch.setattr(mpl_mod, "DUEL_CHUNK", 1024)  # (the 3,000 span three chunks and part of a fourth)
    plan = mpl_mod._resolve(gaussian_pair, [(0, 0.3)], 20_000, 2_000_000, None, 0.1, None, None, "lb", True, None,
                            None, None)
    cand = mpl_mod.Candidate(score=0.0, t=np.array([-100.0]), event=None, pts=np.zeros((1, 1)), loss=np.zeros(1),
                             tau=1e-4, box=None, rule=mpl_mod.ScoreRule("sum", -100.0, 1, _Sum()))  # (every output)
    won, duel = mpl_mod._duel(plan, [(0, cand, False, 1.0)], 80_000, np.random.default_rng(1), lambda *_: None)
    assert seen == [(3000, 3000, 3000)] and duel["mass_shares"][1:] == [1000 / 3000, 300 / 3000, 100 / 3000]


def spike_or_shift(database, size, rng):
    """N(0, 1) under database 0; database 1 puts a tenth of it in a spike N(0, 0.05²) (its log ratio peaks
    at 0: about 1.06, while a half-line's loss is at most about 0.01); database 2 is N(1, 1) (a half-line's
    loss grows along it, {x ≥ 2} has 1.94; a point's at 0 is 0.5)."""
    out = rng.normal(1.0 if database == 2 else 0.0, 1.0, size)
    if database == 1:
        spike = rng.random(size) < 0.1
        out[spike] = rng.normal(0.0, 0.05, int(spike.sum()))
    return out


def _point(t, bandwidth=0.05, rows=20_000):
    return mpl_mod.Candidate(score=0.0, t=np.array([t]), event=None, pts=np.zeros((1, 1)), loss=np.zeros(1),
                             tau=1e-4, box=None, bandwidth=np.array([bandwidth]), rows=rows)


def _half_line(threshold):
    return mpl_mod.Candidate(score=0.0, t=np.array([threshold]), event=None, pts=np.zeros((1, 1)),
                             loss=np.zeros(1), tau=1e-4, box=None, rule=mpl_mod.ScoreRule("output", threshold, 1))


def _plan(pairs, N=2_000_000):
    return mpl_mod._resolve(spike_or_shift, pairs, 20_000, N, None, 0.1, None, None, "lb", True, None, None,
                            mpl_mod.UNDERSMOOTH)


def test_a_points_duel_value_is_its_kernel_density_at_stage_2s_bandwidth():
    """A point t̂ enters the duel as stage 2 measures it: the mean of its duel values is the kernel density
    at t̂ with stage 1's bandwidth rescaled to the size stage 1 weighs by (stage 2's), its predicted bound
    stage 2's (σ̂² = ∫K²(1/f_x + 1/f_x′), c_N = √(N h^d)), its error σ̂ / √(drawn h^d)."""
    from empdp.audit.kde import GAUSS_R, kde_at

    plan, cand = _plan([(0, 1)]), _point(0.3)
    assert mpl_mod._kernel(cand) and mpl_mod._duel_level(cand) is None and not mpl_mod._kernel(_half_line(0.3))
    h = mpl_mod._duel_bandwidth(cand, plan)
    assert h[0] == pytest.approx(0.05 * 100 ** (-1 / 5) * 2_000_000 ** -plan.undersmooth, rel=1e-12)
    outputs = np.random.default_rng(0).normal(size=(5000, 1))
    values = mpl_mod._duel_values([cand, _half_line(0.3)], plan)(outputs)
    assert values[:, 0].mean() == pytest.approx(kde_at(outputs, [[0.3]], h)[0], rel=1e-12)
    assert np.array_equal(values[:, 1], outputs[:, 0])  # (a half-line of a number: the number itself)
    drawn = np.array([1000, 1000])
    pred, loss, sigma, scale = mpl_mod._duel_scores(np.array([[300.0, 200.0], [300.0, 200.0]]), drawn,
                                                    [cand, _half_line(0.3)], plan)
    assert loss[0] == loss[1] == pytest.approx(math.log(1.5))
    assert sigma[0] == pytest.approx(math.sqrt(GAUSS_R * (1 / 0.3 + 1 / 0.2)))
    assert pred[0] == pytest.approx(loss[0] - plan.zc * sigma[0] / math.sqrt(plan.weighed_N * h[0]))
    assert scale[0] == pytest.approx(math.sqrt(h[0])) and scale[1] == 1.0
    assert sigma[1] == pytest.approx(math.sqrt(1 / 0.3 + 1 / 0.2 - 2))
    assert pred[1] == pytest.approx(loss[1] - plan.zc * sigma[1] / math.sqrt(plan.weighed_N))


@pytest.mark.parametrize("other, kernel_wins", [(1, True), (2, False)])
def test_the_duel_measures_a_point_against_a_half_line(other, kernel_wins):
    """Against the spike the point at 0 wins (loss about 0.83 at stage 2's bandwidth, 0.042, against at
    most 0.01 for {x ≥ 0}); against the shift the half-line {x ≥ 2} wins (1.94 against 0.5 at 0), on
    every seed."""
    plan = _plan([(0, other)])
    entrants = [(0, _half_line(0.0 if other == 1 else 2.0), False, 1.0), (0, _point(0.0, 0.2), False, 1.0)]
    for seed in range(3):
        won, seen = mpl_mod._duel(plan, entrants, 200_000, np.random.default_rng(seed), lambda *_: None)
        assert seen["t_hat"] == [False, True]
        assert mpl_mod._kernel(won[1]) is kernel_wins, (seed, seen["losses"])
        point, line = seen["losses"][1], seen["losses"][0]
        assert (point, line) == ((pytest.approx(0.83, abs=0.1), pytest.approx(0.0, abs=0.03)) if kernel_wins
                                 else (pytest.approx(0.5, abs=0.1), pytest.approx(1.94, abs=0.1)))


def test_the_runner_up_between_a_point_and_a_half_line_enters_the_duel():
    """Stage 1 keeps the pair's other candidate (t̂ beside the half-line) and the duel measures both: on the
    spike the search's noisy estimates may rank either first, the duel takes the point, and stage 2
    estimates the kernel density at its t̂."""
    from empdp.audit.dpl import candidate

    plan = _plan([(0, 1)], N=400_000)
    rng = np.random.default_rng(3)
    x, y = (spike_or_shift(d, 20_000, rng)[:, None] for d in (0, 1))
    cand = candidate(x, y, False, plan)
    assert cand.alternative is not None and mpl_mod._kernel(cand) != mpl_mod._kernel(cand.alternative)
    stage1 = mpl_mod._Stage1([cand], 0, False, [0])
    assert mpl_mod._entrants(stage1, None) == [(0, cand, False, 1.0), (0, cand.alternative, False, 1.0)]
    res = mpl(spike_or_shift, [(0, 1)], n=20_000, N=400_000, alpha=0.1, rng=5)
    assert res.duel["t_hat"][res.duel["chosen"]] and res.event_rule is None
    assert abs(float(np.ravel(res.t_hat)[0])) < 0.1 and res.lower_bound > 0.7, (res.t_hat, res.lower_bound)


def test_the_pick_charges_an_event_one_standard_error_and_a_point_two(monkeypatch):
    """The duel takes the largest predicted bound less DUEL_PICK (1) standard errors of an event's own
    estimate and DUEL_PICK_POINT (2) of a point's (its prediction does not charge the smaller N its
    kernel sums get): with these readings the second event wins, where one charge for all would take the
    point and two for all the point too."""
    readings = {"line": (0.50, 0.01), "event": (0.53, 0.03), "point": (0.545, 0.03)}  # predicted, its error
    entrants = [(0, _half_line(0.0), False, 1.0), (0, _half_line(1.0), False, 1.0), (0, _point(0.0), False, 1.0)]

    def scores(hits, drawn, cands, plan):
        predicted, error = (np.array([readings[k][i] for k in readings]) for i in (0, 1))
        return predicted, predicted, error * np.sqrt(drawn), np.ones(len(cands))

    monkeypatch.setattr(mpl_mod, "_duel_scores", scores)
    won, seen = mpl_mod._duel(_plan([(0, 1)]), entrants, 8_000, np.random.default_rng(0), lambda *_: None)
    assert (mpl_mod.DUEL_PICK, mpl_mod.DUEL_PICK_POINT) == (1.0, 2.0)
    assert seen["chosen"] == 1 and won == entrants[1] and seen["t_hat"] == [False, False, True]
    assert seen["standard_errors"] == pytest.approx([0.01, 0.03, 0.03])
    for both in (1.0, 2.0):  # (one charge for every entrant would take the point)
        monkeypatch.setattr(mpl_mod, "DUEL_PICK", both)
        monkeypatch.setattr(mpl_mod, "DUEL_PICK_POINT", both)
        assert mpl_mod._duel(_plan([(0, 1)]), entrants, 8_000, np.random.default_rng(0), lambda *_: None)[1][
            "chosen"] == 2


def plane(database, size, rng):
    """Two coordinates N(database, 1): a point t̂ and a score event's rungs may duel on the same pair."""
    return rng.standard_normal((size, 2)) + float(database)


def test_each_rung_is_charged_as_an_event_beside_a_point(monkeypatch):
    """Rungs join the entrants after the first round: the charges follow the grown list, one standard
    error for the score event and each rung, two for the point (readings: the event 0.50 ± 0.01, each rung
    0.53 ± 0.03, the point 0.545 ± 0.03), so a rung wins where one charge for all would take the point."""
    plan = mpl_mod._resolve(plane, [(0, 0.3)], 20_000, 2_000_000, None, 0.1, None, None, "lb", True, None, None,
                            mpl_mod.UNDERSMOOTH)
    event = mpl_mod.Candidate(score=0.0, t=np.array([1.0]), event=None, pts=np.zeros((1, 1)), loss=np.zeros(1),
                              tau=1e-3, box=None, rule=mpl_mod.ScoreRule("sum", 1.0, 1, _Sum()))
    point = mpl_mod.Candidate(score=0.0, t=np.zeros(2), event=None, pts=np.zeros((1, 2)), loss=np.zeros(1),
                              tau=1e-4, box=None, bandwidth=np.full(2, 0.2), rows=20_000)
    entrants = [(0, event, False, 1.0), (0, point, False, 1.0)]

    def scores(hits, drawn, cands, plan):
        readings = np.array([(0.545, 0.03) if mpl_mod._kernel(c) else (0.50, 0.01) if c.rule.threshold == 1.0
                             else (0.53, 0.03) for c in cands])
        return readings[:, 0], readings[:, 0], readings[:, 1] * np.sqrt(drawn), np.ones(len(cands))

    monkeypatch.setattr(mpl_mod, "_duel_scores", scores)
    won, seen = mpl_mod._duel(plan, entrants, 400_000, np.random.default_rng(0), lambda *_: None)
    assert len(seen["t_hat"]) == len(seen["predicted_bounds"]) == len(seen["mass_shares"]) >= 4
    assert seen["t_hat"] == [False, True] + [False] * (len(seen["t_hat"]) - 2) and min(seen["mass_shares"]) < 1
    assert seen["chosen"] == 2 and seen["mass_shares"][2] < 1 and won[1].rule.threshold > 1.0
    monkeypatch.setattr(mpl_mod, "DUEL_PICK_POINT", 1.0)  # (one charge for all: the point)
    assert mpl_mod._duel(plan, entrants, 400_000, np.random.default_rng(0), lambda *_: None)[1]["chosen"] == 1


def test_a_kernel_stage_2_under_a_deadline_is_sized_by_its_own_pace():
    """Stage 2 at t̂ cannot stop at the deadline (its bandwidth is set by N), so its N comes from its
    own pace, timed on a probe from a stream of its own: at least the pilots' rate, and a slow sampler's
    pace shows in it."""
    def slow(database, size, rng):
        time.sleep(size * 2e-6)
        return rng.normal(float(database), 1.0, size)

    plan = mpl_mod._resolve(slow, [(0, 1)], 2000, 20_000, None, 0.1, None, None, "lb", True, None, None,
                            mpl_mod.UNDERSMOOTH)
    end = mpl_mod._Deadline(time.perf_counter() + 10.0, 1e-9)
    pace = mpl_mod._kde_pace(plan, _point(0.5, 0.2), (0, 1), end)
    assert pace >= 2 * 2e-6  # (two databases' draws per output)
    assert end.final_size(100, False, pace) <= 10.0 / pace < end.final_size(100, False)
    fast = mpl_mod._Deadline(time.perf_counter() + 10.0, 1.0)
    assert mpl_mod._kde_pace(plan, _point(0.5, 0.2), (0, 1), fast) == 1.0


def test_a_kernel_stage_2s_probe_leaves_its_outputs_and_their_reproduction_alone(monkeypatch):
    """The probe runs only for a stage 2 at t̂ under a deadline, and draws from a stream of its own: the
    sizes such a run reports, given back with its seed (no deadline, so no probe), reproduce its bound."""
    calls = []
    pace = mpl_mod._kde_pace
    monkeypatch.setattr(mpl_mod, "_kde_pace", lambda *args: calls.append(args[1]) or pace(*args))
    res = mpl("laplace", [(0, 1)], time_budget=3, alpha=0.1, rng=2, events=False)
    assert res.event_rule is None and len(calls) == 1 and mpl_mod._kernel(calls[0])
    assert res.final_size == res.sizes["final_size_aimed"]  # (a density at a point is not stopped)
    again = mpl("laplace", [(0, 1)], n=res.search_size, N=res.final_size, selection_size=res.sizes["selection_size"],
                search_steps=res.sizes.get("search_steps"), alpha=0.1, rng=2, events=False)
    assert again.lower_bound == res.lower_bound and len(calls) == 1
    mpl("randomized_response", time_budget=3, alpha=0.1, rng=2)  # (frequencies: counted, stopped at the deadline)
    assert len(calls) == 1
