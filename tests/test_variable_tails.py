"""Laplace variable bandwidths whose sup |L| lies beyond the data (issue 37, item 4).

Far out, a mixture of Laplace kernels of several bandwidths is a sum of exponentials: the
narrower kernels die out one by one and L may rise past its limit tens or hundreds of the widest
scales beyond the data. ε_i, δ_i and the at-risk count are checked here against an independent
reference: L in log space (logsumexp of the kernels) on a fine grid reaching 3,000 widest scales
into both tails, refined by a bounded scalar search, and δ_i(ε) by adaptive quadrature between the
kernels' kinks.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy.integrate import quad, simpson
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

import empdp
from empdp import Model, risk
from empdp.density import select_density

N_IND, N_DB = 8, 18
#: the reference grid's reach into each tail, in widest scales (the sups found here lie within 200)
REACH = 3000.0


def clusters(seed: int):
    """The audit's panel: x = N(0, 1) + 50 · (db mod 3), 8 individuals × 18 databases, as
    (query values q, leave-one-out shifts (individuals, databases), the table)."""
    rng = np.random.default_rng(seed)
    db = np.repeat(np.arange(N_DB), N_IND)
    ids = np.tile(np.arange(N_IND), N_DB)
    x = rng.standard_normal(N_DB * N_IND) + 50.0 * (db % 3)
    X = x.reshape(N_DB, N_IND)
    q = X.mean(axis=1)
    loo = (X.sum(axis=1, keepdims=True) - X) / (N_IND - 1)
    table = pl.DataFrame({"id": ids, "db": db, "x": x})
    return q, (q[:, None] - loo).T, table


def log_density(x, centres, b):
    """log of (1/n) Σ_l ℓ_{b_l}(x − c_l), in log space (no underflow however far out)."""
    return logsumexp(-np.abs(x[:, None] - centres[None, :]) / b - np.log(2 * b), axis=1) - np.log(len(b))


def reference_eps(q, b, shift) -> float:
    """sup_x |L(x)|: the largest |L| on a fine grid over the data and 3,000 widest scales of each tail,
    refined around it by a bounded search."""
    kinks = q - shift
    lo, hi = min(q.min(), kinks.min()), max(q.max(), kinks.max())
    xs = np.unique(np.r_[np.linspace(lo - REACH * b.max(), hi + REACH * b.max(), 200_001), q, kinks])

    def absL(x):
        x = np.atleast_1d(x)
        return np.abs(log_density(x, q, b) - log_density(x, kinks, b))

    v = absL(xs)
    k = int(np.argmax(v))
    found = minimize_scalar(lambda t: -absL(t)[0], bounds=(xs[max(k - 1, 0)], xs[min(k + 1, len(xs) - 1)]),
                            method="bounded", options={"xatol": 1e-12})
    return max(float(v[k]), -float(found.fun))


def reference_delta(q, b, shift, eps: float) -> float:
    """δ_i(ε) = max of ∫ (p̂ − e^ε p̂_i)_+ and ∫ (p̂_i − e^ε p̂)_+: by adaptive quadrature on the pieces
    between the kinks of both densities, and by Simpson's rule at b_min/40 on the tails out to 1,500
    widest scales (adaptive quadrature misses their far, narrow regions above ε)."""
    kinks = q - shift
    cuts = np.unique(np.r_[q, kinks])
    out = []
    for first, second in ((q, kinks), (kinks, q)):
        def positive_part(x):
            x = np.atleast_1d(np.asarray(x, dtype=float))
            return np.maximum(np.exp(log_density(x, first, b)) - np.exp(eps + log_density(x, second, b)), 0.0)

        total = sum(quad(lambda x: positive_part(x)[0], a, c, epsabs=0.0, epsrel=1e-10, limit=200)[0]
                    for a, c in zip(cuts[:-1], cuts[1:]))
        for a, c in ((cuts[0] - 1500 * b.max(), cuts[0]), (cuts[-1], cuts[-1] + 1500 * b.max())):
            x = np.linspace(a, c, int((c - a) / (b.min() / 40)) // 2 * 2 + 1)
            total += simpson(positive_part(x), x=x)
        out.append(total)
    return max(out)


@pytest.fixture(scope="module")
def panel():
    q, shifts, table = clusters(5)
    model = select_density(q, kernel="laplace", bandwidth="variable")
    assert model.sensitivity > 0 and np.ptp(model.bandwidths) > 0  # variable bandwidths, several scales
    ref = np.array([reference_eps(q, model.bandwidths, s) for s in shifts])
    return q, shifts, table, model, ref


def test_eps_i_is_the_sup_over_both_tails(panel):
    """ε_i is sup |L| to 1e-6 relative, where the audit found it 39% low: individual 0's sup, 0.1148,
    lies 64 widest scales left of the data; others' lie 100 to 135 scales out."""
    q, shifts, _, model, ref = panel
    eps_i, _ = risk.evaluate(model, shifts, None)
    np.testing.assert_allclose(eps_i, ref, rtol=1e-6)
    assert ref[0] == pytest.approx(0.1148, abs=1e-4)
    b_max, lo, hi = model.bandwidths.max(), q.min(), q.max()
    far = [r for r in range(len(shifts)) if ref[r] > 1.01 * np.abs(
        np.log(np.exp(log_density(np.array([lo - 46 * b_max, hi + 46 * b_max]), q, model.bandwidths))
               / np.exp(log_density(np.array([lo - 46 * b_max, hi + 46 * b_max]), q - shifts[r],
                                    model.bandwidths)))).max()]
    assert len(far) >= 4  # the panel does reach the defect: sups beyond 46 scales


def test_delta_is_positive_below_eps_i_and_matches_quadrature(panel):
    """δ_i(ε) against the reference: within 1e-6, and within 1e-3 relative (the reference's own accuracy
    on the tails) down to the far tails' masses (1e-17…1e-52 here, in both tails: the right tail's from
    the CDFs' tails, not 1 − F); positive for every ε below ε_i, 0 above it."""
    q, shifts, _, model, ref = panel
    fractions = np.array([0.3, 0.8, 0.97, 0.999, 1.001, 1.2])
    for r in (0, 3):  # individual 0's sup lies in the left tail, 3's in the right one
        eps = ref[r] * fractions
        _, delta = risk.evaluate(model, shifts[r:r + 1], eps)
        want = np.array([reference_delta(q, model.bandwidths, shifts[r], e) for e in eps])
        np.testing.assert_allclose(delta[0], want, atol=1e-6)
        np.testing.assert_allclose(delta[0], want, rtol=1e-3)
        np.testing.assert_array_equal(delta[0] > 0, eps < ref[r])


def test_assessment_counts_every_individual_at_risk(panel, tmp_path):
    """Through the assessment: ε_all is the largest reference sup, and n_at_risk at each ε counts the
    individuals whose reference sup exceeds it (before the fix, δ_i was 0 for those whose sup lies
    beyond 46 scales)."""
    _, _, table, _, ref = panel
    path = tmp_path / "clusters.parquet"
    table.write_parquet(path)
    eps = np.array([0.06, 0.075, 0.09, 0.11])
    res = empdp.assess(str(path), id="id", by="db", query="mean(x)", epsilon=list(eps),
                       model=Model(kernel="laplace", bandwidth="variable"))
    assert res.eps_all == pytest.approx(ref.max(), rel=1e-6)
    np.testing.assert_array_equal(res.n_at_risk, (ref[:, None] > eps[None, :]).sum(axis=0))
