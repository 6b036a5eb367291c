"""The curator models (issue 34, item 2): one routing and one refusal for every stage, errors that name
parameters in the library and flags on the command line, and results that answer one protocol."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import one_line_error, run, settings

import empdp
from empdp.errors import InputError
from empdp.models import GROUPED, JOINT, MODELS, ONE, model_for
from empdp.settings import Model

MISSING = "/nonexistent/never-read.parquet"  # a refusal must come before any data are read
SOURCE = dict(id="id", by="year")
#: library keyword -> a value that some models refuse
REFUSABLE = {"kernel": "gaussian", "adversary": "count(*)", "adversary_sql": "SELECT count(*) FROM db",
             "buckets": 2, "workers": "processes", "screening": False}
#: the same on the command line
FLAGS = {"kernel": ["--kernel", "gaussian"], "adversary": ["--adversary", "count(*)"],
         "adversary_sql": ["--adversary-sql", "SELECT count(*) FROM db"], "buckets": ["--buckets", "2"],
         "workers": ["--workers", "processes"], "screening": ["--no-screening"]}
STATISTICS = {"joint": dict(query=["sum(x)", "count(*)"]), "grouped": dict(query="mean(x)", group_by="region")}


@pytest.mark.parametrize("model", [JOINT, GROUPED], ids=lambda m: m.key)
@pytest.mark.parametrize("param", sorted(REFUSABLE))
def test_the_library_refuses_what_a_model_does_not_take_before_reading(model, param):
    assert param in model.refuses
    with pytest.raises(InputError) as info:
        empdp.assess(MISSING, **SOURCE, **STATISTICS[model.key], **settings(**{param: REFUSABLE[param]}))
    text = str(info.value)
    assert text.startswith(f"{param}=") and "does not apply to" in text and model.refuses[param] in text


@pytest.mark.parametrize("model", [JOINT, GROUPED], ids=lambda m: m.key)
@pytest.mark.parametrize("param", sorted(FLAGS))
def test_the_command_line_refuses_the_same_naming_the_flag(model, param, tmp_path):
    statistic = (["--query", "sum(x)", "--query", "count(*)"] if model is JOINT
                 else ["--query", "mean(x)", "--group-by", "region"])
    res = run("assess", MISSING, "--id", "id", "--by", "year", *statistic, *FLAGS[param],
              "--out", tmp_path / "r.parquet")
    line = one_line_error(res, FLAGS[param][0], "does not apply to")
    assert "`" not in line and "=" not in line.split("does not apply")[0]
    assert not list(tmp_path.iterdir())


def test_one_routing_for_every_request():
    assert model_for("mean(x)") == (ONE, 1) and model_for(sql=["SELECT 1 FROM db"]) == (ONE, 1)
    assert model_for(["sum(x)", "count(*)"]) == (JOINT, 2) and model_for(sql=["a", "b", "c"]) == (JOINT, 3)
    assert model_for("mean(x)", group_by="g") == (GROUPED, 1)
    for bad in (dict(), dict(query=["a", "b", "c", "d"]), dict(query="a", sql="b"),
                dict(query=["a", "b"], group_by="g")):
        with pytest.raises(InputError):
            model_for(**bad)
    assert set(MODELS) == {"one", "joint", "grouped"}


@pytest.mark.parametrize("kwargs, param", [
    (dict(threads=0), "threads"), (dict(workers="cores"), "workers"), (dict(epsilon=[-1.0]), "epsilon"),
    (dict(buckets=2), "buckets"), (dict(engine="hadoop"), "engine"), (dict(kernel="epanechnikov"), "kernel"),
])
def test_library_errors_name_parameters_and_the_cli_shows_flags(kwargs, param):
    epsilon = kwargs.pop("epsilon", None)
    with pytest.raises(InputError) as info:
        empdp.assess(MISSING, **SOURCE, query="mean(x)", epsilon=epsilon, **settings(**kwargs))
    assert param in info.value.param and f"`{param}`" in str(info.value) and "--" not in str(info.value)
    shown = info.value.shown(lambda p: "--" + p.replace("_", "-"))
    assert f"--{param}" in shown and "`" not in shown


@pytest.mark.parametrize("args, flag", [
    (["--threads", "0"], "--threads"), (["--memory-limit", "-1GB"], "--memory-limit"),
    (["--buckets", "2"], "--buckets"), (["--sql", "SELECT 1 FROM db"], "--query"),
])
def test_no_backquoted_parameter_reaches_the_terminal(sample_path, args, flag):
    res = run("assess", sample_path, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)", *args)
    line = one_line_error(res, flag)
    assert "`" not in line


def test_every_result_answers_one_protocol(sample_path):
    """riskiest(k, epsilon) with the same leading and trailing columns, out_table, statistic, close."""
    one = empdp.assess(sample_path, id="countyid", by="year", query="mean(murdrate)", model=Model(bandwidth=0.05))
    joint = empdp.assess(sample_path, id="countyid", by="year", query=["mean(murdrate)", "sum(murders)"],
                         model=Model(bandwidth=[0.05, 1000.0]))
    for r in (one, joint):
        eps = float(r.epsilons[len(r.epsilons) // 2])
        top = r.riskiest(5, eps)
        assert top.columns[:5] == [r.id_column, "epsilon", "delta", "eps_i", "n_databases"]
        assert top.columns[-2:] == ["sole_contributor", "sets_eps_all"]
        assert (top["epsilon"] == eps).all() and top["sets_eps_all"].sum() == 1
        assert r.out_table().columns[:5] == [r.id_column, "eps_i", "eps_bound", "delta", "epsilon"]
        assert r.kind in (ONE, JOINT) and r.statistic
    # the joint table at another ε is exact: equal to the one the sweep computed at that ε
    k = len(joint.epsilons) // 2
    assert joint.riskiest(3, float(joint.epsilons[k]))["delta"][0] == pytest.approx(joint.delta[k], rel=1e-12)
    with one as same:  # a context manager that closes the engine the result keeps
        assert same.engine is not None
    assert one.engine is None and np.isfinite(one.eps_all)


def test_one_sql_of_two_or_three_columns_is_a_joint_query():
    assert model_for(sql="SELECT sum(x), count(*) FROM db") == (JOINT, 2)
    assert model_for(sql="SELECT sum(x), count(*), max(x) FROM db") == (JOINT, 3)
    assert model_for(sql="SELECT sum(x) FROM db") == (ONE, 1)
    with pytest.raises(InputError, match="4 columns") as info:
        model_for(sql="SELECT 1, 2, 3, 4 FROM db")
    assert info.value.param == ("sql",)
