"""Compiled loops of the audits, where numpy's vectorised form was the bottleneck: the samplers of the
Sparse Vector family (svt1-svt4, svt3, svt34_parallel, numerical_svt) and of Report Noisy Max
(noisy_max, noisy_max_value, report_noisy_max1-4), the binning of vector outputs behind MPL's table
scores (:func:`bin_codes`, module :mod:`empdp.audit.ratios`), and the keys by which stage 2 counts an
event of integer vectors (:func:`box_keys`, :func:`empdp.audit.kde.contains`).

Sparse Vector: NumPy drew a Laplace noise for every query of every output, and then made a dozen passes
over the (outputs, queries) arrays to find where the c-th answer above falls; an audit's stage 2 spent
170-210 ns an output of ten queries there (svt2, svt4). Here one loop per output draws the threshold
noise, then each query's noise only until the c-th answer above (the answers after it are "aborted"
whatever their noise), so an output of ten queries takes about 35 ns.

Report Noisy Max draws a noise per query, as NumPy did, but keeps only the running maximum, and takes
its Laplace signs from the bits of one uniform integer: an audit's stage 2 of ReportNoisyMax3 (five
queries) drew an output in 15.5 ns on two threads with NumPy, 12.3 here. On one thread the sampler takes
20 ns an output of five queries, 24 with a uniform draw per sign (as NumPy's took).

The samplers' laws are the mechanisms' own, term by term; their random streams differ from numpy's
vectorised draws, so a seed gives other outputs than numpy's did. Each noise is Lap(b) = ±b·E, E a
standard exponential (NumPy's ziggurat, as numba implements it for a ``numpy.random.Generator``) and
the sign a fair coin: a uniform draw of its own in Sparse Vector, a bit of a uniform integer shared by
COIN_BITS noises in Report Noisy Max (whose exponential noise is b·E). The samplers
take the part's Generator and release the GIL (the parts of a draw run on several threads, each with
its own Generator); numba does not take the BitGenerator's lock, so one Generator must not be shared by
threads drawing at once (NumPy's own methods would serialise them). The binning and the keys release the
GIL too.

Everything here is cached in empdp's numba cache folder (module :mod:`empdp.compiled`). This module
imports numba, so only the samplers, the binning and the keys that use it import it, when they are first
called.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import compiled as _cache_folder  # noqa: F401 (sets numba's cache folder before the decorators run)


@njit(cache=True, nogil=True)
def _laplace(rng, scale: float) -> float:
    e = rng.standard_exponential()
    return scale * e if rng.random() < 0.5 else -scale * e


#: Report Noisy Max's Laplace signs are the bits of one uniform integer in [0, 2^COIN_BITS): one draw
#: serves COIN_BITS noises, where a uniform draw per sign cost 1.4 ns of each noise
COIN_BITS = 62
COIN_HIGH = 1 << COIN_BITS


@njit(cache=True, nogil=True)
def noisy_max_index(q, scale: float, exponential: bool, size: int, rng):
    """``size`` outputs of Report Noisy Max: the first query holding the largest q_j + noise_j, the noise
    Lap(scale), or Exp(scale) with ``exponential`` (``np.argmax``'s choice on ties). int64, (size,).

    A Laplace noise is ±scale·E, E standard exponential, its sign the next bit of a uniform integer in
    [0, 2^COIN_BITS) (independent fair coins, as many as its bits). The loop is written out in both
    samplers: numba kept neither a helper returning the coins' state (65 ns an output of five queries)
    nor one keeping it in an array (109 ns) as fast as this (20-21 ns; 24 with a uniform draw per sign),
    and one loop writing either sampler's output cost the value's 21 ns against 20 (report_noisy_max3's
    stage 2, at its ceiling, draws it)."""
    if q.size == 0:
        raise ValueError("Report Noisy Max needs at least one query")
    out = np.empty(size, dtype=np.int64)
    coins, left = np.int64(0), 0
    for i in range(size):
        best, top = 0, 0.0
        for j in range(q.size):
            e = scale * rng.standard_exponential()
            if not exponential:
                if left == 0:
                    coins, left = rng.integers(0, COIN_HIGH, dtype=np.int64), COIN_BITS
                if coins & 1 == 0:
                    e = -e
                coins >>= 1
                left -= 1
            v = q[j] + e
            if j == 0 or v > top:
                best, top = j, v
        out[i] = best
    return out


@njit(cache=True, nogil=True)
def noisy_max_value(q, scale: float, exponential: bool, size: int, rng):
    """``size`` outputs of Report Noisy Max releasing the largest q_j + noise_j itself (the noise as in
    :func:`noisy_max_index`, the same stream). float64, (size,)."""
    if q.size == 0:
        raise ValueError("Report Noisy Max needs at least one query")
    out = np.empty(size)
    coins, left = np.int64(0), 0
    for i in range(size):
        top = 0.0
        for j in range(q.size):
            e = scale * rng.standard_exponential()
            if not exponential:
                if left == 0:
                    coins, left = rng.integers(0, COIN_HIGH, dtype=np.int64), COIN_BITS
                if coins & 1 == 0:
                    e = -e
                coins >>= 1
                left -= 1
            v = q[j] + e
            if j == 0 or v > top:
                top = v
        out[i] = top
    return out


@njit(cache=True, nogil=True)
def svt_answers(q, threshold: float, rho_scale: float, nu_scale: float, c: int, fresh: bool, size: int, rng):
    """``size`` outputs of Sparse Vector with abort: per query 1 (q_j + ν_j ≥ T + ρ), 0 (below) or -1
    (after the c-th answer above); ρ ~ Lap(rho_scale) drawn again after each answer above when
    ``fresh`` (Lyu et al.'s Alg. 2), ν_j ~ Lap(nu_scale). int8, (size, len(q))."""
    m = q.size
    out = np.empty((size, m), dtype=np.int8)
    for i in range(size):
        rho = _laplace(rng, rho_scale)
        count = 0
        for j in range(m):
            if count >= c:
                out[i, j] = -1
            elif q[j] + _laplace(rng, nu_scale) >= threshold + rho:
                out[i, j] = 1
                count += 1
                if fresh:
                    rho = _laplace(rng, rho_scale)
            else:
                out[i, j] = 0
    return out


@njit(cache=True, nogil=True)
def svt_values(q, threshold: float, rho_scale: float, nu_scale: float, c: int, value_scale: float,
               below: float, aborted: float, size: int, rng):
    """``size`` outputs of Sparse Vector releasing values: per query above (q_j + ν_j ≥ T + ρ, at most c
    of them) the value q_j + ν_j itself when ``value_scale`` is 0 (SVT3), else q_j + Lap(value_scale)
    drawn fresh (NumericalSVT); the code ``below`` for a query below and ``aborted`` after the c-th
    answer above. float64, (size, len(q))."""
    m = q.size
    out = np.empty((size, m))
    for i in range(size):
        rho = _laplace(rng, rho_scale)
        count = 0
        for j in range(m):
            if count >= c:
                out[i, j] = aborted
                continue
            noisy = q[j] + _laplace(rng, nu_scale)
            if noisy >= threshold + rho:
                out[i, j] = noisy if value_scale == 0.0 else q[j] + _laplace(rng, value_scale)
                count += 1
            else:
                out[i, j] = below
    return out


@njit(cache=True, nogil=True)
def bin_codes(u, atoms, n_atoms, edges, out):
    """Every coordinate's fine bin (:class:`empdp.audit.ratios.Binning`): the index of the atom it equals,
    else n_atoms + the number of edges ≤ it (``np.searchsorted(edges, u, side="right")`` for sorted
    edges).

    ``u`` (n, d) numbers; row j of ``atoms`` (the first ``n_atoms[j]`` used) and of ``edges`` (padded
    with NaN, which no value is ≥) serve column j, or every column when there is one row (a pooled
    binning). ``out`` (n, d) int64, returned. A value compares as a float (as np.searchsorted compares
    integers with float edges).

    The edges at or below a value are counted one by one (31 of them), not searched: the comparisons
    run side by side in vector registers, 2 ns a value, where a binary search, branches or not, waited
    on each step's load (24 ns) and NumPy's passes took 3-13 ns (a grid lookup where no edge was near,
    a search elsewhere, then the atoms).
    """
    n, d = u.shape
    width = edges.shape[1]
    shared = atoms.shape[0] == 1
    for i in range(n):
        for j in range(d):
            row = 0 if shared else j
            v = float(u[i, j])
            code = -1
            for a in range(n_atoms[row]):
                if atoms[row, a] == v:
                    code = a
                    break
            if code < 0:
                below = 0
                for k in range(width):
                    below += edges[row, k] <= v
                code = n_atoms[row] + below
            out[i, j] = code
    return out


@njit(cache=True, nogil=True)
def box_keys(rows, lo, hi, radix, signed: bool, keys, inside):
    """Each row's mixed-radix key over the integer box [lo, hi] (int64 bounds, |lo|, |hi| < 2^53, the
    product of ``radix`` = hi - lo + 1 below 2^62) into ``keys``, 0 for rows outside it or not
    integer-valued, and which rows are inside into ``inside``; both returned. ``signed`` rows are
    compared as int64, any others as float64 (exact in the box; NaN is outside).

    One pass over the rows, leaving a row at its first coordinate outside: NumPy's pass a column at a
    time took 24 ns a row of ten int8 answers (stage 2 of svt4 counted 1.5·10^8 of them per database),
    as long as drawing them.
    """
    n, d = rows.shape
    for i in range(n):
        key = np.int64(0)
        ok = True
        for j in range(d):
            if signed:
                v = np.int64(rows[i, j])
            else:
                f = np.float64(rows[i, j])
                if not (f >= lo[j] and f <= hi[j] and f == np.floor(f)):
                    ok = False
                    break
                v = np.int64(f)
            if v < lo[j] or v > hi[j]:
                ok = False
                break
            key = key * radix[j] + (v - lo[j])
        keys[i] = key if ok else 0
        inside[i] = ok
    return keys, inside
