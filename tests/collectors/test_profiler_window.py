"""The profiler window's CUPTI teardown: TEARDOWN_CUPTI=1 while a CUDA window stops, and
only when nobody set it and CUDA is new enough; the job's environment as it was after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pardiag.collectors import profiler as profiler_module
from pardiag.collectors.config import CollectorConfig
from pardiag.collectors.profiler import ProfilerWindow, cupti_teardown_plan


@pytest.mark.parametrize("use_cuda, environ, cuda, expected", [
    (False, {}, "13.0", False),
    (True, {}, "13.0", True),
    (True, {}, "12.6", True),
    (True, {}, "12.4", False),
    (True, {}, "11.8", False),
    (True, {}, None, False),  # a CPU build's torch.version.cuda
    (True, {"TEARDOWN_CUPTI": "0"}, "13.0", False),  # PyTorch's own value for CUDA graphs
    (True, {"TEARDOWN_CUPTI": "1"}, "13.0", False),  # the user's: left to them
])
def test_when_the_window_sets_teardown(use_cuda: bool, environ: dict[str, str], cuda: str | None,
                                       expected: bool) -> None:
    plan, why = cupti_teardown_plan(use_cuda, environ, "None" if cuda is None else cuda)
    assert plan is expected and why


class _Recording(ProfilerWindow):
    """Notes TEARDOWN_CUPTI as the trace is handed over, right after the profiler stopped."""

    seen: list[str | None]

    def _ready(self, prof: Any) -> None:
        import os

        self.seen.append(os.environ.get("TEARDOWN_CUPTI"))
        super()._ready(prof)


def _drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: bool) -> tuple[_Recording, list[str | None]]:
    monkeypatch.setattr(profiler_module, "cupti_teardown_plan", lambda use_cuda: (plan, "as planned"))
    cfg = CollectorConfig()
    w = _Recording(cfg, tmp_path / "trace.json", tmp_path / "trace.partial.json", False, lambda where, e: None)
    w.seen = []
    x = torch.randn(8, 8)
    for step in range(1, cfg.schedule.wait + cfg.schedule.warmup + cfg.schedule.active + 3):
        torch.mm(x, x)
        w.on_boundary(step)
    return w, w.seen


def test_teardown_is_set_for_the_stop_and_removed_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    w, seen = _drive(tmp_path, monkeypatch, plan=True)
    assert seen == ["1"]  # set while the trace stopped
    assert w.state == "done" and w.status()["status"] == "ok"
    import os

    assert "TEARDOWN_CUPTI" not in os.environ  # the job's environment as it had it
    assert w.status()["cupti_teardown"] == "as planned"


def test_a_value_already_there_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    _, seen = _drive(tmp_path, monkeypatch, plan=False)
    import os

    assert seen == ["0"] and os.environ["TEARDOWN_CUPTI"] == "0"
