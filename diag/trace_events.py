"""Trace-event JSON written as it is produced: the event record, a sink that writes events
block by block, and the conversion of one rank's Kineto events (``trace.stream_events``)
into events of the merged trace (pid = the rank, its threads renumbered, times on the
job's clock). ``pardiag.export_perfetto`` puts the job together with them."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, BinaryIO, Iterable, Sequence

import msgspec

from pardiag.analyzers.trace import RawEvent

SOURCE_TID = 1000
"""The rank's own threads are numbered from here (the merged trace's own tracks below it)."""
PROFILER_THREAD = ("profiler", None)  # where Kineto's marks on pseudo-processes go
FLOW_PHASES = frozenset("stf")
ASYNC_PHASES = frozenset("ben")
PASSED_PHASES = frozenset("XiICBE") | ASYNC_PHASES


class Event(msgspec.Struct, omit_defaults=True, gc=False):
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


class EventSink:
    """The trace-event list being written: events go out block by block."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.events = 0
        self.encoder = msgspec.json.Encoder()

    def write(self, events: Sequence[Event]) -> None:
        if not events:
            return
        body = self.encoder.encode(events)[1:-1]
        self.f.write(b",\n" + body if self.events else body)
        self.events += len(events)


_NUMBER = (int, float)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class RankEvents:
    """One rank's events, converted as they are read: pid = rank, threads renumbered,
    times on the job's clock; thread names, Kineto's flows and pardiag's tracks at the end."""

    def __init__(self, rank: int, shift_us: float, sink: EventSink, ids: Iterable[int]) -> None:
        self.rank, self.shift, self.sink, self.ids = rank, shift_us, sink, iter(ids)
        self.tids: dict[tuple[Any, Any], int] = {}  # the rank's threads: (pid, tid) -> thread id written
        self.seen: dict[tuple[Any, Any], int] = {}  # (pid, tid) as met -> thread id written
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.labels: dict[Any, str] = {}
        self.flows: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
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
        out: list[Event] = []
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
                append(Event(e.name if e.name is not None else "(unnamed)", "X", start, rank, tid,
                            dur=round(end - start, 3), cat=e.cat, args=e.args if len(e.args) else None))
                continue
            o = self._convert(e)
            if o is not None:
                append(o)
        self.sink.write(out)

    def _convert(self, e: RawEvent) -> Event | None:  # noqa: C901 - one case per phase
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
            return Event(name, "X", start, self.rank, tid, dur=round(end - start, 3), cat=e.cat, args=args)
        if ph in FLOW_PHASES:
            if e.id is not None and ts >= 0:
                self.flows[(e.cat, e.id)].append(Event(name, ph, round(ts, 3), self.rank, tid, cat=e.cat, bp=e.bp))
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
        return Event(name, ph, round(max(ts, 0.0), 3), self.rank, tid, cat=e.cat, id=ident,
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
        out: list[Event] = []
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
            out.append(meta("thread_name", self.rank, new, {"name": name}))
            out.append(meta("thread_sort_index", self.rank, new, {"sort_index": sort if sort is not None else new}))
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


def meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> Event:
    return Event(name, "M", 0.0, pid, tid, args=args)


def slice_event(name: str, start: float, end: float, pid: int, tid: int, cat: str, args: dict[str, Any]) -> Event:
    """An "X" event from its two ends, each rounded to the nanosecond (a slice inside
    another one stays inside it)."""
    s, e = round(start, 3), round(end, 3)
    return Event(name, "X", s, pid, tid, dur=round(max(e - s, 0.0), 3), cat=cat, args=args)


def lane_numbers(spans: Sequence[tuple[float, float]]) -> list[int]:
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
