"""The tests' own layout: builders live in `factories` (pardiag's objects) and `tracegen`
(raw traces), shared fixtures in `conftest`; no test module imports from another, so that
each one can be read, moved or deleted on its own."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(tree: ast.AST) -> set[str]:
    """Every top-level module name an import names, at any depth (inside functions too)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_no_test_module_imports_another() -> None:
    offenders = {}
    for path in sorted(TESTS.glob("*.py")):
        tests = {m for m in imported_modules(ast.parse(path.read_text(), str(path))) if m.startswith("test_")}
        if tests:
            offenders[path.name] = sorted(tests)
    assert offenders == {}, "import builders from factories or tracegen, not from another test module"


def test_the_check_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from test_report import CASES\nimport test_levers.sub\nfrom factories import rank\n")
    assert imported_modules(tree) == {"test_report", "test_levers", "factories"}
