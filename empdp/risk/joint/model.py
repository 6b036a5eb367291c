"""The joint density model of d = 2 or 3 statistics (docs/method.md#102-joint-queries, issue 19).

Product Laplace kernels in whitened coordinates y = W x,

    p̂(x)   = |det W| / n · Σ_j Π_k ℓ_{b_k}((W(x − q_j))_k)
    p̂_i(x) = the same kernels at q_j − Δ_ij            (paired: database j keeps its kernel)

W = R^{−1/2} D^{−1} (D the standard deviations, R the correlation matrix of {q_j}: the symmetric
whitening, which does not depend on the order of the statistics), and b_k chosen by leave-one-out
likelihood. With fixed per-statistic scales (reference runs) W = I. Axis-aligned kernels cannot see
a dependence between the statistics (their ratio is bounded by the marginals'); whitened ones can.
The risk runs in scaled coordinates u = T x, T = diag(1/b) W (:attr:`JointModel.transform`), where
each kernel is 2^{−d} e^{−|u − a_j|_1}; the log-ratio and every δ_i(ε) are invariant under the map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from ...density import Selection, select_density
from ...errors import InputError
from ...models import MAX_DIM

#: singular values of the standardised statistics below this fraction of the largest: rank < d
SINGULAR_RTOL = 1e-7


# ----------------------------------------------------------------------------------- the model
class SingularCovarianceError(InputError):
    """The statistics are exactly dependent over the databases (a finding about the release, not a crash):
    the joint density is singular and an individual who moves a database off the relation is exposed
    with ε_i = ∞. ``involved`` lists the statistics (0-based) in the relation."""

    def __init__(self, message: str, involved=()):
        super().__init__(message)
        self.involved = tuple(int(k) for k in involved)


@dataclass
class JointModel(Selection):
    """Product Laplace KDE of d statistics in whitened coordinates (docs/method.md#102-joint-queries).

    Attributes
    ----------
    points : ndarray (n, d)
        q_j, in the statistics' own units.
    whitening : ndarray (d, d)
        W, y = W x (the identity for fixed per-statistic scales).
    unwhitening : ndarray (d, d)
        W^{−1}.
    scales : ndarray (d,)
        b_k, the Laplace scale on whitened axis k (paired: the same for every p̂_i).
    loglik, selected_by, candidates
        As :class:`empdp.density.Selection` (keyword-only); the log-likelihood is in the statistics'
        units and each candidate is a (scales, loglik).
    """

    points: np.ndarray
    whitening: np.ndarray
    unwhitening: np.ndarray
    scales: np.ndarray

    @property
    def d(self) -> int:
        return self.points.shape[1]

    @property
    def n(self) -> int:
        return self.points.shape[0]

    @property
    def whitened(self) -> bool:
        return not np.array_equal(self.whitening, np.eye(self.d))

    @property
    def transform(self) -> np.ndarray:
        """T = diag(1/b) W: scaled coordinates u = T x, where each kernel is 2^{−d} e^{−|u − a_j|_1}."""
        return self.whitening / self.scales[:, None]

    def logpdf(self, x, shifts=None) -> np.ndarray:
        """log p̂(x) (or log p̂_i(x) with ``shifts`` Δ_i of shape (n, d)); x of shape (..., d)."""
        T = self.transform
        pts = self.points if shifts is None else self.points - np.asarray(shifts, dtype=float)
        u = np.asarray(x, dtype=float) @ T.T
        a = pts @ T.T
        dist = np.abs(u[..., None, :] - a).sum(-1)
        return (logsumexp(-dist, axis=-1) - math.log(self.n) - self.d * math.log(2.0)
                + math.log(abs(np.linalg.det(T))))

    def describe(self) -> dict:
        return {"kind": "laplace-product", "whitened": self.whitened, "scales": self.scales.tolist(),
                "whitening": self.whitening.tolist(), "loglik": float(self.loglik),
                "selected_by": self.selected_by}


def _as_points(q) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    if q.ndim == 1:
        q = q[:, None]
    if q.ndim != 2:
        raise InputError(f"the query values must be an (n, d) array; got shape {q.shape}")
    n, d = q.shape
    if not 1 <= d <= MAX_DIM:
        raise InputError(f"a joint query has 1 to {MAX_DIM} statistics; got {d}")
    if n < 2:
        raise InputError("at least 2 databases are needed to fit the density model")
    if not np.all(np.isfinite(q)):
        raise InputError("the query values must be finite numbers")
    return q


def _label(k: int, names) -> str:
    return f"statistic {k + 1}" + (f" ({names[k]})" if names is not None else "")


def check_dependence(q, names=None) -> None:
    """Refuse statistics that are constant or exact linear functions of the others over the databases.

    Then the sample covariance is singular (rank < d), the joint density has no spread across the
    relation, and whitening is undefined: an individual who moves a database off the relation is
    exposed without bound (ε_i = ∞). Raises :class:`InputError` with a one-line message naming
    the statistics and the relation.
    """
    q = _as_points(q)
    n, d = q.shape
    sd = q.std(axis=0, ddof=1)
    scale = np.abs(q).max(axis=0)
    for k in range(d):
        if not sd[k] > 1e-13 * scale[k]:
            raise SingularCovarianceError(f"{_label(k, names)} is constant over the {n} databases, so it adds nothing "
                             "to the joint release's spread and cannot be whitened; release it separately "
                             "or drop it", (k,))
    if d == 1:
        return
    z = (q - q.mean(axis=0)) / sd
    if n <= d:
        raise InputError(f"{d} statistics need at least {d + 1} databases for their covariance; got {n}")
    _, s, vt = np.linalg.svd(z / math.sqrt(n - 1), full_matrices=False)
    if s[-1] > SINGULAR_RTOL * s[0]:
        return
    v = vt[-1]
    involved = np.flatnonzero(np.abs(v) > 1e-3 * np.abs(v).max())
    r = int(involved[np.argmax(np.abs(v[involved]))])
    mean = q.mean(axis=0)
    # Σ_k v_k (q_k − μ_k)/sd_k = 0  ⇒  q_r = μ_r − (sd_r / v_r) Σ_{k≠r} v_k (q_k − μ_k)/sd_k
    coef = {k: -sd[r] / v[r] * v[k] / sd[k] for k in involved if k != r}
    const = mean[r] - sum(c * mean[k] for k, c in coef.items())
    rel = " + ".join(f"{c:.6g} × {_label(k, None)}" for k, c in coef.items())
    who = " and ".join(_label(k, names) for k in involved)
    raise SingularCovarianceError(f"{who} are exactly dependent over the {n} databases ({_label(r, None)} = {rel} "
                     f"{'+' if const >= 0 else '−'} {abs(const):.6g} in every database): the joint density "
                     "is singular, and an individual who moves a database off this relation is exposed "
                     "with epsilon_i = infinity; release fewer statistics", involved)


def _whitening(q: np.ndarray):
    sd = q.std(axis=0, ddof=1)
    R = np.corrcoef(q, rowvar=False)
    vals, vecs = np.linalg.eigh(R)
    W = (vecs / np.sqrt(vals)) @ vecs.T / sd[None, :]      # R^{−1/2} D^{−1}
    Winv = sd[:, None] * ((vecs * np.sqrt(vals)) @ vecs.T)  # D R^{1/2}
    return W, Winv


#: pairwise cells (rows × n × d) of one block of the leave-one-out likelihood: its memory is O(n), not O(d n²)
LOGLIK_BLOCK_CELLS = 1 << 20


def _loo_loglik(y: np.ndarray, scales: np.ndarray) -> float:
    """Σ_j log[(1/(n−1)) Σ_{l≠j} Π_k ℓ_{b_k}(y_jk − y_lk)] for whitened points y (n, d), a block of rows j
    at a time (a (d, n, n) array of all the pairs was 1.6 GB at 10^4 databases and d = 2). The rows'
    terms are summed once at the end, so the value does not depend on the blocks."""
    n, d = y.shape
    inv, const = 1.0 / scales, np.log(2 * scales).sum()
    rows = np.empty(n)
    step = max(1, LOGLIK_BLOCK_CELLS // (n * d))
    for a in range(0, n, step):
        b = min(a + step, n)
        absdiff = np.abs(y.T[:, a:b, None] - y.T[:, None, :])  # (d, rows, n)
        lk = -np.tensordot(inv, absdiff, axes=1) - const
        lk[np.arange(b - a), np.arange(a, b)] = -np.inf
        rows[a:b] = logsumexp(lk, axis=1) - math.log(n - 1)
    return float(np.sum(rows))


def select_joint_model(q, bandwidth="auto", n_scales: int = 41, names=None) -> JointModel:
    """Fit the joint density model of the (n, d) query values (docs/method.md#102-joint-queries).

    Parameters
    ----------
    q : array (n, d)
        q_j, one row per database (a 1-d array is one statistic).
    bandwidth : 'auto' or a sequence of d positive floats
        'auto': product Laplace kernels in whitened coordinates, one scale common to the axes
        chosen by leave-one-out likelihood over ``n_scales`` values log-spaced over [0.1, 5] ×
        the reference scale (n^{−1/(d+4)} (4/(d+2))^{1/(d+4)} / √2, whitened units), then each
        axis's scale refined on the same grid (two coordinate sweeps). For d = 1, 'auto' is
        exactly :func:`empdp.density.select_density`'s Laplace model.
        (b_1, …, b_d): fixed scales in the statistics' own units, W = I (reference runs); for
        d = 1 this is the 1-d Laplace model of scale b_1.
    names : sequence of d str, optional
        Used in error messages.

    Raises
    ------
    InputError
        Bad shapes or values, a wrong number of scales, or (auto, d ≥ 2) statistics that are
        constant or exactly dependent over the databases (:func:`check_dependence`).
    """
    q = _as_points(q)
    n, d = q.shape
    if not (isinstance(bandwidth, str) and bandwidth == "auto"):
        try:
            b = np.atleast_1d(np.asarray(bandwidth, dtype=np.float64))
        except (TypeError, ValueError):
            raise InputError(f"`bandwidth` must be auto or {d} positive numbers; got {bandwidth!r}",
                             param="bandwidth") from None
        if b.ndim != 1 or b.size != d:
            raise InputError(f"`bandwidth` needs one scale per statistic ({d}); got {b.size}", param="bandwidth")
        if not np.all(np.isfinite(b) & (b > 0)):
            raise InputError(f"`bandwidth` scales must be positive numbers; got {bandwidth!r}", param="bandwidth")
        ll = _loo_loglik(q, b)
        return JointModel(q, np.eye(d), np.eye(d), b, loglik=ll, selected_by="fixed",
                          candidates=[{"scales": b.tolist(), "loglik": ll}])
    if d == 1:
        dm = select_density(q[:, 0], kernel="laplace", bandwidth="auto", n_scales=n_scales)
        return JointModel(q, np.eye(1), np.eye(1), np.array([dm.scale]), loglik=dm.loglik,
                          selected_by=dm.selected_by, candidates=[{"scales": [c["scale"]], "loglik": c["loglik"]} for c in dm.candidates])
    check_dependence(q, names)
    W, Winv = _whitening(q)
    y = q @ W.T
    logdet = math.log(abs(np.linalg.det(W)))
    h0 = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4)) / math.sqrt(2.0)
    grid = h0 * np.logspace(np.log10(0.1), np.log10(5.0), n_scales)
    cands = []

    def fit(s):
        ll = _loo_loglik(y, s) + n * logdet
        cands.append({"scales": s.tolist(), "loglik": ll})
        return ll

    lls = [fit(np.full(d, h)) for h in grid]
    best_ll = max(lls)
    best = np.full(d, grid[int(np.argmax(lls))])
    for _ in range(2):
        moved = False
        for k in range(d):
            for h in grid:
                if h == best[k]:
                    continue
                s = best.copy()
                s[k] = h
                ll = fit(s)
                if ll > best_ll + 1e-12 * abs(best_ll):
                    best_ll, best, moved = ll, s, True
        if not moved:
            break
    if not np.isfinite(best_ll):
        raise InputError("no kernel scale gives a finite likelihood for these query values; pass `bandwidth`",
                         param="bandwidth")
    return JointModel(q, W, Winv, best, loglik=best_ll, selected_by="loo-likelihood", candidates=cands)

