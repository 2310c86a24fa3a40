"""Telemetry by rank: after the job, each GPU's lines move from the host file into
the file of the rank(s) that used that GPU.

A rank's GPU is found from its meta.json: by UUID when the rank recorded one, else by
its CUDA device index looked up in its CUDA_VISIBLE_DEVICES (indices or UUID
prefixes), else by taking the CUDA index as the NVML index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pardiag import rundir
from pardiag.rank_meta import RankMeta
from pardiag.collectors.nvml_metrics import error_text
from pardiag.rundir import RunDir, RunDirError, normalise_uuid


def gpu_of_rank(meta: RankMeta, gpus: dict[int, str | None]) -> tuple[int, str] | None:
    """(NVML index, how it was matched) of the GPU a rank used, from its meta.json.

    `gpus` maps NVML indices to UUIDs. The UUID decides when the meta has one; otherwise
    the rank's CUDA device index is looked up in its CUDA_VISIBLE_DEVICES (indices or
    UUID prefixes), or taken as the NVML index when that variable was not set (CUDA's
    and NVML's orders agree on most machines; the UUID is the reliable key)."""
    dev = meta.device
    if dev is None or dev.type != "cuda":
        return None
    want = normalise_uuid(dev.uuid)
    if want:
        for idx, uuid in gpus.items():
            if normalise_uuid(uuid) == want:
                return idx, "uuid"
    local = dev.index if dev.index is not None else meta.local_rank
    if local is None or local < 0:
        return None
    cvd = dev.cuda_visible_devices
    if cvd is None:
        return (local, "index") if local in gpus else None
    entries = [e.strip() for e in (",".join(map(str, cvd)) if isinstance(cvd, (list, tuple)) else str(cvd)).split(",")]
    entries = [e for e in entries if e]
    if local >= len(entries):
        return None
    entry = entries[local]
    if entry.isdigit():
        return (int(entry), "cuda_visible_devices") if int(entry) in gpus else None
    prefix = normalise_uuid(entry) or ""
    hits = [idx for idx, uuid in gpus.items() if prefix and (normalise_uuid(uuid) or "").startswith(prefix)]
    return (hits[0], "cuda_visible_devices") if len(hits) == 1 else None


def _host_metas(run: RunDir, host: str) -> list[tuple[int, RankMeta]]:
    out = []
    for r in run.ranks():
        try:
            meta = rundir.read_meta(run, r)
        except RunDirError:
            continue
        if meta.host == host:
            out.append((r, meta))
    return out


def split_by_rank(run: RunDir, host: str) -> dict[str, Any]:
    """After the job: move each GPU's lines from ``telemetry/<host>.jsonl`` into
    ``ranks/<rank>/telemetry.jsonl`` of the rank(s) of this host that used it (a GPU
    shared by several ranks goes to each). GPUs no rank used stay in the host file.
    Appends to a rank file that exists already. Returns {"status", "reason", "host",
    "assignments": [{"rank", "gpu", "uuid", "by"}], "unassigned_gpus", "lines",
    "dropped_lines"}. Never raises."""
    try:
        return _split(run, host)
    except Exception as e:
        return {"status": "failed", "reason": f"splitting telemetry by rank: {error_text(e)}", "host": host}


def _split(run: RunDir, host: str) -> dict[str, Any]:
    path = run.host_telemetry(host)
    if not path.is_file():
        return {"status": "skipped", "reason": "no telemetry file for this host", "host": host}
    lock_fd = rundir.lock_exclusive(run.host_telemetry_lock(host))
    if lock_fd is None:
        return {"status": "skipped", "reason": "the sampler on this host is still running", "host": host}
    try:
        return _split_locked(run, host, path)
    finally:
        rundir.unlock(lock_fd)


def _split_locked(run: RunDir, host: str, path: Path) -> dict[str, Any]:
    headers: list[str] = []
    last_header: dict[str, Any] | None = None
    header_gpus: dict[int, dict[str, Any]] = {}
    by_gpu: dict[int, list[str]] = {}
    dropped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            rec = rundir.parse_telemetry_line(line, path)
            if rec is None:
                dropped += 1
            elif rundir.is_telemetry_header(rec):
                headers.append(line if line.endswith("\n") else line + "\n")
                last_header = rec
                header_gpus.update({g["gpu"]: g for g in rec.get("gpus", []) if isinstance(g.get("gpu"), int)})
            else:
                by_gpu.setdefault(rec["gpu"], []).append(line if line.endswith("\n") else line + "\n")
    uuids = {i: g.get("uuid") for i, g in header_gpus.items()}
    assignments: list[dict[str, Any]] = []
    for rank, meta in _host_metas(run, host):
        hit = gpu_of_rank(meta, uuids)
        if hit is not None:
            assignments.append({"rank": rank, "gpu": hit[0], "uuid": uuids.get(hit[0]), "by": hit[1]})
    moved = 0
    for a in assignments:
        lines = by_gpu.get(a["gpu"], [])
        if lines:
            _append_rank_file(run.telemetry(a["rank"]), last_header, a["gpu"], lines)
            moved += len(lines)
    assigned = {a["gpu"] for a in assignments}
    kept = [line for g, lines in sorted(by_gpu.items()) if g not in assigned for line in lines]
    rundir.atomic_write_text(path, "".join(headers) + "".join(kept))
    return {"status": "ok", "reason": None, "host": host, "assignments": assignments,
            "unassigned_gpus": sorted(set(header_gpus) - assigned),
            "lines": {"ranks": moved, "host": len(kept)}, "dropped_lines": dropped}


def _append_rank_file(target: Path, header: dict[str, Any] | None, gpu: int, lines: list[str]) -> None:
    old = target.read_text(encoding="utf-8", errors="replace") if target.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    head = ""
    if header is not None:
        h = dict(header, gpus=[g for g in header.get("gpus", []) if g.get("gpu") == gpu])
        head = rundir.encode_line(h)
    rundir.atomic_write_text(target, old + head + "".join(lines))
