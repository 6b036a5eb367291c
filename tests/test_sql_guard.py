"""User SQL is one expression or one read-only SELECT, and reads only the source (issue 33, findings 2, 3
and 15; docs/user-sql.md): statement breaks, writes and file reads in every SQL-bearing input are
refused (one line, exit 2, no file written), and the opened source's connection cannot reach outside.

Figures: every variant of FILTER_ATTACKS is tried through each FILTER_ROUTE and every variant of
SELECT_ATTACKS through each SELECT_ROUTE, plus the library API; all must be refused.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from helpers import SAMPLE, one_line_error, run

import empdp
from empdp.data import open_panel
from empdp.errors import InputError
from empdp.loo import leave_one_out
from empdp.loo.joint import read_grouped

PASSWD = "/etc/passwd"

#: filters that try to leave their expression, write, or read outside the source ({out}: a target path)
FILTER_ATTACKS = [
    "1=1); COPY (SELECT 'echo x' AS a) TO '{out}' (HEADER false, QUOTE ''); SELECT (1",
    "1=1); COPY (SELECT 1) TO '{out}'; --",
    "1=1) ; /* ; */ COPY (SELECT 1) TO '{out}' ; SELECT (1",
    "x > 0 -- a comment\n); COPY (SELECT 1) TO '{out}'; SELECT (1",
    "((1=1))); COPY (SELECT 1) TO '{out}'; SELECT (((1",
    "name = 'a'); COPY (SELECT 1) TO '{out}'; SELECT ('b'",
    "name = 'it''s'); COPY (SELECT 1) TO '{out}'; SELECT ('",
    "$$a$$ = name); COPY (SELECT 1) TO '{out}'; SELECT ($$b$$",
    "1=1)\uff1b COPY (SELECT 1) TO '{out}'\uff1b SELECT (1",
    "1=1)\u037e COPY (SELECT 1) TO '{out}'\u037e SELECT (1",
    "1=1) OR (1=1",
    "1=1) UNION SELECT 1 FROM read_text('" + PASSWD + "') WHERE (1",
    "x IN (SELECT 1 FROM read_text('" + PASSWD + "'))",
    "length((SELECT string_agg(content, '') FROM read_text('" + PASSWD + "'))) > 0",
    "x IN (SELECT 1 FROM read_csv('" + PASSWD + "'))",
    "x IN (SELECT 1 FROM read_blob('" + PASSWD + "'))",
    "x IN (SELECT 1 FROM read_parquet('" + SAMPLE + "'))",
    "x IN (SELECT 1 FROM glob('/etc/*'))",
    "x IN (SELECT 1 FROM sniff_csv('" + PASSWD + "'))",
    "x IN (SELECT 1 FROM '" + PASSWD + "')",
    "x IN (SELECT 1 FROM __labels)",
    "x IN (SELECT 1 FROM duckdb_settings())",
    "x IN (SELECT 1 FROM query('SELECT 1'))",
    "x IN (WITH a AS (COPY (SELECT 1) TO '{out}') SELECT 1)",
    "x IN (WITH a AS (DELETE FROM __labels RETURNING *) SELECT 1)",
    "1=1); ATTACH '{out}' AS z; SELECT (1",
    "1=1); DETACH memory; SELECT (1",
    "1=1); INSTALL httpfs; SELECT (1",
    "1=1); LOAD httpfs; SELECT (1",
    "1=1); PRAGMA enable_profiling='json'; SELECT (1",
    "1=1); SET enable_external_access = true; SELECT (1",
    "1=1); RESET lock_configuration; SELECT (1",
    "1=1); CALL pragma_version(); SELECT (1",
    "1=1); EXPORT DATABASE '{out}'; SELECT (1",
    "1=1); IMPORT DATABASE '{out}'; SELECT (1",
    "1=1); CREATE TABLE t AS SELECT 1; SELECT (1",
    "1=1); INSERT INTO __labels VALUES (1, 99); SELECT (1",
    "1=1); UPDATE __labels SET __j = 0; SELECT (1",
    "1=1); DELETE FROM __labels; SELECT (1",
    "1=1); DROP TABLE __labels; SELECT (1",
    "1=1); ALTER TABLE __labels RENAME TO z; SELECT (1",
    "1=1); USE memory; SELECT (1",
    "1=1); CHECKPOINT; SELECT (1",
    "1=1); VACUUM; SELECT (1",
    "x > 0, x < 1",
    "x > 0 AS keep",
    "DISTINCT x > 0",
    "x > 0 FROM db",
    "x > 0 LIMIT 1",
]

#: SELECTs that try a second statement, a write, or a read outside the table db ({out}: a target path)
SELECT_ATTACKS = [
    "SELECT avg(x) FROM db; COPY (SELECT 1) TO '{out}'",
    "SELECT avg(x) FROM db; -- a comment\nCOPY (SELECT 1) TO '{out}'",
    "SELECT avg(x) FROM db /* ; */ ; COPY (SELECT 1) TO '{out}'",
    "SELECT avg(x) FROM db WHERE name <> ';'; COPY (SELECT 1) TO '{out}'",
    "SELECT avg(x) FROM db\uff1b COPY (SELECT 1) TO '{out}'",
    "WITH a AS (COPY (SELECT 1) TO '{out}') SELECT avg(x) FROM db",
    "WITH a AS (DELETE FROM __labels RETURNING *) SELECT avg(x) FROM db",
    "WITH a AS (INSERT INTO __labels VALUES (1, 99) RETURNING *) SELECT avg(x) FROM db",
    "WITH a AS (UPDATE __labels SET __j = 0 RETURNING *) SELECT avg(x) FROM db",
    "SELECT avg(x) + (SELECT count(*) FROM read_text('" + PASSWD + "')) FROM db",
    "SELECT avg(x) FROM db WHERE x IN (SELECT 1 FROM read_csv('" + PASSWD + "'))",
    "SELECT avg(x) FROM db, glob('/etc/*')",
    "SELECT avg(x) FROM db, '" + PASSWD + "'",
    "SELECT avg(x) FROM db UNION ALL SELECT count(*) FROM read_blob('" + PASSWD + "')",
    "SELECT avg(x) + (SELECT count(*) FROM read_parquet('" + SAMPLE + "')) FROM db",
    "SELECT avg(x) + (SELECT count(*) FROM __labels) FROM db",
    "SELECT avg(x) + (SELECT count(*) FROM __src) FROM db",
    "SELECT avg(x) + (SELECT count(*) FROM duckdb_settings()) FROM db",
    "SELECT avg(x) + (SELECT count(*) FROM query_table('__labels')) FROM db",
    "SELECT avg(x) FROM db; ATTACH '{out}' AS z",
    "SELECT avg(x) FROM db; INSTALL httpfs",
    "SELECT avg(x) FROM db; LOAD httpfs",
    "SELECT avg(x) FROM db; SET enable_external_access = true",
    "SELECT avg(x) FROM db; CALL pragma_version()",
    "COPY (SELECT avg(x) FROM db) TO '{out}'",
    "EXPORT DATABASE '{out}' -- FROM db",
    "PRAGMA version -- FROM db",
    "ATTACH '{out}' AS z -- FROM db",
    "CREATE TABLE t AS SELECT avg(x) FROM db",
    "INSERT INTO __labels SELECT 1, 99 FROM db",
    "DELETE FROM db",
    "EXPLAIN SELECT avg(x) FROM db",
]

#: how a filter reaches the engine on the command line
FILTER_ROUTES = {
    "assess --where": lambda src, f: ["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)", "--where", f],
    "assess --group-by --where": lambda src, f: ["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)",
                                                 "--group-by", "g", "--where", f],
    "assess joint --where": lambda src, f: ["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)",
                                            "--query", "sum(x)", "--where", f],
    "calibrate --where": lambda src, f: ["calibrate", src, "--id", "id", "--by", "year", "--query", "mean(x)",
                                         "-e", "1", "--where", f, "-o", str(Path(src).parent / "cal.json")],
}
#: how a SELECT reaches the engine on the command line
SELECT_ROUTES = {
    "assess --sql": lambda src, s: ["assess", src, "--id", "id", "--by", "year", "--sql", s],
    "assess --adversary-sql": lambda src, s: ["assess", src, "--id", "id", "--by", "year", "--query", "mean(x)",
                                              "--adversary-sql", s],
    "assess joint --sql": lambda src, s: ["assess", src, "--id", "id", "--by", "year", "--sql", s,
                                          "--sql", "SELECT sum(x) FROM db"],
    "assess --group-by --sql": lambda src, s: ["assess", src, "--id", "id", "--by", "year", "--group-by", "g",
                                               "--sql", s],
}


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """A small panel (12 ids x 6 years, two groups, names holding ';' and quotes) as Parquet."""
    rng = np.random.default_rng(3)
    rows = [(i, y, float(rng.gamma(2.0)), "ab"[i % 2], ["a;b", "it's", 'q"q'][i % 3])
            for y in range(2001, 2007) for i in range(12)]
    path = tmp_path_factory.mktemp("guard") / "small.parquet"
    pd.DataFrame(rows, columns=["id", "year", "x", "g", "name"]).to_parquet(path)
    return str(path)


#: every refusal points to what user SQL may do
DOC = "docs/user-sql.md"


def _refused_cli(args, target) -> None:
    res = run(*args)
    one_line_error(res, DOC)
    assert not target.exists(), f"{args!r} wrote {target}"


@pytest.mark.parametrize("route", sorted(FILTER_ROUTES))
@pytest.mark.parametrize("attack", FILTER_ATTACKS)
def test_filter_attack_refused_on_the_command_line(small, tmp_path, route, attack):
    target = tmp_path / "written"
    _refused_cli(FILTER_ROUTES[route](small, attack.format(out=target)), target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("route", sorted(SELECT_ROUTES))
@pytest.mark.parametrize("attack", SELECT_ATTACKS)
def test_select_attack_refused_on_the_command_line(small, tmp_path, route, attack):
    target = tmp_path / "written"
    _refused_cli(SELECT_ROUTES[route](small, attack.format(out=target)), target)
    assert list(tmp_path.iterdir()) == []


def test_the_finding_names_the_option_and_what_was_found(small, tmp_path):
    target = tmp_path / "x.sh"
    line = one_line_error(run(*FILTER_ROUTES["assess --where"](small, FILTER_ATTACKS[0].format(out=target))),
                          "--where", "second statement", "COPY", "one SQL expression", "docs/user-sql.md")
    assert len(line) < 400
    one_line_error(run(*SELECT_ROUTES["assess --sql"](small, "WITH a AS (COPY (SELECT 1) TO 'x') SELECT 1 FROM db")),
                   "--sql", "COPY is not allowed", "one SELECT")
    one_line_error(run(*SELECT_ROUTES["assess --sql"](small, f"SELECT count(*) FROM db, read_text('{PASSWD}')")),
                   "--sql", "read_text is not allowed")
    assert not target.exists()


@pytest.mark.parametrize("attack", FILTER_ATTACKS)
def test_a_file_field_used_as_a_filter_is_refused_by_the_library(small, tmp_path, attack):
    """A calibration's ``where`` (or any file's) reaching the leave-one-out as a filter."""
    target = tmp_path / "written"
    with pytest.raises(InputError, match=DOC):
        leave_one_out(small, id="id", by="year", query="mean(x)", where=attack.format(out=target))
    with pytest.raises(InputError, match=DOC):
        read_grouped(small, id="id", by="year", group_by="g", query="mean(x)", where=attack.format(out=target))
    assert not target.exists()


@pytest.mark.parametrize("attack", SELECT_ATTACKS)
def test_a_file_field_used_as_a_query_is_refused_by_the_library(small, tmp_path, attack):
    target = tmp_path / "written"
    with pytest.raises(InputError, match=DOC):
        leave_one_out(small, id="id", by="year", sql=attack.format(out=target))
    with pytest.raises(InputError, match=DOC):
        empdp.assess(small, id="id", by="year", sql=[attack.format(out=target), "SELECT sum(x) FROM db"])
    assert not target.exists()


@pytest.mark.parametrize("attack", FILTER_ATTACKS)
def test_the_panels_own_sql_refuses_a_hostile_filter(small, tmp_path, attack):
    """The boundary itself: a filter handed straight to the panel's SQL builders."""
    panel = open_panel(small, id="id", by="year")
    try:
        with pytest.raises(InputError, match=DOC):
            panel.fetchall(f"SELECT count(*) FROM ({panel.base_sql(['x'], attack.format(out=tmp_path / 'w'))})")
        with pytest.raises(InputError, match=DOC):
            panel.require_numeric("x", attack.format(out=tmp_path / "w"))
    finally:
        panel.close()
    assert list(tmp_path.iterdir()) == []


def _sources(tmp_path, small) -> dict:
    df = pd.read_parquet(small)
    (tmp_path / "hive" / "year=1").mkdir(parents=True)
    (tmp_path / "hive" / "year=2").mkdir(parents=True)
    df.drop(columns="year").to_parquet(tmp_path / "hive" / "year=1" / "a.parquet")
    df.drop(columns="year").assign(x=df.x + 1).to_parquet(tmp_path / "hive" / "year=2" / "b.parquet")
    df.to_csv(tmp_path / "small.csv", index=False)
    for y, part in df.groupby("year"):
        part.to_parquet(tmp_path / f"part_{y}.parquet")
    con = duckdb.connect(str(tmp_path / "u.duckdb"))
    con.execute("CREATE TABLE t AS SELECT * FROM df; CREATE TABLE secret AS SELECT 42 AS s")
    con.close()
    return {"file": small, "csv": str(tmp_path / "small.csv"), "glob": str(tmp_path / "part_*.parquet"),
            "folder": str(tmp_path / "hive"), "duckdb": f"{tmp_path / 'u.duckdb'}::t", "frame": df}


@pytest.mark.parametrize("kind", ["file", "csv", "glob", "folder", "duckdb", "frame"])
def test_every_kind_of_source_reads_after_lock_down_and_nothing_else(small, tmp_path, kind):
    """The source's files stay readable once external access is off; any other file, COPY, ATTACH or
    setting fails on the panel's connection, and the lock cannot be lifted."""
    source = _sources(tmp_path, small)[kind]
    by = "year"
    panel = open_panel(source, id="id", by=by)
    try:
        assert panel.fetchall("SELECT count(*) FROM __src")[0][0] == (144 if kind == "folder" else 72)
        res = leave_one_out(source, id="id", by=by, query="mean(x)", where="x > 0.5 -- keep")
        assert np.isfinite(res.q).all()
        for sql in (f"SELECT * FROM read_text('{PASSWD}')", f"SELECT * FROM read_csv('{PASSWD}')",
                    "SELECT * FROM glob('/etc/*')", f"COPY (SELECT 1) TO '{tmp_path / 'w.csv'}'",
                    f"ATTACH '{tmp_path / 'w.db'}' AS w", f"EXPORT DATABASE '{tmp_path / 'exp'}'",
                    "INSTALL httpfs", "LOAD httpfs", "SET enable_external_access = true",
                    "RESET enable_external_access", "SET lock_configuration = false", "SET threads = 1"):
            with pytest.raises(duckdb.Error):
                panel.con.execute(sql)
    finally:
        panel.close()
    assert not any((tmp_path / n).exists() for n in ("w.csv", "w.db", "exp"))


def test_getenv_is_not_there(small):
    """DuckDB's getenv (disabled with external access off, absent from the Python build) reads nothing."""
    with pytest.raises(InputError, match="getenv"):
        leave_one_out(small, id="id", by="year", query="mean(x)", where="getenv('HOME') IS NOT NULL")
    panel = open_panel(small, id="id", by="year")
    try:
        with pytest.raises(duckdb.Error):
            panel.con.execute("SELECT getenv('HOME')")
    finally:
        panel.close()


def test_a_hostile_read_on_the_locked_connection_is_one_line(small):
    panel = open_panel(small, id="id", by="year")
    try:
        with pytest.raises(InputError, match="reaches outside the source.*docs/user-sql.md"):
            panel.fetchall(f"SELECT * FROM read_text('{PASSWD}')")
    finally:
        panel.close()


@pytest.mark.parametrize("where", ["murdrate > 1 AND countyid <> 1001", '"murdrate" >= 0', "murdrate > 1 -- drop zeros",
                                   "CAST(countyid AS VARCHAR) <> 'a;b'", "murdrate /* rate */ > 0.5",
                                   "countyid IN (SELECT unnest([1001, 1003]) UNION SELECT 1005) OR murdrate > 0"])
def test_legitimate_filters_still_work(where):
    res = run("assess", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)", "--where", where)
    assert res.exit_code == 0, res.output


def test_legitimate_filters_and_queries_on_the_library(small):
    for where in ("name <> 'a;b'", "name = 'it''s' OR name = 'q\"q' OR x > 1", "\"x\" > 0 -- trailing comment"):
        res = leave_one_out(small, id="id", by="year", query="mean(x)", where=where)
        assert np.isfinite(res.q).all()
    plain = leave_one_out(small, id="id", by="year", query="mean(x)", where="x > 0.5")
    for sql in ("SELECT avg(x) FROM db WHERE x > 0.5 AND name <> ';' -- a comment",
                "WITH v AS (SELECT x FROM db WHERE x > 0.5) SELECT avg(x) FROM v;",
                "FROM db SELECT avg(x) WHERE x > 0.5"):
        res = leave_one_out(small, id="id", by="year", sql=sql)
        np.testing.assert_allclose(res.q, plain.q)
    grouped = read_grouped(small, id="id", by="year", group_by="g", query="mean(x)", where="x > 0.2 -- c")
    assert grouped.q.shape == (6, 2)


def test_spark_sql_with_a_backslash_is_refused_before_spark_sees_it():
    """Spark's strings escape a quote with a backslash and DuckDB's do not: a text DuckDB reads as one
    string could end early for Spark, so none goes to Spark (the DuckDB checks run first)."""
    from empdp.spark.sql import _scalar

    class NoSpark:
        def sql(self, text):
            raise AssertionError(f"Spark was sent {text!r}")

    with pytest.raises(InputError, match="backslash.*docs/user-sql.md"):
        _scalar(NoSpark(), "SELECT avg(x) FROM db WHERE name <> 'a\\'' --'", "2001")
