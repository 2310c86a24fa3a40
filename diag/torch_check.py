"""Whether the job's Python has torch, told before anything starts.

pardiag itself needs no torch; the training processes do (the profiler runs inside them).
Before anything starts, find the interpreter the command will use and ask it, cheaply,
whether it can import torch. When that cannot be told, the job starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Mapping, Sequence

from pardiag.errors import UserError

PYTHON_LAUNCHERS = ("torchrun", "deepspeed", "accelerate", "horovodrun")
# Run with `python -S`: the site setup (venv, user site, .pth files) is done by hand without
# the user's sitecustomize/usercustomize, which must run only in the job itself. Exit 3: no
# torch; any other failure (an old or broken interpreter) means "cannot tell".
TORCH_PROBE = ("import sys; sys.modules['sitecustomize'] = sys.modules['usercustomize'] = None; "
               "import site; site.main(); import importlib.util; "
               "sys.exit(3 if importlib.util.find_spec('torch') is None else 0)")
TORCH_MISSING = 3
TORCH_PROBE_TIMEOUT_S = 30.0
_SH_EXEC = re.compile(r"""'''exec' ("[^"]+"|'[^']+'|\S+)""")  # pip's launcher for long interpreter paths


def _is_python(name: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", os.path.basename(name)) is not None


def _shebang_python(script: str, path: str | None) -> str | None:
    """The Python a script's `#!` line runs: `#!/venv/bin/python`, `#!/usr/bin/env python3`,
    or `#!/bin/sh` followed by pip's `'''exec' /a/long/path/python "$0" "$@"`."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head.decode("utf-8", "replace").splitlines()
    words = lines[0][2:].split()
    if not words:
        return None
    prog, rest = words[0], words[1:]
    if os.path.basename(prog) == "env":
        rest = [w for w in rest if not w.startswith("-") and "=" not in w]
        return shutil.which(rest[0], path=path) if rest and _is_python(rest[0]) else None
    if _is_python(prog):
        return prog
    if os.path.basename(prog) in ("sh", "bash") and len(lines) > 1:
        m = _SH_EXEC.match(lines[1])
        exe = m.group(1).strip("'\"") if m else ""
        if _is_python(exe):
            return exe
    return None


def job_python(cmd: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The interpreter the command's training processes will run, or None if it cannot be
    told: the first `python*` of the command (also after srun, mpirun, ...), the Python in
    the `#!` line of torchrun/deepspeed/accelerate/horovodrun, or of the command itself
    (an executable script, a console script)."""
    path = environ.get("PATH")
    for i, arg in enumerate(cmd):
        if _is_python(arg):
            return shutil.which(arg, path=path)
        launcher = os.path.basename(arg) in PYTHON_LAUNCHERS
        if launcher or i == 0:
            exe = shutil.which(arg, path=path)
            found = _shebang_python(exe, path) if exe else None
            if found or launcher:
                return found
    return None


def check_job_torch(cmd: Sequence[str], environ: Mapping[str, str]) -> None:
    """Refuse to start a job whose Python cannot import torch (UserError: exit 2)."""
    python = job_python(cmd, environ)
    if python is None:
        return
    try:
        probe = subprocess.run([python, "-S", "-c", TORCH_PROBE], env=dict(environ), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=TORCH_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return
    if probe.returncode == TORCH_MISSING:
        raise UserError(
            f"{python}, the Python this command runs, has no torch: pardiag profiles inside the training "
            "processes, so install torch there or run the command with the Python that has it "
            "(--no-torch-check starts it anyway)"
        )
