"""How the TUI looks, pinned: the overview and the findings screens at 80×24 and
160×48, on fixed analyses of real runs (a CPU run with a straggler; GPU traces with an
NCCL log); the timeline at 80×24 and 120×40 (a CPU run's step, a collective chosen); and, on the factories' analysis with each estimate's basis and the critical
path, the overview and an opened finding. Update with `pytest tests/tui/test_tui_snapshots.py --snapshot-update` after
checking the new SVGs by eye."""

from __future__ import annotations

from pathlib import Path

import pytest

from factories import estimated
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


@pytest.mark.parametrize("size", [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")])
def test_timeline(snap_compare, size: tuple[int, int]) -> None:
    """tests/data/cpu-2rank's step 8 on both ranks, its all_reduce chosen."""
    assert snap_compare(app("tui-timeline.json"), press=["3", "tab"], terminal_size=size)


def test_overview_with_the_critical_path(snap_compare) -> None:
    assert snap_compare(make_app(estimated()), terminal_size=(120, 30))


def test_finding_with_its_estimate(snap_compare) -> None:
    assert snap_compare(make_app(estimated()), press=["5", "enter"], terminal_size=(120, 36))
