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


#: ReportNoisyMax's noise families: is the noise exponential (else Laplace)
_EXPONENTIAL = {"laplace": False, "exponential": True}


def report_noisy_max(epsilon=0.1, noise="laplace", output="index"):
    """ReportNoisyMax1-4 (Ding et al. 2018, Alg. 5-8): noise of scale 2/ε, the argmax or the max."""
    scale = 2.0 / epsilon
    exponential = _EXPONENTIAL[noise]  # (an unknown name fails here, not as Laplace noise)

    def sample(database, size, rng):
        from .compiled import noisy_max_index, noisy_max_value  # numba: loaded by the first draw

        kernel = noisy_max_index if output == "index" else noisy_max_value
        return kernel(vec(database), scale, exponential, size, rng)

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
        from .compiled import svt_answers  # numba: loaded by the first draw

        return svt_answers(vec(database), float(threshold), float(rho_scale), float(nu_scale), c, False,
                           int(size), rng)

    return sample


def svt3(epsilon=0.1, c=1, threshold=1.0):
    """SVT3 (Lyu et al. 2017, Alg. 3): the noisy answer q_i + ν_i for queries above the threshold.

    ρ ~ Lap(2/ε), ν ~ Lap(2c/ε); a query below gives -1000, an aborted one -2000
    (DP-Sniper's codes).
    """
    c = int(c)
    rho_scale, nu_scale = 2.0 / epsilon, 2.0 * c / epsilon

    def sample(database, size, rng):
        from .compiled import svt_values  # numba: loaded by the first draw

        return svt_values(vec(database), float(threshold), rho_scale, nu_scale, c, 0.0, -1000.0, -2000.0,
                          int(size), rng)

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
        from .compiled import svt_values  # numba: loaded by the first draw

        return svt_values(vec(database), float(threshold), rho_scale, nu_scale, c, out_scale, 0.0, -1000.0,
                          int(size), rng)

    return sample


def svt_abort_law(q, rho_scale: float, nu_scale: float, threshold: float, c: int) -> dict:
    """Exact law of the answers of :func:`svt_abort`, as {answers: probability}.

    Given ρ = r the answers are independent until the c-th answer above, so an
    outcome with answers above at the set S (|S| ≤ c) has probability
    ∫ p_ρ(r) Π_{i∈S} S_ν(T + r − q_i) Π_{i∉S, i<stop} F_ν(T + r − q_i) dr
    (stop: after the last member of S if |S| = c, else after the last query).
    """
    q = np.atleast_1d(np.asarray(q, float))
    outcomes, codes = [], []
    for above, stop in abort_patterns(q.size, c):
        answers = np.zeros(q.size, dtype=int)
        answers[list(above)] = 1
        answers[stop:] = -1
        outcomes.append(tuple(answers.tolist()))
        codes.append(answers)
    return dict(zip(outcomes, _threshold_mixture(q, np.array(codes), rho_scale, nu_scale, threshold).tolist()))


def abort_patterns(m: int, c: int):
    """The answer patterns of an SVT that aborts after c answers above, as (above, stop): the queries
    answered above, and the number answered (all m unless the c-th answer above ends the run)."""
    for size in range(c + 1):
        for above in itertools.combinations(range(m), size):
            yield above, (above[-1] + 1 if size == c and size else m)


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


# ----------------------------------------------------------------------------- SVT3's exact ε on a pair

#: absolute accuracy of :func:`svt3_loss_range`: each supremum is known to within it
SVT3_TOL = 1e-9
#: most cells one answer pattern may take (large ε over widely spread queries); beyond, not computed
SVT3_MAX_CELLS = 1 << 16


def svt3_pair_epsilon(x, y, epsilon: float, c: int, threshold: float) -> float | None:
    """Exact ε of SVT3 (:func:`svt3`) on a pair: sup over outputs of |ln p_x(o) − ln p_y(o)|.

    See :func:`svt3_loss_range` for the output's density and how the supremum is taken;
    None when a pattern would need more than :data:`SVT3_MAX_CELLS` cells.
    """
    ranges = svt3_loss_range(x, y, epsilon, c, threshold)
    return None if ranges is None else max(ranges)


def svt34_parallel_pair_epsilon(x, y, epsilon: float, c: int, threshold: float) -> float | None:
    """Exact ε of :func:`svt34_parallel` on a pair.

    Its SVT3 and SVT4 parts use independent noise, so an output's log ratio is the sum of the
    parts' and its supremum the sum of theirs, in each direction:
    ε = max(sup L3 + max L4, sup(−L3) + max(−L4)), L4 over SVT4's answer patterns
    (:func:`svt_abort_law`).
    """
    x, y = vec(x), vec(y)
    ranges = svt3_loss_range(x, y, epsilon, c, threshold)
    if ranges is None or max(ranges) == math.inf:
        return None if ranges is None else math.inf
    codes = []
    for above, below in _distinct_patterns(x, y, int(c)):
        answers = np.full(x.size, -1)
        answers[below], answers[above] = 0, 1
        codes.append(answers)
    laws = [_threshold_mixture(q, np.array(codes), 4.0 / epsilon, 4.0 / (3.0 * epsilon), threshold) for q in (x, y)]
    return max(s3 + s4 for s3, s4 in zip(ranges, truth.loss_range(*laws)))


def svt3_loss_range(x, y, epsilon: float, c: int, threshold: float) -> tuple[float, float] | None:
    """(sup L, sup −L) over SVT3's outputs o, L = ln p_x(o) − ln p_y(o), each to within :data:`SVT3_TOL`.

    An output is an answer pattern (queries above at A, |A| ≤ c, below at B, the rest aborted)
    with the released values v_a = q_a + ν_a, a ∈ A. Given ρ = r the answers are independent,
    and v_a is above the threshold iff r ≤ v_a − T, so its density is
    Π_{a∈A} f_ν(v_a − q_a) · G_B(min_a v_a), G_B(w) = ∫_{−∞}^w p_ρ(s − T) Π_{i∈B} F_ν(s − q_i) ds,
    with ρ ~ Lap(2/ε), ν ~ Lap(2c/ε). The log ratio is Σ_a ℓ_a(v_a) + D(w), w = min_a v_a,
    ℓ_a(v) = (|v − y_a| − |v − x_a|)/ν monotone between its limits ±(y_a − x_a)/ν, and
    D = ln G_B^x − ln G_B^y. For a given w one value is w and the others range over [w, ∞), where
    ℓ_a's supremum is max(ℓ_a(w), ℓ_a(∞)): the supremum is sup_w φ(w), φ = D + M,
    M(w) = Σ_a s_a(w) + max_a (ℓ_a(w) − s_a(w)), s_a = max(ℓ_a(·), ℓ_a(∞)) (and sup −L the same
    with x and y swapped). A pattern without values has L = D(∞).

    sup_w φ is taken by branch and bound, exact to SVT3_TOL (:func:`_pattern_sup`): φ is constant
    below every query and the threshold (G_B ∝ e^{(1/ρ + |B|/ν) w} there), within SVT3_TOL of
    φ(U) beyond a point U where the rest of G_B is that small, and in between, on cells between
    the kinks, φ'' ≥ −C (G_B's integrand is log-concave with log-slope in [−1/ρ, κ],
    κ = 1/ρ + |B|/ν, so (ln G_B)'' ≥ −r(κ + 1/ρ), r = G_B'/G_B non-increasing; M is convex
    there), so no value in a cell exceeds the larger end's by more than C h²/8. G_B is
    integrated by 8-point Gauss-Legendre on cells between its kinks of at most 1/(2(κ + 1/ρ)),
    where its integrand is smooth and its log changes by at most 1/2 (exact to rounding).

    Returns None for queries that are not finite or when a pattern needs more than
    :data:`SVT3_MAX_CELLS` cells, and ∞ both ways for inputs of different lengths (their outputs'
    lengths tell them apart).
    """
    x, y = vec(x), vec(y)
    if x.size != y.size:
        return math.inf, math.inf
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        return None
    rho, nu = 2.0 / epsilon, 2.0 * c / epsilon
    up = down = 0.0
    for above, below in _distinct_patterns(x, y, int(c)):
        part = _PatternLoss(x, y, above, below, rho, nu, threshold)
        sups = part.sup(1), part.sup(-1)
        if None in sups:
            return None
        up, down = max(up, sups[0]), max(down, sups[1])
    return up, down


def _distinct_patterns(x, y, c: int):
    """The answer patterns (above, below) of an aborting SVT on the pair, one per distinct loss: the
    queries' noise is exchangeable, so a pattern's law depends on its pairs (x_i, y_i) above and
    below as multisets only."""
    seen = set()
    for above, stop in abort_patterns(x.size, c):
        above, below = list(above), np.setdiff1d(np.arange(stop), above)
        key = tuple(tuple(sorted(zip(x[i].tolist(), y[i].tolist()))) for i in (above, below))
        if key not in seen:
            seen.add(key)
            yield above, below


class _BelowMass:
    """G(w) = ∫_{−∞}^w p_ρ(s − T) Π_{i∈B} F_ν(s − q_i) ds in logs: the chance that the threshold T + ρ
    is at most w and the queries B fall below it (SVT3, :func:`svt3_loss_range`)."""

    _NODES, _WEIGHTS = np.polynomial.legendre.leggauss(8)

    def __init__(self, q_below, rho: float, nu: float, threshold: float):
        self.q, self.rho, self.nu, self.t = q_below, rho, nu, threshold
        self.kappa = 1.0 / rho + q_below.size / nu  # the integrand's largest log-slope

    def log_density(self, s):
        s = np.asarray(s, float)
        return (-np.abs(s - self.t) / self.rho - math.log(2 * self.rho)
                + truth._laplace_logcdf((s[..., None] - self.q) / self.nu).sum(axis=-1))

    def log_masses(self, a, b):
        """ln ∫_a^b per cell [a_k, b_k] inside one smooth piece of the integrand (Gauss-Legendre)."""
        half = (b - a) / 2
        logs = self.log_density((a + b)[:, None] / 2 + half[:, None] * self._NODES) + np.log(self._WEIGHTS)
        top = logs.max(axis=1)
        return top + np.log(np.exp(logs - top[:, None]).sum(axis=1)) + np.log(half)

    def log_cdf(self, grid, start=None):
        """ln G at the points of ``grid``; ``start`` its value at grid[0], by default at a point below
        every kink, where the integrand is proportional to e^{κ s} and G = density/κ."""
        if start is None:
            start = float(self.log_density(grid[0])) - math.log(self.kappa)
        return np.logaddexp.accumulate(np.concatenate([[start], self.log_masses(grid[:-1], grid[1:])]))


class _PatternLoss:
    """SVT3's log ratio on one answer pattern as φ(w) of the least released value (:func:`svt3_loss_range`)."""

    def __init__(self, x, y, above: list, below, rho: float, nu: float, threshold: float):
        self.mass = [_BelowMass(q[below], rho, nu, threshold) for q in (x, y)]
        self.xa, self.ya, self.nu, self.above = x[above], y[above], nu, above
        self.flat_g = np.array_equal(x[below], y[below])  # then D ≡ 0 and φ has no curvature
        self.kinks = np.concatenate([[threshold], x[below], y[below]])
        self.curve = self.mass[0].kappa + 1.0 / rho
        step = 0.5 / self.curve
        breaks = np.unique(np.concatenate([self.kinks, self.xa, self.ya]))
        self.grid = None
        if breaks.size + (breaks[-1] - breaks[0]) / step > SVT3_MAX_CELLS:
            return
        grid = truth.segment_edges(breaks, breaks[0], breaks[-1], step)
        log_g = [m.log_cdf(grid) for m in self.mass]
        # beyond U, G's remaining mass (at most the threshold's, e^{−(U−T)/ρ}/2) is within SVT3_TOL of G
        top = max(breaks[-1], threshold + rho * (-math.log(2 * SVT3_TOL) - min(g[-1] for g in log_g)))
        if grid.size + (top - breaks[-1]) / step > SVT3_MAX_CELLS:
            return
        tail = truth.segment_edges((), breaks[-1], top, step)
        log_g = [np.concatenate([g, m.log_cdf(tail, g[-1])[1:]]) for m, g in zip(self.mass, log_g)]
        self.grid, self.log_g = np.concatenate([grid, tail[1:]]), np.array(log_g)

    def phi(self, sign: int, w, log_g):
        """sign·L's supremum over the values whose least is w (a pattern without values: L at w = ∞)."""
        d = sign * (log_g[0] - log_g[1])
        if not self.above:
            return d
        ell = sign * (np.abs(w[:, None] - self.ya) - np.abs(w[:, None] - self.xa)) / self.nu
        top = np.maximum(ell, sign * (self.xa - self.ya) / self.nu)
        return d + top.sum(axis=1) + (ell - top).max(axis=1)

    def curvature(self, sign: int, w, log_g):
        """C per cell starting at w: φ'' ≥ −C on it (0 where G_B^x ≡ G_B^y or below every kink)."""
        num = 0 if sign > 0 else 1
        if self.flat_g:
            return np.zeros(w.size)
        rate = np.exp(self.mass[num].log_density(w) - log_g[num])  # r = G'/G, non-increasing
        return np.where(w < self.kinks.min(), 0.0, rate * self.curve)

    def sup(self, sign: int) -> float | None:
        """sup_w sign·φ(w), to within SVT3_TOL (None: too many cells)."""
        if self.grid is None:
            return None
        w, log_g = self.grid, self.log_g
        phi = self.phi(sign, w, log_g)
        if not np.all(np.isfinite(phi)):  # G underflowed beyond its logs: not computed
            return None
        if not self.above:
            return float(phi[-1])
        cells = [w[:-1], w[1:], log_g[:, :-1], phi[:-1], phi[1:], self.curvature(sign, w[:-1], log_g[:, :-1])]
        return _pattern_sup(self, sign, cells, float(phi.max()))


def _pattern_sup(part: _PatternLoss, sign: int, cells: list, best: float) -> float | None:
    """Branch and bound: split the cells whose bound max(φ(a), φ(b)) + C (b − a)²/8 exceeds the best
    value found by more than SVT3_TOL, until none does (None past SVT3_MAX_CELLS splits)."""
    splits = 0
    while True:
        a, b, log_a, phi_a, phi_b, curv = cells
        open_ = np.maximum(phi_a, phi_b) + curv * (b - a) ** 2 / 8 > best + SVT3_TOL
        if not open_.any():
            return best
        splits += np.count_nonzero(open_)
        if splits > SVT3_MAX_CELLS:
            return None
        a, b, log_a, phi_a, phi_b, curv = (v[..., open_] for v in cells)
        mid = (a + b) / 2
        log_mid = np.logaddexp(log_a, np.array([m.log_masses(a, mid) for m in part.mass]))
        phi_mid = part.phi(sign, mid, log_mid)
        best = max(best, float(phi_mid.max()))
        cells = [np.concatenate([a, mid]), np.concatenate([mid, b]), np.concatenate([log_a, log_mid], axis=1),
                 np.concatenate([phi_a, phi_mid]), np.concatenate([phi_mid, phi_b]),
                 np.concatenate([curv, part.curvature(sign, mid, log_mid)])]


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
