"""Replay-based savings: each finding's change as edits of the replay model
(analyzers/replay.py), its saving the step the edited window replays to against the
step the unedited one replays to, and all findings' changes together in ONE replay.

A finding's rule (analyzers/levers.py) first gives the older estimate, a share of the
step times a constant (``Finding.estimate.method`` "share"). When the replay reproduces
the measured steps (error at most ``replay.MAX_ERROR``) and the lever has a replay
form, the replay's figure replaces it ("replay"): the estimate records the edits in
words, the factors they used (measured, with where from, or assumed, labelled), and
the replay's error. A refused replay keeps the share estimate and says why.

Levers and their edits:

* straggler -> ``Straggler(rank)``: the rank's operations at its peers' median;
* dataloader -> ``RemoveInputWait``: every fetch as quick as the rank's quickest;
* mixed_precision -> ``ScaleGemm(speedup)``: the GEMM time inside the window divided by
  the speed-up measured at the job's own shapes after the job (factors/gemm.json), or
  the rule's constant, labelled an assumption, when nothing was measured;
* gradient_accumulation -> ``Accumulate(k)``: gradient collectives and the optimizer
  once per k micro-batches;
* ddp_bucket_size -> ``RegroupBuckets(cap)``: the step's all-reduces packed under the
  advised cap, each pack timed by the job's latency/bandwidth curve (a fit of its own
  calls, or the sweep after the job); without a curve, no replay form.

The saving: per step of the window, the time the edits remove from the job's step
(the slowest rank's; the replayed baseline's less the edited one's), its median over
the window's steps taken off the job's median step over ALL counted steps outside the
window (steps.jsonl), U: ``saving = median(S_j(baseline) - S_j(edited)) / U``. Per
step, not the difference of two medians (one step can absorb the wait another sheds:
a median of three steps made a shorter collective look 4% slower) nor of two means (one
step whose collective took twice as long made a toy job's accumulation save 76%, the
share-based figure being 34%). Not ``1 - S(edited) / S(baseline)``: the
profiler lengthens torch operators (on a CPU, backward by up to 2x) but not a sleep, a
time-bounded loop or a transfer, so the profiled window's steps are not the job's steps
scaled; the time a change removes is mostly time the profiler did not inflate (a
straggler's extra work, an input wait, a collective), and the job's own step is what it
is removed from. Measured on the planted problems (benchmarks/whatif_accuracy.py), this
form was within 5 points where the ratio missed by 6-9 (a straggler, fp32 matmuls).
A straggler on CPUs is the exception: once its operations are its peers', what is left
of the step is the peers' work, which the profiler did lengthen, so the job's step after
the fix is the edited window's median step times the peers' CPU time per step over the
job's counted steps against the window's (``peer_inflation``), replayed without the time
the peers' threads waited for a core in the window beyond their usual
(``replay.without_run_queue``: hidden behind the wait for the straggler, exposed once
nobody waits). On the planted straggler (8 recordings with the fix applied) the time
removed taken off the job's step missed by -2.5 to -9.5 points, this form by -1.2 to -4.6;
over more recordings the form's few profiled steps missed by up to -8.5, and where
steps.jsonl timed the others' wait for the straggler over every counted step, that is
the estimate (``job_held``), the window's replay said beside it. So it is for a rank
slowed by CPU contention on CPUs, whose profiled steps are contended more than the job's
(the profiler's own work shares its CPU: ``contended_words``), bounded by the host's
cores.
Without step records U is the replayed baseline (the ratio form), and so when the
window's step is more than ``WINDOW_UNLIKE`` times the job's (or less than its inverse):
the job's speed changed between the window and the rest (one recording of tiny DDP
buckets ran 50-80 ms steps up to the window and 18-20 ms ones after it), and a time
removed from the window taken off the job's step came out as 100%.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, NamedTuple, Sequence

from pardiag.analysis import Analysis, Finding, Notice
from pardiag.analysis_blocks import WhatIf, WhatIfRow
from pardiag.analyzers import factors
from pardiag.analyzers import replay as rp
from pardiag.analyzers.gemm_shapes import InplaceAddRate
from pardiag.analyzers.levers import (
    CPU_BF16_SPEEDUP, FRESH_CAVEAT_HEAD, GRADIENT_ACCUMULATION_STEPS, PRECISION_SPEEDUP, SAVING_LOW, WORKERS_SHARE_SAID,
    rank_key, straggler_saving_us)
from pardiag.analyzers.steps import job_step_times_us
from pardiag.step_records import StepRecord, counted, signal

WINDOW_UNLIKE = 1.5
"""A window whose median step is more than this many times the job's median step (or less
than its inverse) is not like the rest of the job: savings are then shares of the window's
step (the time removed would otherwise be taken off a step it was never part of)."""


@dataclass(frozen=True)
class Factor:
    """A number an estimate used: measured (with what was timed, where) or assumed.
    ``source`` says what was timed; "measured" is the renderers' word (``measured``)."""

    name: str
    value: float
    unit: str
    source: str
    measured: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": round(self.value, 4), "unit": self.unit, "source": self.source,
                "measured": self.measured}


@dataclass(frozen=True)
class GemmSpeedup:
    """A lower precision's measured GEMM speed-up (factors/gemm.json)."""

    speedup: float
    source: str  # what was timed, where
    half: str = "bf16"  # the lower precision timed
    followers: factors.Followers | None = None  # elementwise operators on the matmuls' outputs (CPU traces)


@dataclass(frozen=True)
class Inputs:
    """What the estimates read besides the Analysis."""

    model: rp.Model | None
    step_records: Mapping[int, Sequence[StepRecord]]
    gemm: GemmSpeedup | None = None
    comm: factors.CommCurve | None = None  # the all-reduce curve measured for the run
    why: str | None = None  # why there is no model
    loader: factors.LoaderHandover | None = None  # a DataLoader worker's hand-over, measured for the run
    faults: factors.FaultCost | None = None  # a page fault of fresh memory, measured for the run
    add_rate: InplaceAddRate | None = None  # the job's own in-place adds (the lowest rank's trace)


@dataclass(frozen=True)
class Plan:
    """One finding's change as replay edits; ``cause``: the step signal (steps.jsonl)
    that times what the change removes on the ``ranks`` it names, on every step (a
    garbage-collection straggler: its ``gc`` pauses), when there is one."""

    edits: tuple[rp.Edit, ...]
    words: tuple[str, ...]
    factors: tuple[Factor, ...]
    cause: str | None = None
    ranks: tuple[int, ...] = ()


CAUSE_SIGNALS: dict[str, str] = {"garbage_collection": "gc", "gradient_accumulation": "backward"}
"""Levers whose cause a step signal times on every step, profiled or not (the straggler's
pauses: ``gc_us``; the gradient all-reduces that accumulation leaves out of k - 1 of k
micro-batches, which DDP waits for inside backward: ``bwd_us``). The window is a few
steps: what the change removes there is scaled to the cause's size over the job's
counted steps (``cause_scale``). comm_bound's all-reduces ran slower outside the window
than in it in some recordings (its steps 87.2 and 89.8 ms against 72.0 and 70.9 in the
window, backward with its wait 70.2 and 73.3 ms against 58.7 and 56.1): with the time
removed from the window taken off the job's step, its 6 recordings of 2026-12-06 missed
the saving measured with 4 micro-batches by +3.0, -4.3, -14.2, +7.8, +0.2 and -12.5
points; scaled by backward over the job against the window (the slowest rank's per
step), by +4.4, -1.8, -4.9, +4.7, +3.2 and +0.2 (the same removal as a share of the
window's step: +6.3, -2.4, -4.8, +7.7, +5.2, 0.0)."""

CAUSE_SCALE_MAX = 2.0
"""The most a window's removed time is scaled by a cause measured on every step (and the
least, its inverse): beyond it the window is not like the rest of the job."""


def cause_scale(records: Mapping[int, Sequence[StepRecord]], name: str,
                ranks: Sequence[int]) -> tuple[float, str] | None:
    """How much larger the cause is over the job's counted steps than in the profiled
    window, and how that was measured, from signal ``name`` per step (steps.jsonl): per step,
    the ``ranks``' largest value less the other ranks' median (what the straggler has
    that its peers do not; with every rank named, the slowest rank's value), its median
    over the counted steps against its median over the window's steps (``profiler``
    "active"). None when either is not measured or the window's is not positive. A garbage-collection straggler's profiled window was its
    3 steps 7-9, whose pauses (median 203.6 and 204.6 ms in two recordings) were
    shorter than over the job's counted steps (208.3 and 221.1 ms): the pauses grew as
    the job ran, and a saving taken off the job's step from the window alone fell 3.5
    and 7.9 points short of the one measured with the fix applied."""
    if not records or not ranks:
        return None
    by_rank = {r: {rec.step: rec for rec in recs} for r, recs in records.items()}
    peers = [r for r in by_rank if r not in ranks]

    def excess(step: int) -> float | None:
        mine = [v for r in ranks if (rec := by_rank.get(r, {}).get(step)) is not None
                and (v := rec.get(name)) is not None]
        theirs = [v for r in peers if (rec := by_rank[r].get(step)) is not None and (v := rec.get(name)) is not None]
        if not mine or (peers and not theirs):
            return None
        return max(mine) - (statistics.median(theirs) if theirs else 0.0)

    lead = by_rank.get(ranks[0], {})
    window = [v for st, rec in lead.items() if rec.profiler == "active" and (v := excess(st)) is not None]
    job = [v for st, rec in lead.items() if counted(rec) and (v := excess(st)) is not None]
    if not window or not job:
        return None
    w, j = statistics.median(window), statistics.median(job)
    if w <= 0 or j <= 0:
        return None
    scale = min(max(j / w, 1 / CAUSE_SCALE_MAX), CAUSE_SCALE_MAX)
    whose = (f"of rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} over "
             f"{'their' if len(ranks) > 1 else 'its'} peers'" if peers else "of the slowest rank per step")
    words = (f"steps.jsonl {signal(name).key} {whose}: median {j / 1e3:.1f} ms over {len(job)} counted "
             f"steps, {w / 1e3:.1f} ms over the window's {len(window)}")
    return scale, words


PEER_INFLATION_MIN = 0.5
"""The least the peers' CPU time per step over the job may be of the window's for a
straggler's projection (``peer_inflation``); a smaller ratio is not the profiler's."""


def _on_cpus(a: Analysis) -> bool:
    """Every rank of the run computes on a CPU (and it has ranks)."""
    return bool(a.ranks) and all(r.device_type == "cpu" for r in a.ranks)


def job_and_window(recs: Sequence[StepRecord], name: str) -> tuple[list[float], list[float]]:
    """A step signal's values over the job's counted steps, and over the profiled window's
    active steps (where a rank observed it)."""
    job = [v for rec in recs if counted(rec) and (v := rec.get(name)) is not None]
    window = [v for rec in recs if rec.profiler == "active" and (v := rec.get(name)) is not None]
    return job, window


class PeerInflation(NamedTuple):
    """``peer_inflation``'s answer."""

    ratio: float  # the peers' CPU time per step over the job against the window's (median over the peers)
    added_us: float  # the CPU time per step the profiler added to their work (the window's less the job's)
    source: str  # in words


def peer_inflation(a: Analysis, records: Mapping[int, Sequence[StepRecord]],
                   ranks: Sequence[int]) -> PeerInflation | None:
    """How much shorter the work of a straggler's peers is outside the profiled window
    than in it, for ranks on CPUs: per peer, its training thread's CPU time per step
    (steps.jsonl ``cpu_us``) as a median over the job's counted steps against one over the
    window's, and the median over the peers; with the words saying so. Once the
    straggler's operations are its peers', the job's step is what the peers do, and
    the profiler lengthens that work (their operators) but not what the fix removes
    (the straggler's extra time, the waiting): the 2-rank straggler job's peer burned
    3.7-4.6 ms of CPU per step outside the window and 4.5-6.0 ms in it (0.69-0.82x).
    Taking the time removed off the job's step instead leaves the window's difference
    from the job in the estimate: in one recording the straggler's window steps were
    46.6 ms against its 47.9 ms over the job, and the saving came out 9.5 points short of
    the one measured with the fix applied. ``added_us`` is the median over the peers of
    the window's CPU time per step less the job's (at least 0). The estimate takes the added
    time off the edited window's step, not the ratio to all of it: the waits and the
    collectives' transfers left in that step are not the profiler's. Over 33 recordings of
    slow_rank, page_faults and long_inputs (7 invocations on 2026-12-06) the window's
    projection with the ratio applied was high by a median of 3.6, 10.0 and 5.2 points
    against the saving measured with the fix, with the time taken off 2.7, 9.3 and 4.9.
    None off CPUs (a GPU's step is its kernels; the host's CPU time holds its
    spin-waits), or without the signal."""
    if not _on_cpus(a) or not ranks:
        return None
    ratios: list[tuple[int, float, float, float]] = []  # (rank, job / window, job, window)
    for r, recs in sorted(records.items()):
        if r in ranks:
            continue
        job, window = job_and_window(recs, "cpu")
        if job and window and statistics.median(window) > 0:
            j, w = statistics.median(job), statistics.median(window)
            ratios.append((r, j / w, j, w))
    if not ratios:
        return None
    ratio = min(statistics.median(x[1] for x in ratios), 1.0)
    if ratio < PEER_INFLATION_MIN:
        return None
    added = max(statistics.median(w - j for _, _, j, w in ratios), 0.0)
    shown = ", ".join(f"rank {r} {j / 1e3:.2f} ms over the job's counted steps, {w / 1e3:.2f} in the window"
                      for r, _, j, w in ratios[:4]) + (f", and {len(ratios) - 4} more" if len(ratios) > 4 else "")
    return PeerInflation(ratio, added, f"steps.jsonl cpu_us of the straggler's peers per step: {shown}")


PEERS_WORK = ("straggler", "input_imbalance")
"""Straggler levers whose fix leaves the job's step to the peers' work as it is: the
straggler's extra work is its own operators (a slow rank, larger batches), which the
edit sets to its peers'. (A contended rank's collectives and a collector's pauses are
re-timed otherwise.)"""


def job_held(a: Analysis, ranks: Sequence[int], step_us: float) -> tuple[float, str] | None:
    """The time the fix of a straggler removes from the job's step measured over the
    job's own counted steps (steps.jsonl): how much longer the others wait for it per
    step, bounded by its extra work and the step (`levers.straggler_saving_us`); with
    where from. The window's replay rests on a few profiled steps, whose work varies. On
    the 2-rank job whose rank 1 sleeps 40 ms per step (tests/scripts/sleepy_ddp.py), in 8
    pairs of recordings with and without the sleep (9.1-10.7 ms steps without), the
    replay alone missed the measured saving by -0.6 to +6.0 points (in 6 runs of its
    test, -8.5 to -0.9), this figure alone by -3.1 to +5.0, their mean by -1.0 to +4.0.
    Where rank 1 busy-loops 40 ms (the benchmark's slow_rank, 4 pairs) the replay missed
    by -3.5 to +0.7, this figure by -4.7 to -2.6, their mean by -4.7 to +0.7.

    Where it is timed, it is the estimate (the window's replay said beside it): the
    fixed jobs' ranks spend more of each step off their CPUs, reaching the all-reduces
    together, than the edited window gives them (page_faults' fixed ranks 2.3-5.1 ms per
    step, slow_rank's 3.5-5.0 of their 8; page_faults' edited windows 1.4-2.4 ms beyond
    the peers' CPU time, their all-reduces timed on the rank that arrived last), and
    the straggler's own time off its CPU over the job is the nearer measure of it. Over 33
    pairs of 7 invocations on 2026-12-06 (slow_rank, page_faults, long_inputs: 13, 10 and
    10 pairs) the median error against the saving measured with the fix was +2.7, +9.3 and
    +4.9 points for the window's replay, +3.0, +6.3 and +2.6 for the mean of the two (the
    rule before) and +1.2, +2.7 and +1.8 for this figure where it was timed (median
    |error| 2.5, 8.1 and 4.3 against 3.0, 8.7 and 3.4). None without the straggler's wait
    timed over steps.jsonl."""
    found = [s for s in a.stragglers if s.rank in ranks]
    if len(found) != 1 or step_us <= 0 or found[0].held_from != "steps.jsonl":
        return None
    s = found[0]
    removed = straggler_saving_us(s, step_us)
    if removed <= 0:
        return None
    held = s.wait_us
    return removed, (f"steps.jsonl: the others wait {held / 1e3:.1f} ms per step more than rank {s.rank}, "
                     f"whose extra work is {s.excess_us_per_step / 1e3:.1f} ms")


def contended_words(records: Mapping[int, Sequence[StepRecord]], ranks: Sequence[int]) -> str:
    """Why a CPU-contended rank's fix is the job's figure (``job_held``), not the window's
    replay: in the planted contention (another process spinning on rank 1's CPU, 2 ranks
    pinned to 2 cores) the profiler's own work shares the contended CPU too, and rank 1
    waited for it 38.5 and 43.7 ms per profiled step against 28.2 and 30.0 over the job's
    steps; the fixed jobs' ranks also spent 4.7-6.6 ms per step off their CPUs, reaching
    the all-reduce together, which no CPU-time floor holds (the replay's figure, 31.9 ms
    per step once raised to the floor, against 36.3 measured). Over 12 pairs of 6
    invocations on 2026-12-06 (README, "Estimates") the window's replay missed the saving
    measured with the fix by a median of +6.4 points (5 of 12 within 5), this figure by
    -1.1 (median |error| 3.6, 7 of 12 within 5). The rank's wait for a CPU in the window
    against the job's, where steps.jsonl has it."""
    said = []
    for r in ranks:
        job, window = job_and_window(records.get(r) or [], "run_queue")
        if job and window and (w := statistics.median(window)) > (j := statistics.median(job)):
            said.append(f"rank {r} waited for a CPU {w / 1e3:.1f} ms per profiled step, "
                        f"{j / 1e3:.1f} over the job's steps")
    return ("the profiled steps were contended more than the job's: " + "; ".join(said) + " (steps.jsonl runq_us)"
            if said else "the others' wait for the contended rank, timed over every counted step")


def run_queue_excess(records: Mapping[int, Sequence[StepRecord]]) -> dict[int, dict[int, float]]:
    """Per rank and profiled step, the time its training thread waited for a core
    (steps.jsonl ``runq_us``) beyond its median over the job's counted steps: the
    window's contention (``replay.without_run_queue``), not the job's. Ranks without the
    signal are left out."""
    out: dict[int, dict[int, float]] = {}
    for r, recs in records.items():
        usual = [v for rec in recs if counted(rec) and (v := rec.get("run_queue")) is not None]
        if not usual:
            continue
        u = statistics.median(usual)
        window = {rec.step: v - u for rec in recs
                  if rec.profiler == "active" and (v := rec.get("run_queue")) is not None and v > u}
        if window:
            out[r] = window
    return out

# ------------------------------------------------------------------------------ factors
def job_steps(result: rp.ReplayResult) -> dict[int, float]:
    """The job's step per window step: the slowest rank's."""
    steps = sorted({s for st in result.replayed_steps.values() for s in st})
    return {s: max(st.get(s, 0.0) for st in result.replayed_steps.values()) for s in steps}


def run_factors(run: Any) -> tuple[GemmSpeedup | None, factors.CommCurve | None]:
    """The factors `pardiag run` measured after the job (factors/ in the run directory:
    analyzers/factors.py), None for what was not measured."""
    if run is None:
        return None, None
    gemm = None
    g = factors.gemm_factor(run.root)
    if g is not None and g.speedup > 0:
        half = {"bfloat16": "bf16", "float16": "fp16"}.get(g.half_dtype, g.half_dtype)
        gemm = GemmSpeedup(g.speedup, g.source.removeprefix("measured: "), half,
                           g.followers if g.device == "cpu" else None)
    return gemm, factors.comm_curve(run.root)


# ------------------------------------------------------------------------------ plans
STRAGGLER_LEVERS = ("straggler", "host_contention", "garbage_collection", "input_imbalance")
"""Levers whose change is the ``Straggler`` edit: a rank's planted or found cause removed."""


def plan(f: Finding, a: Analysis, inputs: Inputs) -> Plan | None:
    """The edits that stand for finding ``f``'s change; None when the lever has no replay
    form (or lacks what it needs)."""
    lever = f.lever
    if lever in STRAGGLER_LEVERS and f.ranks \
            and set(f.ranks) <= {s.rank for s in a.stragglers}:
        # a straggler of the whole run (not one that started after the window: the window cannot show it)
        # CPU contention slows all of the rank's work: every phase, not only the late ones
        every = lever == "host_contention"
        edits: tuple[rp.Edit, ...] = tuple(rp.Straggler(r, every_phase=every) for r in f.ranks)
        words = tuple(f"rank {r}'s operations at its peers' median" + (", in every phase" if every else "")
                      for r in f.ranks)
        facs: tuple[Factor, ...] = ()
        c = inputs.comm
        if every and c is not None and _on_cpus(a):
            # on CPUs the collectives' workers share the contended CPU too
            edits += (rp.UncontendedCollectives(tuple(f.ranks), c.alpha_us, c.beta_us_per_byte),)
            words += (f"their all-reduces at most the curve's time ({c.alpha_us:.0f} us + "
                      f"{c.beta_us_per_byte * 2**20:.0f} us/MB), their workers' pick-up and their loop's wake-up after a collective at most their peers' median",)
            facs = (Factor("all-reduce latency", c.alpha_us, "us", c.source, True),
                    Factor("all-reduce time per MB", c.beta_us_per_byte * 2**20, "us/MB", c.source, True))
        return Plan(edits, words, facs, CAUSE_SIGNALS.get(lever), tuple(f.ranks))
    if lever == "dataloader" and f.est_saving_pct is not None:
        w = _advised(f, "num_workers")
        if isinstance(w, int) and w > 0:
            h = inputs.loader
            fac = (Factor("batch hand-over from a worker", h.us, "us", h.source.removeprefix("measured: "), True)
                   if h is not None else
                   Factor("batch hand-over from a worker", 0.0, "us", "assumed: not measured after the job", False))
            return Plan((rp.RemoveInputWait(workers=w, handover_us=h.us if h is not None else 0.0),),
                        (f"input loaded by {w} workers in parallel with the rest of the step"
                         + (f", each batch handed over in {h.us / 1e3:.2f} ms" if h is not None else ""),), (fac,))
        return Plan((rp.RemoveInputWait(),), ("every input fetch as quick as the rank's quickest",), ())
    if lever == "mixed_precision":
        on_gpu = any(r.device_type == "cuda" for r in a.ranks)
        if inputs.gemm is not None:
            g = inputs.gemm
            fac = Factor(f"{g.half} GEMM speed-up", g.speedup, "x", g.source, True)
            fol = g.followers
            if fol is None or on_gpu:
                return Plan((rp.ScaleGemm(g.speedup),), (f"matrix multiplies {g.speedup:.2g}x faster",), (fac,))
            # the activations the matmuls feed then run in the lower precision too
            return Plan((rp.ScaleGemm(g.speedup, follower_speedup=fol.speedup),),
                        (f"matrix multiplies {g.speedup:.2g}x faster",
                         f"the elementwise operators on their outputs ({fol.followers_us / 1e3:.1f} ms of the window) "
                         f"{fol.byte_ratio:g}x faster on {1 / fol.byte_ratio:.0%} of the bytes"),
                        (fac, Factor(f"{g.half} elementwise speed-up", fol.byte_ratio, "x",
                                     fol.source, False)))
        if on_gpu:
            f32, t32 = PRECISION_SPEEDUP["fp32"], PRECISION_SPEEDUP["tf32"]
            return Plan((rp.ScaleGemm(f32, ("fp32",)), rp.ScaleGemm(t32, ("tf32", "unknown"))),
                        (f"fp32 GEMM kernels {f32:g}x, TF32 {t32:g}x faster",),
                        (Factor("fp32 GEMM speed-up", f32, "x", "assumed: half the bf16/fp32 peak ratio", False),
                         Factor("TF32 GEMM speed-up", t32, "x", "assumed: half the bf16/TF32 peak ratio", False)))
        return Plan((rp.ScaleGemm(CPU_BF16_SPEEDUP),), (f"matrix multiplies {CPU_BF16_SPEEDUP:g}x faster",),
                    (Factor("GEMM speed-up in bf16", CPU_BF16_SPEEDUP, "x",
                            "assumed: nothing was measured after the job", False),))
    if lever == "gradient_accumulation":
        k = GRADIENT_ACCUMULATION_STEPS
        words = (f"gradient all-reduces and the optimizer once per {k} micro-batches",)
        mem = accumulating_backward(a, inputs, k)
        # the all-reduces it leaves out, timed on every rank: the slowest rank's backward per step
        all_ranks = tuple(sorted(inputs.model.origin)) if inputs.model is not None else ()
        if mem is None:
            return Plan((rp.Accumulate(k),), words, (), CAUSE_SIGNALS[lever], all_ranks)
        edit, said, facs = mem
        return Plan((edit,), words + (said,), facs, CAUSE_SIGNALS[lever], all_ranks)
    if lever == "ddp_bucket_size" and inputs.comm is not None:
        cap = _advised_cap(f)
        ddp = (a.run.fw.ddp or [{}])[0] or {}
        now = ddp.get("bucket_cap_mb") or 25.0
        if cap is None or cap <= now:
            return None  # a smaller cap splits a bucket: when its parts are ready is not in the trace
        c = inputs.comm
        fac = Factor("all-reduce latency", c.alpha_us, "us", c.source, True)
        fac2 = Factor("all-reduce time per MB", c.beta_us_per_byte * 2**20, "us/MB", c.source, True)
        return Plan((rp.RegroupBuckets(int(cap * 2**20), c.alpha_us, c.beta_us_per_byte),),
                    (f"each step's all-reduces packed under bucket_cap_mb={cap:.3g}, each pack "
                     f"{c.alpha_us:.0f} us + {c.beta_us_per_byte * 2**20:.0f} us/MB",), (fac, fac2))
    return None


def accumulating_backward(a: Analysis, inputs: Inputs,
                          k: int) -> tuple[rp.Accumulate, str, tuple[Factor, ...]] | None:
    """How backward changes in the micro-batches that accumulate, on CPU ranks whose
    gradients were taken afresh in every step: the Accumulate edit (``k`` micro-batches)
    with, per rank, the time its backward spent faulting that memory in (which they do
    not) and the time adding each new gradient into the one already there costs (which the
    step did not have); in words; the factors. None where no rank shows it or the add cannot be timed.

    A rank counts when, in the window, no AccumulateGrad added into a gradient already
    there (each was None: freed by ``zero_grad(set_to_none=True)``; ``Model.grad_adds``).
    Its add: the trainable parameters' bytes (meta.json) at the rate of the job's own
    in-place adds of same-shaped tensors of 1 MiB or more in the window (SGD's
    ``param.add_``, Adam's ``exp_avg.lerp_``; ``gemm_shapes.inplace_add_rate``); without
    such calls neither term is counted. Its faults: its backward's per step
    (``summary.backward_faults``), up to the pages of the trainable parameters, at the cost
    measured after the job (factors/faults.json; ``summary.FAULT_US``, labelled an
    assumption, when not measured).

    The comm_bound scenario (plain SGD): its problem jobs faulted 8,160 times in every
    step's backward (two 2048x2048 gradients freed every step, given back to the kernel
    by the C library's allocator), and every one of its 15 accumulating fixed jobs 8,160
    times per 4 micro-batches; there each accumulating micro-batch's AccumulateGrad added
    the 2048x2048 gradients in 2.3-2.5 ms each, as the problem job's optimizer added them
    into the parameters (2.42-2.51 ms). Over 15 pairs of recordings the estimate missed by
    a median of -5.3 points with neither term (|error| 5.3, 6 within 5 points), +1.5 with
    the faults alone (3.8, 12) and -3.1 with both (3.9, 11): the faults alone look better
    and leave out a cost the fixed job's trace shows in every accumulating micro-batch."""
    from pardiag.analyzers.summary import FAULT_US, PAGE_BYTES, backward_faults

    model, rate = inputs.model, inputs.add_rate
    if model is None or rate is None or not _on_cpus(a):
        return None
    fw = getattr(a.run, "fw", None)
    trainable = ((fw.parameters if fw is not None else None) or {}).get("trainable_bytes")
    if not isinstance(trainable, (int, float)) or trainable <= 0:
        return None
    add = trainable * rate.us_per_byte
    cost = inputs.faults
    us_each = cost.us if cost is not None else FAULT_US
    adds: list[tuple[int, float]] = []
    faults: list[tuple[int, float]] = []
    said: list[str] = []
    for r in sorted(model.origin):
        calls, added = model.grad_adds.get(r, (0, 0))
        if not calls or added:
            continue
        adds.append((r, add))
        f = backward_faults(inputs.step_records.get(r, ()))
        if f is not None:
            pages = min(f, trainable / PAGE_BYTES)
            faults.append((r, pages * us_each))
            said.append(f"rank {r} {pages:,.0f}")
    if not adds:
        return None
    words = (f"in the micro-batches that accumulate, backward adds each gradient into the one already there: "
             f"{trainable / 2**20:.0f} MB of trainable parameters at {rate.us_per_byte * 2**20:.0f} us/MB "
             f"({add / 1e3:.1f} ms; the job's own in-place adds), where every gradient was taken afresh in the window")
    facs: tuple[Factor, ...] = (Factor("in-place add", rate.us_per_byte * 2**20, "us/MB", rate.source, True),)
    if faults:
        words += (f", and faults their memory in no more: {', '.join(said)} page faults per step (steps.jsonl, "
                  "backward's, the larger of its median over the profiled steps and over the job's, up to the "
                  f"parameters' pages) at {us_each:.2f} us each, paid once per optimizer step")
        facs += ((Factor("page fault of fresh memory", cost.us, "us", cost.source.removeprefix("measured: "), True)
                  if cost is not None else
                  Factor("page fault of fresh memory", FAULT_US, "us", "assumed: not measured after the job", False)),)
    return rp.Accumulate(k, refault_us=tuple(faults), add_us=tuple(adds)), words, facs


def _advised(f: Finding, key: str) -> Any:
    """The value the finding's action sets for keyword ``key`` (None when it sets none)."""
    for s in (f.action or {}).get("settings") or []:
        if isinstance(s, dict) and key in (s.get("kwargs") or {}):
            return s["kwargs"][key]
    return None


def _advised_cap(f: Finding) -> float | None:
    v = _advised(f, "bucket_cap_mb")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


# ------------------------------------------------------------------------------ apply
def _share_estimate(f: Finding, refused: str | None) -> dict[str, Any]:
    return {"method": "share", "saving_pct": f.est_saving_pct, "share_saving_pct": f.est_saving_pct,
            "replay_error_pct": None, "refused": refused, "edits": [], "factors": []}


def apply(a: Analysis, inputs: Inputs) -> Analysis:
    """The Analysis with replay-based estimates on the findings that have a replay form,
    the what-if from one replay of all of them, and the critical path."""
    a = _busy_loader(_refuted(a, inputs), inputs)
    model = inputs.model
    if model is None or not model.origin:
        return share_based(a, inputs.why or "no replay model of the window")
    if model.sharing is None and (sharing := cpu_sharing(a, model)) is not None:
        model = replace(model, sharing=sharing, base_load=None)
    base = rp.replay(model)
    off = base.refusal()
    path = base.median_path()
    crit = critical_path_dict(path, base) if path is not None and off is None else None
    refused = off or unanchored(model)  # the measured window's path holds even then
    if refused is not None:
        return replace(share_based(a, refused), critical_path=crit)
    base_steps = job_steps(base)
    quiet: list[rp.Model] = []  # the model without the window's excess run-queue time, once needed
    b = statistics.median(base_steps.values()) if base_steps else 0.0
    job_step = a.job_summary.step_p50_us or 0.0
    counted_steps = job_step_times_us(inputs.step_records).values_us if inputs.step_records else []
    u = statistics.median(counted_steps) if counted_steps else b
    own_step = bool(counted_steps)  # the saving taken off the job's own step
    if counted_steps and not 1 / WINDOW_UNLIKE <= b / u <= WINDOW_UNLIKE:
        basis = (f"the profiled window's median step ({b / 1e3:.1f} ms) is {b / u:.2g}x the job's median step over "
                 f"{len(counted_steps)} steps outside it ({u / 1e3:.1f} ms): the window is not like the rest of the "
                 "job (its speed changed), so the saving is a share of the window's step, as it was there")
        u, own_step = b, False
    elif counted_steps:
        basis = (f"the time removed per step from the replayed window (median step {b / 1e3:.1f} ms) taken off the job's "
                 f"median step over {len(counted_steps)} steps outside the window ({u / 1e3:.1f} ms)")
    else:
        basis = "saving relative to the replayed window's median step (no step records)"
    err = round(100 * base.error, 1)
    cpu = cpu_floor_inputs(a, inputs.step_records) if counted_steps else None
    load = worker_load(a, inputs.step_records, inputs.loader) if counted_steps else None
    job_u = statistics.median(counted_steps) if counted_steps else u  # the job's own step, unprofiled
    floors: list[str] = []
    shared: list[tuple[float, str]] = []  # the step the workers' share of the cores gave, in words, when it lengthened it

    def saving(edits: Sequence[rp.Edit], scale: float = 1.0, extra_us: float = 0.0,
               profiler_us: float | None = None) -> tuple[float, float, float]:
        """(saving, the edited window's step: the median one less the time removed, the
        time removed from the window). ``scale``: of the time removed (a cause measured
        larger or smaller over the job than in the window); ``extra_us``: added to it
        (the scaling of each finding, for all of them at once). ``profiler_us``: what
        remains is the peers' work as the profiler inflated it (``peer_inflation``): the
        job's step becomes the edited window's median step less the CPU time per step the
        profiler added to it (``profiler_us``)."""
        edited = job_steps(rp.replay(model, edits))
        in_window = statistics.median(base_steps[k] - edited.get(k, base_steps[k]) for k in base_steps)
        removed = in_window * scale + extra_us
        if profiler_us is not None and own_step and edited:
            # the edited window's step itself, not a difference of two replays in which the
            # window's preemptions cancel: without them (``replay.without_run_queue``)
            if not quiet:
                quiet.append(rp.without_run_queue(model, run_queue_excess(inputs.step_records)))
            left = statistics.median(job_steps(rp.replay(quiet[0], edits)).values())
            removed = u - (left - profiler_us) + extra_us
            in_window = b - left
        if load is not None and starts_workers(edits):
            alone = all(isinstance(e, rp.RemoveInputWait) for e in edits)
            if own_step:
                slowed = load.slowed(u - removed, alone=alone)
                if slowed is not None:
                    shared.append(slowed)
                    removed = u - slowed[0]
            elif (slowed := load.slowed(job_u * (1 - removed / u), alone=alone)) is not None:
                # a share of the window's step: the job's own step after it, lengthened as
                # the workers share the cores, gives the share back
                shared.append((slowed[0], slowed[1] + f" (the job's step of {job_u / 1e3:.1f} ms)"))
                removed = u * (1 - slowed[0] / job_u)
        floor = cpu.floor_us(edits, load) if cpu is not None else None
        straggler = any(isinstance(e, rp.Straggler) for e in edits)
        regrouped = any(isinstance(e, rp.RegroupBuckets) for e in edits)
        if cpu is not None and floor is not None and own_step and u - removed < floor:
            floors.append(cpu.words(floor, u - removed, straggler, cpu.kept_busy(edits), regrouped))
            removed = u - floor
        elif cpu is not None and floor is not None and not own_step and removed / u > 1 - floor / job_u:
            # a share of the window's step, but no larger than the job's own step can shed
            floors.append(cpu.words(floor, job_u * (1 - removed / u), straggler, cpu.kept_busy(edits), regrouped)
                          + f" (the job's step of {job_u / 1e3:.1f} ms)")
            removed = max(0.0, u * (1 - floor / job_u))
        # (the window's projection: the time removed there, before the scaling)
        projected = b - in_window if profiler_us is not None and own_step else b - (removed - extra_us) / scale
        return (min(max(0.0, removed / u), 1.0) if u > 0 else 0.0), projected, in_window

    findings: list[Finding] = []
    notes: list[Notice] = []  # why a finding was dropped
    dropped: set[str] = set()
    all_edits: list[rp.Edit] = []
    all_extra = 0.0  # what the cause scaling of each finding adds to the time removed
    profiler_us: float | None = None  # a straggler's: all of the edits at once leave the peers' work too
    rows: list[WhatIfRow] = []
    for f in a.findings:
        p = plan(f, a, inputs)
        if p is None:
            findings.append(f if f.est_saving_pct is None else replace(f, estimate=_share_estimate(f, None)))
            continue
        floors.clear()
        shared.clear()
        scaled = cause_scale(inputs.step_records, p.cause, p.ranks) if p.cause and own_step else None
        scale = scaled[0] if scaled else 1.0
        inflation = peer_inflation(a, inputs.step_records, f.ranks) if f.lever in PEERS_WORK and own_step else None
        try:
            s, e, in_window = saving(p.edits, scale, profiler_us=inflation.added_us if inflation else None)
        except ValueError as exc:  # this finding's edits cannot be replayed: it alone stays share-based
            findings.append(replace(f, estimate=_share_estimate(f, f"its edits could not be replayed: {exc}")))
            continue
        if inflation is not None:
            profiler_us = inflation.added_us
        # CPU contention on CPUs: its wait too is timed over the job's steps (``contended_words``)
        contended = f.lever == "host_contention" and own_step and _on_cpus(a)
        held = job_held(a, f.ranks, u) if (inflation is not None and not floors) or contended else None
        if held is not None:
            # the job's own step less the others' wait (every counted step), not the
            # window's replay (``job_held``)
            removed_us = held[0]
            if contended:
                floors.clear()  # what held up the window's replay; the job's figure is bounded by the cores instead
                if cpu is not None and (floor := cpu.floor_us(p.edits, load)) is not None and u - removed_us < floor:
                    floors.append(cpu.words(floor, u - removed_us, True, cpu.kept_busy(p.edits)))
                    removed_us = u - floor
            all_extra += removed_us - s * u
            window_s, s = s, removed_us / u
        pct = round(100 * s, 1)
        fac = list(p.factors) + (list(load.factors()) if shared and load is not None else []) + (
            [cpu.factor()] if floors and cpu is not None else [])
        if scaled:
            fac.append(Factor("the cause over the job's steps against the window's", scale, "x", scaled[1], True))
            all_extra += in_window * (scale - 1)
        if inflation is not None:
            fac.append(Factor("the peers' CPU time per step the profiler added (the window's less the job's)",
                              inflation.added_us / 1e3, "ms", inflation.source, True))
        if held is not None:
            fac.append(Factor("the others' wait per step over the job", held[0] / 1e3, "ms", held[1], True))
        est = {"method": "replay", "saving_pct": pct, "share_saving_pct": f.est_saving_pct,
               "replay_error_pct": err, "refused": None,
               "edits": list(p.words) + ([
                   f"the job's step after it: the edited window's median step ({e / 1e3:.1f} ms) less the CPU time "
                   f"per step the profiler added to the peers' work ({inflation.added_us / 1e3:.2f} ms, their "
                   f"{inflation.ratio:.2f}x: what is left is their work, which the profiler lengthened, and the waits "
                   "and transfers, which it does not)"] if inflation else [basis]) + ([
                   f"that is {100 * window_s:.1f}% over the window's {len(base_steps)} profiled steps; over the job's "
                   f"{len(counted_steps)} counted steps, its step ({u / 1e3:.1f} ms) less the others' wait for "
                   f"{'rank' if len(f.ranks) == 1 else 'ranks'} {', '.join(map(str, f.ranks))} ({held[0] / 1e3:.1f} ms) "
                   f"is {100 * held[0] / u:.1f}% shorter: the estimate is the job's ("
                   + (contended_words(inputs.step_records, f.ranks) if contended else
                      "the window's replay leaves out the time the ranks spend off their CPUs once they reach the "
                      "all-reduces together") + ")"] if held else []) + [w for _, w in shared[:1]] + floors[:1] + (
                   [f"the time it removes from the window ({in_window / 1e3:.1f} ms per step) scaled by {scale:.3g}: "
                    f"{scaled[1]}"] if scaled else []),
               "factors": [x.to_dict() for x in fac],
               "window_step_us": round(b, 1), "projected_window_step_us": round(e, 1),
               "job_step_us": round(u, 1),
               "bound": floors[0] if floors else (shared[0][1] if shared else None)}  # what held the saving down (the host's cores), in words
        if f.lever == "dataloader" and shared and s < SAVING_LOW:
            step, said = shared[0]
            why = said.split(": ", 1)[-1]
            notes.append(Notice("info", f"more DataLoader workers not advised: with them a step would take "
                                        f"{step / 1e3:.1f} ms against {job_u / 1e3:.1f} now ({why}): the "
                                        "loading would move to processes on the same cores"))
            dropped.add(f.lever)
            continue
        sev = "low" if s < SAVING_LOW else f.severity
        if any(isinstance(x, rp.Accumulate) and x.refault_us for x in p.edits):  # the caveat is counted now
            f = replace(f, evidence=[x for x in f.evidence if not x.startswith(FRESH_CAVEAT_HEAD)])
        if load is not None and starts_workers(p.edits):
            f = replace(f, evidence=[x for x in f.evidence if WORKERS_SHARE_SAID not in x])  # counted now too
        findings.append(replace(f, est_saving_pct=pct, severity=sev, estimate=est))
        all_edits.extend(p.edits)
        if job_step > 0:
            rows.append(WhatIfRow(lever=f.lever, title=f.title, step_us=job_step * (1 - s), saving_pct=pct))
    findings.sort(key=rank_key)
    what = a.what_if
    together: float | None = None
    if all_edits and job_step > 0:
        try:
            together, _, _ = saving(all_edits, extra_us=all_extra, profiler_us=profiler_us)
        except ValueError:  # every edit alone replays, but not all at once: no replayed total
            together = None
    if together is not None:
        replayed = {x.lever for x in rows}
        share_rows = [r for r in (what.findings if what else []) if r.lever not in replayed | dropped]
        what = WhatIf(step_us=job_step, findings=rows + share_rows, all_step_us=job_step * (1 - together),
                      all_saving_pct=round(100 * together, 1),
                      assumption="replayed: the window re-timed with every finding's change at once "
                                 "(not a product of savings)" + (
                                     "; findings without a replay form left out of the total" if share_rows else ""),
                      method="replay", replay_error_pct=err, refused=None)
    elif what is not None:
        what = replace(what, method="share", replay_error_pct=err, refused=None,
                       findings=[r for r in what.findings if r.lever not in dropped])
    return replace(a, findings=findings, what_if=what, critical_path=crit, notices=list(a.notices) + notes)


def _refuted(a: Analysis, inputs: Inputs) -> Analysis:
    """The Analysis without the findings a measured factor refutes: mixed precision where
    the lower precision's matrix multiplies, timed at the job's own shapes after the job,
    were no faster (a CPU without bf16 units ran them at 0.11x: its job's steps took
    1,176 ms in bf16 against 96 in fp32), attention counted with them (the bundled example
    on a CPU with bf16 units: its matrix multiplies 2.2-4.9x faster in bf16, its
    flash-attention backward 6.7x slower, 0.70x together; the job ran 0-5% slower in bf16,
    where the matrix multiplies alone had it estimated 17.5% faster). A notice says why."""
    g = inputs.gemm
    if g is None or g.speedup > 1.0 or not any(f.lever == "mixed_precision" for f in a.findings):
        return a
    note = Notice("info", f"mixed precision not advised: {g.half} matrix multiplies (and attention, where the job "
                          f"has it) ran {g.speedup:.2g}x as fast as "
                          f"fp32 at the job's shapes ({g.source})")
    return _drop(a, "mixed_precision", note)


def _drop(a: Analysis, lever: str, note: Notice) -> Analysis:
    """The Analysis without ``lever``'s findings (and their what-if rows), with ``note``."""
    what = a.what_if
    if what is not None:
        what = replace(what, findings=[r for r in what.findings if r.lever != lever])
    return replace(a, findings=[f for f in a.findings if f.lever != lever], what_if=what,
                   notices=list(a.notices) + [note])


BUSY_CORES = 0.8
"""The share of a host's cores its ranks' processes keep busy per step (steps.jsonl
``pcpu_us`` summed over its ranks, over cores times the job's median step) from which
more DataLoader workers are not advised on CPUs (the loading moves to worker processes
that find no idle core), and regrouped DDP buckets are taken to leave the cores as busy
as they were (`CpuFloor.kept_busy`). The fp32 scenario's processes kept 2 cores 90% busy (39 ms of CPU
per rank per 40.6-43.3 ms step) and 2 workers per rank, as advised, made its steps 48.8
and 48.9 ms (13-20% slower): its training threads waited 5.5 ms per step for a core
instead of 0.2-0.3, and 4.0-5.2 ms for each batch instead of the 2.6 ms it took to load.
The slow-loader scenario's kept them 9.5% busy, and 9-15 workers saved 83-89%."""


def _busy_loader(a: Analysis, inputs: Inputs) -> Analysis:
    """The Analysis without a DataLoader finding where its ranks keep their host's cores
    ``BUSY_CORES`` busy or more (CPUs only); a notice says why."""
    if not any(f.lever == "dataloader" for f in a.findings) or not inputs.step_records:
        return a
    cpu = cpu_floor_inputs(a, inputs.step_records)
    if cpu is None or cpu.step_us <= 0:
        return a
    step = cpu.step_us
    h, ranks, cores = cpu.busiest()
    busy = cpu.busy_share(h)
    if busy < BUSY_CORES:
        return a
    per = ", ".join(f"rank {r} {cpu.cpu_us[r] / 1e3:.1f} ms" for r in ranks)
    note = Notice("info", f"more DataLoader workers not advised: the ranks' processes keep host {h}'s {cores} cores "
                          f"{100 * busy:.0f}% busy ({per} of CPU per {step / 1e3:.1f} ms step); the loading would move "
                          "to worker processes with no idle core to run on")
    return _drop(a, "dataloader", note)


@dataclass(frozen=True)
class CpuFloor:
    """A job on CPUs cannot step faster than its host's cores do its ranks' work: per
    host, the CPU time all its ranks' processes burn per step (every thread: the
    training thread and the collectives' workers; steps.jsonl ``pcpu_us``, median over
    the counted steps) divided by the host's cores is a floor under the edited step.
    The replay re-times each operation as measured, so once an edit makes ranks that
    took turns on the cores work at the same time (a straggler that slept while the
    others computed, then computes with them) it would have them share nothing: on
    2 cores the sleeping straggler's test job was projected at 11.7 ms per step and
    ran at 16.0. Only for edits whose CPU time is measured: a straggler's excess CPU
    per step over its peers' median leaves with it; DDP's buckets regrouped are taken
    to take none with them, as measured in one recording (the tiny-bucket job's
    processes burned 25.3 and 25.7 ms of CPU per 27.5 ms step, the same job with 4x
    fewer all-reduces 25.3 and 27.0, on 2 cores; its step did not get shorter, where
    the profiled window, whose all-reduces ran 3x the sweep's time, projected 28%), though
    more often they take some (below); nor do DataLoader workers: the loading moves to processes on the same cores (on
    2 busy cores 2 workers per rank left the contended job at 36.0 ms per step against
    35.8 and 39.7 with the problem, estimated 16.5 and 15.0% without this floor).
    On GPUs the host's CPU time holds spin-waits that leave with the waiting, so no
    floor there.

    Where the ranks already keep a host's cores ``BUSY_CORES`` busy or more, regrouped
    buckets leave them as busy as they were (`kept_busy`): the floor is the CPU time over
    the cores times that share, the job's own step. The tiny-bucket job kept 2 cores
    87.8-90.8% busy per step (median), and with its buckets regrouped as advised 87.5%, its
    step 41.2-42.5 ms against 40.9-45.1 (2.4% saved); the floor at full cores had
    projected 34.7 ms (15.2 and 11.7% estimated).

    Fewer all-reduces do burn less CPU more often than not: gloo's worker threads copy and
    reduce on the CPU. In 14 later pairs of the tiny-bucket scenario (25 buckets of 0.25 MB
    per step regrouped under the advised 1 MB cap; 2 ranks, 2 cores) each rank's threads
    other than the training thread (``pcpu_us`` less ``cpu_us``) burned 8.3-22.5 ms per step
    with the problem and 4.2-11.2 with the fix, the training threads as much as before; and
    the fixed jobs kept their cores 73-93% busy, not 100%. Against the savings measured
    there with the fix applied, these rules missed by -1.0 points (median; mean |error|
    8.5), with 0.0% for the 2 pairs at 84-90% busy, which measured 7.4 and 38.0% (the
    latter's fixed job re-recorded after the host's speed moved: the first recording's
    steps 33.9 and 34.5 ms per rank, the kept one's 22.8 and 25.2);
    the floor at full cores for every pair, -0.1 (7.8); that with the other threads' CPU
    taken out in the share of the all-reduces' curve time the packs leave out, +11.5
    (13.4); and with the cores then kept as busy as with the problem, -5.1 (10.1). The
    rules were kept: the 14 pairs do not tell them from the floor alone, and earlier pairs
    at 80% busy or more measured -5.6 and -0.4%, and -12.0 to +14.0 (median +1.5) in 6."""

    cpu_us: Mapping[int, float]  # rank -> its process's CPU time per step
    hosts: Mapping[str, tuple[tuple[int, ...], int]]  # host -> (its ranks, its cores)
    step_us: float = 0.0  # the job's median counted step (0: not known)

    def busy_share(self, host: str) -> float:
        """The share of the host's cores its ranks' processes keep busy per step."""
        ranks, cores = self.hosts[host]
        return sum(self.cpu_us[r] for r in ranks) / (cores * self.step_us) if self.step_us > 0 else 0.0

    def kept_busy(self, edits: Sequence[rp.Edit], host: str | None = None) -> float | None:
        """The host's busy share (by default the busiest host's) when the edits are
        regrouped buckets alone and its cores are ``BUSY_CORES`` busy: they stay so."""
        if not edits or not all(isinstance(e, rp.RegroupBuckets) for e in edits) or self.step_us <= 0:
            return None
        b = self.busy_share(self.busiest()[0] if host is None else host)
        return b if b >= BUSY_CORES else None

    def floor_us(self, edits: Sequence[rp.Edit], load: WorkerLoad | None = None) -> float | None:
        """The floor under the edited step; with ``load``, DataLoader workers the edits
        start add what they burn beyond the loop's loading (already in its process's
        CPU time) to their rank's."""
        if not edits or not all(isinstance(e, (rp.Straggler, rp.RegroupBuckets, rp.UncontendedCollectives,
                                               rp.RemoveInputWait)) for e in edits):
            return None
        added = ({r: load.added_us * load.batches.get(r, 0.0) for r in self.cpu_us}
                 if load is not None and starts_workers(edits) else {})
        gone: dict[int, float] = {}
        for e in edits:
            if not isinstance(e, rp.Straggler):
                continue
            peers = [v for r, v in self.cpu_us.items() if r != e.rank]
            if e.rank in self.cpu_us and peers:
                gone[e.rank] = max(self.cpu_us[e.rank] - statistics.median(peers), 0.0)
        return max((sum(self.cpu_us[r] - gone.get(r, 0.0) + added.get(r, 0.0) for r in ranks)
                    / (cores * (self.kept_busy(edits, h) or 1.0))
                    for h, (ranks, cores) in self.hosts.items()), default=None)

    def busiest(self) -> tuple[str, tuple[int, ...], int]:
        h = max(self.hosts, key=lambda k: sum(self.cpu_us[r] for r in self.hosts[k][0]) / self.hosts[k][1])
        return h, self.hosts[h][0], self.hosts[h][1]

    def words(self, floor: float, projected: float, straggler: bool = True,
              kept: float | None = None, regrouped: bool = False) -> str:
        h, ranks, cores = self.busiest()
        if kept is not None:
            return (f"raised from {projected / 1e3:.1f} to {floor / 1e3:.1f} ms per step: the processes of ranks "
                    f"{', '.join(map(str, ranks))} keep host {h}'s {cores} cores {100 * kept:.0f}% busy "
                    "(steps.jsonl, their CPU time per step), and regrouped buckets are taken to leave them as busy: "
                    "the step as long (fewer all-reduces burn less CPU, but where the cores were this busy the "
                    "steps have been little shorter for it)")
        out = ("a straggler's excess over its peers taken out" if straggler else
               "the CPU that fewer all-reduces save taken as balancing the share of the cores the job leaves idle"
               if regrouped else "none of it removed by the change")
        return (f"raised from {projected / 1e3:.1f} to {floor / 1e3:.1f} ms per step: host {h}'s {cores} cores "
                f"do the CPU work of ranks {', '.join(map(str, ranks))} (steps.jsonl, their processes' CPU time "
                f"per step, {out}) no faster than that")

    def factor(self) -> Factor:
        h, ranks, cores = self.busiest()
        per = ", ".join(f"rank {r} {self.cpu_us[r] / 1e3:.1f} ms" for r in ranks)
        return Factor("CPU time per step", sum(self.cpu_us[r] for r in ranks), "us",
                      f"CPU time of each rank's process per step on host {h} ({per}; {cores} cores)", True)


WORKERS_BUSY_SAID = 0.5
"""The share of a host's cores the DataLoader workers would keep busy at the step after
the fix (`WorkerLoad.slowed`) from which the estimate says the step can be longer still:
at 26-36% (slow_input and two variants) the form missed by -2.2 to +1.7 points, at 53% by
+9.5."""


@dataclass(frozen=True)
class WorkerLoad:
    """What DataLoader workers put on the cores a CPU job's ranks compute on, once the
    loading moves out of the loop: per rank and step, the CPU time its loop spent inside
    the DataLoader's ``__next__`` (steps.jsonl ``data_cpu_us``, median over the counted
    steps) plus what loading in workers adds per batch (collating into shared memory,
    pickling, passing the batch: ``loader.json`` ``cpu_us``, measured after the job)
    times its batches per step (``data_calls``).

    The replay takes the workers as having cores of their own. On a CPU host they share
    the ranks': the workers' CPU time per step on a host, W, shared by its cores, is time
    those cores do not spend on the ranks' work, so the step after the fix is
    ``T0 + W / cores``, T0 the replay's, at least the job's own step less its wait for
    input plus the hand-over (``rest_us``: the profiled window can hold more loading than
    the job's steps, and the replay would take it all away), the least of its ranks': a
    rank that does not wait for its input waits for the one that does, in a collective.

    Measured on 2 cores, 2 ranks with the advised 7-14 workers each, over 11 pairs of
    the slow_input scenario (its loading 32 sleeps of 1.5 ms per batch, 1.1 ms of CPU)
    and three variants whose samples also burn 50-100 us of CPU (2.7-4.2 ms per batch):
    without this, on the same recordings, the estimates were +1.5 to +4.8 points over the
    savings measured with the fix applied, and +8.4, +8.7 and +16.8 on the variants; with
    it, -2.2 to +1.1, and -0.2, +1.7 and +9.5 (the last where the loading burns 4.2 ms per
    batch). The training threads' forward, backward and optimizer ran 1.3-2.2x as long as
    with the problem, and they waited 0.9-3.7 ms per step for a core (0.1-0.7 with the
    problem).
    A processor-sharing form (only the ranks' CPU work stretched, by 1 / (1 - W / (cores
    x T))) missed by -1.7 to +3.2 and +10.6: their waits for each other stretch too.

    Ranks pinned to fewer cores than their host's (``pinned``: rank 0's CPU affinity)
    pass the pinning on to their DataLoader workers (forked processes inherit it): each
    rank's workers run on its own cores, where the rank's thread already waits for the
    core as long as whatever else runs there makes it (``stretch``), so the step grows by
    the busiest rank's workers' CPU times its stretch over its cores. The cpu_contention
    scenario pins each rank to one of 2 cores and spins another process on rank 1's,
    whose thread then gets its core half the time it is ready to run; it loads 2.7-3.1 ms
    of CPU per batch in the loop (4.5-7.3 ms of wait). With the 2 workers per rank its
    finding advised, its steps measured -23.3, -20.5, -11.1, -0.7, -0.4 and +2.8% faster
    (6 pairs): none of them the 5% a finding needs. The host-wide form estimated 7.4 to
    20.4% in 8 other recordings of it and +9.1 and +8.5 in 2 of the 4 pairs it can be
    re-run on (it dropped the other 2, at +0.0 and -2.1). This form drops all 12, at -17.8
    to +2.8% (the 4 pairs: +2.8, -13.6, -17.8, -0.2; their errors +13.9, -13.2, -17.1 and
    -3.0 points, where the host-wide form's were +20.2, +0.4, -1.4 and +5.7). Under fair
    sharing a worker would take only its own CPU time from a rank whose core another
    process keeps busy (that process gives up its share too); measured, the steps grew
    by more."""

    loading_us: Mapping[int, float]  # rank -> CPU per step its loop spent loading
    batches: Mapping[int, float]  # rank -> batches per step
    rest_us: Mapping[int, float]  # rank -> its step less its wait for input, the hand-over's time in
    hosts: Mapping[str, tuple[tuple[int, ...], int]]  # host -> (its ranks, its cores)
    added_us: float  # per batch, what loading in workers adds (0: not measured)
    added_source: str = ""
    pinned: int | None = None  # the cores each rank may run on, when fewer than its host's (CPU affinity)
    stretch: Mapping[int, float] = field(default_factory=dict)  # rank -> (on a CPU + waiting for one) / on a CPU

    def rank_load_us(self, r: int) -> float:
        return self.loading_us[r] + self.added_us * self.batches[r]

    def host_load_us(self, ranks: Sequence[int]) -> float:
        return sum(self.rank_load_us(r) for r in ranks)

    def _busiest(self) -> tuple[float, float, int, str]:
        """(the time per step the workers take from the ranks' work where they take most,
        their CPU there, the cores it runs on, and where in words). Pinned ranks (``pinned``): each rank's
        workers inherit its CPU affinity and run on its cores alone, where its thread
        already shares the core with what else runs there (``stretch``: a thread that gets
        its core half the time it wants it takes 2 ms for 1 ms of work); otherwise a
        host's workers share its cores."""
        if self.pinned:
            n = self.pinned
            r = max(self.loading_us, key=lambda k: (self.rank_load_us(k) * self.stretch.get(k, 1.0), -k))
            w, s = self.rank_load_us(r), self.stretch.get(r, 1.0)
            where = (f"rank {r}'s {n} core{'s' if n != 1 else ''} (each rank may run on {n} of its host's cores, and "
                     "its DataLoader workers inherit that), where its thread gets a core "
                     f"{100 / s:.0f}% of the time it is ready to run (steps.jsonl cpu_us and runq_us)")
            return w * s / n, w, n, where
        h, (ranks, cores) = max(self.hosts.items(), key=lambda kv: self.host_load_us(kv[1][0]) / kv[1][1])
        w = self.host_load_us(ranks)
        return w / cores, w, cores, f"host {h}'s {cores} core{'s' if cores != 1 else ''}"

    def slowed(self, t0: float, alone: bool = True) -> tuple[float, str] | None:
        """The step after the fix, from the replay's ``t0``, with the workers sharing the
        cores; and in words (the busiest host's). None when nothing changes. ``alone``:
        the workers are the only change, so the job's own step less its input wait holds
        (with other changes, that is their replay's to say)."""
        # the rank that waits longest for its input has the least left: the others wait for it
        rest = min(self.rest_us.values(), default=0.0) if alone else 0.0
        start = max(t0, rest)
        taken, w, cores, where = self._busiest()
        t = start + taken
        if t <= t0:
            return None
        words = (f"raised from {t0 / 1e3:.1f} to {t / 1e3:.1f} ms per step: "
                 + (f"the job's step less its wait for input, with the hand-over, is {rest / 1e3:.1f} ms "
                    f"(steps.jsonl){', and ' if w > 0 else ''}" if rest > t0 else "")
                 + (f"the DataLoader workers' {w / 1e3:.1f} ms of CPU per step ("
                    + ("the loop's" if self.pinned else "the loops'") + " own loading, steps.jsonl, "
                    + (f"and {self.added_us / 1e3:.2f} ms per batch that workers add" if self.added_us > 0 else
                       "with nothing added for the workers' hand-over, not measured")
                    + f") run on {where}, which the ranks' work then waits for: {taken / 1e3:.1f} ms per step"
                    if w > 0 else ""))
        busy = w / (cores * t) if t > 0 else 0.0
        if busy >= WORKERS_BUSY_SAID:
            words += (f"; the workers would keep those cores {100 * busy:.0f}% busy, and the ranks' work waits longer "
                      "than that for a core when they are this busy: the step can be longer still (one job measured "
                      "9 points under its estimate at 53%)")
        return t, words

    def factors(self) -> tuple[Factor, ...]:
        per = ", ".join(f"rank {r} {v / 1e3:.2f} ms" for r, v in sorted(self.loading_us.items())[:4])
        out: tuple[Factor, ...] = (Factor(
            "loading CPU per step", sum(self.loading_us.values()) / max(1, len(self.loading_us)), "us",
            f"steps.jsonl data_cpu_us, the loop's CPU time inside the DataLoader per step ({per})", True),)
        if self.added_us > 0:
            out += (Factor("CPU a worker adds per batch", self.added_us, "us",
                           self.added_source.removeprefix("measured: "), True),)
        else:
            out += (Factor("CPU a worker adds per batch", 0.0, "us", "assumed: not measured after the job", False),)
        return out


def starts_workers(edits: Sequence[rp.Edit]) -> bool:
    """Whether the edits move a DataLoader's loading into worker processes."""
    return any(isinstance(e, rp.RemoveInputWait) and e.workers for e in edits)


def worker_load(a: Analysis, records: Mapping[int, Sequence[StepRecord]],
                loader: factors.LoaderHandover | None) -> WorkerLoad | None:
    """`WorkerLoad`'s figures, or None: a rank not on a CPU or with no host, no core count,
    or a rank without its loop's loading CPU or its input wait in steps.jsonl (the
    loading CPU recorded since pardiag 0.5.5)."""
    hosts = _cpu_hosts(a)
    if hosts is None:
        return None
    handover = loader.us if loader is not None else 0.0
    loading: dict[int, float] = {}
    batches: dict[int, float] = {}
    rest: dict[int, float] = {}
    for r in a.ranks:
        recs = [rec for rec in records.get(r.rank, ()) if counted(rec)]
        cpu = [v for rec in recs if (v := rec.get("dataloader_cpu")) is not None]
        calls = [v for rec in recs if (v := rec.get("dataloader_calls")) is not None]
        left = [rec.dur_us - w for rec in recs if rec.dur_us is not None and (w := rec.get("dataloader")) is not None]
        if not cpu or not calls or not left:
            return None
        n = statistics.median(calls)
        loading[r.rank] = statistics.median(cpu)
        batches[r.rank] = n
        rest[r.rank] = statistics.median(left) + handover * n
    added = loader.cpu_us if loader is not None and loader.cpu_us is not None else 0.0
    aff = _threads(a).get("sched_affinity")
    cores = min(c for _, c in hosts.values())
    pinned = aff if isinstance(aff, int) and 0 < aff < cores else None
    stretch: dict[int, float] = {}
    for r in a.ranks:
        ratios = [(c + (rec.get("run_queue") or 0.0)) / c for rec in records.get(r.rank, ())
                  if counted(rec) and (c := rec.get("cpu")) is not None and c > 0]
        stretch[r.rank] = max(statistics.median(ratios), 1.0) if ratios else 1.0
    return WorkerLoad(loading, batches, rest, hosts, added, loader.cpu_source if loader is not None else "",
                      pinned, stretch)


def cpu_sharing(a: Analysis, model: rp.Model) -> rp.CpuSharing | None:
    """The cores the model's ranks share, when every rank runs on CPUs with a known host
    and the run recorded its host's core count (rank 0's meta.json: every host taken as
    alike) and its operators' threads."""
    if not a.ranks or any(r.device_type != "cpu" or not r.host for r in a.ranks):
        return None
    threads = _threads(a)
    cores, per = threads.get("cpu_count"), threads.get("torch_num_threads")
    if not isinstance(cores, int) or cores <= 0 or not isinstance(per, int) or per <= 0:
        return None
    host = {r.rank: str(r.host) for r in a.ranks if r.rank in model.origin}
    return rp.CpuSharing(host, {r: per for r in host}, {h: cores for h in set(host.values())})


def cpu_floor_inputs(a: Analysis, records: Mapping[int, Sequence[StepRecord]]) -> CpuFloor | None:
    """The CPU floor's figures, or None: a rank not on a CPU, no host, no process CPU
    time in steps.jsonl, or no core count."""
    hosts = _cpu_hosts(a)
    if hosts is None:
        return None
    cpu: dict[int, float] = {}
    for r in a.ranks:
        vals = [v for rec in records.get(r.rank, ()) if counted(rec) and (v := rec.get("process_cpu")) is not None]
        if not vals:
            return None
        cpu[r.rank] = statistics.median(vals)
    steps = job_step_times_us(records).values_us
    return CpuFloor(cpu, hosts, statistics.median(steps) if steps else 0.0)


def _threads(a: Analysis) -> dict[str, Any]:
    """Rank 0's thread settings (meta.json ``threads``: cpu_count, sched_affinity,
    torch_num_threads), every rank taken as alike; {} when not recorded."""
    fw = getattr(a.run, "fw", None)
    return (fw.threads if fw is not None else None) or {}


def _cpu_hosts(a: Analysis) -> dict[str, tuple[tuple[int, ...], int]] | None:
    """Per host, its ranks and its cores, when every rank runs on CPUs with a known host
    and the run recorded the core count (rank 0's host's: every host taken as alike)."""
    if not a.ranks or any(r.device_type != "cpu" or not r.host for r in a.ranks):
        return None
    cores = _threads(a).get("cpu_count")
    if not isinstance(cores, int) or cores <= 0:
        return None
    hosts: dict[str, list[int]] = {}
    for r in a.ranks:
        hosts.setdefault(str(r.host), []).append(r.rank)
    return {h: (tuple(rs), cores) for h, rs in hosts.items()}


def unanchored(model: rp.Model) -> str | None:
    """Why the replay cannot move the collectives, when some have no issuing call in the
    trace (no ``c10d::*`` call on the host, no kernel launch): they would keep their
    measured start whatever an edit does before them."""
    free = sum(1 for n in model.nodes if n.kind == rp.COLL and not n.deps)
    if not free:
        return None
    total = sum(1 for n in model.nodes if n.kind == rp.COLL)
    return (f"{free} of {total} collectives have no issuing call in the trace (a c10d call or a kernel launch): "
            "the replay could not move them")


def share_based(a: Analysis, why: str | None) -> Analysis:
    """The Analysis with every finding's share-based estimate marked as such (and why the
    replay was not used)."""
    findings = [replace(f, estimate=_share_estimate(f, why)) if f.est_saving_pct is not None else f
                for f in a.findings]
    what = replace(a.what_if, method="share", replay_error_pct=None, refused=why) if a.what_if else None
    return replace(a, findings=findings, what_if=what)


PHASE_NAMES = {"host": "host_gap", "comm": "collective"}


def critical_path_dict(path: rp.CriticalPath, result: rp.ReplayResult) -> dict[str, Any]:
    """The median step's critical path as the Analysis' ``critical_path`` block."""
    by_phase: dict[str, float] = {}
    for k, v in path.by_phase_us.items():
        name = PHASE_NAMES.get(k, k)
        by_phase[name] = round(by_phase.get(name, 0.0) + v, 1)
    by_coll = {k.split(" ")[0]: 0.0 for k in path.by_collective_us}
    for k, v in path.by_collective_us.items():
        by_coll[k.split(" ")[0]] += v
    top_phase = max(by_phase, key=lambda p: by_phase[p]) if by_phase else None
    top_coll = max(by_coll, key=lambda c: by_coll[c]) if by_coll else None
    return {"step": path.step, "rank": path.rank, "path_us": round(sum(path.by_rank_us.values()), 1),
            "by_rank_us": {str(r): round(v, 1) for r, v in sorted(path.by_rank_us.items())},
            "by_phase_us": by_phase, "by_collective_us": {k: round(v, 1) for k, v in by_coll.items()},
            "top_rank": path.top_rank, "top_phase": top_phase, "top_collective": top_coll,
            "replay_error_pct": round(100 * result.error, 1)}
