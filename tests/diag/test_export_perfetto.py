"""The merged Chrome/Perfetto trace (`pardiag export RUN --perfetto`), checked against the
trace-event format by a validator written here, and against pardiag's own analysis of the
same traces: flows against the collectives it matched, steps against its profiled steps,
clocks against its alignment. Real traces: the GPU fixtures, a real 2-rank gloo run."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, REPO, run_pardiag, torchrun

SAMPLED = FIXTURES / "gpu-traces" / "sampled-128rank-job"
A100 = FIXTURES / "gpu-traces" / "a100-2rank-rank0"
EXAMPLE = REPO / "examples" / "train_ddp.py"
PHASES = set("XBEiIsftMCben")
OURS = 1000  # pardiag's tracks have thread ids under this; the ranks' own threads from it on


# ------------------------------------------------------------------------------ the validator
def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        assert raw[:2] == b"\x1f\x8b", "a .gz name holds gzip data"
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    assert isinstance(doc, dict)
    return doc


def _ns(us: float) -> int:
    return round(us * 1000)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate(doc: dict[str, Any]) -> dict[str, Any]:
    """Checks the trace-event format (the JSON object form) as ui.perfetto.dev and
    chrome://tracing read it; returns what the tests look at."""
    assert list(doc)[0] == "displayTimeUnit", "Perfetto reads it first"
    assert set(doc) <= {"displayTimeUnit", "traceEvents", "otherData"}, "Perfetto stops at an unknown key"
    assert doc["displayTimeUnit"] in ("ms", "ns")
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    slices: dict[tuple[int, int], list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    flows: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        assert isinstance(e.get("ph"), str) and e["ph"] in PHASES, e
        assert type(e.get("pid")) is int and type(e.get("tid")) is int, e
        assert isinstance(e.get("name"), str), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_labels", "process_sort_index", "thread_name",
                                 "thread_sort_index"), e
            assert isinstance(e.get("args"), dict), e
            continue
        assert _num(e.get("ts")) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert _num(e.get("dur")) and e["dur"] >= 0, e
            # in integer nanoseconds, as Perfetto reads microseconds (no float sums)
            slices[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e))
        elif e["ph"] in "stf":
            assert type(e.get("id")) is int and isinstance(e.get("cat"), str), e
            flows[(e["cat"], e["name"], e["id"])].append(e)  # Perfetto keys a v1 flow by id, cat and name
        elif e["ph"] in "iI":
            assert e.get("s", "t") in ("t", "p", "g"), e
        if "args" in e:
            assert isinstance(e["args"], dict), e
    for (pid, tid), ss in slices.items():
        if tid < OURS:  # pardiag's own tracks: slices nest or follow one another
            _check_nesting(ss, (pid, tid))
    for key, fl in flows.items():
        phases = Counter(f["ph"] for f in fl)
        assert phases["s"] == 1 and phases["f"] == 1, (key, phases)
        order = sorted(fl, key=lambda f: (f["ts"], "stf".index(f["ph"])))
        assert order[0]["ph"] == "s" and order[-1]["ph"] == "f", key  # the start before the end
        for f in fl:
            assert _bound(f, slices[(f["pid"], f["tid"])]), ("a flow event outside any slice of its thread", f)
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    return {"events": events, "slices": slices, "flows": flows, "processes": processes}


def _check_nesting(ss: list[tuple[int, int, dict[str, Any]]], where: tuple[int, int]) -> None:
    stack: list[float] = []
    for s, e, ev in sorted(ss, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1] <= s:
            stack.pop()
        assert not stack or e <= stack[-1], ("slices overlap without nesting", where, ev)
        stack.append(e)


def _bound(f: dict[str, Any], ss: list[tuple[int, int, dict[str, Any]]]) -> bool:
    """The slice a flow event binds to: the one open at its time on its thread."""
    t = _ns(f["ts"])
    return any(s <= t <= e if f.get("bp") == "e" or f["ph"] != "s" else s <= t < e for s, e, _ in ss)


def pardiag_flows(v: dict[str, Any]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    return {k: f for k, f in v["flows"].items() if k[0] == "pardiag.collective"}


def members(v: dict[str, Any]) -> dict[int, dict[int, dict[str, Any]]]:
    """instance -> rank -> its slice on the rank's "collectives (matched)" track."""
    out: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in v["events"]:
        if e["ph"] == "X" and e.get("cat") == "pardiag.collective" and "instance" in e.get("args", {}):
            out[e["args"]["instance"]][e["pid"]] = e
    return out


def steps_by_rank(v: dict[str, Any]) -> Counter[int]:
    return Counter(e["pid"] for e in v["events"] if e["ph"] == "X" and e.get("cat") == "pardiag.step")


def export(path: Path, out: Path) -> tuple[dict[str, Any], Any, Any]:
    from pardiag.analyzers.pipeline import analyze_path
    from pardiag.export_perfetto import export_perfetto

    analysis = analyze_path(path)
    res = export_perfetto(path, out, analysis)
    return validate(load(out)), res, analysis


# ------------------------------------------------------------------------------ GPU fixtures
def test_sampled_gpu_job_exports_with_flows_steps_and_streams(tmp_path: Path) -> None:
    v, res, analysis = export(SAMPLED, tmp_path / "job.json.gz")
    assert v["processes"] == {0: "rank 0", 1: "rank 1"}  # these traces name no host
    # one flow per collective the analysis matched (its calls, counted by collectives.match)
    matched = sum(c.calls for c in analysis.collectives)
    assert matched == 7 and len(pardiag_flows(v)) == matched == res.flows
    assert all(len(m) == 2 for m in members(v).values()) and len(members(v)) == matched
    # one step slice per profiled step of each rank
    assert steps_by_rank(v) == {r.rank: r.steps_profiled for r in analysis.ranks} == {0: 2, 1: 2}
    names = {e["args"]["name"] for e in v["events"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"GPU 0 stream 7", "GPU 1 stream 7", "steps", "collectives (matched)"} <= names
    kernels = Counter(e["pid"] for e in v["events"] if e.get("cat") == "kernel")
    source = {r: sum(e.get("cat") == "kernel" for e in load(SAMPLED / f"sampled_rank-{r}.json.gz")["traceEvents"])
              for r in (0, 1)}
    assert kernels == source == {0: 1154, 1: 1104}  # every kernel of both traces, under its rank
    doc = load(tmp_path / "job.json.gz")["otherData"]["pardiag"]
    assert doc["clock_offsets_us"] == {"0": 0.0, "1": 332.0} == analysis.run.clock_offsets_us
    assert doc["missing_ranks"] == {} and doc["collective_flows"] == matched
    assert list(load(tmp_path / "job.json.gz")) == ["displayTimeUnit", "otherData", "traceEvents"]
    assert res.left_out == 0


def test_clocks_are_aligned_as_the_analysis_aligns_them(tmp_path: Path) -> None:
    """A rank whose clock is 5 s ahead (another host) lands where it lands with the clock
    right: the offset is measured on the collectives' ends, as the analysis measures it."""
    from pardiag.analyzers import replay
    from pardiag.analyzers.trace import load_trace

    skewed = tmp_path / "skewed"
    skewed.mkdir()
    shutil.copy(SAMPLED / "sampled_rank-0.json.gz", skewed)
    doc = json.loads(gzip.decompress((SAMPLED / "sampled_rank-1.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 5_000_000
    (skewed / "sampled_rank-1.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    a, _, _ = export(SAMPLED, tmp_path / "a.json")
    b, _, _ = export(skewed, tmp_path / "b.json")
    times = [sorted((e["tid"], e["ts"], e["name"]) for e in v["events"] if e["pid"] == 1 and e["ph"] == "X")
             for v in (a, b)]
    assert times[0] == times[1]
    other = load(tmp_path / "b.json")["otherData"]["pardiag"]
    assert other["clock_offsets_us"]["1"] == pytest.approx(5_000_332.0)
    # the replay model's own alignment of the same traces: a step starts where it places it
    model = replay.build_model({r: load_trace(p) for r, p in enumerate(sorted(skewed.iterdir()))})
    first = {e["pid"]: e["ts"] for e in b["events"] if e.get("cat") == "pardiag.step" and e["name"] == "step 551"}
    zero = other["time_zero_us"]
    assert first[1] - first[0] == pytest.approx(model.origin[1] - model.origin[0], abs=0.002)
    assert first[0] == pytest.approx(model.origin[0] - zero, abs=0.002)
    # after alignment, each all-reduce and all-gather ends on both ranks within 1 ms: NCCL's
    # ring kernels of one collective finish within the last chunk's hop of each other (0 to
    # 521 us here). The all-to-alls are left out: these traces name no process group, and
    # the ranks' k-th all-to-alls are not one operation (rank 1 enters the first one after
    # rank 0 has left it), which is the analysis' matching of unnamed groups, not the clock.
    joint = {i: m for i, m in members(b).items() if m[0]["name"] in ("all_reduce", "all_gather")}
    gaps = [abs((m[1]["ts"] + m[1]["dur"]) - (m[0]["ts"] + m[0]["dur"])) for m in joint.values()]
    assert len(gaps) == 4 and max(gaps) <= 1_000.0, gaps
    # and neither rank leaves one before the other has arrived
    assert all(min(e["ts"] + e["dur"] for e in m.values()) >= max(e["ts"] for e in m.values()) for m in joint.values())


def test_straggler_is_labelled_and_marked(tmp_path: Path) -> None:
    from dataclasses import replace

    from pardiag.analysis import Straggler
    from pardiag.analyzers.pipeline import analyze_path
    from pardiag.export_perfetto import export_perfetto

    lag = Straggler(rank=1, excess_us_per_step=23_500.0, cause="forward", evidence=["forward 23.5 ms over the median"])
    analysis = replace(analyze_path(SAMPLED), stragglers=[lag])
    export_perfetto(SAMPLED, tmp_path / "job.json", analysis)
    v = validate(load(tmp_path / "job.json"))
    labels = {e["pid"]: e["args"]["labels"] for e in v["events"] if e["ph"] == "M" and e["name"] == "process_labels"}
    assert labels == {1: "straggler: forward, +23.5 ms/step"}
    (mark,) = [e for e in v["events"] if e["ph"] == "i" and e["name"].startswith("straggler")]
    first = min(e["ts"] for e in v["events"] if e.get("cat") == "pardiag.step" and e["pid"] == 1)
    assert mark["pid"] == 1 and mark["ts"] == first and mark["args"]["evidence"] == lag.evidence
    steps = [e for e in v["events"] if e.get("cat") == "pardiag.step"]
    assert {e["pid"]: e["args"].get("straggler") for e in steps} == {0: None, 1: "forward"}
    assert load(tmp_path / "job.json")["otherData"]["pardiag"]["stragglers"] == [
        {"rank": 1, "cause": "forward", "excess_us_per_step": 23_500.0}]


def test_single_rank_gpu_trace_keeps_kinetos_flows_in_pairs(tmp_path: Path) -> None:
    v, res, analysis = export(A100, tmp_path / "a100.json.gz")
    assert v["processes"] == {0: "rank 0"} and res.missing == {}
    assert pardiag_flows(v) == {} and res.flows == 0  # one rank of two: nothing to join
    kineto = Counter(k[0] for k in v["flows"])
    # the file's launch->kernel (ac2g) and forward->backward flows whose both ends it holds
    assert kineto == {"ac2g": 3774, "fwdbwd": 543}
    assert steps_by_rank(v) == {0: analysis.ranks[0].steps_profiled} == {0: 3}
    path = [e for e in v["events"] if e.get("cat") == "pardiag.critical_path"]
    assert path and res.critical_path is None
    # the critical path's marks hold the steps' time on it (the replay reproduces the window)
    steps = [e for e in v["events"] if e.get("cat") == "pardiag.step"]
    assert sum(e["args"]["on_path_us"] for e in path) == pytest.approx(sum(e["dur"] for e in steps), rel=0.02)


def test_plain_json_output_and_its_counts(tmp_path: Path) -> None:
    v, res, _ = export(SAMPLED, tmp_path / "job.json")
    assert (tmp_path / "job.json").read_bytes()[:1] == b"{" and res.bytes == (tmp_path / "job.json").stat().st_size
    assert res.events == len(v["events"])
    assert not list(tmp_path.glob(".job.json.*"))  # no temporary file left behind


def test_some_ranks_only(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    res = run_pardiag("export", str(SAMPLED), "--perfetto", "--ranks", "1", "-o", str(out))
    assert res.returncode == 0, res.stderr
    v = validate(load(out))
    assert v["processes"] == {1: "rank 1"} and pardiag_flows(v) == {}  # nobody to join it to
    assert load(out)["otherData"]["pardiag"]["clock_offsets_us"] == {"1": 0.0}  # its own clock is the reference
    for spec, words in (("5-7", "none of them in"), ("x", "not a list of ranks"), ("3-1", "no range of ranks")):
        bad = run_pardiag("export", str(SAMPLED), "--ranks", spec, "-o", str(tmp_path / "bad.json"))
        assert bad.returncode == 2 and words in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_an_export_among_the_traces_is_no_rank(tmp_path: Path) -> None:
    """Written into the folder it came from, the export is left out of the next reading of it."""
    from pardiag.analyzers.pipeline import analyze_path

    traces = tmp_path / "traces"
    shutil.copytree(SAMPLED, traces)
    res = run_pardiag("export", str(traces), "--perfetto", "-o", str(traces / "job.json.gz"))
    assert res.returncode == 0, res.stderr
    a = analyze_path(traces)
    assert [r.rank for r in a.ranks] == [0, 1]
    assert any("job.json.gz: a whole job exported by `pardiag export`" in n.message for n in a.notices)
    again = run_pardiag("export", str(traces), "--perfetto", "-o", str(traces / "job.json.gz"))
    assert again.returncode == 0 and "events of 2 ranks" in again.stdout
    assert "note: job.json.gz: a whole job exported by `pardiag export`, not a rank's trace; left out" in again.stderr
    alone = run_pardiag("analyze", str(traces / "job.json.gz"))
    assert alone.returncode == 2 and "not a rank's trace" in alone.stderr


# ------------------------------------------------------------------------------ bad input
def test_odd_events_are_left_out_or_kept_valid(tmp_path: Path) -> None:
    """A real trace with events no profiler writes: a list for a pid, an object for a tid,
    no time, a negative duration, an unknown phase; a counter and an async pair."""
    doc = load(SAMPLED / "sampled_rank-0.json.gz")
    ev = doc["traceEvents"]
    ev[10]["pid"], ev[11]["tid"], ev[12]["ts"], ev[13]["dur"], ev[14]["ph"] = [1, 2], {"a": 1}, None, -5, "P"
    t = ev[20]["ts"]
    ev += [{"ph": "C", "name": "mem", "pid": 4037, "tid": 4037, "ts": t, "args": {"bytes": 5}},
           {"ph": "b", "name": "io", "cat": "a", "id": "0x1", "pid": 4037, "tid": 4037, "ts": t},
           {"ph": "e", "name": "io", "cat": "a", "id": "0x1", "pid": 4037, "tid": 4037, "ts": t + 5}]
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank-0.json").write_text(json.dumps(doc))
    res = run_pardiag("export", str(tmp_path / "traces"), "-o", str(tmp_path / "odd.json"))
    assert res.returncode == 0, res.stderr
    assert "3 events of the traces left out" in res.stderr and "Traceback" not in res.stderr
    v = validate(load(tmp_path / "odd.json"))
    odd = [e for e in v["events"] if e["ph"] in "Cbe"]
    assert [(e["ph"], e.get("id")) for e in odd] == [("C", None), ("b", 1), ("e", 1)]  # the async pair keeps one id
    names = {e["args"]["name"] for e in v["events"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "profiler" in names  # where the events without a thread of their own went


def test_missing_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    res = run_pardiag("export", str(tmp_path / "nope"), "--perfetto", "-o", str(tmp_path / "x.json.gz"))
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "no such file" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "x.json.gz").exists()


def test_truncated_rank_is_left_out_and_named(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLED, traces)
    bad = traces / "sampled_rank-1.json.gz"
    data = gzip.decompress(bad.read_bytes())
    bad.write_bytes(gzip.compress(data[: len(data) // 2]))
    out = tmp_path / "job.json.gz"
    res = run_pardiag("export", str(traces), "--perfetto", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "rank 1 left out of the export" in res.stderr and "truncated" in res.stderr
    assert "Traceback" not in res.stderr and "ranks left out: 1" in res.stdout
    v = validate(load(out))
    other = load(out)["otherData"]["pardiag"]
    assert list(other["missing_ranks"]) == ["1"] and other["ranks"] == [0]
    labels = {e["pid"]: e["args"]["labels"] for e in v["events"] if e["ph"] == "M" and e["name"] == "process_labels"}
    assert labels[1].startswith("no trace: trace unreadable")
    assert not [e for e in v["events"] if e["pid"] == 1 and e["ph"] == "X"]


def test_no_readable_trace_is_an_error(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank-0.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": 1,'))
    res = run_pardiag("export", str(traces), "--perfetto", "-o", str(tmp_path / "x.json.gz"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0 and "no readable trace to export" in res.stderr
    assert not list(tmp_path.glob("*.json.gz")) and not list(tmp_path.glob(".x.json.gz*"))


def test_help_says_what_the_file_holds() -> None:
    res = run_pardiag("export", "--help")
    assert res.returncode == 0
    for words in ("--perfetto", "ui.perfetto.dev", "chrome://tracing", "critical path", "collectives (matched)"):
        assert words in res.stdout


# ------------------------------------------------------------------------------ a real run
@pytest.mark.slow
@pytest.mark.timed
def test_real_gloo_run_with_a_straggler(tmp_path: Path) -> None:
    from pardiag.analyzers import replay

    run = tmp_path / "run"
    res = run_pardiag("run", "-q", "--no-report", "--out", str(run), "--",
                      *torchrun(2, EXAMPLE, "--steps", "20", "--straggler-rank", "1", "--straggler-ms", "60"))
    assert res.returncode == 0, res.stderr[-2000:]
    out = tmp_path / "job.json.gz"
    res = run_pardiag("export", str(run), "--perfetto", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "flows joining the collectives" in res.stdout
    v = validate(load(out))
    analysis = json.loads(run_pardiag("analyze", str(run), "--json").stdout)
    host = analysis["ranks"][0]["host"]
    assert v["processes"] == {0: f"rank 0 ({host})", 1: f"rank 1 ({host})"}
    # flows: one per matched collective, counted two independent ways
    model = replay.load_run(str(run))
    calls = sum(c["calls"] for c in analysis["collectives"])
    assert len(pardiag_flows(v)) == calls == len(model.groups) >= 3
    assert steps_by_rank(v) == {r["rank"]: r["steps_profiled"] for r in analysis["ranks"]}
    # ranks on one host share its clock: the export keeps it (offset 0, as the replay)
    other = load(out)["otherData"]["pardiag"]
    assert other["clock_offsets_us"] == {"0": 0.0, "1": 0.0}
    # On the aligned clock no rank leaves a collective before the last one has arrived (1 us:
    # the written nanosecond of two timestamps of one clock, with room).
    for m in members(v).values():
        assert min(e["ts"] + e["dur"] for e in m.values()) >= max(e["ts"] for e in m.values()) - 1.0, m
    # The data moves for both ranks at once (loopback: microseconds), then each rank's gloo
    # worker closes its annotation when it runs again: 0.2 to 5.4 ms apart on the quiet demo,
    # 5 to 13 ms in a run of this test with the straggler's 60 ms of work and a load average
    # of 3 on 2 cores (a descheduled worker waits out a scheduler period). A quarter of the
    # median step (over 100 ms here) bounds that and still fails a clock off by a step.
    step = statistics.median(e["dur"] for e in v["events"] if e.get("cat") == "pardiag.step")
    ends = [abs((m[1]["ts"] + m[1]["dur"]) - (m[0]["ts"] + m[0]["dur"])) for m in members(v).values()]
    assert max(ends) <= step / 4, (ends, step)
    # the stragglers the analysis names (rank 1, unless 2 busy cores hid it), marked on their rank
    marks = [e for e in v["events"] if e["ph"] == "i" and e["name"].startswith("straggler")]
    assert [(e["pid"], e["args"]["cause"]) for e in marks] == [(s["rank"], s["cause"]) for s in analysis["stragglers"]]
    assert {s["rank"] for s in analysis["stragglers"]} <= {1}
    # the critical path: marks on a track of their own, and the median step's path in the
    # args of the step it ends on
    cp = analysis["critical_path"]
    (median,) = [e for e in v["events"] if e.get("cat") == "pardiag.step" and "critical_path" in e["args"]]
    assert median["pid"] == cp["rank"] and median["name"] == f"step {cp['step']}"
    path = [e for e in v["events"] if e.get("cat") == "pardiag.critical_path" and e["args"]["step"] == cp["step"]]
    on_path = defaultdict(float)
    for e in path:
        on_path[str(e["pid"])] += e["args"]["on_path_us"]
    assert on_path == pytest.approx(cp["by_rank_us"], abs=1.0)
