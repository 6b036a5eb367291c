"""The node grid of the general path (variable bandwidths, Gaussian kernels): where p̂ and p̂_i
are evaluated for a block of individuals, and what such a grid may cost in memory
(docs/method.md#52-exact-delta-and-epsilon-for-one-individual).
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..density import DensityModel
from ..errors import InputError
from . import cells as _cells

_STEP = 1.0 / 6.0  # node spacing, in kernel scales, where the kernels carry mass

#: bytes per grid node and kernel term (+ 2) at the peak of a plan and its evaluation (measured:
#: 21–30 × 8 with a few rows, the matrix form's (2n × 3G) product and its chunks dominating)
GRID_NODE_BYTES = 8 * 32


#: a grid is refused for memory only beyond this many nodes per point (normal grids have a few
#: dozen: b/6 spacing within 4 scales); 5,000 daily databases make a large grid, not a wrong one
ABNORMAL_NODES_PER_POINT = 200


def grid_bytes(nodes: int, n: int) -> int:
    """Estimated peak memory of :func:`grid_plan` and :func:`evaluate` on a grid of ``nodes`` nodes."""
    return GRID_NODE_BYTES * int(nodes) * (n + 2)


def _check_grid(model: DensityModel, pts: np.ndarray, nodes: int, budget: float | None, labels=None) -> None:
    """Refuse (InputError) a grid of ``nodes`` nodes (around ``pts``), abnormally many per point,
    whose :func:`grid_bytes` exceed ``budget`` bytes, before it is built."""
    need = grid_bytes(nodes, len(model.points))
    if budget is None or need <= budget or nodes <= ABNORMAL_NODES_PER_POINT * len(pts):
        return  # a grid of normal size is not refused: many databases make it large, not wrong
    q, b = model.points, model.bandwidths
    span = float(pts.max() - pts.min())
    dev = np.abs(q - np.median(q))
    far = int(np.argmax(dev))
    outlier = ""
    if dev[far] > 10 * np.median(dev):  # one value far from the others' spread: name it
        name = f"database {labels[far]}" if labels is not None else "the database"
        outlier = f", or inspect {name}, whose value {q[far]:.6g} lies far from the others"
    raise InputError(
        f"the density grid would need ~{nodes:,} nodes, ~{need / 1e9:.3g} GB, over the memory limit "
        f"({budget / 1e9:.3g} GB): the query values and their leave-one-out values span {span:.4g}, "
        f"{span / b.min():.3g} times the smallest kernel bandwidth {b.min():.3g}; pass a larger --bandwidth "
        f"(or --bandwidth auto) or a larger --memory-limit{outlier}")


def base_grid(model: DensityModel, extra_points: np.ndarray | None = None, budget: float | None = None,
              labels=None) -> np.ndarray:
    """Shared nodes: every q_j (Laplace kernels: their kinks), spacing b/6 where kernels carry mass, geometric in the tails.

    ``extra_points``: kinks that may need nodes, flat, or (rows, n) with column j the kinks of
    term j (q_j − Δ_ij): then a kink within 3 b_min of its own q_j is left out at once (its
    nearest q on either side is no farther, so the rule below leaves it out too; it spares
    that rule's searches on the ~10^6 kinks of a block).

    With ``budget`` (bytes), an abnormally large grid (over ABNORMAL_NODES_PER_POINT nodes per
    point, e.g. from a bandwidth of 10^-9 of the values' spread) whose plan and evaluation would
    need more (:func:`grid_bytes`) is refused with an :class:`~empdp.errors.InputError` before it is built
    (naming the outlying database by ``labels``, the databases' names, when given).
    """
    q, b = model.points, model.bandwidths
    pts, bws = q, b
    if extra_points is not None and np.size(extra_points):
        # only kinks outside the finely gridded neighbourhood of the q_j need nodes of their own
        # (each kink keeps its own term's bandwidth where known: its kernel's tails reach that far)
        g = b.min() * _STEP
        extra = np.asarray(extra_points, dtype=float)
        if extra.ndim == 2 and extra.shape[1] == len(q):
            keep = np.abs(extra - q[None, :]) > 3.0 * b.min()
            eb, extra = np.broadcast_to(b, extra.shape)[keep], extra[keep]
        else:
            extra = extra.ravel()
            eb = np.full(len(extra), b.min())
        qs = np.argsort(q)
        k = np.clip(np.searchsorted(q[qs], extra), 1, len(q) - 1)
        near = np.minimum(np.abs(extra - q[qs][k - 1]) / b[qs][k - 1], np.abs(q[qs][k] - extra) / b[qs][k])
        far = near > 3.0
        if len(extra):  # the outermost kinks too where their kernels reach 3 of their scales past the points'
            reach = model.kernel.reach
            lo, hi = np.argmin(extra - reach * eb), np.argmax(extra + reach * eb)
            far[lo] |= extra[lo] - reach * eb[lo] < (q - reach * b).min() - 3.0 * eb[lo]
            far[hi] |= extra[hi] + reach * eb[hi] > (q + reach * b).max() + 3.0 * eb[hi]
        key, eb = np.round(extra[far] / g) * g, eb[far]
        order = np.lexsort((-eb, key))  # one node per rounded kink, with the widest bandwidth there
        key, eb = key[order], eb[order]
        first = np.r_[True, np.diff(key) != 0] if len(key) else np.zeros(0, dtype=bool)
        pts, bws = np.r_[q, key[first]], np.r_[b, eb[first]]
    order = np.argsort(pts)
    pts, bws = pts[order], bws[order]
    reach = model.kernel.reach
    template = np.r_[-np.geomspace(reach, 4, 24), np.linspace(-4, 4, 49)[1:-1], np.geomspace(4, reach, 24)]
    prov = np.unique((pts[:, None] + bws[:, None] * template[None, :]).ravel())
    prov = _fill_gaps(prov, pts, bws, reach, model.kernel.far_gap)
    # local spacing: b/6 within 4 scales of the nearest point, growing like distance/24 beyond
    k = np.clip(np.searchsorted(pts, prov), 1, len(pts) - 1)
    dl, dr = np.abs(prov - pts[k - 1]), np.abs(pts[k] - prov)
    s_left = np.maximum(bws[k - 1], dl / 4)
    s_right = np.maximum(bws[k], dr / 4)
    spacing = _STEP * np.minimum(s_left, s_right)
    # place nodes at equal steps of ∫ dx / spacing(x)
    dens = 1.0 / spacing
    cum = np.r_[0.0, np.cumsum(np.diff(prov) * 0.5 * (dens[1:] + dens[:-1]))]
    _check_grid(model, pts, int(min(cum[-1], 2.0**62)) + 3 + len(q), budget, labels)
    nodes = np.interp(np.arange(0, np.floor(cum[-1]) + 1), cum, prov)
    if not model.kernel.kinked:  # a smooth kernel (Gaussian) has no kink at its q_j: the spacing suffices
        return np.unique(np.r_[nodes, prov[0], prov[-1]])
    return np.unique(np.r_[nodes, prov[0], prov[-1], q])


#: :attr:`empdp.kernels.Kernel.far_gap` by kernel name (the former table)
FAR_GAP = {name: k.far_gap for name, k in kernels.KERNELS.items()}


def _fill_gaps(prov: np.ndarray, pts: np.ndarray, bws: np.ndarray, reach: float, far: float) -> np.ndarray:
    """Provisional nodes in the far parts of the gaps between the points' neighbourhoods.

    ``far`` is the distance, in the kernel scales of a gap's end point, from which a gap between the
    points' neighbourhoods gets nodes of its own (:attr:`empdp.kernels.Kernel.far_gap`): that
    point's kernel is below e^{−684} there.

    Nodes are placed at equal steps of ∫ dx / spacing, by the trapezoid rule between provisional
    nodes. Across a gap without provisional nodes that integrand stays at its value at the gap's
    ends (spacing ≈ b · reach/24), so a gap of D kernel scales took ~D/2 nodes: 10^9 at a bandwidth
    of 10^−9 of the query values' spread, 23 GB of grid. With nodes from ``far``
    scales of each end point on, at the template's geometric ratio up to the gap's middle, the spacing grows
    like distance/24 there, as :func:`base_grid` intends: ~50 ln(D / 2 far) nodes. A gap
    narrower than 2 far scales gets none, so its grid is unchanged. The wider spacing is
    where the end points' kernels are below e^{−700} (0 in float64 from the next node on) and
    every kernel is beyond 46 of its scales (mass < 1e-20): the integrals lose nothing there.
    """
    lo, hi = pts - reach * bws, pts + reach * bws
    top = np.maximum.accumulate(hi)  # pts are sorted: how far right the points up to k reach,
    low = np.minimum.accumulate(lo[::-1])[::-1]  # and how far left those from k on reach
    k = np.flatnonzero(low[1:] > top[:-1])  # no neighbourhood meets (top[k], low[k + 1])
    if not len(k):
        return prov
    a, c = pts[k], pts[k + 1]
    half = np.r_[0.5 * (c - a), 0.5 * (c - a)]
    start, sign = np.r_[a, c], np.r_[np.ones(len(k)), -np.ones(len(k))]
    d0 = np.r_[np.maximum(far * bws[k], top[k] - a), np.maximum(far * bws[k + 1], c - low[k + 1])]
    use = d0 < half
    if not use.any():
        return prov
    ratio = (reach / 4.0) ** (1.0 / 23.0)  # the template's geometric step
    count = np.zeros(len(use), dtype=np.intp)
    count[use] = np.ceil(np.log(half[use] / d0[use]) / np.log(ratio))
    side, m = _cells.expand_ranges(np.zeros(len(count), dtype=np.intp), count)
    extra = np.r_[start[side] + sign[side] * d0[side] * ratio ** m, (0.5 * (a + c))[use[:len(k)] | use[len(k):]]]
    return np.unique(np.r_[prov, extra])
