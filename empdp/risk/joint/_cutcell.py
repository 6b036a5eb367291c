"""Exact integrals over one cut cell of the d = 2 grid (docs/method.md#102-joint-queries).

On a cell [0, w1] × [0, w2] the integrand p̂ − e^ε p̂_i is four terms D e^{±t1 ± t2}. For fixed t2 it
is α e^{−t1} + β e^{−(w1−t1)} along t1, whose positive part integrates in closed form
(:func:`pos_1d`); :func:`cell_integral` integrates that along t2, in closed form where the root
stays outside the cell and by Gauss–Legendre on the square root where it crosses.
"""

from __future__ import annotations

import numpy as np

#: widest piece (scaled units) of the Gauss–Legendre axis: 4 nodes on e^{±t} over 0.5 err ~1e−12 relative
MAX_PIECE = 0.5
#: most pieces per interval between edge roots
MAX_PARTS = 256
#: Gauss–Legendre nodes per piece when the nearest singularity of the piece's integrand is far
FAST_NODES = 6
#: "far": at least this many piece lengths beyond the piece (Bernstein ρ ≥ 7 + √48 ≈ 13.9: ρ^{−12} ≈ 2e−14)
SAFE_DISTANCE = 3.0

_GL = {q: np.polynomial.legendre.leggauss(q) for q in (2, 3, 4, 6, 8)}


def _rule(nodes: int):
    """Gauss–Legendre nodes and weights for ``nodes`` points (any count ≥ 1; the usual ones cached)."""
    if nodes not in _GL:
        if int(nodes) != nodes or nodes < 1:
            raise ValueError(f"nodes must be a whole number >= 1, got {nodes!r}")
        _GL[int(nodes)] = np.polynomial.legendre.leggauss(int(nodes))
    return _GL[nodes]


def pos_1d(alpha, beta, f):
    """∫_0^w (α e^{−t} + β e^{−(w−t)})_+ dt with f = e^{−w}: exact (one root at most).

    The root t* (α e^{−2t*} = −β f) lies inside when α β < 0 and f² < −β f/α < 1; then the part
    on the positive side is (√P − √(−f N))², P the positive and N the negative coefficient (no
    cancellation). Otherwise the integrand keeps the sign of α + β (its value at w/2 up to e^{−w/2}).
    """
    total = (alpha + beta) * (1.0 - f)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = -beta * f / alpha
    inside = _opposite(alpha, beta) & (ratio > f * f) & (ratio < 1.0)
    pos, neg = np.maximum(alpha, beta), np.minimum(alpha, beta)
    cut = np.square(np.sqrt(np.maximum(pos, 0.0)) - np.sqrt(np.maximum(-f * neg, 0.0)))
    return np.where(inside, cut, np.where(alpha + beta > 0, np.maximum(total, 0.0), 0.0))


def _opposite(x, y):
    """x and y nonzero of opposite signs, by their signs: the product overflows (a warning) or
    underflows to −0.0 (a root lost) for coefficients e^{±500} apart."""
    return ((x > 0) & (y < 0)) | ((x < 0) & (y > 0))


def cell_integral(D, w1, w2, nodes, tol):
    """∫∫ (h)_+ over [0, w1] × [0, w2] for h = D−− e^{−t1−t2} + D+− e^{−(w1−t1)−t2} + D−+ e^{−t1−(w2−t2)}
    + D++ e^{−(w1−t1)−(w2−t2)} (D: (N, 4) in that order), one compiled loop over the cells
    (:func:`._compiled.cut_cells_2d`): exact along the wider axis, Gauss–Legendre along the other on
    pieces between the edge roots, :data:`FAST_NODES` per piece where the nearest singularity is at
    least :data:`SAFE_DISTANCE` piece lengths away, else ``nodes`` per piece, halved until two rules
    agree within ``tol``.
    """
    from ._compiled import cut_cells_2d  # numba: loaded by the first cut cell only

    D = np.ascontiguousarray(D, dtype=np.float64)
    fx, fw = _rule(FAST_NODES)
    ax, aw = _rule(nodes)
    return cut_cells_2d(D, np.ascontiguousarray(w1, dtype=np.float64), np.ascontiguousarray(w2, dtype=np.float64),
                        fx, fw, ax, aw, float(tol), MAX_PIECE, SAFE_DISTANCE, MAX_PARTS)
