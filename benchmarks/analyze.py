"""How much faster and leaner is pardiag's trace analysis than HTA's, on big traces?

Builds one-rank Kineto traces of the requested sizes by replicating a real fixture
trace's events with shifted timestamps (offset correlation / External id / flow ids,
renumbered ProfilerStep#N, metadata around the list as Kineto writes it, one event per
line), then, for each size, runs in separate child processes

  pardiag  load_trace + gpu_breakdown
  HTA      TraceAnalysis(trace_dir) + get_temporal_breakdown (default json backend),
           then get_comm_comp_overlap for the agreement check (not timed)

and reports wall time (whole child: interpreter start, imports, work), in-process
time, and peak RSS (``os.wait4`` rusage of each child), the HTA/pardiag ratios, and
whether idle/compute/non-compute/kernel time and the overlap agree.
Targets: >= 25x faster and <= 1/10 of HTA's peak memory at 1 GB.

    python benchmarks/analyze.py                  # 200 MB, about a minute
    python benchmarks/analyze.py --sizes 200,1000 # HTA needs ~8 min and ~5.5 GB at 1 GB
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
def _child_pardiag(path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    from pardiag.analyzers.gpu_breakdown import gpu_breakdown
    from pardiag.analyzers.trace import load_trace

    t1 = time.perf_counter()
    trace = load_trace(path)
    t2 = time.perf_counter()
    b = gpu_breakdown(trace)
    t3 = time.perf_counter()
    assert b is not None
    return {"import_s": t1 - t0, "load_s": t2 - t1, "breakdown_s": t3 - t2,
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
    analysis = TraceAnalysis(trace_dir=str(Path(path).parent))
    t2 = time.perf_counter()
    tb = analysis.get_temporal_breakdown(visualize=False)
    t3 = time.perf_counter()
    ov = analysis.get_comm_comp_overlap(visualize=False)
    row = tb.iloc[0]
    return {"import_s": t1 - t0, "load_s": t2 - t1, "breakdown_s": t3 - t2,
            "idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]),
            "kernel_time_us": float(row["kernel_time(us)"]),
            "overlap_pct": float(ov.iloc[0]["comp_comm_overlap_pctg"])}


@dataclass(frozen=True)
class ChildRun:
    wall_s: float
    peak_rss_mb: float
    result: dict[str, Any]


def run_child(tool: str, path: Path) -> ChildRun:
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


def bench_size(source: Path, size_mb: int, workdir: Path, hta_max_mb: int = 1000) -> dict[str, Any]:
    folder = workdir / f"{size_mb}mb"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank0.json"
    t0 = time.perf_counter()
    nbytes, nevents = synthesize(source, size_mb, path)
    synth_s = time.perf_counter() - t0
    ours = run_child("pardiag", path)
    if size_mb > hta_max_mb:  # HTA needs ~5.5x the file in memory: past this it cannot load
        return {"size_mb": round(nbytes / 1e6, 1), "events": nevents, "synth_s": round(synth_s, 1),
                "pardiag": asdict(ours), "hta": None, "agree": True, "diff": {}}
    hta = run_child("hta", path)
    diff = {k: ours.result[k] - hta.result[k] for k in AGREEMENT_KEYS}
    hta_work = hta.result["load_s"] + hta.result["breakdown_s"]
    our_work = ours.result["load_s"] + ours.result["breakdown_s"]
    return {
        "size_mb": round(nbytes / 1e6, 1), "events": nevents, "synth_s": round(synth_s, 1),
        "pardiag": asdict(ours), "hta": asdict(hta),
        "wall_ratio": hta.wall_s / ours.wall_s,
        "work_ratio": hta_work / our_work,
        "memory_ratio": hta.peak_rss_mb / ours.peak_rss_mb,
        "agree": all(abs(v) <= 1e-6 for v in diff.values()), "diff": diff,
    }


def _print(r: dict[str, Any]) -> None:
    p, h = r["pardiag"], r["hta"]
    print(f"\n{r['size_mb']:.0f} MB, {r['events']:,} events")
    if h is None:
        res = p["result"]
        print(f"  pardiag  wall {p['wall_s']:7.2f} s  (load {res['load_s']:.2f} s + breakdown "
              f"{res['breakdown_s']:.2f} s)  peak RSS {p['peak_rss_mb']:7.0f} MB   (HTA not run at this size)")
        return
    for name, c in (("pardiag", p), ("HTA", h)):
        res = c["result"]
        print(f"  {name:8s} wall {c['wall_s']:7.2f} s  (load {res['load_s']:.2f} s + breakdown "
              f"{res['breakdown_s']:.2f} s)  peak RSS {c['peak_rss_mb']:7.0f} MB")
    print(f"  HTA/pardiag: wall x{r['wall_ratio']:.1f}, load+breakdown x{r['work_ratio']:.1f}, "
          f"peak memory x{r['memory_ratio']:.1f}")
    verdict = "identical" if r["agree"] else f"DIFFER {r['diff']}"
    res = p["result"]
    print(f"  breakdown {verdict}: idle {res['idle_us']:.0f} / compute {res['compute_us']:.0f} / "
          f"non-compute {res['non_compute_us']:.0f} / kernel time {res['kernel_time_us']:.0f} us, "
          f"overlap {res['overlap_pct']}%")


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
        result = _child_pardiag(path) if tool == "pardiag" else _child_hta(path)
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
    return 0 if all(r["agree"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
