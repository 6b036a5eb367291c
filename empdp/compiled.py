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
fit, the risk's running sums, and :mod:`empdp.audit.compiled` for the cache folder below): ``empdp
--help`` never loads it, and the audits only once a compiled sampler draws (Sparse Vector, Report
Noisy Max), a vector output is binned or an event of integer vectors is counted. Each sum has one
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


def warm() -> None:
    """Load the default model's compiled functions, on tiny inputs of the types the assessment gives
    them: the first call of a compiled function in a process costs ~0.9 s (LLVM's start and the
    cache's load), which :func:`empdp.assessment.checks.preload` pays in a background thread while
    DuckDB opens and reads the table."""
    q = np.array([0.0, 1.0])
    laplace_sums(q, 1.0, False)
    onescale_rows(q, 1.0, q, np.zeros((1, 2)), np.array([0.5]), True, 700.0)


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


@njit(cache=True, nogil=True)
def onescale_rows(q: np.ndarray, b: float, points: np.ndarray, shifts: np.ndarray, eps: np.ndarray,
                  want_delta: bool, cap: float):
    """ε_i and δ_i(ε) of each row of ``shifts`` (C, n) under one Laplace scale ``b``, row by row
    (:mod:`empdp.risk.onescale` states the closed form); ``q`` the sorted ``points``, ``eps`` ascending,
    ``cap`` the clip of L (:data:`empdp.risk.laplace.L_CAP`). Returns (ε_i (C,), δ (C, len(eps)); with
    ``want_delta`` False, δ is (C, 0)).

    One row's merged nodes, running sums and binned levels live in a few arrays of 2n reused for every
    row: the (rows × nodes) temporaries of numpy's form (two dozen of them, ~300 µs a row at n = 100)
    are gone, and each row costs a sort of its n kinks and O(n + cuts) more.
    """
    C, n = shifts.shape
    E = len(eps) if want_delta else 0
    J = 2 * n
    eps_i = np.zeros(C)
    delta = np.zeros((C, E))
    x = np.empty(J)
    own = np.empty(J, dtype=np.bool_)
    f = np.empty(J - 1)
    Ap, Aq, Bp, Bq = np.empty(J), np.empty(J), np.empty(J), np.empty(J)
    vp, vq, ratio = np.empty(J), np.empty(J), np.empty(J)
    cnt_p, cnt_m = np.empty(J, dtype=np.int64), np.empty(J, dtype=np.int64)
    bins_p, bins_q = np.empty(E + 1), np.empty(E + 1)
    cuts, plus, minus = np.empty(E), np.empty(E), np.empty(E)
    growth, above, below = np.empty(E), np.empty(E), np.empty(E)
    # the levels' bands e^{ε ± RATIO_BAND} (see _node_levels); levels near the clip of L take logs
    by_ratio = E == 0 or eps[E - 1] < RATIO_LEVELS
    for e in range(E):
        growth[e] = math.exp(min(eps[e], cap))
        if by_ratio:
            above[e], below[e] = math.exp(eps[e] + RATIO_BAND), math.exp(eps[e] - RATIO_BAND)
    table = np.zeros(16 * E + 1, dtype=np.int64)  # (sixteen entries a level: a step at most, mostly)
    inv = _band_table(above, table) if by_ratio and E > 0 else 0.0
    kinks = np.empty(n)
    w = 0.5 / n
    by_point = np.argsort(points)  # a row's kinks q_j − Δ_ij in this order are nearly sorted already
    for r in range(C):
        for j in range(n):
            kinks[j] = points[by_point[j]] - shifts[r, by_point[j]]
        _insertion_sort(kinks)
        _merge(q, kinks, x, own)
        for k in range(J - 1):
            f[k] = math.exp((x[k + 1] - x[k]) * (-1.0 / b))
        _running_pair(f, own, Ap, Aq, Bp, Bq)
        for j in range(J):
            inp = 0.0 if own[j] else 1.0
            vp[j] = Ap[j] + Bp[j] - inp
            vq[j] = Aq[j] + Bq[j] - (1.0 - inp)
        top = _node_levels(vp, vq, ratio, eps, above, below, table, inv, by_ratio, cap, cnt_p, cnt_m, E > 0)
        eps_i[r] = top
        if E == 0:
            continue
        # {L > ε} with p̂ over p̂_i, then {L < −ε} with the roles swapped
        _direction_row(cnt_p, Ap, Aq, Bp, Bq, f, growth, bins_p, bins_q, cuts, plus)
        _direction_row(cnt_m, Aq, Ap, Bq, Bp, f, growth, bins_p, bins_q, cuts, minus)
        for e in range(E):
            # δ_i(ε) = 0 from ε_i on (exactly: no interval has L beyond ±ε)
            d = max(plus[e], minus[e]) * w if top > eps[e] else 0.0
            delta[r, e] = min(max(d, 0.0), 1.0)
    return eps_i, delta


#: the log-ratio L = log v_p − log v_q at a node is compared with the levels through the ratio
#: v_p / v_q against the bands e^{ε ± RATIO_BAND}: computed, L is within 4e-13 of log(v_p / v_q)
#: (|log v| ≤ 745 each, to 1.1e-16 relative), far inside the band, so a ratio outside every band
#: gives the level count L itself gives; a ratio inside one takes the logs
RATIO_BAND = 1e-10
#: ratios within [RATIO_MIN, RATIO_MAX] (|log| ≤ ~645, away from the clip of L at 700 and from
#: underflow); levels ≥ RATIO_LEVELS compare L itself (their bands would overflow)
RATIO_MIN, RATIO_MAX, RATIO_LEVELS = 1e-280, 1e280, 600.0


@njit(cache=True, nogil=True)
def _node_levels(vp, vq, ratio, eps, above, below, table, inv, by_ratio, cap, cnt_p, cnt_m, counts) -> float:
    """ε_i = max_j |L_j| of one row, L_j = log v_p − log v_q clipped to ±``cap``; with ``counts``, the
    levels of the ascending ``eps`` below L_j (``cnt_p``) and below −L_j (``cnt_m``) at each node.

    Two logs a node were about a third of an ε_i-only row's time (10 against 6 µs at 100
    databases); the ratio v_p / v_q decides both the counts and which nodes can hold the largest
    |L| (:data:`RATIO_BAND`), and the logs are taken only there and at nodes whose ratio is in a
    level's band: ε_i and the counts are those of L itself, to the bit.
    ``ratio`` holds −1 at nodes outside :data:`RATIO_MIN`–:data:`RATIO_MAX` (L taken exactly there).
    """
    J = len(vp)
    top, r_max, r_min = 0.0, 0.0, math.inf
    up_p = up_m = 0
    for j in range(J):
        a, c = vp[j], vq[j]
        rj = a / c if a > 0.0 and c > 0.0 else -1.0
        if not RATIO_MIN <= rj <= RATIO_MAX:
            ratio[j] = -1.0
            L = _clipped_log_ratio(a, c, cap)
            top = max(top, abs(L))
            if counts:
                cnt_p[j], cnt_m[j] = _level_count(eps, L), _level_count(eps, -L)
            continue
        ratio[j] = rj
        r_max, r_min = max(r_max, rj), min(r_min, rj)
        if not counts:
            continue
        if by_ratio:
            up_p = _band_count(above, below, table, inv, rj)
            up_m = _band_count(above, below, table, inv, c / a)
        if not by_ratio or up_p < 0 or up_m < 0:  # in a band: L itself decides
            L = _clipped_log_ratio(a, c, cap)
            cnt_p[j], cnt_m[j] = _level_count(eps, L), _level_count(eps, -L)
        else:
            cnt_p[j], cnt_m[j] = up_p, up_m
    # the largest |L| among the other nodes is at a ratio within 4e-13 of the extremes: logs there only
    hi, lo = r_max * (1.0 - 1e-9), r_min * (1.0 + 1e-9)
    for j in range(J):
        if ratio[j] >= hi or 0.0 <= ratio[j] <= lo:
            top = max(top, abs(_clipped_log_ratio(vp[j], vq[j], cap)))
    return top


@njit(cache=True, nogil=True)
def _band_table(above, table) -> float:
    """Fill ``table`` (K + 1 entries) with lower bounds of the number of ``above`` (ascending) below
    the values a K-step grid from above[0] to above[−1] gives, for :func:`_band_count`; returns the
    grid's inverse step (0: a single value). Entry k counts below the grid's value k − 1/2, so it
    never exceeds the count at any value whose computed index is k (the index's rounding is below
    1e-12 of a step)."""
    K = len(table) - 1
    width = (above[len(above) - 1] - above[0]) / K
    inv = 1.0 / width if width > 0.0 else 0.0
    for k in range(K + 1):
        table[k] = _level_count(above, above[0] + (k - 0.5) * width)
    return inv


@njit(cache=True, nogil=True)
def _band_count(above, below, table, inv: float, v: float) -> int:
    """The number of levels whose upper band edge ``above`` is below ``v`` (both ascending); −1 when
    ``v`` is inside a level's band [below, above] (then only the log decides).

    The count starts from ``table``'s lower bound (:func:`_band_table`) and steps up to the exact
    count, usually by none or one: ~5 ns against ~20 ns for a binary search, whose steps the
    processor mispredicts. A count the table left short is still exact: the band test sends it
    to the logs."""
    E = len(above)
    c = table[int(min(max((v - above[0]) * inv, 0.0), len(table) - 1.0))]
    while c < E and above[c] < v:
        c += 1
    if c < E and v >= below[c]:
        return -1
    return c


@njit(cache=True, nogil=True)
def _insertion_sort(a) -> None:
    """Sort ``a`` in place in O(len(a) + inversions): a row's kinks, given in the order of their points,
    are out of order only where shifts exceed the points' spacing (numba's quicksort cost ~4 times
    more on them)."""
    for j in range(1, len(a)):
        v = a[j]
        k = j - 1
        while k >= 0 and a[k] > v:
            a[k + 1] = a[k]
            k -= 1
        a[k + 1] = v


@njit(cache=True, nogil=True)
def _merge(q, kinks, x, own) -> None:
    """The sorted centres ``q`` and ``kinks`` merged into ``x`` (a centre before a kink at a tie);
    ``own`` marks the kinks."""
    n = len(q)
    a = c = 0
    for j in range(2 * n):
        if c >= n or (a < n and q[a] <= kinks[c]):
            x[j], own[j] = q[a], False
            a += 1
        else:
            x[j], own[j] = kinks[c], True
            c += 1


@njit(cache=True, nogil=True)
def _running_pair(f, own, Ap, Aq, Bp, Bq) -> None:
    """Running sums of the centres' terms (p̂: not ``own``; p̂_i: ``own``) from the left (A) and the
    right (B) of each node, the node's own term included: A_j = A_{j−1} f_{j−1} + [centre at j]."""
    J = len(own)
    Ap[0], Aq[0] = (0.0, 1.0) if own[0] else (1.0, 0.0)
    for j in range(1, J):
        ip = 0.0 if own[j] else 1.0
        Ap[j] = Ap[j - 1] * f[j - 1] + ip
        Aq[j] = Aq[j - 1] * f[j - 1] + (1.0 - ip)
    Bp[J - 1], Bq[J - 1] = (0.0, 1.0) if own[J - 1] else (1.0, 0.0)
    for j in range(J - 2, -1, -1):
        ip = 0.0 if own[j] else 1.0
        Bp[j] = Bp[j + 1] * f[j] + ip
        Bq[j] = Bq[j + 1] * f[j] + (1.0 - ip)


@njit(cache=True, nogil=True)
def _clipped_log_ratio(vp: float, vq: float, cap: float) -> float:
    """log vp − log vq clipped to ±cap (a zero density: ±cap; both zero: 0)."""
    if vp > 0.0 and vq > 0.0:
        return min(max(math.log(vp) - math.log(vq), -cap), cap)
    if vp > 0.0:
        return cap
    if vq > 0.0:
        return -cap
    return 0.0


@njit(cache=True, nogil=True)
def _level_count(eps, v: float) -> int:
    """The number of levels of the ascending ``eps`` strictly below ``v``."""
    lo, hi = 0, len(eps)
    while lo < hi:
        mid = (lo + hi) // 2
        if eps[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True)
def _direction_row(cnt, Ap, Aq, Bp, Bq, f, growth, bins_p, bins_q, cuts, out) -> None:
    """∫ (p − e^ε q)_+ / (w b) at each ε into ``out``, for one row whose nodes have ``cnt`` levels
    below log p − log q; A, B the running sums of p (Ap, Bp) and q (Aq, Bq). Whole intervals and the
    two flat tails are binned by their first level outside and summed from the top; the intervals a
    level cuts add the closed-form integral on one side of the root (:func:`_cut_integral`), level by
    level."""
    J = len(cnt)
    E = len(growth)
    bins_p[:] = 0.0
    bins_q[:] = 0.0
    cuts[:] = 0.0
    for k in range(J - 1):
        one_f = 1.0 - f[k]
        lo = min(cnt[k], cnt[k + 1])
        bins_p[lo] += (Ap[k] + Bp[k + 1]) * one_f
        bins_q[lo] += (Aq[k] + Bq[k + 1]) * one_f
    bins_p[cnt[0]] += Bp[0]
    bins_q[cnt[0]] += Bq[0]
    bins_p[cnt[J - 1]] += Ap[J - 1]
    bins_q[cnt[J - 1]] += Aq[J - 1]
    for k in range(J - 1):
        lo, hi = min(cnt[k], cnt[k + 1]), max(cnt[k], cnt[k + 1])
        for e in range(lo, hi):
            g = growth[e]
            cuts[e] += _cut_integral(Ap[k] - g * Aq[k], Bp[k + 1] - g * Bq[k + 1], f[k])
    sp = sq = 0.0
    for e in range(E - 1, -1, -1):
        sp += bins_p[e + 1]
        sq += bins_q[e + 1]
        out[e] = (sp - growth[e] * sq) + cuts[e]


@njit(cache=True, nogil=True)
def _cut_integral(alpha: float, beta: float, f: float) -> float:
    """∫_0^h (α e^{−t/b} + β e^{−(h−t)/b})_+ dt / b with f = e^{−h/b}: exact.

    The integrand changes sign at most once. Where it does inside the interval (its values at the
    ends, α + β f and α f + β, differ in sign) the positive side is, with P the positive and N the
    negative one of α and β, (√P − √(−f N))²: a square with no cancellation between large terms
    (as the whole interval's (α + β)(1 − f) minus the negative side it lost e^ε × 1e-16 when e^ε q̂
    made both huge: 1.8e-4 of δ_i at ε = 27 for a kernel shifted 30 scales). Otherwise the
    integrand keeps one sign: the whole interval or nothing.
    """
    start, end = alpha + beta * f, alpha * f + beta
    if (start > 0) == (end > 0):
        return (alpha + beta) * (1.0 - f) if start > 0 else 0.0
    other = -(min(alpha, beta) * f)
    total = max(alpha, beta) + other
    return total - 2.0 * math.sqrt(other * (total - other))
