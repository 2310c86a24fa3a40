"""`pardiag merge`: per-node run directories joined from the run directory's own list
of what it holds (`rundir.ENTRIES`), so that no kind of file is left behind."""

from __future__ import annotations

import inspect
from pathlib import Path

from conftest import read_json, run_pardiag

from pardiag import rundir
from pardiag.rundir import RunDir
from factories import node_run as node, telemetry, write_lines

NAMES = {e.name for e in rundir.ENTRIES}
ARGS = {"rank": 0, "host": "node-a", "pid": 100, "stream": "stdout", "window": 2}  # window 2: the extra one


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
