"""Compiled loops of the density fit and of the exact risk, where numpy needed O(n²) memory or a
call per node (issue 35).

The bandwidth choice needs, for every database j, the log of Σ_k k_{b_k}(q_j − q_k) over the
other databases (the leave-one-out likelihood) or over all of them (the variable-bandwidth
pilot). The n × n matrix of terms made this O(n²) in time and memory; here the values are sorted
once and each sum is built without the matrix:

* one Laplace scale b: exactly, by the two running sums L_j = Σ_{k<j} e^{−(q_j−q_k)/b} =
  e^{−(q_j−q_{j−1})/b} (L_{j−1} + 1) and its mirror image, O(n) after the sort
  (:func:`laplace_sums`);
* one Gaussian scale b: by the moments of boxes one scale wide, visited outward from q_j until
  the terms left out provably add up to below e^{−:data:`TAIL`} of the sum (:func:`gauss_sums`).

Per-point scales b_k (variable bandwidths) have no such form here: :mod:`empdp.density` sums them
in blocks of rows (O(n²) time, bounded memory).

The risk's running sums over the 2n nodes of a row (:func:`running`) loop here too.

This module imports numba, so it is imported only inside the functions that call it (the density
fit, the risk's running sums): ``empdp --help`` and the audits never load it. Each sum has one
implementation here; tests/test_scale.py keeps the matrix form as their reference.

The compiled code is cached in the user's cache folder (``$XDG_CACHE_HOME/empdp/numba``, else
``~/.cache/empdp/numba``; ``$NUMBA_CACHE_DIR`` if set), never beside the installed package: files
written into site-packages outlive ``pip uninstall``, and the folder they leave behind shadowed a
later editable install of empdp as an empty namespace package.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from numba import config as numba_config
from numba import njit


def _cache_folder() -> str:
    """The user's cache folder for empdp's compiled code ('' if it cannot be made: numba's default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(base) / "empdp" / "numba"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ""
    return str(folder) if os.access(folder, os.W_OK) else ""


if not numba_config.CACHE_DIR:  # read when each function below is decorated
    numba_config.CACHE_DIR = _cache_folder()

#: the kernels' codes (:attr:`empdp.kernels.Kernel.code`)
LAPLACE, GAUSSIAN = 0, 1
#: the terms :func:`gauss_sums` leaves out add up to at most 2 e^{−TAIL} ≈ 8.5e-18 of the sum it
#: keeps: below the rounding of the kept sum itself (2^{−53} ≈ 1.1e-16)
TAIL = 40.0
_LOG_SQRT2PI = 0.5 * math.log(2 * math.pi)


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


#: terms of the series of e^{uv} in :func:`gauss_sums` (0 ≤ uv < 1: the rest is below 1/20! ≈ 4e-19 of it)
SERIES = 20


@njit(cache=True)
def gauss_sums(q: np.ndarray, b: float, self_term: bool) -> np.ndarray:
    """log Σ_k φ_b(q_j − q_k) for every j of the sorted ``q`` (k ≠ j unless ``self_term``), in O(n).

    The values fall in boxes one scale wide. For a target x in box A, whose first value is x₀, and
    the values y of box B, whose first value is y₀, with D = (x₀ − y₀)/b, u = (x − x₀)/b and
    v = (y − y₀)/b (both in [0, 1); differences of nearby values are exact) and t = (x − y₀)/b = D + u,
    (t − v)² = t² − 2Dv − 2uv + v², so the box adds

        e^{−t²/2} Σ_m (u^m/m!) Σ_y v^m e^{Dv − v²/2}     (times 1/(b√2π)),

    the series of e^{uv} truncated after :data:`SERIES` terms, every term positive (no cancellation)
    and the rest below 4e-19 of the sum. The moments are computed once a (target box, source box)
    pair, and the boxes are visited outward until the rest (each term below e^{−z²/2}, z the
    nearest distance in scales, at most n of them) provably adds up to below e^−TAIL of every
    target's sum: O(n) per visited box pair, a few dozen pairs at most. A target's own term (1 in its own box, where u = v) is subtracted when ``self_term`` is
    False; with another value in its box (within one scale: a term ≥ e^{−½}) that costs a few units
    of rounding.
    """
    n = len(q)
    # the non-empty boxes: [start[m], start[m + 1]) in the sorted order
    start = np.empty(n + 1, dtype=np.int64)
    boxes = 0
    last = -1.0
    for j in range(n):
        cell = math.floor((q[j] - q[0]) / b)
        if j == 0 or cell != last:
            start[boxes] = j
            boxes += 1
            last = cell
    start[boxes] = n
    ref = np.full(n, -np.inf)
    s = np.zeros(n)
    c = np.zeros(n)
    log_n = math.log(n)
    for a in range(boxes):
        lo, hi = start[a], start[a + 1]
        if self_term or hi - lo > 1:
            _box_pair(q, b, start, a, a, not self_term, ref, s, c)
        for step in (-1, 1):
            other = a + step
            while 0 <= other < boxes:
                near = q[lo] - q[start[other + 1] - 1] if step < 0 else q[start[other]] - q[hi - 1]
                z = near / b
                bar = np.inf
                for j in range(lo, hi):
                    bar = min(bar, ref[j] + math.log(s[j] + c[j]) if s[j] + c[j] > 0 else -np.inf)
                if -0.5 * z * z + log_n < bar - TAIL:  # every term left is below e^{−z²/2}
                    break
                _box_pair(q, b, start, a, other, False, ref, s, c)
                other += step
    out = np.empty(n)
    for j in range(n):
        out[j] = ref[j] + math.log(s[j] + c[j]) - math.log(b) - _LOG_SQRT2PI
    return out


@njit(cache=True)
def _box_pair(q, b, start, a, other, drop_self, ref, s, c) -> None:
    """Add the terms of box ``other``'s values to the sums of box ``a``'s (:func:`gauss_sums`), each
    as e^ref (s + c); ``drop_self``: the own box, less each target's own term."""
    lo, hi = start[a], start[a + 1]
    y0 = q[start[other]]
    D = (q[lo] - y0) / b
    top = -np.inf
    for k in range(start[other], start[other + 1]):
        v = (q[k] - y0) / b
        top = max(top, D * v - 0.5 * v * v)
    moments = np.zeros(SERIES)  # Σ_y v^m e^{Dv − v²/2 − top} / m!
    for k in range(start[other], start[other + 1]):
        v = (q[k] - y0) / b
        w = math.exp(D * v - 0.5 * v * v - top)
        for p in range(SERIES):
            moments[p] += w
            w *= v / (p + 1)
    for j in range(lo, hi):
        t = (q[j] - y0) / b
        u = (q[j] - q[lo]) / b
        series = moments[SERIES - 1]
        for p in range(SERIES - 2, -1, -1):
            series = series * u + moments[p]
        log_value = -0.5 * t * t + top + math.log(series)
        if drop_self:  # the own term is e^0 = 1
            value = math.exp(log_value) - 1.0
            if value <= 0.0:
                continue
            log_value = math.log(value)
        ref[j], s[j], c[j] = _add(log_value, ref[j], s[j], c[j])
