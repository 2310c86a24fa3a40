"""The trace reader's C scanner (analyzers/_scan.c) against the msgspec path it stands in
for: the same Trace, column for column, on every real trace the tests hold and on
generated events of every shape the schema allows; the blocks it must hand back to
msgspec (and does); and that it is really used where it should be."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pardiag.analyzers import trace as tr
from tracegen import same_trace as same

pytestmark = pytest.mark.skipif(tr._scan is None, reason="the C scanner was not built (no C compiler)")

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures"
REAL = sorted([*(ROOT / "tests" / "data").rglob("*.json.gz"), *SHARED.rglob("*.json.gz")])


def both(monkeypatch: pytest.MonkeyPatch, path: Path, **kw: Any) -> tuple[tr.Trace, tr.Trace]:
    monkeypatch.setattr(tr, "SCAN", False)
    plain = tr.load_trace(path, workers=1, **kw)
    monkeypatch.setattr(tr, "SCAN", True)
    return plain, tr.load_trace(path, workers=1, **kw)


def extract(body: bytes, scan: bool, python_functions: bool = False) -> tr._Extractor | None:
    """One block through ``add_json``, scanner on or off; None when it does not decode."""
    saved = tr.SCAN
    tr.SCAN = scan
    try:
        ex = tr._Extractor(python_functions)
        return ex if ex.add_json(body) else None
    finally:
        tr.SCAN = saved


def traces_of(ex: tr._Extractor) -> tr.Trace:
    return ex.finish("block")


def scanned(body: bytes) -> bool:
    """Whether the scanner itself took the block (not msgspec)."""
    ex = tr._Extractor(False)
    return tr._scan.Scanner(ex._intern_name, ex._intern_cat).scan(body) is not None


@pytest.mark.skipif(not REAL, reason="no real traces found")
@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_every_real_trace_reads_the_same(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    plain, fast = both(monkeypatch, path)
    same(fast, plain)
    assert fast.n_events > 0
    # and the scanner read it (were it to hand every block back, both readers would be msgspec)
    scanned_blocks: list[bool] = []
    real = tr._Extractor._add_scanned
    monkeypatch.setattr(tr._Extractor, "_add_scanned",
                        lambda ex, body, got: (scanned_blocks.append(True), real(ex, body, got))[1])
    same(tr.load_trace(path, workers=1), plain)
    assert scanned_blocks


@pytest.mark.skipif(not (SHARED / "gpu-traces").exists(), reason="real GPU traces not found")
def test_a_real_gpu_trace_is_taken_by_the_scanner_block_by_block(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """Small blocks (many cuts) and python_function ranges kept: still the same, and the
    scanner (not msgspec) took every block."""
    src = SHARED / "gpu-traces" / "a100-2rank-rank0" / "nccl_data.json.gz"
    path = tmp_path / "t.json"
    path.write_bytes(gzip.decompress(src.read_bytes()))
    calls: list[bool] = []
    real = tr._scan.Scanner

    class Counting:
        def __init__(self, *a: Any) -> None:
            self.inner = real(*a)

        def scan(self, body: Any) -> Any:
            got = self.inner.scan(body)
            calls.append(got is not None)
            return got

    plain, _ = both(monkeypatch, path, block_bytes=64 << 10, python_functions=True)
    monkeypatch.setattr(tr._scan, "Scanner", Counting)
    fast = tr.load_trace(path, workers=1, block_bytes=64 << 10, python_functions=True)
    same(fast, plain)
    assert len(calls) > 20 and all(calls)
    assert len(fast.flop_ops) > 500 and len(fast.collectives) > 40 and len(fast.steps) >= 3


# --------------------------------------------------------------------------- shapes
def ev(**kw: Any) -> dict[str, Any]:
    return kw


KERNEL = ev(ph="X", cat="kernel", name="volta_sgemm", pid=0, tid=7, ts=100, dur=5,
            args={"stream": 7, "device": 0, "correlation": 11, "External id": 3, "grid": [1, 2, 3]})
CPU_OP = ev(ph="X", cat="cpu_op", name="aten::relu", pid=1, tid=2, ts=90.5, dur=3.25,
            args={"External id": 3, "Input Dims": [[4, 4]], "Ev Idx": 5})
LAUNCH = ev(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=1, tid=2, ts=95, dur=1,
            args={"correlation": 11, "cbid": 211})
MM = ev(ph="X", cat="cpu_op", name="aten::mm", pid=1, tid=2, ts=80, dur=9,
        args={"External id": 4, "Input Dims": [[8, 16], [16, 4]], "Input type": ["float", "float"],
              "Sequence number": 12, "correlation": 99})
STEP = ev(ph="X", cat="user_annotation", name="ProfilerStep#3", pid=1, tid=2, ts=70, dur=100)
COLL = ev(ph="X", cat="kernel", name="ncclDevKernel_AllReduce", pid=0, tid=9, ts=120, dur=30,
          args={"stream": 9, "device": 0, "correlation": 12, "Collective name": "allreduce",
                "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float", "Group size": 2,
                "Process Group Ranks": "[0, 1]"})
SYNC = ev(ph="X", cat="cuda_runtime", name="Event Sync", pid=1, tid=2, ts=130, dur=2, args={"correlation": 13})
MEMORY = ev(ph="i", cat="cpu_instant_event", name="[memory]", pid=1, tid=2, ts=85,
            args={"Bytes": 4096, "Total Allocated": 8192, "Total Reserved": 16384, "Device Type": 1})
TRACE_SPAN = ev(ph="X", cat="Trace", name="PyTorch Profiler (0)", pid="Spans", tid="PyTorch Profiler", ts=1, dur=999)
META = ev(ph="M", name="process_name", pid=0, tid=0, args={"name": "python"})
PYFN = ev(ph="X", cat="python_function", name="train.py(12): step", pid=1, tid=2, ts=75, dur=50)
GLOO = ev(ph="X", cat="user_annotation", name="gloo:all_reduce", pid=1, tid=5, ts=140, dur=8,
          args={"Collective name": "allreduce", "In msg nelems": 10, "Group size": 2})

ALL = [KERNEL, CPU_OP, LAUNCH, MM, STEP, COLL, SYNC, MEMORY, TRACE_SPAN, META, PYFN, GLOO]


def body(events: list[dict[str, Any]], indent: int | None = None) -> bytes:
    return json.dumps(events, indent=indent, ensure_ascii=False).encode()


def agree(text: bytes, python_functions: bool = False) -> tr.Trace | None:
    a, b = extract(text, False, python_functions), extract(text, True, python_functions)
    assert (a is None) == (b is None)
    if a is None or b is None:
        return None
    ta, tb = traces_of(a), traces_of(b)
    same(tb, ta)
    for table in ("gpu", "cpu", "launches", "memory"):  # the column types too
        x, y = getattr(ta, table), getattr(tb, table)
        for col in x.__dataclass_fields__:
            assert getattr(x, col).dtype == getattr(y, col).dtype, (table, col)
    return tb


@pytest.mark.parametrize("python_functions", [False, True])
@pytest.mark.parametrize("indent", [None, 1])
def test_every_kind_of_event_reads_as_msgspec_reads_it(python_functions: bool, indent: int | None) -> None:
    text = body(ALL, indent)
    assert scanned(text)
    t = agree(text, python_functions)
    assert t is not None
    # worked out by hand from ALL: kernels KERNEL, COLL; CPU ops CPU_OP, MM, STEP, GLOO (+ PYFN);
    # launches LAUNCH, MM (a FLOP operator with a correlation), not the Event Sync
    assert len(t.gpu) == 2 and list(t.gpu.stream) == [7, 9]
    assert len(t.cpu) == (5 if python_functions else 4)
    assert sorted(t.launches.correlation.tolist()) == [11, 99]
    assert [s.name for s in t.steps] == ["ProfilerStep#3"]
    assert [c.collective_name for c in t.collectives] == ["allreduce", "allreduce"]
    assert [f.name for f in t.flop_ops] == ["aten::mm"] and t.flop_ops[0].input_dims == [[8, 16], [16, 4]]
    assert len(t.memory) == 1 and t.memory.total_allocated[0] == 8192
    assert t.n_events == len(ALL) and t.ts_fractional  # CPU_OP's ts is a float, META has none
    assert t.min_ts_us == 70.0  # the Trace span (ts 1) is left out


VARIANTS: list[tuple[str, dict[str, Any], bool]] = [
    # (what, the kernel event changed so, whether the scanner keeps the block)
    ("string pid and tid", {"pid": "Spans", "tid": "stream 7"}, True),
    ("float pid", {"pid": 3.0}, True),
    ("bool tid", {"tid": True}, True),
    ("null name", {"name": None}, True),
    ("no name", {"name": ...}, True),
    ("empty name", {"name": ""}, True),
    ("null ts", {"ts": None}, True),
    ("null dur", {"dur": None}, True),
    ("null args", {"args": None}, True),
    ("stream -1", {"args": {"stream": -1, "correlation": 5}}, True),
    ("null stream", {"args": {"stream": None, "correlation": 5}}, True),
    ("exponent ts", {"ts": 1.5e3}, True),
    ("negative zero", {"ts": -0.0, "dur": -0}, True),
    ("big int skipped", {"args": {"stream": 7, "Python id": 123456789012345678901234567890}}, True),
    ("int32-overflowing ids", {"args": {"stream": 7, "correlation": 1 << 40, "device": 1 << 33}}, True),
    ("unicode name", {"name": "ядро<λ>"}, True),
    ("null collective name", {"args": {"stream": 7, "Collective name": None}}, True),
    ("nested args", {"args": {"stream": 7, "x": {"y": [1, {"z": [None, True, False, "w"]}]}}}, True),
    # handed to msgspec: the same result or the same refusal
    ("escaped name", {"name": 'a "quoted" \\ name\u0001'}, False),
    ("string stream", {"args": {"stream": "7"}}, False),
    ("float correlation", {"args": {"stream": 7, "correlation": 11.0}}, False),
    ("string ts", {"ts": "100"}, False),
    ("bool dur", {"dur": True}, False),
    ("numeric cat", {"cat": 5}, False),
    ("list args", {"args": [1, 2]}, False),
    ("huge pid", {"pid": 1 << 70}, False),
    ("huge ts", {"ts": 1 << 64}, False),
]


@pytest.mark.parametrize("what,change,kept", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_unusual_values_read_as_msgspec_reads_them(what: str, change: dict[str, Any], kept: bool) -> None:
    e = dict(KERNEL)
    for k, v in change.items():
        if v is ...:
            e.pop(k)
        else:
            e[k] = v
    text = body([CPU_OP, e, MM])
    assert scanned(text) == kept, what
    agree(text)


RAW_CASES: list[tuple[str, bytes, bool | None]] = [
    # (what, the block, whether it decodes at all: None = the scanner hands it on and msgspec decides)
    ("duplicate key", b'[{"cat":"kernel","name":"k","ts":1,"dur":2,"ts":3}]', None),
    ("control character in a string", b'[{"cat":"kernel","name":"a\x01b","ts":1,"dur":2}]', False),
    ("invalid UTF-8 in a name", b'[{"cat":"cpu_op","name":"a\xffb","ts":1,"dur":2}]', True),
    ("invalid UTF-8 elsewhere", b'[{"cat":"cpu_op","name":"ab","ts":1,"dur":2,"args":{"x":"\xfe"}}]', True),
    ("leading zero", b'[{"cat":"cpu_op","name":"a","ts":01,"dur":2}]', False),
    ("trailing comma", b'[{"cat":"cpu_op","name":"a","ts":1,"dur":2},]', False),
    ("cut inside a string", b'[{"cat":"cpu_op","name":"a},{"]', False),
    ("not an object", b'[1, {"cat":"cpu_op","name":"a","ts":1,"dur":2}]', False),
    ("empty list", b"[]", True),
    ("blank around", b' \n[ {"cat":"cpu_op","name":"a","ts":1,"dur":2} ]\n ', True),
    ("out of range float", b'[{"cat":"cpu_op","name":"a","ts":1e999,"dur":2}]', None),
    ("many digits", b'[{"cat":"cpu_op","name":"a","ts":1234567890123.4567890123456789,"dur":2.000000000000000000001}]',
     True),
    ("escaped key", b'[{"c\\u0061t":"cpu_op","name":"a","ts":1,"dur":2}]', True),
]


@pytest.mark.parametrize("what,text,decodes", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_odd_json_reads_as_msgspec_reads_it(what: str, text: bytes, decodes: bool | None) -> None:
    t = agree(text)
    if decodes is not None:
        assert (t is not None) == decodes, what


def test_numbers_are_read_to_the_last_bit() -> None:
    """Floats by the exact fast path and by Python's conversion beyond it, against
    msgspec's (correctly rounded) reading, in the ts and dur columns."""
    values = ["0.1", "5961210385636.123", "1e-7", "123456789012345678.5", "9007199254740993.0",
              "2.2250738585072014e-308", "1.7976931348623157e308", "4.35", "0.000001234", "1e22", "1e23"]
    text = ("[" + ",".join(f'{{"cat":"cpu_op","name":"a","ts":{v},"dur":{v}}}' for v in values) + "]").encode()
    assert scanned(text)
    t = agree(text)
    assert t is not None and t.cpu.ts_us.tolist() == [float(v) for v in values]


# --------------------------------------------------------------------------- generated
_names = st.sampled_from(["aten::mm", "aten::add", "ProfilerStep#1", "nccl:all_reduce", "Event Sync",
                          "cudaLaunchKernel", "k<1>", "[memory]", "", "c10d::allreduce_"])
_ints = st.one_of(st.integers(-5, 40), st.integers(-(1 << 62), 1 << 62))
_scalars = st.one_of(st.none(), st.booleans(), _ints, st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=4))
_json = st.recursive(_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c,
                                                                                     max_size=3), max_leaves=6)
_arg_int = st.one_of(st.none(), _ints)
_args = st.fixed_dictionaries({}, optional={
    "stream": _arg_int, "device": _arg_int, "correlation": _arg_int, "External id": _arg_int,
    "Collective name": st.one_of(st.none(), st.just("allreduce")), "Input Dims": _json,
    "Total Allocated": _arg_int, "Bytes": _arg_int, "grid": _json})
_event = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "i", "M", "f"]),
    "cat": st.one_of(st.none(), st.sampled_from(["kernel", "cpu_op", "user_annotation", "cuda_runtime",
                                                "Trace", "python_function", "gpu_memcpy"])),
    "name": st.one_of(st.none(), _names),
    "pid": st.one_of(_ints, st.text(max_size=3), st.none(), st.floats(0, 9)),
    "tid": st.one_of(_ints, st.text(max_size=3), st.none()),
    "ts": st.one_of(st.none(), _ints, st.floats(-1e12, 1e15)),
    "dur": st.one_of(st.none(), _ints, st.floats(0, 1e6)),
    "args": st.one_of(st.none(), _args),
    "id": _json,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(_event, max_size=12), indent=st.sampled_from([None, 0, 2]),
       python_functions=st.booleans(), ascii_only=st.booleans())
def test_generated_events_read_as_msgspec_reads_them(events: list[dict[str, Any]], indent: int | None,
                                                      python_functions: bool, ascii_only: bool) -> None:
    agree(json.dumps(events, indent=indent, ensure_ascii=ascii_only).encode(), python_functions)


def test_the_scanner_takes_plain_generated_blocks() -> None:
    """The property above holds trivially if the scanner always handed back: plain blocks
    of the usual shapes are its own."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        picks = [ALL[i] for i in rng.integers(0, len(ALL), 30)]
        assert scanned(body(picks, int(rng.integers(0, 3))))


def test_an_extractor_and_its_scanner_are_freed() -> None:
    """The scanner holds its extractor's methods: the cycle is broken when the extractor
    finishes, and the garbage collector can break it otherwise (2 threads reading a 200 MB
    trace kept 5.1 MB of the blocks' names while it could not)."""
    import gc
    import weakref

    for finish in (True, False):
        ex = tr._Extractor(False)
        assert ex.add_json(body(ALL)) and ex._scanner is not None
        if finish:
            ex.finish("t")
        ref = weakref.ref(ex)
        del ex
        if finish:
            assert ref() is None  # freed at once, without the collector
        gc.collect()
        assert ref() is None, finish


# --------------------------------------------------------------------------- threads
def test_threads_number_names_as_one_reader_does(tmp_path: Path) -> None:
    """Threads keep one numbering each across their blocks and the join orders names by
    where the file first meets them: names met first in a late block of one thread and an
    early one of the other, blocks the scanner hands to msgspec (escaped names), names met
    only by events that make no row: the names, categories and every column are the
    serial reader's."""
    from tracegen import launched_kernel, write_kineto_trace

    from pardiag.analyzers import trace_parallel

    rng = np.random.default_rng(3)
    events: list[dict[str, Any]] = []
    for i in range(6000):
        k = int(rng.integers(0, 400))
        name = f"kernel_{k}" if k % 97 else f'odd "k{k}"'  # escaped: its block goes to msgspec
        events.append(launched_kernel(name, 10.0 * i, 5, i + 1))
        if i % 7 == 0:  # a runtime call without a correlation: numbered, but no row
            events.append({"ph": "X", "cat": "cuda_runtime", "name": f"call_{i % 50}", "pid": 1, "tid": 2,
                           "ts": 10.0 * i + 1, "dur": 1})
        if i % 500 == 0:
            events.append({"ph": "X", "cat": f"cat_{i // 500}", "name": "annotation", "pid": 1, "tid": 2,
                           "ts": 10.0 * i + 2, "dur": 3})
    path = write_kineto_trace(tmp_path / "t.json", events)
    serial = tr.load_trace(path, workers=1)
    parallel = trace_parallel.load_parallel(path, 2, block_bytes=16 << 10)
    assert parallel is not None
    same(parallel, serial)
    assert len(serial.names) > 400 and len(serial.cats) >= 13
    assert serial.gpu.name_id.dtype == np.int16 and serial.gpu.cat_id.dtype == np.int8


def test_name_ids_are_as_narrow_as_the_names_allow(tmp_path: Path) -> None:
    """int8 up to 127 names, int16 up to 32,767, int32 beyond, the same ids either way."""
    from tracegen import launched_kernel, write_kineto_trace

    for n, dtype in ((100, np.int8), (1000, np.int16), (40000, np.int32)):
        events = [launched_kernel(f"k{i}", 10.0 * i, 5, i + 1) for i in range(n)]
        t = tr.load_trace(write_kineto_trace(tmp_path / f"t{n}.json", events), workers=1)
        assert t.gpu.name_id.dtype == dtype and t.gpu.cat_id.dtype == np.int8, n
        assert [t.names[i] for i in t.gpu.name_id.tolist()] == [f"k{i}" for i in range(n)]


def test_flop_ops_as_columns_read_back_as_they_were_found() -> None:
    import pickle

    from pardiag.analyzers.trace import FlopColumns, FlopOp, FlopOps

    dims, types = [[8, 16], [16, 4]], ["float", "float"]
    ops = [FlopOp("aten::mm", 7, 11, 10.5, 2.25, dims, types, None, True),
           FlopOp("aten::addmm", 7, 12, 20.0, -1.0, [[4]], ["float"], [""], False),
           FlopOp("aten::mm", -1, 11, 30.0, 3.0, dims, types, None, False)]
    def columns(part: list[FlopOp]) -> FlopColumns:
        out = FlopColumns()
        for o in part:
            out.add(o.name, o.pid, o.tid, o.ts_us, o.dur_us, o.input_dims, o.input_type, o.concrete, o.grad_mode)
        return out

    cols = FlopOps(columns(ops))
    assert len(cols) == 3 and list(cols) == ops and cols[-1] == ops[2] and cols[1:] == ops[1:]
    assert cols == FlopOps(columns(ops)) and cols != FlopOps(columns(ops[:2]))
    # one copy of each recorded input that the decoder shared
    assert cols[0].input_dims is cols[2].input_dims
    # starting in [10, 30), duration not negative: the first only
    assert cols.within(10.0, 30.0) == ops[:1]
    with pytest.raises(IndexError):
        cols[3]
    # a worker process's part, pickled, then joined after another's: names and inputs renumbered
    a, b = columns(ops[2:]), columns(ops[:2])
    a.extend(pickle.loads(pickle.dumps(b)))
    assert list(FlopOps(a)) == ops[2:] + ops[:2] and a.names == ["aten::mm", "aten::addmm"]
    # a pid beyond int64 is not a pid: -1, as a pid that is not a number
    big = FlopColumns()
    big.add("aten::mm", 1 << 70, 3, 0.0, 1.0, None, None, None, False)
    assert FlopOps(big)[0].pid == -1
