"""Exact ε_i and δ_i(ε) of candidates on Spark's executors (docs/spark.md).

The candidates' Δ rows never reach the driver: the persisted Δ table is joined with the
candidates, cut into fixed blocks of consecutive candidates, and each block is made dense and
passed to :func:`empdp.risk.evaluate` in a Python worker (``applyInPandas``), with the density
model shipped to the executors once per task in the function's closure. Only (row, ε_i, δ_i(ε))
come back. A block holds the same individuals as ``codes[b·B:(b+1)·B]``, so the results are
exactly those of ``risk.evaluate`` run locally on those blocks. With an adversary
(:func:`evaluate_buckets_on_executors`) each block runs :func:`empdp.risk.buckets.bucket_risk`
with every bucket's model instead.
"""

from __future__ import annotations

import numpy as np

from ..density import DensityModel
from ..risk.buckets import bucket_risk

#: candidates per block evaluated by one Python worker call (the risk layer's own block size)
BLOCK_ROWS = 8192


def _block_evaluator(evaluate, n: int, total: int, block_rows: int, cols: tuple):
    """The pandas function applied to one block's sparse (row, j, delta, undef) rows: the block made
    dense, ``evaluate(dense)`` (a dict of per-row columns) and the block's row numbers."""

    def evaluate_block(pdf):
        import pandas as pd
        from threadpoolctl import threadpool_limits

        rows = pdf["__row"].to_numpy()
        first = int(rows.min()) // block_rows * block_rows
        count = min(block_rows, total - first)
        dense = np.zeros((count, n))
        ok = ~pdf["undef"].to_numpy(dtype=bool)
        dense[rows[ok] - first, pdf["__j"].to_numpy()[ok]] = pdf["delta"].to_numpy()[ok]
        # single-threaded BLAS as in assess: the executor's cores run tasks side by side
        with threadpool_limits(limits=1, user_api="blas"):
            out = evaluate(dense)
        out = {"__row": np.arange(first, first + count, dtype=np.int64),
               **{k: (list(v) if np.ndim(v) == 2 else v) for k, v in out.items()}}
        return pd.DataFrame(out)[list(cols)]

    return evaluate_block


def _run_blocks(engine, codes: np.ndarray, evaluate, schema: str, block_rows: int):
    """``evaluate`` on the executors, block by block of the individuals ``codes``; the Arrow table of
    (__row, the columns of ``schema``) and, per row, the position of each result row in ``codes``."""
    from pyspark.sql import functions as F

    from .session import _collect

    n = len(engine.panel.labels)
    cols = ("__row",) + tuple(part.split()[0] for part in schema.split(", "))
    rows = engine.shift_rows(codes).withColumn("__block", (F.col("__row") / block_rows).cast("long"))
    fn = _block_evaluator(evaluate, n, len(codes), block_rows, cols)
    result = rows.groupBy("__block").applyInPandas(fn, schema="__row long, " + schema)
    tab = engine._run(lambda: _collect(result))
    return tab, np.asarray(tab.column("__row").to_numpy(zero_copy_only=False), dtype=np.int64)


def _column(tab, name: str, dtype) -> np.ndarray:
    return np.asarray(tab.column(name).to_numpy(zero_copy_only=False), dtype=dtype)


def _matrix(tab, name: str, width: int) -> np.ndarray:
    """An ``array<double>`` column as a (rows, width) matrix."""
    flat = tab.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float64).reshape(tab.num_rows, width)


def evaluate_on_executors(engine, model: DensityModel, codes: np.ndarray, eps: np.ndarray | None,
                          need_eps_i: bool = True, block_rows: int = BLOCK_ROWS, return_exact: bool = False):
    """ε_i and δ_i(ε) of the individuals ``codes`` of a screened :class:`SparkEngine`, on the executors.

    Returns ``(eps_i, delta)``: arrays in ``codes`` order, ``delta`` of shape (len(codes), len(eps))
    (None without ``eps``), equal to ``risk.evaluate(model, engine.shifts(block), eps, ...)`` on
    each block ``codes[b·block_rows:(b+1)·block_rows]``. Individuals absent everywhere in the Δ
    table (none, for codes from the screen) get ε_i = 0 and δ_i = 0. ``return_exact`` adds a
    third array: which rows were evaluated exactly (see :func:`empdp.risk.evaluate`).
    """
    codes = np.asarray(codes, dtype=np.int64)
    eps = None if eps is None else np.asarray(eps, dtype=np.float64)
    eps_i = np.zeros(len(codes))
    delta = None if eps is None else np.zeros((len(codes), len(eps)))
    exact = np.zeros(len(codes), dtype=bool)
    if len(codes):
        def evaluate(dense):
            from empdp import risk

            e, d, x = risk.evaluate(model, dense, eps, need_eps_i=need_eps_i, return_exact=True)
            return {"eps_i": e, "exact": x, **({} if eps is None else {"delta": d})}

        schema = "eps_i double, exact boolean" + ("" if eps is None else ", delta array<double>")
        tab, at = _run_blocks(engine, codes, evaluate, schema, block_rows)
        eps_i[at] = _column(tab, "eps_i", np.float64)
        exact[at] = _column(tab, "exact", bool)
        if eps is not None:
            delta[at] = _matrix(tab, "delta", len(eps))
    return (eps_i, delta, exact) if return_exact else (eps_i, delta)


def evaluate_buckets_on_executors(engine, buckets: list, codes: np.ndarray, eps: np.ndarray | None,
                                  block_rows: int = BLOCK_ROWS):
    """:func:`empdp.risk.buckets.bucket_risk` of the individuals ``codes`` of a screened
    :class:`SparkEngine`, on the executors: the adversary buckets' models travel in the function,
    the candidates' Δ rows stay on the cluster.

    Returns ``(eps_i, delta, which, per_bucket_eps)`` in ``codes`` order, as ``bucket_risk`` on the
    dense rows of ``codes`` (``delta`` None without ``eps``).
    """
    codes = np.asarray(codes, dtype=np.int64)
    eps = None if eps is None else np.asarray(eps, dtype=np.float64)
    k = len(buckets)
    eps_i, which, per = np.zeros(len(codes)), np.zeros(len(codes), dtype=np.int64), np.zeros((len(codes), k))
    delta = None if eps is None else np.zeros((len(codes), len(eps)))
    if len(codes):
        def evaluate(dense):
            e, d, w, p = bucket_risk(buckets, dense, eps)
            return {"eps_i": e, "which": w, "per": p, **({} if eps is None else {"delta": d})}

        schema = "eps_i double, which long, per array<double>" + ("" if eps is None else ", delta array<double>")
        tab, at = _run_blocks(engine, codes, evaluate, schema, block_rows)
        eps_i[at], which[at] = _column(tab, "eps_i", np.float64), _column(tab, "which", np.int64)
        per[at] = _matrix(tab, "per", k)
        if eps is not None:
            delta[at] = _matrix(tab, "delta", len(eps))
    return eps_i, delta, which, per
