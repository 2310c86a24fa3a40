"""From a run directory (or a folder of plain torch.profiler traces, or one trace file)
to the Analysis. Ranks are parsed in parallel processes; only small summaries travel
back. Everything that is missing or odd becomes a notice, never an exception.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

from pardiag import rundir
from pardiag.analysis import Analysis, GpuTime, Notice, RankResult, StepTime, Straggler
from pardiag.analyzers.collectives import clock_offsets, end_times, match
from pardiag.analyzers.groups import process_groups
from pardiag.analyzers import factors, trace_parallel
from pardiag.analyzers.rank_trace import RankTrace, analyze_rank_trace
from pardiag.analyzers.steps import step_stats
from pardiag.analyzers.stragglers import RankEvidence, find_stragglers, step_tiles, step_waits
from pardiag.analyzers.trace import is_merged_export, trace_head
from pardiag.errors import UserError
from pardiag.rank_meta import RankMeta
from pardiag.run_info import FrameworkInfo, RunInfo
from pardiag.step_records import StepRecord

if TYPE_CHECKING:
    from pardiag.analysis_blocks import NcclSummary, Telemetry
    from pardiag.analyzers.nccl.log import NcclReport

TRACE_NAME = re.compile(r".*\.json(\.gz)?$")
Progress = Callable[[int, int], None]
SKEW_WARN_US = 5_000_000.0  # clocks of hosts this far apart make cross-rank times meaningless


@dataclass(frozen=True)
class RankInput:
    rank: int
    trace: Path | None
    trace_complete: bool
    head: dict[str, Any] | None = None  # plain traces: the metadata before the events (see trace_head)


@dataclass(frozen=True)
class TraceSummary:
    """What one worker process returns for one rank (small, picklable)."""

    rank: int
    result: RankTrace | None
    gpu: GpuTime | None
    base_time_ns: int | None
    error: str | None


def _summarise(inp: RankInput, decoders: int | None = None) -> TraceSummary:
    """One rank's trace read and summarised; ``decoders``: processes that decode it
    (`load_trace`'s workers: None, every core)."""
    from pardiag.analyzers.gpu_breakdown import gpu_breakdown
    from pardiag.analyzers.trace import TraceError, load_trace

    assert inp.trace is not None
    try:
        trace = load_trace(inp.trace, workers=decoders)
    except TraceError as e:
        return TraceSummary(inp.rank, None, None, None, str(e))
    except MemoryError:
        return TraceSummary(inp.rank, None, None, None, f"{inp.trace}: out of memory while reading")
    result = analyze_rank_trace(trace, drop_last_step=not inp.trace_complete)
    g = gpu_breakdown(trace)
    gpu = (
        GpuTime(
            span_us=g.span_us,
            compute_us=g.compute_us,
            comm_us=g.comm_us,
            overlap_us=g.overlap_us,
            memory_us=g.memory_us,
            idle_us=g.idle_us,
            kernel_us=g.kernel_us,
        )
        if g is not None
        else None
    )
    return TraceSummary(inp.rank, result, gpu, trace.base_time_ns, None)


# -- inputs ---------------------------------------------------------------------------------


def find_inputs(
    path: Path, notices: list[Notice], allow_empty: bool = False
) -> tuple[rundir.RunDir | None, list[RankInput]]:
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_file():
        if not TRACE_NAME.match(path.name):
            raise UserError(f"{path}: not a trace (.json or .json.gz) nor a run directory")
        if is_merged_export(trace_head(path)):
            raise UserError(f"{path}: a whole job exported by `pardiag export`, not a rank's trace "
                            "(open it in ui.perfetto.dev)")
        return None, _plain_traces([path], notices)
    if rundir.is_run_dir(path):
        run = rundir.RunDir(path)
        inputs = []
        for r in run.ranks():
            trace, complete = run.find_trace(r)
            inputs.append(RankInput(r, trace, complete))
        return run, inputs
    files = sorted(p for p in path.iterdir() if p.is_file() and TRACE_NAME.match(p.name))
    if not files:
        if allow_empty:
            return None, []
        raise UserError(f"{path}: no run directory and no trace files (*.json, *.json.gz) in it")
    inputs = _plain_traces(files, notices)
    if not inputs and not allow_empty:
        raise UserError(f"{path}: no rank's trace in it, only whole jobs exported by `pardiag export`")
    return None, inputs


def _plain_traces(files: list[Path], notices: list[Notice]) -> list[RankInput]:
    """One input per rank. Each file's head is read once: its rank, and the metadata
    (`distributedInfo`, `deviceProperties`, host) that fills the Analysis' `run` block."""
    from pardiag.analyzers.trace import rank_of

    out: dict[int, RankInput] = {}
    unranked = []
    for f in files:
        head = trace_head(f)
        if is_merged_export(head):
            notices.append(Notice("info", f"{f.name}: a whole job exported by `pardiag export`, not a rank's trace; "
                                          "left out"))
            continue
        info = head.get("distributedInfo")
        r = info.get("rank") if isinstance(info, dict) and type(info.get("rank")) is int else rank_of(f)
        if r is None:
            unranked.append((f, head))
        elif r in out:
            notices.append(Notice("warning", f"two traces claim rank {r}: {out[r].trace} and {f}; using the first"))
        else:
            out[r] = RankInput(r, f, True, head)
    for f, head in unranked:
        r = next(i for i in range(len(files) + len(out) + 1) if i not in out)
        notices.append(Notice("warning", f"{f.name}: no rank in the trace or its name; taken as rank {r} by order"))
        out[r] = RankInput(r, f, True, head)
    return [out[r] for r in sorted(out)]


# -- the analysis ---------------------------------------------------------------------------


def analyze_path(
    path: Path | None,
    jobs: int | None = None,
    progress: Progress | None = None,
    use_hta: bool = False,
    nccl_logs: Sequence[Path] = (),
) -> Analysis:
    """`path` None: only the NCCL logs are read (a user who has nothing else)."""
    notices: list[Notice] = []
    run: rundir.RunDir | None
    inputs: list[RankInput]
    if path is None:
        if not nccl_logs:
            raise UserError("nothing to analyse: give a run directory, a trace folder or file, or --nccl-log FILE")
        run, inputs = None, []
    else:
        run, inputs = find_inputs(path, notices, allow_empty=bool(nccl_logs))
    manifest = _manifest(run, notices) if run is not None else {}
    metas: dict[int, RankMeta] = {}
    if run is not None:
        metas = {i.rank: m for i in inputs if (m := _meta(run, i.rank)) is not None}

    summaries = _summarise_all([i for i in inputs if i.trace is not None], jobs, progress, run)
    for i in inputs:
        if i.trace is None:
            notices.append(Notice("warning", f"rank {i.rank}: no profiler trace ({_why_no_trace(metas.get(i.rank))})"))
        elif not i.trace_complete:
            notices.append(Notice("warning", f"rank {i.rank}: the profiler window was cut short; partial trace used"))
    for s in summaries.values():
        if s.error:
            notices.append(Notice("error", f"rank {s.rank}: trace unreadable: {s.error}"))

    traces = {r: s.result for r, s in summaries.items() if s.result is not None}
    matched = match({r: t.collectives for r, t in traces.items()})
    step_records = {i.rank: rundir.read_steps(run, i.rank) if run is not None else [] for i in inputs}
    ranks = [
        _rank_result(i, step_records[i.rank], summaries.get(i.rank), metas.get(i.rank), matched.wait_by_rank_us,
                     matched.transfer_by_rank_us)
        for i in inputs
    ]
    world = (
        manifest.get("world_size")
        or max((m.world_size or 0 for m in metas.values()), default=0)
        or max((t.world_size or 0 for t in traces.values()), default=0)
        or len(inputs)
    )
    _self_checks(traces, matched, world, manifest, notices, run, inputs)

    window_waits = step_waits({r: t.collectives for r, t in traces.items()},
                              {r: t.steps for r, t in traces.items() if t.steps})
    over_time = None
    if run is not None:
        from pardiag.analyzers import temporal

        over_time = temporal.analyze(step_records)
    late = over_time.late_stretches() if over_time is not None else []
    evidence = {
        r.rank: RankEvidence(
            rank=r.rank,
            steps_in_window=r.steps_profiled,
            wait_us=r.wait_us,
            phases_us=r.phases_us,
            step_records=_outside(step_records[r.rank], late),
            step_waits_us=window_waits.get(r.rank, {}),
            step_lengths_us={k: hi - lo for k, (lo, hi) in step_tiles(traces[r.rank].steps).items()}
            if r.rank in traces else {},
            host_gaps_us=traces[r.rank].host_gaps_us if r.rank in traces else {},
            device_type=r.device_type,
        )
        for r in ranks
        if r.steps_profiled > 0 or run is not None
    }
    hang = None
    if run is not None:
        from pardiag.analyzers.hang import diagnose, last_finished_steps

        hang = diagnose({r: m.exit.to_dict() for r, m in metas.items()},
                        last_finished_steps(step_records), world)
        if hang:
            notices.append(Notice("error", f"hang: {hang.summary}"))
    fault_cost = factors.fault_cost(run.root) if run is not None else None  # factors/faults.json, read once
    stragglers = [_left_out_said(s, late) for s in find_stragglers(evidence, fault_cost)]
    step_timeline = _step_timeline(inputs, traces, [s.rank for s in stragglers])
    second = _extra_window(run, inputs, step_records, metas, ranks, jobs, notices) if run is not None else None
    if over_time is not None:
        from pardiag.analyzers import temporal_rules

        notices.extend(temporal_rules.notices(over_time.to_dict()))
    offsets = clock_offsets(
        {r: end_times(t.collectives, (summaries[r].base_time_ns or 0) / 1e3) for r, t in traces.items()}
    )
    if offsets and max(abs(v) for v in offsets.values()) > SKEW_WARN_US:
        notices.append(Notice("warning", f"clocks differ by up to {max(abs(v) for v in offsets.values()) / 1e6:.1f} s between ranks; measured from collective end times (run.clock_offsets_us). pardiag compares durations across ranks, never clock times, so its figures do not depend on them"))
    hta = _hta(inputs, summaries, notices) if use_hta else None
    nccl, nccl_report = _nccl(run, nccl_logs, world, notices)
    if run is not None:  # the flight recorder's dumps join the verdict (of the exits, else NCCL's)
        from pardiag.analyzers.hang import flight_recorder_verdict

        hang, fr_notes = flight_recorder_verdict(hang or (nccl.hang if nccl else None), run.flight_dir, world)
        notices += [Notice("warning", n) for n in fr_notes]
    telemetry = _telemetry(run, notices) if run is not None else None
    from pardiag.analyzers.rules import advise
    from pardiag.analyzers.summary import build_summary, fresh_pages_words, inflation_words

    summary = build_summary(ranks, step_records if run is not None else None)
    if (said := inflation_words(summary.profiled_step_inflation)) is not None:
        notices.append(Notice("info", said))
    if run is not None and (said := fresh_pages_words(ranks, step_records)) is not None:
        notices.append(Notice("info", said))
    run_info = _run_info(path, manifest, metas, inputs, world, offsets, ranks, nccl.to_dict() if nccl else None,
                         from_run_dir=run is not None)
    efficiency = _efficiency(run, ranks, traces, metas, step_records, summary, run_info.device_name, notices)
    if efficiency is not None:
        mfu = {x.rank: x for x in efficiency.ranks}
        ranks = [replace(r, mfu=mfu[r.rank].mfu, hfu=mfu[r.rank].hfu) if r.rank in mfu else r for r in ranks]
        summary = replace(summary, mfu=efficiency.mfu, hfu=efficiency.hfu)
    advised = advise(Analysis(
        hang=hang,
        hta=hta,
        nccl=nccl,
        telemetry=telemetry,
        run=run_info,
        ranks=ranks,
        collectives=matched.collectives,
        stragglers=stragglers,
        process_groups=process_groups(traces, matched.collectives, world,
                                      fsdp=any(m.fsdp for m in metas.values())),
        notices=notices,
        summary=summary,
        temporal=over_time.to_dict() if over_time is not None else None,
        extra_window=second,
        step_timeline=step_timeline,
        efficiency=efficiency,
    ), nccl=nccl_report, telemetry=telemetry)
    return _estimates(advised, inputs, step_records, run, fault_cost, notices)


def _outside(records: Sequence[StepRecord], late: Sequence[tuple[int, int, int | None]]) -> list[StepRecord]:
    """The step records outside the stretches in which one rank became late part-way
    through the run (`Temporal.late_stretches`): the straggler test takes a median over
    the steps, and a stretch of one level beside steps of another puts that median on
    the edge between them (a late straggler's 30 ms over 15 of 31 steps gave "3.7 ms per
    step", the largest of the steps before it). The stretch is the late finding's."""
    if not late:
        return list(records)
    return [rec for rec in records
            if not any(first <= rec.step and (last is None or rec.step <= last) for _, first, last in late)]


def _left_out_said(s: Straggler, late: Sequence[tuple[int, int, int | None]]) -> Straggler:
    """A straggler timed over steps.jsonl says which steps it left out (`_outside`)."""
    if not late or s.held_from != "steps.jsonl":
        return s
    said = "; ".join(f"steps {first}{f'-{last}' if last is not None else ' on'} (rank {rank} late from step {first})"
                     for rank, first, last in late)
    return replace(s, evidence=[*s.evidence, f"left out of these medians: {said}, said on their own"])


def _step_timeline(inputs: Sequence[RankInput], traces: Mapping[int, RankTrace],
                   first: Sequence[int]) -> dict[str, Any] | None:
    """One step of every rank on the replay's clock (ranks of one host share it: the hosts
    as the traces name them, as ``replay.model_of`` reads them)."""
    from pardiag.analyzers.job_timeline import step_view

    hosts: dict[int, str | None] = {}
    for i in inputs:
        if i.trace is not None and i.rank in traces:
            h = (i.head if i.head is not None else trace_head(i.trace)).get("host_name")
            hosts[i.rank] = h if isinstance(h, str) and h else None
    return step_view(traces, hosts, first)


def _efficiency(run: rundir.RunDir | None, ranks: Sequence[RankResult], traces: Mapping[int, RankTrace],
                metas: Mapping[int, RankMeta], step_records: Mapping[int, Sequence[StepRecord]], summary: Any,
                device_name: str | None, notices: list[Notice]) -> Any:
    """The efficiency block (analyzers/efficiency.py); its failure is a notice."""
    from pardiag.analyzers import efficiency
    from pardiag.analyzers.flops import FlopCount

    try:
        return efficiency.analyze(efficiency.Inputs(
            ranks=ranks, flops={r: FlopCount.from_dict(t.flops) if t.flops else None for r, t in traces.items()},
            metas=metas, step_records=step_records, job_step_us=summary.step_p50_us,
            job_step_source=summary.step_p50_source, device_name=device_name,
            measured=factors.read_peak(run.root) if run is not None else None))
    except Exception as e:  # MFU is one figure among many: never lose the analysis over it
        notices.append(Notice("warning", f"MFU left out: {type(e).__name__}: {e}"))
        return None


REPLAY_MAX_BYTES = 1 << 30
"""Traces larger than this in all (on disk) are not replayed: the estimates stay share-based."""


def _add_rate(a: Analysis, found: Sequence[tuple[int, Any, bool]]) -> Any:
    """The job's own in-place add rate (lowest rank's trace) when a CPU job has a
    gradient-accumulation finding (`estimates.accumulating_backward`), else None."""
    from pardiag.analyzers import gemm_shapes

    if not found or not any(f.lever == "gradient_accumulation" for f in a.findings) \
            or not a.ranks or any(r.device_type != "cpu" for r in a.ranks):
        return None
    try:
        return gemm_shapes.inplace_add_rate(min(found)[1])
    except gemm_shapes.ShapeError:
        return None


def _estimates(a: Analysis, inputs: Sequence[RankInput], step_records: Mapping[int, Sequence[StepRecord]],
               run: rundir.RunDir | None, fault_cost: factors.FaultCost | None, notices: list[Notice]) -> Analysis:
    """Replay-based estimates (analyzers/estimates.py); share-based ones, with a notice,
    when the window cannot be replayed. ``fault_cost``: factors/faults.json's, as read."""
    from pardiag.analyzers import estimates, replay

    found = [(i.rank, i.trace, i.trace_complete) for i in inputs if i.trace is not None]
    size = sum(Path(p).stat().st_size for _, p, _ in found if Path(p).exists())
    model: replay.Model | None = None
    why = None
    if not found:
        why = "no profiler trace"
    elif size > REPLAY_MAX_BYTES:
        why = f"{size / 2**30:.1f} GiB of traces, more than the {REPLAY_MAX_BYTES / 2**30:.0f} GiB replayed"
    else:
        try:
            model = replay.model_of(found, max_nodes=replay.MAX_NODES)
        except replay.TooLarge as e:  # a budget of memory: share-based estimates, and why
            why = str(e)
            notices.append(Notice("info", f"{why}: estimates are share-based"))
        except Exception as e:  # the replay's failure must not take the analysis down
            why = f"the replay model failed: {type(e).__name__}: {e}"
            notices.append(Notice("warning", f"{why}; estimates are share-based"))
    try:
        gemm, comm = estimates.run_factors(run) if model is not None else (None, None)
        loader = factors.loader_handover(run.root) if model is not None and run is not None else None
        faults = fault_cost if model is not None else None
        return estimates.apply(a, estimates.Inputs(model, step_records, gemm, comm, why, loader=loader,
                                                   faults=faults, add_rate=_add_rate(a, found)))
    except Exception as e:
        notices.append(Notice("warning", f"replay estimates failed: {type(e).__name__}: {e}; estimates are "
                                         "share-based"))
        return estimates.share_based(a, f"replay estimates failed: {type(e).__name__}")


def _nccl(
    run: rundir.RunDir | None, extra: Sequence[Path], world: int, notices: list[Notice]
) -> tuple[NcclSummary | None, NcclReport | None]:
    logs = list(extra)
    if run is not None and run.nccl_dir.is_dir():
        logs += sorted(p for p in run.nccl_dir.glob("*.log") if p.stat().st_size > 0)
    if not logs:
        return None, None
    from pardiag.analyzers.nccl.log import parse_nccl_logs
    from pardiag.analyzers.nccl.summary import summarise

    report = parse_nccl_logs(logs)
    block = summarise(report, world or None)
    if block.hang:
        notices.append(Notice("error", f"hang: {block.hang.summary}"))
    return block, report


def _telemetry(run: rundir.RunDir, notices: list[Notice]) -> Telemetry | None:
    from pardiag.analyzers.telemetry import telemetry_block

    try:
        return telemetry_block(run)
    except Exception as e:  # telemetry is optional; never lose the analysis over it
        notices.append(Notice("warning", f"telemetry unreadable: {type(e).__name__}: {e}"))
        return None


def _hta(inputs: list[RankInput], summaries: dict[int, TraceSummary], notices: list[Notice]) -> dict[str, Any] | None:
    gpu = {i.rank: i.trace for i in inputs if i.trace is not None and summaries.get(i.rank) and summaries[i.rank].gpu}
    if not gpu:
        notices.append(Notice("warning", "--hta: HTA analyses GPU kernels and no trace has any; skipped"))
        return None
    from pardiag.analyzers.hta_engine import hta_summary

    try:
        return hta_summary(gpu)
    except Exception as e:  # HTA's own failure must not lose pardiag's analysis
        notices.append(Notice("error", f"--hta: HTA failed: {type(e).__name__}: {str(e)[:300]}"))
        return None


def _summarise_all(
    inputs: list[RankInput], jobs: int | None, progress: Progress | None, run: rundir.RunDir | None = None
) -> dict[int, TraceSummary]:
    """Per-rank results: from the node's summary.json where it matches the trace,
    else by parsing the trace in a pool of processes."""
    out: dict[int, TraceSummary] = {}
    if run is not None:
        from pardiag.analyzers import reduce

        rest = []
        for i in inputs:
            got = reduce.load(run, i.rank, i.trace) if i.trace is not None else None
            if got is None:
                rest.append(i)
            else:
                out[i.rank] = TraceSummary(i.rank, got[0], got[1], got[2], None)
        inputs = rest
    total = len(inputs)
    if progress:
        progress(0, total)
    if not inputs:
        return out
    cores = jobs or trace_parallel.cores()
    workers = min(cores, total)
    decoders = max(1, cores // total)  # the cores a pool leaves idle decode each trace's blocks
    if workers <= 1:
        for n, i in enumerate(inputs, 1):
            out[i.rank] = _summarise(i, decoders)
            if progress:
                progress(n, total)
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_summarise, i, decoders): i for i in inputs}
        for n, fut in enumerate(as_completed(futures), 1):
            i = futures[fut]
            try:
                out[i.rank] = fut.result()
            except Exception as e:  # a worker that died (out of memory, killed)
                out[i.rank] = TraceSummary(i.rank, None, None, None, f"{i.trace}: {type(e).__name__}: {e}")
            if progress:
                progress(n, total)
    return out


def _manifest(run: rundir.RunDir, notices: list[Notice]) -> dict[str, Any]:
    try:
        return rundir.read_manifest(run)
    except rundir.RunDirError as e:
        if "newer" in str(e):
            raise UserError(str(e)) from None
        notices.append(Notice("warning", f"no usable manifest ({e}); the run may still be going or was killed"))
        return {}


def _extra_window(run: rundir.RunDir, inputs: Sequence[RankInput], step_records: Mapping[int, Sequence[StepRecord]],
                  metas: Mapping[int, RankMeta], first: Sequence[RankResult], jobs: int | None,
                  notices: list[Notice]) -> dict[str, Any] | None:
    """The extra window recorded on a slowdown (trace-2 of each rank), against the
    first (analyzers/extra_window.py); None without one. Its failure is a notice."""
    from pardiag.analyzers import extra_window

    found = []
    for i in inputs:
        path, complete = run.find_trace(i.rank, 2)
        if path is not None:
            found.append(RankInput(i.rank, path, complete))
    if not found:
        return None
    try:
        summaries = _summarise_all(found, jobs, None, None)
        traces = {r: s.result for r, s in summaries.items() if s.result is not None}
        matched = match({r: t.collectives for r, t in traces.items()})
        second = [_rank_result(i, step_records.get(i.rank, []), summaries.get(i.rank), metas.get(i.rank),
                               matched.wait_by_rank_us, matched.transfer_by_rank_us) for i in found]
        raw = {}
        for i in found:
            try:
                doc = json.loads(run.meta(i.rank).read_text())
                raw[i.rank] = (doc.get("profiler_extra") or [{}])[0]
            except (OSError, ValueError, AttributeError, IndexError):
                raw[i.rank] = {}
        block = extra_window.compare(first, second, raw)
    except Exception as e:  # the extra window must not take the analysis down
        notices.append(Notice("warning", f"the second profiler window could not be analysed: {type(e).__name__}: {e}"))
        return None
    if block is not None and (said := extra_window.words(block)):
        notices.append(Notice("info", said))
    return block


def _meta(run: rundir.RunDir | None, rank: int) -> RankMeta | None:
    """The rank's meta.json; None when there is none or it cannot be read."""
    if run is None:
        return None
    try:
        return rundir.read_meta(run, rank)
    except rundir.RunDirError:
        return None


def _why_no_trace(meta: RankMeta | None) -> str:
    prof = meta.profiler if meta is not None else None
    return (prof.reason or prof.status or "not recorded") if prof is not None else "not recorded"


def _rank_result(
    inp: RankInput,
    records: Sequence[StepRecord],
    s: TraceSummary | None,
    meta: RankMeta | None,
    waits: dict[int, float],
    transfers: dict[int, float],
) -> RankResult:
    st = step_stats(records)
    step_time = StepTime(
        p50=st.p50_us,
        mean=st.mean_us,
        max=st.max_us,
        n=st.n,
        p90=st.p90_us,
        steps_total=st.last_step + 1 if st.last_step is not None else 0,
        disturbed=st.disturbed,
        profiled_p50=st.profiled_p50_us,
    )
    t = s.result if s else None
    zero_b = {k: 0.0 for k in ("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle")}
    zero_p = {k: 0.0 for k in ("dataloader", "forward", "backward", "optimizer", "other", "host")}
    n_steps = len(t.steps) if t else 0
    return RankResult(
        rank=inp.rank,
        host=meta.host if meta is not None else None,
        steps_profiled=n_steps,
        window_us=t.window_us if t else 0.0,
        breakdown_us=dict(t.breakdown_us) if t else zero_b,
        phases_us=dict(t.phases_us) if t else zero_p,
        step_time_us=step_time,
        gpu=s.gpu if s else None,
        trace=str(inp.trace.name) if inp.trace else None,
        trace_complete=inp.trace_complete and t is not None,
        device_type=t.device_type if t else (meta.device.type if meta is not None and meta.device else None),
        wait_us=waits.get(inp.rank, 0.0),
        transfer_us=transfers.get(inp.rank, 0.0),
        phases_per_step_us={k: v / n_steps for k, v in t.phases_us.items()} if t and n_steps else {},
        host_phases_us=_host_phases(records),
        ops=dict(t.ops) if t else {},
        breakdown_per_step_us={str(k): dict(v) for k, v in t.breakdown_per_step_us.items()} if t else {},
        host_per_step_us=_host_per_step(records),
        memory=_memory(meta, t.memory if t else None, records),
    )


def _memory(meta: RankMeta | None, trace_mem: Mapping[str, Any] | None,
            records: Sequence[StepRecord]) -> dict[str, Any] | None:
    """The rank's memory by category (analyzers/memory.py); the device's samples from
    every step that has them (how much forward leaves does not depend on its timing)."""
    from pardiag.analyzers.memory import rank_memory
    from pardiag.step_records import WARMUP_STEPS, counted

    def series(name: str, only_counted: bool) -> list[float]:
        return [v for r in records if r.step >= WARMUP_STEPS and (counted(r) or not only_counted)
                and (v := r.get(name)) is not None]

    return rank_memory(meta, trace_mem, series("activations", False), series("device_allocated", False),
                       series("rss_mb", True))


HOST_STEPS_KEPT = 512  # counted steps of steps.jsonl kept per rank for the share tests


def _host_per_step(records: Sequence[StepRecord]) -> dict[str, dict[str, float]]:
    """The last HOST_STEPS_KEPT counted steps (steps.jsonl), each its duration ("step")
    and the host phases it observed, keyed by the step's number as text."""
    from pardiag.step_records import counted, host_phases

    recs = [r for r in records if counted(r) and r.dur_us is not None and r.dur_us > 0][-HOST_STEPS_KEPT:]
    out = {}
    for r in recs:
        d = {"step": float(r.dur_us or 0.0)}
        for sig in host_phases():
            v = r.get(sig.name)
            if v is not None:
                d[sig.name] = float(v)
        out[str(r.step)] = d
    return out


def _host_phases(records: Sequence[StepRecord]) -> dict[str, float]:
    """Median host time per step over the counted steps (steps.jsonl): "step" (the
    duration) and every signal of `step_records.SIGNALS` marked a host phase, each over
    the steps that observed it."""
    from pardiag.analyzers.steps import median
    from pardiag.step_records import counted, host_phases

    recs = [r for r in records if counted(r)]
    cols: dict[str, list[float]] = {"step": [r.dur_us for r in recs if r.dur_us is not None]}
    for sig in host_phases():
        cols[sig.name] = [v for r in recs if (v := r.get(sig.name)) is not None]
    return {k: m for k, v in cols.items() if (m := median(v)) is not None}


def _self_checks(
    traces: dict[int, RankTrace],
    matched: Any,
    world: int,
    manifest: dict[str, Any],
    notices: list[Notice],
    run: rundir.RunDir | None,
    inputs: list[RankInput],
) -> None:
    comm_us = sum(t.breakdown_us.get("comm_exposed", 0.0) + t.breakdown_us.get("comm_overlapped", 0.0)
                  for t in traces.values())
    if world > 1 and traces and not any(t.collectives for t in traces.values()):
        if comm_us > 0:  # kernels that move data without a collective record (DeepEP, NVSHMEM)
            notices.append(Notice("info", f"communication kernels ran ({comm_us / 1000:.1f} ms over the ranks) but no "
                                          "collective was recorded (expert-parallel libraries such as DeepEP move data "
                                          "in kernels of their own): counted as communication, not matched across ranks"))
        else:
            notices.append(Notice("warning", f"a {world}-rank job with no communication in any trace: is the model "
                                             "wrapped in DDP/FSDP, or were the collectives outside the window?"))
    for r, t in sorted(traces.items()):
        for n in t.notices:
            notices.append(Notice("warning", f"rank {r}: {n}"))
    unsized = sorted({c.op for c in matched.collectives if c.group_size is None and c.algbw_gbps is not None})
    if unsized:
        notices.append(Notice("info", f"bus bandwidth left out for {', '.join(unsized)}: the traces do not give the "
                                      "size of their process group (no 'Group size', 'Process Group Ranks' or "
                                      "pg_config); the algorithm bandwidth is shown"))
    m = matched
    left_out: tuple[tuple[int, Literal["error", "warning", "info"], str], ...] = (
        # what the matching left out or could not time, one notice each
        (m.unmatched, "warning", "collectives appear in one rank's trace only (profiled windows that cover different "
                                 "steps, or a sampled trace): left out of the collective times, as their wait cannot "
                                 "be told from their transfer"),
        (m.mismatched_size, "warning", "collectives have different sizes on different ranks at the same position: not "
                                       "the same operation (a sampled trace, or process groups the traces do not "
                                       "name); left out of the matching"),
        (m.launch_only_alone, "info", "collectives ran in process groups of one rank: NCCL moves no data for them (no "
                                      "kernel, at most a local copy or reduce), so none is timed as communication"),
        (m.launch_only - m.launch_only_alone, "warning", "NCCL collectives have no kernel in the traces (a sampled or "
                                                         "CPU-only trace): counted, but not timed"),
        (m.mismatched_unnamed, "warning", "collectives differ in type between ranks at the same position; the traces "
                                          "do not name process groups, so collectives of different groups (or a "
                                          "sampled trace) may be mixed"),
        (m.mismatched - m.mismatched_unnamed, "error", "collectives differ in type between ranks at the same position "
                                                       "of one process group: the ranks issue collectives in different "
                                                       "orders (a hang risk)"),
    )
    for count, level, text in left_out:
        if count > 0:
            notices.append(Notice(level, f"{count} {text}"))
    if world and inputs:
        missing = sorted(set(range(world)) - {i.rank for i in inputs})
        if missing and len(missing) < world:
            notices.append(Notice("warning", f"no data from rank(s) {_ranges(missing)} of {world}"))
    from pardiag.redact import home_paths, redact_value

    for f in manifest.get("failed_ranks") or []:
        reason = home_paths(redact_value(str(f.get("reason"))))
        notices.append(Notice("error", f"rank {f.get('rank')} failed at step {f.get('step')}: {reason}"))


def _ranges(xs: list[int]) -> str:
    from pardiag.manifest import rank_ranges

    return rank_ranges(xs)


def _run_info(
    path: Path | None,
    manifest: dict[str, Any],
    metas: dict[int, RankMeta],
    inputs: list[RankInput],
    world: int,
    offsets: dict[int, float],
    ranks: Sequence[RankResult] = (),
    nccl: dict[str, Any] | None = None,
    from_run_dir: bool = False,
) -> RunInfo:
    """The `run` block: from the manifest and the ranks' meta.json for a run directory;
    for plain traces from their own metadata (backend from `distributedInfo`, device
    from `deviceProperties`); with NCCL logs only, from the logs."""
    from pardiag.redact import home_paths, redact_value

    first = metas[min(metas)] if metas else RankMeta()
    device = first.device
    plain = _plain_run_info(inputs, ranks) if not manifest and not metas and not from_run_dir else {}
    logs = _nccl_run_info(nccl or {})
    command = manifest.get("command")
    return RunInfo(
        path=home_paths(str(path)) if path is not None else None,
        world_size=world or logs.get("world_size") or 0,
        ranks_analyzed=len(inputs),
        backend=manifest.get("backend") or first.backend or plain.get("backend") or logs.get("backend"),
        device_type=(manifest.get("device_type") or (device.type if device else None) or plain.get("device_type")
                     or logs.get("device_type")),
        device_name=(device.name if device else None) or plain.get("device_name"),
        command=[home_paths(redact_value(str(c))) for c in command] if isinstance(command, list) else command,
        launcher=manifest.get("launcher"),
        hosts=(manifest.get("hosts") or sorted({m.host for m in metas.values() if m.host})
               or plain.get("hosts") or logs.get("hosts") or []),
        exit_code=manifest.get("exit_code"),
        versions=manifest.get("versions") or first.fact("versions") or plain.get("versions") or logs.get("versions"),
        profiler=manifest.get("profiler"),
        clock_offsets_us={str(r): v for r, v in sorted(offsets.items())},
        collectors=manifest.get("collectors"),
        framework=_framework(metas),
        devices=plain.get("devices") or None,
    )


def _plain_run_info(inputs: list[RankInput], ranks: Sequence[RankResult]) -> dict[str, Any]:
    """What plain traces say about the job in their metadata (the lowest rank that has
    it): backend, NCCL version, the node's devices, the hosts; the device type from
    `deviceProperties` (Kineto lists the GPUs there), else from what the ranks ran on."""
    heads = [i.head for i in inputs if i.head]
    info: dict[str, Any] = next((h["distributedInfo"] for h in heads if isinstance(h.get("distributedInfo"), dict)), {})
    props = next((h["deviceProperties"] for h in heads if h.get("deviceProperties")), None)
    devices = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    out: dict[str, Any] = {}
    if isinstance(info.get("backend"), str):
        out["backend"] = info["backend"]
    if isinstance(info.get("nccl_version"), str):
        out["versions"] = {"nccl": info["nccl_version"]}
    if devices:
        names = sorted({str(d["name"]) for d in devices if d.get("name")})
        out["device_type"] = "cuda"
        out["device_name"] = ", ".join(names) or None
        out["devices"] = [
            {"id": d.get("id"), "name": d.get("name"), "total_memory_bytes": d.get("totalGlobalMem"),
             "capability": f"{d['computeMajor']}.{d['computeMinor']}"
             if d.get("computeMajor") is not None and d.get("computeMinor") is not None else None,
             "sms": d.get("numSms")}
            for d in devices
        ]
    else:
        types = sorted({r.device_type for r in ranks if r.device_type})
        if len(types) == 1:
            out["device_type"] = types[0]
    hosts = sorted({str(h["host_name"]) for h in heads if isinstance(h.get("host_name"), str) and h["host_name"]})
    if hosts:
        out["hosts"] = hosts
    return out


def _version_key(v: str) -> tuple[tuple[int, int | str], ...]:
    """'2.9.6+cuda11.3' before '2.10.3': the numbers compared as numbers."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.+\-]", v))


def _nccl_run_info(nccl: dict[str, Any]) -> dict[str, Any]:
    """With NCCL logs only: the world size, hosts and NCCL version the logs name."""
    if not nccl:
        return {}
    hosts = nccl.get("hosts") or ()
    versions = sorted({v for h in hosts for v in h.get("versions") or ()}, key=_version_key)
    out: dict[str, Any] = {"backend": "nccl", "device_type": "cuda",
                           "hosts": sorted({h["host"] for h in hosts if h.get("host")})}
    if nccl.get("world_size"):
        out["world_size"] = nccl["world_size"]
    if versions:
        out["versions"] = {"nccl": ", ".join(versions)}
    return out


FRAMEWORK_KEYS = ("ddp", "fsdp", "amp", "dataloaders", "grad_accumulation", "optimizers", "parameters", "device", "threads")
# Of DDP's own runtime record (`_get_ddp_logging_data()`, meta ddp[i].logging), the
# numbers the advisor reads; the rest (addresses, per-parameter orders) stays in meta.json.
DDP_LOGGING_KEPT = (
    "iteration", "unused_parameter_size", "num_parameter_tensors", "total_parameter_size_bytes",
    "avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
    "avg_backward_compute_comm_overlap_time", "has_rebuilt_buckets", "can_set_static_graph", "backend_name",
    "module_name",
)


def _framework(metas: dict[int, RankMeta]) -> FrameworkInfo | None:
    """What the job used, as rank 0 (or the lowest rank) saw it, plus the peak device
    memory over all ranks; `name`/`version` of the framework that drove the optimizer
    (None when the run did not record it: older runs, plain torch assumed); per DDP
    module, the kept part of DDP's logging data and `across_ranks`: what every rank's
    DDP recorded about unused parameters."""
    import copy

    if not metas:
        return None
    first = metas[min(metas)]
    out: dict[str, Any] = {k: copy.deepcopy(first.fact(k)) for k in FRAMEWORK_KEYS}
    peaks = [(m.device.max_memory_reserved_bytes if m.device else None) or 0 for m in metas.values()]
    out["peak_memory_reserved_bytes_max"] = max(peaks) if any(peaks) else None
    ident = first.framework
    out["name"] = ident.name if ident else None
    out["version"] = ident.version if ident else None
    out["detected_from"] = ident.detected_from if ident else None
    out["loaded"] = dict(ident.loaded) if ident else {}
    if out.get("ddp"):
        for i, d in enumerate(out["ddp"]):
            if not isinstance(d, dict):
                continue
            log = d.pop("logging", None)  # bulky; the facts that matter are kept above it
            d["logging"] = {k: log[k] for k in DDP_LOGGING_KEPT if k in log} if isinstance(log, dict) else {}
            d["across_ranks"] = _ddp_across_ranks(metas, i)
    if out.get("threads"):
        out["threads"].pop("python_executable", None)  # a local path: not for reports
    return FrameworkInfo.from_dict(out)


def _ddp_across_ranks(metas: dict[int, RankMeta], i: int) -> dict[str, Any]:
    """DDP module `i` as every rank recorded it: how many ranks have it, how many ran it
    with find_unused_parameters, and the largest unused-parameter size any reported
    (DDP records it at the iterations it samples; None where no rank did)."""
    ranks = find_unused = 0
    sizes: list[int] = []
    iterations: list[int] = []
    for m in metas.values():
        mods = m.ddp or ()
        if i >= len(mods):
            continue
        mod = mods[i]
        ranks += 1
        find_unused += bool(mod.find_unused_parameters)
        # the size at the last write, and the largest at any write of meta.json
        vs = [x for x in (mod.unused_parameter_size, mod.unused_parameter_size_max) if x is not None]
        if vs:
            sizes.append(max(vs))
        if mod.iteration is not None:
            iterations.append(mod.iteration)
    return {
        "ranks": ranks,
        "find_unused_parameters": find_unused,
        "unused_parameter_size_reported": len(sizes),
        "unused_parameter_size_max": max(sizes) if sizes else None,
        "iteration_min": min(iterations) if iterations else None,
    }
