"""Helpers shared by the CLI tests: run a command in-process, check a one-line error."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from empdp.cli.main import cli

SAMPLE = str(Path(__file__).resolve().parents[1] / "sample_data" / "countymurders.parquet")
#: the curator key that signs the tests' calibrations and ledgers (fixture ``curator_key`` sets it)
CURATOR_KEY = b"test-suite-curator-key-0123456789abc"
#: the sample's id, database and query options
QUERY = ["--id", "countyid", "--by", "year", "--query", "mean(murdrate)"]


def write_key(path, key: bytes = CURATOR_KEY) -> Path:
    """A key file as a curator keeps one: owner-only (mode 0600), else empdp refuses it."""
    path = Path(path)
    path.write_bytes(key)
    path.chmod(0o600)
    return path


def run(*args, env: dict | None = None):
    """``empdp ARGS...`` in-process (arguments may be numbers or paths); exceptions propagate."""
    return CliRunner().invoke(cli, [str(a) for a in args], env=env, catch_exceptions=False)


def one_line_error(res, *fragments: str, code: int = 2) -> str:
    """Bad input: exit ``code``, exactly one 'Error: ' line holding every fragment, no traceback."""
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def set_field(d: dict, path, value) -> None:
    """Set ``d[path[0]][path[1]]...`` to ``value`` in place, or delete it when ``value`` is KeyError
    (tests that damage one field of a JSON file)."""
    *parents, last = path
    for key in parents:
        d = d[key]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value


def parquet_file(tmp_path_factory, table, folder: str, name: str) -> str:
    """``table`` written to a fresh folder of a module-scoped fixture; its path."""
    path = tmp_path_factory.mktemp(folder) / name
    table.write_parquet(path)
    return str(path)


def settings(**flat) -> dict:
    """The keywords of ``empdp.assess``/``calibrate`` for options named flat (``kernel="gaussian"``,
    ``engine="spark"``): ``model=Model(...)`` and ``execution=Execution(...)``, for tests that loop
    over options by name."""
    from dataclasses import fields

    from empdp.settings import Execution, Model

    out = {}
    for cls, key in ((Model, "model"), (Execution, "execution")):
        mine = {f.name for f in fields(cls)}
        given = {k: v for k, v in flat.items() if k in mine}
        if given:
            out[key] = cls(**given)
    unknown = set(flat) - {f.name for cls in (Model, Execution) for f in fields(cls)}
    assert not unknown, f"not a setting: {unknown}"
    return out


def html_sections(html: str) -> dict:
    """A report's sections by their id."""
    return dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', html, flags=re.S))


def no_timestamp(html: str) -> str:
    """A report without the time it was generated at."""
    return re.sub(r"generated \S+ \S+ UTC", "", html)


def table_rows(section: str) -> list[list[str]]:
    """The text of each cell of each body row of a section's table."""
    body = section[section.index("<tbody>"):section.index("</tbody>")]
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]
