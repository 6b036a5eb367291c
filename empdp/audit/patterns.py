"""StatDP input patterns for vector-valued inputs (Ding et al. 2018, Table 1 of Askin et al. 2022),
and the per-pattern answer counts that summarise the outputs of query-wise mechanisms.

Each pattern is a pair of query-answer vectors that differ by at most 1 in
every component (counting queries on adjacent databases); for queries of
sensitivity s the values 0, 1, 2 become 1 − s, 1, 1 + s (``scale_pairs``).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

PATTERN_NAMES = (
    "one above", "one below", "one above rest below", "one below rest above",
    "half half", "all above", "all below", "x shape",
)
ORDERED_NAMES = ("one above rest below (last)", "one below rest above (last)")

#: Largest number of queries for generated patterns (ten pairs of vectors of this length).
MAX_PATTERN_DIM = 100_000


def scale_pairs(pairs: list, sensitivity: float, centre: float = 0.0) -> list:
    """Pairs for inputs of sensitivity s: every value v becomes centre + (v − centre)·s.

    The reference pairs differ by at most 1 per entry; scaled, by at most s, so
    they stay neighbouring. Scaling noise and inputs together leaves the law of
    the (centred) output unchanged, so the exact ε or D_α over the pairs does not
    depend on s. At s = 1 the pairs are returned as they are (bit-identical audits).
    """
    if sensitivity == 1:
        return pairs

    def scale(db):
        if isinstance(db, (list, tuple)):
            return type(db)(centre + (v - centre) * sensitivity for v in db)
        return centre + (db - centre) * sensitivity

    return [(scale(x), scale(y)) for x, y in pairs]


def statdp_patterns(dim: int, ordered: bool = False, sensitivity: float = 1.0) -> list[tuple[list, list]]:
    """The eight StatDP patterns for ``dim`` queries, in the order of PATTERN_NAMES.

    With ``ordered`` (for mechanisms that read the queries in order, like the
    Sparse Vector variants) two more pairs put the odd query last instead of
    first: "one above rest below (last)" and "one below rest above (last)".
    With ``sensitivity`` s ≠ 1 the values 0, 1, 2 become 1 − s, 1, 1 + s
    (around the threshold T = 1 of the Sparse Vector variants).
    """
    if int(dim) != dim or not 2 <= dim <= MAX_PATTERN_DIM:
        raise InputError(f"StatDP patterns need between 2 and {MAX_PATTERN_DIM:,} queries, "
                         f"got dimension {dim!r}")
    dim = int(dim)
    half = dim // 2
    ones = [1] * dim
    return scale_pairs([
        (ones, [0] + [1] * (dim - 1)),
        (ones, [2] + [1] * (dim - 1)),
        (ones, [2] + [0] * (dim - 1)),
        (ones, [0] + [2] * (dim - 1)),
        (ones, [2] * half + [0] * (dim - half)),
        (ones, [2] * dim),
        (ones, [0] * dim),
        ([1] * half + [0] * (dim - half), [0] * half + [1] * (dim - half)),
    ] + ([
        (ones, [0] * (dim - 1) + [2]),
        (ones, [2] * (dim - 1) + [0]),
    ] if ordered else []), sensitivity, centre=1.0)


def neighbour_pairs(dim: int) -> list:
    """DP-Sniper's pairs for mechanisms whose neighbours differ in one entry (Bichsel et al. 2021,
    ``PatternGenerator`` without component-wise neighbourhood): "one above" and "one below" of
    StatDP, x = (1, …, 1) against x′ with the first entry 0 or 2 (numbers when ``dim`` is 1)."""
    if dim == 1:
        return [(1, 0), (1, 2)]
    ones = [1] * dim
    return [(ones, [0] + ones[1:]), (ones, [2] + ones[1:])]


def answer_counts(x, x_prime, outputs) -> np.ndarray:
    """Number of "above" answers (1) per group of queries with equal (q_i, q′_i).

    For the Sparse Vector variants without abort (SVT5, SVT6) the answers are
    independent given the threshold noise, so within a group they are
    exchangeable under both inputs: the counts are a sufficient statistic for
    the pair and carry the same privacy loss as the answer vectors, but take a
    handful of values instead of 2^m, which the frequency estimates of MPL
    need (Askin et al. 2022 sample the vectors and rarely see the worst ones).
    Outputs that do not have one answer per query are returned unchanged.
    """
    qx, qy = np.atleast_1d(np.asarray(x, float)), np.atleast_1d(np.asarray(x_prime, float))
    out = np.asarray(outputs)
    if out.ndim != 2 or qx.size != qy.size or out.shape[1] != qx.size:
        return outputs
    _, group = np.unique(np.stack([qx, qy], axis=1), axis=0, return_inverse=True)
    group = np.ravel(group)
    one_hot = (group[:, None] == np.arange(group.max() + 1)[None, :]).astype(np.int32)
    return (out == 1).astype(np.int32) @ one_hot
