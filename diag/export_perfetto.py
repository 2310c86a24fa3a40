"""The whole job as one Chrome/Perfetto trace (`pardiag export RUN --perfetto`).

Trace-event format (the JSON object form: ``{"displayTimeUnit": "ms", "otherData":
{"pardiag": {...}}, "traceEvents": [...]}``, times in microseconds; ``otherData`` first, so
that a reader of a folder of traces knows the file from its head), gzip-compressed when the output's
name ends in ``.gz``. ui.perfetto.dev and chrome://tracing open it.

* Every rank is one process (pid = rank, named "rank N (host)"); its threads and GPU
  streams are its threads, with every event of its profiled window (the rank's trace,
  read block by block and written as it is read: memory stays bounded by the largest
  rank's columns, not the job's events).
* Each rank's clock is shifted by the offset the analysis aligns it with
  (``job_timeline``: the replay model's alignment), and the whole job starts at 0.
* pardiag's own tracks, above each rank's threads: "steps" (one slice per profiled
  step, as the analysis tiles the window), "collectives (matched)" (each collective
  matched across ranks, split into the rank's wait for the others and the transfer,
  joined to the same collective on the other ranks by a flow arrow) and "critical path"
  (what each step's end waited on, from the replay; left out, as the analysis leaves
  the replay out, past ``pipeline.REPLAY_MAX_BYTES`` of traces, since the model holds
  every rank's columns at once). The straggler is labelled on its process and marked
  with an instant event.
* Kineto's own flows (launch to kernel, forward to backward) are kept when both ends
  are in the file, with ids made unique across ranks.
"""

from __future__ import annotations

import gzip
import itertools
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Collection, Iterable, Mapping, Sequence

import msgspec

from pardiag import __version__, rundir
from pardiag.analysis import Analysis, Notice, Straggler
from pardiag.analyzers import job_timeline as jt
from pardiag.analyzers.pipeline import REPLAY_MAX_BYTES, RankInput, find_inputs
from pardiag.analyzers.trace import (
    EXPORT_MARK, Trace, TraceError, load_trace, stream_events, trace_head)
from pardiag.errors import UserError
from pardiag.trace_events import Event, EventSink, RankEvents, lane_numbers, meta, slice_event

Progress = Callable[[str, int, int], None]  # (what, done, total)

# pardiag's tracks in each rank's process; the rank's own threads are numbered from
# trace_events.SOURCE_TID
STEPS_TID = 1
PATH_TID = 2  # critical-path lanes: 2, 3, ...
COLL_TID = 10  # matched-collective lanes: 10, 11, ...
CAT_STEP, CAT_COLL, CAT_PATH, CAT_MARK = "pardiag.step", "pardiag.collective", "pardiag.critical_path", "pardiag"


@dataclass(frozen=True)
class ExportResult:
    out: Path
    ranks: tuple[int, ...]  # exported
    missing: dict[int, str]  # rank -> why it is not in the file
    events: int  # events written
    left_out: int  # events of the ranks' traces left out (no time, a negative duration, an unknown phase)
    flows: int  # flow arrows joining the collectives matched across ranks (one per collective)
    bytes: int
    critical_path: str | None  # why the critical path is not drawn; None when it is
    notices: tuple[str, ...] = ()  # what reading the traces and building the replay said


# ------------------------------------------------------------------------------ reading
@dataclass
class _Ranks:
    """The ranks to export: their windows (small) and trace files; the others and why."""

    windows: dict[int, jt.RankWindow] = field(default_factory=dict)
    files: dict[int, Path] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)  # shown in the process names
    missing: dict[int, str] = field(default_factory=dict)
    incomplete: list[int] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # what reading the path said (an export left out, ...)


def _read_ranks(inputs: Sequence[RankInput], analysis: Analysis | None, progress: Progress | None,
                keep: dict[int, Trace] | None) -> _Ranks:
    """Every rank's window (``keep``: also its trace, for the replay model)."""
    shown = {r.rank: r.host for r in analysis.ranks if r.host} if analysis is not None else {}
    out = _Ranks()
    for k, inp in enumerate(inputs):
        if progress:
            progress("reading traces", k, len(inputs))
        if inp.trace is None:
            out.missing[inp.rank] = "no profiler trace"
            continue
        try:
            trace = load_trace(inp.trace)
        except TraceError as e:
            out.missing[inp.rank] = f"trace unreadable: {e}"
            continue
        except MemoryError:
            out.missing[inp.rank] = f"{inp.trace.name}: out of memory while reading"
            continue
        host = trace_head(inp.trace).get("host_name")
        host = host if isinstance(host, str) and host else None
        out.windows[inp.rank] = jt.rank_window(inp.rank, trace, inp.trace_complete, host)
        out.files[inp.rank] = inp.trace
        if shown.get(inp.rank) or host:
            out.hosts[inp.rank] = shown.get(inp.rank) or host or ""
        if not inp.trace_complete:
            out.incomplete.append(inp.rank)
        if keep is not None:
            keep[inp.rank] = trace
    if progress:
        progress("reading traces", len(inputs), len(inputs))
    return out


def rank_selection(spec: str) -> frozenset[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8}; ``UserError`` for anything else."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise UserError(f"--ranks {spec}: not a list of ranks and ranges (like 0-3,8)") from None
        if a < 0 or b < a:
            raise UserError(f"--ranks {spec}: {part.strip()} is no range of ranks")
        out.update(range(a, b + 1))
    return frozenset(out)


def _timeline(path: Path, analysis: Analysis | None, progress: Progress | None, only: Collection[int] | None = None
              ) -> tuple[_Ranks, jt.JobTimeline, str | None]:
    """The ranks (``only`` those, when given) and the job's timeline; the reason the
    critical path is left out, if it is."""
    from pardiag.analyzers import replay as rp
    from pardiag.manifest import rank_ranges

    notices: list[Notice] = []
    _run, inputs = find_inputs(path, notices)
    if only is not None:
        chosen = [i for i in inputs if i.rank in only]
        if not chosen:
            raise UserError(f"--ranks {rank_ranges(only)}: none of them in {path} "
                            f"(its ranks: {rank_ranges(i.rank for i in inputs) or 'none'})")
        inputs = chosen
    size = sum(i.trace.stat().st_size for i in inputs if i.trace is not None and i.trace.is_file())
    keep: dict[int, Trace] | None = {} if size <= REPLAY_MAX_BYTES else None
    ranks = _read_ranks(inputs, analysis, progress, keep)
    ranks.notices = [n.message for n in notices]
    if not ranks.windows:
        why = "; ".join(f"rank {r}: {w}" for r, w in sorted(ranks.missing.items())) or "no rank"
        raise UserError(f"{path}: no readable trace to export ({why})")
    model = None
    no_path = None if keep is not None else f"{size / 2**30:.1f} GiB of traces, more than the replay reads"
    if keep is not None:
        if progress:
            progress("replaying the window", 0, 1)
        try:
            model = rp.build_model(keep, incomplete=ranks.incomplete, hosts=jt.alignment_hosts(ranks.windows))
        except Exception as e:  # the path is an addition: the export goes on without it
            no_path = f"the replay model failed: {type(e).__name__}: {e}"
        keep.clear()
    tl = jt.job_timeline(ranks.windows, model)
    if model is not None and not tl.paths:
        no_path = "no profiled step to replay"
    return ranks, tl, no_path


# ------------------------------------------------------------------------------ pardiag's tracks
@dataclass(frozen=True)
class _Marks:
    """What the analysis says about the job, for the tracks: stragglers by rank, the
    critical path of its median step."""

    stragglers: dict[int, Straggler]
    critical_path: dict[str, Any] | None

    @classmethod
    def of(cls, analysis: Analysis | None) -> _Marks:
        if analysis is None:
            return cls({}, None)
        return cls({s.rank: s for s in analysis.stragglers}, analysis.critical_path)


def _collective_tracks(tl: jt.JobTimeline) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
    """The lane of each (collective, rank) on its rank's "collectives" track, and each
    rank's number of lanes."""
    per_rank: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
    for c in tl.collectives:
        for m in c.members:
            per_rank[m.rank].append((c.index, m.start_us, max(m.end_us, m.start_us + 0.001)))
    lane_of: dict[tuple[int, int], int] = {}
    count: dict[int, int] = {}
    for r, items in per_rank.items():
        lanes = lane_numbers([(s, e) for _, s, e in items])
        for (i, _, _), k in zip(items, lanes):
            lane_of[(i, r)] = k
        count[r] = max(lanes) + 1 if lanes else 0
    return lane_of, count


def _anchor(m: jt.Member) -> float:
    """Where a flow meets a member: the middle of its transfer (transfers end together
    across ranks), else of the whole call."""
    end = max(m.end_us, m.start_us + 0.001)
    split = min(max(m.start_us + m.wait_us, m.start_us), end)
    if m.transfer_us > 0 and m.timing != "launch" and end > split:
        return (split + end) / 2
    return (m.start_us + end) / 2


def _collective_events(tl: jt.JobTimeline, rank: int, lane_of: Mapping[tuple[int, int], int]) -> list[Event]:
    out = []
    for c in tl.collectives:
        for m in c.members:
            if m.rank != rank:
                continue
            tid = COLL_TID + lane_of[(c.index, rank)]
            end = max(m.end_us, m.start_us + 0.001)  # a call of no length still holds its flow
            args = {"instance": c.index, "process_group": c.process_group, "step": c.step, "position": c.position,
                    "bytes": c.bytes, "wait_us": round(m.wait_us, 3), "transfer_us": round(m.transfer_us, 3),
                    "timing": m.timing, "ranks": [x.rank for x in c.members]}
            out.append(slice_event(c.op, m.start_us, end, rank, tid, CAT_COLL, args))
            if m.timing == "launch":
                continue
            split = min(max(m.start_us + m.wait_us, m.start_us), end)  # the last rank arrived: data moves
            if split > m.start_us:
                out.append(slice_event("wait", m.start_us, split, rank, tid, CAT_COLL,
                                  {"waited_for_others_us": round(m.wait_us, 3)}))
            if end > split and m.transfer_us > 0:
                out.append(slice_event("transfer", split, end, rank, tid, CAT_COLL, {"transfer_us": round(m.transfer_us, 3)}))
    return out


def _collective_flows(tl: jt.JobTimeline, lane_of: Mapping[tuple[int, int], int], ids: Iterable[int]) -> list[Event]:
    """One flow per matched collective, through its members in the order of their anchor
    times: "s" on the first, "t" on the middle ones, "f" on the last."""
    out = []
    it = iter(ids)
    for c in tl.collectives:
        ident = next(it)
        order = sorted(c.members, key=lambda m: (round(_anchor(m), 3), m.rank))
        for k, m in enumerate(order):
            ph = "s" if k == 0 else "f" if k == len(order) - 1 else "t"
            out.append(Event(c.op, ph, round(_anchor(m), 3), m.rank, COLL_TID + lane_of[(c.index, m.rank)],
                            cat=CAT_COLL, id=ident, bp="e" if ph == "f" else None))
    return out


def _step_events(tl: jt.JobTimeline, rank: int, marks: _Marks) -> list[Event]:
    out = []
    lag = marks.stragglers.get(rank)
    median = marks.critical_path.get("step") if marks.critical_path else None
    for tile in tl.steps.get(rank, ()):
        args: dict[str, Any] = {"step": tile.step, "length_us": round(tile.end_us - tile.start_us, 3)}
        ending = tl.paths.get(tile.step)
        if ending is not None:
            args["critical_path_ends_on_rank"] = ending[0]
        if lag is not None:
            args["straggler"] = lag.cause
        if tile.step == median and marks.critical_path and marks.critical_path.get("rank") == rank:
            args["critical_path"] = marks.critical_path
            out.append(Event(f"critical path of the median step ({tile.step})", "i", round(tile.end_us, 3), rank,
                            STEPS_TID, cat=CAT_MARK, s="t", args=marks.critical_path))
        out.append(slice_event(f"step {tile.step}", tile.start_us, tile.end_us, rank, STEPS_TID, CAT_STEP, args))
    if lag is not None:
        first = tl.steps[rank][0].start_us if tl.steps.get(rank) else 0.0
        out.append(Event(f"straggler: {lag.cause}", "i", round(first, 3), rank, STEPS_TID, cat=CAT_MARK, s="t",
                        args={"excess_us_per_step": lag.excess_us_per_step, "held_us_per_step": lag.held_us_per_step,
                              "cause": lag.cause, "evidence": lag.evidence}))
    return out


def _path_events(tl: jt.JobTimeline, rank: int) -> tuple[list[Event], int]:
    """The critical-path marks on the rank (steps' paths may overlap: lanes); their lanes."""
    mine = [(step, ending, m) for step, (ending, ms) in sorted(tl.paths.items()) for m in ms if m.rank == rank]
    lanes = lane_numbers([(m.start_us, m.end_us) for _, _, m in mine])
    out = [slice_event(m.name, m.start_us, m.end_us, rank, PATH_TID + k, CAT_PATH,
                  {"step": step, "step_ends_on_rank": ending, "on_path_us": round(m.on_path_us, 3), "kind": m.kind,
                   "phase": m.phase})
           for (step, ending, m), k in zip(mine, lanes)]
    return out, (max(lanes) + 1 if lanes else 0)


def _process_events(rank: int, host: str | None, labels: Sequence[str], tracks: Mapping[int, str]) -> list[Event]:
    out = [meta("process_name", rank, 0, {"name": f"rank {rank} ({host})" if host else f"rank {rank}"}),
           meta("process_sort_index", rank, 0, {"sort_index": rank})]
    if labels:
        out.append(meta("process_labels", rank, 0, {"labels": ", ".join(labels)}))
    for tid, name in tracks.items():
        out.append(meta("thread_name", rank, tid, {"name": name}))
        out.append(meta("thread_sort_index", rank, tid, {"sort_index": -1000 + tid}))
    return out


# ------------------------------------------------------------------------------ the export
def export_perfetto(path: Path, out: Path, analysis: Analysis | None = None,
                    progress: Progress | None = None, only: Collection[int] | None = None) -> ExportResult:
    """Write the merged trace of the run directory or trace folder ``path`` to ``out``
    (``only`` these ranks, when given: their clocks aligned among themselves, their
    collectives matched among themselves). ``analysis`` (of the same path) marks its
    stragglers and its median step's critical path. Raises ``UserError`` (one line) when
    nothing can be exported; ranks that cannot be are left out and named in the result
    and in the file (``otherData``)."""
    ranks, tl, no_path = _timeline(path, analysis, progress, only)
    marks = _Marks.of(analysis)
    lane_of, coll_lanes = _collective_tracks(tl)
    ids = itertools.count(1)
    try:
        with ExitStack() as stack:
            raw = stack.enter_context(rundir.atomic_open(out))
            f: BinaryIO = (stack.enter_context(gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0))  # type: ignore[arg-type]
                           if out.name.endswith(".gz") else raw)
            # otherData before the events: a reader of a folder of traces knows the file from its head
            f.write(b'{"displayTimeUnit": "ms",\n"otherData": ' + msgspec.json.encode(_other_data(path, ranks, tl, marks, no_path))
                    + b',\n"traceEvents": [\n')
            sink = EventSink(f)
            dropped = _write_ranks(ranks, tl, marks, sink, ids, lane_of, coll_lanes, progress)
            sink.write(_collective_flows(tl, lane_of, ids))
            f.write(b"\n]}\n")
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    except TraceError as e:  # read once already: the file changed while it was exported
        raise UserError(f"{e} (while exporting)") from None
    return ExportResult(out, tuple(sorted(ranks.windows)), dict(sorted(ranks.missing.items())), sink.events,
                        dropped, len(tl.collectives), out.stat().st_size, no_path, (*ranks.notices, *tl.notices))


def _write_ranks(ranks: _Ranks, tl: jt.JobTimeline, marks: _Marks, sink: EventSink, ids: Iterable[int],
                 lane_of: Mapping[tuple[int, int], int], coll_lanes: Mapping[int, int],
                 progress: Progress | None) -> int:
    """Every rank's process: its own events, then pardiag's tracks; ranks left out get a
    process that says why. Returns the number of events left out (unreadable times)."""
    dropped = 0
    order = sorted(set(ranks.windows) | set(ranks.missing))
    for k, r in enumerate(order):
        if progress:
            progress("writing", k, len(order))
        host = ranks.hosts.get(r)
        if r in ranks.missing:
            sink.write(_process_events(r, host, [f"no trace: {ranks.missing[r]}"], {STEPS_TID: "steps"}) +
                       [Event(f"rank {r}: no trace ({ranks.missing[r]})", "i", 0.0, r, STEPS_TID, cat=CAT_MARK, s="p")])
            continue
        w = ranks.windows[r]
        writer = RankEvents(r, tl.offsets_us.get(r, 0.0) + tl.zero_us, sink, ids)
        stream_events(ranks.files[r], writer.on_events)
        writer.finish(w.main_tid)
        dropped += writer.dropped
        path_events, path_lanes = _path_events(tl, r)
        tracks = {STEPS_TID: "steps"}
        tracks.update({PATH_TID + k: "critical path" + (f" {k + 1}" if k else "") for k in range(path_lanes)})
        tracks.update({COLL_TID + k: "collectives (matched)" + (f" {k + 1}" if k else "")
                       for k in range(coll_lanes.get(r, 0))})
        lag = marks.stragglers.get(r)
        labels = [f"straggler: {lag.cause}, +{lag.excess_us_per_step / 1e3:.1f} ms/step"] if lag else []
        if r in ranks.incomplete:
            labels.append("window cut short: last step left out")
        sink.write(_process_events(r, host, labels, tracks) + _step_events(tl, r, marks) + path_events
                   + _collective_events(tl, r, lane_of))
    if progress:
        progress("writing", len(order), len(order))
    return dropped


def _other_data(path: Path, ranks: _Ranks, tl: jt.JobTimeline, marks: _Marks, no_path: str | None) -> dict[str, Any]:
    return {"pardiag": {
        **EXPORT_MARK,
        "version": __version__,
        "source": str(path),
        "ranks": sorted(ranks.windows),
        "missing_ranks": {str(r): why for r, why in sorted(ranks.missing.items())},
        "clock_offsets_us": {str(r): v for r, v in sorted(tl.offsets_us.items())},
        "time_zero_us": tl.zero_us,
        "collectives_matched": len(tl.collectives),
        "collective_flows": len(tl.collectives),
        "stragglers": [{"rank": s.rank, "cause": s.cause, "excess_us_per_step": s.excess_us_per_step}
                       for s in marks.stragglers.values()],
        "critical_path": marks.critical_path,
        "critical_path_left_out": no_path,
        "notices": list(tl.notices)[:20],
    }}
