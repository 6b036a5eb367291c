"""Shared CLI plumbing: output options, JSON, progress bars, atomic table writes."""

from __future__ import annotations

import json
import logging
import math
import sys
from contextlib import contextmanager

import click
import numpy as np

log = logging.getLogger("empdp")


def output_options(f):
    """``--json``, ``--quiet``, ``-v/--verbose`` and ``--debug`` for a command."""
    f = click.option("--debug", is_flag=True, help="Show tracebacks on errors.")(f)
    f = click.option("-v", "--verbose", count=True, help="Log progress details to stderr (-vv for more).")(f)
    f = click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors (and --json output).")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print one JSON object to stdout, nothing else.")(f)
    return f


def setup_logging(verbose: int, quiet: bool, debug: bool) -> None:
    ctx = click.get_current_context()
    ctx.meta["empdp.debug"] = debug
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(message)s", force=True)


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    return obj


def emit_json(obj) -> None:
    """Print ``obj`` as strict JSON (non-finite numbers become null)."""
    click.echo(json.dumps(_clean(obj), allow_nan=False))


@contextmanager
def progress_bars(enabled: bool):
    """Yield a ``progress(stage, done, total)`` callback drawing rich bars on stderr.

    Bars appear only when ``enabled`` and stderr is a terminal, so ``--json``
    output and pipes stay clean.
    """
    if not enabled or not sys.stderr.isatty():
        yield lambda stage, done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bars:
        tasks: dict = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=max(total, 1))
            bars.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


def write_table(df, path: str) -> None:
    """Write a polars frame to Parquet or CSV (by extension), atomically, owner-only."""
    from empdp.errors import InputError
    from empdp.io import atomic_path

    lower = path.lower()
    if not lower.endswith((".parquet", ".pq", ".csv")):
        raise InputError(f"--out {path!r} must end in .parquet or .csv")
    with atomic_path(path, private=True) as tmp:
        if lower.endswith(".csv"):
            df.write_csv(tmp)
        else:
            df.write_parquet(tmp)
