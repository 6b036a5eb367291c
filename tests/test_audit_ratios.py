"""Per-coordinate log-ratio scores (empdp.audit.ratios) and the MPL bounds they give on vector outputs."""

from __future__ import annotations

import math

import numpy as np

from empdp.audit.mechanisms import dpsniper_mechanism
from empdp.audit.mpl import mpl
from empdp.audit.ratios import BIN_COUNTS, fit_binning, ratio_scores


def _bits(probs, size, rng):
    return (rng.random((size, len(probs))) < np.asarray(probs)[None, :]).astype(np.int8)


def test_bit_tables_are_the_exact_per_bit_log_ratios():
    """Independent bits (RAPPOR's shape): each bit's two values are atoms and its table is
    ln P_x(bit)/P_x′(bit), so the score is the exact log ratio of the output, up to sampling error."""
    rng = np.random.default_rng(0)
    px, py = np.array([0.7, 0.5, 0.2, 0.5]), np.array([0.3, 0.5, 0.4, 0.5])
    x, y = _bits(px, 200_000, rng), _bits(py, 200_000, rng)
    binning, scores = ratio_scores(x, y)[0]
    assert not binning.pooled and not binning.differences
    assert all(len(a) == 2 for a in binning.atoms)
    per_column = scores[0]
    t = _bits([0.5] * 4, 1000, rng)
    exact = (np.where(t == 1, np.log(px / py), np.log((1 - px) / (1 - py)))).sum(axis=1)
    np.testing.assert_allclose(per_column.score(t), exact, atol=0.03)


def test_difference_tables_recover_independent_increments():
    """Prefix sums of independent Laplace increments: the differences' score is the sum of the
    increments' log ratios (a shift of 1 in scale 10: at most 0.1 each)."""
    rng = np.random.default_rng(1)
    q = np.array([1.0, 0.0, 1.0, 0.0, 1.0])

    def sample(shift, size):
        return np.cumsum(shift * q[None, :] + rng.laplace(0.0, 10.0, (size, q.size)), axis=1)

    x, y = sample(1.0, 400_000), sample(0.0, 400_000)
    by_kind = {(b.differences, b.pooled): scores for b, scores in ratio_scores(x, y)}
    diff32 = by_kind[(True, False)][BIN_COUNTS.index(32)]
    t = sample(0.5, 2000)
    inc = np.diff(np.concatenate([np.zeros((len(t), 1)), t], axis=1), axis=1)
    exact = ((np.abs(inc - 0.0) - np.abs(inc - 1.0)) / 10.0 * q[None, :]).sum(axis=1)
    assert np.corrcoef(diff32.score(t), exact)[0, 1] > 0.95
    assert np.abs(diff32.score(t)).max() <= 0.1 * q.sum() + 0.15  # five tables of 32 bins, each ~0.013 off


def test_atoms_and_plain_values_share_a_column():
    """Codes among numbers (SVT's -1000 'below'): the codes are bins of their own, the numbers are
    binned by quantiles, and every value gets one bin."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5000, 3))
    x[rng.random(x.shape) < 0.3] = -1000.0
    binning = fit_binning(x, x[::-1], differences=False, pooled=False)
    assert all(list(a) == [-1000.0] for a in binning.atoms)
    codes = binning.codes(x)
    assert np.all((codes == 0) == (x == -1000.0))
    assert codes.max() <= 32 and codes[x != -1000.0].min() >= 1


def test_prefix_sum_bound_from_differences():
    """PrefixSum (exact ε 1 over DP-Sniper's pairs): the differences' log ratios find an event the
    logistic regression on raw coordinates missed (0.47-0.49 at these sizes, 0.65 now), below the truth."""
    mech, pairs = dpsniper_mechanism("prefix_sum")
    res = mpl(mech, pairs, n=20_000, N=100_000, alpha=0.1, rng=0)
    assert "log ratios of the differences" in res.event_rule["score"]
    assert 0.58 < res.lower_bound <= mech.true_epsilon_over(pairs)


def test_score_events_keep_the_documented_floor():
    """The floor is 20/n for the whole stage 1 (n outputs per database), although the scores are fitted
    on one half and judged on the other. The floor caps the loss at ln(1/τ): noisy_hist2's best events
    (loss 10) are rare under x′, and 20/(n/2) capped them at ln(n/40) instead of ln(n/20)."""
    mech, pairs = dpsniper_mechanism("noisy_hist2")
    res = mpl(mech, pairs, n=4000, N=20_000, alpha=0.1, rng=0)
    assert res.tau == 20 / 4000
    assert math.log(4000 / 40) < res.loss_at_t_hat <= math.log(4000 / 20) + 1e-9


def test_table_counts_added_over_chunks_are_those_of_all_outputs():
    """The refit counts its tables chunk by chunk (TableScores.add): the binnings and patterns come from
    the first chunk, and the scores equal those of tables counted on every output at once with the
    same binnings (SVT-like outputs: codes among values, so the answer patterns are among them)."""
    from empdp.audit.ratios import PatternBinning, TableScores

    rng = np.random.default_rng(9)

    def draw(shift, size):
        v = rng.laplace(shift, 1.0, (size, 4))
        v[v < -0.5] = -1000.0
        return v

    x, y = draw(0.3, 50_000), draw(0.0, 50_000)
    tables = TableScores(x[:20_000], y[:20_000])
    assert any(isinstance(b, PatternBinning) for b in tables.binnings)
    for start in range(20_000, 50_000, 7_000):
        tables.add(tables.codes(x[start:start + 7_000]), tables.codes(y[start:start + 7_000]))
    once = TableScores(x[:20_000], y[:20_000])
    whole_x, whole_y = (once.split(once.codes(v)) for v in (x, y))
    once.counts = [[b.counts(c) for b, c in zip(once.binnings, side)] for side in (whole_x, whole_y)]
    t = draw(0.15, 3000)
    for (_, chunked), (_, direct) in zip(tables.scores(), once.scores()):
        for a, b in zip(chunked, direct):
            np.testing.assert_array_equal(a.score(t), b.score(t))
    # and the counts are every output's: a chunk's counts are added, not replacing the first's
    assert sum(c.sum() for c in tables.counts[0][0]) == 50_000 * 4
