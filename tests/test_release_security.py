"""Keyed integrity of calibrations and ledgers: the tampering table of issue 23 (docs/release-security.md).

Each row is what an attacker with write access to the files but without the
curator key tried; each must be refused by ``release`` (exit 2, one line,
nothing written) and by ``ledger verify``.
"""

import hashlib
import json
import os
import sqlite3
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import CURATOR_KEY, SAMPLE, one_line_error, run, write_key

from empdp.keys import key_id
from empdp.noise import Calibration, Ledger, calibrate_values
from empdp.noise.ledger_format import CHAIN_FIELDS, SCHEMA
from empdp.noise.ledger_format import body as _body

KEY = CURATOR_KEY
OTHER = b"another-curators-key-abcdefghijklmn"


def make_calibration(scale=0.01):
    """A calibration at epsilon 0.1 of 15 databases and 40 individuals (noise added unless ``scale`` is wide)."""
    rng = np.random.default_rng(4)
    q = rng.normal(size=15)
    shifts = rng.normal(size=(40, 15)) * 0.05 * (rng.random((40, 15)) < 0.3)
    density = SimpleNamespace(kernel="laplace", scale=scale, selected_by="test", candidates=[scale], loglik=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibrate_values(q, shifts, epsilon=0.1, density=density)


pytestmark = pytest.mark.usefixtures("curator_key")  # $EMPDP_KEY = KEY (tests/conftest.py)


@pytest.fixture(scope="module")
def cal_dict(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    make_calibration().save(path, key=KEY)
    d = json.loads(path.read_text())
    assert d["noise"]["kind"] == "laplace_mixture" and d["key_id"] == key_id(KEY)
    return d


def write(path, d):
    path.write_text(json.dumps(d, indent=2))
    return path


def sha_digest(d):
    body = {k: v for k, v in d.items() if k not in ("digest", "hmac", "key_id")}
    return hashlib.sha256(json.dumps(body, indent=2, sort_keys=True).encode()).hexdigest()


def release(cal, ledger, *extra):
    return run("release", cal, "--value", 1.5, "--ledger", ledger, "--budget", 0.3, "--json", *extra)


@pytest.fixture
def ledger(tmp_path, cal_dict):
    """A signed ledger (budget 0.3) holding two releases of epsilon 0.1."""
    cal = write(tmp_path / "cal.json", cal_dict)
    path = tmp_path / "l.sqlite"
    for _ in range(2):
        assert release(cal, path).exit_code == 0
    return path


def assert_refused(res, ledger, before, *fragments):
    one_line_error(res, *fragments)
    assert ledger.read_bytes() == before


# ----------------------------------------------------------- calibration tampering

def _eps_tiny(d):
    d.update(epsilon=1e-9, verified_eps_max=1e-9)


def _no_noise(d):
    d["noise"] = {"kind": "none", "weight_zero": 1.0, "scale": 0.0}
    d["expected_abs_noise"] = 0.0


CAL_TAMPER = {
    "digest removed, epsilon 1e-9": (lambda d: (d.pop("digest"), _eps_tiny(d)), "was edited after"),
    "digest recomputed (SHA-256), epsilon 1e-9": (lambda d: (_eps_tiny(d), d.update(digest=sha_digest(d))),
                                                  "was edited after"),
    "noise set to none, digest recomputed": (lambda d: (_no_noise(d), d.update(digest=sha_digest(d))),
                                             "was edited after"),
    "signature removed": (lambda d: (d.pop("hmac"), d.pop("key_id")), "is not signed"),
    "signature removed, epsilon 1e-9, digest recomputed": (
        lambda d: (d.pop("hmac"), d.pop("key_id"), _eps_tiny(d), d.update(digest=sha_digest(d))), "is not signed"),
    "hmac from another key": (lambda d: d.update(hmac=hashlib.sha256(b"x").hexdigest()), "was edited after"),
}


@pytest.mark.parametrize("case", CAL_TAMPER)
def test_tampered_calibration_is_refused(tmp_path, cal_dict, ledger, case):
    edit, message = CAL_TAMPER[case]
    d = json.loads(json.dumps(cal_dict))
    edit(d)
    bad = write(tmp_path / "bad.json", d)
    before = ledger.read_bytes()
    assert_refused(release(bad, ledger), ledger, before, message, str(bad))
    assert Ledger(ledger, key=KEY).verify()["n_releases"] == 2


def test_calibration_signed_with_another_key_is_refused(tmp_path, ledger):
    other = tmp_path / "other.json"
    make_calibration().save(other, key=OTHER)
    before = ledger.read_bytes()
    assert_refused(release(other, ledger), ledger, before, "signed with another key", key_id(OTHER))


def test_unsigned_calibration_needs_allow_unsigned(tmp_path):
    unsigned = tmp_path / "u.json"
    make_calibration().save(unsigned)
    one_line_error(release(unsigned, tmp_path / "l.sqlite"), "is not signed", "--allow-unsigned")
    assert not (tmp_path / "l.sqlite").exists()
    res = release(unsigned, tmp_path / "l.sqlite", "--allow-unsigned")
    assert res.exit_code == 0 and "Warning: --allow-unsigned" in res.output


def test_release_without_any_key_is_refused_before_anything(tmp_path, cal_dict, monkeypatch):
    monkeypatch.delenv("EMPDP_KEY")
    cal = write(tmp_path / "cal.json", cal_dict)
    one_line_error(release(cal, tmp_path / "l.sqlite"), "needs the curator key", "--key-file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json"]
    key_file = write_key(tmp_path / "k", KEY + b"\n")
    assert release(cal, tmp_path / "l.sqlite", "--key-file", key_file).exit_code == 0
    short = write_key(tmp_path / "short", b"too short")
    one_line_error(release(cal, tmp_path / "l.sqlite", "--key-file", short), "at least 16 bytes")


def test_calibration_changed_in_python_after_loading_cannot_release(tmp_path, cal_dict):
    cal = Calibration.load(write(tmp_path / "cal.json", cal_dict), key=KEY)
    cal.epsilon = cal.verified_eps_max = 1e-9
    with pytest.raises(ValueError, match="changed after it was loaded"):
        cal.release(1.0, ledger=tmp_path / "l.sqlite", key=KEY)
    assert not (tmp_path / "l.sqlite").exists()


# ----------------------------------------------------------------- ledger tampering

def _restore_schema(con):
    """Put back, letter for letter, the triggers and views an edit dropped: the attacker's best move, since
    the ledger refuses any other schema (the checks under test are then the chain's)."""
    have = {name for (name,) in con.execute("SELECT name FROM sqlite_master")}
    for statement in SCHEMA:
        name = statement.split()[2]
        if name not in have:
            con.execute(statement)


def _sql(*statements):
    def edit(path):
        con = sqlite3.connect(path)
        for s in statements:
            con.execute(s)
        _restore_schema(con)
        con.commit()
        con.close()
    return edit


def _rechain(key_id_value, eps=1e-9):
    """Rewrite every record with a lower epsilon and recompute the links and head with unkeyed SHA-256."""
    def edit(path):
        con = sqlite3.connect(path)
        con.row_factory = sqlite3.Row
        con.execute("DROP TRIGGER chain_no_update")
        prev = "0" * 64
        for row in con.execute("SELECT * FROM chain ORDER BY seq").fetchall():
            rec = dict(row)
            if rec["kind"] == "release":
                rec["epsilon"] = eps
            if rec["seq"] == 0:
                rec["key_id"] = key_id_value
            mac = hashlib.sha256((prev + _body(rec, CHAIN_FIELDS)).encode()).hexdigest()
            con.execute("UPDATE chain SET epsilon = ?, key_id = ?, prev_mac = ?, mac = ? WHERE seq = ?",
                        (rec["epsilon"], rec["key_id"], prev, mac, rec["seq"]))
            prev, last = mac, rec["seq"]
        head = hashlib.sha256(f"head:{last}:{prev}".encode()).hexdigest()
        con.execute("UPDATE meta SET value = ? WHERE key = 'head'", (json.dumps({"seq": last, "mac": head}),))
        _restore_schema(con)
        con.commit()
        con.close()
    return edit


LEDGER_TAMPER = {
    "UPDATE meta (head)": (_sql("UPDATE meta SET value = '{\"seq\": 0, \"mac\": \"00\"}' WHERE key = 'head'"),
                           "head (meta) does not match"),
    "budget in genesis lifted to 100": (_sql("DROP TRIGGER chain_no_update",
                                             "UPDATE chain SET budget = 100.0 WHERE seq = 0"),
                                        "the genesis record (record 0) does not match its HMAC"),
    "epsilon of a record set to 1e-9": (_sql("DROP TRIGGER chain_no_update",
                                             "UPDATE chain SET epsilon = 1e-9 WHERE seq = 2"),
                                        "record 2 does not match its HMAC"),
    "noise_added of a record cleared": (_sql("DROP TRIGGER chain_no_update",
                                             "UPDATE chain SET noise_added = 0 WHERE seq = 1"),
                                        "record 1 does not match"),
    "last row deleted after dropping triggers": (_sql("DROP TRIGGER chain_no_delete", "DELETE FROM chain WHERE seq = 2"),
                                                 "last records were removed"),
    "all releases deleted": (_sql("DROP TRIGGER chain_no_delete", "DELETE FROM chain WHERE seq > 0"),
                             "last records were removed"),
    "genesis deleted": (_sql("DROP TRIGGER chain_no_delete", "DELETE FROM chain WHERE seq = 0"),
                        "genesis record"),
    "a middle row deleted": (_sql("DROP TRIGGER chain_no_delete", "DELETE FROM chain WHERE seq = 1"),
                             "record 1 is missing"),
    "chain rewritten with lower epsilon, unkeyed hashes": (_rechain(key_id(KEY)), "record 0) does not match"),
    "chain rewritten as an unsigned ledger": (_rechain(None), "is not signed"),
    "meta format and view dropped": (_sql("DROP VIEW releases", "DELETE FROM meta"), "head (meta) does not match"),
}


@pytest.mark.parametrize("case", LEDGER_TAMPER)
def test_tampered_ledger_is_refused(tmp_path, ledger, case):
    edit, message = LEDGER_TAMPER[case]
    edit(ledger)
    before = ledger.read_bytes()
    res = release(tmp_path / "cal.json", ledger)
    assert_refused(res, ledger, before, message, str(ledger))
    assert_refused(run("ledger", "verify", ledger), ledger, before, message)


def test_ledger_signed_with_another_key_is_refused(tmp_path, cal_dict, ledger):
    other_cal = tmp_path / "other.json"
    Calibration.from_dict(cal_dict, key=KEY).save(other_cal, key=OTHER)  # re-signed with the other key
    before = ledger.read_bytes()
    res = run("release", other_cal, "--value", 1, "--ledger", ledger, "--json", env={"EMPDP_KEY": OTHER.decode()})
    assert_refused(res, ledger, before, "signed with another key", key_id(KEY))


def test_budget_is_never_exceeded_and_lives_in_the_chain(tmp_path, ledger):
    res = release(tmp_path / "cal.json", ledger)
    assert res.exit_code == 0 and json.loads(res.output)["budget_left"] == pytest.approx(0.0)
    assert run("release", tmp_path / "cal.json", "--value", 1, "--ledger", ledger).exit_code == 1
    (genesis,) = [r for r in Ledger(ledger, key=KEY).chain() if r["seq"] == 0]
    assert genesis["kind"] == "genesis" and genesis["budget"] == 0.3 and genesis["key_id"] == key_id(KEY)


def test_budget_set_later_is_a_chained_record(tmp_path, cal_dict):
    cal = write(tmp_path / "cal.json", cal_dict)
    path = tmp_path / "l.sqlite"
    assert run("release", cal, "--value", 1, "--ledger", path, "--budget", "unlimited").exit_code == 0  # none yet
    assert release(cal, path).exit_code == 0  # fixes 0.3
    kinds = [r["kind"] for r in Ledger(path, key=KEY).chain()]
    assert kinds == ["genesis", "release", "budget", "release"]
    assert Ledger(path, key=KEY).verify()["budget"] == 0.3
    one_line_error(run("release", cal, "--value", 1, "--ledger", path, "--budget", 5), "cannot be changed")


# ------------------------------------------------------------- show, verify, anchoring

def test_ledger_verify_and_show_print_the_head(tmp_path, ledger):
    head = Ledger(ledger, key=KEY).chain()[-1]["mac"]
    res = run("ledger", "verify", ledger)
    assert res.exit_code == 0 and f"head {head}" in res.output and "2 releases" in res.output
    out = json.loads(run("ledger", "verify", ledger, "--json").output)
    assert out["ok"] and out["head"] == head and out["spent"] == pytest.approx(0.2) and out["budget"] == 0.3
    shown = json.loads(run("ledger", "show", ledger, "--json").output)
    assert shown["verified"] and shown["head"] == head and [r["seq"] for r in shown["records"]] == [1, 2]
    assert all(r["noise_added"] == 1 for r in shown["records"])
    unverified = run("ledger", "show", ledger, env={"EMPDP_KEY": ""})
    assert unverified.exit_code == 0 and "NOT VERIFIED" in unverified.output and head in unverified.output


def test_expect_head_catches_a_rolled_back_or_replaced_ledger(tmp_path, ledger):
    old_copy = ledger.read_bytes()
    old_head = Ledger(ledger, key=KEY).verify()["head"]
    assert release(tmp_path / "cal.json", ledger).exit_code == 0
    new_head = Ledger(ledger, key=KEY).verify()["head"]
    assert run("ledger", "verify", ledger, "--expect-head", old_head).exit_code == 0  # grown since: fine
    ledger.write_bytes(old_copy)  # rolled back to the older copy: it verifies on its own ...
    assert run("ledger", "verify", ledger).exit_code == 0
    # ... but not against the head recorded elsewhere
    one_line_error(run("ledger", "verify", ledger, "--expect-head", new_head), "expected head", "rolled back")
    ledger.unlink()  # deleted and started afresh: a new chain
    assert release(tmp_path / "cal.json", ledger).exit_code == 0
    one_line_error(run("ledger", "verify", ledger, "--expect-head", old_head), "expected head")


def test_ledger_commands_refuse_a_missing_file_and_need_the_key(tmp_path, ledger):
    one_line_error(run("ledger", "verify", tmp_path / "nope.sqlite"), "does not exist")
    one_line_error(run("ledger", "verify", ledger, env={"EMPDP_KEY": ""}), "is signed with the curator key")


# ---------------------------------------------------------------- the guarantee travels

def test_release_without_noise_says_so_everywhere(tmp_path):
    cal = make_calibration(scale=10.0)
    assert cal.noise["kind"] == "none"
    path = tmp_path / "none.json"
    cal.save(path, key=KEY)
    res = run("release", path, "--value", 1.5, "--ledger", tmp_path / "l.sqlite", "--budget", "unlimited", "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert out["noise_added"] is False and out["value"] == 1.5 and out["private"] is True
    assert "no noise was added" in out["guarantee"] and "exact value" in out["guarantee"]
    assert "not classical DP" in out["guarantee"]
    assert res.stderr.count("NO NOISE WAS ADDED") == 1
    (rec,) = Ledger(tmp_path / "l.sqlite", key=KEY).records()
    assert rec["noise_added"] == 0


def test_release_json_keeps_its_keys_and_explains_private(tmp_path, cal_dict):
    res = release(write(tmp_path / "cal.json", cal_dict), tmp_path / "l.sqlite")
    out = json.loads(res.stdout)
    assert set(out) == {"value", "epsilon", "budget_spent", "budget_left", "private", "noise_added", "guarantee",
                        "seq"}
    assert out["noise_added"] is True and out["seq"] == 1 and "NO NOISE" not in res.stderr
    assert out["guarantee"].startswith("empirical differential privacy at epsilon 0.1")
    assert "SPEC" not in res.output
    seeded = json.loads(release(tmp_path / "cal.json", tmp_path / "l.sqlite", "--seed", 3).stdout)
    assert seeded["private"] is False and seeded["guarantee"].startswith("NOT PRIVATE")


# ------------------------------------------------------------------ paths and modes

def test_empty_ledger_path_is_refused(tmp_path, cal_dict, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cal = write(tmp_path / "cal.json", cal_dict)
    for empty in ("", " "):
        one_line_error(run("release", cal, "--value", 1, "--ledger", empty), "--ledger is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json"]


@pytest.mark.parametrize("dangling", [False, True])
def test_ledger_symlink_is_refused(tmp_path, ledger, dangling):
    target = tmp_path / "elsewhere.sqlite" if dangling else ledger
    link = tmp_path / "link.sqlite"
    link.symlink_to(target)
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(release(tmp_path / "cal.json", link), "symbolic link")
    one_line_error(run("ledger", "verify", link), "symbolic link")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # a dangling link's target is not created


def test_calibration_and_ledger_are_owner_only_also_on_overwrite(tmp_path, ledger):
    cal = tmp_path / "c.json"
    cal.write_text("{}")
    os.chmod(cal, 0o644)
    make_calibration().save(cal, key=KEY)  # overwrites a 0644 file
    assert (cal.stat().st_mode & 0o777, ledger.stat().st_mode & 0o777) == (0o600, 0o600)
    make_calibration().save(cal, key=KEY)
    assert cal.stat().st_mode & 0o777 == 0o600


def test_calibrate_cli_signs_with_the_key_file(tmp_path, monkeypatch):
    monkeypatch.delenv("EMPDP_KEY")
    key_file = write_key(tmp_path / "curator.key", KEY)
    out = tmp_path / "c.json"
    res = run("calibrate", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)", "-e", 0.5,
              "-o", out, "--key-file", key_file, "-q")
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["key_id"] == key_id(KEY) and out.stat().st_mode & 0o777 == 0o600
    assert Calibration.load(out, key=KEY, allow_unsigned=False).signed
    unsigned = run("calibrate", SAMPLE, "--id", "countyid", "--by", "year", "--query", "mean(murdrate)", "-e",
                   0.5, "-o", tmp_path / "u.json", "-q")
    assert unsigned.exit_code == 0 and "is unsigned" in unsigned.output
