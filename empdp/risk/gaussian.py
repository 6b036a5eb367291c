"""Gaussian kernels: p̂_i on a shared grid as one matrix product, and ε_i at a tolerance.

**Series form.** With z = (x − q_j)/b_j and δ = Δ_ij/b_j, the shifted kernel is

    φ(z + δ)/b = φ(z) e^{−δz − δ²/2}/b = φ(z)/b · e^{−δ²/2} Σ_{k<K} (−δz)^k/k!  + R,

|R| ≤ φ(z)/b · |δz|^K/K! · e^{|δz|} (the exponential series' Lagrange remainder). So on a grid
shared by a block of individuals, p̂_i, its slope (the derivative of the same K terms) and its CDF
are rows of ``coeffs @ columns``: the rows hold δ_ij^k e^{−δ_ij²/2} (individuals × nK), the columns
φ(z_j)(−z_j)^k/k!, their x-derivatives and their integrals (nK × grid). The remainder is certified
grid point by grid point (:meth:`SeriesPlan.certified`) for chunks of :data:`SERIES_ROWS` rows of
like shifts (for their largest, rounded up: :meth:`SeriesPlan.certificate`): each point gets the
fewest terms that certify it, in a few tiers of one K, one product per tier (the inner points of a
10^7-row panel need ~10 terms, the outer tails up to ~20); where no K ≤ :data:`MAX_TERMS` does, the values are computed directly. A tier's product
is cut into segments of consecutive grid points, each with only the run of kernels (in order of
q) that matters there: a kernel 9 scales away adds e^{−40} of p̂_i, so on a 10^7-row panel
the segments do 44% of the whole product's work; the kernels left out are bounded (1e-16
relative) and those below a point add their whole mass 1/n to its CDF. Rows with large
shifts (max_j |δ_ij| > :data:`MAX_SHIFT`) are evaluated directly throughout.

**ε_i at a tolerance.** The log-ratio L = log p̂ − log p̂_i of Gaussian mixtures is unbounded,
so ε_i is the smallest ε with δ_i(ε) ≤ τ (:func:`tolerance_eps`): a root of a non-increasing
function, found by a safeguarded Newton iteration on log δ_i from a certified bracket. Near τ
(~1e-12) δ_i is the mass of far tails, where differences of CDF values near 1 lose every
digit; there δ_i is integrated instead from cubic Hermite models of log p̂ and log p̂_i between
the nodes (exact for a single Gaussian, whose log-density is quadratic) by Gauss–Legendre.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr

from ..kernels import Gaussian

#: rows whose largest |Δ_ij|/b_j exceeds this are evaluated directly (the series needs many terms)
MAX_SHIFT = 1.0
#: certified relative error of the series' p̂_i (and of its log-slope, in units of 1/b_min): L within 1e-13.
#: (At 1e-14, a term more on most grid points, 6% of a row's δ_i on a bounded 10^7-row panel, for δ_i
#: that moved by at most 2e-15.)
SERIES_TOL = 1e-13
#: certified absolute error of the series' CDF of p̂_i
CDF_TOL = 1e-14
#: most terms of the series; grid points that need more are evaluated directly
MAX_TERMS = 24
#: relative error of p̂_i (and of its slope) from the kernels a grid segment's product leaves out, and
#: the absolute error of its CDF: 1% of the series' own tolerances
BAND_TOL = 1e-16
BAND_CDF_TOL = 1e-16
#: most grid points of one segment of a tier's product (each takes only the kernels that matter there;
#: on a 10^7-row panel, 44% of the full product's work at 32, 53% at 64)
SEGMENT_POINTS = 32
_SQRT2PI = math.sqrt(2 * math.pi)
_KERNEL = Gaussian()
_LOG_FACT = np.r_[0.0, np.cumsum(np.log(np.arange(1.0, MAX_TERMS + 2)))]


#: cells (rows × points × terms) of one step of :func:`direct`: its temporaries stay in cache
DIRECT_CELLS = 200_000


def direct(x: np.ndarray, centers: np.ndarray, b: np.ndarray, cdf: bool = True):
    """Value, slope and CDF of (1/n) Σ_l φ_{b_l}(x − c_l), directly: ``x`` (C, m), ``centers`` (C, n).
    Without ``cdf``, value and slope only (an exp per kernel, no ndtr)."""
    C, m = x.shape
    n = centers.shape[1]
    out = [np.empty((C, m)) for _ in range(3 if cdf else 2)]
    step = max(1, DIRECT_CELLS // max(1, m * n))
    for r in range(0, C, step):
        s = slice(r, r + step)
        u = x[s, :, None] - centers[s, None, :]
        if cdf:
            val, der, _, F = _KERNEL.terms(u, b)
        else:
            z = u / b
            val = np.exp(-0.5 * z * z) / (b * _SQRT2PI)
            der, F = -z / b * val, None
        for o, v in zip(out, (val, der, F)):
            o[s] = v.sum(axis=2) / n
    return out


class Certificate(NamedTuple):
    """How the series evaluates a chunk of rows on a plan's grid (:meth:`SeriesPlan.certified`)."""

    tiers: list  # (T, grid points) for each tier of T terms
    bad: np.ndarray  # grid points evaluated directly
    segments: list  # (T, g0, g1, j0, j1, left): the products' pieces


class SeriesPlan:
    """The shared part of the series form on one grid: the unshifted kernels' columns.

    ``p``, ``pr``, ``F``: p̂ on the grid (shared by every row); :func:`series_nodes` gives p̂_i.
    The plan holds the kernels in ascending order of q (``order``: the model's index of each);
    :meth:`certified` and :meth:`curvature` take per-kernel bounds in the model's order.
    """

    def __init__(self, points: np.ndarray, bandwidths: np.ndarray, grid: np.ndarray):
        # the kernels in ascending order of q: a grid segment's product needs a contiguous run of them
        self.order = np.argsort(points, kind="stable")
        self.q, self.b, self.grid = points[self.order], bandwidths[self.order], grid
        n, q, b = len(points), self.q, self.b
        self.z = (grid[None, :] - q[:, None]) / b[:, None]  # (n, G)
        self.phi = np.exp(-0.5 * self.z * self.z) / _SQRT2PI
        self.p = (self.phi / b[:, None]).sum(axis=0) / n
        self.pr = (-self.z * self.phi / b[:, None] ** 2).sum(axis=0) / n
        self.F = ndtr(self.z).sum(axis=0) / n
        self._W = None
        self._certificates = {}  # shift bound (a power of CERT_STEP) → its Certificate (or None)

    def columns(self, T: int) -> np.ndarray:
        """(T', n, 3, G) columns (T' ≥ T; the first T serve T terms), k-major: per term k and
        kernel j, the value's V_k = φ(z_j)(−z_j)^k/(k! n b_j), its slope D_k = ((k + 1) V_{k+1} −
        V_{k−1})/b_j (the x-derivative of V_k) and its CDF ∫_{−∞}^{z_j} (−s)^k φ(s) ds/(k! n)."""
        W = self._W  # one read: threads may share the plan (each uses the array it got, of ≥ T terms)
        if W is None or len(W) < T:
            T = max(T, min(MAX_TERMS, T + 3))  # a margin: the next chunks' shifts may need a few more
            n, G = self.z.shape
            b = self.b[:, None]
            V = np.empty((T + 1, n, G))
            mz = -self.z
            V[0] = self.phi / (n * b)
            for k in range(1, T + 1):
                V[k] = V[k - 1] * mz * (1.0 / k)
            W = np.empty((T, n, 3, G))
            W[:, :, 0] = V[:T]
            W[:, :, 1] = V[1:T + 1] * np.arange(1, T + 1)[:, None, None]
            W[1:, :, 1] -= V[:T - 1]
            W[:, :, 1] /= b
            # I_k = ∫_{−∞}^z s^k φ = −z^{k−1} φ + (k − 1) I_{k−2}; J_k = (−1)^k I_k/(k! n) = (V_{k−1} b_j + J_{k−2})/k
            J = W[:, :, 2]
            J[0] = ndtr(self.z) / n
            if T > 1:
                J[1] = self.phi / n  # −I_1 = φ
            for k in range(2, T):
                J[k] = (V[k - 1] * b + J[k - 2]) * (1.0 / k)
            if self._W is None or len(self._W) < len(W):
                self._W = W
        return W

    def certificate(self, M: float) -> "Certificate | None":
        """:meth:`certified` for |Δ_ij|/b_j ≤ M for every kernel, with M rounded up to a power of
        :data:`CERT_STEP` so that chunks of like shifts share one (cached) certificate: on a 10^7-row
        panel its terms cost within ~5% of each chunk's own per-kernel bounds, and it is computed a
        few times per plan instead of once per chunk (~4 µs a row)."""
        key = 0.0
        if M > 0:
            k = math.ceil(math.log(M, CERT_STEP))
            key = CERT_STEP ** k if CERT_STEP ** k >= M else CERT_STEP ** (k + 1)  # (rounding of the log)
        if key not in self._certificates:  # (threads sharing the plan may both compute it: the same result)
            self._certificates[key] = self._certified(np.full(len(self.q), key))
        return self._certificates[key]

    def certified(self, M: np.ndarray) -> "Certificate | None":
        """The series' tiers and bands for rows with |Δ_ij|/b_j ≤ M_j (``M``, (n,), the model's order).

        See :meth:`_certified`; None when the direct evaluation is cheaper."""
        return self._certified(np.asarray(M, dtype=float)[self.order])

    def _certified(self, M: np.ndarray) -> "Certificate | None":
        """:meth:`certified` with ``M`` in the plan's order of kernels: a :class:`Certificate` whose
        ``tiers`` (a list of (T, points)) get p̂_i and slope within :data:`SERIES_TOL` from T terms,
        and the CDF within :data:`CDF_TOL` (T ≥ :func:`cdf_terms`); ``bad``: the points evaluated
        directly; ``segments``: each tier's product cut into runs of grid points and of kernels.

        After T terms the value's error is at most φ(z)/b (M|z|)^T/T! e^{M|z|} (the exponential
        series' Lagrange remainder) and the exact term is at least φ(z)/b e^{−M|z| − M²/2}: their
        sums over j bound the relative error of p̂_i at each point. The slope is the derivative
        of the T terms, whose error, from d/dz of the remainder, is at most
        φ(z)/b² e^{M|z|} (|z| (M|z|)^T/T! + M (M|z|)^{T−1}/(T − 1)!) (relative to 1/b_min).
        Each point gets the fewest terms that certify it; points are grouped in a few tiers of
        one T each, chosen for the least work (:func:`_tiers`).

        A tier's product is cut into segments of at most :data:`SEGMENT_POINTS` consecutive grid
        points, each with the run of kernels (in order of q) that matters there (:meth:`_bands`).
        """
        b = self.b[:, None]
        az = np.abs(self.z)
        t = M[:, None] * az
        w = self.phi / b
        low = (w * np.exp(-t - 0.5 * (M * M)[:, None])).sum(axis=0)
        scale = self.b.min() / b
        G = az.shape[1]
        need = np.full(G, MAX_TERMS + 1)
        open_ = np.ones(G, dtype=bool)
        with np.errstate(over="ignore", invalid="ignore"):
            # φ/b e^{M|z|}, in one exponent (φ underflows to 0 where e^{M|z|} overflows, > 709 scales
            # away): it bounds the kernel's shifted value and every partial sum of its series
            whole = np.exp(t - 0.5 * self.z * self.z) / (_SQRT2PI * b)
            prev = whole * t  # φ/b (M|z|)^T/T! e^{M|z|} at T = 1
            for T in range(2, MAX_TERMS + 1):
                wr = prev * t / T
                err = np.maximum(wr.sum(axis=0), ((wr * az + prev * M[:, None]) * scale).sum(axis=0))
                ok = open_ & ((err <= SERIES_TOL * low) | (err == 0))
                need[ok] = T
                open_ &= ~ok
                prev = wr
                if not open_.any():
                    break
        need[need <= MAX_TERMS] = np.maximum(need[need <= MAX_TERMS], cdf_terms(float(M.max(initial=0.0))))
        tiers, bad, cost = _tiers(need)
        if cost >= G * DIRECT_COST:
            return None
        return Certificate(tiers, bad, self._bands(tiers, M, whole, az, scale, low))

    def _bands(self, tiers, M, whole, az, scale, low) -> list:
        """Segments (T, g0, g1, j0, j1, left) of the tiers' products: grid points g0 … g1 − 1 (a run of
        one tier's points, at most :data:`SEGMENT_POINTS`) take kernels j0 … j1 − 1 (in order of q)
        in the product, and ``left`` (g1 − g0,) kernels left out below each point add 1/n each to
        the CDF.

        A kernel left out of a point's product would add at most ``whole`` = φ(z)/b e^{M|z|} to
        the value (and to any partial sum of its series), (|z| + M) whole/b to the slope, and to
        the CDF 1/n or 0 (as it lies below or above the point) within Φ(M − |z|)/n. At each point
        the kernels left out from either end of the order of q stay below half of
        :data:`BAND_TOL` of p̂_i's certified lower bound (value; slope in units of p̂_i/b_min)
        and half of :data:`BAND_CDF_TOL` (CDF); a segment takes the union of its points' runs.
        """
        n = len(self.q)
        with np.errstate(over="ignore", invalid="ignore"):
            value = whole
            slope = whole * (az + M[:, None]) * scale
            cdf = ndtr(M[:, None] - az) / n
        lo = np.full(len(low), n)
        hi = np.zeros(len(low), dtype=np.intp)
        for bound, budget in ((value, 0.5 * BAND_TOL * low), (slope, 0.5 * BAND_TOL * low),
                              (cdf, np.full(len(low), 0.5 * BAND_CDF_TOL))):
            bound = np.where(np.isfinite(bound), bound, np.inf)
            # kernels 0 … lo − 1 and hi … n − 1 may be left out: their cumulative bounds fit the budget
            lo = np.minimum(lo, (np.cumsum(bound, axis=0) <= budget).sum(axis=0))
            hi = np.maximum(hi, n - (np.cumsum(bound[::-1], axis=0) <= budget).sum(axis=0))
        hi = np.maximum(hi, lo)
        below = np.searchsorted(self.q, self.grid, side="left")  # kernels with q_j < x
        segments = []
        for T, pts in tiers:
            # runs of consecutive grid points, cut into pieces of at most SEGMENT_POINTS
            breaks = np.flatnonzero(np.diff(pts) != 1) + 1
            for run in np.split(pts, breaks):
                for a in range(0, len(run), SEGMENT_POINTS):
                    g0, g1 = int(run[a]), int(run[min(a + SEGMENT_POINTS, len(run)) - 1]) + 1
                    j0, j1 = int(lo[g0:g1].min()), int(hi[g0:g1].max())
                    if j1 <= j0:  # no kernel matters there (p̂_i underflows): keep one, the product needs a run
                        j0, j1 = 0, 1
                    # kernels left out below each point: those with q_j < x outside the run
                    left = np.minimum(below[g0:g1], j0) + np.maximum(below[g0:g1] - j1, 0)
                    segments.append((T, g0, g1, j0, j1, left))
        return segments

    def curvature(self, M: np.ndarray) -> np.ndarray:
        """K (G − 1,) with L'' ≥ −K on every grid cell, for rows with |Δ_ij|/b_j ≤ M_j (``M``, (n,),
        the model's order).

        For a Gaussian mixture f = Σ a_l φ(z_l)/b_l, (log f)'' = Var_v(s) − E_v[1/b²] with weights
        v_l ∝ a_l φ(z_l)/b_l and slopes s_l = z_l/b_l. So L'' = (log p̂)'' − (log p̂_i)'' ≥
        −Var_v(s) − (1/b_min² − 1/b_max²) with p̂_i's weights, and Var_v(s) ≤ E_v[(s − c)²] for
        any c (here p̂'s mean slope −p̂'/p̂ at the cell's middle). Over the cell and every shift,
        z_l = (x − q_l + Δ_l)/b_l lies in [z_l(a) − M_l, z_l(c) + M_l]: each numerator term is
        taken at its largest value there and each denominator term at its smallest.
        """
        return self._curvature(np.asarray(M, dtype=float)[self.order])

    def _curvature(self, M: np.ndarray) -> np.ndarray:
        """:meth:`curvature` with ``M`` in the plan's order of kernels."""
        M = M[:, None]
        b = self.b[:, None]
        lo, hi = self.z[:, :-1] - M, self.z[:, 1:] + M
        near = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
        far = np.maximum(np.abs(lo), np.abs(hi))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            mid = 0.5 * (self.grid[:-1] + self.grid[1:])
            c = np.interp(mid, self.grid, np.where(self.p > 0, -self.pr / self.p, 0.0))
            spread = np.maximum((lo / b - c) ** 2, (hi / b - c) ** 2)
            num = (np.exp(-0.5 * near * near) / b * spread).sum(axis=0)
            den = (np.exp(-0.5 * far * far) / b).sum(axis=0)
            K = num / den + (1.0 / self.b.min() ** 2 - 1.0 / self.b.max() ** 2)
        return np.where(np.isfinite(K), K, np.inf)


#: relative work per row of one series term at one point (value, slope and CDF products: ~6 flops), of one
#: directly evaluated point (an exp and an ndtr per kernel: ~20 ns each, hundreds of BLAS flops), and of one
#: more tier (a product call, gathered columns, scattered results)
PRODUCT_COST = 6.0
DIRECT_COST = 400.0
TIER_COST = 400.0
#: most tiers of one T (terms) in a block's series
MAX_TIERS = 3


def _tiers(need: np.ndarray):
    """Group points needing ``need`` terms (MAX_TERMS + 1: evaluated directly) into at most
    :data:`MAX_TIERS` tiers of one K each (a point goes to the tier of the smallest K ≥ its need),
    for the least cost. Returns (list of (K, points), direct points, cost per row)."""
    bad = np.flatnonzero(need > MAX_TERMS)
    ks, counts = np.unique(need[need <= MAX_TERMS], return_counts=True)
    base = len(bad) * DIRECT_COST
    if not len(ks):
        return [], bad, base
    cum = np.r_[0, np.cumsum(counts)]

    def cost(tops):  # tops: indices into ks, ascending, the last is len(ks) − 1
        c, lo = 0.0, 0
        for t in tops:
            c += (cum[t + 1] - cum[lo]) * int(ks[t]) * PRODUCT_COST + TIER_COST
            lo = t + 1
        return c
    last = len(ks) - 1
    best = (cost([last]), [last])
    for a in range(last):
        best = min(best, (cost([a, last]), [a, last]))
        if MAX_TIERS >= 3:
            for c in range(a + 1, last):
                best = min(best, (cost([a, c, last]), [a, c, last]))
    tiers, lo = [], 0
    for t in best[1]:
        K = int(ks[t])
        tiers.append((K, np.flatnonzero((need <= K) & (need > (int(ks[lo - 1]) if lo else 0)))))
        lo = t + 1
    return tiers, bad, base + best[0]


def cdf_terms(M: float) -> int:
    """Terms after which the series' CDF is within :data:`CDF_TOL` for max_j |δ_ij| ≤ M.

    ∫ |R| ≤ M^K/K! E[|Z|^K e^{M|Z|}] = M^K/K! · 2 e^{M²/2} E[(Z + M)^K; Z > −M]
    ≤ M^K/K! · 2 e^{M²/2} Σ_m C(K, m) M^{K−m} E|Z|^m, with E|Z|^m = 2^{m/2} Γ((m+1)/2)/√π.
    """
    if M == 0:
        return 1
    mom = [2 ** (m / 2) * math.gamma((m + 1) / 2) / math.sqrt(math.pi) for m in range(MAX_TERMS + 1)]
    for K in range(1, MAX_TERMS + 1):
        moment = sum(math.comb(K, m) * M ** (K - m) * mom[m] for m in range(K + 1))
        if M ** K / math.factorial(K) * 2 * math.exp(M * M / 2) * moment <= CDF_TOL:
            return K
    return MAX_TERMS


#: ratio of the shift bounds for which :meth:`SeriesPlan.certificate` computes certificates
CERT_STEP = 2 ** 0.125

#: rows of one series product: the tiers are certified for the largest shifts of these rows
SERIES_ROWS = 1024


def series_values(plan: SeriesPlan, shifts: np.ndarray, cert: Certificate | None = None):
    """p̂_i, its slope and CDF on the plan's grid for each row of ``shifts`` (C, n), by the series
    of :meth:`SeriesPlan.certified` (``cert``: its result for these rows), one product per tier
    segment, directly at the points it does not certify; directly throughout when that is cheaper."""
    b = plan.b
    C, G = len(shifts), len(plan.grid)
    # δ_ij, kernel-major in the plan's order of kernels: the coefficients below are built along the rows
    delta = shifts.T[plan.order] / b[:, None]
    if cert is None:
        cert = plan.certificate(float(np.abs(delta).max(initial=0.0)))
    if cert is None:
        return direct(np.broadcast_to(plan.grid, (C, G)), plan.q[None, :] - shifts[:, plan.order], b)
    n = len(b)
    val, der, cdf = np.empty((C, G)), np.empty((C, G)), np.empty((C, G))
    if cert.tiers:
        W = plan.columns(max(T for T, _ in cert.tiers))
        head = np.exp(-0.5 * delta * delta)
        buf = np.empty(C * max(T * (j1 - j0) for T, _, _, j0, j1, _ in cert.segments))
    for T, g0, g1, j0, j1, left in cert.segments:
        P, J = g1 - g0, j1 - j0
        # the rows' coefficients δ^k e^{−δ²/2} (the 1/k! is in the columns) of the run of kernels, built in
        # place as (terms, kernels, rows): each power is one pass over contiguous memory (built row by row,
        # (rows, terms, kernels), they took 3 times as long), and the product takes their transpose as it is
        rows = buf[:C * T * J].reshape(T, J, C)
        rows[0] = head[j0:j1]
        run = delta[j0:j1]
        for k in range(1, T):
            np.multiply(rows[k - 1], run, out=rows[k])
        out = rows.reshape(T * J, C).T @ W[:T, j0:j1, :, g0:g1].reshape(T * J, 3 * P)
        val[:, g0:g1], der[:, g0:g1] = out[:, :P], out[:, P:2 * P]
        cdf[:, g0:g1] = out[:, 2 * P:] + left / n
    if len(cert.bad):
        bad = cert.bad
        val[:, bad], der[:, bad], cdf[:, bad] = direct(np.broadcast_to(plan.grid[bad], (C, len(bad))),
                                                       plan.q[None, :] - shifts[:, plan.order], b)
    return val, der, cdf


def series_nodes(plan: SeriesPlan, shifts: np.ndarray, curvature: bool = False) -> dict:
    """The node fields of :class:`empdp.risk.nodes._Nodes` on the plan's grid for rows of ``shifts``,
    by the series in chunks of :data:`SERIES_ROWS` rows (the caller sorts rows by their largest
    shift: each chunk's tiers fit its own rows). With ``curvature``, also ``K`` (C, G − 1): L'' ≥ −K
    on each grid cell of each row (:meth:`SeriesPlan.curvature` for the row's chunk)."""
    C, G = shifts.shape[0], len(plan.grid)
    val, der, cdf = np.empty((C, G)), np.empty((C, G)), np.empty((C, G))
    K = np.empty((C, G - 1)) if curvature else None
    for r in range(0, C, SERIES_ROWS):
        s = slice(r, r + SERIES_ROWS)
        val[s], der[s], cdf[s] = series_values(plan, shifts[s])
        if curvature:
            K[s] = plan._curvature((np.abs(shifts[s][:, plan.order]) / plan.b).max(axis=0, initial=0.0))

    def shared(a):
        return np.broadcast_to(a, (C, G))
    pr = shared(plan.pr)  # one slope: the left slopes are the same arrays
    return dict(x=shared(plan.grid), p=shared(plan.p), pr=pr, pl=pr, F=shared(plan.F), pi=val, pir=der, pil=der,
                Fi=cdf, K=K)


# ------------------------------------------------------------------ ε_i at a tolerance
#: Gauss–Legendre points per interval in :func:`tolerance_eps`
GL_POINTS = 16
_GL_T, _GL_W = np.polynomial.legendre.leggauss(GL_POINTS)
_GL_T, _GL_W = 0.5 * (_GL_T + 1.0), 0.5 * _GL_W
#: relative width of the final bracket of ε_i
EPS_RTOL = 1e-10
_LOG_FLOOR = -745.0


def _hermite(ya, yc, ma, mc, t):
    """The cubic Hermite interpolant on [0, 1] (values ya, yc; slopes ma, mc per unit t) at t."""
    d = yc - ya
    return ya + t * (ma + t * ((3 * d - 2 * ma - mc) + t * (ma + mc - 2 * d)))


def tolerance_eps(x, p, pr, pi, pir, upper: np.ndarray, tol: float, floor: float = 0.0) -> np.ndarray:
    """Smallest ε with δ_i(ε) ≤ ``tol`` for each row of nodes ``x`` (C, N) carrying the values and
    slopes of p̂ (``p``, ``pr``) and of p̂_i (``pi``, ``pir``); ``upper``: certified upper bounds
    (δ_i(upper) ≤ tol). Between nodes, log p̂ and log p̂_i are cubic Hermite interpolants (the
    nodes hold every extremum of L, so L is monotone between them). The result ε satisfies
    δ_i(ε) ≤ tol < δ_i(ε (1 − 1e-9)) on that model, or is 0 when δ_i(0) ≤ tol.

    With ``floor`` > 0 only the ε above it are wanted: rows with δ_i(floor) ≤ tol get NaN
    (their ε is at most ``floor``) without the search (in the search for ε_all, ~90% of the
    rows on a 10^7-row panel, whose ε_i(τ) cannot raise it).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.maximum(np.log(p), _LOG_FLOOR)
        lpi = np.maximum(np.log(pi), _LOG_FLOOR)
        sp = np.where(p > 0, pr / p, 0.0)
        spi = np.where(pi > 0, pir / pi, 0.0)
    h = np.diff(x, axis=1)
    sides = [_one_side(h, num, snum, den, sden, upper, tol, floor)
             for num, snum, den, sden in ((lp, sp, lpi, spi), (lpi, spi, lp, sp))]
    out = np.fmax(*sides)
    # NaN (at most ``floor``) on one side and at most ``floor`` on the other: at most ``floor``
    return np.where(np.isnan(sides[0]) | np.isnan(sides[1]), np.where(out > floor, out, np.nan), out)


def _one_side(h, A, sA, D, sD, upper, tol, least=0.0):
    """ε where ∫_{A−D>ε} (e^A − e^{ε+D}) falls to ``tol`` (A, D: log-densities at the nodes);
    NaN where that ε is at most ``least`` > 0."""
    C, N = A.shape
    S = A - D  # the log-ratio at the nodes
    top = S.max(axis=1)  # δ = 0 on the model from here on (S is monotone between nodes)
    out = np.zeros(C)
    if least > 0:
        out[top <= least] = np.nan
    rows = np.flatnonzero(top > max(least, 0.0))
    if not len(rows):
        return out
    hi = top[rows].copy()
    guess = np.minimum(np.broadcast_to(np.asarray(upper, dtype=float), (C,))[rows], hi)
    # intervals that can meet {S > ε} for ε ≥ a floor: a coarse floor first (the region at τ is
    # small), lowered for the rows where δ at the floor is below τ, down to ``least``
    floor = np.maximum(0.5 * guess, least)
    while len(rows):
        last = (floor <= 1e-3 * guess) | (floor <= least)
        floor = np.where(last, least, floor)  # the last try: every interval where S > least
        ivl = _Intervals(h, A, sA, D, sD, S, rows, floor)
        d, _ = ivl.delta(floor)
        ok = d > tol  # a bracket [floor, hi]
        out[rows[ok]] = _newton(ivl, floor, hi, guess, tol, ok)[ok]
        if least > 0:
            out[rows[~ok & last]] = np.nan  # δ(least) ≤ tol: at most ``least``
        keep = ~ok & ~last  # (δ(0) ≤ tol: ε = 0)
        rows, hi, guess = rows[keep], np.minimum(hi, floor)[keep], np.minimum(guess, floor)[keep]
        floor = np.maximum(0.25 * floor[keep], least)
    return out


class _Intervals:
    """The node intervals of some rows where S = A − D exceeds a floor somewhere (flat lists)."""

    def __init__(self, h, A, sA, D, sD, S, rows, floor):
        Sa, Sc = S[rows, :-1], S[rows, 1:]
        rr, kk = np.nonzero(np.maximum(Sa, Sc) > floor[:, None])
        g = rows[rr]
        hh = h[g, kk]
        self.R = len(rows)
        self.rr = rr
        self.hh = hh
        # per unit t: values and slopes of A and D at both ends
        self.A = (A[g, kk], A[g, kk + 1], hh * sA[g, kk], hh * sA[g, kk + 1])
        self.D = (D[g, kk], D[g, kk + 1], hh * sD[g, kk], hh * sD[g, kk + 1])
        self.Sa = Sa[rr, kk]
        self.Sc = Sc[rr, kk]
        # an interval wholly inside {S > ε} is integrated at the same Gauss points for every ε: its
        # ∫ e^A and ∫ e^D once, and where the model's A − D ≥ ε at every point (no clipping), its
        # mass is ∫ e^A − e^ε ∫ e^D
        with np.errstate(over="ignore"):
            a = _hermite(*(v[:, None] for v in self.A), _GL_T[None, :])
            d = _hermite(*(v[:, None] for v in self.D), _GL_T[None, :])
            self.smin, self.dmax = (a - d).min(axis=1, initial=np.inf), d.max(axis=1, initial=-np.inf)
            self.IA, self.ID = np.exp(a) @ _GL_W, np.exp(d) @ _GL_W

    def delta(self, eps, rows=None):
        """δ(ε) and dδ/dε = −e^ε ∫_{S>ε} e^D for the ``rows`` (all: None) at their ε."""
        if rows is None:
            return self._delta(eps, slice(None), self.rr, self.R)
        at = np.full(self.R, -1)
        at[rows] = np.arange(len(rows))
        sel = np.flatnonzero(at[self.rr] >= 0)
        return self._delta(eps, sel, at[self.rr[sel]], len(rows))

    def _delta(self, eps, sel, rr, R):
        e = eps[rr]
        la, lc = self.Sa[sel], self.Sc[sel]
        A = tuple(v[sel] for v in self.A)
        D = tuple(v[sel] for v in self.D)
        inside = np.minimum(la, lc) >= e
        cut = ~inside & (np.maximum(la, lc) > e)
        t0 = np.where(inside, 0.0, 1.0)
        t1 = np.ones_like(t0)
        if cut.any():
            r = _root(*(v[cut] for v in (*A, *D)), e[cut])
            rising = (lc > la)[cut]
            t0[cut] = np.where(rising, r, 0.0)
            t1[cut] = np.where(rising, 1.0, r)
        quick = inside & (e <= self.smin[sel]) & (e + self.dmax[sel] <= 700.0)
        whole = self.hh[sel][quick]
        with np.errstate(divide="ignore"):  # e^ε ∫ e^D as one exponential: e^ε alone overflows beyond ε = 709
            grown = np.exp(e[quick] + np.log(self.ID[sel][quick]))
        qmass, qdmass, qrr = whole * (self.IA[sel][quick] - grown), whole * grown, rr[quick]
        live = (t1 > t0) & ~quick
        t = t0[live, None] + (t1 - t0)[live, None] * _GL_T[None, :]
        a = _hermite(*(v[live, None] for v in A), t)
        dd = _hermite(*(v[live, None] for v in D), t)
        ee = e[live, None]
        f = np.exp(a) * -np.expm1(np.minimum(ee + dd - a, 0.0))
        g = np.exp(np.minimum(ee + dd, 700.0))
        scale = (self.hh[sel] * (t1 - t0))[live]
        mass = (f @ _GL_W) * scale
        dmass = (g @ _GL_W) * scale
        rr = np.r_[rr[live], qrr]
        mass, dmass = np.r_[mass, qmass], np.r_[dmass, qdmass]
        return np.bincount(rr, weights=mass, minlength=R), -np.bincount(rr, weights=dmass, minlength=R)


def _root(a0, a1, am, cm, d0, d1, dm, dmc, e):
    """t ∈ [0, 1] where the Hermite model of S = A − D equals e (S monotone on the interval):
    Newton's method safeguarded by bisection, each root until its step is below 1e-12."""
    ya, yc = a0 - d0, a1 - d1
    ma, mc = am - dm, cm - dmc
    d = yc - ya
    c2, c3 = 3 * d - 2 * ma - mc, ma + mc - 2 * d
    rising = d > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.nan_to_num(np.clip((e - ya) / d, 0.0, 1.0), nan=0.5)
    out = t.copy()
    idx = np.arange(len(t))
    lo, hi = np.zeros_like(t), np.ones_like(t)
    for _ in range(80):
        H = ya + t * (ma + t * (c2 + t * c3)) - e
        dH = ma + t * (2 * c2 + 3 * t * c3)
        above = (H > 0) == rising
        hi = np.where(above, t, hi)
        lo = np.where(above, lo, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            nt = t - H / dH
        nt = np.where((nt >= lo) & (nt <= hi), nt, 0.5 * (lo + hi))
        out[idx] = nt
        go = np.abs(nt - t) > 1e-12
        if not go.any():
            break
        idx, t, lo, hi = idx[go], nt[go], lo[go], hi[go]
        ya, ma, c2, c3, e, rising = (v[go] for v in (ya, ma, c2, c3, e, rising))
    return out


def _newton(ivl: _Intervals, lo, hi, start, tol, use):
    """Safeguarded Newton on log δ(ε) − log tol in the brackets [lo, hi] (δ(lo) > tol ≥ δ(hi)),
    from ``start``; rows not in ``use`` are skipped. Returns each row's bracket's upper end.

    Two steps in a row from the same side double the second (log δ may be convex there, and
    Newton would creep); a step that leaves the bracket, or a third slow one, bisects."""
    lo, hi = lo.copy(), hi.copy()
    eps = np.clip(start, lo, hi)
    active = use & (hi - lo > EPS_RTOL * hi)
    side = np.zeros(len(lo))  # +1: the last point was above tol, −1: at or below
    slow = np.zeros(len(lo), dtype=np.intp)
    log_tol = math.log(tol)
    for _ in range(200):
        rows = np.flatnonzero(active)
        if not len(rows):
            break
        d, dd = ivl.delta(eps[rows], rows)
        e = eps[rows]
        above = d > tol
        low, up = np.where(above, e, lo[rows]), np.where(above, hi[rows], e)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (np.log(d) - log_tol) * d / dd  # Newton on log δ: ε − g/g'
        sgn = np.where(above, 1.0, -1.0)
        step = np.where(side[rows] == sgn, 2.0 * step, step)
        nxt = e - step
        # a step too small to cut the bracket: step over the root, to close it from the other side
        small = np.abs(step) <= 0.5 * EPS_RTOL * up
        nxt = np.where(small, nxt + sgn * 0.5 * EPS_RTOL * up, nxt)
        width = hi[rows] - lo[rows]
        sl = np.where(up - low > 0.5 * width, slow[rows] + 1, 0)
        ok = np.isfinite(nxt) & (nxt > low) & (nxt < up) & (sl < 3)
        nxt = np.where(ok, nxt, 0.5 * (low + up))
        slow[rows] = np.where(ok, sl, 0)
        side[rows] = np.where(ok, sgn, 0.0)
        lo[rows], hi[rows], eps[rows] = low, up, nxt
        active[rows] = (up - low) > EPS_RTOL * up
    return hi
