"""Compiled loops of the joint risk's general path (issue 37, item 2): the positive part of the
density difference integrated over the cells a level cuts (docs/method.md#102-joint-queries).

On a cell of the kink grid, in coordinates t measured from the cell's low corner, the integrand is
h(t) = Σ_σ C_σ e^{σ·t} (σ ∈ {±1}^d). ∫ h_+ is exact along axis 0 (α e^t + β e^{−t} has one root at
most) and by Gauss–Legendre along the others, on pieces split where h vanishes on the cell's edges
parallel to the quadrature axis (closed-form roots), so that each piece's integrand is analytic. A
cell where h is a single exponential along the last axis (a tail cell) factorises:
∫ (e^{σt} g)_+ = (g)_+ ∫ e^{σt}. This was the numpy recursion of :mod:`._generic` (one call per
recursion level over every (cell, node) at once, and its temporaries); here each (cell, level) is
one loop, with the same pieces and nodes, so the values agree with it to rounding.

Coefficients are flat: C[i_0 2^{d−1} + … + i_{d−1}], index 0 for σ_k = +1 and 1 for −1.

This module imports numba: it is imported only by the function that integrates cut cells, and
its compiled code is cached in empdp's cache folder (:mod:`empdp.compiled` sets it).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ... import compiled  # noqa: F401  (sets numba's cache folder before the functions below compile)

#: exponents are capped here (e^700 is finite; a larger factor only multiplies terms that vanish)
_CAP = 700.0


@njit(cache=True, nogil=True)
def _pos_1d(alpha: float, beta: float, w: float) -> float:
    """∫_0^w (α e^t + β e^{−t})_+ dt in closed form (one root at most); a root strictly inside gives a
    square (α e^r = −β e^{−r} there), which has no cancellation."""
    lo, hi = 0.0, w if (alpha >= 0.0 and beta >= 0.0) else 0.0
    mixed = (alpha > 0.0 and beta < 0.0) or (alpha < 0.0 and beta > 0.0)  # not the product: it underflows
    rising = mixed and alpha > 0.0
    r = 0.0
    if mixed:
        r = min(max(0.5 * math.log(-beta / alpha), 0.0), w)
        if rising:
            lo, hi = r, w
        else:
            lo, hi = 0.0, r
    span = hi - lo
    if not span > 0.0:
        return 0.0
    if mixed and 0.0 < r < w:
        if rising:
            half = math.exp(min(0.5 * w, 350.0))
            val = (math.sqrt(abs(alpha)) * half - math.sqrt(abs(beta)) / half) ** 2
        else:
            val = (math.sqrt(abs(beta)) - math.sqrt(abs(alpha))) ** 2
    else:
        val = alpha * math.exp(lo) * math.expm1(span) - beta * math.exp(-lo) * math.expm1(-span)
    if not math.isfinite(val):
        return 0.0
    return max(val, 0.0)


@njit(cache=True, nogil=True)
def _edge_root(gamma: float, eta: float, w: float) -> float:
    """Root of γ e^t + η e^{−t} in [0, w] (0 when there is none: a harmless extra breakpoint)."""
    if not ((gamma > 0.0 and eta < 0.0) or (gamma < 0.0 and eta > 0.0)):
        return 0.0
    r = 0.5 * (math.log(abs(eta)) - math.log(abs(gamma)))
    if not math.isfinite(r):
        return 0.0
    return min(max(r, 0.0), w)


@njit(cache=True, nogil=True)
def _at(plus: float, minus: float, up: float, down: float) -> float:
    """plus e^t + minus e^{−t} from e^t, e^{−t} (non-finite values 0)."""
    v = plus * up + minus * down
    return v if math.isfinite(v) else 0.0


@njit(cache=True, nogil=True)
def _pos_2d(c0: float, c1: float, c2: float, c3: float, w0: float, w1: float, x: np.ndarray,
            wts: np.ndarray) -> float:
    """∫_{[0,w0]×[0,w1]} (Σ_σ c_σ e^{σ·t})_+ dt, flat c = (c_{++}, c_{+−}, c_{−+}, c_{−−})."""
    if c0 == 0.0 and c2 == 0.0 or c1 == 0.0 and c3 == 0.0:  # one exponential along axis 1
        weight = -math.expm1(-w1) if (c0 == 0.0 and c2 == 0.0) else math.expm1(min(w1, _CAP))
        return 0.0 if weight == 0.0 else _pos_1d(c0 + c1, c2 + c3, w0) * weight
    far = math.exp(min(w0, _CAP))
    near = math.exp(-w0)
    r1 = _edge_root(c0 + c2, c1 + c3, w1)  # axis 0 at 0
    r2 = _edge_root(c0 * far + c2 * near, c1 * far + c3 * near, w1)  # axis 0 at w0
    lo_r, hi_r = min(r1, r2), max(r1, r2)
    total = 0.0
    for p in range(3):
        a = 0.0 if p == 0 else (lo_r if p == 1 else hi_r)
        b = lo_r if p == 0 else (hi_r if p == 1 else w1)
        if not b > a:
            continue
        for q in range(x.shape[0]):
            wt = 0.5 * (b - a) * wts[q]
            if wt == 0.0:
                continue
            t = a + (b - a) * (x[q] + 1.0) * 0.5
            up, down = math.exp(min(t, _CAP)), math.exp(-t)
            total += wt * _pos_1d(_at(c0, c1, up, down), _at(c2, c3, up, down), w0)
    return total


@njit(cache=True, nogil=True)
def _pos_3d(c: np.ndarray, w: np.ndarray, x: np.ndarray, wts: np.ndarray, bps: np.ndarray) -> float:
    """∫_{[0,w]} (Σ_σ c_σ e^{σ·t})_+ dt for d = 3 (flat c of 8; ``bps`` scratch of 6)."""
    pure_minus = c[0] == 0.0 and c[2] == 0.0 and c[4] == 0.0 and c[6] == 0.0
    pure_plus = c[1] == 0.0 and c[3] == 0.0 and c[5] == 0.0 and c[7] == 0.0
    wl = w[2]
    if pure_minus or pure_plus:
        weight = -math.expm1(-wl) if pure_minus else math.expm1(min(wl, _CAP))
        if weight == 0.0:
            return 0.0
        return _pos_2d(c[0] + c[1], c[2] + c[3], c[4] + c[5], c[6] + c[7], w[0], w[1], x, wts) * weight
    # h on the edges parallel to axis 2, at the four corners of axes 0 and 1
    f0 = (1.0, math.exp(min(w[0], _CAP)))
    g0 = (1.0, math.exp(-w[0]))
    f1 = (1.0, math.exp(min(w[1], _CAP)))
    g1 = (1.0, math.exp(-w[1]))
    bps[0], bps[5] = 0.0, wl
    for corner in range(4):
        e0, e1 = corner >> 1, corner & 1
        k00, k01, k10, k11 = f0[e0] * f1[e1], f0[e0] * g1[e1], g0[e0] * f1[e1], g0[e0] * g1[e1]
        gamma = c[0] * k00 + c[2] * k01 + c[4] * k10 + c[6] * k11
        eta = c[1] * k00 + c[3] * k01 + c[5] * k10 + c[7] * k11
        bps[corner + 1] = _edge_root(gamma, eta, wl)
    bps.sort()
    total = 0.0
    for p in range(5):
        a, b = bps[p], bps[p + 1]
        if not b > a:
            continue
        for q in range(x.shape[0]):
            wt = 0.5 * (b - a) * wts[q]
            if wt == 0.0:
                continue
            t = a + (b - a) * (x[q] + 1.0) * 0.5
            up, down = math.exp(min(t, _CAP)), math.exp(-t)
            total += wt * _pos_2d(_at(c[0], c[1], up, down), _at(c[2], c[3], up, down),
                                  _at(c[4], c[5], up, down), _at(c[6], c[7], up, down), w[0], w[1], x, wts)
    return total


@njit(cache=True, nogil=True)
def cut_integrals(CA: np.ndarray, CB: np.ndarray, sA: np.ndarray, sB: np.ndarray, width: np.ndarray,
                  cell: np.ndarray, level: np.ndarray, side: np.ndarray, x: np.ndarray,
                  wts: np.ndarray) -> np.ndarray:
    """∫_cell (p − e^ε p_i)_+ (``side`` 0) or (p_i − e^ε p)_+ (1) for each (cell, level) item, d = 2 or 3.

    p = e^{sA} Σ_σ CA_σ e^{σ·t} and p_i = e^{sB} Σ_σ CB_σ e^{σ·t} on each cell (CA, CB (U, 2^d), the log
    scales sA, sB (U,)); width (U, d); per item its cell (index into U), ε and side. The factor
    e^{ε + s_other − s_own} is applied to the smaller side (the other divided by it when it exceeds 1)
    and the result scaled back in log space, so ε beyond 709 does not overflow. Runs without the GIL
    (the exact rows run in threads).
    """
    out = np.empty(cell.shape[0])
    c = np.empty(CA.shape[1])
    bps = np.empty(6)
    for k in range(cell.shape[0]):
        u = cell[k]
        own, other = (CA, CB) if side[k] == 0 else (CB, CA)
        s_own, s_other = (sA[u], sB[u]) if side[k] == 0 else (sB[u], sA[u])
        lg = level[k] + s_other - s_own
        if lg <= 0.0:  # h = e^{s_own} (own − e^{lg} other)
            g, scale = math.exp(lg), s_own
            for i in range(c.shape[0]):
                c[i] = own[u, i] - g * other[u, i]
        else:  # h = e^{s_own + lg} (e^{−lg} own − other)
            g, scale = math.exp(-lg), s_own + lg
            for i in range(c.shape[0]):
                c[i] = g * own[u, i] - other[u, i]
        if c.shape[0] == 4:
            v = _pos_2d(c[0], c[1], c[2], c[3], width[u, 0], width[u, 1], x, wts)
        else:
            v = _pos_3d(c, width[u], x, wts, bps)
        out[k] = math.exp(math.log(v) + scale) if v > 0.0 else 0.0
    return out
