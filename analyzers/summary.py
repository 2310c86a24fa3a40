"""The job-level figures every output shows (median step, exposed communication, the
job's step percentiles, the profiler's inflation), computed once into `Analysis.summary`.

The advisor, the what-if projection, scaling, diff and every renderer read them from
there, so that no two screens can disagree. The definitions, worded for users, are
`pardiag.analysis.SUMMARY_DEFINITIONS`; in short:

- a median of an even count is the mean of the two middle values (`steps.percentile`);
- shares are pooled over the job (sums over ranks over the sum of their windows), never
  a mean of per-rank ratios: a rank with a longer window weighs more, as its time does;
- the job's step is its slowest rank's, per step (the ranks meet in its collectives).

Pure Python over the ranks' results; the step records are optional (an Analysis read
from schema 1 or built by hand has none).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from pardiag.analysis import BREAKDOWN_KEYS, Analysis, Inflation, RankResult, StepPercentiles, Summary
from pardiag.analyzers.steps import job_step_times_us, median, percentile
from pardiag.step_records import WARMUP_STEPS, StepRecord, counted

StepRecords = Mapping[int, Sequence[StepRecord]]


def build_summary(ranks: Sequence[RankResult], step_records: StepRecords | None = None) -> Summary:
    """The summary of a job; `step_records` (steps.jsonl per rank) gives the job's step
    percentiles over every step, without them they come from the profiled windows."""
    step, source = step_p50(ranks)
    return Summary(
        step_p50_us=step,
        step_p50_source=source,
        comm_exposed_ratio=_pooled(ranks, lambda r: r.breakdown_us.get("comm_exposed", 0.0)),
        comm_exposed_transfer_ratio=_pooled(ranks, exposed_transfer_us),
        breakdown_ratio={k: v for k in BREAKDOWN_KEYS
                         if (v := _pooled(ranks, lambda r, k=k: r.breakdown_us.get(k, 0.0))) is not None},
        step_percentiles_us=step_percentiles(ranks, step_records),
        profiled_step_inflation=replace(inflation(ranks, step if source == "all steps" else None),
                                        by_phase_us=phase_inflation_us(step_records or {}),
                                        adjacent=adjacent_inflation(step_records or {}),
                                        page_faults=fault_rates(step_records or {})),
        computed_from="steps" if step_records is not None else "ranks",
    )


def summary_from_ranks(ranks: Sequence[RankResult]) -> Summary:
    """What can be computed without the step records (schema 1 upgraded, built by hand)."""
    return build_summary(ranks, None)


def readvise(a: Analysis) -> Analysis:
    """An Analysis of schema 1, upgraded: its advisor's findings (and what-if) recomputed
    from the summary, so that they use the figures every report shows; findings from
    the NCCL logs and GPU telemetry, which no rule recomputes, are kept as they were."""
    from pardiag.analyzers.rules import RULES, advise

    by_rules = {row.lever for row in RULES if row.family == "lever"}
    return advise(replace(a, findings=[]), extra=[f for f in a.findings if f.lever not in by_rules])


def step_p50(ranks: Sequence[RankResult]) -> tuple[float | None, Any]:
    """Median over ranks of their p50 over all steps; without steps.jsonl, of their
    profiled window per step."""
    p50s = [r.step_time_us.p50 for r in ranks if r.step_time_us.p50 is not None]
    if p50s:
        return median(p50s), "all steps"
    windows = [w for r in ranks if (w := profiled_window_step_us(r)) is not None]
    if windows:
        return median(windows), "profiled window"
    return None, "none"


def profiled_window_step_us(r: RankResult) -> float | None:
    return r.window_us / r.steps_profiled if r.steps_profiled and r.window_us > 0 else None


def exposed_transfer_us(r: RankResult) -> float:
    """A rank's exposed communication without its waiting for other ranks: scaled by the
    share of its collective time that was transfer (`transfer_fraction`)."""
    return r.breakdown_us.get("comm_exposed", 0.0) * transfer_fraction(r)


def transfer_fraction(r: RankResult) -> float:
    """The share of a rank's collective time that was transfer, transfer / (transfer +
    wait); 1 when it spent none in collectives."""
    coll = r.transfer_us + r.wait_us
    return r.transfer_us / coll if coll > 0 else 1.0


def _pooled(ranks: Sequence[RankResult], part: Any) -> float | None:
    timed = [r for r in ranks if r.window_us > 0]
    window = sum(r.window_us for r in timed)
    return sum(part(r) for r in timed) / window if window > 0 else None


def step_percentiles(ranks: Sequence[RankResult], step_records: StepRecords | None) -> StepPercentiles:
    values = job_step_times_us(step_records).values_us if step_records else []
    source = "steps"
    if not values:
        values = [w for r in ranks if (w := profiled_window_step_us(r)) is not None]
        source = "profiled"
    if not values:
        return StepPercentiles(None, None, None, None, 0, "none")
    return StepPercentiles(p50=percentile(values, 0.5), p90=percentile(values, 0.9), p99=percentile(values, 0.99),
                           max=max(values), n=len(values), source=source)  # type: ignore[arg-type]


def profiled_step_us(r: RankResult) -> float | None:
    """A rank's step under the profiler: the median step inside its active window
    (steps.jsonl), else the profiled window per step (the trace)."""
    return r.step_time_us.profiled_p50 if r.step_time_us.profiled_p50 is not None else profiled_window_step_us(r)


def inflation(ranks: Sequence[RankResult], step_us: float | None) -> Inflation:
    by_rank = {}
    profiled = []
    for r in ranks:
        p = profiled_step_us(r)
        if p is None:
            continue
        profiled.append(p)
        if r.step_time_us.p50:
            by_rank[str(r.rank)] = p / r.step_time_us.p50
    prof = median(profiled)
    return Inflation(job=prof / step_us if prof is not None and step_us else None, by_rank=by_rank)


def phase_inflation_us(step_records: StepRecords) -> dict[str, float]:
    """What the profiler made longer: per host phase of steps.jsonl (`host_phases`) and
    "untimed" (the step less those phases: pardiag's boundary, Python outside them), the
    median over ranks of (its median over the steps inside the profiler's active window
    less its median over the counted steps). {} without steps in both."""
    from pardiag.step_records import host_phases

    names = [s.name for s in host_phases()]

    def value(r: StepRecord, name: str) -> float | None:
        if name != "untimed":
            return r.get(name)
        return (r.dur_us or 0.0) - sum(r.get(n) or 0.0 for n in names)

    per: dict[str, list[float]] = {}
    for records in step_records.values():
        active = [r for r in records if r.profiler == "active" and r.dur_us is not None and r.step >= WARMUP_STEPS]
        plain = [r for r in records if counted(r) and r.dur_us is not None]
        if not active or not plain:
            continue
        for name in [*names, "untimed"]:
            a = median([v for r in active if (v := value(r, name)) is not None])
            b = median([v for r in plain if (v := value(r, name)) is not None])
            if a is not None and b is not None:
                per.setdefault(name, []).append(a - b)
    return {k: m for k, v in per.items() if (m := median(v)) is not None}


def fault_rates(step_records: StepRecords) -> dict[str, float]:
    """The process's minor page faults per step: "profiled" (inside the active window) and
    "plain" (the counted steps), each the median over ranks of the rank's median; {}
    where they were not counted (not on Unix, or records older than the counter)."""
    per: dict[str, list[float]] = {"profiled": [], "plain": []}
    for records in step_records.values():
        active = [v for r in records if r.profiler == "active" and r.step >= WARMUP_STEPS
                  and (v := r.get("page_faults")) is not None]
        plain = [v for r in records if counted(r) and (v := r.get("page_faults")) is not None]
        if active and plain:
            per["profiled"].append(median(active) or 0.0)
            per["plain"].append(median(plain) or 0.0)
    return {k: m for k, v in per.items() if (m := median(v)) is not None}


FAULTS_SAID = 1.5  # profiled steps page-faulting this many times as often (and 1000 more): said


def fault_words(inf: Inflation) -> str:
    """'; page faults ...' when profiled steps faulted FAULTS_SAID x as often as the others."""
    f = inf.page_faults
    a, b = f.get("profiled"), f.get("plain")
    if a is None or b is None or a < FAULTS_SAID * b or a - b < 1000:
        return ""
    return (f"; the process page-faulted {a:,.0f} times per profiled step against {b:,.0f} per unprofiled one "
            "(steps.jsonl): the profiler's own memory, or a change in how the job's memory is reused, which slows "
            "the operators that touch fresh memory")


FRESH_PAGES_SHARE = 0.10  # of the rank's median step, at FAULT_US per fault: from here a CPU job's steady faults are said
FAULT_US = 1.2  # what a minor fault of fresh memory costs, about: fresh_pages_words' threshold, and the
# accumulation estimate's cost per fault, labelled assumed, where none was measured after the job
FRESH_PAGES_STEADY = 0.5  # the quarter of steps that faulted least faulted at least this share of the median
FRESH_PAGES_MIN_STEPS = 5
FRESH_PAGES_RSS_GROWTH = 0.05  # resident memory grows less than this over the later half of the counted steps
# (the first ones still grow: comm_bound's rank went from 477 to 610 MB over its first 3, then stayed)
PAGE_BYTES = 4096  # a minor fault brings in one page


def steady_faults(records: Sequence[StepRecord], signal: str = "page_faults") -> float | None:
    """The median of ``signal`` (page faults) over the rank's counted steps when it faults
    about as often in every one of them: at least FRESH_PAGES_MIN_STEPS steps, the quarter
    that fault least at FRESH_PAGES_STEADY of the median or more; else None (0 faults too)."""
    faults = sorted(v for x in records if counted(x) and (v := x.get(signal)) is not None)
    if len(faults) < FRESH_PAGES_MIN_STEPS:
        return None
    f = median(faults) or 0.0
    return f if f > 0 and faults[len(faults) // 4] >= FRESH_PAGES_STEADY * f else None


def backward_faults(records: Sequence[StepRecord]) -> float | None:
    """The page faults per step a rank's backward takes that accumulating micro-batches
    do not (steps.jsonl ``bwd_faults``): the larger of its median over the profiled
    window's steps (what the replayed backward holds) and its median over the job's
    counted steps (at least ``FRESH_PAGES_MIN_STEPS`` of them; what the job's step,
    which the saving is taken off, holds); None when neither is positive.

    The C library's allocator does not fault alike in every run, nor in the window as
    outside it: of comm_bound's 8 ranks in 4 recordings, one faulted in none of its
    counted steps and 4,096-5,531 times in each profiled one, one 6,144-10,240 times per
    counted step and 0-483 in the window, one 0 or about 4,096 times in turn; every
    rank of their 4 fixed jobs faulted 8,160 times per 4 micro-batches. An earlier rule
    counted only faults as frequent in every counted step (the quarter of steps that
    fault least at half the median or more), and left the window's faults in the
    micro-batches that accumulate: those 4 recordings were estimated at +2.9, -11.3,
    -24.3 and +6.5 points off the measured saving, with this rule +3.0, -4.3, -14.2 and
    +7.8 (the -14.2: that job's steps were 87.2 ms, its profiled ones 72.0, its
    all-reduces slower outside the window)."""
    window = [v for x in records if x.profiler == "active" and (v := x.get("backward_page_faults")) is not None]
    job = [v for x in records if counted(x) and (v := x.get("backward_page_faults")) is not None]
    w = median(window) or 0.0
    j = (median(job) or 0.0) if len(job) >= FRESH_PAGES_MIN_STEPS else 0.0
    return max(w, j) or None


def fresh_pages_words(ranks: Sequence[RankResult], step_records: StepRecords) -> str | None:
    """On CPUs, a process that page-faults about as often in every counted step while its
    resident memory stays flat gives memory back to the kernel and takes it again each
    step: glibc's allocator trims the top of its heap and unmaps large blocks once they
    are freed (gradients set to None, activations). Said when those faults, at FAULT_US
    each, come to FRESH_PAGES_SHARE of the rank's step, with the settings that keep the
    memory; what they save is not estimated. A fault cost the training threads of comm_bound
    and long_inputs 1.4-1.5 us of CPU (their CPU per step with and without the settings
    over their faults), a loop writing fresh memory 0.85-1.24 us more than reused memory:
    FAULT_US is between. Measured (steps.jsonl, 2 ranks on 2 CPUs):
    comm_bound's rank faulted 8,160 times per step, and with MALLOC_TRIM_THRESHOLD_ and
    MALLOC_MMAP_THRESHOLD_ set none, its training thread burning 43.3-45.0 ms of CPU per
    step against 55.4; long_inputs' long-batch rank 8,160 times, its job's step 34.0-35.0 ms
    and with them 22.9-24.0. The healthy control faults 0-2,272 times per step (up to 6%
    of its 47 ms step at FAULT_US), unsteadily: nothing is said, and the settings moved
    its step from 46.5-49.3 to 45.1-46.9 ms. The settings do not always hold: a 64 MiB
    block taken and freed in every step (tests/scripts/fresh_pages.py) faulted its 16,385
    pages with them too (above the 32 MiB mmap threshold), hence "can". None off CPUs (a GPU job's device memory is
    its allocator's, and its host faults are the loader's and the launches'), or without
    the signals."""
    if not ranks or any(r.device_type != "cpu" for r in ranks):
        return None
    said: list[tuple[int, float, float]] = []
    for r in sorted(step_records):
        recs = [x for x in step_records[r] if counted(x)]
        f = steady_faults(recs)
        steps = [x.dur_us for x in recs if x.dur_us]
        rss = [v for x in recs if (v := x.get("rss_mb")) is not None]
        if f is None or not steps or len(rss) < 2:
            continue
        step = median(steps) or 0.0
        if (step <= 0 or f * FAULT_US < FRESH_PAGES_SHARE * step
                or max(tail := rss[len(rss) // 2:]) > (1 + FRESH_PAGES_RSS_GROWTH) * min(tail)):
            continue
        said.append((r, f, step))
    if not said:
        return None
    who = "; ".join(f"rank {r} {f:,.0f} times in its {step / 1e3:.1f} ms step ({f * PAGE_BYTES / 2**20:.0f} MB)"
                    for r, f, step in said[:4]) + (f"; {len(said) - 4} more ranks" if len(said) > 4 else "")
    its = "its" if len(said) == 1 else "their"
    return (f"memory taken fresh in every step: {who}, {its} resident memory flat (steps.jsonl): the C library's "
            "allocator hands freed memory back to the kernel and the next step faults it in again. Its settings "
            "can keep it (MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432 in the job's "
            "environment removed every fault of two test jobs; blocks larger than the mmap threshold are mapped "
            "afresh each time), or another allocator preloaded (jemalloc, tcmalloc); whether they do here and what "
            "that saves is not estimated: compare the step with and without")


ADJACENT_STEPS = 4  # counted steps on either side of the profiler window: its local baseline


def adjacent_inflation(step_records: StepRecords) -> float | None:
    """The median over ranks of (the median step inside the profiler's active window over
    the median of the counted steps at most ADJACENT_STEPS before the window opens or
    after it closes). Against the median of every step, a job whose machine got faster
    or slower part-way reads as inflated; against its neighbours, only what the window
    itself added. None without both kinds of step."""
    ratios = []
    for records in step_records.values():
        window = [r.step for r in records if r.profiler is not None]
        active = [r.dur_us for r in records
                  if r.profiler == "active" and r.dur_us is not None and r.step >= WARMUP_STEPS]
        if not window or not active:
            continue
        lo, hi = min(window), max(window)
        near = [r.dur_us for r in records if counted(r) and r.dur_us is not None
                and (lo - ADJACENT_STEPS <= r.step < lo or hi < r.step <= hi + ADJACENT_STEPS)]
        a, b = median(active), median(near)
        if a is not None and b:
            ratios.append(a / b)
    return median(ratios)


INFLATION_SAID = 1.10  # profiled steps this much longer than the median step: the analysis says what grew
PHASE_SAID = 0.10  # ... naming the phases that hold at least this share of the growth
PHASE_WORDS = {"dataloader": "DataLoader", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
               "untimed": "outside those"}


def inflation_words(inf: Inflation) -> str | None:
    """The notice for profiled steps over INFLATION_SAID x the median step: what grew
    (the phases of steps.jsonl, largest first) and what that means for the window's
    shares; None below it or when unknown."""
    if inf.job is None or inf.job < INFLATION_SAID:
        return None
    total = sum(v for v in inf.by_phase_us.values() if v > 0)
    grew = sorted(((v, k) for k, v in inf.by_phase_us.items() if v > 0 and v >= PHASE_SAID * total), reverse=True)
    what = (": " + ", ".join(f"{PHASE_WORDS.get(k, k)} +{v / 1000:.1f} ms" for v, k in grew[:3])
            + " per step (median over ranks, steps.jsonl)") if grew else ""
    near = ""
    if inf.adjacent is not None:
        near = (f"; against the steps just before and after the window {inf.adjacent:.2f}x"
                + (" (the machine's speed changed during the job: most of the difference is not the profiler's)"
                   if inf.adjacent < INFLATION_SAID else ""))
    return (f"profiled steps took {inf.job:.2f}x the median step{what}{near}{fault_words(inf)}. The profiler adds host time to every "
            "operator it records (more with --with-stack or --profile-memory; other processes busy during the "
            "window show the same way), so the window's shares of host-side "
            "work (compute on a CPU, the phases, idle and input time beside them) are those of the slowed steps; "
            "savings taken from them are qualified in their findings")
