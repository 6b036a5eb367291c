"""Reference mechanisms and their pairs: sensitivity, StatDP patterns, database checks,
module loading, the MPL region and sample sizes, exact values (bad input is an InputError)."""

import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from audit_cli_helpers import run
from helpers import one_line_error
from numpy.testing import assert_allclose

import empdp.cli.main as main_mod
from empdp.audit import truth
from empdp.audit.mechanisms import BUILTIN_NAMES, builtin, load_mechanism
from empdp.audit.mpl import mpl
from empdp.audit.pairs import resolve_pairs
from empdp.audit.patterns import statdp_patterns
from empdp.audit.renyi import renyi
from empdp.errors import InputError


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a module into a fresh working directory; returns a function (name, source) -> name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name, source):
        (tmp_path / f"{name}.py").write_text(source)
        return name

    return write


SUM_SAMPLER = ("import numpy as np\n"
               "def sample(database, size, rng):\n"
               "    return float(np.sum(database)) + rng.laplace(0.0, 1.0, size)\n")


# ----------------------------------------------------------------------------- 1. sensitivity

SENSITIVE = [name for name in BUILTIN_NAMES if "sensitivity" in builtin(name).params]
RECORDS = ("laplace", "gaussian", "subsampled_laplace", "subsampled_gaussian")  # a sum is released


def _max_step(pairs, kind):
    """Largest change between x and x′: per entry for vectors, of the sum for records."""
    steps = []
    for x, y in pairs:
        x, y = np.atleast_1d(np.asarray(x, float)), np.atleast_1d(np.asarray(y, float))
        steps.append(np.max(np.abs(x - y)) if kind == "queries" else abs(x.sum() - y.sum()))
    return max(steps)


@pytest.mark.parametrize("name", SENSITIVE)
def test_default_pairs_respect_the_sensitivity(name):
    """Pairs differ by at most s, and the exact value over them is the one at s = 1 (scale-free)."""
    ref = builtin(name)
    m = builtin(name, sensitivity=0.5)
    for kind, exact in (("mpl", m.true_epsilon_over), ("renyi", lambda p: m.true_renyi_over(2.0, p))):
        pairs = resolve_pairs(m, None, kind)
        assert _max_step(pairs, "records" if name in RECORDS else "queries") <= 0.5 + 1e-12
        ref_pairs = resolve_pairs(ref, None, kind)
        ref_value = ref.true_epsilon_over(ref_pairs) if kind == "mpl" else ref.true_renyi_over(2.0, ref_pairs)
        value = exact(pairs)
        assert (value is None) == (ref_value is None)
        if value is not None:
            assert_allclose(value, ref_value, rtol=1e-9)
    eps = m.true_epsilon_over(resolve_pairs(m, None, "mpl"))
    if eps is not None:
        assert eps <= m.epsilon * (1 + 1e-9)


@pytest.mark.parametrize("name", ["noisy_max", "svt2", "noisy_max_value"])
def test_patterns_respect_the_sensitivity(name):
    m = builtin(name, sensitivity=0.25)
    pairs = resolve_pairs(m, "patterns", "mpl")
    assert _max_step(pairs, "queries") == pytest.approx(0.25)
    assert m.true_epsilon_over(pairs) <= m.epsilon * (1 + 1e-9)


def test_sensitivity_one_pairs_are_the_papers():
    assert builtin("laplace").mpl_pairs == [(0.0, b / 10) for b in range(1, 11)]
    assert builtin("noisy_max").mpl_pairs == statdp_patterns(6)
    assert builtin("noisy_max").mpl_pairs[1] == ([1] * 6, [2] + [1] * 5)  # ints, as in the paper
    assert builtin("subsampled_gaussian").renyi_pairs == [([0.0] * 10, [1.0] + [0.0] * 9)]
    assert builtin("laplace").region == (-1.0, 1.0)


@pytest.mark.parametrize("name,params", [("laplace", {"sensitivity": 0.5}),
                                         ("subsampled_laplace", {"sensitivity": 0.25, "q": 1})])
def test_mpl_true_value_matches_the_audited_pairs(name, params):
    res = mpl(name, params=params, n=1000, N=3000, rng=2)
    assert res.pairs_true_value == pytest.approx(res.true_value, rel=1e-9)
    assert all("neighbours" not in w for w in res.warnings)


def test_mpl_warns_when_given_pairs_are_not_neighbours():
    res = mpl("laplace", [(0.0, 2.0)], n=500, N=1000, rng=1)
    assert res.pairs_true_value == pytest.approx(2.0)
    assert any("not neighbours" in w for w in res.warnings)


# ----------------------------------------------------------------------------- 2. patterns

def test_patterns_for_a_user_sampler_default_to_five_queries():
    m = load_mechanism(lambda db, size, rng: rng.normal(size=size))
    pairs = resolve_pairs(m, "patterns", "mpl")
    assert pairs == statdp_patterns(5)
    assert all(len(x) == len(y) == 5 for x, y in pairs)
    assert resolve_pairs(m, "patterns:3", "mpl") == statdp_patterns(3)


def test_patterns_for_noisy_max_value_use_its_k():
    m = builtin("noisy_max_value")
    assert resolve_pairs(m, "patterns", "mpl") == statdp_patterns(3)
    with pytest.raises(InputError, match="calibrated for 3"):
        resolve_pairs(m, "patterns:5", "mpl")


@pytest.mark.parametrize("name,why", [("laplace", "statistic"), ("gaussian", "statistic"),
                                      ("exponential", "statistic"), ("subsampled_laplace", "statistic"),
                                      ("noisy_gd", "statistic"), ("randomized_response", "not all bits"),
                                      ("shuffled_rr", "not all bits")])
def test_patterns_are_refused_where_they_make_no_sense(name, why):
    for spec in ("patterns", "patterns:4"):
        with pytest.raises(InputError, match=why) as info:
            resolve_pairs(builtin(name), spec, "mpl")
        assert "default pairs" in str(info.value) and "\n" not in str(info.value)


def test_cli_patterns_for_user_sampler_and_noisy_max_value(user_module):
    mod = user_module("fixb_sum_sampler", SUM_SAMPLER)
    sizes = ("--search-size", 500, "--final-size", 1000)
    res = run("mpl", "-m", f"{mod}:sample", "--pairs", "patterns", *sizes, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    res = run("mpl", "-m", "noisy_max_value", "--pairs", "patterns", *sizes, "--seed", 1)
    assert res.exit_code == 0, res.output
    one_line_error(run("mpl", "-m", "randomized_response", "--pairs", "patterns"), "bits")


# ----------------------------------------------------------------------------- 3. databases in pairs

@pytest.mark.parametrize("name", ["svt2", "svt5", "svt6", "randomized_response", "noisy_max",
                                  "noisy_max_value", "shuffled_rr"])
def test_vectors_of_different_lengths_are_refused(name):
    with pytest.raises(InputError, match=r"pairs\[1\]: x and x_prime must have the same length"):
        resolve_pairs(builtin(name), [([0, 1, 0], [1, 1, 0]), ([0, 0, 0], [1, 1])], "mpl")


@pytest.mark.parametrize("db", [[1, [2, 3]], [[1, 2], [3, 4]], "abc", None, [1, float("nan")], [1, "a"]])
def test_databases_must_be_numbers_or_flat_lists(db):
    for mech in ("laplace", load_mechanism(lambda d, size, rng: rng.normal(size=size))):
        with pytest.raises(InputError, match=r"pairs\[0\]: a database must be a number or a flat list"):
            resolve_pairs(load_mechanism(mech), [(db, 0)], "mpl")


def test_bits_must_be_bits_and_lengths_may_differ_for_records_and_user_samplers():
    with pytest.raises(InputError, match="bits"):
        resolve_pairs(builtin("randomized_response"), [([0, 2], [1, 1])], "mpl")
    with pytest.raises(InputError, match="bits"):
        resolve_pairs(builtin("shuffled_rr"), [([0, 0.5], [1, 1])], "mpl")
    user = load_mechanism(lambda d, size, rng: rng.normal(size=size))
    assert resolve_pairs(user, [([0, 0, 0], [0, 0])], "mpl") == [([0, 0, 0], [0, 0])]  # add/remove one
    assert resolve_pairs(builtin("subsampled_laplace"), [([0, 0, 0], [0, 0])], "mpl")


@pytest.mark.parametrize("pairs,fragment", [("[[[0,0,0],[1,1]]]", "same length"),
                                            ("[[[1,[2,3]], 0]]", "flat list")])
def test_cli_bad_databases_exit_2(tmp_path, pairs, fragment):
    path = tmp_path / "pairs.json"
    path.write_text(pairs)
    name = "svt2" if fragment == "same length" else "laplace"
    one_line_error(run("mpl", "-m", name, "--pairs", path, "--search-size", 500, "--final-size", 1000), fragment)


# ----------------------------------------------------------------------------- 4. loading modules

@pytest.mark.parametrize("source,fragment", [("raise RuntimeError('boom\\nsecond line')\n", "RuntimeError: boom"),
                                             ("def f(:\n", "SyntaxError"),
                                             ("import sys\nsys.exit(3)\n", "SystemExit")])
def test_modules_that_fail_on_import_are_input_errors(user_module, source, fragment):
    mod = user_module(f"fixb_bad_{abs(hash(source)) % 10 ** 8}", source)
    with pytest.raises(InputError, match=f"cannot import module '{mod}'") as info:
        load_mechanism(f"{mod}:f")
    assert fragment in str(info.value) and "\n" not in str(info.value)
    one_line_error(run("mpl", "-m", f"{mod}:f"), "cannot import module", fragment)


def test_a_failing_user_sampler_is_bad_input_and_a_failing_builtin_is_an_internal_error(user_module, monkeypatch):
    """A user's sampler that raises is bad input: one line naming it and the database, exit 2. A built-in
    sampler that raises (numba failing to compile the Sparse Vector loop, say) is empdp's own failure: an
    internal error (exit 1), not blamed on the user's mechanism or databases."""
    mod = user_module("fixb_raises", "def f(database, size, rng):\n    raise ValueError('no draw')\n")
    with pytest.raises(InputError, match=f"mechanism '{mod}:f' failed on database 0: ValueError: no draw"):
        mpl(f"{mod}:f", pairs=[(0, 1)], n=500, N=1000, rng=1)
    Path("pairs.json").write_text("[[0, 1]]")  # (in the module's folder, the working directory)
    one_line_error(run("mpl", "-m", f"{mod}:f", "--pairs", "pairs.json", "--search-size", 500, "--final-size", 1000),
                   f"mechanism '{mod}:f' failed on database", "ValueError: no draw")
    from empdp.audit import compiled

    def broken(*args):
        raise RuntimeError("numba could not compile")

    monkeypatch.setattr(compiled, "svt_answers", broken)
    with pytest.raises(RuntimeError, match="could not compile"):
        mpl("svt4", n=500, N=1000, rng=1)
    res = run("mpl", "-m", "svt4", "--search-size", 500, "--final-size", 1000)
    assert res.exit_code == 1 and "internal error: RuntimeError: numba could not compile" in res.output, res.output
    assert "failed on database" not in res.output


@pytest.mark.parametrize("spec", [":f", "mymod:", ":"])
def test_module_and_function_both_needed(spec):
    with pytest.raises(InputError, match="module:function with both parts"):
        load_mechanism(spec)
    one_line_error(run("mpl", "-m", spec), "both parts")


# ----------------------------------------------------------------------------- 5. region and sizes

@pytest.mark.parametrize("region", [(1.0, 1.0), (2.0, 1.0), (0.0, float("inf")), "0,1"])
def test_region_needs_lo_below_hi(region):
    with pytest.raises(InputError, match="lo < hi"):
        mpl("laplace", n=500, N=1000, region=region, rng=1)


def test_region_is_a_box_for_discrete_vector_outputs():
    res = mpl("svt6", n=1000, N=3000, region=(0, 3), rng=2)
    points = [res.t_hat] + (res.event or [])
    assert all(0 <= v <= 3 for t in points for v in np.atleast_1d(t))
    with pytest.raises(InputError, match="no observed output lies in the region"):
        mpl("svt6", n=1000, N=3000, region=(10, 20), rng=2)


@pytest.mark.parametrize("n,N", [(2000, 1000), (2000, 2000)])
def test_stage_two_must_be_larger(n, N):
    with pytest.raises(InputError, match="must be larger than `n`"):
        mpl("laplace", n=n, N=N, rng=1)


def test_cli_default_sizes_satisfy_n_below_N():
    """Sizes default to the time budget's (N = 5n); one size alone takes the other's old default."""
    defaults = {p.name: p.default for p in main_mod.cli.get_command(None, "audit").commands["mpl"].params}
    assert defaults["search_size"] is None and defaults["final_size"] is None and defaults["time_budget"] == 20
    one_line_error(run("mpl", "-m", "laplace", "--final-size", 20000), "larger than --search-size")


# ----------------------------------------------------------------------------- 6. no stray warnings

def test_subsampling_with_q_one_warns_nothing():
    x, y = [0.0] * 10, [1.0] + [0.0] * 9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert truth.mixture_epsilon("laplace", x, y, 1.0, 1.0) == pytest.approx(1.0)
        assert truth.mixture_renyi("laplace", 2.0, x, y, 1.0, 1.0) == pytest.approx(truth.laplace_renyi(2.0, 1.0))
        res = mpl("subsampled_laplace", params={"q": 1}, n=500, N=1000, rng=1)
    assert res.pairs_true_value == pytest.approx(1.0)


# ----------------------------------------------------------------------------- 7. true values

def test_shuffled_rr_reports_its_epsilon():
    res = mpl("shuffled_rr", n=500, N=1000, rng=1)
    assert res.true_value == pytest.approx(math.log(3))
    assert res.pairs_true_value == pytest.approx(math.log(3))


def test_svt5_renyi_is_infinite_where_supports_differ():
    res = renyi("svt5", order=2, n=1000, rng=1)
    assert res.true_value == math.inf and res.to_dict()["true_value_infinite"] is True
    res = renyi("svt6", order=2, n=1000, rng=1)  # all 2^m answers possible under both: finite, not computed
    assert res.true_value is None


def test_svt5_law_exact_and_against_sampling():
    b = 2.0  # ρ ~ Lap(2 Δ / ε) at ε = Δ = 1
    law = truth.svt5_law([1, 1, 1], b)
    assert law == {(1, 1, 1): pytest.approx(0.5), (0, 0, 0): pytest.approx(0.5)}
    # same support {none, all}: ε = max |log ratio|, P_x'(all) = P(ρ ≤ 1)
    up = 1 - 0.5 * math.exp(-1 / b)
    eps = max(abs(math.log(0.5 / up)), abs(math.log(0.5 / (1 - up))))
    assert truth.svt5_pair_values([1, 1, 1], [2, 2, 2], b) == pytest.approx(eps)
    assert truth.svt5_pair_values([1, 1, 1], [0, 1, 1], b) == math.inf
    # D_2(x ‖ x′) is finite (x′ can give both of x's answers): P_x′(all) = P(ρ ≤ −1), P_x′(none) = ½
    assert truth.svt5_pair_values([1, 1, 1], [0, 1, 1], b, order=2.0) == pytest.approx(
        math.log(0.25 / (0.5 * math.exp(-1 / b)) + 0.25 / 0.5))
    assert truth.svt5_pair_values([0, 1, 1], [1, 1, 1], b, order=2.0) == math.inf  # x charges (0, 1, 1)
    q = [0.0, 1.5, 1.0, 1.5]
    law = truth.svt5_law(q, b)
    assert sum(law.values()) == pytest.approx(1.0)
    out = builtin("svt5").sampler(q, 40000, np.random.default_rng(0))
    patterns, counts = np.unique(out, axis=0, return_counts=True)
    assert {tuple(p) for p in patterns.tolist()} == set(law)
    for p, c in zip(patterns.tolist(), counts):
        prob = law[tuple(p)]
        assert abs(c / 40000 - prob) < 5 * math.sqrt(prob * (1 - prob) / 40000)


# ---------------------------------------------------------- absurd cost (issue 23, item 8)

@pytest.mark.parametrize("params, fragment", [({"steps": 1e12}, "steps=1e+12 is over 10,000"),
                                              ({"steps": 10_001}, "is over 10,000"),
                                              ({"lr": 2.5}, "must be below 2"),
                                              ({"sigma": 1e-300}, "outside [1e-100, 1e+100]")])
def test_noisy_gd_parameters_of_absurd_cost_are_refused(params, fragment):
    """steps=1e12 ran for more than 120 s before anything was said."""
    from empdp.audit.mechanisms import builtin

    with pytest.raises(InputError, match=re.escape(fragment)):
        builtin("noisy_gd", **params)


def test_sample_sizes_beyond_memory_are_refused():
    """Stage 1 holds its n outputs (at most 10^8); stage 2 only counts its N chunk by chunk (at most 10^10)."""
    from empdp.audit import mpl

    with pytest.raises(InputError, match=r"N = 99999999999999999999 is over 1e\+10"):
        mpl("laplace", n=100, N=99999999999999999999, rng=1)
    with pytest.raises(InputError, match=r"n = 100000001 is over 1e\+08 outputs per database, more than memory"):
        mpl("laplace", n=10**8 + 1, N=10**9, rng=1)
    with pytest.raises(InputError, match=r"selection_size = 10000000001 is over 1e\+10"):
        mpl("laplace", n=100, N=1000, selection_size=10**10 + 1, rng=1)
