"""How much does `pardiag run` slow a training job down?

Runs examples/train_ddp.py on 2 CPU ranks (torchrun, gloo) alternately
(a) plain and (b) under `pardiag run --no-report --profile-steps 10,2,5`, and
compares median step times:

  outside  steps of the pardiag run outside the profiler window, without the first
           few warm-up steps and the step right after the window closes (the trace
           is exported at that boundary); target <= 1.01 x plain
  active   steps inside the active (recorded) part of the window; target <= 1.10 x plain

Both runs pass the script's --step-log (one JSON line per optimizer step per
rank), so they pay the same for it. The window comes from the "profiler" field of
each rank's steps.jsonl. Step times come, by default, from the script's log in
both runs (--timer script): the same clock as the baseline, and it charges the
work pardiag does at step boundaries (opening the profiler, exporting the trace,
writing meta.json). --timer pardiag uses steps.jsonl's dur_us instead (which also
includes that work and reports it separately as pardiag_us); --json reports both.

Per run, the value is the median over ranks of each rank's median; per
configuration, the median over repetitions. Plain and pardiag runs alternate
(ABBA) to cancel drift on a busy machine.

    python benchmarks/overhead.py                 # 3 repetitions, 40 steps
    python benchmarks/overhead.py --reps 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
NPROC = 2
PROFILE_STEPS = (10, 2, 5)  # wait, warmup, active
SKIP_FIRST = 3  # warm-up steps left out of every median
TARGET_OUTSIDE = 1.01
TARGET_ACTIVE = 1.10
CONFIGS: dict[str, list[str]] = {
    "fp32": [],
    "bf16": ["--precision", "bf16"],
    "accum2": ["--accum-steps", "2"],
}
DEFAULT_CONFIGS = ("fp32", "bf16")


class BenchError(Exception):
    """A run that failed or left no usable step times; the message says which."""


# ---------------------------------------------------------------------------
# Pure helpers: reading step records and splitting them around the window


def parse_steps_jsonl(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Step records from JSON lines; blank, torn or foreign lines are skipped."""
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and not isinstance(rec["step"], bool):
            out.append(rec)
    return out


def _dur(rec: dict[str, Any]) -> float | None:
    d = rec.get("dur_us")
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def split_window(
    records: list[dict[str, Any]], skip_first: int = SKIP_FIRST, settle: int = 1
) -> tuple[list[float], list[float]]:
    """(outside, active) step durations in microseconds.

    The window is the set of steps whose record has ``profiler`` set ("warmup" or
    "active"). *active* holds the "active" steps. *outside* holds every other step
    except: steps numbered below ``skip_first``, the window itself, and the
    ``settle`` steps right after the window's last step. Steps without a duration
    (``dur_us`` null, e.g. step 0) are in neither list.
    """
    window = [r["step"] for r in records if r.get("profiler") in ("warmup", "active")]
    after = range(max(window) + 1, max(window) + 1 + settle) if window else range(0)
    outside: list[float] = []
    active: list[float] = []
    for r in records:
        d = _dur(r)
        if d is None:
            continue
        if r.get("profiler") == "active":
            active.append(d)
        elif r.get("profiler") is None and r["step"] >= skip_first and r["step"] not in after:
            outside.append(d)
    return outside, active


def with_durations_from(records: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`records` with dur_us replaced by the same step's dur_us in `other` (None if absent)."""
    by_step = {r["step"]: _dur(r) for r in other}
    return [{**r, "dur_us": by_step.get(r["step"])} for r in records]


def median_or_none(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _self_check() -> None:
    """The window split on a hand-made run: window 10..16 (2 warmup, 5 active), 20 steps."""
    recs = [{"step": 0, "dur_us": None}]
    for s in range(1, 20):
        rec: dict[str, Any] = {"step": s, "dur_us": float(s)}
        if 10 <= s <= 11:
            rec["profiler"] = "warmup"
        elif 12 <= s <= 16:
            rec["profiler"] = "active"
        recs.append(rec)
    outside, active = split_window(recs, skip_first=3, settle=1)
    assert outside == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 18.0, 19.0], outside
    assert active == [12.0, 13.0, 14.0, 15.0, 16.0], active
    no_window = [{"step": s, "dur_us": 1.0} for s in range(6)]
    assert split_window(no_window) == ([1.0, 1.0, 1.0], [])
    torn = parse_steps_jsonl(['{"step": 0, "dur_us": null}', "", '{"step": 1, "dur', '{"x": 1}'])
    assert torn == [{"step": 0, "dur_us": None}]
    merged = with_durations_from([{"step": 1, "dur_us": 5.0, "profiler": "active"}], [{"step": 1, "dur_us": 7.0}])
    assert merged == [{"step": 1, "dur_us": 7.0, "profiler": "active"}]


# ---------------------------------------------------------------------------
# Running


TIMERS = ("script", "pardiag")


@dataclass
class RepResult:
    plain_ms: float | None = None
    # timer -> (outside, active) median step times of the pardiag run, in ms
    pardiag_ms: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)


@dataclass
class ConfigResult:
    name: str
    reps: list[RepResult] = field(default_factory=list)

    def summary(self, timer: str) -> dict[str, Any]:
        plain = median_or_none(r.plain_ms for r in self.reps)
        out: dict[str, Any] = {"config": self.name, "plain_ms": plain}
        for t in TIMERS:
            outside = median_or_none(r.pardiag_ms[t][0] for r in self.reps if t in r.pardiag_ms)
            active = median_or_none(r.pardiag_ms[t][1] for r in self.reps if t in r.pardiag_ms)
            sub = {
                "outside_ms": outside,
                "active_ms": active,
                "outside_ratio": outside / plain if plain and outside else None,
                "active_ratio": active / plain if plain and active else None,
            }
            out[f"timer_{t}"] = sub
            if t == timer:
                out.update(sub)
        out["reps"] = [
            {"plain_ms": r.plain_ms, **{f"{t}_timer": list(v) for t, v in r.pardiag_ms.items()}}
            for r in self.reps
        ]
        return out


def torchrun() -> list[str]:
    exe = Path(sys.executable).parent / "torchrun"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("torchrun")
    if found:
        return [found]
    raise BenchError("torchrun not found next to this Python or on PATH")


def run_logged(cmd: list[str], log: Path, timeout: float, what: str) -> None:
    """Run `cmd` in the repository root with output to `log`; BenchError if it fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise BenchError(f"{what}: cannot start {cmd[0]}: {e.strerror}") from None
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise BenchError(f"{what}: still running after {timeout:.0f} s, killed; its output ends:\n"
                             + output_excerpt(log)) from None
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        raise BenchError(f"{what}: exited with {rc}; its output ends:\n" + output_excerpt(log))


def output_excerpt(log: Path, tail: int = 6) -> str:
    """The last exception lines of a run's output (torchrun buries them), then its last lines."""
    lines = log.read_text(errors="replace").rstrip().splitlines()
    errors = [ln for ln in lines if re.search(r"\b\w*(Error|Exception)\b:", ln)][-3:]
    picked = errors + (["  ..."] if errors else []) + lines[-tail:]
    return "\n".join("  " + ln for ln in picked)


def read_rank_logs(prefix: Path, what: str) -> list[list[dict[str, Any]]]:
    per_rank = []
    for r in range(NPROC):
        path = Path(f"{prefix}.rank{r}")
        if not path.is_file():
            raise BenchError(f"{what}: rank {r} wrote no step log ({path})")
        per_rank.append(parse_steps_jsonl(path.read_text(errors="replace").splitlines()))
    return per_rank


def plain_run(work: Path, name: str, rep: int, script_args: list[str], timeout: float) -> float:
    what, stem = f"plain run ({name}, rep {rep + 1})", work / f"plain.{name}.{rep}"
    log = Path(f"{stem}.steps")
    run_logged([*torchrun(), "--standalone", "--nproc-per-node", str(NPROC), str(EXAMPLE),
                *script_args, "--step-log", str(log)], Path(f"{stem}.out"), timeout, what)
    per_rank = [[d for r in recs if r["step"] >= SKIP_FIRST and (d := _dur(r)) is not None]
                for recs in read_rank_logs(log, what)]
    if not all(per_rank):
        raise BenchError(f"{what}: too few steps recorded (use more --steps)")
    return statistics.median(statistics.median(v) for v in per_rank) / 1e3


def pardiag_run(work: Path, name: str, rep: int, script_args: list[str],
                timeout: float) -> dict[str, tuple[float | None, float | None]]:
    what, stem = f"pardiag run ({name}, rep {rep + 1})", work / f"pardiag.{name}.{rep}"
    out, log = Path(f"{stem}.run"), Path(f"{stem}.steps")
    run_logged([sys.executable, "-m", "pardiag", "run", "--out", str(out), "--no-report",
                "--profile-steps", ",".join(map(str, PROFILE_STEPS)), "--",
                *torchrun(), "--standalone", "--nproc-per-node", str(NPROC), str(EXAMPLE),
                *script_args, "--step-log", str(log)], Path(f"{stem}.out"), timeout, what)
    script_logs = read_rank_logs(log, what)
    per_timer: dict[str, tuple[list[float | None], list[float | None]]] = {t: ([], []) for t in TIMERS}
    for r in range(NPROC):
        path = out / "ranks" / str(r) / "steps.jsonl"
        if not path.is_file():
            raise BenchError(f"{what}: rank {r} wrote no {path.relative_to(work)}")
        recs = parse_steps_jsonl(path.read_text(errors="replace").splitlines())
        if not any(rec.get("profiler") == "active" for rec in recs):
            print(f"overhead: warning: {what}: rank {r} recorded no profiled steps", file=sys.stderr)
        for t, rank_recs in (("pardiag", recs), ("script", with_durations_from(recs, script_logs[r]))):
            o, a = split_window(rank_recs)
            per_timer[t][0].append(median_or_none(o))
            per_timer[t][1].append(median_or_none(a))
    result = {}
    for t, (outside, active) in per_timer.items():
        o_ms, a_ms = median_or_none(outside), median_or_none(active)
        if o_ms is None:
            raise BenchError(f"{what}: no steps outside the profiler window (use more --steps)")
        result[t] = (o_ms / 1e3, a_ms / 1e3 if a_ms is not None else None)
    return result


def benchmark(args: argparse.Namespace, work: Path) -> list[ConfigResult]:
    results = [ConfigResult(name) for name in args.config]
    for rep in range(args.reps):
        for res in results:
            script_args = ["--steps", str(args.steps), "--log-every", "1000000", *CONFIGS[res.name]]
            rr = RepResult()
            order = ("plain", "pardiag") if rep % 2 == 0 else ("pardiag", "plain")
            for kind in order:
                if kind == "pardiag" and args.plain_only:
                    continue
                if not args.json:
                    print(f"  rep {rep + 1}/{args.reps} {res.name:<7} {kind} ...", file=sys.stderr, flush=True)
                if kind == "plain":
                    rr.plain_ms = plain_run(work, res.name, rep, script_args, args.timeout)
                else:
                    rr.pardiag_ms = pardiag_run(work, res.name, rep, script_args, args.timeout)
            res.reps.append(rr)
    return results


def fmt(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None else "-"


def print_table(summaries: list[dict[str, Any]], timer: str) -> None:
    head = ("config", "plain ms", "outside ms", "ratio", "active ms", "ratio")
    rows = [head]
    for s in summaries:
        def ratio(x: float | None, target: float) -> str:
            return "-" if x is None else f"{x:.3f}" + ("" if x <= target else " !")
        rows.append((s["config"], fmt(s["plain_ms"], ".1f"), fmt(s["outside_ms"], ".1f"),
                     ratio(s["outside_ratio"], TARGET_OUTSIDE), fmt(s["active_ms"], ".1f"),
                     ratio(s["active_ratio"], TARGET_ACTIVE)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"median step times ({timer} timer); targets: outside <= {TARGET_OUTSIDE}, "
          f"active <= {TARGET_ACTIVE} x plain ('!' = over)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows real defaults only (not None, not False of a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each plain/pardiag pair")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--config", action="append", choices=sorted(CONFIGS),
                   help=f"configuration to measure, repeatable (default: {', '.join(DEFAULT_CONFIGS)})")
    p.add_argument("--timer", choices=["pardiag", "script"], default="script",
                   help="step times of the pardiag run for the table: the script's log or steps.jsonl")
    p.add_argument("--plain-only", action="store_true", help="run only the plain baseline")
    p.add_argument("--timeout", type=float, default=300, help="seconds before a run is killed")
    p.add_argument("--keep", action="store_true", help="keep the run folders and print where")
    p.add_argument("--json", action="store_true", help="print machine-readable results only")
    args = p.parse_args(argv)
    args.config = args.config or list(DEFAULT_CONFIGS)
    wait, warmup, active = PROFILE_STEPS
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if not args.plain_only and args.steps < wait + warmup + active + 6:
        p.error(f"--steps must be at least {wait + warmup + active + 6} to leave steps after the window")
    _self_check()

    work = Path(tempfile.mkdtemp(prefix="pardiag-overhead-"))
    try:
        results = benchmark(args, work)
    except BenchError as e:
        print(f"overhead: {e}", file=sys.stderr)
        if args.keep:
            print(f"overhead: run folders kept in {work}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("overhead: interrupted", file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    summaries = [r.summary(args.timer) for r in results]
    if args.json:
        print(json.dumps({"steps": args.steps, "reps": args.reps, "nproc": NPROC,
                          "profile_steps": list(PROFILE_STEPS), "timer": args.timer,
                          "targets": {"outside": TARGET_OUTSIDE, "active": TARGET_ACTIVE},
                          "results": summaries}, indent=2))
    else:
        print_table(summaries, args.timer)
        if args.keep:
            print(f"run folders: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
