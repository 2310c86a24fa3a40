"""How much does the profiler slow the steps it records, per collection setting?

Runs the bundled example (examples/train_ddp.py, what `pardiag demo` runs: 2 CPU
ranks, torchrun, gloo, one epoch) under `pardiag run` with each setting, alternating
settings within each repetition, and reports the analysis' own figure,
summary.profiled_step_inflation: per rank, the median step inside the profiler's active
window (steps.jsonl) over its median undisturbed step outside it; for the job, the
median over ranks. That figure compares with the median over every step, so a machine
whose load changes during the job moves it (a run recorded while another job finished
halfway read 2.29x); "adjacent" compares with the counted steps just before and after
the window instead. Per setting: the median over repetitions and the range (min-max).
Also the host time per profiled step by phase (the trace's forward, backward, optimizer,
host work), to show which work the profiler inflates.

    python benchmarks/inflation.py                     # every setting, 3 repetitions
    python benchmarks/inflation.py --reps 5 --settings default,no_shapes

Progress goes to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif_accuracy import free_port, log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
NPROC = 2
TARGET = 1.10  # the goal for the default settings
ADJACENT = 4  # counted steps on either side of the window for the local baseline

# setting -> the `pardiag run` options it adds
SETTINGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "no_shapes": ("--no-shapes",),
    "active_10": ("--profile-steps", "5,2,10"),
    "warmup_1": ("--profile-steps", "5,1,3"),
    "profile_memory": ("--profile-memory",),  # the allocations too: activations on a CPU
    "no_profile": ("--no-profile",),  # no window: the ratio is of the same steps' noise (1.0 expected)
}


def record(out: Path, options: tuple[str, ...]) -> None:
    cmd = [sys.executable, "-m", "pardiag", "run", "-q", "--no-report", "--out", str(out), *options, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLE), "--epochs", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"error: {' '.join(options) or 'default'}: exit {res.returncode}: "
                         f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")


def adjacent(out: Path, rank: int) -> float | None:
    """A rank's median active step over the median of the counted steps at most ADJACENT
    steps before the window opens or after it closes: the profiler's cost with less of
    the drift of a machine whose load changes during the job (the analysis' figure
    compares with the median over every step)."""
    from pardiag.analyzers.steps import median
    from pardiag.rundir import RunDir, read_steps
    from pardiag.step_records import counted

    recs = read_steps(RunDir(out), rank)
    window = [r.step for r in recs if r.profiler is not None]
    active = [r.dur_us for r in recs if r.profiler == "active" and r.dur_us]
    if not window or not active:
        return None
    lo, hi = min(window), max(window)
    near = [r.dur_us for r in recs
            if counted(r) and r.dur_us and (lo - ADJACENT <= r.step < lo or hi < r.step <= hi + ADJACENT)]
    m, base = median(active), median(near)
    return m / base if m and base else None


def measure(out: Path) -> tuple[float | None, dict[str, float], dict[str, float], list[float]]:
    """(job inflation, per rank, host time per profiled step by phase (mean over ranks,
    ms), per rank the ratio to the adjacent steps)."""
    from pardiag.analyzers.pipeline import analyze_path

    a = analyze_path(out)
    infl = a.job_summary.profiled_step_inflation
    phases: dict[str, float] = {}
    ranks = [r for r in a.ranks if r.steps_profiled]
    for r in ranks:
        for k, v in r.phases_us.items():
            phases[k] = phases.get(k, 0.0) + v / r.steps_profiled / len(ranks) / 1000
    near = [x for r in a.ranks if (x := adjacent(out, r.rank)) is not None]
    return infl.job, dict(infl.by_rank), phases, near


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}")
    p.add_argument("--reps", type=int, default=3, help="recordings per setting (default 3)")
    p.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR")
    a = p.parse_args(argv)
    names = [s.strip() for s in a.settings.split(",") if s.strip()]
    if not names or any(s not in SETTINGS for s in names) or a.reps < 1:
        print(f"error: --settings of {', '.join(SETTINGS)}; --reps >= 1", file=sys.stderr)
        return 2
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="inflation-"))
    work.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, list[float]] = {s: [] for s in names}
    ranks: dict[str, list[float]] = {s: [] for s in names}
    phases: dict[str, list[dict[str, float]]] = {s: [] for s in names}
    near: dict[str, list[float]] = {s: [] for s in names}
    try:
        for i in range(a.reps):
            for s in names:  # settings alternate: a slow spell of the machine hits them all
                out = work / f"{s}-{i + 1}"
                record(out, SETTINGS[s])
                job, by_rank, ph, adj = measure(out)
                log(f"[{s} {i + 1}/{a.reps}] job {job if job is None else round(job, 3)}, ranks "
                    f"{ {k: round(v, 3) for k, v in by_rank.items()} }, adjacent {[round(x, 3) for x in adj]}")
                if adj:
                    near[s].append(statistics.median(adj))
                if job is not None:
                    jobs[s].append(job)
                ranks[s] += list(by_rank.values())
                if ph:
                    phases[s].append(ph)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    keys = ("forward", "backward", "optimizer", "dataloader", "other", "host")
    head = (["setting", "runs", "job x (median)", "job x (range)", "rank x (range)", "adjacent x (median)",
             "adjacent x (range)"] + [f"{k} ms" for k in keys])
    rows = [head]
    for s in names:
        j, r = jobs[s], ranks[s]
        ph = {k: statistics.median([d.get(k, 0.0) for d in phases[s]]) for k in keys} if phases[s] else {}
        rows.append([s, str(len(j)), f"{statistics.median(j):.3f}" if j else "-",
                     f"{min(j):.3f}-{max(j):.3f}" if j else "-", f"{min(r):.3f}-{max(r):.3f}" if r else "-",
                     f"{statistics.median(near[s]):.3f}" if near[s] else "-",
                     f"{min(near[s]):.3f}-{max(near[s]):.3f}" if near[s] else "-"]
                    + [f"{ph[k]:.1f}" if ph else "-" for k in keys])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    print("\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                    for row in rows))
    print(f"(target for the default settings: job x <= {TARGET:.2f}; job x: the analysis' "
          "profiled_step_inflation, against the median of every step; adjacent x: against the counted steps "
          f"at most {ADJACENT} before or after the window, median over ranks; phases: host time per profiled "
          "step, mean over ranks, median over runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
