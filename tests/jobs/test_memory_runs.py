"""Memory by category on real 2-rank jobs (gloo, CPU): every category of a job counted
by hand (tests/scripts/memory_job.py), the planted imbalance (examples/scenarios/
memory_hog.py: rank 1 keeps 320 MiB) found with its size, then gone with the fix, memory
taken fresh in every step, and what accumulating does to backward's memory in the
gradient-accumulation estimate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO, SCRIPTS, run_pardiag, torchrun

pytestmark = pytest.mark.slow
MIB = 2**20


def analysed(tmp_path: Path, name: str, cmd: list[str], *args: str, env: dict[str, str] | None = None) -> dict:
    out = tmp_path / name
    res = run_pardiag("run", "-q", "--out", str(out), *args, "--", *cmd, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(run_pardiag("analyze", str(out), "--json").stdout)


def test_every_category_equals_the_hand_count(tmp_path: Path) -> None:
    doc = analysed(tmp_path, "counted", torchrun(2, SCRIPTS / "memory_job.py"), "--profile-memory")
    for r in doc["ranks"]:
        m = r["memory"]
        assert m["device"] == "cpu"
        peak = m["peak"]
        # the script's docstring works these out
        assert peak["parameters"] == 2_102_272
        assert peak["gradients"] == 4_204_544  # one per parameter and DDP's bucket buffer
        assert peak["optimizer_state"] == 4_204_560
        # the ReLU's output (32 x 1024 x 4) and the loss with backward's seed (a few bytes)
        assert 131_072 <= peak["activations"] <= 131_072 + 64, peak
        assert "profiled steps" in m["sources"]["activations"]
        assert peak["total"] is None and peak["other"] is None  # a CPU allocator keeps no count
        assert m["rss_peak"] >= m["rss_steady"] > 0


def test_a_rank_that_holds_320_mib_more_is_found_and_the_fix_clears_it(tmp_path: Path) -> None:
    script = REPO / "examples" / "scenarios" / "memory_hog.py"
    problem = analysed(tmp_path, "hog", torchrun(2, script, "--steps", "20"))
    # the finding, not necessarily the first: the job is the healthy one, which sleeps 20 ms
    # per optimizer step, and a recording whose exposed communication passes 10% (12% in
    # one full-suite run, 6-9% in three others) also gets gradient_accumulation, ranked
    # first as its severity is higher (a true one: 4 micro-batches per step cut the
    # healthy job's time per micro-batch by 59%, README) than memory_imbalance's (low here)
    found = [f for f in problem["findings"] if f["lever"] == "memory_imbalance"]
    assert len(found) == 1, [(f["lever"], f["title"]) for f in problem["findings"]]
    top = found[0]
    assert top["ranks"] == [1], top
    rss = {r["rank"]: r["memory"]["rss_peak"] for r in problem["ranks"]}
    # 320 MiB planted. Measured: rank 1 over rank 0 by 265 to 385 MiB in 7 recordings of the
    # problem (a clean-clone suite run gave 354, full suite runs on 2 busy cores 265 and
    # 385: its steady RSS 385 MiB apart too, the allocator keeping more on the rank that
    # holds more), and the ranks of the fixed job apart by -31 to +19 MiB in 4 (their RSS
    # differs by that much with nothing planted); bounded at 96 MiB (30%): over every miss
    # measured, far from a broken figure (0 or 640 MiB)
    assert abs(rss[1] - rss[0] - 320 * MIB) <= 96 * MIB, rss
    assert "the same on every rank" in " ".join(top["evidence"])
    # a CPU-only job records its allocations by default: its activations are known
    assert all(r["memory"]["peak"]["activations"] for r in problem["ranks"]), problem["ranks"][0]["memory"]
    fixed = analysed(tmp_path, "fixed", torchrun(2, script, "--steps", "20", "--fix"), "--no-profile-memory")
    assert not [f for f in fixed["findings"] if f["lever"] == "memory_imbalance"], fixed["findings"]
    assert all(r["memory"]["peak"]["activations"] is None for r in fixed["ranks"])  # asked not to record them


def test_memory_taken_fresh_in_every_step_is_noticed(tmp_path: Path) -> None:
    # a 64 MiB block taken and freed in every step: glibc maps it afresh each time, so
    # every step faults its 16,384 pages (16,385 with the page of its header) in again,
    # about 18 ms of an 18 ms step here (1.2 us each is 19.7 ms: over 10% of any step
    # under 197 ms); the same loop keeping the block faults nothing after its first step
    def notices(name: str, *args: str) -> list[str]:
        doc = analysed(tmp_path, name, [sys.executable, str(SCRIPTS / "fresh_pages.py"), *args])
        return [n["message"] for n in doc["notices"] if n["message"].startswith("memory taken fresh")]

    (said,) = notices("fresh")
    assert said.startswith("memory taken fresh in every step: rank 0 16,385 times in its "), said
    assert "ms step (64 MB), its resident memory flat (steps.jsonl)" in said
    assert notices("kept", "--keep") == []


@pytest.mark.timed
def test_the_accumulation_estimate_reads_the_jobs_own_adds_and_the_measured_fault(tmp_path: Path) -> None:
    """comm_bound under `pardiag run` as users run it (factors measured after the job): the
    gradient-accumulation estimate carries the in-place add rate of rank 0's own trace and,
    where a rank's backward faulted about as often in every counted step, the cost of a
    fault measured after the job (factors/faults.json). Both worked out here from the
    run's files, apart from the estimate."""
    import statistics

    from pardiag.analyzers.gemm_shapes import inplace_add_rate

    run = tmp_path / "acc"
    res = run_pardiag("run", "-q", "--out", str(run), "--",
                      *torchrun(2, REPO / "examples" / "scenarios" / "comm_bound.py", "--steps", "20"), measure=True)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(run_pardiag("analyze", str(run), "--json").stdout)
    (f,) = [f for f in doc["findings"] if f["lever"] == "gradient_accumulation"]
    est = f["estimate"]
    assert est["method"] == "replay", est
    factors = {x["name"]: x for x in est["factors"]}
    trace = next((run / "ranks" / "0").glob("trace.json*"))
    rate = inplace_add_rate(trace)
    assert rate is not None and rate.calls >= 3  # the optimizer adds the two 2048x2048 weights, every step
    assert factors["in-place add"]["value"] == pytest.approx(rate.us_per_byte * MIB, abs=1e-3)
    assert factors["in-place add"]["measured"] is True

    def faults(rank: int) -> float:
        """The larger of the backward faults' median over the profiled steps and over the
        counted ones (past step 0, outside the window), from steps.jsonl."""
        rows = [json.loads(l) for l in (run / "ranks" / str(rank) / "steps.jsonl").read_text().splitlines()]
        window = [r["bwd_faults"] for r in rows if r.get("profiler") == "active" and "bwd_faults" in r]
        job = [r["bwd_faults"] for r in rows if r["step"] >= 1 and "bwd_faults" in r and not r.get("profiler")]
        return max(statistics.median(window) if window else 0, statistics.median(job) if len(job) >= 5 else 0)

    # the allocator decides run by run whether gradients are faulted in again each step:
    # the fault is timed after the job when a rank faulted 1,000 times per step or more,
    # counted (measured or assumed) when it faulted at all
    most = max(faults(r) for r in (0, 1))
    if most >= 1000:
        measured = json.loads((run / "factors" / "faults.json").read_text())
        assert measured["status"] == "ok" and measured["bytes"] == 16 * MIB
        assert factors["page fault of fresh memory"]["value"] == pytest.approx(measured["us_per_fault"], abs=1e-3)
        assert factors["page fault of fresh memory"]["measured"] is True
        assert not [e for e in f["evidence"] if e.startswith("each step page-faults")]  # counted, not a caveat
    elif most > 0:
        assert factors["page fault of fresh memory"]["measured"] is False
    else:
        assert "page fault of fresh memory" not in factors
