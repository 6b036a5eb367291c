"""One model from assess to release, and the riskiest-individuals table as it is.

- calibrate adds no noise at ε exactly when assess puts nobody at risk at ε (same data, same
  options), in both directions, on the sample and on random panels;
- the riskiest table ranks by exact δ_i(ε), ties by exact ε_i, always holds the individual that
  sets ε_all, and never shows a bound as ε_i (checked against a brute-force ranking of everyone);
- Gaussian kernels report their tolerance (``eps_tolerance``) and ε_i as the smallest ε with
  δ_i(ε) ≤ τ.
"""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from numpy.testing import assert_allclose
from rich.console import Console

from empdp import calibrate, risk
from empdp.assessment import assess
from empdp.cli.main import cli
from empdp.cli.render import print_assessment
from empdp.settings import Model

QUERY = dict(id="countyid", by="year", query="mean(murdrate)")


def panel(seed: int, n_ind: int = 60, n_db: int = 12) -> pd.DataFrame:
    """Every individual in every database (no sole contributors), heavy-tailed contributions."""
    rng = np.random.default_rng(seed)
    effect = rng.standard_t(3, n_ind) * 2
    rows = [(f"c{i}", 2000 + j, 10 + effect[i] + rng.normal(0, 1)) for j in range(n_db) for i in range(n_ind)]
    return pd.DataFrame(rows, columns=["id", "year", "x"])


def _calibrate(source, eps, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no noise is added" and friends
        return calibrate(source, epsilon=eps, **kw)


def _check_both_directions(source, **kw):
    a = assess(source, **kw)
    assert a.sole_contributors == 0 and a.eps_all > 0
    for factor, quiet in ((1 - 1e-6, False), (1 + 1e-6, True)):
        eps = a.eps_all * factor
        nobody = int(assess(source, epsilon=[eps], **kw).n_at_risk[0]) == 0
        cal = _calibrate(source, eps, **kw)
        assert nobody is quiet
        assert (cal.noise["kind"] == "none") is nobody, (factor, cal.noise)
        # the same model: calibrate's curator kernel is assess's density model
        assert cal.curator_kernel == {"kind": a.model.kernel, "scale": float(a.model.scale)}


def test_default_model_is_one_laplace_scale():
    a = assess(panel(0), id="id", by="year", query="mean(x)")
    assert a.model.kernel == "laplace" and not a.model.variable and a.eps_tolerance == 0.0
    assert a.to_dict()["eps_tolerance"] == 0.0


def test_calibrate_adds_no_noise_exactly_when_assess_finds_nobody_at_risk_on_the_sample(sample_path):
    _check_both_directions(sample_path, **QUERY)


@pytest.mark.parametrize("seed", range(4))
def test_calibrate_adds_no_noise_exactly_when_assess_finds_nobody_at_risk_on_panels(seed):
    _check_both_directions(panel(seed), id="id", by="year", query="mean(x)")


def test_fixed_bandwidth_is_the_same_model_too():
    _check_both_directions(panel(7), id="id", by="year", query="sum(x)", model=Model(bandwidth=0.8))


def test_variable_bandwidths_are_assess_only(sample_path, tmp_path):
    a = assess(panel(1), id="id", by="year", query="mean(x)", model=Model(bandwidth="variable"))
    assert a.model.describe()["selected_by"] == "loo-likelihood"
    assert a.model.bandwidths.std() > 0  # the variable part is there when asked for
    out = tmp_path / "cal.json"
    res = CliRunner().invoke(cli, ["calibrate", sample_path, "--id", "countyid", "--by", "year", "--query",
                                   "mean(murdrate)", "-e", "1", "--bandwidth", "variable", "-o", str(out)])
    assert res.exit_code == 2 and "--bandwidth variable is for assess only" in res.output
    assert not out.exists()


# ------------------------------------------------------------------ the riskiest table
def _brute_force_ranking(a, eps: float):
    """Every individual's exact (δ_i(ε), ε_i), ranked by δ_i then ε_i (sole contributors first)."""
    m = a.n_individuals
    codes = np.arange(m)
    eps_i, delta = a.exact_risk(codes, eps)
    order = np.lexsort((-eps_i, -delta))
    return codes[order], delta[order], eps_i[order]


@pytest.mark.parametrize("which", [0, 3, 20, 40])
def test_riskiest_ranks_by_exact_delta_and_holds_the_eps_all_individual(sample_assessment, which):
    a = sample_assessment
    eps = float(a.epsilons[0]) if which == 0 else a.eps_all * which / 50
    codes, delta, eps_i = _brute_force_ranking(a, eps)
    top = a.riskiest(10, eps)
    ids = a.individuals[a.id_column].to_numpy()
    plain = top.filter(~top["sets_eps_all"]) if top.height > 10 else top
    assert_allclose(plain["delta"].to_numpy(), delta[:len(plain)], atol=1e-12)
    assert_allclose(plain["eps_i"].to_numpy(), eps_i[:len(plain)], rtol=1e-12)
    # the same individuals, up to exact ties
    assert set(plain[a.id_column].to_list()) <= set(ids[codes[:len(plain) + 2]].tolist())
    setter = ids[int(np.argmax(a.exact_risk(np.arange(a.n_individuals), eps)[0]))]
    assert setter in top[a.id_column].to_list()
    assert top.filter(top["sets_eps_all"])[a.id_column].to_list() == [setter]
    assert top.filter(top["sets_eps_all"])["eps_i"][0] == pytest.approx(a.eps_all, rel=1e-12)
    assert np.isfinite(top["eps_i"].to_numpy()).all()  # exact for every row shown, never a bound


def test_riskiest_at_a_high_epsilon_still_shows_eps_all_individual(sample_assessment):
    # at ε just below ε_all only the ε_all individual is at risk; the rest rank by exact ε_i
    a = sample_assessment
    top = a.riskiest(5, a.eps_all * 0.999)
    assert top["sets_eps_all"][0] and top["delta"][0] > 0 and (top["delta"][1:] == 0).all()
    assert (np.diff(top["eps_i"].to_numpy()[1:]) <= 0).all()


def test_terminal_table_shows_no_bound_as_eps_i(sample_path):
    a = assess(sample_path, epsilon=[1.0], **QUERY)
    buf = io.StringIO()
    print_assessment(a, console=Console(file=buf, width=200, highlight=False), top=10)
    table = buf.getvalue().split("riskiest individuals")[1]
    assert "<=" not in table and "sets eps_all" in table
    setter = a.riskiest(10, 1.0).filter("sets_eps_all")[a.id_column][0]
    assert f" {setter} " in table


def test_individuals_keep_the_exact_eps_i_the_search_found(sample_path):
    a = assess(sample_path, **QUERY)
    known = a.individuals.filter(a.individuals["eps_i"].is_not_null())
    assert known.height > 0 and known["eps_i"].max() == pytest.approx(a.eps_all, rel=1e-15)


# ------------------------------------------------------------------ Gaussian tolerance
def test_gaussian_reports_its_tolerance(sample_path):
    a = assess(sample_path, epsilon=[0.5], **QUERY, model=Model(kernel="gaussian", bandwidth=0.02))
    d = a.to_dict()
    assert d["eps_tolerance"] == risk.GAUSSIAN_TOL > 0
    assert any("eps_tolerance" in n for n in d["notes"])
    buf = io.StringIO()
    print_assessment(a, console=Console(file=buf, width=200, highlight=False))
    text = buf.getvalue()
    assert "every individual protected" not in text and f"delta_i <= {risk.GAUSSIAN_TOL:g}" in text
    res = CliRunner().invoke(cli, ["assess", sample_path, "--id", "countyid", "--by", "year", "--query",
                                   "mean(murdrate)", "--kernel", "gaussian", "--bandwidth", "0.02", "--json"])
    assert json.loads(res.output)["eps_tolerance"] == risk.GAUSSIAN_TOL


def test_null_values_are_counted_and_warned_about():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"id": np.repeat(np.arange(50), 10), "y": np.tile(np.arange(10), 50),
                       "x": rng.normal(size=500)})
    nulls = rng.random(500) < 0.2
    df.loc[nulls, "x"] = np.nan
    a = assess(df, id="id", by="y", query="mean(x)")
    assert any(f"{int(nulls.sum()):,} rows have a NULL" in w for w in a.warnings), a.warnings


def test_spark_remote_in_the_environment_does_not_stop_the_embedded_engine(sample_path):
    res = CliRunner().invoke(cli, ["assess", sample_path, "--id", "countyid", "--by", "year", "--query",
                                   "mean(murdrate)", "-e", "1", "-q"], env={"SPARK_REMOTE": "sc://nowhere:1"})
    assert res.exit_code == 0, res.output
