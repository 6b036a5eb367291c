"""empdp: empirical differential privacy for repeated databases.

Three jobs (SPEC 0): :func:`assess` per-individual empirical privacy risk,
calibrate-and-release noise (:mod:`empdp.noise`), and black-box audits
(:mod:`empdp.audit`).
"""

__version__ = "0.1.0"
