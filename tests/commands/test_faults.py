"""Faults during `pardiag run`: the job's exit code is kept, what was collected is kept,
the manifest says what happened, and nothing breaks the training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SCRIPTS, pardiag_cmd, read_json, read_steps, run_pardiag, torchrun

pytestmark = pytest.mark.slow


def wait_for_steps(path: Path, n: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} never reached {n} steps")


def test_rank_killed_with_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "kill"
    proc = subprocess.Popen(
        pardiag_cmd("run", "-q", "--no-report", "--out", str(out), "--profile-steps", "1,1,1", "--",
                    *torchrun(2, SCRIPTS / "tiny_ddp.py", "--steps", "100000", "--sleep-ms", "20")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_steps(out / "ranks/1/steps.jsonl", 5)
    pid = read_json(out / "ranks/1/meta.json")["pid"]
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0  # torchrun reports the failure; pardiag passes its code on
    m = read_json(out / "manifest.json")
    assert m["exit_code"] == proc.returncode and m["complete"] is True
    failed = {f["rank"]: f for f in m["failed_ranks"]}
    assert "no clean exit" in failed[1]["reason"]
    assert len(read_steps(out / "ranks/1/steps.jsonl")) >= 5  # nothing lost
    assert (out / "ranks/1/trace.json.gz").exists()  # its window (steps 2) was complete


def test_launcher_interrupted_twice(tmp_path: Path) -> None:
    out = tmp_path / "twice"
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, sys, time, torch\n"
        "hits = []\n"
        "signal.signal(signal.SIGINT, lambda *a: hits.append(1))  # ignores the first interrupts\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "while len(hits) < 2:\n"
        "    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad(); time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.Popen(pardiag_cmd("run", "-q", "--no-report", "--out", str(out), "--", sys.executable, str(script)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_steps(out / "ranks/0/steps.jsonl", 3)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 3  # the job decided how to end, and its code came back
    m = read_json(out / "manifest.json")
    assert m["launchers"][0]["signals_received"] == ["SIGINT", "SIGINT"]
    assert m["exit_code"] == 3 and len(read_steps(out / "ranks/0/steps.jsonl")) >= 3


def test_run_directory_cannot_be_created() -> None:
    res = run_pardiag("run", "--out", "/dev/null/run", "--", "true")
    assert res.returncode == 2
    assert res.stderr.strip() == "pardiag: error: cannot create the run directory /dev/null/run: Not a directory"


def test_disk_full(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        res = run_pardiag("run", "-q", "--no-report", "--out", str(small / "run"), "--profile-steps", "2,1,3", "--",
                          *torchrun(2, SCRIPTS / "tiny_ddp.py", "--steps", "30"))
        assert res.returncode == 0  # the training finished; the full disk did not break it
        assert "Traceback" not in res.stderr
        m = read_json(small / "run" / "manifest.json")
        prof = m["collectors"]["profiler"]
        assert prof["status"] == "failed" and "could not write" in prof["reason"]
        for rank in (0, 1):
            assert [s["step"] for s in read_steps(small / "run" / f"ranks/{rank}/steps.jsonl")] == list(range(30))
            assert not [p.name for p in (small / "run" / f"ranks/{rank}").iterdir() if p.name.startswith(".")]
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)
