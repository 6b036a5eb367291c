"""Adversarial knowledge: risk conditional on a statistic of each database the adversary knows.

Burchard et al. (2020), section 4: when the adversary knows g(X) of each database (its size, a
total, the season), the guarantee must hold conditionally on that knowledge. The databases are
sorted by g and cut into K contiguous buckets of near-equal size (ties kept in database order;
``numpy.array_split`` sizes); each bucket B is one piece of knowledge Z. Within a bucket the
curator's model is the one of the plain assessment, fitted to the bucket's query values
(bandwidths chosen within the bucket, or the one ``bandwidth`` given), paired across individuals:

    δ_i^B(ε), ε_i^B   as in the plain assessment, on {q_j : j ∈ B} and {q_j − Δ_ij : j ∈ B}
    δ_i(ε) = max_B δ_i^B(ε),   ε_i = max_B ε_i^B

and δ, δ*, ε_all and the sweep follow from these. Screening bounds per bucket, max over buckets:
M_i = max_B max_{j∈B} |Δ_ij| / b_j^B (the leave-one-out engine computes it with the per-database
scales). See ``docs/method.md`` ("Adversarial knowledge").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..density import DensityModel, select_density
from ..engines import engine_of
from ..errors import InputError
from ..io import jsonable
from ..risk.buckets import bucket_risk
from . import checks

#: databases a bucket should hold at least (fewer: the bucket's density estimate is unreliable)
MIN_BUCKET = checks.MIN_DATABASES  # the one threshold of "too few databases" (assessment.checks)
#: the default number of buckets is at most this
MAX_DEFAULT_BUCKETS = 5
#: rows evaluated together (dense shifts of one block, each bucket's columns in turn)
BLOCK_ROWS = 4096


@dataclass
class Bucket:
    """One piece of adversary knowledge: the databases whose statistic g lies in [lo, hi]."""

    databases: np.ndarray  # column indices, in database order
    lo: float
    hi: float
    model: DensityModel
    eps_all: float = 0.0

    def to_dict(self, labels) -> dict:
        return {"lo": self.lo, "hi": self.hi, "n_databases": int(len(self.databases)),
                "eps_all": self.eps_all, "databases": [jsonable(labels[j]) for j in self.databases],
                "bandwidth": float(self.model.scale)}


def default_buckets(n: int) -> int:
    """The largest K ≤ 5 that keeps at least 10 databases per bucket (1 below 20 databases)."""
    return max(1, min(MAX_DEFAULT_BUCKETS, n // MIN_BUCKET))


def split_buckets(g: np.ndarray, k: int) -> list[np.ndarray]:
    """Database indices sorted by g (stable: ties in database order), cut into ``k`` near-equal parts."""
    order = np.argsort(np.asarray(g, dtype=float), kind="stable")
    return [np.sort(part) for part in np.array_split(order, k)]


def check_buckets(k, n: int) -> int:
    if k is None:
        return default_buckets(n)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n // 2:
        raise InputError(f"`buckets` must be a whole number from 1 to {n // 2} (each bucket needs at least 2 "
                         f"of the {n} databases), got {k!r}", param="buckets")
    return int(k)


def align_statistic(g_labels, g_values, labels, statistic: str) -> np.ndarray:
    """The adversary statistic per database of the assessment (``labels``), checked."""
    by_label = dict(zip([str(v) for v in g_labels], np.asarray(g_values, dtype=float)))
    missing = [v for v in labels if str(v) not in by_label]
    if missing:
        raise InputError(f"the adversary statistic {statistic} is not defined on database {missing[0]!r}; "
                         "it must have a value on every database")
    g = np.array([by_label[str(v)] for v in labels])
    bad = np.flatnonzero(~np.isfinite(g))
    if len(bad):
        raise InputError(f"the adversary statistic {statistic} is NULL or not finite on database "
                         f"{labels[bad[0]]!r} ({len(bad)} database(s)); choose a statistic defined on every database")
    if np.ptp(g) == 0:
        raise InputError(f"the adversary statistic {statistic} is the same ({g[0]:g}) on every database, so it "
                         "tells the adversary nothing; assess without `adversary`", param="adversary")
    return g


def read_statistic(source, labels, *, id: str, by: str, adversary: str | None, adversary_sql: str | None,
                   engine="duckdb", drop_null_ids: bool = False) -> tuple[np.ndarray, str]:
    """g on every database of the assessment (``labels``) and its description, computed by the engine
    the assessment reads with (an engine object or name, :mod:`empdp.engines`): only one number per
    database leaves it."""
    from ..data.guard import check_select
    if adversary_sql is not None:  # named as the user gave it (the engine would say --sql)
        check_select(adversary_sql.strip().rstrip(";").strip(), "adversary_sql")
    knows = engine_of(engine).open(source, id=id, by=by, query=adversary, sql=adversary_sql,
                                   drop_null_ids=drop_null_ids)
    statistic = knows.query.describe()
    try:
        values = knows.values()
    except InputError as exc:
        raise InputError(f"the adversary statistic {statistic}: {exc}", param=exc.param) from None
    finally:
        knows.close()
    return align_statistic(knows.panel.labels, values, labels, statistic), statistic


def fit_buckets(q: np.ndarray, g: np.ndarray, k: int, *, kernel: str, bandwidth) -> tuple[list[Bucket], list]:
    """The buckets and their models; warnings for buckets under :data:`MIN_BUCKET` databases."""
    buckets = []
    for cols in split_buckets(g, k):
        model = select_density(q[cols], kernel=kernel, bandwidth=bandwidth)
        buckets.append(Bucket(cols, float(g[cols].min()), float(g[cols].max()), model))
    small = [len(b.databases) for b in buckets if len(b.databases) < MIN_BUCKET]
    warnings = []
    if small:
        warnings.append(f"{len(small)} of the {k} adversary bucket(s) hold fewer than {MIN_BUCKET} databases "
                        f"(sizes {', '.join(str(len(b.databases)) for b in buckets)}): their density estimates, "
                        "and so the conditional risk, rest on little data")
    return buckets, warnings


def scales(buckets: list[Bucket], n: int) -> np.ndarray:
    """Per-database kernel scale b_j of its bucket's model (for the screening bound M_i)."""
    out = np.empty(n)
    for b in buckets:
        out[b.databases] = b.model.bandwidths
    return out


def assess_buckets(engine, q: np.ndarray, buckets: list[Bucket], eps: np.ndarray | None, *,
                   default_epsilons, fetch_rows: int, progress) -> dict:
    """Exact conditional risk of every individual that needs it (screening with M_i).

    ``eps`` None: the sweep is chosen from the conditional ε_all by ``default_epsilons``.
    """
    n = len(q)
    screen = engine.screen(scales(buckets, n))
    m = len(screen)
    undefined = screen.undefined
    definable = np.flatnonzero(~undefined)
    exact = all(b.model.kernel.exact_eps for b in buckets)  # ε_i exact: screening by M_i
    eps_i = np.full(m, np.nan)
    eps_i[undefined] = np.inf
    which = np.full(m, -1, dtype=np.int64)
    per_bucket = np.zeros(len(buckets))
    bound = np.where(undefined, np.inf, screen.bound)

    def run(codes, with_eps, stage):
        """Evaluate ``codes`` (fetched in as few scans as fit in memory); δ only ``with_eps``."""
        if engine.on_executors:
            return run_on_executors(codes, with_eps, stage)
        out = np.zeros((len(codes), len(eps))) if with_eps else None
        for a in range(0, len(codes), fetch_rows):
            chunk = codes[a:a + fetch_rows]
            rows = engine.shifts(chunk)
            for s in range(0, len(chunk), BLOCK_ROWS):
                e, d, w, per = bucket_risk(buckets, rows[s:s + BLOCK_ROWS], eps if with_eps else None)
                sel = chunk[s:s + BLOCK_ROWS]
                eps_i[sel], which[sel] = e, w
                per_bucket[:] = np.maximum(per_bucket, per.max(axis=0, initial=0.0))
                if with_eps:
                    out[a + s:a + s + len(sel)] = d
                progress(stage, a + s + len(sel), len(codes))
        return out

    def run_on_executors(codes, with_eps, stage):
        """Spark: every bucket's model goes to the executors, the candidates' Δ rows stay there."""
        e, out, w, per = engine.evaluate_buckets(buckets, codes, eps if with_eps else None)
        eps_i[codes], which[codes] = e, w
        per_bucket[:] = np.maximum(per_bucket, per.max(axis=0, initial=0.0))
        progress(stage, len(codes), len(codes))
        return out

    # ε_all: exact ε_i in decreasing order of the bound until the bound cannot beat the best so far
    # (Gaussian log-ratios have no finite bound: every individual is evaluated)
    order = definable[np.argsort(-bound[definable], kind="stable")]
    eps_all, pos, batch = 0.0, 0, 256
    while pos < len(order) and (not exact or bound[order[pos]] > eps_all):
        todo = order[pos:pos + batch]
        run(todo, False, "eps_all")
        eps_all = max(eps_all, float(np.nanmax(eps_i[todo], initial=0.0)))
        pos, batch = pos + len(todo), batch * 2
    if eps is None:
        eps = default_epsilons(eps_all)
    eps = np.asarray(eps, dtype=float)
    need = definable[bound[definable] > eps[0]] if exact else definable
    delta = np.zeros((m, len(eps)))
    if len(need):
        delta[need] = run(need, True, "delta_i")
    delta[undefined] = 1.0
    if exact:  # δ_i(ε) = 0 for ε ≥ ε_i
        known = np.isfinite(eps_i)
        delta[known] = np.where(eps_i[known, None] <= eps[None, :], 0.0, delta[known])
    rest = definable[np.isnan(eps_i[definable])]  # screened out of both stages: their ε_i (and bucket) too,
    if len(rest):                                   # so that every row of the table is complete, as without
        run(rest, False, "eps_i")                   # an adversary
    for k, b in enumerate(buckets):
        b.eps_all = float(per_bucket[k])
    return dict(screen=screen, eps=eps, eps_i=eps_i, delta=delta, which=which, eps_all=eps_all,
                n_evaluated=int(np.isfinite(eps_i[definable]).sum()))


def summary(buckets: list[Bucket], labels, statistic: str, unconditional) -> dict:
    """The JSON ``adversary`` object."""
    return {"statistic": statistic,
            "buckets": [b.to_dict(labels) for b in buckets],
            "unconditional": {"eps_all": jsonable(unconditional.eps_all),
                              "sweep": [{"epsilon": float(e), "delta": float(d), "total_risk": float(t),
                                         "n_at_risk": int(c)}
                                        for e, d, t, c in zip(unconditional.epsilons, unconditional.delta,
                                                              unconditional.total_risk, unconditional.n_at_risk)]}}


def bucket_column(which: np.ndarray, eps_i: np.ndarray) -> pl.Series:
    """The bucket that sets each individual's ε_i (null where ε_i is 0, unknown or infinite)."""
    ok = (which >= 0) & np.isfinite(eps_i) & (np.nan_to_num(eps_i) > 0)
    return pl.Series("bucket", np.where(ok, which, 0), dtype=pl.Int64).set(pl.Series(~ok), None) \
        if (~ok).any() else pl.Series("bucket", which, dtype=pl.Int64)
