"""empdp: empirical differential privacy for repeated databases.

Three jobs (SPEC 0): :func:`assess` per-individual empirical privacy risk,
calibrate-and-release noise (:mod:`empdp.noise`), and black-box audits
(:mod:`empdp.audit`).
"""

__version__ = "0.1.0"

from .assess import Assessment, assess
from .density import DensityModel, select_density
from .errors import BudgetExceededError, EmpdpError, InputError
from .loo import LooResult, leave_one_out
from .noise import Calibration, calibrate

__all__ = ["Assessment", "assess", "DensityModel", "select_density", "LooResult", "leave_one_out", "Calibration", "calibrate",
           "EmpdpError", "InputError", "BudgetExceededError", "audit"]


def __getattr__(name):
    # empdp.audit pulls in scipy.stats and scipy.integrate (about half a second), which
    # assess/calibrate never need: load it on first use of ``empdp.audit`` (PEP 562)
    if name == "audit":
        import importlib

        return importlib.import_module(".audit", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
