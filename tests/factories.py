"""Builders of pardiag's own objects for the tests: ranks, Analyses, findings, the
framework facts a run records, and a node's run directory. Every test builds them from
here, so that one shape of run has one builder.

Raw profiler traces (the Kineto JSON the analyzers parse) are built by `tracegen`: they
are the input format, not pardiag's objects, and know nothing of the package.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console

from pardiag import manifest, rundir
from pardiag.analysis import (
    Analysis,
    Collective,
    Finding,
    GpuTime,
    Notice,
    ProcessGroup,
    RankResult,
    StepTime,
    Straggler,
)
from pardiag.analysis_blocks import (
    CollLaggard,
    GpuTelemetry,
    Hang,
    HangGroup,
    HangLate,
    HangWait,
    HostTelemetry,
    NcclSummary,
    RankGpu,
    StuckRank,
    Telemetry,
    WhatIf,
    WhatIfRow,
    nccl_late,
    nccl_waited,
)
from pardiag.run_info import FrameworkInfo, RunInfo
from pardiag.rundir import RunDir

if TYPE_CHECKING:  # textual stays out of the tests that do not drive the TUI
    from pardiag.tui.app import PardiagApp

MB = 2**20
GB = 2**30
MS = 1000.0


# -- ranks and Analyses given as shares of the profiled window ------------------------------


def rank(r: int, *, window: float = 100_000.0, steps: int = 1, device: str = "cuda", step_p50: float = 100_000.0,
         ops: dict[str, Any] | None = None, host: dict[str, float] | None = None, **shares: float) -> RankResult:
    """A rank whose breakdown has the given shares of the window (idle takes the rest)."""
    b = {k: shares.get(k, 0.0) * window for k in ("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader")}
    b["idle"] = window - sum(b.values())
    return RankResult(rank=r, host="h", steps_profiled=steps, window_us=window, breakdown_us=b,
                      phases_us={}, step_time_us=StepTime(step_p50, step_p50, step_p50, 10),
                      device_type=device, ops=ops or {}, host_phases_us=host or {})


def analysis(ranks: list[RankResult], framework: dict[str, Any] | None = None, **kw: Any) -> Analysis:
    return Analysis(run=RunInfo(world_size=len(ranks), framework=FrameworkInfo.from_dict(framework or {})), ranks=ranks,
                    collectives=kw.pop("collectives", []), stragglers=kw.pop("stragglers", []), **kw)


def rank_ms(r: int, p50_ms: float, steps: int, exposed_ms: float, transfer_ms: float, wait_ms: float,
            profiled_ms: float) -> RankResult:
    """A CPU rank given in milliseconds: 100 ms of window per profiled step, 60% compute."""
    window = 100 * MS * steps
    b = {"compute": 0.6 * window, "comm_exposed": exposed_ms * MS, "comm_overlapped": 0.0, "memcpy": 0.0,
         "dataloader": 0.0}
    b["idle"] = window - sum(b.values())
    return RankResult(rank=r, host="node0", steps_profiled=steps, window_us=window, breakdown_us=b, phases_us={},
                      step_time_us=StepTime(p50=p50_ms * MS, mean=p50_ms * MS, max=p50_ms * MS * 1.1, n=5,
                                            p90=p50_ms * MS, profiled_p50=profiled_ms * MS),
                      device_type="cpu", transfer_us=transfer_ms * MS, wait_us=wait_ms * MS)


# -- the framework facts a run records (run["framework"]) --------------------------------------


DDP_ONE_BUCKET = {"ddp": [{"bucket_cap_mb": 25.0, "bucket_sizes_bytes": [40 * MB], "gradient_as_bucket_view": False,
                           "static_graph": False, "find_unused_parameters": False}],
                  "grad_accumulation": {"backwards_per_step": 1.0}}


def ddp(find_unused: bool = False, unused: int | None = 0, ranks: int = 2, total: int = 40 * MB) -> dict[str, Any]:
    """One DDP module's record, with its logging data and the across-ranks agreement."""
    return {"bucket_cap_mb": 25.0, "bucket_sizes_bytes": [total], "gradient_as_bucket_view": False,
            "static_graph": False, "find_unused_parameters": find_unused, "comm_hook": None,
            "logging": {"num_parameter_tensors": 256, "module_name": "Net", "iteration": 10,
                        "unused_parameter_size": unused},
            "across_ranks": {"ranks": ranks, "find_unused_parameters": ranks if find_unused else 0,
                             "unused_parameter_size_reported": ranks if unused is not None else 0,
                             "unused_parameter_size_max": unused, "iteration_min": 10}}


def facts(name: str | None, version: str | None = None, loaded: dict[str, str] | None = None,
          **extra: Any) -> dict[str, Any]:
    """A DDP job's framework facts, under the named framework (None: plain torch)."""
    fw: dict[str, Any] = {
        "ddp": [ddp()], "grad_accumulation": {"backwards_per_step": 1.0},
        "dataloaders": [{"num_workers": 0, "pin_memory": False, "persistent_workers": False, "batch_size": 32}],
        "threads": {"sched_affinity": 16}, "optimizers": [{"class": "SGD", "lr": 0.01, "initial_lr": 0.01}],
        "amp": {"autocast": {}}, "device": {"capability": "8.0"},
    }
    if name is not None:
        fw.update(name=name, version=version, loaded=loaded if loaded is not None else {})
    fw.update(extra)
    return fw


def lever_runs() -> list[Analysis]:
    """Many single-GPU runs for properties every lever finding must keep: breakdowns from
    all compute to all exposed communication, with and without input wait, crossed with
    the framework facts each rule reads (DDP with one bucket, FSDP, none; DataLoader
    workers none or all CPUs; fp32/TF32 GEMMs; small kernels; syncs; device memory),
    and profiled steps as long as the others or twice as long."""
    fws: list[dict[str, Any]] = [
        {},
        DDP_ONE_BUCKET,
        {"fsdp": {"fsdp2": {}}, "grad_accumulation": {"backwards_per_step": 1.0}},
        {"dataloaders": [{"num_workers": 16, "pin_memory": True, "persistent_workers": True, "batch_size": 8}],
         "threads": {"sched_affinity": 4}, "amp": {"autocast": {}}, "device": {"capability": "9.0"}},
        {"device": {"total_memory_bytes": 10 * GB}, "parameters": {"local_bytes": 4 * GB},
         "peak_memory_reserved_bytes_max": 2 * GB, "amp": {"autocast": {}}},
        {"device": {"total_memory_bytes": 10 * GB}, "parameters": {"local_bytes": GB},
         "peak_memory_reserved_bytes_max": 19 * GB // 2, "amp": {"autocast": {}}},
    ]
    runs = []
    for compute in (0.0, 0.05, 0.3, 0.6):
        for exposed in (0.0, 0.05, 0.12, 0.3, 0.6):
            for dataloader in (0.0, 0.06, 0.3):
                if compute + exposed + dataloader > 1:
                    continue
                for fw in fws:
                    for step_p50 in (100_000.0, 50_000.0):
                        ops = {"gemm_us": {"fp32": compute * 50_000.0, "tf32": compute * 50_000.0},
                               "compute_kernel_p50_us": 8.0, "sync_calls": 30, "item_device_reads": 2}
                        host = {"step": step_p50, "dataloader": dataloader * step_p50}
                        r = rank(0, steps=1, step_p50=step_p50, compute=compute, comm_exposed=exposed,
                                 dataloader=dataloader, ops=ops, host=host)
                        runs.append(analysis([r], fw))
    return runs


# -- findings ----------------------------------------------------------------------------------


def finding(lever: Any = "straggler", severity: Any = "medium", saving: float | None = None,
            estimate: dict[str, Any] | None = None) -> Finding:
    return Finding(lever=lever, severity=severity, title=f"{lever} {severity}", evidence=["x"], ranks=[0],
                   est_saving_pct=saving, action={}, estimate=estimate)


# -- where an estimate comes from (Finding.estimate) and the critical path ----------------------


def replay_estimate(saving: float = 12.4, share: float = 9.8, error: float = 3.1) -> dict[str, Any]:
    """A saving projected by replaying the window: one measured factor and one assumed."""
    return {"method": "replay", "saving_pct": saving, "share_saving_pct": share, "replay_error_pct": error,
            "refused": None, "edits": ["rank 1's operations set to its peers' median",
                                       "GEMMs on every rank divided by 2.3"],
            "factors": [{"name": "bf16 GEMM speed-up", "value": 2.3, "unit": "x",
                         "source": "bf16 vs fp32 GEMMs on rank 0", "measured": True},
                        {"name": "overlap of the last bucket", "value": 0.5, "unit": "",
                         "source": "", "measured": False}]}


def share_estimate(saving: float = 7.5, refused: str | None = "the replay is 14.2% off the measured step, "
                                                                    "more than the 10% allowed") -> dict[str, Any]:
    """The older share-times-constant estimate, the replay refused (or not tried: refused None)."""
    return {"method": "share", "saving_pct": saving, "share_saving_pct": saving, "replay_error_pct": None,
            "refused": refused, "edits": [], "factors": []}


def critical_path(step: int = 8, rank: int = 0) -> dict[str, Any]:
    """A 96 ms path that spent most on rank 1 (58.2 ms), in forward (38.4 ms), in all_reduce (19.2 ms)."""
    return {"step": step, "rank": rank, "path_us": 96_000.0, "by_rank_us": {"0": 37_800.0, "1": 58_200.0},
            "by_phase_us": {"forward": 38_400.0, "backward": 24_000.0, "optimizer": 4_800.0, "dataloader": 0.0,
                            "host_gap": 5_400.0, "wait": 4_200.0, "collective": 19_200.0},
            "by_collective_us": {"all_reduce": 19_200.0}, "top_rank": 1, "top_phase": "forward",
            "top_collective": "all_reduce", "replay_error_pct": 2.4}


# -- the nccl, telemetry and hang blocks ---------------------------------------------------------


def gpu_telemetry(gpu: int, *, host: str | None = "h", ranks: list[int] | None = None, samples: int = 50,
                  **figures: Any) -> GpuTelemetry:
    """A GPU's telemetry summary: every figure unknown (None) unless given."""
    unknown: dict[str, Any] = {f: None for f in GpuTelemetry.__dataclass_fields__}
    base = {**unknown, "host": host, "gpu": gpu, "uuid": f"GPU-{gpu}", "ranks": [gpu] if ranks is None else ranks,
            "samples": samples, "span_us": samples * 100_000.0, "clock_event_samples": samples,
            "busy_samples": samples, "throttle_share": {}}
    return GpuTelemetry(**{**base, **figures})


def telemetry_summary(gpus: list[GpuTelemetry], *, problems: list[str] | None = None) -> Telemetry:
    """The block as telemetry_block writes it for these GPUs (hosts and ranks derived)."""
    hosts: dict[str, list[GpuTelemetry]] = {}
    for g in gpus:
        hosts.setdefault(str(g.host), []).append(g)
    return Telemetry(
        source="nvml", status="ok" if gpus else "absent", reason=None if gpus else "no GPU telemetry in this run",
        gpus=gpus,
        hosts={h: HostTelemetry(gpus=len(gs), ranks=sorted(r for g in gs for r in g.ranks),
                                unassigned_gpus=[g.gpu for g in gs if not g.ranks], samples=sum(g.samples for g in gs),
                                util_gpu_ratio_mean=None, power_total_mean_w=None, temperature_max_c=None,
                                throttled_gpus=[], drivers=["550.54.15"]) for h, gs in sorted(hosts.items())},
        ranks={str(r): RankGpu(host=g.host, gpu=g.gpu, uuid=g.uuid) for g in gpus for r in g.ranks},
        problems=problems or [])


def nccl_summary(hosts: list[dict[str, Any]], *, hang: Hang | None = None, **kw: Any) -> NcclSummary:
    """The nccl block for these host records (the parser's shape: host, ranks, pids, versions, ...)."""
    base: dict[str, Any] = {"files": len(hosts), "processes": sum(len(h.get("pids") or [1]) for h in hosts),
                            "world_size": None, "nnodes": len(hosts), "multi_node": len(hosts) > 1,
                            "transports": {}, "init_s_max": None, "warnings": [], "errors": []}
    return NcclSummary(**{**base, **kw, "hosts": hosts, "hang": hang})


def pardiag_hang(summary: str = "rank(s) 0 timed out in a collective (recv) during step 6; rank(s) 1 never arrived",
                 message: str = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                                "5000ms for recv operation to complete") -> Hang:
    """pardiag's own diagnosis of a 2-rank gloo job whose rank 1 stopped at step 6."""
    return Hang(source="pardiag", summary=summary, step=6,
                waited=[HangWait(rank=0, op="recv", step=6, timeout_ms=5000, message=message)],
                late=[HangLate(rank=1, reason="never reached the collective: its last finished step is 5; it was "
                                              "killed or is still running", last_step=5, ended="running")],
                collect_next=["py-spy dump --pid <pid of the late rank> (where its Python is blocked)"])


def nccl_hang(summary: str = "process group 0(default_pg): ranks [0, 1, 2] timed out in ALLREDUCE SeqNum 808, "
                             "9801523 elements after 600000 ms; every reporting rank is stuck on the same collective "
                             "(no desync). ranks [3] never arrived (behind, or no timeout line).") -> Hang:
    """NCCL's diagnosis: ranks 0-2 of 4 timed out in all-reduce SeqNum 808, rank 3 never came."""
    stuck = [StuckRank(rank=r, process_group="0(default_pg)", seq=808, op_type="ALLREDUCE", numel_in=9801523,
                       numel_out=9801523, timeout_ms=600000, ran_for_ms=600020 + r, last_enqueued=811,
                       last_completed=807) for r in range(3)]
    groups = [HangGroup(process_group="0(default_pg)", seq=808, op_type="ALLREDUCE", numel_in=9801523,
                        numel_out=9801523, timeout_ms=600000, kind="collective_stuck", ranks_timed_out=[0, 1, 2],
                        ranks_behind=[], ranks_without_timeout=[3])]
    return Hang(source="nccl", summary=summary, waited=nccl_waited(stuck), late=nccl_late(groups, [3]),
                collect_next=["py-spy dump --native on ranks [3] while hung: where they are instead of the collective"],
                kind="collective_stuck", world_size=4, process_groups=groups, ranks_stuck=stuck, never_arrived=[3],
                coll_laggards=[CollLaggard(host="gpu-b", pid=4245, ranks=[3], nranks=4, last_op_count=807,
                                           behind_by=1)],
                first_error="gpu-b:4245 [3] NET/IB : Got completion from peer with status=12",
                flight_recorder=[], env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
                doc="https://pytorch.org/docs/stable/torch_nccl_environment_variables.html")


# -- every shape of run a renderer must survive, built from the dataclasses --------------------


EVIL = "</script><img src=x onerror=alert(1)>"


def rank_result(rank: int, *, host: str = "node0", step_ms: float | None = 200.0, window_ms: float = 600.0,
                steps: int = 3, comm: float = 0.1, gpu: bool = False, device: str = "cpu") -> RankResult:
    w = window_ms * 1000
    shares = {"compute": 0.7 - comm, "comm_exposed": comm, "comm_overlapped": 0.05, "memcpy": 0.02 if gpu else 0.0,
              "dataloader": 0.03, "idle": 0.0}
    shares["idle"] = 1.0 - sum(shares.values())
    phases = {"dataloader": 0.03 * w, "forward": 0.3 * w, "backward": 0.5 * w, "optimizer": 0.1 * w, "other": 0.07 * w}
    st = StepTime(p50=None, mean=None, max=None, n=0)
    if step_ms is not None:
        st = StepTime(p50=step_ms * 1000, mean=step_ms * 1010, max=step_ms * 1500, n=20, p90=step_ms * 1100,
                      steps_total=25, disturbed=1)
    g = GpuTime(span_us=0.9 * w, compute_us=0.5 * w, comm_us=0.3 * w, overlap_us=0.1 * w, memory_us=0.02 * w,
                idle_us=0.15 * w, kernel_us=0.75 * w) if gpu else None
    return RankResult(rank=rank, host=host, steps_profiled=steps, window_us=w,
                      breakdown_us={k: v * w for k, v in shares.items()}, phases_us=phases, step_time_us=st,
                      gpu=g, trace="trace.json.gz", trace_complete=True, device_type=device,
                      wait_us=comm * w * 0.5 * (rank % 3), phases_per_step_us={k: v / steps for k, v in phases.items()})


def crashed_rank(rank: int, host: str = "node0") -> RankResult:
    zero_b = dict.fromkeys(("compute", "comm_exposed", "comm_overlapped", "memcpy", "dataloader", "idle"), 0.0)
    zero_p = dict.fromkeys(("dataloader", "forward", "backward", "optimizer", "other"), 0.0)
    return RankResult(rank=rank, host=host, steps_profiled=0, window_us=0.0, breakdown_us=zero_b, phases_us=zero_p,
                      step_time_us=StepTime(p50=None, mean=None, max=None, n=0), trace=None, trace_complete=False)


def collective(op: str = "all_reduce", group: str = "0:default_pg", size: int = 2, calls: int = 3) -> Collective:
    return Collective(op=op, process_group=group, calls=calls, bytes=6_408_312, total_us=69_885.0,
                      transfer_us=23_350.0, wait_us=46_535.0, algbw_gbps=0.27, busbw_gbps=0.27,
                      group_size=size, ranks_matched=size, wait_by_rank_us={"0": 0.0, "1": 93_070.0})


def run_info(world: int, *, hosts: list[str] | None = None, backend: str = "gloo", device: str = "cpu",
             command: list[str] | None = None) -> RunInfo:
    return RunInfo(
        path="runs/exp1", world_size=world, ranks_analyzed=world, backend=backend,
        device_type=device, command=command or ["torchrun", "--nproc-per-node", str(world), "train.py"],
        launcher="torchrun", hosts=hosts if hosts is not None else ["node0"], exit_code=0,
        versions={"python": "3.11.7", "torch": "2.13.0", "cuda": None},
        profiler={"enabled": True, "record_shapes": True, "schedule": {"wait": 5, "warmup": 2, "active": 3}},
    )


FINDING = Finding(lever="ddp_bucket_size", severity="medium", title="DDP buckets are too small for this model",
                  evidence=["47 buckets of 25 MB for 1.2 GB of gradients", "all_reduce: 61% of its time waiting"],
                  ranks=[0, 1], est_saving_pct=7.5,
                  action={"code": "model = DDP(model, bucket_cap_mb=100)", "doc": "https://pytorch.org/docs/stable/ddp.html"})


NO_MANIFEST = Notice("warning", "no usable manifest (missing); the run may still be going or was killed")


def empty_run(world: int | None = None, notice: Notice = NO_MANIFEST) -> Analysis:
    """No rank at all: a run without a manifest (run={}), or one of `world` ranks where none produced a trace."""
    return Analysis(run=RunInfo(world_size=world), ranks=[], collectives=[], stragglers=[],
                    notices=[notice])


def single_rank() -> Analysis:
    return Analysis(run=run_info(1), ranks=[rank_result(0, comm=0.0)], collectives=[], stragglers=[])


def crashed() -> Analysis:
    ranks = [rank_result(r) for r in range(3)] + [crashed_rank(3)]
    return Analysis(run=run_info(4), ranks=ranks, collectives=[collective(size=4)], stragglers=[],
                    notices=[Notice("warning", "rank 3: no profiler trace (the process exited before the window)"),
                             Notice("error", "rank 3 failed at step 7: RuntimeError: CUDA error: an illegal memory access")])


def small() -> Analysis:
    """Two CPU ranks on one host, a straggler, a finding: the golden markdown."""
    return Analysis(
        run=run_info(2, hosts=["node0"]),
        ranks=[rank_result(0, comm=0.3), rank_result(1, step_ms=230.0, comm=0.1)],
        collectives=[collective()],
        stragglers=[Straggler(rank=1, excess_us_per_step=83_050.0, cause="forward",
                              evidence=["the other ranks wait 71.8 ms per step more than rank 1",
                                        "forward: +78.4 ms per step vs the median of the other ranks"])],
        process_groups=[ProcessGroup(name="0", desc="default_pg", role="data-parallel", size=2, ranks=[0, 1],
                                     ops={"all_reduce": 3}, total_us=69_885.0, wait_us=46_535.0)],
        findings=[FINDING],
        notices=[Notice("info", "rank 0: 2 steps outside the profiled window were disturbed")],
    )


def estimated() -> Analysis:
    """small(), its findings' savings with their basis (one replayed, one share-based with the
    replay refused), the what-if from one replay, and the critical path of the median step."""
    a = small()
    replayed = replace(FINDING, lever="straggler", title="rank 1 is slower than the others", est_saving_pct=12.4,
                       evidence=["forward: +78.4 ms per step vs the median of the other ranks"], action={},
                       estimate=replay_estimate())
    shared = replace(FINDING, estimate=share_estimate())
    what_if = WhatIf(step_us=215_000.0, findings=[WhatIfRow("straggler", replayed.title, 188_340.0, 12.4),
                                                  WhatIfRow("ddp_bucket_size", shared.title, 198_875.0, 7.5)],
                     all_step_us=176_300.0, all_saving_pct=18.0,
                     assumption="one replay of the profiled window with every finding's edits together",
                     method="replay", replay_error_pct=3.1)
    return replace(a, findings=[replayed, shared], what_if=what_if, critical_path=critical_path())


def gpu_run(n: int = 8) -> Analysis:
    return Analysis(
        run=run_info(n, hosts=["gpu-a", "gpu-b"], backend="nccl", device="cuda"),
        ranks=[rank_result(r, host=("gpu-a", "gpu-b")[r // 4 % 2], gpu=True, device="cuda", comm=0.05 + 0.02 * r)
               for r in range(n)],
        collectives=[collective(size=n), collective("_allgather_base", "1:tp", size=4, calls=12)],
        stragglers=[],
        findings=[FINDING, Finding(lever="nccl_env", severity="high", title="NCCL_P2P_DISABLE=1 forces copies through the host",
                                   evidence=["gpu-a:4242 NCCL INFO NCCL_P2P_DISABLE set by environment to 1"], ranks=list(range(n)),
                                   est_saving_pct=None, action={"env": {"NCCL_P2P_DISABLE": None, "NCCL_IB_HCA": "mlx5"}})],
        nccl=nccl_summary([{"host": "gpu-a", "pids": [4242], "ranks": [0, 1, 2, 3], "versions": ["2.21.5"],
                            "networks": ["IB"]},
                           {"host": "gpu-b", "pids": [4343], "ranks": [4, 5, 6, 7], "versions": ["2.21.5"],
                            "networks": ["IB"]}], world_size=n, init_s_max=3.2),
        telemetry=telemetry_summary([gpu_telemetry(r, host=("gpu-a", "gpu-b")[r // 4 % 2], samples=1200,
                                                 util_gpu_ratio_mean=0.81, throttle_share={"HW_SLOWDOWN": 0.25})
                                   for r in range(n)]),
    )


def big(n: int = 512) -> Analysis:
    hosts = [f"node{h:03d}.cluster.example.org" for h in range(n // 8)]
    ranks = [rank_result(r, host=hosts[r // 8], gpu=True, device="cuda", step_ms=200.0 + (r % 17), comm=0.05 + (r % 7) / 100)
             for r in range(n)]
    groups = [ProcessGroup(name=str(g), desc=f"tp{g}", role="tensor-parallel", size=8, ranks=list(range(8 * g, 8 * g + 8)),
                           ops={"all_reduce": 40}, total_us=1e5, wait_us=2e4) for g in range(n // 8)]
    evidence = [f"rank {r} waits least in {50 + r % 50}% of all steps" for r in range(40)]
    return Analysis(
        run=run_info(n, hosts=hosts, backend="nccl", device="cuda"),
        ranks=ranks,
        collectives=[collective(op, f"{g}:tp{g}", size=8) for g in range(n // 8) for op in ("all_reduce", "all_gather")],
        stragglers=[Straggler(rank=r, excess_us_per_step=5e3 * (r % 5 + 1), cause="dataloader", evidence=evidence)
                    for r in range(0, n, 16)],
        process_groups=groups,
        findings=[FINDING] * 40,
        notices=[Notice("warning", f"rank {r}: trace has {r} dropped events " + "x" * 300) for r in range(300)],
        nccl=nccl_summary([{"host": h, "pids": [i], "ranks": list(range(8 * i, 8 * i + 8))} for i, h in enumerate(hosts)]),
    )


def hostile() -> Analysis:
    """Untrusted text everywhere a trace, a log or a command line can put it."""
    a = small()
    r0 = rank_result(0, host=EVIL)
    return Analysis(
        run=replace(a.run, command=["python", EVIL, "--name", "a|b`c`"], hosts=[EVIL], backend=EVIL, path=EVIL,
                    versions={"torch": EVIL}),
        ranks=[r0, *a.ranks[1:]],
        collectives=[collective(op=EVIL, group=EVIL)],
        stragglers=[Straggler(rank=1, excess_us_per_step=1e4, cause=EVIL, evidence=[EVIL])],
        process_groups=[ProcessGroup(name=EVIL, desc=EVIL, role="data-parallel", size=2, ranks=[0, 1],
                                     ops={EVIL: 1}, total_us=1.0, wait_us=0.0)],
        findings=[Finding(lever="nccl_env", severity="high", title=EVIL, evidence=[EVIL], ranks=[0],
                          est_saving_pct=None, action={"code": EVIL, "env": {"NCCL_X": EVIL}, "doc": "javascript:alert(1)"}),
                  Finding(lever="straggler", severity="medium", title="slow rank", evidence=[], ranks=[1],
                          est_saving_pct=5.0, action={},
                          estimate={**replay_estimate(), "edits": [EVIL],
                                    "factors": [{"name": EVIL, "value": 2.0, "unit": EVIL, "source": EVIL, "measured": True}]}),
                  Finding(lever="sync_points", severity="low", title="syncs", evidence=[], ranks=[0],
                          est_saving_pct=2.0, action={}, estimate=share_estimate(2.0, refused=EVIL))],
        critical_path={**critical_path(), "by_collective_us": {EVIL: 19_200.0}, "top_collective": EVIL,
                       "by_phase_us": {EVIL: 96_000.0}, "top_phase": EVIL},
        notices=[Notice("error", EVIL)],
        nccl=nccl_summary([{"host": EVIL, EVIL: EVIL, "versions": [EVIL]}], warnings=[EVIL], errors=[EVIL],
                          hang=nccl_hang(summary=EVIL)),
        telemetry=telemetry_summary([gpu_telemetry(0, host=EVIL, name=EVIL)], problems=[EVIL]),
        hang=pardiag_hang(summary=EVIL, message=EVIL),
    )


CASES: dict[str, Callable[[], Analysis]] = {
    "empty": empty_run, "single": single_rank, "crashed": crashed, "cpu": small, "gpu": gpu_run, "512": big,
    "estimated": estimated,
}

def slow_rank_job(n: int = 512, slow: int = 300) -> Analysis:
    """n ranks on n/8 hosts; rank `slow` does 40 ms more forward work per step."""
    rng = random.Random(7)
    ranks = []
    for i in range(n):
        step = 100_000 + rng.random() * 5_000 + (40_000 if i == slow else 0)
        wait = 2_000 if i == slow else 40_000 + rng.random() * 3_000
        shares = {"compute": step - wait - 12_000, "comm_exposed": wait + 4_000, "comm_overlapped": 3_000,
                  "memcpy": 1_000, "dataloader": 2_000, "idle": 2_000}
        ranks.append(RankResult(
            rank=i, host=f"node{i // 8:03d}", steps_profiled=3, window_us=3 * step,
            breakdown_us={k: 3 * v for k, v in shares.items()},
            phases_us={"dataloader": 6_000, "forward": 3 * step * 0.3, "backward": 3 * step * 0.5,
                       "optimizer": 3 * step * 0.15, "other": 0.0},
            step_time_us=StepTime(p50=step, mean=step * 1.01, max=step * 1.3, n=20, p90=step * 1.1, steps_total=25),
            wait_us=3 * wait, transfer_us=3 * 4_000, device_type="cuda",
        ))
    collectives = [
        Collective(op=op, process_group=pg, calls=calls, bytes=size, total_us=total, transfer_us=total * 0.3,
                   wait_us=total * 0.7, algbw_gbps=80.0, busbw_gbps=150.0, group_size=n, ranks_matched=n,
                   wait_by_rank_us={str(i): (500.0 if i == slow else total * 0.7 * (0.8 + 0.4 * rng.random()))
                                    for i in range(n)})
        for op, pg, calls, size, total in (("all_reduce", "0:default_pg", 30, 400_000_000, 90_000.0),
                                          ("all_gather", "1:tp", 60, 50_000_000, 20_000.0),
                                          ("reduce_scatter", "1:tp", 60, 50_000_000, 18_000.0),
                                          ("broadcast", "0:default_pg", 2, 4_000_000, 900.0))
    ]
    return Analysis(
        run=RunInfo(world_size=n, backend="nccl", device_type="cuda", hosts=[f"node{h:03d}" for h in range(n // 8)],
                    path="synthetic-512"),
        ranks=ranks, collectives=collectives,
        stragglers=[Straggler(slow, 40_000.0, "forward", ["the other ranks wait 39 ms per step more"], 39_000.0)],
        findings=[Finding("straggler", "high", f"rank {slow} is 40 ms per step slower (forward)",
                          ["the other ranks wait 39 ms per step more"], [slow], 28.0,
                          {"code": "# check rank 300: nvidia-smi -q -d CLOCK,PERFORMANCE"})],
    )


SHAPES: dict[str, Callable[[], Analysis]] = {
    "empty": empty_run, "single": single_rank, "crashed": crashed, "cpu": small, "gpu": gpu_run, "512": big,
    "estimated": estimated,
}


# -- a node's run directory --------------------------------------------------------------------


def jsonl_evidence(recs: dict[int, list[Any]]) -> dict[int, Any]:
    """The straggler test's evidence from step records alone (no profiled window)."""
    from pardiag.analyzers.stragglers import RankEvidence

    return {r: RankEvidence(rank=r, steps_in_window=0, wait_us=0.0, phases_us={}, step_records=rs)
            for r, rs in recs.items()}


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(rundir.encode_line(r) for r in records))


def telemetry(host: str, gpu: int, uuid: str) -> list[dict[str, Any]]:
    header = rundir.telemetry_header(host, 1_000, 0.1, "550.54", [{"gpu": gpu, "uuid": uuid, "name": "H100"}])
    return [header, {"t_ns": 2_000, "gpu": gpu, "uuid": uuid, "util_gpu_pct": 90}]


def node_run(root: Path, host: str, pid: int, rank: int, complete: bool) -> RunDir:
    """A node's run directory with a file of every kind a run writes, through RunDir's paths."""
    run = RunDir(root)
    manifest.write_launcher_record(run, {"host": host, "pid": pid, "job_key": "job-1", "status": "ended",
                                         "started": 1.0, "ended": 2.0, "exit_code": 0})
    rundir.atomic_write_json(run.meta(rank), {"format": rundir.META_FORMAT, "format_version": rundir.META_VERSION,
                                              "host": host, "pid": pid, "rank": rank, "world_size": 2,
                                              "exit": {"status": "ok"}})
    steps = rundir.StepsWriter(run.steps(rank))
    steps.write({"step": 0, "start_ns": 1, "end_ns": 2})
    steps.close()
    trace = (run.trace(rank) if complete else run.partial_trace(rank)).with_suffix(".json.gz")
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": [], "distributedInfo": {"rank": rank}}, f)
    rundir.write_summary(run, rank, trace, {"result": {}, "gpu": None, "base_time_ns": None})
    write_lines(run.telemetry(rank), telemetry(host, 0, f"GPU-{rank}"))
    write_lines(run.host_telemetry(host), telemetry(host, 1, f"GPU-{rank}-unused"))
    run.host_telemetry_lock(host).touch()
    run.nccl_dir.mkdir()
    (run.nccl_dir / f"{host}.{pid}.log").write_text(f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap\n")
    run.flight_dir.mkdir()
    Path(f"{run.flight_prefix()}{rank}").write_bytes(b"\x80\x04flight")
    run.bootstrap_errors_dir.mkdir(parents=True)
    run.stream_log(host, pid, "stdout").write_text("loss 1.0\n")
    run.stream_log(host, pid, "stderr").write_text("")
    run.bootstrap_error(host, pid).write_text("collector failed to install\n")
    if rank == 0:  # the node of the lowest rank measures the factors
        run.factors_dir.mkdir()
        rundir.atomic_write_json(run.gemm_factor, {"format": "pardiag.gemm-factor", "format_version": 1,
                                                   "status": "skipped", "reason": "the trace has no shapes"})
    manifest.write(run)
    rundir.atomic_write_json(run.analysis, {"schema": "pardiag.analysis"})
    run.report.write_text("<html></html>")
    return run


# -- the TUI, read as the terminal shows it ------------------------------------------------------


def screen_text(app: PardiagApp) -> str:
    """What the terminal shows now, as plain text (as App.export_screenshot renders it)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                      color_system="truecolor", legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def settle(pilot) -> None:
    """Let the app handle what the last keys caused (mounts, layout, messages)."""
    await pilot.pause()
