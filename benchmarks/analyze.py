"""How much faster and leaner is pardiag's trace analysis than HTA's, on big traces?

Builds one-rank Kineto traces of the requested sizes by replicating a real fixture
trace's events with shifted timestamps (offset correlation / External id / flow ids,
renumbered ProfilerStep#N, metadata around the list as Kineto writes it, one event per
line), then, for each size, runs in separate child processes

  pardiag    load_trace + gpu_breakdown, its blocks decoded by one worker per core
  pardiag/1  the same in one process (load_trace(workers=1)): what one core does
  HTA        TraceAnalysis(trace_dir) + get_temporal_breakdown (default json backend),
             then get_comm_comp_overlap for the agreement check (not timed)

and reports wall time (whole child: interpreter start, imports, work), in-process time
(load + breakdown: the ratio the targets are about), the JSON decoded per second in all
and per core used, peak memory (the largest PSS of the child and its workers together,
sampled every 2 ms in a run of its own; PSS counts pages a forked worker shares with its
parent once) and
peak RSS of the child alone (``os.wait4``), the HTA/pardiag ratios, and whether
idle/compute/non-compute/kernel time and the overlap agree. Between sizes, the growth
of pardiag's time per MB. Targets: load + breakdown >= 50x faster than HTA's at 200 MB
and at 1 GB, peak memory <= 0.3x the file, the same numbers.

    python benchmarks/analyze.py                  # 200 MB, about a minute
    python benchmarks/analyze.py --sizes 200,1000,5000   # HTA runs up to --hta-max (1 GB)
    python benchmarks/analyze.py --sizes 200 --json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = (REPO.parent / "shared" / "fixtures" / "gpu-traces" / "a100-2rank-rank0"
                  / "nccl_data.json.gz")
ID_STRIDE = 10_000_000
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
TARGET_SPEEDUP = 50.0  # HTA's load + breakdown over pardiag's
TARGET_MEMORY = 0.3  # pardiag's peak memory over the file's size


# --------------------------------------------------------------------------- synth
def _shift(event: dict[str, Any], copy: int, dt: float, steps: int) -> dict[str, Any]:
    e = dict(event)
    if "ts" in e:
        e["ts"] = e["ts"] + copy * dt
    if "id" in e and isinstance(e["id"], int):
        e["id"] += copy * ID_STRIDE
    m = _STEP.match(str(e.get("name", "")))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + copy * steps}"
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += copy * ID_STRIDE
        e["args"] = args
    return e


def synthesize(source: Path, target_mb: int, out: Path) -> tuple[int, int]:
    """Write a trace of about ``target_mb`` MB; return (bytes, events)."""
    doc = json.loads(gzip.open(source).read() if source.suffix == ".gz" else source.read_bytes())
    events = doc.pop("traceEvents")
    body = [e for e in events if e.get("ph") != "M" and e.get("cat") != "Trace"]
    tail = [e for e in events if e.get("ph") == "M" or e.get("cat") == "Trace"]
    starts = [e["ts"] for e in body if "ts" in e]
    ends = [e["ts"] + e.get("dur", 0) for e in body if "ts" in e]
    dt = math.ceil(max(ends) - min(starts)) + 1000  # int: integer timestamps stay int
    steps = sum(1 for e in body if _STEP.match(str(e.get("name", ""))))
    head = {k: v for k, v in doc.items() if k in ("schemaVersion", "deviceProperties",
                                                  "distributedInfo")}
    rest = {k: v for k, v in doc.items() if k not in head}
    target = target_mb * 1_000_000
    n = 0
    with open(out, "w") as f:
        f.write("{\n" + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in head.items()))
        f.write('  "traceEvents": [\n')
        sep = ""
        copy = 0
        while copy == 0 or f.tell() < target:
            f.write("".join(sep + "  " + json.dumps(_shift(e, copy, dt, steps))
                            for sep, e in zip([sep] + [",\n"] * (len(body) - 1), body)))
            sep = ",\n"
            n += len(body)
            copy += 1
        for e in tail:
            f.write(",\n  " + json.dumps(e))
            n += 1
        f.write("\n  ]" + "".join(f',\n  "{k}": {json.dumps(v)}' for k, v in rest.items()))
        f.write("\n}\n")
    return out.stat().st_size, n


# --------------------------------------------------------------------------- children
def _tree_pss_mb(pid: int) -> float:
    """PSS of a process and its descendants, MB (0 for what cannot be read)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) / 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


class _PeakMemory:
    """The largest PSS of this process tree, sampled every ``interval`` s in a thread."""

    def __init__(self, interval: float = 0.02) -> None:
        import threading

        self.interval = interval
        self.peak = _tree_pss_mb(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _tree_pss_mb(os.getpid()))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _tree_pss_mb(os.getpid()))


MEMORY_SAMPLE_S = 0.002
"""The memory run's sampling interval: the breakdown's peak lasts about 30 ms at 200 MB,
which sampling every 20 ms caught at 59-61 MB where every 2 ms reads 61-64."""


def _child_pardiag(path: str, workers: int | None, interval: float = 0.02) -> dict[str, Any]:
    t0 = time.perf_counter()
    from pardiag.analyzers import trace_parallel
    from pardiag.analyzers.gpu_breakdown import gpu_breakdown
    from pardiag.analyzers.trace import load_trace

    t1 = time.perf_counter()
    mem = _PeakMemory(interval)
    used = trace_parallel.cores() if workers is None else workers
    if not trace_parallel.worth_it(Path(path), used):
        used = 1
    trace = load_trace(path, workers=workers)
    t2 = time.perf_counter()
    b = gpu_breakdown(trace)
    t3 = time.perf_counter()
    assert b is not None
    return {"import_s": t1 - t0, "load_s": t2 - t1, "breakdown_s": t3 - t2, "cores": used,
            "peak_pss_mb": mem.stop(),
            "idle_us": b.idle_us, "compute_us": b.compute_us,
            "non_compute_us": b.non_compute_us, "kernel_time_us": b.span_us,
            "overlap_pct": round(100 * (b.overlap_ratio or 0.0), 2)}


def _child_hta(path: str) -> dict[str, Any]:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    t1 = time.perf_counter()
    mem = _PeakMemory()
    analysis = TraceAnalysis(trace_dir=str(Path(path).parent))
    t2 = time.perf_counter()
    tb = analysis.get_temporal_breakdown(visualize=False)
    t3 = time.perf_counter()
    peak = mem.stop()
    ov = analysis.get_comm_comp_overlap(visualize=False)
    row = tb.iloc[0]
    return {"import_s": t1 - t0, "load_s": t2 - t1, "breakdown_s": t3 - t2, "cores": 1, "peak_pss_mb": peak,
            "idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]),
            "kernel_time_us": float(row["kernel_time(us)"]),
            "overlap_pct": float(ov.iloc[0]["comp_comm_overlap_pctg"])}


@dataclass(frozen=True)
class ChildRun:
    wall_s: float
    peak_rss_mb: float
    result: dict[str, Any]


def run_child(tool: str, path: Path) -> ChildRun:  # tool: pardiag, pardiag/1 or hta
    """Run one tool in a fresh interpreter; wall time and peak RSS of that child."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", tool, str(path)],
                                stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)  # reap it here to get its own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"{tool} failed:\n{err.read().decode(errors='replace')[-3000:]}")
    rss = usage.ru_maxrss / 1024
    return ChildRun(wall, rss, json.loads(out.decode().strip().splitlines()[-1]))


# --------------------------------------------------------------------------- main
AGREEMENT_KEYS = ("idle_us", "compute_us", "non_compute_us", "kernel_time_us", "overlap_pct")


def _work(c: ChildRun) -> float:
    return float(c.result["load_s"] + c.result["breakdown_s"])


def bench_size(source: Path, size_mb: int, workdir: Path, hta_max_mb: int = 1000) -> dict[str, Any]:
    folder = workdir / f"{size_mb}mb"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank0.json"
    t0 = time.perf_counter()
    nbytes, nevents = synthesize(source, size_mb, path)
    synth_s = time.perf_counter() - t0
    ours = run_child("pardiag", path)
    # memory in a run of its own, sampled every 2 ms (which slows the reader a little)
    ours.result["peak_pss_mb"] = max(ours.result["peak_pss_mb"],
                                     run_child("pardiag-memory", path).result["peak_pss_mb"])
    serial = run_child("pardiag/1", path)
    mb = nbytes / 1e6
    out: dict[str, Any] = {
        "size_mb": round(mb, 1), "events": nevents, "synth_s": round(synth_s, 1),
        "pardiag": asdict(ours), "pardiag_1": asdict(serial), "hta": None,
        "mb_per_s": mb / ours.result["load_s"], "cores": ours.result["cores"],
        "mb_per_s_per_core": mb / ours.result["load_s"] / ours.result["cores"],
        "mb_per_s_1": mb / serial.result["load_s"],
        "memory_of_file": ours.result["peak_pss_mb"] / mb,
        "diff_1": {k: ours.result[k] - serial.result[k] for k in AGREEMENT_KEYS},
    }
    out["agree"] = all(abs(v) <= 1e-6 for v in out["diff_1"].values())
    if size_mb > hta_max_mb:  # HTA needs ~5.5x the file in memory: past this it cannot load
        out["diff"] = {}
        return out
    hta = run_child("hta", path)
    diff = {k: ours.result[k] - hta.result[k] for k in AGREEMENT_KEYS}
    out.update({
        "hta": asdict(hta), "wall_ratio": hta.wall_s / ours.wall_s, "work_ratio": _work(hta) / _work(ours),
        "work_ratio_1": _work(hta) / _work(serial), "memory_ratio": hta.result["peak_pss_mb"] / ours.result["peak_pss_mb"],
        "diff": diff,
    })
    out["agree"] = out["agree"] and all(abs(v) <= 1e-6 for v in diff.values())
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _print(r: dict[str, Any]) -> None:
    print(f"\n{r['size_mb']:.0f} MB, {r['events']:,} events")
    rows = [("pardiag", r["pardiag"]), ("pardiag/1", r["pardiag_1"])] + ([("HTA", r["hta"])] if r["hta"] else [])
    for name, c in rows:
        res = c["result"]
        print(f"  {name:9s} wall {c['wall_s']:7.2f} s  (load {res['load_s']:.2f} s + breakdown "
              f"{res['breakdown_s']:.2f} s, {res['cores']} core(s))  peak memory {res['peak_pss_mb']:6.0f} MB "
              f"(RSS of the process {c['peak_rss_mb']:.0f} MB)")
    print(f"  decoded {r['mb_per_s']:.0f} MB/s on {r['cores']} core(s), {r['mb_per_s_per_core']:.0f} MB/s per core "
          f"({r['mb_per_s_1']:.0f} MB/s in one process)")
    mem_ok = r["memory_of_file"] <= TARGET_MEMORY
    print(f"  peak memory {r['memory_of_file']:.2f}x the file: target <= {TARGET_MEMORY}x {_met(mem_ok)}")
    if r["hta"] is None:
        print("  (HTA not run at this size)")
    else:
        ok = r["work_ratio"] >= TARGET_SPEEDUP
        print(f"  HTA/pardiag: load+breakdown x{r['work_ratio']:.1f} (one process x{r['work_ratio_1']:.1f}), "
              f"wall x{r['wall_ratio']:.1f}, peak memory x{r['memory_ratio']:.1f}; target x{TARGET_SPEEDUP:g} {_met(ok)}")
    verdict = "identical" if r["agree"] else f"DIFFER {r['diff']} {r['diff_1']}"
    res = r["pardiag"]["result"]
    who = "pardiag, pardiag/1 and HTA" if r["hta"] else "pardiag and pardiag/1"
    print(f"  breakdown {verdict} ({who}): idle {res['idle_us']:.0f} / compute {res['compute_us']:.0f} / "
          f"non-compute {res['non_compute_us']:.0f} / kernel time {res['kernel_time_us']:.0f} us, "
          f"overlap {res['overlap_pct']}%")


def _print_growth(results: list[dict[str, Any]]) -> None:
    if len(results) < 2:
        return
    base = results[0]
    per_mb = [r["pardiag"]["result"]["load_s"] / r["size_mb"] for r in results]
    steps = ", ".join(f"{r['size_mb']:.0f} MB x{p / per_mb[0]:.2f}" for r, p in zip(results[1:], per_mb[1:]))
    print(f"\ngrowth of pardiag's load time per MB against {base['size_mb']:.0f} MB: {steps} (1.00: linear)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="200", help="trace sizes in MB, comma separated")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="trace to replicate")
    ap.add_argument("--workdir", type=Path, help="where to write traces (default: temp)")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    ap.add_argument("--hta-max", type=int, default=1000, metavar="MB",
                    help="largest size HTA is run on (it needs about 5.5x the file in memory)")
    ap.add_argument("--child", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        tool, path = a.child
        result = (_child_hta(path) if tool == "hta" else
                  _child_pardiag(path, None, MEMORY_SAMPLE_S) if tool == "pardiag-memory" else
                  _child_pardiag(path, 1 if tool == "pardiag/1" else None))
        print(json.dumps(result))
        return 0
    if not a.source.exists():
        print(f"source trace not found: {a.source}", file=sys.stderr)
        return 2
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="pardiag-bench-"))
    results = []
    try:
        for size in (int(s) for s in a.sizes.split(",") if s.strip()):
            r = bench_size(a.source, size, workdir, a.hta_max)
            results.append(r)
            if not a.json:
                _print(r)
            shutil.rmtree(workdir / f"{size}mb", ignore_errors=True)
    finally:
        if a.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if a.json:
        print(json.dumps(results, indent=2))
    else:
        _print_growth(results)
    return 0 if all(r["agree"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
