"""The Spark engine (docs/spark.md): the same assessment on a cluster.

:func:`make_spark_engine` opens a source on Spark and returns a :class:`SparkEngine` with the
interface of :class:`empdp.loo.LooEngine`; :func:`evaluate_on_executors` evaluates the exact
ε_i and δ_i(ε) of candidates on the executors (:func:`evaluate_buckets_on_executors`: per adversary
bucket). Needs ``pip install "empdp[spark]"`` and Java.
"""

from .engine import SparkEngine, make_spark_engine, open_spark_source
from .executors import evaluate_buckets_on_executors, evaluate_on_executors
from .session import SparkPanel, group_cells, group_condition, spark_session

__all__ = ["SparkEngine", "SparkPanel", "evaluate_buckets_on_executors", "evaluate_on_executors", "group_cells",
           "group_condition", "make_spark_engine", "open_spark_source", "spark_session"]
