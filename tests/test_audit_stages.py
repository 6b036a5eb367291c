"""Audit internals added for issue 4: likelihood-ratio events, answer-count features,
successive halving, the Rényi pilot and bias correction, progress callbacks and -v logs."""

import json
import logging
import math

import numpy as np
import pytest
from audit_cli_helpers import run
from numpy.testing import assert_allclose

import empdp.cli._common as common
from empdp.audit import builtin, mpl, renyi, truth
from empdp.audit.kde import contains
from empdp.audit.patterns import answer_counts
from empdp.audit.renyi import floored_divergence
from empdp.errors import InputError

BAR = "━"  # rich's bar glyph
ESC = "\x1b["


def test_contains_matches_rows_exactly():
    rows = np.array([[0, 1], [1, 1], [2, 0], [0, 1]])
    assert contains(rows, np.array([[0, 1], [2, 0]])).tolist() == [True, False, True, True]
    assert contains(np.array([0.5, 1.5, 2.5]), np.array([1.5])).tolist() == [False, True, False]


def test_answer_counts_groups_queries_by_the_pair():
    x, y = [1, 1, 1, 1], [2, 0, 2, 0]
    out = np.array([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    # groups sorted by (q, q'): (1, 0) = queries 1, 3; (1, 2) = queries 0, 2
    assert answer_counts(x, y, out).tolist() == [[1, 2], [0, 0], [2, 2]]
    assert answer_counts(3.0, 4.0, np.arange(5)) is not None  # scalar outputs pass through


def test_answer_counts_keep_the_privacy_loss_of_svt6():
    """Counts are sufficient for exchangeable answers: the law of the counts, summed from the
    exact law of the vectors, has the same log-ratio for every vector in a class."""
    eps, m = 0.5, 4
    b = 2 / eps
    x, y = [1] * m, [0, 0, 2, 2]
    r = np.linspace(-60 * b, 60 * b, 200001)
    w = np.full(r.size, r[1] - r[0])
    rho = np.exp(-np.abs(r) / b) / (2 * b)

    def p_vec(q, a):
        above = 0.5 * np.exp(-np.maximum(1 + r[:, None] - np.array(q, float), 0) / b)
        above = np.where(1 + r[:, None] - np.array(q, float) < 0,
                         1 - 0.5 * np.exp((1 + r[:, None] - np.array(q, float)) / b), above)
        probs = np.where(np.array(a) == 1, above, 1 - above)
        return float(np.sum(w * rho * probs.prod(axis=1)))

    vecs = [tuple(int(c) for c in format(k, f"0{m}b")) for k in range(2 ** m)]
    loss = {v: math.log(p_vec(x, v) / p_vec(y, v)) for v in vecs}
    classes = {}
    for v in vecs:
        classes.setdefault(tuple(answer_counts(x, y, np.array([v]))[0]), []).append(loss[v])
    assert len(classes) == 9
    for members in classes.values():
        assert_allclose(members, members[0], atol=1e-9)


def test_events_beat_single_outputs_on_svt6():
    """The worst SVT6 outputs are rare; events and answer counts make them measurable."""
    kw = dict(params={"epsilon": 0.7}, n=10000, N=40000)
    plain = [mpl("svt6", **kw, rng=r, feature=None, events=False).lower_bound for r in range(3)]
    ours = [mpl("svt6", **kw, rng=r) for r in range(3)]
    assert all(res.feature == "answer_counts" for res in ours)
    assert np.median([res.lower_bound for res in ours]) > np.median(plain) + 0.2
    assert np.median([res.lower_bound for res in ours]) > 0.7  # SVT6 is not 0.7-DP


def test_event_result_and_json():
    res = mpl("svt6", params={"epsilon": 0.7}, n=10000, N=40000, rng=3)
    d = res.to_dict()
    assert d["event_size"] == (1 if res.event is None else len(res.event))
    assert d["t_hat"] == (res.event[0] if res.event is not None else res.t_hat)
    json.dumps(d)


def test_successive_halving_spends_the_stage1_budget(monkeypatch):
    """With B ≥ 3 pairs: n/2 per pair, then B·n/2 more for the best ⌈B/4⌉ pairs, no more."""
    drawn = []
    mech = builtin("laplace", epsilon=1.0)

    def counting(database, size, rng):
        drawn.append(size)
        return mech(database, size, rng)

    pairs = [(0.0, b / 10) for b in range(1, 9)]
    res = mpl(counting, pairs, n=1000, N=5000, region=(-1, 1), rng=1, duel_size=0)  # (the search's draws alone)
    stage1 = drawn[:-2]
    assert sum(stage1) == 2 * len(pairs) * 1000
    assert stage1[:2 * len(pairs)] == [500] * (2 * len(pairs))
    assert drawn[-2:] == [5000, 5000]
    assert res.pair_index >= 4  # the larger shifts are selected


def test_renyi_pilot_keeps_both_directions_only_when_close():
    sym = renyi("laplace", order=2, n=20000, rng=1)
    assert {c["direction"] for c in sym.candidates if c["stage"] == "final"} == {"x||x'", "x'||x"}
    asym = renyi("subsampled_gaussian", order=3, n=100000, rng=1)
    finals = [c for c in asym.candidates if c["stage"] == "final"]
    assert len(finals) == 1 and finals[0]["direction"] == "x'||x"
    assert asym.selection == "pilot"


def test_bias_correction_removes_the_plug_in_bias():
    """Frequencies from n = 300 outputs of two laws on 4 points: the corrected D̂ is centred on D_α."""
    f, g, order, n = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4]), 3.0, 300
    exact = truth.discrete_renyi(order, f, g)
    rng = np.random.default_rng(0)
    fx, fy = rng.multinomial(n, f, 4000) / n, rng.multinomial(n, g, 4000) / n
    est = {}
    for noise in (None, 1.0):
        est[noise] = np.mean([floored_divergence(a, b, np.ones(f.size), order, 1e-9, 1e10, n, n,
                                                 noise=noise)[0] for a, b in zip(fx, fy)])
    assert abs(est[1.0] - exact) < 0.3 * abs(est[None] - exact), (est, exact)


def test_floored_divergence_on_a_log_scale_matches_the_direct_sum_and_survives_high_orders():
    """Probabilities on 5 points: D̂ equals log Σ f^α s(g)^{1−α} / (α − 1) computed directly at
    α = 3, and by logsumexp at α = 400, where f^α underflows (the old sum gave T = 0)."""
    f, g = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.1, 0.15, 0.2, 0.25, 0.3])
    tau, eta = 1e-9, 1e12
    s = np.logaddexp(eta * g, eta * tau) / eta
    for order in (3.0, 400.0):
        D, sigma, share, rel_se, corrected = floored_divergence(f, g, np.ones(5), order, tau, eta, 10**6, 10**6)
        log_terms = order * np.log(f) + (1 - order) * np.log(s)
        top = log_terms.max()
        assert D == pytest.approx((top + math.log(np.exp(log_terms - top).sum())) / (order - 1), rel=1e-12)
        assert math.isfinite(sigma) and sigma > 0 and share == 0.0 and not corrected
    direct = math.log(np.sum(f ** 3 * s ** -2.0)) / 2
    assert floored_divergence(f, g, np.ones(5), 3.0, tau, eta, 10**6, 10**6)[0] == pytest.approx(direct, rel=1e-12)


def test_renyi_at_high_orders_skips_the_bias_correction_and_warns():
    """Gaussian mechanism (D_α = α/2), n = 2000: at α = 50 the second-order correction used to put
    the bound at 499 (D = 25); beyond its range it is skipped and the result says why."""
    for seed in range(3):
        res = renyi("gaussian", order=50, n=2000, rng=seed)
        assert res.lower_bound <= res.true_value == 25.0
        assert not res.bias_corrected
        assert any("relative standard error" in w and "increase n" in w for w in res.warnings)
    ok = renyi("gaussian", order=2, n=100_000, rng=1)
    assert ok.bias_corrected and not any("relative standard error" in w for w in ok.warnings)


def test_renyi_floor_grows_with_the_order():
    """Laplace mechanism (ε = 1), α = 10, n = 10^4: with the floor tuned for α ≤ 3 the bound
    exceeded D_α in 17 of 100 runs (noisy tail points raised to the 10th power); the floor
    grown by α(α − 1)/6 keeps it below in all but the allowed few."""
    runs = [renyi("laplace", order=10, n=10_000, rng=100 + s) for s in range(20)]
    assert sum(r.lower_bound > r.true_value for r in runs) <= 1
    assert np.median([r.lower_bound / r.true_value for r in runs]) > 0.9
    low = renyi("laplace", order=3, n=10_000, rng=1)
    high = renyi("laplace", order=10, n=10_000, rng=1)
    assert high.tau / low.tau == pytest.approx(15, rel=0.1)  # the same spread, so h differs by little


def test_renyi_extreme_orders_are_refused_or_computed_without_overflow():
    import warnings
    with pytest.raises(InputError, match="above 10000"):
        renyi("gaussian", order=1e300, n=2000, rng=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / invalid-value warnings either
        res = renyi("gaussian", order=1000, n=2000, rng=1)
    assert math.isfinite(res.lower_bound) and res.lower_bound <= res.true_value


def test_progress_callback_reports_every_stage():
    seen = []
    mpl("laplace", n=2000, N=5000, rng=1, progress=lambda s, d, t: seen.append((s, d, t)))
    stages = list(dict.fromkeys(s for s, _, _ in seen))
    assert stages[0].startswith("MPL stage 1") and stages[2].startswith("MPL stage 2")
    # (three finalists, each a half-line and its runner-up t_hat)
    assert stages[1] == "MPL stage 1: duel of 6 entrants on 2 x 10,000 fresh outputs of each pair at most"
    assert seen[-1][1] == seen[-1][2] == 1
    first = [(d, t) for s, d, t in seen if s == stages[0]]
    assert first[0][0] == 0 and first[-1][0] == first[-1][1] == 13  # 10 pairs + 3 finalists
    duel = [(d, t) for s, d, t in seen if s == stages[1]]
    done = [d for d, _ in duel]  # (a duel settled early jumps to its end)
    assert duel[0] == (0, 4) and duel[-1] == (4, 4) and done == sorted(done) and len(set(done)) == len(done)
    seen.clear()
    renyi("gaussian", order=2, n=2000, rng=1, progress=lambda s, d, t: seen.append((s, d, t)))
    assert [s.split(":")[0] for s in dict.fromkeys(s for s, _, _ in seen)] == ["Renyi pilot", "Renyi bound"]


@pytest.fixture
def terminal(monkeypatch):
    """Force the CLI's terminal check on (CliRunner's stderr is not a terminal)."""
    monkeypatch.setattr(common, "stderr_is_terminal", lambda: True)
    monkeypatch.setattr(common.sys.stderr, "isatty", lambda: True, raising=False)


def test_json_stays_pure_on_a_terminal(terminal):
    res = run("mpl", "-m", "laplace", "--search-size", 3000, "--final-size", 8000, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["search_size"] == 3000
    assert BAR not in res.stderr and ESC not in res.stderr and ESC not in res.stdout


def test_bars_on_a_terminal_go_to_stderr(terminal):
    res = run("renyi", "-m", "gaussian", "--order", 2, "--sample-size", 5000, "--seed", 1)
    assert res.exit_code == 0, res.output
    assert "Renyi bound" in res.stderr and BAR in res.stderr
    assert ESC not in res.stdout and "lower bound" in res.stdout


def test_verbose_logs_one_line_per_stage():
    res = run("mpl", "-m", "svt6", "--param", "epsilon=0.7", "--search-size", 5000, "--final-size", 20000,
              "--seed", 1, "-v")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if "empdp.audit" in ln]
    assert len(lines) == 3 and all(ln.startswith("INFO") for ln in lines), res.stderr
    assert "stage 1" in lines[0] and "10 pairs x 2 x 2500 outputs" in lines[0] and " s;" in lines[0]
    assert "stage 1 duel: 3 entrants and 0 rungs on 2 x " in lines[1] and "(of 25000)" in lines[1]
    assert "stage 2" in lines[2] and "20000 fresh outputs" in lines[2]
    quiet = run("mpl", "-m", "svt6", "--search-size", 5000, "--final-size", 20000, "--seed", 1)
    assert "INFO" not in quiet.stderr
    logging.getLogger("empdp").handlers.clear()


def test_feature_fits_on_several_threads_warn_nothing():
    """A column of codes only (svt34_parallel's aborted queries) has no plain values. The fit silenced
    NumPy's warning about it with ``warnings.catch_warnings``, which is process-wide: stage 1 fits on
    several threads, one fit's exit restored the filters inside another's, and "Degrees of freedom <= 0
    for slice" reached the user's terminal."""
    import threading
    import warnings

    from empdp.audit.events import _Features

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 4))
    x[:, 2] = rng.choice([-1000.0, -2000.0, -3000.0], 2000)  # every value a code (three of them)
    x[::3, 3] = -2000.0
    failures = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def fit():
            try:
                for _ in range(100):
                    f = _Features.fit(x)
                    assert (f.centre[2], f.scale[2]) == (0.0, 1.0)
            except Exception as exc:  # (raised on the test's thread below)
                failures.append(exc)

        threads = [threading.Thread(target=fit) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures[0]
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], caught[:1]
