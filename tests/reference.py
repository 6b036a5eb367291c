"""Slow, obvious reference implementations the tests compare against."""

import numpy as np

from empdp.density import DensityModel


def brute_force_risk(model: DensityModel, shifts: np.ndarray, eps: np.ndarray, points: int = 400_001):
    """δ_i(ε) and ε_i by direct evaluation of both densities on a dense per-individual grid.

    The grid spans 46 (Laplace) or 12 (Gaussian) kernel scales beyond every
    point of both samples and contains every kink; the integrand's positive part is
    integrated with the trapezoid rule after locating sign changes linearly.
    """
    q, b = model.points, model.bandwidths
    kinks = q - shifts
    reach = 46 if model.kernel == "laplace" else 12
    lo = min((q - reach * b).min(), (kinks - reach * b).min())
    hi = max((q + reach * b).max(), (kinks + reach * b).max())
    x = np.unique(np.r_[np.linspace(lo, hi, points), q, kinks])
    p = model.pdf(x)
    pi = model.pdf(x, shifts)
    out = []
    for e in np.atleast_1d(eps):
        d = []
        for a, c in ((p, pi), (pi, p)):
            g = a - np.exp(e) * c
            # exact positive part of the piecewise-linear interpolant of g
            g0, g1, h = g[:-1], g[1:], np.diff(x)
            both = (g0 >= 0) & (g1 >= 0)
            area = np.where(both, 0.5 * (g0 + g1) * h, 0.0)
            cross = (g0 > 0) != (g1 > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                frac = np.where(cross, np.maximum(g0, g1) / np.abs(g1 - g0), 0.0)
            area += np.where(cross & ~both, 0.5 * np.maximum(g0, g1) * frac * h, 0.0)
            d.append(area.sum())
        out.append(max(d))
    if model.kernel == "laplace":
        eps_i = np.abs(np.log(p) - np.log(pi)).max()
    else:
        # the region outside of which both densities have < 1e-13 mass per side, by root finding
        from scipy.optimize import brentq
        from scipy.stats import norm

        def logcdf(z, pts, upper):
            u = (z - pts) / b
            vals = norm.logsf(u) if upper else norm.logcdf(u)
            return np.logaddexp.reduce(vals) - np.log(len(pts))

        def edge(upper):
            def f(z):
                return max(logcdf(z, q, upper), logcdf(z, kinks, upper)) - np.log(1e-13)
            return brentq(f, lo, hi, xtol=1e-14 * b.min(), rtol=1e-15)

        a, c = edge(False), edge(True)
        xs = np.r_[a, x[(x > a) & (x < c)], c]
        eps_i = np.abs(model.logpdf(xs) - model.logpdf(xs, shifts)).max()
    return np.array(out), eps_i
