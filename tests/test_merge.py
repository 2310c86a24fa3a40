"""`pardiag merge`: per-node run directories joined from the run directory's own list
of what it holds (`rundir.ENTRIES`), so that no kind of file is left behind."""

from __future__ import annotations

import gzip
import inspect
import json
from pathlib import Path
from typing import Any

from conftest import read_json, run_pardiag

from pardiag import manifest, rundir
from pardiag.rundir import RunDir

NAMES = {e.name for e in rundir.ENTRIES}
ARGS = {"rank": 0, "host": "node-a", "pid": 100, "stream": "stdout"}


def named_paths(run: RunDir) -> dict[str, Path]:
    """Every path RunDir names (properties, and methods given a rank, host, pid, stream)."""
    out: dict[str, Path] = {}
    for name, member in inspect.getmembers(RunDir):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            value = getattr(run, name)
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters)[1:]
            value = member(run, *(ARGS[p] for p in params))
        else:
            continue
        if isinstance(value, str):  # a pattern NCCL expands
            value = Path(value)
        if isinstance(value, Path):
            out[name] = value
    return out


def test_every_path_the_run_directory_names_is_a_listed_entry(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    paths = named_paths(run)
    assert {"telemetry", "host_telemetry", "summary", "flight_prefix", "launcher_record"} <= set(paths)
    unknown = {n: p for n, p in paths.items() if p.relative_to(tmp_path).parts[0] not in NAMES}
    assert not unknown


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(rundir.encode_line(r) for r in records))


def telemetry(host: str, gpu: int, uuid: str) -> list[dict[str, Any]]:
    header = rundir.telemetry_header(host, 1_000, 0.1, "550.54", [{"gpu": gpu, "uuid": uuid, "name": "H100"}])
    return [header, {"t_ns": 2_000, "gpu": gpu, "uuid": uuid, "util_gpu_pct": 90}]


def node(root: Path, host: str, pid: int, rank: int, complete: bool) -> RunDir:
    """A node's run directory with a file of every kind a run writes, through RunDir's paths."""
    run = RunDir(root)
    manifest.write_launcher_record(run, {"host": host, "pid": pid, "job_key": "job-1", "status": "ended",
                                         "started": 1.0, "ended": 2.0, "exit_code": 0})
    rundir.atomic_write_json(run.meta(rank), {"format": rundir.META_FORMAT, "format_version": rundir.META_VERSION,
                                              "host": host, "pid": pid, "rank": rank, "world_size": 2,
                                              "exit": {"status": "ok"}})
    steps = rundir.StepsWriter(run.steps(rank))
    steps.write({"step": 0, "start_ns": 1, "end_ns": 2})
    steps.close()
    trace = (run.trace(rank) if complete else run.partial_trace(rank)).with_suffix(".json.gz")
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": [], "distributedInfo": {"rank": rank}}, f)
    rundir.write_summary(run, rank, trace, {"result": {}, "gpu": None, "base_time_ns": None})
    write_lines(run.telemetry(rank), telemetry(host, 0, f"GPU-{rank}"))
    write_lines(run.host_telemetry(host), telemetry(host, 1, f"GPU-{rank}-unused"))
    run.host_telemetry_lock(host).touch()
    run.nccl_dir.mkdir()
    (run.nccl_dir / f"{host}.{pid}.log").write_text(f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap\n")
    run.flight_dir.mkdir()
    Path(f"{run.flight_prefix()}{rank}").write_bytes(b"\x80\x04flight")
    run.bootstrap_errors_dir.mkdir(parents=True)
    run.stream_log(host, pid, "stdout").write_text("loss 1.0\n")
    run.stream_log(host, pid, "stderr").write_text("")
    run.bootstrap_error(host, pid).write_text("collector failed to install\n")
    manifest.write(run)
    rundir.atomic_write_json(run.analysis, {"schema": "pardiag.analysis"})
    run.report.write_text("<html></html>")
    return run


def files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def test_merge_copies_every_collected_file(tmp_path: Path) -> None:
    inputs = [node(tmp_path / "node0", "node-a", 100, 0, True), node(tmp_path / "node1", "node-b", 200, 1, False)]
    out = tmp_path / "all"
    res = run_pardiag("merge", *(str(r.root) for r in inputs), "-o", str(out))
    assert res.returncode == 0, res.stderr
    role = {e.name: e.role for e in rundir.ENTRIES}
    kinds = set()
    for run in inputs:
        for rel in files(run.root):
            assert rel.parts[0] in role, f"{rel}: not an entry of the run directory"
            kinds.add(rel.parts[0])
            if role[rel.parts[0]] == "collected":
                assert (out / rel).read_bytes() == (run.root / rel).read_bytes(), rel
    assert kinds == NAMES  # the inputs hold every kind of entry
    assert (files(out) - {Path("manifest.json"), Path(".lock")}) == set().union(
        *({rel for rel in files(r.root) if role[rel.parts[0]] == "collected"} for r in inputs))
    m = read_json(out / "manifest.json")  # rebuilt from what was joined
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and m["hosts"] == ["node-a", "node-b"]
    assert len(m["launchers"]) == 2 and m["collectors"]["missing_ranks"] == []
    assert not (out / "analysis.json").exists() and not (out / "report.html").exists()


def test_merge_refuses_a_file_two_nodes_wrote_differently(tmp_path: Path) -> None:
    a = node(tmp_path / "node0", "node-a", 100, 0, True)
    b = node(tmp_path / "node1", "node-b", 200, 1, True)
    write_lines(b.host_telemetry("node-a"), telemetry("node-a", 1, "GPU-other"))  # same name, other lines
    res = run_pardiag("merge", str(a.root), str(b.root), "-o", str(tmp_path / "all"))
    assert res.returncode == 2 and "telemetry/node-a.jsonl comes from two inputs" in res.stderr
