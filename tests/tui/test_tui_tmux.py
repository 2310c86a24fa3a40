"""The real `pardiag tui` in a real terminal (tmux): it starts, switches screens, shows
the help and quits on `q`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "tui-straggler.analysis.json"
TMUX = shutil.which("tmux")

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux)")


class Tmux:
    """One detached session on a private server socket."""

    def __init__(self, socket: str) -> None:
        self.base = [str(TMUX), "-L", socket]

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, check=check, timeout=10)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "tui").stdout

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        shown = ""
        while time.monotonic() < deadline:
            shown = self.screen()
            if text in shown:
                return shown
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared; the screen shows:\n{shown}")

    def alive(self) -> bool:
        return self("has-session", "-t", "tui", check=False).returncode == 0


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux(f"pardiag-tui-test-{os.getpid()}")
    yield t
    t("kill-server", check=False)


def test_real_terminal(tmux: Tmux) -> None:
    env = {"TERM": "xterm-256color", "PARDIAG_RUN_DIR": ""}
    command = f"{sys.executable} -m pardiag tui {FIXTURE}"
    tmux("new-session", "-d", "-s", "tui", "-x", "120", "-y", "40",
         *(x for k, v in env.items() for x in ("-e", f"{k}={v}")), command)
    shown = tmux.wait_for("1 Overview")
    assert "straggler: rank 1" in shown and "profiled window" in shown
    tmux("send-keys", "-t", "tui", "2")
    tmux.wait_for("waiting per rank and collective")
    tmux("send-keys", "-t", "tui", "3")
    tmux.wait_for("share of a profiled step")
    tmux("send-keys", "-t", "tui", "5")
    shown = tmux.wait_for("what to change")
    assert "straggler" in shown and "rank 1 is 40.4 ms" in shown
    tmux("send-keys", "-t", "tui", "?")
    tmux.wait_for("pardiag tui · help")
    tmux("send-keys", "-t", "tui", "Escape")
    tmux.wait_for("what to change")
    tmux("send-keys", "-t", "tui", "q")
    deadline = time.monotonic() + 10
    while tmux.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tmux.alive(), "the app did not quit on q"
