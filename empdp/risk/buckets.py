"""Exact risk against an adversary's buckets of databases (docs/method.md, the adversary model): the
largest conditional risk over the buckets, each bucket with its own density model."""

from __future__ import annotations

import numpy as np

from .exact import evaluate


def bucket_risk(buckets: list, shifts: np.ndarray, eps: np.ndarray | None):
    """ε_i, δ_i(eps) (maxima over buckets) and the bucket that sets ε_i, for rows of dense shifts.

    ``buckets`` have a density ``model`` and the positions of their ``databases``
    (:class:`empdp.assessment.adversary.Bucket`).

    Returns ``(eps_i, delta, which, per_bucket_eps)`` with ``delta`` None without ``eps``.
    """
    C = len(shifts)
    eps_i = np.zeros(C)
    which = np.zeros(C, dtype=np.int64)
    per = np.zeros((C, len(buckets)))
    delta = None if eps is None else np.zeros((C, len(eps)))
    for k, b in enumerate(buckets):
        e, d = evaluate(b.model, shifts[:, b.databases], eps)
        per[:, k] = e
        take = e > eps_i
        eps_i[take], which[take] = e[take], k
        if delta is not None:
            d = b.model.kernel.reported_delta(d)  # below a stated tolerance δ_i is reported as 0
            delta = np.maximum(delta, d)
    return eps_i, delta, which, per
