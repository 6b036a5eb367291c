"""Extension points are one registry entry each (docs/architecture.md): a test-only entry is picked up by
every stage that takes one. (Query forms: tests/test_spark.py runs a test-only form on both engines;
kernels: tests/test_kernels.py.)"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import random_panel

import empdp
from empdp import engines
from empdp.errors import InputError

OPENED: list = []


@dataclass(frozen=True)
class Recording(engines.DuckDB):
    """A test-only engine: DuckDB's leave-one-out, noting each source it opens."""

    name = "recording"

    def open(self, source, **query):
        OPENED.append(query.get("query"))
        return super().open(source, **query)


@pytest.fixture
def recording(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "recording", Recording)
    OPENED.clear()
    return empdp.Execution(engine="recording")


def test_a_new_engine_is_one_registry_line(recording):
    df = random_panel(5, n_db=6, n_ind=20, ties=False)
    keys = dict(id="id", by="year", query="mean(x)")
    a = empdp.assess(df, **keys, epsilon=[0.3], execution=recording)
    b = empdp.assess(df, **keys, epsilon=[0.3])
    assert OPENED == ["mean(x)"] and a.eps_all == b.eps_all and np.array_equal(a.delta, b.delta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sole contributors, noted by both
        cal = empdp.calibrate(df, **keys, epsilon=0.5, execution=recording)
        assert cal.lam == empdp.calibrate(df, **keys, epsilon=0.5).lam
    assert OPENED == ["mean(x)", "mean(x)"]
    res = empdp.audit.audit_release(cal, df, engine="recording", top=1, n=500, N=2000, n_renyi=500, rng=1)
    assert len(OPENED) == 3 and res.exact_epsilon_max <= 0.5 * (1 + 1e-9)


def test_an_unknown_engine_names_the_registered_ones(recording):
    with pytest.raises(InputError, match="duckdb, spark, recording") as info:
        empdp.Execution(engine="hadoop")
    assert info.value.param == ("engine",)


def test_a_new_audit_mechanism_is_its_registry_entries(monkeypatch):
    """A built-in mechanism is its builder and its default parameters (docs/architecture.md): a test-only one
    (Laplace under another name) is audited by the library and the command line."""
    import json

    from helpers import run

    from empdp.audit import mechanisms

    monkeypatch.setitem(mechanisms._DEFAULTS, "test_only", dict(mechanisms._DEFAULTS["laplace"]))
    monkeypatch.setitem(mechanisms._BUILDERS, "test_only", mechanisms._BUILDERS["laplace"])
    sizes = dict(n=2000, N=10000, rng=1)
    assert empdp.audit.mpl("test_only", params={"epsilon": 0.5}, **sizes).lower_bound == \
        empdp.audit.mpl("laplace", params={"epsilon": 0.5}, **sizes).lower_bound
    res = run("audit", "mpl", "-m", "test_only", "--param", "epsilon=0.5", "--search-size", "2000",
              "--final-size", "10000", "--seed", "1", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["lower_bound"] <= 0.5 * 1.2


def test_every_curator_model_has_a_path_or_a_refusal_in_every_stage():
    """A curator model (empdp.models.MODELS) is picked up by each stage's table keyed by the model, or refused
    by the model with a reason (docs/architecture.md): a new model missing from a stage fails here."""
    import importlib

    from empdp.cli.render import PRINTERS
    from empdp.models import MODELS
    from empdp.noise import compute
    from empdp.report import page

    assess_stage = importlib.import_module("empdp.assessment.assess")  # the package exports the function
    for key, model in MODELS.items():
        assert key in assess_stage._PATHS and key in PRINTERS, key
        assert key in page._REPORTS or "report" in model.refuses, key
        # calibrate is asked only of models a calibration request can be (no group_by there)
        assert key in compute._PATHS or key == "grouped", key
