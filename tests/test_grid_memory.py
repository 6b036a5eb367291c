"""The evaluation grid stays small when the bandwidth is tiny against the query values' spread,
and a grid that cannot fit in the memory limit is refused with a clear message (docs/method.md#41-per-individual-risk)."""

import importlib
import warnings

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from empdp import risk
from empdp.cli.main import cli
from empdp.density import DensityModel, select_density
from empdp.errors import InputError
from empdp.risk import grid as _grid


def _model(q, b, kernel="laplace"):
    q = np.asarray(q, dtype=float)
    return DensityModel(kernel, b, 0.0, q, np.full(len(q), b), loglik=0.0)


@pytest.mark.parametrize("kernel", ["laplace", "gaussian"])
def test_grid_grows_with_the_log_of_the_span_in_bandwidths(kernel):
    """Before: ~D/2 nodes across a gap of D scales (10^9 at a bandwidth of 1e-9, 23 GB)."""
    sizes = [len(risk.base_grid(_model([0.0, 0.3, 1.0, 1.0 + 10.0**k], 1.0, kernel))) for k in (4, 5, 6)]
    assert sizes[-1] < 3000
    assert sizes[2] - sizes[1] < 2 * (sizes[1] - sizes[0]) + 500  # logarithmic, not linear


def test_tiny_bandwidth_grid_with_far_kinks_is_small():
    rng = np.random.default_rng(0)
    model = _model(rng.normal(size=5), 1e-9)
    shifts = rng.normal(scale=0.2, size=(5, 5))
    assert len(risk.base_grid(model, model.points[None, :] - shifts, budget=1e9)) < 100_000


def test_grid_without_far_gaps_is_unchanged(monkeypatch):
    """A gap narrower than 2 FAR_GAP scales gets no new nodes: the grid and the results are those of
    the grid built without gap filling, bit for bit."""
    rng = np.random.default_rng(1)
    q = np.r_[rng.normal(size=20), 40.0]  # 40 scales of b = 1 away: within 2 × 700 scales
    model = select_density(q, kernel="laplace", bandwidth=1.0)
    shifts = rng.normal(scale=3.0, size=(50, 21))
    pts = np.sort(np.r_[q, (q[None, :] - shifts).ravel()])
    prov = np.sort(rng.uniform(pts[0], pts[-1], 100))
    np.testing.assert_array_equal(_grid._fill_gaps(prov, pts, np.full(len(pts), 1.0), 46.0, _grid.FAR_GAP["laplace"]), prov)
    eps = np.array([0.1, 0.5, 2.0])
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    with_fill = risk.evaluate(model, shifts, eps, grid=grid)
    monkeypatch.setattr(_grid, "_fill_gaps", lambda prov, *args: prov)  # the grid as it was built before
    plain = risk.base_grid(model, model.points[None, :] - shifts)
    np.testing.assert_array_equal(grid, plain)
    without = risk.evaluate(model, shifts, eps, grid=plain)
    np.testing.assert_array_equal(with_fill[0], without[0])
    np.testing.assert_array_equal(with_fill[1], without[1])
    assert (with_fill[1] > 0).any()  # the comparison covers positive δ_i, not only zeros


def test_far_outlier_results_match_the_dense_grid():
    """δ_i on the new grid matches the old dense grid's (which an outlier 2,000 scales away still allows)."""
    rng = np.random.default_rng(4)
    q = np.r_[rng.normal(size=14), 100.0]
    model = _model(q, 0.05)
    shifts = rng.normal(scale=0.15, size=(20, 15))
    eps = np.array([0.05, 0.3, 1.0])
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    _, delta = risk.evaluate(model, shifts, eps, grid=grid)
    dense = np.unique(np.r_[grid, np.arange(q.max() - 1950 * 0.05, q.max() - 40 * 0.05, 0.1)])
    _, ref = risk.evaluate(model, shifts, eps, grid=dense)
    np.testing.assert_allclose(delta, ref, atol=1e-9)


def test_grid_over_budget_is_refused_before_it_is_built():
    model = _model([0.0, 0.1, 0.2, 5.0], 1e-3)
    with pytest.raises(InputError, match=r"would need ~[\d,]+ nodes.*over the memory limit.*`bandwidth`"):
        risk.base_grid(model, budget=1e5, labels=[2000, 2001, 2002, 2003])
    with pytest.raises(InputError, match="inspect database 2003, whose value 5"):
        risk.base_grid(model, budget=1e5, labels=[2000, 2001, 2002, 2003])
    assert len(risk.base_grid(model, budget=1e9)) > 0


@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(0)
    rows = [(i, y, rng.normal()) for i in range(1, 6) for y in range(2000, 2005)] + [(1, 2000, 0.5)]
    path = tmp_path / "small.parquet"
    pd.DataFrame(rows, columns=["id", "year", "x"]).to_parquet(path)
    return str(path)


def _assess(path, *extra):
    return CliRunner().invoke(cli, ["assess", path, "--id", "id", "--by", "year", "--query", "mean(x)",
                                     "--kernel", "laplace", "-e", "1", "-q", "--json", *extra])


def test_tiny_bandwidth_assess_runs_in_little_memory_without_warnings(small, monkeypatch):
    """Before: 1e-9 took all 23 GB and was killed; 1e-3 printed an overflow RuntimeWarning."""
    monkeypatch.setattr(importlib.import_module("empdp.assessment.evaluation"), "_memory_limit", lambda engine: 10**9)
    for bw in ("1e-9", "1e-3"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = _assess(small, "--bandwidth", bw)
        assert res.exit_code == 0, res.output
        assert '"delta": 1.0' in res.output or '"delta": 0.9' in res.output


def test_grid_over_memory_limit_is_refused_with_exit_2(small, monkeypatch):
    """Models evaluated on a grid (here Gaussian kernels) refuse a grid that cannot fit; the
    default one-scale Laplace model needs no grid and runs."""
    A = importlib.import_module("empdp.assessment.evaluation")

    monkeypatch.setattr(A, "_memory_limit", lambda engine: 10_000)
    res = CliRunner().invoke(cli, ["assess", small, "--id", "id", "--by", "year", "--query", "mean(x)",
                                   "--kernel", "gaussian", "--bandwidth", "1e-9", "-e", "1", "-q", "--json"])
    assert res.exit_code == 2, res.output
    line, = res.output.strip().splitlines()
    assert line.startswith("Error: the density grid would need") and "--bandwidth" in line
    res = _assess(small, "--bandwidth", "1e-9")
    assert res.exit_code == 0, res.output
