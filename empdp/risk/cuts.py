"""The partial integrals of the general path: the mass of (p̂ − e^ε p̂_i) on the part of an
interval that a level ε cuts, from Hermite models of L and of the densities
(docs/method.md#52-exact-delta-and-epsilon-for-one-individual).
"""

from __future__ import annotations

import numpy as np

from . import cells as _cells


def _mass_poly(h, va, vc, da, dc, mass):
    """Coefficients (of t, …, t⁵) of ∫_0^{th} of the quartic-corrected Hermite model of a density
    on an interval of length h, as a polynomial in t ∈ [0, 1].

    The model is the cubic Hermite interpolant of the values va, vc and one-sided slopes da, dc
    at both ends, plus a multiple of the bubble t²(1−t)² that makes its integral over the whole
    interval the exact ``mass``.
    """
    A, B, Cc, D = h * va, h * h * da, h * vc, h * h * dc
    Q = 30 * (mass - (A + Cc) / 2 - (B - D) / 12)  # the bubble's weight times ∫ t²(1−t)² = 1/30
    return A, B / 2, Cc - A + (Q - 2 * B - D) / 3, (A - Cc - Q) / 2 + (B + D) / 4, Q / 5


#: the size of the last Newton step (in units of the cell) at which :func:`_cubic_root` accepts a root
ROOT_TOL = 1e-4


def _cubic_root(a0, a1, a2, a3, rise, t, tol=ROOT_TOL, deferred=False):
    """t ∈ [0, 1] where a0 + a1 t + a2 t² + a3 t³ is zero, from the starting points ``t`` (the
    linear guesses); ``rise`` is the cubic's change from t = 0 to 1 (its sign: rising or falling).

    Two Newton steps, and the second one's size bounds the error: Newton converges
    quadratically, so when that step is at most ``tol`` (of the cell) the error left is of
    order tol² (times the cubic's |a''/a'|, O(1) on these cells). A root error e moves the
    partial masses by O(e²) of the cell's, the integrand vanishing at the root: about 1e-16
    of the cell's mass at tol = 1e-4. On these cells ~95% of the roots get there; the others
    take two more steps, judged the same way by the last (on a bounded 10^7-row panel all but
    ~1% of them then get there), and those left (a larger or non-finite last step, or one that
    leaves [0, 1]) are found by :func:`_bracketed_root`, to tol².
    Each root depends on its own coefficients only. With ``deferred``, the roots left for the
    bracketed search are not sought: returns (t, their indices), for the caller to seek them
    with others (:func:`_bracketed_root` costs ~100 µs a call, however few its roots).
    """
    t0 = t
    t, step = _newton_steps(a0, a1, a2, a3, t)
    # (a root the last step leaves outside [0, 1] is one of a model that is not monotone there)
    bad = np.flatnonzero(~((np.abs(step) <= tol) & (t >= 0.0) & (t <= 1.0)))
    far = bad[:0]
    if len(bad):
        coeffs = tuple(v[bad] for v in (a0, a1, a2, a3))
        t[bad], step = _newton_steps(*coeffs, np.clip(t[bad], 0.0, 1.0))
        far = bad[~((np.abs(step) <= tol) & (t[bad] >= 0.0) & (t[bad] <= 1.0))]
    if deferred:
        return t, far
    if len(far):
        t[far] = _bracketed_root(a0[far], a1[far], a2[far], a3[far], rise[far] > 0, t0[far], tol=tol * tol)
    return t


def _newton_steps(a0, a1, a2, a3, t):
    """Two Newton steps on the cubic from ``t`` (the first kept in [0, 1]): the point and the last step."""
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(2):
            H = ((a3 * t + a2) * t + a1) * t + a0
            dH = (3 * a3 * t + 2 * a2) * t + a1
            step = H / dH
            t = np.clip(t - step, 0.0, 1.0) if k == 0 else t - step
    return t, step


def _bracketed_root(a0, a1, a2, a3, rising, t, tol=1e-8, iters=60):
    """:func:`_cubic_root` by Newton's method safeguarded by bisection (``rising``: the cubic's
    direction): a root stops once its step is at most ``tol``. Every root iterates until most
    have stopped; the last few go on alone.
    """
    out = t.copy()
    active = None  # the roots iterated (None: all)
    done = np.zeros(len(t), dtype=bool)  # of those, the ones already stopped
    lo, hi = np.zeros_like(t), np.ones_like(t)
    for _ in range(iters):
        H = ((a3 * t + a2) * t + a1) * t + a0
        dH = (3 * a3 * t + 2 * a2) * t + a1
        above = (H > 0) == rising  # the root lies left of t
        hi = np.where(above, t, hi)
        lo = np.where(above, lo, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = t - H / dH
        # a Newton step that stays in the bracket (or stays put, at an exact root) is taken
        step = np.where((newton >= lo) & (newton <= hi), newton, 0.5 * (lo + hi))  # NaN: bisect
        # a stopped root keeps its value: each root's result depends on itself only, not on
        # the roots it is iterated with
        if active is None:
            out = np.where(done, out, step)
        else:
            out[active] = np.where(done, out[active], step)
        done |= np.abs(step - t) <= tol
        t = step
        left = len(done) - np.count_nonzero(done)
        if left == 0:
            break
        if left <= len(done) // 4:  # few left: go on with those only
            keep = np.flatnonzero(~done)
            active = keep if active is None else active[keep]
            t, lo, hi, rising, a0, a1, a2, a3 = (v[keep] for v in (t, lo, hi, rising, a0, a1, a2, a3))
            done = np.zeros(len(active), dtype=bool)
    return out


#: cuts per step of :func:`_cut_sums` (its temporaries stay in cache)
CUT_CHUNK = 8192

#: the node fields of p̂ and of p̂_i: value, right and left slopes, CDF
_P = ("p", "pr", "pl", "F")
_PI = ("pi", "pir", "pil", "Fi")


def _end(field: np.ndarray, rr: np.ndarray, kk: np.ndarray, right: bool = False):
    """A node field (rows × nodes) at the left (or ``right``) ends of intervals (rows ``rr``,
    intervals ``kk``), as one flat take (numpy's two-index gather is ~4 times slower); a field
    shared by every row (a broadcast view: p̂ on a series grid) from its one row, not from the
    copy of every row that ravel() would make."""
    if field.strides[0] == 0:
        return field[0, kk + right]
    return np.take(field.ravel(), rr * field.shape[1] + kk + right)


def _cell_ends(L, Lr, Ll, h, rr, kk):
    """L at both ends of intervals (rows ``rr``, intervals ``kk``), its right slope at the left end,
    its left slope at the right end, and the intervals' lengths (``h``: rows × (nodes − 1))."""
    a = rr * L.shape[1] + kk  # flat index of each interval's left node (and a + 1 of its right one)
    return (np.take(L.ravel(), a), np.take(L.ravel(), a + 1), np.take(Lr.ravel(), a), np.take(Ll.ravel(), a + 1),
            np.take(h.ravel(), a - rr))


def _model_ends(nd, f, rr, kk, masses):
    """What the Hermite model of density ``f`` (its node fields: value, right and left slopes)
    needs on intervals (``rr``, ``kk``): both end values, the right slope at the left end, the
    left slope at the right end, and the interval's mass from ``masses`` ({fields: (rows, nodes + 1)
    masses of the intervals, then of the tails}, :func:`empdp.risk.nodes._masses`)."""
    value, right, left = (getattr(nd, g) for g in f[:3])
    return (_end(value, rr, kk), _end(value, rr, kk, True), _end(right, rr, kk), _end(left, rr, kk, True),
            _end(masses[f], rr, kk))


def _cut_sums(nd, L, Lr, Ll, h, rr, kk, sign, num, den, eps, growth, masses, first=None, count=None):
    """∫ (num − e^ε den) over the part of each cut interval where sign·L > ε, summed by row and level.

    Interval j (row ``rr[j]``, interval ``kk[j]``) is cut by the levels ``first[j]``, …,
    ``first[j] + count[j] − 1`` of ``eps`` (one level, ``eps[0]``, when ``count`` is None).
    On each, the cut point is the root of the cubic Hermite model of sign·L, and the masses
    left of it come from the quartic-corrected Hermite models of both densities, formed for each
    cut in cache-sized chunks (formed once per interval, ~1.2 cuts each on a bounded 10^7-row
    panel, they had to be stacked and gathered for the cuts: 10% more time).
    ``masses``: the intervals' masses (see :func:`_model_ends`). Returns the sums, (rows, len(eps)).
    """
    C = L.shape[0]
    E = len(eps)
    if count is None:
        e = np.zeros(len(rr), dtype=np.intp)
    else:
        j, e = _cells.expand_ranges(first, count)
        rr, kk = rr[j], kk[j]

    def models(cuts):
        """For ``cuts`` (a slice or indices): the cubic Hermite model of sign·L (its value at 0, rise and
        a1..a3) and each density's mass inside the region as c0 + k1 t + … + k5 t⁵ (t the root), with
        the whole mass."""
        r, k = rr[cuts], kk[cuts]
        la, lc, ma, mc, hh = _cell_ends(L, Lr, Ll, h, r, k)
        la, lc, hma, hmc = sign * la, sign * lc, hh * (sign * ma), hh * (sign * mc)
        d = lc - la
        rising = d > 0  # the region sign·L > ε lies right of the root, else left of it
        flip = np.where(rising, -1.0, 1.0)

        def poly(f):
            va, vc, da, dc, mass = _model_ends(nd, f, r, k, masses)
            return (np.where(rising, mass, 0.0), *(flip * c for c in _mass_poly(hh, va, vc, da, dc, mass)), mass)
        return la, d, hma, 3 * d - 2 * hma - hmc, hma + hmc - 2 * d, poly(num), poly(den)

    def part(t, k0, k1, k2, k3, k4, k5, mass):
        return np.clip(k0 + t * (k1 + t * (k2 + t * (k3 + t * (k4 + t * k5)))), 0, mass)

    contrib = np.empty(len(e))
    far = []  # (cuts, the cubics' a0..a3, rise, t0) of the roots left for one bracketed search
    for c0 in range(0, len(e), CUT_CHUNK):  # cache-sized chunks: a few dozen temporaries per step
        cuts = slice(c0, min(c0 + CUT_CHUNK, len(e)))
        la, d, a1, a2, a3, pn, pd = models(cuts)
        level = eps[e[cuts]]
        with np.errstate(divide="ignore", invalid="ignore"):
            t0 = np.nan_to_num(np.clip((level - la) / d, 0, 1), nan=0.5)
        a0 = la - level
        t, left = _cubic_root(a0, a1, a2, a3, d, t0, deferred=True)
        if len(left):
            far.append((c0 + left, *(v[left] for v in (a0, a1, a2, a3, d, t0))))
        contrib[cuts] = part(t, *pn) - growth[e[cuts]] * part(t, *pd)
    if far:  # their contributions again, from their roots
        at, a0, a1, a2, a3, d, t0 = (np.concatenate(v) for v in zip(*far))
        t = _bracketed_root(a0, a1, a2, a3, d > 0, t0, tol=ROOT_TOL * ROOT_TOL)
        *_, pn, pd = models(at)
        contrib[at] = part(t, *pn) - growth[e[at]] * part(t, *pd)
    return np.bincount(rr * E + e, weights=contrib, minlength=C * E).reshape(C, E)


def _turn_sums(nd, L, Lr, Ll, h, turns, cuts, sign, num, den, eps, growth, masses):
    """∫ (num − e^ε den) where sign·L > ε on the intervals that hold an extremum of L which is not
    a node (δ_i only, see :func:`empdp.risk.nodes._insert_extrema`), at the levels that cross
    them, summed by row and level: (rows, len(eps)).

    ``turns`` = (rows, intervals, t, L, L', densities), in row-major order: the extremum of the
    interval's cubic Hermite model of L at t ∈ (0, 1), and the exact L, slope and densities'
    values and slopes there ({"p", "pr", "pi", "pir"}). ``cuts`` = (rows, intervals,
    first, count) of the binning's cut list (as in :func:`_cut_sums`; None: ``eps[0]``) for these
    intervals: the levels between the two end values of sign·L, which cross it once. Levels from the
    nearer end value to the extremum's cross it twice, r1 < t < r2; the binning counts the
    interval whole below both end values (so also there at a minimum of sign·L) and not at all
    above them. Every root is that of the cubic Hermite model of its side, [0, t] or [t, 1], from
    the exact values and slopes at its ends (as with the extremum a node). So are the densities'
    models (quartic-corrected, as in :func:`_cut_sums`), each side's matched to its share of the
    interval's exact mass: its cubic Hermite integral plus the rest, shared in proportion to the
    sides' lengths⁵ as the integrals' errors are. (The models on the whole interval put δ_i off by
    up to 3e-12 on a bounded 10^7-row panel, against ~5e-13 with the extremum a node.)
    """
    rr, kk, te, Le, Se, at_e = turns
    C, N = L.shape
    E = len(eps)
    la, lc, ma, mc, hh = _cell_ends(L, Lr, Ll, h, rr, kk)
    la, lc, top = sign * la, sign * lc, sign * Le
    peak = top > np.maximum(la, lc)
    valley = top < np.minimum(la, lc)
    # the levels crossed twice: from the higher end value up to a maximum, or from a minimum up to the
    # lower end value (counted the binning's way: levels below sign·L; ties go either way)
    side = "left" if sign > 0 else "right"
    lo = np.searchsorted(eps, np.where(peak, np.maximum(la, lc), top), side=side)
    hi = np.searchsorted(eps, np.where(peak, top, np.minimum(la, lc)), side=side)
    twice = np.where(peak | valley, np.maximum(hi - lo, 0), 0)
    j2, e2 = _cells.expand_ranges(lo, twice)
    # the levels crossed once, from the cut list: on the side of the lower end value at a maximum, of
    # the higher one at a minimum
    crr, ckk, first, count = cuts
    j1 = np.searchsorted(rr * N + kk, crr * N + ckk)
    if count is None:
        e1 = np.zeros(len(j1), dtype=np.intp)
    else:
        owner, e1 = _cells.expand_ranges(first, count)
        j1 = j1[owner]
    w0, w1 = te * hh, (1.0 - te) * hh
    sides = ((la, top, w0 * sign * ma, w0 * sign * Se), (top, lc, w1 * sign * Se, w1 * sign * mc))

    def roots(*groups):
        """t of the crossings of ``level`` on side k (0: [0, t_e], 1: [t_e, 1]) of turns j, for each
        group (k, j, level): their cubics' roots in one search."""
        cubic = []
        for k, j, level in groups:
            y0, y1, m0, m1 = (v[j] for v in sides[k])
            d = y1 - y0
            with np.errstate(divide="ignore", invalid="ignore"):
                u0 = np.nan_to_num(np.clip((level - y0) / d, 0, 1), nan=0.5)
            cubic.append((y0 - level, m0, 3 * d - 2 * m0 - m1, m0 + m1 - 2 * d, d, u0))
        u = np.split(_cubic_root(*(np.concatenate(v) for v in zip(*cubic))),
                     np.cumsum([len(j) for _, j, _ in groups])[:-1])
        return [te[j] * v if k == 0 else te[j] + (1.0 - te[j]) * v for (k, j, _), v in zip(groups, u)]

    # once: on the side whose end values hold the level (at a maximum, the side of the lower end value;
    # at a minimum, of the higher one; the other side's cubic has no root there), and the region lies
    # right of the root on a rising side
    lev1 = eps[e1]
    on_left = (lev1 - la[j1]) * (lev1 - top[j1]) <= 0
    r = np.empty(len(j1))
    r[on_left], r[~on_left], r1, r2 = roots((0, j1[on_left], lev1[on_left]), (1, j1[~on_left], lev1[~on_left]),
                                            (0, j2, eps[e2]), (1, j2, eps[e2]))
    rising = np.where(on_left, top[j1] > la[j1], lc[j1] > top[j1])
    j, e = np.r_[j1, j2], np.r_[e1, e2]
    start, stop = np.r_[np.where(rising, r, 0.0), r1], np.r_[np.where(rising, 1.0, r), r2]
    # at a minimum the binning counted the whole interval: it loses (r1, r2)
    weight = np.r_[np.ones(len(j1)), np.where(peak[j2], 1.0, -1.0)]

    def part(f):
        """Each density's mass on (start, stop): the interval's split at t_e, each side's quartic-corrected
        Hermite model matched to its share of the exact mass (see the docstring)."""
        va, vc, da, dc, mass = _model_ends(nd, f, rr, kk, masses)
        ends = ((w0, va, at_e[f[0]], da, at_e[f[1]]), (w1, at_e[f[0]], vc, at_e[f[1]], dc))
        # each side's cubic Hermite integral, then the rest of the exact mass shared as their errors
        # (∝ length⁵) would be
        simple = [0.5 * w * (va + vc) + w * w / 12 * (da - dc) for w, va, vc, da, dc in ends]
        tail = np.minimum(te, 1.0 - te) ** 5 / (te ** 5 + (1.0 - te) ** 5)
        left = simple[0] + (mass - simple[0] - simple[1]) * np.where(te < 0.5, tail, 1.0 - tail)
        shares = (np.clip(left, 0, mass), np.clip(mass - left, 0, mass))
        out = 0.0
        for k, ((w, va, vc, da, dc), share) in enumerate(zip(ends, shares)):
            c = [q[j] for q in _mass_poly(w, va, vc, da, dc, share)]
            t0, span = (0.0, te[j]) if k == 0 else (te[j], 1.0 - te[j])
            with np.errstate(divide="ignore", invalid="ignore"):
                u0, u1 = (np.nan_to_num(np.clip((x - t0) / span, 0, 1)) for x in (start, stop))
            for u, sgn in ((u1, 1.0), (u0, -1.0)):
                out = out + sgn * u * (c[0] + u * (c[1] + u * (c[2] + u * (c[3] + u * c[4]))))
        return np.clip(out, 0, mass[j])

    contrib = weight * (part(num) - growth[e] * part(den))
    return np.bincount(rr[j] * E + e, weights=contrib, minlength=C * E).reshape(C, E)
