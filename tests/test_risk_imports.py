"""The risk package's modules import each other without a circle (issue 35: cells.py and laplace.py
imported each other, one way only for a type annotation).

The same finder as the audit package's test: imports inside functions and annotations count,
only those under ``if TYPE_CHECKING:`` are left out (they never run).
"""

import ast
from pathlib import Path

from test_audit_imports import _audit_imports, _circle

import empdp.risk

PACKAGE = Path(empdp.risk.__file__).parent


def test_the_risk_package_has_no_import_circle():
    paths = {p.stem: p for p in PACKAGE.glob("*.py")}
    graph = {name: _audit_imports(path, set(paths)) - {name} for name, path in paths.items()}
    assert graph["laplace"] >= {"cells"}  # the finder sees the package's relative imports
    assert _circle(graph) is None, " -> ".join(_circle(graph))


def test_cells_imports_nothing_from_laplace_not_even_for_type_checking():
    """The circle was closed by a type-checking import of laplace's GridPlan: cells works on arrays only."""
    tree = ast.parse((PACKAGE / "cells.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.split(".")[-1] == "laplace"}
