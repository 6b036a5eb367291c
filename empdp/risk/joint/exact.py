"""Exact per-individual risk of a joint query (docs/method.md#41-per-individual-risk and #102-joint-queries).

One statistic: the closed form of :mod:`empdp.risk.onescale` (the scaled model is one Laplace scale).
Two statistics: the matrix form on the grid of kink lines, :mod:`._cells`. Three statistics, and the
two-statistic rows the matrix form cannot certify: the vertex machinery of :mod:`._generic`.
"""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from .. import onescale
from . import _cells, _generic
from ._generic import QUAD_NODES, _check_shifts
from .model import JointModel


def joint_bound(model: JointModel, shifts) -> np.ndarray:
    """Screening bound M_i = max_j Σ_k |(T Δ_ij)_k| ≥ ε_i, so δ_i(ε) = 0 for ε ≥ M_i (docs/method.md#102-joint-queries)."""
    s = _check_shifts(model, shifts)
    T = model.transform
    total = np.zeros(s.shape[:2])
    for k in range(model.d):  # |(T Δ)_k| axis by axis: no (m, n, d) temporaries, no (m·n, d) matmul
        u = s[..., 0] * T[k, 0]
        for c in range(1, model.d):
            u += s[..., c] * T[k, c]
        total += np.abs(u)
    return total.max(-1, initial=0.0)


def exact_eps(a: np.ndarray, su: np.ndarray) -> np.ndarray:
    """Exact ε_i for scaled points ``a`` (n, d) and scaled shifts ``su`` (m, n, d)."""
    return _risk(a, su, None, QUAD_NODES)[0]


def _risk(a, su, eps, nodes, only=None, cap=None):
    """(ε_i, δ_i or None) for rows with some shift; ``eps`` ascending (``only``, ``cap`` in its order)."""
    m, n, d = su.shape
    if m == 0:
        return np.zeros(0), None if eps is None else np.zeros((0, len(eps)))
    if d == 1:
        return onescale.evaluate(a[:, 0], 1.0, su[:, :, 0], eps, only, cap)
    if d == 2:
        # ε_i: the product form where it holds, else the general path's, the same bits whether or not
        # δ_i is asked for
        e, same = _cells.eps_rows(a, su)
        wide = np.flatnonzero(~same)
        if len(wide):
            e[wide] = _generic._eps_rows(a, su[wide])
        if eps is None:
            return e, None
        _, dl, ok = _cells.evaluate(a, su, eps, nodes, only, cap)
        rest = np.flatnonzero(~ok)  # δ_i of the rows the matrix form cannot certify: the general path
    else:
        e = _generic._eps_rows(a, su)
        dl = None if eps is None else np.zeros((m, len(eps)))
        rest = np.arange(m)
    if eps is not None:
        for r in rest:
            dl[r] = _general_levels(a, a - su[r], eps, nodes, e[r], only, cap)
    return e, dl


def _general_levels(a, b, eps, nodes, eps_i, only, cap):
    """δ_i(ε) of one row by the general path: every level, or with ``only``/``cap`` the levels in
    ``only`` and those where the chord bound exceeds the cap (NaN at the others below ε_i)."""
    if only is None:
        return _generic._delta_row(a, b, eps, nodes)[1]
    out = np.zeros(len(eps))
    live = eps < eps_i
    first = only & live
    if first.any():
        out[first] = _generic._delta_row(a, b, eps[first], nodes)[1]
    bound = _cells.chord_bound(out[:1], eps[0], np.array([eps_i]), eps)[0]
    more = ~only & live & (bound > cap)
    if more.any():
        out[more] = _generic._delta_row(a, b, eps[more], nodes)[1]
    out[~only & live & ~more] = np.nan
    return out


def joint_risk(model: JointModel, shifts, eps=None, *, nodes: int = QUAD_NODES,
               screen: bool = True, only=None, cap=None):
    """Exact ε_i and δ_i(ε) of each individual for a joint query (docs/method.md#41-per-individual-risk).

    Parameters
    ----------
    model : JointModel
    shifts : array (m, n, d)
        Δ_ij (zero where i is absent from database j).
    eps : array (E,), optional
        Privacy levels for δ_i(ε), any order.
    nodes : int
        Gauss–Legendre nodes per piece inside cells the level cuts (pieces near a singular point
        of their integrand are halved until two rules agree to 1e−13 of the cell's scale).
    screen : bool
        Rows with M_i ≤ min(eps) get ε_i only (their δ_i is exactly 0 there and above).
    only, cap : arrays (E,), optional
        As in :func:`empdp.risk.evaluate`: δ_i at every level in ``only`` (which must hold the
        smallest ε); at the others only where a bound on δ_i exceeds ``cap`` there (d = 1: δ_i at
        the smallest ε; d = 2, 3: the chord bound of convexity in e^ε, :func:`._cells.chord_bound`).
        Elsewhere δ_i is NaN where it is positive (ε < ε_i).

    Returns
    -------
    eps_i : ndarray (m,)
        sup |log p̂ − log p̂_i|, exact (max of L over grid vertices).
    delta : ndarray (m, E) or None
        δ_i(ε); exactly 0 for ε ≥ ε_i.
    """
    s = _check_shifts(model, shifts)
    T = model.transform
    a = model.points @ T.T
    su = s @ T.T
    m = su.shape[0]
    bound = np.abs(su).sum(-1).max(-1, initial=0.0)
    eps_i = np.zeros(m)
    live = np.flatnonzero(bound > 0)
    if eps is None:
        eps_i[live] = _risk(a, su[live], None, nodes)[0]
        eps_i = np.minimum(eps_i, bound * (1 + 1e-12))
        return eps_i, None
    eps = np.atleast_1d(np.asarray(eps, dtype=np.float64))
    if eps.ndim != 1 or not np.all(np.isfinite(eps) & (eps >= 0)):
        raise InputError("eps must be a list of non-negative numbers")
    order = np.argsort(eps, kind="stable")
    if only is not None:
        only = np.asarray(only, dtype=bool)[order]
        if cap is None or not only[0]:
            raise ValueError("only must keep the smallest epsilon, and comes with cap")
        cap = np.asarray(cap, dtype=np.float64)[order]
    delta = np.zeros((m, len(eps)))
    need = live[bound[live] > (eps.min() if screen else -1.0)]
    only_eps = np.setdiff1d(live, need)
    eps_i[only_eps] = _risk(a, su[only_eps], None, nodes)[0]
    if len(need):
        e, d = _risk(a, su[need], eps[order], nodes, only, cap)
        eps_i[need] = e
        delta[np.ix_(need, order)] = d
    eps_i = np.minimum(eps_i, bound * (1 + 1e-12))
    delta[eps_i[:, None] <= eps[None, :]] = 0.0
    return eps_i, delta
