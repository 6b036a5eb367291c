"""Score events for MPL: outputs of any dimension (docs/method.md#91-mpl-a-lower-bound-on-pure-dp-epsilon).

A score s maps an output to a number that should grow with the privacy loss
log f_x/f_x′; an event is {s(t) ≥ c} or {s(t) ≤ c}. Any event is a
post-processing t ↦ 1{t ∈ S}, so |ln P_x(S) − ln P_x′(S)| ≤ ε, whatever s and c
are (the idea of DP-Sniper's threshold attacks, Bichsel et al. 2021). Stage 1
fits s and chooses c on its own outputs; stage 2 counts the event among fresh
outputs, so the bound keeps its level however the score was learned.

Scores: the output itself for one-dimensional continuous outputs (events are
half-lines); for vector outputs an L2-penalised logistic regression (MPL also
tries per-coordinate log ratios, module :mod:`empdp.audit.ratios`) of "from x′"
against "from x" on features of the output: the standardised coordinates,
their consecutive differences, indicators of repeated values (codes such as
"below" or "aborted" among numeric answers) and the number of coordinates in
each of 16 pooled quantile bins (a symmetric summary for exchangeable
coordinates). Its logit estimates the log ratio (a linear one exactly when the
coordinates are independent bits, as for RAPPOR).
"""

from __future__ import annotations

import importlib
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from .kde import sigma_discrete

#: most stage-1 rows the logistic regression is fitted on (the fit costs rows × features × iterations)
FIT_ROWS = 40_000
#: pooled quantile bins whose counts are features
POOLED_BINS = 16
#: a value repeated in at least this share of a column's outputs gets its own indicator
ATOM_SHARE = 0.01
#: most thresholds compared in stage 1 (quantiles of the pooled scores)
MAX_THRESHOLDS = 1024
#: L2 penalty on the standardised weights (per row of the mean log-loss)
PENALTY = 1e-4


@dataclass
class ScoreRule:
    """The event {score(t) ≥ threshold} (direction +1) or {score(t) ≤ threshold} (direction −1)."""

    kind: str  # what scores: "output" (the output itself), "logistic regression", or a ratio score's name
    threshold: float
    direction: int
    scorer: object | None = None  # ``scorer.score(outputs) -> (n,)``; None: the output itself
    refitted: bool = False  # a table score counted again by MPL's refit (empdp.audit.mpl._refit)

    def score(self, outputs: np.ndarray) -> np.ndarray:
        if self.scorer is None:
            return np.asarray(outputs, float)[:, 0]
        return self.scorer.score(outputs)

    def members(self, outputs: np.ndarray) -> np.ndarray:
        s = self.score(outputs)
        return s >= self.threshold if self.direction > 0 else s <= self.threshold

    def describe(self) -> dict:
        return {"score": self.kind, "direction": ">=" if self.direction > 0 else "<=",
                "threshold": float(self.threshold)}


@dataclass
class _Logistic:
    """The logit of the fitted logistic regression on the features."""

    features: _Features
    weights: np.ndarray

    def score(self, outputs: np.ndarray) -> np.ndarray:
        return self.features.transform(outputs) @ self.weights[1:] + self.weights[0]


@dataclass
class _Features:
    """Feature map learned from stage-1 outputs (see the module doc)."""

    centre: np.ndarray
    scale: np.ndarray
    atoms: list  # (column, value) pairs with an indicator
    diff_scale: np.ndarray | None
    bins: np.ndarray  # pooled quantile edges of the non-atom values

    @classmethod
    def fit(cls, x: np.ndarray) -> _Features:
        atoms = []
        atom_mask = np.zeros(x.shape, dtype=bool)
        for j in range(x.shape[1]):
            values, counts = np.unique(x[:, j], return_counts=True)
            if len(values) <= 2:  # a bit: its standardised value says it all
                continue
            for v in values[counts >= ATOM_SHARE * len(x)][:4]:
                atoms.append((j, float(v)))
                atom_mask[:, j] |= x[:, j] == v
        plain = np.where(atom_mask, np.nan, x)
        # a column of codes only has no plain values: centre 0, scale 1. (Not by silencing NumPy's warnings:
        # ``warnings.catch_warnings`` is process-wide, and stage 1 fits on several threads at once, so one
        # fit's exit restored the filters inside another's and "Degrees of freedom <= 0" reached the user.)
        some = ~np.all(atom_mask, axis=0)
        centre, scale = np.zeros(x.shape[1]), np.ones(x.shape[1])
        if some.any():
            centre[some] = np.nanmedian(plain[:, some], axis=0)
            scale[some] = _spread(plain[:, some])
        diff_scale = _spread(np.diff(x, axis=1)) if x.shape[1] > 1 else None
        pooled = plain[~np.isnan(plain)]
        bins = np.unique(np.quantile(pooled, np.linspace(0, 1, POOLED_BINS + 1)[1:-1])) if pooled.size else \
            np.array([])
        return cls(centre, scale, atoms, diff_scale, bins)

    def transform(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, float)
        parts = []
        is_atom = np.zeros(x.shape, dtype=bool)
        for j, v in self.atoms:
            hit = x[:, j] == v
            is_atom[:, j] |= hit
            parts.append(hit[:, None].astype(float))
        parts.insert(0, np.where(is_atom, 0.0, (x - self.centre) / self.scale))
        if self.diff_scale is not None:
            parts.append(np.diff(x, axis=1) / self.diff_scale)
        if self.bins.size:
            which = np.searchsorted(self.bins, x)
            which[is_atom] = -1
            width = self.bins.size + 2  # a column per bin, and one for the atoms (which = -1), dropped
            rows = np.arange(len(x))[:, None] * width
            counts = np.bincount((rows + which + 1).ravel(), minlength=len(x) * width).reshape(-1, width)[:, 1:]
            parts.append(counts / math.sqrt(x.shape[1]))
        return np.hstack(parts)


def _spread(a: np.ndarray) -> np.ndarray:
    s = np.nanstd(a, axis=0) if a.size else np.ones(a.shape[1])
    return np.where(np.isfinite(s) & (s > 0), s, 1.0)


def fit_score(x: np.ndarray, y: np.ndarray, discrete: bool, iterations: int = 100) -> ScoreRule:
    """The score for outputs ``x`` (from x) and ``y`` (from x′), as a rule without threshold yet
    (the logistic regression: at most ``iterations`` L-BFGS steps)."""
    if not discrete and x.shape[1] == 1:
        return ScoreRule("output", 0.0, 1)
    rows = max(1, len(x) // max(1, FIT_ROWS // 2))
    xs, ys = x[::rows].astype(float), y[::rows].astype(float)
    feats = _Features.fit(np.vstack([xs, ys]))
    design = np.vstack([feats.transform(xs), feats.transform(ys)])
    labels = np.concatenate([np.zeros(len(xs)), np.ones(len(ys))])
    return ScoreRule("logistic regression", 0.0, 1, _Logistic(feats, _logistic(design, labels, iterations)))


def load_optimizer():
    """SciPy's optimizers, imported on first use (the audit command stays light). A time budget's audit of
    vector outputs imports them before its pilots: in the first pilot their import (~1 s) made the search
    look dearer per output than it is, and the plan chose a third of the outputs it could afford (svt3)."""
    return importlib.import_module("scipy.optimize")


def _logistic(design: np.ndarray, labels: np.ndarray, iterations: int) -> np.ndarray:
    """Weights (intercept first) of an L2-penalised logistic regression, by L-BFGS."""
    optimize = load_optimizer()
    a = np.hstack([np.ones((len(design), 1)), design])
    n = len(a)

    def loss(w):
        z = a @ w
        lse = np.logaddexp(0.0, z)
        grad = a.T @ (1 / (1 + np.exp(-z)) - labels) / n + 2 * PENALTY * np.r_[0.0, w[1:]]
        return float(np.mean(lse - labels * z) + PENALTY * w[1:] @ w[1:]), grad

    with _one_blas_thread():  # scipy's own BLAS, loaded just now: see one_blas_thread
        res = optimize.minimize(loss, np.zeros(a.shape[1]), jac=True, method="L-BFGS-B",
                                options={"maxiter": iterations})
    return res.x


_BLAS_LOCK = threading.Lock()
_blas_limit: list = []  # [the process-wide limit, fits running under it] while any fit runs


@contextmanager
def _one_blas_thread():
    """BLAS on one thread while any logistic fit runs. The limit is process-wide and stage 1 fits pairs on
    several threads: a limit entered per fit, exited out of order, restored the unlimited BLAS while
    another fit still ran (its L-BFGS then spun BLAS threads against the draws). The first fit to begin
    sets it and the last to end restores it."""
    with _BLAS_LOCK:
        if not _blas_limit:
            _blas_limit[:] = [threadpool_limits(limits=1, user_api="blas"), 0]
        _blas_limit[1] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _blas_limit[1] -= 1
            if not _blas_limit[1]:
                _blas_limit.pop(0).restore_original_limits()
                _blas_limit.clear()


def best_threshold(rule: ScoreRule, x: np.ndarray, y: np.ndarray, tau: float, weight: float):
    """The threshold and direction maximising the predicted bound |ln p − ln q| − weight·σ(p, q).

    ``weight`` is z/√N + penalty/√n (as for the discrete events of DPL). Returns
    (rule with threshold, criterion, thresholds (K,), loss (K,)).
    """
    crit, direction, threshold, cand, loss = best_threshold_of(rule.score(x), rule.score(y), tau, weight)
    return ScoreRule(rule.kind, threshold, direction, rule.scorer), crit, cand, loss


def best_rule(scored, tau: float, weight: float):
    """Of the ``(rule, score_x, score_y)`` in ``scored`` (the rule's scores of both samples), the one whose
    best threshold has the largest criterion (the first, on ties): (rule, :func:`best_threshold_of`'s
    tuple). Only one candidate's scores are held at a time."""
    top = None
    for rule, score_x, score_y in scored:
        found = best_threshold_of(score_x, score_y, tau, weight)
        if top is None or found[0] > top[1][0]:
            top = (rule, found)
    return top


def best_threshold_of(score_x: np.ndarray, score_y: np.ndarray, tau: float, weight: float):
    """:func:`best_threshold` on the scores of both samples: (criterion, direction, threshold,
    thresholds (K,), loss (K,))."""
    sx, sy = np.sort(score_x), np.sort(score_y)
    cand = _thresholds(sx, sy)
    best = (-math.inf, None, None)
    losses = []
    for direction in (1, -1):
        if direction > 0:
            px = 1 - np.searchsorted(sx, cand, side="left") / len(sx)
            py = 1 - np.searchsorted(sy, cand, side="left") / len(sy)
        else:
            px = np.searchsorted(sx, cand, side="right") / len(sx)
            py = np.searchsorted(sy, cand, side="right") / len(sy)
        fx, fy = np.maximum(px, tau), np.maximum(py, tau)
        loss = np.abs(np.log(fx) - np.log(fy))
        crit = loss - weight * sigma_discrete(fx, fy)
        i = int(np.argmax(crit))
        losses.append(loss)
        if crit[i] > best[0]:
            best = (float(crit[i]), direction, float(cand[i]))
    return (*best, cand, np.maximum(losses[0], losses[1]))


def _thresholds(sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """The thresholds compared: every distinct pooled score, or MAX_THRESHOLDS quantiles of them (linear
    interpolation, as ``np.quantile``'s default) when they are more.

    From the two sorted samples in linear time: a stable sort merges their two runs, and the quantiles
    are read off the merged order. ``np.unique`` and ``np.quantile`` on the pooled scores sorted and
    partitioned them again, most of a one-dimensional stage 1 (laplace at 12.5 million outputs: 8.6 s a
    pair, stage 1 running past its budget)."""
    pooled = np.concatenate([sx, sy])
    pooled.sort(kind="stable")
    distinct = np.concatenate([[True], pooled[1:] != pooled[:-1]])
    if np.count_nonzero(distinct) <= MAX_THRESHOLDS:
        return pooled[distinct]
    at = np.linspace(0, 1, MAX_THRESHOLDS) * (len(pooled) - 1)
    lo = np.floor(at).astype(np.int64)
    hi = np.minimum(lo + 1, len(pooled) - 1)
    t, a, b = at - lo, pooled[lo], pooled[hi]
    # NumPy's own lerp (``_lerp``): from the upper point where t ≥ 0.5, so the thresholds are np.quantile's
    return np.unique(np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t))
