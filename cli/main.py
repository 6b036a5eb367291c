"""The ``empdp`` command: a thin click layer over the library (docs/method.md)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback

import click

from empdp import __version__
from empdp.errors import EmpdpError, InputError
from empdp.textfmt import terminal_safe

#: command -> (module, object, one-line help); modules load only when their command runs, so
#: ``empdp --help`` and an audit do not pay for polars, DuckDB and the assessment stack
COMMANDS = {
    "assess": (".assess", "assess_cmd", "How much releasing a statistic reveals about each individual."),
    "calibrate": (".calibrate", "calibrate", "The least noise that reaches a target epsilon."),
    "release": (".calibrate", "release", "Add that noise to a new value and record it in the ledger."),
    "ledger": (".ledger", "ledger", "Show or verify a release ledger and print its chain head."),
    "audit": (".audit", "audit", "Black-box lower bounds on a mechanism's epsilon (MPL, Renyi)."),
    "report": (".report", "report", "The HTML report of an assessment saved with --save-result."),
}


def _duckdb_errors() -> tuple:
    """DuckDB's bad-input and out-of-memory exception types, if DuckDB was loaded (else none)."""
    duckdb = sys.modules.get("duckdb")
    if duckdb is None:
        return (), ()
    return ((duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
             duckdb.ConversionException, duckdb.InvalidInputException), (duckdb.OutOfMemoryException,))


class EmpdpGroup(click.Group):
    """Click group whose ``main`` turns expected errors into one line and an exit code.

    0 success, 1 runtime error, 2 bad input or usage, 130 interrupted (Ctrl-C). Tracebacks only
    with --debug.
    Handling errors here (not in a wrapper) keeps ``CliRunner`` tests on the same path.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = sys.argv[1:] if args is None else list(args)
        debug = "--debug" in args
        try:
            return super().main(args=args, prog_name=prog_name or "empdp", complete_var=complete_var,
                                standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every error: one line, no traceback
            message, code = _message(exc)
            _fail(message, code, debug)

    def invoke(self, ctx):
        """Run the command; a Ctrl-C leaves as :class:`_Interrupted`, which click passes through
        (a ``KeyboardInterrupt`` it would turn into "aborted", after a blank line)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _Interrupted() from exc

    def list_commands(self, ctx):
        return [name for name in COMMANDS if self._available(name)]

    def get_command(self, ctx, name):
        if name not in COMMANDS or not self._available(name):
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module, __package__), attr)

    @staticmethod
    def _available(name: str) -> bool:
        return importlib.util.find_spec(COMMANDS[name][0], __package__) is not None

    def format_commands(self, ctx, formatter):
        """The command list from :data:`COMMANDS`, without importing the commands."""
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class _Interrupted(Exception):
    """Ctrl-C during a command (see :meth:`EmpdpGroup.invoke`)."""


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C, or was raised while one was handled.

    A Ctrl-C reaches here as ``KeyboardInterrupt``; as DuckDB's ``InterruptException`` (a
    connection's ``interrupt()``); or, when the signal arrives while DuckDB runs a query, as the
    ``RuntimeError("Query interrupted")`` DuckDB raises in its place. Code that turns DuckDB errors
    into bad input (``raise InputError(...) from None``) keeps the interrupt as ``__context__``.
    """
    duckdb = sys.modules.get("duckdb")
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if (isinstance(exc, (KeyboardInterrupt, _Interrupted))
                or (duckdb is not None and isinstance(exc, duckdb.InterruptException))
                or (type(exc) is RuntimeError and str(exc) == "Query interrupted")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _message(exc: BaseException) -> tuple[str, int]:
    """The one-line message and exit code of an error: 1 runtime error, 2 bad input or usage,
    130 interrupted (as a shell reports a command stopped by SIGINT)."""
    if _interrupted(exc):
        return "interrupted", 130
    if isinstance(exc, click.exceptions.Abort):
        return "aborted", 1
    if isinstance(exc, click.ClickException):
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return exc.format_message() + hint, 2 if isinstance(exc, click.UsageError) else exc.exit_code
    if isinstance(exc, InputError):
        from ._common import flag

        return exc.shown(flag), exc.exit_code
    if isinstance(exc, EmpdpError):
        return str(exc), exc.exit_code
    bad_sql, no_memory = _duckdb_errors()
    if isinstance(exc, MemoryError) or isinstance(exc, no_memory):
        return (f"out of memory ({exc or type(exc).__name__}); try --memory-limit or a machine with more "
                "memory"), 1
    if isinstance(exc, bad_sql):
        from empdp.data import clip

        return "the query or filter is not valid SQL for this source: " + clip(str(exc).splitlines()[0], 200), 2
    spark = sys.modules.get("empdp.spark.session")  # loaded when the Spark engine ran
    failure = spark.spark_failure(exc) if spark is not None else None
    if failure:
        return failure, 1
    return f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)", 1


def _fail(message, code: int, debug: bool = False):
    """Print ``Error: MESSAGE`` as one line (whitespace runs joined, control characters shown
    escaped: a message may quote a value from the data) and exit with ``code``."""
    if debug:
        traceback.print_exc()
    click.echo("Error: " + terminal_safe(" ".join(str(message).split())), err=True)
    sys.exit(code)


@click.group(cls=EmpdpGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="empdp")
def cli():
    """Empirical differential privacy for repeated databases.

    Start with 'empdp assess --help'; the README explains the method and every
    quantity the commands print.
    """


def main(argv=None):
    """Console-script entry point."""
    cli.main(args=argv)


if __name__ == "__main__":
    main()
