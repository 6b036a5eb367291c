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
        f"{span / b.min():.3g} times the smallest kernel bandwidth {b.min():.3g}; pass a larger `bandwidth` "
        f"(or `bandwidth` auto) or a larger `memory_limit`{outlier}", param=("bandwidth", "memory_limit"))


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
    tails = _tails(model, extra_points, prov[0], prov[-1])
    _check_grid(model, pts, int(min(cum[-1], 2.0**62)) + 3 + len(q) + len(tails), budget, labels)
    nodes = np.interp(np.arange(0, np.floor(cum[-1]) + 1), cum, prov)
    if not model.kernel.kinked:  # a smooth kernel (Gaussian) has no kink at its q_j: the spacing suffices
        return np.unique(np.r_[nodes, prov[0], prov[-1]])
    return np.unique(np.r_[nodes, prov[0], prov[-1], q, tails])


#: beyond the tail nodes of :func:`_tails`, every kernel narrower than the widest is below this share
#: of a widest one (divided by n), in p̂ and in every p̂_i: L is its limit there to within 2e-20
TAIL_SHARE = 1e-20
#: tail nodes per unit of the fastest decay rate still alive (1 / (b_l) − 1 / b_max): L's changes in
#: the tail take ~1/rate, as the nodes' spacing near the points takes b/6
TAIL_STEPS = 6.0
#: the tail nodes stop this many widest scales beyond the farthest widest kernel: farther, every
#: kernel is below e^{−TAIL_REACH} (the densities, evaluated as such, underflow from ~745 on)
TAIL_REACH = 600.0


def _tails(model: DensityModel, extra_points, lo: float, hi: float) -> np.ndarray:
    """Nodes left of ``lo`` and right of ``hi`` (the grid's ends) where L still moves.

    Beyond every centre, a Laplace mixture of several bandwidths is a sum of exponentials
    e^{−|x|/b_l}: far out only the widest kernels are left, and L tends to its limit
    (:func:`empdp.risk.cells.tail_limits`), but on the way the narrower kernels die out one by
    one and L may first rise past that limit, tens or hundreds of the widest scales beyond the
    data (an 8 × 18 panel in three clusters had sup |L| 39% above the largest |L| within 46
    scales). Term l falls below ``TAIL_SHARE``/n of the widest kernel's (whose centre lies at
    c_w, b_max its scale) from x − top = s_l on, in closed form:

        s_l = (log(b_max / (b_l η)) + (top − c_w)/b_max − (top − c_l)/b_l) / (1/b_l − 1/b_max),

    with top the rightmost centre, and each centre taken where it is least favourable over the
    rows (the kinks of ``extra_points``, q_l − Δ_il, lie within the slack max |Δ|, rounded up to
    a power of two times b_min so that blocks of similar shifts share a grid). Up to there the
    nodes are spaced 1/(TAIL_STEPS · rate) for the fastest rate 1/b_l − 1/b_max among the
    terms still above that share (L changes over ~1/rate there; the spacing grows as terms die,
    so a few thousand nodes at most), and they stop ``TAIL_REACH`` widest scales beyond the farthest
    widest kernel, where the densities would underflow. Only Laplace kernels (whose ε_i is
    sup |L|) of several bandwidths need them: one scale has a flat L beyond the data, and a
    Gaussian's L grows without bound (its ε_i(τ) is found from the nodes' tails).
    """
    b = model.bandwidths
    if not model.kernel.exact_eps or np.all(b == b[0]):
        return np.zeros(0)
    q = model.points
    slack = 0.0
    if extra_points is not None and np.size(extra_points):
        extra = np.asarray(extra_points, dtype=float)
        if extra.ndim == 2 and extra.shape[1] == len(q):
            reach_out = np.abs(extra - q[None, :]).max()
        else:
            reach_out = max(float(extra.max() - q.max()), float(q.min() - extra.min()), 0.0)
        if reach_out > 0:
            slack = b.min() * 2.0 ** np.ceil(np.log2(reach_out / b.min()))
    right = _tail_offsets(q, b, slack, hi - q.max())
    left = _tail_offsets(-q, b, slack, q.min() - lo)
    return np.r_[q.min() - left, q.max() + right]


def _tail_offsets(q: np.ndarray, b: np.ndarray, slack: float, start: float) -> np.ndarray:
    """The right tail's nodes of :func:`_tails` as offsets from max(q), beyond ``start``."""
    b_max = b.max()
    narrow = b < b_max * (1 - 1e-12)
    if not narrow.any():
        return np.zeros(0)
    top = q.max() + slack  # no centre, of p̂ or of a row's p̂_i, lies right of it
    c_w = q[~narrow].max() - slack  # nor a widest kernel's (the one farthest right) left of this
    bl = b[narrow]
    rate = 1.0 / bl - 1.0 / b_max
    eta = TAIL_SHARE / len(q)
    s = (np.log(b_max / (bl * eta)) + (top - c_w) / b_max - (top - (q[narrow] + slack)) / bl) / rate
    order = np.argsort(-s)
    s, fastest = s[order], np.maximum.accumulate(rate[order])  # on (s[k + 1], s[k]) the terms ≤ k are alive
    stop = min(s[0], TAIL_REACH * b_max - (top - c_w))
    begin = max(start - slack, 0.0)
    ends = np.clip(np.r_[s, 0.0], begin, stop)  # piece k: (ends[k + 1], ends[k]), spacing 1 / (steps · fastest[k])
    length = ends[:-1] - ends[1:]
    count = np.ceil(length * TAIL_STEPS * fastest).astype(np.intp)
    piece, m = _cells.expand_ranges(np.zeros(len(count), dtype=np.intp), count)
    offsets = ends[1:][piece] + length[piece] * (m + 1) / count[piece]
    return slack + offsets[offsets > start - slack]


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
