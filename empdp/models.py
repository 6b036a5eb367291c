"""The curator models: what is released, and so how its risk is modelled (docs/architecture.md).

One statistic (with or without an adversary's buckets), 2–3 statistics released together, and one
statistic per group are the three models. Every stage (assess, calibrate, the CLI) asks
:func:`model_for` which one a request is, refuses through :meth:`CuratorModel.refuse` what that model
does not take (one message form, naming the parameter as its caller knows it), and dispatches on the
model's ``key`` to the stage's own implementation. A new model is one entry here and one
implementation per stage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from . import kernels
from .data.guard import select_width
from .errors import InputError

#: the most statistics released together that have an exact joint model
MAX_DIM = 3

_ONE_ONLY = "assess the statistics one at a time for it"


@dataclass(frozen=True)
class CuratorModel:
    """One curator model: its ``key`` (what stages dispatch on), its name in messages (``{d}``: the
    number of statistics), and the parameters it does not take, each with why."""

    key: str
    name: str
    refuses: dict = field(default_factory=dict)
    #: the parameters the name mentions (shown as flags on the command line)
    names: tuple = ()

    def named(self, d: int | None = None) -> str:
        return self.name.format(d=d)

    def refuse(self, given: Iterable[tuple[str, str]], d: int | None = None) -> None:
        """Raise :class:`InputError` for the first given parameter this model does not take.

        ``given`` are (parameter, how the caller shows it) pairs in the caller's order, for the
        parameters given a value other than their default: ``("kernel", "kernel='gaussian'")`` from
        the library, ``("kernel", "--kernel gaussian")`` from the command line."""
        for param, shown in given:
            if param in self.refuses:
                raise InputError(f"{shown} does not apply to {self.named(d)}: {self.refuses[param]}",
                                 param=self.names)


#: why the one-statistic options do not apply to several statistics (joint or grouped)
_VECTOR = {
    "kernel": "{what} use product Laplace kernels, whose eps_i are exact; drop it",
    "adversary": f"the adversary model conditions one statistic; {_ONE_ONLY}",
    "adversary_sql": f"the adversary model conditions one statistic; {_ONE_ONLY}",
    "buckets": f"adversary buckets condition one statistic; {_ONE_ONLY}",
    "workers": "the {kind} evaluation runs in this process",
    "screening": "every individual's eps_i is exact already (or labelled a bound), and screening only skips "
                 "delta_i(epsilon) certified to be 0; drop it",
    "uncertainty": "the uncertainty of {what} is not estimated yet (one statistic only); drop it",
    "level": "a calibration at a level is made for one statistic only so far; drop it",
}


def _vector(what: str, kind: str, **more) -> dict:
    return {k: v.format(what=what, kind=kind) for k, v in _VECTOR.items()} | more


ONE = CuratorModel("one", "one statistic", {
    "precision": "one statistic's risk is exact (only the total risk of 2-3 statistics released together is "
                 "certified to a tolerance); drop it"})
JOINT = CuratorModel("joint", "a joint query of {d} statistics", _vector(
    "joint queries", "joint",
    calibration="the joint report has no calibration section yet; report the calibration of one statistic",
    audit="the joint report has no audit section yet; report the audit of one statistic"))
GROUPED = CuratorModel("grouped", "grouped statistics (`group_by`)", names=("group_by",), refuses=_vector(
    "grouped statistics", "grouped",
    calibration="it adds a section to --report, which grouped statistics do not take",
    audit="it adds a section to --report, which grouped statistics do not take",
    save_result="'empdp report' does not read grouped results; use --json or --out",
    without_shifts="it goes with --save-result, which grouped statistics do not take"))
#: every curator model, by key
MODELS = {m.key: m for m in (ONE, JOINT, GROUPED)}


#: the values of the parameters that only some models take which mean "not given" (the library's defaults;
#: ``workers="auto"`` lets each model choose)
_UNGIVEN = {"kernel": (kernels.DEFAULT.name,), "adversary": (None,), "adversary_sql": (None,), "buckets": (None,),
            "engine": ("duckdb",), "workers": ("threads", "auto"), "screening": (True,), "level": (None,),
            "uncertainty": (None,), "precision": (None,)}


def given(**values) -> list[tuple[str, str]]:
    """(parameter, ``name=value``) of the library parameters given a value that means something, in the
    caller's order: what :meth:`CuratorModel.refuse` checks for a library call."""
    return [(k, f"{k}={v!r}") for k, v in values.items() if v not in _UNGIVEN[k]]


def statistics(query, sql) -> tuple[list, list]:
    """``query`` and ``sql`` as lists (a single statistic, None or a list of them)."""
    def listed(v):
        return [] if v is None else [v] if isinstance(v, str) else list(v)

    return listed(query), listed(sql)


def model_for(query=None, sql=None, group_by=None) -> tuple[CuratorModel, int]:
    """The curator model of a request and its number of statistics d: one statistic; 2–3 given as
    ``query`` or ``sql`` (all of one kind), or as one ``sql`` returning 2–3 columns; or one statistic per
    group of ``group_by``."""
    queries, sqls = statistics(query, sql)
    given = len(queries) + len(sqls)
    if group_by is not None:
        if given != 1:
            raise InputError("`group_by` computes one statistic per group: give one `query` or one `sql` "
                             f"(got {len(queries)} `query` and {len(sqls)} `sql`)", param=("group_by", "query", "sql"))
        return GROUPED, 1
    if given == 0:
        raise InputError("give exactly one of `query` (e.g. 'mean(x)') or `sql` (over the table db)",
                         param=("query", "sql"))
    if given == 1:
        width = select_width(sqls[0]) if sqls else 1  # one SELECT of 2-3 columns: statistics released together
        if width > MAX_DIM:
            raise InputError(f"`sql` returns {width} columns: at most {MAX_DIM} statistics are released together",
                             param="sql")
        return (JOINT, width) if width > 1 else (ONE, 1)
    if queries and sqls:
        raise InputError(f"give exactly one of `query` or `sql` for one statistic, or 2-{MAX_DIM} statistics released "
                         f"together all as `query` or all as `sql`, not both (got {len(queries)} `query` and "
                         f"{len(sqls)} `sql`)", param=("query", "sql"))
    if given > MAX_DIM:
        param = "query" if queries else "sql"
        raise InputError(f"`{param}` given {given} times: at most {MAX_DIM} statistics are released together",
                         param=param)
    return JOINT, given
