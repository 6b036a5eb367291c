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
from .laplace import L_CAP, _running

#: (rows × nodes) cells per block: the block's two dozen temporaries stay within a few MB
BLOCK_CELLS = 50_000


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
    """:func:`_block` over row blocks of bounded size; ``eps`` ascending."""
    C, n = shifts.shape
    eps_i = np.empty(C)
    delta = None if eps is None else np.empty((C, len(eps)))
    step = max(1, BLOCK_CELLS // (2 * n))
    for k in range(0, C, step):
        e, d = _block(q, b, points, shifts[k:k + step], eps)
        eps_i[k:k + step] = e
        if d is not None:
            delta[k:k + step] = d
    return eps_i, delta


def _block(q: np.ndarray, b: float, points: np.ndarray, shifts: np.ndarray, eps: np.ndarray | None):
    C, n = shifts.shape
    J = 2 * n
    # the merged nodes of each row; `own` marks the row's kinks (the others are the shared q_j)
    centres = np.concatenate([np.broadcast_to(q, (C, n)), points[None, :] - shifts], axis=1)
    order = np.argsort(centres, axis=1, kind="stable")
    x = np.take_along_axis(centres, order, axis=1)
    own = order >= n
    # node-major (J, ·) arrays: the running sums step over contiguous rows
    xT = np.ascontiguousarray(x.T)
    with np.errstate(under="ignore"):
        f = np.exp(np.diff(xT, axis=0) * (-1.0 / b))  # (J − 1, C), in (0, 1]
    inflow = np.empty((J, 2 * C))
    inflow[:, :C] = ~own.T
    inflow[:, C:] = own.T
    decay = np.concatenate([f, f], axis=1)
    A = _running(None, decay, inflow.copy())
    B = _running(None, decay, inflow.copy(), reverse=True)
    # densities at the nodes (up to w): the node's own centre is in both sums
    V = A + B - inflow
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(V[:, :C]) - np.log(V[:, C:])
    L = np.clip(np.nan_to_num(L, nan=0.0, posinf=L_CAP, neginf=-L_CAP), -L_CAP, L_CAP)
    eps_i = np.abs(L).max(axis=0)
    if eps is None:
        return eps_i, None
    # interval masses (up to w b): (A_k + B_{k+1})(1 − f_k); tails: B_0 on the left, A_last on the right
    one_f = 1.0 - f
    mass = (A[:-1] + B[1:]) * np.concatenate([one_f, one_f], axis=1)
    w = 0.5 / n  # w b
    delta = np.maximum(_direction(L, mass, A, B, 0, f, eps), _direction(-L, mass, A, B, C, f, eps))
    delta *= w
    np.clip(delta, 0.0, 1.0, out=delta)
    # δ_i(ε) = 0 from ε_i on (exactly: no interval has L beyond ±ε)
    delta[eps_i[:, None] <= eps[None, :]] = 0.0
    return eps_i, delta


def _direction(L, mass, A, B, at_p, f, eps):
    """∫ (p − e^ε q)_+ / (w b) for each row and each ε (ascending), with L = log p − log q at the
    nodes (J, C); ``mass`` (J − 1, 2C) holds the interval masses and A, B (J, 2C) the running sums of
    p̂ then of p̂_i, side by side: p is the half from column ``at_p`` (0 or C), q the other half."""
    J, C = L.shape
    E = len(eps)
    at_q = C - at_p
    mp, mq = mass[:, at_p:at_p + C], mass[:, at_q:at_q + C]
    tails_p, tails_q = (B[0, at_p:at_p + C], A[-1, at_p:at_p + C]), (B[0, at_q:at_q + C], A[-1, at_q:at_q + C])
    growth = np.exp(np.minimum(eps, L_CAP))
    # levels strictly below L at each node; an interval lies in {L > ε} for the levels below the
    # smaller of its ends' counts, is cut by those between, and lies outside for the others
    cnt = np.searchsorted(eps, L, side="left")  # (J, C)
    lo = np.minimum(cnt[:-1], cnt[1:])
    hi = np.maximum(cnt[:-1], cnt[1:])
    cols = np.arange(C)
    out = np.zeros((C, E))
    # whole intervals and the two flat tails: binned by their first level outside, summed from the top
    firsts = [lo, cnt[:1], cnt[-1:]]
    masses = [(mp, mq), (tails_p[0][None, :], tails_q[0][None, :]), (tails_p[1][None, :], tails_q[1][None, :])]
    bins_p = np.zeros(C * (E + 1))
    bins_q = np.zeros(C * (E + 1))
    for first, (wp, wq) in zip(firsts, masses):
        flat = (cols[None, :] * (E + 1) + first).ravel()
        bins_p += np.bincount(flat, weights=wp.ravel(), minlength=C * (E + 1))
        bins_q += np.bincount(flat, weights=wq.ravel(), minlength=C * (E + 1))
    full_p = np.cumsum(bins_p.reshape(C, E + 1)[:, ::-1], axis=1)[:, -2::-1]
    full_q = np.cumsum(bins_q.reshape(C, E + 1)[:, ::-1], axis=1)[:, -2::-1]
    out += full_p - growth * full_q
    # intervals cut by a level: the closed-form integral on one side of the root, level by level
    count = (hi - lo).ravel()
    cut = np.flatnonzero(count)
    if len(cut):
        c = count[cut]
        starts = np.cumsum(c) - c
        # each interval's run of pairs: its index, and levels lo, lo + 1, … (runs by cumulative sums)
        at = _runs(starts, cut, int(starts[-1] + c[-1]))
        level = _runs(starts, starts - lo.ravel()[cut], len(at))
        np.subtract(np.arange(len(at)), level, out=level)
        g = growth[level]
        # the sums at the cut intervals' ends, taken from A and B whole (their halves' ravel() would
        # copy them): interval k of row c is A's flat k·2C + c (+ C for p̂_i's half), B's one node on
        row, col = np.divmod(at, C)
        row *= 2 * C
        row += col
        alpha = A.ravel().take(row + at_p)
        alpha -= g * A.ravel().take(row + at_q)
        row += 2 * C
        beta = B.ravel().take(row + at_p)
        beta -= g * B.ravel().take(row + at_q)
        value = _cut_integral(alpha, beta, f.ravel().take(at))
        # (row, level) pairs repeat across a row's intervals
        at %= C
        at *= E
        at += level
        out += np.bincount(at, weights=value, minlength=C * E).reshape(C, E)
    return out


def _runs(starts: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """``values[k]`` repeated from ``starts[k]`` to the next start (``np.repeat`` of runs, by a cumulative sum:
    several times faster for the short runs here)."""
    out = np.zeros(size, dtype=np.int64)
    out[starts] = np.diff(values, prepend=0)
    return np.cumsum(out, out=out)


def _cut_integral(alpha, beta, f):
    """∫_0^h (α e^{−t/b} + β e^{−(h−t)/b})_+ dt / b with f = e^{−h/b}: exact.

    The integrand changes sign at most once. Where it does inside the interval (its values at the
    ends, α + β f and α f + β, differ in sign) the positive side is, with P the positive and N the
    negative one of α and β,

        (√P − √(−f N))²,

    a square with no cancellation between large terms. (As the whole interval's (α + β)(1 − f)
    minus the negative side it lost e^ε × 1e-16 when e^ε q̂ made both huge: 1.8e-4 of δ_i at
    ε = 27 for a kernel shifted 30 scales.) Otherwise the integrand keeps one sign: the whole
    interval or nothing.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        out = beta * f
        out += alpha  # the integrand at t = 0
        other = alpha * f
        other += beta  # at t = h
        positive = out > 0
        same = other > 0
        np.equal(same, positive, out=same)  # no sign change inside
        np.maximum(alpha, beta, out=out)  # P
        np.minimum(alpha, beta, out=other)
        other *= f
        np.negative(other, out=other)  # −f N, below P where the sign changes inside
        out += other
        other *= out - other  # (−f N) P
        np.sqrt(other, out=other)  # (NaN where both are negative: replaced below)
        other += other
        out -= other  # P + (−f N) − 2 √(−f N P) = (√P − √(−f N))², to rounding of P
    np.copyto(out, 0.0, where=same)
    whole = np.flatnonzero(np.logical_and(positive, same, out=positive))  # positive throughout (few)
    if len(whole):
        out[whole] = (alpha[whole] + beta[whole]) * (1.0 - f[whole])
    return out
