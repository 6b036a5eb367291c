"""The entry points' settings objects (empdp.Data, Model, Execution): checked when made, naming the
parameter; the same result whichever way the table is given; short signatures."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from conftest import random_panel

import empdp
from empdp.errors import InputError


@pytest.mark.parametrize("make, param", [
    (lambda: empdp.Execution(threads=0), "threads"),
    (lambda: empdp.Execution(threads=True), "threads"),
    (lambda: empdp.Execution(workers="cores"), "workers"),
    (lambda: empdp.Model(kernel="cauchy"), "kernel"),
    (lambda: empdp.Data("t.parquet", id="", by="year"), "id"),
    (lambda: empdp.Data("t.parquet", id="id", by=None), "by"),
])
def test_settings_are_checked_when_made_naming_the_parameter(make, param):
    with pytest.raises(InputError) as info:
        make()
    assert param in info.value.param and f"`{param}`" in str(info.value) and "\n" not in str(info.value)


def test_data_object_or_flat_keys_give_the_same_assessment():
    df = random_panel(2, n_db=6, n_ind=25)
    flat = empdp.assess(df, id="id", by="year", query="mean(x)", epsilon=[0.2, 1.0])
    held = empdp.assess(empdp.Data(df, "id", "year"), query="mean(x)", epsilon=[0.2, 1.0],
                        model=empdp.Model(), execution=empdp.Execution(threads=1))
    assert held.eps_all == flat.eps_all
    np.testing.assert_array_equal(held.delta, flat.delta)
    with pytest.raises(InputError, match="given by the Data object"):
        empdp.assess(empdp.Data(df, "id", "year"), id="id", query="mean(x)")


def test_model_and_execution_reach_the_assessment():
    df = random_panel(2, n_db=6, n_ind=25)
    a = empdp.assess(df, id="id", by="year", query="mean(x)", epsilon=[0.5],
                     model=empdp.Model(kernel="gaussian", bandwidth=0.7),
                     execution=empdp.Execution(screening=False))
    assert a.model.kernel.name == "gaussian" and a.model.scale == 0.7
    assert not a.screening and a.n_evaluated == a.n_individuals - a.sole_contributors


@pytest.mark.parametrize("entry, most", [(empdp.assess, 13), (empdp.calibrate, 12)])
def test_entry_points_take_settings_not_two_dozen_keywords(entry, most):
    names = list(inspect.signature(entry).parameters)
    assert len(names) <= most and {"model", "execution"} <= set(names)


def test_intervals_are_checked_when_made_and_equal_held_or_read_again():
    with pytest.raises(InputError) as info:
        empdp.Intervals(replicates=0)
    assert info.value.param == ("replicates",)
    with pytest.raises(InputError, match="`rows`"):
        empdp.Intervals(rows="some")
    df = random_panel(2, n_db=24, n_ind=25)
    a = empdp.assess(df, id="id", by="year", query="mean(x)", intervals=empdp.Intervals(replicates=40, rng=1))
    b = empdp.assess(df, id="id", by="year", query="mean(x)")
    b.estimate_uncertainty(40, rng=1)
    assert a.uncertainty.to_dict() == b.uncertainty.to_dict()  # the same intervals, held or read again
    with pytest.raises(InputError, match="does not apply to a joint query"):
        empdp.assess(df, id="id", by="year", query=["mean(x)", "sum(x)"], intervals=empdp.Intervals())
