"""Joint queries (SPEC 5.3, issue 19): the numerical core in empdp/joint.py against brute-force references."""

import numpy as np
import pytest
from scipy.special import logsumexp

from empdp.density import select_density
from empdp.errors import InputError
from empdp.noise.joint_exact import joint_eps_at, joint_minimal_lambda, joint_noise
from empdp.risk import evaluate
from empdp.risk.joint import SingularCovarianceError, joint_bound, joint_risk, select_joint_model
from empdp.risk.joint._generic import QUAD_NODES


# ------------------------------------------------------------------ brute-force references (ours)
def _axis_nodes(kinks, h, tail, h_tail):
    """2-point Gauss nodes on sub-intervals ≤ h between kinks (≤ h_tail in the tails)."""
    k = np.unique(kinks)
    lo_all, hi_all = k[0] - tail, k[-1] + tail
    edges = [lo_all]
    for a, b, step in [(lo_all, k[0], h_tail)] + [(x, y, h) for x, y in zip(k[:-1], k[1:])] + [(k[-1], hi_all, h_tail)]:
        m = max(1, int(np.ceil((b - a) / step)))
        edges.extend(a + (b - a) * np.arange(1, m + 1) / m)
    e = np.array(edges)
    c, r = (e[:-1] + e[1:]) / 2, (e[1:] - e[:-1]) / 2
    g = 1 / np.sqrt(3)
    return np.r_[c - r * g, c + r * g], np.r_[r, r]


def ref_delta_2d(A, B, eps, h=0.01, tail=25.0, h_tail=0.04):
    """δ(ε) by a dense tensor Gauss grid aligned with the kinks (scaled coordinates, unit Laplace kernels).

    Error O(h²) from the level curve only; the tails beyond 25 scales hold < 1e-10 of mass.
    """
    x1, w1 = _axis_nodes(np.r_[A[:, 0], B[:, 0]], h, tail, h_tail)
    x2, w2 = _axis_nodes(np.r_[A[:, 1], B[:, 1]], h, tail, h_tail)
    n = len(A)
    P = np.exp(-np.abs(x1[:, None] - A[:, 0])) @ np.exp(-np.abs(x2[:, None] - A[:, 1])).T / (4 * n)
    Q = np.exp(-np.abs(x1[:, None] - B[:, 0])) @ np.exp(-np.abs(x2[:, None] - B[:, 1])).T / (4 * n)
    W = w1[:, None] * w2[None, :]
    return np.array([max((np.clip(P - np.exp(e) * Q, 0, None) * W).sum(),
                         (np.clip(Q - np.exp(e) * P, 0, None) * W).sum()) for e in np.atleast_1d(eps)])


def ref_eps(A, B, rng=None, extra=0):
    """sup |L| by direct log-sum-exp on the full union kink grid plus far points (and random points)."""
    d = A.shape[1]
    axes = [np.r_[np.unique(np.r_[A[:, k], B[:, k]]), min(A[:, k].min(), B[:, k].min()) - 50,
                  max(A[:, k].max(), B[:, k].max()) + 50] for k in range(d)]
    u = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, d)
    if extra:
        span = np.array([[ax.min() + 45, ax.max() - 45] for ax in axes])
        u = np.r_[u, span[:, 0] + rng.random((extra, d)) * (span[:, 1] - span[:, 0])]
    L = (logsumexp(-np.abs(u[:, None, :] - A).sum(-1), axis=1)
         - logsumexp(-np.abs(u[:, None, :] - B).sum(-1), axis=1))
    return np.abs(L).max()


def mc_delta(A, B, eps, N, rng):
    """Monte Carlo δ(ε) = max over sides of E_P[(1 − e^{ε − L})_+] with its standard error."""
    means, ses = [], []
    for P, Q in ((A, B), (B, A)):
        u = P[rng.integers(0, len(P), N)] + rng.laplace(size=(N, P.shape[1]))
        L = (logsumexp(-np.abs(u[:, None, :] - P).sum(-1), axis=1)
             - logsumexp(-np.abs(u[:, None, :] - Q).sum(-1), axis=1))
        v = np.clip(-np.expm1(eps[:, None] - L[None]), 0, None)
        means.append(v.mean(1))
        ses.append(v.std(1) / np.sqrt(N))
    return np.max(means, axis=0), np.max(ses, axis=0)


def scaled(model, shifts_row):
    T = model.transform
    return model.points @ T.T, (model.points - shifts_row) @ T.T


def random_panel(seed, n, d, m, p_present=0.6, size=0.8):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, d))
    if d > 1:
        q[:, 1] += 0.6 * q[:, 0]
    S = rng.normal(size=(m, n, d)) * size * (rng.random((m, n, 1)) < p_present)
    return q, S


# ------------------------------------------------------------------------------- d = 1
def test_d1_equals_the_one_statistic_laplace_model():
    rng = np.random.default_rng(11)
    n, b = 14, 0.6
    q = rng.normal(size=n) * 2
    S = rng.standard_t(3, size=(40, n)) * (rng.random((40, n)) < 0.5) * rng.uniform(0.01, 2, (40, 1))
    eps = np.array([0.01, 0.1, 0.3, 1.0, 3.0])
    dm = select_density(q, kernel="laplace", bandwidth=b)
    e1, d1 = evaluate(dm, S, eps)
    jm = select_joint_model(q[:, None], bandwidth=[b])
    e2, d2 = joint_risk(jm, S[:, :, None], eps)
    np.testing.assert_allclose(e2, e1, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(d2, d1, atol=1e-8)
    x = np.linspace(-8, 8, 101)
    np.testing.assert_allclose(jm.logpdf(x[:, None]), dm.logpdf(x), rtol=1e-12)
    np.testing.assert_allclose(jm.logpdf(x[:, None], S[3][:, None]), dm.logpdf(x, S[3]), rtol=1e-12)
    # 'auto' in d = 1 is select_density's own choice
    assert select_joint_model(q[:, None]).scales[0] == select_density(q, kernel="laplace").scale


def test_d2_with_a_constant_statistic_reduces_to_d1():
    q, S = random_panel(3, 10, 1, 20)
    q2 = np.c_[q, np.full(len(q), 4.0)]
    S2 = np.concatenate([S, np.zeros_like(S)], axis=2)
    eps = np.array([0.05, 0.4, 1.2])
    e1, d1 = joint_risk(select_joint_model(q, bandwidth=[0.5]), S, eps)
    e2, d2 = joint_risk(select_joint_model(q2, bandwidth=[0.5, 0.3]), S2, eps)
    np.testing.assert_allclose(e2, e1, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(d2, d1, atol=1e-9)


# ------------------------------------------------------------------------------- d = 2
def test_d2_matrix_form_is_exact_against_the_cell_quadrature_reference():
    """Denser panels (n = 12, both sets, many levels) against the tensor Gauss reference at two resolutions."""
    q, S = random_panel(21, 12, 2, 3, p_present=0.8, size=0.5)
    model = select_joint_model(q)
    eps = np.geomspace(0.01, 0.6, 7)
    e, dl = joint_risk(model, S, eps)
    for i in range(len(S)):
        A, B = scaled(model, S[i])
        assert e[i] == pytest.approx(ref_eps(A, B), rel=1e-9)
        fine = ref_delta_2d(A, B, eps, h=0.01)
        np.testing.assert_allclose(dl[i], fine, atol=1e-6)
    # more Gauss nodes per piece change nothing beyond round-off: the pieces are certified by agreement
    np.testing.assert_allclose(joint_risk(model, S, eps, nodes=8)[1], dl, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_d2_matches_dense_reference(seed):
    q, S = random_panel(seed, 6, 2, 2)
    model = select_joint_model(q, bandwidth=[0.5, 0.7]) if seed == 0 else select_joint_model(q)
    eps = np.array([0.05, 0.3, 0.8])
    e, dl = joint_risk(model, S, eps)
    for i in range(len(S)):
        A, B = scaled(model, S[i])
        assert e[i] == pytest.approx(ref_eps(A, B, np.random.default_rng(seed), 20000), rel=1e-6)
        coarse, fine = ref_delta_2d(A, B, eps, h=0.02), ref_delta_2d(A, B, eps, h=0.01)
        # the reference (error O(h²), from the level curve) is within 1e-6 at both resolutions
        np.testing.assert_allclose(dl[i], coarse, atol=1e-6)
        np.testing.assert_allclose(dl[i], fine, atol=1e-6)


def test_d2_eps_exact_on_many_panels_and_below_the_screening_bound():
    q, S = random_panel(5, 9, 2, 60, size=1.5)
    model = select_joint_model(q)
    e, _ = joint_risk(model, S)
    M = joint_bound(model, S)
    assert np.all(e <= M * (1 + 1e-12))
    rng = np.random.default_rng(1)
    for i in range(0, 60, 6):
        A, B = scaled(model, S[i])
        assert e[i] == pytest.approx(ref_eps(A, B, rng, 5000), rel=1e-6, abs=1e-12)


def test_d2_exposed_individual_at_levels_near_its_eps_is_not_lost_to_cancellation():
    """The paper's pair at ε of hundreds: e^ε ≈ 1e130 multiplies p̂_i, so the cut pieces' coefficients
    span 1e130 (a form with cancellation lost 2e−2, then 4e−4 here). Reference: the tensor grid
    (h = 0.2 over 125 × 224 scales; accurate to ~1e−5 at these levels)."""
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 2.0, size=(30, 40))
    x[7] = 5.0 + rng.normal(0, 0.05, size=40)
    q = np.column_stack([x.sum(0), x.sum(0) - x[7]])
    S = np.zeros((1, 40, 2))
    S[0, :, 0] = x[7]
    model = select_joint_model(q)
    e, _ = joint_risk(model, S)
    eps = e[0] * np.array([0.6, 0.74, 0.9])
    d = joint_risk(model, S, eps)[1][0]
    A, B = scaled(model, S[0])
    np.testing.assert_allclose(d, ref_delta_2d(A, B, eps, h=0.2, h_tail=0.4), atol=3e-5)


@pytest.mark.parametrize("d", [2, 3])
def test_only_and_cap_skip_exactly_what_cannot_exceed_the_cap(d):
    """δ_i at the levels outside ``only`` only where the chord bound (convexity in e^ε) exceeds the cap."""
    from empdp.risk.joint._cells import chord_bound

    q, S = random_panel(3, 10 if d == 2 else 7, d, 12 if d == 2 else 3, size=0.6)
    model = select_joint_model(q)
    eps = np.geomspace(0.02, 0.8, 12 if d == 2 else 7)
    e, full = joint_risk(model, S, eps)
    only = np.zeros(len(eps), dtype=bool)
    only[[0, 5]] = True
    cap = np.full(len(eps), np.quantile(full[full > 0], 0.5))
    e2, part = joint_risk(model, S, eps[::-1], only=only[::-1], cap=cap[::-1])  # any order
    part = part[:, ::-1]
    np.testing.assert_array_equal(e2, e)
    done = ~np.isnan(part)
    np.testing.assert_array_equal(part[done], full[done])
    assert done[:, only].all() and not done.all()
    assert np.all(full[~done] > 0) and np.all(full[~done] <= cap[None, :].repeat(len(S), 0)[~done])
    bound = chord_bound(full[:, 0], eps[0], e, eps)
    assert np.all(full <= bound + 1e-15)
    with pytest.raises(ValueError, match="smallest"):
        joint_risk(model, S, eps, only=~only, cap=cap)


def test_d2_quadrant_sums_by_prefix_sums_equal_the_matrix_product(monkeypatch):
    """Rows spanning more than 2 FAST_SPAN scales take the matrix product; both forms give one δ_i."""
    from empdp.risk.joint import _cells

    q, S = random_panel(6, 9, 2, 4, p_present=0.8)
    model = select_joint_model(q)
    eps = np.geomspace(0.02, 0.6, 6)
    e, d = joint_risk(model, S, eps)
    monkeypatch.setattr(_cells, "FAST_SPAN", 0.0)
    e2, d2 = joint_risk(model, S, eps)
    np.testing.assert_allclose(e2, e, rtol=1e-12)
    np.testing.assert_allclose(d2, d, atol=1e-13)


@pytest.mark.parametrize("span", [3.0, 400.0])
def test_d2_quadrant_sums_on_the_kink_grid_equal_their_definition(span):
    """The gathered quadrant sums of each point set on a row's grid of all 2n kink lines per axis equal
    the sums by definition: the points at or before vertex line i (rank ≤ i) referred to x_i, those
    after it referred to x_{i+1} (none on the last line); with ties (absent databases put b_j on a_j,
    repeated coordinates) and rows spanning more than the prefix sums' range (the product form)."""
    from empdp.risk.joint import _cells

    rng = np.random.default_rng(5)
    n, C = 7, 5
    a = rng.normal(size=(n, 2)) * span / 6
    a[3] = a[1]  # repeated point
    s = rng.normal(size=(C, n, 2)) * (rng.random((C, n, 1)) < 0.6)
    s[0, 2, 0] = a[2, 0] - a[4, 0]  # b's first coordinate on another point's line
    b = a[None] - s
    xs, ranks = zip(*[_cells._axis(a[:, k], b[:, :, k])[:2] for k in range(2)])
    for pts, sel, G in ((np.broadcast_to(a, b.shape), slice(None, n), _cells._point_grid(a[None])),
                        (b, slice(n, None), _cells._point_grid(b))):
        Q = _cells._gather(xs, [r[:, sel] for r in ranks], *G)
        J = 2 * n
        for r in range(C):
            fac = []
            for k in range(2):
                x, rank = xs[k][r], ranks[k][r, sel]
                left = (rank[None, :] <= np.arange(J)[:, None]) * np.exp(-np.abs(x[:, None] - pts[r, None, :, k]))
                nxt = np.r_[x[1:], x[-1]]
                right = ((rank[None, :] >= np.arange(1, J + 1)[:, None])
                         * np.exp(-np.abs(nxt[:, None] - pts[r, None, :, k])))
                fac.append((left, right))
            for q, (s1, s2) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
                np.testing.assert_allclose(Q[r, q], fac[0][s1] @ fac[1][s2].T, rtol=1e-12, atol=1e-300)


def test_d2_eps_alone_far_apart_rows_take_the_log_space_path():
    """A row with a shift of hundreds of scales: the product form would underflow; the result stays exact."""
    q, S = random_panel(4, 7, 2, 3)
    model = select_joint_model(q, bandwidth=[0.01, 0.01])
    S[1, 2] = [5.0, -3.0]  # 500 and 300 scales
    e, _ = joint_risk(model, S)
    for i in range(len(S)):
        A, B = scaled(model, S[i])
        assert e[i] == pytest.approx(ref_eps(A, B), rel=1e-9)


@pytest.mark.parametrize("seed", [1, 6, 8, 9])
def test_eps_i_has_the_same_bits_with_and_without_delta(seed):
    """A call that asks for δ_i reports the ε_i an ε-only call reports, to the last bit (d = 2), also on
    rows beyond the product form's reach (these panels differed by 1-4 ulp before). d = 3 computes ε_i
    one way in both."""
    rng = np.random.default_rng(seed)
    q, S = random_panel(seed, 7, 2, 6, size=1.5)
    b = rng.choice([0.005, 0.01, 0.02, 0.05])
    model = select_joint_model(q, bandwidth=[b, b])
    k = rng.integers(0, 6)
    S[k, rng.integers(0, 7), rng.integers(0, 2)] = rng.uniform(2, 8)  # hundreds of scales in one database
    S[(k + 1) % 6, :, 0] = rng.uniform(3, 10)  # the same large shift in every database
    alone, _ = joint_risk(model, S)
    with np.errstate(over="ignore", divide="ignore"):
        with_delta, _ = joint_risk(model, S, np.array([0.5, 5.0]))
    assert np.array_equal(alone, with_delta), np.flatnonzero(alone != with_delta)


def test_delta_vanishes_at_and_above_eps_i_and_is_positive_below():
    q, S = random_panel(8, 8, 2, 10)
    model = select_joint_model(q)
    e, _ = joint_risk(model, S)
    eps = np.r_[0.98 * e, e, 1.01 * e]
    for i in range(len(S)):
        _, d = joint_risk(model, S[i:i + 1], eps[[i, len(S) + i, 2 * len(S) + i]])
        assert d[0, 0] > 0 and d[0, 1] == 0 and d[0, 2] == 0


def test_whitened_model_does_not_depend_on_the_order_of_the_statistics():
    q, S = random_panel(4, 20, 2, 15)
    eps = np.array([0.1, 0.5])
    e1, d1 = joint_risk(select_joint_model(q), S, eps)
    e2, d2 = joint_risk(select_joint_model(q[:, ::-1]), S[:, :, ::-1], eps)
    np.testing.assert_allclose(e2, e1, rtol=1e-9)
    np.testing.assert_allclose(d2, d1, atol=1e-7)  # the quadrature axes differ: within its error


# ------------------------------------------------------------------------------- d = 3
def test_d3_with_a_constant_statistic_reduces_to_d2():
    q, S = random_panel(6, 7, 2, 4)
    q3 = np.c_[q, np.full(len(q), -1.0)]
    S3 = np.concatenate([S, np.zeros(S.shape[:2] + (1,))], axis=2)
    eps = np.array([0.1, 0.6])
    e2, d2 = joint_risk(select_joint_model(q, bandwidth=[0.5, 0.6]), S, eps)
    e3, d3 = joint_risk(select_joint_model(q3, bandwidth=[0.5, 0.6, 0.4]), S3, eps)
    np.testing.assert_allclose(e3, e2, rtol=1e-9, atol=1e-12)
    # d = 2 is exact to round-off; the d = 3 path integrates cut cells by quadrature, pieces near a
    # singular point halved until two rules agree (its fixed 6-node rule was within 1e-6 only)
    np.testing.assert_allclose(d3, d2, atol=1e-10)


def test_d3_cut_cells_in_chunks_give_the_same_delta(monkeypatch):
    """The cut cells' coefficients are formed a chunk of cells at a time: chunks of 7 cells (many
    boundaries, a last partial chunk) give the same δ_i as one chunk."""
    from empdp.risk.joint import _generic

    q, S = random_panel(4, 6, 3, 2, size=0.7)
    model = select_joint_model(q)
    eps = np.array([0.05, 0.2, 0.5])
    whole = joint_risk(model, S, eps)[1]
    monkeypatch.setattr(_generic, "COEF_CELLS", 7)
    np.testing.assert_array_equal(joint_risk(model, S, eps)[1], whole)
    assert whole.max() > 0


def test_d3_row_at_100_databases_does_not_hold_the_whole_grid():
    """One d = 3 row at 100 databases has a grid of about 183³ = 6·10⁶ cells: held whole (a score of
    arrays of 8 bytes a cell) it took 450 MB a row, two rows at a time in threads. Visited in slabs
    along axis 0, each reduced to its part of the sums per level, it stays below 150 MB (about 27 MB
    here, at a level near ε_i; 44 MB at ε = 0.02, where most cells are kept or cut)."""
    import tracemalloc

    rng = np.random.default_rng(3)
    q = rng.normal(size=(100, 3))
    q[:, 1] += 0.6 * q[:, 0]
    S = (rng.normal(size=(100, 3)) * 0.3 * (rng.random((100, 1)) < 0.8))[None]
    model = select_joint_model(q)
    eps_i = joint_risk(model, S)[0][0]
    level = np.array([0.9 * eps_i])
    tracemalloc.start()
    try:
        e, dl = joint_risk(model, S, level)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e[0] == eps_i and dl[0, 0] > 0
    assert peak < 150e6, f"{peak / 1e6:.0f} MB"


def _along_axis0(alpha, beta, w):
    """∫_0^w (α e^t + β e^{−t})_+ dt elementwise (numpy, from the root), the reference's inner integral."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.clip(0.5 * np.log(-beta / alpha), 0.0, w)
    r = np.where((alpha * beta < 0) & np.isfinite(r), r, np.where(alpha + beta > 0, 0.0, w))
    lo = np.where(alpha > 0, r, 0.0)  # rising: positive right of the root; falling: left of it
    hi = np.where(alpha > 0, w, np.where(alpha * beta < 0, r, np.where(alpha + beta > 0, w, 0.0)))
    lo = np.where((alpha >= 0) & (beta >= 0), 0.0, lo)
    hi = np.where((alpha >= 0) & (beta >= 0), w, hi)
    val = alpha * (np.exp(hi) - np.exp(lo)) - beta * (np.exp(-hi) - np.exp(-lo))
    return np.maximum(val, 0.0)


def _cut_cells_and_dense_reference(nodes: int, U: int = 30, N: int = 1200):
    """The compiled d = 3 cut cell with ``nodes`` per piece and a dense N × N Gauss–Legendre rule over
    axes 1 and 2 of the exact integral along axis 0, on U random cells a level cuts (the dense rule
    is good to about 3e−9 relative at N = 1200 against one of 2400: its error is the kink where the
    root along axis 0 crosses the cell's faces)."""
    from empdp.risk.joint._compiled import cut_cells

    rng = np.random.default_rng(8)
    own, other = np.exp(rng.normal(0, 1, (U, 8))), np.exp(rng.normal(0, 1, (U, 8)))
    width = np.column_stack([rng.uniform(0.2, 1.5, U), rng.uniform(0.05, 1.0, U), rng.uniform(0.05, 1.0, U)])
    g = own.sum(1) / other.sum(1) * rng.uniform(0.6, 1.6, U)  # h = own − g other changes sign in most cells
    x, wts = np.polynomial.legendre.leggauss(nodes)
    got = np.empty(U)
    for u in range(U):  # one cell, one level each (the cell's corners bracket only that level)
        out = np.zeros((2, 1))
        level = np.log(g[u:u + 1])
        cut_cells(own[u:u + 1], other[u:u + 1], np.zeros(1), np.zeros(1), width[u:u + 1], level - 1e-9,
                  level + 1e-9, level, x, wts, 1e-13, out)
        got[u] = out[0, 0]
    X, W = np.polynomial.legendre.leggauss(N)
    c = own - g[:, None] * other
    ref = np.empty(U)
    for u in range(U):
        t1, t2 = (X + 1) * width[u, 1] / 2, (X + 1) * width[u, 2] / 2
        e1, e2 = np.stack([np.exp(t1), np.exp(-t1)], 1), np.stack([np.exp(t2), np.exp(-t2)], 1)
        # flat σ: index 4 i0 + 2 i1 + i2, i = 0 for +1; axis 0's coefficients of e^{+t0} and e^{−t0}
        coef = [e1 @ c[u, 4 * i0:4 * i0 + 4].reshape(2, 2) @ e2.T for i0 in (0, 1)]
        inner = _along_axis0(coef[0], coef[1], width[u, 0])
        ref[u] = W @ inner @ W * width[u, 1] * width[u, 2] / 4
    return got, ref


def test_d3_cut_cells_equal_a_dense_quadrature():
    """The compiled d = 3 cut cell (exact along axis 0, pieces between edge roots and folds, those the
    root stays out of in closed form, pieces near a singular point halved until two rules agree)
    against a dense rule on random cut cells (both signs of h, roots entering through every face),
    within 1e−8 relative. A fixed 6-node rule a piece, without the halving, erred by up to 6.7e−6 on
    them (a fold of the level set inside a piece); 16 nodes by 1.4e−8."""
    got, ref = _cut_cells_and_dense_reference(QUAD_NODES)
    assert (ref > 0).sum() > len(ref) // 2
    np.testing.assert_allclose(got, ref, rtol=1e-8, atol=1e-13)


def test_d3_matches_monte_carlo_and_the_vertex_reference():
    rng = np.random.default_rng(9)
    q = rng.normal(size=(5, 3))
    q[:, 2] += q[:, 0]
    S = rng.normal(size=(2, 5, 3)) * 0.7 * (rng.random((2, 5, 1)) < 0.7)
    model = select_joint_model(q, bandwidth=[0.6, 0.5, 0.7])
    eps = np.array([0.1, 0.5])
    e, dl = joint_risk(model, S, eps)
    for i in range(2):
        A, B = scaled(model, S[i])
        assert e[i] == pytest.approx(ref_eps(A, B, rng, 20000), rel=1e-6)
        mean, se = mc_delta(A, B, eps, 400_000, rng)
        # Monte Carlo tolerance: 5 standard errors (about 1e-3 here)
        assert np.all(np.abs(dl[i] - mean) <= 5 * se + 1e-9), (dl[i], mean, se)
    # quadrature convergence inside cut cells: 6 and 10 nodes agree to 1e-9
    _, d10 = joint_risk(model, S, eps, nodes=10)
    np.testing.assert_allclose(d10, dl, atol=1e-9)


# ------------------------------------------------------------------ the paper's example (§3)
def paper_panel(n_db=40, n_ind=30, seed=0):
    """sum(x) and sum(x) without individual K, where K contributes a steady amount each database."""
    rng = np.random.default_rng(seed)
    x = rng.normal(5.0, 2.0, size=(n_ind, n_db))
    K = 7
    x[K] = 5.0 + rng.normal(0, 0.05, size=n_db)
    q = np.c_[x.sum(0), x.sum(0) - x[K]]                      # (n_db, 2)
    shifts = np.stack([x, x], axis=-1)                         # Δ_ij = (x_ij, x_ij) for i ≠ K
    shifts[K, :, 1] = 0.0                                      # K is not in the second statistic
    return q, shifts, K


def test_paper_example_each_statistic_private_together_they_expose_k():
    q, shifts, K = paper_panel()
    marginal = []
    for k in range(2):
        dm = select_density(q[:, k], kernel="laplace")
        marginal.append(evaluate(dm, shifts[:, :, k])[0])
    marginal = np.array(marginal)  # (2, m)
    model = select_joint_model(q)
    assert model.whitened
    e, _ = joint_risk(model, shifts)
    assert int(np.argmax(e)) == K
    assert e[K] >= 10 * marginal[:, K].max()
    assert e[K] >= 10 * np.delete(e, K).max()  # K stands out; nobody else does
    # axis-aligned kernels with the marginal scales cannot see it (their ratio is bounded by the marginals')
    aligned = select_joint_model(q, bandwidth=[select_density(q[:, k], kernel="laplace").scale for k in range(2)])
    ea, _ = joint_risk(aligned, shifts)
    assert ea[K] < 10 * marginal[:, K].max()


# ----------------------------------------------------------------------------- bad input
def test_singular_covariance_is_a_finding_not_a_crash():
    q, shifts, K = paper_panel()
    exact = q.copy()
    exact[:, 1] = exact[:, 0] - 5.0  # K's contribution exactly constant: statistic 2 = statistic 1 − 5
    with pytest.raises(SingularCovarianceError, match=r"statistic 1 .*and statistic 2 .*exactly dependent") as info:
        select_joint_model(exact, names=["sum(x)", "sum(x) without K"])
    assert "\n" not in str(info.value) and isinstance(info.value, InputError)
    assert info.value.involved == (0, 1)
    q3 = np.c_[q, 2 * q[:, 0] - 3 * q[:, 1] + 1]
    with pytest.raises(InputError, match="exactly dependent"):
        select_joint_model(q3)
    const = np.c_[q[:, 0], np.full(len(q), 3.0)]
    with pytest.raises(InputError, match="statistic 2 is constant"):
        select_joint_model(const)


@pytest.mark.parametrize("q, bw, match", [
    (np.zeros((5, 4)), "auto", "1 to 3 statistics"),
    (np.ones((5, 2)), [1.0], "one scale per statistic"),
    (np.ones((5, 2)), [1.0, -1.0], "positive"),
    (np.array([[1.0, np.nan], [2.0, 3.0]]), "auto", "finite"),
])
def test_bad_input_is_one_line(q, bw, match):
    with pytest.raises(InputError, match=match):
        select_joint_model(q, bandwidth=bw)


# ---------------------------------------------------------------------------- calibration
def test_calibration_is_minimal_and_verified():
    q, S = random_panel(2, 30, 2, 40, size=0.3)
    model = select_joint_model(q)
    epsilon = 0.2
    res = joint_minimal_lambda(model, S, epsilon)
    assert res.t > 1 and res.noise.kind == "laplace_mixture"
    assert joint_eps_at(model, S, res.t).max() <= epsilon
    assert joint_eps_at(model, S, 0.99 * res.t).max() > epsilon
    np.testing.assert_allclose(res.noise.scales, res.t * model.scales)
    np.testing.assert_allclose(res.noise.weights, res.t ** -2.0)
    np.testing.assert_allclose(res.noise.unwhitening @ model.whitening, np.eye(2), atol=1e-12)
    # no noise exactly when the curator model is ε-private for everyone
    eps_all = joint_risk(model, S)[0].max()
    assert joint_minimal_lambda(model, S, eps_all * 1.0001).noise.kind == "none"
    assert joint_minimal_lambda(model, S, eps_all * 0.999).noise.kind != "none"


def test_noise_deconvolves_the_curator_kernel_per_whitened_axis():
    from scipy import stats

    q, _ = random_panel(2, 30, 2, 1)
    model = select_joint_model(q)
    noise = joint_noise(model, 2.0 * model.scales)
    rng = np.random.default_rng(0)
    N = 200_000
    kernel = rng.laplace(size=(N, 2)) * model.scales @ model.unwhitening.T  # curator kernel, statistics' units
    y = (kernel + noise.sample(N, rng)) @ model.whitening.T
    for k in range(2):  # kernel ⋆ noise is Laplace(λ_k) on each whitened axis
        assert stats.kstest(y[:, k], "laplace", args=(0, noise.scales[k])).pvalue > 1e-3
    assert joint_noise(model, model.scales * 0.5).kind == "none"


def test_any_gauss_node_count_in_the_adaptive_cells():
    """``nodes`` is any count (a rule outside the cached 2, 3, 4, 6, 8 raised KeyError where a cut
    cell needs refinement); a count below 1 is refused."""
    from empdp.risk.joint import _cutcell

    rng = np.random.default_rng(4)
    x = rng.normal(5.0, 2.0, size=(30, 20))
    K = 7
    x[K] = 5.0 + rng.normal(0, 0.05, size=20)
    q = np.c_[x.sum(0), x.sum(0) - x[K]]
    S = np.stack([x, x], axis=-1)
    S[K, :, 1] = 0.0
    model = select_joint_model(q)
    eps = np.array([1.0, 5.0])
    _, d4 = joint_risk(model, S[K:K + 1], eps, nodes=4)
    _, d10 = joint_risk(model, S[K:K + 1], eps, nodes=10)
    np.testing.assert_allclose(d10, d4, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="nodes"):
        _cutcell._rule(0)


@pytest.mark.parametrize("gap", [500.0, 800.0, 1000.0])
def test_d2_extreme_gaps_keep_the_far_mass_and_raise_no_warning(gap):
    """Closed forms far apart (issue 37, item 4): the same shift of ``gap`` scales in every database is a
    translation, so ε_i = gap exactly and the two densities are disjoint up to e^{−gap}: δ_i(ε) = 1 at
    small ε. One database moved ``gap`` away takes its whole kernel, 1/n of the mass, beyond reach of
    the others: δ_i = 1/n at small ε. Before, the general path's cells 800 scales wide lost the mass
    of the points beside their far edge (δ_i(0) = 0.88 and 0.043) and overflowed."""
    import warnings

    rng = np.random.default_rng(4)
    q = rng.normal(size=(20, 2))
    q[:, 1] += 0.5 * q[:, 0]
    model = select_joint_model(q, bandwidth=[1.0, 1.0])
    same = np.zeros((1, 20, 2))
    same[0, :, 0] = gap
    one = np.zeros((1, 20, 2))
    one[0, 3] = [gap, -0.3 * gap]
    eps = np.array([0.0, 1.0, 50.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e, d = joint_risk(model, same, eps)
        e1, d1 = joint_risk(model, one, eps)
    assert e[0] == pytest.approx(gap, rel=1e-12)
    np.testing.assert_allclose(d[0], 1.0, atol=1e-12)
    np.testing.assert_allclose(d1[0], 1 / 20, atol=1e-12)
