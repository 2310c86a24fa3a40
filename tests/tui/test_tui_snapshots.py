"""How the TUI looks, pinned: the overview and the findings screens at 80×24 and
160×48, on fixed analyses of real runs (a CPU run with a straggler; GPU traces with an
NCCL log). Update with `pytest tests/tui/test_tui_snapshots.py --snapshot-update` after
checking the new SVGs by eye."""

from __future__ import annotations

from pathlib import Path

import pytest

from pardiag import analysis as model
from pardiag.tui.app import PardiagApp, make_app

DATA = Path(__file__).resolve().parents[1] / "data"
SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


def app(name: str) -> PardiagApp:
    return make_app(model.load(DATA / name))


@pytest.mark.parametrize("size", SIZES)
def test_overview(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(app("tui-straggler.analysis.json"), terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_findings(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(app("tui-gpu-nccl.analysis.json"), press=["5"], terminal_size=size)
