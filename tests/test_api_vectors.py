"""``empdp.assess`` with a list of statistics or ``group_by``: the joint and grouped assessments behind
the one entry point (issue 19 item 1), and the one-statistic options it refuses."""

import numpy as np
import pytest
from helpers import settings
from test_joint_assess import paper_table
from test_joint_groups import EPS, grouped_table

from empdp.assessment import Assessment, assess
from empdp.assessment.groups import GroupedAssessment, assess_grouped
from empdp.assessment.joint import JointAssessment, assess_joint
from empdp.errors import InputError


def test_a_list_of_queries_is_the_joint_assessment():
    table, K = paper_table(n_db=12, n_ind=10, K=3)
    got = assess(table, id="id", by="db", query=["sum(x)", "sum(x_not_k)"], epsilon=[0.5, 2.0])
    ref = assess_joint(table, id="id", by="db", queries=["sum(x)", "sum(x_not_k)"], epsilon=[0.5, 2.0])
    assert isinstance(got, JointAssessment)
    np.testing.assert_array_equal(got.eps_i, ref.eps_i)
    np.testing.assert_array_equal(got.delta, ref.delta)
    assert int(np.argmax(got.eps_i)) == K


def test_a_list_of_one_is_the_one_statistic_assessment():
    table, _ = paper_table(n_db=12, n_ind=10)
    one = assess(table, id="id", by="db", sql=["SELECT sum(x) FROM db"], epsilon=[0.5])
    plain = assess(table, id="id", by="db", sql="SELECT sum(x) FROM db", epsilon=[0.5])
    assert isinstance(one, Assessment)
    assert one.eps_all == plain.eps_all and np.array_equal(one.delta, plain.delta)


def test_group_by_is_the_grouped_assessment():
    table = grouped_table(groups="abcd", n_db=12, n_ind=24, movers={20: "abcd", 21: "ab"})
    got = assess(table, id="id", by="year", query="mean(x)", group_by="region", epsilon=EPS)
    ref = assess_grouped(table, id="id", by="year", group_by="region", query="mean(x)", epsilon=EPS)
    assert isinstance(got, GroupedAssessment) and got.groups == list("abcd")
    np.testing.assert_array_equal(got.eps_i, ref.eps_i)
    assert got.n_bound_only == 1  # individual 20: rows in all 4 regions


@pytest.mark.parametrize("option", [{"kernel": "gaussian"}, {"adversary": "count(*)"},
                                    {"screening": False}])
def test_one_statistic_options_are_refused_for_several(option):
    table, _ = paper_table(n_db=6, n_ind=8, K=3)
    with pytest.raises(InputError, match=f"{next(iter(option))}="):
        assess(table, id="id", by="db", query=["sum(x)", "max(x)"], **settings(**option))


def test_group_by_takes_one_statistic():
    table = grouped_table(groups="ab", n_db=6, n_ind=8, movers={})
    with pytest.raises(InputError, match="one `query` or one `sql`"):
        assess(table, id="id", by="year", query=["sum(x)", "max(x)"], group_by="region")
