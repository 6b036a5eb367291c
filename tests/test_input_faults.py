"""The bad-input catalogue (issue 23): every numeric option of ``assess`` and ``audit
mpl|renyi|release`` given NaN, ±inf, huge, negative, zero and tiny numbers, and JSON bombs in
every file the commands read.

Each case must end with exit 0, or exit 2 and exactly one ``Error:`` line on stderr: no
traceback, no internal error, no NumPy warning dump, and nothing written (no output file, no
temporary). The audits run with small samples so that the catalogue stays fast.
"""

from __future__ import annotations

import functools
import os
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import random_panel

from empdp.cli.main import cli
from empdp.settings import Model

#: the values tried in every numeric option
VALUES = ("nan", "inf", "-inf", "1e308", "-1e308", "-1", "0", "1e-320", "99999999999999999999", "9" * 400, "")

#: the deepest-nesting and longest-integer JSON files (Python refuses both by default)
BOMBS = {"digits": "[" + "9" * 5000 + "]", "nesting": "[" * 100_000 + "]" * 100_000,
         "object_digits": '{"format": "empdp-calibration/1", "epsilon": ' + "9" * 5000 + "}",
         "nan": "[[NaN, Infinity]]"}

ASSESS_OPTIONS = ("--epsilon", "--memory-limit", "--threads", "--bandwidth")
AUDIT_OPTIONS = {
    "mpl": ("--alpha", "--n", "--N", "--seed", "--region", "--param epsilon=", "--param sensitivity="),
    "renyi": ("--alpha", "--n", "--order", "--seed", "--param epsilon=", "--param sensitivity="),
    "release": ("--top", "--order", "--alpha", "--seed"),
}
#: built-in parameters, each tried on its mechanism with every value
MECHANISM_PARAMS = (("gaussian", "sigma"), ("noisy_gd", "steps"), ("noisy_gd", "lr"), ("noisy_gd", "sigma"),
                    ("randomized_response", "p"), ("subsampled_gaussian", "q"), ("noisy_max", "epsilon"))

TALLY = {"tried": 0, "clean": 0}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small panel and its calibration, in a folder of their own."""
    from empdp.noise import calibrate

    folder = tmp_path_factory.mktemp("inputs")
    panel = folder / "panel.parquet"
    random_panel(2, n_db=6, n_ind=12).to_parquet(panel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(str(panel), id="id", by="year", query="mean(x)", epsilon=1.0, model=Model(kernel="laplace"))
    cal.save(folder / "cal.json")
    for name, text in BOMBS.items():
        (folder / f"{name}.json").write_text(text)
    return folder


@pytest.fixture(autouse=True)
def small_release_audit(monkeypatch):
    """``audit release`` with small samples (the CLI has no options for them)."""
    import empdp.audit

    monkeypatch.setattr(empdp.audit, "audit_release",
                        functools.partial(empdp.audit.audit_release, n=300, N=600, n_renyi=300))


def invoke(args, out_dir):
    """Run ``empdp ARGS`` in-process; return (exit code, stdout, stderr, warnings raised)."""
    before = set(os.listdir(out_dir))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = CliRunner().invoke(cli, [str(a) for a in args])
    new = set(os.listdir(out_dir)) - before
    dumps = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    return res, new, dumps


def problem(args, out_dir, written_ok=()):
    """None if the run was clean, else what went wrong: exit 0, or exit 2 with one 'Error:' line; no
    traceback or warning; nothing written on error."""
    res, new, dumps = invoke(args, out_dir)
    TALLY["tried"] += 1
    stderr, shown = res.stderr, " ".join(str(a) for a in args[:12])[:300]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if res.exit_code not in (0, 2):
        return f"{shown}: exit {res.exit_code}: {res.output[-300:]}"
    if "Traceback" in stderr or "internal error" in stderr:
        return f"{shown}: {stderr[-300:]}"
    if dumps or "Warning:" in stderr:  # a NumPy warning dump (RuntimeWarning: ...)
        return f"{shown}: warnings {[str(w.message) for w in dumps][:3]} {stderr[-200:]}"
    if res.exit_code == 2:
        if len(lines) != 1 or not lines[0].startswith("Error: "):
            return f"{shown}: not one Error: line: {stderr[-300:]}"
        if len(lines[0]) > 600:
            return f"{shown}: the error echoes a long value in full ({len(lines[0])} characters)"
        if new:
            return f"{shown}: wrote {sorted(new)}"
    elif not new <= set(written_ok):
        return f"{shown}: wrote {sorted(new)}"
    TALLY["clean"] += 1
    return None


def check_clean(args, out_dir, written_ok=()):
    """Assert that one run is clean (see :func:`problem`); return its result."""
    found = problem(args, out_dir, written_ok)
    assert found is None, found


def check_all(cases, out_dir, written_ok=(), cleanup=None):
    """Run every case, then fail listing each one that was not clean."""
    found = []
    for args in cases:
        found.append(problem(args, out_dir, written_ok))
        if cleanup:
            cleanup()
    found = [f for f in found if f]
    assert not found, f"{len(found)} of {len(cases)} cases not clean:\n" + "\n".join(found)


def _option(option: str, value: str) -> list:
    if option.startswith("--param "):
        return ["--param", option.split(" ", 1)[1] + value]
    if option == "--region":
        return ["--region", f"{value},1" if value != "" else ","]
    return [option, value]


# ------------------------------------------------------------------------ assess

@pytest.mark.parametrize("option", ASSESS_OPTIONS)
def test_assess_numeric_options(files, tmp_path, option):
    out = tmp_path / "rows.csv"
    base = ["assess", files / "panel.parquet", "--id", "id", "--by", "year", "--query", "mean(x)",
            "--kernel", "laplace", "--out", out, "-q"]
    if option != "--bandwidth":
        base += ["--bandwidth", "0.5"]
    if option != "--epsilon":
        base += ["-e", "1"]
    check_all([base + _option(option, value) for value in VALUES], tmp_path, written_ok=("rows.csv",),
              cleanup=lambda: out.unlink(missing_ok=True))


# ------------------------------------------------------------------------ audit

@pytest.mark.parametrize("command, option", [(c, o) for c, opts in AUDIT_OPTIONS.items() for o in opts])
def test_audit_numeric_options(files, tmp_path, command, option):
    if command == "release":
        base = ["audit", "release", files / "cal.json", files / "panel.parquet", "--json"]
    else:
        base = ["audit", command, "-m", "laplace", "--json", "--n", "300"]
        base += ["--N", "600"] if command == "mpl" else ["--order", "2"]
        base = [a for a in base if a not in ("--n", "300")] if option == "--n" else base
        if option in ("--N", "--order"):
            i = base.index(option)
            base = base[:i] + base[i + 2:]
    check_all([base + _option(option, value) for value in VALUES], tmp_path)


@pytest.mark.parametrize("mechanism, param", MECHANISM_PARAMS)
def test_mechanism_parameters(tmp_path, mechanism, param):
    cases = [["audit", command, "-m", mechanism, "--n", "300", *extra, "--seed", "1", "--json",
              "--param", f"{param}={value}"]
             for value in VALUES for command, extra in (("mpl", ["--N", "600"]), ("renyi", ["--order", "2"]))]
    check_all(cases, tmp_path)


def test_noisy_gd_absurd_steps_are_refused_quickly(tmp_path):
    """steps=1e12 ran for over 120 s: the cost is checked with the parameters."""
    import time

    t0 = time.perf_counter()
    res, _, _ = invoke(["audit", "mpl", "-m", "noisy_gd", "--param", "steps=1e12"], tmp_path)
    assert res.exit_code == 2 and "steps=1e+12 is over 10,000" in res.stderr, res.output
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("spec", ["patterns:1000000000", "patterns:-5", "patterns:0"])
def test_pattern_sizes(tmp_path, spec):
    check_all([["audit", "mpl", "-m", "noisy_max", "--pairs", spec, "--n", "300", "--N", "600"]], tmp_path)


# ------------------------------------------------------------------------ JSON bombs

@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_json_bombs_in_every_file_read(files, tmp_path, bomb):
    path = files / f"{bomb}.json"
    panel = files / "panel.parquet"
    query = ["--id", "id", "--by", "year", "--query", "mean(x)"]
    commands = [
        ["audit", "mpl", "-m", "laplace", "--pairs", path],
        ["audit", "renyi", "-m", "laplace", "--order", "2", "--pairs", path],
        ["audit", "release", path, panel],
        ["release", path, "--value", "1", "--ledger", tmp_path / "ledger.db"],
        ["report", path, "--output", tmp_path / "r.html"],
        ["assess", panel, *query, "--report", tmp_path / "r.html", "--calibration", path],
        ["assess", panel, *query, "--report", tmp_path / "r.html", "--audit", path],
    ]
    check_all(commands, tmp_path)
    for args in commands:  # each of these files is bad input
        assert invoke(args, tmp_path)[0].exit_code == 2, args


def test_read_json_refuses_bombs_in_one_line(tmp_path):
    from empdp.errors import InputError
    from empdp.io import read_json

    (tmp_path / "deep.json").write_text(BOMBS["nesting"])
    (tmp_path / "long.json").write_text(BOMBS["digits"])
    with pytest.raises(InputError, match="nests lists or objects too deeply"):
        read_json(tmp_path / "deep.json", "test file")
    assert read_json(tmp_path / "long.json", "test file") == [float("inf")]  # for the callers to refuse
    assert np.isinf(read_json(tmp_path / "long.json", "test file")[0])


def test_zz_tally():
    """The figures for the closing note (run with -s to see them); runs last in this file."""
    print(f"\nbad-input catalogue: {TALLY['tried']} cases tried, {TALLY['clean']} clean")


# ------------------------------------------------------------------------ long values

LONG = "zz" * 3000


@pytest.mark.parametrize("options", [
    ["--query", "mean(x)", "--where", LONG + " > 1"],
    ["--query", f"mean({LONG})"],
    ["--query", LONG],
    ["--sql", f"SELECT avg(x) FROM db WHERE {LONG} > 1"],
    ["--query", "mean(x)", "--memory-limit", LONG],
    ["--query", "mean(x)", "--out", LONG + ".csv"],
    ["--query", "mean(x)", "--out", "x/" * 3000 + "t.csv"],
])
def test_long_option_values_are_echoed_shortened(files, tmp_path, options):
    """Very long option values were echoed in full in the error line."""
    res, new, _ = invoke(["assess", files / "panel.parquet", "--id", "id", "--by", "year", *options, "-q"], tmp_path)
    line = res.stderr.strip()
    assert res.exit_code == 2 and line.startswith("Error: ") and "\n" not in line, res.output[:300]
    assert len(line) < 600 and not new, line[:300]


@pytest.mark.parametrize("args", [["mpl", "-m", LONG], ["mpl", "-m", "laplace", "--param", LONG],
                                  ["mpl", "-m", "laplace", "--param", f"{LONG}=1"],
                                  ["mpl", "-m", "laplace", "--region", LONG], ["mpl", "-m", "laplace", "--pairs", LONG],
                                  ["mpl", "-m", f"{LONG}:f"]])
def test_long_audit_values_are_echoed_shortened(tmp_path, args):
    res, _, _ = invoke(["audit", *args], tmp_path)
    line = res.stderr.strip()
    assert res.exit_code == 2 and line.startswith("Error: ") and "\n" not in line, res.output[:300]
    assert len(line) < 600, line[:300]
