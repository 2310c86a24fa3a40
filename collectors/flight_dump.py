"""Write this rank's flight recorder when the rank fails, where NCCL's watchdog would.

PyTorch's flight recorder keeps the last collectives of every process group in memory.
NCCL's watchdog writes it to `TORCH_FR_DUMP_TEMP_FILE<rank>` on a timeout; ProcessGroupGloo
(torch 2.13) records into the same buffer but nothing ever writes it, so a gloo hang left
`flight/` empty. When a rank ends with an exception, this writes the buffer with c10d's
own serialiser (`_dump_fr_trace`, the bytes the watchdog writes) unless a dump of that rank
is already there: a raw fact, read later by pardiag.analyzers.flight_recorder.
"""

from __future__ import annotations

import os
from pathlib import Path

from pardiag import rundir

PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def dump_path(run: rundir.RunDir, rank: int) -> Path:
    """Where torch itself would write this rank's dump: the user's prefix when set, else the run's."""
    prefix = next((os.environ[v] for v in PREFIX_VARS if os.environ.get(v)), None)
    return Path(f"{prefix}{rank}") if prefix else run.flight_dump(rank)


def dump_on_failure(run: rundir.RunDir, rank: int) -> str | None:
    """Write the dump; returns why it was not written (None: written). Never raises."""
    try:
        if not any(os.environ.get(v, "0").strip() not in ("", "0") for v in SIZE_VARS):
            return "flight recorder off (buffer size 0)"
        path = dump_path(run, rank)
        if path.exists():
            return "already dumped"
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace", None)
        if dump is None:
            return "this torch has no _dump_fr_trace"
        rundir.atomic_write_bytes(path, dump())
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
