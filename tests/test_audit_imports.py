"""The audit package has no import circle (issue 34, item 6).

Imports inside functions count: one placed there to dodge a circle is still a circle. Only
imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

import ast
from pathlib import Path

import empdp.audit

PACKAGE = Path(empdp.audit.__file__).parent


def _module_name(path: Path) -> str:
    return "__init__" if path.name == "__init__.py" else path.stem


def _type_checking_nodes(tree: ast.AST) -> set:
    """ids of the nodes under an ``if TYPE_CHECKING:`` block."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(sub) for sub in ast.walk(node))
    return inside


def _audit_imports(path: Path, modules: set) -> set:
    """Modules of the audit package that ``path`` imports (relative ``from .x`` / ``from . import x``)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or id(node) in skip:
            continue
        absolute = node.module and node.module.startswith("empdp.audit")
        if node.level == 1 or absolute:
            target = node.module.removeprefix("empdp.audit").lstrip(".") if node.module else ""
            names = [target] if target else [a.name for a in node.names]
            found.update(name.split(".")[0] for name in names if name.split(".")[0] in modules)
    return found


def _graph() -> dict:
    paths = {_module_name(p): p for p in PACKAGE.glob("*.py")}
    return {name: _audit_imports(path, set(paths)) - {name} for name, path in paths.items()}


def _circle(graph: dict) -> list | None:
    """One import circle as a list of modules (first = last), or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_circle_finder_finds_a_circle_through_a_function_level_import():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_imports_inside_functions(tmp_path):
    (tmp_path / "one.py").write_text("def f():\n    from .two import g\n    return g\n")
    (tmp_path / "two.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .one import f\n")
    assert _audit_imports(tmp_path / "one.py", {"one", "two"}) == {"two"}
    assert _audit_imports(tmp_path / "two.py", {"one", "two"}) == set()


def test_the_audit_package_has_no_import_circle():
    graph = _graph()
    assert {"mpl", "dpl", "events", "kde"} <= set(graph)  # the modules of the old circle are all seen
    assert _circle(graph) is None, f"import circle: {' -> '.join(_circle(graph))}"
