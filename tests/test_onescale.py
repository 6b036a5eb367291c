"""The closed-form risk of one-scale Laplace models (empdp.risk.onescale) against references:
adaptive quadrature split at every kink and at every root, and the general grid path."""

import numpy as np
import pytest
from reference import laplace_quadrature_delta

from empdp import risk
from empdp.density import DensityModel
from empdp.risk import onescale as _onescale


def one_scale(q, b) -> DensityModel:
    return DensityModel(kernel="laplace", scale=b, sensitivity=0.0, points=np.asarray(q, dtype=float),
                        bandwidths=np.full(len(q), float(b)), loglik=0.0, selected_by="fixed")


@pytest.mark.parametrize("seed", range(6))
def test_delta_and_eps_i_against_quadrature(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    q = rng.normal(size=n) * rng.uniform(0.2, 2)
    b = float(rng.uniform(0.05, 0.8))
    shifts = rng.normal(size=(3, n)) * rng.uniform(0.05, 1.0) * (rng.random((3, n)) < 0.8)
    eps = np.array([0.0, 0.03, 0.2, 0.6, 1.5])
    eps_i, delta = _onescale.evaluate(q, b, shifts, eps)
    for i in range(len(shifts)):
        ref = [laplace_quadrature_delta(q, b, shifts[i], e) for e in eps]
        np.testing.assert_allclose(delta[i], ref, rtol=0, atol=1e-12)
        # ε_i = sup |L|, taken at a node (L is monotone between nodes): check it on a dense grid
        x = np.unique(np.r_[np.linspace(q.min() - 3, q.max() + 3, 20001), q, q - shifts[i]])
        m = one_scale(q, b)
        sup = np.abs(m.logpdf(x) - m.logpdf(x, shifts[i])).max()
        assert eps_i[i] == pytest.approx(sup, rel=1e-12, abs=1e-14)
        assert np.all(delta[i][eps >= eps_i[i]] == 0)


@pytest.mark.parametrize("direction", [-1.0, 1.0])
def test_far_kernel_at_large_eps_against_quadrature(direction):
    """A kernel shifted 30 scales: near ε_i ≈ 28.6, e^ε times p̂'s mass is of order 1 where p̂_i's far
    kernel sits. Each cut interval's positive part is a square without cancellation; as the whole
    interval minus its negative part (both ~e^ε) it was off by 1.8e-4 at ε = 27 (shift to the right)."""
    q, b = np.array([0.0, 0.3, -0.2]), 1.0
    shift = np.array([0.0, 0.0, 30.0 * direction])
    eps_i, _ = _onescale.evaluate(q, b, shift[None, :], None)
    eps = np.array([0.5, 0.9, 0.95, 0.97, 0.995]) * eps_i[0]
    _, delta = _onescale.evaluate(q, b, shift[None, :], eps)
    want = [laplace_quadrature_delta(q, b, shift, e) for e in eps]
    assert min(want) > 0.02
    np.testing.assert_allclose(delta[0], want, rtol=1e-12, atol=1e-15)


def test_log_ratio_is_monotone_between_nodes():
    """The property the closed form rests on (δ_i cuts at most one root per piece)."""
    rng = np.random.default_rng(7)
    q = rng.normal(size=12)
    b = 0.3
    shift = rng.normal(size=12) * 0.7
    m = one_scale(q, b)
    nodes = np.unique(np.r_[q, q - shift])
    for x0, x1 in zip(nodes[:-1], nodes[1:]):
        x = np.linspace(x0, x1, 400)
        d = np.diff(m.logpdf(x) - m.logpdf(x, shift))
        assert np.all(d >= -1e-12) or np.all(d <= 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_equals_the_general_grid_path(seed):
    """Two independent exact methods: the closed form and the certified-bounds grid path."""
    rng = np.random.default_rng(100 + seed)
    n = [5, 30, 100, 17][seed]
    q = rng.standard_t(3, size=n)
    b = float(rng.uniform(0.05, 0.5))
    shifts = rng.normal(size=(60, n)) * rng.uniform(0.01, 1.0) * (rng.random((60, n)) < 0.6)
    shifts[0] = 0.0  # no change: no risk
    shifts[1, 0] = 40 * b  # far outside the others
    eps = np.sort(rng.uniform(0, 2, size=9))
    model = one_scale(q, b)
    e_new, d_new = risk.evaluate(model, shifts, eps)
    e_old, d_old = risk.evaluate_on_grid(model, shifts, eps)
    np.testing.assert_allclose(e_new, e_old, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(d_new, d_old, rtol=0, atol=5e-10)
    assert e_new[0] == 0 and np.all(d_new[0] == 0)


def test_ties_absences_and_far_kinks():
    """Kinks on the shared points (absent from a database: Δ = 0), repeated points, and kinks
    thousands of scales away (densities that underflow between them): finite, in [0, 1]."""
    q = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 3.0])
    b = 0.1
    shifts = np.array([[0.0, 0.5, 0.0, 0.0, 0.0, 0.0],
                       [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],  # a kink on another point
                       [0.0, 0.0, 0.0, 0.0, 0.0, 500.0]])  # 5,000 scales away
    eps = np.array([0.1, 1.0, 10.0])
    eps_i, delta = _onescale.evaluate(q, b, shifts, eps)
    assert np.all(np.isfinite(eps_i)) and np.all((delta >= 0) & (delta <= 1))
    for i in range(2):
        ref = [laplace_quadrature_delta(q, b, shifts[i], e) for e in eps]
        np.testing.assert_allclose(delta[i], ref, atol=1e-12)
    # the far kink moves 1/6 of the mass out of reach: δ = 1/6 whatever ε (to double precision)
    np.testing.assert_allclose(delta[2], 1 / 6, rtol=1e-12)
    assert eps_i[2] == 700.0  # capped like the general path


def test_only_and_cap_as_the_general_path():
    rng = np.random.default_rng(3)
    q = rng.normal(size=20)
    model = one_scale(q, 0.2)
    shifts = rng.normal(size=(40, 20)) * 0.3
    eps = np.geomspace(0.01, 1.0, 8)
    only = np.zeros(8, dtype=bool)
    only[:3] = True
    full = risk.evaluate(model, shifts, eps)[1]
    cap = np.full(8, np.median(full[:, 0]))
    got = risk.evaluate(model, shifts, eps, only=only, cap=cap)[1]
    # the same sums over fewer levels: equal to round-off
    np.testing.assert_allclose(got[:, only], full[:, only], rtol=1e-13, atol=1e-17)
    over = full[:, 0] > cap[0]
    np.testing.assert_allclose(got[over], full[over], rtol=1e-13, atol=1e-17)
    rest = got[~over][:, ~only]
    assert np.isnan(rest).any()
    np.testing.assert_array_equal(np.isnan(rest), full[~over][:, ~only] > 0)
    with pytest.raises(ValueError):
        risk.evaluate(model, shifts, eps, only=~only, cap=cap)


def _matrix_form(q, b, points, shifts, eps):
    """The closed form as numpy evaluated it before the compiled rows (rows × nodes arrays, the
    running sums by a loop over nodes): the reference of test_compiled_rows_equal_the_matrix_form."""
    from empdp.risk.laplace import L_CAP
    C, n = shifts.shape
    J = 2 * n
    centres = np.concatenate([np.broadcast_to(q, (C, n)), points[None, :] - shifts], axis=1)
    order = np.argsort(centres, axis=1, kind="stable")
    xT = np.take_along_axis(centres, order, axis=1).T
    own = (order >= n).T
    with np.errstate(under="ignore"):
        f = np.exp(np.diff(xT, axis=0) * (-1.0 / b))
    inflow = np.concatenate([~own, own], axis=1).astype(float)
    decay = np.concatenate([f, f], axis=1)
    A, B = inflow.copy(), inflow.copy()
    for j in range(1, J):
        A[j] += A[j - 1] * decay[j - 1]
        B[J - 1 - j] += B[J - j] * decay[J - 1 - j]
    V = A + B - inflow
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.log(V[:, :C]) - np.log(V[:, C:])
    L = np.clip(np.nan_to_num(L, nan=0.0, posinf=L_CAP, neginf=-L_CAP), -L_CAP, L_CAP)
    eps_i = np.abs(L).max(axis=0)
    growth = np.exp(np.minimum(eps, L_CAP))
    mass = (A[:-1] + B[1:]) * (1.0 - decay)
    sides = []
    for sign, at_p in ((1.0, 0), (-1.0, C)):
        at_q = C - at_p
        p, qq = slice(at_p, at_p + C), slice(at_q, at_q + C)
        cnt = np.searchsorted(eps, sign * L, side="left")
        lo, hi = np.minimum(cnt[:-1], cnt[1:]), np.maximum(cnt[:-1], cnt[1:])
        out = np.zeros((C, len(eps)))
        for c in range(C):
            for e in range(len(eps)):
                whole = (lo[:, c] > e, cnt[0, c] > e, cnt[-1, c] > e)
                sp = mass[whole[0], p][:, c].sum() + B[0, p][c] * whole[1] + A[-1, p][c] * whole[2]
                sq = mass[whole[0], qq][:, c].sum() + B[0, qq][c] * whole[1] + A[-1, qq][c] * whole[2]
                out[c, e] = sp - growth[e] * sq
                for k in np.flatnonzero((lo[:, c] <= e) & (hi[:, c] > e)):
                    alpha = A[k, p][c] - growth[e] * A[k, qq][c]
                    beta = B[k + 1, p][c] - growth[e] * B[k + 1, qq][c]
                    out[c, e] += quad_cut(alpha, beta, f[k, c])
        sides.append(out)
    delta = np.clip(np.maximum(*sides) * (0.5 / n), 0.0, 1.0)
    delta[eps_i[:, None] <= eps[None, :]] = 0.0
    return eps_i, delta


def quad_cut(alpha, beta, f):
    """∫_0^h (α e^{−t/b} + β e^{−(h−t)/b})_+ dt / b with f = e^{−h/b}, from the root directly."""
    h = -np.log(f) if f > 0 else np.inf
    a0, a1 = alpha + beta * f, alpha * f + beta
    if a0 <= 0 and a1 <= 0:
        return 0.0
    if a0 >= 0 and a1 >= 0:
        return (alpha + beta) * (1.0 - f)
    t = 0.5 * (h + np.log(-alpha / beta))  # α e^{−t} = −β e^{−(h−t)} (a sign change: α β < 0)
    left = alpha * (1 - np.exp(-t)) + beta * (np.exp(t - h) - f)
    return left if a0 > 0 else (alpha + beta) * (1.0 - f) - left


@pytest.mark.parametrize("seed", range(4))
def test_compiled_rows_equal_the_matrix_form(seed):
    """The compiled row kernel against the numpy form it replaced, on panels with small shifts
    (kinks nearly in their points' order), large ones (out of order), absences and ties: ε_i to the
    last bits (the same sums in the same order; the libraries' exp and log may differ by an ulp, and
    ε_i = ln(v_p/v_q) turns an ulp of a ratio near 1 into ~2e-16 absolute: seed 0's shifts of 0.001
    give ε_i of 0.003, where one ulp is 3e-14 relative; a fresh machine's numpy showed it) and δ_i
    to 1e-12 of the largest (each cut here from its root, not as a square)."""
    rng = np.random.default_rng(200 + seed)
    n = [4, 30, 100, 60][seed]
    q = rng.normal(size=n)
    if seed == 3:
        q[::3] = q[0]  # repeated points
    b = float(rng.uniform(0.05, 0.5))
    shifts = rng.normal(size=(25, n)) * [0.001, 0.05, 0.3, 2.0][seed] * (rng.random((25, n)) < 0.7)
    shifts[0] = 0.0
    eps = np.sort(rng.uniform(0, 1.5, size=11))
    e_new, d_new = _onescale.evaluate(q, b, shifts, eps)
    e_ref, d_ref = _matrix_form(np.sort(q), b, q, shifts, eps)
    still = ~shifts.any(axis=1)  # p̂_i ≡ p̂: evaluate skips these rows (no risk), the form rounds to ~1e-16
    e_ref[still], d_ref[still] = 0.0, 0.0
    np.testing.assert_allclose(e_new, e_ref, rtol=1e-14, atol=1e-15)  # (a few ulps of a ratio near 1)
    np.testing.assert_allclose(d_new, d_ref, rtol=0, atol=1e-12 * max(d_ref.max(), 1e-300))
    assert np.array_equal(d_new > 0, d_ref > 0)


def _log_counts(vp, vq, eps, cap):
    """The level counts and ε_i of one row from the logs at every node, as the kernel took them
    before comparing ratios: the reference of test_node_levels_count_as_the_logs_do."""
    from empdp import compiled

    L = np.array([compiled._clipped_log_ratio(a, c, cap) for a, c in zip(vp, vq)])
    return (np.searchsorted(eps, L, side="left"), np.searchsorted(eps, -L, side="left"),
            float(np.abs(L).max(initial=0.0)))


@pytest.mark.parametrize("seed", range(3))
def test_node_levels_count_as_the_logs_do(seed):
    """The row kernel counts the levels below each node's log-ratio from the ratio v_p / v_q (no
    logs): at nodes whose log-ratio equals a level, lies within rounding of it with densities
    e^{−400} small (where the two logs' rounding, ~1e-13, exceeds the ratio's), has a zero density
    or a ratio beyond e^{±645}, the counts and ε_i must still be exactly those of the logs."""
    from empdp import compiled
    from empdp.risk.laplace import L_CAP

    rng = np.random.default_rng(seed)
    eps = np.sort(np.concatenate([rng.uniform(0.001, 3.0, 30), [0.5, 0.5, 1e-4, 2.0]]))
    scale = np.exp(rng.uniform(-400.0, 5.0, 600))  # tiny densities: log rounding ~1e-13
    offsets = rng.choice([0.0, 1e-16, -1e-16, 1e-14, -1e-14, 1e-12, -1e-12], 600)
    level = rng.choice(np.concatenate([eps, -eps]), 600)
    vq = scale
    vp = scale * np.exp(level) * (1.0 + offsets)
    free = rng.random(600) < 0.2  # some nodes anywhere
    vp[free] = scale[free] * np.exp(rng.normal(0, 2.0, free.sum()))
    # the largest |L| among a hundred ratios within rounding of each other (and of tiny densities)
    top_nodes = slice(500, 600)
    vq[top_nodes] = np.exp(rng.uniform(-400.0, -300.0, 100))
    vp[top_nodes] = vq[top_nodes] * np.exp(8.1234567) * (1.0 + rng.integers(-3, 4, 100) * 1e-16)
    vp[:4], vq[:4] = [0.0, 1.0, 0.0, 1e-300], [1.0, 0.0, 0.0, 1.0]  # zero densities, a huge ratio
    vp[4], vq[4] = 1.0, 1e-290
    E = len(eps)
    above, below = np.exp(eps + compiled.RATIO_BAND), np.exp(eps - compiled.RATIO_BAND)
    table = np.zeros(16 * E + 1, dtype=np.int64)
    inv = compiled._band_table(above, table)
    J = len(vp)
    cnt_p, cnt_m, ratio = np.empty(J, dtype=np.int64), np.empty(J, dtype=np.int64), np.empty(J)
    top = compiled._node_levels(vp, vq, ratio, eps, above, below, table, inv, True, L_CAP, cnt_p, cnt_m, True)
    want_p, want_m, want_top = _log_counts(vp, vq, eps, L_CAP)
    np.testing.assert_array_equal(cnt_p, want_p)
    np.testing.assert_array_equal(cnt_m, want_m)
    assert top == want_top
    # ε_i alone (the search's rows): the same maximum, from the logs at the extreme ratios only
    assert compiled._node_levels(vp[5:], vq[5:], ratio[5:], eps, above, below, table, inv, True, L_CAP,
                                 cnt_p, cnt_m, False) == _log_counts(vp[5:], vq[5:], eps, L_CAP)[2]


def test_the_warm_up_loads_what_the_default_assessment_calls(sample_path):
    """The assessment loads its compiled kernels in a background thread while DuckDB reads the table
    (``compiled.warm``): ~1.4 s of numba's import and cache load that the density fit waited for at
    10^7 rows. It must load the very specializations the assessment calls (an argument of another type,
    a read-only array say, would compile or load a second one in the foreground): after a default
    assessment in a fresh process, no compiled function has a signature the warm-up did not load."""
    import subprocess
    import sys

    code = (
        "from empdp import compiled\n"
        "compiled.warm()\n"
        "fns = [compiled.onescale_rows, compiled.laplace_sums]\n"
        "before = [list(f.signatures) for f in fns]\n"
        "from empdp import assess\n"
        f"assess({sample_path!r}, id='countyid', by='year', query='mean(murdrate)')\n"
        "after = [list(f.signatures) for f in fns]\n"
        "print(before == after, len(before[0]), len(before[1]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "1", "1"]
