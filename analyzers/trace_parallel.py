"""Decode one large trace on several cores.

`load_trace` reads a trace block by block in one thread, which keeps one core busy
(with the C scanner, `trace.SCAN`, about 400 MB/s of JSON here; with msgspec alone about
125 MB/s, half decoding and half sorting the events into columns). For a large file on a
machine with idle cores, `load_parallel` splits the work:

* the calling thread reads the file (gunzipping it when it is gzip), cuts the
  ``traceEvents`` text after the last event separator of each block, as the serial
  reader does, and hands each block (``[`` + events + ``]``) to a worker;
* with the C scanner the workers are threads: the scanner lets go of the GIL while it
  reads, and each thread keeps one numbering of names and categories across its blocks
  (`_Numberings`; each block notes the ids it met, in the order it met them). Without
  it they are forked processes (Linux; elsewhere the trace is read serially), and the
  calling process decodes every n-th block itself between cuts;
* each worker sorts its block's events into columns with the serial reader's own code
  (`trace._Extractor`) and returns the columns, the names and categories they refer
  to, and the rare events it kept (steps, collectives, FLOP operators);
* the calling thread decodes the last events and the metadata after the list itself,
  and joins the blocks in file order: names and categories are renumbered in order of
  first appearance in the file, so the result is the `Trace` the serial reader gives,
  column for column.

Any block that does not decode (a separator-like string inside a name, an unusual
layout) sends the whole file back to the serial reader, which knows how to cope.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np
import numpy.typing as npt

from pardiag.analyzers import trace as tr

PARALLEL_MIN_BYTES = 48 << 20
"""Below this (on disk) a trace is read in one process: forking and joining would cost
more than the second core gives back."""

PARALLEL_BLOCK_BYTES = 1 << 20
"""Bytes of JSON per block handed to a worker. With the C scanner, at 200 MB on 2 cores: 1
MB blocks peaked at 61-63 MB, 2 MB ones at 64-66 (each thread holds a block and what is
made of it), in 0.32 s against 0.29 (the per-block work)."""

_IN_FLIGHT_PER_WORKER = 3  # blocks queued per worker: enough to keep it busy, few to hold

if TYPE_CHECKING:
    from concurrent.futures import Executor


class _Pending(Protocol):
    def result(self) -> _Part | None: ...


class _Job:
    """One block's decoding, in a `_Threads` pool or on the reading thread (every
    `workers`-th block when processes decode): its result, or what it raised, once done."""

    __slots__ = ("fn", "args", "kwargs", "done", "value", "error")

    def __init__(self, fn: Callable[..., _Part | None], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.value: _Part | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args, **self.kwargs)
        except BaseException as e:  # handed to whoever waits for it
            self.error = e
        finally:
            self.fn, self.args, self.kwargs = _dropped, (), {}  # the block's bytes go now
            self.done.set()

    def cancel(self) -> None:
        self.error = RuntimeError("cancelled")
        self.done.set()

    def result(self) -> _Part | None:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


def _dropped(*_: Any, **__: Any) -> None:
    return None


class _Threads:
    """What the reader needs of a thread pool (submit, shutdown, a ``with`` block), on
    `threading` alone: `concurrent.futures` brings `logging` and its own machinery, 0.8
    MB of a 200 MB trace's 61 MB peak."""

    def __init__(self, n: int) -> None:
        self._jobs: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"pardiag-trace-{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., _Part | None], *args: Any, **kwargs: Any) -> _Job:
        job = _Job(fn, args, kwargs)
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()
        return job

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            job.run()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        with self._cv:
            if cancel_futures:
                for job in self._jobs:
                    job.cancel()
                self._jobs.clear()
            self._closed = True
            self._cv.notify_all()
        if wait:
            for t in self._threads:
                t.join()

    def __enter__(self) -> _Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True)


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether workers can be forked: on Linux. The children run only the decoder (no
    lock another thread of this process may hold: a progress bar's refresh thread
    writes to the terminal, which they never touch), as the rank-level pools do."""
    if not sys.platform.startswith("linux"):
        return False
    import multiprocessing  # here: with the C scanner no process is forked (1.5 MB less)

    return "fork" in multiprocessing.get_all_start_methods()


def json_bytes(path: Path) -> int:
    """About how many bytes of JSON the file holds: its size, or for gzip the size it
    records of its content (modulo 4 GiB, so never taken under 4x the file)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(2) != tr._GZIP_MAGIC:
                return size
            f.seek(-4, os.SEEK_END)
            return max(int.from_bytes(f.read(4), "little"), 4 * size)
    except OSError:
        return 0


def worth_it(path: Path, workers: int) -> bool:
    """Whether ``workers`` threads (with the C scanner) or processes would read the file
    sooner than one."""
    return workers > 1 and json_bytes(path) >= PARALLEL_MIN_BYTES and (tr.SCAN or can_fork())


@dataclass
class _Part:
    """One block's events as the serial reader sorts them, with the names and
    categories its id columns refer to (a thread's numbering, shared by its blocks: then
    ``name_order``/``cat_order`` give the ids the block met, in the order it met them;
    else the block's own, met in id order)."""

    names: list[str]
    name_flags: list[int]
    cats: list[str]
    name_order: list[int] | None
    cat_order: list[int] | None
    gpu: dict[str, npt.NDArray[Any]]
    cpu: dict[str, npt.NDArray[Any]]
    launches: dict[str, npt.NDArray[Any]]
    memory: dict[str, npt.NDArray[Any]]
    steps: list[tr.StepMark]
    collectives: list[tr.CollectiveEvent]
    flop_ops: tr.FlopColumns
    n_events: int
    ts_fractional: bool
    min_ts: float


def _part_of(ex: tr._Extractor) -> _Part:
    # one block's columns are small: joined without handing the heap back after each
    ex._scanner = None  # it holds the extractor's methods: a cycle, kept while gc is paused
    shared = ex.numbering is not None
    return _Part(ex.names, ex.name_flags, list(ex.cat_ids), ex.name_order if shared else None,
                 ex.cat_order if shared else None, ex.gpu.arrays(False), ex.cpu.arrays(False),
                 ex.launches.arrays(False), ex.memory.arrays(False), ex.steps, ex.collectives, ex.flop_ops,
                 ex.n_events, ex.ts_fractional, ex.min_ts)


_PIECE_BYTES = 256 << 10
"""Bytes of JSON a worker decodes at a time: a block's decoded events are tens of
thousands of small objects whose memory Python's allocator keeps once grown to hold
them, in every process that decodes."""


class _Numberings:
    """Each decoding thread's numbering of names and categories (an extractor whose are
    shared by the thread's blocks: each name met by a thread is numbered once)."""

    def __init__(self, python_functions: bool) -> None:
        self.python_functions = python_functions
        self.local = threading.local()
        self.made: list[tr._Extractor] = []

    def get(self) -> tr._Extractor:
        ex: tr._Extractor | None = getattr(self.local, "ex", None)
        if ex is None:
            ex = self.local.ex = tr._Extractor(self.python_functions)
            self.made.append(ex)
        return ex

    def close(self) -> None:
        for ex in self.made:
            ex._scanner = None  # its scanner holds its methods: no cycle left behind
        self.made.clear()


def _decode_block(block: bytes | bytearray, sep: bytes | None, python_functions: bool,
                  piece: int | None = None, numberings: _Numberings | None = None) -> _Part | None:
    """In a worker: one block's events (``[`` + events + ``]``) as a part, decoded
    ``piece`` bytes at a time (by default `_PIECE_BYTES`, or the whole block at once when
    the C scanner reads it: no object per event), cut at ``sep``; None when the block
    does not decode."""
    buf = block if isinstance(block, bytearray) else bytearray(block)
    view = memoryview(buf)
    if piece is None:
        piece = len(buf) if tr.SCAN else _PIECE_BYTES
    with tr.gc_paused():
        ex = tr._Extractor(python_functions, numberings.get() if numberings is not None else None)
        s = 1  # the first byte of the next piece's events (a '{')
        while sep and len(buf) - s > piece + piece // 2:
            k = buf.find(sep, s + piece)
            if k < 0:
                break
            opened, closed = buf[s - 1], buf[k + 1]
            buf[s - 1], buf[k + 1] = ord("["), ord("]")
            added = ex.add_json(view[s - 1:k + 2])
            buf[s - 1], buf[k + 1] = opened, closed
            if not added:  # a separator inside a string: the rest as one
                break
            s = k + len(sep) - 1
        opened = buf[s - 1]
        buf[s - 1] = ord("[")
        if not ex.add_json(view[s - 1:]):
            return None
        buf[s - 1] = opened
        view.release()
        return _part_of(ex)


class _Fallback(Exception):
    """The file must be read by the serial reader."""


def _join(parts: list[_Part], meta: tr._Extractor, python_functions: bool, path: str) -> tr.Trace:
    """The parts in file order as one trace, as the serial reader would have built it."""
    ex = tr._Extractor(python_functions)
    ex.meta = meta.meta
    # a thread's numbering (keyed by its names list, which its extractor keeps alive until
    # the join is done: `_Numberings.close`) -> its ids' joined ones, -1 where not met yet
    name_maps: dict[int, npt.NDArray[np.int32]] = {}
    cat_maps: dict[int, npt.NDArray[np.int32]] = {}
    while parts:
        part = parts.pop(0)  # its columns held by the chunks alone: freed as each column is joined
        if part.name_order is None:  # the block's own numbering, its ids met in order
            name_map = np.full(len(part.names), -1, dtype=np.int32)
            cat_map = np.full(len(part.cats), -1, dtype=np.int32)
        else:
            name_map = _grown(name_maps, id(part.names), len(part.names))
            cat_map = _grown(cat_maps, id(part.names), len(part.cats))
        for i in range(len(part.names)) if part.name_order is None else part.name_order:
            if name_map[i] >= 0:
                continue
            name = part.names[i]
            nid = ex.name_ids.get(name)
            if nid is None:
                nid = ex.name_ids[name] = len(ex.names)
                ex.names.append(name)
                ex.name_flags.append(part.name_flags[i])
            name_map[i] = nid
        for i in range(len(part.cats)) if part.cat_order is None else part.cat_order:
            if cat_map[i] >= 0:
                continue
            cat = part.cats[i]
            cid = ex.cat_ids.get(cat)
            if cid is None:
                cid = ex.cat_ids[cat] = len(ex.cat_ids)
            cat_map[i] = cid
        for table, cols in ((ex.gpu, part.gpu), (ex.cpu, part.cpu), (ex.launches, part.launches),
                            (ex.memory, part.memory)):
            if not next(iter(cols.values())).size:
                continue
            for k, name in enumerate(table.dtypes):
                col = cols[name]
                if name == "name_id":
                    col = name_map[col]
                elif name == "cat_id":
                    col = cat_map[col]
                if name in tr._NARROWED:  # as the joined column will be: int8 or int16
                    col = col.astype(tr._narrowest([col]) or col.dtype, copy=False)
                table.chunks[k].append(col)
        ex.steps += part.steps
        ex.collectives += part.collectives
        ex.flop_ops.extend(part.flop_ops)
        ex.n_events += part.n_events
        ex.ts_fractional = ex.ts_fractional or part.ts_fractional
        ex.min_ts = min(ex.min_ts, part.min_ts)
    return ex.finish(path)


def _grown(maps: dict[int, npt.NDArray[np.int32]], key: int, n: int) -> npt.NDArray[np.int32]:
    """The map of a numbering's ids to the joined ones (-1: not met yet), at least ``n`` long."""
    m = maps.get(key)
    if m is None or len(m) < n:
        grown = np.full(max(n, 2 * len(m) if m is not None else n), -1, dtype=np.int32)
        if m is not None:
            grown[:len(m)] = m
        m = maps[key] = grown
    return m


def load_parallel(path: Path, workers: int, python_functions: bool = False,
                  block_bytes: int = PARALLEL_BLOCK_BYTES) -> tr.Trace | None:
    """The trace decoded by ``workers`` processes; None when it must be read serially
    (its layout is not the usual one, or a block did not decode). Raises `TraceError`
    as `load_trace` does for a truncated file."""
    meta = tr._Extractor(python_functions)  # the metadata before and after the list
    tail = tr._Extractor(python_functions)  # the last events, decoded here
    futures: list[_Pending] = []
    threads = tr.SCAN  # the C scanner lets go of the GIL: threads, no copy of the process
    numberings = _Numberings(python_functions) if threads else None
    extra: dict[str, Any] = {"numberings": numberings} if threads else {}
    with tr._errors_as_trace_error(path), tr.gc_paused(), warnings.catch_warnings():
        # Python 3.12+ warns of forking a process with threads; see can_fork
        warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
        try:
            # processes: the calling process decodes every `workers`-th block itself, between
            # cuts (one process fewer to fork and feed, and its blocks' columns are never
            # pickled); threads: the calling thread only cuts
            forked = workers if threads else max(1, workers - 1)
            executor: _Threads | Executor = _Threads(forked) if threads else _processes(forked)
            with executor as pool:
                pending: deque[_Pending] = deque()
                turn = [0]

                def submit(fn: Callable[..., _Part | None], *args: Any) -> None:
                    turn[0] += 1
                    if not threads and workers > 1 and turn[0] % workers == 0:
                        mine = _Job(fn, args, {"python_functions": python_functions})
                        mine.run()  # here; what it raises, as a worker's failure: the serial reader decides
                        futures.append(mine)
                        return
                    while len(pending) >= forked * _IN_FLIGHT_PER_WORKER:
                        _result(pending.popleft())
                    fut: _Pending = pool.submit(fn, *args, python_functions=python_functions, **extra)
                    futures.append(fut)
                    pending.append(fut)

                try:
                    with tr._open(path) as f:
                        head = _head(f, path, block_bytes, meta)
                        if head is None:
                            raise _Fallback
                        start, sep, first = head
                        held = [first]  # the head's 2 MB: held by the stream alone, or by no one
                        del head, first
                        gzipped = not isinstance(f, io.BufferedReader)
                        rest = (_stream(f, held.pop(), sep, block_bytes, submit) if gzipped else
                                _ranges(path, start, sep, block_bytes, submit))
                        held.clear()
                    if rest is None or not tr._decode_tail(path, rest, tail):
                        raise _Fallback
                    del rest
                    parts = [_result(f) for f in futures]
                    futures.clear()  # the parts are held by `parts` alone
                    pending.clear()
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)  # no more blocks decoded for nothing
                    raise
            for key, value in tail.meta.items():  # the head's metadata first, as the serial reader keeps it
                meta.meta.setdefault(key, value)
            parts.append(_part_of(tail))
            return _join(parts, meta, python_functions, str(path))
        except _Fallback:
            return None
        finally:
            if numberings is not None:
                numberings.close()


def _processes(n: int) -> Executor:
    """A pool of ``n`` forked processes (imported here: with the C scanner none is forked)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("fork"))


def _result(fut: _Pending) -> _Part:
    """A worker's part; `_Fallback` when its block did not decode or the worker failed
    (the serial reader then says what is wrong, as it would have)."""
    try:
        part = fut.result()
    except Exception:  # a worker that died or raised: the serial reader decides
        raise _Fallback from None
    if part is None:
        raise _Fallback
    return part


def _head(f: io.BufferedIOBase, path: Path, block: int,
          meta: tr._Extractor) -> tuple[int, bytes, bytearray] | None:
    """The serial reader's head (`trace._read_list_head`) and the separator between events:
    (the offset of the first event, the separator, ``[`` + the text read after the
    list's opening), or None when the layout is not the usual one."""
    got = tr._read_list_head(f, path, meta, block)
    if got is None:
        return None
    start, first = got
    sep = tr._pick_separator(first)
    return None if sep is None else (start, sep, first)


def _stream(f: io.BufferedIOBase, buf: bytearray, sep: bytes, block: int, submit: Any) -> bytearray | None:
    """A stream (gzip): each block of whole events read here and sent to a worker;
    ``[`` + what is left after the last one, or None without a separator for too long."""
    while True:
        k = buf.rfind(sep)
        if k > 0:
            submit(_decode_block, b"".join((memoryview(buf)[:k + 1], b"]")), sep)
            rest = bytearray(b"[")
            rest += memoryview(buf)[k + len(sep) - 1:]
            buf = rest
        elif len(buf) > tr._HEAD_LIMIT:
            return None
        chunk = f.read(block)
        if not chunk:
            return buf
        buf += chunk
        del chunk


_PROBE = 64 << 10  # bytes read at a cut point to find the next separator (more while none is found)


def _ranges(path: Path, start: int, sep: bytes, block: int, submit: Any) -> bytearray | None:
    """A plain file: cut about every ``block`` bytes at the next separator (only the
    bytes around each cut are read here), each range read and decoded by a worker;
    ``[`` + the last events and what follows the list, or None when no separator is
    found near a cut."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        at = start  # the first byte of the range being cut (a '{')
        while size - at > block + _PROBE:
            probe = at + block
            f.seek(probe)
            window = f.read(_PROBE)
            k = window.find(sep)
            while k < 0 and len(window) < tr._HEAD_LIMIT:
                more = f.read(_PROBE)
                if not more:
                    break
                window += more
                k = window.find(sep)
            if k < 0:
                return None
            end = probe + k + 1  # after the event's '}'
            submit(_decode_range, str(path), at, end - at, sep)
            at = probe + k + len(sep) - 1
        # the rest but its last events to a worker too: what is decoded here (after the
        # list's last separator) waits for no one, but holds up the workers' core
        tail_at = max(at, size - _PROBE)
        f.seek(tail_at)
        k = f.read().rfind(sep)
        if k >= 0 and tail_at + k > at:
            submit(_decode_range, str(path), at, tail_at + k + 1 - at, sep)
            at = tail_at + k + len(sep) - 1
        f.seek(at)
        rest = bytearray(b"[")
        rest += f.read()
    return rest


def _decode_range(path: str, offset: int, length: int, sep: bytes, python_functions: bool,
                  numberings: _Numberings | None = None) -> _Part | None:
    """In a worker: the events in ``length`` bytes of the file from ``offset``."""
    buf = bytearray(length + 2)
    buf[0], buf[-1] = ord("["), ord("]")
    with open(path, "rb") as f:
        f.seek(offset)
        if f.readinto(memoryview(buf)[1:length + 1]) != length:
            return None
    return _decode_block(buf, sep, python_functions, numberings=numberings)
