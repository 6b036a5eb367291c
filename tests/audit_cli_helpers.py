"""Shared helpers of the audit CLI input tests."""

from click.testing import CliRunner

import empdp.cli.main as main_mod


def run(*args):
    """``empdp audit ARGS...`` in-process; arguments may be numbers."""
    return CliRunner().invoke(main_mod.cli, ["audit", *map(str, args)])


def assert_one_line_exit_2(res, *fragments):
    """Bad input: exit 2, one 'Error:' line holding every fragment, no traceback."""
    out = res.output.strip()
    assert res.exit_code == 2, res.output
    assert "Traceback" not in out and "internal error" not in out
    assert out.startswith("Error:") and len(out.splitlines()) == 1, out
    for fragment in fragments:
        assert fragment in out, out
