"""Pairs of databases to audit: the defaults, the StatDP patterns, and checks of given pairs."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .common import short
from .mechanisms import Mechanism
from .patterns import statdp_patterns

#: Number of queries of the StatDP patterns for a user sampler given ``pairs="patterns"``.
USER_PATTERN_DIM = 5
#: Most queries (entries of a query or bit vector) audited: every output holds one answer per
#: query, so n outputs of K answers take 8·n·K bytes
MAX_QUERIES = 1000

_NO_PATTERNS = {
    "records": "its database is one value per individual and it releases a statistic of them "
               "(a sum or mean), not one answer per query",
    "bits": "its database is a vector of 0/1 bits, and the patterns' values 0, 1, 2 are not all bits",
    "histogram": "its database is a histogram, whose neighbours differ by one in one bin, not in every "
                 "entry as the patterns' do",
    "value": "its database is one value, hashed into a Bloom filter",
}


def resolve_pairs(mechanism: Mechanism, pairs, kind: str) -> list:
    """Pairs to audit: given pairs, ``"patterns"``/``"patterns:K"``, or the mechanism's defaults.

    ``"patterns"`` are the StatDP input patterns (``statdp_patterns``) for K queries:
    the built-in's number of queries (scaled to its sensitivity), or K = 5 for a user
    sampler; ``"patterns:K"`` sets K. Built-ins whose database is not a query vector
    (a statistic of records, or bits) reject them. Every database must be a number
    or a flat list of finite numbers; for built-ins on query or bit vectors x and
    x′ must have the same length (and the length the mechanism is calibrated for),
    and bits must be 0 or 1. User samplers may compare databases of different
    lengths (add/remove-one neighbours).
    """
    if isinstance(pairs, str):
        pairs = _patterns(mechanism, pairs)
    elif pairs is None:
        pairs = mechanism.mpl_pairs if kind == "mpl" else mechanism.renyi_pairs
        if pairs is None:
            pairs = mechanism.mpl_pairs or mechanism.renyi_pairs
        if pairs is None:
            raise InputError(f"mechanism {mechanism.name!r} has no default pairs; give `pairs`", param="pairs")
    elif isinstance(pairs, np.ndarray):
        pairs = pairs.tolist()
    elif not isinstance(pairs, (list, tuple)):
        raise InputError(f"pairs must be a list of [x, x_prime], 'patterns' or 'patterns:K', "
                         f"got {short(pairs)}")
    pairs = list(pairs)
    if not pairs:
        raise InputError("no pairs of databases given")
    for i, item in enumerate(pairs):
        _check_pair(mechanism, i, item)
    return pairs


def _patterns(mechanism: Mechanism, spec: str) -> list:
    """The StatDP patterns for ``"patterns"`` or ``"patterns:K"`` (see ``resolve_pairs``)."""
    name, sep, dim = spec.partition(":")
    if name != "patterns":
        raise InputError(f"pairs must be a list of [x, x_prime], 'patterns' (StatDP patterns for the "
                         f"built-in's number of queries, {USER_PATTERN_DIM} for a user sampler) or "
                         f"'patterns:K' (K queries), got {short(spec)}")
    if mechanism.inputs in _NO_PATTERNS:
        raise InputError(f"StatDP patterns do not apply to mechanism {mechanism.name!r}: "
                         f"{_NO_PATTERNS[mechanism.inputs]}; audit its default pairs (give no pairs) "
                         "or give a list of [x, x_prime] pairs (a JSON file for --pairs)")
    if sep:
        try:
            k = int(dim)
        except ValueError:
            raise InputError(f"'patterns:K' needs an integer number of queries K, got {short(dim)}") from None
        if not 1 <= k <= MAX_QUERIES:
            raise InputError(f"'patterns:K' needs 1 <= K <= {MAX_QUERIES:,} queries, got {k:,}: every output is a "
                             f"vector of K answers, so K = {k:,} would not fit in memory")
    else:
        k = mechanism.pattern_dim or USER_PATTERN_DIM
    sens = mechanism.params.get("sensitivity", 1.0) if mechanism.inputs == "queries" else 1.0
    return statdp_patterns(k, ordered=mechanism.ordered_queries, sensitivity=sens)


def _database(db, where: str) -> np.ndarray:
    """A database as a 0-d or 1-d float array, or InputError if it is not a number or flat list."""
    bad = InputError(f"{where}: a database must be a number or a flat list of finite numbers "
                     f"(e.g. 3 or [0, 1, 1]), got {short(db)}")
    if db is None or isinstance(db, (str, bytes, dict, set)):
        raise bad
    try:
        arr = np.asarray(db)
    except (ValueError, TypeError):  # ragged nesting
        raise bad from None
    if arr.dtype.kind not in "biuf" or arr.ndim > 1 or not np.all(np.isfinite(arr)):
        raise bad
    return arr


def _check_pair(mechanism: Mechanism, i: int, item) -> None:
    where = f"pairs[{i}]"
    if not (isinstance(item, (list, tuple)) and len(item) == 2):
        raise InputError(f"{where}: each pair must be [x, x_prime], got {short(item)}")
    x, y = (_database(db, where) for db in item)
    kind = mechanism.inputs
    if kind not in ("queries", "bits", "histogram"):
        return
    what = {"queries": "query answers", "bits": "bits", "histogram": "histogram bins"}[kind]

    def size(a):
        return "a number" if a.ndim == 0 else f"{a.size} entries"

    if x.shape != y.shape:
        raise InputError(f"{where}: x and x_prime must have the same length for {mechanism.name!r} (its "
                         f"database is a vector of {what}, compared entry by entry), got {size(x)} and "
                         f"{size(y)}")
    if x.size == 0:
        raise InputError(f"{where}: mechanism {mechanism.name!r} needs at least one entry in a database")
    if x.size > MAX_QUERIES:
        raise InputError(f"{where}: {x.size:,} {what} are more than the {MAX_QUERIES:,} an audit can sample "
                         f"(each output is a vector of that length); audit fewer queries")
    if mechanism.input_length is not None and x.size != mechanism.input_length:
        raise InputError(f"{where}: mechanism {mechanism.name!r} is calibrated for "
                         f"{mechanism.input_length} {what}, got {size(x)}")
    if kind == "bits" and not (np.isin(x, (0, 1)).all() and np.isin(y, (0, 1)).all()):
        raise InputError(f"{where}: mechanism {mechanism.name!r} takes bits (0 or 1), got "
                         f"{short(item[0])} and {short(item[1])}")
