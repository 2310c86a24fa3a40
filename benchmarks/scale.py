"""Scale: per-node reduction and central analysis for 8 to 1,024 ranks.

Builds synthetic run directories from a real GPU fixture trace (each rank a copy of
one of 8 variants whose kernel durations differ by a few per cent, plus 50 steps of
steps.jsonl with per-rank variation and a meta.json), then measures, each in its own
process:

- reduction: summarising every trace (what each node does for its own ranks after
  the job, here all of them on this machine); per node = 8 ranks, run in parallel on
  a cluster, so the per-node time is total / (ranks / 8);
- central analysis from the summaries (what `pardiag analyze RUN` does on a large
  job): wall time and peak memory, with the growth factor per doubling of ranks
  (target: linear or better, under a minute and 2 GB at 1,024 ranks);
- central analysis straight from the traces at the smaller sizes, and HTA's
  TraceAnalysis load + temporal breakdown on the same traces where it can load them.

    python benchmarks/scale.py                       # 8, 64, 512, 1024 ranks
    python benchmarks/scale.py --sizes 8,64 --hta-max 64
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "gpu-traces" / "sampled-128rank-job" / "sampled_rank-0.json.gz"
VARIANTS = 8
RANKS_PER_NODE = 8


def make_variants(work: Path) -> list[Path]:
    doc = json.loads(gzip.open(FIXTURE, "rt").read())
    out = []
    for v in range(VARIANTS):
        d = json.loads(json.dumps(doc))
        scale = 1.0 + 0.03 * v
        for e in d["traceEvents"]:
            if e.get("cat") == "kernel" and isinstance(e.get("dur"), (int, float)):
                e["dur"] = e["dur"] * scale
        p = work / f"variant{v}.json.gz"
        with gzip.open(p, "wt", compresslevel=3) as f:
            json.dump(d, f)
        out.append(p)
    return out


def make_run(root: Path, n: int, variants: list[Path]) -> Path:
    run = root / f"run{n}"
    rng = random.Random(n)
    for r in range(n):
        d = run / "ranks" / str(r)
        d.mkdir(parents=True)
        shutil.copy(variants[r % VARIANTS], d / "trace.json.gz")
        base = 100_000.0 * (1 + 0.02 * (r % 5))
        with open(d / "steps.jsonl", "w") as f:
            for s in range(50):
                dur = base * (1 + 0.05 * rng.random())
                f.write(json.dumps({"step": s, "t_end_ns": s * 10**8, "dur_us": dur, "data_us": 500.0,
                                    "bwd_us": dur * 0.5, "opt_us": 2000.0, "backwards": 1, "pardiag_us": 20.0}) + "\n")
        meta = {"format": "pardiag.rank-meta", "format_version": 1, "rank": r, "world_size": n,
                "host": f"node{r // RANKS_PER_NODE}", "exit": {"status": "exited"}}
        (d / "meta.json").write_text(json.dumps(meta))
    return run


def timed(code: str) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MB, the largest of the process and its children) of `code`."""
    prog = (
        "import resource, sys, time\n"
        "t0 = time.perf_counter()\n" + code + "\n"
        "wall = time.perf_counter() - t0\n"
        "peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print('RESULT', wall, peak / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT"))
    _, wall, peak = line.split()
    return float(wall), float(peak), out.stdout


def growth(sizes: list[int], times: list[float]) -> list[str]:
    out = ["-"]
    for (n1, t1), (n2, t2) in zip(zip(sizes, times), list(zip(sizes, times))[1:]):
        out.append(f"{(t2 / t1) ** (1 / math.log2(n2 / n1)):.2f}" if t1 > 0 else "-")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8,64,512,1024")
    p.add_argument("--raw-max", type=int, default=64, help="largest size analysed straight from traces")
    p.add_argument("--hta-max", type=int, default=8, help="largest size given to HTA (0: none)")
    args = p.parse_args(argv)
    if not FIXTURE.is_file():
        print(f"fixture trace not found: {FIXTURE.name}")
        return 1
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        variants = make_variants(work)
        print(f"built {VARIANTS} trace variants from {FIXTURE.name} in {time.perf_counter() - t0:.1f} s", flush=True)
        for n in sizes:
            run = make_run(work, n, variants)
            raw = hta = None
            if n <= args.raw_max:
                raw = timed(f"from pardiag.analyzers.pipeline import analyze_path\nfrom pathlib import Path\n"
                            f"analyze_path(Path({str(run)!r}))")
            if n <= args.hta_max:
                files = {r: str(run / "ranks" / str(r) / "trace.json.gz") for r in range(n)}
                hta = timed("import logging; logging.disable(logging.WARNING)\n"
                            "from hta.trace_analysis import TraceAnalysis\n"
                            f"ta = TraceAnalysis(trace_files={files!r}, trace_dir={str(run)!r})\n"
                            "ta.get_temporal_breakdown(visualize=False)")
            red = timed(f"from pardiag.node_summaries import write_node_summaries\nfrom pardiag.rundir import RunDir\n"
                        f"from pathlib import Path\nerr = write_node_summaries(RunDir(Path({str(run)!r})), list(range({n})))\n"
                        f"assert not any(err.values()), err")
            central = timed(f"from pardiag.analyzers.pipeline import analyze_path\nfrom pathlib import Path\n"
                            f"a = analyze_path(Path({str(run)!r}))\nassert len(a.ranks) == {n}")
            rows.append((n, red, central, raw, hta))
            print(f"  {n} ranks done", flush=True)
            shutil.rmtree(run)
    print()
    print(f"{'ranks':>6} {'reduce s':>9} {'per node s':>10} {'reduce MB':>9} {'central s':>9} {'central MB':>10} "
          f"{'growth':>6} {'raw s':>7} {'raw MB':>7} {'HTA s':>7} {'HTA MB':>7}")
    g = growth([r[0] for r in rows], [r[2][0] for r in rows])
    for (n, red, central, raw, hta), gr in zip(rows, g):
        per_node = red[0] / max(1, n / RANKS_PER_NODE)
        print(f"{n:>6} {red[0]:>9.1f} {per_node:>10.2f} {red[1]:>9.0f} {central[0]:>9.2f} {central[1]:>10.0f} {gr:>6} "
              f"{(f'{raw[0]:.2f}' if raw else '-'):>7} {(f'{raw[1]:.0f}' if raw else '-'):>7} "
              f"{(f'{hta[0]:.2f}' if hta else '-'):>7} {(f'{hta[1]:.0f}' if hta else '-'):>7}")
    print("growth: factor of central-analysis time per doubling of ranks (1.0 = flat, 2.0 = linear)")
    big = rows[-1]
    n, red, central = big[0], big[1], big[2]
    per_node = red[0] / max(1, n / RANKS_PER_NODE)
    verdict = per_node + central[0]
    ok = central[0] < 60 and central[1] < 2048
    print(f"target at {n} ranks: central analysis under 60 s and 2 GB -> {central[0]:.1f} s, {central[1]:.0f} MB: "
          f"{'met' if ok else 'NOT met'}")
    print(f"time to the verdict at {n} ranks ({max(1, n // RANKS_PER_NODE)} nodes of {RANKS_PER_NODE} ranks reducing at "
          f"once, each as fast as this machine): one node's reduction {per_node:.1f} s + central analysis "
          f"{central[0]:.1f} s = {verdict:.1f} s; target under 60 s {'met' if verdict < 60 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
