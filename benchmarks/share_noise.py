"""Do the share rules fire on noise? False and true findings of the share-based levers
(gradient_accumulation, ddp_bucket_size, comm_overlap, dataloader) on real recordings,
judged two ways on the same recordings:

  pooled   the share of the profiled window (or of steps.jsonl) against the rule's
           threshold, as the rules judged before the step test: the Analysis re-advised
           with its per-step figures removed (`share_test` then decides on the pooled
           share alone)
  steps    as pardiag advises: the share's lower bound over the steps
           (analyzers/shares.py) must clear the threshold too

For each scenario of examples/scenarios (2 ranks, torchrun, gloo on the CPU, recorded as
benchmarks/whatif_accuracy.py records them): how many recordings got each share lever,
either way. The healthy control should get none; a planted problem its lever every time.
Other findings (a straggler) are listed, not counted: they are not share rules.

    python benchmarks/share_noise.py --repeat 4 --scenarios healthy,comm_bound,tiny_buckets,slow_input
    python benchmarks/share_noise.py --runs RUN_DIR [RUN_DIR ...]     # recordings made before

Progress goes to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif_accuracy import SCENARIOS, STEPS, BenchError, log, record  # noqa: E402

from pardiag.analysis import Analysis  # noqa: E402
from pardiag.analyzers.pipeline import analyze_path  # noqa: E402
from pardiag.analyzers.rules import advise  # noqa: E402

SHARE_LEVERS = ("gradient_accumulation", "ddp_bucket_size", "comm_overlap", "dataloader")


def pooled_only(a: Analysis) -> Analysis:
    """`a` advised again without its per-step figures: the share rules judge the pooled
    share alone."""
    ranks = [replace(r, breakdown_per_step_us={}, host_per_step_us={}) for r in a.ranks]
    return advise(replace(a, ranks=ranks, findings=[], what_if=None))


def levers(a: Analysis) -> set[str]:
    return {f.lever for f in a.findings}


def scenario_of(path: Path) -> str:
    name = path.name
    for s in sorted(SCENARIOS, key=len, reverse=True):
        if name.startswith(s):
            return s
    return name


@dataclass
class Verdict:
    scenario: str
    path: str
    exposed: float  # summary.comm_exposed_transfer_ratio
    pooled: set[str]  # levers found judging the pooled shares alone
    steps: set[str]  # levers found as pardiag advises


def judge(paths: list[Path]) -> list[Verdict]:
    out = []
    for p in paths:
        a = analyze_path(p)
        v = Verdict(scenario_of(p), str(p), a.job_summary.comm_exposed_transfer_ratio or 0.0,
                    levers(pooled_only(a)), levers(a))
        log(f"[{p.name}] exposed {v.exposed:.1%}; pooled: {sorted(v.pooled)}; steps: {sorted(v.steps)}")
        out.append(v)
    return out


def table(rows: list[Verdict]) -> str:
    lines = [("scenario", "planted lever", "runs", "share findings (pooled)", "share findings (steps)",
              "planted found (pooled/steps)", "other findings (steps)")]
    for scen in dict.fromkeys(r.scenario for r in rows):
        rs = [r for r in rows if r.scenario == scen]
        planted = SCENARIOS.get(scen, (None, ()))[0]

        def count(found: list[set[str]]) -> str:
            return ", ".join(f"{lv} {n}" for lv in SHARE_LEVERS if (n := sum(lv in f for f in found))) or "none"

        hits = (f"{sum(planted in r.pooled for r in rs)}/{sum(planted in r.steps for r in rs)}" if planted else "-")
        others: dict[str, int] = {}
        for r in rs:
            for lv in r.steps - set(SHARE_LEVERS) - {planted}:
                others[lv] = others.get(lv, 0) + 1
        lines.append((scen, planted or "none (control)", str(len(rs)), count([r.pooled for r in rs]),
                      count([r.steps for r in rs]), hits,
                      ", ".join(f"{k} {v}" for k, v in sorted(others.items())) or "none"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--scenarios", default="healthy,comm_bound,tiny_buckets,slow_input",
                   help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    p.add_argument("--repeat", type=int, default=4, help="recordings per scenario (default 4)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per job (default {STEPS})")
    p.add_argument("--retries", type=int, default=2, help="as benchmarks/whatif_accuracy.py --retries")
    p.add_argument("--keep", metavar="DIR", help="keep the run directories under DIR (default: a temporary one)")
    p.add_argument("--runs", nargs="+", metavar="RUN_DIR",
                   help="judge these recordings instead (named <scenario>-<n>, as --keep names them)")
    a = p.parse_args(argv)
    if a.runs:
        print(table(judge([Path(r) for r in a.runs])))
        return 0
    names = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    if not names or any(s not in SCENARIOS for s in names) or a.repeat < 1:
        print(f"error: --scenarios of {', '.join(SCENARIOS)}, --repeat >= 1", file=sys.stderr)
        return 2
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="share-noise-"))
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    try:
        for i in range(a.repeat):  # scenarios alternate, so that a slow spell of the machine hits them all
            for s in names:
                out = work / f"{s}-{i + 1}"
                log(f"[{s}] recording {i + 1}/{a.repeat}")
                run = record(s, False, out, a.steps, a.retries)
                paths.append(Path(run.path))
        print(table(judge(paths)))
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
