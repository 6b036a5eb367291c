"""Sources whose id or label column mixes value types (JSON lines with 1 and "1")."""

import json
import os

import pytest
from click.testing import CliRunner

from empdp import assess
from empdp.cli.main import cli
from empdp.errors import InputError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _panel(mixed_id=False, mixed_year=False):
    return [{"id": str(i) if mixed_id and (i + y) % 2 else i, "year": str(y) if mixed_year and i == 1 else y,
             "x": (i * 7 + y * 3) % 11 / 10} for i in range(1, 6) for y in range(2000, 2005)]


@pytest.mark.parametrize("mixed_id,mixed_year,column", [(True, False, "'id'"), (False, True, "'year'")])
def test_mixed_json_types_are_refused(tmp_path, mixed_id, mixed_year, column):
    """DuckDB types such a column JSON and groups 1 apart from "1": 5 counties became 11."""
    src = _write(tmp_path / "mixed.json", _panel(mixed_id, mixed_year))
    with pytest.raises(InputError, match=f"column {column} mixes value types"):
        assess(src, id="id", by="year", query="mean(x)")
    res = CliRunner().invoke(cli, ["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)", "-q"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "mixes value types" in res.output


def test_one_json_type_is_fine(tmp_path):
    src = _write(tmp_path / "clean.json", _panel())
    assert assess(src, id="id", by="year", query="mean(x)").n_individuals == 5


def test_where_filters_rows_before_the_finiteness_check(tmp_path):
    """An infinite value in a row --where removes is never read; one in a kept row is refused."""
    rows = _panel()
    rows[0]["x"] = float("inf")  # JSON Infinity: id 1, year 2000
    src = tmp_path / "inf.json"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match="infinite"):
        assess(str(src), id="id", by="year", query="mean(x)")
    assert assess(str(src), id="id", by="year", query="mean(x)", where="x < 100").n_individuals == 5
    with pytest.raises(InputError, match="among the rows --where keeps"):
        assess(str(src), id="id", by="year", query="mean(x)", where="x > -1")


def test_sql_with_two_statements_is_refused():
    """DuckDB ran only the last statement and the tool then blamed 'the same query value'."""
    from empdp.query import parse_query

    with pytest.raises(InputError, match="one SELECT statement"):
        parse_query(sql="SELECT avg(x) FROM db; SELECT 1")
    assert parse_query(sql="SELECT avg(x) FROM db WHERE name <> 'a;b';").sql == \
        "SELECT avg(x) FROM db WHERE name <> 'a;b'"


# ---------------------------------------------------------------- spill folder (issue 23, item 5)

def _spill_dir(con):
    return con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]


def test_spill_folder_is_fresh_private_and_removed_on_close(tmp_path, monkeypatch):
    """A predictable /tmp/empdp-duckdb-<pid> (0755) let another user plant a symlink there."""
    import gc
    import stat
    import tempfile

    from empdp.data import close_connection, connect

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"empdp-duckdb-{os.getpid()}"
    (tmp_path / "victim").mkdir()
    planted.symlink_to(tmp_path / "victim")
    con = connect()
    spill = _spill_dir(con)
    assert os.path.realpath(spill) != os.path.realpath(planted) and not os.path.islink(spill)
    assert stat.S_IMODE(os.stat(spill).st_mode) == 0o700
    other = connect()
    assert _spill_dir(other) != spill  # not derived from the process id
    close_connection(con)
    assert not os.path.exists(spill)
    spill = _spill_dir(other)
    del other
    gc.collect()
    assert not os.path.exists(spill)  # removed with the connection


def test_spill_folder_is_removed_at_interpreter_exit(tmp_path):
    import subprocess
    import sys

    code = ("import tempfile; tempfile.tempdir = {!r}\n"
            "from empdp.data import connect\n"
            "con = connect()\n"
            "print(con.execute(\"SELECT current_setting('temp_directory')\").fetchall()[0][0])\n"
            ).format(str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    spill = out.stdout.strip()
    assert spill.startswith(str(tmp_path)) and not os.path.exists(spill)
