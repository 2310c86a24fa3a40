"""First pardiag code to run in a process started under `pardiag run`.

Imported from sitecustomize, so it stays tiny and imports nothing heavy. It decides
whether this process is a training worker (not a launcher such as the torchrun
agent) and, if so, arranges for the collector to be installed right after the
process imports torch. Nothing is written until the process takes a training step,
so helper processes that import torch (DataLoader workers, compile workers) leave
no trace.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Callable

ENV_RUN_DIR = "PARDIAG_RUN_DIR"
ENV_CONFIG = "PARDIAG_CONFIG"

# Python entry points of launchers: the process that starts workers is not one.
LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "torch.distributed.elastic",
    "deepspeed.launcher",
    "accelerate.commands",
    "horovod.runner",
    "pardiag",
)
LAUNCHER_SCRIPTS = ("torchrun", "deepspeed", "accelerate", "horovodrun", "pardiag")


def entry_point(argv: list[str]) -> tuple[str, str]:
    """('module', name) for `python -m name`, ('script', basename) for `python file`,
    ('code', '') for `python -c`, ('', '') when unknown."""
    args = argv[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            return "module", args[i + 1]
        if a.startswith("-m") and len(a) > 2:
            return "module", a[2:]
        if a == "-c" or a.startswith("-c"):
            return "code", ""
        if a in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return "script", os.path.basename(a)
    return "", ""


def is_launcher(argv: list[str]) -> bool:
    kind, name = entry_point(argv)
    if kind == "module":
        return any(name == m or name.startswith(m + ".") for m in LAUNCHER_MODULES)
    if kind == "script":
        stem = name[:-3] if name.endswith(".py") else name
        return stem in LAUNCHER_SCRIPTS
    return False


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Calls `hook(module)` once `name` has finished importing."""

    def __init__(self, name: str, hook: Callable[[Any], None]) -> None:
        self.name = name
        self.hook = hook

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        _remove_finder(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ChainedLoader(spec.loader, self.hook)
        return spec


class _ChainedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[Any], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Leave no trace of the wrapper on the module: tools that look at
        # module.__loader__ / __spec__.loader see the real loader.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except BaseException:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _remove_finder(finder: Any) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def _on_torch(module: Any) -> None:
    from pardiag.collectors import runtime

    runtime.install()


def activate() -> None:
    if not os.environ.get(ENV_RUN_DIR):
        return
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv)
    if is_launcher(argv):
        return
    if "torch" in sys.modules:
        _on_torch(sys.modules["torch"])
        return
    sys.meta_path.insert(0, _PostImportFinder("torch", _on_torch))
