"""Exact ε_i and δ_i(ε) of candidates on Spark's executors (docs/spark.md).

The candidates' Δ rows never reach the driver: the persisted Δ table is joined with the
candidates, cut into fixed blocks of consecutive candidates, and each block is made dense and
passed to :func:`empdp.risk.evaluate` in a Python worker (``applyInPandas``), with the density
model shipped to the executors once per task in the function's closure. Only (row, ε_i, δ_i(ε))
come back. A block holds the same individuals as ``codes[b·B:(b+1)·B]``, so the results are
exactly those of ``risk.evaluate`` run locally on those blocks.
"""

from __future__ import annotations

import numpy as np

from ..density import DensityModel

#: candidates per block evaluated by one Python worker call (the risk layer's own block size)
BLOCK_ROWS = 8192


def _block_evaluator(model: DensityModel, n: int, total: int, eps: np.ndarray | None, need_eps_i: bool,
                     block_rows: int, cols: tuple):
    """The pandas function applied to one block's sparse (row, j, delta, undef) rows."""

    def evaluate_block(pdf):
        import pandas as pd
        from threadpoolctl import threadpool_limits

        from empdp import risk

        rows = pdf["__row"].to_numpy()
        first = int(rows.min()) // block_rows * block_rows
        count = min(block_rows, total - first)
        dense = np.zeros((count, n))
        ok = ~pdf["undef"].to_numpy(dtype=bool)
        dense[rows[ok] - first, pdf["__j"].to_numpy()[ok]] = pdf["delta"].to_numpy()[ok]
        # single-threaded BLAS as in assess: the executor's cores run tasks side by side
        with threadpool_limits(limits=1, user_api="blas"):
            eps_i, delta, exact = risk.evaluate(model, dense, eps, need_eps_i=need_eps_i, return_exact=True)
        out = {"__row": np.arange(first, first + count, dtype=np.int64), "eps_i": eps_i, "exact": exact}
        if eps is not None:
            out["delta"] = list(delta)
        return pd.DataFrame(out)[list(cols)]

    return evaluate_block


def evaluate_on_executors(engine, model: DensityModel, codes: np.ndarray, eps: np.ndarray | None,
                          need_eps_i: bool = True, block_rows: int = BLOCK_ROWS, return_exact: bool = False):
    """ε_i and δ_i(ε) of the individuals ``codes`` of a screened :class:`SparkEngine`, on the executors.

    Returns ``(eps_i, delta)``: arrays in ``codes`` order, ``delta`` of shape (len(codes), len(eps))
    (None without ``eps``), equal to ``risk.evaluate(model, engine.shifts(block), eps, ...)`` on
    each block ``codes[b·block_rows:(b+1)·block_rows]``. Individuals absent everywhere in the Δ
    table (none, for codes from the screen) get ε_i = 0 and δ_i = 0. ``return_exact`` adds a
    third array: which rows were evaluated exactly (see :func:`empdp.risk.evaluate`).
    """
    from pyspark.sql import functions as F

    from .session import _collect

    codes = np.asarray(codes, dtype=np.int64)
    n = len(engine.panel.labels)
    eps = None if eps is None else np.asarray(eps, dtype=np.float64)
    eps_i = np.zeros(len(codes))
    delta = None if eps is None else np.zeros((len(codes), len(eps)))
    exact = np.zeros(len(codes), dtype=bool)
    if not len(codes):
        return (eps_i, delta, exact) if return_exact else (eps_i, delta)
    rows = engine.shift_rows(codes).withColumn("__block", (F.col("__row") / block_rows).cast("long"))
    schema = "__row long, eps_i double, exact boolean" + ("" if eps is None else ", delta array<double>")
    cols = ("__row", "eps_i", "exact") + (() if eps is None else ("delta",))
    fn = _block_evaluator(model, n, len(codes), eps, need_eps_i, block_rows, cols)
    result = rows.groupBy("__block").applyInPandas(fn, schema=schema)
    tab = engine._run(lambda: _collect(result))
    at = np.asarray(tab.column("__row").to_numpy(zero_copy_only=False), dtype=np.int64)
    eps_i[at] = np.asarray(tab.column("eps_i").to_numpy(zero_copy_only=False), dtype=np.float64)
    exact[at] = np.asarray(tab.column("exact").to_numpy(zero_copy_only=False), dtype=bool)
    if eps is not None:
        flat = tab.column("delta").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        delta[at] = np.asarray(flat, dtype=np.float64).reshape(len(at), len(eps))
    return (eps_i, delta, exact) if return_exact else (eps_i, delta)
