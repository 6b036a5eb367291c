"""``empdp audit``: bad input is one ``Error:`` line and exit 2, never an internal error."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from audit_cli_helpers import run
from helpers import CURATOR_KEY, SAMPLE, one_line_error, write_key

from empdp.audit import audit_release, mpl
from empdp.audit.common import as_rng
from empdp.errors import InputError

pytestmark = pytest.mark.usefixtures("curator_key")  # $EMPDP_KEY verifies the signed calibrations

FAST = ("--search-size", 2000, "--final-size", 5000)




@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    from empdp.noise import calibrate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(SAMPLE, id="countyid", by="year", query="mean(murdrate)", epsilon=1.0)
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    cal.save(path, key=CURATOR_KEY)  # signed: audit release checks the signature first
    return path


# 1. empdp.audit after a bare ``import empdp`` (fresh interpreter: the tests have imported it already)

def test_import_empdp_gives_audit_lazily():
    code = ("import sys, empdp\n"
            "assert 'empdp.audit' not in sys.modules  # loaded on first use: it pulls in scipy.stats\n"
            "r = empdp.audit.mpl('laplace', params={'epsilon': 0.7}, n=2000, N=5000, rng=1)\n"
            "assert r.lower_bound > 0 and 'audit' in empdp.__all__\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr



def test_audit_modules_and_an_mpl_run_import_no_scipy():
    """An audit command must start fast: scipy.stats/integrate/optimize/special are imported on first
    use (the Rényi floor, some exact values, the release audit's quadrature), never at module level."""
    code = ("import sys\n"
            "import empdp.audit, empdp.audit.truth, empdp.audit.release, empdp.audit.dpl, empdp.audit.samplers\n"
            "from helpers import run\n"
            "res = run('audit', 'mpl', '-m', 'laplace', '--search-size', 2000, '--final-size', 5000, '--seed', 1)\n"
            "assert res.exit_code == 0, res.output\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(__file__))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout

# 2. only 'patterns' and 'patterns:K' mean the StatDP patterns; other values are files

@pytest.mark.parametrize("name", ["patterns.json", "patterns_mine.json", "patterns:x"])
def test_pairs_file_named_like_patterns_is_read(tmp_path, monkeypatch, name):
    (tmp_path / name).write_text(json.dumps([[0, 1]]))
    monkeypatch.chdir(tmp_path)
    res = run("mpl", "-m", "laplace", "--pairs", name, *FAST, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["pair"] == [0, 1]


def test_pairs_patterns_k_still_means_patterns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file named patterns:3 here
    res = run("mpl", "-m", "noisy_max", "--pairs", "patterns:3", *FAST, "--seed", 1, "--json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)["pair"][0]) == 3


def test_pairs_patterns_bad_k_is_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(run("mpl", "-m", "laplace", "--pairs", "patterns:x", *FAST),
                           "'patterns:x' does not exist", "patterns:K")


# 3. a pairs path that is not a readable file

@pytest.mark.parametrize("value,fragment", [(".", "pairs file '.' is a folder"), ("", "--pairs is empty")])
def test_pairs_folder_or_empty(tmp_path, monkeypatch, value, fragment):
    monkeypatch.chdir(tmp_path)
    one_line_error(run("mpl", "-m", "laplace", "--pairs", value, *FAST), fragment)


def test_pairs_unreadable(tmp_path, monkeypatch):
    import pathlib

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    (tmp_path / "pairs.json").write_text("[[0, 1]]")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pathlib.Path, "read_text", denied)
    one_line_error(run("mpl", "-m", "laplace", "--pairs", "pairs.json", *FAST),
                           "'pairs.json' cannot be read: Permission denied")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_pairs_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "pairs.json"
    path.write_text("[[0, 1]]")
    path.chmod(0)
    monkeypatch.chdir(tmp_path)
    one_line_error(run("mpl", "-m", "laplace", "--pairs", "pairs.json", *FAST), "cannot be read")


# 4. negative seeds

@pytest.mark.parametrize("args", [("mpl", "-m", "laplace", *FAST),
                                  ("renyi", "-m", "gaussian", "--order", 2, "--sample-size", 2000)])
def test_negative_seed_cli(args):
    one_line_error(run(*args, "--seed", -1), "--seed", "-1")


def test_negative_seed_release_cli(calibration):
    one_line_error(run("release", calibration, SAMPLE, "--seed", -1), "--seed", "-1")


@pytest.mark.parametrize("seed", [-1, np.int64(-5)])
def test_negative_seed_api(seed):
    with pytest.raises(InputError, match="non-negative integer"):
        as_rng(seed)
    with pytest.raises(InputError, match="non-negative integer"):
        mpl("laplace", params={"epsilon": 0.7}, n=2000, N=5000, rng=seed)


# 5. an empty or reversed region

@pytest.mark.parametrize("region", ["1,1", "2,1"])
def test_region_lo_must_be_below_hi(region):
    one_line_error(run("mpl", "-m", "laplace", "--region", region, *FAST, "--seed", 1),
                           "--region", "LO < HI", repr(region))


# 6. the release audit checks its options before any work

@pytest.mark.parametrize("order", [1, 0.5, "inf"])
def test_release_order_cli(calibration, order):
    one_line_error(run("release", calibration, SAMPLE, "--order", order, "--top", 1),
                           "Rényi order must be a finite number > 1")


@pytest.mark.parametrize("kwargs,fragment", [
    ({"order": 1}, "Rényi order"), ({"order": float("nan")}, "Rényi order"), ({"top": 0}, "`top`"),
    ({"alpha": 0.7}, "alpha"), ({"rng": -1}, "seed"),
])
def test_release_options_checked_before_reading(tmp_path, kwargs, fragment):
    # the calibration does not exist: the option error must come first
    with pytest.raises(InputError, match=fragment):
        audit_release(tmp_path / "missing.json", SAMPLE, **kwargs)


# ---------------------------------------------------------------- --hash-ids (issue 23, item 3)

@pytest.fixture
def small_release_audit(monkeypatch):
    import functools

    import empdp.audit

    monkeypatch.setattr(empdp.audit, "audit_release",
                        functools.partial(empdp.audit.audit_release, n=2000, N=5000, n_renyi=2000))


def test_release_audit_hash_ids_names_nobody(calibration, small_release_audit, tmp_path, monkeypatch):
    """'empdp report --audit' on a --hash-ids result wrote the raw ids of an audit release."""
    from empdp.io import keyed_hash

    key_file = write_key(tmp_path / "key", b"a secret key of 32 characters...")
    monkeypatch.delenv("EMPDP_HASH_KEY", raising=False)
    plain = run("release", calibration, SAMPLE, "--top", 3, "--seed", 1, "--json")
    hashed = run("release", calibration, SAMPLE, "--top", 3, "--seed", 1, "--json", "--hash-ids",
                 "--hash-key-file", key_file)
    assert plain.exit_code == 0 and hashed.exit_code == 0, hashed.output
    raw = [row["id"] for row in json.loads(plain.output)["individuals"]]
    out = json.loads(hashed.output)
    assert out["ids_hashed"] is True and json.loads(plain.output)["ids_hashed"] is False
    assert [row["id"] for row in out["individuals"]] == [keyed_hash(v, key_file.read_bytes()) for v in raw]
    table = run("release", calibration, SAMPLE, "--top", 3, "--seed", 1, "--hash-ids", "--hash-key-file", key_file)
    first_column = [line.split()[0] for line in table.stdout.splitlines()[2:5]]
    assert first_column == [row["id"] for row in out["individuals"]]


def test_release_audit_hash_ids_without_a_key_is_refused_before_work(calibration, monkeypatch):
    import empdp.audit

    monkeypatch.delenv("EMPDP_HASH_KEY", raising=False)
    monkeypatch.setattr(empdp.audit, "audit_release", lambda *a, **k: pytest.fail("the audit ran"))
    one_line_error(run("release", calibration, SAMPLE, "--hash-ids"), "--hash-ids needs a secret key")
