"""``empdp report``: the HTML report of a saved assessment (issue 5), and the report options of assess."""

from __future__ import annotations

import math

import click

from empdp.errors import InputError
from empdp.io import load_hash_key, read_json, refuse_overwrite

from ._common import (
    check_output,
    emit_json,
    given_options,
    key_options,
    log,
    output_options,
    progress_bars,
    setup_logging,
)


def extras_options(f):
    """``--calibration`` and ``--audit``: optional sections of the report."""
    f = click.option("--audit", "audit", metavar="AUDIT.json",
                     help="Add an audit section to the HTML report: the JSON printed by "
                          "'empdp audit mpl|renyi|release --json'.")(f)
    f = click.option("--calibration", "calibration", metavar="CAL.json",
                     help="Add a noise-calibration section to the HTML report: the JSON written by "
                          "'empdp calibrate', its signature checked with the curator key (--key-file or "
                          "$EMPDP_KEY) before any field is used.")(f)
    return key_options(f)


def load_extras(calibration: str | None, audit: str | None, key_file: str | None = None,
                allow_unsigned: bool = False) -> tuple[dict | None, dict | None]:
    """Read and check the ``--calibration`` (its signature first) and ``--audit`` files, before any long
    computation."""
    if not calibration and not audit:  # nothing to read: no need to import the report (matplotlib)
        return None, None
    from empdp.keys import load_key
    from empdp.noise import Calibration
    from empdp.report import audit_kind

    cal = None
    if calibration:
        cal = Calibration.load(calibration, key=load_key(key_file), allow_unsigned=allow_unsigned).to_dict()
    aud = None
    if audit:
        aud = read_json(audit, "audit file", " (write one with 'empdp audit ... --json > FILE')")
        try:
            kind = audit_kind(aud, audit)
        except InputError as exc:
            msg = str(exc)
            raise InputError(msg if msg.startswith("audit result") else f"--audit {audit!r}: {msg}") from None
        log.info("audit %s: %s", audit, kind)
    if cal:
        log.info("calibration %s: epsilon %g, lambda* %.6g", calibration, cal["epsilon"], cal["lambda"])
    return cal, aud


def check_epsilon(epsilon: float | None) -> None:
    if epsilon is not None and not (math.isfinite(epsilon) and 0 <= epsilon <= 700):
        raise InputError(f"--epsilon must be in [0, 700] (e^epsilon overflows beyond); got {epsilon:.4g}")


@click.command("report")
@click.argument("result")
@click.option("-o", "--output", required=True, metavar="FILE", help="Write the HTML report to FILE.html (mode 0600).")
@extras_options
@click.option("--epsilon", "-e", type=float, help="The ε to mark and to evaluate the table at "
                                                  "(default: the smallest assessed ε).")
@click.option("--hash-ids", is_flag=True, help="Replace ids by a keyed hash (HMAC-SHA256) in the report.")
@click.option("--hash-key-file", metavar="FILE", help="File holding the --hash-ids key (default: $EMPDP_HASH_KEY).")
@output_options
def report(result, output, calibration, audit, key_file, allow_unsigned, epsilon, hash_ids, hash_key_file, as_json,
           quiet, verbose, debug):
    """The HTML report of an assessment saved with 'empdp assess --save-result'.

    Renders the same self-contained report as 'empdp assess --report', without
    re-reading the data, optionally with a calibration and an audit section
    (one statistic). A joint result (2-3 statistics) gets the joint report at
    its smallest assessed epsilon.

    \b
    Examples:
      empdp assess sample_data/countymurders.parquet --id countyid --by year \\
          --query "mean(murdrate)" --save-result murders.json
      empdp calibrate sample_data/countymurders.parquet --id countyid --by year \\
          --query "mean(murdrate)" -e 1 -o cal.json
      empdp report murders.json --calibration cal.json -e 1 -o report.html
    """
    from empdp.assessment.result import load_result
    from empdp.report import render_report, report_sections


    setup_logging(verbose, quiet, debug)
    check_output(output, "-o", (".html", ".htm"), ".html")
    refuse_overwrite(output, result, calibration, audit, option="-o")
    check_epsilon(epsilon)
    key = load_hash_key(hash_key_file) if hash_ids or hash_key_file else None
    saved = load_result(result)
    log.info("result %s: %s over %d databases, %d individuals (%d rows and %d shift rows saved)", result,
             saved.statistic, saved.n_databases, saved.n_individuals, saved.individuals.height,
             len(saved.saved_shifts))
    saved.kind.refuse(given_options(click.get_current_context(), ("calibration", "audit")), saved.n_statistics)
    cal, aud = load_extras(calibration, audit, key_file, allow_unsigned)
    audit_key = key
    if aud is not None and aud.get("ids_hashed"):
        audit_key = None  # 'empdp audit release --hash-ids' wrote pseudonyms already
    elif saved.ids_hashed and aud is not None and aud.get("individuals") and not key:
        raise InputError(f"the ids in {result!r} are pseudonyms but those of the audit {audit!r} are not: pass "
                         "--hash-ids (with the key the result was saved with) so the report names nobody")
    if key and saved.ids_hashed:
        log.info("the ids in %s are already pseudonyms; not hashing them again", result)
        key = None
    with progress_bars(not (as_json or quiet), log) as progress:
        progress(f"writing {output}", 0, 0)
        render_report(saved, output, epsilon=epsilon, calibration=cal, audit=aud, hash_ids=key or False,
                      audit_hash_ids=audit_key or False)
        progress(f"writing {output}", 1, 1)
    sections = report_sections(saved, cal, aud)
    if as_json:
        emit_json({"report": output, "sections": sections})
    elif not quiet:
        click.echo(f"HTML report written to {output} (mode 0600)")
