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
import math
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
    EXPORT_MARK, RawEvent, Trace, TraceError, load_trace, stream_events, trace_head)
from pardiag.errors import UserError

Progress = Callable[[str, int, int], None]  # (what, done, total)

# pardiag's tracks in each rank's process; the rank's own threads are numbered from SOURCE_TID
STEPS_TID = 1
PATH_TID = 2  # critical-path lanes: 2, 3, ...
COLL_TID = 10  # matched-collective lanes: 10, 11, ...
SOURCE_TID = 1000
PROFILER_THREAD = ("profiler", None)  # where Kineto's marks on pseudo-processes go
CAT_STEP, CAT_COLL, CAT_PATH, CAT_MARK = "pardiag.step", "pardiag.collective", "pardiag.critical_path", "pardiag"
FLOW_PHASES = frozenset("stf")
ASYNC_PHASES = frozenset("ben")
PASSED_PHASES = frozenset("XiICBE") | ASYNC_PHASES


class _Out(msgspec.Struct, omit_defaults=True, gc=False):
    """One event as written (fields left at their default are left out)."""

    name: str
    ph: str
    ts: float
    pid: int
    tid: int
    dur: float | None = None
    cat: str | None = None
    id: int | None = None
    bp: str | None = None
    s: str | None = None
    args: Any = None


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


# ------------------------------------------------------------------------------ writing
class _Sink:
    """The trace-event list being written: events go out block by block."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.events = 0
        self.encoder = msgspec.json.Encoder()

    def write(self, events: Sequence[_Out]) -> None:
        if not events:
            return
        body = self.encoder.encode(events)[1:-1]
        self.f.write(b",\n" + body if self.events else body)
        self.events += len(events)


_NUMBER = (int, float)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _RankWriter:
    """One rank's events, converted as they are read: pid = rank, threads renumbered,
    times on the job's clock; thread names, Kineto's flows and pardiag's tracks at the end."""

    def __init__(self, rank: int, shift_us: float, sink: _Sink, ids: Iterable[int]) -> None:
        self.rank, self.shift, self.sink, self.ids = rank, shift_us, sink, iter(ids)
        self.tids: dict[tuple[Any, Any], int] = {}  # the rank's threads: (pid, tid) -> thread id written
        self.seen: dict[tuple[Any, Any], int] = {}  # (pid, tid) as met -> thread id written
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.labels: dict[Any, str] = {}
        self.flows: dict[tuple[Any, Any], list[_Out]] = defaultdict(list)
        self.async_ids: dict[tuple[Any, Any], int] = {}
        self.dropped = 0

    def tid(self, pid: Any, tid: Any) -> int:
        # Kineto's own marks ("Traces", "") and anything that is no thread id go to one thread
        key = (pid, tid) if type(pid) is int and type(tid) in (int, str) else PROFILER_THREAD
        t = self.tids.get(key)
        if t is None:
            t = self.tids[key] = SOURCE_TID + len(self.tids)
        return t

    def on_events(self, events: list[RawEvent]) -> None:
        """The hot loop: a complete event with numeric times (nearly all of a trace) is
        converted here, anything else by ``_convert``."""
        out: list[_Out] = []
        append = out.append
        rank, shift, seen, isfinite = self.rank, self.shift, self.seen, math.isfinite
        for e in events:
            ts, dur = e.ts, e.dur
            if (e.ph == "X" and type(ts) in _NUMBER and type(dur) in _NUMBER and dur >= 0  # type: ignore[operator]
                    and isfinite(ts + dur) and e.cat != "Trace" and type(e.pid) is int  # type: ignore[operator]
                    and type(e.tid) is int):
                tid = seen.get((e.pid, e.tid))
                if tid is None:
                    tid = seen[(e.pid, e.tid)] = self.tid(e.pid, e.tid)
                t = ts - shift  # type: ignore[operator]
                # both ends through the same shift and rounding, so that nested events stay nested
                # (an event earlier than every rank's first timed event is cut at the job's start)
                start, end = round(t if t > 0 else 0.0, 3), round(t + dur if t + dur > 0 else 0.0, 3)  # type: ignore[operator]
                append(_Out(e.name if e.name is not None else "(unnamed)", "X", start, rank, tid,
                            dur=round(end - start, 3), cat=e.cat, args=e.args if len(e.args) else None))
                continue
            o = self._convert(e)
            if o is not None:
                append(o)
        self.sink.write(out)

    def _convert(self, e: RawEvent) -> _Out | None:  # noqa: C901 - one case per phase
        ph = e.ph or ("X" if e.dur is not None else None)
        if ph == "M":
            self._metadata(e)
            return None
        if e.cat == "Trace":  # Kineto's span of the whole recording, on a process of its own
            return None
        if ph is None or not _finite(e.ts) or (ph not in PASSED_PHASES and ph not in FLOW_PHASES):
            self.dropped += 1
            return None
        ts = float(e.ts) - self.shift  # type: ignore[arg-type]
        args = e.args if len(e.args) else None
        name = e.name if e.name is not None else "(unnamed)"
        tid = self.tid(e.pid, e.tid)
        if ph == "X":
            if not _finite(e.dur) or e.dur < 0:  # type: ignore[operator]
                self.dropped += 1
                return None
            # both ends through the same shift and rounding, so that nested events stay nested
            # (an event earlier than every rank's first timed event is cut at the job's start)
            start, end = round(max(ts, 0.0), 3), round(max(ts + float(e.dur), 0.0), 3)  # type: ignore[arg-type]
            return _Out(name, "X", start, self.rank, tid, dur=round(end - start, 3), cat=e.cat, args=args)
        if ph in FLOW_PHASES:
            if e.id is not None and ts >= 0:
                self.flows[(e.cat, e.id)].append(_Out(name, ph, round(ts, 3), self.rank, tid, cat=e.cat, bp=e.bp))
            else:
                self.dropped += 1
            return None
        ident = None
        if ph in ASYNC_PHASES:
            key = (e.cat, e.id)
            ident = self.async_ids.get(key)
            if ident is None:
                ident = self.async_ids[key] = next(self.ids)
        scope = "p" if e.s == "g" else e.s  # the rank's, not the whole job's
        return _Out(name, ph, round(max(ts, 0.0), 3), self.rank, tid, cat=e.cat, id=ident,
                    s=scope if ph in "iI" else None, args=args)

    def _metadata(self, e: RawEvent) -> None:
        """Thread names and process labels are kept (to name the rank's threads); the
        source's process names and sort orders give way to the rank's."""
        if e.name not in ("thread_name", "process_labels") or not len(e.args):
            return
        try:
            args = msgspec.json.decode(e.args)
        except msgspec.DecodeError:
            return
        if not isinstance(args, dict):
            return
        if e.name == "thread_name" and isinstance(args.get("name"), str):
            self.thread_names[(e.pid, e.tid)] = args["name"].strip()
        elif e.name == "process_labels" and isinstance(args.get("labels"), str):
            self.labels[e.pid] = args["labels"].strip()

    def finish(self, main_tid: int | None) -> None:
        """Kineto's flows whose both ends are here, and the names of the rank's threads."""
        out: list[_Out] = []
        for events in self.flows.values():
            phases = [o.ph for o in events]
            if phases.count("s") != 1 or phases.count("f") != 1:
                continue  # an end outside the window: nothing to join
            ident = next(self.ids)
            start = next(o for o in events if o.ph == "s")
            if any(o.ts < start.ts for o in events):
                continue
            for o in events:
                o.id = ident
                out.append(o)
        for (pid, tid), new in self.tids.items():
            name, sort = self._thread_name(pid, tid, main_tid)
            out.append(_meta("thread_name", self.rank, new, {"name": name}))
            out.append(_meta("thread_sort_index", self.rank, new, {"sort_index": sort if sort is not None else new}))
        self.sink.write(out)

    def _thread_name(self, pid: Any, tid: Any, main_tid: int | None) -> tuple[str, int | None]:
        if (pid, tid) == PROFILER_THREAD:
            return "profiler", None
        name = self.thread_names.get((pid, tid)) or f"thread {tid}"
        label = self.labels.get(pid, "")
        if label.startswith("GPU"):  # Kineto's device "process": its threads are the streams
            return f"{label} {name}", 1_000_000 + tid if isinstance(tid, int) else None
        if tid == main_tid:
            return f"{name}: training loop", 0
        return name, None


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> _Out:
    return _Out(name, "M", 0.0, pid, tid, args=args)


def _slice(name: str, start: float, end: float, pid: int, tid: int, cat: str, args: dict[str, Any]) -> _Out:
    """An "X" event from its two ends, each rounded to the nanosecond (a slice inside
    another one stays inside it)."""
    s, e = round(start, 3), round(end, 3)
    return _Out(name, "X", s, pid, tid, dur=round(max(e - s, 0.0), 3), cat=cat, args=args)


def _lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """For intervals in any order, the lowest lane where each fits after the ones before it
    (by start): slices on one track must nest, and these only touch."""
    ends: list[float] = []
    lane = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        s, e = spans[i]
        k = next((j for j, end in enumerate(ends) if end <= s), len(ends))
        if k == len(ends):
            ends.append(e)
        else:
            ends[k] = e
        lane[i] = k
    return lane


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
        lanes = _lanes([(s, e) for _, s, e in items])
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


def _collective_events(tl: jt.JobTimeline, rank: int, lane_of: Mapping[tuple[int, int], int]) -> list[_Out]:
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
            out.append(_slice(c.op, m.start_us, end, rank, tid, CAT_COLL, args))
            if m.timing == "launch":
                continue
            split = min(max(m.start_us + m.wait_us, m.start_us), end)  # the last rank arrived: data moves
            if split > m.start_us:
                out.append(_slice("wait", m.start_us, split, rank, tid, CAT_COLL,
                                  {"waited_for_others_us": round(m.wait_us, 3)}))
            if end > split and m.transfer_us > 0:
                out.append(_slice("transfer", split, end, rank, tid, CAT_COLL, {"transfer_us": round(m.transfer_us, 3)}))
    return out


def _collective_flows(tl: jt.JobTimeline, lane_of: Mapping[tuple[int, int], int], ids: Iterable[int]) -> list[_Out]:
    """One flow per matched collective, through its members in the order of their anchor
    times: "s" on the first, "t" on the middle ones, "f" on the last."""
    out = []
    it = iter(ids)
    for c in tl.collectives:
        ident = next(it)
        order = sorted(c.members, key=lambda m: (round(_anchor(m), 3), m.rank))
        for k, m in enumerate(order):
            ph = "s" if k == 0 else "f" if k == len(order) - 1 else "t"
            out.append(_Out(c.op, ph, round(_anchor(m), 3), m.rank, COLL_TID + lane_of[(c.index, m.rank)],
                            cat=CAT_COLL, id=ident, bp="e" if ph == "f" else None))
    return out


def _step_events(tl: jt.JobTimeline, rank: int, marks: _Marks) -> list[_Out]:
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
            out.append(_Out(f"critical path of the median step ({tile.step})", "i", round(tile.end_us, 3), rank,
                            STEPS_TID, cat=CAT_MARK, s="t", args=marks.critical_path))
        out.append(_slice(f"step {tile.step}", tile.start_us, tile.end_us, rank, STEPS_TID, CAT_STEP, args))
    if lag is not None:
        first = tl.steps[rank][0].start_us if tl.steps.get(rank) else 0.0
        out.append(_Out(f"straggler: {lag.cause}", "i", round(first, 3), rank, STEPS_TID, cat=CAT_MARK, s="t",
                        args={"excess_us_per_step": lag.excess_us_per_step, "held_us_per_step": lag.held_us_per_step,
                              "cause": lag.cause, "evidence": lag.evidence}))
    return out


def _path_events(tl: jt.JobTimeline, rank: int) -> tuple[list[_Out], int]:
    """The critical-path marks on the rank (steps' paths may overlap: lanes); their lanes."""
    mine = [(step, ending, m) for step, (ending, ms) in sorted(tl.paths.items()) for m in ms if m.rank == rank]
    lanes = _lanes([(m.start_us, m.end_us) for _, _, m in mine])
    out = [_slice(m.name, m.start_us, m.end_us, rank, PATH_TID + k, CAT_PATH,
                  {"step": step, "step_ends_on_rank": ending, "on_path_us": round(m.on_path_us, 3), "kind": m.kind,
                   "phase": m.phase})
           for (step, ending, m), k in zip(mine, lanes)]
    return out, (max(lanes) + 1 if lanes else 0)


def _process_events(rank: int, host: str | None, labels: Sequence[str], tracks: Mapping[int, str]) -> list[_Out]:
    out = [_meta("process_name", rank, 0, {"name": f"rank {rank} ({host})" if host else f"rank {rank}"}),
           _meta("process_sort_index", rank, 0, {"sort_index": rank})]
    if labels:
        out.append(_meta("process_labels", rank, 0, {"labels": ", ".join(labels)}))
    for tid, name in tracks.items():
        out.append(_meta("thread_name", rank, tid, {"name": name}))
        out.append(_meta("thread_sort_index", rank, tid, {"sort_index": -1000 + tid}))
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
            sink = _Sink(f)
            dropped = _write_ranks(ranks, tl, marks, sink, ids, lane_of, coll_lanes, progress)
            sink.write(_collective_flows(tl, lane_of, ids))
            f.write(b"\n]}\n")
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    except TraceError as e:  # read once already: the file changed while it was exported
        raise UserError(f"{e} (while exporting)") from None
    return ExportResult(out, tuple(sorted(ranks.windows)), dict(sorted(ranks.missing.items())), sink.events,
                        dropped, len(tl.collectives), out.stat().st_size, no_path, (*ranks.notices, *tl.notices))


def _write_ranks(ranks: _Ranks, tl: jt.JobTimeline, marks: _Marks, sink: _Sink, ids: Iterable[int],
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
                       [_Out(f"rank {r}: no trace ({ranks.missing[r]})", "i", 0.0, r, STEPS_TID, cat=CAT_MARK, s="p")])
            continue
        w = ranks.windows[r]
        writer = _RankWriter(r, tl.offsets_us.get(r, 0.0) + tl.zero_us, sink, ids)
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
