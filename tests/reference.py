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


def laplace_quadrature_delta(q, b, shift, eps):
    """δ_i(ε) for Laplace kernels (one scale ``b``, or one bandwidth per kernel): the larger over both
    directions of ∫ (p − e^ε p_i)_+, by quad on the pieces between the kinks and the integrand's
    roots (brentq), independent of the closed form and of the grid path."""
    from scipy.integrate import quad
    from scipy.optimize import brentq

    q = np.asarray(q, dtype=float)
    b = np.broadcast_to(np.asarray(b, dtype=float), q.shape)

    def density(centres):
        return lambda x: (np.exp(-np.abs(x - centres) / b) / (2 * b)).sum() / len(q)

    p, pi = density(q), density(q - shift)
    nodes = np.unique(np.r_[q, q - shift])
    out = []
    for a, c in ((p, pi), (pi, p)):
        def g(x):
            return a(x) - np.exp(eps) * c(x)

        total = 0.0
        for lo, hi in ((-np.inf, nodes[0]), (nodes[-1], np.inf)):  # tails: one sign each
            total += max(quad(g, lo, hi, epsabs=1e-15, epsrel=1e-13)[0], 0.0)
        for x0, x1 in zip(nodes[:-1], nodes[1:]):
            g0, g1 = g(x0), g(x1)
            if g0 >= 0 and g1 >= 0:
                total += quad(g, x0, x1, epsabs=1e-15, epsrel=1e-13)[0]
            elif g0 > 0 or g1 > 0:  # one sign change on the piece (one-signed exponential sum)
                r = brentq(g, x0, x1, xtol=1e-15, rtol=1e-15)
                lo, hi = (x0, r) if g0 > 0 else (r, x1)
                total += quad(g, lo, hi, epsabs=1e-15, epsrel=1e-13)[0]
        out.append(total)
    return max(out)
