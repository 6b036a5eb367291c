"""Black-box audits: MPL pure-DP, Rényi-DP and (ε, δ) lower bounds, reference mechanisms (docs/method.md#9-audits)."""

from .approx import ApproxResult, approx
from .mechanisms import BUILTIN_NAMES, Mechanism, builtin, load_mechanism
from .mpl import MPLResult, mpl
from .patterns import statdp_patterns
from .release import ReleaseAudit, audit_release
from .renyi import RenyiResult, renyi

__all__ = ["ApproxResult", "approx", "BUILTIN_NAMES", "Mechanism", "MPLResult", "builtin", "load_mechanism", "mpl",
           "statdp_patterns", "RenyiResult", "renyi", "ReleaseAudit", "audit_release"]
