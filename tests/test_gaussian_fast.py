"""Gaussian kernels: the series fast path and ε_i(τ) against adaptive quadrature (scipy.integrate.quad).

The reference integrates ∫ (p̂ − e^ε p̂_i)_+ (and the other direction) piece by piece between the
roots of L(x) = ±ε (found by a fine scan and brentq on log-densities, so far tails keep their
digits), and finds ε_i(τ) = min{ε : δ_i(ε) ≤ τ} by brentq on log δ_i.
"""

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq, minimize_scalar
from scipy.special import logsumexp

from empdp import risk
from empdp.density import DensityModel, _bandwidths
from empdp.risk import gaussian as _gaussian
from empdp.settings import Model

TAU = risk.EPS_TOLERANCE


# ------------------------------------------------------------------ the quadrature reference
class Reference:
    """p̂ and p̂_i of one individual in log space, and δ_i(ε), ε_i(τ) by quadrature."""

    def __init__(self, model: DensityModel, shift: np.ndarray):
        self.q, self.b = model.points, model.bandwidths
        self.qi = self.q - shift
        pts = np.r_[self.q, self.qi]
        self.lo = pts.min() - 40 * self.b.max()
        self.hi = pts.max() + 40 * self.b.max()
        scan = np.unique(np.r_[np.linspace(self.lo, self.hi, 8001), pts])
        # L's local extrema, refined: no region {±L > ε} is narrower than the scan can see
        L = self.log_ratio(scan)
        # where both densities are below e^-60, the regions hold no mass that counts (< 1e-24)
        alive = np.maximum(self._log(scan, self.q), self._log(scan, self.qi)) > -60
        turns = [scan]
        for sign in (1.0, -1.0):
            v = sign * L
            for k in np.flatnonzero((v[1:-1] >= v[:-2]) & (v[1:-1] >= v[2:]) & alive[1:-1]) + 1:
                res = minimize_scalar(lambda x: -sign * self.log_ratio(x), bounds=(scan[k - 1], scan[k + 1]),
                                      method="bounded", options={"xatol": 1e-13})
                turns.append([res.x])
        self.scan = np.unique(np.concatenate(turns))

    def _log(self, x, centers):
        z = (np.asarray(x, dtype=float)[..., None] - centers) / self.b
        return logsumexp(-0.5 * z * z - np.log(self.b), axis=-1) - 0.5 * math.log(2 * math.pi) - math.log(len(centers))

    def log_ratio(self, x):
        return self._log(x, self.q) - self._log(x, self.qi)

    def _side(self, eps, sign, epsabs=1e-13):
        """∫_{sign·L > ε} (num − e^ε den) with num, den = p̂, p̂_i (sign +1) or p̂_i, p̂ (−1)."""
        num, den = (self.q, self.qi) if sign > 0 else (self.qi, self.q)
        g = lambda x: sign * self.log_ratio(x) - eps  # noqa: E731
        vals = g(self.scan)
        cuts = [self.lo]
        for k in np.flatnonzero(np.sign(vals[:-1]) != np.sign(vals[1:])):
            cuts.append(brentq(g, self.scan[k], self.scan[k + 1], xtol=1e-15, rtol=1e-15))
        cuts.append(self.hi)

        def f(x):
            a, c = self._log(x, num), self._log(x, den)
            return math.exp(a) * -math.expm1(min(eps + c - a, 0.0))

        total = 0.0
        for a, c in zip(cuts[:-1], cuts[1:]):
            if c > a and g(0.5 * (a + c)) > 0:
                inner = np.unique(np.r_[a, self.q[(self.q > a) & (self.q < c)], self.qi[(self.qi > a) & (self.qi < c)], c])
                for u, v in zip(inner[:-1], inner[1:]):
                    total += quad(f, u, v, epsabs=epsabs, epsrel=1e-11, limit=200)[0]
        return total

    def delta(self, eps):
        return max(self._side(eps, 1.0), self._side(eps, -1.0))

    def crossed(self, eps, rel, tol=TAU):
        """δ(ε (1 + rel)) ≤ tol < δ(ε (1 − rel)) (or δ(0) ≤ tol for ε = 0): min{ε : δ ≤ tol} is within rel of ε."""
        side = lambda e: max(self._side(e, 1.0, 1e-8 * tol), self._side(e, -1.0, 1e-8 * tol))  # noqa: E731
        if eps == 0:
            return side(0.0) <= tol
        return side(eps * (1 + rel)) <= tol < side(eps * (1 - rel))

    def eps_tol(self, tol=TAU):
        """min{ε : δ(ε) ≤ tol}, each direction by brentq on log δ (δ is decreasing)."""
        out = 0.0
        for sign in (1.0, -1.0):
            top = np.max(sign * self.log_ratio(self.scan))
            if top <= 0 or self._side(0.0, sign, 1e-8 * tol) <= tol:
                continue
            h = lambda e: math.log(max(self._side(e, sign, 1e-8 * tol), 1e-300)) - math.log(tol)  # noqa: E731
            out = max(out, brentq(h, 0.0, top, xtol=1e-13, rtol=1e-12))
        return out


# ------------------------------------------------------------------ cases
def panel(seed, n, rows, shift_scale, variable):
    rng = np.random.default_rng(seed)
    q = np.r_[rng.normal(size=n - 1), 3.0]  # an outlying database: tails matter
    bw = _bandwidths("gaussian", q, 0.4, 0.5 if variable else 0.0)
    model = DensityModel("gaussian", 0.4, 0.5 if variable else 0.0, q, bw, loglik=0.0)
    shifts = rng.normal(size=(rows, n)) * shift_scale[:, None] * (rng.random((rows, n)) < 0.8)
    return model, shifts


def both_paths(model, shifts, eps):
    """(eps_i, delta) by the fast path (series) and the direct path."""
    fast = risk.evaluate(model, shifts, eps)
    keep = _gaussian.MAX_SHIFT
    try:
        _gaussian.MAX_SHIFT = -1.0  # every row evaluated directly
        slow = risk.evaluate(model, shifts, eps)
    finally:
        _gaussian.MAX_SHIFT = keep
    return fast, slow


EPS = np.array([0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
SCALES = np.array([0.002, 0.02, 0.08, 0.3, 0.9])  # shifts of various sizes, in units of the bandwidth 0.4


@pytest.mark.parametrize("seed,variable", [(0, True), (1, False), (2, True)])
def test_fast_direct_and_quadrature_agree(seed, variable):
    model, shifts = panel(seed, 12, len(SCALES), SCALES, variable)
    (e_fast, d_fast), (e_slow, d_slow) = both_paths(model, shifts, EPS)
    # (rows evaluated directly have twice the nodes: the two paths' Hermite models differ by ~4e-10)
    np.testing.assert_allclose(d_fast, d_slow, atol=1e-9, rtol=0)
    np.testing.assert_allclose(e_fast, e_slow, rtol=1e-8, atol=0)
    for r in range(len(shifts)):
        ref = Reference(model, shifts[r])
        want = np.array([ref.delta(e) for e in EPS])
        want[want <= TAU] = 0.0
        np.testing.assert_allclose(d_fast[r], want, atol=1e-8, rtol=0)
        # ε_i(τ) within 1e-6 relative of the reference's root: δ is monotone, so it suffices that
        # the reference's δ crosses τ between ε_i (1 ∓ 1e-6)
        assert ref.crossed(e_fast[r], 1e-6)


def test_eps_i_is_the_tolerance_crossing():
    """δ_i(ε_i) ≤ τ < δ_i(ε_i (1 − 1e-6)) on the quadrature reference, and δ_i is reported 0 from ε_i on."""
    model, shifts = panel(3, 15, 3, np.array([0.05, 0.2, 0.6]), True)
    eps_i, _ = risk.evaluate(model, shifts)
    for r in range(len(shifts)):
        assert Reference(model, shifts[r]).crossed(eps_i[r], 1e-6)
    # and brentq on the reference's log δ finds the same root
    assert eps_i[1] == pytest.approx(Reference(model, shifts[1]).eps_tol(), rel=1e-6)
    _, delta = risk.evaluate(model, shifts, np.sort(np.r_[eps_i, eps_i * 0.99]))
    assert np.all(delta[np.arange(3), np.argsort(np.argsort(np.r_[eps_i, eps_i * 0.99]))[:3]] == 0.0)


def test_certified_bound_covers_eps_i():
    model, shifts = panel(4, 20, 8, np.geomspace(0.01, 1.5, 8), True)
    eps_i, _ = risk.evaluate(model, shifts)
    bound = risk.eps_upper_bound(model, (np.abs(shifts) / model.bandwidths).max(axis=1),
                                 np.count_nonzero(shifts, axis=1))
    assert np.all(eps_i <= bound)
    assert np.all(risk.eps_upper_bound(model, (np.abs(shifts) / model.bandwidths).max(axis=1)) >= bound)



def test_eps_bound_is_the_smallest_certified_eps():
    """The screening bound: share · δ_Gauss(ε; μ) ≤ τ at it and > τ just below it (Newton's result),
    over tiny to huge shifts and shares; 0 for no shift, ∞ for an infinite one."""
    rng = np.random.default_rng(7)
    mu = np.r_[np.geomspace(1e-9, 300, 400), rng.uniform(0.01, 0.2, 200), 0.0, np.inf]
    share = np.r_[rng.uniform(0.01, 1.0, 600), 1.0, 1.0]
    eps = risk.gaussian_eps_bound(mu, share)
    assert eps[-2] == 0.0 and eps[-1] == np.inf
    m, w, e = mu[:-2], share[:-2], eps[:-2]
    assert np.all(w * risk.term_delta("gaussian", e, m) <= TAU)
    # (below μ ~ 1e-6 the curve's τ = 1e-12 is the difference of two terms near 1/2: rounding decides)
    sharp = m > 1e-5
    assert np.all(w[sharp] * risk.term_delta("gaussian", e[sharp] * (1 - 1e-9), m[sharp]) > TAU)
    # and it grows with the shift (one share)
    assert np.all(np.diff(risk.gaussian_eps_bound(np.geomspace(1e-3, 50, 100))) > 0)


def test_term_by_term_bound_covers_delta_and_clears_rows_below_the_floor():
    """(1/n) Σ_j δ_Gauss(ε; |Δ_ij|/b_j) bounds δ_i(ε) and is at most the M_i bound; rows it clears in
    the search for ε_all (``eps_floor``) are those whose ε_i(τ) is at most the floor."""
    model, shifts = panel(6, 25, 30, np.geomspace(0.005, 0.8, 30), True)
    scaled = np.abs(shifts) / model.bandwidths
    eps = np.array([0.0, 0.05, 0.3, 1.0])
    _, delta = risk.evaluate(model, shifts, eps)
    for k, e in enumerate(eps):
        terms = risk.bounds.delta_terms_bound("gaussian", e, scaled)
        assert np.all(delta[:, k] <= terms + 1e-12)
        upper = risk.delta_upper_bound("gaussian", e, scaled.max(axis=1), np.count_nonzero(shifts, axis=1),
                                       len(model.points))
        assert np.all(terms <= upper * (1 + 1e-12))
    eps_i, _ = risk.evaluate(model, shifts)
    floor = float(np.median(eps_i))
    got, _, exact = risk.evaluate(model, shifts, eps_floor=floor, return_exact=True)
    cleared = ~exact
    assert cleared.any() and not cleared.all()
    assert np.all(np.isnan(got[cleared])) and np.all(eps_i[cleared] <= floor)
    above = eps_i > floor
    np.testing.assert_allclose(got[above], eps_i[above], rtol=1e-9)  # (the search starts from the floor)


def test_series_values_match_direct():
    """The series' p̂_i, slope and CDF on a grid against the direct sums, with certified points."""
    model, shifts = panel(5, 30, 40, np.geomspace(0.001, 0.1, 40), True)
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    plan = risk.grid_plan(model, grid)
    nodes = _gaussian.series_nodes(plan, shifts)
    assert nodes is not None
    v, d, c = _gaussian.direct(np.broadcast_to(grid, (len(shifts), len(grid))), model.points[None, :] - shifts,
                               model.bandwidths)
    np.testing.assert_allclose(nodes["pi"], v, rtol=1e-12, atol=0)
    np.testing.assert_allclose(nodes["pir"], d, rtol=0, atol=1e-12 * np.abs(d).max())
    np.testing.assert_allclose(nodes["Fi"], c, rtol=0, atol=1e-13)


def test_absent_individual_and_large_shifts():
    model, shifts = panel(6, 10, 3, np.array([0.0, 3.0, 0.1]), False)
    shifts[0] = 0.0
    (e_fast, d_fast), (e_slow, d_slow) = both_paths(model, shifts, EPS)
    assert e_fast[0] == 0 and np.all(d_fast[0] == 0)
    np.testing.assert_allclose(d_fast, d_slow, atol=1e-9, rtol=0)  # (direct rows: twice the nodes)
    np.testing.assert_allclose(e_fast, e_slow, rtol=1e-8)


# ------------------------------------------------------------------ the series' tiers and certified bounds
def wide_panel(seed, rows, variable):
    """Query values spread over ~30 bandwidths (as on a 10^7-row panel) and small shifts: the outer
    grid points need more terms than the inner ones."""
    rng = np.random.default_rng(seed)
    n = 40
    q = np.sort(rng.normal(scale=6.0, size=n))
    bw = _bandwidths("gaussian", q, 1.0, 0.5 if variable else 0.0)
    model = DensityModel("gaussian", 1.0, 0.5 if variable else 0.0, q, bw, loglik=0.0)
    shifts = rng.normal(size=(rows, n)) * 0.03 * bw[None, :] * rng.uniform(0.5, 2.0, size=(rows, 1))
    return model, shifts


@pytest.mark.parametrize("variable", [False, True])
def test_series_tiers_match_direct(variable):
    """Each grid point's tier (fewest terms that certify it) gives p̂_i, its slope and CDF within the
    certified tolerances of the direct sums; the tiers differ (the outer points need more terms)."""
    model, shifts = wide_panel(7, 50, variable)
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    plan = risk.grid_plan(model, grid)
    cert = plan.certified((np.abs(shifts) / model.bandwidths).max(axis=0))
    tiers, bad = cert.tiers, cert.bad
    assert len(tiers) >= 2 and tiers[0][0] < tiers[-1][0]
    # the segments leave far kernels out of the product, some of them below the points (their CDF counts 1/n)
    n = len(model.points)
    assert min(j1 - j0 for _, _, _, j0, j1, _ in cert.segments) < n // 2
    assert max(int(left.max()) for *_, left in cert.segments) > 0
    assert sorted(g for _, g0, g1, *_ in cert.segments for g in range(g0, g1)) == sorted(
        np.concatenate([pts for _, pts in tiers]).tolist())
    assert sorted(np.concatenate([pts for _, pts in tiers] + [bad]).tolist()) == list(range(len(grid)))
    val, der, cdf = _gaussian.series_values(plan, shifts)
    v, d, c = _gaussian.direct(np.broadcast_to(grid, (len(shifts), len(grid))), model.points[None, :] - shifts,
                               model.bandwidths)
    # certified within SERIES_TOL = 1e-13 (relative; slopes relative to p̂_i / b_min) and CDF_TOL = 1e-14
    # (absolute), plus the rounding of the alternating series where |δ z| ~ 1 (far tails, where the slope
    # is ~|z| p̂_i / b) and of the direct sums
    np.testing.assert_allclose(val, v, rtol=2e-13, atol=0)
    assert np.all(np.abs(der - d) <= 1e-12 * v / model.bandwidths.min())
    np.testing.assert_allclose(cdf, c, rtol=0, atol=2e-14)
    # two terms fewer than the inner tier's fail somewhere in it: its T is not padded
    T, pts = tiers[0]
    W = plan.columns(T)
    delta = shifts[:, plan.order] / plan.b
    coef = delta[:, None, :] ** np.arange(T)[None, :, None] * np.exp(-0.5 * delta * delta)[:, None, :]  # δ^k e^{−δ²/2}
    short = coef[:, :T - 2].reshape(len(shifts), -1) @ W[:T - 2, :, 0][:, :, pts].reshape(-1, len(pts))
    assert np.max(np.abs(short - v[:, pts]) / v[:, pts]) > 2e-13
    # the same kernels in another order (the plan sorts them by q): the same values
    perm = np.random.default_rng(1).permutation(len(model.points))
    shuffled = DensityModel("gaussian", 1.0, model.sensitivity, model.points[perm], model.bandwidths[perm],
                            loglik=0.0)
    again = _gaussian.series_values(risk.grid_plan(shuffled, grid), shifts[:, perm])
    for got, want in zip(again, (val, der, cdf)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14 * np.abs(want).max())


def test_series_points_past_the_terms_are_direct(monkeypatch):
    """Grid points that need more than MAX_TERMS terms are evaluated directly, with the kernels in the
    order the caller gave them (the plan sorts them by q), beside the series' points."""
    model, shifts = wide_panel(9, 30, True)
    perm = np.random.default_rng(2).permutation(len(model.points))
    shuffled = DensityModel("gaussian", 1.0, model.sensitivity, model.points[perm], model.bandwidths[perm],
                            loglik=0.0)
    shifts = shifts[:, perm]
    grid = risk.base_grid(shuffled, shuffled.points[None, :] - shifts)
    plan = risk.grid_plan(shuffled, grid)
    monkeypatch.setattr(_gaussian, "MAX_TERMS", 14)  # (the outer points need up to 16 terms)
    cert = plan.certified((np.abs(shifts[:, plan.order]) / plan.b).max(axis=0))
    assert len(cert.bad) > 10 and len(cert.tiers)
    got = _gaussian.series_values(plan, shifts, cert)
    want = _gaussian.direct(np.broadcast_to(grid, (len(shifts), len(grid))), shuffled.points[None, :] - shifts,
                            shuffled.bandwidths)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-13, atol=2e-14 * np.abs(w).max())


@pytest.mark.parametrize("variable", [False, True])
def test_curvature_bound_holds(variable):
    """L'' ≥ −K on every grid cell (SeriesPlan.curvature) for shifts up to M, at many points of each cell,
    with L'' from the direct sums: (log f)'' = f''/f − (f'/f)²."""
    model, shifts = wide_panel(8, 6, variable)
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    plan = risk.grid_plan(model, grid)
    M = (np.abs(shifts) / model.bandwidths).max(axis=0)
    K = plan.curvature(M)
    t = np.linspace(0.0, 1.0, 9)
    x = (grid[:-1, None] + np.diff(grid)[:, None] * t[None, :]).ravel()
    b = model.bandwidths

    def d2log(centers):
        z = (x[:, None] - centers[None, :]) / b
        phi = np.exp(-0.5 * z * z) / b
        f, f1, f2 = phi.sum(1), (-z / b * phi).sum(1), ((z * z - 1) / b ** 2 * phi).sum(1)
        return f2 / f - (f1 / f) ** 2, f
    base, f = d2log(model.points)
    alive = f > 1e-250 * f.max()  # where both densities are representable
    for row in shifts:
        Lpp = (base - d2log(model.points - row)[0]).reshape(len(grid) - 1, len(t))
        ok = (Lpp >= -K[:, None] * (1 + 1e-9) - 1e-9 / b.min() ** 2) | ~alive.reshape(Lpp.shape)
        assert ok.all()
    inner = (grid[:-1] > model.points.min()) & (grid[1:] < model.points.max())
    assert np.all(np.isfinite(K[inner]))


@pytest.mark.parametrize("variable", [False, True])
def test_delta_without_eps_i_integrates_the_extrema_in_their_intervals(variable):
    """δ_i at a sweep without ε_i (the extrema of L that a level may cross are not nodes: their
    intervals' cuts come from each side's models, cuts._turn_sums) equals δ_i with every extremum a
    node, at many levels and at one, and the quadrature reference; no node is inserted."""
    model, shifts = wide_panel(9, 40, variable)
    eps = np.geomspace(0.01, 0.5, 30)
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    plan = risk.grid_plan(model, grid)
    order = np.argsort((np.abs(shifts) / model.bandwidths).max(axis=1), kind="stable")
    shifts = shifts[order]
    levels = np.unique(np.r_[-eps, eps])
    parts, _ = risk.node_values(model, shifts, grid, plan, levels, None, False)
    turns = parts[0][0].turns
    assert len(parts) == 1 and parts[0][0].x.shape[1] == len(grid)  # no node inserted
    assert len(turns[0]) > 100 and np.any(turns[3] > 0) and np.any(turns[3] < 0)  # extrema of both signs
    _, every = risk.evaluate(model, shifts, eps, grid=grid, plan=plan, need_eps_i=True)
    _, some = risk.evaluate(model, shifts, eps, grid=grid, plan=plan, need_eps_i=False)
    # (with ε_i, δ_i is reported 0 from ε_i(τ) on, where it is at most τ)
    np.testing.assert_allclose(np.where(some <= TAU, 0.0, some), np.where(every <= TAU, 0.0, every), rtol=0, atol=3e-13)
    assert np.count_nonzero(every) > 100
    for k in (0, 12, 29):  # one level at a time: the sweep's single-level path
        _, one = risk.evaluate(model, shifts, eps[k:k + 1], grid=grid, plan=plan, need_eps_i=False)
        np.testing.assert_allclose(one[:, 0], some[:, k], rtol=0, atol=3e-13)
    worst = np.argsort(np.abs(some - every).max(axis=1))[-3:]
    for r in worst:  # as close to the reference as with the extrema as nodes (whose error here is 3.5e-11)
        ref = Reference(model, shifts[r])
        for k in (0, 10, 20):
            q = ref.delta(eps[k])
            assert abs(some[r, k] - q) <= abs(every[r, k] - q) + 3e-13 and abs(some[r, k] - q) < 1e-10


def test_tolerance_eps_whole_intervals_once(monkeypatch):
    """ε_i(τ) with the whole intervals' Gauss-point integrals taken once per floor equals ε_i(τ) with
    every interval integrated at each Newton step."""
    model, shifts = panel(10, 15, 6, np.array([0.02, 0.05, 0.1, 0.2, 0.4, 0.8]), True)
    fast, _ = risk.evaluate(model, shifts)
    init = _gaussian._Intervals.__init__

    def slow_init(self, *args):
        init(self, *args)
        self.smin = np.full_like(self.smin, -np.inf)  # no interval takes the shortcut
    monkeypatch.setattr(_gaussian._Intervals, "__init__", slow_init)
    slow, _ = risk.evaluate(model, shifts)
    np.testing.assert_allclose(fast, slow, rtol=1e-9, atol=0)
    assert np.all(fast > 0)


def test_large_shifts_against_quadrature():
    """Rows shifted by many bandwidths (evaluated directly) match the quadrature reference within 1e-7
    at large ε: there p̂_i's mass lies far left of p̂'s, its CDF is 1 to double precision where
    L > ε, and e^ε multiplies the masses taken from it (5.7e-3 of δ_i lost from CDF differences
    instead of upper tails; 1.5e-6 with the ordinary node spacing instead of half of it)."""
    model, shifts = wide_panel(12, 2, False)
    shifts[0] += 16.0 * model.bandwidths
    shifts[1, :20] += 12.0 * model.bandwidths[:20]
    eps = np.array([2.0, 10.0, 30.0, 60.0, 90.0])
    _, delta = risk.evaluate(model, shifts, eps)
    for r in range(len(shifts)):
        ref = Reference(model, shifts[r])
        want = np.array([ref.delta(e) for e in eps])
        want[want <= TAU] = 0.0
        np.testing.assert_allclose(delta[r], want, atol=1e-7, rtol=0)
    assert delta[:, -1].min() > 1e-3


@pytest.mark.parametrize("direct", [False, True])
def test_eps_floor_skips_only_the_rows_below_it(direct):
    """With ``eps_floor``, ε_i(τ) is NaN exactly where it is at most the floor, and the same value elsewhere
    (on the series path and the direct path)."""
    model, shifts = panel(11, 15, 12, np.geomspace(0.01, 0.9, 12), True)
    keep = _gaussian.MAX_SHIFT
    try:
        if direct:
            _gaussian.MAX_SHIFT = -1.0
        full, _ = risk.evaluate(model, shifts)
        floor = float(np.median(full))
        part, _ = risk.evaluate(model, shifts, eps_floor=floor)
    finally:
        _gaussian.MAX_SHIFT = keep
    below = full <= floor
    assert 0 < below.sum() < len(full)
    assert np.all(np.isnan(part[below])) and not np.isnan(part[~below]).any()
    # (the search's bracket may start at the floor: the same root within its relative width 1e-10)
    np.testing.assert_allclose(part[~below], full[~below], rtol=1e-9, atol=0)


def test_far_outlying_database_keeps_the_series():
    """A database ~2,500 scales from the others (its kernel underflows where e^{M|z|} overflows) leaves the
    series certified on the bulk's grid points, with the direct sums' values there."""
    rng = np.random.default_rng(0)
    n = 50
    q = np.r_[rng.normal(size=n - 1), 1000.0]
    bw = _bandwidths("gaussian", q, 0.4, 0.0)
    model = DensityModel("gaussian", 0.4, 0.0, q, bw, loglik=0.0)
    shifts = rng.uniform(-0.1, 0.1, size=(20, n)) * bw
    shifts[:, -1] = 0.5 * bw[-1]
    grid = risk.base_grid(model, model.points[None, :] - shifts)
    plan = risk.grid_plan(model, grid)
    cert = plan.certified((np.abs(shifts) / bw).max(axis=0))
    bulk = np.flatnonzero((grid > q[:-1].min()) & (grid < q[:-1].max()))
    assert len(bulk) > 20 and not np.isin(bulk, cert.bad).any()
    val, der, cdf = _gaussian.series_values(plan, shifts)
    v, d, c = _gaussian.direct(np.broadcast_to(grid, (len(shifts), len(grid))), model.points[None, :] - shifts, bw)
    np.testing.assert_allclose(val[:, bulk], v[:, bulk], rtol=1e-13, atol=0)
    np.testing.assert_allclose(cdf[:, bulk], c[:, bulk], rtol=0, atol=2e-14)


def test_plan_cache_shares_a_plan_and_changes_no_bit():
    """Blocks on the same grid share one plan (its series columns built once), with the same results
    as a plan of their own; a block on another grid gets a new plan; a plan's columns for fewer terms
    are the first rows of those for more (so threads sharing it may use whichever array they got)."""
    from empdp.risk import blocks

    model, shifts = wide_panel(11, 60, False)
    eps = np.geomspace(0.01, 0.5, 12)
    a, b = shifts[:30], shifts[30:]
    grid = risk.base_grid(model, model.points[None, :] - a)
    assert np.array_equal(grid, risk.base_grid(model, model.points[None, :] - b))
    plans = blocks.PlanCache(model)
    blocks.evaluate_block(model, a, eps, False, None, None, plans=plans)
    shared = plans.plan(grid)
    cached = blocks.evaluate_block(model, b, eps, False, None, None, plans=plans)
    assert plans.plan(grid) is shared
    own = blocks.evaluate_block(model, b, eps, False, None, None)
    for got, want in zip(cached, own):
        np.testing.assert_array_equal(got, want)
    far = b.copy()
    far[0, 0] = 40.0 * model.bandwidths[0]  # a kink far from every point: a node of its own
    assert plans.plan(risk.base_grid(model, model.points[None, :] - far)) is not shared
    fresh = risk.grid_plan(model, grid)
    few, many = fresh.columns(5), shared.columns(20)
    np.testing.assert_array_equal(many[:len(few)], few)


def test_far_shifted_row_matches_brute_force():
    """An individual who moves every database's value by ~16.7 kernel scales (a large persistent effect)
    is evaluated directly on the grid cut into ⌈M/4⌉ parts per interval: δ_i within 2e-8 of brute-force
    quadrature at every level (on the grid's midpoints only, as before, it was off by 4.3e-7)."""
    from reference import brute_force_risk

    rng = np.random.default_rng(5)
    n = 30
    q = np.sort(rng.normal(scale=3.0, size=n))
    model = DensityModel("gaussian", 1.0, 0.0, q, np.ones(n), loglik=0.0)
    shifts = 16.7 + rng.normal(size=(1, n)) * 0.02
    eps_i, _ = risk.evaluate(model, shifts)
    eps = np.linspace(0.05, 0.6, 12) * eps_i[0]
    _, delta = risk.evaluate(model, shifts, eps, need_eps_i=False)
    want = np.array(brute_force_risk(model, shifts[0], eps)[0])
    assert want[-1] > 0.01  # every level is well inside the risky range
    np.testing.assert_allclose(delta[0], want, rtol=0, atol=2e-8)


def test_outlying_database_gap_matches_brute_force():
    """One database 56 scales from the others: between them the CDF stays at the share of the kernels
    on one side, and differences of F (or of 1 − F) lost every digit that e^ε multiplies (5e-3 of
    δ_i at ε = 44 for an individual shifting the other databases by ~10 scales; 4.4e-7 at ε = 34 for
    one moving the outlier by 5). The directly evaluated nodes carry each kernel's smaller tail."""
    from reference import brute_force_risk

    q = np.array([1.9678720123876419, 10.551392166585341, 6.265913883235744, 4.405681564477476,
                  4.398320988594126, 3.706636440224794, 5.830111903128308, 79.65042447385278])
    b = 1.235769754779552
    model = DensityModel("gaussian", b, 0.0, q, np.full(8, b), loglik=0.0)
    shifts = np.array([[0, 0, 0, 0, 0, 0, 0, -6.17884877389776],
                       [-12.26345471157591, -11.94458531466214, -12.230667320859393, 0,
                        -11.956885662593946, -11.698019652773622, -12.002081530916628, 0]])
    eps = np.array([34.17044347442015, 44.193773560250065])
    _, delta = risk.evaluate(model, shifts, eps, need_eps_i=False)
    for r in range(2):
        want = np.array(brute_force_risk(model, shifts[r], eps)[0])
        np.testing.assert_allclose(delta[r], want, rtol=1e-6, atol=1e-10)
    assert delta[1, 1] > 0.07


def test_variable_bandwidths_grid_reaches_the_widest_shifted_kernel():
    """Variable bandwidths and every kernel shifted 40 units: the grid must reach 12 of its own
    scales beyond each shifted kernel, not 12 of the narrowest (the grid stopped 8 units short of the
    widest one's tail: ε_i(τ) was 431.7 instead of 449.18, and δ_i(440) 7e-15 instead of 1.0e-10)."""
    rng = np.random.default_rng(0)
    n = 10
    q = np.sort(rng.normal(size=n) * 8.0)
    b = rng.uniform(0.5, 2.0, n)
    model = DensityModel("gaussian", 1.0, 0.5, q, b, loglik=0.0)
    shifts = np.full((1, n), -40.0)
    ref = Reference(model, shifts[0])
    eps_i, _ = risk.evaluate(model, shifts)
    assert eps_i[0] == pytest.approx(ref.eps_tol(), rel=1e-6)
    eps = np.array([400.0, 440.0])
    _, delta = risk.evaluate(model, shifts, eps, need_eps_i=False)
    np.testing.assert_allclose(delta[0], [ref.delta(e) for e in eps], rtol=1e-6)


@pytest.mark.filterwarnings("error")
def test_eps_beyond_double_precision_is_said_to_be_a_lower_bound():
    """One individual dominating every database (~100 bandwidths): its ε_i(τ) is in the thousands, past
    where e^ε and the densities' ratio fit in a float64 (Gaussian log-densities floor at −745). The
    assessment says that ε_all and such ε_i are lower bounds, and no numpy overflow warning escapes
    (e^ε ∫ e^D is one exponential: e^ε alone overflowed beyond ε = 709)."""
    import polars as pl

    import empdp

    rng = np.random.default_rng(3)
    frames = []
    for db in range(30):
        x = rng.normal(10, 1, size=40)
        x[0] = 400.0
        frames.append(pl.DataFrame({"db": db, "id": np.arange(40), "x": x}))
    a = empdp.assess(pl.concat(frames), id="id", by="db", query="mean(x)", model=Model(kernel="gaussian"))
    assert a.eps_all >= 700
    assert any("lower bounds" in w and "700" in w for w in a.warnings)
