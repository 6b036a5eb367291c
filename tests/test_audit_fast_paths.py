"""The audits' fast paths give the same results as the plain computations they replace.

Laplace noise as a signed exponential, large draws made of parts (each with its own stream, on several
threads, the same outputs however many), the table lookup that categorises integer answer vectors
instead of sorting them, and the compiled binning of vector outputs and Report Noisy Max.
"""

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from empdp.audit import common, kde, samplers
from empdp.audit.mechanisms import dpsniper_mechanism, load_mechanism
from empdp.errors import InputError


def test_laplace_noise_has_the_laplace_law():
    noise = samplers.laplace_noise(np.random.default_rng(0), 3.0, (200_000,))
    assert stats.kstest(noise, stats.laplace(scale=3.0).cdf).pvalue > 0.01
    assert noise.shape == (200_000,)
    # a wrong scale is seen: the test can fail
    assert stats.kstest(noise, stats.laplace(scale=3.1).cdf).pvalue < 1e-6
    # the sign is a fair coin, independent of the size, in every cell of a 2-d draw
    block = samplers.laplace_noise(np.random.default_rng(1), 2.0, (40_000, 5))
    assert block.shape == (40_000, 5)
    large = np.abs(block) > 2.0 * np.log(2)  # |Lap(2)|'s median
    for cells in (large, ~large):
        assert abs(np.mean(block[cells] > 0) - 0.5) < 0.01
    assert np.all(np.abs(np.mean(block > 0, axis=0) - 0.5) < 0.01)


def test_a_large_draw_is_made_of_parts_each_with_its_own_stream(monkeypatch):
    calls = []

    def base(database, size, rng):
        calls.append(size)
        return np.full((size, 2), database) + rng.random((size, 2))

    monkeypatch.setattr(common, "DRAW_PART", 1000)
    out = common.draw(base, 5.0, 2500, np.random.default_rng(1))
    assert out.shape == (2500, 2) and calls == [1000, 1000, 500]
    # every row its own: parts drawn from one stream, restarted per part, would repeat rows
    assert np.all((out >= 5) & (out < 6)) and len(np.unique(out[:, 0])) == 2500
    again = common.draw(base, 5.0, 2500, np.random.default_rng(1))
    assert np.array_equal(out, again)  # a seed reproduces the parts
    assert not np.array_equal(common.draw(base, 5.0, 2500, np.random.default_rng(2)), out)


@pytest.mark.parametrize("name", ["svt1", "numerical_svt", "laplace_parallel", "rappor"])
def test_a_seed_gives_the_same_outputs_on_any_number_of_threads(name):
    """The parts and their streams do not depend on the threads that draw them (a seed reproduces an audit
    on a machine with other cores), and consecutive draws from one generator differ."""
    mech, pairs = dpsniper_mechanism(name)
    assert mech.threads is None  # a built-in draws on every core
    size = 3 * common.DRAW_PART + 17
    outs = [common.draw(replace(mech, threads=k), pairs[0][1], size, np.random.default_rng(7)) for k in (1, 2, 3)]
    assert outs[0].shape[0] == size
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    rng = np.random.default_rng(7)
    first, second = (common.draw(mech, pairs[0][1], size, rng) for _ in range(2))
    assert np.array_equal(first, outs[0]) and not np.array_equal(first, second)


@pytest.mark.parametrize("name", ["svt1", "numerical_svt", "laplace_parallel"])
def test_a_builtin_drawn_in_parts_keeps_its_law(name, monkeypatch):
    """The same sampler in parts of 700 rows and in one call: the per-column means agree within noise."""
    mech, pairs = dpsniper_mechanism(name)
    whole = mech.sampler(pairs[0][1], 20_000, np.random.default_rng(2)).astype(float)
    monkeypatch.setattr(common, "DRAW_PART", 700)
    parts = common.draw(mech, pairs[0][1], 20_000, np.random.default_rng(3)).astype(float)
    assert parts.shape == whole.shape
    se = np.sqrt((whole.var(axis=0) + parts.var(axis=0)) / 20_000) + 1e-12
    assert np.all(np.abs(whole.mean(axis=0) - parts.mean(axis=0)) < 5 * se)


def test_a_users_sampler_runs_on_one_thread_unless_its_user_says(monkeypatch):
    """A user's sampler may keep state: by default every part is drawn on the calling thread; with
    ``threads`` given (the user says it is thread-safe) the parts run on several."""
    monkeypatch.setattr(common, "DRAW_PART", 100)
    seen = set()

    def slow(database, size, rng):
        seen.add(threading.get_ident())
        time.sleep(0.01)  # long enough that a second thread takes a part
        return rng.random(size)

    mech = load_mechanism(slow)
    assert mech.threads == 1
    common.draw(mech, 0.0, 1000, np.random.default_rng(0))
    assert seen == {threading.get_ident()}
    seen.clear()
    together = threading.Barrier(2, timeout=60)  # each call waits for another: only two threads at once pass

    def paired(database, size, rng):
        seen.add(threading.get_ident())
        together.wait()
        return rng.random(size)

    common.draw(load_mechanism(paired, threads=2), 0.0, 1000, np.random.default_rng(0))  # (10 parts)
    assert len(seen) == 2 and threading.get_ident() not in seen


def test_a_users_sampler_in_an_audit_is_called_from_the_calling_thread_only():
    """The whole audit, not only a draw: stage 1's steps ran on a pool of one thread beside the calling
    one (step 0 and stage 2 on the caller, the others on the pool), so a sampler bound to its thread
    (an R session, a GPU context) was called from two."""
    from empdp.audit import mpl

    seen = set()

    def sampler(database, size, rng):
        seen.add(threading.get_ident())
        return rng.laplace(float(database), 1.0, size)

    mpl(sampler, pairs=[(0, 1), (0, 2), (1, 2)], n=2000, N=5000, rng=1)
    assert seen == {threading.get_ident()}


def test_blas_stays_on_one_thread_until_the_last_of_overlapping_fits_ends():
    """Stage 1 fits its pairs' logistic scores on several threads, and the BLAS limit is process-wide: a
    limit per fit, exited out of order (A begins, B begins, A ends), gave B back the unlimited BLAS."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from empdp.audit.events import _one_blas_thread

    def blas():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    with threadpool_limits(limits=2, user_api="blas"):
        if blas() != {2}:
            pytest.skip("no BLAS that runs two threads here")
        a, b = _one_blas_thread(), _one_blas_thread()
        a.__enter__()
        b.__enter__()
        assert blas() == {1}
        a.__exit__(None, None, None)
        assert blas() == {1}  # B still runs
        b.__exit__(None, None, None)
        assert blas() == {2}


def test_parts_of_different_widths_are_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(common, "DRAW_PART", 100)

    def drifting(database, size, rng):
        return rng.random((size, 1 + (rng.random() < 0.5)))

    with pytest.raises(InputError, match="different shapes"):
        common.draw(drifting, 0.0, 5000, np.random.default_rng(0))


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.float64])
def test_dense_categories_match_a_sort(dtype):
    rng = np.random.default_rng(4)
    x = rng.integers(-1, 2, (3000, 6)).astype(dtype)
    y = rng.integers(-1, 3, (2000, 6)).astype(dtype)
    cats, (cx, cy) = kde.categorize(x, y)
    expect = np.unique(np.vstack([x, y]), axis=0)
    assert np.array_equal(cats, expect)  # the categories in the sort's order
    assert np.array_equal(cats[cx], x) and np.array_equal(cats[cy], y)


def test_categories_of_one_column_stay_in_value_order():
    x = np.array([[5.0], [-2.0], [5.0], [1e300]])
    cats, (codes,) = kde.categorize(x)
    assert cats[:, 0].tolist() == [-2.0, 5.0, 1e300]
    assert codes.tolist() == [1, 0, 1, 2]


# ----------------------------------------------------------------------------- pattern-and-value scores


def _xor_outputs(rng, size, same: bool):
    """Two columns, each the atom -1000 or a value N(0, 1); under x the two agree (both atoms or both
    values), under x' they differ: each column alone has the same law under both, the pattern does not."""
    first = rng.random(size) < 0.5
    second = first if same else ~first
    vals = rng.normal(size=(size, 2))
    return np.where(np.column_stack([first, second]), vals, -1000.0)


def test_pattern_score_sees_a_joint_pattern_the_columns_miss():
    from empdp.audit import ratios

    rng = np.random.default_rng(6)
    x, y = _xor_outputs(rng, 20_000, True), _xor_outputs(rng, 20_000, False)
    families = ratios.ratio_scores(x, y)
    pattern = [s for _, scores in families for s in scores if isinstance(s, ratios.PatternScore)]
    column = [s for b, scores in families for s in scores
              if not isinstance(s, ratios.PatternScore) and not b.differences]  # raw columns, one by one
    assert pattern and column
    fx, fy = _xor_outputs(rng, 5000, True), _xor_outputs(rng, 5000, False)
    # the pattern's log ratio is ±infinite in truth; the pseudo-counts keep it large and finite
    assert np.all(pattern[0].score(fx) > 3) and np.all(pattern[0].score(fy) < -3)
    assert max(abs(np.mean(s.score(fx)) - np.mean(s.score(fy))) for s in column) < 0.1


def test_pattern_score_adds_the_values_log_ratio():
    """Column 0 is a value with probability 0.6 (x) or 0.4 (x'), the value N(1, 1) or N(0, 1): the log
    ratio of a value v is ln 1.5 + v - 1/2, of the atom ln(0.4 / 0.6)."""
    from empdp.audit import ratios

    rng = np.random.default_rng(7)

    def draw(p, mean, size):
        is_value = rng.random(size) < p
        return np.column_stack([np.where(is_value, rng.normal(mean, 1, size), -1.0), rng.normal(size=size)])

    x, y = draw(0.6, 1.0, 100_000), draw(0.4, 0.0, 100_000)
    score = [s for _, scores in ratios.ratio_scores(x, y) for s in scores
             if isinstance(s, ratios.PatternScore) and s.bins == 32][0]
    fresh = draw(0.5, 0.5, 5000)
    truth = np.where(fresh[:, 0] == -1.0, np.log(0.4 / 0.6), np.log(1.5) + fresh[:, 0] - 0.5)
    inner = np.abs(fresh[:, 0]) < 2  # the outer quantile bins average over a long tail
    assert np.corrcoef(score.score(fresh)[inner], truth[inner])[0, 1] > 0.97
    atom = score.score(fresh)[fresh[:, 0] == -1.0]
    # the second column (the same law under both) adds only its shrunk tables' noise
    assert abs(np.median(atom) - np.log(0.4 / 0.6)) < 0.03 and np.all(np.abs(atom - np.log(0.4 / 0.6)) < 0.15)


def test_no_pattern_family_without_atoms():
    from empdp.audit import ratios

    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(2000, 3)), rng.normal(0.1, 1, (2000, 3))
    assert not any(isinstance(s, ratios.PatternScore) for _, scores in ratios.ratio_scores(x, y) for s in scores)


@pytest.mark.parametrize("kind", ["continuous", "heavy tails", "few values", "ties"])
def test_score_thresholds_from_the_merged_samples_are_np_quantile_and_unique(kind):
    """The score events' thresholds, read off the merged sorted samples, are exactly the distinct pooled
    scores (at most MAX_THRESHOLDS of them) or np.quantile's MAX_THRESHOLDS quantiles, which it replaces.
    "heavy tails": NumPy interpolates from the upper point where the fraction is ≥ 0.5; always from the
    lower one, a threshold here moved by an ulp (-5.4e-20 beside a Cauchy sample's neighbours)."""
    from empdp.audit.events import MAX_THRESHOLDS, _thresholds

    rng = np.random.default_rng(3)
    if kind == "continuous":
        x, y = rng.laplace(0, 10, 50_001), rng.laplace(1, 10, 49_000)
    elif kind == "heavy tails":
        rng = np.random.default_rng(0)
        x, y = np.concatenate([rng.normal(size=3000), rng.standard_cauchy(size=2000)]), rng.normal(size=4000) * 2
    elif kind == "few values":
        x, y = rng.integers(0, 50, 3000).astype(float), rng.integers(0, 70, 2000).astype(float)
    else:  # many distinct values, most of the mass on a few
        x = np.where(rng.random(40_000) < 0.7, 0.0, rng.normal(size=40_000))
        y = np.where(rng.random(30_000) < 0.5, 1.0, rng.normal(size=30_000))
    pooled = np.concatenate([x, y])
    old = np.unique(pooled)
    if len(old) > MAX_THRESHOLDS:
        old = np.unique(np.quantile(pooled, np.linspace(0, 1, MAX_THRESHOLDS)))
    assert np.array_equal(_thresholds(np.sort(x), np.sort(y)), old)


def test_an_audit_gives_the_same_bound_on_one_thread_and_on_two():
    """The whole MPL run (stage 1's draws and features, stage 2's event counted on the draw's threads)."""
    from empdp.audit.mpl import mpl

    one, two = (mpl("svt1", n=40_000, N=100_000, alpha=0.1, rng=3, threads=k) for k in (1, 2))
    assert one.lower_bound == two.lower_bound and one.final_size == two.final_size == 100_000
    assert one.to_dict()["stage1_max_loss"] == two.to_dict()["stage1_max_loss"]


@pytest.mark.parametrize("value", ["0", "-2", "100000", "two"])
def test_bad_threads_are_one_line(value):
    from audit_cli_helpers import run
    from helpers import one_line_error

    res = run("mpl", "-m", "laplace", "--threads", value, "--search-size", 1000, "--final-size", 5000)
    one_line_error(res, "threads")


def _reference_codes(u, atoms, edges):
    """A column's fine bins the plain way: the atom's index where the value is one, else len(atoms) +
    np.searchsorted(edges, value, side="right")."""
    out = len(atoms) + np.searchsorted(np.asarray(edges, float), u.astype(float), side="right")
    for k, a in enumerate(atoms):
        out[u == a] = k
    return out


@pytest.mark.parametrize("case", ["laplace", "ties", "ints", "int_atoms", "wide_ints", "far", "uneven",
                                  "huge_offset", "on_edges", "atoms", "all_atoms", "overflowing_differences",
                                  "infinities"])
@pytest.mark.parametrize("pooled", [False, True])
def test_compiled_bins_equal_the_plain_search(case, pooled):
    """Binning.codes counts each value's edges in compiled code (and looks integers of a narrow range up
    in a table of those counts): the same numbers as np.searchsorted and an atom match, values on and
    one ulp beside every edge included, whatever the edges (ties, far apart, far from 0, all infinite:
    values never seen where the fitting outputs were all atoms)."""
    from empdp.audit import ratios

    rng = np.random.default_rng(11)
    values = rng.laplace(0.0, 200.0, (5000, 3))
    differences = False
    if case == "ints":
        values = rng.integers(-30, 3000, values.shape)
    elif case == "int_atoms":  # (SVT's codes and RAPPOR's bits: looked up; the columns' atoms differ)
        values = rng.integers(-1, 2, values.shape)
        values[:, 1] = np.where(rng.random(len(values)) < 0.5, values[:, 1], rng.integers(-40, 40, len(values)))
        values[:, 2] = rng.integers(0, 2, len(values))
    elif case == "wide_ints":
        values = rng.integers(-3 * 10**6, 3 * 10**6, values.shape)
    elif case == "far":
        values = values * 1e6
    elif case == "huge_offset":
        values = values * 1e-12 + 1e12
    elif case in ("atoms", "all_atoms"):
        codes = rng.choice([-1000.0, 7.0, 0.5], size=values.shape)
        values = np.where(rng.random(values.shape) < (1.0 if case == "all_atoms" else 0.6), codes, values)
    elif case == "infinities":  # infinite differences in x' alone: atoms are looked for in the first 5,000
        values = rng.laplace(0.0, 200.0, (12000, 3))  # pooled values, all x's here, so they are not atoms
        values[6000::13, 1], values[6000::13, 2] = 1.7e308, -1.7e308
        differences = True
    elif case == "overflowing_differences":
        values[::7, 1], values[::7, 2] = 1.7e308, -1.7e308  # a difference overflows to -inf
        differences = True
    with np.errstate(over="ignore"):
        binning = ratios.fit_binning(values[:len(values) // 2], values[len(values) // 2:], differences, pooled)
    if case == "ties":
        binning.edges = [np.sort(np.concatenate([e[:20], np.full(11, e[20])])) for e in binning.edges]
    elif case == "uneven":
        binning.edges = [np.concatenate([e[:30], [1e9]]) for e in binning.edges]
    if case == "all_atoms":  # values the fitting outputs never had: every edge infinite, none at or below them
        values[::3] = rng.normal(size=values[::3].shape)
    if case == "on_edges":
        edges = np.concatenate(binning.edges)
        around = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)])
        values[: len(around) * 10] = np.repeat(around, 10 * values.shape[1]).reshape(-1, values.shape[1])
    with np.errstate(over="ignore"):
        u = ratios._coordinates(values, differences)
        got = binning.codes(values)
    assert case not in ("overflowing_differences", "infinities") or np.isinf(u).any()
    assert all(np.isfinite(e).all() or np.isinf(e).all() for e in binning.edges)  # (no NaN edge)
    if case == "all_atoms":
        assert all(np.isinf(e).all() for e in binning.edges)
    for j in range(u.shape[1]):
        k = 0 if pooled else j
        assert np.array_equal(got[:, j], _reference_codes(u[:, j], binning.atoms[k], binning.edges[k])), j
    if case == "int_atoms":
        assert [len(a) for a in binning.atoms] == ([3] if pooled else [3, 3, 2])


def test_binned_outputs_must_keep_the_width_they_were_fitted_on():
    """The compiled binning reads a row of atoms and edges per column: a sampler whose outputs change
    width between draws is refused, not read past its rows."""
    from empdp.audit import ratios

    rng = np.random.default_rng(2)
    for values in (rng.normal(size=(300, 2)), rng.integers(0, 5, (300, 2))):
        binning = ratios.fit_binning(values, values, False, False)
        with pytest.raises(InputError, match="outputs of 3 coordinates, where the outputs its audit began with had 2"):
            binning.codes(np.concatenate([values, values[:, :1]], axis=1))
        pooled = ratios.fit_binning(values, values, False, True)
        assert pooled.codes(np.concatenate([values, values[:, :1]], axis=1)).shape == (300, 3)


def test_compiled_noisy_max_breaks_ties_as_argmax():
    """The compiled Report Noisy Max keeps a running maximum: at noise scale 0 it gives np.argmax's first
    query and np.max (its laws: the next test, and tests/test_audit_mechanisms_dpsniper.py)."""
    from empdp.audit import compiled

    rng = np.random.default_rng(3)
    for q in ([2.0, 5.0, 5.0, 1.0], [7.0], [-1.0, -1.0]):
        q = np.array(q)
        assert compiled.noisy_max_index(q, 0.0, False, 3, rng).tolist() == [int(np.argmax(q))] * 3
        assert compiled.noisy_max_value(q, 0.0, True, 3, rng).tolist() == [q.max()] * 3
    with pytest.raises(ValueError, match="at least one query"):
        compiled.noisy_max_index(np.array([]), 1.0, False, 3, rng)


@pytest.mark.parametrize("queries", [1, 3, 61, 62, 63, 130])
def test_compiled_noisy_max_signs_are_fair_coins_across_their_words(queries):
    """The Laplace signs are the bits of uniform integers of COIN_BITS (62) bits, a word shared by
    consecutive outputs and refilled within one: with equal queries the argmax is uniform over them
    (chi-square: a refill gone wrong within an output) and the max's CDF is F(t)^k, F Laplace's (k = 1:
    the noise itself, symmetric; a word runs out within some outputs from k = 3 on, within every one at
    63 and 130). The next test pins the stream itself."""
    from empdp.audit import compiled

    rng, size = np.random.default_rng(queries), 120_000
    q = np.zeros(queries)
    index = compiled.noisy_max_index(q, 1.0, False, size, rng)
    if queries > 1:
        counts = np.bincount(index, minlength=queries)
        assert stats.chisquare(counts).pvalue > 1e-4, counts
    values = compiled.noisy_max_value(q, 1.0, False, size, rng)
    lap = stats.laplace()
    for p in (0.1, 0.5, 0.9):  # (the max's quantiles: F(t)^k = p)
        t = lap.ppf(p ** (1 / queries))
        assert abs(np.mean(values <= t) - p) < 4 * np.sqrt(p * (1 - p) / size), (p, t)
    assert compiled.COIN_HIGH == 2 ** compiled.COIN_BITS and compiled.COIN_BITS <= 62


def test_compiled_noisy_max_draws_as_its_reference_loop():
    """The compiled samplers' stream, written out in NumPy: per noise a standard exponential, and per
    COIN_BITS Laplace noises one uniform integer in [0, 2^COIN_BITS) whose bits, lowest first, are the
    signs (1: +), the word carried from one output to the next; exponential noise draws no coins."""
    from empdp.audit import compiled

    def reference(q, scale, exponential, size, seed):
        rng, index, value, coins, left = np.random.default_rng(seed), [], [], 0, 0
        for _ in range(size):
            noisy = []
            for qj in q:
                e = scale * rng.standard_exponential()
                if not exponential:
                    if left == 0:
                        coins, left = int(rng.integers(0, compiled.COIN_HIGH, dtype=np.int64)), compiled.COIN_BITS
                    e, coins, left = (e if coins & 1 else -e), coins >> 1, left - 1
                noisy.append(qj + e)
            index.append(int(np.argmax(noisy)))
            value.append(max(noisy))
        return index, value

    for k in (3, 61, 62, 63, 130):
        q = np.linspace(0.0, 1.0, k)
        for exponential in (False, True):
            index, value = reference(q, 2.0, exponential, 300, k)
            assert compiled.noisy_max_index(q, 2.0, exponential, 300, np.random.default_rng(k)).tolist() == index
            assert compiled.noisy_max_value(q, 2.0, exponential, 300, np.random.default_rng(k)).tolist() == value


@pytest.mark.parametrize("name", ["noisy_max", "noisy_max_value"])
def test_laplace_noisy_max_samplers_follow_their_exact_laws(name):
    """ReportNoisyMax with Laplace noise (ours, DP-Sniper's ReportNoisyMax1): P(argmax = j) =
    ∫ f(t − q_j) Π_{i≠j} F(t − q_i) dt, and the max's CDF Π F(t − q_i), by quadrature."""
    from scipy import integrate

    q, scale = np.array([0.0, 1.0, 2.5]), 2.0  # epsilon 1: scale 2/epsilon (noisy_max_value: k = 3 -> 3)
    mech = load_mechanism(name, {"epsilon": 1.0}, None)
    draws = np.asarray(mech(q, 200_000, np.random.default_rng(11)))
    if name == "noisy_max":
        lap = stats.laplace(scale=scale)
        for j in range(3):
            p = integrate.quad(lambda t: lap.pdf(t - q[j]) * np.prod([lap.cdf(t - q[i]) for i in range(3) if i != j]),
                               -np.inf, np.inf)[0]
            assert abs(np.mean(draws == j) - p) < 4 * np.sqrt(p * (1 - p) / len(draws)), (j, p)
    else:
        lap = stats.laplace(scale=3.0)
        for t in (-2.0, 1.0, 4.0):
            p = np.prod(lap.cdf(t - q))
            assert abs(np.mean(draws <= t) - p) < 4 * np.sqrt(p * (1 - p) / len(draws)), (t, p)
