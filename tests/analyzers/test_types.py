"""The analysis type-checks: mypy, strict on `pardiag.analyzers`, `pardiag.analysis` and the typed
records it reads (pyproject.toml, [tool.mypy]), reports no error.

The import names come from setuptools' package-dir mapping (`pardiag` is diag/,
`pardiag.analyzers` is analyzers/, ...), which mypy cannot see through an editable
install. The test lays the mapping out as a `pardiag` tree of links in a temporary
folder and puts it on MYPYPATH; mypy's messages are given back with the repository's
paths. Its cache is the repository's .mypy_cache, so a second run takes a few seconds.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def _package_dirs() -> dict[str, str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(conf["tool"]["setuptools"]["package-dir"])


def _link_tree(root: Path, package_dirs: dict[str, str]) -> None:
    """`root/pardiag/...` as the installed package: a top-level package is a folder whose
    entries link to its source folder's; a subpackage mapped elsewhere is a link to its
    folder (the source folder's own entry of that name, if any, is replaced)."""
    for name, src in sorted(package_dirs.items(), key=lambda kv: kv[0].count(".")):
        target = root.joinpath(*name.split("."))
        source = (REPO / src).resolve()
        if "." not in name:
            target.mkdir(parents=True)
            for entry in source.iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
        else:
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(source, target_is_directory=True)


def test_analysis_type_checks(tmp_path: Path) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it comes with the `test` extra: pip install -e '.[test]')")
    tree = tmp_path / "src"
    try:
        _link_tree(tree, _package_dirs())
    except OSError as e:  # no symbolic links on this file system
        pytest.skip(f"cannot lay out the package tree for mypy: {e}")
    env = dict(os.environ, MYPYPATH=str(tree))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
         "--cache-dir", ".mypy_cache", "--no-error-summary", "--hide-error-context"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    # the link tree's paths back to the repository's folders
    for name, src in sorted(_package_dirs().items(), key=lambda kv: -kv[0].count(".")):
        out = out.replace(str(tree.joinpath(*name.split("."))) + os.sep, src.rstrip("/") + "/")
    if proc.returncode != 0:
        pytest.fail(f"mypy reports type errors (pyproject.toml, [tool.mypy]):\n{out}", pytrace=False)
