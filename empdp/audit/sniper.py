"""DP-Sniper's evaluation mechanisms: samplers and exact output laws (docs/method.md#93-reference-mechanisms).

The 20 mechanisms of Bichsel et al. 2021 (S&P; repository ``eth-sri/dp-sniper``,
``dpsniper/mechanisms``, evaluated in ``dpsniper/experiments/exp_default.py``),
with their definitions and parameters. Six are the same mechanisms as existing
built-ins and are not repeated here (Laplace, ReportNoisyMax1 = ``noisy_max``,
SVT2, SVT4, SVT5, SVT6); :mod:`empdp.audit.mechanisms` registers the others.

Each sampler is ``sample(database, size, rng) -> array`` drawing from ``rng``
only. Each exact law is the output distribution for one database (a pmf over
outcomes, or a closed-form density ratio), from which the tests and the
truth table take the exact ε of a pair.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..errors import InputError
from . import truth
from .samplers import laplace_noise, stat, vec

# ----------------------------------------------------------------------------- Truncated geometric

def geometric_k(epsilon: float) -> int:
    """k = ⌈ln(2/ε)⌉ of GeoSample (Balcer, Vadhan 2018, Alg. 4.8): the noise ratio is 2^-k."""
    return math.ceil(math.log(2.0 / epsilon))


def truncated_geometric_pmf(c: int, epsilon: float, n: int) -> np.ndarray:
    """P(z), z = 0..n, of GeoSample(ε, n) on the count c, from its integer CDF F (Step 2 of Alg. 4.8).

    F is computed in exact integers (Python's unbounded ints; DP-Sniper's int64
    overflows for small ε or large n), the output is the smallest z with F(z) ≥ u,
    u uniform on 1..d, so P(z) = (F(z) − F(z−1)) / d.
    """
    k = geometric_k(epsilon)
    d = (2 ** (k + 1) + 1) * (2 ** k + 1) ** (n - 1)
    f = [2 ** (k * (c - z)) * (2 ** k + 1) ** (n - (c - z)) for z in range(c)]
    f += [d - 2 ** (k * (z - c + 1)) * (2 ** k + 1) ** (n - 1 - (z - c)) for z in range(c, n)]
    f.append(d)
    steps = [f[0]] + [f[z] - f[z - 1] for z in range(1, n + 1)]
    return np.array([s / d for s in steps])


def truncated_geometric(epsilon=0.1, n=5):
    n = int(n)
    laws = [truncated_geometric_pmf(c, epsilon, n) for c in range(n + 1)]

    def sample(database, size, rng):
        return rng.choice(n + 1, size=size, p=laws[_count(database, n)])

    return sample


def _count(database, n: int) -> int:
    c = stat(database)
    if c != round(c) or not 0 <= c <= n:
        raise InputError(f"truncated_geometric counts individuals: a database is an integer count in [0, {n}] "
                         f"(parameter n), got {c:g}")
    return int(round(c))


# ----------------------------------------------------------------------------- additive noise on vectors

def noisy_hist(scale: float):
    """NoisyHist1/2 (Ding et al. 2018, Alg. 9, 10): every bin plus Lap(scale)."""

    def sample(database, size, rng):
        h = vec(database)
        return h[None, :] + laplace_noise(rng, scale, (size, h.size))

    return sample


def laplace_parallel(epsilon=0.005, copies=20):
    """``copies`` independent Laplace mechanisms Lap(1/ε) on the same value, all outputs released."""
    copies = int(copies)

    def sample(database, size, rng):
        return stat(database) + laplace_noise(rng, 1.0 / epsilon, (size, copies))

    return sample


def prefix_sum(epsilon=0.1):
    """PrefixSum (Wang et al. 2019): the running sums of q_i + Lap(1/ε)."""

    def sample(database, size, rng):
        q = vec(database)
        return np.cumsum(q[None, :] + laplace_noise(rng, 1.0 / epsilon, (size, q.size)), axis=1)

    return sample


#: ReportNoisyMax's noise families: (rng, scale, shape) → draws
_NOISE = {"laplace": laplace_noise,
          "exponential": lambda rng, scale, shape: rng.exponential(scale, shape)}


def report_noisy_max(epsilon=0.1, noise="laplace", output="index"):
    """ReportNoisyMax1-4 (Ding et al. 2018, Alg. 5-8): noise of scale 2/ε, the argmax or the max."""
    scale = 2.0 / epsilon
    draw = _NOISE[noise]  # a family looked up once (an unknown name fails here, not as exponential noise)

    def sample(database, size, rng):
        q = vec(database)
        noisy = q[None, :] + draw(rng, scale, (size, q.size))
        return np.argmax(noisy, axis=1) if output == "index" else np.max(noisy, axis=1)

    return sample


def _exponential_logcdf(z):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(z > 0, np.log(-np.expm1(-np.maximum(z, 0.0))), -np.inf)


def noisy_max_exponential_pmf(q, scale: float) -> np.ndarray:
    """P(argmax_i (q_i + Exp(scale)) = k): ∫ f_k(t) Π_{i≠k} F_i(t) dt by piecewise Gauss-Legendre."""
    q = np.atleast_1d(np.asarray(q, float))
    t, w = truth._segment_nodes(q, q.min(), q.max() + 60 * scale, scale / 2)
    z = (t[:, None] - q[None, :]) / scale
    logcdf = _exponential_logcdf(z)
    with np.errstate(invalid="ignore"):
        logpdf = np.where(z >= 0, -z - math.log(scale), -np.inf)
        others = logcdf.sum(axis=1, keepdims=True) - logcdf
        # where F_k = 0 the "others" sum is −∞ − (−∞); f_k is 0 there anyway
        terms = np.where(np.isfinite(logpdf), logpdf + np.where(np.isnan(others), -np.inf, others), -np.inf)
    return w @ np.exp(terms)


def noisy_max_exponential_value_epsilon(x, y) -> float | None:
    """ε of ReportNoisyMax4 on a pair: ∞ where the supports' left ends or the tie counts at the max differ.

    max_i(q_i + Exp) has support [max q, ∞) and density ∝ (t − max q)^{j−1} near it,
    j the number of queries at the max; a different max or j makes the log ratio
    unbounded. Otherwise not computed (None).
    """
    x, y = np.atleast_1d(np.asarray(x, float)), np.atleast_1d(np.asarray(y, float))
    if x.max() != y.max() or np.sum(x == x.max()) != np.sum(y == y.max()):
        return math.inf
    return None


# ----------------------------------------------------------------------------- Sparse Vector variants

def svt_abort(epsilon=0.1, c=1, threshold=1.0, rho_scale=None, nu_scale=None):
    """SVT with one threshold noise ρ and abort after c answers above (Lyu et al. 2017, Alg. 1 and 4).

    Output per query: 1 (above), 0 (below), -1 (after the c-th answer above).
    """
    c = int(c)

    def sample(database, size, rng):
        q = vec(database)
        rho = laplace_noise(rng, rho_scale, (size, 1))
        noisy = laplace_noise(rng, nu_scale, (size, q.size))
        noisy += q[None, :]
        return _abort_after(noisy >= threshold + rho, c)

    return sample


def _abort_after(above: np.ndarray, c: int) -> np.ndarray:
    """Answers 1/0 with -1 after the c-th answer above (the count before each query reaches c)."""
    before = np.cumsum(above, axis=1, dtype=np.int32)  # int32, not the default int64: half the memory traffic
    before -= above
    out = above.astype(np.int8)
    out[before >= c] = -1
    return out


def svt3(epsilon=0.1, c=1, threshold=1.0):
    """SVT3 (Lyu et al. 2017, Alg. 3): the noisy answer q_i + ν_i for queries above the threshold.

    ρ ~ Lap(2/ε), ν ~ Lap(2c/ε); a query below gives -1000, an aborted one -2000
    (DP-Sniper's codes).
    """
    c = int(c)
    rho_scale, nu_scale = 2.0 / epsilon, 2.0 * c / epsilon

    def sample(database, size, rng):
        q = vec(database)
        rho = laplace_noise(rng, rho_scale, (size, 1))
        noisy = q[None, :] + laplace_noise(rng, nu_scale, (size, q.size))
        above = noisy >= threshold + rho
        answers = _abort_after(above, c)
        return np.where(answers == 1, noisy, np.where(answers == 0, -1000.0, -2000.0))

    return sample


def svt34_parallel(epsilon=0.1, c=2, threshold=1.0):
    """SVT3 and the original SVT4 (ρ ~ Lap(4/ε), ν ~ Lap(4/(3ε))) on the same queries, outputs side by side."""
    left = svt3(epsilon, c, threshold)
    right = svt_abort(epsilon, c, threshold, rho_scale=4.0 / epsilon, nu_scale=4.0 / (3.0 * epsilon))

    def sample(database, size, rng):
        return np.hstack([left(database, size, rng), right(database, size, rng).astype(float)])

    return sample


def numerical_svt(epsilon=0.1, c=2, threshold=1.0):
    """NumericalSVT (Wang et al. 2019): compare with ρ1 ~ Lap(3/ε), ν ~ Lap(6c/ε); release
    q_i + Lap(3c/ε) (fresh noise) above, 0 below, -1000 after the c-th answer above."""
    c = int(c)
    rho_scale, nu_scale, out_scale = 3.0 / epsilon, 6.0 * c / epsilon, 3.0 * c / epsilon

    def sample(database, size, rng):
        q = vec(database)
        rho = laplace_noise(rng, rho_scale, (size, 1))
        above = q[None, :] + laplace_noise(rng, nu_scale, (size, q.size)) >= threshold + rho
        values = q[None, :] + laplace_noise(rng, out_scale, (size, q.size))
        answers = _abort_after(above, c)
        return np.where(answers == 1, values, np.where(answers == 0, 0.0, -1000.0))

    return sample


def svt_abort_law(q, rho_scale: float, nu_scale: float, threshold: float, c: int) -> dict:
    """Exact law of the answers of :func:`svt_abort`, as {answers: probability}.

    Given ρ = r the answers are independent until the c-th answer above, so an
    outcome with answers above at the set S (|S| ≤ c) has probability
    ∫ p_ρ(r) Π_{i∈S} S_ν(T + r − q_i) Π_{i∉S, i<stop} F_ν(T + r − q_i) dr
    (stop: after the last member of S if |S| = c, else after the last query).
    """
    q = np.atleast_1d(np.asarray(q, float))
    m = q.size
    outcomes, codes = [], []
    for size in range(c + 1):
        for members in itertools.combinations(range(m), size):
            answers = np.zeros(m, dtype=int)
            answers[list(members)] = 1
            if size == c and size > 0:
                answers[members[-1] + 1:] = -1
            outcomes.append(tuple(answers.tolist()))
            codes.append(answers)
    return dict(zip(outcomes, _threshold_mixture(q, np.array(codes), rho_scale, nu_scale, threshold).tolist()))


def svt_free_pair_epsilon(x, y, rho_scale: float, nu_scale: float, threshold: float) -> float:
    """Exact ε of SVT6 (answers 1{q_i + ν_i ≥ T + ρ}, no abort) on a pair.

    Queries with equal (x_i, y_i) have exchangeable answers under both inputs, so an
    answer vector's probability is Π_g S_g^{k_g} F_g^{n_g − k_g} integrated over ρ, with
    k_g its number of answers above in group g: the ratio depends on the counts only,
    and the laws of the count tuples (a handful per pattern, not 2^m) give ε.
    """
    x, y = np.atleast_1d(np.asarray(x, float)), np.atleast_1d(np.asarray(y, float))
    groups, sizes = np.unique(np.stack([x, y], axis=1), axis=0, return_counts=True)
    counts = np.array(list(itertools.product(*(range(n + 1) for n in sizes))))
    laws = []
    for q in (groups[:, 0], groups[:, 1]):
        codes = np.concatenate([counts, sizes[None, :] - counts], axis=1)  # aboves, then belows per group
        laws.append(_threshold_mixture(q, codes, rho_scale, nu_scale, threshold, counted=True))
    return truth.discrete_epsilon(laws[0], laws[1])


def _threshold_mixture(q, codes, rho_scale, nu_scale, threshold, chunk: int = 128,
                       counted: bool = False) -> np.ndarray:
    """∫ p_ρ(r) Π_i g_i(r) dr per row of ``codes`` (1: above, 0: below, -1: not asked), or with
    ``counted`` per row of (answers above per query, answers below per query)."""
    big = max(rho_scale, nu_scale)
    breaks = [0.0] + [float(v - threshold) for v in q]
    r, w = truth._segment_nodes(breaks, min(breaks) - 60 * big, max(breaks) + 60 * big,
                                min(rho_scale, nu_scale), order=24)
    log_rho = -np.abs(r) / rho_scale - math.log(2 * rho_scale)
    z = (threshold + r[:, None] - q[None, :]) / nu_scale
    log_below, log_above = truth._laplace_logcdf(z), truth._laplace_logsf(z)
    out = np.empty(len(codes))
    for start in range(0, len(codes), chunk):  # 2^10 outcomes x 10^4 nodes at once would be 80 MB
        part = codes[start:start + chunk]
        if counted:
            logs = part[:, :q.size] @ log_above.T + part[:, q.size:] @ log_below.T
        else:
            logs = (part == 1).astype(float) @ log_above.T + (part == 0).astype(float) @ log_below.T
        # terms below e^-600 are dropped: they cannot move a probability we compare, and their
        # subnormal exponentials are ten times slower
        out[start:start + chunk] = np.exp(np.maximum(logs + log_rho[None, :], -600.0)) @ w
    return out


def law_epsilon(px: dict, py: dict) -> float:
    """max over outcomes of |log P_x − log P_y| for two laws given as {outcome: probability}."""
    keys = sorted(set(px) | set(py))
    return truth.discrete_epsilon([px.get(k, 0.0) for k in keys], [py.get(k, 0.0) for k in keys])


def numerical_svt_pair_epsilon(x, y, epsilon: float, c: int, threshold: float) -> float:
    """Exact ε of NumericalSVT on a pair.

    An output is the answer pattern a and, for the queries above, values
    v_j = q_j + Lap(3c/ε) drawn independently of a. Its log ratio is
    L(a) + Σ_{j above} h_j(v_j), each h_j ranging over [−|Δ_j| ε/(3c), +|Δ_j| ε/(3c)];
    the supremum is max_a |L(a)| + Σ_{j above in a} |Δ_j| ε/(3c).
    """
    x, y = np.atleast_1d(np.asarray(x, float)), np.atleast_1d(np.asarray(y, float))
    rho_scale, nu_scale = 3.0 / epsilon, 6.0 * c / epsilon
    px = svt_abort_law(x, rho_scale, nu_scale, threshold, c)
    py = svt_abort_law(y, rho_scale, nu_scale, threshold, c)
    shift = np.abs(x - y) * epsilon / (3.0 * c)
    worst = 0.0
    for a, p in px.items():
        if (p > 0) != (py[a] > 0):
            return math.inf
        if p > 0:
            above = np.array(a) == 1
            worst = max(worst, abs(math.log(p) - math.log(py[a])) + float(shift[above].sum()))
    return worst


# ----------------------------------------------------------------------------- RAPPOR

def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit (Appleby), as a signed int like ``mmh3.hash``."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    nblocks = len(data) // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[4 * nblocks:]
    k = 0
    for i, byte in enumerate(tail):
        k |= byte << (8 * i)
    if tail:
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def bloom_bits(value, hashes: int, filter_size: int) -> np.ndarray:
    """RAPPOR's Bloom filter of ``value``: bit ``mmh3.hash(str(value), seed=i) % size`` set for each i.

    Integer values hash as integers ("1", not "1.0"), as DP-Sniper's integer inputs do.
    """
    v = stat(value)
    text = str(int(v)) if v == int(v) else str(v)
    bits = np.zeros(int(filter_size), dtype=np.int8)
    for i in range(int(hashes)):
        bits[murmur3_32(text.encode(), i) % int(filter_size)] = 1
    return bits


def rappor_one_probs(f: float, p: float | None, q: float | None) -> tuple[float, float]:
    """P(reported bit = 1) for a Bloom bit 0 and 1: permanent RR (keep with prob. 1 − f, else a fair
    coin), then for full RAPPOR the instantaneous RR (report 1 with prob. q if set, p if not)."""
    perm0, perm1 = f / 2, 1 - f / 2
    if p is None:
        return perm0, perm1
    return perm0 * q + (1 - perm0) * p, perm1 * q + (1 - perm1) * p


def rappor(hashes=4, filter_size=20, f=0.75, p=0.45, q=0.55):
    """RAPPOR (Erlingsson et al. 2014, steps 1-3); one-time RAPPOR (steps 1-2) with ``p = q = None``."""
    one0, one1 = rappor_one_probs(f, p, q)

    def sample(database, size, rng):
        bits = bloom_bits(database, hashes, filter_size)
        prob = np.where(bits == 1, one1, one0)
        return (rng.random((size, bits.size)) < prob[None, :]).astype(np.int8)

    return sample


def rappor_pair_epsilon(x, y, hashes: int, filter_size: int, f: float, p=None, q=None) -> float:
    """ε of RAPPOR on two values: the reported bits are independent, so the log ratios add over
    the Bloom bits that differ, each ln(P(1|1)/P(1|0)) or ln(P(0|0)/P(0|1)), whichever is larger."""
    return rappor_bit_epsilon(f, p, q) * int(np.sum(bloom_bits(x, hashes, filter_size)
                                                    != bloom_bits(y, hashes, filter_size)))


def rappor_bit_epsilon(f: float, p=None, q=None) -> float:
    one0, one1 = rappor_one_probs(f, p, q)
    return max(abs(math.log(one1 / one0)), abs(math.log((1 - one0) / (1 - one1))))
