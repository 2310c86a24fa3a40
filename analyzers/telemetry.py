"""GPU telemetry (NVML samples): per-GPU and per-host summaries, and `gpu_health` findings.

Samples come from ``ranks/<rank>/telemetry.jsonl`` (GPUs matched to ranks after the
job) and ``telemetry/<host>.jsonl`` (GPUs no rank was matched to); the format is
described in :mod:`pardiag.rundir`. A GPU shared by several ranks is counted
once. Units in the block: ratios 0..1, bytes, MHz, W, °C, GB/s (10^9 bytes/s), µs.
NVML's PCIe figures are KB/s, taken as 1,000 bytes; its NVLink counters are KiB.

The ``gpu_health`` rules (:func:`throttling`, :func:`slow_peer`, :func:`memory_headroom`)
are rows of the one registry (``analyzers.rules.RULES``), run once per judged GPU
(``ctx.gpu``, compared with ``ctx.gpu_peers``; see :func:`judged_gpus`) with the
stragglers at hand; each returns its finding about that GPU, or none.
Thresholds:

- ``THROTTLE_MIN_SHARE`` (5%): a GPU whose clocks were held down by a thermal or power
  reason (``SLOWDOWN_REASONS``) in at least this share of its busy samples
  (utilisation > 0: the idle start and end of a job do not dilute it) gets a finding;
  high severity from ``THROTTLE_HIGH_SHARE`` (25%) when a thermal or hardware
  slowdown is among the reasons, medium below that, low when the only reason is the
  software power cap (normal under full load).
- ``PEER_DEFICIT`` (10%): a GPU whose mean SM clock while busy, or whose mean
  utilisation, is more than this far below the median of the other GPUs of the job
  (at least two GPUs matched to ranks).

Only the job's GPUs (those matched to a rank) are judged when any GPU was matched;
otherwise every sampled GPU is.
- ``HEADROOM_MIN_RATIO`` (5%): peak memory used within 5% of the GPU's total is an
  out-of-memory risk. NVML counts what PyTorch's caching allocator reserves, so this
  is the memory the process held, not what its tensors needed.
- ``MIN_SAMPLES`` (5): fewer (busy) samples of a GPU say nothing.

``est_saving_pct`` is an upper bound for a job whose kernels are bound by the SM clock:
throttling: share of throttled samples × (1 − mean clock while throttled / max clock);
a slow GPU: its clock deficit to its peers × its busy share. None where the telemetry
cannot tell (utilisation deficits, memory).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from pardiag import rundir
from pardiag.analysis import Finding, Severity
from pardiag.analysis_blocks import GpuTelemetry, HostTelemetry, RankGpu, Telemetry
from pardiag.rundir import RunDir, RunDirError, normalise_uuid, read_telemetry

if TYPE_CHECKING:  # the registry imports this module
    from pardiag.analyzers.rules import RuleContext

THROTTLE_MIN_SHARE = 0.05
THROTTLE_HIGH_SHARE = 0.25
PEER_DEFICIT = 0.10
HEADROOM_MIN_RATIO = 0.05
MIN_SAMPLES = 5
MAX_PROBLEMS = 20

CLOCK_EVENTS_DOC = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html"
NVIDIA_SMI_DOC = "https://docs.nvidia.com/deploy/nvidia-smi/index.html"
CUDA_MEMORY_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
TUNING_DOC = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"

# NVML clock event (throttle) reason bits, nvmlClocksEventReason* / nvmlClocksThrottleReason*
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})
HARDWARE_REASONS = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
SLOWDOWN_REASONS = THERMAL_REASONS | POWER_REASONS | HARDWARE_REASONS


def decode_clock_events(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clock event bitmask; unknown bits as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"bit_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


# --------------------------------------------------------------------------- loading


@dataclass
class _GpuSamples:
    host: str | None
    gpu: int
    uuid: str | None
    name: str | None
    ranks: set[int] = field(default_factory=set)
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Loaded:
    gpus: dict[str, _GpuSamples] = field(default_factory=dict)
    drivers: dict[str, set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _key(host: str | None, gpu: int, uuid: str | None) -> str:
    return normalise_uuid(uuid) or f"{host}#{gpu}"


def _add_file(loaded: _Loaded, path: Path, host: str | None, rank: int | None, run: RunDir) -> None:
    try:
        tf = read_telemetry(path)
    except (OSError, RunDirError) as e:
        loaded.problems.append(f"{path.relative_to(run.root)}: {e}")
        return
    if tf.dropped:
        loaded.problems.append(f"{path.relative_to(run.root)}: {tf.dropped} unreadable line(s) skipped")
    names: dict[int, str | None] = {}
    for h in tf.headers:
        host = h.get("host") or host
        if h.get("driver"):
            loaded.drivers.setdefault(str(host), set()).add(str(h["driver"]))
        names.update({g["gpu"]: g.get("name") for g in h.get("gpus", []) if isinstance(g.get("gpu"), int)})
    seen_here: set[str] = set()
    for s in tf.samples:
        key = _key(host, s["gpu"], s.get("uuid"))
        entry = loaded.gpus.get(key)
        if entry is None:
            entry = loaded.gpus[key] = _GpuSamples(host, s["gpu"], s.get("uuid"), names.get(s["gpu"]))
        elif key not in seen_here and entry.samples:
            # this GPU's samples were already taken from another file (a shared GPU,
            # or a host file left behind by an interrupted split)
            if rank is not None:
                entry.ranks.add(rank)
            continue
        seen_here.add(key)
        if rank is not None:
            entry.ranks.add(rank)
        entry.samples.append(s)


def _load(run: RunDir) -> _Loaded:
    loaded = _Loaded()
    for r in run.ranks():
        path = run.telemetry(r)
        if path.is_file():
            _add_file(loaded, path, _meta_host(run, r), r, run)
    for path in run.host_telemetry_files():
        _add_file(loaded, path, path.stem, None, run)
    for g in loaded.gpus.values():
        g.samples.sort(key=lambda s: s["t_ns"])
    return loaded


def _meta_host(run: RunDir, rank: int) -> str | None:
    try:
        return rundir.read_meta(run, rank).host
    except RunDirError:
        return None


# --------------------------------------------------------------------------- statistics


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _vals(samples: Iterable[dict[str, Any]], key: str, scale: float | None = None) -> list[float]:
    """Numeric values of `key` (ints stay ints: bytes, MHz), times `scale` if given."""
    if scale is None:
        return [s[key] for s in samples if _num(s.get(key))]
    return [s[key] * scale for s in samples if _num(s.get(key))]


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _p50(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _counter_gbps(samples: Sequence[dict[str, Any]], key: str) -> float | None:
    """Mean rate of a cumulative KiB counter, over the intervals it grew in."""
    pts = [(s["t_ns"], s[key]) for s in samples if _num(s.get(key))]
    nbytes = 0
    ns = 0
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t1 > t0 and v1 >= v0:  # a counter reset is left out
            nbytes += (v1 - v0) * 1024
            ns += t1 - t0
    return nbytes / ns if ns else None  # bytes per ns = GB/s


def _busy(s: dict[str, Any]) -> bool:
    u = s.get("util_gpu_pct")
    return u > 0 if isinstance(u, (int, float)) else True


def _throttle(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Reasons seen, as shares of the samples that have them; the slowdown share counts
    busy samples only (utilisation > 0), so that an idle start or end of the job
    does not dilute it."""
    with_events = [(s, decode_clock_events(int(s["clock_events"]))) for s in samples if _num(s.get("clock_events"))]
    counts: dict[str, int] = {}
    for _, names in with_events:
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    busy = [(s, names) for s, names in with_events if _busy(s)]
    slow = [s for s, names in busy if SLOWDOWN_REASONS.intersection(names)]
    n = len(with_events)
    return {
        "clock_event_samples": n,
        "busy_samples": len(busy),
        "throttle_share": {k: counts[k] / n for k in sorted(counts)} if n else {},
        "slowdown_share": len(slow) / len(busy) if busy else None,
        "sm_clock_slowdown_mean_mhz": _mean(_vals(slow, "sm_clock_mhz")),
    }


def _gpu_summary(g: _GpuSamples) -> GpuTelemetry:
    s = g.samples
    util = _vals(s, "util_gpu_pct", 0.01)
    clock = _vals(s, "sm_clock_mhz")
    busy_clock = _vals([x for x in s if _busy(x)], "sm_clock_mhz")
    clock_max = max(_vals(s, "sm_clock_max_mhz"), default=None)
    power = _vals(s, "power_mw", 1e-3)
    limit = max(_vals(s, "power_limit_mw", 1e-3), default=None)
    temp = _vals(s, "temp_c")
    used_max = max(_vals(s, "mem_used_bytes"), default=None)
    total = max(_vals(s, "mem_total_bytes"), default=None)
    headroom = total - used_max if total is not None and used_max is not None else None
    out: dict[str, Any] = {
        "host": g.host, "gpu": g.gpu, "uuid": g.uuid, "name": g.name, "ranks": sorted(g.ranks),
        "samples": len(s), "span_us": (s[-1]["t_ns"] - s[0]["t_ns"]) / 1e3 if s else 0.0,
        "util_gpu_ratio_mean": _mean(util), "util_gpu_ratio_p50": _p50(util),
        "util_mem_ratio_mean": _mean(_vals(s, "util_mem_pct", 0.01)),
        "sm_clock_mean_mhz": _mean(clock), "sm_clock_busy_mean_mhz": _mean(busy_clock),
        "sm_clock_min_mhz": min(clock, default=None), "sm_clock_max_mhz": clock_max,
        "sm_clock_ratio": _ratio(_mean(clock), clock_max),
        "power_mean_w": _mean(power), "power_max_w": max(power, default=None), "power_limit_w": limit,
        "power_ratio": _ratio(_mean(power), limit),
        "temperature_max_c": max(temp, default=None), "temperature_mean_c": _mean(temp),
        "memory_used_max_bytes": used_max, "memory_total_bytes": total,
        "memory_headroom_bytes": headroom, "memory_headroom_ratio": _ratio(headroom, total),
        "pcie_tx_mean_gbps": _mean(_vals(s, "pcie_tx_kBps", 1e-6)),
        "pcie_rx_mean_gbps": _mean(_vals(s, "pcie_rx_kBps", 1e-6)),
        "nvlink_tx_mean_gbps": _counter_gbps(s, "nvlink_tx_kib"),
        "nvlink_rx_mean_gbps": _counter_gbps(s, "nvlink_rx_kib"),
    }
    out.update(_throttle(s))
    return GpuTelemetry(**out)


def _host_summary(gpus: list[GpuTelemetry], drivers: set[str]) -> HostTelemetry:
    def present(values: Iterable[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    power = present(g.power_mean_w for g in gpus)
    return HostTelemetry(
        gpus=len(gpus),
        ranks=sorted(r for g in gpus for r in g.ranks),
        unassigned_gpus=[g.gpu for g in gpus if not g.ranks],
        samples=sum(g.samples for g in gpus),
        util_gpu_ratio_mean=_mean(present(g.util_gpu_ratio_mean for g in gpus)),
        power_total_mean_w=sum(power) if power else None,
        temperature_max_c=max(present(g.temperature_max_c for g in gpus), default=None),
        throttled_gpus=[g.gpu for g in gpus if (g.slowdown_share or 0) >= THROTTLE_MIN_SHARE],
        drivers=sorted(drivers),
    )


def _absent_reason(run: RunDir) -> str:
    try:
        st = rundir.read_manifest(run).get("collectors", {}).get("telemetry") or {}
    except RunDirError:
        st = {}
    reason = st.get("reason") if isinstance(st, dict) else None
    return f"no GPU telemetry in this run ({reason})" if reason else "no GPU telemetry in this run"


def telemetry_block(run: RunDir) -> Telemetry:
    """The `telemetry` block of the Analysis (`pardiag.analysis_blocks.Telemetry`): status
    "ok" or "absent" with the reason, a summary per GPU and per host, each rank's GPU, and
    the problems met reading the files. Never raises on missing or torn files."""
    loaded = _load(run)
    gpus = [_gpu_summary(g) for g in loaded.gpus.values() if g.samples]
    gpus.sort(key=lambda g: (str(g.host), g.gpu))
    hosts: dict[str, list[GpuTelemetry]] = {}
    for g in gpus:
        hosts.setdefault(str(g.host), []).append(g)
    ranks = {str(r): RankGpu(host=g.host, gpu=g.gpu, uuid=g.uuid) for g in gpus for r in g.ranks}
    return Telemetry(
        source="nvml",
        status="ok" if gpus else "absent",
        reason=None if gpus else _absent_reason(run),
        gpus=gpus,
        hosts={h: _host_summary(gs, loaded.drivers.get(h, set())) for h, gs in sorted(hosts.items())},
        ranks=dict(sorted(ranks.items(), key=lambda kv: int(kv[0]))),
        problems=loaded.problems[:MAX_PROBLEMS],
    )


# --------------------------------------------------------------------------- findings


def _who(g: GpuTelemetry) -> str:
    ranks = g.ranks
    who = f"GPU {g.gpu} on {g.host or '?'}"
    if ranks:
        who += f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
    return who


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _finding(severity: Severity, title: str, evidence: list[str], ranks: Iterable[int],
             est: float | None, action: dict[str, Any]) -> Finding:
    return Finding(lever="gpu_health", severity=severity, title=title, evidence=evidence,
                   ranks=sorted(set(ranks)), est_saving_pct=est, action=action)


def _straggler_note(g: GpuTelemetry, stragglers: Sequence[int]) -> list[int]:
    return sorted(set(g.ranks) & set(stragglers))


def _throttling(g: GpuTelemetry, peers: Sequence[GpuTelemetry], stragglers: Sequence[int]) -> list[Finding]:
    """Clocks held down by a thermal or power reason in >= THROTTLE_MIN_SHARE of samples."""
    share = g.slowdown_share
    if g.busy_samples < MIN_SAMPLES or share is None or share < THROTTLE_MIN_SHARE:
        return []
    seen = {k: v for k, v in g.throttle_share.items() if k in SLOWDOWN_REASONS}
    names = sorted(seen, key=lambda k: (-seen[k], k))
    serious = bool(THERMAL_REASONS.union(HARDWARE_REASONS).intersection(seen))
    severity: Severity = ("high" if share >= THROTTLE_HIGH_SHARE else "medium") if serious else "low"
    evidence = [f"{k} in {_pct(seen[k])} of {g.clock_event_samples} samples" for k in names]
    evidence.append(f"clocks held down in {_pct(share)} of the {g.busy_samples} samples in which the GPU was busy")
    est = None
    clock, cmax = g.sm_clock_slowdown_mean_mhz, g.sm_clock_max_mhz
    if clock is not None and cmax:
        evidence.append(f"SM clock while throttled {clock:.0f} MHz of {cmax:.0f} MHz max")
        est = 100 * share * max(0.0, 1 - clock / cmax)
    if g.temperature_max_c is not None:
        evidence.append(f"temperature max {g.temperature_max_c:.0f} °C")
    if g.power_mean_w is not None and g.power_limit_w:
        evidence.append(f"power mean {g.power_mean_w:.0f} W of {g.power_limit_w:.0f} W limit")
    linked = _straggler_note(g, stragglers)
    if linked:
        evidence.append(f"rank {', '.join(map(str, linked))} is the straggler: the others wait for this GPU")
    kind = "thermally" if THERMAL_REASONS.intersection(seen) else "power" if not serious else "hardware"
    title = f"{_who(g)} is {kind} throttled ({', '.join(names)}) in {_pct(share)} of busy samples"
    what = ("check cooling and airflow of this GPU" if serious
            else "the GPU runs at its power limit; a higher limit (nvidia-smi -pl) or fewer GPUs per power domain helps")
    code = f"# {what}\nnvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {g.gpu}"
    return [_finding(severity, title, evidence, g.ranks, est, {"code": code, "doc": CLOCK_EVENTS_DOC})]


def _deficit(value: float | None, others: list[float]) -> tuple[float, float] | None:
    """(deficit ratio, peers' median) when value is more than PEER_DEFICIT below the median."""
    if value is None or not others:
        return None
    median = float(statistics.median(others))
    if median <= 0:
        return None
    d = 1 - value / median
    return (d, median) if d > PEER_DEFICIT else None


def _clock(g: GpuTelemetry) -> float | None:
    busy = g.sm_clock_busy_mean_mhz
    return busy if busy is not None else g.sm_clock_mean_mhz


def _slow_peer(g: GpuTelemetry, peers: Sequence[GpuTelemetry], stragglers: Sequence[int]) -> list[Finding]:
    """Mean SM clock (while busy) or mean utilisation > PEER_DEFICIT below the other
    GPUs' median."""
    others = [p for p in peers if p is not g]
    if not any(p is g for p in peers) or not others or g.samples < MIN_SAMPLES:
        return []
    clock = _deficit(_clock(g), [c for c in map(_clock, others) if c is not None])
    util = _deficit(g.util_gpu_ratio_mean, [u for p in others if (u := p.util_gpu_ratio_mean) is not None])
    if clock is None and util is None:
        return []
    evidence, parts, est = [], [], None
    if clock is not None:
        d, median = clock
        parts.append(f"SM clock {_pct(d)} lower")
        evidence.append(f"SM clock while busy {_clock(g) or 0:.0f} MHz vs peers' median {median:.0f} MHz (-{_pct(d)})")
        busy = g.util_gpu_ratio_mean
        est = 100 * d * busy if busy is not None else None
    if util is not None:
        d, median = util
        parts.append(f"utilisation {_pct(d)} lower")
        evidence.append(f"utilisation {_pct(g.util_gpu_ratio_mean or 0.0)} vs peers' median {_pct(median)} (-{_pct(d)})")
    linked = _straggler_note(g, stragglers)
    title = f"{_who(g)}: {' and '.join(parts)} than the other GPUs"
    if linked:
        title += f"; rank {', '.join(map(str, linked))} is the straggler"
        evidence.append("the step-time analysis found this rank to be the straggler: this GPU explains it")
    severity: Severity = "high" if linked else "medium" if clock is not None else "low"
    if clock is not None:
        action = {"code": f"# compare clocks and limits with the other GPUs\nnvidia-smi -q -d CLOCK,PERFORMANCE -i {g.gpu}",
                  "doc": CLOCK_EVENTS_DOC}
    else:
        action = {"code": "# the GPU waits for its host: profile this rank's input pipeline and host work",
                  "doc": TUNING_DOC}
    return [_finding(severity, title, evidence, g.ranks, est if clock is not None else None, action)]


def _memory_headroom(g: GpuTelemetry, peers: Sequence[GpuTelemetry], stragglers: Sequence[int]) -> list[Finding]:
    """Peak memory used within HEADROOM_MIN_RATIO of the GPU's total."""
    ratio = g.memory_headroom_ratio
    if ratio is None or ratio >= HEADROOM_MIN_RATIO:
        return []
    gib = 1024 ** 3
    evidence = [
        f"memory used max {(g.memory_used_max_bytes or 0) / gib:.2f} GiB of {(g.memory_total_bytes or 0) / gib:.2f} GiB",
        f"headroom {(g.memory_headroom_bytes or 0) / 2**20:.0f} MiB ({_pct(ratio)})",
        "NVML counts what PyTorch's caching allocator reserves, not only live tensors",
    ]
    action = {
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "code": "# less activation memory: a smaller micro-batch with gradient accumulation, or\n"
                "# torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
        "doc": CUDA_MEMORY_DOC,
    }
    title = f"{_who(g)} ran with {_pct(ratio)} memory headroom: risk of out-of-memory"
    return [_finding("medium", title, evidence, g.ranks, None, action)]


def judged_gpus(block: Telemetry | None) -> tuple[list[GpuTelemetry], list[GpuTelemetry]]:
    """(the GPUs judged, the peers they are compared with): the job's GPUs (those matched
    to a rank) when any was matched, else every sampled GPU; peers only when at least two
    GPUs of the job have enough samples."""
    gpus = [g for g in (block.gpus if block is not None else []) if g.samples >= 1]
    if any(g.ranks for g in gpus):  # GPUs no rank used are not the job's business
        gpus = [g for g in gpus if g.ranks]
    peers = [g for g in gpus if g.ranks and g.samples >= MIN_SAMPLES]
    return gpus, peers if len(peers) >= 2 else []


# Per-GPU rules: the registry runs them once per judged GPU (`ctx.gpu`; None: no GPU).


def throttling(ctx: RuleContext) -> list[Finding]:
    """The GPU's clocks held down by a thermal or power reason (see `_throttling`)."""
    return _throttling(ctx.gpu, ctx.gpu_peers, ctx.straggler_ranks) if ctx.gpu is not None else []


def slow_peer(ctx: RuleContext) -> list[Finding]:
    """The GPU slower or less used than the job's other GPUs (see `_slow_peer`)."""
    return _slow_peer(ctx.gpu, ctx.gpu_peers, ctx.straggler_ranks) if ctx.gpu is not None else []


def memory_headroom(ctx: RuleContext) -> list[Finding]:
    """The GPU ran close to the end of its memory (see `_memory_headroom`)."""
    return _memory_headroom(ctx.gpu, ctx.gpu_peers, ctx.straggler_ranks) if ctx.gpu is not None else []
