"""`trace.stream_events`: a real trace's events as the file holds them, block by block,
whatever the block size; a bad file is a TraceError, the callback's own error stays its own."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

from conftest import FIXTURES
from pardiag.analyzers.trace import RawEvent, TraceError, stream_events

A100 = FIXTURES / "gpu-traces" / "a100-2rank-rank0" / "nccl_data.json.gz"


def as_dict(e: RawEvent) -> dict[str, object]:
    out = {k: getattr(e, k) for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s")}
    out["args"] = msgspec.json.decode(e.args) if len(e.args) else None
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize("block", [1 << 16, 1 << 24])
def test_events_come_in_file_order_at_any_block_size(block: int) -> None:
    expected = json.loads(gzip.decompress(A100.read_bytes()))["traceEvents"]
    blocks: list[list[RawEvent]] = []
    n = stream_events(A100, blocks.append, block_bytes=block)
    got = [e for b in blocks for e in b]
    assert n == len(got) == len(expected) == 40573
    assert (len(blocks) > 10) == (block == 1 << 16)  # small blocks: the file comes in pieces
    assert [as_dict(e) for e in got] == [{k: v for k, v in e.items() if v is not None} for e in expected]


def test_truncated_and_empty_files_are_trace_errors(tmp_path: Path) -> None:
    data = gzip.decompress(A100.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceError, match="truncated"):
        stream_events(cut, lambda _: None, block_bytes=1 << 16)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        stream_events(empty, lambda _: None)


def test_the_callbacks_error_is_not_taken_for_a_bad_trace() -> None:
    def full_disk(_: list[RawEvent]) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        stream_events(A100, full_disk)
