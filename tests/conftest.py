from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), *args]


T = TypeVar("T")


def steadier(record: Callable[[int], T], unsteadiness: Callable[[T], float], what: str) -> T:
    """A timed test's recording (``record(0)``), recorded once more (``record(1)``) when it
    was unsteady: ``unsteadiness`` over 1, the host having moved under it. The steadier of
    the two is kept, the first on a tie."""
    first = record(0)
    if (u1 := unsteadiness(first)) <= 1:
        return first
    second = record(1)
    u2 = unsteadiness(second)
    print(f"{what}: unsteadiness {u1:.2f}, recorded again: {u2:.2f} (over 1: unsteady)")
    return second if u2 < u1 else first


def pardiag_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pardiag", *args]


def run_pardiag(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 240, measure: bool = False) -> subprocess.CompletedProcess[str]:
    """`pardiag ARGS`; a `pardiag run` skips the factors measured after the job (up to
    50 s) unless `measure`: the tests of the factors ask for them."""
    if args and args[0] == "run" and not measure:
        args = ("run", "--no-measure", *args[1:])
    e = dict(os.environ)
    e.pop("PARDIAG_RUN_DIR", None)
    if env:
        e.update(env)
    return subprocess.run(pardiag_cmd(*args), cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def tiny_script() -> Path:
    return SCRIPTS / "tiny_ddp.py"


@pytest.fixture(scope="session")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real interpreter that cannot import torch (a bare virtual environment)."""
    env = tmp_path_factory.mktemp("bare") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0
    return python


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (`make test` runs the tests not marked `timed` on several workers):
    tests that share a fixture their own module builds once (a module- or session-scoped
    job, parametrized or not) go to one worker together, so that the job runs once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        module = item.path
        for name in sorted(item.fixturenames):
            defs = info.name2fixturedefs.get(name)
            if not defs or defs[-1].scope not in ("module", "session"):
                continue
            code = getattr(defs[-1].func, "__code__", None)
            if code is None or Path(code.co_filename) != module:
                continue
            callspec = getattr(item, "callspec", None)
            value = callspec.params.get(name, "") if callspec is not None else ""
            param = value if isinstance(value, str) else callspec.indices[name]  # type: ignore[union-attr]
            item.add_marker(pytest.mark.xdist_group(f"{module.stem}:{name}:{param}"))
            break
