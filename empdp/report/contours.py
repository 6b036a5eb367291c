"""The joint density p̂ and p̂_i on a grid over two statistics, for the joint report's contour plots
(docs/method.md#102-joint-queries, issue 19).

For d = 2 the grid holds the model density itself; for d = 3 it holds the 2-D margin of the pair,
the third statistic integrated out in closed form: along a line x_c ↦ x the scaled coordinates are
u = c + t x_c, so each kernel is e^{−Σ_k |c_k + t_k x_c|}, a convex piecewise-linear exponent with at
most three kinks, integrated exactly segment by segment (log space; no quadrature error).

Two statistics correlated over the databases (|r| ≥ :data:`SHEAR_CORRELATION`, as a sum and the
same sum without one individual) put the density on a ridge far narrower than their range; the grid
is then sheared, its vertical axis the second statistic less its least-squares line on the first
(x_j − α − β x_i, still in x_j's units). The shear has Jacobian 1, so the densities are unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

#: grid points per axis of a contour plot
GRID = 120
#: |correlation| of a pair over the databases from which its grid is sheared along the ridge
SHEAR_CORRELATION = 0.9
#: points of the grid evaluated per block (bounds the (block, n, d) temporaries)
BLOCK = 2048


@dataclass
class DensityGrid:
    """p̂ and p̂_i of the pair ``axes`` = (i, j) (0-based statistics) on the grid ``x`` × ``y``.

    The grid point (x, y) is x_i = x, x_j = y + ``intercept`` + ``slope`` · x (both 0 unless the grid
    is sheared). ``log_p`` and ``log_p_i`` have shape (len(y), len(x)) (rows along y, as matplotlib's
    contour takes them); for d = 3 they are the pair's 2-D margins.
    """

    axes: tuple
    x: np.ndarray
    y: np.ndarray
    log_p: np.ndarray
    log_p_i: np.ndarray
    slope: float = 0.0
    intercept: float = 0.0

    @property
    def sheared(self) -> bool:
        return self.slope != 0.0 or self.intercept != 0.0

    @property
    def p(self) -> np.ndarray:
        return np.exp(self.log_p)

    @property
    def p_i(self) -> np.ndarray:
        return np.exp(self.log_p_i)

    def points(self, xy: np.ndarray) -> np.ndarray:
        """The (m, 2) grid coordinates ``xy`` as values of the statistics (x_i, x_j)."""
        return np.column_stack([xy[:, 0], xy[:, 1] + self.intercept + self.slope * xy[:, 0]])

    def coordinates(self, pts: np.ndarray) -> np.ndarray:
        """Values (m, d) of the statistics as grid coordinates (m, 2): the inverse of :meth:`points`."""
        i, j = self.axes
        return np.column_stack([pts[:, i], pts[:, j] - self.intercept - self.slope * pts[:, i]])


def shear(model, axes) -> tuple[float, float]:
    """(slope, intercept) of x_j on x_i over the databases when they are strongly correlated, else (0, 0)."""
    xi, xj = model.points[:, axes[0]], model.points[:, axes[1]]
    r = np.corrcoef(xi, xj)[0, 1]
    if not abs(r) >= SHEAR_CORRELATION:
        return 0.0, 0.0
    slope = float(np.cov(xi, xj)[0, 1] / np.var(xi, ddof=1))
    return slope, float(xj.mean() - slope * xi.mean())


def kernel_extent(model, v: np.ndarray) -> float:
    """How far one kernel reaches along the linear functional v · x, in its units: Σ_l |v · W⁻¹_{:l}| b_l."""
    return float(np.abs(v @ model.unwhitening) @ model.scales)


def log_margin(model, xy: np.ndarray, axes, shifts=None) -> np.ndarray:
    """log of the 2-D margin of p̂ (or p̂_i with ``shifts`` (n, d)) over the statistics ``axes``, at
    the (m, 2) points ``xy``; for d = 2 this is ``model.logpdf``."""
    if model.d == 2:
        x = np.empty((len(xy), 2))
        x[:, list(axes)] = xy
        return model.logpdf(x, shifts=shifts)
    (c_ax,) = [k for k in range(model.d) if k not in axes]
    T = model.transform
    pts = model.points if shifts is None else model.points - np.asarray(shifts, dtype=float)
    t = T[:, c_ax]                                   # u changes by t per unit of the integrated statistic
    a = pts @ T.T                                    # kernel centres (n, d) in scaled coordinates
    slope = np.abs(t).sum()                          # > 0: T is invertible
    safe = np.where(t == 0, 1.0, t)
    out = np.empty(len(xy))
    for s in range(0, len(xy), BLOCK):
        u0 = xy[s:s + BLOCK] @ T[:, list(axes)].T    # (m, d): u at x_c = 0
        c = u0[:, None, :] - a[None, :, :]          # (m, n, d)
        # kinks where c_k + t_k z = 0; a statistic the line does not move adds a constant, no kink
        z = np.where(t == 0, 0.0, -c / safe)
        z.sort(axis=-1)
        f = np.abs(c[..., None, :] + t * z[..., :, None]).sum(-1)  # (m, n, 3): the exponent at the kinks
        gap = np.diff(z, axis=-1)
        df = np.abs(np.diff(f, axis=-1))
        with np.errstate(divide="ignore", invalid="ignore"):
            # ∫ over a segment of e^{−f}, f linear: gap · e^{−min f} · (1 − e^{−|Δf|}) / |Δf|
            factor = np.where(df > 1e-12, -np.expm1(-df) / np.where(df > 0, df, 1.0), 1.0)
            inner = np.log(gap) + np.log(factor) - np.minimum(f[..., 1:], f[..., :-1])
        tails = -f[..., [0, -1]] - math.log(slope)   # ∫ beyond the outer kinks: e^{−f}/Σ|t_k|
        pieces = np.concatenate([inner, tails], axis=-1).reshape(len(c), -1)
        out[s:s + BLOCK] = logsumexp(pieces, axis=-1)
    return out - math.log(model.n) - model.d * math.log(2.0) + math.log(abs(np.linalg.det(T)))


def density_grid(model, shifts, axes=(0, 1), pad: float = 3.0) -> DensityGrid:
    """p̂ and p̂_i (the points shifted by the individual's ``shifts`` (n, d)) of the pair ``axes``, on a
    grid over the points with and without the individual and ``pad`` kernel extents beyond them."""
    axes = tuple(int(k) for k in axes)
    slope, intercept = shear(model, axes)
    frame = DensityGrid(axes, np.empty(0), np.empty(0), np.empty(0), np.empty(0), slope, intercept)
    uv = frame.coordinates(np.concatenate([model.points, model.points - shifts]))
    unit = np.eye(model.d)
    lines = []
    for k, v in enumerate((unit[axes[0]], unit[axes[1]] - slope * unit[axes[0]])):
        reach = pad * kernel_extent(model, v)
        lines.append(np.linspace(uv[:, k].min() - reach, uv[:, k].max() + reach, GRID))
    X, Y = np.meshgrid(*lines)
    xy = frame.points(np.column_stack([X.ravel(), Y.ravel()]))
    return DensityGrid(axes, lines[0], lines[1], log_margin(model, xy, axes).reshape(X.shape),
                       log_margin(model, xy, axes, shifts=shifts).reshape(X.shape), slope, intercept)


def pairs(d: int) -> list[tuple]:
    """The pairs of statistics drawn: the one pair for d = 2, all three for d = 3."""
    return [(i, j) for i in range(d) for j in range(i + 1, d)]
