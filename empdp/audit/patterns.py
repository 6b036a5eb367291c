"""StatDP input patterns for vector-valued inputs (Ding et al. 2018, Table 1 of Askin et al. 2022),
and the per-pattern answer counts that summarise the outputs of query-wise mechanisms.

Each pattern is a pair of query-answer vectors that differ by at most 1 in
every component (counting queries on adjacent databases).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

PATTERN_NAMES = (
    "one above", "one below", "one above rest below", "one below rest above",
    "half half", "all above", "all below", "x shape",
)
ORDERED_NAMES = ("one above rest below (last)", "one below rest above (last)")


def statdp_patterns(dim: int, ordered: bool = False) -> list[tuple[list[int], list[int]]]:
    """The eight StatDP patterns for ``dim`` queries, in the order of PATTERN_NAMES.

    With ``ordered`` (for mechanisms that read the queries in order, like the
    Sparse Vector variants) two more pairs put the odd query last instead of
    first: "one above rest below (last)" and "one below rest above (last)".
    """
    if int(dim) != dim or dim < 2:
        raise InputError(f"StatDP patterns need at least 2 queries, got dimension {dim!r}")
    dim = int(dim)
    half = dim // 2
    ones = [1] * dim
    return [
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
    ] if ordered else [])


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
