"""Per-coordinate log-ratio scores for MPL's score events (docs/method.md#91-mpl-a-lower-bound-on-pure-dp-epsilon).

When an output's coordinates u_1..u_d are independent under both inputs, its
log ratio is the sum Σ_j ln f_{x,j}(u_j) / f_{x′,j}(u_j) of the coordinates'
own log ratios, and each of those is a one-dimensional estimate: a binned log
ratio from stage-1 counts. The score is that sum, exact up to the binning where
the mechanism is a product of independent coordinates (parallel Laplace
copies, RAPPOR's bits, noisy histograms) and a good guess elsewhere. The
coordinates u are the raw outputs or their consecutive differences (prefix
sums are sums of independent terms), one table per coordinate or one pooled
table for all (exchangeable coordinates, where pooling multiplies the counts).

Like any score, it only chooses the event that stage 2 counts among fresh
outputs: a poor table weakens the bound, it never invalidates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import InputError

#: a value repeated in at least this share of a column's outputs is a bin of its own (codes such as
#: "below" or "aborted" among numeric answers, and the two values of a bit)
ATOM_SHARE = 0.01
#: most atoms per column
MAX_ATOMS = 8
#: rows on which a column's atoms are looked for (an atom of share 1% appears ~50 times in them)
ATOM_ROWS = 5000
#: the finest binning: quantile bins of the non-atom values; coarser ones merge neighbouring bins
FINE_BINS = 32
#: the bin counts tried (each divides FINE_BINS): few bins estimate a small per-coordinate loss
#: (parallel Laplace copies, ε = 0.005 each) with little noise, many resolve a loss that changes
#: within the output's range
BIN_COUNTS = (2, 8, 32)
#: most stage-1 rows the tables are counted on
FIT_ROWS = 200_000
#: integer coordinates spanning fewer values than this are binned by a table over their range (bits and
#: SVT's answer codes: a value's atom found by a branch per output cost RAPPOR's random bits 6 ns each,
#: against 2 for the table)
LOOKUP_RANGE = 1 << 12
#: pseudo-count added to every bin of both samples (keeps empty bins finite and shrinks rare ones to 0)
PSEUDO = 1.0


@dataclass
class Binning:
    """The fine bins of the coordinates u (raw outputs or differences; per column or one pooled binning)."""

    differences: bool
    pooled: bool
    atoms: list  # per column (or one, pooled): the atom values
    edges: list  # per column (or one): FINE_BINS - 1 quantile edges of the non-atom values (ties kept)

    def codes(self, outputs: np.ndarray) -> np.ndarray:
        """(n, d) fine bin index of every coordinate: its atom's index, else len(atoms) + its quantile bin
        (the number of its column's edges at or below it)."""
        from .compiled import bin_codes  # numba: loaded by the first vector output scored

        u = _coordinates(outputs, self.differences)
        if not self.pooled and u.shape[1] != len(self.atoms):  # (the compiled loop reads a row per column)
            raise InputError(f"mechanism returned outputs of {u.shape[1]} coordinates, where the outputs its "
                             f"audit began with had {len(self.atoms)}: a mechanism's outputs must keep one width")
        atoms, n_atoms, edges = self._tables
        if u.dtype.kind == "i" and u.size:  # integers of a narrow range: each value binned once, then looked up
            lo, hi = int(u.min()), int(u.max())
            if hi - lo < LOOKUP_RANGE:
                columns = atoms.shape[0]  # (one, pooled: its table serves every column)
                span = np.repeat(np.arange(lo, hi + 1, dtype=np.int64)[:, None], columns, axis=1)
                table = bin_codes(span, atoms, n_atoms, edges, np.empty(span.shape, dtype=np.int64))
                column = np.arange(u.shape[1]) if columns > 1 else np.zeros(u.shape[1], dtype=np.int64)
                return table.ravel()[(u - lo) * columns + column[None, :]]
        return bin_codes(u, atoms, n_atoms, edges, np.empty(u.shape, dtype=np.int64))

    @cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The atoms and edges as :func:`empdp.audit.compiled.bin_codes` reads them: a row per column
        (one, pooled), padded to the most of any column (edges with NaN)."""
        width = max([len(a) for a in self.atoms] + [1])
        atoms = np.zeros((len(self.atoms), width))
        for j, a in enumerate(self.atoms):
            atoms[j, :len(a)] = a
        n_atoms = np.array([len(a) for a in self.atoms], dtype=np.int64)
        edges = np.full((len(self.edges), max(len(e) for e in self.edges)), np.nan)
        for j, e in enumerate(self.edges):
            edges[j, :len(e)] = e
        return atoms, n_atoms, edges

    def counts(self, codes: np.ndarray) -> list:
        """Per column (one, pooled): the outputs in each fine bin, atoms first (counts add over chunks)."""
        if self.pooled:
            return [np.bincount(codes.ravel(), minlength=len(self.atoms[0]) + FINE_BINS)]
        return [np.bincount(codes[:, j], minlength=len(a) + FINE_BINS) for j, a in enumerate(self.atoms)]

    def tables(self, counts_x: list, counts_y: list, bins: int) -> list:
        """(d, size) binned log ratio ln(count_x / count_x′) over ``bins`` merged quantile bins, per fine
        bin, from the fine bins' :meth:`counts` of both samples."""
        merge = FINE_BINS // bins
        rows = []
        for j, atoms in enumerate(self.atoms):
            k = len(atoms)
            coarse = np.concatenate([np.arange(k), k + np.arange(FINE_BINS) // merge])
            nx, ny = (_merged(coarse, c[j], k + bins) for c in (counts_x, counts_y))
            rows.append(_shrunk(np.log(nx / nx.sum()) - np.log(ny / ny.sum()), 1 / nx + 1 / ny)[coarse])
        return rows

    def scores(self, counts_x: list, counts_y: list) -> list:
        return [RatioScore(self, b, self.tables(counts_x, counts_y, b)) for b in BIN_COUNTS]


def _merged(coarse: np.ndarray, fine: np.ndarray, size: int) -> np.ndarray:
    """The fine bins' counts summed into their ``coarse`` bins, plus PSEUDO each."""
    return np.bincount(coarse, weights=fine, minlength=size) + PSEUDO


@dataclass
class RatioScore:
    """s(t) = Σ_j r_j(u_j), r_j a binned log ratio (one table per column, or one pooled table)."""

    binning: Binning
    bins: int
    tables: list

    @property
    def name(self) -> str:
        b = self.binning
        return (f"{'pooled ' if b.pooled else ''}log ratios of the "
                f"{'differences' if b.differences else 'coordinates'} ({self.bins} bins)")

    def score(self, outputs: np.ndarray) -> np.ndarray:
        return self.score_codes(self.binning.codes(outputs))

    def score_codes(self, codes: np.ndarray) -> np.ndarray:
        if self.binning.pooled:
            return self.tables[0][codes].sum(axis=1)
        # the columns' tables end to end: one lookup for all coordinates
        offsets = np.cumsum([0] + [len(t) for t in self.tables[:-1]])
        return np.concatenate(self.tables)[codes + offsets[None, :]].sum(axis=1)


@dataclass
class PatternBinning:
    """The answer pattern of an output (which atom, or "a value", in each column: SVT's above / below /
    aborted) and the fine bins of the values (the per-column binning ``inner`` of the raw outputs)."""

    inner: Binning
    radix: np.ndarray  # per column: its number of atoms + 1 ("a value")
    patterns: np.ndarray  # sorted keys of the patterns seen in the fitting rows

    def codes(self, outputs: np.ndarray) -> np.ndarray:
        """(n, 1 + d): the pattern's index (len(patterns) if unseen), then the fine bin of every coordinate."""
        return self.codes_from_fine(self.inner.codes(outputs))

    def codes_from_fine(self, fine: np.ndarray) -> np.ndarray:
        keys = _pattern_keys(fine, self.radix)
        idx = np.minimum(np.searchsorted(self.patterns, keys), len(self.patterns) - 1)
        return np.column_stack([np.where(self.patterns[idx] == keys, idx, len(self.patterns)), fine])

    def counts(self, codes: np.ndarray) -> list:
        """The outputs of each pattern (the unseen ones last), then per column those whose value is in
        each fine bin (counts add over chunks)."""
        out = [np.bincount(codes[:, 0], minlength=len(self.patterns) + 1)]
        for j, atoms in enumerate(self.inner.atoms):
            c = codes[:, 1 + j]
            out.append(np.bincount(c[c >= len(atoms)] - len(atoms), minlength=FINE_BINS))
        return out

    def scores(self, counts_x: list, counts_y: list) -> list:
        return [PatternScore.fit(self, counts_x, counts_y, b) for b in BIN_COUNTS]


def _pattern_keys(fine: np.ndarray, radix: np.ndarray) -> np.ndarray:
    """Mixed-radix key of each row's pattern: per column its atom index, or radix − 1 for a value."""
    which = np.minimum(fine, radix[None, :] - 1)
    weights = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]]).astype(np.int64)
    return which.astype(np.int64) @ weights


@dataclass
class PatternScore:
    """s(t) = r(pattern of t) + Σ_{j a value} r_j(t_j | a value): the pattern's log ratio from its counts
    and each released value's log ratio given that it is a value (a joint law that is a pattern times
    independent values, as NumericalSVT's, is scored exactly up to the binning). The events combine the
    answers with the released values, where the loss of SVT3 and NumericalSVT mostly is."""

    binning: PatternBinning
    bins: int
    pattern_table: np.ndarray  # (patterns + 1,): the last, unseen patterns, scores 0
    value_tables: list  # per column, per fine bin (atoms 0)

    @property
    def name(self) -> str:
        return f"log ratios of the answer pattern and the values ({self.bins} bins)"

    def score(self, outputs: np.ndarray) -> np.ndarray:
        return self.score_codes(self.binning.codes(outputs))

    def score_codes(self, codes: np.ndarray) -> np.ndarray:
        offsets = np.cumsum([0] + [len(t) for t in self.value_tables[:-1]])
        values = np.concatenate(self.value_tables)[codes[:, 1:] + offsets[None, :]].sum(axis=1)
        return self.pattern_table[codes[:, 0]] + values

    @classmethod
    def fit(cls, binning: PatternBinning, counts_x: list, counts_y: list, bins: int) -> PatternScore:
        """The tables at ``bins`` value bins from both samples' :meth:`PatternBinning.counts`."""
        nx, ny = (c[0] + PSEUDO for c in (counts_x, counts_y))
        table = _shrunk(np.log(nx / nx.sum()) - np.log(ny / ny.sum()), 1 / nx + 1 / ny)
        table[-1] = 0.0
        coarse = np.arange(FINE_BINS) // (FINE_BINS // bins)
        values = []
        for j, atoms in enumerate(binning.inner.atoms):
            vx, vy = (_merged(coarse, c[1 + j], bins) for c in (counts_x, counts_y))
            ratio = _shrunk(np.log(vx / vx.sum()) - np.log(vy / vy.sum()), 1 / vx + 1 / vy)
            values.append(np.concatenate([np.zeros(len(atoms)), ratio[coarse]]))
        return cls(binning, bins, table, values)


#: most distinct answer patterns kept from the fitting rows (more are too thin to estimate one by one)
MAX_PATTERNS = 1 << 16


def pattern_binning(binning: Binning, codes_x: np.ndarray, codes_y: np.ndarray) -> PatternBinning | None:
    """The answer patterns over the per-column ``binning`` of the raw outputs (with its codes of the
    fitting rows), or None where no column has atoms (the per-column scores are then the same) or the
    patterns are too many."""
    radix = np.array([len(a) + 1 for a in binning.atoms], dtype=np.int64)
    if np.all(radix == 1) or np.sum(np.log2(radix.astype(float))) > 62:
        return None
    patterns = np.unique(np.concatenate([_pattern_keys(codes_x, radix), _pattern_keys(codes_y, radix)]))
    if len(patterns) > MAX_PATTERNS:
        return None
    return PatternBinning(binning, radix, patterns)


def _shrunk(ratio: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """Each bin's log ratio times max(0, 1 − var/ratio²) (positive-part James–Stein): a coordinate whose
    loss is nil (the four unchanged bins of a noisy histogram) adds its tables' noise to every output's
    score and blurs the event; shrunk, most of its bins add nothing."""
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(ratio != 0, np.maximum(0.0, 1 - variance / ratio ** 2), 0.0)
    return ratio * keep


def _coordinates(outputs: np.ndarray, differences: bool) -> np.ndarray:
    u = np.asarray(outputs)
    # integers stay integers (int64: differences of int8 codes would wrap)
    u = u.astype(np.int64) if u.dtype.kind in "biu" else u.astype(float)
    if differences:
        u = np.concatenate([u[:, :1], np.diff(u, axis=1)], axis=1)
    return u


def _column_binning(u: np.ndarray, v: np.ndarray):
    """Atoms and fine quantile edges of one column (or of the pooled columns) of both samples."""
    pooled = np.concatenate([u, v])
    found, counts = np.unique(pooled[:ATOM_ROWS], return_counts=True)
    atoms = found[counts >= ATOM_SHARE * min(len(pooled), ATOM_ROWS)][:MAX_ATOMS]
    plain = pooled[~np.isin(pooled, atoms)]
    plain = plain[np.isfinite(plain)]  # (differences that overflowed: a quantile between two infinities is NaN)
    if not plain.size:
        return atoms, np.full(FINE_BINS - 1, np.inf)  # every value an atom: the quantile bins stay empty
    return atoms, np.quantile(plain, np.arange(1, FINE_BINS) / FINE_BINS)


def fit_binning(x: np.ndarray, y: np.ndarray, differences: bool, pooled: bool) -> Binning:
    u, v = _coordinates(x, differences), _coordinates(y, differences)
    if pooled:
        parts = [_column_binning(u.ravel(), v.ravel())]
    else:
        parts = [_column_binning(u[:, j], v[:, j]) for j in range(u.shape[1])]
    atoms, edges = (list(p) for p in zip(*parts))
    return Binning(differences, pooled, atoms, edges)


class TableScores:
    """The scores of :func:`ratio_scores` from counts that add up over chunks of outputs.

    The binnings (the raw coordinates per column and pooled, the differences per column) and the
    answer patterns are fixed by the first chunk (at most FIT_ROWS outputs of each sample); every
    chunk, the first included, adds its fine bins' counts. So the tables can be counted on millions
    of outputs streamed in chunks, one held at a time (MPL's refit, :func:`empdp.audit.mpl._refit`), where
    stage 1's tables were counted on the outputs it holds: svt3's best events are values released
    late, about 1 output in 5,000, and their bins' log ratios are noise at stage 1's 200,000.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray):
        x, y = x[:FIT_ROWS], y[:FIT_ROWS]
        self.width = x.shape[1]
        self.binnings = []
        codes = []
        for differences, pooled in ((False, False), (False, True), (True, False)):
            binning = fit_binning(x, y, differences, pooled)
            self.binnings.append(binning)
            codes.append((binning.codes(x), binning.codes(y)))
            if not (differences or pooled):
                patterns = pattern_binning(binning, *codes[-1])
                if patterns is not None:
                    self.binnings.append(patterns)
                    codes.append(tuple(patterns.codes_from_fine(c) for c in codes[-1]))
        self.counts = [[b.counts(c) for b, c in zip(self.binnings, side)] for side in zip(*codes)]

    def codes(self, outputs: np.ndarray) -> np.ndarray:
        """(n, columns) every binning's codes of ``outputs`` side by side (a pattern binning's from its
        per-column binning's), as int32 (a chunk's codes are several times its outputs' width)."""
        out = []
        for binning in self.binnings:
            out.append(binning.codes_from_fine(out[-1]) if isinstance(binning, PatternBinning)
                       else binning.codes(outputs))
        return np.concatenate(out, axis=1).astype(np.int32)

    def split(self, codes: np.ndarray) -> list:
        """:meth:`codes` side by side, split into each binning's (views)."""
        return np.split(codes, np.cumsum(self._widths())[:-1], axis=1)

    def _widths(self) -> list[int]:
        return [self.width + isinstance(b, PatternBinning) for b in self.binnings]  # (a pattern's first)

    @property
    def columns(self) -> int:
        """The columns of :meth:`codes`."""
        return sum(self._widths())

    def add(self, codes_x: np.ndarray, codes_y: np.ndarray) -> None:
        """Add a chunk's counts, from its :meth:`codes` in both samples."""
        for side, codes in zip(self.counts, (codes_x, codes_y)):
            for k, (binning, c) in enumerate(zip(self.binnings, self.split(codes))):
                side[k] = [a + b for a, b in zip(side[k], binning.counts(c))]

    def scores(self) -> list[tuple[Binning | PatternBinning, list]]:
        """Per binning, its scores at every BIN_COUNTS, from the counts so far."""
        return [(b, b.scores(cx, cy)) for b, cx, cy in zip(self.binnings, *self.counts)]


def ratio_scores(x: np.ndarray, y: np.ndarray) -> list[tuple[Binning | PatternBinning, list]]:
    """The scores of vector outputs ``x`` (from x) and ``y`` (from x′), fitted on their first FIT_ROWS,
    grouped by binning: the raw coordinates per column and pooled, and the differences per column, each
    at every BIN_COUNTS, and where some column has atoms, the answer pattern with the values
    (:class:`PatternScore`)."""
    return TableScores(x, y).scores()
