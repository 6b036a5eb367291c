"""Samplers of the built-in reference mechanisms (docs/method.md#93-reference-mechanisms).

Each function takes the mechanism's parameters and returns a sampler
``sample(database, size, rng) -> array`` of shape (size,) or (size, d),
vectorised over the samples. A database is a number or a list of numbers; the
additive-noise mechanisms release the sum of its entries. The registry that
pairs them with defaults, pairs and true values is :mod:`empdp.audit.mechanisms`.
"""

from __future__ import annotations

import math

import numpy as np

from . import truth


def vec(database) -> np.ndarray:
    """A database as a 1-d float array."""
    return np.atleast_1d(np.asarray(database, dtype=float))


def stat(database) -> float:
    """The sum of a database's entries (what the additive-noise mechanisms release)."""
    return float(vec(database).sum())


def laplace_noise(rng: np.random.Generator, scale: float, shape) -> np.ndarray:
    """Lap(scale) noise of ``shape`` as ±scale·E, E a standard exponential and the sign a fair coin.

    |Lap(1)| is Exp(1) and its sign is independent of it, so this is Lap(scale) exactly. NumPy's ziggurat
    exponentials make it far faster than ``rng.laplace`` (a logarithm per draw), and the audits of the
    vector-output mechanisms spend most of their time drawing noise: the coin (one byte from
    ``rng.integers``) costs less than the second exponential of E1 − E2, which this replaced (6.5 against
    4.7 ns a draw).
    """
    noise = rng.standard_exponential(shape)
    sign = rng.integers(0, 2, noise.shape, dtype=np.int8)
    sign <<= 1
    sign -= 1
    noise *= sign
    noise *= scale
    return noise


def laplace(epsilon=1.0, sensitivity=1.0):
    scale = sensitivity / epsilon

    def sample(database, size, rng):
        return stat(database) + rng.laplace(0.0, scale, size)

    return sample


def gaussian(sigma=1.0, sensitivity=1.0):
    sd = sigma * sensitivity

    def sample(database, size, rng):
        return stat(database) + rng.normal(0.0, sd, size)

    return sample


def noisy_max(epsilon=1.0, sensitivity=1.0):
    scale = 2.0 * sensitivity / epsilon

    def sample(database, size, rng):
        from .compiled import noisy_max_index  # numba: loaded by the first draw

        return noisy_max_index(vec(database), scale, False, size, rng)

    return sample


def noisy_max_value(epsilon=1.0, sensitivity=1.0, k=3):
    scale = k * sensitivity / epsilon  # Lap(1/λ) per entry, ε = kλ

    def sample(database, size, rng):
        from .compiled import noisy_max_value as kernel  # numba: loaded by the first draw

        return kernel(vec(database), scale, False, size, rng)

    return sample


def exponential(epsilon=1.0):
    lam = truth.exponential_lambda(epsilon)

    def sample(database, size, rng):
        s = stat(database)
        left = (1 - math.exp(-lam * s)) / (2 - math.exp(-lam * s))  # P(t < s)
        u = rng.random(size)
        go_left = rng.random(size) < left
        t_left = s + np.log(math.exp(-lam * s) + u * (1 - math.exp(-lam * s))) / lam
        t_right = s + rng.exponential(1.0 / lam, size)
        return np.where(go_left, t_left, t_right)

    return sample


def svt(variant: int, epsilon=1.0, threshold=1.0, c=1, sensitivity=1.0):
    """Sparse Vector variants of Lyu, Su, Li 2017 (Alg. 2, 4, 5, 6).

    Output per query: 1 (above), 0 (below), -1 (aborted after c answers above).
    SVT4 is run at ε·4/(1+6c) so that it is ε-DP (its original scaling gives
    (1+6c)/4·ε; Askin et al. 2022 correct it the same way).
    """
    c = int(c)
    if variant == 4:
        eps = epsilon * 4.0 / (1 + 6 * c)
        rho_scale, nu_scale = sensitivity / (eps / 4), sensitivity / (eps * 3 / 4)
    elif variant == 2:
        rho_scale, nu_scale = c * sensitivity / (epsilon / 2), 2 * c * sensitivity / (epsilon / 2)
    else:  # 5 and 6
        rho_scale, nu_scale = sensitivity / (epsilon / 2), sensitivity / (epsilon / 2)

    def sample(database, size, rng):
        q = vec(database)
        if variant in (5, 6):  # no abort: every answer compared with one threshold noise
            rho = laplace_noise(rng, rho_scale, size)
            noisy = q[None, :] if variant == 5 else q[None, :] + laplace_noise(rng, nu_scale, (size, q.size))
            return (noisy >= threshold + rho[:, None]).astype(np.int8)
        from .compiled import svt_answers  # numba: loaded by the first draw of an aborting variant

        return svt_answers(q, float(threshold), rho_scale, nu_scale, c, variant == 2, int(size), rng)

    return sample


def randomized_response(p=0.75):
    def sample(database, size, rng):
        bits = np.atleast_1d(np.asarray(database)).astype(np.int64)
        keep = rng.random((size, bits.size)) < p
        out = np.where(keep, bits[None, :], 1 - bits[None, :]).astype(np.int64)
        return out[:, 0] if np.ndim(database) == 0 else out

    return sample


def shuffled_rr(p=0.75):
    """Binary RR by each individual, then shuffled: the release is the number of ones."""

    def sample(database, size, rng):
        bits = np.atleast_1d(np.asarray(database)).astype(np.int64)
        prob_one = np.where(bits == 1, p, 1 - p)
        return (rng.random((size, bits.size)) < prob_one[None, :]).sum(axis=1)

    return sample


def subsampled(noise: str, q=0.2, epsilon=1.0, sigma=1.0, sensitivity=1.0):
    def sample(database, size, rng):
        x = vec(database)
        included = rng.random((size, x.size)) < q
        s = included @ x
        if noise == "laplace":
            return s + rng.laplace(0.0, sensitivity / epsilon, size)
        return s + rng.normal(0.0, sigma * sensitivity, size)

    return sample


def noisy_gd(sigma=0.1, lr=0.1, steps=20, theta0=0.0):
    """Noisy gradient descent on the quadratic loss ½(θ − x_i)² (Chourasia et al. 2021).

    θ_{k+1} = θ_k − η (θ_k − mean(x)) + √(2η)·σ·Z_k, output θ_K.
    """
    steps = int(steps)

    def sample(database, size, rng):
        xbar = float(vec(database).mean())
        theta = np.full(size, float(theta0))
        for _ in range(steps):  # loop over iterations, vectorised over samples
            theta = theta - lr * (theta - xbar) + math.sqrt(2 * lr) * sigma * rng.normal(size=size)
        return theta

    return sample
