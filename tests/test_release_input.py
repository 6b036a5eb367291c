"""Damaged or edited calibration files and ledgers are refused in one line, exit 2 (docs/method.md#84-secure-sampling).

The budget cannot be bypassed: no calibration field, edited file or old
ledger record makes a release spend zero or negative epsilon.
"""

import json
import math
import sqlite3

import pytest
from helpers import CURATOR_KEY, SAMPLE, one_line_error, run, set_field

import empdp
from empdp.errors import InputError
from empdp.noise import Calibration, Ledger, LedgerError, ledger_v1
from empdp.noise.ledger_v1 import record_hash as _record_hash
from empdp.noise.sampler import NoiseSampler
from empdp.settings import Model

KEY = CURATOR_KEY


pytestmark = pytest.mark.usefixtures("curator_key")  # $EMPDP_KEY = KEY (tests/conftest.py)


@pytest.fixture(scope="module")
def cal_path(tmp_path_factory):
    """A calibration of the sample data at ε = 0.1 (Laplace kernel), written by the library."""
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    empdp.calibrate(SAMPLE, id="countyid", by="year", query="mean(murdrate)", epsilon=0.1,
                    model=Model(kernel="laplace")).save(path, key=KEY)
    return path


@pytest.fixture
def cal_dict(cal_path):
    d = json.loads(cal_path.read_text())
    assert d["noise"]["kind"] == "laplace_mixture"  # noise is added: scale must be > 0
    return d


def write(tmp_path, d, name="edited.json", digest=False):
    """Write ``d`` as a calibration file; without ``digest`` as an older empdp did (no digest)."""
    d = dict(d)
    if not digest:
        d.pop("digest", None)
    path = tmp_path / name
    path.write_text(json.dumps(d, indent=2))
    return path


# ------------------------------------------------- 1. no refund, no free release

@pytest.mark.parametrize("eps", [-1, 0, -0.5])
def test_non_positive_epsilon_is_refused_and_spends_nothing(cal_dict, tmp_path, eps):
    ledger = tmp_path / "l.sqlite"
    good = write(tmp_path, cal_dict, "good.json", digest=True)
    assert run("release", good, "--value", 1, "--ledger", ledger, "--budget", 0.15).exit_code == 0
    bad = write(tmp_path, {**cal_dict, "epsilon": eps})
    res = run("release", bad, "--value", 1, "--ledger", ledger, "--budget", 0.15)
    one_line_error(res, "was edited after", str(bad), "empdp calibrate")  # the signature, before any field
    summary = Ledger(ledger, key=KEY).verify()
    assert summary["n_releases"] == 1 and summary["spent"] == pytest.approx(0.1)
    # the budget was not refunded: a second real release is refused
    assert run("release", good, "--value", 1, "--ledger", ledger).exit_code == 1


@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan"), float("inf"), "0.5", None, True])
def test_ledger_never_records_a_non_positive_spend(tmp_path, eps):
    path = tmp_path / "l.sqlite"
    fields = dict(query="q", source=None, database=None, epsilon=eps, weight_zero=0.2, private=True,
                  calibration_digest="d")
    fields["lambda"] = 1.0
    with pytest.raises(InputError, match="positive, finite epsilon"):
        Ledger(path, key=KEY).append(fields, lambda: 0.0)
    assert not path.exists()


#: the first format's schema as the first release of it wrote it (before its positive-epsilon trigger)
V1_SCHEMA = ledger_v1.SCHEMAS[0]


def v1_ledger(path, epsilons, budget=None):
    """A ledger as empdp wrote it before keyed chains: unkeyed SHA-256 links, the budget in meta."""
    con = sqlite3.connect(path)
    con.executescript(V1_SCHEMA)
    if budget is not None:
        con.execute("INSERT INTO meta VALUES ('budget', ?)", (repr(budget),))
    prev = "0" * 64
    for eps in epsilons:
        rec = dict(time="t", query="q", source=None, database=None, epsilon=eps, weight_zero=0.2,
                   noisy_value=1.0, private=1, calibration_digest="d")
        rec["lambda"] = 1.0
        h = _record_hash(prev, rec)
        con.execute("INSERT INTO releases (time, query, source, database, epsilon, lambda, weight_zero, "
                    "noisy_value, private, calibration_digest, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    ("t", "q", None, None, eps, 1.0, 0.2, 1.0, 1, "d", prev, h))
        prev = h
    con.commit()
    con.close()


def test_ledger_with_a_negative_record_from_an_older_empdp_is_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    v1_ledger(path, [0.5, -1.0], budget=1.0)  # a refund record, with a valid (unkeyed) hash chain
    fields = dict(query="q", source=None, database=None, epsilon=0.5, weight_zero=0.2, private=True,
                  calibration_digest="d", source_digest="value given")
    fields["lambda"] = 1.0
    with pytest.raises(LedgerError, match="record 2 spends epsilon -1.0"):
        Ledger(path, key=KEY, allow_unsigned=True).append(fields, lambda: 1.0)
    with pytest.raises(LedgerError, match="cannot be trusted"):
        Ledger(path, allow_unsigned=True).verify()


def test_old_format_ledger_is_used_only_with_allow_unsigned(tmp_path):
    path = tmp_path / "l.sqlite"
    v1_ledger(path, [0.25, 0.25], budget=1.0)
    fields = dict(query="q", source=None, database=None, epsilon=0.25, weight_zero=0.2, private=True,
                  calibration_digest="d", source_digest="value given")
    fields["lambda"] = 1.0
    with pytest.raises(LedgerError, match="first, unkeyed ledger format"):
        Ledger(path, key=KEY).append(fields, lambda: 1.0)
    old = Ledger(path, key=KEY, allow_unsigned=True)
    assert old.verify()["spent"] == 0.5 and old.verify()["format"] == "empdp-ledger/1"
    before = path.read_bytes()
    drawn = []
    with pytest.raises(LedgerError, match="can be shown and verified, not extended"):  # no key, no source digest
        old.append(fields, lambda: drawn.append(1) or 1.0)
    assert drawn == [] and path.read_bytes() == before and old.verify()["n_releases"] == 2


def test_calibration_changed_in_python_cannot_release(cal_path, tmp_path):
    cal = Calibration.load(cal_path, key=KEY)
    cal.epsilon = -1.0
    with pytest.raises(InputError, match="'epsilon'"):
        cal.release(1.0, ledger=tmp_path / "l.sqlite")
    assert not (tmp_path / "l.sqlite").exists()


# ----------------------------------------------- 2. damaged fields: one line, exit 2

@pytest.mark.parametrize("path, value, field", [
    (("noise", "scale"), -1, "'noise.scale'"),
    (("noise", "scale"), 0, "'noise.scale'"),
    (("noise", "scale"), "abc", "'noise.scale'"),
    (("noise", "weight_zero"), 1.5, "'noise.weight_zero'"),
    (("noise", "weight_zero"), -0.1, "'noise.weight_zero'"),
    (("noise", "weight_zero"), 0.0, "'noise.weight_zero'"),  # kind laplace_mixture needs 0 < w < 1
    (("noise", "weight_zero"), None, "'noise.weight_zero'"),
    (("noise", "kind"), "uniform", "'noise.kind'"),
    (("noise",), KeyError, "'noise'"),
    (("noise",), [1, 2], "'noise'"),
    (("curator_kernel", "kind"), "box", "'curator_kernel.kind'"),
    (("curator_kernel", "scale"), -0.1, "'curator_kernel.scale'"),
    (("curator_kernel",), KeyError, "'curator_kernel'"),
    (("lambda",), -1, "'lambda'"),
    (("lambda",), KeyError, "'lambda'"),
    (("epsilon",), "0.1", "'epsilon'"),
    (("epsilon",), True, "'epsilon'"),
    (("epsilon",), 1e400, "'epsilon'"),  # inf in JSON terms
    (("n_individuals",), 2.5, "'n_individuals'"),
    (("query",), 7, "'query'"),
    (("verified_eps_max",), 0.2, "verified_eps_max"),  # above epsilon: no calibration writes that
    (("expected_abs_noise",), 0.0, "expected_abs_noise"),
])
def test_damaged_calibration_field_exits_2_naming_it(cal_dict, tmp_path, path, value, field):
    set_field(cal_dict, path, value)
    bad = write(tmp_path, cal_dict)
    res = run("release", bad, "--value", 1, "--ledger", tmp_path / "l.sqlite", "--budget", 1)
    one_line_error(res, "was edited after", str(bad))  # signed: the HMAC refuses it before any field is used
    unsigned = write(tmp_path, {k: v for k, v in cal_dict.items() if k not in ("hmac", "key_id")}, "unsigned.json")
    res = run("release", unsigned, "--value", 1, "--ledger", tmp_path / "l.sqlite", "--budget", 1,
              "--allow-unsigned")
    one_line_error(res, field, str(unsigned))  # unsigned (unsafe): each field is still checked
    assert not (tmp_path / "l.sqlite").exists()


def test_nan_epsilon_exits_2(cal_dict, tmp_path):
    bad = tmp_path / "nan.json"
    for k in ("digest", "hmac", "key_id"):
        cal_dict.pop(k, None)
    bad.write_text(json.dumps(cal_dict).replace('"epsilon": 0.1', '"epsilon": NaN'))
    assert "NaN" in bad.read_text()
    res = run("release", bad, "--value", 1, "--ledger", tmp_path / "l.sqlite", "--allow-unsigned")
    one_line_error(res, "'epsilon'", "nan")


@pytest.mark.parametrize("text", ["[1, 2]", '"x"', "null"])
def test_calibration_that_is_not_an_object_exits_2(tmp_path, text):
    bad = tmp_path / "c.json"
    bad.write_text(text)
    one_line_error(run("release", bad, "--value", 1), "not an empdp calibration", str(bad))


# --------------------------------------------------------------- digest

def test_saved_calibration_carries_a_digest_that_matches(cal_path, cal_dict):
    cal = Calibration.load(cal_path, key=KEY)
    assert cal_dict["digest"] == cal.digest  # the same digest the ledger records
    assert "digest" not in cal.to_dict()


@pytest.mark.parametrize("key, value", [("epsilon", 0.2), ("query", "count(*)"), ("n_individuals", 5)])
def test_edited_calibration_with_a_digest_is_refused(cal_dict, tmp_path, key, value):
    bad = write(tmp_path, {**cal_dict, key: value}, digest=True)
    res = run("release", bad, "--value", 1, "--ledger", tmp_path / "l.sqlite")
    one_line_error(res, "was edited", str(bad), "empdp calibrate")
    assert not (tmp_path / "l.sqlite").exists()


def test_calibration_without_a_digest_still_loads(cal_dict, tmp_path):
    old = write(tmp_path, cal_dict, "old.json")  # as written before calibrations carried a digest
    assert "digest" not in json.loads(old.read_text())
    assert Calibration.load(old, key=KEY).digest == cal_dict["digest"]
    res = run("release", old, "--value", 1, "--ledger", tmp_path / "l.sqlite", "--budget", "unlimited", "--json")
    assert res.exit_code == 0, res.output


# -------------------------------------------------- 3. corrupt or foreign ledger

def _garbage(path, cal_path):
    path.write_bytes(b"this is not a database\n" * 50)


def _truncated(path, cal_path):
    full = path.with_name("full.sqlite")
    for _ in range(40):
        assert run("release", cal_path, "--value", 1, "--ledger", full, "--budget", "unlimited",
                   "--seed", 1).exit_code == 0
    con = sqlite3.connect(full)  # fold the WAL into the file, then cut it short
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = full.read_bytes()
    assert len(data) > 8192
    path.write_bytes(data[:len(data) // 2])


def _foreign(path, cal_path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (name TEXT)")
    con.execute("INSERT INTO customers VALUES ('x')")
    con.commit()
    con.close()


@pytest.mark.parametrize("make", [_garbage, _truncated, _foreign])
def test_unreadable_ledger_exits_2_and_is_left_unchanged(cal_path, tmp_path, make):
    ledger = tmp_path / "l.sqlite"
    make(ledger, cal_path)
    before = ledger.read_bytes()
    res = run("release", cal_path, "--value", 1, "--ledger", ledger, "--budget", 1)
    one_line_error(res, str(ledger), "--ledger", "not a readable empdp ledger")
    assert ledger.read_bytes() == before
    # nothing else written: a WAL-mode file read read-only may get SQLite's -wal and -shm companions
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("l.")
                  and not p.name.endswith(("-wal", "-shm"))) == ["l.sqlite"]


def test_ledger_path_that_is_a_folder_exits_2(cal_path, tmp_path):
    res = run("release", cal_path, "--value", 1, "--ledger", tmp_path)
    one_line_error(res, "folder", str(tmp_path))
    with pytest.raises(InputError, match="is a folder"):  # the library refuses it too
        Ledger(tmp_path, key=KEY).spent()


def test_unreadable_ledger_is_still_a_ledger_error_in_python(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"x" * 2000)
    with pytest.raises(LedgerError) as info:
        Ledger(bad, key=KEY).verify()
    assert isinstance(info.value, InputError) and info.value.exit_code == 2


# -------------------------------------------------------------- sampler

@pytest.mark.parametrize("w, scale", [(1.5, 1.0), (math.nan, 1.0), ("0.2", 1.0), (0.2, "abc"), (0.2, -1.0),
                                      (0.2, math.inf), (True, 1.0)])
def test_sampler_refuses_bad_parameters_as_input_errors(w, scale):
    with pytest.raises(InputError):
        NoiseSampler(w, scale)


def test_calibrating_a_source_of_sole_contributors_only_is_refused(tmp_path):
    """One individual in every database: no leave-one-out is defined, and calibrate used to write
    'no noise', after which release published the exact value as private."""
    import pandas as pd

    src = tmp_path / "oneid.parquet"
    pd.DataFrame({"id": [1] * 12, "year": [2000, 2001, 2002, 2003] * 3,  # three rows of it in each
                  "x": [1.0, 2.0, 1.5, 3.0] * 3}).to_parquet(src)
    out = tmp_path / "cal.json"
    res = run("calibrate", src, "--id", "id", "--by", "year", "--query", "mean(x)", "--epsilon", 1, "-o", out)
    one_line_error(res, "only contributor to some database")
    assert not out.exists()
