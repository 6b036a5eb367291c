"""The second red team's release-path findings (issue 33), each by its class (docs/release-security.md).

Findings 1 (a planted trigger swallows the record), 7 (empty or mistyped ledgers), 8 (``ledger verify``
on empty files and read-only file systems), 9 (key files), 10 (what a release was computed from) and the
new ``--expect-head`` of ``release``. Every refusal is one line, exit 2, the ledger byte for byte as it
was and no value printed.
"""

import hashlib
import json
import os
import sqlite3
import subprocess
import time

import pytest
from helpers import SAMPLE, one_line_error, run, write_key
from test_release_security import KEY

from empdp.digest import VALUE_GIVEN, source_digest
from empdp.errors import InputError
from empdp.keys import MAX_KEY_FILE_BYTES, load_key
from empdp.noise import Ledger
from empdp.noise import ledger as ledger_module

pytestmark = pytest.mark.usefixtures("curator_key")  # $EMPDP_KEY = KEY (tests/conftest.py)


@pytest.fixture(scope="module")
def sample_cal(tmp_path_factory):
    """A calibration of the sample's yearly mean murder rate (it stores its query, so SOURCE releases)."""
    path = tmp_path_factory.mktemp("sample") / "cal.json"
    res = run("calibrate", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)", "-e", 0.5,
              "--kernel", "laplace", "--bandwidth", 0.05, "-o", path, "-q", env={"EMPDP_KEY": KEY.decode()})
    assert res.exit_code == 0, res.output
    return path


@pytest.fixture
def ledger(tmp_path, cal_path):
    """A signed ledger with a budget of 1 holding two releases of epsilon 0.1."""
    path = tmp_path / "l.sqlite"
    for _ in range(2):
        assert release(cal_path, path, "--budget", 1).exit_code == 0
    return path


def release(cal, ledger, *extra):
    return run("release", cal, "--value", 1.5, "--ledger", ledger, "--json", *extra)


def refused(res, ledger, before, *fragments):
    """One line, exit 2, no value on stdout, the ledger unchanged."""
    one_line_error(res, *fragments)
    assert res.stdout == "" and ledger.read_bytes() == before


def plant(path, *statements):
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()


# ------------------------------------------------ finding 1: schema objects of every kind

SCHEMA_ATTACKS = {
    "RAISE(IGNORE) on the release INSERT and on the head (the red team's)": (
        "CREATE TRIGGER z1 BEFORE INSERT ON chain WHEN NEW.kind='release' BEGIN SELECT RAISE(IGNORE); END",
        "CREATE TRIGGER z2 BEFORE INSERT ON meta BEGIN SELECT RAISE(IGNORE); END"),
    "AFTER INSERT trigger deleting the record": (
        "CREATE TRIGGER z AFTER INSERT ON chain BEGIN DELETE FROM chain WHERE seq = NEW.seq; END",),
    "AFTER INSERT trigger rewriting epsilon": (
        "CREATE TRIGGER z AFTER INSERT ON chain BEGIN UPDATE chain SET epsilon = 1e-9 WHERE seq = NEW.seq; END",),
    "trigger on meta replacing the head": (
        "CREATE TRIGGER z BEFORE INSERT ON meta WHEN NEW.key = 'head' BEGIN SELECT RAISE(IGNORE); END",),
    "INSTEAD OF trigger on the view": (
        "CREATE TRIGGER z INSTEAD OF INSERT ON releases BEGIN SELECT 1; END",),
    "an extra index": ("CREATE INDEX z ON chain(kind)",),
    "an extra unique index that refuses a second release": ("CREATE UNIQUE INDEX z ON chain(time)",),
    "an extra view": ("CREATE VIEW z AS SELECT 1",),
    "an extra table": ("CREATE TABLE z (a)",),
    "an extra column": ("ALTER TABLE chain ADD COLUMN z TEXT",),
    "the positive-epsilon trigger weakened": (
        "DROP TRIGGER chain_positive_epsilon",
        "CREATE TRIGGER chain_positive_epsilon BEFORE INSERT ON chain BEGIN SELECT 1; END"),
    "the append-only trigger dropped": ("DROP TRIGGER chain_no_delete",),
    "the view redefined": ("DROP VIEW releases", "CREATE VIEW releases AS SELECT * FROM chain WHERE 0"),
}


@pytest.mark.parametrize("attack", SCHEMA_ATTACKS)
def test_a_schema_empdp_did_not_write_is_refused_before_anything(tmp_path, cal_path, ledger, attack):
    plant(ledger, *SCHEMA_ATTACKS[attack])
    before = ledger.read_bytes()
    refused(release(cal_path, ledger), ledger, before, "schema is not one empdp writes", str(ledger))
    for command in ("verify", "show"):
        refused(run("ledger", command, ledger), ledger, before, "schema is not one empdp writes")
    with pytest.raises(InputError, match="schema is not one empdp writes"):
        Ledger(ledger, key=KEY).verify()


def test_the_read_back_catches_a_swallowed_record_even_past_the_schema_check(tmp_path, ledger, monkeypatch):
    """Defence in depth: were the schema check bypassed, the record read back inside the transaction
    is missing, so the release is rolled back and no value comes out."""
    plant(ledger, *SCHEMA_ATTACKS["RAISE(IGNORE) on the release INSERT and on the head (the red team's)"])
    monkeypatch.setattr(Ledger, "_layout", lambda self, con: "v3")
    book = Ledger(ledger, key=KEY)
    fields = dict(query="q", epsilon=0.1, private=True, source_digest=VALUE_GIVEN)
    with pytest.raises(InputError, match="did not store the record|did not read back"):
        book.append(fields, lambda: 1.0)
    monkeypatch.undo()
    plant(ledger, "DROP TRIGGER z1", "DROP TRIGGER z2")
    assert Ledger(ledger, key=KEY).verify()["n_releases"] == 2  # nothing was recorded, nothing half-written


def test_a_schema_changed_between_open_and_transaction_is_refused(tmp_path, ledger, monkeypatch):
    """The schema is checked again inside the release's transaction (another process may change it)."""
    real = ledger_module.Ledger._connect

    def connect_then_plant(self, write):
        opened = real(self, write)
        if write:
            plant(ledger, "CREATE TABLE z (a)")
        return opened

    monkeypatch.setattr(ledger_module.Ledger, "_connect", connect_then_plant)
    with pytest.raises(InputError, match="schema"):
        Ledger(ledger, key=KEY).append(dict(query="q", epsilon=0.1, private=True, source_digest=VALUE_GIVEN),
                                       lambda: 1.0)


# --------------------------------------------- finding 7: no silent new, empty or unlimited ledger

def test_a_missing_ledger_needs_an_explicit_budget_and_is_announced(tmp_path, cal_path):
    typo = tmp_path / "relaeses.sqlite"
    one_line_error(release(cal_path, typo), "does not exist", "--budget N", "--budget unlimited")
    default = cal_path.with_suffix(".ledger.sqlite")
    one_line_error(run("release", cal_path, "--value", 1), "does not exist", str(default))
    assert not typo.exists() and not default.exists()
    res = release(cal_path, typo, "--budget", "unlimited")
    assert res.exit_code == 0 and f"Started a new ledger {typo} with no budget limit" in res.stderr
    res = release(cal_path, tmp_path / "b.sqlite", "--budget", 0.5)
    assert res.exit_code == 0 and "with a total-epsilon budget of 0.5" in res.stderr
    again = release(cal_path, typo)
    assert again.exit_code == 0 and "Started" not in again.stderr
    assert typo.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("budget", ["abc", "unlimitted", "nan", "-1", "0", ""])
def test_a_bad_budget_is_refused(tmp_path, cal_path, budget):
    one_line_error(release(cal_path, tmp_path / "l.sqlite", "--budget", budget), "--budget", "'unlimited'")
    assert not (tmp_path / "l.sqlite").exists()


def test_unlimited_cannot_replace_a_budget(tmp_path, cal_path, ledger):
    before = ledger.read_bytes()
    refused(release(cal_path, ledger, "--budget", "unlimited"), ledger, before, "budget of 1", "cannot be changed")


# ------------------------------------------------ finding 8: ledger verify, empty and read-only

@pytest.mark.parametrize("content", [b"", b"\0" * 4096, b"SQLite format 3\0"])
def test_ledger_commands_on_an_empty_or_cut_file_are_one_line(tmp_path, content):
    path = tmp_path / "e.sqlite"
    path.write_bytes(content)
    for command in ("verify", "show"):
        one_line_error(run("ledger", command, path), str(path), "not a readable empdp ledger")
    assert path.read_bytes() == content


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder on a file system mounted read-only (needs root, as in CI; skipped elsewhere)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("mounting a file system needs root")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_ledger_verify_works_on_a_read_only_file_system(tmp_path, cal_path, read_only_folder):
    path = read_only_folder / "l.sqlite"
    for _ in range(2):
        assert release(cal_path, path, "--budget", 1).exit_code == 0
    head = Ledger(path, key=KEY).verify()["head"]
    assert subprocess.run(["mount", "-o", "remount,ro", str(read_only_folder)]).returncode == 0
    res = run("ledger", "verify", path, "--expect-head", head)
    assert res.exit_code == 0 and "ok: 2 releases" in res.output and head in res.output, res.output
    assert run("ledger", "show", path, "--json").exit_code == 0
    one_line_error(release(cal_path, path), str(path))  # a release cannot be recorded there: refused


# --------------------------------------------------------------------- finding 9: key files

@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o602, 0o644])
def test_a_key_file_others_can_read_or_change_is_refused(tmp_path, cal_path, mode):
    key_file = write_key(tmp_path / "k", KEY)
    key_file.chmod(mode)
    one_line_error(release(cal_path, tmp_path / "l.sqlite", "--key-file", key_file), "chmod 600", str(key_file))
    one_line_error(run("calibrate", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
                       "-e", 1, "-o", tmp_path / "c.json", "--key-file", key_file), "chmod 600")
    one_line_error(run("assess", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
                       "--hash-ids", "--hash-key-file", key_file, "--out", tmp_path / "o.csv"),
                   "chmod 600", "--hash-key-file")  # the id-hashing key too: every key file is one class
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_a_key_file_that_is_not_a_small_regular_file_is_refused_at_once(tmp_path):
    big = write_key(tmp_path / "big", b"x" * (MAX_KEY_FILE_BYTES + 1))
    with pytest.raises(InputError, match="larger than"):
        load_key(big)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    for device in ("/dev/zero", fifo):  # /dev/zero used to be read until memory ran out; a FIFO would block
        t0 = time.perf_counter()
        with pytest.raises(InputError, match="not a regular file"):
            load_key(device)
        assert time.perf_counter() - t0 < 1.0
    assert load_key(write_key(tmp_path / "ok", KEY + b"\n")) == KEY


# ------------------------------------------------ finding 10: a release is tied to its data

def test_the_ledger_records_the_source_released_from_and_its_digest(tmp_path, sample_cal):
    path = tmp_path / "l.sqlite"
    assert release(sample_cal, path, "--budget", "unlimited").exit_code == 0
    res = run("release", sample_cal, SAMPLE, "--database", 1990, "--ledger", path, "--json")
    assert res.exit_code == 0, res.output
    given, computed = Ledger(path, key=KEY).records()
    assert given["source"] is None and given["source_digest"] == VALUE_GIVEN
    with open(SAMPLE, "rb") as f:
        assert computed["source_digest"] == "sha256:" + hashlib.sha256(f.read()).hexdigest()  # as sha256sum
    assert computed["source"] == SAMPLE and computed["database"] == "1990"
    shown = json.loads(run("ledger", "show", path, "--json").stdout)["records"]
    assert [r["source_digest"] for r in shown] == [VALUE_GIVEN, computed["source_digest"]]


def test_the_digest_of_several_files_is_that_of_their_sorted_digests(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    for name, data in (("b.csv", b"x\n2\n"), ("a.csv", b"x\n1\n")):
        (folder / name).write_bytes(data)
    digests = sorted(hashlib.sha256(d).hexdigest() for d in (b"x\n1\n", b"x\n2\n"))
    expected = "sha256-files:" + hashlib.sha256("".join(d + "\n" for d in digests).encode()).hexdigest()
    assert source_digest(str(folder)) == source_digest(str(folder / "*.csv")) == expected
    (folder / "a.csv").write_bytes(b"x\n3\n")
    assert source_digest(str(folder)) != expected


def test_a_source_that_changes_while_it_is_read_is_not_released(tmp_path, sample_cal, monkeypatch):
    import empdp.noise.source as source

    data = tmp_path / "d.parquet"
    data.write_bytes(open(SAMPLE, "rb").read())
    real = source.database_values

    def touched(*args, **kwargs):
        value = real(*args, **kwargs)
        os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
        return value

    monkeypatch.setattr(source, "database_values", touched)
    one_line_error(run("release", sample_cal, data, "--database", 1990, "--ledger", tmp_path / "l.sqlite",
                       "--budget", 1), "changed while it was read")
    assert not (tmp_path / "l.sqlite").exists()


# ------------------------------------------------------------------ release --expect-head

def test_release_expect_head_refuses_a_rolled_back_ledger(tmp_path, cal_path, ledger):
    old = ledger.read_bytes()
    assert release(cal_path, ledger).exit_code == 0
    head = Ledger(ledger, key=KEY).verify()["head"]
    assert release(cal_path, ledger, "--expect-head", head).exit_code == 0  # grown since: still holds it
    for p in ledger.parent.glob("l.sqlite-*"):
        p.unlink()
    ledger.write_bytes(old)  # rolled back to a copy from before that head
    refused(release(cal_path, ledger, "--expect-head", head), ledger, old, "expected head", "rolled back")
    one_line_error(release(cal_path, tmp_path / "new.sqlite", "--budget", 1, "--expect-head", head),
                   "does not exist")
    assert not (tmp_path / "new.sqlite").exists()


# -------------------------------------------- finding 6: a new period needs only that period

@pytest.fixture(scope="module")
def year_1990(tmp_path_factory):
    """The sample's 1990 rows alone: a new year's table, as a curator receives it."""
    import duckdb

    path = tmp_path_factory.mktemp("new") / "new_year.parquet"
    duckdb.sql(f"COPY (SELECT * FROM read_parquet('{SAMPLE}') WHERE year = 1990) TO '{path}'")
    return path


def test_release_of_a_new_period_needs_only_that_period(tmp_path, sample_cal, year_1990):
    path = tmp_path / "l.sqlite"
    alone = run("release", sample_cal, year_1990, "--database", 1990, "--ledger", path, "--budget", 3, "--seed", 5,
                "--json")
    assert alone.exit_code == 0, alone.output  # it said "at least 2 databases are needed"
    panel = run("release", sample_cal, SAMPLE, "--database", 1990, "--ledger", path, "--seed", 5, "--json")
    assert json.loads(alone.stdout)["value"] == json.loads(panel.stdout)["value"]  # the same f(X^1990)
    one_line_error(run("release", sample_cal, year_1990, "--database", 1991, "--ledger", path),
                   "database '1991' is not in 'year'", "it has: 1990")
    records = Ledger(path, key=KEY).records()
    assert [r["source"] for r in records] == [str(year_1990), SAMPLE]
    assert records[0]["source_digest"] != records[1]["source_digest"]


def test_joint_release_of_a_new_period_needs_only_that_period(tmp_path, year_1990):
    cal = tmp_path / "joint.json"
    res = run("calibrate", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)",
              "--query", "sum(murders)", "-e", 1, "-o", cal, "-q")
    assert res.exit_code == 0, res.output
    res = run("release", cal, year_1990, "--database", 1990, "--ledger", tmp_path / "l.sqlite", "--budget", 1,
              "--json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["value"]) == 2


# ------------------------------ finding 2, the file's side: no field is used before the signature

def test_audit_release_checks_the_signature_before_any_field(tmp_path, sample_cal):
    """The red team's unsigned calibration whose 'where' broke out into a COPY: refused on its signature,
    before its query or filter is read (the SQL guard would refuse the text too: docs/user-sql.md)."""
    target = tmp_path / "planted.sh"
    d = json.loads(sample_cal.read_text())
    d["where"] = (f"1=1); COPY (SELECT 'echo x' AS a) TO '{target}' (HEADER false, QUOTE ''); SELECT (1")
    for k in ("digest", "hmac", "key_id"):
        d.pop(k)
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(d))
    one_line_error(run("audit", "release", forged, SAMPLE, "--seed", 1), "is not signed", "--allow-unsigned")
    signed_edit = tmp_path / "edited.json"
    signed_edit.write_text(json.dumps({**json.loads(sample_cal.read_text()), "where": d["where"]}))
    one_line_error(run("audit", "release", signed_edit, SAMPLE, "--seed", 1), "was edited after")
    res = run("audit", "release", forged, SAMPLE, "--seed", 1, "--allow-unsigned")
    assert res.exit_code == 2 and "--where" in res.output or "where" in res.output, res.output
    assert not target.exists()


@pytest.mark.parametrize("field, text", [
    ("where", "1=1); COPY (SELECT 1) TO '/tmp/x' (HEADER false); SELECT (1"),
    ("where", "countyid IN (SELECT 1 FROM read_text('/etc/passwd'))"),
    ("sql", "SELECT avg(murdrate) FROM db; ATTACH 'x.db'"),
    ("sql", "WITH w AS (DELETE FROM db RETURNING *) SELECT count(*) FROM w"),
])
def test_sql_in_a_signed_calibration_is_still_only_one_expression_or_select(tmp_path, sample_cal, field, text):
    """Signed by the curator or not, a calibration's SQL fields are checked as the options are, naming
    the file's field (what only the key-holder could write must still not run as anything else)."""
    from empdp.noise import Calibration

    d = Calibration.load(sample_cal, key=KEY).to_dict()
    d[field] = text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    res = run("release", bad, SAMPLE, "--database", 1990, "--budget", 1, "--ledger", tmp_path / "l.sqlite",
              "--allow-unsigned")
    one_line_error(res, f"field '{field}'")
    assert not (tmp_path / "l.sqlite").exists() and not os.path.exists("/tmp/x")
