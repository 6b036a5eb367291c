"""empdp: empirical differential privacy for repeated databases.

Three jobs: :func:`assess` per-individual empirical privacy risk,
calibrate-and-release noise (:mod:`empdp.noise`), and black-box audits
(:mod:`empdp.audit`).

Code map, in the order data flows (the method: ``docs/method.md``)::

    data.py, query.py   the source as DuckDB sees it; the query forms
    loo.py              query values q_j and leave-one-out shifts Δ_ij (one scan)
    density.py          the curator's density model (Laplace, one scale, by default)
    risk.py, _laplace.py, _gaussian.py
                        exact δ_i(ε), ε_i and screening bounds
    assess.py           the assessment: screening, ε_all search, sweep, riskiest table
    checks.py           independence and representativeness of the databases
    noise/              calibration (λ*, deconvolution), secure sampling, release ledger
    audit/              black-box lower bounds (MPL, Rényi) and the release audit
    report.py, result.py, io.py
                        HTML report, saved results, atomic writes and hashed ids

The names below load their modules on first use (PEP 562), so ``import empdp``
and the command line start fast.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "Assessment": ".assess", "assess": ".assess",
    "DensityModel": ".density", "select_density": ".density",
    "EmpdpError": ".errors", "InputError": ".errors", "BudgetExceededError": ".errors",
    "LooResult": ".loo", "leave_one_out": ".loo",
    "Calibration": ".noise", "calibrate": ".noise",
}
#: submodules reachable as attributes (``empdp.audit.mpl(...)``, ``empdp.risk``)
_SUBMODULES = ("audit", "noise", "risk", "density", "report", "result", "io", "checks", "loo", "data")

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


class _Package(types.ModuleType):
    """``empdp.assess`` is the function, as ``from .assess import assess`` made it before the
    names loaded lazily: importing the submodule must not rebind the attribute to the module
    (the submodule stays in ``sys.modules['empdp.assess']``)."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})
