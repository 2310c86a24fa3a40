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
from pardiag.analyzers.trace import TraceError, load_trace
from tracegen import launched_kernel as kernel, same_trace as same, write_kineto_trace

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "gpu-traces"
A100 = FIXTURES / "a100-2rank-rank0" / "nccl_data.json.gz"
SAMPLED = FIXTURES / "sampled-128rank-job" / "sampled_rank-0.json.gz"
needs_fixtures = pytest.mark.skipif(not A100.exists(), reason="real GPU traces not found (shared fixtures)")
BLOCK = 64 << 10  # many blocks from a few MB


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
    calls are the ones this process sees), and the trace is still the serial reader's.
    (Processes are the reader's way without the C scanner.)"""
    monkeypatch.setattr(trace_module, "SCAN", False)
    data = gzip.decompress(A100.read_bytes())
    path = tmp_path / ("t.json.gz" if gzipped else "t.json")
    path.write_bytes(gzip.compress(data, 1) if gzipped else data)
    here: list[int] = []
    real = trace_module._Extractor.add_json
    monkeypatch.setattr(trace_module._Extractor, "add_json", lambda ex, body: (here.append(1), real(ex, body))[1])
    parallel = trace_parallel.load_parallel(path, 2, block_bytes=BLOCK)
    assert parallel is not None
    blocks = len(data) // BLOCK
    # the forked worker's calls are not seen here; the last events are decoded here too
    assert blocks // 2 - 2 <= len(here) <= blocks // 2 + 3, (len(here), blocks)
    same(parallel, load_trace(path, workers=1))


@needs_fixtures
@pytest.mark.skipif(trace_module._scan is None, reason="the C scanner was not built")
@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_with_the_scanner_threads_decode_the_blocks(tmp_path: Path, gzipped: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The C scanner lets go of the GIL: blocks are decoded by threads of this process (no
    fork), every block's call seen here, from two threads but the calling one, and the
    trace is the serial reader's."""
    data = gzip.decompress(A100.read_bytes())
    path = tmp_path / ("t.json.gz" if gzipped else "t.json")
    path.write_bytes(gzip.compress(data, 1) if gzipped else data)
    threads: list[int] = []
    real = trace_module._Extractor.add_json
    monkeypatch.setattr(trace_module._Extractor, "add_json",
                        lambda ex, body: (threads.append(threading.get_ident()), real(ex, body))[1])
    monkeypatch.setattr(trace_parallel, "_processes", None)  # no process is forked
    parallel = trace_parallel.load_parallel(path, 2, block_bytes=BLOCK)
    assert parallel is not None
    blocks = len(data) // BLOCK
    assert blocks - 2 <= len(threads) <= blocks + 3, (len(threads), blocks)
    assert len(set(threads) - {threading.get_ident()}) == 2
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


@pytest.mark.parametrize("workers", [1, 2])
def test_id_columns_are_int32_until_a_value_does_not_fit(tmp_path: Path, workers: int) -> None:
    # ids are kept in int32 where a block's values fit (half their memory); one block
    # with a correlation beyond int32 makes that column int64, its values exact
    big = (1 << 40) + 3
    events = [kernel("k", 10 + i, 5, 1 + i) for i in range(3000)]
    events[2500]["args"]["correlation"] = big
    path = write_kineto_trace(tmp_path / "t.json", events)
    t = (load_trace(path, workers=1, block_bytes=8192) if workers == 1
         else trace_parallel.load_parallel(path, 2, block_bytes=8192))
    assert t is not None and len(t.gpu) == 3000
    assert t.gpu.correlation.dtype == np.int64
    assert t.gpu.correlation[2500] == big and t.gpu.correlation[2499] == 2500 and t.gpu.correlation[0] == 1
    assert (t.gpu.stream.dtype, t.gpu.device.dtype, t.gpu.external_id.dtype) == (np.int32,) * 3
    assert t.gpu.stream.tolist() == [7] * 3000

    events[2500]["args"]["correlation"] = 2501
    small = load_trace(write_kineto_trace(tmp_path / "s.json", events), workers=1, block_bytes=8192)
    assert small.gpu.correlation.dtype == np.int32
    assert small.gpu.correlation.tolist() == list(range(1, 3001))


@pytest.mark.parametrize("scan", [False, True], ids=["msgspec", "scanner"])
@pytest.mark.parametrize("odd", [False, True], ids=["plain", "separator-in-a-name"])
def test_a_block_decoded_in_pieces_is_the_block_decoded_at_once(tmp_path: Path, odd: bool, scan: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # 300 kernels of about 200 bytes on one line (json.dumps: separator '}, {') cut into
    # pieces of about 1 KB, each piece size of a 200-byte range in turn, so that the cut
    # lands at every place inside an event: the same part as one decode each time. With
    # a separator inside the names of kernels 30-59 some cuts land inside a name: that
    # piece fails to decode and the rest is decoded as one.
    names = ["k"] * 300
    if odd:
        names[30:60] = ["odd}, {name"] * 30
    path = write_kineto_trace(tmp_path / "t.json", [kernel(n, 10 + i, 5, 1) for i, n in enumerate(names)],
                              layout="dumps")
    text = path.read_bytes()
    head = trace_parallel._head(open(path, "rb"), path, 1 << 20, trace_module._Extractor(False))
    assert head is not None
    start, sep, _ = head
    assert sep == b"}, {" and text.count(sep) == 299 + 30 * odd
    end = text.rfind(sep) + 1  # the events but the last
    block = bytearray(b"[" + text[start:end] + b"]")  # as a worker reads it: cut in place
    whole = trace_parallel._decode_block(bytes(block), None, False)
    assert whole is not None and whole.n_events == 299
    if scan and trace_module._scan is None:
        pytest.skip("the C scanner was not built")
    monkeypatch.setattr(trace_module, "SCAN", scan)
    decoded: list[bool] = []
    real = trace_module._Extractor.add_json
    monkeypatch.setattr(trace_module._Extractor, "add_json", lambda ex, b: (
        r := real(ex, b), decoded.append(r))[0])
    fell_back = 0
    for piece in range(1024, 1224, 3):
        decoded.clear()
        pieces = trace_parallel._decode_block(block, sep, False, piece=piece)
        assert pieces is not None and len(decoded) > 5, piece  # decoded in pieces
        assert decoded.count(False) <= 1 and decoded[-1], piece  # at most one failed: then the rest at once
        fell_back += decoded.count(False)
        assert pieces.n_events == 299 and pieces.names == whole.names, piece
        assert block == b"[" + text[start:end] + b"]", piece  # the bytes cut in place are put back
        for col in whole.gpu:
            assert np.array_equal(pieces.gpu[col], whole.gpu[col]), (piece, col)
    assert (fell_back > 0) == odd, fell_back
