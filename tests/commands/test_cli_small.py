"""Small command-line behaviours.

- `pardiag demo` checks, before anything starts, that the Python it runs the example
  with can import torch: without it, one line on stderr and exit 2.
- A closed stdout (`pardiag analyze RUN | head -1`) ends a command quietly: no
  traceback, exit 141 as for a command killed by SIGPIPE.
- `trace_head` and `rank_of` read the same head of a trace.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import pardiag_cmd

TRACES = Path(__file__).resolve().parents[1] / "data" / "cpu-2rank"  # plain torch.profiler traces, 2 ranks


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    """A copy of the traces, so that nothing is written next to the test data."""
    return Path(shutil.copytree(TRACES, tmp_path / "traces"))


def test_demo_refuses_a_python_without_torch_before_starting(tmp_path: Path, python_without_torch: Path) -> None:
    out = tmp_path / "demo"
    # the demo runs the example with pardiag's own interpreter: here, one without torch
    script = ("import sys\nfrom pardiag.cli import main\n"
              "sys.executable = sys.argv[1]\nsys.exit(main(['demo', '--out', sys.argv[2]]))\n")
    res = subprocess.run([sys.executable, "-c", script, str(python_without_torch), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    line = res.stderr.strip()
    assert line.count("\n") == 0, res.stderr
    assert line.startswith("pardiag: error: pardiag demo runs the example with ")
    assert str(python_without_torch) in line and "has no torch" in line
    assert res.stdout == ""
    assert not out.exists()  # nothing started, no run directory


def test_demo_check_passes_with_torch() -> None:
    from pardiag.commands.demo import example_script
    from pardiag.torch_check import check_job_torch

    check_job_torch([sys.executable, "-m", "torch.distributed.run", str(example_script())], {})


def _piped(args: list[str], reader: str) -> tuple[int, str, str]:
    """`pardiag ARGS | READER` through bash: (pardiag's exit status, what the reader
    printed, pardiag's stderr)."""
    line = f"{shlex.join(pardiag_cmd(*args))} 2>\"$ERR\" | {reader}; echo \"status=${{PIPESTATUS[0]}}\""
    err = Path(args[-1]).parent / "stderr.txt"
    res = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "ERR": str(err)})
    assert res.returncode == 0, res.stderr
    shown, _, status = res.stdout.rpartition("status=")
    return int(status), shown, err.read_text()


def test_analyze_into_head_ends_quietly(traces: Path) -> None:
    status, shown, err = _piped(["analyze", "-j", "1", str(traces)], "head -1")
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert shown.count("\n") == 1 and "world size 2" in shown
    assert status in (0, 141)  # 0 when the summary was all written before head exited
    # `head -n 0` exits at once: every line of the summary goes into a closed pipe
    status, shown, err = _piped(["analyze", "-j", "1", str(traces)], "head -n 0")
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert shown == "" and status == 141


def test_json_into_a_closed_pipe_ends_quietly(traces: Path) -> None:
    # `head -n 0` exits at once: the JSON is written (at once, at the end) into a closed pipe
    status, shown, err = _piped(["analyze", "-j", "1", "--json", str(traces)], "head -n 0")
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert shown == ""
    assert status == 141
    status, shown, err = _piped(["analyze", "-j", "1", "--json", str(traces)], "head -1")
    assert "Traceback" not in err, err
    assert shown.startswith("{") and status in (0, 141)


def test_trace_head_and_rank_of_read_the_same_head() -> None:
    from pardiag.analyzers.trace import rank_of, trace_head

    for f in sorted(TRACES.glob("*.json.gz")):
        head = trace_head(f)
        assert set(head) <= {"distributedInfo", "deviceProperties", "host_name"}
        assert head["distributedInfo"]["rank"] == rank_of(f)
    assert trace_head(TRACES / "no-such-trace.json.gz") == {}
