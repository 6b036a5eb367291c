"""Spark side of the data layer: a session, the user's source as a DataFrame, and a validated panel.

Only :mod:`empdp.spark` talks to Spark. A :class:`SparkPanel` plays the part of
:class:`empdp.data.Panel` for the Spark engine: the source DataFrame, the names of the id and
database-label columns, the labels in order, and :meth:`SparkPanel.base` (the rows a query
reads, with the 0-based database index ``__j`` and the id as ``__i``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

import pyarrow as pa

from ..data import clip, shorten
from ..data.panel import Source, check_databases, file_format
from ..errors import InputError

#: seconds allowed to open a TCP connection to a Spark master or Spark Connect server
CONNECT_TIMEOUT = 5.0
#: Spark Connect's default port (sc://HOST without a port)
CONNECT_PORT = 15002


def require_pyspark():
    """Import PySpark, or one line saying how to install it."""
    try:
        import pyspark  # noqa: F401
        from pyspark.sql import SparkSession  # noqa: F401
    except ImportError:
        raise InputError('the Spark engine needs PySpark >= 3.5: pip install "empdp[spark]"') from None
    # PySpark warns about pandas 3 at every pandas UDF; the engine's UDFs use plain columns only
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    return pyspark


#: a Java exception's class name before its message (Py4J errors quote the JVM's)
_JAVA_CLASS = re.compile(r"^:?\s*(?:[A-Za-z_$][\w$]*\.)+[\w$]*(?:Exception|Error):\s*")


def first_line(exc: BaseException) -> str:
    """The first meaningful line of a Spark/Py4J error (they run to hundreds of lines), without
    Py4J's "An error occurred while calling o123.load." and the Java exception's class name."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = _JAVA_CLASS.sub("", line.strip()).strip(": ")
        if line and not line.startswith(("JVM stacktrace", "Traceback", "An error occurred while calling")):
            return clip(line, 300)
    return type(exc).__name__


def _require_reachable(url: str, what: str, default_port: int) -> None:
    """Refuse a master or Spark Connect URL whose host:port does not accept a TCP connection.

    Spark itself waits (a standalone master) or retries for minutes (Spark Connect) before it
    gives up; a connection attempt with a short timeout says the same thing at once.
    """
    parsed = urlparse(url)
    hosts = (parsed.netloc or parsed.path).split("/")[0]
    for host_port in hosts.split(","):  # spark://h1:7077,h2:7077 (standby masters)
        host, _, port = host_port.partition(":")
        port = port.split(";")[0]  # sc://host:port/;token=...
        try:
            with socket.create_connection((host, int(port or default_port)), timeout=CONNECT_TIMEOUT):
                return
        except (OSError, ValueError) as exc:
            reason = exc
    raise InputError(f"cannot reach the {what} {shorten(url)}: {first_line(reason)}; check the host and port "
                     f"(and that the cluster is running)")


@contextmanager
def _launch_environment(master: str, python_given: bool):
    """The environment a new session starts in, restored afterwards.

    Without ``$SPARK_REMOTE``: PySpark reads it itself and refuses it beside a master (an explicit
    master wins). On a local master, ``$PYSPARK_PYTHON`` is this interpreter unless the user chose
    one (that variable, or ``spark.pyspark.python`` in ``config``): PySpark starts its Python workers
    with ``$PYSPARK_PYTHON``, else with the ``python3`` on PATH, which lacks empdp and pyarrow when
    empdp runs from a virtual environment that is not activated (as after ``pipx install``). The
    SparkContext keeps the interpreter it read when it starts. A cluster's workers run the
    cluster's Python, whose path the driver's need not be.
    """
    saved = {name: os.environ.get(name) for name in ("SPARK_REMOTE", "PYSPARK_PYTHON")}
    os.environ.pop("SPARK_REMOTE", None)
    if master.startswith("local") and not (saved["PYSPARK_PYTHON"] or python_given) and sys.executable:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: the head of a Python traceback (a worker's, quoted in Spark's error)
_TRACEBACK = "Traceback (most recent call last):"
#: what Spark writes before the stderr of a Python worker that failed to start
_WORKER_STDERR = "Error from python worker:"


def spark_failure(exc: BaseException) -> str | None:
    """One line for an error Spark raised, or None when ``exc`` is not Spark's (Py4J's or PySpark's).

    A Python worker's failure, quoted inside Spark's pages of Java and Python stack, is the
    worker's own exception: the last line of the last Python traceback in the text (e.g.
    "ModuleNotFoundError: No module named 'pyarrow'"), or, for a worker that did not start, the
    first line it wrote. Any other Spark error is its first meaningful line (:func:`first_line`).
    """
    if not type(exc).__module__.startswith(("py4j", "pyspark")):
        return None
    lines = str(exc).splitlines()
    worker = _worker_exception(lines) or _after(lines, _WORKER_STDERR)
    return "a Spark task failed: " + clip(worker, 300) if worker else "Spark failed: " + first_line(exc)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _worker_exception(lines: list[str]) -> str | None:
    """The exception line of the last Python traceback in ``lines``: the first line after it that is
    indented no deeper than the traceback's head (its frames and their code are deeper)."""
    heads = [k for k, line in enumerate(lines) if _TRACEBACK in line]
    if not heads:
        return None
    depth = _indent(lines[heads[-1]])
    return next((line.strip() for line in lines[heads[-1] + 1:] if line.strip() and _indent(line) <= depth), None)


def _after(lines: list[str], marker: str) -> str | None:
    """The first non-empty line after the last line holding ``marker``."""
    marked = [k for k, line in enumerate(lines) if marker in line]
    return next((line.strip() for line in lines[marked[-1] + 1:] if line.strip()), None) if marked else None


def spark_session(master: str | None = None, remote: str | None = None, config: dict | None = None):
    """The active SparkSession, or a new one on ``master`` (default ``local[*]``) or a Spark
    Connect ``remote`` (``sc://HOST:PORT``; default ``$SPARK_REMOTE`` when no master is given).

    Raises :class:`InputError` (one line) when PySpark or Java is missing, or the master or
    server does not answer.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    if master and remote:
        raise InputError("give either `master` or `remote` of the Spark engine, not both", param=("master", "remote"))
    remote = remote or (None if master else os.environ.get("SPARK_REMOTE"))
    if remote:
        if not remote.startswith("sc://"):
            raise InputError(f"`remote` {shorten(remote)} is not a Spark Connect URL; use sc://HOST:PORT", param="remote")
        _require_reachable(remote, "Spark Connect server", CONNECT_PORT)
        try:
            builder = SparkSession.builder.remote(remote)
            for key, value in (config or {}).items():
                builder = builder.config(key, value)
            return builder.getOrCreate()
        except ImportError as exc:
            raise InputError(f"Spark Connect needs its client libraries ({first_line(exc)}): "
                             f'pip install "pyspark[connect]>=3.5"') from None
        except Exception as exc:  # noqa: BLE001 - any failure to connect is the user's to fix
            raise InputError(f"cannot open a Spark Connect session on {shorten(remote)}: {first_line(exc)}") from None
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    master = master or "local[*]"
    if master.startswith("spark://"):
        _require_reachable(master, "Spark master", 7077)
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise InputError("the Spark engine needs Java 17 (or 11/21): install a JRE (e.g. apt-get install "
                         "openjdk-17-jre-headless) or set JAVA_HOME")
    # runSQLOnFiles off: user SQL cannot read files by path (SELECT * FROM parquet.`/x`; docs/user-sql.md)
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.execution.arrow.pyspark.enabled": "true", "spark.sql.session.timeZone": "UTC",
                "spark.sql.runSQLOnFiles": "false"}
    if master.startswith("local"):
        settings["spark.sql.shuffle.partitions"] = str(4 * (os.cpu_count() or 1))
    settings.update(config or {})
    try:
        with _launch_environment(master, "spark.pyspark.python" in settings):
            builder = SparkSession.builder.master(master).appName("empdp")
            for key, value in settings.items():
                builder = builder.config(key, value)
            session = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - e.g. JAVA_GATEWAY_EXITED, a bad master URL
        raise InputError(f"cannot start Spark on master {shorten(master)}: {first_line(exc)}") from None
    if not logging.getLogger("empdp").isEnabledFor(logging.DEBUG):
        # a failed task logs its Java stack trace on stderr; empdp reports the error in one line
        # (-vv keeps Spark's own log)
        session.sparkContext.setLogLevel("FATAL")
    return session


def is_dataframe(source: Any) -> bool:
    """True for a classic or Spark Connect ``pyspark.sql.DataFrame``."""
    return type(source).__module__.startswith("pyspark.sql") and hasattr(source, "sparkSession")


def _reader_format(path: str) -> tuple[str, dict]:
    """Spark's reader name and options for a file, glob or (hive-partitioned) folder."""
    probe = path
    if os.path.isdir(path):
        files = sorted(p for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
        if not files:
            raise InputError(f"folder {path!r} contains no files")
        probe = str(files[0])
    kind = file_format(probe.lower())
    if kind is None:
        raise InputError(f"cannot tell the format of {path!r}; use a .parquet, .csv, .tsv or .json(l) "
                         f"file, a glob or a folder of them, or the Spark engine's `table`", param="table")
    if kind == "csv":
        sep = "\t" if probe.lower().rstrip(".gz").endswith(".tsv") else ","
        return "csv", {"header": "true", "inferSchema": "true", "sep": sep}
    if kind == "json":
        return "json", {"multiLine": "true"} if _json_array(probe) else {}
    return "parquet", {}


def _json_array(path: str) -> bool:
    """True when a (local, uncompressed) JSON file holds one array rather than JSON lines."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError:
        return False
    return head[:1] == b"["


def read_source(spark, source: Any = None, table: str | None = None, options: dict | None = None):
    """The user's source as a DataFrame and its description.

    ``source``: a path, glob or folder (Parquet, CSV, JSON; hive partitions become columns),
    or a DataFrame; ``table``: a catalog or Delta table by name instead.
    """
    from pyspark.errors import PySparkException

    if table is not None:
        if source is not None:
            raise InputError("give either a source path or the Spark engine's `table`, not both", param="table")
        try:
            df = spark.table(table)
            df.columns  # noqa: B018 - resolves the table now (Spark Connect resolves lazily)
        except (PySparkException, Exception) as exc:  # noqa: BLE001
            raise InputError(f"cannot read table {shorten(table)}: {first_line(exc)}") from None
        return df, f"table {table}"
    if is_dataframe(source):
        return source, "<Spark DataFrame>"
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(f"unsupported source of type {type(source).__name__} for the Spark engine; give a path, "
                         f"a glob, a folder, the Spark engine's `table`, or a pyspark.sql.DataFrame", param="table")
    path = os.fspath(source)
    local = "://" not in path
    if local and not any(ch in path for ch in "*?[") and not os.path.exists(path):
        raise InputError(f"source {path!r} not found; give a Parquet/CSV/JSON file, a glob, a folder, "
                         f"or the Spark engine's `table`", param="table")
    fmt, opts = _reader_format(path) if local else (file_format(path.lower()) or "parquet", {})
    opts.update(options or {})
    try:
        df = spark.read.format(fmt).options(**opts).load(path)
        df.columns  # noqa: B018
    except Exception as exc:  # noqa: BLE001 - PATH_NOT_FOUND, corrupt files, ...
        raise InputError(f"cannot read {path!r}: {first_line(exc)}") from None
    return df, path


@dataclass(kw_only=True)
class SparkPanel(Source):
    """The source as Spark sees it (the :class:`empdp.data.Panel` of the Spark engine): a
    :class:`empdp.data.panel.Source` with ``df``, the source's DataFrame, and the session.
    ``checked`` holds the (column, where) pairs whose values were found finite when it opened."""

    df: Any
    spark: Any = None
    checked: frozenset = frozenset()
    _label_df: Any = field(default=None, repr=False)

    def close(self) -> None:
        """Nothing to close: the session is shared (``spark.stop()`` ends it for every engine)."""

    def kept(self, where: str | None = None):
        """Every column of the rows a query reads, with ``__j`` (database index): NULL ids removed and
        ``where`` applied."""
        from pyspark.sql import functions as F

        df = self.df.filter(F.col(_q(self.id)).isNotNull())
        if where:
            df = df.filter(F.expr(where))
        lab = F.broadcast(self._label_df)
        return df.join(lab, df[_q(self.by)] == lab["__label"])

    def base(self, columns: Sequence[str] = (), where: str | None = None):
        """Rows the query reads: ``__j`` (database index), ``__i`` (id) and the value columns as
        doubles, NULL ids removed and ``where`` applied."""
        from pyspark.sql import functions as F

        cols = [F.col("__j"), F.col(_q(self.id)).alias("__i")]
        cols += [F.col(_q(c)).cast("double").alias(c) for c in dict.fromkeys(columns)]
        return self.kept(where).select(*cols)

    def group(self, column: str, text: str) -> "SparkPanel":
        """The panel of one group: the rows whose ``column``, as Spark's text, is ``text`` (as
        :func:`group_cells` names the groups). A Column filter, not SQL text: no value can end it early."""
        from pyspark.sql import functions as F

        return replace(self, df=self.df.filter(_group_text(column) == F.lit(text)))

    def require_numeric(self, column: str, where: str | None = None) -> None:
        """Raise :class:`InputError` unless ``column`` exists and is numeric (NaN/inf are counted
        when the panel opens, see :func:`open_spark_panel`)."""
        self.require_column(column)
        typ = self.columns[column]
        if not _is_numeric(typ):
            raise InputError(f"column {column!r} has type {typ}, not a number; choose a numeric column "
                             f"or CAST it in `sql`", param="sql")

    def require_column(self, column: str) -> None:
        if column not in self.columns:
            raise InputError(f"column {column!r} not found in {self.description}; "
                             f"available: {', '.join(self.columns)}")


def _q(name: str) -> str:
    """A column name as Spark's column resolver reads it (backticks: dots and spaces are literal)."""
    return "`" + str(name).replace("`", "``") + "`"


def _is_numeric(typ: str) -> bool:
    return typ.startswith(("tinyint", "smallint", "int", "bigint", "float", "double", "decimal", "boolean",
                           "byte", "short", "long"))


def open_spark_panel(spark, source: Any, *, id: str, by: str, table: str | None = None,
                     value_columns: Sequence[str] = (), where: str | None = None,
                     drop_null_ids: bool = False, database: str | None = None) -> SparkPanel:
    """Open and validate a repeated-database source on Spark (docs/method.md#1-data-model), in one scan.

    The same refusals as :func:`empdp.data.open_panel` (missing columns, nested ids, NULL ids
    unless ``drop_null_ids``, NULL labels, no rows, fewer than two databases, a ``by`` that
    cannot name databases), and NaN or infinite values in the query's float columns among the
    rows ``where`` keeps. With ``database`` only that database is read (``release SOURCE
    --database D``).
    """
    from pyspark.sql import functions as F

    df, description = read_source(spark, source, table)
    columns = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    panel = SparkPanel(df=df, id=id, by=by, labels=[], description=description, columns=columns,
                       spark=spark)
    panel.require_column(id)
    panel.require_column(by)
    if id == by:
        raise InputError(f"`id` and `by` are the same column {id!r}; the database label must differ from the id",
                         param=("id", "by"))
    for col, what, option in ((id, "individual", "id"), (by, "database", "by")):
        if columns[col].startswith(("array", "map", "struct")):
            raise InputError(f"`{option}` column {shorten(col)} holds nested values ({clip(columns[col], 60)}); "
                             f"the {what} must be a plain value (a number, text or date): choose another column, "
                             f"or unnest it in the source", param=option)
    for col in value_columns:
        panel.require_numeric(col, where)
    if database is not None:  # the one database a release needs (its label compared as text)
        panel.df = df = df.filter(F.col(_q(by)).cast("string") == str(database))
    keep = F.col(_q(id)).isNotNull()
    if where:
        try:
            keep = keep & F.expr(where)
        except Exception as exc:  # noqa: BLE001 - a ParseException
            raise InputError(f"the filter `where` {where!r} is not valid here: {first_line(exc)}",
                             param="where") from None
    aggs = [F.count(F.lit(1)).alias("rows"),
            F.sum(F.col(_q(id)).isNull().cast("long")).alias("null_id")]
    floats = _floats(panel, value_columns)
    aggs += _nonfinite(floats, keep)
    try:
        per_label = df.groupBy(F.col(_q(by)).alias("__label")).agg(*aggs).orderBy("__label").collect()
    except Exception as exc:  # noqa: BLE001 - unreadable files surface at the first job
        msg = first_line(exc)
        if where and ("where" in msg.lower() or "UNRESOLVED" in msg or "PARSE" in msg.upper()):
            raise InputError(f"the filter `where` {where!r} is not valid here: {msg}", param="where") from None
        raise InputError(f"cannot read {shorten(description)}: {msg}") from None
    n_rows = sum(r["rows"] for r in per_label)
    if n_rows == 0:
        if database is not None:
            raise InputError(f"database {shorten(database)} is not in {shorten(by)} of {shorten(description)}")
        raise InputError(f"{description} has no rows")
    if database is None:
        check_databases(by, [r["rows"] for r in per_label])
    n_null_by = sum(r["rows"] for r in per_label if r["__label"] is None)
    if n_null_by:
        raise InputError(f"{n_null_by} rows have a NULL database label in column {by!r}; fill or filter them")
    n_null_id = sum(r["null_id"] or 0 for r in per_label)
    if n_null_id and not drop_null_ids:
        raise InputError(f"{n_null_id} rows have a NULL id in column {id!r}; remove them or give `drop_null_ids`",
                         param="drop_null_ids")
    _require_finite(floats, per_label, where)
    labels = [r["__label"] for r in per_label]
    if len(labels) < (1 if database is not None else 2):
        raise InputError(f"column {by!r} has {len(labels)} distinct value(s); at least 2 databases are needed "
                         f"to estimate the query's distribution")
    panel.labels, panel.n_null_ids = labels, int(n_null_id)
    panel.checked = frozenset((c, where) for c in value_columns)
    schema = f"__label {df.schema[by].dataType.simpleString()}, __j int"
    panel._label_df = spark.createDataFrame([(lab, j) for j, lab in enumerate(labels)], schema)
    return panel


def _floats(panel: SparkPanel, columns: Sequence[str]) -> list[str]:
    """The float columns among ``columns`` (the ones that can hold NaN or infinity)."""
    return [c for c in dict.fromkeys(columns) if panel.columns[c].startswith(("float", "double"))]


def _nonfinite(floats: Sequence[str], keep) -> list:
    """Aggregates counting the NaN (``nan{k}``) and infinite (``inf{k}``) values of each of ``floats``
    on the rows ``keep`` holds for."""
    from pyspark.sql import functions as F

    aggs = []
    for k, col in enumerate(floats):
        x = F.col(_q(col))
        aggs.append(F.sum((keep & F.isnan(x)).cast("long")).alias(f"nan{k}"))
        aggs.append(F.sum((keep & x.isin(float("inf"), float("-inf"))).cast("long")).alias(f"inf{k}"))
    return aggs


def _require_finite(floats: Sequence[str], rows: list, where: str | None) -> None:
    """Refuse NaN or infinite values counted by :func:`_nonfinite` (summed over ``rows``)."""
    for k, col in enumerate(floats):
        nan, inf = (sum(r[f"{w}{k}"] or 0 for r in rows) for w in ("nan", "inf"))
        if nan or inf:
            raise InputError(f"column {col!r} has {nan} NaN and {inf} infinite values"
                             + (" among the rows `where` keeps" if where else "")
                             + "; remove or impute them first, or filter them with `where` "
                               "(NULLs are ignored like SQL aggregates do)", param="where")


def require_values(panel: SparkPanel, columns: Sequence[str], where: str | None) -> None:
    """Refuse a value column that is missing, not numeric, or not finite on the rows ``where`` keeps:
    what :func:`open_spark_panel` checks, for a query on a panel opened for others (one scan, and
    none when the panel checked these columns already)."""
    from pyspark.sql import functions as F

    for col in columns:
        panel.require_numeric(col, where)
    floats = [c for c in _floats(panel, columns) if (c, where) not in panel.checked]
    if not floats:
        return
    try:
        rows = panel.kept(where).agg(*_nonfinite(floats, F.lit(True))).collect()
    except Exception as exc:  # noqa: BLE001 - a filter Spark cannot resolve
        raise InputError(f"the filter `where` {where!r} is not valid here: {first_line(exc)}", param="where") from None
    _require_finite(floats, rows, where)


def _group_text(column: str):
    """A group's name: ``column``'s value as Spark's text (a Column)."""
    from pyspark.sql import functions as F

    return F.col(_q(column)).cast("string")


def group_condition(column: str, text: str) -> str:
    """Spark SQL keeping the rows of one group of ``column`` (named by its text, as :func:`group_cells`):
    the text compared in hexadecimal, so that no group value can end the literal early."""
    return f"hex(CAST({_q(column)} AS STRING)) = '{text.encode('utf-8').hex().upper()}'"


def group_cells(panel: SparkPanel, column: str, where: str | None = None) -> tuple[list, int]:
    """The groups of ``column`` in every database on the rows ``where`` keeps, as
    :func:`empdp.data.sql.group_cells` gives them on DuckDB: ``(cells, n_null)``, one ``(text, value,
    database index, rows)`` per group present in a database, ordered by the group's value, and the
    number of kept rows whose group is NULL. One job."""
    from pyspark.sql import functions as F

    panel.require_column(column)
    if panel.columns[column].startswith("map"):
        raise InputError(f"`group_by` column {shorten(column)} holds maps ({clip(panel.columns[column], 60)}), "
                         "which Spark cannot order; group by a plain column", param="group_by")
    x = F.col(_q(column))
    cells = (panel.kept(where).groupBy(_group_text(column).alias("t"), "__j")
             .agg(F.first(x).alias("v"), F.count(F.lit(1)).alias("rows"), F.max(x.isNull()).alias("null")))
    try:
        rows = cells.orderBy("v", "t", "__j").collect()
    except Exception as exc:  # noqa: BLE001 - a filter Spark cannot resolve
        raise InputError(f"the filter `where` {where!r} is not valid here: {first_line(exc)}", param="where") from None
    n_null = sum(r["rows"] for r in rows if r["null"])
    return [(r["t"], r["v"], r["__j"], r["rows"]) for r in rows if not r["null"]], int(n_null)


def _collect(df) -> pa.Table:
    """A (small) DataFrame on the driver as an Arrow table (``toArrow`` from PySpark 4, else pandas)."""
    to_arrow = getattr(df, "toArrow", None)
    if to_arrow is not None:
        return to_arrow()
    return pa.Table.from_pandas(df.toPandas(), preserve_index=False)
