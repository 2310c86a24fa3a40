"""Load a Kineto (torch.profiler) trace into numpy columns, fast and in bounded memory.

A Kineto trace is one JSON object: a few metadata keys (``distributedInfo``,
``deviceProperties``, ``baseTimeNanoseconds``, ...) around a ``traceEvents`` list that
holds nearly all of the bytes. ``load_trace`` reads it in blocks (2 MB by default):

* it finds ``"traceEvents": [`` in the first block and decodes the header before it;
* it cuts each block after the last event separator (``},`` + whitespace + ``{`` as
  the file writes it, learnt from the first block) and decodes the events before
  the cut as one JSON array, keeping the rest for the next block;
* after the last block, the remainder (last events, ``]`` and the trailing metadata)
  is decoded as ``{"traceEvents": [`` + remainder.

Each block goes first to the C scanner (`_scan`, analyzers/_scan.c; `SCAN`), which
writes the columns without a Python object per event and hands back the few events
whose name or arguments matter (steps, collectives, FLOP operators, allocations); those,
and any block the scanner does not expect, are decoded by msgspec typed Structs that
name only the fields pardiag reads (other keys, ``Call stack``, ``grid``, ..., are
skipped in C without building objects). The cyclic garbage collector is off while
decoding (it costs 3x on millions of small objects). Each block's events become numpy columns before the next block is read, so
memory stays at a few blocks plus the columns. When the layout is not the usual one
(no ``traceEvents`` near the start, no separator, a cut that does not decode), the
whole document is decoded at once instead.

Known malformations are tolerated: integers beyond int64 (e.g. ``Comms Id``) are
skipped or decoded as Python ints and mapped to -1 in int64 columns; invalid UTF-8 is
replaced (U+FFFD). A truncated, empty or non-trace file raises ``TraceError`` with a
one-line message, never another exception.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import re
import sys
import zlib
from array import array
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence as SequenceABC
from typing import Any, Callable, Iterator, Protocol, Sequence, overload

import msgspec
import numpy as np
import numpy.typing as npt

from pardiag.analyzers.flop_rules import OP_NAMES as FLOP_OP_NAMES

try:  # the hot loop in C, built with the package (optional: without it, msgspec decodes every event)
    from pardiag.analyzers import _scan
except ImportError:  # pragma: no cover - a build without a C compiler
    _scan = None  # type: ignore[assignment]

SCAN = _scan is not None and os.environ.get("PARDIAG_TRACE_SCAN", "1") != "0"
"""Whether blocks of events go through the C scanner (`_scan.Scanner`, analyzers/_scan.c)
first: it writes the columns without a Python object per event and hands the few events
whose name or arguments matter (steps, collectives, FLOP operators, allocations) to the
msgspec path; a block it does not expect is decoded by msgspec whole. The same Trace
either way (tests/analyzers/test_trace_scan.py); ``PARDIAG_TRACE_SCAN=0`` turns it off."""

BLOCK_BYTES = 2 << 20
"""Bytes read per block. The decoded events of a block are many small objects
whose memory Python's allocator keeps once it has grown to hold them: a 200 MB trace
read in one process peaked at 146 MB with 16 MB blocks, at 72 MB with 2 MB blocks (in
0.94 s instead of 1.00 s: the smaller block also stays in the caches)."""

_HEAD_LIMIT = 64 << 20  # give up on block-wise reading past this without a cut
_RANK_HEAD_BYTES = 256 << 10
_GZIP_MAGIC = b"\x1f\x8b"
_KEY = b'"traceEvents"'
_ARRAY_OPEN = re.compile(rb"\s*:\s*\[")
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_MAX_CUT_RETRIES = 16

CPU_OP_CATEGORIES: frozenset[str] = frozenset({"cpu_op", "user_annotation"})
SYNC_EVENT_NAMES: frozenset[str] = frozenset({"Event Sync", "Context Sync"})
_COMM_ANNOTATION_PREFIXES = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")
# The program's own call (`c10d::_reduce_scatter_base_`): kept beside the backend's
# annotations to name what the program asked for (a backend may run it as another op).
_C10D_PREFIX = "c10d::"
_STEP, _SYNC, _COMM, _FLOP = 1, 2, 4, 8  # name flags

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
IDS = npt.NDArray[np.signedinteger[Any]]
"""An id column (stream, device, thread, correlation, ...): int32 where every value of
a block fits, int64 otherwise (a column joined from both is int64). Ids are compared,
never summed, so the narrower type only halves their memory (a quarter of the columns')."""
NAME_IDS = npt.NDArray[np.signedinteger[Any]]
"""An index into ``Trace.names`` or ``Trace.cats``: int8, int16 or int32, the narrowest
that holds the trace's ids."""


class TraceError(Exception):
    """The file is not a readable Kineto trace; the message is one line."""


# --------------------------------------------------------------------------- schema
_NO_RAW = msgspec.Raw()


class _Args(msgspec.Struct, gc=False):
    """The ``args`` keys pardiag reads; numbers are ``Any`` so that integers beyond
    int64 decode (as Python ints) instead of failing the block."""

    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    device: Any = None
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    sequence_nr: Any = msgspec.field(default=None, name="Sequence number")
    # `[memory]` instant events (profile_memory=True)
    nbytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_type: Any = msgspec.field(default=None, name="Device Type")


class _Event(msgspec.Struct, gc=False):
    """A trace event, reduced to what pardiag reads. ``ph`` is not needed: like HTA,
    pardiag keeps every event that has a ``dur`` and a ``cat`` (``gc=False``: these
    objects hold no references that could form cycles)."""

    cat: str | None = None
    name: str | None = None
    pid: Any = None
    tid: Any = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: _Args | None = None


class _Doc(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None


_EVENTS = msgspec.json.Decoder(list[_Event])
_DOC = msgspec.json.Decoder(_Doc)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class ProcessGroupConfig:
    name: str
    desc: str
    backend_config: str
    size: int | None
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class DistributedInfo:
    rank: int | None
    world_size: int | None
    backend: str | None
    nccl_version: str | None
    pg_config: tuple[ProcessGroupConfig, ...]


@dataclass(frozen=True)
class GpuEvents:
    """Events on a GPU stream: every event whose ``args.stream`` reads as an integer
    other than -1 (kernels, ``gpu_memcpy``, ``gpu_memset``, ...), in file order."""

    name_id: NAME_IDS
    cat_id: NAME_IDS
    stream: IDS
    device: IDS
    correlation: IDS  # -1 when absent
    external_id: IDS  # -1 when absent
    ts_us: F64
    dur_us: F64

    def __len__(self) -> int:
        return int(self.ts_us.size)


@dataclass(frozen=True)
class CpuOps:
    """Host-side ranges (``cpu_op``, ``user_annotation``, optionally
    ``python_function``), in file order."""

    name_id: NAME_IDS
    cat_id: NAME_IDS
    pid: IDS
    tid: IDS  # -1 when not an integer
    ts_us: F64
    dur_us: F64
    external_id: IDS

    def __len__(self) -> int:
        return int(self.ts_us.size)


@dataclass(frozen=True)
class Launches:
    """Host events that carry a ``correlation`` id to GPU work (``cuda_runtime``,
    ``cuda_driver``, ...), excluding device-wide sync events, in file order."""

    name_id: NAME_IDS
    tid: IDS
    ts_us: F64
    dur_us: F64
    correlation: IDS

    def __len__(self) -> int:
        return int(self.ts_us.size)


@dataclass(frozen=True)
class MemoryEvents:
    """The allocator's ``[memory]`` instant events (``profile_memory=True``), in file
    order: each allocation (``nbytes`` > 0) or free (< 0) and the allocator's totals
    after it. ``device_type``: c10's DeviceType (0 CPU, 1 CUDA). The totals count only
    what the profiler saw: they start from 0 when it starts, and a block allocated
    before it is never subtracted when freed, so only their differences inside a
    profiled step mean bytes held."""

    ts_us: F64
    nbytes: I64
    total_allocated: I64
    total_reserved: I64
    device_type: I64

    def __len__(self) -> int:
        return int(self.ts_us.size)


def _no_memory_events() -> MemoryEvents:
    e = np.empty(0, dtype=np.int64)
    return MemoryEvents(np.empty(0, dtype=np.float64), e, e, e, e)


@dataclass(frozen=True)
class StepMark:
    """An event whose name contains ``ProfilerStep`` (CPU or GPU annotation)."""

    name: str
    cat: str
    ts_us: float
    dur_us: float
    hta_gpu: bool  # on a stream (>= 0) with a correlation (>= 0): HTA calls it GPU


@dataclass(frozen=True)
class CollectiveEvent:
    """A collective as the trace records it: ``record_param_comms`` ops and NCCL
    kernels with ``Collective name`` args, ``nccl:*``/``gloo:*`` annotations, and the
    program's ``c10d::*`` calls."""

    name: str
    cat: str
    on_gpu: bool
    ts_us: float
    dur_us: float
    tid: int  # host thread, or the stream for GPU events
    correlation: int
    external_id: int
    collective_name: str | None
    in_msg_nelems: int | None
    out_msg_nelems: int | None
    dtype: str | None
    group_size: int | None
    pg_name: str | None
    pg_desc: str | None
    pg_ranks: tuple[int, ...] | None
    input_dims: Any
    input_type: Any


@dataclass(frozen=True, slots=True)  # slots: a 200 MB trace holds 14,835 of them (0.9 MB less)
class FlopOp:
    """An operator that performs floating-point work by `pardiag.analyzers.flop_rules`
    (a matrix multiply, a convolution, attention), with what it recorded of its inputs.
    `grad_mode`: it carried a ``Sequence number``, which the dispatcher records for an
    operator called with autograd recording (a forward pass, or a forward recomputed
    inside backward), never for the operators a backward pass runs."""

    name: str
    pid: int
    tid: int
    ts_us: float
    dur_us: float
    input_dims: Any
    input_type: Any
    concrete: Any
    grad_mode: bool


class FlopColumns:
    """`FlopOp`s as they are found, column by column (no object per operator: a 200 MB
    trace holds 14,838, whose objects and floats, freed among the objects that stay,
    would keep 2.4 MB of the allocator's pages). Recorded inputs are kept once per
    object (the decoder shares equal ones)."""

    __slots__ = ("names", "_name_ix", "name", "pid", "tid", "ts", "dur", "values", "_value_ix", "dims", "types",
                 "concrete", "grad")

    def __init__(self) -> None:
        self.names: list[str] = []
        self._name_ix: dict[str, int] = {}
        self.name = array("i")
        self.pid = array("q")
        self.tid = array("q")
        self.ts = array("d")
        self.dur = array("d")
        self.values: list[Any] = []
        self._value_ix: dict[int, int] = {}  # id() of a kept value -> its index
        self.dims = array("i")
        self.types = array("i")
        self.concrete = array("i")
        self.grad = array("b")

    def __len__(self) -> int:
        return len(self.ts)

    def __getstate__(self) -> dict[str, Any]:  # (a worker process's part) ids mean nothing elsewhere
        return {k: getattr(self, k) for k in self.__slots__ if k not in ("_name_ix", "_value_ix")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._name_ix = {n: i for i, n in enumerate(self.names)}
        self._value_ix = {id(v): i for i, v in enumerate(self.values)}

    def _value(self, v: Any) -> int:
        at = self._value_ix.get(id(v))
        if at is None:
            at = self._value_ix[id(v)] = len(self.values)
            self.values.append(v)
        return at

    def _name(self, name: str) -> int:
        at = self._name_ix.get(name)
        if at is None:
            at = self._name_ix[name] = len(self.names)
            self.names.append(name)
        return at

    def add(self, name: str, pid: int, tid: int, ts: float, dur: float, input_dims: Any, input_type: Any,
            concrete: Any, grad_mode: bool) -> None:
        self.name.append(self._name(name))
        self.pid.append(pid if _INT64_MIN <= pid <= _INT64_MAX else -1)
        self.tid.append(tid if _INT64_MIN <= tid <= _INT64_MAX else -1)
        self.ts.append(ts)
        self.dur.append(dur)
        self.dims.append(self._value(input_dims))
        self.types.append(self._value(input_type))
        self.concrete.append(self._value(concrete))
        self.grad.append(grad_mode)

    def extend(self, other: FlopColumns) -> None:
        names = [self._name(n) for n in other.names]
        values = [self._value(v) for v in other.values]
        self.name.extend(array("i", (names[i] for i in other.name)))
        for mine, theirs in ((self.dims, other.dims), (self.types, other.types), (self.concrete, other.concrete)):
            mine.extend(array("i", (values[i] for i in theirs)))
        self.pid.extend(other.pid)
        self.tid.extend(other.tid)
        self.ts.extend(other.ts)
        self.dur.extend(other.dur)
        self.grad.extend(other.grad)


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class FlopOps(SequenceABC[FlopOp]):
    """A trace's `FlopOp`s held as columns (`FlopColumns`, as numpy arrays): read one by
    one, each is a `FlopOp` made on the spot."""

    __slots__ = ("_names", "_name", "_pid", "_tid", "_ts", "_dur", "_values", "_dims", "_types", "_concrete",
                 "_grad")

    def __init__(self, ops: FlopColumns) -> None:
        self._names, self._values = ops.names, ops.values
        self._name = np.frombuffer(ops.name, dtype=np.intc)
        self._pid = np.frombuffer(ops.pid, dtype=np.int64)
        self._tid = np.frombuffer(ops.tid, dtype=np.int64)
        self._ts = np.frombuffer(ops.ts, dtype=np.float64)
        self._dur = np.frombuffer(ops.dur, dtype=np.float64)
        self._dims = np.frombuffer(ops.dims, dtype=np.intc)
        self._types = np.frombuffer(ops.types, dtype=np.intc)
        self._concrete = np.frombuffer(ops.concrete, dtype=np.intc)
        self._grad = np.frombuffer(ops.grad, dtype=np.int8)

    def __len__(self) -> int:
        return len(self._ts)

    def _op(self, i: int) -> FlopOp:
        v = self._values
        return FlopOp(name=self._names[self._name[i]], pid=int(self._pid[i]), tid=int(self._tid[i]),
                      ts_us=float(self._ts[i]), dur_us=float(self._dur[i]), input_dims=v[self._dims[i]],
                      input_type=v[self._types[i]], concrete=v[self._concrete[i]], grad_mode=bool(self._grad[i]))

    @overload
    def __getitem__(self, i: int) -> FlopOp: ...
    @overload
    def __getitem__(self, i: slice) -> list[FlopOp]: ...

    def __getitem__(self, i: int | slice) -> FlopOp | list[FlopOp]:
        if isinstance(i, slice):
            return [self._op(k) for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._op(i % len(self) if i < 0 else i)

    def __iter__(self) -> Iterator[FlopOp]:
        return (self._op(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FlopOps):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def within(self, lo: float, hi: float) -> list[FlopOp]:
        """The operators starting in [lo, hi) with a duration that is not negative, in
        file order."""
        return [self._op(int(i)) for i in np.flatnonzero((self._ts >= lo) & (self._ts < hi) & (self._dur >= 0))]


@dataclass(frozen=True)
class Trace:
    """One rank's trace as columns. Times are the file's microseconds."""

    path: str
    distributed: DistributedInfo | None
    device_properties: tuple[dict[str, Any], ...]
    base_time_ns: int | None
    names: tuple[str, ...]  # name_id -> name
    cats: tuple[str, ...]  # cat_id -> category
    gpu: GpuEvents
    cpu: CpuOps
    launches: Launches
    steps: tuple[StepMark, ...]
    collectives: tuple[CollectiveEvent, ...]
    n_events: int
    ts_fractional: bool
    """True when some ``ts`` is a JSON float or missing: HTA then rounds every event
    inward to whole microseconds (start up, end down)."""
    min_ts_us: float
    """Earliest start among events with a category and a duration (HTA's origin)."""
    flop_ops: FlopOps
    """Host operators with a FLOP rule (``cpu_op``), in file order."""
    memory: MemoryEvents = field(default_factory=_no_memory_events)
    """``[memory]`` events; empty unless the profiler recorded allocations."""

    @property
    def rank(self) -> int | None:
        return self.distributed.rank if self.distributed else None


# --------------------------------------------------------------------------- scalars
def _as_int(v: Any, default: int = -1) -> int:
    """Integer value of a JSON scalar, ``default`` when it is not one or overflows."""
    if type(v) is int:
        return v if -(1 << 63) <= v < (1 << 63) else default
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return default
    return i if -(1 << 63) <= i < (1 << 63) else default


def _as_opt_int(v: Any) -> int | None:
    return None if v is None else _as_int(v, default=-1)


def _int_column(values: Sequence[Any],
                dtype: type[np.generic] = np.int64) -> npt.NDArray[np.integer]:
    if dtype is _ID:
        try:
            return np.fromiter(values, dtype=np.int32, count=len(values))
        except (OverflowError, TypeError, ValueError):  # a value beyond int32, or not an int
            dtype = np.int64
    try:
        return np.fromiter(values, dtype=dtype, count=len(values))
    except (OverflowError, TypeError, ValueError):
        return np.array([_as_int(v) for v in values], dtype=dtype)


def _float_column(values: Sequence[Any]) -> F64:
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (OverflowError, TypeError, ValueError):
        return np.array([float(v) if isinstance(v, (int, float)) else np.nan
                         for v in values], dtype=np.float64)


def _pg_ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, list) and all(isinstance(r, int) for r in v):
        return tuple(v)
    return None


def _raw_value(raw: msgspec.Raw) -> Any:
    if not len(raw):
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


# --------------------------------------------------------------------------- extraction
_ID = np.signedinteger
"""The dtype of an id column in `_Columns` (`IDS`): each block's chunk int32 when its
values fit, else int64."""


class _Columns:
    """Column lists of one table for the current block, turned into numpy chunks at
    the end of each block and joined (column by column, to bound memory) at the end."""

    def __init__(self, **dtypes: type[np.generic]) -> None:
        self.dtypes = dtypes
        self.lists: list[list[Any]] = [[] for _ in dtypes]
        self.chunks: list[list[npt.NDArray[Any]]] = [[] for _ in dtypes]

    def appenders(self) -> list[Any]:
        """Bound ``append`` of each column list (in ``dtypes`` order), for hot loops."""
        return [col.append for col in self.lists]

    def append(self, *row: Any) -> None:
        for col, value in zip(self.lists, row):
            col.append(value)

    def flush(self) -> None:
        if not self.lists[0]:
            return
        for values, chunks, dtype in zip(self.lists, self.chunks, self.dtypes.values()):
            chunks.append(_int_column(values, dtype) if issubclass(dtype, np.integer)
                          else _float_column(values))
            values.clear()

    def extend(self, raw: Sequence[bytes]) -> None:
        """Append columns the C scanner wrote (int64 or float64 bytes, in ``dtypes``
        order) as one chunk each, typed as `flush` types the lists' values."""
        if not raw[0]:
            return
        self.flush()
        for chunks, (name, dtype), b in zip(self.chunks, self.dtypes.items(), raw):
            if dtype is np.float64:
                chunks.append(np.frombuffer(b, np.float64))
                continue
            col = np.frombuffer(b, np.int64)
            if name in _NARROWED:  # (as the joined column will be)
                col = col.astype(_narrowest([col]) or dtype)
            elif dtype is _ID:
                if -(1 << 31) <= int(col.min()) and int(col.max()) < (1 << 31):
                    col = col.astype(np.int32)
            elif dtype is not np.int64:
                col = col.astype(dtype)
            chunks.append(col)

    def arrays(self, release: bool = True) -> dict[str, npt.NDArray[Any]]:
        """The columns; with `release`, the heap handed back after each is joined."""
        self.flush()
        out = {}
        for i, (name, dtype) in enumerate(self.dtypes.items()):
            chunks, self.chunks[i] = self.chunks[i], []
            narrow = _narrowest(chunks) if release and name in _NARROWED else None
            out[name] = (np.concatenate(chunks, dtype=narrow) if chunks else
                         np.empty(0, np.int32 if dtype is _ID else dtype))
            del chunks
            if release:
                release_memory()  # the chunks' pages, before the next column is joined
        return out


_NARROWED = ("name_id", "cat_id")
"""Columns that index a trace's names or categories: a trace holds hundreds, so the
joined column is int8 or int16 where its ids fit (`NAME_IDS`; at 200 MB of trace, 2.4
MB of the 20 MiB of columns)."""


def _narrowest(chunks: Sequence[npt.NDArray[Any]]) -> type[np.signedinteger[Any]] | None:
    top = max((int(c.max()) for c in chunks if c.size), default=0)
    low = min((int(c.min()) for c in chunks if c.size), default=0)
    for t in (np.int8, np.int16, np.int32):
        info = np.iinfo(t)
        if info.min <= low and top <= info.max:
            return t
    return None


def _libc_trim() -> Callable[[], None]:
    try:
        import ctypes

        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: None if trim(0) else None


release_memory = _libc_trim()
"""Give the freed heap back to the system (glibc's ``malloc_trim``; nothing elsewhere).
The chunks of a column are freed as scattered pieces the next column's array cannot
reuse: without it a 1 GB trace peaked at 333 MB (the columns twice), with it at 213 MB."""


class _Sink(Protocol):
    """What the block-wise reader hands each block's events and the metadata to, and the
    decoders it decodes them with."""

    events_decoder: msgspec.json.Decoder[Any]
    doc_decoder: msgspec.json.Decoder[Any]

    def add(self, events: list[Any]) -> None: ...

    def add_json(self, body: bytes | bytearray | memoryview) -> bool: ...

    def add_meta(self, doc: Any) -> None: ...


_FLAGS_OF: dict[str, int] = {}
"""A name's flags (`_STEP` | `_SYNC` | `_COMM` | `_FLOP`), worked out once per process."""
_FLAGS_KEPT = 1 << 17


class _Extractor:
    """Turns decoded events into columns, one block at a time."""

    events_decoder = _EVENTS
    doc_decoder = _DOC

    def __init__(self, python_functions: bool, numbering: _Extractor | None = None) -> None:
        """``numbering``: an extractor whose names and categories (and their scanner) this
        one shares: one thread's blocks, each its own extractor, number each name once;
        ``name_order``/``cat_order`` then say which ids each block met, in the order it
        first met them, and the blocks are joined by them (`trace_parallel._join`)."""
        self.cpu_cats = CPU_OP_CATEGORIES | ({"python_function"} if python_functions else set())
        self.names: list[str] = []
        self.name_ids: dict[str | None, int] = {}
        self.name_flags: list[int] = []  # _STEP | _SYNC | _COMM bits per name id
        self.cat_ids: dict[str, int] = {}
        self.numbering = numbering
        self.name_order: list[int] = []
        self.cat_order: list[int] = []
        if numbering is not None:
            self.names, self.name_ids, self.name_flags = numbering.names, numbering.name_ids, numbering.name_flags
            self.cat_ids = numbering.cat_ids
        ids, i64, f64 = np.int32, np.int64, np.float64
        self.gpu = _Columns(name_id=ids, cat_id=ids, stream=_ID, device=_ID,
                            correlation=_ID, external_id=_ID, ts_us=f64, dur_us=f64)
        self.cpu = _Columns(name_id=ids, cat_id=ids, pid=_ID, tid=_ID, external_id=_ID,
                            ts_us=f64, dur_us=f64)
        self.launches = _Columns(name_id=ids, tid=_ID, correlation=_ID, ts_us=f64,
                                 dur_us=f64)
        self.memory = _Columns(ts_us=f64, nbytes=i64, total_allocated=i64, total_reserved=i64,
                               device_type=i64)
        self.steps: list[StepMark] = []
        self.collectives: list[CollectiveEvent] = []
        self.flop_ops = FlopColumns()
        self.n_events = 0
        self.ts_fractional = False
        self.min_ts: float = float("inf")
        self.meta: dict[str, Any] = {}
        self._scanner: Any = None
        self._values: dict[bytes, Any] = {} if numbering is None else numbering._values  # by JSON text

    def _value(self, raw: msgspec.Raw) -> Any:
        """A recorded argument's value (shapes, types), decoded once per distinct text: a
        training step calls the same operators with the same shapes every step, and their
        operators share one read-only value (a 200 MB trace: 14,835 FLOP operators, 2.2 MB
        of decoded lists without this)."""
        key = bytes(raw)
        try:
            return self._values[key]
        except KeyError:
            value = self._values[key] = _raw_value(raw)
            return value

    def _intern_name(self, name: str | None) -> tuple[int, int]:
        """For the C scanner: a name's id (given now if new) and flags."""
        nid = self.name_ids.get(name)
        if nid is None:
            nid = self._name_id(name)
        return nid, self.name_flags[nid]

    def _intern_cat(self, cat: str) -> tuple[int, int]:
        """For the C scanner: a category's id (given now if new; -1 for the ``Trace``
        span, whose events are left out) and whether it is a CPU operator's."""
        cid = self.cat_ids.get(cat)
        if cid is None:
            if cat == "Trace":
                return -1, 0
            cid = self._cat_id(cat)
        return cid, int(cat in self.cpu_cats)

    def add_json(self, body: bytes | bytearray | memoryview) -> bool:
        """Sort one block of events (``[`` + events + ``]``, JSON) into the tables, as
        `add` sorts the decoded events: by the C scanner where it can (`SCAN`), else
        decoded by msgspec. False (nothing added) when the block is not a valid list of
        events."""
        if SCAN:
            owner = self.numbering or self
            if owner._scanner is None:
                owner._scanner = _scan.Scanner(owner._intern_name, owner._intern_cat)
            got = owner._scanner.scan(body)
            if got is not None and self._add_scanned(body, got):
                if self.numbering is not None:
                    self._met(np.frombuffer(got[7], np.int64).tolist(), np.frombuffer(got[8], np.int64).tolist())
                return True
        events = _decode_events(body, self.events_decoder)
        if events is None:
            return False
        self.add(events)
        if self.numbering is not None:
            self._met(*self._order_of(events))
        return True

    def _met(self, names: list[int], cats: list[int]) -> None:
        """Note the ids a block met, in order, after those met before (a block may come
        in pieces)."""
        for order, new in ((self.name_order, names), (self.cat_order, cats)):
            if not order:
                order += new
                continue
            known = set(order)
            order += [i for i in new if i not in known]

    def _order_of(self, events: list[_Event]) -> tuple[list[int], list[int]]:
        """The name and category ids `add` numbered these events by, in the order it met
        them (what the scanner reports of its blocks)."""
        names: dict[int, None] = {}
        cats: dict[int, None] = {}
        for e in events:
            if e.dur is None or e.cat is None:
                continue
            cid = self.cat_ids.get(e.cat)
            if cid is None:  # the Trace span
                continue
            cats[cid] = None
            if e.ts is not None:
                names[self.name_ids[e.name]] = None
        return list(names), list(cats)

    def _add_scanned(self, body: bytes | bytearray | memoryview, got: tuple[Any, ...]) -> bool:
        n_events, fractional, min_ts, gpu, cpu, launches, rare = got[:7]
        events: list[_Event] = []
        if rare:
            offsets = np.frombuffer(rare, np.int64).tolist()
            with memoryview(body) as view:
                text = b"".join((b"[", b",".join(view[s:e] for s, e in zip(offsets[::2], offsets[1::2])), b"]"))
            decoded = _decode_events(text, self.events_decoder)
            if decoded is None:  # (the scanner read them: not expected) the block as msgspec reads it
                return False
            events = decoded
        self.n_events += n_events
        self.ts_fractional = self.ts_fractional or fractional
        if min_ts is not None and min_ts < self.min_ts:
            self.min_ts = min_ts
        self.gpu.extend(gpu)
        self.cpu.extend(cpu)
        self.launches.extend(launches)
        self._rare(events)
        self.memory.flush()
        return True

    def _rare(self, events: list[_Event]) -> None:
        """What `add` does with the events the scanner handed back, but the columns it
        wrote: steps, collectives, FLOP operators and allocation records."""
        flags = self.name_flags
        for e in events:
            if e.dur is None:
                if e.name == "[memory]" and e.args is not None and e.ts is not None:
                    self._memory_event(e.ts, e.args)
                continue
            cat = e.cat
            nid = self.name_ids[e.name]
            a = e.args
            if a is not None and a.stream is not None:
                stream = a.stream if type(a.stream) is int else _as_int(a.stream)
                if stream != -1:
                    if flags[nid]:
                        self._flagged(e, a, nid, cat or "", gpu_stream=stream, launch=False)
                    elif a.collective_name is not None:
                        self._collective(e, a, self.names[nid], cat or "", stream, on_gpu=True)
                    continue
            if flags[nid]:
                self._flagged(e, a, nid, cat or "", gpu_stream=None, launch=False)
            elif a is not None and a.collective_name is not None:
                self._collective(e, a, self.names[nid], cat or "", _as_int(e.tid), on_gpu=False)

    def _name_id(self, name: str | None) -> int:
        nid = self.name_ids[name] = len(self.names)
        # one string per name in the process: the blocks decoded in parallel each number
        # their names, and the steps, collectives and FLOP operators of each hold them
        text = sys.intern(name) if name else ""
        self.names.append(text)
        flags = _FLAGS_OF.get(text)
        if flags is None:  # each block decoded in parallel meets the trace's names again
            if len(_FLAGS_OF) > _FLAGS_KEPT:
                _FLAGS_OF.clear()
            flags = _FLAGS_OF[text] = (
                (_STEP if "ProfilerStep" in text else 0)
                | (_SYNC if text in SYNC_EVENT_NAMES else 0)
                | (_COMM if text.startswith(_COMM_ANNOTATION_PREFIXES) or text.startswith(_C10D_PREFIX) else 0)
                | (_FLOP if FLOP_OP_NAMES.match(text) else 0))
        self.name_flags.append(flags)
        return nid

    def _cat_id(self, cat: str) -> int:
        cid = self.cat_ids[cat] = len(self.cat_ids)
        return cid

    def add_meta(self, doc: _Doc) -> None:
        for key in ("distributedInfo", "deviceProperties", "baseTimeNanoseconds"):
            value = getattr(doc, key)
            if value is not None and key not in self.meta:
                self.meta[key] = value

    def add(self, events: list[_Event]) -> None:  # noqa: C901 - the hot loop, kept flat
        """Sort one block's events into the tables (HTA keeps events with a ``dur``
        and a ``cat``, except the ``Trace`` span)."""
        self.n_events += len(events)
        if not self.ts_fractional:
            self.ts_fractional = any(type(e.ts) is not int for e in events)
        g_name, g_cat, g_stream, g_dev, g_corr, g_ext, g_ts, g_dur = self.gpu.appenders()
        c_name, c_cat, c_pid, c_tid, c_ext, c_ts, c_dur = self.cpu.appenders()
        l_name, l_tid, l_corr, l_ts, l_dur = self.launches.appenders()
        cpu_cats = self.cpu_cats
        name_ids = self.name_ids
        flags = self.name_flags
        cat_ids = self.cat_ids
        min_ts = self.min_ts
        for e in events:
            dur = e.dur
            if dur is None:
                if e.name == "[memory]" and e.args is not None and e.ts is not None:
                    self._memory_event(e.ts, e.args)
                continue
            cat = e.cat
            if cat is None:
                continue
            cid = cat_ids.get(cat)
            if cid is None:
                if cat == "Trace":
                    continue
                cid = self._cat_id(cat)
            ts = e.ts
            if ts is None:
                continue
            if ts < min_ts:
                min_ts = ts
            nid = name_ids.get(e.name)
            if nid is None:
                nid = self._name_id(e.name)
            a = e.args
            if a is not None and a.stream is not None:
                # HTA's normalize_gpu_stream_numbers: int(value), -1 when impossible
                stream = a.stream if type(a.stream) is int else _as_int(a.stream)
                if stream != -1:
                    g_name(nid)
                    g_cat(cid)
                    g_stream(stream)
                    g_dev(-1 if a.device is None else a.device)
                    g_corr(-1 if a.correlation is None else a.correlation)
                    g_ext(-1 if a.external_id is None else a.external_id)
                    g_ts(ts)
                    g_dur(dur)
                    if flags[nid]:
                        self._flagged(e, a, nid, cat, gpu_stream=stream)
                    elif a.collective_name is not None:
                        self._collective(e, a, self.names[nid], cat, stream, on_gpu=True)
                    continue
            if cat in cpu_cats:
                pid = e.pid
                tid = e.tid
                c_name(nid)
                c_cat(cid)
                c_pid(pid if type(pid) is int else -1)
                c_tid(tid if type(tid) is int else -1)
                c_ext(-1 if a is None or a.external_id is None else a.external_id)
                c_ts(ts)
                c_dur(dur)
            if flags[nid]:
                self._flagged(e, a, nid, cat, gpu_stream=None)
                continue
            if a is not None:
                if a.correlation is not None:
                    tid = e.tid
                    l_name(nid)
                    l_tid(tid if type(tid) is int else -1)
                    l_corr(a.correlation)
                    l_ts(ts)
                    l_dur(dur)
                if a.collective_name is not None:
                    self._collective(e, a, self.names[nid], cat, _as_int(e.tid), on_gpu=False)
        self.min_ts = min_ts
        self.gpu.flush()
        self.cpu.flush()
        self.launches.flush()
        self.memory.flush()

    def _memory_event(self, ts: float, a: _Args) -> None:
        total = _as_int(a.total_allocated)
        if total == -1:  # not an allocator's record
            return
        self.memory.append(ts, _as_int(a.nbytes, 0), total, _as_int(a.total_reserved, 0),
                           _as_int(a.device_type))

    def _flagged(self, e: _Event, a: _Args | None, nid: int, cat: str,
                 gpu_stream: int | None, launch: bool = True) -> None:
        """Rare events whose name matters: steps, sync events, comm annotations
        (``launch``: add its launch row; the C scanner has written it)."""
        f = self.name_flags[nid]
        name = self.names[nid]
        if f & _STEP:
            corr = -1 if a is None else _as_int(a.correlation)
            hta_gpu = gpu_stream is not None and gpu_stream >= 0 and corr >= 0
            self.steps.append(StepMark(name, cat, float(e.ts or 0), float(e.dur or 0),
                                       hta_gpu))
        if a is None:
            return
        if f & _FLOP and gpu_stream is None and cat == "cpu_op":
            pid, tid = e.pid, e.tid
            self.flop_ops.add(name, pid if type(pid) is int else -1, tid if type(tid) is int else -1,
                              float(e.ts or 0), float(e.dur or 0), self._value(a.input_dims),
                              self._value(a.input_type), self._value(a.concrete), a.sequence_nr is not None)
        if launch and gpu_stream is None and a.correlation is not None and not f & _SYNC:
            tid = e.tid
            self.launches.append(nid, tid if type(tid) is int else -1, a.correlation,
                                 e.ts, e.dur)
        if a.collective_name is not None or f & _COMM:
            on_gpu = gpu_stream is not None
            self._collective(e, a, name, cat, gpu_stream if gpu_stream is not None
                             else _as_int(e.tid), on_gpu=on_gpu)

    def _collective(self, e: _Event, a: _Args, name: str, cat: str, tid: int,
                    on_gpu: bool) -> None:
        cname = a.collective_name
        dtype = a.dtype
        self.collectives.append(CollectiveEvent(
            name=name, cat=cat, on_gpu=on_gpu, ts_us=float(e.ts or 0), dur_us=float(e.dur or 0),
            tid=tid, correlation=_as_int(a.correlation), external_id=_as_int(a.external_id),
            collective_name=cname if isinstance(cname, str) else None,
            in_msg_nelems=_as_opt_int(a.in_msg_nelems),
            out_msg_nelems=_as_opt_int(a.out_msg_nelems),
            dtype=dtype if isinstance(dtype, str) else None,
            group_size=_as_opt_int(a.group_size),
            pg_name=None if a.pg_name is None else str(a.pg_name),
            pg_desc=None if a.pg_desc is None else str(a.pg_desc),
            pg_ranks=_pg_ranks(a.pg_ranks),
            input_dims=self._value(a.input_dims), input_type=self._value(a.input_type)))

    def finish(self, path: str) -> Trace:
        self._scanner = None  # it holds this extractor's methods: no cycle left behind
        flop_ops, self.flop_ops = FlopOps(self.flop_ops), FlopColumns()
        return Trace(
            path=path,
            distributed=_distributed_info(self.meta.get("distributedInfo")),
            device_properties=tuple(d for d in self.meta.get("deviceProperties") or ()
                                    if isinstance(d, dict)),
            base_time_ns=_as_opt_int(self.meta.get("baseTimeNanoseconds")),
            names=tuple(self.names),
            cats=tuple(self.cat_ids),
            gpu=GpuEvents(**self.gpu.arrays()),
            cpu=CpuOps(**self.cpu.arrays()),
            launches=Launches(**self.launches.arrays()),
            steps=tuple(self.steps),
            collectives=tuple(self.collectives),
            n_events=self.n_events,
            ts_fractional=self.ts_fractional,
            min_ts_us=float(self.min_ts) if self.min_ts != float("inf") else 0.0,
            flop_ops=flop_ops,
            memory=MemoryEvents(**self.memory.arrays()),
        )


def _distributed_info(d: Any) -> DistributedInfo | None:
    if not isinstance(d, dict):
        return None
    pgs = []
    for pg in d.get("pg_config") or ():
        if isinstance(pg, dict):
            ranks = pg.get("ranks")
            pgs.append(ProcessGroupConfig(
                name=str(pg.get("pg_name", "")), desc=str(pg.get("pg_desc", "")),
                backend_config=str(pg.get("backend_config", "")),
                size=_as_opt_int(pg.get("pg_size")),
                ranks=_pg_ranks(ranks) or ()))
    backend = d.get("backend")
    nccl = d.get("nccl_version")
    return DistributedInfo(
        rank=_as_opt_int(d.get("rank")), world_size=_as_opt_int(d.get("world_size")),
        backend=backend if isinstance(backend, str) else None,
        nccl_version=nccl if isinstance(nccl, str) else None, pg_config=tuple(pgs))


# --------------------------------------------------------------------------- decoding
def _decode_events(body: bytes | bytearray | memoryview, decoder: msgspec.json.Decoder[Any] = _EVENTS) -> list[Any] | None:
    """Decode ``[ ... ]`` of events; retry once with invalid UTF-8 replaced."""
    events: list[Any]
    try:
        events = decoder.decode(body)
        return events
    except msgspec.DecodeError as exc:
        if "UTF-8" not in str(exc):
            return None
    except msgspec.ValidationError:
        return None
    try:
        events = decoder.decode(str(body, "utf-8", "replace").encode("utf-8"))
        return events
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _decode_doc(data: bytes, decoder: msgspec.json.Decoder[Any] = _DOC) -> Any:
    """Decode a whole document; raises msgspec errors."""
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        if "UTF-8" not in str(exc):
            raise
    return decoder.decode(data.decode("utf-8", "replace").encode("utf-8"))


def _open(path: Path) -> io.BufferedIOBase:
    """The file's bytes, gunzipped when it is gzip (by content, not by name)."""
    with open(path, "rb") as raw:
        magic = raw.read(2)
    return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")


def _pick_separator(data: bytes | bytearray) -> bytes | None:
    """The byte string between two top-level events, as this file writes it: the most
    common in the first 64 KB (hundreds of events; a writer uses one throughout), or in
    the first MB when there is none there (events that long)."""
    for limit in (1 << 16, 1 << 20):
        found = Counter(m.group() for m in _SEPARATOR.finditer(data, 0, min(len(data), limit)))
        if found or limit >= len(data):
            return found.most_common(1)[0][0] if found else None
    return None


def _cut_and_decode(buf: bytearray, sep: bytes, ex: _Sink) -> bytearray | None:
    """Decode the events in ``buf`` (``[`` + events text) before its last separator.

    The byte after the cut's ``}`` (a comma or blank) becomes ``]`` so the part
    before it decodes in place, without a copy. Returns ``[`` + the rest, or ``buf``
    unchanged when it has no separator yet. Earlier separators are tried when a cut
    does not decode (a separator-like string after the list, e.g. in trailing
    metadata); ``None`` when none decodes.
    """
    end = len(buf)
    for _ in range(_MAX_CUT_RETRIES):
        k = buf.rfind(sep, 0, end)
        if k < 0:
            return buf if end == len(buf) else None
        saved = buf[k + 1]
        buf[k + 1] = ord("]")
        if ex.add_json(memoryview(buf)[: k + 2]):
            rest = bytearray(b"[")
            rest += memoryview(buf)[k + len(sep) - 1:]
            return rest
        buf[k + 1] = saved
        end = k
    return None


def _read_list_head(f: io.BufferedIOBase, path: Path, ex: _Sink, block: int) -> tuple[int, bytearray] | None:
    """Read up to the event list, decode the metadata before it into ``ex``; (the
    offset of the first event, ``[`` + what was read after the list's opening), or None
    when the layout is not the usual one."""
    head = f.read(block)
    if not head or head.isspace():
        raise TraceError(f"{path.name}: empty file")
    while (i := head.find(_KEY)) < 0 or len(head) - i < 64:
        more = f.read(block) if len(head) <= _HEAD_LIMIT else b""
        if not more:
            break
        head += more
    if i < 0:
        return None
    m = _ARRAY_OPEN.match(head, i + len(_KEY))
    if m is None:
        return None
    try:
        ex.add_meta(_decode_doc(head[:i] + b'"traceEvents": []}', ex.doc_decoder))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    buf = bytearray(b"[")
    buf += memoryview(head)[m.end():]
    return m.end(), buf


def _decode_blockwise(path: Path, ex: _Sink, block: int) -> bool:
    """Block-wise decoding; False when the layout is not the usual one."""
    with _open(path) as f:
        got = _read_list_head(f, path, ex, block)
        if got is None:
            return False
        buf = got[1]
        sep: bytes | None = None
        while True:
            if sep is None:
                sep = _pick_separator(buf)
            if sep is not None:
                left = _cut_and_decode(buf, sep, ex)
                if left is None:
                    return False
                buf = left
            chunk = f.read(block)
            if not chunk:
                break
            if len(buf) > _HEAD_LIMIT:
                return False
            buf += chunk
            del chunk
    return _decode_tail(path, buf, ex)


def _decode_tail(path: Path, rest: bytearray, ex: _Sink) -> bool:
    """Decode the last events (``rest`` = ``[`` + text) and the trailing metadata."""
    try:
        doc = _decode_doc(b'{"traceEvents":' + rest, ex.doc_decoder)
    except msgspec.ValidationError:  # a subclass of DecodeError
        return False
    except msgspec.DecodeError as exc:
        if "truncated" in str(exc):
            raise TraceError(f"{path.name}: truncated trace (the file ends inside the "
                             "event list)") from None
        return False
    ex.add(doc.traceEvents or [])
    ex.add_meta(doc)
    return True


def _decode_whole(path: Path, ex: _Sink) -> None:
    with _open(path) as f:
        data = f.read()
    if not data.strip():
        raise TraceError(f"{path.name}: empty file")
    try:
        doc = _decode_doc(data, ex.doc_decoder)
    except msgspec.ValidationError as exc:  # a subclass of DecodeError
        raise TraceError(f"{path.name}: not a Kineto trace ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{path.name}: not valid JSON ({exc})") from None
    del data
    if doc.traceEvents is None:
        raise TraceError(f"{path.name}: not a Kineto trace (no traceEvents list)")
    ex.add_meta(doc)
    ex.add(doc.traceEvents)


@contextmanager
def _errors_as_trace_error(path: Path) -> Iterator[None]:
    try:
        yield
    except TraceError:
        raise
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path.name}: truncated or corrupt gzip data ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read ({exc.strerror or exc})") from None
    except (msgspec.MsgspecError, ValueError, TypeError, MemoryError) as exc:
        raise TraceError(f"{path.name}: unreadable trace ({type(exc).__name__}: "
                         f"{exc})") from None


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside (restored after): what is built here holds
    no cycles, and each collection would scan the whole growing heap again (building the
    replay model of 1,024 ranks took 37.6 s with it, 19.3 s without)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_trace(path: str | Path, *, block_bytes: int = BLOCK_BYTES,
               python_functions: bool = False, workers: int | None = None) -> Trace:
    """Load a ``.json`` or ``.json.gz`` Kineto trace (gzip is detected by content).

    ``python_functions`` also keeps ``python_function`` ranges in ``Trace.cpu``
    (traces recorded ``with_stack`` have millions of them). ``workers``: processes
    that decode a large file's blocks in parallel (`trace_parallel`; None: one per
    core this process may use; 1: this process alone). The result is the same.
    Raises ``TraceError`` for an unreadable, truncated, empty or non-trace file.
    """
    p = Path(path)
    from pardiag.analyzers import trace_parallel

    n = trace_parallel.cores() if workers is None else workers
    if trace_parallel.worth_it(p, n):
        got = trace_parallel.load_parallel(p, n, python_functions)
        if got is not None:
            return got
    with _errors_as_trace_error(p), gc_paused():
        ex = _Extractor(python_functions)
        if not _decode_blockwise(p, ex, block_bytes):
            ex = _Extractor(python_functions)
            _decode_whole(p, ex)
        return ex.finish(str(p))


# --------------------------------------------------------------------------- raw events
class RawEvent(msgspec.Struct, gc=False):
    """A trace event as the file holds it, for readers that pass events on (the merged
    export): the trace-event fields by name, ``args`` kept as its undecoded JSON text
    (empty when absent)."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Any = None
    tid: Any = None
    ts: int | float | None = None
    dur: int | float | None = None
    id: Any = None
    bp: str | None = None
    s: str | None = None
    args: msgspec.Raw = _NO_RAW


class _RawDoc(msgspec.Struct):
    traceEvents: list[RawEvent] | None = None


class _Delivery(Exception):
    """The callback of ``stream_events`` failed: its own error, not the trace's."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


class _RawSink:
    """Hands each block's events to a callback as they are decoded."""

    events_decoder = msgspec.json.Decoder(list[RawEvent])
    doc_decoder = msgspec.json.Decoder(_RawDoc)

    def __init__(self, on_events: Callable[[list[RawEvent]], None]) -> None:
        self.on_events = on_events
        self.delivered = 0

    def add_json(self, body: bytes | bytearray | memoryview) -> bool:
        events = _decode_events(body, self.events_decoder)
        if events is None:
            return False
        self.add(events)
        return True

    def add(self, events: list[RawEvent]) -> None:
        self.delivered += len(events)
        try:
            self.on_events(events)
        except Exception as exc:  # kept apart from the reader's errors (a full disk is no bad trace)
            raise _Delivery(exc) from exc

    def add_meta(self, doc: Any) -> None:
        pass


def stream_events(path: str | Path, on_events: Callable[[list[RawEvent]], None], *,
                  block_bytes: int = BLOCK_BYTES) -> int:
    """Read a trace block by block (as ``load_trace`` does, in bounded memory) and call
    ``on_events`` with each block's events, in file order; returns how many there were.
    Raises ``TraceError`` for an unreadable, truncated, empty or non-trace file (after
    some blocks may have been delivered: a reader that writes as it goes checks the file
    with ``load_trace`` first)."""
    p = Path(path)
    sink = _RawSink(on_events)
    try:
        with _errors_as_trace_error(p), gc_paused():
            if not _decode_blockwise(p, sink, block_bytes):
                if sink.delivered:
                    raise TraceError(f"{p.name}: the event list could not be cut into blocks after "
                                     f"{sink.delivered} events")
                _decode_whole(p, sink)
    except _Delivery as d:
        raise d.exc from None
    return sink.delivered


# --------------------------------------------------------------------------- rank
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
HEAD_KEYS = ("distributedInfo", "deviceProperties", "host_name", "otherData")
"""The metadata ``trace_head`` reads: what Kineto writes before the event list (and the
``otherData`` that ``pardiag export`` writes before its own)."""
EXPORT_MARK = {"export": "perfetto"}
"""In ``otherData.pardiag`` of a file ``pardiag export`` wrote: the whole job, not one
rank's trace (a reader of a folder of traces leaves it out)."""


def is_merged_export(head: dict[str, Any]) -> bool:
    """Whether a trace's head (``trace_head``) is that of a ``pardiag export`` file."""
    other = head.get("otherData")
    mine = other.get("pardiag") if isinstance(other, dict) else None
    return isinstance(mine, dict) and all(mine.get(k) == v for k, v in EXPORT_MARK.items())


def rank_of(path: str | Path) -> int | None:
    """The trace's rank, reading only the head of the file.

    ``distributedInfo.rank`` from the metadata before the event list (where Kineto
    writes it); else a number after ``rank`` in the file name (``rank-3.json.gz``,
    ``sampled_rank-0.json.gz``); else the last number in the file name; else None.
    """
    p = Path(path)
    info = _head_values(_read_head(p), ("distributedInfo",)).get("distributedInfo")
    if isinstance(info, dict) and type(info.get("rank")) is int:
        return int(info["rank"])
    m = _RANK_IN_NAME.search(p.name)
    if m is None:
        numbers = re.findall(r"\d+", p.name.split(".")[0])
        return int(numbers[-1]) if numbers else None
    return int(m.group(1))


def trace_head(path: str | Path) -> dict[str, Any]:
    """The metadata Kineto writes before the event list (``distributedInfo``,
    ``deviceProperties``, ``host_name``), from the first 256 kB of the file; {} for what
    is not there or not readable (the full parse still reads the trace)."""
    return _head_values(_read_head(Path(path)), HEAD_KEYS)


def _read_head(path: Path) -> str:
    """The first ``_RANK_HEAD_BYTES`` of the (gunzipped) file as text; "" if unreadable."""
    try:
        with _open(path) as f:
            return f.read(_RANK_HEAD_BYTES).decode("utf-8", "replace")
    except (OSError, EOFError, zlib.error):
        return ""


def _head_values(text: str, keys: Sequence[str]) -> dict[str, Any]:
    """The JSON value of each top-level ``keys`` found before ``"traceEvents"`` in ``text``."""
    end = text.find('"traceEvents"')
    end = end if end >= 0 else len(text)
    out: dict[str, Any] = {}
    for key in keys:
        quoted = f'"{key}"'
        i = text.find(quoted, 0, end)
        colon = text.find(":", i + len(quoted)) if i >= 0 else -1
        if colon < 0:
            continue
        start = colon + 1
        while start < len(text) and text[start].isspace():
            start += 1
        try:
            out[key], _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            continue
    return out
