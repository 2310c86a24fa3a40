"""Commands are adapters: shared policy (the analysis cache, recording a run) lives in
modules of its own, so no command imports another command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

COMMANDS = Path(__file__).resolve().parents[2] / "diag" / "commands"
PACKAGE = "pardiag.commands"


def command_modules() -> list[Path]:
    return sorted(p for p in COMMANDS.glob("*.py") if p.name != "__init__.py")


def imported_commands(source: str) -> list[str]:
    """The command modules that `source` (a module of the commands package) imports."""
    names = {p.stem for p in command_modules()}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(PACKAGE + ".")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 and module:  # from .x import y
                found.append(f"{PACKAGE}.{module}")
            elif node.level == 1 or module == PACKAGE:  # from . import x, from pardiag.commands import x
                found += [f"{PACKAGE}.{a.name}" for a in node.names if a.name in names]
            elif module.startswith(PACKAGE + "."):
                found.append(module)
            elif module == "pardiag" and any(a.name == "commands" for a in node.names):
                found.append(PACKAGE)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PACKAGE + "."):
            found.append(node.value)  # importlib.import_module("pardiag.commands.x")
    return sorted(set(found))


def test_there_are_commands() -> None:
    assert {"analyze", "run", "demo", "report", "tui"} <= {p.stem for p in command_modules()}


@pytest.mark.parametrize("path", command_modules(), ids=lambda p: p.stem)
def test_no_command_imports_another_command(path: Path) -> None:
    assert imported_commands(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source", [
    "from pardiag.commands.run import record",
    "import pardiag.commands.analyze",
    "from pardiag.commands import analyze",
    "from . import run",
    "from .analyze import load_or_analyze",
    "from pardiag import commands",
    "def f():\n    from pardiag.commands.analyze import load_or_analyze\n",
    "import importlib\nimportlib.import_module('pardiag.commands.run')",
])
def test_every_shape_of_such_an_import_is_caught(source: str) -> None:
    assert imported_commands(source) != []


def test_services_are_not_caught() -> None:
    source = "from pardiag.analysis_cache import load_or_analyze\nfrom pardiag import rundir\nimport pardiag.recording\n"
    assert imported_commands(source) == []
