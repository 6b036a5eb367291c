"""Joint risk at extreme gaps and levels (issue 37, item 4): ε beyond 709, shifts of 500–1000 scales
and the sum / sum-without-K example near its ε_i, against references that share no code with
empdp: an arbitrary-precision closed form (mpmath) and an exact-along-lines adaptive quadrature."""

import warnings

import mpmath as mp
import numpy as np
import pytest
from scipy.integrate import quad

from empdp.risk.joint import _generic, joint_risk, select_joint_model
from tests.test_joint import paper_panel, ref_eps, scaled


# ------------------------------------------------------------------ references (ours, independent)
def ref_delta_1d(x, y, eps):
    """max over the sides of ∫ (p − e^ε q)_+ for the unit Laplace mixtures of points x and y, in
    40-digit arithmetic: between kinks each density is A e^u + B e^{−u}, integrated in closed form
    on either side of its root (no overflow at any ε)."""
    mp.mp.dps = 40
    n = len(x)
    edges = [-mp.inf] + [mp.mpf(k) for k in sorted(set(map(float, x)) | set(map(float, y)))] + [mp.inf]

    def coef(pts, lo, hi):
        return (mp.fsum(mp.exp(-mp.mpf(p)) for p in pts if p >= hi) / (2 * n),
                mp.fsum(mp.exp(mp.mpf(p)) for p in pts if p <= lo) / (2 * n))

    def side(P, Q, t):
        total = mp.mpf(0)
        for lo, hi in zip(edges[:-1], edges[1:]):
            (ap, bp), (aq, bq) = coef(P, lo, hi), coef(Q, lo, hi)
            al, be = ap - t * aq, bp - t * bq
            cuts = [lo, hi]
            if al * be < 0 and lo < mp.log(-be / al) / 2 < hi:
                cuts = [lo, mp.log(-be / al) / 2, hi]
            for u0, u1 in zip(cuts[:-1], cuts[1:]):
                mid = (u0 + u1) / 2 if mp.isfinite(u0) and mp.isfinite(u1) else (u1 - 1 if mp.isfinite(u1) else u0 + 1)
                if al * mp.exp(mid) + be * mp.exp(-mid) > 0:
                    total += ((al * mp.exp(u1) if al else 0) - (be * mp.exp(-u1) if be else 0)) \
                        - ((al * mp.exp(u0) if al else 0) - (be * mp.exp(-u0) if be else 0))
        return total

    return np.array([float(max(side(x, y, mp.exp(mp.mpf(e))), side(y, x, mp.exp(mp.mpf(e))))) for e in eps])


def _pos_exp(al, be, w):
    """∫_0^w (al e^t + be e^{−t})_+ dt, split at the root (plain floats: the reference's inner axis)."""
    cuts = [0.0, w]
    opposite = (al > 0 > be) or (al < 0 < be)  # by the signs: the product of e^{−700} and e^{−667} underflows
    root = 0.5 * (np.log(abs(be)) - np.log(abs(al))) if opposite else -1.0  # logs apart: the ratio overflows
    if 0 < root < w:
        cuts = [0.0, root, w]
    total = 0.0
    for t0, t1 in zip(cuts[:-1], cuts[1:]):
        mid = 0.5 * (t0 + t1)
        if al * np.exp(mid) + be * np.exp(-mid) > 0:
            total += al * (np.exp(t1) - np.exp(t0)) + be * (np.exp(-t0) - np.exp(-t1))
    return total


def _scaled_pos(up, down, w):
    """∫_0^w (Σ_j c_j e^{up_j} e^t + Σ_j c_j e^{down_j} e^{−t})_+ dt for signed weights folded into the
    exponents' lists ``up``, ``down`` ((log |c|, sign) pairs): each interval scaled by its own largest
    term, so terms e^{±1000} apart stay exact."""
    top = max([u + w for u, _ in up] + [v for v, _ in down])
    al = sum(sg * np.exp(u - top) for u, sg in up)
    be = sum(sg * np.exp(v - top) for v, sg in down)
    value = _pos_exp(al, be, w)
    return np.exp(np.log(value) + top) if value > 0 else 0.0


def _line(P, Q, eps, y):
    """∫ (p(u, y) − e^ε q(u, y))_+ du × 4n along axis 0 at height y, exactly: between kinks the
    integrand is α e^t + β e^{−t}; the far tails are single exponentials."""
    lw = np.r_[-np.abs(y - P[:, 1]), eps - np.abs(y - Q[:, 1])]
    sign = np.r_[np.ones(len(P)), -np.ones(len(Q))]
    pts = np.r_[P[:, 0], Q[:, 0]]
    kinks = np.unique(pts)
    total = 0.0
    for lo, hi in zip(np.r_[-np.inf, kinks], np.r_[kinks, np.inf]):
        right = pts >= hi
        if np.isinf(lo) or np.isinf(hi):  # beyond the outer kinks: one exponential, ∫ e^{−|t|} = 1
            exps = lw + hi - pts if np.isinf(lo) else lw + pts - lo
            v = (sign * np.exp(exps - exps.max())).sum()
            total += np.exp(np.log(v) + exps.max()) if v > 0 else 0.0
            continue
        up = [(lw[j] + lo - pts[j], sign[j]) for j in np.flatnonzero(right)]
        down = [(lw[j] + pts[j] - lo, sign[j]) for j in np.flatnonzero(~right)]
        total += _scaled_pos(up, down, hi - lo)
    return total


def _near_ends(y0, y1):
    """Breakpoints 10^{−2} … 10^2 from either end: near ε_i the level set is a corner a fraction of a
    scale wide at a kink, which the adaptive rule would not find on an interval 250 scales long."""
    g = np.geomspace(0.01, 100.0, 13)
    v = np.r_[y0 + g, y1 - g]
    return np.unique(v[(v > y0) & (v < y1)])


def ref_delta_lines(A, B, eps, corners=False):
    """δ(ε) for scaled points A, B (n, 2): exact along axis 0 for each height, adaptive Gauss–Kronrod
    over the heights between the kinks of axis 1 (and 40 scales beyond); ``corners``: with the
    breakpoints of :func:`_near_ends`."""
    n = len(A)
    out = []
    for e in eps:
        sides = []
        for P, Q in ((A, B), (B, A)):
            ys = np.unique(np.r_[P[:, 1], Q[:, 1]])
            edges = np.r_[ys[0] - 40, ys, ys[-1] + 40]

            def f(y, P=P, Q=Q):
                return _line(P, Q, e, y)

            sides.append(sum(quad(f, y0, y1, epsabs=1e-11, epsrel=1e-8, limit=400,
                                  points=_near_ends(y0, y1) if corners else None)[0]
                             for y0, y1 in zip(edges[:-1], edges[1:])) / (4 * n))
        out.append(max(sides))
    return np.array(out)


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow is a defect here, not a warning to the curator
        return fn(*args)


# ------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("gap", [500.0, 800.0, 1000.0])
@pytest.mark.parametrize("kind", ["same shift in every database", "one database moved"])
def test_gaps_of_hundreds_of_scales_near_eps_i_against_arbitrary_precision(gap, kind):
    """Points that differ along one axis only: the other axes' kernels are one common factor, so δ_i is
    the 1-d δ of the axis's mixtures, computed in 40 digits. Before, ε beyond 709 overflowed e^ε in
    the general path (δ_i NaN) and the d = 2 cut cells warned of overflow; the product of two
    far-apart coefficients also lost a root when it underflowed."""
    rng = np.random.default_rng(7)
    n = 8
    x = 2 * rng.normal(size=n)
    s = np.full(n, gap) if kind.startswith("same") else np.where(np.arange(n) == 3, gap, 0.0)
    eps = np.array([0.0, 1.0, 0.5 * gap, gap - 20, gap - 2, gap - 0.2])
    ref = ref_delta_1d(x, x - s, eps)
    assert ref[-2] > 1e-3  # the levels near ε_i carry mass: the test can see a lost term
    for d, axis in ((2, 0), (2, 1), (3, 0), (3, 2)):
        q = np.zeros((n, d))
        q[:, axis] = x
        model = select_joint_model(q, bandwidth=[1.0] * d)
        S = np.zeros((1, n, d))
        S[0, :, axis] = s
        e, dl = _quiet(joint_risk, model, S, eps)
        _, general = _quiet(_generic._delta_row, q, q - S[0], eps, 6)
        np.testing.assert_allclose(dl[0], ref, atol=1e-6, err_msg=f"d={d} axis={axis}")
        np.testing.assert_allclose(general, ref, atol=1e-6, err_msg=f"general path d={d} axis={axis}")
        assert e[0] == pytest.approx(ref_eps(q, q - S[0]), rel=1e-6)


def test_one_database_moved_far_in_two_dimensions_beyond_709():
    """A genuine 2-d panel (the level curves are not lines) with one database moved (700, −250) scales:
    δ_i at ε near ε_i > 709 against the exact-along-lines quadrature, by the matrix form and the
    general path."""
    rng = np.random.default_rng(11)
    n = 8
    q = rng.normal(size=(n, 2)) * [1.5, 1.0]
    q[:, 1] += 0.5 * q[:, 0]
    model = select_joint_model(q, bandwidth=[1.0, 1.0])
    S = np.zeros((1, n, 2))
    S[0, 2] = [700.0, -250.0]
    e, _ = _quiet(joint_risk, model, S)
    assert e[0] == pytest.approx(ref_eps(q, q - S[0]), rel=1e-6)
    assert e[0] > 709
    eps = np.array([1.0, e[0] - 30, e[0] - 3, e[0] - 0.3])
    ref = ref_delta_lines(q, q - S[0], eps, corners=True)
    assert ref[-2] > 1e-4
    _, dl = _quiet(joint_risk, model, S, eps)
    _, general = _quiet(_generic._delta_row, q, q - S[0], eps, 6)
    np.testing.assert_allclose(dl[0], ref, atol=1e-6)
    np.testing.assert_allclose(general, ref, atol=1e-6)


def test_sum_and_sum_without_k_at_n_20_near_eps_i():
    """The paper's example with 20 databases (whitened model, ε_K ≈ 213): δ_K at levels up to 0.9999 ε_K
    against the exact-along-lines quadrature, ε_K against the log-sum-exp on the kink grid."""
    q, shifts, K = paper_panel(n_db=20)
    model = select_joint_model(q)
    A, B = scaled(model, shifts[K])
    e, _ = _quiet(joint_risk, model, shifts[K:K + 1])
    assert e[0] == pytest.approx(ref_eps(A, B, np.random.default_rng(0), 20000), rel=1e-6)
    eps = e[0] * np.array([0.99, 0.9999])
    ref = ref_delta_lines(A, B, eps)
    assert ref[-1] > 1e-6
    _, dl = _quiet(joint_risk, model, shifts[K:K + 1], eps)
    _, general = _quiet(_generic._delta_row, A, B, eps, 6)
    np.testing.assert_allclose(dl[0], ref, atol=1e-6)
    np.testing.assert_allclose(general, ref, atol=1e-6)
