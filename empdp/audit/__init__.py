"""Black-box audits: MPL pure-DP, Rényi-DP and (ε, δ) lower bounds, reference mechanisms (docs/method.md#9-audits).

The release audit is imported on first use (PEP 562): it pulls in the data engines, which an
``audit mpl`` under a time budget would otherwise spend most of a second on before its pilots start.
The other audits stay plain imports, as their functions share their modules' names (importing the
module ``empdp.audit.mpl`` binds the package attribute ``mpl`` to it, and only this file's import
rebinds it to the function).
"""

import importlib

from .approx import ApproxResult, approx
from .mechanisms import BUILTIN_NAMES, Mechanism, builtin, load_mechanism
from .mpl import MPLResult, mpl
from .patterns import statdp_patterns
from .renyi import RenyiResult, renyi

#: names imported on first use, and their module
_LAZY = {"ReleaseAudit": "release", "audit_release": "release"}

__all__ = ["ApproxResult", "approx", "BUILTIN_NAMES", "Mechanism", "MPLResult", "builtin", "load_mechanism", "mpl",
           "statdp_patterns", "RenyiResult", "renyi", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value  # later look-ups find it without this function
    return value
