"""Fast density estimates for the audits: binned Gaussian KDE (1-3 d) and frequencies.

The audits need densities of 10^4-10^6 mechanism outputs on a grid (DPL's
search for the worst output, the Rényi integral) and at one point (MPL's
confidence bound). On a grid we use linear binning and a separable Gaussian
convolution by FFT (Wand 1994; KDEpy's ``FFTKDE``): cost O(n + G log G),
no per-point Python loop. At a single point we sum the kernel exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..robust import robust_spread

#: ∫K² for the standard Gaussian kernel in one dimension: 1 / (2√π).
GAUSS_R = 1.0 / (2.0 * np.sqrt(np.pi))

#: Kernel mass beyond this many bandwidths is ignored (< 2e-9 relative).
_CUT = 6.0


def as_samples(values) -> np.ndarray:
    """Return mechanism outputs as a 2-d array (size, d)."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1, 1)
    elif arr.ndim == 1:
        arr = arr[:, None]
    elif arr.ndim > 2:
        arr = arr.reshape(arr.shape[0], -1)
    return arr


#: Rows used for the spread in bandwidth rules: a strided (for i.i.d. outputs: random)
#: subsample, so that 10^6 outputs cost no full sort; the IQR is then within ~1%.
_SCALE_ROWS = 1 << 16


def scale_estimate(x: np.ndarray) -> np.ndarray:
    """Robust per-column spread (:func:`empdp.robust.robust_spread`: min(sd, IQR/1.349), the sd
    where the IQR is 0), on a strided subsample of large samples; 1 where it is 0."""
    if x.shape[0] > 2 * _SCALE_ROWS:
        x = x[:: x.shape[0] // _SCALE_ROWS]
    s = robust_spread(x, axis=0)
    return np.where(s > 0, s, 1.0)


def rule_of_thumb(x: np.ndarray, size: int | None = None, undersmooth: float = 0.0) -> np.ndarray:
    """Per-dimension Gaussian-kernel bandwidth, Silverman/Scott rule, optionally undersmoothed.

    h_j = c_d · s_j · m^{-1/(d+4)} · m^{-γ}, with c_1 = 1.06 (Silverman) and
    c_d = (4/(d+2))^{1/(d+4)} (Scott) for d > 1, s_j the robust spread of
    column j, m = ``size`` (defaults to the number of rows) and γ = ``undersmooth``
    (the undersmoothing exponent of Askin et al. 2022, condition C4).
    """
    m = x.shape[0] if size is None else size
    d = x.shape[1]
    c = 1.06 if d == 1 else (4.0 / (d + 2)) ** (1.0 / (d + 4))
    return c * scale_estimate(x) * m ** (-1.0 / (d + 4) - undersmooth)


@dataclass
class Grid:
    """A regular grid: per-dimension axes; ``cell`` is the volume of one cell."""

    axes: list[np.ndarray]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(a) for a in self.axes)

    @property
    def steps(self) -> np.ndarray:
        return np.array([a[1] - a[0] if len(a) > 1 else 1.0 for a in self.axes])

    @property
    def cell(self) -> float:
        return float(np.prod(self.steps))

    def points(self) -> np.ndarray:
        """All grid points as an array (G, d) in C order."""
        mesh = np.meshgrid(*self.axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)


def make_grid(lo, hi, sizes) -> Grid:
    """Grid from ``lo`` to ``hi`` (per dimension), ``sizes`` points per dimension."""
    lo, hi, sizes = np.atleast_1d(lo), np.atleast_1d(hi), np.atleast_1d(sizes)
    axes = []
    for a, b, m in zip(lo, hi, sizes):
        axes.append(np.linspace(a, b, int(m)) if b > a else np.array([a]))
    return Grid(axes)


def _linear_bin(x: np.ndarray, grid: Grid) -> np.ndarray:
    """Linear binning of the rows of ``x`` onto ``grid``: counts array of grid.shape.

    Each point's unit mass is split between the 2^d surrounding grid nodes in
    proportion to proximity; points outside the grid are dropped (the caller
    pads the grid by several bandwidths so that they do not matter).
    """
    shape = grid.shape
    d = len(shape)
    lo = np.array([a[0] for a in grid.axes])
    pos = (x - lo) / grid.steps  # fractional index
    inside = np.all((pos >= 0) & (pos <= np.array(shape) - 1), axis=1)
    pos = pos[inside]
    base = np.minimum(np.floor(pos).astype(np.int64), np.maximum(np.array(shape) - 2, 0))
    frac = pos - base
    total = int(np.prod(shape))
    counts = np.zeros(total)
    strides = np.array([int(np.prod(shape[k + 1:])) for k in range(d)], dtype=np.int64)
    for corner in range(2 ** d):
        bits = [(corner >> k) & 1 for k in range(d)]
        w = np.ones(len(pos))
        idx = np.zeros(len(pos), dtype=np.int64)
        for k, b in enumerate(bits):
            if shape[k] == 1:
                if b:
                    w = w * 0.0
                continue
            w = w * (frac[:, k] if b else 1.0 - frac[:, k])
            idx += (base[:, k] + b) * strides[k]
        counts += np.bincount(idx, weights=w, minlength=total)
    return counts.reshape(shape)


def _gauss_smooth(counts: np.ndarray, grid: Grid, h: np.ndarray) -> np.ndarray:
    """Convolve binned counts with a product Gaussian kernel, axis by axis, by FFT."""
    out = counts
    for k, axis in enumerate(grid.axes):
        m = len(axis)
        if m == 1:
            continue
        step = axis[1] - axis[0]
        half = min(m - 1, int(np.ceil(_CUT * h[k] / step)))
        u = np.arange(-half, half + 1) * step
        kern = np.exp(-0.5 * (u / h[k]) ** 2) / (np.sqrt(2 * np.pi) * h[k])
        size = m + 2 * half
        nfft = 1 << int(np.ceil(np.log2(size)))
        spec = np.fft.rfft(kern, nfft)
        moved = np.moveaxis(out, k, -1)
        conv = np.fft.irfft(np.fft.rfft(moved, nfft, axis=-1) * spec, nfft, axis=-1)
        out = np.moveaxis(conv[..., half:half + m], -1, k)
    return out


def binned_kde(x: np.ndarray, h, grid: Grid) -> np.ndarray:
    """Gaussian product-kernel KDE of the rows of ``x`` on ``grid`` (binned, FFT).

    Returns density values of shape ``grid.shape``. The binning error is
    O((step/h)^2) relative; callers use steps of h/8 or finer.
    """
    x = as_samples(x)
    h = np.broadcast_to(np.asarray(h, dtype=float), (x.shape[1],))
    counts = _linear_bin(x, grid)
    dens = _gauss_smooth(counts, grid, h) / x.shape[0]
    return np.maximum(dens, 0.0)


def kernel_weights(x: np.ndarray, t: np.ndarray, h) -> np.ndarray:
    """Each row's Gaussian product-kernel weight at the one point ``t`` (d,): their mean is
    :func:`kde_at` there (the duel of MPL sums them a part at a time)."""
    x = as_samples(x).astype(float)
    h = np.broadcast_to(np.asarray(h, dtype=float), (x.shape[1],))
    z = (x - np.asarray(t, dtype=float)[None, :]) / h
    return np.exp(-0.5 * np.einsum("ij,ij->i", z, z)) / (float(np.prod(h)) * (2 * np.pi) ** (x.shape[1] / 2))


def kde_at(x: np.ndarray, t, h, chunk: int = 1 << 20) -> np.ndarray:
    """Exact Gaussian product-kernel KDE of the rows of ``x`` at the points ``t`` (k, d)."""
    x = as_samples(x)
    t = np.atleast_2d(np.asarray(t, dtype=float))
    h = np.broadcast_to(np.asarray(h, dtype=float), (x.shape[1],))
    norm = x.shape[0] * np.prod(h) * (2 * np.pi) ** (x.shape[1] / 2)
    out = np.zeros(t.shape[0])
    step = max(1, chunk // max(1, t.shape[0]))
    for s in range(0, x.shape[0], step):
        z = (x[s:s + step, None, :] - t[None, :, :]) / h
        out += np.exp(-0.5 * np.einsum("ijk,ijk->ij", z, z)).sum(axis=0)
    return out / norm


def grid_for(samples: list[np.ndarray], h: np.ndarray, lo=None, hi=None, step_frac: float = 0.125,
             max_points: int | None = None) -> Grid:
    """A grid covering [lo, hi] (default: the samples' range) padded by 6h, step ≤ h·step_frac."""
    pooled = np.vstack(samples)
    d = pooled.shape[1]
    lo = pooled.min(axis=0) if lo is None else np.broadcast_to(np.asarray(lo, float), (d,))
    hi = pooled.max(axis=0) if hi is None else np.broadcast_to(np.asarray(hi, float), (d,))
    a, b = lo - _CUT * h, hi + _CUT * h
    cap = max_points or {1: 1 << 14, 2: 512, 3: 128}[d]
    sizes = np.minimum(np.ceil((b - a) / (h * step_frac)).astype(int) + 1, cap)
    return make_grid(a, b, np.maximum(sizes, 2))


#: integer row keys below this many values are categorised by a table of them (linear time), not a sort
DENSE_KEYS = 1 << 24


def _row_keys(pooled: np.ndarray):
    """(key per row, number of possible keys or None): a mixed-radix int64 for small integer values,
    else the value (one column) or raw bytes (sortable, unbounded)."""
    if pooled.dtype.kind in "biu" or np.all(pooled == np.round(pooled)):
        lo = pooled.min(axis=0)
        radix = (pooled.max(axis=0) - lo + 1).astype(np.float64)
        if np.prod(radix) < 2.0 ** 62:
            weights = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1.0]]).astype(np.int64)
            keys = (pooled - lo).astype(np.int64) @ weights
            return keys, int(np.prod(radix))
    if pooled.shape[1] == 1:
        return pooled[:, 0], None
    rows = np.ascontiguousarray(pooled)
    return rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel(), None


def _unique_keys(keys: np.ndarray, size: int | None):
    """(first row of each distinct key, in key order; each row's category), as np.unique's index and inverse.

    Keys of at most DENSE_KEYS values are looked up in a table (three linear passes): the sort of
    np.unique cost 3 of svt1's 18 s with millions of answer vectors of a dozen distinct values.
    """
    if size is None or size > DENSE_KEYS:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    seen = np.zeros(size, dtype=bool)
    seen[keys] = True
    inverse = (np.cumsum(seen) - 1)[keys]
    first = np.empty(int(seen.sum()), dtype=np.intp)
    first[inverse[::-1]] = np.arange(len(keys) - 1, -1, -1)  # the last write per category is its first row
    return first, inverse


def categorize(*samples: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Common categories of several discrete samples.

    Returns (categories (K, d), codes per sample). Rows are compared exactly.
    """
    arrs = [as_samples(s) for s in samples]
    pooled = np.vstack(arrs)
    first, inverse = _unique_keys(*_row_keys(pooled))
    cats = pooled[first]
    codes, start = [], 0
    for a in arrs:
        codes.append(inverse[start:start + len(a)])
        start += len(a)
    return cats, codes


#: integer-valued events whose rows have at most this many possible keys (and at most KEYS_PER_ROW per row
#: counted) are looked up in a table, others in the members' sorted keys
CONTAINS_TABLE, KEYS_PER_ROW = 1 << 22, 16
#: the largest |value| an integer key's box may reach: float64 holds its integers exactly below this
EXACT_INTEGERS = 2.0 ** 53


def contains(rows: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Boolean mask: which rows of ``rows`` equal one of the rows of ``members`` (exact match).

    Integer-valued members strictly within ±2^53 get mixed-radix keys over their own box, built in one
    compiled pass over the rows, so the rows need no sort (stage 2 counts an event among hundreds of
    millions of SVT answer vectors); with few enough keys each row's key is looked up in a table of the
    members' keys, else in their sorted list. Other values are compared by categories. Rows of another
    width than the members' are bad input (a mechanism whose outputs change width).
    """
    rows, members = as_samples(rows), as_samples(members)
    if rows.shape[1] != members.shape[1] and len(members):  # (the compiled keys read a bound per column)
        raise InputError(f"mechanism returned outputs of {rows.shape[1]} coordinates, where the outputs its "
                         f"audit began with had {members.shape[1]}: a mechanism's outputs must keep one width")
    if rows.shape[1] > 1 and len(members):
        wide = members.astype(np.float64)
        lo, hi = wide.min(axis=0), wide.max(axis=0)
        if np.all(wide == np.round(wide)) and lo.min() > -EXACT_INTEGERS and hi.max() < EXACT_INTEGERS:
            lo, hi = lo.astype(np.int64), hi.astype(np.int64)
            radix = hi - lo + 1  # (in integers: a span past 2^53 is exact)
            keys_total = math.prod(int(r) for r in radix)
            if keys_total < 2 ** 62:
                keys, inside = _box_keys(rows, lo, hi, radix)
                member_keys, _ = _box_keys(members, lo, hi, radix)
                if keys_total <= min(CONTAINS_TABLE, KEYS_PER_ROW * len(rows) + 4096):
                    table = np.zeros(keys_total, dtype=bool)
                    table[member_keys] = True
                    return table[keys] & inside
                return inside & np.isin(keys, member_keys)
    _, (codes, member_codes) = categorize(rows, members)
    return np.isin(codes, member_codes)


def _box_keys(rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, radix: np.ndarray):
    """Each row's mixed-radix key over the integer box [lo, hi] (|lo|, |hi| < 2^53), 0 for rows outside
    it or not integer-valued, and which rows are inside, in one compiled pass
    (:func:`empdp.audit.compiled.box_keys`: numba, loaded here on first use). Signed integers are
    compared as int64, everything else as float64, both exact here."""
    from .compiled import box_keys

    if not rows.dtype.isnative or rows.dtype.kind not in "biuf" or rows.dtype.itemsize > 8 or (
            rows.dtype.kind == "f" and rows.dtype.itemsize < 4):  # (what numba does not type: cast as NumPy did)
        rows = rows.astype(np.int64 if rows.dtype.kind == "i" else np.float64)
    rows = np.ascontiguousarray(rows)
    return box_keys(rows, np.ascontiguousarray(lo, np.int64), np.ascontiguousarray(hi, np.int64),
                    np.ascontiguousarray(radix, np.int64), rows.dtype.kind == "i",
                    np.empty(len(rows), dtype=np.int64), np.empty(len(rows), dtype=bool))


def frequencies(codes: np.ndarray, k: int) -> np.ndarray:
    """Relative frequencies of the category codes 0..k-1."""
    return np.bincount(codes, minlength=k) / len(codes)


def sigma_discrete(fx, fy):
    """σ̂ of ln f̂_x − ln f̂_x′ for frequencies (Askin et al. 2022, eq. 25): √(1/f_x + 1/f_x′ − 2)."""
    return np.sqrt(np.maximum(1 / fx + 1 / fy - 2, 0.0))


def looks_discrete(values: np.ndarray, max_levels: int = 1000) -> bool:
    """Discrete if integer/bool dtype, or few distinct values (≤ max_levels and ≤ 5% of rows)."""
    arr = np.asarray(values)
    if arr.dtype.kind in "biu":
        return True
    x = as_samples(arr)
    if x.shape[0] < 20:
        return False
    cap = min(max_levels, max(2, x.shape[0] // 20))
    if len(np.unique(x[:4 * cap + 1], axis=0)) > cap:  # cheap early exit for continuous outputs
        return False
    levels = len(np.unique(x, axis=0))
    return levels <= cap
