"""How well does the replay of the profiled window reproduce the measured step?

For each run (a run directory, a folder of traces or one trace), replays the window
with the measured durations and prints the job's measured and replayed step (the
slowest rank's mean), the error (the worst rank's: each rank's mean replayed step
against its measured one), and the critical path of the median step (which rank, which phase, which
collective). Targets: median error <= 3%, each run <= 8%; replay-based
estimates are refused for a run above 8%.

    python benchmarks/replay_error.py RUN [RUN...]
    python benchmarks/replay_error.py RUN --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from pardiag.analyzers.replay import MAX_ERROR, TARGET_MEDIAN_ERROR, load_run, replay
from pardiag.analyzers.trace import TraceError
from pardiag.errors import UserError
from pardiag.rundir import RunDirError


def measure(path: str) -> dict[str, Any]:
    model = load_run(path)
    r = replay(model)
    cp = r.median_path()
    return {
        "run": path,
        "ranks": sorted(model.origin),
        "steps": max((len(s) for s in r.measured_steps.values()), default=0),
        "measured_ms": r.measured_step_us / 1e3,
        "replayed_ms": r.replayed_step_us / 1e3,
        "error": r.error,
        "refused": r.refusal(),
        "critical_path": None if cp is None else {
            "step": cp.step, "rank": cp.top_rank, "phase": cp.top_phase, "collective": cp.top_collective,
            "by_phase_ms": {k: v / 1e3 for k, v in sorted(cp.by_phase_us.items(), key=lambda kv: -kv[1])}},
        "notices": model.notices,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories, trace folders or trace files")
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    a = p.parse_args(argv)
    rows = []
    for run in a.runs:
        try:
            rows.append(measure(run))
        except (UserError, RunDirError, TraceError) as exc:
            print(str(exc), file=sys.stderr)
            return 2
    if a.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    width = max(len(Path(r["run"]).name) for r in rows)
    print(f"{'run':{width}}  {'measured':>10}  {'replayed':>10}  {'error':>6}  critical path of the median step")
    for r in rows:
        cp = r["critical_path"]
        path = "-" if cp is None else (f"step {cp['step']}: rank {cp['rank']}, {cp['phase']}"
                                       + (f", {cp['collective']}" if cp["collective"] else ""))
        print(f"{Path(r['run']).name:{width}}  {r['measured_ms']:8.2f}ms  {r['replayed_ms']:8.2f}ms  "
              f"{r['error']:6.1%}  {path}")
        if r["refused"]:
            print(f"{'':{width}}  estimates refused: {r['refused']}")
    errors = [r["error"] for r in rows]
    med = statistics.median(errors)
    print(f"median error {med:.1%} (target <= {TARGET_MEDIAN_ERROR:.0%}), worst {max(errors):.1%} "
          f"(bound {MAX_ERROR:.0%} per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
