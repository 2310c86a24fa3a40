"""What the reports say when no straggler is named: words that follow the numbers
shown next to them, and "not measured" when nothing was."""

from __future__ import annotations

from dataclasses import replace

from pardiag.analysis import Analysis
from pardiag.display import no_straggler_words
from pardiag.report_md import render_markdown
from factories import analysis, collective, rank

MS = 1000.0


def two_ranks(wait0_ms: float, wait1_ms: float, *, steps: int = 3, collectives: bool = True) -> Analysis:
    # steps of 100 ms (step_p50); waits summed over `steps` profiled steps
    ranks = [replace(rank(r, device="cpu", steps=steps, window=100 * MS * steps), wait_us=w * MS * steps)
             for r, w in ((0, wait0_ms), (1, wait1_ms))]
    return analysis(ranks, collectives=[collective()] if collectives else [])


def test_uneven_waits_are_not_called_even() -> None:
    # the bundled demo: rank 0 waits 52 ms per step, rank 1 20 ms, no straggler named
    words = no_straggler_words(two_ranks(52, 20))
    assert words is not None and "evenly" not in words
    assert "rank 0 waits 52.0 ms per step and rank 1 20.0 ms (profiled window)" in words
    assert "**Straggler:** none named; rank 0 waits 52.0 ms" in render_markdown(two_ranks(52, 20))


def test_even_only_when_measured_and_close() -> None:
    # 21 vs 20 ms of a 100 ms step: within 10% of the step
    assert no_straggler_words(two_ranks(21, 20)) == \
        "none; the ranks wait on each other evenly (20.0 to 21.0 ms per step, profiled window)"


def test_no_waits_measured_is_said() -> None:
    # a plain trace folder whose ranks matched no collective, and no steps.jsonl
    a = two_ranks(0, 0, collectives=False)
    words = no_straggler_words(a)
    assert words is not None and words.startswith("not measured") and "evenly" not in words
    assert "evenly" not in render_markdown(a)
    # without a profiled step there is no wait per step either
    assert no_straggler_words(two_ranks(0, 0, steps=0)).startswith("not measured")  # type: ignore[union-attr]


def test_steps_jsonl_backward_is_the_measure_without_a_window() -> None:
    ranks = [replace(rank(r, device="cpu", steps=0, window=0.0, host={"step": 100 * MS, "backward": b * MS}))
             for r, b in ((0, 45), (1, 5))]
    words = no_straggler_words(analysis(ranks))
    assert words is not None and "rank 0 spends in backward, DDP's wait included, 45.0 ms per step" in words
