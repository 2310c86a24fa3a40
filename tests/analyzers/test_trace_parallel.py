"""One trace decoded by several processes (analyzers/trace_parallel.py): the same Trace as
the serial reader, column for column, on the real GPU fixtures cut into many blocks, plain
and gzipped; the cases it hands back to the serial reader; its errors."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import numpy as np
import pytest

from pardiag.analyzers import trace as trace_module, trace_parallel
from pardiag.analyzers.trace import Trace, TraceError, load_trace
from tracegen import launched_kernel as kernel, write_kineto_trace

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "gpu-traces"
A100 = FIXTURES / "a100-2rank-rank0" / "nccl_data.json.gz"
SAMPLED = FIXTURES / "sampled-128rank-job" / "sampled_rank-0.json.gz"
needs_fixtures = pytest.mark.skipif(not A100.exists(), reason="real GPU traces not found (shared fixtures)")
BLOCK = 64 << 10  # many blocks from a few MB


def same(a: Trace, b: Trace) -> None:
    assert a.names == b.names and a.cats == b.cats
    for table in ("gpu", "cpu", "launches", "memory"):
        ta, tb = getattr(a, table), getattr(b, table)
        for col in ta.__dataclass_fields__:
            assert np.array_equal(getattr(ta, col), getattr(tb, col)), (table, col)
    assert (a.steps, a.collectives, a.flop_ops, a.n_events, a.ts_fractional, a.min_ts_us) == (
        b.steps, b.collectives, b.flop_ops, b.n_events, b.ts_fractional, b.min_ts_us)
    assert (a.distributed, a.device_properties, a.base_time_ns) == (
        b.distributed, b.device_properties, b.base_time_ns)


@needs_fixtures
@pytest.mark.parametrize("source", [A100, SAMPLED], ids=["a100", "sampled"])
@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_a_real_trace_in_many_blocks_is_the_serial_readers_trace(tmp_path: Path, source: Path,
                                                                  gzipped: bool) -> None:
    data = gzip.decompress(source.read_bytes())
    path = tmp_path / ("t.json.gz" if gzipped else "t.json")
    path.write_bytes(gzip.compress(data, 1) if gzipped else data)
    serial = load_trace(path, workers=1)
    parallel = trace_parallel.load_parallel(path, 2, block_bytes=BLOCK)
    assert parallel is not None, "the parallel reader handed a real trace back"
    assert len(data) // BLOCK >= 8  # the cut really made many blocks
    same(parallel, serial)
    assert serial.n_events > 4000 and len(serial.gpu) > 500


@needs_fixtures
@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_the_calling_process_decodes_its_share_of_the_blocks(tmp_path: Path, gzipped: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With 2 processes one is forked: the caller decodes every second block itself (its
    calls are the ones this process sees), and the trace is still the serial reader's."""
    data = gzip.decompress(A100.read_bytes())
    path = tmp_path / ("t.json.gz" if gzipped else "t.json")
    path.write_bytes(gzip.compress(data, 1) if gzipped else data)
    here: list[int] = []
    real = trace_module._Extractor.add
    monkeypatch.setattr(trace_module._Extractor, "add", lambda ex, events: (here.append(1), real(ex, events))[1])
    parallel = trace_parallel.load_parallel(path, 2, block_bytes=BLOCK)
    assert parallel is not None
    blocks = len(data) // BLOCK
    # the forked worker's calls are not seen here; the last events are decoded here too
    assert blocks // 2 - 2 <= len(here) <= blocks // 2 + 3, (len(here), blocks)
    same(parallel, load_trace(path, workers=1))


@needs_fixtures
def test_python_functions_and_three_workers(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(gzip.decompress(A100.read_bytes()))
    parallel = trace_parallel.load_parallel(path, 3, python_functions=True, block_bytes=BLOCK)
    assert parallel is not None
    same(parallel, load_trace(path, workers=1, python_functions=True))


@needs_fixtures
def test_load_trace_takes_the_parallel_path_for_a_large_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(gzip.decompress(A100.read_bytes()))
    monkeypatch.setattr(trace_parallel, "PARALLEL_MIN_BYTES", 1 << 20)
    calls = []
    real = trace_parallel.load_parallel
    monkeypatch.setattr(trace_parallel, "load_parallel", lambda *a, **k: calls.append(a) or real(*a, **k))
    same(load_trace(path, workers=2), load_trace(path, workers=1))
    assert len(calls) == 1  # workers=1 read it serially
    assert trace_parallel.worth_it(path, 2) and not trace_parallel.worth_it(path, 1)


def test_gzip_size_is_read_from_its_trailer(tmp_path: Path) -> None:
    data = b'{"traceEvents": []}' + b" " * 100_000
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(data))
    assert trace_parallel.json_bytes(path) == len(data)


def test_a_separator_inside_a_name_goes_back_to_the_serial_reader(tmp_path: Path) -> None:
    # a block cut inside the name does not decode: the serial reader, which retries
    # earlier separators, reads the file
    events = [kernel("odd},\n  {name" * 400, 10 + i, 5, 1) for i in range(300)]
    path = write_kineto_trace(tmp_path / "t.json", events)
    assert trace_parallel.load_parallel(path, 2, block_bytes=4096) is None
    t = load_trace(path, workers=1)
    assert t.n_events == len(events) and t.names[int(t.gpu.name_id[0])].startswith("odd},\n  {name")


def test_no_separator_is_no_parallel_read(tmp_path: Path) -> None:
    path = write_kineto_trace(tmp_path / "t.json", [kernel("k", 10 + i, 5, 1) for i in range(50)], layout="dumps")
    # json.dumps writes '}, {': a separator too; one line with no event at all has none
    one = tmp_path / "one.json"
    one.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]}')
    assert trace_parallel.load_parallel(one, 2, block_bytes=4096) is None
    parallel = trace_parallel.load_parallel(path, 2, block_bytes=512)
    assert parallel is not None
    same(parallel, load_trace(path, workers=1))


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_a_truncated_trace_is_the_serial_readers_error(tmp_path: Path, gzipped: bool) -> None:
    events = [kernel("k", 10 + i, 5, 1) for i in range(3000)]
    text = write_kineto_trace(tmp_path / "whole.json", events).read_bytes()
    cut = text[: len(text) * 2 // 3]
    path = tmp_path / ("cut.json.gz" if gzipped else "cut.json")
    path.write_bytes(gzip.compress(cut) if gzipped else cut)
    with pytest.raises(TraceError, match="truncated trace") as serial:
        load_trace(path, workers=1)
    with pytest.raises(TraceError) as parallel:
        trace_parallel.load_parallel(path, 2, block_bytes=8192)
    assert str(parallel.value) == str(serial.value)


@needs_fixtures
def test_another_thread_running_does_not_stop_it(tmp_path: Path) -> None:
    # `pardiag analyze` reads traces while a progress bar's thread refreshes the terminal
    path = tmp_path / "t.json"
    path.write_bytes(gzip.decompress(A100.read_bytes()))
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        parallel = trace_parallel.load_parallel(path, 2, block_bytes=BLOCK)
    finally:
        stop.set()
        t.join()
    assert parallel is not None
    same(parallel, load_trace(path, workers=1))
