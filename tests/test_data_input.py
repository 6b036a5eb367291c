"""Sources whose id or label column mixes value types (JSON lines with 1 and "1")."""

import json
import os

import pytest
from click.testing import CliRunner

from empdp.assessment import assess
from empdp.cli.main import cli
from empdp.errors import InputError
from empdp.settings import Model


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
    with pytest.raises(InputError, match="among the rows `where` keeps"):
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


# ------------------------------------------------ silent or late failures (issue 23, item 11)

def _nulls_frame():
    import pandas as pd

    rows = [(f"i{i}", y, None if (i + y) % 5 == 0 else float(i)) for y in range(2000, 2005) for i in range(10)]
    return pd.DataFrame(rows, columns=["id", "year", "x"])


@pytest.mark.parametrize("query, expected", [("mean(x)", 10), ("median(x)", 10), ("var(x)", 10),
                                             ("sum(x)/sum(x)", 10), ("count(*)", 0)])
def test_null_values_are_counted_for_a_warning(query, expected):
    """20% NULL values were dropped without a word, even with -v."""
    from empdp.loo import make_engine

    engine = make_engine(_nulls_frame(), id="id", by="year", query=query)
    engine.values()
    assert engine.n_null_values == expected
    if expected:
        assert engine.null_values_warning.startswith("10 rows have a NULL 'x': the query skips")
    else:
        assert engine.null_values_warning is None


def test_null_values_are_counted_after_the_filter():
    from empdp.loo import make_engine

    engine = make_engine(_nulls_frame(), id="id", by="year", query="mean(x)", where="id <> 'i0'")
    engine.values()
    assert engine.n_null_values == 9  # i0 has one NULL row, which the filter removes


@pytest.mark.parametrize("column, kind", [("lid", "BIGINT[]"), ("sid", "STRUCT"), ("mid", "MAP")])
@pytest.mark.parametrize("option", ["id", "by"])
def test_nested_columns_cannot_name_individuals_or_databases(tmp_path, column, kind, option):
    import duckdb

    path = tmp_path / "nested.parquet"
    duckdb.sql(f"COPY (SELECT [i, 1] AS lid, {{'a': i}} AS sid, map([1], [i]) AS mid, "
               f"i::VARCHAR AS id, y AS year, i * 1.5 AS x FROM range(5) t(i), range(2000, 2003) u(y)) "
               f"TO '{path}'")
    cols = {"id": "id", "by": "year", option: column}
    res = CliRunner().invoke(cli, ["assess", str(path), "--id", cols["id"], "--by", cols["by"],
                                   "--query", "mean(x)", "-q"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert f"--{option} column '{column}' holds nested values" in res.output and kind in res.output


def test_json_arrays_cannot_name_individuals(tmp_path):
    src = _write(tmp_path / "ids.json", [{"id": [i], "year": y, "x": 1.0 * i} for i in range(4)
                                         for y in range(2000, 2003)])
    with pytest.raises(InputError, match="holds nested values|holds JSON arrays"):
        assess(src, id="id", by="year", query="mean(x)")


def test_many_databases_are_assessed_on_a_small_machine(monkeypatch):
    """5,000 databases on a machine of 1 GiB were refused before the scan, since the density model held
    every pair of query values (~1.4 GB); it holds O(n) now (tests/test_scale.py watches that), and
    one-row databases are refused by the `by` check instead (the median database's rows)."""
    import numpy as np
    import pandas as pd

    import empdp.data.connection

    monkeypatch.setattr(empdp.data.connection, "physical_memory", lambda: 2**30)  # 1 GiB: DuckDB's share 256 MB
    n = 5000 * 3  # three individuals in each database: labels of databases, not of rows
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"id": np.arange(n) % 3, "year": np.arange(n) // 3, "x": rng.standard_normal(n)})
    res = assess(df, id="id", by="year", query="mean(x)")
    assert res.n_databases == 5000 and res.eps_all > 0
    one_row = pd.DataFrame({"id": np.arange(5000), "year": np.arange(5000), "x": np.ones(5000)})
    with pytest.raises(InputError, match="not a column of database labels"):
        assess(one_row, id="id", by="year", query="mean(x)")


@pytest.mark.parametrize("limit, fragment", [("-1GB", "not a size"), ("-1", "not a size"), ("0", "not a size"),
                                             ("abc", "not a size"), ("1MB", "below the 16 MB"),
                                             ("200%", "share of memory"), ("1e30GB", "too large"),
                                             ("x" * 500, "not a size")])
def test_bad_memory_limits_are_refused(limit, fragment):
    """DuckDB reads '-1GB' as no limit at all, and a limit of 1MB failed late as out of memory."""
    from empdp.data import connect

    with pytest.raises(InputError, match=f"`memory_limit` .*{fragment}") as info:
        connect(limit)
    assert len(str(info.value)) < 250  # a long value is echoed shortened


@pytest.mark.parametrize("limit", ["16MB", "1GB", "3 GB", "1.5GiB", "50%", "1e3MB"])
def test_good_memory_limits_pass(limit):
    from empdp.data import close_connection, connect

    close_connection(connect(limit))


@pytest.mark.parametrize("threads", [0, -1, 10**6, True, 2.5])
def test_bad_thread_counts_are_refused(threads):
    """10^5 threads hung DuckDB (it starts them all)."""
    from empdp.data import connect

    with pytest.raises(InputError, match="`threads` .* must be an integer from 1 to"):
        connect(threads=threads)


@pytest.mark.parametrize("kw,match", [
    (dict(query="mean(x)", where="year = 'abc'"), "not valid SQL for this source: Conversion Error"),
    (dict(query="median(x)", where="nosuch > 1"), r"the filter `where` 'nosuch > 1' is not valid here: Binder Error"),
    (dict(sql="SELECT avg(nosuch) FROM db"), "`sql` failed on database 2000: Binder Error"),
])
def test_duckdb_errors_are_input_errors_in_the_library(tmp_path, kw, match):
    """The data layer turns DuckDB's bad-input errors into one-line InputError (the CLI's map is a fallback)."""
    from empdp.loo import leave_one_out

    src = _write(tmp_path / "p.json", _panel())
    with pytest.raises(InputError, match=match) as info:
        leave_one_out(src, id="id", by="year", **kw)
    assert "\n" not in str(info.value)
    args = ["assess", src, "--id", "id", "--by", "year", "-q"] + [f"--{k}={v}" for k, v in kw.items()]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "Error: " in res.output, res.output
    assert "`" not in res.output  # the library names parameters; the command line shows their flags


def test_arrow_columns_become_numpy_arrays_without_pandas():
    """data.arrow_numpy equals pyarrow's to_numpy (integers, floats, booleans, offset slices, chunked,
    nulls) and, unlike it, does not import pandas (0.2-0.35 s of every assess)."""
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa

    from empdp.data import arrow_numpy

    rng = np.random.default_rng(0)
    columns = [pa.array(rng.integers(0, 10**12, 1000)), pa.array(rng.normal(size=1000)),
               pa.array(rng.random(1000) < 0.3), pa.array(rng.normal(size=1000)).slice(3, 500),
               pa.array(rng.random(1000) < 0.5).slice(5, 333), pa.array(np.arange(10, dtype=np.int32)).slice(2),
               pa.chunked_array([pa.array([1.0, 2.0]), pa.array([3.0])]), pa.array([1.0, None, 3.0])]
    for column in columns:
        got, want = arrow_numpy(column), column.to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    # (columns from DuckDB, as in the engine: building one with pa.array imports pandas itself)
    code = ("import sys, duckdb; from empdp.data import arrow_numpy; "
            "t = duckdb.sql('SELECT range::BIGINT a, range / 3.0 b, range % 2 = 0 c FROM range(10)').arrow().read_all(); "
            "[arrow_numpy(t.column(i)) for i in range(3)]; print('pandas' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


@pytest.mark.parametrize("by", ["murdrate", "popul", "countyid_copy"])
def test_a_mistaken_by_fails_fast_naming_the_column_and_the_counts(tmp_path, by):
    """Issue 34: '--by murdrate' (a float column, by mistake) ran 498 s and 'succeeded' with 18,077 databases;
    it is refused before any leave-one-out work, naming the column and the counts."""
    import time

    from helpers import SAMPLE, one_line_error, run

    source = SAMPLE
    if by == "countyid_copy":  # an id-like column: one database per individual and year
        import duckdb

        source = tmp_path / "p.parquet"
        duckdb.sql(f"COPY (SELECT *, countyid * 100 + year % 100 AS countyid_copy FROM '{SAMPLE}') TO '{source}'")
    t0 = time.perf_counter()
    line = one_line_error(run("assess", source, "--id", "countyid", "--by", by, "--query", "mean(murdrate)"),
                          f"--by '{by}' makes", "databases of 37,349 rows", "median database holds")
    assert time.perf_counter() - t0 < 10, line  # seconds, not minutes


def test_three_rows_per_database_at_the_median_are_enough():
    import pandas as pd

    from empdp import assess

    df = pd.DataFrame({"id": [1, 2, 3] * 4, "db": [d for d in range(4) for _ in range(3)], "x": range(12)})
    assert assess(df, id="id", by="db", query="mean(x)", model=Model(kernel="laplace", bandwidth=1.0)).n_databases == 4
