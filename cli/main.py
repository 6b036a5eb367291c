"""The ``empdp`` command: a thin click layer over the library (SPEC 8)."""

from __future__ import annotations

import sys
import traceback

import click
import duckdb

from empdp import __version__
from empdp.errors import EmpdpError

from .assess import assess_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="empdp")
def cli():
    """Empirical differential privacy for repeated databases.

    \b
    assess     how much releasing a statistic reveals about each individual
    calibrate  the least noise that reaches a target epsilon
    release    add that noise to a new value and record it in a ledger
    audit      black-box lower bounds on a mechanism's epsilon (MPL, Renyi)
    """


cli.add_command(assess_cmd)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv=None) -> None:
    """Entry point: run the CLI, turning expected errors into one line and an exit code.

    0 success, 1 runtime error, 2 bad input or usage. Tracebacks only with --debug.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="empdp", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Error: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        hint = ""
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            hint = f" (see '{ctx.command_path} --help')"
        click.echo(f"Error: {_one_line(exc.format_message())}{hint}", err=True)
        sys.exit(2 if isinstance(exc, click.UsageError) or exc.exit_code == 2 else exc.exit_code)
    except EmpdpError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"Error: {_one_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException,
            duckdb.ConversionException, duckdb.InvalidInputException) as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"Error: the query or filter is not valid SQL for this source: "
                   f"{_one_line(str(exc).splitlines()[0])}", err=True)
        sys.exit(2)
    except (MemoryError, duckdb.OutOfMemoryException) as exc:
        click.echo(f"Error: out of memory ({_one_line(exc) or 'MemoryError'}); "
                   f"try --memory-limit or a machine with more memory", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("Error: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - last line of defence: one line, no traceback
        if debug:
            traceback.print_exc()
        click.echo(f"Error: internal error: {type(exc).__name__}: {_one_line(exc)} "
                   f"(rerun with --debug for a traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
