"""Exact risk for Laplace kernels of one global scale, in closed form
(docs/method.md#54-one-laplace-scale-closed-form-the-default-model).

With one scale b, every term of p̂ and of p̂_i is (1/2b) e^{−|x − c|/b}. Between two consecutive
nodes x_k < x_{k+1} of the merged centres (the q_j, shared, and the row's kinks q_j − Δ_ij)
no term has a kink, so with t = x − x_k ∈ [0, h]

    p̂(t) = w (A_k e^{−t/b} + B_{k+1} e^{−(h−t)/b}),    w = 1/(2bn),

where A_k sums e^{−(x_k − c)/b} over the centres c ≤ x_k and B_{k+1} sums e^{−(c − x_{k+1})/b}
over the centres c ≥ x_{k+1} (p̂_i likewise with A′, B′). Hence, for every ε,

    p̂ − e^ε p̂_i = w (α e^{−t/b} + β e^{−(h−t)/b}),   α = A_k − e^ε A′_k,  β = B_{k+1} − e^ε B′_{k+1},

which changes sign at most once on the interval. So the log-ratio L = log p̂ − log p̂_i is
monotone between nodes (a level it crossed twice would give two sign changes), its supremum is
taken at a node (the tails are flat: L there is its value at the end node), ε_i = max_k |L(x_k)|,
and each interval adds to δ_i(ε) = ∫ (p̂ − e^ε p̂_i)_+ an integral in closed form: the whole
interval's w b (α + β)(1 − e^{−h/b}) when α, β ≥ 0, nothing when both are ≤ 0, and otherwise the
part on one side of the root t*, where e^{−t*/b} = e^{−h/2b} √(−β/α). No grid, no bounds and no
root finding: the nodes are the 2n centres, every sum is a running sum whose factors are at most
1 (nothing overflows), and each (interval, level) pair a level cuts costs one square root.
"""

from __future__ import annotations

import numpy as np

from ..kernels import Laplace
from .laplace import L_CAP


def applies(model) -> bool:
    """True for a Laplace model whose points all share one scale (the default model)."""
    b = model.bandwidths
    return isinstance(model.kernel, Laplace) and len(b) > 0 and bool(np.all(b == b[0]))


def evaluate(points: np.ndarray, b: float, shifts: np.ndarray, eps: np.ndarray | None = None,
             only: np.ndarray | None = None, cap: np.ndarray | None = None):
    """Exact ε_i and δ_i(ε) for each row of ``shifts`` (C, n) under one Laplace scale ``b``.

    Returns ``(eps_i, delta)``: ``eps_i`` (C,) clipped at :data:`empdp.risk.laplace.L_CAP` like the
    general path, ``delta`` (C, len(eps)) in [0, 1] (None without ``eps``). ``eps`` in any order.
    ``only`` and ``cap`` as in :func:`empdp.risk.evaluate`: at the ε outside ``only``, δ_i is
    computed for the rows whose δ_i at the smallest ε exceeds ``cap`` there, and is otherwise
    NaN where it is positive (ε < ε_i) and 0 where it is not.
    """
    shifts = np.atleast_2d(np.asarray(shifts, dtype=np.float64))
    C, n = shifts.shape
    eps_i = np.zeros(C)
    if eps is None:
        delta = None
    else:
        eps = np.asarray(eps, dtype=np.float64)
        delta = np.zeros((C, len(eps)))
    if C == 0 or n == 0:
        return eps_i, delta
    q = np.sort(np.asarray(points, dtype=np.float64))
    rows = np.flatnonzero(shifts.any(axis=1))  # p̂_i ≡ p̂ elsewhere: no risk
    if eps is None:
        eps_i[rows], _ = _blocks(q, float(b), points, shifts[rows], None)
        return eps_i, None
    order = np.argsort(eps, kind="stable")
    wanted = np.ones(len(eps), dtype=bool) if only is None else np.asarray(only, dtype=bool)
    computed, skipped = order[wanted[order]], order[~wanted[order]]  # ascending ε
    if len(skipped) and (not wanted[order[0]] or cap is None):
        raise ValueError("only must keep the smallest epsilon, and comes with cap")
    eps_i[rows], d = _blocks(q, float(b), points, shifts[rows], eps[computed])
    delta[np.ix_(rows, computed)] = d
    if len(skipped):
        delta[np.ix_(rows, skipped)] = np.where(eps_i[rows, None] > eps[None, skipped], np.nan, 0.0)
        over = rows[(d[:, :1] > np.asarray(cap)[skipped][None, :]).any(axis=1)]
        if len(over):  # rows above a cap: their δ_i at those ε too
            delta[np.ix_(over, skipped)] = _blocks(q, float(b), points, shifts[over], eps[skipped])[1]
    return eps_i, delta


def _blocks(q: np.ndarray, b: float, points: np.ndarray, shifts: np.ndarray, eps: np.ndarray | None):
    """ε_i and δ_i at ``eps`` (ascending; None: ε_i only) of each row, row by row in compiled code
    (:func:`empdp.compiled.onescale_rows`: the nodes are the 2n merged centres, every sum a running
    sum whose factors are at most 1, each (interval, level) pair a level cuts one square root)."""
    from .. import compiled  # numba: loaded by the evaluation only, never by --help or an audit

    levels = np.zeros(0) if eps is None else np.ascontiguousarray(eps, dtype=np.float64)
    eps_i, delta = compiled.onescale_rows(q, b, np.ascontiguousarray(points, dtype=np.float64),
                                          np.ascontiguousarray(shifts), levels, eps is not None, L_CAP)
    return eps_i, None if eps is None else delta
