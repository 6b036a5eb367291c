"""The ``empdp`` command: a thin click layer over the library (SPEC 8)."""

from __future__ import annotations

import sys
import traceback

import click
import duckdb

from empdp import __version__
from empdp.errors import EmpdpError

from .assess import assess_cmd
from .audit import audit
from .calibrate import calibrate, release
from .report import report


class EmpdpGroup(click.Group):
    """Click group whose ``main`` turns expected errors into one line and an exit code.

    0 success, 1 runtime error, 2 bad input or usage. Tracebacks only with --debug.
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
        except click.exceptions.Abort:
            _fail("aborted", 1)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            _fail(exc.format_message() + hint, 2 if isinstance(exc, click.UsageError) else exc.exit_code)
        except EmpdpError as exc:
            _fail(exc, exc.exit_code, debug)
        except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
                duckdb.ConversionException, duckdb.InvalidInputException) as exc:
            _fail("the query or filter is not valid SQL for this source: " + str(exc).splitlines()[0], 2, debug)
        except (MemoryError, duckdb.OutOfMemoryException) as exc:
            _fail(f"out of memory ({exc or 'MemoryError'}); try --memory-limit or a machine with more memory",
                  1, debug)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - last line of defence: one line, no traceback
            _fail(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)", 1, debug)


def _fail(message, code: int, debug: bool = False):
    if debug:
        traceback.print_exc()
    click.echo("Error: " + " ".join(str(message).split()), err=True)
    sys.exit(code)


@click.group(cls=EmpdpGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="empdp")
def cli():
    """Empirical differential privacy for repeated databases.

    \b
    assess     how much releasing a statistic reveals about each individual
    calibrate  the least noise that reaches a target epsilon
    release    add that noise to a new value and record it in a ledger
    audit      black-box lower bounds on a mechanism's epsilon (MPL, Renyi)
    report     the HTML report of an assessment saved with --save-result
    """


cli.add_command(assess_cmd)
cli.add_command(calibrate)
cli.add_command(release)
cli.add_command(audit)
cli.add_command(report)


def main(argv=None):
    """Console-script entry point."""
    cli.main(args=argv)


if __name__ == "__main__":
    main()
