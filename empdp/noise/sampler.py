"""Secure, exact sampling of the release noise h = w·δ_0 + (1 − w)·Laplace(λ) (docs/method.md#84-secure-sampling).

Randomness comes from the operating system's CSPRNG (``secrets``); a seed
switches to a local PCG64 generator for tests only, and such output is not
private. NumPy's global state is never used.

Floating point cannot leak the value (Mironov 2012): the Laplace part is an
exact discrete Laplace on the grid γ = 2^-k (Canonne, Kamath, Steinke 2020,
Algorithms 1–2, integer arithmetic only), and :meth:`NoiseSampler.release`
adds it to the value rounded to the same grid in exact integer arithmetic.
The grid is γ ≤ λ·2^-20 and the discrete scale is t·γ ≥ λ with an integer t,
so the noise is never smaller than calibrated; rounding the value moves each
q_j by at most γ/2, which changes ε by at most γ/λ ≤ 2^-20.
"""

from __future__ import annotations

import math
import numbers
import secrets
from fractions import Fraction

import numpy as np

from ..errors import InputError

_TWO64 = 1 << 64


class SecureBits:
    """Uniform 64-bit words from the OS CSPRNG (``secrets.token_bytes``)."""

    private = True

    def words(self, size: int) -> np.ndarray:
        return np.frombuffer(secrets.token_bytes(8 * size), dtype=np.uint64).copy()


class SeededBits:
    """Reproducible words from a local PCG64 generator: tests only, NOT private."""

    private = False

    def __init__(self, seed: int):
        self._gen = np.random.Generator(np.random.PCG64(seed))

    def words(self, size: int) -> np.ndarray:
        return self._gen.integers(0, np.iinfo(np.uint64).max, size=size, dtype=np.uint64, endpoint=True)


def bits_source(seed: int | None = None):
    """CSPRNG words when ``seed`` is None, else the seeded (not private) source."""
    if seed is None:
        return SecureBits()
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2 ** 128:
        raise InputError(f"`seed` must be an integer in [0, 2^128); got {str(seed)[:40]}", param="seed")
    return SeededBits(int(seed))


def uniform_below(bits, bound) -> np.ndarray:
    """Exactly uniform integers in [0, bound) for each entry of ``bound`` (1 ≤ bound < 2^62).

    Rejection sampling on the smallest covering power of two: no modulo bias.
    """
    bound = np.asarray(bound, dtype=np.int64)
    out = np.empty(bound.shape, dtype=np.int64)
    nbits = np.ceil(np.log2(np.maximum(bound, 1).astype(float))).astype(np.uint64)
    nbits = np.where((np.uint64(1) << nbits) < bound.astype(np.uint64), nbits + np.uint64(1), nbits)
    mask = (np.uint64(1) << nbits) - np.uint64(1)
    todo = np.arange(bound.size)
    flat_bound, flat_mask, flat_out = bound.ravel(), mask.ravel(), out.reshape(-1)
    while todo.size:
        r = (bits.words(todo.size) & flat_mask[todo]).astype(np.int64)
        ok = r < flat_bound[todo]
        flat_out[todo[ok]] = r[ok]
        todo = todo[~ok]
    return out


def bernoulli_exp(bits, num, den) -> np.ndarray:
    """Exact Bernoulli(exp(−num/den)) for integer 0 ≤ num ≤ den (CKS 2020, Algorithm 1).

    Draw A_K ~ Bernoulli(γ/K), K = 1, 2, … until the first 0; P(K odd) = e^{−γ}.
    """
    num = np.asarray(num, dtype=np.int64)
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), num.shape)
    k = np.ones(num.shape, dtype=np.int64)
    todo = np.arange(num.size)
    while todo.size:
        a = uniform_below(bits, den[todo] * k[todo]) < num[todo]
        k[todo[a]] += 1
        todo = todo[a]
    return k % 2 == 1


def discrete_laplace(bits, t: int, size: int) -> np.ndarray:
    """``size`` exact draws with P(Z = z) ∝ exp(−|z|/t), integer t ≥ 1 (CKS 2020, Algorithm 2, s = 1)."""
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        u = uniform_below(bits, np.full(todo.size, t))
        keep = bernoulli_exp(bits, u, t)
        todo_k, u = todo[keep], u[keep]
        v = np.zeros(todo_k.size, dtype=np.int64)
        live = np.arange(todo_k.size)  # V ~ Geometric: count successes of Bernoulli(e^{-1})
        while live.size:
            a = bernoulli_exp(bits, np.ones(live.size, dtype=np.int64), 1)
            v[live[a]] += 1
            live = live[a]
        x = u + t * v
        neg = (bits.words(todo_k.size) & np.uint64(1)).astype(bool)
        accept = ~(neg & (x == 0))
        out[todo_k[accept]] = np.where(neg, -x, x)[accept]
        todo = np.concatenate([todo[~keep], todo_k[~accept]])
    return out


class NoiseSampler:
    """Draws from h = w·δ_0 + (1 − w)·Laplace(λ) on the grid 2^-k (docs/method.md#83-deconvolution-the-noise-law).

    Parameters
    ----------
    weight_zero : float
        w, the atom at 0 (1 for no noise).
    scale : float
        λ of the Laplace part (ignored when w = 1).
    seed : int, optional
        Tests only: reproducible and marked not private.
    bits : optional
        The source of random words to draw from instead of one made from ``seed``
        (:func:`bits_source`): the axes of a joint release share one.
    """

    def __init__(self, weight_zero: float, scale: float, seed: int | None = None, bits=None):
        def real(v):
            return (isinstance(v, numbers.Real) and not isinstance(v, bool))
        if not (real(weight_zero) and 0.0 <= weight_zero <= 1.0):
            raise InputError(f"noise weight_zero must be a number in [0, 1], got {weight_zero!r}")
        if not (real(scale) and (weight_zero == 1.0 or (math.isfinite(scale) and scale > 0))):
            raise InputError(f"noise Laplace scale must be a positive, finite number, got {scale!r}")
        self.weight_zero = float(weight_zero)
        self.scale = float(scale)
        self.bits = bits_source(seed) if bits is None else bits
        self.private = self.bits.private
        if self.weight_zero < 1.0:
            self.grid_exp = 20 - math.floor(math.log2(self.scale))
            self.t = math.ceil(Fraction(self.scale) * Fraction(2) ** self.grid_exp)
            # floor(w·2^64)/2^64 ≤ w: a slightly smaller atom is a mixture of two ε-private noises
            self._atom = np.uint64(min(int(Fraction(self.weight_zero) * _TWO64), _TWO64 - 1))
        else:
            self.grid_exp, self.t = 0, 0

    @property
    def grid(self) -> float:
        """γ = 2^-k, the spacing of noisy outputs (0 without noise)."""
        return math.ldexp(1.0, -self.grid_exp) if self.t else 0.0

    def sample_units(self, size: int) -> np.ndarray:
        """Noise in grid units (int64): 0 with probability w, else discrete Laplace(t)."""
        if not self.t:
            return np.zeros(size, dtype=np.int64)
        out = np.zeros(size, dtype=np.int64)
        lap = np.flatnonzero(self.bits.words(size) >= self._atom)
        out[lap] = discrete_laplace(self.bits, self.t, lap.size)
        return out

    def sample(self, size: int) -> np.ndarray:
        """``size`` noise draws as floats (exact multiples of the grid)."""
        return np.ldexp(self.sample_units(size).astype(float), -self.grid_exp)

    def release(self, value: float) -> float:
        """value + y, computed exactly on the grid and rounded once at the end."""
        value = float(value)
        if not math.isfinite(value):
            raise InputError(f"cannot release a non-finite value ({value})")
        if not self.t:
            return value
        if abs(value) + 1000 * self.scale > 1e308:  # checked before drawing: a refusal reveals nothing
            raise InputError(f"the value's magnitude ({abs(value):.3g}) plus the noise (scale {self.scale:.3g}) "
                             "could overflow a double; nothing was released")
        unit = Fraction(2) ** self.grid_exp
        total = round(Fraction(value) * unit) + int(self.sample_units(1)[0])
        return float(total / unit)
