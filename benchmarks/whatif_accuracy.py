"""How close are pardiag's estimated savings to what the advised change really saves?

For every planted-problem scenario in examples/scenarios: record the job under
`pardiag run` (2 ranks, torchrun, gloo on the CPU) with its problem, then again with
`--fix` (the change its finding advises, the scenario's FIX), analyse the first and
compare, per lever:

  estimated  the scenario's finding's est_saving_pct, and what_if's figure for all
             findings together (what_if.all_saving_pct)
  measured   1 - fixed / problem, each the median of the job's step times over ALL
             counted steps of steps.jsonl (`job_step_times_us`: per step the slowest
             rank; warm-up, profiler window and disturbed steps left out), per
             micro-batch (a fix that accumulates k micro-batches per step is divided by k)
  found      in how many problem runs the scenario's finding was made: the estimate and
             the measured saving it is compared with are medians over those pairs (a
             run without the finding has no estimate to be wrong)
  error      estimated - measured, in percentage points
  method     how the estimate was made (replay, or share when the replay was refused),
             with the share-based figure beside it ("share est")
  replay err the replay's error against the measured window, the worst of the runs
  window err the edited replay's step (the fixed window as the problem run projects it)
             less the fixed run's own profiled window step, per micro-batch, in points of
             the problem's window step: the model's error apart from the profiler slowing
             the two runs differently

and the run-to-run noise (with --repeat 2 or more): "noise", the same job recorded
twice, the problem runs against each other and the fixed runs against each other (the
largest difference of two medians, in points of the problem's step: the unit of the
error); "spread", the range of the measured saving over the repetitions (points). The healthy control has nothing to fix:
its pair is the same job twice, so its "measured" is noise too. Problem and fixed runs
alternate, and only one job runs at a time; a job during which other processes kept more
than a quarter of a core busy (from /proc/stat, less the job's own CPU time) is recorded
again (--retries) and the least disturbed recording is kept. A multiply is timed before,
between and after each pair's two jobs: how far the host's own speed moved over the pair
(with --steady PCT, a pair over which it moved more than PCT% is recorded again and the
steadiest attempt kept). Under the table, the host's
own noise (benchmarks/host_probe.py, at the start and the end of the recordings): whether
one CPU's torch work slows another's, and how far the host's speed drifted.

    python benchmarks/whatif_accuracy.py                        # every scenario, once
    python benchmarks/whatif_accuracy.py --repeat 2             # with the noise
    python benchmarks/whatif_accuracy.py --scenarios slow_rank,slow_input --json out.json
    python benchmarks/whatif_accuracy.py --repeat 2 --keep runs/ && \
        python benchmarks/whatif_accuracy.py --repeat 2 --reuse runs/   # the same runs, analysed again
    python benchmarks/whatif_accuracy.py --pool O.json P.json   # several invocations' pairs together

Progress goes to stderr; the table (or with --json - , the JSON) to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import host_probe  # benchmarks/host_probe.py, beside this file
from pardiag.analyzers.estimates import STRAGGLER_LEVERS
from pardiag.analyzers.levers import GRADIENT_ACCUMULATION_STEPS
from pardiag.analyzers.steps import job_step_times_us
from pardiag.rundir import RunDir, read_steps

ROOT = Path(__file__).resolve().parents[1]
SCENARIO_DIR = ROOT / "examples" / "scenarios"
NPROC = 2
STEPS = 30
CONTENDED = 0.25  # cores used by other processes during a job above which it is recorded again
TARGET_PP = 5.0  # |estimated - measured| targeted, per scenario
MEDIAN_TARGET_PP = 3.0  # the median over the scenarios of their |error|

# scenario -> (the lever its finding must carry, extra `pardiag run` arguments)
SCENARIOS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "slow_rank": ("straggler", ()),
    "slow_input": ("dataloader", ()),
    "tiny_buckets": ("ddp_bucket_size", ()),
    "fp32_matmul": ("mixed_precision", ()),
    "comm_bound": ("gradient_accumulation", ()),
    "too_large": ("sharding", ("--memory-per-rank", "400MiB")),
    "cpu_contention": ("host_contention", ()),
    "gc_pauses": ("garbage_collection", ()),
    "long_inputs": ("input_imbalance", ()),
    "page_faults": ("straggler", ()),
    "healthy": (None, ()),
}


# lever -> {(the call its action's settings name, keyword): the scenario harness's parameter}:
# a fixed run applies the values the problem run's finding advised (harness --set)
ADVISED: dict[str, dict[tuple[str, str], str]] = {
    "dataloader": {("torch.utils.data.DataLoader", "num_workers"): "workers",
                   ("torch.utils.data.DataLoader", "persistent_workers"): "persistent_workers"},
    "ddp_bucket_size": {("torch.nn.parallel.DistributedDataParallel", "bucket_cap_mb"): "bucket_cap_mb"},
}


# lever -> the harness parameters its change sets beyond what the finding's settings name
# (a straggler's cause is the scenario's own: only its FIX removes it)
CHANGE: dict[str, dict[str, Any]] = {
    "gradient_accumulation": {"accum": GRADIENT_ACCUMULATION_STEPS},
    "mixed_precision": {"autocast": True},
}


def all_changes(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The harness parameters that apply every change the problem run's what-if replayed
    together (its findings with a replay estimate), laid over the scenario's FIX by
    ``--fix``; None when one of them has no harness form (the what-if cannot be checked)."""
    out: dict[str, Any] = {}
    for f in doc.get("findings") or []:
        if (f.get("estimate") or {}).get("method") != "replay":
            continue  # left out of what_if.all_saving_pct too
        lever = f.get("lever", "")
        if lever in STRAGGLER_LEVERS:
            continue  # the scenario's planted cause: its FIX
        values = {**advised_values(lever, f), **CHANGE.get(lever, {})}
        if not values:
            return None
        out.update(values)
    return out


def advised_values(lever: str, finding: dict[str, Any]) -> dict[str, Any]:
    """The harness parameters a finding's action sets, e.g. {"workers": 15}."""
    wanted = ADVISED.get(lever, {})
    out: dict[str, Any] = {}
    for setting in (finding.get("action") or {}).get("settings") or []:
        if not isinstance(setting, dict):
            continue
        for key, value in (setting.get("kwargs") or {}).items():
            param = wanted.get((str(setting.get("call")), key))
            if param:
                out[param] = value
    return out


class BenchError(Exception):
    """A job that failed or left no usable step times; the message says which."""


@dataclass
class Run:
    """One recorded job: its run directory and the median job step time per micro-batch."""
    path: str
    fixed: bool
    step_us: float  # median job step time over all counted steps
    steps_counted: int
    per_micro_us: float  # step_us / micro-batches per step
    wall_s: float
    others_cores: float | None = None  # CPU used meanwhile by processes outside the job, in cores


@dataclass
class Result:
    scenario: str
    lever: str | None
    problem: list[Run] = field(default_factory=list)
    fixed: list[Run] = field(default_factory=list)
    estimated_pct: list[float | None] = field(default_factory=list)  # per problem run: the lever's est_saving_pct
    method: list[str | None] = field(default_factory=list)  # per problem run: how it was estimated (replay, share)
    share_pct: list[float | None] = field(default_factory=list)  # per problem run: the share-based estimate
    replay_error_pct: list[float | None] = field(default_factory=list)  # per run (problem and fixed): the replay's error
    projected_window_us: list[float | None] = field(default_factory=list)  # per problem run: the edited replay's step, per micro-batch
    window_us: list[float | None] = field(default_factory=list)  # per problem run: its replayed window step
    fixed_window_us: list[float | None] = field(default_factory=list)  # per fixed run: its window's replayed step, per micro-batch
    what_if_all_pct: list[float | None] = field(default_factory=list)  # per problem run
    top_lever: list[str | None] = field(default_factory=list)  # per problem run: the first finding's lever
    still_reported: list[bool | None] = field(default_factory=list)  # per fixed run: the lever found again
    advice: str | None = None  # the finding's action, as the first problem run gave it
    applied: list[dict[str, Any]] = field(default_factory=list)  # per pair: the advised values the fix used
    combined: list[Run | None] = field(default_factory=list)  # per pair (--combined): every change applied at once
    host_drift: list[float | None] = field(default_factory=list)  # per pair: how far the host's speed moved over it

    def measured_pct(self) -> list[float]:
        """Measured saving per repetition (problem run i against fixed run i)."""
        return [100 * (1 - f.per_micro_us / p.per_micro_us) for p, f in zip(self.problem, self.fixed)]

    def noise_pp(self) -> float | None:
        """The largest difference between two recordings of the same job (problem runs
        against each other, fixed runs against each other), in points of the first
        problem run's step: what it moves the measured saving by."""
        if len(self.problem) < 2 and len(self.fixed) < 2:
            return None
        base = self.problem[0].per_micro_us
        out = [abs(a.per_micro_us - b.per_micro_us) / base * 100
               for runs in (self.problem, self.fixed) for a in runs for b in runs]
        return max(out)

    def spread_pp(self) -> float | None:
        """The range of the measured saving over the repetitions, in points."""
        m = self.measured_pct()
        return max(m) - min(m) if len(m) > 1 else None

    def measured_where(self, estimates: list[float | None]) -> float | None:
        """The median measured saving of the pairs whose problem run gave an estimate: an
        estimate is compared with the fix applied after the run it came from. A pair
        whose problem run got no finding has no estimate to be wrong; its measured saving
        (often a problem recording that did not show the problem: tiny_buckets' fixed job
        ran 26% slower than such a one) counts in the noise and in how often the problem
        was found, not in the error."""
        m = [x for x, e in zip(self.measured_pct(), estimates) if e is not None]
        return statistics.median(m) if m else None

    def combined_pct(self) -> list[float | None]:
        """Per pair (--combined): the saving measured with every change the what-if
        replayed applied at once, per micro-batch."""
        return [None if c is None else 100 * (1 - c.per_micro_us / p.per_micro_us)
                for p, c in zip(self.problem, self.combined)]

    def combined_summary(self) -> dict[str, Any]:
        if not self.combined:
            return {}
        m = self.combined_pct()
        pairs = [(w, x) for w, x in zip(self.what_if_all_pct, m) if w is not None and x is not None]
        return {"combined_each_pct": [None if x is None else round(x, 1) for x in m],
                "combined_pct": _median([x for _, x in pairs]),
                "combined_error_pp": (_round(statistics.median(w for w, _ in pairs) - statistics.median(x for _, x in pairs))
                                      if pairs else None)}

    def summary(self) -> dict[str, Any]:
        measured = statistics.median(self.measured_pct()) if self.fixed else None
        est = _median([e for e in self.estimated_pct if e is not None])
        wi = _median([w for w in self.what_if_all_pct if w is not None])
        if self.lever is None:  # the control: nothing should be estimated, nothing changes
            est = wi if wi is not None else 0.0
            vs_est = vs_wi = measured
        else:
            vs_est, vs_wi = self.measured_where(self.estimated_pct), self.measured_where(self.what_if_all_pct)
        return {
            "scenario": self.scenario, "lever": self.lever,
            "estimated_pct": est, "what_if_all_pct": wi,
            "measured_pct": _round(measured),
            "measured_estimated_pct": _round(vs_est),  # over the pairs with an estimate
            "found": sum(e is not None for e in self.estimated_pct) if self.lever else None,
            "pairs": len(self.measured_pct()),
            "error_pp": _round(est - vs_est) if est is not None and vs_est is not None else None,
            "what_if_error_pp": _round(wi - vs_wi) if wi is not None and vs_wi is not None else None,
            **self.combined_summary(),
            "noise_pp": _round(self.noise_pp()), "spread_pp": _round(self.spread_pp()),
            "measured_each_pct": [round(m, 1) for m in self.measured_pct()],
            "estimated_each_pct": self.estimated_pct,
            "method": self.method, "share_each_pct": self.share_pct,
            "share_pct": _median([e for e in self.share_pct if e is not None]),
            "share_error_pp": (_round(_median([e for e in self.share_pct if e is not None])  # type: ignore[operator]
                                      - self.measured_where(self.share_pct))
                               if self.fixed and any(e is not None for e in self.share_pct) else None),
            "replay_error_pct": self.replay_error_pct,
            # the replay's projection of the fixed window against the fixed run's own window
            # (both profiled): the model's error without the profiler's different inflation of
            # the two runs
            "window_error_pp": _median([100 * (p - f) / w for p, f, w in
                                        zip(self.projected_window_us, self.fixed_window_us, self.window_us)
                                        if p and f and w]),
            "top_lever": self.top_lever, "still_reported_after_fix": self.still_reported,
            "advice": self.advice, "applied": self.applied,
            "problem_step_ms": [round(r.per_micro_us / 1000, 2) for r in self.problem],
            "fixed_step_ms": [round(r.per_micro_us / 1000, 2) for r in self.fixed],
            "others_cores": [None if r.others_cores is None else round(r.others_cores, 2)
                             for r in self.problem + self.fixed],
            "host_drift_pct": [None if d is None else round(100 * d, 1) for d in self.host_drift],
        }


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def micro_batches(scenario: str, fixed: bool) -> int:
    """Micro-batches per optimizer step: the scenario's `accum`, as its FIX sets it."""
    mod = importlib.import_module(f"pardiag.examples.scenarios.{scenario}")
    return int(getattr(mod, "FIX", {}).get("accum", 1)) if fixed else 1


def median_step_us(path: Path) -> tuple[float, int]:
    """The median job step time over every counted step of the run, and how many counted."""
    run = RunDir(path)
    job = job_step_times_us({r: read_steps(run, r) for r in run.ranks()})
    if not job.values_us:
        raise BenchError(f"{path}: no counted steps in steps.jsonl")
    return statistics.median(job.values_us), len(job.values_us)


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def record(scenario: str, fixed: bool, out: Path, steps: int, retries: int = 0,
           values: dict[str, Any] | None = None, k: int | None = None) -> Run:
    """Record one job; when other processes used more than CONTENDED cores on average
    while it ran, record it again (up to `retries` times) and keep the least disturbed."""
    best: Run | None = None
    for attempt in range(retries + 1):
        target = out if attempt == 0 else out.with_name(f"{out.name}-again{attempt}")
        run = _record(scenario, fixed, target, steps, values or {}, k)
        if best is None or (run.others_cores or 0.0) < (best.others_cores or 0.0):
            best = run
        if run.others_cores is None or run.others_cores <= CONTENDED:
            break
        if attempt < retries:
            log(f"[{scenario}]   other processes used {run.others_cores:.2f} cores meanwhile: recording it again")
    assert best is not None
    return best


def _record(scenario: str, fixed: bool, out: Path, steps: int, values: dict[str, Any], k: int | None = None) -> Run:
    lever_args = SCENARIOS[scenario][1]
    cmd = [sys.executable, "-m", "pardiag", "run", "-q", "--no-report", "--out", str(out), *lever_args, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCENARIO_DIR / f"{scenario}.py"), "--steps", str(steps), *(["--fix"] if fixed else []),
           *[f"--set={k}={json.dumps(v)}" for k, v in values.items()]]
    env = dict(os.environ)
    env.pop("PARDIAG_RUN_DIR", None)
    busy0, mine0, t0 = busy_cpu_s(), children_cpu_s(), time.monotonic()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    busy1, mine1, wall = busy_cpu_s(), children_cpu_s(), time.monotonic() - t0
    others = (max(0.0, (busy1 - busy0) - (mine1 - mine0)) / wall
              if busy0 is not None and busy1 is not None and wall > 0 else None)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BenchError(f"{scenario}{' --fix' if fixed else ''}: exit {res.returncode}: {tail[0]}")
    step_us, n = median_step_us(out)
    k = k or micro_batches(scenario, fixed)
    # what --reuse needs to keep the same recording of a job recorded again
    (out / KEPT_FILE).write_text(json.dumps({"others_cores": others, "wall_s": wall}) + "\n")
    return Run(str(out), fixed, step_us, n, step_us / k, wall, others)


KEPT_FILE = "whatif_accuracy.json"  # in each run directory the benchmark records: the other processes' load


def kept(path: Path) -> Path:
    """The recording of a job that `record` kept (--reuse): of the run directory and its
    "-againN" re-recordings, the one other processes disturbed least (KEPT_FILE); where
    that was not written, the last re-recording (the ones before it were disturbed)."""
    tries = [path] + sorted(path.parent.glob(f"{path.name}-again*"), key=lambda p: int(p.name.rsplit("again", 1)[1] or 0))
    load: dict[Path, float] = {}
    for t in tries:
        try:
            v = json.loads((t / KEPT_FILE).read_text()).get("others_cores")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(v, (int, float)):
            load[t] = float(v)
    if len(load) == len(tries):
        return min(tries, key=lambda t: load[t])
    return tries[-1]


def analyze(path: Path) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "pardiag", "analyze", str(path), "--json", "--force"],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise BenchError(f"pardiag analyze {path}: exit {res.returncode}: {res.stderr.strip()[-300:]}")
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _advice(finding: dict[str, Any]) -> str:
    action = finding.get("action") or {}
    code = action.get("torch_code") or action.get("code") or action.get("text") or ""
    return str(code).splitlines()[0] if code else ""


def window_step_us(path: Path) -> float | None:
    """The replayed median step of a run's profiled window (as the estimates take it)."""
    import statistics

    from pardiag.analyzers.estimates import job_steps
    from pardiag.analyzers.replay import load_run, replay

    try:
        return statistics.median(job_steps(replay(load_run(str(path)))).values())
    except Exception:  # a run the replay cannot read: no window figure
        return None


def recorded(path: Path, scenario: str, fixed: bool, k: int | None = None) -> Run:
    """A run recorded earlier (--reuse): its step times as `_record` measures them, of the
    recording `record` kept (`kept`)."""
    path = kept(path)
    if not (path / "manifest.json").exists():
        raise BenchError(f"{path}: not a run directory (record it first with --keep)")
    step_us, n = median_step_us(path)
    return Run(str(path), fixed, step_us, n, step_us / (k or micro_batches(scenario, fixed)), 0.0, None)


HOST_DRIFT = 0.05
"""With --steady, the most the host's speed may move over a pair (``host_probe.speed_us``
before, between and after its two jobs: the largest of the three over the smallest,
less 1) before the pair is recorded again (--retries; the steadiest attempt is kept): a
fixed job run on a host 5% slower moves the measured saving by up to 5 points, the
target. Not the default: on 2026-12-06 a 256x256 multiply took 351 us at one
invocation's start, 388 at its end and 575 three minutes later (three probes taken back
to back at rest read 412-418), but in the next invocation (22 pairs, --steady 5) the
probes around a pair moved 25-94% where its jobs' steps did not (slow_rank's problem jobs
47.3 and 48.6 ms, fixed 8.0 and 8.0, over probes of 546, 394, 416 us), 12 pairs moved
more than 5% in all three attempts, and the invocation took twice as long: a probe of
half a second samples a speed that moves within seconds, which a job of 20 s averages."""

PAIRS_FILE = "whatif_pairs.json"  # in --keep DIR: per pair, the attempt kept and the host's speed around it


def pair_names(scenario: str, i: int, attempt: int = 0) -> tuple[str, str]:
    """The run directories of pair ``i``'s problem and fixed jobs: the first attempt's
    `scenario-i` and `scenario-fix-i`, an attempt recorded again (the host's speed moved)
    `...-hostN`."""
    tail = f"-host{attempt}" if attempt else ""
    return f"{scenario}-{i}{tail}", f"{scenario}-fix-{i}{tail}"


def host_drift(speeds: list[float | None]) -> float | None:
    """How far the host's speed moved over the probes (the slowest over the quickest, less
    1); None with fewer than two."""
    got = [x for x in speeds if x is not None and x > 0]
    return max(got) / min(got) - 1 if len(got) >= 2 else None


def drift_words(rows: list[dict[str, Any]], steady: float | None = None) -> str | None:
    """One line under the table: how far the host's speed moved over the pairs kept (and,
    with ``steady``, how many stayed past it after every attempt)."""
    drifts = [d for r in rows for d in r.get("host_drift_pct") or [] if d is not None]
    if not drifts:
        return None
    over = sum(d > 100 * steady for d in drifts) if steady is not None else 0
    return (f"the host's speed over each pair kept: moved {statistics.median(drifts):.1f}% (median), at most "
            f"{max(drifts):.1f}%" + (f"; {over} of {len(drifts)} pairs over {100 * steady:g}% after every attempt"
                                      if over and steady is not None else ""))


def kept_pair(workdir: Path, scenario: str, i: int) -> tuple[tuple[str, str], float | None]:
    """The pair of jobs an earlier --keep kept (PAIRS_FILE; the first attempt's names
    where it has no line), and the host's drift over it."""
    try:
        got = json.loads((workdir / PAIRS_FILE).read_text()).get(f"{scenario}-{i}") or {}
        return (str(got["problem"]), str(got["fixed"])), got.get("drift")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return pair_names(scenario, i), None


def _keep_pair(workdir: Path, scenario: str, i: int, names: tuple[str, str], speeds: list[float | None],
               drift: float | None, attempts: int) -> None:
    path = workdir / PAIRS_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    doc[f"{scenario}-{i}"] = {"problem": names[0], "fixed": names[1], "speed_us": speeds,
                             "drift": None if drift is None else round(drift, 4), "attempts": attempts}
    path.write_text(json.dumps(doc, indent=1) + "\n")


@dataclass
class Taken:
    """One job of a pair as measured: its run and its analysis."""
    run: Run
    doc: dict[str, Any]
    values: dict[str, Any] = field(default_factory=dict)  # the advised values it was run with (a fixed job)


def _take(scenario: str, run: Run) -> Taken:
    doc = analyze(Path(run.path))
    others = f", others used {run.others_cores:.2f} cores" if run.others_cores is not None else ""
    log(f"[{scenario}]   median step {run.per_micro_us / 1000:.1f} ms per micro-batch over "
        f"{run.steps_counted} steps ({run.wall_s:.0f} s{others})")
    return Taken(run, doc)


def _pair(scenario: str, lever: str | None, i: int, steps: int, workdir: Path, retries: int,
          reuse: Path | None, steady: float | None = None, probe: bool = True) -> tuple[Taken, Taken, float | None]:
    """Pair ``i``: its problem job, then its fixed job with the advised values the problem
    run's finding gave; with ``steady``, recorded again while the host's speed moved more
    than that over it (the steadiest attempt kept); or the ones --keep kept (``reuse``).
    Without ``probe`` the host's speed is not timed (no drift, no --steady)."""

    def speed() -> float | None:
        return host_probe.speed_us() if probe else None

    if reuse is not None:
        (p_name, f_name), drift = kept_pair(reuse, scenario, i)
        p = _take(scenario, recorded(reuse / p_name, scenario, False))
        values = _advised(lever, p.doc)
        return p, replace(_take(scenario, recorded(reuse / f_name, scenario, True)), values=values), drift
    tries: list[tuple[float | None, Taken, Taken, tuple[str, str], list[float | None]]] = []
    for attempt in range((retries if steady is not None else 0) + 1):
        names = pair_names(scenario, i, attempt)
        speeds = [speed()]
        log(f"[{scenario}] recording {names[0]} ({steps} steps, {NPROC} ranks)")
        p = _take(scenario, record(scenario, False, workdir / names[0], steps, retries))
        values = _advised(lever, p.doc)
        speeds.append(speed())
        log(f"[{scenario}] recording {names[1]} ({steps} steps, {NPROC} ranks)")
        if values:
            log(f"[{scenario}]   as advised: {', '.join(f'{k}={v}' for k, v in values.items())}")
        f = replace(_take(scenario, record(scenario, True, workdir / names[1], steps, retries, values)), values=values)
        speeds.append(speed())
        drift = host_drift(speeds)
        tries.append((drift, p, f, names, speeds))
        shown = ", ".join("-" if x is None else f"{x:.0f}" for x in speeds)
        if drift is not None:
            log(f"[{scenario}]   the host's speed moved {100 * drift:.0f}% over the pair (a multiply took {shown} us)")
        if steady is None or drift is None or drift <= steady:
            break
        log(f"[{scenario}]   " + ("recording the pair again" if attempt < retries else "keeping the steadiest attempt"))
    drift, p, f, names, speeds = min(tries, key=lambda t: t[0] if t[0] is not None else 0.0)
    _keep_pair(workdir, scenario, i, names, speeds, drift, len(tries))
    return p, f, drift


def _found(lever: str | None, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The analysis' findings of the scenario's lever (none for the control)."""
    return [f for f in doc.get("findings") or [] if lever and f.get("lever") == lever]


def _advised(lever: str | None, doc: dict[str, Any]) -> dict[str, Any]:
    found = _found(lever, doc)
    return advised_values(lever, found[0]) if found and lever else {}


def measure(scenario: str, repeat: int, steps: int, workdir: Path, retries: int = 0,
            reuse: Path | None = None, combined: bool = False, steady: float | None = None,
            probe: bool = True) -> Result:
    """Record the scenario `repeat` times with its problem and with --fix (alternating),
    analyse every run, and collect what `Result.summary` reports. With `reuse`, the runs
    are the ones an earlier --keep left there, analysed again; without `probe`, the
    host's speed is not timed around each pair (`_pair`)."""
    lever = SCENARIOS[scenario][0]
    res = Result(scenario, lever)
    for i in range(repeat):
        p, f, drift = _pair(scenario, lever, i, steps, workdir, retries, reuse, steady, probe)
        res.host_drift.append(drift)
        for t, fixed in ((p, False), (f, True)):
            run, doc = t.run, t.doc
            res.replay_error_pct.append((doc.get("critical_path") or {}).get("replay_error_pct"))
            found = _found(lever, doc)
            if fixed:
                w = window_step_us(Path(run.path))
                res.fixed_window_us.append(w / micro_batches(scenario, True) if w else None)
                res.fixed.append(run)
                res.still_reported.append(bool(found) if lever else bool(doc.get("findings")))
                continue
            res.problem.append(run)
            res.estimated_pct.append(found[0].get("est_saving_pct") if found else None)
            est = (found[0].get("estimate") or {}) if found else {}
            res.method.append(est.get("method"))
            res.projected_window_us.append(est.get("projected_window_step_us"))
            res.window_us.append(est.get("window_step_us"))
            res.share_pct.append(est.get("share_saving_pct", found[0].get("est_saving_pct")) if found else None)
            wi = doc.get("what_if") or {}
            res.what_if_all_pct.append(wi.get("all_saving_pct") if wi.get("findings") else 0.0)
            findings = doc.get("findings") or []
            res.top_lever.append(findings[0]["lever"] if findings else None)
            if found and res.advice is None:
                res.advice = _advice(found[0])
            res.applied.append(f.values)
        if combined:
            res.combined.append(_combined(scenario, i, p.doc, steps, workdir, retries, reuse))
    return res


def _combined(scenario: str, i: int, problem_doc: dict[str, Any], steps: int, workdir: Path, retries: int,
              reuse: Path | None) -> Run | None:
    """Pair i's third run (--combined): the scenario's FIX and every other change its problem
    run's what-if replayed, applied at once; None when one of them has no harness form."""
    values = all_changes(problem_doc)
    if values is None:
        log(f"[{scenario}]   a change of the what-if has no harness form: no combined run")
        return None
    k = int(values.get("accum") or micro_batches(scenario, True))
    name = f"{scenario}-all-{i}"
    log(f"[{scenario}] recording {name}: the fix" + "".join(f", {a}={v}" for a, v in values.items()))
    run = (recorded(reuse / name, scenario, True, k) if reuse is not None
           else record(scenario, True, workdir / name, steps, retries, values, k))
    log(f"[{scenario}]   median step {run.per_micro_us / 1000:.1f} ms per micro-batch over {run.steps_counted} steps")
    return run


def _cell(x: Any, fmt: str = "{:.1f}") -> str:
    if x is None:
        return "-"
    return fmt.format(x) if isinstance(x, (int, float)) else str(x)


def _after(still: list[bool | None]) -> str:
    """Whether the fixed runs still report the lever (the control: any finding)."""
    if not still or any(x is None for x in still):
        return "-"
    return "still reported" if all(still) else "gone" if not any(still) else "reported in some"


def _columns(lines: list[list[str]]) -> list[str]:
    """Rows of cells as aligned text: the first 4 columns to the left, the rest to the right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
            for line in lines]


def _met(errs: list[float]) -> str:
    """Whether the scenarios' |errors| meet the targets: each within TARGET_PP, their
    median within MEDIAN_TARGET_PP."""
    return "met" if max(errs) <= TARGET_PP and statistics.median(errs) <= MEDIAN_TARGET_PP else "not met"


def table(rows: list[dict[str, Any]]) -> str:
    head = ["scenario", "lever", "method", "found", "est. %", "what_if %", "measured %", "error pp", "what_if err pp",
            "share est %", "share err pp", "replay err %", "window err pp", "noise pp", "spread pp", "problem ms", "fixed ms", "after fix"]
    lines = [head]
    for r in rows:
        methods = sorted({m for m in r.get("method") or [] if m})
        errs = [e for e in r.get("replay_error_pct") or [] if e is not None]
        found = "-" if r.get("found") is None else f"{r['found']}/{r.get('pairs', '?')}"
        measured = r["measured_pct"] if r.get("measured_estimated_pct") is None else r["measured_estimated_pct"]
        lines.append([r["scenario"], r["lever"] or "(none)", "/".join(methods) or "-", found, _cell(r["estimated_pct"]),
                      _cell(r["what_if_all_pct"]),
                      _cell(measured), _cell(r["error_pp"], "{:+.1f}"), _cell(r["what_if_error_pp"], "{:+.1f}"),
                      _cell(r.get("share_pct")), _cell(r.get("share_error_pp"), "{:+.1f}"),
                      _cell(max(errs) if errs else None), _cell(r.get("window_error_pp"), "{:+.1f}"),
                      _cell(r["noise_pp"]), _cell(r["spread_pp"]), "/".join(f"{x:.1f}" for x in r["problem_step_ms"]),
                      "/".join(f"{x:.1f}" for x in r["fixed_step_ms"]), _after(r["still_reported_after_fix"])])
    out = _columns(lines)
    errs = [abs(r["error_pp"]) for r in rows if r["error_pp"] is not None and r["lever"]]
    if errs:
        out.append(f"|error| over levers with an estimate: median {statistics.median(errs):.1f} pp, max "
                   f"{max(errs):.1f} pp (target: each <= {TARGET_PP:g}, median <= {MEDIAN_TARGET_PP:g})")
    for r in rows:
        if r.get("combined_each_pct") is not None:
            each = ", ".join("-" if x is None else f"{x:.1f}" for x in r["combined_each_pct"])
            out.append(f"{r['scenario']}: every change at once measured {each}% per pair; what_if "
                       f"{_cell(r['what_if_all_pct'])}%, error {_cell(r.get('combined_error_pp'), '{:+.1f}')} pp")
    rep = [e for r in rows for e in r.get("replay_error_pct") or [] if e is not None]
    if rep:
        out.append(f"replay error over {len(rep)} runs: median {statistics.median(rep):.1f}%, max {max(rep):.1f}% "
                   "(target: median <= 3%, each <= 8%)")
    return "\n".join(out)


def pool(docs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per scenario with a lever, every pair of several invocations' results (--json
    files, each with its label): the pairs' errors (estimated - measured, a pair whose
    problem run got no finding left out, as in summary()), their median (the scenario's
    pooled error), how many are within TARGET_PP, and the spread of the measured saving
    over all pairs; the control's recordings with a finding counted apart. On this host
    the same job recorded twice differs by up to tens of points (the noise column), so a
    scenario's error over two pairs of one invocation moves by as much: its median over
    the pairs of several invocations is what the estimate's bias is."""
    rows: dict[str, dict[str, Any]] = {}
    for label, doc in docs:
        for r in doc.get("results") or []:
            row = rows.setdefault(r["scenario"], {"scenario": r["scenario"], "lever": r.get("lever"), "errors": [],
                                                  "measured": [], "found": 0, "pairs": 0,
                                                  "invocation_error_pp": {}})
            est = r.get("estimated_each_pct") or []
            meas = r.get("measured_each_pct") or []
            row["invocation_error_pp"][label] = r.get("error_pp")
            row["pairs"] += len(meas)
            row["measured"].extend(meas)
            for e, m in zip(est, meas):
                if e is None or m is None:
                    continue
                row["found"] += 1
                row["errors"].append(round(e - m, 1))
    out = []
    for row in rows.values():
        errs = row["errors"]
        row["error_pp"] = _median(errs)
        row["abs_error_pp"] = _median([abs(e) for e in errs])
        row["within"] = sum(abs(e) <= TARGET_PP for e in errs)
        row["measured_range_pp"] = (round(max(row["measured"]) - min(row["measured"]), 1)
                                    if row["measured"] else None)
        out.append(row)
    return out


def pool_table(rows: list[dict[str, Any]], labels: list[str]) -> str:
    """pool()'s rows as text: per scenario its pairs' errors, their median and how many
    are within the target; then every pair together, the scenarios' medians against the
    targets, and how many invocations met them on their own."""
    head = ["scenario", "lever", "pairs", "error pp (each)", "median pp", "median |pp|", f"within {TARGET_PP:g}",
            "measured range pp"]
    lines = [head]
    levers = [r for r in rows if r["lever"]]
    for r in levers:
        lines.append([r["scenario"], r["lever"], f"{r['found']}/{r['pairs']}",
                      " ".join(f"{e:+.1f}" for e in r["errors"]) or "-", _cell(r["error_pp"], "{:+.1f}"),
                      _cell(r["abs_error_pp"]), f"{r['within']}/{len(r['errors'])}", _cell(r["measured_range_pp"])])
    out = _columns(lines)
    every = [e for r in levers for e in r["errors"]]
    if every:
        out.append(f"all {len(every)} pairs of {len(labels)} invocations ({', '.join(labels)}): median |error| "
                   f"{statistics.median(abs(e) for e in every):.1f} pp, {sum(abs(e) <= TARGET_PP for e in every)} "
                   f"within {TARGET_PP:g}")
    by = [abs(r["error_pp"]) for r in levers if r["error_pp"] is not None]
    if by:
        worst = max((r for r in levers if r["error_pp"] is not None), key=lambda r: abs(r["error_pp"]))
        out.append(f"by scenario (the median of its pairs' errors): median |error| {statistics.median(by):.1f} pp, "
                   f"max {max(by):.1f} pp ({worst['scenario']}); targets (each <= {TARGET_PP:g}, median <= "
                   f"{MEDIAN_TARGET_PP:g}) {_met(by)}")
    alone = []
    for label in labels:
        errs = [abs(e) for r in levers if (e := r["invocation_error_pp"].get(label)) is not None]
        if errs:
            alone.append(f"{label} {_met(errs)} (median {statistics.median(errs):.1f}, max {max(errs):.1f})")
    if alone:
        out.append("each invocation alone: " + "; ".join(alone))
    for r in rows:
        if not r["lever"]:
            out.append(f"{r['scenario']} (the control): a finding in {r['found']} of {r['pairs']} recordings with "
                       f"nothing planted")
    return "\n".join(out)


def _pool_main(paths: list[str]) -> int:
    docs = []
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            print(f"error: {path}: not a result of --json ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
            print(f"error: {path}: not a result of --json (no 'results' list)", file=sys.stderr)
            return 2
        docs.append((Path(path).stem, doc))
    print(pool_table(pool(docs), [label for label, _ in docs]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated, of: {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--repeat", type=int, default=1, help="problem/fixed pairs per scenario; 2+ also gives the noise")
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per job (default {STEPS})")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-': stdout, no table)")
    p.add_argument("--retries", type=int, default=2,
                   help=f"record a job again, up to this many times, when other processes used more than "
                        f"{CONTENDED:g} cores while it ran (default 2; the least disturbed is kept)")
    p.add_argument("--steady", metavar="PCT", type=float,
                   help="record a pair again (up to --retries times) when the host's speed, timed before, between "
                        "and after its jobs, moved more than PCT%% over it; the steadiest attempt is kept (default: "
                        "report the movement only)")
    p.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR (default: a temporary one)")
    p.add_argument("--combined", action="store_true",
                   help="also record each pair with every change the problem run's what-if replayed applied at once "
                        "(the scenario's fix and the other findings' advised values), and compare that saving with "
                        "what_if.all_saving_pct")
    p.add_argument("--reuse", metavar="DIR", help="analyse again the runs an earlier --keep DIR recorded, instead of "
                                                  "recording (the estimates of a newer pardiag on the same runs)")
    p.add_argument("--pool", metavar="JSON", nargs="+",
                   help="record nothing: read the --json results of several invocations and give every scenario's "
                        "pairs together (their errors, the median, how many within the target)")
    a = p.parse_args(argv)
    if a.pool:
        return _pool_main(a.pool)
    names = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not names:
        print(f"error: unknown scenario(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    if a.repeat < 1 or a.retries < 0 or a.steps < 12:
        print("error: --repeat must be >= 1, --retries >= 0 and --steps >= 12 (warm-up and the profiler window take 10)",
              file=sys.stderr)
        return 2
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="whatif-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    host: dict[str, Any] = {}
    try:
        if not a.reuse:  # the host's own noise: whether its CPUs slow each other, its drift (host_probe.py)
            host["start"] = host_probe.probe()
        rows = []
        for s in names:
            rows.append(measure(s, a.repeat, a.steps, work, a.retries, Path(a.reuse) if a.reuse else None,
                                a.combined, None if a.steady is None else a.steady / 100).summary())
        if not a.reuse:
            host["end"] = host_probe.probe()
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    doc = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": f"{os.cpu_count()} CPUs, {platform.machine()}",
           "ranks": NPROC, "backend": "gloo", "steps": a.steps, "repeat": a.repeat, "results": rows,
           **({"host": host} if host else {})}
    if a.json:
        text = json.dumps(doc, indent=2)
        if a.json == "-":
            print(text)
            return 0
        Path(a.json).write_text(text + "\n")
    print(table(rows))
    if (line := host_probe.words(host.get("start"), host.get("end"))) is not None:
        print(line)
    if (line := drift_words(rows, None if a.steady is None else a.steady / 100)) is not None:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
