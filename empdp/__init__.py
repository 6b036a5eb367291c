"""empdp: empirical differential privacy for repeated databases.

Three jobs: :func:`assess` per-individual empirical privacy risk,
calibrate-and-release noise (:mod:`empdp.noise`), and black-box audits
(:mod:`empdp.audit`).

Code map, in the order data flows (the method: ``docs/method.md``)::

    models.py, params.py  the curator models (one statistic, joint, grouped) every stage asks for;
                        one validator per parameter concept
    settings.py         the entry points' settings objects: Data, Model, Execution, Precision, Intervals
    data/, query.py     the source as DuckDB sees it; the query forms
    loo/, engines.py    query values q_j and leave-one-out shifts Δ_ij, one engine per strategy;
                        the engine objects (DuckDB, Spark)
    density.py          the curator's density model (Laplace, one scale, by default)
    risk/               exact δ_i(ε), ε_i and screening bounds (closed form for the default model;
                        joint/ for 2–3 statistics released together)
    assessment/         the assessment of each curator model: screening, ε_all search, sweep,
                        riskiest table, adversary, checks, saved results
    noise/              calibration (λ*, deconvolution), secure sampling, release ledger
    audit/              black-box lower bounds (MPL, Rényi) and the release audit
    spark/              the leave-one-out and the exact evaluation on a Spark cluster
    report/             the HTML report
    io.py, keys.py, robust.py, errors.py
                        atomic writes and hashed ids, release keys, the robust spread, errors

The names below load their modules on first use (PEP 562), so ``import empdp``
and the command line start fast.
"""

import importlib

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "Assessment": ".assessment", "assess": ".assessment",
    "DensityModel": ".density", "select_density": ".density",
    "EmpdpError": ".errors", "InputError": ".errors", "BudgetExceededError": ".errors",
    "LooResult": ".loo", "leave_one_out": ".loo",
    "Calibration": ".noise", "calibrate": ".noise", "JointCalibration": ".noise", "load_calibration": ".noise",
    "JointAssessment": ".assessment.joint", "GroupedAssessment": ".assessment.groups",
    "Data": ".settings", "Model": ".settings", "Execution": ".settings", "Intervals": ".settings",
    "Precision": ".settings",
}
#: submodules reachable as attributes (``empdp.audit.mpl(...)``, ``empdp.risk``)
_SUBMODULES = ("assessment", "audit", "noise", "risk", "density", "report", "io", "loo", "data", "engines", "models")

__all__ = [*_EXPORTS, "audit"]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})
