"""Cost follows the rows, not the square of the number of databases (issue 35).

The density fit's leave-one-out likelihood and variable-bandwidth pilot summed an n × n matrix of
kernel terms (75 s and 5 GB at 10^4 databases): they are now sums over the sorted values
(:mod:`empdp.compiled`), checked here against that matrix, which stays in this file as the
reference. A 2·10^4-database assessment runs in a subprocess whose data segment is capped below
one such matrix, so an n × n array anywhere on the default command's path fails it at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import polars as pl
import pytest
from numpy.testing import assert_allclose
from scipy.special import logsumexp

from empdp import kernels
from empdp.density import _bandwidths, log_kernel_sums, loo_loglik, select_density

# ---------------------------------------------------------------------------- the matrix reference


def matrix_log_sums(kernel, q, bandwidths, self_term):
    """log Σ_k k_{b_k}(q_j − q_k) from the full n × n matrix (the form the fit had before issue 35)."""
    lk = kernels.kernel(kernel).logpdf(q[:, None] - q[None, :], bandwidths[None, :])
    if not self_term:
        np.fill_diagonal(lk, -np.inf)
    return logsumexp(lk, axis=1)


def hard_values(n: int, seed: int) -> np.ndarray:
    """Query values with ties, a tight cluster, and isolated values hundreds of scales away."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(n)
    q[: n // 10] = q[n // 10: 2 * (n // 10)]  # ties
    q[-3:] = [40.0, -250.0, 1e4]  # outliers: their sums underflow in linear form
    return rng.permutation(q)


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("self_term", [False, True])
@pytest.mark.parametrize("scale,offset", [(1e-12, 0.0), (0.01, 0.0), (0.04, 60.0), (0.3, 0.0), (5.0, 0.0)])
def test_kernel_sums_equal_the_matrix_to_rounding(kernel, variable, self_term, scale, offset):
    """Every form of the sums: one scale (Laplace running sums, Gaussian box moments; a span of
    more than 2^50 scales takes the blocks), per-point scales (blocks), values far from 0."""
    q = hard_values(600, seed=int(scale * 100) + variable) + offset
    bw = _bandwidths(kernel, q, scale, 0.5) if variable else np.full(len(q), scale)
    got = log_kernel_sums(kernel, q, bw, self_term=self_term)
    want = matrix_log_sums(kernel, q, bw, self_term)
    # the isolated values' sums are ~e^{-10^4}: both forms carry the rounding of q_j − q_k there
    assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_the_variable_bandwidth_pilot_and_the_likelihood_equal_the_matrix_form():
    q = hard_values(400, seed=5)
    n = len(q)
    for kernel in ("laplace", "gaussian"):
        pilot = matrix_log_sums(kernel, q, np.full(n, 0.4), True) - np.log(n)
        want = 0.4 * np.exp(0.5 * (pilot.mean() - pilot))
        assert_allclose(_bandwidths(kernel, q, 0.4, 0.5), want, rtol=1e-13)
        want_ll = float(np.sum(matrix_log_sums(kernel, q, want, False) - np.log(n - 1)))
        assert loo_loglik(kernel, q, want) == pytest.approx(want_ll, rel=1e-13)


def test_the_chosen_model_is_the_one_the_matrix_form_chose():
    """Every candidate's likelihood as from the matrix, so the same scale (and sensitivity) wins."""
    q = np.random.default_rng(8).gamma(2.0, 1.0, 300)
    for kernel, bandwidth in (("laplace", "auto"), ("gaussian", "auto"), ("laplace", "variable")):
        model = select_density(q, kernel=kernel, bandwidth=bandwidth)
        lls = []
        for c in model.candidates:
            bw = _bandwidths(c["kernel"], q, c["scale"], c["sensitivity"])
            lls.append(float(np.sum(matrix_log_sums(c["kernel"], q, bw, False) - np.log(len(q) - 1))))
            assert c["loglik"] == pytest.approx(lls[-1], rel=1e-13, abs=1e-12)
        best = model.candidates[int(np.argmax(lls))]
        assert (model.scale, model.sensitivity) == (best["scale"], best["sensitivity"])


def test_a_kernel_without_a_compiled_sum_is_summed_in_blocks(monkeypatch):
    """A registered kernel the compiled module does not know takes the block form, with the same sums."""
    q = hard_values(300, seed=2)
    bw = np.full(len(q), 0.7)
    want = log_kernel_sums("gaussian", q, bw, self_term=False)
    monkeypatch.setattr(kernels.Gaussian, "code", None)
    monkeypatch.setattr("empdp.density.BLOCK_TERMS", 1000)  # several blocks of rows
    assert_allclose(log_kernel_sums("gaussian", q, bw, self_term=False), want, rtol=1e-13)


def test_the_risk_running_sums_are_the_numpy_recurrence_bit_for_bit():
    from empdp.risk.laplace import _running

    rng = np.random.default_rng(4)
    inflow = rng.random((50, 7))
    decay = np.exp(-rng.random((49, 7)))
    for reverse in (False, True):
        want = inflow.copy()
        for j in (range(48, -1, -1) if reverse else range(1, 50)):
            prev, f = (j + 1, j) if reverse else (j - 1, j - 1)
            want[j] += want[prev] * decay[f]
        assert np.array_equal(_running(None, decay, inflow.copy(), reverse=reverse), want)
        shared = decay[:, 0]  # one decay for every column
        want1 = _running(None, np.repeat(shared[:, None], 7, axis=1), inflow.copy(), reverse=reverse)
        assert np.array_equal(_running(None, shared, inflow.copy(), reverse=reverse), want1)


# ---------------------------------------------------------------------------- memory


def traced_peak(kernel, q, bw) -> int:
    """Peak bytes allocated by one :func:`log_kernel_sums` (compiled or loaded before measuring)."""
    log_kernel_sums(kernel, q, bw, self_term=False)
    tracemalloc.start()
    try:
        log_kernel_sums(kernel, q, bw, self_term=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_the_fit_of_one_scale_holds_o_n_memory(kernel):
    """The sums of 3,000 values allocate O(n): a 3,000² matrix would be 72 MB."""
    q = np.random.default_rng(1).standard_normal(3000)
    peak = traced_peak(kernel, q, np.full(len(q), 0.2))
    assert peak < 2_000_000, f"{peak / 1e6:.1f} MB"


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_the_fit_of_variable_bandwidths_holds_blocks_of_rows(kernel):
    """Per-point scales are summed a block of rows at a time: 6,000 values stay far below the 288 MB
    of their matrix."""
    q = np.random.default_rng(1).standard_normal(6000)
    peak = traced_peak(kernel, q, _bandwidths(kernel, q, 0.2, 0.5))
    assert peak < 64_000_000, f"{peak / 1e6:.1f} MB"


def test_the_joint_models_likelihood_holds_blocks_of_rows_and_is_the_all_pairs_sum_to_the_bit():
    """The joint model's leave-one-out likelihood (every pair of databases) is summed a block of rows at a
    time: 4,000 databases at d = 2 stay far below the 256 MB of their (d, n, n) array, and the value is
    the all-pairs form's bit for bit."""
    from empdp.risk.joint import model as joint_model

    rng = np.random.default_rng(2)
    y, scales = rng.standard_normal((4000, 2)), np.array([0.3, 0.5])
    joint_model._loo_loglik(y[:50], scales)
    tracemalloc.start()
    try:
        got = joint_model._loo_loglik(y, scales)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64_000_000, f"{peak / 1e6:.1f} MB"
    small = y[:300]
    lk = -np.tensordot(1 / scales, np.abs(small.T[:, :, None] - small.T[:, None, :]), axes=1) - np.log(2 * scales).sum()
    np.fill_diagonal(lk, -np.inf)
    want = float(np.sum(logsumexp(lk, axis=1) - np.log(299)))
    assert joint_model._loo_loglik(small, scales) == want
    assert np.isfinite(got)


#: assess a panel in a subprocess whose resident memory is watched: past the cap it exits at once with
#: status 3; else it prints the databases seen and its peak resident kB
_ASSESS = textwrap.dedent("""
    import os, sys, threading, time
    cap_kb = int(sys.argv[2]) // 1024

    def watch():
        while True:
            with open("/proc/self/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            if rss > cap_kb:
                os._exit(3)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    import empdp
    res = empdp.assess(sys.argv[1], id="id", by="db", query="mean(x)")
    # this process's own peak (VmHWM; ru_maxrss keeps the parent's peak across fork and exec)
    with open("/proc/self/status") as f:
        print(res.n_databases, next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")))
""")


def test_an_assessment_of_20000_databases_holds_no_n_by_n_array(tmp_path):
    """The default command on 3 individuals × 2·10^4 databases, its resident memory capped at 1.2 GB (it
    needs ~0.5 GB, most of it the libraries): one n × n float array is 3.2 GB (before issue 35 the fit
    held several), so it stops at the first."""
    n_db, n_ind = 20_000, 3
    rng = np.random.default_rng(35)
    path = tmp_path / "long.parquet"
    pl.DataFrame({"id": np.tile(np.arange(n_ind), n_db), "db": np.repeat(np.arange(n_db), n_ind),
                  "x": 50 + 10 * rng.standard_normal(n_db * n_ind)}).write_parquet(path)
    cap = 1200 * 2**20
    # the compiled code is cached first (compiling it takes more memory than the assessment): a
    # small panel, the same cache folder
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NUMBA_CACHE_DIR", None)
    small = tmp_path / "small.parquet"
    pl.DataFrame({"id": np.tile(np.arange(n_ind), 50), "db": np.repeat(np.arange(50), n_ind),
                  "x": 50 + 10 * rng.standard_normal(50 * n_ind)}).write_parquet(small)
    warm = subprocess.run([sys.executable, "-c", _ASSESS, str(small), str(8 * cap)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    res = subprocess.run([sys.executable, "-c", _ASSESS, str(path), str(cap)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode != 3, "resident memory passed 1.2 GB"
    assert res.returncode == 0, res.stderr[-2000:]
    n_seen, peak_kb = map(int, res.stdout.split()[-2:])
    assert n_seen == n_db
    assert peak_kb * 1024 < cap


def test_the_compiled_code_is_cached_in_the_users_cache_folder_not_beside_the_package(tmp_path, sample_path):
    """Files numba writes beside an installed package outlive 'pip uninstall'; the folder they left
    shadowed a later editable install as an empty namespace package (the README's two commands)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NUMBA_CACHE_DIR", None)
    code = "import empdp, empdp.compiled as c; print(c.numba_config.CACHE_DIR); " \
           f"empdp.assess({sample_path!r}, id='countyid', by='year', query='mean(murdrate)')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    folder = tmp_path / "cache" / "empdp" / "numba"
    assert res.stdout.split()[0] == str(folder)
    assert any(f.suffix in (".nbi", ".nbc") for f in folder.rglob("*"))  # the compiled functions are there


# ---------------------------------------------------------------------------- numba, lazily

_PROBE = textwrap.dedent("""
    import atexit, sys
    atexit.register(lambda: print("numba" in sys.modules, file=sys.stderr))
    from empdp.cli.main import main
    sys.argv = ["empdp", *sys.argv[1:]]
    main()
""")


def _loads_numba(*args) -> bool:
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stderr.strip().splitlines()[-1] == "True"


def test_help_and_audits_do_not_import_numba(sample_path):
    assert not _loads_numba("--help")
    assert not _loads_numba("audit", "mpl", "-m", "laplace", "--param", "epsilon=0.7", "--seed", "1",
                            "--search-size", "2000", "--final-size", "4000", "-q")
    # the probe sees it where it is used: an assessment fits the density model
    assert _loads_numba("assess", sample_path, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
                        "--bandwidth", "0.05", "-q")
