"""Joint queries: d = 2 or 3 statistics released together (docs/method.md#102-joint-queries).

Numerical core, arrays in and out: :mod:`.model` (the whitened product Laplace density),
:mod:`.exact` (exact ε_i, δ_i(ε) and the screening bound; :mod:`._cells` for d = 2, :mod:`._generic`
for d = 3) and :mod:`.bounds` (certified O(n d) bounds on δ_i(ε) and ε_i, which decide most
individuals before any exact evaluation). The stages use them as they use the one-statistic core: :mod:`empdp.loo.joint` reads a
table into them, :mod:`empdp.assessment.joint` and :mod:`empdp.assessment.groups` assess, and
:mod:`empdp.noise.joint_exact` calibrates.
"""

from .exact import joint_bound, joint_risk
from .model import MAX_DIM, JointModel, SingularCovarianceError, check_dependence, select_joint_model

__all__ = ["MAX_DIM", "JointModel", "SingularCovarianceError", "check_dependence", "joint_bound", "joint_risk",
           "select_joint_model"]
