"""The TUI app: thin. It holds the Analysis (or loads it in a worker thread), maps the
number keys to the screens, and opens ranks and findings; the screens draw."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import ClassVar, Sequence

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from pardiag.analysis import Analysis
from pardiag.errors import UserError
from pardiag.tui.loader import Loader, Progress, path_loader
from pardiag.tui.messages import AnalysisLoaded, LoadFailed, LoadProgress, Navigate, OpenFinding, OpenRank
from pardiag.tui.screen_table import BY_MODE, SCREENS, screen_bindings
from pardiag.tui.screens.finding import FindingScreen
from pardiag.tui.screens.help import HelpScreen
from pardiag.tui.screens.loading import LoadingScreen
from pardiag.tui.screens.rank import RankScreen


class PardiagApp(App[None]):
    TITLE = "pardiag"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        *screen_bindings(),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, analysis: Analysis | None = None, *, loader: Loader | None = None, source: str = "") -> None:
        if (analysis is None) == (loader is None):
            raise ValueError("give an analysis or a loader")
        super().__init__()
        self.analysis = analysis
        self.loader = loader
        self.load_error: str | None = None
        self.source = source or (str(analysis.run.path or "") if analysis else "")

    def on_mount(self) -> None:
        if self.analysis is not None:
            self._install(self.analysis)
        else:
            self.add_mode("loading", lambda: LoadingScreen(self.source))
            self.switch_mode("loading")
            self._load()

    def _install(self, a: Analysis) -> None:
        for row in SCREENS:
            self.add_mode(row.mode, partial(row.screen, a))
        self.switch_mode(SCREENS[0].mode)

    # -- loading in a worker thread ---------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        assert self.loader is not None

        def progress(done: int, total: int) -> None:
            self.post_message(LoadProgress(done, total))

        try:
            a = self.loader(progress)
        except UserError as e:
            self.post_message(LoadFailed(str(e)))
        except Exception as e:  # shown on the loading screen: the TUI must not die with a traceback
            self.post_message(LoadFailed(f"analysis failed: {type(e).__name__}: {e}"))
        else:
            self.post_message(AnalysisLoaded(a))

    def _loading_screen(self) -> LoadingScreen | None:
        stack = self._screen_stacks.get("loading") or []
        return stack[0] if stack and isinstance(stack[0], LoadingScreen) else None

    def on_load_progress(self, message: LoadProgress) -> None:
        if (screen := self._loading_screen()) is not None:
            screen.progress(message.done, message.total)

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.error
        if (screen := self._loading_screen()) is not None:
            screen.fail(message.error)

    def on_analysis_loaded(self, message: AnalysisLoaded) -> None:
        self.analysis = message.analysis
        help_open = isinstance(self.screen, HelpScreen)
        self._install(message.analysis)
        if help_open:
            self.push_screen(HelpScreen())

    # -- navigation -------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "show":
            return self.analysis is not None and self.current_mode != "loading"
        return True

    def action_show(self, name: str) -> None:
        if name in BY_MODE and self.analysis is not None:
            if isinstance(self.screen, HelpScreen):
                self.screen.dismiss()
            self.switch_mode(name)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen())

    def on_navigate(self, message: Navigate) -> None:
        self.action_show(message.screen)

    def on_open_rank(self, message: OpenRank) -> None:
        if self.analysis is not None and any(r.rank == message.rank for r in self.analysis.ranks):
            if self.current_mode != "overview":
                self.switch_mode("overview")
            while isinstance(self.screen, RankScreen):
                self.pop_screen()
            self.push_screen(RankScreen(self.analysis, message.rank))

    def on_open_finding(self, message: OpenFinding) -> None:
        if self.analysis is not None:
            while isinstance(self.screen, FindingScreen):
                self.pop_screen()
            self.push_screen(FindingScreen(self.analysis, message.index))


def make_app(source: Analysis | Loader | Path | str, nccl_logs: Sequence[Path] = ()) -> PardiagApp:
    """The app for an Analysis (shown at once), a loader (`loader(progress) -> Analysis`,
    run in a worker thread), or a path (run dir, folder of traces, trace, analysis.json)."""
    if isinstance(source, Analysis):
        return PardiagApp(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        return PardiagApp(loader=path_loader(path, nccl_logs), source=str(path))
    return PardiagApp(loader=source, source=getattr(source, "__name__", "analysis"))


__all__ = ["PardiagApp", "make_app", "Loader", "Progress"]
