"""Comparing two runs of the same job: did HEAD get slower than BASE, and where.

The sample. Steps of one job are not independent: all ranks of a data-parallel job
meet in every step's collectives, so they move together, and one rank's step times
follow each other in time. Pooling every rank's steps would count one slow step
world_size times and make any difference look significant. The sample is therefore
the per-step *job* time: for each step number seen by every rank, the longest of the
ranks' `dur_us`. Only counted steps count, as in the Analysis (`step_records.counted`):
step 0, steps inside the profiler window and steps in which pardiag itself worked
(`pardiag_us >= DISTURBED_US`) on any rank are left out. Dependence in time remains;
its lag-1 autocorrelation is reported and a note says when it makes the test optimistic.

Without steps.jsonl (folders of plain traces) the sample falls back to one value per
rank, the profiled step time `window_us / steps_profiled`; the test then has little
power, and the result says so.

The statistics:
- medians and p90 (linear interpolation: `steps.percentile`, pardiag's one percentile
  function; the bootstrap's resampled medians use numpy's, the same definition vectorised);
- the relative change of the median, head / base - 1, with a percentile bootstrap
  confidence interval (each run resampled with replacement, fixed seed);
- a two-sided Mann-Whitney U test. Ties get mid-ranks. With at most EXACT_MAX_N values
  in each sample the p-value is exact: the null distribution of the rank sum is counted
  over all subsets of the pooled (mid-)ranks, so it is exact given the ties too. Larger
  samples use the normal approximation with tie correction and continuity correction:
  z = (|U - n1 n2 / 2| - 1/2) / sqrt(n1 n2 / 12 * ((N + 1) - sum(t^3 - t) / (N (N - 1)))).

Regression: HEAD's median is slower by more than `fail_over_pct` AND the difference is
significant: p < ALPHA and the bootstrap CONFIDENCE interval of the change lies above 0.

What the test cannot see: with one run on each side there is no measure of run-to-run
variation. A machine that is busier, or in another state, for the whole of one run
shifts all its steps together, and that shift is as significant as a real regression.
The threshold is the guard against it: set it above the machine's run-to-run noise.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from pardiag.analysis import BREAKDOWN_KEYS, PHASE_KEYS, Analysis, Finding
from pardiag.analyzers.steps import JobSteps, job_step_times_us, median, percentile
from pardiag.step_records import StepRecord

__all__ = ["JobSteps", "job_step_times_us"]  # the job's step time lives in steps.py; kept importable here

SCHEMA = "pardiag.diff"
SCHEMA_VERSION = 1
ALPHA = 0.01
CONFIDENCE = 0.99
DEFAULT_FAIL_OVER_PCT = 5.0
EXACT_MAX_N = 20
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
AUTOCORR_NOTE = 0.5  # lag-1 autocorrelation past which the p-value is called optimistic
TITLE_KEY_CHARS = 40

Verdict = Literal["regression", "slower", "faster", "unchanged", "unknown"]
Source = Literal["steps", "profiled"]


# -- statistics -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U of the first sample: pairs (x, y) with x > y, ties counted half
    p_value: float  # two-sided
    method: Literal["exact", "normal"]
    min_p_value: float  # the smallest p these sample sizes can give (complete separation)


def midranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..N, tied values sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return (last - (counts - 1) / 2.0)[inverse]


def mann_whitney_u(x: Sequence[float], y: Sequence[float], method: Literal["auto", "exact", "normal"] = "auto") -> MannWhitney:
    """Two-sided Mann-Whitney U test of x against y (see the module docstring)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n1, n2 = len(xs), len(ys)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples need at least one value")
    ranks = midranks(np.concatenate([xs, ys]))
    r1 = float(ranks[:n1].sum())
    u = r1 - n1 * (n1 + 1) / 2.0
    if method == "auto":
        method = "exact" if max(n1, n2) <= EXACT_MAX_N else "normal"
    if method == "exact":
        p = _exact_p(ranks, n1, r1)
        min_p = min(1.0, 2.0 / math.comb(n1 + n2, n1))
    else:
        _, counts = np.unique(ranks, return_counts=True)
        ties = float(((counts.astype(float) ** 3) - counts).sum())
        p = _normal_p(u, n1, n2, ties)
        min_p = _normal_p(0.0, n1, n2, 0.0)
    return MannWhitney(u=u, p_value=p, method=method, min_p_value=min_p)


def _normal_p(u: float, n1: int, n2: int, ties: float) -> float:
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - (ties / (n * (n - 1)) if n > 1 else 0.0))
    if var <= 0:
        return 1.0  # every value equal
    z = max(abs(u - n1 * n2 / 2.0) - 0.5, 0.0) / math.sqrt(var)
    return min(1.0, math.erfc(z / math.sqrt(2.0)))


def _exact_p(ranks: np.ndarray, n1: int, r1: float) -> float:
    """P-value from the distribution of the rank sum of n1 values drawn from the pooled
    ranks without replacement, counted by dynamic programming over doubled (integer) ranks."""
    doubled = np.rint(2 * ranks).astype(int)
    top = int(doubled.sum())
    counts = np.zeros((n1 + 1, top + 1))  # counts[k, s]: subsets of k ranks whose doubled sum is s
    counts[0, 0] = 1.0
    for v in doubled:
        counts[1:, v:] = counts[1:, v:] + counts[:-1, : top + 1 - v]
    dist = counts[n1]
    total = dist.sum()
    observed = int(round(2 * r1))
    low, high = dist[: observed + 1].sum() / total, dist[observed:].sum() / total
    return float(min(1.0, 2.0 * min(low, high)))


def bootstrap_median_change(base: Sequence[float], head: Sequence[float], confidence: float = CONFIDENCE,
                            resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of median(head) / median(base) - 1."""
    b, h = np.asarray(base, dtype=float), np.asarray(head, dtype=float)
    rng = np.random.default_rng(seed)
    changes = []
    chunk = max(1, min(resamples, 4_000_000 // max(len(b), len(h), 1)))  # bounded memory
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        mb = np.median(b[rng.integers(0, len(b), (k, len(b)))], axis=1)
        mh = np.median(h[rng.integers(0, len(h), (k, len(h)))], axis=1)
        changes.append(mh / mb - 1.0)
    lo, hi = np.quantile(np.concatenate(changes), [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return float(lo), float(hi)


def lag1_autocorrelation(xs: Sequence[float]) -> float | None:
    d = np.asarray(xs, dtype=float)
    if len(d) < 3:
        return None
    d = d - d.mean()
    denom = float((d * d).sum())
    return float((d[:-1] * d[1:]).sum() / denom) if denom > 0 else None


# -- samples ----------------------------------------------------------------------------------


def profiled_step_times_us(a: Analysis) -> list[float]:
    """One value per rank: its mean step time inside the profiled window."""
    return [r.window_us / r.steps_profiled for r in a.ranks if r.steps_profiled and r.window_us > 0]


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTimeDiff:
    source: Source  # "steps": per-step job time from steps.jsonl; "profiled": per-rank profiled step time
    base_n: int
    head_n: int
    base_p50_us: float | None
    head_p50_us: float | None
    base_p90_us: float | None
    head_p90_us: float | None
    base_mean_us: float | None
    head_mean_us: float | None
    change_ratio: float | None  # head p50 / base p50 - 1
    ci_low_ratio: float | None
    ci_high_ratio: float | None
    confidence: float
    u: float | None
    p_value: float | None
    test_method: str | None
    min_p_value: float | None
    base_autocorr_lag1: float | None
    head_autocorr_lag1: float | None


@dataclass(frozen=True)
class CategoryDelta:
    key: str  # breakdown_us key
    base_share: float | None  # of the profiled window, all ranks
    head_share: float | None
    base_us_per_step: float | None  # mean over ranks, per profiled step
    head_us_per_step: float | None


@dataclass(frozen=True)
class PhaseDelta:
    key: str  # phases_us key
    base_us_per_step: float | None
    head_us_per_step: float | None


@dataclass(frozen=True)
class CollectiveDelta:
    op: str
    process_group: str
    base_calls_per_step: float | None  # None: not seen in that run
    head_calls_per_step: float | None
    base_bytes_per_step: float | None
    head_bytes_per_step: float | None
    base_transfer_us_per_step: float | None
    head_transfer_us_per_step: float | None
    base_wait_us_per_step: float | None
    head_wait_us_per_step: float | None


@dataclass(frozen=True)
class FindingChange:
    lever: str
    severity: str
    title: str
    est_saving_pct: float | None


@dataclass(frozen=True)
class EfficiencyDelta:
    """The two runs' efficiency blocks side by side (None where a run has none): a change
    of the model's FLOPs per step says the runs did different work, and MFU then compares
    them better than the step time does."""

    base_mfu: float | None
    head_mfu: float | None
    base_hfu: float | None
    head_hfu: float | None
    base_model_tflops: float | None
    head_model_tflops: float | None
    base_model_flops_per_step: float | None
    head_model_flops_per_step: float | None
    base_samples_per_s: float | None
    head_samples_per_s: float | None
    base_tokens_per_s: float | None
    head_tokens_per_s: float | None
    base_peak_source: str | None  # "table" or "measured"
    head_peak_source: str | None


@dataclass(frozen=True)
class DiffResult:
    base_label: str
    head_label: str
    fail_over_pct: float
    alpha: float
    verdict: Verdict
    steps: StepTimeDiff
    categories: list[CategoryDelta]
    phases: list[PhaseDelta]
    collectives: list[CollectiveDelta]
    new_findings: list[FindingChange]
    resolved_findings: list[FindingChange]
    notes: list[str] = field(default_factory=list)
    efficiency: EfficiencyDelta | None = None  # None: neither run has the block

    @property
    def regression(self) -> bool:
        return self.verdict == "regression"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "regression": self.regression, **asdict(self)}


@dataclass(frozen=True)
class RunInput:
    label: str
    analysis: Analysis
    steps_by_rank: Mapping[int, Sequence[StepRecord]] | None  # None: no run directory


# -- comparing --------------------------------------------------------------------------------


def _pct(xs: Sequence[float], q: float) -> float | None:
    return percentile(xs, q / 100)


def compare_step_times(base: Sequence[float], head: Sequence[float], source: Source,
                       confidence: float = CONFIDENCE) -> StepTimeDiff:
    b50, h50 = _pct(base, 50), _pct(head, 50)
    change = lo = hi = None
    mw = None
    if base and head and b50:
        change = (h50 or 0.0) / b50 - 1.0
        lo, hi = bootstrap_median_change(base, head, confidence)
        mw = mann_whitney_u(head, base)
    return StepTimeDiff(
        source=source, base_n=len(base), head_n=len(head),
        base_p50_us=b50, head_p50_us=h50, base_p90_us=_pct(base, 90), head_p90_us=_pct(head, 90),
        base_mean_us=float(np.mean(base)) if base else None, head_mean_us=float(np.mean(head)) if head else None,
        change_ratio=change, ci_low_ratio=lo, ci_high_ratio=hi, confidence=confidence,
        u=mw.u if mw else None, p_value=mw.p_value if mw else None, test_method=mw.method if mw else None,
        min_p_value=mw.min_p_value if mw else None,
        base_autocorr_lag1=lag1_autocorrelation(base) if source == "steps" else None,
        head_autocorr_lag1=lag1_autocorrelation(head) if source == "steps" else None,
    )


def verdict(s: StepTimeDiff, fail_over_pct: float, alpha: float = ALPHA) -> Verdict:
    if s.change_ratio is None or s.p_value is None or s.ci_low_ratio is None or s.ci_high_ratio is None:
        return "unknown"
    significant = s.p_value < alpha
    if significant and s.ci_low_ratio > 0:
        return "regression" if s.change_ratio * 100 > fail_over_pct else "slower"
    if significant and s.ci_high_ratio < 0:
        return "faster"
    return "unchanged"


def _steps_profiled(a: Analysis) -> float:
    return median(float(r.steps_profiled) for r in a.ranks if r.steps_profiled) or 0.0


def _category(a: Analysis, key: str) -> tuple[float | None, float | None]:
    """(share of the profiled window pooled over the job, the summary's `breakdown_ratio`;
    us per profiled step, mean over ranks)."""
    ranks = [r for r in a.ranks if r.window_us > 0 and r.steps_profiled]
    if not ranks:
        return None, None
    share = a.job_summary.breakdown_ratio.get(key)
    return share, sum(r.breakdown_us.get(key, 0.0) / r.steps_profiled for r in ranks) / len(ranks)


def category_deltas(base: Analysis, head: Analysis) -> list[CategoryDelta]:
    out = []
    for k in BREAKDOWN_KEYS:
        (bs, bu), (hs, hu) = _category(base, k), _category(head, k)
        out.append(CategoryDelta(k, bs, hs, bu, hu))
    return out


def phase_deltas(base: Analysis, head: Analysis) -> list[PhaseDelta]:
    def one(a: Analysis, key: str) -> float | None:
        ranks = [r for r in a.ranks if r.steps_profiled and r.phases_us]
        return sum(r.phases_us.get(key, 0.0) / r.steps_profiled for r in ranks) / len(ranks) if ranks else None

    return [PhaseDelta(k, one(base, k), one(head, k)) for k in PHASE_KEYS]


def collective_deltas(base: Analysis, head: Analysis) -> list[CollectiveDelta]:
    """Matched by (op, process group); per profiled step so that different windows compare."""
    def index(a: Analysis) -> dict[tuple[str, str], tuple[float, ...]]:
        steps = _steps_profiled(a) or 1.0
        return {(c.op, c.process_group): (c.calls / steps, c.bytes / steps, c.transfer_us / steps, c.wait_us / steps)
                for c in a.collectives}

    b, h = index(base), index(head)
    out = []
    for key in sorted(set(b) | set(h)):
        bv, hv = b.get(key, (None,) * 4), h.get(key, (None,) * 4)
        out.append(CollectiveDelta(key[0], key[1], bv[0], hv[0], bv[1], hv[1], bv[2], hv[2], bv[3], hv[3]))
    return sorted(out, key=lambda c: -max(_total(c.base_transfer_us_per_step, c.base_wait_us_per_step),
                                          _total(c.head_transfer_us_per_step, c.head_wait_us_per_step)))


def _total(*xs: float | None) -> float:
    return sum(x for x in xs if x is not None)


def finding_key(f: Finding) -> tuple[str, str]:
    """A finding's identity across runs: its lever and the start of its title with
    numbers masked, up to the first ':', ';' or '(' (so '35% of the step ...' and
    '41% of the step ...' are the same finding)."""
    title = re.sub(r"\d+(\.\d+)?", "#", f.title.lower())
    title = re.split(r"[:;(]", title, maxsplit=1)[0].strip()
    return f.lever, title[:TITLE_KEY_CHARS]


def finding_changes(base: Analysis, head: Analysis) -> tuple[list[FindingChange], list[FindingChange]]:
    """(findings new in HEAD, findings of BASE resolved in HEAD)."""
    def change(f: Finding) -> FindingChange:
        return FindingChange(f.lever, f.severity, f.title, f.est_saving_pct)

    bk, hk = {finding_key(f) for f in base.findings}, {finding_key(f) for f in head.findings}
    return ([change(f) for f in head.findings if finding_key(f) not in bk],
            [change(f) for f in base.findings if finding_key(f) not in hk])


def _samples(base: RunInput, head: RunInput, notes: list[str]) -> tuple[list[float], list[float], Source]:
    jb = job_step_times_us(base.steps_by_rank) if base.steps_by_rank else JobSteps([], [], 0)
    jh = job_step_times_us(head.steps_by_rank) if head.steps_by_rank else JobSteps([], [], 0)
    if jb.values_us and jh.values_us:
        notes.append(f"step time: per-step job time (the slowest rank of each step) over {len(jb.values_us)} BASE and "
                     f"{len(jh.values_us)} HEAD undisturbed steps of steps.jsonl; warm-up, profiled and disturbed steps "
                     f"left out ({jb.left_out} and {jh.left_out})")
        for side, j in (("BASE", jb), ("HEAD", jh)):
            if len(j.values_us) < 10:
                notes.append(f"{side} has only {len(j.values_us)} undisturbed steps: run more steps for a reliable comparison")
        return jb.values_us, jh.values_us, "steps"
    missing = [r.label for r, j in ((base, jb), (head, jh)) if not j.values_us]
    b, h = profiled_step_times_us(base.analysis), profiled_step_times_us(head.analysis)
    notes.append(f"no undisturbed steps from steps.jsonl in {' and '.join(missing)} (plain traces?): compared the "
                 f"ranks' profiled step times ({len(b)} BASE and {len(h)} HEAD values, one per rank); "
                 "the test has little power")
    return b, h, "profiled"


def diff_runs(base: RunInput, head: RunInput, fail_over_pct: float = DEFAULT_FAIL_OVER_PCT,
              alpha: float = ALPHA, confidence: float = CONFIDENCE) -> DiffResult:
    notes: list[str] = []
    b, h, source = _samples(base, head, notes)
    steps = compare_step_times(b, h, source, confidence)
    if steps.min_p_value is not None and steps.min_p_value >= alpha:
        notes.append(f"with {steps.base_n} and {steps.head_n} values the test cannot reach p < {alpha:g} "
                     f"(smallest possible p = {steps.min_p_value:.2g}): it cannot report a regression")
    for side, r in (("BASE", steps.base_autocorr_lag1), ("HEAD", steps.head_autocorr_lag1)):
        if r is not None and r > AUTOCORR_NOTE:
            notes.append(f"{side}'s step times drift (lag-1 autocorrelation {r:.2f}): the test treats steps as "
                         "independent, so its p-value is optimistic")
    if _steps_profiled(base.analysis) != _steps_profiled(head.analysis):
        notes.append("the profiled windows have different lengths: breakdowns and collectives compared per step")
    new, resolved = finding_changes(base.analysis, head.analysis)
    eff = efficiency_delta(base.analysis, head.analysis, notes)
    return DiffResult(
        base_label=base.label, head_label=head.label, fail_over_pct=fail_over_pct, alpha=alpha,
        verdict=verdict(steps, fail_over_pct, alpha), steps=steps,
        categories=category_deltas(base.analysis, head.analysis), phases=phase_deltas(base.analysis, head.analysis),
        collectives=collective_deltas(base.analysis, head.analysis),
        new_findings=new, resolved_findings=resolved, notes=notes, efficiency=eff,
    )


FLOPS_CHANGE_NOTE = 0.01  # model FLOPs per step that differ by more than this share: the runs did other work


def efficiency_delta(base: Analysis, head: Analysis, notes: list[str]) -> EfficiencyDelta | None:
    b, h = base.efficiency, head.efficiency
    if b is None and h is None:
        return None

    def get(e: Any, name: str) -> Any:
        return getattr(e, name) if e is not None else None

    bf, hf = get(b, "model_flops_per_step"), get(h, "model_flops_per_step")
    if bf and hf and abs(hf / bf - 1) > FLOPS_CHANGE_NOTE:
        notes.append(f"the model's FLOPs per step changed {hf / bf - 1:+.1%} (the runs did different work): "
                     "MFU and throughput compare them better than the step time")
    bp, hp = get(get(b, "peak"), "source"), get(get(h, "peak"), "source")
    if bp and hp and bp != hp:
        notes.append(f"MFU is against a {bp} peak in BASE and a {hp} peak in HEAD")
    return EfficiencyDelta(
        base_mfu=get(b, "mfu"), head_mfu=get(h, "mfu"), base_hfu=get(b, "hfu"), head_hfu=get(h, "hfu"),
        base_model_tflops=get(b, "model_tflops"), head_model_tflops=get(h, "model_tflops"),
        base_model_flops_per_step=bf, head_model_flops_per_step=hf,
        base_samples_per_s=get(b, "samples_per_s"), head_samples_per_s=get(h, "samples_per_s"),
        base_tokens_per_s=get(b, "tokens_per_s"), head_tokens_per_s=get(h, "tokens_per_s"),
        base_peak_source=bp, head_peak_source=hp)


def largest_increases(d: DiffResult, n: int = 3) -> list[tuple[str, str, float]]:
    """Where the time per profiled step grew most: (kind, name, extra us per step), largest
    first; kind is "category" (breakdown key), "phase" (phase key), "wait" or "transfer"
    (a collective, named "op process_group"). Categories and phases cut the same time two ways."""
    cands: list[tuple[str, str, float]] = []
    cands += [("category", c.key, _delta(c.base_us_per_step, c.head_us_per_step)) for c in d.categories]
    cands += [("phase", p.key, _delta(p.base_us_per_step, p.head_us_per_step)) for p in d.phases]
    for k in d.collectives:
        name = f"{k.op} {k.process_group}"
        cands.append(("wait", name, _delta(k.base_wait_us_per_step, k.head_wait_us_per_step)))
        cands.append(("transfer", name, _delta(k.base_transfer_us_per_step, k.head_transfer_us_per_step)))
    return sorted((c for c in cands if c[2] > 0), key=lambda c: -c[2])[:n]


def _delta(b: float | None, h: float | None) -> float:
    return (h or 0.0) - (b or 0.0)
