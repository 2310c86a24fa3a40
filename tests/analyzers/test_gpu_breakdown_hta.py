"""Trace loading and the per-rank GPU breakdown: hand-computed cases, corrupt
inputs, and agreement with HTA itself on real traces."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pardiag.analyzers import trace as trace_module
from pardiag.analyzers.gpu_breakdown import GpuBreakdown, gpu_breakdown
from pardiag.analyzers.trace import Trace, TraceError, load_trace, rank_of
from hta_reference import HtaNumbers, compare as _compare, hta_numbers as _hta, ours as _ours
from tracegen import cpu_op, launch, launched_kernel as kernel, meta_events, step, write_kineto_trace as write_trace

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
GPU_TRACES = FIXTURES / "gpu-traces"
CPU_TRACES = FIXTURES / "cpu-traces"
GPU_FILES = sorted(GPU_TRACES.glob("*/*.json*")) if GPU_TRACES.is_dir() else []
CPU_FILES = sorted(CPU_TRACES.glob("*.json*")) if CPU_TRACES.is_dir() else []
needs_gpu_fixtures = pytest.mark.skipif(
    not GPU_FILES, reason=f"real GPU traces not found in {GPU_TRACES} (shared fixtures)")
needs_cpu_fixtures = pytest.mark.skipif(
    not CPU_FILES, reason=f"real CPU traces not found in {CPU_TRACES} (shared fixtures)")


NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def two_streams_events() -> list[dict[str, Any]]:
    """Two steps, kernels on three streams, comm under compute, a late kernel.

    stream 7   gemm [10,30]            memcpy [45,50]     add [70,80]   late [160,170]
    stream 8        relu [25,40], small [12,14] (nested)
    stream 20            nccl [35,60]
    The last step starts at 100: "late" (launched at 150) and an orphan kernel
    without a launch are out of HTA's scope.
    """
    return [
        *meta_events(),
        step(1, 0, 100), step(2, 100, 100),
        cpu_op("aten::mm", 0, 9),
        *(launch(c, c) for c in range(1, 7)), launch(8, 150),
        kernel("gemm", 10, 20, 1), kernel("relu", 25, 15, 2, stream=8),
        kernel("small", 12, 2, 3, stream=8),
        kernel("Memcpy HtoD (Pageable -> Device)", 45, 5, 4, cat="gpu_memcpy"),
        kernel(NCCL, 35, 25, 5, stream=20), kernel("add", 70, 10, 6),
        kernel("late", 160, 10, 8), kernel("orphan", 85, 5, 9),
    ]


TWO_STREAMS = GpuBreakdown(span_us=70, kernel_us=60, idle_us=10, compute_us=40, comm_us=25,
                           overlap_us=5, memory_us=5, events=6, events_dropped=2)


def nanosecond_events() -> list[dict[str, Any]]:
    """Fractional timestamps: HTA rounds each event inward to whole microseconds.

    gemm [10.2, +19.9] -> [11, 30]; nccl [20.6, +15] -> [21, 35];
    relu [36.5, +0.3] -> [37, 36] (end before start: a group of length -1, as in HTA);
    gemm [40.0, +5.5] -> [40, 45]. No ProfilerStep: nothing is dropped.
    union 24 - 1 + 5 = 28 over a span of 34; compute 19 - 1 + 5 = 23; comm 14;
    comm under compute [21, 30] = 9.
    """
    return [
        *meta_events(),
        cpu_op("aten::mm", 1.5, 2.25),
        *(launch(c, 2.0 + c) for c in range(1, 5)),
        kernel("gemm", 10.2, 19.9, 1), kernel(NCCL.replace("Dev", ""), 20.6, 15.0, 2, stream=13),
        kernel("relu", 36.5, 0.3, 3), kernel("gemm", 40.0, 5.5, 4),
    ]


NANOSECONDS = GpuBreakdown(span_us=34, kernel_us=28, idle_us=6, compute_us=23, comm_us=14,
                           overlap_us=9, memory_us=0, events=4, events_dropped=0)


# --------------------------------------------------------------------------- synthetic
def test_two_streams_by_hand(tmp_path: Path) -> None:
    t = load_trace(write_trace(tmp_path / "r0.json", two_streams_events()))
    assert gpu_breakdown(t) == TWO_STREAMS
    b = gpu_breakdown(t)
    assert b is not None and b.non_compute_us == 20 and b.overlap_ratio == 5 / 25


def test_last_step_included_keeps_late_kernel(tmp_path: Path) -> None:
    t = load_trace(write_trace(tmp_path / "r0.json", two_streams_events()))
    b = gpu_breakdown(t, include_last_step=True)
    assert b is not None
    assert (b.span_us, b.kernel_us, b.compute_us, b.events, b.events_dropped) == (
        160, 70, 50, 7, 1)


def test_nanosecond_rounding_by_hand(tmp_path: Path) -> None:
    t = load_trace(write_trace(tmp_path / "r0.json", nanosecond_events(), layout="dumps"))
    assert t.ts_fractional
    assert gpu_breakdown(t) == NANOSECONDS


def test_trace_columns(tmp_path: Path) -> None:
    t = load_trace(write_trace(tmp_path / "r0.json.gz", two_streams_events(), rank=1))
    assert t.rank == 1 and t.distributed is not None and t.distributed.world_size == 2
    assert t.base_time_ns == 1700000000000000000
    assert t.n_events == len(two_streams_events())
    assert not t.ts_fractional and t.min_ts_us == 0
    names = [t.names[i] for i in t.gpu.name_id]
    assert names == ["gemm", "relu", "small", "Memcpy HtoD (Pageable -> Device)", NCCL, "add",
                     "late", "orphan"]
    assert t.gpu.stream.tolist() == [7, 8, 8, 7, 20, 7, 7, 7]
    assert t.gpu.correlation.tolist() == [1, 2, 3, 4, 5, 6, 8, 9]
    assert [t.cats[i] for i in t.gpu.cat_id][3] == "gpu_memcpy"
    assert t.gpu.ts_us.dtype == np.float64 and t.gpu.dur_us.tolist()[:2] == [20, 15]
    assert [t.names[i] for i in t.cpu.name_id] == ["ProfilerStep#1", "ProfilerStep#2",
                                                   "aten::mm"]
    assert t.cpu.tid.tolist() == [1, 1, 1]
    assert t.launches.correlation.tolist() == [1, 2, 3, 4, 5, 6, 8]
    assert [s.name for s in t.steps] == ["ProfilerStep#1", "ProfilerStep#2"]


def test_trace_without_gpu_events_has_no_breakdown(tmp_path: Path) -> None:
    t = load_trace(write_trace(tmp_path / "r0.json", [*meta_events(), cpu_op("aten::add", 1, 2)]))
    assert len(t.gpu) == 0 and len(t.cpu) == 1
    assert gpu_breakdown(t) is None


def test_empty_event_list_is_a_trace(tmp_path: Path) -> None:
    t = load_trace(write_trace(tmp_path / "r0.json", []))
    assert t.n_events == 0 and t.rank == 0 and gpu_breakdown(t) is None


# --------------------------------------------------------------------------- layouts
def assert_same_trace(a: Trace, b: Trace) -> None:
    assert a.names == b.names and a.cats == b.cats
    for table in ("gpu", "cpu", "launches"):
        ta, tb = getattr(a, table), getattr(b, table)
        for col in ta.__dataclass_fields__:
            assert np.array_equal(getattr(ta, col), getattr(tb, col)), (table, col)
    assert (a.steps, a.collectives, a.n_events, a.ts_fractional, a.min_ts_us) == (
        b.steps, b.collectives, b.n_events, b.ts_fractional, b.min_ts_us)
    assert (a.distributed, a.device_properties, a.base_time_ns) == (
        b.distributed, b.device_properties, b.base_time_ns)


@pytest.mark.parametrize("layout", ["kineto", "dumps"])
def test_small_blocks_match_one_block(tmp_path: Path, layout: str) -> None:
    events = two_streams_events() * 50
    path = write_trace(tmp_path / "r0.json", events, layout=layout,
                       trailing={"deviceProperties": [{"id": 0}, {"id": 1}, {"id": 2}]})
    whole = load_trace(path)
    assert whole.n_events == len(events) and len(whole.device_properties) == 3
    assert_same_trace(load_trace(path, block_bytes=997), whole)


def test_whole_document_fallback_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_trace(tmp_path / "r0.json", two_streams_events() * 20, layout="dumps")
    blockwise = load_trace(path, block_bytes=1024)
    monkeypatch.setattr(trace_module, "_MAX_CUT_RETRIES", 0)  # every cut "fails"
    assert_same_trace(load_trace(path, block_bytes=1024), blockwise)


def test_separator_inside_a_name(tmp_path: Path) -> None:
    events = [kernel("odd}, {name", 10, 5, 1)] * 30 + two_streams_events()
    path = write_trace(tmp_path / "r0.json", events, layout="dumps")
    t = load_trace(path, block_bytes=700)
    assert t.n_events == len(events) and t.names[int(t.gpu.name_id[0])] == "odd}, {name"


@needs_gpu_fixtures
@pytest.mark.parametrize("path", GPU_FILES, ids=[p.name for p in GPU_FILES])
def test_fixture_small_blocks_match(path: Path) -> None:
    assert_same_trace(load_trace(path, block_bytes=64 << 10), load_trace(path))


# --------------------------------------------------------------------------- malformed
def test_huge_integers_and_invalid_utf8_are_tolerated(tmp_path: Path) -> None:
    odd = kernel("gemm", 10, 20, 1)
    odd["args"]["Comms Id"] = 123456789012345678901234567890
    bad_corr = kernel("relu", 40, 5, 2)
    bad_corr["args"]["correlation"] = 99999999999999999999999
    events = [*two_streams_events(), odd, bad_corr]
    raw = write_trace(tmp_path / "r0.json", events * 30).read_bytes()
    raw = raw.replace(b'"name": "small"', b'"name": "sm\xffall"')
    path = tmp_path / "bad.json"
    path.write_bytes(raw)
    for block in (1500, trace_module.BLOCK_BYTES):
        t = load_trace(path, block_bytes=block)
        assert t.n_events == len(events) * 30
        assert "sm\ufffdall" in t.names
        assert t.gpu.correlation.tolist()[-1] == -1  # out of int64 range


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"  \n ", "empty file"),
        (b"[1, 2, 3]", "not a Kineto trace"),
        (b'"just a string"', "not a Kineto trace"),
        (b'{"foo": 1}', "no traceEvents"),
        (b'{"traceEvents": null}', "no traceEvents"),
        (b'{"traceEvents": 5}', "not a Kineto trace"),
        (b'{"traceEvents": [1, 2]}', "not a Kineto trace"),
        (b'{"traceEvents": [{"ts": "soon"}]}', "not a Kineto trace"),
        (b'{"traceEvents": [ {"ph": "X",, } ]}', "not valid JSON"),
        (b"\x00\x01garbage\xfe", "not valid JSON"),
    ],
)
def test_not_a_trace(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message) as err:
        load_trace(path)
    assert "\n" not in str(err.value) and "x.json" in str(err.value)


def test_truncated_json(tmp_path: Path) -> None:
    full = write_trace(tmp_path / "full.json", two_streams_events() * 40).read_bytes()
    for name, data in (("cut.json", full[: len(full) * 3 // 5]),
                       ("cut.json.gz", gzip.compress(full[: len(full) // 2]))):
        (tmp_path / name).write_bytes(data)
        for block in (1000, trace_module.BLOCK_BYTES):
            with pytest.raises(TraceError, match="truncated") as err:
                load_trace(tmp_path / name, block_bytes=block)
            assert "\n" not in str(err.value)


def test_truncated_gzip_stream(tmp_path: Path) -> None:
    data = (write_trace(tmp_path / "full.json.gz", two_streams_events() * 40)).read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="gzip"):
        load_trace(tmp_path / "cut.json.gz")
    (tmp_path / "bad.json.gz").write_bytes(data[:10] + b"\x00" * 40 + data[50:])
    with pytest.raises(TraceError):
        load_trace(tmp_path / "bad.json.gz")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "absent.json")
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path)


# --------------------------------------------------------------------------- rank
def test_rank_of(tmp_path: Path) -> None:
    assert rank_of(write_trace(tmp_path / "a.json.gz", [], rank=5)) == 5
    anonymous = tmp_path / "worker_rank-3.pt.trace.json"
    anonymous.write_text('{"traceEvents": []}')
    assert rank_of(anonymous) == 3
    plain = tmp_path / "trace.json"
    plain.write_text('{"traceEvents": []}')
    assert rank_of(plain) is None


@needs_gpu_fixtures
@pytest.mark.parametrize("path", GPU_FILES, ids=[p.name for p in GPU_FILES])
def test_rank_of_fixture(path: Path) -> None:
    assert rank_of(path) == load_trace(path).rank


# --------------------------------------------------------------------------- CPU fixture
@needs_cpu_fixtures
def test_cpu_fixture() -> None:
    t = load_trace(CPU_FILES[0])
    assert t.distributed is not None
    assert (t.rank, t.distributed.world_size, t.distributed.backend) == (34, 300, "gloo")
    assert len(t.distributed.pg_config) == 11 and len(t.distributed.pg_config[0].ranks) == 300
    assert t.base_time_ns == 1719853884000000000
    assert len(t.gpu) == 0 and len(t.cpu) == 15 and len(t.launches) == 0
    assert [s.name for s in t.steps] == ["ProfilerStep#551"]
    gloo = [c for c in t.collectives if c.name == "gloo:all_reduce"]
    assert len(gloo) == 10 and gloo[0].input_dims == [[321271]] and gloo[0].input_type == ["float"]
    assert gpu_breakdown(t) is None
    assert rank_of(CPU_FILES[0]) == 34


@needs_gpu_fixtures
def test_a100_fixture_columns() -> None:
    t = load_trace(GPU_TRACES / "a100-2rank-rank0" / "nccl_data.json.gz")
    assert t.ts_fractional and t.rank == 0 and len(t.device_properties) == 8
    cats = {t.cats[i] for i in np.unique(t.gpu.cat_id)}
    assert cats == {"kernel", "gpu_memcpy", "gpu_memset"}
    assert len(t.gpu) == 2700 + 960 + 114
    record = [c for c in t.collectives if c.name == "record_param_comms"]
    assert record and record[0].collective_name == "allreduce" and record[0].pg_ranks == (0, 1)
    on_gpu = [c for c in t.collectives if c.on_gpu]
    assert len(on_gpu) == 21 and all(c.name.startswith("ncclKernel_") for c in on_gpu)


# --------------------------------------------------------------------------- HTA
@pytest.fixture(scope="module")
def hta_results(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, HtaNumbers]:
    """HTA run once per folder of rank files (it analyses folders, not files)."""
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    root = tmp_path_factory.mktemp("hta")
    groups: dict[str, list[Path]] = {}
    for f in GPU_FILES:
        groups.setdefault(f.parent.name, []).append(f)
    synthetic = root / "synthetic"
    synthetic.mkdir()
    groups["two-streams"] = [write_trace(synthetic / "two_streams.json", two_streams_events())]
    groups["nanoseconds"] = [write_trace(synthetic / "nanoseconds.json", nanosecond_events())]
    results: dict[Path, HtaNumbers] = {}
    for group, files in groups.items():
        folder = root / group
        folder.mkdir()
        for f in files:
            shutil.copy(f, folder / f.name)
        for name, numbers in _hta(folder).items():
            results[next(f for f in files if f.name == name)] = numbers
    return results


@needs_gpu_fixtures
@pytest.mark.parametrize("path", GPU_FILES, ids=[p.name for p in GPU_FILES])
def test_real_trace_agrees_with_hta(path: Path, hta_results: dict[Path, HtaNumbers]) -> None:
    """Compute, idle, kernel time, non-compute and comm/compute overlap within 1 %;
    pardiag reproduces HTA 0.5 exactly, so the numbers are in fact equal."""
    ours, hta = _ours(path), hta_results[path]
    _compare(ours, hta, rel=0.01)
    _compare(ours, hta, rel=1e-12)


def test_synthetic_traces_agree_with_hta(hta_results: dict[Path, HtaNumbers]) -> None:
    """HTA itself confirms the hand-computed numbers above."""
    for path, hta in hta_results.items():
        if path.parent.name == "synthetic":
            _compare(_ours(path), hta, rel=1e-12)
    by_name = {p.name: n for p, n in hta_results.items()}
    assert by_name["two_streams.json"]["kernel_time_us"] == TWO_STREAMS.span_us
    assert by_name["nanoseconds.json"]["idle_us"] == NANOSECONDS.idle_us


def test_membership_by_binary_search_is_numpys_isin() -> None:
    from pardiag.analyzers.gpu_breakdown import _member

    values = np.array([5, -1, 7, 7, 1 << 40, 3, 9], dtype=np.int64)
    pool = np.array([9, 7, 7, -1, 2], dtype=np.int64)
    assert _member(values, pool).tolist() == [False, True, True, True, False, False, True]
    assert _member(values, pool[:0]).tolist() == [False] * 7
    assert _member(values[:0], pool).tolist() == []
    rng = np.random.default_rng(3)
    big, some = rng.integers(-5, 10_000, 50_000), rng.integers(0, 20_000, 3_000)
    assert np.array_equal(_member(big, some), np.isin(big, some))


def test_the_launch_scope_in_floats_is_the_scope_in_integers() -> None:
    """`_started_before` (rounded and shifted in float64) against the int64 way it stands
    for, on fractional and whole starts, both comparisons, and beyond 2**52 (where it
    takes the int64 way)."""
    from types import SimpleNamespace

    from pardiag.analyzers import gpu_breakdown as gb

    rng = np.random.default_rng(11)
    for fractional in (False, True):
        for base in (1.7e12, 5.9e15):
            ts = base + rng.integers(0, 10**7, 5000).astype(np.float64)
            if fractional:
                ts += rng.integers(0, 1000, 5000) / 1000
            trace = SimpleNamespace(ts_fractional=fractional)
            origin = int(np.ceil(ts.min()))
            for inclusive in (False, True):
                for limit in (0.0, 5e6 + 0.5, 5e6, 2e7):
                    want = gb._before(gb._round_start(ts, trace) - origin, limit, inclusive)
                    got = gb._started_before(ts, trace, origin, limit, inclusive)
                    assert np.array_equal(got, want), (fractional, base, inclusive, limit)
