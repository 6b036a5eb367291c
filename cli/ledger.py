"""``empdp ledger show|verify``: inspect a release ledger and print its chain head (README, "Release security")."""

from __future__ import annotations

from pathlib import Path

import click

from empdp.errors import InputError
from empdp.keys import load_key
from empdp.noise import Ledger
from empdp.noise.ledger_format import REAL, read_vector
from empdp.textfmt import fmt, terminal_safe

from ._common import emit_json, key_options, output_options, setup_logging

_COLUMNS = ("seq", "time", "query", "database", "epsilon", "noisy_value", "noise_added", "private", "source",
            "source_digest")


def _open(path: str, key_file, allow_unsigned) -> Ledger:
    book = Ledger(path, key=load_key(key_file), allow_unsigned=allow_unsigned)
    book.check_path()
    if not Path(path).exists():
        raise InputError(f"ledger {path!r} does not exist")
    return book


@click.group("ledger")
def ledger():
    """Show or verify a release ledger; print its chain head to record elsewhere."""


@ledger.command("verify")
@click.argument("ledger_path", metavar="LEDGER")
@click.option("--expect-head", metavar="HEX", help="A chain head recorded earlier: it must be in this ledger "
                                                   "(catches a ledger rolled back to an older copy).")
@key_options
@output_options
def verify(ledger_path, expect_head, key_file, allow_unsigned, as_json, quiet, verbose, debug):
    """Verify every record, the budget and the head of LEDGER under the curator key.

    Exit 0 if intact (printing the chain head), 2 with one line naming the
    first record that does not verify. Record the head somewhere the ledger's
    writers cannot change (a ticket, a signed e-mail, a second machine) and
    check it later with --expect-head.

    \b
    Examples:
      empdp ledger verify releases.sqlite --key-file curator.key
      empdp ledger verify releases.sqlite --expect-head 3f2a...c9 --json
    """
    setup_logging(verbose, quiet, debug)
    summary = _open(ledger_path, key_file, allow_unsigned).verify(expect_head=expect_head)
    if as_json:
        emit_json({"ok": True, "ledger": ledger_path, **summary})
    elif not quiet:
        budget = "no budget (unlimited)" if summary["budget"] is None else f"budget {fmt(summary['budget'])}"
        click.echo(f"ok: {fmt(summary['n_releases'])} releases, epsilon {fmt(summary['spent'])} spent, {budget}; "
                   f"{'signed with key ' + summary['key_id'] if summary['signed'] else 'UNSIGNED'}")
        click.echo(f"head {summary['head']}")


@ledger.command("show")
@click.argument("ledger_path", metavar="LEDGER")
@key_options
@output_options
def show(ledger_path, key_file, allow_unsigned, as_json, quiet, verbose, debug):
    """List the releases in LEDGER and print its chain head.

    With the curator key (--key-file or $EMPDP_KEY) the ledger is verified
    first, and a mismatch is refused as in 'empdp ledger verify'; without it
    the records are shown unverified, and say so.

    \b
    Examples:
      empdp ledger show releases.sqlite --key-file curator.key
      empdp ledger show releases.sqlite --json
    """
    setup_logging(verbose, quiet, debug)
    book = _open(ledger_path, key_file, allow_unsigned)
    summary = book.verify() if book.key is not None or allow_unsigned else None
    chain = book.chain()
    # a joint release's vectors (noisy value, noise scales and weights) are JSON text in their REAL columns
    records = [{k: read_vector(v) if k in REAL else v for k, v in r.items()} for r in chain if r["kind"] == "release"]
    head = summary["head"] if summary else (chain[-1].get("mac") or chain[-1].get("hash")) if chain else None
    if as_json:
        emit_json({"ledger": ledger_path, "verified": summary is not None, "summary": summary, "head": head,
                   "records": records})
        return
    if quiet:
        return
    for r in records:
        # the released value in full (it is what was published); epsilon to 4 digits like every number shown
        click.echo("  ".join(f"{k}={fmt(r.get(k)) if k == 'epsilon' else terminal_safe(r.get(k))}" for k in _COLUMNS))
    if summary is None:
        click.echo(f"{fmt(len(records))} releases, NOT VERIFIED (no curator key given)")
    else:
        budget = "no budget (unlimited)" if summary["budget"] is None else f"budget {fmt(summary['budget'])}"
        click.echo(f"{fmt(summary['n_releases'])} releases verified, epsilon {fmt(summary['spent'])} spent, {budget}")
    click.echo(f"head {head}")
