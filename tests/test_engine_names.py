"""``--engine``'s choices come from a light tuple, not from importing the engines (issue 36).

Importing :mod:`empdp.engines` (polars, DuckDB) only to list two names cost every command ~0.6 s of
start-up, an audit's inside its time budget.
"""

import subprocess
import sys
import textwrap

from helpers import run

from cli._common import ENGINE_NAMES
from empdp.engines import ENGINES

#: modules a command's start-up must not load: the engines and what they pull in, and the compiled kernels
HEAVY = ("empdp.engines", "polars", "duckdb", "numba")

_PROBE = textwrap.dedent("""
    import atexit, sys
    atexit.register(lambda: print(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}
                                         or m == "empdp.engines"), file=sys.stderr))
    from empdp.cli.main import main
    sys.argv = ["empdp", *sys.argv[1:]]
    main()
""")


def _heavy_modules(*args) -> list:
    code = _PROBE.format(heavy={m for m in HEAVY if "." not in m})
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return eval(res.stderr.strip().splitlines()[-1])  # the probe's own printed list of names


def test_engine_names_are_the_engines():
    assert ENGINE_NAMES == tuple(ENGINES)


def test_engine_choices_offer_every_engine_and_refuse_others():
    res = run("assess", "--help")
    assert res.exit_code == 0, res.output
    for name in ENGINE_NAMES:
        assert name in res.output
    res = run("assess", "x.parquet", "--engine", "sqlite", "--id", "a", "--by", "b", "--query", "mean(c)")
    assert res.exit_code == 2 and "sqlite" in res.output, res.output


def test_help_and_audit_help_import_no_engine():
    assert _heavy_modules("--help") == []
    assert _heavy_modules("audit", "mpl", "--help") == []


def test_an_audit_of_a_builtin_imports_no_engine():
    """An audit reads no table: checking its pairs once built every error message through empdp.data, whose
    import (DuckDB, pyarrow) took ~1 s of the first pilot and of the time budget. Numba is loaded only by
    the compiled samplers (Sparse Vector, Report Noisy Max) and the binning of vector outputs (module
    empdp.audit.compiled), when they are first called."""
    assert _heavy_modules("audit", "mpl", "-m", "laplace", "--search-size", "2000", "--final-size", "10000",
                          "--quiet") == []
    loaded = _heavy_modules("audit", "mpl", "-m", "svt3", "--search-size", "2000", "--final-size", "10000",
                            "--quiet")
    assert "numba" in loaded and not {"empdp.engines", "polars", "duckdb"} & set(loaded)
