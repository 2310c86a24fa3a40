"""The tests' own layout: builders live in `factories` (pardiag's objects) and `tracegen`
(raw traces), shared fixtures in `conftest`; no test module imports from another, so that
each one can be read, moved or deleted on its own. Each test module sits in the folder of
what it tests, so that a newcomer finds a module's tests: `analyzers/`, `collectors/`,
`tui/` as the source folders, `diag/` for pardiag's model, records, cache and renderers,
`commands/` for the command line as a user runs it, `jobs/` for real training jobs and
installs end to end (README.md, "Layout")."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
GROUPS = ("analyzers", "collectors", "diag", "commands", "tui", "jobs")


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
    for path in sorted(TESTS.rglob("*.py")):
        tests = {m for m in imported_modules(ast.parse(path.read_text(), str(path))) if m.startswith("test_")}
        if tests:
            offenders[path.name] = sorted(tests)
    assert offenders == {}, "import builders from factories or tracegen, not from another test module"


def test_the_check_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from test_report import CASES\nimport test_levers.sub\nfrom factories import rank\n")
    assert imported_modules(tree) == {"test_report", "test_levers", "factories"}


def test_every_test_module_is_in_the_folder_of_what_it_tests() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    misplaced = [str(p.relative_to(TESTS)) for p in modules
                 if p.parent != TESTS and p.parent.relative_to(TESTS).parts[0] not in GROUPS]
    at_top = [p.name for p in modules if p.parent == TESTS and p.name != "test_layout.py"]
    assert misplaced == [] and at_top == [], (misplaced, at_top)
    names = [p.name for p in modules if "frameworks" not in p.parts]
    assert len(names) == len(set(names)), "test module names are unique (pytest imports them by name)"
    assert len(modules) > 40
