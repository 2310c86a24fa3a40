"""The one registry of finding rules, and the advisor that runs it.

Every rule has the same shape, whatever it reads::

    def my_rule(ctx: RuleContext) -> list[Finding]: ...   # [] when nothing to say

A rule returns a list because some find one thing per subject (a GPU health rule, one
finding per GPU); most return none or one. The context holds what the three families
of rules read:

- ``nccl`` rules (analyzers/nccl/findings.py): ``ctx.nccl``, the parsed NCCL logs;
- ``telemetry`` rules (analyzers/telemetry.py): ``ctx.telemetry``, the Analysis'
  telemetry block, and the stragglers of ``ctx.analysis``;
- ``lever`` rules (analyzers/levers.py): ``ctx.analysis`` with its ``summary``, and
  ``ctx.framework``, the facts the ranks recorded (DDP, FSDP, AMP, DataLoader, device).

An input the run does not have is empty (no logs: a report of no process; no
telemetry: None, no GPU to judge), so a rule needs no guard for it: it finds nothing.

A row runs once for the job, or (``per="gpu"``) once per judged GPU with ``ctx.gpu``
set: GPU health checks judge one GPU against its peers.

Order: ``RULES`` runs top to bottom, consecutive per-GPU rows GPU by GPU (all checks
of the first GPU, then of the next); a rule may read what ran before it found
(``ctx.earlier``: the stale-override rule leaves out the variables a symptom rule
already removes). The advisor then sorts the findings by ``levers.rank_key`` (severity;
a memory limit first; changes that keep the training the same before those that change
the global batch; the larger saving first); findings of equal rank keep the running
order: NCCL, then GPU health (GPU by GPU), then the levers, each in the order of its rows.

To add a rule: write the function in its family's module, add one ``Row`` below (its
name, family, the lever id it reports and, for a GPU check, ``per="gpu"``), add its test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Literal, Protocol, Sequence

from pardiag.analysis import LEVERS, Analysis, Finding, Lever, Notice, RankResult
from pardiag.analysis_blocks import GpuTelemetry, Telemetry
from pardiag.run_info import FrameworkInfo
from pardiag.analyzers import levers
from pardiag.analyzers import telemetry as gpu_health
from pardiag.analyzers import temporal_rules
from pardiag.analyzers.levers import rank_key, what_if
from pardiag.analyzers.nccl import findings as nccl_findings
from pardiag.analyzers.nccl.log import NcclReport, merge_logs

Family = Literal["nccl", "telemetry", "lever", "temporal"]


def _no_logs() -> NcclReport:
    return merge_logs([])


@dataclass(frozen=True)
class RuleContext:
    """What a rule reads. `nccl` is empty and `telemetry` None when the run has none."""

    analysis: Analysis
    nccl: NcclReport = field(default_factory=_no_logs)
    telemetry: Telemetry | None = None
    earlier: tuple[Finding, ...] = ()  # found by the rows above this one
    gpu: GpuTelemetry | None = None  # per-GPU rows: the GPU judged

    @property
    def gpus(self) -> list[GpuTelemetry]:
        """The GPUs the per-GPU rows judge (telemetry's summaries), in block order."""
        return gpu_health.judged_gpus(self.telemetry)[0]

    @property
    def gpu_peers(self) -> list[GpuTelemetry]:
        """The GPUs a judged GPU is compared with; [] with fewer than two."""
        return gpu_health.judged_gpus(self.telemetry)[1]

    @property
    def framework(self) -> FrameworkInfo:
        """What the ranks recorded about the job (`run.framework`); an empty record
        (every fact None) when nothing."""
        return self.analysis.run.fw

    @property
    def step_us(self) -> float:
        """The job's median step (`summary.step_p50_us`), 0 when unknown."""
        return self.analysis.job_summary.step_p50_us or 0.0

    @property
    def ranks(self) -> list[RankResult]:
        """The ranks that have a profiled window."""
        return [r for r in self.analysis.ranks if r.window_us > 0]

    @property
    def inflation(self) -> float | None:
        """How much longer a profiled step was than the median step
        (`summary.profiled_step_inflation.job`), None when unknown."""
        return self.analysis.job_summary.profiled_step_inflation.job

    def share(self, key: str) -> float:
        """A breakdown category's share of the profiled window, pooled over the job
        (`summary.breakdown_ratio`)."""
        return self.analysis.job_summary.breakdown_ratio.get(key, 0.0)

    def exposed_transfer(self) -> float:
        """Exposed communication without the time ranks waited for each other inside it
        (that is imbalance, not the cost of moving data), pooled over the job
        (`summary.comm_exposed_transfer_ratio`)."""
        return self.analysis.job_summary.comm_exposed_transfer_ratio or 0.0

    def exposed(self) -> float:
        """Exposed communication, waiting included (`summary.comm_exposed_ratio`)."""
        return self.analysis.job_summary.comm_exposed_ratio or 0.0

    def exposed_words(self) -> str:
        """The two exposed-communication figures, labelled as every report labels them."""
        return (f"exposed communication {self.exposed_transfer():.1%} of the profiled time with waiting for other "
                f"ranks left out ({self.exposed():.1%} with it; pooled over ranks)")

    @property
    def on_gpu(self) -> bool:
        """Whether any rank ran on a CUDA device."""
        return any(r.device_type == "cuda" for r in self.analysis.ranks)

    @property
    def ddp(self) -> dict[str, Any] | None:
        """The first DDP module the ranks recorded, None without DDP."""
        d = self.framework.ddp or []
        return d[0] if d else None

    @property
    def straggler_ranks(self) -> list[int]:
        return [s.rank for s in self.analysis.stragglers]


class Rule(Protocol):
    def __call__(self, ctx: RuleContext) -> list[Finding]: ...


@dataclass(frozen=True)
class Row:
    """One rule of the registry: its name (for notices and tests), its family, the lever
    id of every finding it returns, the function, and whether it runs once for the job
    or once per judged GPU (`ctx.gpu`)."""

    name: str
    family: Family
    lever: Lever
    check: Rule
    per: Literal["job", "gpu"] = "job"

    def __post_init__(self) -> None:
        if self.lever not in LEVERS:  # the type is closed at run time too
            raise ValueError(f"unknown lever id {self.lever!r}; known: {', '.join(LEVERS)}")


RULES: tuple[Row, ...] = (
    Row("socket_fallback_with_ib", "nccl", "nccl_env", nccl_findings.socket_fallback_with_ib),
    Row("p2p_shm_disabled", "nccl", "nccl_env", nccl_findings.p2p_shm_disabled),
    Row("bootstrap_on_loopback", "nccl", "nccl_env", nccl_findings.bootstrap_on_loopback),
    Row("ib_without_gdrdma", "nccl", "nccl_env", nccl_findings.ib_without_gdrdma),
    Row("version_mismatch", "nccl", "nccl_env", nccl_findings.version_mismatch),
    Row("slow_init", "nccl", "nccl_env", nccl_findings.slow_init),
    Row("few_channels", "nccl", "nccl_env", nccl_findings.few_channels),
    Row("socket_threading", "nccl", "nccl_env", nccl_findings.socket_threading),
    Row("stale_overrides", "nccl", "nccl_env", nccl_findings.stale_overrides),  # after the symptom rules it defers to
    Row("gpu_throttling", "telemetry", "gpu_health", gpu_health.throttling, per="gpu"),
    Row("gpu_slow_peer", "telemetry", "gpu_health", gpu_health.slow_peer, per="gpu"),
    Row("gpu_memory_headroom", "telemetry", "gpu_health", gpu_health.memory_headroom, per="gpu"),
    Row("straggler", "lever", "straggler", levers.straggler),
    Row("host_contention", "lever", "host_contention", levers.host_contention),
    Row("garbage_collection", "lever", "garbage_collection", levers.garbage_collection),
    Row("input_imbalance", "lever", "input_imbalance", levers.input_imbalance),
    Row("dataloader", "lever", "dataloader", levers.dataloader),
    Row("gradient_accumulation", "lever", "gradient_accumulation", levers.gradient_accumulation),
    Row("ddp_bucket_size", "lever", "ddp_bucket_size", levers.ddp_bucket_size),
    Row("ddp_find_unused", "lever", "ddp_find_unused", levers.ddp_find_unused),
    Row("comm_overlap", "lever", "comm_overlap", levers.comm_overlap),
    Row("mixed_precision", "lever", "mixed_precision", levers.mixed_precision),
    Row("sharding", "lever", "sharding", levers.sharding),
    Row("batch_size", "lever", "batch_size", levers.batch_size),
    Row("memory_imbalance", "lever", "memory_imbalance", levers.memory_imbalance),
    Row("allocator_fragmentation", "lever", "allocator_fragmentation", levers.allocator_fragmentation),
    Row("sync_points", "lever", "sync_points", levers.sync_points),
    Row("host_overhead", "lever", "host_overhead", levers.host_overhead),
    # when: from the temporal block (after the whole-run rows, whose findings they defer to)
    Row("late_straggler", "temporal", "straggler", temporal_rules.late_straggler),
    Row("gc_pauses", "temporal", "garbage_collection", temporal_rules.gc_pauses),
)


def _calls(ctx: RuleContext, rows: Sequence[Row]) -> Iterator[tuple[Row, RuleContext]]:
    """Each row with the context it runs in, in running order: a job row once; a run of
    consecutive per-GPU rows GPU by GPU (every check of one GPU, then the next's)."""
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j].per == "gpu":
            j += 1
        if j == i:
            yield rows[i], ctx
            i += 1
            continue
        for g in ctx.gpus:
            for row in rows[i:j]:
                yield row, replace(ctx, gpu=g)
        i = j


def run_rules(ctx: RuleContext, family: Family | None = None, notices: list[Notice] | None = None) -> list[Finding]:
    """The findings of every row (of `family`, if given), in running order (`_calls`).
    With `notices`, a rule that fails becomes a warning there (one rule's bug must not
    take the analysis down); without, it raises."""
    rows = [row for row in RULES if family is None or row.family == family]
    found: list[Finding] = []
    for row, row_ctx in _calls(ctx, rows):
        try:
            got = row.check(replace(row_ctx, earlier=tuple(found)))
            wrong = sorted({f.lever for f in got if f.lever != row.lever})
            if wrong:
                raise ValueError(f"returned lever {', '.join(wrong)}, not its row's {row.lever}")
        except Exception as e:
            if notices is None:
                raise
            notices.append(Notice("warning", f"{row.family} rule {row.name} failed: {type(e).__name__}: {e}"))
            continue
        found.extend(got)
    return found


def _with_mfu(f: Finding, a: Analysis) -> Finding:
    """The finding with the job's MFU in its evidence where MFU speaks to its cause
    (analyzers/efficiency.py `mfu_evidence`): a low MFU with little exposed communication
    is a job held by its input or host, not by the network."""
    from pardiag.analyzers.efficiency import EVIDENCE_PREFIX, mfu_evidence

    line = mfu_evidence(f.lever, a.efficiency, a.job_summary.comm_exposed_transfer_ratio)
    if line is None or any(e.startswith(EVIDENCE_PREFIX) for e in f.evidence):
        return f
    return replace(f, evidence=[*f.evidence, line])


def ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Most important first (`levers.rank_key`); equal ranks keep their order."""
    return sorted(findings, key=rank_key)


def advise(a: Analysis, *, nccl: NcclReport | None = None, telemetry: Telemetry | None = None,
           extra: Sequence[Finding] = ()) -> Analysis:
    """The Analysis with the findings of every rule (after those it already has and
    `extra`), ordered, and the what-if projection. A rule that fails is a notice."""
    ctx = RuleContext(a, nccl=nccl if nccl is not None else _no_logs(), telemetry=telemetry)
    found = [_with_mfu(f, a) for f in run_rules(ctx, notices=a.notices)]
    findings = ordered(list(a.findings) + list(extra) + found)
    return replace(a, findings=findings, what_if=what_if(ctx.step_us, findings))
