"""Where each estimate comes from and the critical path, in every output format: the
figures of `Finding.estimate`, the what-if's method and `Analysis.critical_path` appear
(a refused replay with its reason, measured factors with where they were timed, assumed
ones labelled), and an analysis without these keys renders as before."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from factories import critical_path, estimated, finding, replay_estimate, share_estimate, small
from pardiag.analysis import Analysis
from pardiag.display import critical_path_of, critical_path_rows, estimate_of, estimate_words
from pardiag.renderers import FORMATS

READABLE = ["md", "text", "html"]


def without_new_keys(a: Analysis) -> Analysis:
    """The analysis as an older pardiag wrote it: no estimate basis, the what-if of
    multiplied shares, no critical path."""
    assert a.what_if is not None
    old = replace(a.what_if, method=None, replay_error_pct=None, refused=None,
                  assumption="each saving as its finding states; savings of different findings treated as independent")
    return replace(a, findings=[replace(f, estimate=None) for f in a.findings], what_if=old, critical_path=None)


def words(name: str, a: Analysis) -> str:
    return " ".join(FORMATS[name].render(a).split())  # the terminal summary wraps long lines


# The factories' figures, worded: saving 12.4% -> "-12%"; error 3.1%; 58.2 of 96.0 ms is 61%,
# forward 38.4 ms 40%, all_reduce 19.2 ms 20%; the what-if 215.0 ms -> 176.3 ms, -18%.
REPLAYED = "replayed: -12% (replay within 3.1% of the measured step)"
REFUSED = "share-based: -8% (replay refused: the replay is 14.2% off the measured step, more than the 10% allowed)"
PATH = ["step 8 (96.0 ms, ending on rank 0)", "rank 1 58.2 ms (61%)", "forward 38.4 ms (40%)",
        "all_reduce 19.2 ms (20%)"]
WHAT_IF = "step 215.0 → 176.3 ms (-18%), one replay with every finding's edits (replay within 3.1% of the measured step)"


@pytest.mark.parametrize("name", READABLE)
def test_every_readable_format_shows_the_basis_the_refusal_and_the_critical_path(name: str) -> None:
    out = words(name, estimated())
    q = FORMATS[name].quote
    assert q(REPLAYED) in out and q(REFUSED) in out
    for part in PATH:
        assert q(part) in out, part
    if name != "html":  # the HTML shows the method under the findings, the figures in the what-if facts
        assert q(WHAT_IF) in out
    else:
        assert q("With every finding applied: one replay with every finding's edits (replay within 3.1% of "
                 "the measured step)") in out


@pytest.mark.parametrize("name", ["md", "html"])
def test_the_reports_label_each_factor_measured_or_assumed(name: str) -> None:
    out = words(name, estimated())
    q = FORMATS[name].quote
    assert q("bf16 GEMM speed-up 2.3x (measured: bf16 vs fp32 GEMMs on rank 0)") in out
    assert q("overlap of the last bucket 0.5 (assumed)") in out


def test_the_html_lists_the_replays_edits_and_every_part_of_the_path() -> None:
    out = FORMATS["html"].render(estimated())
    assert 'id="critical-path"' in out and '<a href="#critical-path">' in out
    assert "rank 1&#39;s operations set to its peers&#39; median" in out
    # every rank, phase and collective with time on the path, with its ms and share
    for by, name, ms, share in [("rank", "rank 0", "37.8", "39%"), ("phase", "host_gap", "5.4", "6%"),
                                ("phase", "wait", "4.2", "4%"), ("collective", "all_reduce", "19.2", "20%")]:
        assert (f'<tr><td>{by}</td><td class="name">{name}</td><td class="num">{ms}</td>'
                f'<td class="num">{share}</td>') in out
    assert '<td class="name">dataloader</td>' not in out  # no time on the path


def test_json_carries_the_blocks_as_given() -> None:
    doc = json.loads(FORMATS["json"].render(estimated()))
    assert [f["estimate"]["method"] for f in doc["findings"]] == ["replay", "share"]
    assert doc["findings"][0]["estimate"]["factors"][0]["measured"] is True
    assert doc["what_if"]["method"] == "replay" and doc["critical_path"]["path_us"] == 96_000.0


@pytest.mark.parametrize("name", list(FORMATS))
def test_without_the_new_keys_nothing_new_is_shown(name: str) -> None:
    old = without_new_keys(estimated())
    out = FORMATS[name].render(old)
    if name == "json":
        doc = json.loads(out)
        assert doc["critical_path"] is None and all(f["estimate"] is None for f in doc["findings"])
        return
    lowered = out.lower()
    for word in ("replay", "share-based", "critical path", "critical-path", "estimate:", "factors:"):
        assert word not in lowered, word
    # and the same analysis with the keys does show them: the check above can fail
    assert "critical path" in FORMATS[name].render(estimated()).lower()


def test_markdown_of_an_analysis_without_them_is_unchanged() -> None:
    """small() (the golden markdown's analysis) has none of the keys: adding them to a copy
    changes its markdown only by the new lines."""
    a = small()
    plain = FORMATS["md"].render(a).splitlines()
    with_keys = replace(a, findings=[replace(a.findings[0], estimate=share_estimate(refused=None))],
                        critical_path=critical_path())
    added = [line for line in FORMATS["md"].render(with_keys).splitlines() if line not in plain]
    assert [line.split(":")[0] for line in added if line] == ["- **Critical path", "Estimate"]
    assert "Estimate: share-based: -8%" in added


BOUND = ("raised from 19.5 to 24.8 ms per step: the processes of ranks 0, 1 keep host vm's 2 cores 87% busy "
         "(steps.jsonl, their CPU time per step), and regrouped buckets are taken to leave them as busy: the step "
         "as long (fewer all-reduces burn less CPU, but where the cores were this busy the steps have been little "
         "shorter for it) (the job's step of 24.8 ms)")


@pytest.mark.parametrize("name", READABLE)
def test_a_saving_held_to_nothing_says_what_held_it(name: str) -> None:
    # the tiny-bucket job on 2 busy cores: the replay removes 19% of the window, the cores
    # leave 0%; without the bound the line read "replayed: -0%", nothing to say why
    e = {**replay_estimate(saving=0.0), "edits": ["each step's all-reduces packed under bucket_cap_mb=1", BOUND],
         "bound": BOUND}
    a = replace(estimated(), findings=[finding("ddp_bucket_size", "low", saving=0.0, estimate=e)])
    out = words(name, a)
    q = FORMATS[name].quote
    assert q("replayed: 0% (replay within 3.1% of the measured step)") in out and "-0%" not in out
    # the reports and the summary say it once: beside the figure, or (the HTML) among the replay's edits
    assert out.count(q("raised from 19.5 to 24.8 ms per step")) == 1
    if name != "html":
        assert q("; bounded: raised from 19.5 to 24.8 ms per step: the processes of ranks 0, 1") in out
    got = finding(saving=0.0, estimate=e)
    assert estimate_words(got, factors=False, bound=False) == "replayed: 0% (replay within 3.1% of the measured step)"
    assert estimate_of(got).bound == BOUND  # type: ignore[union-attr]
    assert estimate_of(finding(saving=5.0, estimate=replay_estimate())).bound is None  # older analyses: none


# -- the display layer reads what a newer or broken writer may give ------------------------------


def test_an_estimate_without_its_own_figure_shows_the_findings() -> None:
    e = {**replay_estimate(), "saving_pct": "n/a", "replay_error_pct": None}
    f = finding(saving=21.0, estimate=e)
    assert estimate_words(f, factors=False) == "replayed: -21%"
    assert estimate_of(finding(estimate={"saving_pct": 3.0})) is None  # no method: not stated
    assert estimate_words(finding(saving=5.0, estimate=share_estimate(saving=5.0, refused=None))) == "share-based: -5%"


def test_a_critical_path_without_its_tops_names_the_largest() -> None:
    cp = {**critical_path(), "top_rank": None, "top_phase": None, "top_collective": None}
    got = critical_path_of(replace(small(), critical_path=cp))
    assert got is not None and (got.top_rank, got.top_phase, got.top_collective) == (1, "forward", "all_reduce")
    assert critical_path_of(replace(small(), critical_path={**critical_path(), "path_us": 0.0})) is None
    rows = critical_path_rows(got)
    assert [r[1] for r in rows if r[0] == "rank"] == ["rank 1", "rank 0"]
    assert sum(r[3] for r in rows if r[0] == "phase") == pytest.approx(1.0)  # the phases tile the path


def test_the_terminal_summary_says_when_nothing_was_found() -> None:
    from pardiag.render_text import summary_text

    a = small()
    assert a.findings and "no finding" not in summary_text(a, width=200)
    none = replace(a, findings=[])
    assert "what to change: no finding (no lever pardiag knows would make this run faster)" in summary_text(none, width=200)
    assert "no finding" not in summary_text(replace(none, ranks=[]), width=200)  # nothing analysed: nothing said


def test_a_factor_in_microseconds_reads_in_ms_from_100_us_and_in_us_under() -> None:
    from pardiag.display import Factor, factor_words

    fault = Factor(name="page fault of fresh memory", value=1.5444, unit="us", source="64 MB written", measured=True)
    assert factor_words(fault) == "page fault of fresh memory 1.54 us (measured: 64 MB written)"
    handover = Factor(name="batch hand-over from a worker", value=686.0, unit="us", source="timed", measured=True)
    assert factor_words(handover).startswith("batch hand-over from a worker 0.7")
    assert "ms (measured: timed)" in factor_words(handover)
