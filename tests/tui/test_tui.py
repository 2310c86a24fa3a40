"""The TUI driven through Textual's pilot: every screen, sort, filter, a rank opened, a
finding opened and its change copied; on real runs' Analyses (a CPU run, the GPU
fixtures with NCCL logs and a hang), an empty Analysis, and a 512-rank one loaded in a
worker while the app keeps answering keys."""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
from pathlib import Path

import pytest
from textual.widgets import ProgressBar

from pardiag import analysis as model
from pardiag.analysis import Analysis, Notice
from pardiag.errors import UserError
from pardiag.tui.app import make_app
from pardiag.tui.screens.collectives import CollectivesScreen
from pardiag.tui.screens.finding import FindingScreen, change_text
from pardiag.tui.screens.findings import FindingsScreen
from pardiag.tui.screens.help import HelpScreen
from pardiag.tui.screens.loading import LoadingScreen
from pardiag.tui.screens.nccl import NcclScreen
from pardiag.tui.screens.overview import OverviewScreen
from pardiag.tui.screens.rank import RankScreen
from pardiag.tui.screens.timeline import TimelineScreen
from pardiag.tui.widgets.heatmap import WaitHeatmap
from pardiag.tui.widgets.lanes import Lanes
from pardiag.tui.widgets.section import Section
from pardiag.tui.widgets.table import SortableTable
from factories import empty_run, estimated, gpu_telemetry, nccl_hang, nccl_summary, screen_text, settle, telemetry_summary
from factories import slow_rank_job as synthetic

DATA = Path(__file__).resolve().parents[1] / "data"
SHARED = Path(__file__).resolve().parents[3] / "shared"
FIXTURES = SHARED / "fixtures"
NCCL_LOGS = SHARED / "reference" / "nccl" / "logs"
pytestmark = pytest.mark.anyio
SCREENS = {"1": OverviewScreen, "2": CollectivesScreen, "3": TimelineScreen, "4": NcclScreen, "5": FindingsScreen}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def demo() -> Analysis:
    """`pardiag demo` (2 ranks, gloo on CPU, a mixed-precision finding)."""
    return model.load(DATA / "tui-demo.analysis.json")


def straggler() -> Analysis:
    """examples/scenarios/slow_rank.py on 2 ranks: rank 1 is 40 ms per step slower."""
    return model.load(DATA / "tui-straggler.analysis.json")


@functools.cache
def gpu_fixture(name: str, log: str | None = None) -> Analysis:
    folder = FIXTURES / "gpu-traces" / name
    if not folder.is_dir():
        pytest.skip(f"GPU trace fixture {folder.name} not present")
    logs = []
    if log is not None:
        found = sorted(NCCL_LOGS.glob(f"{log}-*.log"))
        if not found:
            pytest.skip(f"NCCL log {log}-* not present")
        logs = found[:1]
    from pardiag.analyzers.pipeline import analyze_path

    return analyze_path(folder, jobs=1, nccl_logs=logs)


empty = functools.partial(empty_run, world=2, notice=Notice("error", "no rank produced a trace"))


# -- every screen, on every kind of run ---------------------------------------------------------


ANALYSES = {  # the other runs are driven through every screen by the tests below
    "cpu-straggler": straggler,
    "gpu-128rank-sampled": lambda: gpu_fixture("sampled-128rank-job"),
    "empty": empty,
}


@pytest.mark.parametrize("name", list(ANALYSES))
async def test_every_screen_opens_and_help_and_quit(name: str) -> None:
    a = ANALYSES[name]()
    app = make_app(a)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, OverviewScreen)
        for key, cls in [*SCREENS.items(), ("1", OverviewScreen)]:
            await pilot.press(key)
            await settle(pilot)
            assert isinstance(app.screen, cls), key
            text = screen_text(app)
            assert "1 Overview" in text and "5 Findings" in text  # the screen bar
            assert "quit" in text and "help" in text  # the footer
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert "zoom in / out" in screen_text(app)
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("q")
        await settle(pilot)
    assert app.return_code == 0


async def test_missing_data_is_said() -> None:
    async with make_app(empty()).run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "No rank produced data" in screen_text(pilot.app)
        assert "no rank produced a trace" in screen_text(pilot.app)
        for key, says in (("2", "no collectives in the profiled window"), ("3", "nothing to draw"),
                          ("4", "no NCCL logs"), ("5", "no findings")):
            await pilot.press(key)
            await settle(pilot)
            assert says in screen_text(pilot.app), key
        await pilot.press("5")
        await settle(pilot)
        assert "error: no rank produced a trace" in screen_text(pilot.app)  # notices listed


async def test_hang_diagnosis_comes_first_on_comm_setup() -> None:
    a = gpu_fixture("a100-2rank-rank0", "17")
    assert a.nccl is not None and a.nccl.hang is not None
    async with make_app(a).run_test(size=(100, 40)) as pilot:
        await pilot.press("4")
        await settle(pilot)
        text = screen_text(pilot.app)
        assert text.index("HANG") < text.index("NCCL communication setup")
        assert "ALLREDUCE" in text and "where each rank stopped" in text
        assert "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in text


async def test_pardiags_own_hang_verdict_shows_without_nccl_logs() -> None:
    # a gloo hang: the verdict from the ranks' exits (and flight recorder), no NCCL block
    from dataclasses import replace

    h = replace(nccl_hang("rank 1 never entered all_reduce #4 of group 0; rank 0 waited"), source="pardiag")
    a = replace(gpu_fixture("a100-2rank-rank0", "08"), nccl=None, hang=h)
    async with make_app(a).run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "HANG rank 1 never entered all_reduce #4" in screen_text(pilot.app)  # the overview
        await pilot.press("4")
        await settle(pilot)
        text = screen_text(pilot.app)
        assert "rank 1 never entered all_reduce #4" in text and "where each rank stopped" in text


async def test_nccl_hosts_and_env_problems() -> None:
    a = gpu_fixture("a100-2rank-rank0", "08")
    async with make_app(a).run_test(size=(160, 40)) as pilot:
        await pilot.press("4")
        await settle(pilot)
        text = screen_text(pilot.app)
        assert "gpt-dev-ppt" in text and "2.19.3" in text and "SHM/direct/direct" in text
        assert "P2P disabled by NCCL_P2P_LEVEL=LOC" in text and "unset NCCL_P2P_LEVEL" in text


# -- overview: sort, filter, open a rank ------------------------------------------------------------


async def test_overview_sorts_filters_and_opens_a_rank() -> None:
    async with make_app(straggler()).run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        table = pilot.app.screen.query_one("#ranks", SortableTable)
        assert [r.rank for r in table.items] == [0, 1] and table.row_count == 2
        assert "▲" in screen_text(pilot.app) and "straggler: rank 1" in screen_text(pilot.app)
        await pilot.press("s")  # rank -> step p50, largest first
        await settle(pilot)
        assert table.columns_spec[table.sort_column].label == "step p50"
        assert [table.items[i].rank for i in table.shown] == [0, 1]  # rank 0 waits for rank 1: the longer steps
        assert "sorted by step p50 ▼" in screen_text(pilot.app)
        await pilot.press("S")
        await settle(pilot)
        assert [table.items[i].rank for i in table.shown] == [1, 0]
        await pilot.press("slash", *"straggler")
        await settle(pilot)
        assert table.row_count == 1 and table.current_item().rank == 1
        assert "1 of 2 ranks" in screen_text(pilot.app)
        await pilot.press("enter")  # keeps the filter, back in the table
        await settle(pilot)
        assert pilot.app.screen.focused is table
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(pilot.app.screen, RankScreen) and pilot.app.screen.rank.rank == 1
        titles = [s.title for s in pilot.app.screen.query(Section)]
        assert titles == ["rank 1  ▲ straggler", "where the profiled time went", "phases per step",
                          "host phases (all steps)", "collectives", "GPU timeline", "operators", "telemetry"]
        await pilot.press("end")
        await settle(pilot)
        assert "no telemetry" in screen_text(pilot.app)
        await pilot.press("n")
        await settle(pilot)
        assert isinstance(pilot.app.screen, RankScreen) and pilot.app.screen.rank.rank == 0
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(pilot.app.screen, OverviewScreen)
        await pilot.press("slash", "escape")  # esc clears the filter
        await settle(pilot)
        assert table.row_count == 2


async def test_mouse_switches_screens_and_sorts_by_header() -> None:
    async with make_app(demo()).run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.click("#nav-findings")
        await settle(pilot)
        assert isinstance(pilot.app.screen, FindingsScreen)
        await pilot.click("#nav-overview")
        await settle(pilot)
        table = pilot.app.screen.query_one("#ranks", SortableTable)
        await pilot.click("#ranks", offset=(12, 0))  # the "step p50" header
        await settle(pilot)
        assert table.columns_spec[table.sort_column].label == "step p50"


async def test_rank_telemetry_as_sparklines() -> None:
    """Whatever numeric series the telemetry block holds for the rank's GPU are drawn."""
    a = synthetic(4, slow=1)
    util = [0.2, 0.9, 0.95, 0.3, 0.97, 0.99, 0.1, 0.92]
    telemetry = telemetry_summary([gpu_telemetry(1, host="node000", ranks=[1], name="NVIDIA H100", util_gpu_ratio_mean=0.65,
                                                 sm_clock_mean_mhz=1410.0, power_mean_w=512.0,
                                                 series={"util_gpu_ratio": util, "power_w": [300.0, 650.0, 640.0, 320.0]})])
    a = dataclasses.replace(a, telemetry=telemetry)
    async with make_app(a).run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.press("down", "enter")
        await settle(pilot)
        assert isinstance(pilot.app.screen, RankScreen) and pilot.app.screen.rank.rank == 1
        text = screen_text(pilot.app)
        assert "NVIDIA H100" in text and "65%" in text
        assert "series.util_gpu_ratio" in text and "▁█" in text and "series.power_w" in text
        await pilot.press("n")
        await settle(pilot)
        assert "no telemetry" in screen_text(pilot.app)  # rank 2: no GPU record


# -- collectives and timeline -----------------------------------------------------------------------


async def test_collectives_table_drives_the_heatmap() -> None:
    a = gpu_fixture("sampled-128rank-job")
    async with make_app(a).run_test(size=(100, 30)) as pilot:
        await pilot.press("2")
        await settle(pilot)
        screen = pilot.app.screen
        heat = screen.query_one(WaitHeatmap)
        assert heat.ranks == [0, 1] and [c.title for c in heat.columns] == ["#1", "#2", "#3"]
        # all_reduce, matched where both ranks' calls have the same size: step 551's 78 MB
        # (11727 - 8370 us) and step 552's 22.9 MB (36158 - 13838 us); step 551's second
        # (108 MB on rank 0, 105 MB on rank 1) is not one collective: rank 0 waited 25.7 ms
        assert heat.columns[2].values == {0: 25677.0, 1: 0.0}
        assert "25.7" in screen_text(pilot.app)
        await pilot.press("slash", *"all_reduce", "enter")
        await settle(pilot)
        assert [c.title for c in heat.columns] == ["#3"]
        await pilot.press("slash", "escape", "s", "s", "s", "s", "s", "s")  # -> wait ms, largest first
        await settle(pilot)
        table = screen.query_one("#collectives", SortableTable)
        assert table.columns_spec[table.sort_column].label == "wait ms"
        assert [c.title for c in heat.columns] == ["#1", "#3", "#2"]


async def test_timeline_zooms_and_scrolls() -> None:
    async with make_app(straggler()).run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await settle(pilot)
        lanes = pilot.app.screen.query_one(Lanes)
        assert "share of a profiled step" in screen_text(pilot.app)
        assert lanes.zoom == 1.0 and lanes.offset_us == 0.0
        await pilot.press("plus", "plus")
        await settle(pilot)
        assert lanes.zoom == pytest.approx(2.25)
        before = lanes.offset_us
        await pilot.press("right")
        assert lanes.offset_us > before
        await pilot.press("left", "left", "left", "left")
        assert lanes.offset_us == 0.0
        await pilot.press("minus", "minus", "minus")
        assert lanes.zoom == 1.0
        await pilot.press("s")  # order lanes by profiled step, longest first
        assert lanes.lanes[0].rank == 0
        await pilot.press("slash", *"rank 1", "enter")
        await settle(pilot)
        assert [r.rank for r in lanes.lanes] == [1]


# -- findings: open one, copy its change ------------------------------------------------------------


async def test_finding_opens_and_copies_its_change() -> None:
    a = model.load(DATA / "tui-gpu-nccl.analysis.json")
    async with make_app(a).run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.press("5")
        await settle(pilot)
        assert "if all were applied" in screen_text(pilot.app)
        await pilot.press("down", "enter")
        await settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, FindingScreen)
        text = screen_text(pilot.app)
        assert "P2P disabled by NCCL_P2P_LEVEL=LOC" in text and "evidence" in text and "unset NCCL_P2P_LEVEL" in text
        await pilot.press("c")
        await settle(pilot)
        assert pilot.app.clipboard == "unset NCCL_P2P_LEVEL" == change_text(screen.finding)
        assert "copied the change" in screen_text(pilot.app)  # the toast
        await pilot.press("p")  # the first finding: code, saving, assumption
        await settle(pilot)
        text = screen_text(pilot.app)
        assert "estimated saving: 38%" in text and "assumption: half of the idle time" in text
        await pilot.press("c")
        assert pilot.app.clipboard.startswith("model = torch.compile(model)")
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(pilot.app.screen, FindingsScreen)
        await pilot.press("up", "c")  # copy from the list too: the highlighted finding's change
        assert pilot.app.clipboard.startswith("model = torch.compile(model)")


# -- loading: progress, no freeze, a large run ------------------------------------------------------


async def test_large_run_loads_in_a_worker_and_keys_work_meanwhile() -> None:
    n = 512
    halfway = threading.Event()
    release = threading.Event()

    def loader(progress) -> Analysis:
        for done in range(0, n // 2 + 1, 32):
            progress(done, n)
        halfway.set()
        assert release.wait(timeout=30), "the test never let the loader finish"
        progress(n, n)
        return synthetic(n)

    app = make_app(loader)
    async with app.run_test(size=(80, 24)) as pilot:
        while not halfway.is_set():
            await pilot.pause(0.05)
        await settle(pilot)
        assert isinstance(app.screen, LoadingScreen)
        bar = app.screen.query_one(ProgressBar)
        assert (bar.total, bar.progress) == (n, n // 2)
        assert "256/512 traces" in screen_text(app)
        await pilot.press("question_mark")  # handled while the worker is busy
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert [w.is_running for w in app.workers] == [True]
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(app.screen, LoadingScreen)
        release.set()
        await app.workers.wait_for_complete()
        await settle(pilot)
        assert isinstance(app.screen, OverviewScreen)
        table = app.screen.query_one("#ranks", SortableTable)
        assert table.row_count == n
        started = time.monotonic()
        await pilot.press("s", "slash", *"node001", "enter")
        await settle(pilot)
        assert table.row_count == 8 and time.monotonic() - started < 5
        await pilot.press("slash", "escape", "slash", *"straggler", "enter", "enter")
        await settle(pilot)
        assert isinstance(app.screen, RankScreen) and app.screen.rank.rank == 300
        await pilot.press("3")
        await settle(pilot)
        assert len(app.screen.query_one(Lanes).lanes) == n
        await pilot.press("2", "tab")
        await settle(pilot)
        heat = app.screen.query_one(WaitHeatmap)
        assert len(heat.ranks) == n and len(heat.columns) == 4
        assert heat.virtual_size.height == n + 1


async def test_a_failing_loader_is_shown_not_raised() -> None:
    def loader(progress) -> Analysis:
        raise UserError("traces/: no traces found")

    app = make_app(loader)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.workers.wait_for_complete()
        await settle(pilot)
        assert isinstance(app.screen, LoadingScreen)
        assert "traces/: no traces found" in screen_text(app)
        await pilot.press("1")  # screens need an analysis: nothing happens
        assert isinstance(app.screen, LoadingScreen)
        await pilot.press("q")
    assert app.load_error == "traces/: no traces found"  # `pardiag tui` says it again and exits 2


async def test_a_path_is_loaded_in_the_worker() -> None:
    folder = FIXTURES / "gpu-traces" / "sampled-128rank-job"
    if not folder.is_dir():
        pytest.skip("GPU trace fixture not present")
    app = make_app(folder)
    async with app.run_test(size=(100, 40)) as pilot:  # room for the finding and the notices below it
        await app.workers.wait_for_complete()
        await settle(pilot)
        assert isinstance(app.screen, OverviewScreen)
        assert app.analysis is not None and app.analysis.run.world_size == 128
        assert "4 notices" in screen_text(app)  # unnamed groups: bus bandwidth, sizes and types differ; ranks missing
        await pilot.press("5")
        await settle(pilot)
        assert "no data from rank(s) 2-127 of 128" in screen_text(app)


# -- the command ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, says", [("no/such/dir", "no such file or directory"),
                                        ("README.md", "not a run directory, a trace")])
def test_bad_path_is_one_line(path: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pardiag.cli import main

    repo = Path(__file__).resolve().parents[2]
    assert main(["tui", str(repo / path)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and err.startswith("pardiag: error:")


def test_empty_folder_and_foreign_json_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pardiag.cli import main

    assert main(["tui", str(tmp_path)]) == 2
    assert "no pardiag run and no trace files" in capsys.readouterr().err
    (tmp_path / "analysis.json").write_text('{"schema": "something else"}')
    assert main(["tui", str(tmp_path / "analysis.json")]) == 2
    assert "not a pardiag analysis" in capsys.readouterr().err


def test_textual_stays_out_of_the_analyzers() -> None:
    import subprocess

    code = "import pardiag.analyzers.pipeline, pardiag.commands.tui, sys; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


async def test_untrusted_strings_are_shown_as_text() -> None:
    """Op names, hosts, findings and notices come from traces, logs and argv: Textual/rich
    markup in them is shown literally and never breaks a screen."""
    evil = "[bold red]x[/][link=https://e.example]y[/link][/]"
    a = synthetic(16, slow=3)
    a = dataclasses.replace(
        a,
        run=dataclasses.replace(a.run, command=["python", evil], hosts=[evil]),
        ranks=[dataclasses.replace(r, host=evil) for r in a.ranks],
        collectives=[dataclasses.replace(c, op=evil, process_group=evil) for c in a.collectives],
        findings=[dataclasses.replace(f, title=evil, evidence=[evil], action={"code": evil}) for f in a.findings],
        notices=[Notice("error", evil)],
        nccl=nccl_summary([{"host": evil, "versions": [evil]}], errors=[evil], hang=nccl_hang(summary=evil)),
    )
    app = make_app(a)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        for key in [*SCREENS, "1"]:
            await pilot.press(key)
            await settle(pilot)
        await pilot.press("enter")  # a rank's detail
        await settle(pilot)
        assert isinstance(app.screen, RankScreen)
        await pilot.press("escape", "5", "enter")
        await settle(pilot)
        assert "[bold red]x[/]" in screen_text(app)
        await pilot.press("q")
        await settle(pilot)


# -- where an estimate comes from, the critical path ------------------------------------------------


async def test_estimate_basis_and_critical_path_are_shown() -> None:
    a = estimated()
    async with make_app(a).run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        text = screen_text(pilot.app)
        assert ("critical path: step 8 (96.0 ms, ending on rank 0): most on rank 1 58.2 ms (61%) · "
                "forward 38.4 ms (40%) · all_reduce 19.2 ms (20%)") in text
        await pilot.press("5")
        await settle(pilot)
        text = " ".join(screen_text(pilot.app).split())
        assert "215.0 → 176.3 ms (-18%)" in text and "one replay with every finding's edits" in text
        await pilot.press("enter")  # the first finding: replayed
        await settle(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, FindingScreen) and screen.finding.lever == "straggler"
        assert screen.query("#estimate")
        text = screen_text(pilot.app)
        assert "replayed: -12% (replay within 3.1% of the measured step)" in text
        assert "share-based estimate: -10%" in text
        assert "bf16 GEMM speed-up 2.3x (measured: bf16 vs fp32 GEMMs on rank 0)" in text
        assert "overlap of the last bucket 0.5 (assumed)" in text
        assert "rank 1's operations set to its peers' median" in text
        await pilot.press("n")  # the second: share-based, the replay refused
        await settle(pilot)
        text = " ".join(screen_text(pilot.app).split())
        assert "share-based: -8% (replay refused: the replay is 14.2% off the measured step" in text
        assert "replayed" not in text


async def test_an_analysis_without_them_shows_nothing_new() -> None:
    """Older analyses: no critical path line, no estimate section, the what-if as before."""
    async with make_app(straggler()).run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        assert "critical path" not in screen_text(pilot.app)
        await pilot.press("5")
        await settle(pilot)
        assert "replay" not in screen_text(pilot.app) and "share-based" not in screen_text(pilot.app)
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(pilot.app.screen, FindingScreen)
        text = screen_text(pilot.app)
        assert "evidence" in text and "replay" not in text and not pilot.app.screen.query("#estimate")
