"""Runs the wrapped command: live output copied to files, signals forwarded to its
whole process group, its exit code returned unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Mapping, Sequence

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
KILL_AFTER_INTERRUPTS = 3


@dataclass
class LaunchResult:
    exit_code: int
    started: float
    ended: float
    signals_received: list[str] = field(default_factory=list)
    killed_by_signal: str | None = None
    error: str | None = None


class _Tee(threading.Thread):
    """Copies a child's stream to our own at once, and to a log file line by line
    (each line passed through `clean`, which redacts secrets)."""

    def __init__(self, src: IO[bytes], dst: IO[bytes] | None, log: Path, clean: Callable[[str], str]):
        super().__init__(daemon=True, name=f"pardiag-tee-{log.name}")
        self.src, self.dst, self.log, self.clean = src, dst, log, clean

    def run(self) -> None:
        fd = self.src.fileno()
        pending = b""
        try:
            logf = open(self.log, "ab")
        except OSError:
            logf = None
        try:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                if self.dst is not None:
                    try:
                        self.dst.write(chunk)
                        self.dst.flush()
                    except (OSError, ValueError):
                        self.dst = None
                if logf is not None:
                    pending += chunk
                    cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
                    if cut >= 0 or len(pending) > 1 << 16:
                        cut = cut if cut >= 0 else len(pending) - 1
                        self._write(logf, pending[: cut + 1])
                        pending = pending[cut + 1 :]
            if logf is not None and pending:
                self._write(logf, pending)
        finally:
            if logf is not None:
                try:
                    logf.close()
                except OSError:  # disk full: what was written is kept, the job goes on
                    pass

    def _write(self, logf: IO[bytes], data: bytes) -> None:
        try:
            logf.write(self.clean(data.decode("utf-8", "replace")).encode("utf-8"))
            logf.flush()
        except (OSError, ValueError):
            pass


def launch(
    cmd: Sequence[str],
    env: Mapping[str, str],
    stdout_log: Path,
    stderr_log: Path,
    clean: Callable[[str], str] = lambda s: s,
    echo: bool = True,
) -> LaunchResult:
    """Start `cmd` in its own process group and wait for it.

    Ctrl-C, SIGTERM, SIGHUP and SIGQUIT received by pardiag go to the whole group
    (the launcher and every worker). The third interrupt kills the group.
    """
    started = time.time()
    try:
        proc = subprocess.Popen(
            list(cmd),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **_new_process_group(),
        )
    except FileNotFoundError:
        return LaunchResult(127, started, time.time(), error=f"command not found: {cmd[0]}")
    except PermissionError:
        return LaunchResult(126, started, time.time(), error=f"permission denied: {cmd[0]}")
    except OSError as e:
        return LaunchResult(126, started, time.time(), error=f"cannot run {cmd[0]}: {e}")

    result = LaunchResult(0, started, started)
    tees = [
        _Tee(proc.stdout, sys.stdout.buffer if echo else None, stdout_log, clean),  # type: ignore[arg-type]
        _Tee(proc.stderr, sys.stderr.buffer if echo else None, stderr_log, clean),  # type: ignore[arg-type]
    ]
    for t in tees:
        t.start()

    def forward(signum: int, _frame: object) -> None:
        result.signals_received.append(signal.Signals(signum).name)
        sig = signum
        if len(result.signals_received) >= KILL_AFTER_INTERRUPTS:
            sig = signal.SIGKILL
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in FORWARDED_SIGNALS:
            try:
                previous[s] = signal.signal(s, forward)
            except (OSError, ValueError):
                pass
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # only if a handler could not be installed
                forward(signal.SIGINT, None)
    finally:
        for s, h in previous.items():
            try:
                signal.signal(s, h)
            except (OSError, ValueError):
                pass
    for t in tees:
        t.join(timeout=10)
    result.ended = time.time()
    if rc < 0:
        result.killed_by_signal = signal.Signals(-rc).name
        result.exit_code = 128 - rc
    else:
        result.exit_code = rc
    return result


def _new_process_group() -> dict[str, object]:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}
