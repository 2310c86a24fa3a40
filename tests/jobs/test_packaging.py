"""pardiag installed the way users install it.

- The wheel holds every package and data file of the folders installed as `pardiag.*`
  (a new subpackage cannot be forgotten in pyproject.toml), and building it prints no
  setuptools warning.
- No analysis command imports torch (or HTA, or pandas).
- `pardiag run` refuses, before anything starts, a command whose Python has no torch.
- slow: the wheel installed with its dependencies from the package index into a fresh
  virtual environment without torch runs `--version`, `analyze`, `report`, `diff` and a
  headless `tui` on a real 2-rank CPU trace, and says how to get HTA for `--hta`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, run_pardiag

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = DATA / "cpu-2rank"  # `pardiag demo`'s two ranks (gloo, CPU), as plain torch.profiler traces
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "LICENSE.txt", "NOTICE")
IGNORED = re.compile(r"(^|/)(__pycache__|\.[^/]*)(/|$)|\.py[co]$")
# setuptools' own warnings: a warning class, or the "!!" banner around its long notices
BUILD_WARNING = re.compile(r"\w*Warning\b|^\s*!!\s*$|^\s*\*{20,}", re.MULTILINE)


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _package_dirs() -> dict[str, Path]:
    """Installed name -> folder, from pyproject's package-dir mapping."""
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    return {name: REPO / folder for name, folder in mapping.items()}


def _sources_copy(dest: Path) -> Path:
    """The files a build reads, copied (so that building leaves nothing in the checkout
    and never races another build there)."""
    dest.mkdir()
    for name in SOURCES:
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)
    for folder in {p.relative_to(REPO).parts[0] for p in _package_dirs().values()}:
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(the wheel, what the build printed). Built by setuptools' PEP 517 backend
    (pyproject.toml's build-system), as pip and `python -m build` call it."""
    setuptools = pytest.importorskip("setuptools")
    required = re.search(r"setuptools>=([0-9.]+)", str(_pyproject()["build-system"]["requires"]))
    have = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    if required and have < tuple(int(x) for x in required.group(1).split(".")[:2]):
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build needs ({required.group(0)})")
    root = tmp_path_factory.mktemp("build")
    src = _sources_copy(root / "src")
    out = root / "dist"
    out.mkdir()
    script = ("import sys\nfrom setuptools import build_meta as b\n"
              "sys.stdout.write('WHEEL=' + b.build_wheel(sys.argv[1]) + '\\n')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    res = subprocess.run([sys.executable, "-c", script, str(out)], cwd=src, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    name = re.search(r"^WHEEL=(.+)$", res.stdout, re.MULTILINE)
    assert name, res.stdout[-2000:]
    return out / name.group(1), res.stdout + res.stderr


def _expected_files() -> dict[str, Path]:
    """Every file of the installed folders, by its path inside the wheel."""
    dirs = _package_dirs()
    tops = {name: folder for name, folder in dirs.items()}
    out: dict[str, Path] = {}
    for name, folder in tops.items():
        for f in folder.rglob("*"):
            rel = f.relative_to(folder).as_posix()
            if not f.is_file() or IGNORED.search(rel):
                continue
            # a file under a nested root (collectors/ inside pardiag?) belongs to that root only
            inner = name.replace(".", "/") + "/" + rel
            owner = max((n for n in tops if inner.startswith(n.replace(".", "/") + "/")), key=len)
            if owner == name:
                out[inner] = f
    return out


def test_wheel_has_every_package_and_data_file(built: tuple[Path, str]) -> None:
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _expected_files()
    missing = sorted(p for p in expected if p not in names)
    assert not missing, f"not in the wheel (add the package or its data to pyproject.toml): {missing}"
    packages = {str(Path(p).parent).replace("/", ".") for p in names if p.endswith("/__init__.py")}
    on_disk = {str(Path(p).parent).replace("/", ".") for p in expected if p.endswith("/__init__.py")}
    assert packages == on_disk
    for sub in ("pardiag.tui.screens", "pardiag.tui.widgets", "pardiag.commands", "pardiag.collectors._inject"):
        assert sub in packages
    assert "pardiag/templates/report.html.j2" in names
    stray = sorted(p for p in names if not p.startswith(("pardiag/", "pardiag-")))
    assert not stray, f"the wheel installs outside pardiag/: {stray}"


def test_wheel_metadata_needs_no_torch(built: tuple[Path, str]) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.MULTILINE)
    core = [r for r in requires if "extra ==" not in r]
    assert core and not [r for r in core if re.match(r"(torch|holistictraceanalysis|pandas|jupyter)", r, re.I)]
    assert any(re.match(r"holistictraceanalysis.*extra == .hta.", r, re.I) for r in requires)
    for extra in ("hta", "frameworks", "test"):
        assert f"Provides-Extra: {extra}" in meta
    assert re.search(r"^License-Expression: Apache-2.0$", meta, re.MULTILINE)


def test_build_prints_no_setuptools_warning(built: tuple[Path, str]) -> None:
    _, output = built
    found = [line.strip() for line in output.splitlines() if BUILD_WARNING.search(line)]
    assert not found, "the build warns:\n" + "\n".join(found[:40])


# -- no torch in the analysis -----------------------------------------------------------------------

NO_TORCH = r"""
import importlib, pkgutil, sys
BLOCKED = ("torch", "hta", "pandas")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} imported by an analysis command")

sys.meta_path.insert(0, Block())
from pardiag.cli import main
data, out = sys.argv[1], sys.argv[2]
for argv in (["analyze", data, "-j", "1", "--json"], ["report", data, "-j", "1", "-o", out + "/r.html"],
             ["report", data, "-j", "1", "--format", "md"], ["diff", data, data]):
    rc = main(argv)
    assert rc == 0, (argv, rc)
import pardiag.tui.app
for pkg in ("pardiag", "pardiag.commands", "pardiag.analyzers", "pardiag.tui", "pardiag.tui.screens",
            "pardiag.tui.widgets"):
    for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__):
        if m.name != "__main__":
            importlib.import_module(f"{pkg}.{m.name}")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("NO-TORCH-OK")
"""


def test_analysis_commands_import_no_torch(tmp_path: Path) -> None:
    """Every module of the CLI, the analyzers and the TUI imports without torch, HTA or
    pandas; analyze, report (html, md) and diff run on real traces with them blocked."""
    res = subprocess.run([sys.executable, "-c", NO_TORCH, str(TRACES), str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0 and "NO-TORCH-OK" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    assert (tmp_path / "r.html").stat().st_size > 100_000


# -- `pardiag run`: torch in the job's Python ------------------------------------------------------------


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_job_python_is_found_in_every_launcher_shape(tmp_path: Path, python_without_torch: Path) -> None:
    from pardiag.torch_check import job_python

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    py = str(python_without_torch)
    env = {"PATH": f"{bin_}{os.pathsep}{python_without_torch.parent}"}
    _script(bin_ / "torchrun", f"#!{py}\nimport sys\n")
    _script(bin_ / "deepspeed", "#!/usr/bin/env python3\n")
    _script(bin_ / "accelerate", f"#!/bin/sh\n'''exec' \"{py}\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    _script(bin_ / "train-entry", f"#!{py}\n")
    _script(bin_ / "srun", "#!/bin/sh\nexec \"$@\"\n")
    _script(bin_ / "job.sh", "#!/bin/sh\npython train.py\n")
    assert job_python(["torchrun", "--nproc-per-node", "2", "t.py"], env) == py
    assert job_python(["deepspeed", "t.py"], env) == str(python_without_torch.parent / "python3")
    assert job_python(["accelerate", "launch", "t.py"], env) == py
    assert job_python(["train-entry", "--epochs", "1"], env) == py
    assert job_python(["python3", "-m", "torch.distributed.run", "t.py"], env) == str(python_without_torch.parent / "python3")
    assert job_python(["srun", "-n", "2", "python", "t.py"], env) == str(python_without_torch.parent / "python")
    assert job_python([py, "t.py"], env) == py
    assert job_python(["job.sh"], env) is None  # a shell script: cannot tell, the job starts
    assert job_python(["no-such-launcher-xyz", "t.py"], env) is None


def test_an_interpreter_that_cannot_answer_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pardiag.torch_check as torch_check

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _script(bin_ / "python", "#!/bin/sh\nexit 1\n")  # a broken interpreter: cannot tell
    torch_check.check_job_torch(["python", "t.py"], {"PATH": str(bin_)})
    _script(bin_ / "python", "#!/bin/sh\nsleep 5\n")
    monkeypatch.setattr(torch_check, "TORCH_PROBE_TIMEOUT_S", 0.5)
    torch_check.check_job_torch(["python", "t.py"], {"PATH": str(bin_)})  # too slow to answer: the job starts


def test_run_refuses_a_python_without_torch_before_starting(tmp_path: Path, python_without_torch: Path) -> None:
    out = tmp_path / "run"
    marker = tmp_path / "started"
    res = run_pardiag("run", "--out", str(out), "--", str(python_without_torch), "-c",
                      f"open({str(marker)!r}, 'w')")
    assert res.returncode == 2
    line = res.stderr.strip()
    assert line.count("\n") == 0 and "has no torch" in line and str(python_without_torch) in line
    assert "--no-torch-check" in line
    assert not marker.exists() and not out.exists()  # nothing started, no run directory
    # the check can be skipped; and a Python with torch passes it
    res = run_pardiag("run", "-q", "--no-report", "--no-torch-check", "--out", str(out), "--",
                      str(python_without_torch), "-c", f"open({str(marker)!r}, 'w')")
    assert res.returncode == 0, res.stderr
    assert marker.exists()
    from pardiag.torch_check import check_job_torch

    check_job_torch([sys.executable, "train.py"], os.environ)  # .venv has torch: no error


def test_hta_missing_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from pardiag.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hta" else real(name, *a))
    assert main(["analyze", str(TRACES), "--hta", "-j", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'pardiag[hta]'" in err


# -- the wheel in a fresh environment without torch -------------------------------------------------------

TUI_START = r"""
import asyncio, html, sys
from pathlib import Path
from pardiag.tui.app import make_app

async def main():
    app = make_app(Path(sys.argv[1]))
    async with app.run_test(size=(140, 40)) as pilot:
        for _ in range(600):
            await pilot.pause(0.05)
            if app.load_error or (app.analysis is not None and app.current_mode == "overview"):
                break
        assert app.load_error is None, app.load_error
        assert app.analysis is not None, "the analysis never loaded"
        await pilot.pause()
        text = html.unescape(app.export_screenshot()).replace("\xa0", " ")
        print("SCREEN", type(app.screen).__name__, [r.rank for r in app.analysis.ranks])
        print("OF", "2 of 2 ranks" in text, "gloo" in text)

asyncio.run(main())
"""


def _index_reachable(pip: list[str], env: dict[str, str], where: Path) -> str | None:
    """None if pip can fetch from the package index, else why not."""
    res = subprocess.run([*pip, "download", "--no-deps", "--dest", str(where), "msgspec>=0.18"],
                         env=env, capture_output=True, text=True, timeout=300)
    return None if res.returncode == 0 else (res.stderr.strip().splitlines() or ["pip failed"])[-1]


@pytest.mark.slow
def test_wheel_installs_and_analyses_without_torch(built: tuple[Path, str], tmp_path: Path) -> None:
    wheel, _ = built
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_ = venv / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PARDIAG_"))}
    env.update(PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1", VIRTUAL_ENV=str(venv))
    pip = [str(bin_ / "python"), "-m", "pip", "--disable-pip-version-check"]
    why = _index_reachable(pip, env, tmp_path / "probe")
    if why:
        pytest.skip(f"pip cannot reach the package index: {why}")
    res = subprocess.run([*pip, "install", "-q", str(wheel)], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)

    python, pardiag = str(bin_ / "python"), str(bin_ / "pardiag")
    no_torch = run(python, "-c", "import torch")
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    assert run(python, "-c", "import hta").returncode != 0  # HTA is an extra

    res = run(pardiag, "--version")
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
    assert res.returncode == 0 and res.stdout.strip() == f"pardiag {version}", res.stderr

    res = run(pardiag, "analyze", str(TRACES), "-j", "1")
    assert res.returncode == 0, res.stderr
    assert "world size 2" in res.stdout and "backend gloo" in res.stdout and "all_reduce" in res.stdout
    res = run(pardiag, "analyze", str(TRACES), "-j", "1", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["run"]["world_size"] == 2
    assert all(r["steps_profiled"] > 0 and r["window_us"] > 0 for r in doc["ranks"])

    res = run(pardiag, "report", str(TRACES), "-j", "1", "-o", str(tmp_path / "report.html"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "report.html").stat().st_size > 100_000
    res = run(pardiag, "report", str(TRACES), "-j", "1", "--format", "md")
    assert res.returncode == 0 and "gloo" in res.stdout, res.stderr
    res = run(pardiag, "diff", str(TRACES), str(TRACES))
    assert res.returncode == 0, res.stderr

    res = run(python, "-c", TUI_START, str(TRACES))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "SCREEN OverviewScreen [0, 1]" in res.stdout and "OF True True" in res.stdout, res.stdout[-2000:]

    res = run(pardiag, "analyze", str(TRACES), "--hta")
    assert res.returncode == 2 and "pip install 'pardiag[hta]'" in res.stderr and res.stderr.count("\n") == 1

    res = run(pardiag, "run", "--out", str(tmp_path / "run"), "--", python, "-c", "print('started')")
    assert res.returncode == 2 and "has no torch" in res.stderr and "started" not in res.stdout
    assert not (tmp_path / "run").exists()

    assert run(python, "-c", "import torch").returncode != 0  # nothing above installed it


def test_every_module_of_the_package_imports() -> None:
    """Every module under pardiag.* imports as a module (the scenario scripts too, which
    also run as files), in a process of its own so nothing here is disturbed."""
    pytest.importorskip("torch")
    code = (
        "import importlib, pkgutil, pardiag\n"
        "bad = []\n"
        "for m in pkgutil.walk_packages(pardiag.__path__, 'pardiag.'):\n"
        "    if m.name.endswith(('__main__', 'sitecustomize')): continue\n"
        "    try: importlib.import_module(m.name)\n"
        "    except BaseException as e: bad.append(f'{m.name}: {e!r}')\n"
        "print('\\n'.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "", res.stdout + res.stderr
