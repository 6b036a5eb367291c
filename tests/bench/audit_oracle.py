"""Oracle bounds on DP-Sniper's 20 mechanisms: which of its reference 90% bounds can a valid bound reach?

For each mechanism of ``DPSNIPER_SUITE`` (DP-Sniper's parameters and input pairs) the output laws of
both inputs of every pair are computed exactly, without sampling, as the masses (P0 under x, P1 under x')
of the cells of a partition of the output space. Cells are merged by their log ratio L = ln(P0/P1)
rounded to a grid of H = 1e-5 (a union of cells is an event, so the masses stay exact; only the order
of cells whose L differ by less than H is lost). Sorting them by L gives the Neyman-Pearson events
S = {L ≥ t}, and a fraction λ of the boundary cell gives the randomised boundary of DP-Sniper's
threshold tests (``dpsniper/attack/ml_attack.py``). Both directions of every pair are used.

The ORACLE bound of a construction at N outputs per input is its value when the estimates equal the true
P0(S), P1(S), at the best event S (over t, λ, pairs, directions): the bound of a perfect attack when its
estimates err neither way. A run exceeds it only when its estimates err upward: with sd the estimate's
standard error at that event, P(bound ≥ oracle + k·sd) ≈ 1 − Φ(k), and for a median of 3 seeds
3p² − 2p³ of that p.

* DP-Sniper's construction (``dpsniper/probability/estimators.py`` l. 121-127, ``binomial_cdf.py``):
  one-sided Clopper-Pearson at 0.05 for each probability (a union bound for 90% in all),
  ln lcb(N, ⌊P0 N⌋) − ln ucb(N, ⌊P1 N⌋), at N = n_final = 2·10^8 outputs per input
  (``dpsniper/search/ddconfig.py``; fresh outputs, ``ddwitness.py`` l. 43). Its event has P1(S) = c = 0.01
  (``dpsniper/attack/dpsniper.py`` l. 82: the threshold leaves a fraction c of the outputs of x' above),
  printed as "CP c", and with the best S of any P1 as "CP best". "eps c" is ln(P0/P1) of the c = 0.01 event,
  the estimate a perfect classifier's run has on average.
* Ours (MPL's stage 2 on an event, ``_stage2_discrete`` of empdp/audit/mpl.py):
  ln(P0/P1) − z_0.9·sqrt((1−P0)/(N P0) + (1−P1)/(N P1)) at N ∈ {1, 3, 10, 30}·10^6 per input ("G N"), and
  at N20, the most a 20 s run could draw: 20 s on 2 cores all spent drawing the two inputs' outputs,
  N20 = 20 s / (µs per output), nothing for stage 1 or for scoring (measured runs of 20 s on a shared
  host, drawing on one core, reached a stage-2 N 6-30 times smaller; on both, 4-13 times). "P(med3)" is the chance that the median of 3 runs at N20
  on the oracle's event reaches "DPS ref"; "N*" is the least N per input at which our oracle reaches it,
  "s*" the seconds its 2·N* outputs take on 2 cores. The randomised boundary moves none of our values by
  1e-4 except on SVT5, whose outcomes are few and one of them impossible under x' (its ε is ∞).

"DPS ref" is the better of DP-Sniper's two reference bounds, rounded to 3 decimals as in the issue
(``audit_suite.DPSNIPER``); unrounded, each is in ``eval_sp2021/reference-results/dd_search_*_data.log``
beside its p1, p2 at n_final, from which :func:`clopper_pearson` gives it back (Laplace: 0.0968037).

Laws: exact pmfs from empdp.audit.truth/sniper (truncated geometric, ReportNoisyMax1/2, SVT1/2/4 and the
answer patterns of NumericalSVT and SVT34Parallel (``svt_abort_law``), SVT5 (``svt5_law``), SVT6 (the count
laws of ``svt_free_pair_epsilon``)); closed-form CDFs on fine cells (Laplace, NoisyHist1/2: one bin differs;
ReportNoisyMax3/4: the max's CDF is the product of the CDFs); independent coordinates by numerical
convolution of their binned losses (LaplaceParallel, PrefixSum: the prefix sums are an invertible map of the
noisy answers; NumericalSVT's released values given its pattern); RAPPOR's differing Bloom bits enumerated.
SVT3 has no law in empdp: here its density given the pattern (above set A, below set B) is
Π_{a∈A} f_ν(v_a − q_a) · G_B(min_a v_a − T), G_B(u) = ∫_{r≤u} p_ρ(r) Π_{i∈B} F_ν(T + r − q_i) dr, by cumulative
trapezoid on a grid of 0.02 (its pattern masses match ``svt_abort_law``); with c = 2 (SVT34Parallel)
the two values' cells are coarser away from the queries (exact masses off the diagonal, the diagonal cells'
G taken at their midpoint). "max|L|" is the largest finite cell loss: a check against the exact ε.

Sampling cost: µs per output of the audit's draw (``empdp.audit.common.draw``: the sampler in parts of
2^15 rows, outputs checked) of 10^6 outputs on one thread, best of 2.

    python tests/bench/audit_oracle.py [--only svt2,laplace] [--no-cost]

It takes about two and a half minutes, most of it SVT34Parallel's two-value cells.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import math
import time
from pathlib import Path

import numpy as np
from scipy import signal, stats

from empdp.audit import sniper, truth
from empdp.audit.common import draw
from empdp.audit.mechanisms import DPSNIPER_SUITE, dpsniper_mechanism
from empdp.audit.samplers import stat, vec

#: DP-Sniper's final sample size per input, confidence split and event mass (dpsniper/search/ddconfig.py)
DPS_N, DPS_ALPHA, DPS_C = 200_000_000, 0.05, 0.01
OUR_NS = (10**6, 3 * 10**6, 10**7, 3 * 10**7)
Z90 = float(stats.norm.ppf(0.9))
H = 1e-5  # loss grid
TINY = 1e-30  # cells lighter than this under both inputs cannot move a bound
FFT_FLOOR = 1e-13  # convolved bins lighter than this are the FFT's rounding (~1e-17), and go
BUDGET_CORE_SECONDS = 20.0 * 2


def _reference() -> dict:
    """DP-Sniper's reference bounds, from the suite bench (one table, not two)."""
    spec = importlib.util.spec_from_file_location("audit_suite", Path(__file__).with_name("audit_suite.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DPSNIPER


# ----------------------------------------------------------------------------- binned losses

class Bins:
    """Masses under x and x' of the cells of one loss bin each (L = (lo + i)·H), and of L = ±∞."""

    def __init__(self):
        self.lo, self.b0, self.b1 = 0, np.zeros(0), np.zeros(0)
        self.inf0 = self.inf1 = 0.0  # P0 where P1 = 0, P1 where P0 = 0

    def add_cells(self, w0, w1) -> Bins:
        w0, w1 = np.ravel(np.asarray(w0, float)), np.ravel(np.asarray(w1, float))
        live = np.maximum(w0, w1) > TINY
        w0, w1 = w0[live], w1[live]
        self.inf0 += float(w0[w1 <= 0].sum())
        self.inf1 += float(w1[w0 <= 0].sum())
        both = (w0 > 0) & (w1 > 0)
        if both.any():
            w0, w1 = w0[both], w1[both]
            idx = np.rint((np.log(w0) - np.log(w1)) / H).astype(np.int64)
            lo = int(idx.min())
            self.add_bins(lo, np.bincount(idx - lo, w0), np.bincount(idx - lo, w1))
        return self

    def add_bins(self, lo: int, b0, b1) -> None:
        if not self.b0.size:
            self.lo, self.b0, self.b1 = lo, np.array(b0, float), np.array(b1, float)
            return
        new_lo, new_hi = min(self.lo, lo), max(self.lo + self.b0.size, lo + len(b0))
        out0, out1 = np.zeros(new_hi - new_lo), np.zeros(new_hi - new_lo)
        for start, a0, a1 in ((self.lo, self.b0, self.b1), (lo, b0, b1)):
            out0[start - new_lo:start - new_lo + len(a0)] += a0
            out1[start - new_lo:start - new_lo + len(a1)] += a1
        self.lo, self.b0, self.b1 = new_lo, out0, out1

    def convolve(self, other: Bins) -> Bins:
        """The losses of two independent outputs released together (their losses add)."""
        if self.inf0 or self.inf1 or other.inf0 or other.inf1:
            raise ValueError("infinite losses are not convolved")
        out = Bins()
        out.lo = self.lo + other.lo
        out.b0, out.b1 = signal.fftconvolve(self.b0, other.b0), signal.fftconvolve(self.b1, other.b1)
        # a bin of rounding noise would carry a noise loss: it goes from both laws
        noise = (out.b0 < FFT_FLOOR) | (out.b1 < FFT_FLOOR)
        out.b0[noise] = out.b1[noise] = 0.0
        return out

    def cells(self):
        return np.append(self.b0, [self.inf0, 0.0]), np.append(self.b1, [0.0, self.inf1])


def _power(bins: Bins, k: int) -> Bins:
    """k independent copies, by repeated squaring (fewer FFTs, less rounding)."""
    out, base = None, bins
    while k:
        if k & 1:
            out = base if out is None else out.convolve(base)
        k >>= 1
        if k:
            base = base.convolve(base)
    return out


def _law_bins(px: dict, py: dict) -> Bins:
    keys = sorted(set(px) | set(py))
    return Bins().add_cells([px.get(k, 0.0) for k in keys], [py.get(k, 0.0) for k in keys])


# ----------------------------------------------------------------------------- laws on the line

def _interval_masses(edges, logcdf) -> np.ndarray:
    """Masses between sorted ``edges`` from a log CDF, by the CDF below the median and the survival
    function above it (no cancellation in either tail)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lc = logcdf(np.asarray(edges, float))
        cdf, sf = np.exp(lc), -np.expm1(lc)
    return np.where(cdf[1:] <= 0.5, np.diff(cdf), -np.diff(sf))


def _laplace_logcdf(loc, scale):
    return lambda t: truth._laplace_logcdf((t - loc) / scale)


def _laplace_shift(a: float, b: float, scale: float, cells: int = 40_000) -> Bins:
    """Lap(a, scale) against Lap(b, scale): the loss is constant outside [a, b] and linear inside."""
    if a == b:
        return Bins().add_cells([1.0], [1.0])
    edges = np.concatenate([[-np.inf], np.linspace(min(a, b), max(a, b), cells + 1), [np.inf]])
    return Bins().add_cells(_interval_masses(edges, _laplace_logcdf(a, scale)),
                            _interval_masses(edges, _laplace_logcdf(b, scale)))


def _independent_laplace(x, y, scale: float) -> Bins:
    """x + Lap(scale) per coordinate against y + Lap(scale): the coordinates' losses convolved."""
    out = None
    for a, b in zip(vec(x), vec(y)):
        if a != b:
            part = _laplace_shift(a, b, scale)
            out = part if out is None else out.convolve(part)
    return out if out is not None else Bins().add_cells([1.0], [1.0])


def _max_bins(x, y, scale: float, noise: str, width: float = 0.005) -> Bins:
    """max_i(q_i + noise_i): its CDF is the product of the coordinates' CDFs."""
    qx, qy = vec(x), vec(y)
    if noise == "laplace":
        lo, base = min(qx.min(), qy.min()) - 15 * scale, truth._laplace_logcdf
    else:  # exponential noise: the support starts at max q
        lo, base = min(qx.max(), qy.max()), sniper._exponential_logcdf
    hi = max(qx.max(), qy.max()) + 40 * scale
    edges = np.concatenate([[-np.inf], np.arange(lo, hi, width), [hi, np.inf]])

    def logcdf(q):
        return lambda t: base((t[:, None] - q[None, :]) / scale).sum(axis=1)

    return Bins().add_cells(_interval_masses(edges, logcdf(qx)), _interval_masses(edges, logcdf(qy)))


# ----------------------------------------------------------------------------- SVT3 (no law in empdp)

class _Svt3Law:
    """SVT3's law on a grid of the threshold noise r (the values are v = r + T).

    Given ρ = r the answers are independent: a pattern with answers above at A and below at B has
    density Π_{a∈A} f_ν(v_a − q_a) · G_B(min_a v_a − T), G_B(u) = ∫_{r≤u} p_ρ(r) Π_{i∈B} F_ν(T + r − q_i) dr.
    """

    STEP = 0.02

    def __init__(self, q, rho: float, nu: float, threshold: float):
        self.q, self.nu, self.t = vec(q), nu, threshold
        span = 60 * max(rho, nu)
        self.r = np.arange(-span, span + self.STEP / 2, self.STEP)
        self.log_rho = -np.abs(self.r) / rho - math.log(2 * rho)
        self.log_below = truth._laplace_logcdf((threshold + self.r[None, :] - self.q[:, None]) / nu)

    def g(self, below) -> np.ndarray:
        """G_B at the grid points (cumulative trapezoid)."""
        dens = np.exp(self.log_rho + self.log_below[list(below)].sum(axis=0))
        return np.concatenate([[0.0], np.cumsum((dens[1:] + dens[:-1]) * (self.STEP / 2))])

    def value_pdf(self, k: int) -> np.ndarray:
        return np.exp(-np.abs(self.r + self.t - self.q[k]) / self.nu) / (2 * self.nu)

    def value_cells(self, k: int, edges) -> np.ndarray:
        """Masses of q_k + Lap(ν) between grid points ``edges`` (indices), the outer cells unbounded."""
        v = self.r[edges] + self.t
        v = np.concatenate([[-np.inf], v[1:-1], [np.inf]])
        return _interval_masses(v, _laplace_logcdf(self.q[k], self.nu))


def _trapezoid_cells(dens, edges, step) -> np.ndarray:
    """Trapezoid integrals between grid indices ``edges`` (increasing, the last the grid's end), as sums of
    the intervals' own (differences of a cumulative sum would lose the small cells in its rounding)."""
    return np.add.reduceat((dens[1:] + dens[:-1]) * (step / 2), edges[:-1])


def _coarse_edges(law: _Svt3Law) -> np.ndarray:
    """Grid indices of value cells: 0.02 near the queries, wider where the loss barely moves."""
    v = law.r + law.t
    lo, hi = law.q.min() - 3, law.q.max() + 3
    points = np.concatenate([np.arange(lo, hi, 0.02), np.arange(-120, 120, 0.5), np.arange(-600, 600, 2.0),
                             np.arange(v[0], v[-1], 10.0), [v[0], v[-1]]])
    return np.unique(np.clip(np.rint((points - v[0]) / law.STEP).astype(np.int64), 0, v.size - 1))


def _svt3_bins(x, y, c: int, rho: float, nu: float, threshold: float) -> Bins:
    laws = [_Svt3Law(q, rho, nu, threshold) for q in (x, y)]
    m, out = laws[0].q.size, Bins()
    fine = np.arange(laws[0].r.size)
    coarse = _coarse_edges(laws[0])
    for size in range(c + 1):
        for above in itertools.combinations(range(m), size):
            stop = above[-1] + 1 if size == c and size else m
            below = [i for i in range(stop) if i not in above]
            gs = [law.g(below) for law in laws]
            if size == 0:
                out.add_cells([gs[0][-1]], [gs[1][-1]])
            elif size == 1:
                out.add_cells(*(_trapezoid_cells(law.value_pdf(above[0]) * g, fine, law.STEP)
                                for law, g in zip(laws, gs)))
            else:
                out.add_cells(*(_two_above(law, g, above, coarse) for law, g in zip(laws, gs)))
    return out


def _two_above(law: _Svt3Law, g, above, edges) -> np.ndarray:
    """Masses of the (v_a, v_b) cells: the smaller value's cell carries G (exact off the diagonal)."""
    (a, b) = above
    h_a, h_b = (_trapezoid_cells(law.value_pdf(k) * g, edges, law.STEP) for k in (a, b))
    f_a, f_b = law.value_cells(a, edges), law.value_cells(b, edges)
    i, j = np.indices((h_a.size, h_b.size))
    return np.where(i < j, h_a[:, None] * f_b[None, :],
                    np.where(i > j, f_a[:, None] * h_b[None, :],
                             0.5 * (h_a[:, None] * f_b[None, :] + f_a[:, None] * h_b[None, :])))


# ----------------------------------------------------------------------------- the suite's laws

def _svt6_law(q, groups, sizes, rho: float, nu: float, threshold: float) -> np.ndarray:
    """P(answer counts per group of equal (x_i, x'_i)): ``svt_free_pair_epsilon``'s per-vector law times
    the number of answer vectors with those counts."""
    counts = np.array(list(itertools.product(*(range(n + 1) for n in sizes))))
    codes = np.concatenate([counts, sizes[None, :] - counts], axis=1)
    ways = np.prod([[math.comb(int(n), int(k)) for n, k in zip(sizes, row)] for row in counts], axis=1)
    return ways * sniper._threshold_mixture(q, codes, rho, nu, threshold, counted=True)


def _svt6(x, y, p) -> Bins:
    rho = 2 / p["epsilon"]
    groups, sizes = np.unique(np.stack([vec(x), vec(y)], axis=1), axis=0, return_counts=True)
    return Bins().add_cells(*(_svt6_law(groups[:, i], groups, sizes, rho, rho, 1.0) for i in (0, 1)))


def _rappor(one_time: bool):
    def build(x, y, p) -> Bins:
        pq = (None, None) if one_time else (p["p"], p["q"])
        one0, one1 = sniper.rappor_one_probs(p["f"], *pq)
        bx, by = (sniper.bloom_bits(v, int(p["hashes"]), int(p["filter_size"])) for v in (x, y))
        laws = []
        for bits in (bx, by):
            probs = np.where(bits[bx != by] == 1, one1, one0)  # P(report 1) of each differing bit
            laws.append(np.array([np.prod(np.where(np.array(out) == 1, probs, 1 - probs))
                                  for out in itertools.product((0, 1), repeat=probs.size)]))
        return Bins().add_cells(*laws)

    return build


def _numerical_svt(x, y, p) -> Bins:
    """The answer pattern's law, and given it the released values q_j + Lap(3c/ε) of the queries above."""
    eps, c, t = p["epsilon"], int(p["c"]), p["threshold"]
    px, py = (sniper.svt_abort_law(q, 3 / eps, 6 * c / eps, t, c) for q in (x, y))
    # a value's loss law depends on |x_j − x'_j| only (shift and reflect both laws together)
    diff = np.abs(vec(x) - vec(y))
    value = {d: _laplace_shift(0.0, d, 3 * c / eps) for d in set(diff.tolist()) - {0.0}}
    out = Bins()
    for answers, p0 in px.items():
        part = Bins().add_cells([p0], [py[answers]])
        for j in np.flatnonzero((np.array(answers) == 1) & (diff > 0)):
            part = part.convolve(value[float(diff[j])])
        out.add_bins(part.lo, part.b0, part.b1)
    return out


def _svt_abort(rho_of, nu_of, threshold_of=lambda p: 1.0):
    def build(x, y, p) -> Bins:
        args = (rho_of(p), nu_of(p), threshold_of(p), int(p.get("c", 1)))
        return _law_bins(sniper.svt_abort_law(x, *args), sniper.svt_abort_law(y, *args))

    return build


def _svt34(x, y, p) -> Bins:
    eps, c, t = p["epsilon"], int(p["c"]), p["threshold"]
    svt4 = _law_bins(*(sniper.svt_abort_law(q, 4 / eps, 4 / (3 * eps), t, c) for q in (x, y)))
    return _svt3_bins(x, y, c, 2 / eps, 2 * c / eps, t).convolve(svt4)


def _discrete(pmf):
    return lambda x, y, p: Bins().add_cells(pmf(x, p), pmf(y, p))


#: per mechanism: (x, x', built-in's params) -> Bins, with DP-Sniper's definitions (dpsniper/mechanisms)
LAWS = {
    "laplace": lambda x, y, p: _laplace_shift(stat(x), stat(y), 1 / p["epsilon"]),
    "truncated_geometric": _discrete(lambda q, p: sniper.truncated_geometric_pmf(int(stat(q)), p["epsilon"],
                                                                                 int(p["n"]))),
    "noisy_hist1": lambda x, y, p: _independent_laplace(x, y, 1 / p["epsilon"]),
    "noisy_hist2": lambda x, y, p: _independent_laplace(x, y, p["epsilon"]),
    "report_noisy_max1": _discrete(lambda q, p: truth.noisy_max_pmf(q, 2 / p["epsilon"])),
    "report_noisy_max2": _discrete(lambda q, p: sniper.noisy_max_exponential_pmf(q, 2 / p["epsilon"])),
    "report_noisy_max3": lambda x, y, p: _max_bins(x, y, 2 / p["epsilon"], "laplace"),
    "report_noisy_max4": lambda x, y, p: _max_bins(x, y, 2 / p["epsilon"], "exponential"),
    "svt1": _svt_abort(lambda p: 2 / p["epsilon"], lambda p: 4 * p["c"] / p["epsilon"], lambda p: p["threshold"]),
    "svt2": _svt_abort(lambda p: 2 / p["epsilon"], lambda p: 4 / p["epsilon"]),  # c = 1
    "svt3": lambda x, y, p: _svt3_bins(x, y, int(p["c"]), 2 / p["epsilon"], 2 * p["c"] / p["epsilon"],
                                       p["threshold"]),
    # DP-Sniper's SVT4 is svt4 at epsilon = 0.175: its own ε' = 0.175·4/7 = 0.1, ρ ~ Lap(4/ε'), ν ~ Lap(4/(3ε'))
    "svt4": _svt_abort(lambda p: 4 / (p["epsilon"] * 4 / 7), lambda p: 4 / (3 * p["epsilon"] * 4 / 7)),
    "svt5": lambda x, y, p: _law_bins(truth.svt5_law(x, 2 / p["epsilon"]), truth.svt5_law(y, 2 / p["epsilon"])),
    "svt6": _svt6,
    "rappor": _rappor(one_time=False),
    "one_time_rappor": _rappor(one_time=True),
    "laplace_parallel": lambda x, y, p: _power(_laplace_shift(stat(x), stat(y), 1 / p["epsilon"]), int(p["copies"])),
    "svt34_parallel": _svt34,
    "prefix_sum": lambda x, y, p: _independent_laplace(x, y, 1 / p["epsilon"]),
    "numerical_svt": _numerical_svt,
}


# ----------------------------------------------------------------------------- bounds on the events

def _gauss(p0, p1, n):
    """Our Gaussian-approximation 90% bound (−∞ where an estimate would be 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        val = np.log(p0 / p1) - Z90 * np.sqrt((1 - p0) / (n * p0) + (1 - p1) / (n * p1))
    return np.where((p0 > 0) & (p1 > 0), val, -np.inf)


def _wilson(p0, p1, n, z=float(stats.norm.ppf(1 - DPS_ALPHA))):
    """One-sided Wilson bounds at 0.05 each: Clopper-Pearson's shape, cheap enough to search with."""
    def bound(p, sign):
        centre = p + z * z / (2 * n)
        half = z * np.sqrt(np.maximum(p * (1 - p), 0) / n + z * z / (4 * n * n))
        return (centre + sign * half) / (1 + z * z / n)

    with np.errstate(divide="ignore", invalid="ignore"):
        val = np.log(bound(p0, -1)) - np.log(bound(p1, 1))
    return np.where(p0 > 0, val, -np.inf)


def clopper_pearson(p0: float, p1: float, n: int) -> float:
    """DP-Sniper's bound with its estimates at p0, p1 (``estimators.py`` _compute_lcb)."""
    k0, k1 = math.floor(p0 * n), math.floor(p1 * n)
    lcb = 0.0 if k0 == 0 else stats.beta.ppf(DPS_ALPHA, k0, n - k0 + 1)
    ucb = 1.0 if k1 == n else stats.beta.ppf(1 - DPS_ALPHA, k1 + 1, n - k1)
    return math.log(lcb) - math.log(ucb) if lcb > 0 else -math.inf


class Curve:
    """The nested events of one direction: cells by decreasing loss, with their cumulative masses."""

    LAMBDAS = np.linspace(0, 1, 9)[:-1]

    def __init__(self, p0, p1):
        with np.errstate(divide="ignore", invalid="ignore"):
            loss = np.log(p0) - np.log(p1)
        keep = (p0 > 0) | (p1 > 0)
        order = np.argsort(-loss[keep], kind="stable")
        self.a0, self.a1 = p0[keep][order], p1[keep][order]
        # quadrature leaves the totals within ~1e-5 of 1: no estimate above 1
        self.c0 = np.minimum(np.concatenate([[0.0], np.cumsum(self.a0)]), 1.0)
        self.c1 = np.minimum(np.concatenate([[0.0], np.cumsum(self.a1)]), 1.0)

    def event(self, k: int, lam):
        return (np.minimum(self.c0[k] + lam * self.a0[k], 1.0), np.minimum(self.c1[k] + lam * self.a1[k], 1.0))

    def best(self, bound) -> tuple[float, float, float]:
        """max over t and λ of bound(P0, P1): a grid of λ, then λ refined around the best cell."""
        lam = self.LAMBDAS[None, :]
        vals = bound(*self.event(np.arange(self.a0.size)[:, None], lam))
        k = int(np.unravel_index(np.argmax(vals), vals.shape)[0])
        best = (-math.inf, 0.0, 0.0)
        fine = np.linspace(0, 1, 4001)
        for j in range(max(k - 1, 0), min(k + 2, self.a0.size)):
            p0, p1 = self.event(j, fine)
            v = bound(p0, p1)
            i = int(np.argmax(v))
            if v[i] > best[0]:
                best = (float(v[i]), float(p0[i]), float(p1[i]))
        return best

    def at_mass(self, c: float) -> tuple[float, float]:
        """DP-Sniper's event: the top cells until P1 = c, the boundary cell in part."""
        k = int(np.searchsorted(self.c1, c, side="right")) - 1
        return self.event(k, (c - self.c1[k]) / self.a1[k])


# ----------------------------------------------------------------------------- the table

def sampling_cost(name: str, size: int = 10**6) -> float:
    """µs per output of the audit's draw (its parts and output check) on one thread: best of 2, warmed up."""
    mech, pairs = dpsniper_mechanism(name)
    mech = dataclasses.replace(mech, threads=1)
    rng = np.random.default_rng(0)
    x = pairs[0][0]
    draw(mech, x, 1000, rng)
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        draw(mech, x, size, rng)
        best = min(best, time.perf_counter() - t0)
    return best / size * 1e6


class Oracle:
    """One mechanism's events: the curves of its pairs, in both directions."""

    def __init__(self, name: str):
        mech, pairs = dpsniper_mechanism(name)
        self.curves, self.max_loss = [], 0.0
        for x, y in pairs:
            b0, b1 = LAWS[name](x, y, mech.params).cells()
            finite = (b0 > 0) & (b1 > 0)
            self.max_loss = max(self.max_loss, float(np.max(np.abs(np.log(b0[finite] / b1[finite])))))
            self.curves += [Curve(b0, b1), Curve(b1, b0)]
        self.exact = mech.true_epsilon_over(pairs)

    def best(self, bound) -> tuple[float, float, float]:
        return max(curve.best(bound) for curve in self.curves)

    def gauss(self, n: float) -> tuple[float, float, float]:
        """Our bound at n outputs per input, at its best event: (value, P0, P1)."""
        return self.best(lambda a, b: _gauss(a, b, n))

    def dpsniper(self) -> tuple[float, float, float]:
        """DP-Sniper's bound at n_final on its c = 0.01 event, that event's ln(P0/P1), and its bound on the
        best event (searched with Wilson's bounds, then computed exactly)."""
        at_c = [curve.at_mass(DPS_C) for curve in self.curves]
        cp_c, p0, p1 = max((clopper_pearson(p0, p1, DPS_N), p0, p1) for p0, p1 in at_c)
        _, b0, b1 = self.best(lambda a, b: _wilson(a, b, DPS_N))
        return cp_c, math.log(p0 / p1), clopper_pearson(b0, b1, DPS_N)

    def needed(self, target: float, lo: float = 1e3, hi: float = 1e13) -> float:
        """The least N per input at which our oracle reaches ``target`` (bisection on log N; ∞ beyond hi)."""
        if self.gauss(hi)[0] < target:
            return math.inf
        for _ in range(16):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if self.gauss(mid)[0] < target else (lo, mid)
        return hi


def _chance(at, n: float, ref: float) -> float:
    """P(median of 3 runs ≥ ref) for a bound at the oracle's event at n: its estimate is normal."""
    val, p0, p1 = at
    sd = math.sqrt((1 - p0) / (n * p0) + (1 - p1) / (n * p1))
    p = float(stats.norm.sf((ref - val) / sd))
    return 3 * p * p - 2 * p ** 3


def _fmt(v, width=7, digits=4) -> str:
    if v is None:
        return f"{'n/a':>{width}s}"
    return f"{'inf':>{width}s}" if math.isinf(v) else f"{v:{width}.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated names")
    ap.add_argument("--no-cost", action="store_true", help="skip the sampling costs (and N20)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(DPSNIPER_SUITE)
    ref = _reference()
    print(f"oracle bounds; DP-Sniper: Clopper-Pearson 2 x {DPS_ALPHA} at N = {DPS_N:.0e}, c = {DPS_C}; ours: "
          f"Gaussian z_0.9 at N per input; N20 = {BUDGET_CORE_SECONDS:g} core-seconds / (2 x cost); "
          "N* = least N where ours reaches DPS ref, s* = its seconds on 2 cores")
    print(f"{'mechanism':20s} {'exact':>7s} {'max|L|':>7s} {'DPS ref':>7s} {'eps c':>7s} {'CP c':>7s} {'CP best':>7s} "
          + " ".join(f"{f'G {n:.0e}':>7s}" for n in OUR_NS)
          + f" {'us/out':>6s} {'N20':>7s} {'G N20':>7s} {'P(med3)':>7s} {'N*':>7s} {'s*':>7s}")
    for name in names:
        row = Oracle(name)
        best_ref = max(ref[name][:2])
        cp_c, eps_c, cp_best = row.dpsniper()
        needed = row.needed(best_ref)
        line = (f"{name:20s} {_fmt(row.exact)} {_fmt(row.max_loss)} {best_ref:7.3f} {_fmt(eps_c)} {_fmt(cp_c)} "
                f"{_fmt(cp_best)} " + " ".join(_fmt(row.gauss(n)[0]) for n in OUR_NS))
        if not args.no_cost:
            cost = sampling_cost(name)
            n20 = BUDGET_CORE_SECONDS / (2 * cost * 1e-6)
            at20 = row.gauss(n20)
            line += (f" {cost:6.3f} {n20:7.1e} {_fmt(at20[0])} {_chance(at20, n20, best_ref):7.3f} {needed:7.1e} "
                     f"{needed * cost * 1e-6:7.0f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
