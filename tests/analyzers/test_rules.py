"""The one registry of finding rules: every lever id where it belongs, the closed lever
type, the documented order, and the three families (NCCL, GPU health, levers) coming
through it together on a real NCCL log, a telemetry block and an Analysis built by hand."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import get_args

import pytest

from pardiag.analysis import LEVERS, Finding, Lever, Straggler
from pardiag.analysis_blocks import GpuTelemetry
from pardiag.analyzers import levers, rules, temporal_rules
from pardiag.analyzers.pipeline import analyze_path
from pardiag.analyzers.nccl.log import parse_nccl_logs
from pardiag.analyzers.rules import RULES, Row, RuleContext, advise, ordered, run_rules
from factories import DDP_ONE_BUCKET, analysis, finding, gpu_telemetry, lever_runs, rank, telemetry_summary

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
NCCL_LOG = SHARED / "reference" / "nccl" / "logs" / "08-chimera2-v2193-shm-p2p-level-loc-loopback-bootstrap.log"
needs_log = pytest.mark.skipif(not NCCL_LOG.is_file(), reason="reference NCCL logs not present (shared/reference/nccl)")
FAMILY_LEVER = {"nccl": "nccl_env", "telemetry": "gpu_health"}


def gpu(n: int, *, throttled: bool = False, low_memory: bool = False) -> GpuTelemetry:
    """A GPU's telemetry summary: thermally throttled in 10% of its busy samples (medium,
    no clock to estimate from), and/or 1% memory headroom (medium)."""
    return gpu_telemetry(n, samples=50, slowdown_share=0.10 if throttled else 0.0,
                         throttle_share={"hw_thermal_slowdown": 0.10} if throttled else {},
                         sm_clock_busy_mean_mhz=1900, sm_clock_mean_mhz=1900, util_gpu_ratio_mean=0.9,
                         memory_headroom_ratio=0.01 if low_memory else 0.5, memory_used_max_bytes=79 * 2**30,
                         memory_total_bytes=80 * 2**30, memory_headroom_bytes=2**30)


# -- the lever type ----------------------------------------------------------------------


def test_lever_type_levers_and_readme_agree() -> None:
    assert LEVERS == get_args(Lever) and len(set(LEVERS)) == len(LEVERS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = readme[readme.index("**What to change**"):readme.index("and the projected step time")]
    assert tuple(re.findall(r"`(\w+)`", listed)) == LEVERS


@pytest.mark.skipif(not (SHARED / "DESIGN.md").is_file(), reason="DESIGN.md not present")
def test_lever_type_is_designs_vocabulary_and_its_extensions() -> None:
    design = (SHARED / "DESIGN.md").read_text(encoding="utf-8")
    fixed = design[design.index("`findings[].lever` is one of"):design.index("`severity` is")]
    vocabulary = re.findall(r"`(\w+)`", fixed.split("):", 1)[1])
    extensions = design[design.index("Lever ids may be extended"):][:300]
    assert vocabulary == list(LEVERS[:len(vocabulary)])
    added = set(LEVERS) - set(vocabulary)
    named = {"ddp_find_unused", "host_contention", "garbage_collection", "input_imbalance"}  # DESIGN.md's examples
    assert all(f"`{x}`" in extensions for x in named)
    # extended further (memory by category); listed with the rest in the README (the test above)
    assert added == named | {"memory_imbalance", "allocator_fragmentation"}


def test_the_closed_type_rejects_an_unknown_id_in_the_registry_but_loads_a_newer_file() -> None:
    assert Row("ok", "lever", "straggler", levers.straggler).lever == "straggler"
    with pytest.raises(ValueError, match="unknown lever id 'stragler'"):
        Row("typo", "lever", "stragler", levers.straggler)  # type: ignore[arg-type]
    # an analysis.json from a newer pardiag, with a lever id this one does not know, loads
    import json

    from pardiag.analysis import from_dict

    doc = json.loads(analysis([rank(0)]).to_json())
    doc["findings"] = [dict(vars(finding("nccl_env")), lever="future_lever")]
    assert [f.lever for f in from_dict(doc).findings] == ["future_lever"]


# -- the registry ------------------------------------------------------------------------


def test_registry_covers_every_lever_id_exactly_where_expected() -> None:
    assert len({row.name for row in RULES}) == len(RULES)
    assert {row.lever for row in RULES} == set(LEVERS)
    for row in RULES:
        if row.family == "lever":
            assert row.lever == row.name and row.check is getattr(levers, row.name) and row.per == "job"
        elif row.family == "temporal":
            assert row.check is getattr(temporal_rules, row.name) and row.lever in ("straggler", "garbage_collection")
        else:
            assert row.lever == FAMILY_LEVER[row.family]
        assert row.per == ("gpu" if row.family == "telemetry" else "job")
    once = Counter(row.lever for row in RULES if row.family == "lever")
    assert set(once.values()) == {1} and set(once) == set(LEVERS) - {"nccl_env", "gpu_health"}


def test_registry_order_is_the_documented_one() -> None:
    families = [row.family for row in RULES]
    assert families == sorted(families, key=["nccl", "telemetry", "lever", "temporal"].index)
    assert [row.name for row in RULES if row.family == "temporal"] == ["late_straggler", "gc_pauses"]
    assert [row.name for row in RULES if row.family == "nccl"][-1] == "stale_overrides"  # defers to the others
    # the advisor's table as it was, kept in its order
    assert [row.name for row in RULES if row.family == "lever"] == [
        "straggler", "host_contention", "garbage_collection", "input_imbalance", "dataloader", "gradient_accumulation", "ddp_bucket_size", "ddp_find_unused", "comm_overlap",
        "mixed_precision", "sharding", "batch_size", "memory_imbalance", "allocator_fragmentation", "sync_points",
        "host_overhead"]


def test_ordered_by_rank_then_running_order() -> None:
    low, high, medium = finding("nccl_env", "low"), finding("gpu_health", "high"), finding("dataloader", "medium", 5.0)
    batch = finding("batch_size", "medium", 9.0)  # changes the training: after, at equal severity
    memory = finding("sharding", "high")  # a memory limit comes first among the high ones
    tie_a, tie_b = finding("nccl_env", "medium", 5.0), finding("gpu_health", "medium", 5.0)
    assert ordered([low, high, batch, medium, tie_a, memory, tie_b]) == [memory, high, medium, tie_a, tie_b, batch, low]


def test_per_gpu_rows_run_gpu_by_gpu() -> None:
    block = telemetry_summary([gpu(0, throttled=True, low_memory=True), gpu(1, throttled=True, low_memory=True)])
    ctx = RuleContext(analysis([rank(0, compute=0.8)]), telemetry=block)
    found = ordered(run_rules(ctx, family="telemetry"))
    assert [(f.ranks, f.title.split(" ran ")[0].split(" is ")[0], f.severity) for f in found] == [
        ([0], "GPU 0 on h (rank 0)", "medium"), ([0], "GPU 0 on h (rank 0)", "medium"),
        ([1], "GPU 1 on h (rank 1)", "medium"), ([1], "GPU 1 on h (rank 1)", "medium")]
    assert ["throttled" in f.title for f in found] == [True, False, True, False]


def test_empty_inputs_find_nothing() -> None:
    ctx = RuleContext(analysis([rank(0, compute=0.8)]))
    assert run_rules(ctx, family="nccl") == [] and run_rules(ctx, family="telemetry") == []


# -- the three families through the one registry ------------------------------------------


@needs_log
def test_all_three_families_come_through_the_registry() -> None:
    report = parse_nccl_logs([NCCL_LOG])
    block = telemetry_summary([gpu(0, low_memory=True), gpu(1)])
    a = analysis([rank(r, compute=0.6, comm_exposed=0.2, dataloader=0.1) for r in (0, 1)], DDP_ONE_BUCKET,
                 stragglers=[Straggler(rank=1, excess_us_per_step=5000.0, cause="forward", evidence=["e"])])
    out = advise(a, nccl=report, telemetry=block)
    by_family = {fam: run_rules(RuleContext(a, nccl=report, telemetry=block), family=fam)
                 for fam in ("nccl", "telemetry", "lever")}
    assert {f.lever for f in by_family["nccl"]} == {"nccl_env"} and len(by_family["nccl"]) == 2
    assert [f.lever for f in by_family["telemetry"]] == ["gpu_health"]
    assert {"straggler", "dataloader", "gradient_accumulation", "ddp_bucket_size"} <= {
        f.lever for f in by_family["lever"]}
    assert out.findings == ordered(by_family["nccl"] + by_family["telemetry"] + by_family["lever"])
    assert out.what_if is not None and [w.lever for w in out.what_if.findings] == [
        f.lever for f in out.findings if f.est_saving_pct]
    assert not out.notices


def test_a_straggler_that_page_faults_is_told_to_keep_its_memory() -> None:
    # the others wait 17.7 ms of a 100 ms step for rank 0, whose extra work is 19.0 ms of faults
    a = analysis([rank(r, compute=0.6) for r in (0, 1)],
                 stragglers=[Straggler(rank=0, excess_us_per_step=19000.0, cause="page faults (backward)",
                                       evidence=["e"], held_us_per_step=17700.0)])
    (f,) = [f for f in run_rules(RuleContext(a), family="lever") if f.lever == "straggler"]
    assert f.title.startswith("rank 0 is 19.0 ms per step slower (page faults (backward))")
    assert "hands freed memory" in f.action["text"] and "MALLOC_TRIM_THRESHOLD_=1073741824" in f.action["text"]
    assert f.action["code"].splitlines()[1] == (
        "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 torchrun ...")


@needs_log
def test_the_pipeline_calls_the_registry() -> None:
    a = analyze_path(ROOT / "tests" / "data" / "cpu-2rank", jobs=1, nccl_logs=[NCCL_LOG])
    nccl = [f for f in a.findings if f.lever == "nccl_env"]
    assert [f.title for f in nccl] == [
        f.title for f in ordered(run_rules(RuleContext(a, nccl=parse_nccl_logs([NCCL_LOG])), family="nccl"))]
    assert len(nccl) == 2


def test_a_failing_rule_is_a_notice_and_a_wrong_lever_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: RuleContext) -> list[Finding]:
        raise KeyError("x")

    def mislabelled(ctx: RuleContext) -> list[Finding]:
        return [finding("dataloader")]

    monkeypatch.setattr(rules, "RULES", (Row("broken", "lever", "straggler", broken),
                                         Row("mislabelled", "lever", "sync_points", mislabelled)))
    out = advise(analysis([rank(0, compute=0.8)]))
    assert out.findings == []
    assert [n.message for n in out.notices] == [
        "lever rule broken failed: KeyError: 'x'",
        "lever rule mislabelled failed: ValueError: returned lever dataloader, not its row's sync_points"]
    with pytest.raises(KeyError):
        run_rules(RuleContext(analysis([rank(0)])))


# -- severity follows the saving ------------------------------------------------------------

# rules whose docstring says why a finding with no saving estimated may be high
HIGH_WITHOUT_SAVING = {"sharding": "the next larger batch runs out of memory"}


def test_no_lever_finding_is_high_without_the_saving_to_match() -> None:
    """Over many built runs: a finding that saves under SAVING_LOW of the step is low, and
    one with no (or no positive) saving is not high unless its rule's docstring says why.
    comm_overlap used to be high with 30% exposed communication and nothing to hide it
    under (0% saving)."""
    low = 100 * levers.SAVING_LOW
    seen: Counter[str] = Counter()
    for a in lever_runs():
        for f in run_rules(RuleContext(a), "lever"):
            seen[f.lever] += 1
            if f.est_saving_pct is not None and f.est_saving_pct < low:
                assert f.severity == "low", (f.lever, f.est_saving_pct, f.severity, f.title)
            if not f.est_saving_pct and f.severity == "high":
                seen["high without saving"] += 1
                why = HIGH_WITHOUT_SAVING.get(f.lever)
                assert why and why in " ".join((getattr(levers, f.lever).__doc__ or "").split()), f.lever
    # the runs reach every rule that estimates a saving, and the high-without-saving one
    assert {"dataloader", "gradient_accumulation", "ddp_bucket_size", "comm_overlap", "mixed_precision",
            "host_overhead", "sync_points", "sharding", "batch_size", "high without saving"} <= set(seen), seen
