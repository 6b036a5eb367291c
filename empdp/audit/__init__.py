"""Black-box audits: MPL pure-DP and Rényi-DP lower bounds, reference mechanisms (docs/method.md#9-audits)."""

from .mechanisms import BUILTIN_NAMES, Mechanism, builtin, load_mechanism
from .mpl import MPLResult, mpl
from .patterns import statdp_patterns

__all__ = ["BUILTIN_NAMES", "Mechanism", "MPLResult", "builtin", "load_mechanism", "mpl",
           "statdp_patterns"]
from .renyi import RenyiResult, renyi

__all__ += ["RenyiResult", "renyi"]
from .release import ReleaseAudit, audit_release

__all__ += ["ReleaseAudit", "audit_release"]
