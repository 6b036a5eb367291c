"""The assessment (docs/method.md#6-sweeps-and-the-epsilon_all-search): per-individual risk of a query.

In the order it runs::

    sweep.py        :class:`RiskSweep`: what every result holds and does, whatever its curator model
    assess.py       :func:`assess` (every curator model enters here) and :class:`Assessment`: one
                    statistic, the stages from the source to the result
    joint.py        2–3 statistics released together (:class:`JointAssessment`)
    groups.py       one statistic per group (:class:`GroupedAssessment`)
    joint_evaluation.py  their exact evaluation, ε_all search and sweep
    evaluation.py   the exact evaluation: ε_all search, δ_i in blocks, the running summary
    parallel.py     where blocks run: the calling thread, a thread pool or worker processes
    ranking.py      the riskiest individuals, ranked by exact δ_i (branch and bound on certified bounds)
    checks.py       independence and representativeness of the databases
    adversary.py    the risk conditional on what an adversary knows (buckets of databases)
    result.py       saved results: written, read back, and rendered as the live one
"""

from .assess import Assessment, assess, default_epsilons

__all__ = ["Assessment", "assess", "default_epsilons"]
