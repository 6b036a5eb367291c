"""Output paths of every command: checked before any work, written together or not at all.

A bad output path is a one-line exit-2 error naming the option and the path,
raised before the (possibly long) computation, and it writes nothing. The
outputs of one ``assess`` run are committed together: a failure while writing
any of them leaves none of the new files and no temporaries.

Tests run as root, where chmod cannot make a folder unwritable; an unwritable
folder is simulated by making ``tempfile.mkstemp`` fail in it, as it does in
``/sys`` or ``/proc``.
"""

from __future__ import annotations

import errno
import os
import tempfile

import pytest
from click.testing import CliRunner
from conftest import random_panel

import empdp.assessment.result
import empdp.cli.assess as assess_cli
import empdp.cli.calibrate as calibrate_cli
import empdp.io as io
from empdp.cli.main import cli
from empdp.errors import InputError

QUERY = ["--id", "id", "--by", "year", "--query", "mean(x)"]


def run(args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(res, code=2):
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "Traceback" not in res.output and "internal error" not in res.output
    return lines[0]


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "panel.parquet"
    random_panel(3, n_db=6, n_ind=20).to_parquet(path)
    return str(path)


@pytest.fixture(scope="module")
def cal_path(tmp_path_factory, panel):
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    res = run(["calibrate", panel, *QUERY, "-e", "1", "--kernel", "laplace", "-o", path, "-q"])
    assert res.exit_code == 0, res.output
    return path


@pytest.fixture
def no_work(monkeypatch):
    """Fail loudly if a command starts its computation (the checks must come first)."""
    def computed(*args, **kwargs):
        raise AssertionError("the computation started before the output paths were checked")

    monkeypatch.setattr(assess_cli, "assess", computed)
    monkeypatch.setattr(calibrate_cli, "calibrate_source", computed)
    monkeypatch.setattr(calibrate_cli, "release_value", computed)


@pytest.fixture
def locked(tmp_path, monkeypatch):
    """A folder that exists but where no file can be created (like /sys for root)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and os.path.abspath(dir) == str(folder):
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return folder


def files_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ------------------------------------------------------------------ checked up front
@pytest.mark.parametrize("option, name", [("--out", "t.parquet"), ("--report", "r.html"),
                                          ("--save-result", "r.json")])
def test_assess_unwritable_folder_is_refused_before_work(tmp_path, panel, no_work, locked, option, name):
    outputs = {"--out": tmp_path / "t.parquet", "--report": tmp_path / "r.html",
               "--save-result": tmp_path / "r.json"}
    outputs[option] = locked / name
    before = files_under(tmp_path)
    line = one_line_error(run(["assess", panel, *QUERY, *[a for kv in outputs.items() for a in kv]]))
    # long paths are cut in the middle of the line: the option, the file name and the reason stay
    assert option in line and name in line and "writable folder" in line
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("option, name", [("--out", "t.csv"), ("--report", "r.html"),
                                          ("--save-result", "r.json")])
def test_assess_existing_folder_as_output_is_refused_before_work(tmp_path, panel, no_work, option, name):
    (tmp_path / name).mkdir()
    line = one_line_error(run(["assess", panel, *QUERY, option, tmp_path / name]))
    assert option in line and str(tmp_path / name) in line and "is an existing folder" in line
    assert files_under(tmp_path) == [name]


def test_assess_output_under_a_file_names_the_file(tmp_path, panel, no_work):
    (tmp_path / "afile").write_text("x")
    line = one_line_error(run(["assess", panel, *QUERY, "--out", tmp_path / "t.parquet",
                               "--save-result", tmp_path / "afile" / "r.json"]))
    assert "--save-result" in line and "afile' is a file, not a folder" in line
    assert files_under(tmp_path) == ["afile"]


@pytest.mark.parametrize("case", ["locked", "folder", "under a file"])
def test_calibrate_bad_output_is_refused_before_work(tmp_path, panel, no_work, locked, case):
    out = {"locked": locked / "c.json", "folder": tmp_path / "c.json", "under a file": tmp_path / "f" / "c.json"}
    (tmp_path / "c.json").mkdir()
    (tmp_path / "f").write_text("x")
    before = files_under(tmp_path)
    line = one_line_error(run(["calibrate", panel, *QUERY, "-e", "1", "-o", out[case]]))
    assert line.startswith("Error: -o") and str(out[case].parent if case == "under a file" else out[case]) in line
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("case", ["locked", "folder"])
def test_report_bad_output_is_refused(tmp_path, locked, case):
    out = locked / "r.html" if case == "locked" else tmp_path / "r.html"
    if case == "folder":
        out.mkdir()
    before = files_under(tmp_path)
    # the output is checked even before the result file is read
    line = one_line_error(run(["report", tmp_path / "missing.json", "-o", out]))
    assert line.startswith("Error: -o") and str(out) in line
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("case", ["locked", "folder"])
def test_release_bad_ledger_is_refused_before_the_query(tmp_path, cal_path, panel, no_work, locked, case):
    ledger = locked / "l.sqlite" if case == "locked" else tmp_path / "l.sqlite"
    if case == "folder":
        ledger.mkdir()
    before = files_under(tmp_path)
    line = one_line_error(run(["release", cal_path, panel, "--database", "2001", "--ledger", ledger]))
    assert "--ledger" in line and str(ledger) in line
    assert files_under(tmp_path) == before


# ------------------------------------------------------------------ committed together
def three_outputs(tmp_path):
    return ["--out", tmp_path / "t.parquet", "--report", tmp_path / "r.html", "--save-result", tmp_path / "r.json"]


def test_assess_writes_all_outputs_owner_only_and_no_temporaries(tmp_path, panel):
    res = run(["assess", panel, *QUERY, *three_outputs(tmp_path), "-q"])
    assert res.exit_code == 0, res.output
    assert files_under(tmp_path) == ["r.html", "r.json", "t.parquet"]
    assert all((tmp_path / f).stat().st_mode & 0o777 == 0o600 for f in files_under(tmp_path))


@pytest.mark.parametrize("existing", [False, True])
def test_failure_writing_the_last_output_leaves_none_of_them(tmp_path, panel, monkeypatch, existing):
    if existing:  # earlier outputs of the same names are kept unchanged
        for name in ("t.parquet", "r.html", "r.json"):
            (tmp_path / name).write_text("old " + name)
    real = empdp.assessment.result.save_result

    def fail_after_writing(a, path, **kwargs):
        real(a, path, **kwargs)  # the temporary file is complete ...
        raise OSError(errno.ENOSPC, "No space left on device")  # ... but something fails after it

    monkeypatch.setattr(empdp.assessment.result, "save_result", fail_after_writing)
    res = run(["assess", panel, *QUERY, *three_outputs(tmp_path), "-q"])
    assert res.exit_code == 1 and "No space left on device" in res.output
    if existing:
        assert files_under(tmp_path) == ["r.html", "r.json", "t.parquet"]
        assert all((tmp_path / f).read_text() == "old " + f for f in files_under(tmp_path))
    else:
        assert files_under(tmp_path) == []


def test_failed_commit_restores_the_outputs_already_replaced(tmp_path, monkeypatch):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("old a")
    real = os.replace

    def replace(src, dst):
        if str(dst) == str(b):
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="Input/output error"):
        with io.output_batch():
            io.write_text(a, "new a")
            io.write_text(b, "new b")
    assert files_under(tmp_path) == ["a.json"] and a.read_text() == "old a"


def test_batch_keeps_the_last_write_of_a_path(tmp_path):
    with io.output_batch():
        io.write_text(tmp_path / "a.txt", "first")
        io.write_text(tmp_path / "a.txt", "second")
        assert not (tmp_path / "a.txt").exists()  # nothing is in place before the batch commits
    assert files_under(tmp_path) == ["a.txt"] and (tmp_path / "a.txt").read_text() == "second"


def test_library_writers_refuse_a_folder_or_unwritable_folder_as_input_errors(tmp_path, locked):
    (tmp_path / "d.json").mkdir()
    with pytest.raises(InputError, match="is an existing folder"):
        io.write_text(tmp_path / "d.json", "x")
    with pytest.raises(InputError, match="writable folder"):
        io.write_text(locked / "x.json", "x")
    assert files_under(tmp_path) == ["d.json", "locked"]


# ---------------------------------------------------- names, overwrites, leftovers (issue 23)

def test_a_file_name_too_long_is_one_line_exit_2(tmp_path, panel, no_work):
    """A 300-character --out name was an internal error (OSError ENAMETOOLONG)."""
    out = tmp_path / ("a" * 300 + ".csv")
    line = one_line_error(run(["assess", panel, *QUERY, "--out", out]))
    assert "--out" in line and "file name is 304 bytes long" in line and "shorter name" in line
    assert len(line) < 300 and files_under(tmp_path) == []


def test_a_long_name_that_fits_is_written(tmp_path):
    """The temporary beside a 250-character name must itself fit (it adds ~15 characters)."""
    target = tmp_path / ("b" * 250 + ".txt")
    io.write_text(target, "ok")
    assert target.read_text() == "ok" and files_under(tmp_path) == [target.name]


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "glob", "folder", "duckdb"])
def test_refuse_overwrite_names_the_input(tmp_path, how):
    data = tmp_path / "data.csv"
    data.write_text("a\n1\n")
    out, source = data, str(data)
    if how == "symlink":
        out = tmp_path / "link.csv"
        out.symlink_to(data)
    elif how == "hardlink":
        out = tmp_path / "hard.csv"
        os.link(data, out)
    elif how == "glob":
        source = str(tmp_path / "*.csv")
    elif how == "folder":
        out, source = tmp_path / "new.parquet", str(tmp_path)
    elif how == "duckdb":
        source = str(data) + "::t"
    with pytest.raises(InputError, match="--out .*(is the input|inside the input folder)"):
        io.refuse_overwrite(out, None, source, option="--out")
    assert data.read_text() == "a\n1\n"


def test_refuse_overwrite_lets_other_paths_through(tmp_path):
    (tmp_path / "data.csv").write_text("a\n1\n")
    io.refuse_overwrite(tmp_path / "out.csv", str(tmp_path / "data.csv"), object(), option="--out")
    io.refuse_overwrite(None, str(tmp_path / "data.csv"))
    io.refuse_overwrite(tmp_path / "sub" / "x.csv", str(tmp_path / "su*.csv"))


def test_stale_temporaries_of_the_target_are_removed(tmp_path):
    """A kill -9 between the temporary's creation and its rename leaves '.NAME.XXXXXXXX.tmp' behind."""
    import time

    target = tmp_path / "r.json"
    stale = [tmp_path / ".r.json.abcd1234.tmp", tmp_path / ".r.json.abcd1234.tmp.old",
             tmp_path / ".r.json.zz_y9876.probe"]
    fresh = tmp_path / ".r.json.fresh123.tmp"  # another run may be writing it now
    other = [tmp_path / ".s.json.abcd1234.tmp", tmp_path / ".r.json.notours.txt", tmp_path / "keep.tmp"]
    hour_ago = time.time() - 2 * io.STALE_SECONDS
    for p in stale + other + [fresh]:
        p.write_text("x")
        if p is not fresh:
            os.utime(p, (hour_ago, hour_ago))
    io.write_text(target, "new")
    assert files_under(tmp_path) == sorted([target.name, fresh.name, *(p.name for p in other)])


@pytest.mark.parametrize("private", [True, False])
def test_overwrite_keeps_a_private_mode(tmp_path, private):
    import stat

    target = tmp_path / "out.txt"
    io.write_text(target, "first", private=True)
    os.chmod(target, 0o600)
    io.write_text(target, "second", private=private)
    assert target.read_text() == "second" and stat.S_IMODE(os.stat(target).st_mode) == 0o600
    fresh = tmp_path / "new.txt"
    io.write_text(fresh, "x", private=private)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == (0o600 if private else 0o644)
