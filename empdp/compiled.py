"""Compiled kernel sums over sorted query values: the density model's O(n log n) core (issue 35).

The bandwidth choice needs, for every database j, the log of Σ_k k_{b_k}(q_j − q_k) over the
other databases (the leave-one-out likelihood) or over all of them (the variable-bandwidth
pilot). The n × n matrix of terms made this O(n²) in time and memory; here the values are sorted
once and each sum is built without the matrix:

* one Laplace scale b: exactly, by the two running sums L_j = Σ_{k<j} e^{−(q_j−q_k)/b} =
  e^{−(q_j−q_{j−1})/b} (L_{j−1} + 1) and its mirror image, O(n) after the sort
  (:func:`laplace_sums`);
* Gaussian kernels and per-point scales b_k: over a window about q_j that grows until every term
  left out is provably below e^{−:data:`TAIL`} of the kept sum (:func:`window_sums`).

This module imports numba, so it is imported only by the code that calls it (the density model's
fit): ``empdp --help`` and the audits never load it. Each kernel has one implementation here; the
matrix form stays in the tests as their reference.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: the kernels' codes (:attr:`empdp.kernels.Kernel.code`)
LAPLACE, GAUSSIAN = 0, 1
#: the terms a window leaves out add up to at most 2 e^{−TAIL} ≈ 8.5e-18 of the sum it keeps:
#: below the rounding of the kept sum itself (2^{−53} ≈ 1.1e-16)
TAIL = 40.0
_LOG_SQRT2PI = 0.5 * math.log(2 * math.pi)


@njit(cache=True)
def _lognorm(kind: int, b: float) -> float:
    """The log-normaliser of k_b that :func:`_logk` subtracts (log 2b; log b for Gaussian kernels)."""
    return math.log(2 * b) if kind == LAPLACE else math.log(b)


@njit(cache=True)
def _logk(kind: int, d: float, b: float, norm: float) -> float:
    """log k_b(d) for d ≥ 0 with ``norm`` = :func:`_lognorm` of b, in the operations of
    :meth:`empdp.kernels.Kernel.logpdf`."""
    if kind == LAPLACE:
        return -d / b - norm
    z = d / b
    return -0.5 * z * z - norm - _LOG_SQRT2PI


@njit(cache=True)
def _envelope(kind: int, d: float, lo: float, hi: float) -> float:
    """The largest log k_b(d) over scales b in [lo, hi]: both kernels' log k_b(d) rise in b up to
    b = d and fall after it, so the maximum is at d clipped to [lo, hi]."""
    b = min(max(d, lo), hi)
    return _logk(kind, d, b, _lognorm(kind, b))


@njit(cache=True)
def _running_max(b: np.ndarray) -> np.ndarray:
    """max(b[:k+1]) for every k."""
    out = np.empty_like(b)
    top = b[0]
    for k in range(len(b)):
        top = max(top, b[k])
        out[k] = top
    return out


@njit(cache=True)
def _running_min(b: np.ndarray) -> np.ndarray:
    """min(b[:k+1]) for every k."""
    out = np.empty_like(b)
    low = b[0]
    for k in range(len(b)):
        low = min(low, b[k])
        out[k] = low
    return out


@njit(cache=True)
def _add(t: float, ref: float, s: float, c: float):
    """Add e^t to the compensated sum e^ref (s + c) (Neumaier), rescaling when t is the new largest."""
    if t > ref:
        scale = math.exp(ref - t)
        s, c, ref = s * scale, c * scale, t
        x = 1.0
    else:
        x = math.exp(t - ref)
    total = s + x
    if abs(s) >= abs(x):
        c += (s - total) + x
    else:
        c += (x - total) + s
    return ref, total, c


@njit(cache=True)
def window_sums(kind: int, q: np.ndarray, b: np.ndarray, self_term: bool) -> np.ndarray:
    """log Σ_k k_{b_k}(q_j − q_k) for every j of the sorted ``q`` (k ≠ j unless ``self_term``).

    The sum over a side stops once the terms left (each at most the kernel's envelope at their
    distance over their scales) add up to less than e^−TAIL of what is kept: the result is the
    full sum's to a relative 2 e^−TAIL, far below rounding. The time is the number of terms kept,
    O(n) per point at worst (scales as wide as the data) and O(1) when they are narrow.
    """
    n = len(q)
    out = np.empty(n)
    norm = np.empty(n)
    for k in range(n):
        norm[k] = _lognorm(kind, b[k])
    lo_left, hi_left = _running_min(b), _running_max(b)
    lo_right, hi_right = _running_min(b[::-1])[::-1], _running_max(b[::-1])[::-1]
    for j in range(n):
        ref, s, c = -np.inf, 0.0, 0.0
        if self_term:
            ref, s, c = _add(_logk(kind, 0.0, b[j], norm[j]), ref, s, c)
        # both nearest neighbours first: the stopping test of each side then compares with a sum
        # that already holds the largest terms of both
        for k in (j - 1, j + 1):
            if 0 <= k < n:
                ref, s, c = _add(_logk(kind, abs(q[j] - q[k]), b[k], norm[k]), ref, s, c)
        ref, s, c = _side(kind, q, b, norm, j, j - 2, -1, lo_left, hi_left, ref, s, c)
        ref, s, c = _side(kind, q, b, norm, j, j + 2, 1, lo_right, hi_right, ref, s, c)
        out[j] = ref + math.log(s + c)
    return out


@njit(cache=True)
def _side(kind: int, q: np.ndarray, b: np.ndarray, norm: np.ndarray, j: int, k: int, step: int,
          lo: np.ndarray, hi: np.ndarray, ref: float, s: float, c: float):
    """Add the terms k, k + step, ... of q[j]'s sum to e^ref (s + c) until those not yet added (``lo``,
    ``hi``: the least and largest scale among them; at most n of them) provably add up to less than
    e^−TAIL of it. The bar is the sum's log when last refreshed: the sum only grows, so an older,
    lower bar keeps more terms, never fewer, and a log a term is saved."""
    n = len(q)
    log_n = math.log(n)
    bar = ref + math.log(s + c) - TAIL - log_n
    kept = 0
    while 0 <= k < n:
        d = abs(q[j] - q[k])
        t = _logk(kind, d, b[k], norm[k])
        # one scale among the terms left: the envelope is this term itself
        if (t if lo[k] == hi[k] else _envelope(kind, d, lo[k], hi[k])) < bar:
            break
        ref, s, c = _add(t, ref, s, c)
        k += step
        kept += 1
        if kept % 32 == 0:
            bar = ref + math.log(s + c) - TAIL - log_n
    return ref, s, c


@njit(cache=True)
def laplace_sums(q: np.ndarray, b: float, self_term: bool) -> np.ndarray:
    """log Σ_k e^{−|q_j − q_k|/b} for every j of the sorted ``q`` (k ≠ j unless ``self_term``), exactly.

    L_j = Σ_{k<j} e^{−(q_j−q_k)/b} = e^{−(q_j−q_{j−1})/b} P_{j−1} with P_j = L_j + 1 ≥ 1, and the
    mirror image R_j from the right: P never under- or overflows, and log L_j = log P_{j−1} −
    (q_j − q_{j−1})/b stays exact where L_j itself would underflow (an isolated value).
    """
    n = len(q)
    log_left = _one_side_laplace(q, b)
    log_right = _one_side_laplace(-q[::-1], b)[::-1]
    out = np.empty(n)
    own = 0.0 if self_term else -np.inf  # log of the self term e^0
    for j in range(n):
        hi = max(log_left[j], log_right[j], own)
        if hi == -np.inf:
            out[j] = -np.inf
            continue
        total = math.exp(log_left[j] - hi) + math.exp(log_right[j] - hi) + math.exp(own - hi)
        out[j] = hi + math.log(total)
    return out


@njit(cache=True)
def _one_side_laplace(q: np.ndarray, b: float) -> np.ndarray:
    """log Σ_{k<j} e^{−(q_j − q_k)/b} for every j of the ascending ``q`` (−∞ for j = 0)."""
    n = len(q)
    out = np.empty(n)
    out[0] = -np.inf
    carry = 1.0  # P_{j−1} = L_{j−1} + 1
    for j in range(1, n):
        x = (q[j] - q[j - 1]) / b
        if x < 700.0:
            left = carry * math.exp(-x)
            out[j] = math.log(left) if left > 1e-300 else math.log(carry) - x
        else:
            left = 0.0
            out[j] = math.log(carry) - x
        carry = left + 1.0
    return out


@njit(cache=True)
def running(decay: np.ndarray, inflow: np.ndarray, reverse: bool) -> None:
    """S_j = S_{j−1}·decay_{j−1} + inflow_j down axis 0 of ``inflow`` (J, K), in place (reversed: S_j =
    S_{j+1}·decay_j + inflow_j from the end); ``decay`` (J − 1, K). The risk's running sums over 2n
    nodes: a loop here, where numpy needed a call per node (0.2 s a row at 10^4 databases)."""
    J, K = inflow.shape
    if reverse:
        for j in range(J - 2, -1, -1):
            for c in range(K):
                inflow[j, c] += inflow[j + 1, c] * decay[j, c]
    else:
        for j in range(1, J):
            for c in range(K):
                inflow[j, c] += inflow[j - 1, c] * decay[j - 1, c]
