"""Every package of the source tree is installed by 'pip install .' (the README's first command).

A subpackage missing from pyproject.toml's list works in the editable install the tests use and
fails only after a plain install: 'No module named empdp.loo'.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(empdp(?:\.\w+)*)"', re.search(r"packages = \[(.*?)\]", text).group(1)))
    found = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "empdp").rglob("__init__.py")}
    found |= {"empdp.cli"}  # cli/ is installed as empdp.cli (package-dir)
    assert found == listed, f"missing: {sorted(found - listed)}, stale: {sorted(listed - found)}"
