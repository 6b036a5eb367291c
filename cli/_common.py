"""Shared CLI plumbing: output options, JSON, progress bars, atomic table writes."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import contextmanager

import click

from empdp.io import jsonable
from empdp.keys import KEY_ENV

log = logging.getLogger("empdp.cli")

#: the names of :data:`empdp.engines.ENGINES`, for ``--engine``'s choices: importing the engines (polars,
#: DuckDB) to list them cost every command ~0.6 s of start-up, an audit's inside its time budget
#: (tests/test_engine_names.py checks that the two agree)
ENGINE_NAMES = ("duckdb", "spark")


def output_options(f):
    """``--json``, ``--quiet``, ``-v/--verbose`` and ``--debug`` for a command."""
    f = click.option("--debug", is_flag=True, help="Show tracebacks on errors.")(f)
    f = click.option("-v", "--verbose", count=True, help="Log progress details to stderr (-vv for more).")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors (and --json output).")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print one JSON object to stdout, nothing else.")(f)
    return f


def setup_logging(verbose: int, quiet: bool, debug: bool) -> None:
    """Send the ``empdp`` loggers to stderr: INFO with ``-v``, DEBUG with ``-vv``, WARNING otherwise.

    Only empdp's own loggers are configured (``-vv`` should not print matplotlib's
    font search), and the handler is removed when the command ends, so in-process
    callers (tests, notebooks) get their logging back unchanged.
    """
    ctx = click.get_current_context()
    ctx.meta["empdp.debug"] = debug
    level = logging.WARNING if quiet or not verbose else logging.DEBUG if verbose > 1 else logging.INFO
    root = logging.getLogger("empdp")
    handler = logging.StreamHandler(sys.stderr)  # the stderr of this call (CliRunner swaps it)
    # the level first (grep-able), then the wall-clock time, so a slow stage shows where the time went
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s.%(msecs)03d %(name)s: %(message)s",
                                           datefmt="%H:%M:%S"))
    before = root.level, root.propagate
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False

    def restore() -> None:
        root.removeHandler(handler)
        root.setLevel(before[0])
        root.propagate = before[1]

    ctx.call_on_close(restore)


#: library parameters whose flag is not ``--`` and the parameter's name with dashes
_FLAGS = {"screening": "--no-screening", "n": "--search-size", "N": "--final-size", "master": "--spark-master",
          "remote": "--spark-remote", "id": "--id", "by": "--by", "rng": "--seed", "time_budget": "--time-budget"}


def flag(param: str) -> str:
    """The command-line flag of a library parameter (errors name parameters; the CLI shows flags)."""
    ctx = click.get_current_context(silent=True)
    if param in _FLAGS:
        return _FLAGS[param]
    for p in (ctx.command.params if ctx is not None else ()):
        if p.name == param and isinstance(p, click.Option):
            return max(p.opts, key=len)
    return "--" + param.replace("_", "-")


def emit_json(obj) -> None:
    """Print ``obj`` as strict JSON (non-finite numbers become null)."""
    click.echo(json.dumps(jsonable(obj), allow_nan=False))


class StageLog:
    """A ``progress(stage, done, total)`` callback that logs each stage once it ends.

    INFO: one line per stage with its items and elapsed time; DEBUG: every update.
    Libraries report progress after work, so a stage is timed from the previous
    stage's last update to its own last one. A stage ends when another one starts
    or at :meth:`close`. Stages reported in batches (``done`` restarting after
    reaching ``total``) are summed.
    """

    def __init__(self, logger: logging.Logger):
        self.log = logger
        self.stage: str | None = None
        self.last = time.perf_counter()

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if stage != self.stage:
            self.close()
            self.stage, self.start, self.base_done, self.base_total = stage, self.last, 0, 0
            self.done, self.total = 0, 0
        elif done < self.done or (self.total > 0 and self.done >= self.total):
            self.base_done, self.base_total = self.base_done + self.done, self.base_total + self.total
        self.done, self.total, self.last = done, total, now
        self.log.debug("%s: %d/%s", stage, done, total if total > 0 else "?")

    def close(self) -> None:
        """Log the current stage, if any, as ended at its last update."""
        if self.stage is None:
            return
        done, total = self.base_done + self.done, self.base_total + self.total
        items = f"{done:,}/{total:,}, " if total > 0 else ""
        self.log.info("%s: %sdone in %.2f s", self.stage, items, self.last - self.start)
        self.stage = None


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal (the only place bars are drawn)."""
    return sys.stderr.isatty()


@contextmanager
def progress_bars(enabled: bool, logger: logging.Logger | None = None):
    """Yield a ``progress(stage, done, total)`` callback drawing rich bars on stderr.

    Bars appear only when ``enabled`` and stderr is a terminal, so ``--json``
    output and pipes stay clean; ``total <= 0`` draws a pulsing bar (size not
    known yet). With ``logger``, every stage is also logged (:class:`StageLog`),
    bars or not.
    """
    stages = StageLog(logger) if logger is not None else None
    if not enabled or not stderr_is_terminal():
        yield stages or (lambda stage, done, total: None)
        if stages:
            stages.close()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # the terminal check is ours (above), so rich need not repeat it on a wrapped stream
    # the time left while a stage runs (ETA), its time taken once it is done
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(compact=True, elapsed_when_finished=True),
                  console=Console(stderr=True, force_terminal=True), transient=True) as bars:
        tasks: dict = {}

        def update(stage: str, done: int, total: int) -> None:
            if stages:
                stages(stage, done, total)
            known = {"total": total} if total > 0 else {}
            new = stage not in tasks
            if new:
                tasks[stage] = bars.add_task(stage, total=total if total > 0 else None)
            bars.update(tasks[stage], completed=done, **known)
            if new:  # show a new stage now, not at the next tick: short ones would never be seen
                bars.refresh()

        yield update
    if stages:
        stages.close()


def check_output(path: str | None, option: str, suffixes: tuple | None = None, kinds: str = "") -> None:
    """Refuse, before any work is done, an output path with the wrong extension (``kinds`` names the
    right ones), a missing or unwritable folder, or an existing folder as the file: a bad option never
    costs a long computation or leaves half the outputs written."""
    from empdp.data import shorten
    from empdp.errors import InputError
    from empdp.io import check_output_path

    if path is None:
        return
    path = str(path)
    if suffixes and not path.lower().endswith(suffixes):
        raise InputError(f"{option} {shorten(path)} must end in {kinds}")
    check_output_path(path, option)


def write_table(df, path: str) -> None:
    """Write a polars frame to Parquet or CSV (by extension), atomically, owner-only (:func:`empdp.io.write_frame`)."""
    from empdp.data import shorten
    from empdp.errors import InputError
    from empdp.io import write_frame

    if not path.lower().endswith((".parquet", ".pq", ".csv")):
        raise InputError(f"--out {shorten(path)} must end in .parquet or .csv")
    write_frame(df, path)  # CSV text cells that a spreadsheet would run as a formula get a leading "'"


def engine_options(engine_help: str, table: bool = True):
    """``--engine duckdb|spark``, ``--spark-master``, ``--spark-remote`` and (``table``) ``--table``
    for a command that reads a source; :func:`engine_settings` checks them together."""

    def decorate(f):
        if table:
            f = click.option("--table", metavar="DB.NAME",
                             help="With --engine spark: read this catalog or Delta table instead of SOURCE.")(f)
        f = click.option("--spark-remote", metavar="URL", envvar="SPARK_REMOTE",
                         help="With --engine spark: a Spark Connect server, sc://HOST:PORT (default: "
                              "$SPARK_REMOTE).")(f)
        f = click.option("--spark-master", metavar="URL",
                         help="With --engine spark: the master (default local[*]).")(f)
        f = click.option("--engine", type=click.Choice(list(ENGINE_NAMES)), default="duckdb", show_default=True,
                         help=engine_help)(f)
        return f

    return decorate


def engine_settings(source, engine: str, spark_master: str | None, spark_remote: str | None,
                    table: str | None = None, required: bool = True) -> dict:
    """The engine keywords of the library (``engine``, ``spark_master``, ``spark_remote``, ``table``),
    checked before any data are read: ``--table`` and the Spark URLs go with ``--engine spark``, a
    ``$SPARK_REMOTE`` meant for other tools neither stops the embedded engine nor overrides an
    explicit ``--spark-master``, and (``required``) exactly one of SOURCE and ``--table`` is given."""
    from click.core import ParameterSource

    from empdp.errors import InputError

    ctx = click.get_current_context()
    if spark_remote is not None and ctx.get_parameter_source("spark_remote") == ParameterSource.ENVIRONMENT \
            and (engine != "spark" or spark_master):
        spark_remote = None
    if engine != "spark":
        if table is not None:
            raise InputError(f"--table {table} names a catalog or Delta table, which only Spark reads: add "
                             f"--engine spark, or give a file, glob or folder as SOURCE")
        for option, value in (("--spark-master", spark_master), ("--spark-remote", spark_remote)):
            if value:
                raise InputError(f"{option} goes with --engine spark: add --engine spark, or drop {option}")
    if source is not None and table is not None:
        raise InputError("give either SOURCE or --table DB.NAME, not both")
    if required and source is None and table is None:
        raise InputError("give the SOURCE to read (a file, glob or folder), or --table DB.NAME with --engine spark")
    if table is not None and not table.strip():
        raise InputError("--table is empty (an unset shell variable?); give the table's name, e.g. db.claims")
    return {"engine": engine, "spark_master": spark_master, "spark_remote": spark_remote, "table": table}


def engine_object(settings: dict):
    """The library's ``engine`` from :func:`engine_settings`' keywords: the name ``duckdb`` (the library
    then applies ``memory_limit`` and ``threads``) or a :class:`empdp.engines.Spark` with its settings."""
    if settings["engine"] == "duckdb":
        return "duckdb"
    from empdp.engines import engine_of

    return engine_of(settings["engine"], spark_master=settings["spark_master"], spark_remote=settings["spark_remote"],
                     table=settings["table"])


def key_options(f):
    """``--key-file`` and ``--allow-unsigned`` (the curator key; see the README, "Release security")."""
    f = click.option("--allow-unsigned", is_flag=True,
                     help="UNSAFE: accept calibration files and ledgers without a valid curator-key signature "
                          "(and write an unsigned ledger when no key is given). Anyone who can write those "
                          "files can then lift the budget or release exact values undetected.")(f)
    f = click.option("--key-file", type=click.Path(dir_okay=False), metavar="FILE",
                     help=f"File holding the curator key (>= 16 bytes) that signs calibrations and ledgers with "
                          f"HMAC-SHA256; default: ${KEY_ENV}. Keep it apart from the files it protects.")(f)
    return f


#: command-line names of library parameters where they differ
_PARAMETER = {"no_screening": "screening", "tolerance": "precision", "exact": "precision"}


def given_options(ctx, names) -> list[tuple[str, str]]:
    """(library parameter, how the command line shows it) of the options among ``names`` given a value
    other than their default, in ``names``' order: ``--kernel gaussian``, ``--adversary``."""
    options = {p.name: p for p in ctx.command.params}
    given = []
    for name in names:
        value, option = ctx.params[name], options[name]
        if value in (option.default, None, False, ()):
            continue
        shown = max(option.opts, key=len)
        if isinstance(option.type, click.Choice):
            shown += f" {value}"
        given.append((_PARAMETER.get(name, name), shown))
    return given
