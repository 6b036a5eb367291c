"""Compiled loops of the joint risk (issue 37, items 2 and 5): the positive part of the density
difference integrated over the cells a level cuts, on the general path's grid (d = 2 and 3, below)
and on the d = 2 matrix form's (:func:`cut_cells_2d`, for :mod:`._cutcell`)
(docs/method.md#102-joint-queries).

On a cell of the kink grid, in coordinates t measured from the cell's low corner, the integrand is
h(t) = Σ_σ C_σ e^{σ·t} (σ ∈ {±1}^d). ∫ h_+ is exact along axis 0 (α e^t + β e^{−t} has one root at
most) and by Gauss–Legendre along the others, on pieces split where h vanishes on the cell's edges
parallel to the quadrature axis (closed-form roots), so that each piece's integrand is analytic. A
cell where h is a single exponential along the last axis (a tail cell) factorises:
∫ (e^{σt} g)_+ = (g)_+ ∫ e^{σt}. Between those edge roots the root along axis 0 either stays
inside the cell or stays out of it, so a piece where it stays out is integrated in closed form (h
keeps one sign there), without nodes: about half of the pieces on the county sample's rows.

Where the root stays inside, the integrand along axis 1 is singular at the zeros of α and β, and
the integral over axes 0 and 1 as a function of t2 is singular where they vanish together (a fold of
the level set: a whole line along axis 0 on it, two bilinear equations in e^{2t1}, e^{2t2}) and where
the edge roots' coefficients vanish, all in closed form. Axis 2 is also split at the real folds. A
piece gets one rule where its nearest singular point lies :data:`SAFE` piece lengths away or more;
otherwise it is halved until two rules agree within a tolerance relative to the cell's
∫ Σ_σ |C_σ| e^{σ·t}, as the d = 2 cells are (issue 37: one rule a piece erred by up to 7e−5
relative on the county sample's rows, 6.7e−6 on random cells, where a fold or a zero lay inside or
beside a piece). Each cell is integrated at every level it cuts in one pass (:func:`cut_cells`),
adding to each level's sum in ascending cell order. The cells' coefficients are formed here too
(:func:`cell_coefficients`), one exponential per point and cell.

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
#: a piece whose nearest real singular point lies at least this many piece lengths away gets one rule
#: (Bernstein ellipse ρ ≥ 3 + √8 ≈ 5.8: 6 nodes err by at most about ρ^{−12} ≈ 6e−10 of the piece; on the
#: county sample's rows the δ_i agree with 16 nodes a piece to 1e−11 relative, and 3 piece lengths,
#: ρ ≥ 13.9, cost 1.6× as much); closer, it is halved until two rules agree
SAFE = 1.0


@njit(cache=True, nogil=True)
def _axis0(w: float) -> tuple:
    """The factors of axis 0's width that every closed form on a cell uses: (e^w, e^{−w}, e^{w/2},
    e^w − 1, e^{−w} − 1), computed once per cell instead of at every quadrature node."""
    return (math.exp(min(w, _CAP)), math.exp(-w), math.exp(min(0.5 * w, 350.0)), math.expm1(min(w, _CAP)),
            math.expm1(-w))


@njit(cache=True, nogil=True)
def _pos_1d(alpha: float, beta: float, f: tuple) -> float:
    """∫_0^w (α e^t + β e^{−t})_+ dt in closed form (one root at most), ``f`` = :func:`_axis0` (w).

    With opposite signs the root r has e^{2r} = −β/α: it lies inside (0, w) when that ratio lies in
    (1, e^{2w}), and then the positive side is a square (α e^r = −β e^{−r} there), with no
    cancellation; otherwise the integrand keeps one sign and the integral is α (e^w − 1) − β (e^{−w} − 1)
    or 0. Comparing the ratio replaces the logarithm of the root (the same cases up to rounding at
    their common boundary, where the formulas agree).
    """
    far, _, half, grow, shrink = f
    mixed = (alpha > 0.0 and beta < 0.0) or (alpha < 0.0 and beta > 0.0)  # not the product: it underflows
    if not mixed:
        positive = alpha >= 0.0 and beta >= 0.0
        val = alpha * grow - beta * shrink if positive else 0.0
    else:
        ratio = -beta / alpha
        rising = alpha > 0.0
        if ratio > 1.0 and ratio < far * far:
            if rising:
                val = (math.sqrt(abs(alpha)) * half - math.sqrt(abs(beta)) / half) ** 2
            else:
                val = (math.sqrt(abs(beta)) - math.sqrt(abs(alpha))) ** 2
        elif (ratio <= 1.0) == rising:  # the root at or left of 0 and rising, or at or beyond w and falling
            val = alpha * grow - beta * shrink
        else:
            val = 0.0
    if not math.isfinite(val):
        return 0.0
    return max(val, 0.0)


@njit(cache=True, nogil=True)
def _edge_root(gamma: float, eta: float, w: float) -> float:
    """Root of γ e^t + η e^{−t} in [0, w] (0 when there is none: a harmless extra breakpoint)."""
    if not ((gamma > 0.0 and eta < 0.0) or (gamma < 0.0 and eta > 0.0)):
        return 0.0
    ratio = eta / gamma
    # one logarithm of the ratio, or two where the ratio of far-apart terms overflows or underflows
    r = 0.5 * math.log(-ratio) if 1e-300 < -ratio < 1e300 else 0.5 * (math.log(abs(eta)) - math.log(abs(gamma)))
    if not math.isfinite(r):
        return 0.0
    return min(max(r, 0.0), w)


@njit(cache=True, nogil=True)
def _exps(t: float) -> tuple:
    """(e^t, e^{−t}) by one exponential where e^t is finite and not capped."""
    if t < _CAP:
        up = math.exp(t)
        return up, 1.0 / up
    return math.exp(_CAP), math.exp(-t)


@njit(cache=True, nogil=True)
def _node(a: float, b: float, x: np.ndarray, wts: np.ndarray, q: int) -> tuple:
    """Node ``q`` of the Gauss–Legendre rule (x, wts) on [a, b]: (weight, e^t, e^{−t}) at its t."""
    t = a + (b - a) * (x[q] + 1.0) * 0.5
    up, down = _exps(t)
    return 0.5 * (b - a) * wts[q], up, down


@njit(cache=True, nogil=True)
def _at(plus: float, minus: float, up: float, down: float) -> float:
    """plus e^t + minus e^{−t} from e^t, e^{−t} (non-finite values 0)."""
    v = plus * up + minus * down
    return v if math.isfinite(v) else 0.0


@njit(cache=True, nogil=True)
def _zero(plus: float, minus: float) -> float:
    """The real t where plus e^t + minus e^{−t} vanishes (NaN if none): a singular point of a piece's
    integrand (its other zeros lie π/2 off the real axis)."""
    if not ((plus > 0.0 and minus < 0.0) or (plus < 0.0 and minus > 0.0)):
        return np.nan
    return 0.5 * (math.log(abs(minus)) - math.log(abs(plus)))


@njit(cache=True, nogil=True)
def _gap(re: float, im: float, a: float, b: float) -> float:
    """Distance from the point re + i im to the segment [a, b] (∞ for a NaN point)."""
    if not math.isfinite(re):
        return np.inf
    return math.hypot(max(a - re, re - b, 0.0), im)


@njit(cache=True, nogil=True)
def _inner_rule(c0: float, c1: float, c2: float, c3: float, a: float, b: float, f: tuple, x: np.ndarray,
                wts: np.ndarray) -> float:
    """One Gauss–Legendre rule on [a, b] of the exact integral along axis 0 (see :func:`_piece`)."""
    total = 0.0
    for q in range(x.shape[0]):
        wt, up, down = _node(a, b, x, wts, q)
        if wt == 0.0:
            continue
        total += wt * _pos_1d(_at(c0, c1, up, down), _at(c2, c3, up, down), f)
    return total


@njit(cache=True, nogil=True)
def _accept(whole: float, halves: float, a: float, b: float, tol: float, stack: np.ndarray, top: int) -> bool:
    """Whether a halved piece [a, b] is done: its two halves agree with the whole within ``tol`` per
    unit length, or the piece is too short or the stack too deep to halve again."""
    return (abs(halves - whole) <= tol * (b - a) or top + 2 > stack.shape[0]
            or b - a <= 1e-12 * max(1.0, abs(a)))


@njit(cache=True, nogil=True)
def _inner_adaptive(c0: float, c1: float, c2: float, c3: float, a: float, b: float, f: tuple,
                    x: np.ndarray, wts: np.ndarray, tol: float, stack: np.ndarray) -> float:
    """:func:`_inner_rule` on [a, b], pieces halved until two rules agree within ``tol`` per unit
    length (depth first, ``stack`` scratch (S, 3))."""
    total = 0.0
    stack[0, 0], stack[0, 1], stack[0, 2] = a, b, _inner_rule(c0, c1, c2, c3, a, b, f, x, wts)
    top = 1
    while top:
        top -= 1
        lo, hi, whole = stack[top, 0], stack[top, 1], stack[top, 2]
        mid = 0.5 * (lo + hi)
        left = _inner_rule(c0, c1, c2, c3, lo, mid, f, x, wts)
        right = _inner_rule(c0, c1, c2, c3, mid, hi, f, x, wts)
        if _accept(whole, left + right, lo, hi, tol, stack, top):
            total += left + right
            continue
        stack[top, 0], stack[top, 1], stack[top, 2] = mid, hi, right
        stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = lo, mid, left
        top += 2
    return total


@njit(cache=True, nogil=True)
def _piece(c0: float, c1: float, c2: float, c3: float, a: float, b: float, f: tuple, x: np.ndarray,
           wts: np.ndarray, tol: float, stack: np.ndarray) -> float:
    """∫_{t1=a}^{b} ∫_0^{w0} (h)_+ for h = (c0 e^{t1} + c1 e^{−t1}) e^{t0} + (c2 e^{t1} + c3 e^{−t1}) e^{−t0},
    on a piece [a, b] where the root along axis 0 does not cross the cell's edges t0 = 0, w0.

    So either the root lies inside (0, w0) all along the piece: Gauss–Legendre on the exact integral
    along axis 0, whose only singular points are the zeros of α = c0 e^{t1} + c1 e^{−t1} and
    β = c2 e^{t1} + c3 e^{−t1} (real, or π/2 off the axis): one rule where the nearest real one is at
    least :data:`SAFE` piece lengths away, else halved until two rules agree within ``tol`` per unit
    length; or nowhere on it: h keeps its sign at every t1 of the piece, and the integral is 0
    or that of h, a sum of exponentials, in closed form (the same value as the rule's to ~1e−13 of it,
    without its nodes). The case is read at the piece's midpoint.
    """
    far, half = f[0], f[2]
    tm = 0.5 * (a + b)
    up, down = _exps(tm)
    alpha, beta = _at(c0, c1, up, down), _at(c2, c3, up, down)
    mixed = (alpha > 0.0 and beta < 0.0) or (alpha < 0.0 and beta > 0.0)
    if not (mixed and -beta / alpha > 1.0 and -beta / alpha < far * far):
        if not alpha * half + beta / half > 0.0:  # h at t0 = w0/2: its sign on the whole piece
            return 0.0
        rise = math.exp(min(a, _CAP)) * math.expm1(min(b - a, _CAP))  # ∫_a^b e^{t1}
        fall = math.exp(-a) * -math.expm1(a - b)  # ∫_a^b e^{−t1}
        val = f[3] * (c0 * rise + c1 * fall) - f[4] * (c2 * rise + c3 * fall)
        if math.isfinite(val):
            return max(val, 0.0)
    near = min(_gap(_zero(c0, c1), 0.0, a, b), _gap(_zero(c2, c3), 0.0, a, b))
    if near >= SAFE * (b - a):
        return _inner_rule(c0, c1, c2, c3, a, b, f, x, wts)
    return _inner_adaptive(c0, c1, c2, c3, a, b, f, x, wts, tol, stack)


@njit(cache=True, nogil=True)
def _pos_2d(c0: float, c1: float, c2: float, c3: float, f: tuple, w1: float, x: np.ndarray,
            wts: np.ndarray, tol: float, stack: np.ndarray) -> float:
    """∫_{[0,w0]×[0,w1]} (Σ_σ c_σ e^{σ·t})_+ dt, flat c = (c_{++}, c_{+−}, c_{−+}, c_{−−}); ``f`` =
    :func:`_axis0` (w0); ``tol`` per unit length of axis 1 (:func:`_piece`)."""
    if c0 == 0.0 and c2 == 0.0 or c1 == 0.0 and c3 == 0.0:  # one exponential along axis 1
        weight = -math.expm1(-w1) if (c0 == 0.0 and c2 == 0.0) else math.expm1(min(w1, _CAP))
        return 0.0 if weight == 0.0 else _pos_1d(c0 + c1, c2 + c3, f) * weight
    far, near = f[0], f[1]
    r1 = _edge_root(c0 + c2, c1 + c3, w1)  # axis 0 at 0
    r2 = _edge_root(c0 * far + c2 * near, c1 * far + c3 * near, w1)  # axis 0 at w0
    lo_r, hi_r = min(r1, r2), max(r1, r2)
    total = 0.0
    for p in range(3):
        a = 0.0 if p == 0 else (lo_r if p == 1 else hi_r)
        b = lo_r if p == 0 else (hi_r if p == 1 else w1)
        if b > a:
            total += _piece(c0, c1, c2, c3, a, b, f, x, wts, tol, stack)
    return total


@njit(cache=True, nogil=True)
def _outer_rule(c: np.ndarray, a: float, b: float, f: tuple, w1: float, x: np.ndarray, wts: np.ndarray,
                tol: float, stack: np.ndarray) -> float:
    """One Gauss–Legendre rule on [a, b] along axis 2 of the integral over axes 0 and 1 (d = 3)."""
    total = 0.0
    for q in range(x.shape[0]):
        wt, up, down = _node(a, b, x, wts, q)
        if wt == 0.0:
            continue
        total += wt * _pos_2d(_at(c[0], c[1], up, down), _at(c[2], c[3], up, down),
                              _at(c[4], c[5], up, down), _at(c[6], c[7], up, down), f, w1, x, wts, tol, stack)
    return total


@njit(cache=True, nogil=True)
def _outer_adaptive(c: np.ndarray, a: float, b: float, f: tuple, w1: float, x: np.ndarray, wts: np.ndarray,
                    tol: float, tol_inner: float, stack: np.ndarray, inner: np.ndarray) -> float:
    """:func:`_outer_rule` on [a, b], pieces halved until two rules agree within ``tol`` per unit
    length (depth first, as :func:`_inner_adaptive`)."""
    total = 0.0
    stack[0, 0], stack[0, 1], stack[0, 2] = a, b, _outer_rule(c, a, b, f, w1, x, wts, tol_inner, inner)
    top = 1
    while top:
        top -= 1
        lo, hi, whole = stack[top, 0], stack[top, 1], stack[top, 2]
        mid = 0.5 * (lo + hi)
        left = _outer_rule(c, lo, mid, f, w1, x, wts, tol_inner, inner)
        right = _outer_rule(c, mid, hi, f, w1, x, wts, tol_inner, inner)
        if _accept(whole, left + right, lo, hi, tol, stack, top):
            total += left + right
            continue
        stack[top, 0], stack[top, 1], stack[top, 2] = mid, hi, right
        stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = lo, mid, left
        top += 2
    return total


@njit(cache=True, nogil=True)
def _folds(c: np.ndarray, w1: float, w2: float, sre: np.ndarray, sim: np.ndarray, ns: int,
           bps: np.ndarray, nb: int) -> tuple:
    """The t2 where α and β (the coefficients of e^{±t0}) vanish together at some t1: there the level
    set holds a whole line along axis 0 and its projection folds, a singular point of the integral over
    axes 0 and 1. With U = e^{2t1}, V = e^{2t2}, α = β = 0 is two bilinear equations in (U, V), so V
    solves a quadratic. Each root (complex ones too) is added to the singular points (sre, sim);
    real ones with t1 in (0, w1) and t2 in (0, w2) to the breakpoints ``bps``. Returns (ns, nb)."""
    qa = c[6] * c[0] - c[2] * c[4]
    qb = c[6] * c[1] + c[7] * c[0] - c[2] * c[5] - c[3] * c[4]
    qc = c[7] * c[1] - c[3] * c[5]
    disc = qb * qb - 4.0 * qa * qc
    if qa == 0.0 or not math.isfinite(disc):
        return ns, nb
    if disc < 0.0:  # V = (−qb ± i √−disc) / 2qa: t2 = ½ (log |V| + i arg V)
        re, im = -qb / (2.0 * qa), math.sqrt(-disc) / (2.0 * abs(qa))
        sre[ns], sim[ns] = 0.5 * math.log(math.hypot(re, im)), 0.5 * abs(math.atan2(im, re))
        return ns + 1, nb
    s = -0.5 * (qb + math.copysign(math.sqrt(disc), qb))
    for V in (s / qa, qc / s if s != 0.0 else np.nan):
        if not V > 0.0:
            continue
        t2 = 0.5 * math.log(V)
        sre[ns], sim[ns] = t2, 0.0
        ns += 1
        d1, d2 = c[0] * V + c[1], c[4] * V + c[5]
        if d1 == 0.0 and d2 == 0.0:
            continue
        U = -(c[2] * V + c[3]) / d1 if abs(d1) >= abs(d2) else -(c[6] * V + c[7]) / d2
        if U > 0.0 and 0.0 < 0.5 * math.log(U) < w1 and 0.0 < t2 < w2:
            bps[nb] = t2
            nb += 1
    return ns, nb


@njit(cache=True, nogil=True)
def _outer_singular(c: np.ndarray, f: tuple, w1: float, sre: np.ndarray, sim: np.ndarray) -> int:
    """Real singular points along axis 2 besides the folds: the zeros in t2 of the coefficients the
    pieces' breakpoints along axis 1 come from (h on the faces t0 = 0, w0) and of α, β on the edges
    t1 = 0, w1. Returns their count in (sre, sim)."""
    e1, g1 = math.exp(min(w1, _CAP)), math.exp(-w1)
    ns = 0
    for k in range(2):  # faces t0 = 0, w0: h's coefficients of e^{t1} and e^{−t1}
        p, m = (1.0, 1.0) if k == 0 else (f[0], f[1])
        for j in (0, 2):
            sre[ns], sim[ns] = _zero(c[j] * p + c[j + 4] * m, c[j + 1] * p + c[j + 5] * m), 0.0
            ns += 1
    for k in range(2):  # edges t1 = 0, w1: α (c0 … c3) and β (c4 … c7)
        p, m = (1.0, 1.0) if k == 0 else (e1, g1)
        for j in (0, 4):
            sre[ns], sim[ns] = _zero(c[j] * p + c[j + 2] * m, c[j + 1] * p + c[j + 3] * m), 0.0
            ns += 1
    return ns


@njit(cache=True, nogil=True)
def _pos_3d(c: np.ndarray, w: np.ndarray, f: tuple, x: np.ndarray, wts: np.ndarray, tol: float,
            bps: np.ndarray, sre: np.ndarray, sim: np.ndarray, stack: np.ndarray, inner: np.ndarray) -> float:
    """∫_{[0,w]} (Σ_σ c_σ e^{σ·t})_+ dt for d = 3 (flat c of 8; ``f`` = :func:`_axis0` (w[0]); ``tol``
    for the whole cell; scratch ``bps`` of 8, ``sre``, ``sim`` of 12, the stacks (S, 3)).

    Axis 2 is split at the edge roots on the four edges parallel to it and at the folds
    (:func:`_folds`); a piece whose nearest singular point (:func:`_outer_singular`, the folds) lies at
    least :data:`SAFE` piece lengths away gets one rule, the others are halved until two rules agree.
    """
    pure_minus = c[0] == 0.0 and c[2] == 0.0 and c[4] == 0.0 and c[6] == 0.0
    pure_plus = c[1] == 0.0 and c[3] == 0.0 and c[5] == 0.0 and c[7] == 0.0
    wl = w[2]
    if pure_minus or pure_plus:
        weight = -math.expm1(-wl) if pure_minus else math.expm1(min(wl, _CAP))
        if weight == 0.0:
            return 0.0
        return _pos_2d(c[0] + c[1], c[2] + c[3], c[4] + c[5], c[6] + c[7], f, w[1], x, wts,
                       tol / (weight * w[1]), inner) * weight
    # h on the edges parallel to axis 2, at the four corners of axes 0 and 1
    f0 = (1.0, f[0])
    g0 = (1.0, f[1])
    f1 = (1.0, math.exp(min(w[1], _CAP)))
    g1 = (1.0, math.exp(-w[1]))
    bps[0], bps[5] = 0.0, wl
    for corner in range(4):
        e0, e1 = corner >> 1, corner & 1
        k00, k01, k10, k11 = f0[e0] * f1[e1], f0[e0] * g1[e1], g0[e0] * f1[e1], g0[e0] * g1[e1]
        gamma = c[0] * k00 + c[2] * k01 + c[4] * k10 + c[6] * k11
        eta = c[1] * k00 + c[3] * k01 + c[5] * k10 + c[7] * k11
        bps[corner + 1] = _edge_root(gamma, eta, wl)
    ns = _outer_singular(c, f, w[1], sre, sim)
    ns, nb = _folds(c, w[1], wl, sre, sim, ns, bps, 6)
    bps[:nb].sort()
    tol_outer, tol_inner = tol / wl, tol / (wl * w[1])
    total = 0.0
    for p in range(nb - 1):
        a, b = bps[p], bps[p + 1]
        if not b > a:
            continue
        near = np.inf
        for k in range(ns):
            near = min(near, _gap(sre[k], sim[k], a, b))
        if near >= SAFE * (b - a):
            total += _outer_rule(c, a, b, f, w[1], x, wts, tol_inner, inner)
        else:
            total += _outer_adaptive(c, a, b, f, w[1], x, wts, tol_outer, tol_inner, stack, inner)
    return total


@njit(cache=True, nogil=True)
def _magnitude(c: np.ndarray, w: np.ndarray) -> float:
    """∫ Σ_σ |c_σ| e^{σ·t} over the cell [0, w] (flat c, index 0 for +1): a bound on ∫ |h| that the
    cell's tolerance is relative to."""
    d = w.shape[0]
    total = 0.0
    for i in range(c.shape[0]):
        term = abs(c[i])
        for k in range(d):
            plus = (i >> (d - 1 - k)) & 1 == 0
            term *= math.expm1(min(w[k], _CAP)) if plus else -math.expm1(-w[k])
        total += term
    return total


@njit(cache=True, nogil=True)
def cell_coefficients(lo: np.ndarray, hi: np.ndarray, P: np.ndarray) -> tuple:
    """((K, 2^d), (K,)): on each cell [lo_c, hi_c] (lo, hi (K, d)) the density of the points P (n, d) is
    e^{scale} Σ_σ A_σ e^{σ·t}, t measured from the cell's low corner, σ flat in the order of the axes
    with index 0 for +1.

    A point right of the cell along axis k (beyond its midpoint: points lie on the cells' edges, not
    inside) contributes e^{lo_k − p_k} e^{t_k}, one left of it e^{p_k − lo_k} e^{−t_k}: each point
    adds to one σ. Each axis's exponents are referred to their largest (the nearest point's factor is
    1), whose sum, with log(n 2^d), is the scale: no coefficient overflows, and a far point
    underflows only below e^{−745} of the nearest.
    """
    K, d = lo.shape
    n = P.shape[0]
    coef = np.zeros((K, 2 ** d))
    scale = np.empty(K)
    expo = np.empty(n)
    sigma = np.empty(n, dtype=np.int64)
    norm = math.log(n * 2.0 ** d)
    for c in range(K):
        total = 0.0
        expo[:] = 0.0
        sigma[:] = 0
        for k in range(d):
            mid = 0.5 * (lo[c, k] + hi[c, k])
            top = -np.inf
            for j in range(n):
                left = P[j, k] <= mid
                e = P[j, k] - lo[c, k] if left else lo[c, k] - P[j, k]
                sigma[j] = 2 * sigma[j] + (1 if left else 0)
                expo[j] += e
                top = max(top, e)
            total += top
        for j in range(n):
            coef[c, sigma[j]] += math.exp(expo[j] - total)
        scale[c] = total - norm
    return coef, scale


@njit(cache=True, nogil=True)
def cut_cells(CA: np.ndarray, CB: np.ndarray, sA: np.ndarray, sB: np.ndarray, width: np.ndarray,
              cmin: np.ndarray, cmax: np.ndarray, eps: np.ndarray, x: np.ndarray, wts: np.ndarray,
              tol: float, out: np.ndarray) -> None:
    """Adds to ``out`` (2, E) ∫_cell (p − e^ε p_i)_+ (row 0) and (p_i − e^ε p)_+ (row 1) over every cell
    at every level it cuts (ε with cmin < ε < cmax, row 0; cmin < −ε < cmax, row 1), d = 2 or 3.

    p = e^{sA} Σ_σ CA_σ e^{σ·t} and p_i = e^{sB} Σ_σ CB_σ e^{σ·t} on each cell (CA, CB (U, 2^d), the log
    scales sA, sB (U,)); width (U, d); the cells in ascending order (each level's sum adds them in that
    order). The factor e^{ε + s_other − s_own} is applied to the smaller side (the other divided by it
    when it exceeds 1) and the result scaled back in log space, so ε beyond 709 does not overflow.
    Pieces are halved until two rules agree within ``tol`` × :func:`_magnitude` of the cell. Runs
    without the GIL (the exact rows run in threads).
    """
    c = np.empty(CA.shape[1])
    bps = np.empty(8)
    sre = np.empty(12)
    sim = np.empty(12)
    stack = np.empty((64, 3))
    inner = np.empty((64, 3))
    for u in range(CA.shape[0]):
        f = _axis0(width[u, 0])
        for side in range(2):
            own, other = (CA, CB) if side == 0 else (CB, CA)
            s_own, s_other = (sA[u], sB[u]) if side == 0 else (sB[u], sA[u])
            for k in range(eps.shape[0]):
                lev = eps[k] if side == 0 else -eps[k]
                if not (cmin[u] < lev and lev < cmax[u]):
                    continue
                lg = eps[k] + s_other - s_own
                if lg <= 0.0:  # h = e^{s_own} (own − e^{lg} other)
                    g, scale = math.exp(lg), s_own
                    for i in range(c.shape[0]):
                        c[i] = own[u, i] - g * other[u, i]
                else:  # h = e^{s_own + lg} (e^{−lg} own − other)
                    g, scale = math.exp(-lg), s_own + lg
                    for i in range(c.shape[0]):
                        c[i] = g * own[u, i] - other[u, i]
                cell_tol = tol * _magnitude(c, width[u])
                if c.shape[0] == 4:
                    v = _pos_2d(c[0], c[1], c[2], c[3], f, width[u, 1], x, wts, cell_tol / width[u, 1], inner)
                else:
                    v = _pos_3d(c, width[u], f, x, wts, cell_tol, bps, sre, sim, stack, inner)
                out[side, k] += math.exp(math.log(v) + scale) if v > 0.0 else 0.0


# ----------------------------------------------------------------------------- d = 2 cut cells
@njit(cache=True, nogil=True)
def _root_2d(gamma: float, eta: float, w: float) -> float:
    """t in [0, w] where γ e^{−t} + η e^{−(w−t)} = 0 (0 when there is none: a harmless breakpoint);
    by logarithms apart (the ratio of far terms overflows)."""
    if not ((gamma > 0.0 and eta < 0.0) or (gamma < 0.0 and eta > 0.0)):
        return 0.0
    t = 0.5 * (w + math.log(abs(gamma)) - math.log(abs(eta)))
    if not math.isfinite(t):
        return 0.0
    return min(max(t, 0.0), w)


@njit(cache=True, nogil=True)
def _square_2d(alpha: float, beta: float, f1: float) -> float:
    """(√P − √(f1 N))², P the positive and −N the negative of α, β: the exact integral along t1 where
    the root lies inside (no cancellation)."""
    pos, neg = max(alpha, beta), min(alpha, beta)
    return (math.sqrt(max(pos, 0.0)) - math.sqrt(max(-f1 * neg, 0.0))) ** 2


@njit(cache=True, nogil=True)
def _along_t1(alpha: float, beta: float, f1: float) -> float:
    """∫_0^{w1} (α e^{−t} + β e^{−(w1−t)})_+ dt, f1 = e^{−w1}: the square where the root lies inside
    (α, β of opposite signs and f1² < −β f1/α < 1), else (α + β)(1 − f1) or 0."""
    mixed = (alpha > 0.0 and beta < 0.0) or (alpha < 0.0 and beta > 0.0)
    if mixed:
        ratio = -beta * f1 / alpha
        if ratio > f1 * f1 and ratio < 1.0:
            return _square_2d(alpha, beta, f1)
    if alpha + beta > 0.0:
        return max((alpha + beta) * (1.0 - f1), 0.0)
    return 0.0


@njit(cache=True, nogil=True)
def _gauss_2d(d: np.ndarray, f1: float, w2: float, lo: float, hi: float, parts: int, x: np.ndarray,
              wts: np.ndarray, square: bool) -> float:
    """Gauss–Legendre over ``parts`` equal parts of [lo, hi] along t2 of the exact integral along t1
    (``square``: the root is known to lie inside, the square alone)."""
    h = (hi - lo) / parts
    total = 0.0
    for k in range(parts):
        centre = lo + h * (k + 0.5)
        piece = 0.0
        for q in range(x.shape[0]):
            t = centre + 0.5 * h * x[q]
            e_lo, e_hi = math.exp(-t), math.exp(t - w2)
            alpha = d[0] * e_lo + d[2] * e_hi
            beta = d[1] * e_lo + d[3] * e_hi
            piece += wts[q] * (_square_2d(alpha, beta, f1) if square else _along_t1(alpha, beta, f1))
        total += piece * (0.5 * h)
    return total


@njit(cache=True, nogil=True)
def _fixed_2d(d: np.ndarray, f1: float, w2: float, bps: np.ndarray, parts: np.ndarray, inside: np.ndarray,
              positive: np.ndarray, x: np.ndarray, wts: np.ndarray) -> float:
    """∫ over the three intervals of t2 between the edge roots: where the root stays outside [0, w1]
    the integrand along t1 is (α + β)(1 − f1) or 0, a sum of exponentials in t2 (closed form); where
    it lies inside, the square by one rule on each of ``parts`` equal parts."""
    out = 0.0
    for i in range(3):
        lo, hi = bps[i], bps[i + 1]
        span = hi - lo
        if not inside[i] and positive[i] and span > 0.0:
            down = math.exp(-lo) * -math.expm1(-span)  # ∫ e^{−t}
            up = math.exp(hi - w2) * -math.expm1(-span)  # ∫ e^{t − w2}
            out += ((d[0] * down + d[2] * up) + (d[1] * down + d[3] * up)) * (1.0 - f1)
    for i in range(3):
        if inside[i] and bps[i + 1] - bps[i] > 0.0:
            out += _gauss_2d(d, f1, w2, bps[i], bps[i + 1], parts[i], x, wts, True)
    return out


@njit(cache=True, nogil=True)
def _adaptive_2d(d: np.ndarray, f1: float, w2: float, bps: np.ndarray, x: np.ndarray, wts: np.ndarray,
                 tol: float, max_piece: float, max_parts: int) -> float:
    """Every interval cut into m equal parts, m doubled until two rules agree within ``tol`` (or m
    reaches ``max_parts``): the cells near a zero of α or β."""
    m = max(1, int(math.ceil(w2 / max_piece)))
    coarse = 0.0
    first = True
    while True:
        fine = 0.0
        for i in range(3):
            if bps[i + 1] > bps[i]:
                fine += _gauss_2d(d, f1, w2, bps[i], bps[i + 1], m, x, wts, False)
        if not first and (abs(fine - coarse) <= tol or m >= max_parts):
            return fine
        first = False
        m *= 2
        coarse = fine


@njit(cache=True, nogil=True)
def cut_cells_2d(D: np.ndarray, w1: np.ndarray, w2: np.ndarray, fx: np.ndarray, fw: np.ndarray,
                 ax: np.ndarray, aw: np.ndarray, tol: float, max_piece: float, safe: float,
                 max_parts: int) -> np.ndarray:
    """∫∫ (h)_+ over [0, w1] × [0, w2] for each d = 2 cut cell, h = D−− e^{−t1−t2} + D+− e^{−(w1−t1)−t2}
    + D−+ e^{−t1−(w2−t2)} + D++ e^{−(w1−t1)−(w2−t2)} (D (N, 4) in that order; docs/method.md#102-joint-queries).

    Exact along the wider axis (t1); along the other, the edge roots (where h vanishes on t1 = 0, w1)
    split t2 into three intervals on each of which one formula holds, analytic except at the real
    zeros of α(t2) = D−− e^{−t2} + D−+ e^{t2−w2} and β(t2) = D+− e^{−t2} + D++ e^{t2−w2} (closed form;
    their complex zeros lie π/2 off the axis). A cell whose intervals with the root inside have their
    nearest zero at least ``safe`` piece lengths away gets one rule (``fx``, ``fw``) per piece of at
    most ``max_piece``; the others are halved until two rules (``ax``, ``aw``) agree within ``tol``.
    """
    N = D.shape[0]
    out = np.empty(N)
    d = np.empty(4)
    bps = np.empty(4)
    parts = np.empty(3, dtype=np.int64)
    inside = np.empty(3, dtype=np.bool_)
    positive = np.empty(3, dtype=np.bool_)
    for c in range(N):
        a, b = w1[c], w2[c]
        if b > a:  # the exact axis is the wider one
            a, b = b, a
            d[0], d[1], d[2], d[3] = D[c, 0], D[c, 2], D[c, 1], D[c, 3]
        else:
            d[0], d[1], d[2], d[3] = D[c, 0], D[c, 1], D[c, 2], D[c, 3]
        f1 = math.exp(-a)
        r1 = _root_2d(d[0] + f1 * d[1], d[2] + f1 * d[3], b)
        r2 = _root_2d(f1 * d[0] + d[1], f1 * d[2] + d[3], b)
        bps[0], bps[1], bps[2], bps[3] = 0.0, min(r1, r2), max(r1, r2), b
        fast = True
        for i in range(3):
            lo, hi = bps[i], bps[i + 1]
            parts[i] = max(1, int(math.ceil((hi - lo) / max_piece)))
            near = np.inf
            for c0, c1 in ((d[0], d[2]), (d[1], d[3])):
                z = 0.5 * (b + math.log(-c0 / c1)) if c1 != 0.0 and -c0 / c1 > 0.0 else np.nan
                if math.isfinite(z):
                    near = min(near, max(max(lo - z, z - hi), 0.0))
            mid = 0.5 * (lo + hi)
            e_lo, e_hi = math.exp(-mid), math.exp(mid - b)
            al = d[0] * e_lo + d[2] * e_hi
            be = d[1] * e_lo + d[3] * e_hi
            mixed = (al > 0.0 and be < 0.0) or (al < 0.0 and be > 0.0)
            ratio = -be * f1 / al if mixed else 0.0
            inside[i] = mixed and ratio > f1 * f1 and ratio < 1.0
            positive[i] = al + be > 0.0
            if not (hi <= lo or not inside[i] or near >= safe * (hi - lo) / parts[i]):
                fast = False
        if fast:
            out[c] = _fixed_2d(d, f1, b, bps, parts, inside, positive, fx, fw)
        else:
            out[c] = _adaptive_2d(d, f1, b, bps, ax, aw, tol, max_piece, max_parts)
    return out
