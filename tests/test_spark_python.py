"""Issue 33, finding 16: the Spark engine's local Python workers run the driver's own interpreter
(not the ``python3`` on PATH, which an empdp run by its path from a virtual environment that is
not activated does not share), unless the user chose one; a worker's failure is one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import QUERY, SAMPLE, run

pytest.importorskip("pyspark", reason="the Spark engine needs PySpark: pip install 'empdp[spark]'")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("the Spark engine needs Java (a JRE 17) on PATH or JAVA_HOME", allow_module_level=True)

from empdp.spark import spark_session  # noqa: E402
from empdp.spark.engine import SparkEngine  # noqa: E402
from empdp.spark.session import spark_failure  # noqa: E402

STUB_SAYS = "stub python3: not the driver's interpreter"


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory) -> str:
    """PATH with a ``python3`` (and ``python``) first that fails at once, as an interpreter without
    empdp and pyarrow fails Spark's workers."""
    folder = tmp_path_factory.mktemp("stubbin")
    for name in ("python3", "python"):
        stub = folder / name
        stub.write_text(f"#!/bin/sh\necho \"{STUB_SAYS}\" >&2\nexit 3\n")
        stub.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def _assess_on_spark(path: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_REMOTE")}
    environ.update(PATH=path, **env)
    cmd = [sys.executable, "-m", "empdp.cli.main", "assess", SAMPLE, *QUERY, "--bandwidth", "0.05",
           "--engine", "spark", "--json"]
    return subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=600)


def test_local_workers_run_the_drivers_python(stub_path):
    res = _assess_on_spark(stub_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"eps_all"' in res.stdout


def test_users_pyspark_python_is_kept_and_its_failure_is_one_line(stub_path):
    res = _assess_on_spark(stub_path, PYSPARK_PYTHON=shutil.which("python3", path=stub_path))
    assert res.returncode == 1, res.stderr[-3000:]
    # (Spark's JVM prints its log4j banner before empdp quiets it)
    assert res.stderr.splitlines()[-1] == f"Error: a Spark task failed: {STUB_SAYS}"
    assert "Traceback" not in res.stderr and "\tat org.apache" not in res.stderr and res.stdout == ""


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[1]", config={"spark.sql.shuffle.partitions": "1"})
    yield session
    session.stop()


def _failing_udf(spark):
    from pyspark.sql import functions as F

    # a lambda: cloudpickle ships it by value, the worker needs no module of the tests
    boom = F.udf(lambda x: int(f"boom {x}"), "long")
    return spark.range(1).select(boom("id")).collect()


def test_worker_exception_is_its_last_line(spark):
    with pytest.raises(Exception) as caught:
        _failing_udf(spark)
    assert len(str(caught.value).splitlines()) > 1  # Spark's own message: a traceback and more
    assert spark_failure(caught.value) == ("a Spark task failed: ValueError: invalid literal for int() with "
                                           "base 10: 'boom 0'")
    assert spark_failure(ValueError("not Spark's")) is None


def test_cli_reports_a_worker_failure_in_one_line(spark, monkeypatch):
    monkeypatch.setattr(SparkEngine, "_values", lambda self: _failing_udf(self.spark))
    res = run("assess", SAMPLE, *QUERY, "--bandwidth", "0.05", "--engine", "spark")
    assert res.exit_code == 1, res.output
    assert res.output == "Error: a Spark task failed: ValueError: invalid literal for int() with base 10: 'boom 0'\n"
