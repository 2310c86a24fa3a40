"""The HTML report in a real browser: headless Chromium, offline, no script errors,
every chart drawn, untrusted text inert. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from pardiag.analysis import Analysis
from pardiag.report_html import figures, render_html
from factories import hostile, small

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM = next((p for p in map(shutil.which, BROWSERS) if p), None)
ARTIFACTS = REPO / "test-artifacts"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install -y chromium)"
)


def chromium(page: Path, profile: Path, *action: str) -> subprocess.CompletedProcess[str]:
    """Open a local page with every network lookup failing; console messages on stderr."""
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000",
        *action, page.resolve().as_uri(),
    ]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=180)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line and re.search(r"Uncaught|Error|error", line)]


def status(dom: str) -> dict[str, str]:
    m = re.search(r'<div id="render-status"[^>]*>', dom)
    assert m, "no render status in the page"
    return dict(re.findall(r'data-(\w+)="([^"]*)"', m.group(0)))


def fixture_analysis() -> Analysis:
    from pardiag.analyzers.pipeline import analyze_path

    traces = FIXTURES / "gpu-traces" / "sampled-128rank-job"
    if not traces.is_dir():
        pytest.skip(f"fixture traces not found: {traces}")
    return analyze_path(traces, jobs=1)


CASES = {"cpu-run": small, "gpu-traces": fixture_analysis, "hostile-text": hostile}


def test_console_errors_are_seen(tmp_path: Path) -> None:
    """The check below would be worthless if a broken page passed it."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    run = chromium(page, tmp_path / "profile", "--dump-dom")
    assert console_errors(run.stderr), run.stderr[-2000:]


@pytest.mark.parametrize("case", CASES)
def test_report_renders_in_chromium(case: str, tmp_path: Path) -> None:
    a = CASES[case]()
    html = render_html(a)
    expected = len(figures(a))
    assert expected >= 3
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    for tag in re.findall(r"<(?:script|link)\b[^>]*>", html):
        assert not re.search(r"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", tag), f"loads from the network: {tag}"

    run = chromium(page, tmp_path / "profile", "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    assert console_errors(run.stderr) == [], run.stderr[-4000:]
    st = status(dom)
    assert st["errors"] == ""
    assert st["expected"] == st["rendered"] == str(expected), st
    assert dom.count('class="plot-container plotly"') == expected
    assert dom.count('class="main-svg"') >= expected
    assert "<img" not in dom  # untrusted text never became an element

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{case}.png"
    shot.unlink(missing_ok=True)
    run = chromium(page, tmp_path / "profile", "--window-size=1280,3600", f"--screenshot={shot}")
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.is_file() and shot.stat().st_size > 20_000
