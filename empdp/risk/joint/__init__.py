"""Joint queries: d = 2 or 3 statistics released together (docs/method.md#102-joint-queries, issue 19).

Numerical core, arrays in and out: :mod:`.model` (the whitened product Laplace density),
:mod:`.risk` (exact ε_i, δ_i(ε); :mod:`._cells` for d = 2, :mod:`._generic` for d = 3) and
:mod:`.noise` (calibration). :mod:`.panel` reads a table into them; :mod:`empdp.joint.assess` assesses it.
"""

from .model import MAX_DIM, JointModel, SingularCovarianceError, check_dependence, select_joint_model
from .noise import JointLambda, JointNoise, joint_eps_at, joint_minimal_lambda, joint_noise
from .risk import joint_bound, joint_risk

__all__ = ["MAX_DIM", "JointLambda", "JointModel", "JointNoise", "SingularCovarianceError", "check_dependence",
           "joint_bound", "joint_eps_at", "joint_minimal_lambda", "joint_noise", "joint_risk",
           "select_joint_model"]
