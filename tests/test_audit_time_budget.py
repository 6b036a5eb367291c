"""--time-budget: sample sizes chosen by pilot runs, reported, and reproducible given back with the seed."""

import importlib
import json
import time
from dataclasses import replace

import pytest
from audit_cli_helpers import run
from helpers import one_line_error

from empdp.audit.mpl import mpl
from empdp.audit.renyi import renyi
from empdp.errors import InputError


def test_mpl_budget_chooses_reports_and_reproduces_sizes():
    t0 = time.perf_counter()
    res = mpl("laplace", params={"epsilon": 0.5}, time_budget=2, rng=3)
    took = time.perf_counter() - t0
    s = res.sizes
    assert s["chosen_by"] == "time budget" and s["time_budget"] == 2
    assert s["search_size"] == res.search_size >= 4000 and s["final_size"] == res.final_size
    # N is aimed at 2n or more; the clock may stop stage 2 short of it, once past n (a loaded host slowed
    # a stage 1 of 1.89 million outputs past its plan, and N was 65,536; with n = 1.11 million, 786,432
    # were drawn, and the sizes given back were refused: N must exceed n)
    mpl_mod = importlib.import_module("empdp.audit.mpl")
    assert s["final_size_aimed"] >= mpl_mod.round_size(2 * res.search_size)  # (to three significant digits)
    assert res.search_size < res.final_size <= s["final_size_aimed"]
    assert took < 8  # about the budget (a loaded machine may overrun it somewhat)
    # (search_steps: reported when the clock stopped stage 1, which a loaded host's run of 10 pairs can;
    # duel_size: the clock shrinks a duel begun late, and the default size then chose another entrant)
    again = mpl("laplace", params={"epsilon": 0.5}, n=s["search_size"], N=s["final_size"],
                selection_size=s["selection_size"], search_steps=s.get("search_steps"),
                duel_size=s.get("duel_size"), rng=3)
    assert again.lower_bound == res.lower_bound and again.sizes["chosen_by"] == "given"
    assert again.sizes["selection_size"] == s["selection_size"]
    # a 95% bound exceeds the truth on 5% of seeds, and then only by about its own error: ~1% here
    assert 0 < res.lower_bound <= 0.5 * 1.02


def test_renyi_budget_chooses_reports_and_reproduces_sizes():
    res = renyi("gaussian", order=2, time_budget=2, rng=5)
    assert res.sizes["chosen_by"] == "time budget" and res.sizes["sample_size"] == res.sample_size >= 4000
    again = renyi("gaussian", order=2, n=res.sample_size, rng=5)
    assert again.lower_bound == res.lower_bound
    assert res.to_dict()["sizes"]["sample_size"] == res.sample_size


def test_without_budget_or_sizes_the_old_defaults_hold():
    res = mpl("randomized_response", rng=1)
    assert (res.search_size, res.final_size) == (20000, 50000) and res.sizes["chosen_by"] == "default"


@pytest.mark.parametrize("budget", [0, -1, float("nan"), 1e9, True])
def test_bad_budgets_are_input_errors(budget):
    with pytest.raises(InputError, match="time budget"):
        mpl("laplace", time_budget=budget)


def test_budget_and_sizes_together_are_refused():
    with pytest.raises(InputError, match="not both"):
        mpl("laplace", n=1000, time_budget=3)
    with pytest.raises(InputError, match="not both"):
        renyi("laplace", n=1000, time_budget=3)
    one_line_error(run("mpl", "-m", "laplace", "--time-budget", 3, "--search-size", 1000), "not both")
    one_line_error(run("renyi", "-m", "laplace", "--order", 2, "--time-budget", 3, "--sample-size", 1000),
                   "not both")


def test_cli_budget_in_json_and_sizes_override_the_default_budget():
    res = run("mpl", "-m", "laplace", "--param", "epsilon=0.5", "--time-budget", 2, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["sizes"]["chosen_by"] == "time budget" and d["sizes"]["search_size"] == d["search_size"]
    # Every size the run reports is given back, as the docs tell users: the stage-2 size stage 1 weighed
    # its candidates by, and, when the stage-1 deadline stopped the search early (under load), its steps.
    sizes = [(f"--{key.replace('_', '-')}", d["sizes"][key])
             for key in ("search_size", "final_size", "selection_size", "search_steps") if key in d["sizes"]]
    given = run("mpl", "-m", "laplace", "--param", "epsilon=0.5", *(v for pair in sizes for v in pair), "--seed", 1,
                "--json")
    assert json.loads(given.output)["lower_bound"] == d["lower_bound"]  # the default budget is not used
    text = run("renyi", "-m", "gaussian", "--order", 2, "--time-budget", 2, "--seed", 1)
    assert text.exit_code == 0 and "chosen for a 2 s budget" in text.output


def test_budget_sized_bound_on_laplace_at_a_tenth():
    """The issue's target, at sizes fixed for a deterministic test: a 20 s budget chose n ≥ 7·10^5
    (N = 5n) for Laplace on this 2-core machine under load; a fifth of that already gives ≥ 0.095."""
    res = mpl("laplace", params={"epsilon": 0.1}, n=140_000, N=700_000, alpha=0.05, rng=2)
    assert 0.095 <= res.lower_bound <= 0.1
    assert res.event_rule is not None  # a half-line event, not a density at a point


@pytest.mark.parametrize("power", [0.85, 1.0, 1.25])
def test_the_budget_forecasts_costs_that_grow_slower_or_faster_than_the_size(power, monkeypatch):
    """A run whose cost grows as size^power is sized so that pilots and run together take the planned
    share of the budget. A straight line through two small pilots forecast a cost that stops growing (a
    fit on capped rows) at 2-3 times its real value. The budget's clock is a fake one that each run
    advances by exactly its cost (sleeping overshot on a loaded host and failed CI)."""
    import types

    from empdp.audit import budget as budget_module
    from empdp.audit.budget import SAFETY, size_for_budget

    def cost(size):
        return 0.02 * (size / 1000) ** power

    clock = [0.0]
    monkeypatch.setattr(budget_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def run(size, rng):
        clock[0] += cost(size)

    budget = 4.0
    size, info = size_for_budget(run, budget, 1000, 10**9)
    pilots = clock[0]
    assert info["cost_power"] == pytest.approx(power, abs=0.05)
    assert 0.85 * SAFETY * budget < pilots + cost(size) < 1.1 * SAFETY * budget
    assert pilots < 0.35 * budget  # the pilots leave most of the budget to the run


def test_the_budget_gives_stage2_the_time_stage1_leaves():
    """Stage 1 is planned at STAGE1_SHARE of the time the pilots left, stage 2 the rest at its own rate:
    where stage 2 costs 50 times less per output than stage 1 (the Sparse Vector variants' score events),
    N is about 33 n at a share of 0.6, where a fixed N = 5n left stage 2 under a tenth of the time; where
    it is as dear, N stays 5n."""
    from empdp.audit.budget import SAFETY, two_stage_sizes

    sizes, ratio, budget, pilot = [1000, 4000], 5, 20.0, 2.0
    stage1 = [5e-4 * s for s in sizes]  # linear, 0.5 ms per output
    stage2 = [1e-5 * ratio * s for s in sizes]  # 10 us per output of stage 2
    n, N, info = two_stage_sizes(sizes, stage1, stage2, ratio, budget, pilot, 0.6, 1000, (10**9, 10**9))
    left = SAFETY * budget - pilot
    assert 5e-4 * n == pytest.approx(0.6 * left, rel=0.01)
    assert 5e-4 * n + 1e-5 * N == pytest.approx(left, rel=0.01)
    assert N > 30 * n and info["stage1_share"] == 0.6 and info["cost_power"] == pytest.approx(1.0)
    # stage 2 as dear per output as stage 1 (discrete outputs, counted both ways): N stays 5n, all within
    n, N, _ = two_stage_sizes(sizes, stage1, [5e-4 * ratio * s for s in sizes], ratio, budget, pilot, 0.6, 1000,
                              (10**9, 10**9))
    assert N == pytest.approx(ratio * n, rel=0.01) and 5e-4 * (n + N) == pytest.approx(left, rel=0.01)
    # a stage 1 already over the budget leaves stage 2 its floor of 2n, and memory caps n
    n, N, info = two_stage_sizes(sizes, [100.0, 400.0], stage2, ratio, budget, pilot, 0.6, 1000, (1500, 10**9))
    assert (n, N) == (1000, 2000) and info["capped_by"] == "minimum size"
    n, N, info = two_stage_sizes(sizes, stage1, stage2, ratio, budget, pilot, 0.6, 1000, (5000, 10**9))
    assert n == 5000 and N > 30 * n and info["capped_by"] == "memory"


def test_audits_run_blas_on_one_thread():
    """The audits' small matrices gain nothing from BLAS threads, which spin against each other on a
    loaded host; the sampler sees one thread in numpy's BLAS (scipy's own, loaded later, is limited where
    the logistic fit uses it)."""
    from threadpoolctl import threadpool_info

    from empdp.audit import approx, renyi

    seen = []

    def sampler(database, size, rng):
        seen.append(max(lib["num_threads"] for lib in threadpool_info()
                        if lib["user_api"] == "blas" and "numpy" in lib["filepath"]))
        return rng.laplace(float(database[0]), 2.0, size)

    for audit in (lambda: mpl(sampler, [([0.0], [1.0])], n=1000, N=2000, rng=1),
                  lambda: renyi(sampler, [([0.0], [1.0])], order=2, n=1000, rng=1),
                  lambda: approx(sampler, [([0.0], [1.0])], delta=1e-3, n=1000, N=2000, rng=1)):
        audit()
    assert seen and set(seen) == {1}


def test_stage1_memory_cap_counts_bytes():
    """Float outputs keep the old cap (5 * 10^7 values over all pairs); SVT's int8 answer vectors, which
    that cap held at a third of their budget, get MAX_NARROWING times as many rows, not 8."""
    import numpy as np

    from empdp.audit.budget import MAX_NARROWING, stage1_cap

    floats, narrow = np.zeros((2, 10)), np.zeros((2, 10), np.int8)
    assert stage1_cap(floats, 16) == 5 * 10**7 // (16 * 10)
    assert stage1_cap(narrow, 16) == MAX_NARROWING * stage1_cap(floats, 16)
    assert stage1_cap(np.zeros((2, 10), np.float32), 16) == 2 * stage1_cap(floats, 16)


def test_stage2_stops_at_its_deadline_and_the_reported_size_reproduces(monkeypatch):
    """With a deadline, stage 2 of an event draws whole chunks until the next would end past it (the clock
    alone stops it, never the counts): a stage 2 aimed at 10^8 outputs ends within the budget, reports
    the outputs it counted, and those sizes given back reproduce the bound."""
    mpl_mod = importlib.import_module("empdp.audit.mpl")  # the package binds the name mpl to the function
    monkeypatch.setattr(mpl_mod._Deadline, "final_size", lambda self, n, stoppable, rate=None: mpl_mod.MAX_COUNTED)
    t0 = time.perf_counter()
    res = mpl("randomized_response", time_budget=3, rng=4)
    took = time.perf_counter() - t0
    assert took < 3.5  # the deadline is 0.95 x 3 - 0.3 s after the call; one chunk takes milliseconds
    assert res.sizes["final_size_aimed"] == mpl_mod.MAX_COUNTED > res.final_size == res.sizes["final_size"]
    assert res.final_size % mpl_mod.STAGE2_CHUNK == 0
    again = mpl("randomized_response", n=res.search_size, N=res.final_size,
                selection_size=res.sizes["selection_size"], search_steps=res.sizes.get("search_steps"), rng=4)
    assert again.lower_bound == res.lower_bound


def test_stage1_weighs_by_the_planned_size_and_the_reported_sizes_reproduce_it(monkeypatch):
    """Stage 1 weighs its candidates by a stage-2 size (their predicted bound's error); a time budget
    plans it before stage 1 and chooses N after, for the time left, so the two differ (on a loaded
    host CI's run chose another candidate when N was given back alone: 0.49815 against 0.49862).
    Both are reported, and given back with the seed they reproduce the bound, here with N forced
    far below the planned size (laplace's choice then changes on some seeds), and on the command line."""
    mpl_mod = importlib.import_module("empdp.audit.mpl")
    monkeypatch.setattr(mpl_mod._Deadline, "final_size", lambda self, n, stoppable, rate=None: mpl_mod.round_size(2 * n))
    for seed in (3, 4):
        res = mpl("laplace", params={"epsilon": 0.5}, time_budget=2, rng=seed)
        s = res.sizes
        # the forced N is 2n to three significant digits (CI's loaded run searched 636,000: N 1,270,000),
        # and the clock may stop stage 2 short of it
        assert s["selection_size"] > s["final_size_aimed"] == mpl_mod.round_size(2 * s["search_size"])
        assert s["final_size"] <= s["final_size_aimed"]
        again = mpl("laplace", params={"epsilon": 0.5}, n=s["search_size"], N=s["final_size"],
                    selection_size=s["selection_size"], search_steps=s.get("search_steps"), rng=seed)
        assert again.lower_bound == res.lower_bound
    steps = ["--search-steps", s["search_steps"]] if "search_steps" in s else []
    cli = run("mpl", "-m", "laplace", "--param", "epsilon=0.5", "--seed", 4, "--json", "--search-size",
              s["search_size"], "--final-size", s["final_size"], "--selection-size", s["selection_size"], *steps)
    assert cli.exit_code == 0, cli.output
    out = json.loads(cli.output)
    assert out["lower_bound"] == res.lower_bound and out["sizes"]["selection_size"] == s["selection_size"]
    with pytest.raises(InputError, match="not both"):
        mpl("laplace", selection_size=10**6, time_budget=5)


def test_a_past_deadline_still_draws_one_chunk():
    import numpy as np

    from empdp.audit.dpl import Plan
    from empdp.audit.mechanisms import load_mechanism

    mpl_mod = importlib.import_module("empdp.audit.mpl")  # the package binds the name mpl to the function
    mech = load_mechanism("randomized_response", None)
    plan = Plan(mech=mech, pairs=[(0, 1)], n=100, N=5 * mpl_mod.STAGE2_CHUNK, alpha=0.05, zc=1.64, region=None,
                tau=None, selection="lb", events=True, bandwidth=None, undersmooth=0.03, feature=None)
    rng = np.random.default_rng(1)
    past = list(mpl_mod._stage2_chunks(plan, (0, 1), rng, end=time.perf_counter() - 1))
    assert [len(x) for x, _ in past] == [mpl_mod.STAGE2_CHUNK]
    later = list(mpl_mod._stage2_chunks(plan, (0, 1), rng, end=time.perf_counter() + 60))
    assert sum(len(x) for x, _ in later) == plan.N
    # past the deadline, still more than n outputs: the sizes a run reports must be accepted given back (N > n)
    wide = replace(plan, n=2 * mpl_mod.STAGE2_CHUNK + 1)
    past = list(mpl_mod._stage2_chunks(wide, (0, 1), rng, end=time.perf_counter() - 1))
    assert sum(len(x) for x, _ in past) == 3 * mpl_mod.STAGE2_CHUNK > wide.n


def test_the_budget_counts_from_the_given_clock_start():
    """The command line counts its budget from its process's start (start-up and imports took 1-2.6 s of
    20 that the plan never saw): a budget of 6 s that started 3 s ago leaves the call about 2 s."""
    t0 = time.perf_counter()
    res = mpl("randomized_response", time_budget=6, rng=2, clock_start=t0 - 3)
    assert time.perf_counter() - t0 < 3.2  # about 0.95 x 6 - 0.6 - 3 = 2.1 s, where counting from the call took 5
    assert res.sizes["seconds_before_plan"] > 3


def test_the_command_counts_from_its_process_start_only_when_it_is_the_command(monkeypatch):
    import sys

    import cli.audit
    from empdp.audit import budget

    monkeypatch.setattr(budget, "process_age", lambda: 4.0)
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/empdp", "audit", "mpl"])
    assert cli.audit._clock_start() == pytest.approx(time.perf_counter() - 4.0, abs=0.5)
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/pytest"])  # in-process: the process may be hours old
    assert cli.audit._clock_start() is None


def test_process_age_of_a_fresh_process_is_its_start_up():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "from empdp.audit.budget import process_age; print(process_age())"],
                         capture_output=True, text=True, timeout=60)
    assert 0 < float(out.stdout) < 10, out


def test_stage1_forecast_is_a_fixed_part_and_a_growing_one():
    """Stage 1's fixed costs made its pilots fit a power of 0.8 where runs 12 times larger grew linearly
    (8.1 s forecast, 11.2 s taken): its growing part grows at least linearly. Its fixed part (the pairs'
    score fits on few outputs: svt3's pilots of 4,000-9,000 outputs took 0.95-1.39 s, 0.6 s of it fixed)
    is the intercept of the pilots' line: through the origin the plan forecast 9.9 s for 6.25 s taken."""
    from empdp.audit.budget import MAX_FIXED_SHARE, two_stage_sizes

    def plan(sizes, stage1, ratio=5):
        stage2 = [1e-7 * ratio * s for s in sizes]
        return two_stage_sizes(sizes, stage1, stage2, ratio, 20.0, 1.0, 0.75, 1000, (10**9, 10**9), left=10.0)

    sizes = [1000, 4000, 6000, 9000]
    n, _, info = plan(sizes, [3.0] + [0.6 + 8.9e-5 * s for s in sizes[1:]])  # svt3's, the first slowed by imports
    assert info["cost_power"] == 1.0
    assert 0.6 + 8.9e-5 * n == pytest.approx(7.5, rel=0.01)  # the planned 75% of the 10 s left
    sizes = [1000, 4000, 16000]
    concave = [0.01 * (s / 1000) ** 0.8 for s in sizes]  # the old forecast's trap: no fixed part at scale
    n, _, _ = plan(sizes, concave)
    assert 7.5 <= concave[-1] * n / sizes[-1] <= 7.5 / (1 - 0.1)  # at least linear, at most ~10% beyond
    n, _, _ = plan(sizes[:2], [3.0, 0.5])  # two pilots, the first slowed by one-off work: no line to read
    assert 0.5 * n / sizes[1] == pytest.approx(7.5, rel=0.01)
    n, _, _ = plan(sizes, [3.0, 0.5, 0.45])  # a line falling after the first pilot: no fixed part
    assert 0.45 * n / sizes[-1] == pytest.approx(7.5, rel=0.01)
    n, _, _ = plan(sizes, [1.0, 1.0, 1.01])  # all fixed: at most MAX_FIXED_SHARE of the last pilot
    assert 1.01 * MAX_FIXED_SHARE + 1.01 * (1 - MAX_FIXED_SHARE) * n / sizes[-1] == pytest.approx(7.5, rel=0.01)


def test_stage1_stops_at_its_deadline_and_the_reported_steps_reproduce(monkeypatch):
    """Stage 1 had no deadline: laplace at the memory cap searched 17.3 s where 11 were planned, and the
    run took 21.2 s of 20. With a budget it begins no step (a pair's search) that would end past its share
    of the time at its pace so far; here that share is nil, so it stops after its first step, reports it,
    and the sizes and steps given back reproduce the bound (library and command line)."""
    mpl_mod = importlib.import_module("empdp.audit.mpl")
    monkeypatch.setattr(mpl_mod, "STAGE1_END_SHARE", 0.0)
    res = mpl("noisy_max", time_budget=3, rng=5)
    s = res.sizes
    assert s["search_steps"] == 1 and len(res.stage1_max_loss_by_pair) == 1 and res.pair_index == 0
    again = mpl("noisy_max", n=s["search_size"], N=s["final_size"], selection_size=s["selection_size"],
                search_steps=1, rng=5)
    assert again.lower_bound == res.lower_bound and again.sizes["search_steps"] == 1
    cli = run("mpl", "-m", "noisy_max", "--seed", 5, "--json", "--search-size", s["search_size"], "--final-size",
              s["final_size"], "--selection-size", s["selection_size"], "--search-steps", 1)
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output)["lower_bound"] == res.lower_bound
    with pytest.raises(InputError, match="not both"):
        mpl("noisy_max", search_steps=2, time_budget=5)


@pytest.mark.parametrize("searches", [None, 8])
def test_a_stage1_planned_too_large_ends_within_the_budget(monkeypatch, searches):
    """The pilots' forecast of stage 1 can miss (the run above); forced to plan eight times the size it
    forecasts, a run over eight pairs still ends within its budget, its stage 1 stopped by the clock.
    With as many searches at once as pairs (a machine of 8 cores), no step had ended when the others
    began, so none was checked: the whole first round ran (10.8 s of a 4 s budget). Now a step the pilots'
    pace does not vouch for waits for the first to end."""
    mpl_mod = importlib.import_module("empdp.audit.mpl")
    planned = mpl_mod.two_stage_sizes

    def too_large(*args, **kwargs):
        n, N, info = planned(*args, **kwargs)
        return 8 * n, 16 * n, info

    monkeypatch.setattr(mpl_mod, "two_stage_sizes", too_large)
    if searches:
        monkeypatch.setattr(mpl_mod, "draw_workers", lambda mech: searches)
    t0 = time.perf_counter()
    res = mpl("noisy_max", time_budget=4, rng=1)
    # 4 s and what a loaded host's last steps overrun: eight searches on two cores race four to a core, and
    # at CI's load beside another run one took 5.7 s (the old code: 10.8 s on a quiet host)
    assert time.perf_counter() - t0 < (5.5 if searches is None else 7.5)
    assert 1 <= res.sizes["search_steps"] < 8 + 2


def test_the_plan_holds_back_a_refit_only_where_the_pilots_search_found_score_events():
    """A refit follows a score event of vector outputs only. SVT's answers (discrete vectors of few values)
    never get one, and the time a refit's pace held back for them cut svt6's search at a 5 s budget to
    its first 2 of 8 pairs (median bound 0.143 over seeds 1000-1009, 0.378 without): the pilots record
    whether their search found a score event, and the plan allows for a refit only then."""
    import numpy as np

    from empdp.audit.mechanisms import dpsniper_mechanism

    mpl_mod = importlib.import_module("empdp.audit.mpl")
    for name, scored in (("svt6", False), ("laplace_parallel", True), ("laplace", False)):
        mech, pairs = dpsniper_mechanism(name)
        plan = mpl_mod._resolve(mech, pairs, 4000, 20000, None, 0.1, None, None, "lb", True, "default", None,
                                mpl_mod.UNDERSMOOTH)
        clock = []
        mpl_mod._run(plan, np.random.default_rng(0), None, lambda *_: None, clock)
        assert clock[-1].scored is scored, name
    mech, pairs = dpsniper_mechanism("svt6")  # (the plan's refit pace, from its pilots under a 3 s budget)
    plan = mpl_mod._resolve(mech, pairs, 4000, 20000, None, 0.1, None, None, "lb", True, "default", None,
                            mpl_mod.UNDERSMOOTH)
    end = mpl_mod._budget_sizes(plan, 3.0, time.perf_counter(), None)[3]
    assert end.refit_pace == 0.0 and end.refit_seconds(10 ** 6) == 0.0 and end.duel_pace > 0
