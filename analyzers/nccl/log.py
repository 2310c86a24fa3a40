"""NCCL debug logs (``NCCL_DEBUG=INFO``) and the PyTorch watchdog lines next to them.

``parse_nccl_log`` reads one file (or lines) into an :class:`NcclLog`; ``parse_nccl_logs``
reads many per-process files (a run directory's NCCL folder) and merges them per host
into an :class:`NcclReport`. Line formats follow ``reference/nccl/formats.md``
(NCCL 2.4 - 2.30 and RCCL); the section numbers below (``§N``) refer to it.

How a line is read:

1. Wrapper prefixes are stripped (§1.2): Ray ``(RayTrainWorker pid=…, ip=…)``,
   log-shipper ISO timestamps, launcher rank labels (``[rank3]:``, ``0:``,
   ``[1,0]<stdout>:``, ``[3] host:…``), ANSI colour codes and their remnants,
   Ray's ``[repeated Nx across cluster]``, markdown quotes and backticks. The Ray
   worker or rank label is kept as the line's tag.
2. The NCCL prefix ``host:pid:tid [dev] NCCL INFO|WARN`` (§1.1) names the process; it
   is also found after text no wrapper rule knows (other launchers, logging
   frameworks), and ``host:pid:tid`` may be missing (``[0] NCCL INFO …``) or have an
   empty host. Without ``host:pid`` the tag keeps processes apart. The message is
   matched against :data:`MESSAGE_RULES`, a table of compiled patterns, first match wins.
3. Lines without the NCCL prefix are bare version lines (§2), RCCL's banner (its
   first line may carry the prefix, the rest never do) or PyTorch
   ``ProcessGroupNCCL`` lines (§14): watchdog timeouts, watchdog progress, flight
   recorder mentions, NCCL errors surfaced as exceptions. A bare version line or
   banner belongs to the process its tag names, else to the process whose line came
   just before (NCCL prints it right after that process's own lines), else to the
   banner's ``Hostname``; every version statement is kept in ``version_lines``.

Content never raises: undecodable bytes are replaced, unknown lines are counted.
Results are frozen dataclasses; ``to_dict()`` gives plain JSON-ready data.
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

LogInput = Union[str, bytes, "os.PathLike[str]", Iterable[Union[str, bytes]]]
MAX_LINE_CHARS = 8192
RECENT_CALLS = 256  # COLL lines kept per process (the count of all of them is kept too)
MAX_WARNINGS = 500


class _Json:
    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


def _as_dict(obj: Any) -> dict[str, Any]:
    return asdict(obj)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class NcclVersion(_Json):
    version: str  # "2.19.3" (plus suffix such as "a0" when NCCL printed one)
    cuda: str | None  # CUDA major.minor NCCL was built with


@dataclass(frozen=True)
class Interface(_Json):
    name: str  # "eth0", "lo", "bond0"
    address: str  # "10.0.0.1<0>"
    index: int | None = None  # "[0]" in indexed lists


@dataclass(frozen=True)
class NetDevice(_Json):
    index: int
    name: str  # "mlx5_0", merged devices "mlx5_0+mlx5_1"
    port: int | None
    link: str  # "IB", "RoCE", "IB/SHARP"


@dataclass(frozen=True)
class CommInit(_Json):
    phase: str  # START | COMPLETE
    comm: str
    rank: int
    nranks: int
    cuda_dev: int
    nvml_dev: int | None
    bus_id: str | None
    comm_id: str | None
    api: str | None  # ncclCommInitRank, ncclCommSplit, ... (2.21+)


@dataclass(frozen=True)
class CommShape(_Json):
    comm: str
    rank: int
    nranks: int
    nnodes: int
    local_ranks: int
    local_rank: int


@dataclass(frozen=True)
class Ring(_Json):
    channel: int
    nchannels: int
    ranks: tuple[int, ...]
    truncated: bool


@dataclass(frozen=True)
class Connection(_Json):
    channel: int
    conn_index: int | None
    src_rank: int
    dst_rank: int
    src_dev: str | None  # PCI busId (hex, <= 2.18.1) or nvmlDev index (2.18.3+)
    dst_dev: str | None
    direction: str | None  # send | receive | None (P2P/SHM lines)
    via: str  # "P2P/CUMEM", "SHM/direct/direct", "NET/IB/0/GDRDMA"
    transport: str  # P2P | SHM | NET | CollNet | NVLS
    net: str | None  # network name for NET connections ("IB", "Socket", plugin)
    net_dev: int | None
    gdr: bool
    legacy_ring: bool  # "Ring NN :" prefix (NCCL <= 2.6)
    message: str

    @property
    def own_rank(self) -> int:
        return self.dst_rank if self.direction == "receive" else self.src_rank


@dataclass(frozen=True)
class GraphPattern(_Json):
    pattern: int
    cross_nic: int
    nchannels: int
    bw_intra_gbps: float  # GB/s per channel as NCCL's search estimated it
    bw_inter_gbps: float
    type_intra: str
    type_inter: str


@dataclass(frozen=True)
class TuningChoice(_Json):
    coll: str | None
    size_bytes: int
    algo: str
    proto: str


@dataclass(frozen=True)
class PhaseTimings(_Json):
    api: str | None
    rank: int | None
    nranks: int | None
    total_s: float
    phases_s: dict[str, float]
    message: str


@dataclass(frozen=True)
class Connected(_Json):
    what: str  # rings | trees
    pxn: int | None
    gdr: int | None


@dataclass(frozen=True)
class CollCall(_Json):
    func: str
    op_count: int
    count: int
    datatype: int
    dtype: str | None
    size_bytes: int | None
    op: int
    root: int
    comm: str
    nranks: int
    in_place: bool


@dataclass(frozen=True)
class NcclWarning(_Json):
    location: str | None  # NCCL source file:line
    func: str | None  # 2.30+
    message: str
    meaning: str | None
    benign: bool
    timestamp: str | None


@dataclass(frozen=True)
class ErrorStep(_Json):
    location: str
    code: int
    thread: str | None


@dataclass(frozen=True)
class ErrorChain(_Json):
    warning: str | None  # the WARN that started the chain
    steps: tuple[ErrorStep, ...]
    result: int
    result_name: str
    meaning: str


@dataclass(frozen=True)
class WatchdogTimeout(_Json):
    rank: int | None
    seq: int | None
    op_type: str | None
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int
    pg_id: str | None
    pg_guid: str | None
    pg_desc: str | None
    message: str

    @property
    def process_group(self) -> str:
        return _pg_name(self.pg_id, self.pg_guid, self.pg_desc)


@dataclass(frozen=True)
class WatchdogProgress(_Json):
    rank: int
    pg_id: str | None
    pg_guid: str | None
    pg_desc: str | None
    work: int
    last_enqueued: int
    last_completed: int


@dataclass(frozen=True)
class FrameworkError(_Json):
    name: str  # ncclSystemError, ncclRemoteError, ...
    meaning: str
    rank: int | None
    message: str


def _pg_name(pg_id: str | None, guid: str | None, desc: str | None) -> str:
    name = guid if guid is not None else pg_id
    if name is None:
        return "?"
    return f"{name}({desc})" if desc else name


@dataclass(frozen=True)
class NcclProcess(_Json):
    """Everything one process (``host:pid``) said."""

    host: str | None
    pid: int | None
    devices: tuple[int, ...]  # [cudaDev] values seen, in order of appearance
    lines: int
    version: NcclVersion | None
    rccl_version: str | None
    cuda_driver_version: int | None  # 12040 = CUDA 12.4 driver
    env: dict[str, str]
    comm_config: dict[str, str]
    bootstrap: tuple[Interface, ...]
    socket_interfaces: tuple[Interface, ...]
    ib_devices: tuple[NetDevice, ...]
    ib_oob: Interface | None
    ib_relaxed_ordering: bool
    ib_no_device: bool
    network: str | None  # "Using network X" (§4.4), else the net named in NET transport lines
    network_inferred: bool  # True when no "Using network" line was seen
    plugins: tuple[str, ...]  # plugin load messages
    gdr_notes: tuple[str, ...]  # "GPU Direct RDMA Enabled/Disabled ..." lines
    p2p_blocked: tuple[str, ...]  # "P2P is disabled between ... GPUs" lines
    socket_threads: tuple[int, int] | None  # (threads, sockets per thread)
    net_link_gbps: tuple[float, ...]  # "NET[50.0]" links in the topology dump, GB/s
    inits: tuple[CommInit, ...]
    shapes: tuple[CommShape, ...]
    rings: tuple[Ring, ...]
    trees: tuple[str, ...]
    connections: tuple[Connection, ...]
    coll_channels: int | None
    p2p_channels: int | None
    patterns: tuple[GraphPattern, ...]
    thread_thresholds: str | None
    tuning: tuple[TuningChoice, ...]
    init_timings: tuple[PhaseTimings, ...]
    bootstrap_timings: tuple[PhaseTimings, ...]
    connected: tuple[Connected, ...]
    coll_calls: tuple[CollCall, ...]  # the most recent RECENT_CALLS
    coll_calls_total: int
    warnings: tuple[NcclWarning, ...]
    errors: tuple[ErrorChain, ...]
    features: tuple[str, ...]  # version-dating format features seen (§15)
    # who printed the lines when NCCL's own prefix has no host:pid (trimmed or wrapped
    # lines): the launcher's label, e.g. "rank 3" or "pid=1234 ip=10.0.0.2"
    tag: str | None = None

    @property
    def who(self) -> str:
        """host:pid, or the launcher's label when NCCL's prefix named neither."""
        if self.host is None and self.pid is None and self.tag:
            return self.tag
        return f"{self.host or '?'}:{self.pid if self.pid is not None else '?'}"

    @property
    def ranks(self) -> tuple[int, ...]:
        """Ranks this process holds (in any communicator)."""
        found = {i.rank for i in self.inits} | {c.own_rank for c in self.connections}
        return tuple(sorted(found))

    @property
    def nranks(self) -> int | None:
        sizes = [i.nranks for i in self.inits] + [s.nranks for s in self.shapes]
        sizes += [c.nranks for c in self.coll_calls] + [t.nranks for t in self.init_timings if t.nranks]
        return max(sizes) if sizes else None

    @property
    def nchannels(self) -> int | None:
        """Channel count NCCL stated (coll channels, ring ``NN/MM``, graph search)."""
        if self.coll_channels is not None:
            return self.coll_channels
        if self.rings:
            return max(r.nchannels for r in self.rings)
        return max((p.nchannels for p in self.patterns), default=None)

    @property
    def channels_seen(self) -> int:
        """Highest channel index in transport lines + 1 (a lower bound for excerpts)."""
        return max((c.channel for c in self.connections), default=-1) + 1

    @property
    def fabric(self) -> str | None:
        """IB, RoCE, Socket or a plugin's network name."""
        return fabric_of(self.network, self.ib_devices)

    @property
    def version_range(self) -> tuple[str | None, str | None]:
        return infer_version_range(self.features)


def fabric_of(network: str | None, devices: Sequence[NetDevice]) -> str | None:
    if network is None:
        return None
    if network.upper().startswith("IB") and devices:
        return "RoCE" if all(d.link.startswith("RoCE") for d in devices) else "IB"
    return "IB" if network.upper().startswith("IB") else network


@dataclass(frozen=True)
class VersionLine(_Json):
    """One version statement and the process it belongs to.

    ``library`` is NCCL or RCCL. ``host``/``pid``/``tag`` name the process; ``how``
    says how that was decided: "prefix" (NCCL's own prefix), "wrapper" (the launcher's
    label on a bare line), "previous line" (a bare line printed right after a line of
    that process: NCCL <= 2.21 prints the bare line from the process that holds rank 0,
    right after its own init lines), "banner hostname" (RCCL's banner), or None
    (nobody can be named)."""

    library: str
    version: NcclVersion
    full: str  # as printed: "2.19.3+cuda12.2", "2.21.5-HEAD:9a0e6a1"
    host: str | None
    pid: int | None
    tag: str | None
    how: str | None

    @property
    def text(self) -> str:
        return f"{self.library} {self.full}" if self.library != "NCCL" else version_text(self.version) or self.full

    @property
    def who(self) -> str:
        if self.host is None and self.pid is None:
            return self.tag or "?"
        return f"{self.host or '?'}:{self.pid if self.pid is not None else '?'}"


@dataclass(frozen=True)
class RcclBanner(_Json):
    """RCCL's multi-line banner (ROCm): ``RCCL version : 2.21.5-HEAD:9a0e6a1`` then
    ``HIP version``, ``ROCm version``, ``Hostname``, ``Librccl path`` … one per line,
    printed without NCCL's prefix even when the first line has it."""

    fields: dict[str, str]
    host: str | None  # the process that printed it, else the banner's own Hostname
    pid: int | None
    tag: str | None


@dataclass(frozen=True)
class NcclLog(_Json):
    source: str
    processes: tuple[NcclProcess, ...]
    versions: tuple[NcclVersion, ...]  # every version line, prefixed or bare
    rccl: dict[str, str]  # RCCL banner block: "RCCL version", "HIP version", ...
    timeouts: tuple[WatchdogTimeout, ...]
    progress: tuple[WatchdogProgress, ...]
    flight_recorder: tuple[str, ...]
    torch_notes: tuple[str, ...]
    framework_errors: tuple[FrameworkError, ...]
    lines_total: int
    lines_nccl: int
    lines_unrecognized: int
    read_error: str | None = None
    version_lines: tuple[VersionLine, ...] = ()  # every NCCL/RCCL version statement, with its process
    rccl_banners: tuple[RcclBanner, ...] = ()

    @property
    def version(self) -> NcclVersion | None:
        return self.versions[0] if self.versions else None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({p.host for p in self.processes if p.host}))

    @property
    def network(self) -> str | None:
        return next((p.network for p in self.processes if p.network), None)

    @property
    def nranks(self) -> int | None:
        return max((n for p in self.processes if (n := p.nranks)), default=None)

    @property
    def ranks_seen(self) -> tuple[int, ...]:
        found = {r for p in self.processes for r in p.ranks}
        found |= {c.src_rank for p in self.processes for c in p.connections}
        found |= {c.dst_rank for p in self.processes for c in p.connections}
        found |= {t.rank for t in self.timeouts if t.rank is not None}
        return tuple(sorted(found))

    @property
    def nranks_min(self) -> int | None:
        """Lower bound on the communicator size when no line states it: highest rank seen + 1."""
        seen = self.ranks_seen
        return max(self.nranks or 0, seen[-1] + 1) if seen else self.nranks

    @property
    def connections(self) -> tuple[Connection, ...]:
        return tuple(c for p in self.processes for c in p.connections)

    @property
    def warnings(self) -> tuple[NcclWarning, ...]:
        return tuple(w for p in self.processes for w in p.warnings)

    @property
    def fatal_warnings(self) -> tuple[NcclWarning, ...]:
        return tuple(w for w in self.warnings if not w.benign)

    @property
    def version_range(self) -> tuple[str | None, str | None]:
        return infer_version_range(tuple(f for p in self.processes for f in p.features))


@dataclass(frozen=True)
class HostSummary(_Json):
    host: str
    pids: tuple[int, ...]
    ranks: tuple[int, ...]
    versions: tuple[str, ...]  # "2.19.3+cuda12.2"
    networks: tuple[str, ...]
    fabrics: tuple[str, ...]
    plugins: tuple[str, ...]  # loaded/selected net plugins ("internal" when none)
    bootstrap_interfaces: tuple[str, ...]
    net_interfaces: tuple[str, ...]  # NET/Socket interfaces and IB devices
    env: dict[str, tuple[str, ...]]
    local_ranks: int | None


@dataclass(frozen=True)
class NcclReport(_Json):
    logs: tuple[NcclLog, ...]
    hosts: tuple[HostSummary, ...]

    @property
    def processes(self) -> tuple[NcclProcess, ...]:
        return tuple(p for log in self.logs for p in log.processes)

    @property
    def timeouts(self) -> tuple[WatchdogTimeout, ...]:
        return tuple(t for log in self.logs for t in log.timeouts)

    @property
    def progress(self) -> tuple[WatchdogProgress, ...]:
        return tuple(p for log in self.logs for p in log.progress)

    @property
    def world_size(self) -> int | None:
        return max((n for log in self.logs if (n := log.nranks)), default=None)

    @property
    def nnodes(self) -> int | None:
        stated = [s.nnodes for p in self.processes for s in p.shapes]
        if stated:
            return max(stated)
        return len(self.hosts) or None

    @property
    def multi_node(self) -> bool:
        return (self.nnodes or 0) > 1

    def rank_hosts(self) -> dict[int, str]:
        """Rank -> host, from the world communicator's init lines and transport lines."""
        world = self.world_size
        out: dict[int, str] = {}
        for p in self.processes:
            if not p.host:
                continue
            for r in [i.rank for i in p.inits if i.nranks == world] + [c.own_rank for c in p.connections]:
                out.setdefault(r, p.host)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(world_size=self.world_size, nnodes=self.nnodes, multi_node=self.multi_node)
        return d


# --------------------------------------------------------------------------- wrappers

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ANSI_REMNANT = re.compile(r"(?<![\w\]])\[\d{1,3}(?:;\d{1,3})*m")  # "[36m" once the ESC byte is lost
RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")

WRAPPERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("markdown quote or backticks", re.compile(r"^\s*(?:>\s?|`+)")),
    ("ray worker", re.compile(r"^\s*\((?P<ray>[^()]*\bpid=\d+[^()]*)\)\s*")),
    ("openmpi --tag-output", re.compile(r"^\s*\[\d+,(?P<rank>\d+)\]<(?:stdout|stderr)>:\s*")),
    ("log shipper timestamp",
     re.compile(r"^\s*\|?\s*\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*(?:\|\s*)?")),
    ("torch/torchrun rank label", re.compile(r"^\s*\[[A-Za-z_]*?(?P<rank>\d+)\]:\s*")),
    ("launcher rank label", re.compile(r"^\s*\[(?P<rank>\d+)\]\s+(?=[^\s:\[]+:\d+:\d+\s|\[)")),
    ("srun -l", re.compile(r"^\s*(?P<rank>\d+):\s+")),
    ("pdsh host tag", re.compile(r"^\s*[\w.-]+:\s+(?=[^\s:]+:\d+:\d+\s)")),
)


def _strip_colour(text: str) -> str:
    if "\x1b" in text:
        text = ANSI_ESCAPE.sub("", text)
    if "m" in text and "[" in text and re.search(r"\[\d{1,3}(?:;\d{1,3})*m", text):
        text = ANSI_REMNANT.sub("", text)
    return RAY_REPEATED.sub("", text) if "[repeated " in text else text


RAY_PID = re.compile(r"\bpid=(?P<pid>\d+)(?:.*?\bip=(?P<ip>[\w.:-]+))?")


def strip_wrappers(line: str) -> tuple[str, int | None]:
    """Remove launcher/shipper prefixes; return the NCCL line and the launcher's
    rank label when one was present (innermost label wins)."""
    text, label, _tag = unwrap(line)
    return text, label


def unwrap(line: str) -> tuple[str, int | None, str | None]:
    """``strip_wrappers`` plus a tag naming the process the launcher says printed the
    line: the innermost Ray worker (``pid=615 ip=10.72.7.6``), else the rank label
    (``rank 3``). NCCL's own ``host:pid`` beats the tag; lines without it (trimmed
    prefixes, bare version lines) keep their process apart by it."""
    text = _strip_colour(line.replace("\x00", "")).rstrip()
    label: int | None = None
    ray: str | None = None
    for _ in range(8):
        for _name, pattern in WRAPPERS:
            m = pattern.match(text)
            if m and m.end() > 0:
                if "rank" in pattern.groupindex and m.group("rank") is not None:
                    label = int(m.group("rank"))
                if "ray" in pattern.groupindex:
                    r = RAY_PID.search(m.group("ray"))
                    if r:
                        ray = f"pid={r['pid']}" + (f" ip={r['ip']}" if r["ip"] else "")
                text = text[m.end():]
                break
        else:
            break
    tag = ray if ray is not None else f"rank {label}" if label is not None else None
    return text.rstrip("`").strip(), label, tag


# --------------------------------------------------------------------------- NCCL lines

_PREFIX_BODY = (
    r"(?:(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) +)?"  # host may be empty (":5202:5683 [0] …")
    r"\s*\[(?P<dev>\d+)\] "
    r"(?:(?P<loc>[\w./+-]+:\d+)(?: \((?P<func>\w+)\))? )?"
    r"NCCL (?P<level>INFO|WARN) (?P<msg>.*)$")
PREFIX = re.compile(r"^(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\] )?" + _PREFIX_BODY)
# The same prefix after text no wrapper rule knows (another launcher's tag, a logging
# framework's timestamp and level): found where it starts a word.
PREFIX_INSIDE = re.compile(r"(?:^|(?<=\s)|(?<=[\]>):|]))(?P<ts>)" + _PREFIX_BODY)
BARE_VERSION = re.compile(r"^NCCL version (?P<v>\d+\.\d+\.\d+)(?P<suffix>[^+\s]*)(?:\+cuda(?P<cuda>\d+\.\d+))?")
RCCL_BLOCK = re.compile(r"^(?P<key>RCCL version|HIP version|ROCm version|Librccl path)\s*:?\s*(?P<val>\S.*)$")
# a line of RCCL's banner after its first: "HIP version  : 6.2.41133-dd7f95766", "Hostname     : z292",
# "HIP runtime  : …" (newer RCCL); only read while a banner is open
RCCL_FIELD = re.compile(r"^(?P<key>[A-Z][A-Za-z]*(?: [A-Za-z]+){0,2})\s*: (?P<val>\S.*)$")
RCCL_BANNER_MAX = 10  # fields after the version line
VERSION_NUMBER = re.compile(r"(?P<v>\d+\.\d+\.\d+)")
IFACE = re.compile(r"(?:\[(?P<i>\d+)\])?(?P<name>[^\s:\[\]]+):(?P<addr>\S+)")
IB_DEV = re.compile(
    r"\[(?P<i>\d+)\](?:=\{(?P<merged>[^}]*)\}|(?P<name>[^\s:]+):(?P<port>\d+)/(?P<link>\w+(?:/\w+)?))")
MERGED_DEV = re.compile(r"\[\d+\] (?P<name>[^\s:]+):(?P<port>\d+)/(?P<link>\w+)")
KV_PARTS = re.compile(r"(?P<k>\w+) (?P<v>[\d.]+)")
DTYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8),
    9: ("bfloat16", 2), 10: ("float8e4m3", 1), 11: ("float8e5m2", 1)}
ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOS = ("LL", "LL128", "Simple")

RESULT_CODES: dict[int, tuple[str, str]] = {
    0: ("ncclSuccess", "success"),
    1: ("ncclUnhandledCudaError", "a CUDA call failed inside NCCL (out of memory, device error, driver)"),
    2: ("ncclSystemError", "a system call or external library (socket, IB verbs, malloc) failed; "
                           "before NCCL 2.13 also a peer process that exited"),
    3: ("ncclInternalError", "an internal NCCL check failed: often NCCL or plugin versions that differ "
                             "between ranks, or a broken setup"),
    4: ("ncclInvalidArgument", "an invalid argument was passed to NCCL"),
    5: ("ncclInvalidUsage", "NCCL was used incorrectly (two ranks on one GPU, mismatched calls)"),
    6: ("ncclRemoteError", "a remote process exited or the network between ranks failed"),
    7: ("ncclInProgress", "operation still in progress (non-blocking communicator)"),
}


class _Proc:
    """Mutable accumulator for one process while reading; frozen by ``freeze``."""

    def __init__(self, host: str | None, pid: int | None, tag: str | None = None) -> None:
        self.host, self.pid, self.tag = host, pid, tag
        self.devices: list[int] = []
        self.lines = 0
        self.version: NcclVersion | None = None
        self.rccl_version: str | None = None
        self.driver: int | None = None
        self.env: dict[str, str] = {}
        self.comm_config: dict[str, str] = {}
        self.bootstrap: tuple[Interface, ...] = ()
        self.socket_ifs: tuple[Interface, ...] = ()
        self.ib_devices: tuple[NetDevice, ...] = ()
        self.ib_oob: Interface | None = None
        self.ib_ro = False
        self.ib_none = False
        self.network: str | None = None
        self.socket_threads: tuple[int, int] | None = None
        self.coll_channels: int | None = None
        self.p2p_channels: int | None = None
        self.thresholds: str | None = None
        self.lists: dict[str, list[Any]] = {}
        self.calls: deque[CollCall] = deque(maxlen=RECENT_CALLS)
        self.calls_total = 0
        self.chain: tuple[str | None, list[ErrorStep]] | None = None
        self.features: set[str] = set()

    def add(self, key: str, item: Any) -> None:
        self.lists.setdefault(key, []).append(item)

    def items(self, key: str) -> tuple[Any, ...]:
        return tuple(self.lists.get(key, ()))

    def close_chain(self) -> None:
        if self.chain and self.chain[1]:
            warn, steps = self.chain
            name, meaning = RESULT_CODES.get(steps[-1].code, (f"nccl error {steps[-1].code}", "unknown result code"))
            self.add("errors", ErrorChain(warn, tuple(steps), steps[-1].code, name, meaning))
        self.chain = None

    def inferred_network(self) -> str | None:
        return next((c.net for c in self.lists.get("connections", ()) if c.net), None)

    def freeze(self) -> NcclProcess:
        self.close_chain()
        network = self.network or self.inferred_network()
        return NcclProcess(
            host=self.host, pid=self.pid, devices=tuple(self.devices), lines=self.lines,
            version=self.version, rccl_version=self.rccl_version, cuda_driver_version=self.driver,
            env=dict(self.env), comm_config=dict(self.comm_config), bootstrap=self.bootstrap,
            socket_interfaces=self.socket_ifs, ib_devices=self.ib_devices, ib_oob=self.ib_oob,
            ib_relaxed_ordering=self.ib_ro, ib_no_device=self.ib_none, network=network,
            network_inferred=self.network is None and network is not None,
            plugins=self.items("plugins"), gdr_notes=self.items("gdr"), p2p_blocked=self.items("p2p_blocked"),
            socket_threads=self.socket_threads, net_link_gbps=self.items("links"),
            inits=self.items("inits"), shapes=self.items("shapes"), rings=self.items("rings"),
            trees=self.items("trees"), connections=self.items("connections"),
            coll_channels=self.coll_channels, p2p_channels=self.p2p_channels,
            patterns=self.items("patterns"), thread_thresholds=self.thresholds, tuning=self.items("tuning"),
            init_timings=self.items("init_timings"), bootstrap_timings=self.items("bootstrap_timings"),
            connected=self.items("connected"), coll_calls=tuple(self.calls), coll_calls_total=self.calls_total,
            warnings=self.items("warnings"), errors=self.items("errors"), features=tuple(sorted(self.features)),
            tag=self.tag)


Apply = Callable[[_Proc, "re.Match[str]"], None]


@dataclass(frozen=True)
class MessageRule:
    """One row of the message table: ``pattern`` is matched at the start of the
    message (after the NCCL prefix); ``apply`` records what it says."""

    kind: str
    pattern: re.Pattern[str]
    apply: Apply
    example: str  # a real line of this kind (formats.md), tested


def _int(s: str | None) -> int | None:
    return int(s) if s is not None else None


def _interfaces(text: str) -> tuple[Interface, ...]:
    return tuple(Interface(m["name"], m["addr"], _int(m["i"])) for m in IFACE.finditer(text))


def _ib_devices(text: str) -> tuple[NetDevice, ...]:
    out = []
    for m in IB_DEV.finditer(text):
        if m["merged"] is not None:
            parts = list(MERGED_DEV.finditer(m["merged"]))
            name = "+".join(p["name"] for p in parts) or m["merged"]
            link = parts[0]["link"] if parts else "?"
            out.append(NetDevice(int(m["i"]), name, _int(parts[0]["port"]) if parts else None, link))
        else:
            out.append(NetDevice(int(m["i"]), m["name"], int(m["port"]), m["link"]))
    return tuple(out)


def _parts(text: str) -> dict[str, float]:
    return {m["k"]: float(m["v"]) for m in KV_PARTS.finditer(text)}


def _on_version(p: _Proc, m: re.Match[str]) -> None:
    p.version = NcclVersion(m["v"] + m["suffix"], m["cuda"])


def _on_rccl(p: _Proc, m: re.Match[str]) -> None:
    p.rccl_version = m["v"]


def _on_driver(p: _Proc, m: re.Match[str]) -> None:
    p.driver = int(m["v"])


def _on_env(p: _Proc, m: re.Match[str]) -> None:
    p.env[m["var"]] = m["val"].strip()


def _on_env_set_to(p: _Proc, m: re.Match[str]) -> None:
    p.env.setdefault(m["var"], m["val"])


def _on_comm_config(p: _Proc, m: re.Match[str]) -> None:
    p.comm_config[m["field"]] = m["val"]


def _on_bootstrap(p: _Proc, m: re.Match[str]) -> None:
    p.bootstrap = _interfaces(m["ifs"])
    p.features.add("bootstrap_nospace" if m["sep"] == ":" else "bootstrap_space")
    if p.bootstrap and p.bootstrap[0].index is not None:
        p.features.add("bootstrap_indexed")


def _on_timings(key: str) -> Apply:
    def apply(p: _Proc, m: re.Match[str]) -> None:
        groups = m.groupdict()
        p.add(key, PhaseTimings(groups.get("fn"), _int(groups.get("rank")), _int(groups.get("nranks")),
                                float(m["total"]), _parts(m["parts"]), m.string))
        if key == "init_timings":
            p.features.add("init_timings_api" if groups.get("fn") else "init_timings_plain")
    return apply


def _on_socket(p: _Proc, m: re.Match[str]) -> None:
    p.socket_ifs = _interfaces(m["ifs"])


def _on_socket_threads(p: _Proc, m: re.Match[str]) -> None:
    p.socket_threads = (int(m["t"]), int(m["s"]))


def _on_ib(p: _Proc, m: re.Match[str]) -> None:
    p.ib_devices = _ib_devices(m["devs"])
    oob = _interfaces(m["oob"])
    p.ib_oob = oob[0] if oob else None
    p.ib_ro = m["ro"] is not None
    p.ib_none = p.ib_none or not p.ib_devices
    if p.ib_ro:
        p.features.add("ib_relaxed_ordering")


def _on_ib_none(p: _Proc, m: re.Match[str]) -> None:
    p.ib_none = True


def _on_network(p: _Proc, m: re.Match[str]) -> None:
    p.network = m["net"].strip()


def _adder(key: str, feature: str | None = None) -> Apply:
    def apply(p: _Proc, m: re.Match[str]) -> None:
        p.add(key, m.string)
        if feature:
            p.features.add(feature)
    return apply


def _on_link(p: _Proc, m: re.Match[str]) -> None:
    p.add("links", float(m["bw"]))


def _on_init(p: _Proc, m: re.Match[str]) -> None:
    p.add("inits", CommInit(m["phase"], m["comm"], int(m["rank"]), int(m["nranks"]), int(m["cudaDev"]),
                            _int(m["nvmlDev"]), m["busId"], m["commId"], m["fn"]))
    if m["fn"]:
        p.features.add("init_api_config" if m["fn"] != "ncclCommInitRank" else "init_api")
    elif m["nvmlDev"] and m["commId"] and m["phase"] == "START":
        p.features.add("init_start_noapi")


def _on_shape(p: _Proc, m: re.Match[str]) -> None:
    p.add("shapes", CommShape(m["comm"], int(m["rank"]), int(m["nranks"]), int(m["nnodes"]),
                              int(m["lr"]), int(m["lrank"])))


def _conn_kind(m: re.Match[str]) -> str:
    via = m["via"]
    for kind in ("NET", "P2P", "SHM", "CollNet", "NVLS"):
        if via.startswith(kind):
            return kind
    return "SHM" if via.startswith("direct shared memory") else via.split("/")[0]


def _on_conn(p: _Proc, m: re.Match[str]) -> None:
    conn = Connection(
        channel=int(m["ch"]), conn_index=_int(m["conn"]), src_rank=int(m["src"]), dst_rank=int(m["dst"]),
        src_dev=m["srcdev"], dst_dev=m["dstdev"], direction=m["dir"], via=m["via"], transport=_conn_kind(m),
        net=m["net"], net_dev=_int(m["netdev"]), gdr=m["gdr"] is not None, legacy_ring=m["kw"] == "Ring",
        message=m.string)
    p.add("connections", conn)
    if conn.legacy_ring:
        p.features.add("conn_ring_prefix")
    elif conn.src_dev is not None:
        p.features.add("conn_busid_dev" if _looks_like_bus_id(conn.src_dev) else "conn_nvml_dev")


def _looks_like_bus_id(dev: str) -> bool:
    return len(dev) >= 4 or any(c in "abcdef" for c in dev)


def _on_ring(p: _Proc, m: re.Match[str]) -> None:
    ranks = tuple(int(x) for x in m["ranks"].split())
    p.add("rings", Ring(int(m["c"]), int(m["n"]) if m["n"] else 0, ranks, m["trunc"] is not None))


def _on_trees(p: _Proc, m: re.Match[str]) -> None:
    p.add("trees", m["body"].strip())
    if "|" in m["body"]:
        p.features.add("trees_dual")


def _on_pattern(p: _Proc, m: re.Match[str]) -> None:
    p.add("patterns", GraphPattern(int(m["pattern"]), int(m["crossNic"]), int(m["nch"]), float(m["bwIntra"]),
                                   float(m["bwInter"]), m["tIntra"], m["tInter"]))


def _on_channels(p: _Proc, m: re.Match[str]) -> None:
    p.coll_channels, p.p2p_channels = int(m["coll"]), int(m["p2p"])
    p.features.add("channels_collnet" if m["collnet"] else "channels_nvls" if m["nvls"] else "channels_plain")


def _on_thresholds(p: _Proc, m: re.Match[str]) -> None:
    p.thresholds = m["t"].strip()


def _on_connected(p: _Proc, m: re.Match[str]) -> None:
    p.add("connected", Connected(m["what"], _int(m["pxn"]), _int(m["gdr"])))
    if m["pxn"] is not None:
        p.features.add("connected_pxn")


def _name(names: Sequence[str], value: str) -> str:
    return names[int(value)] if value.isdigit() and int(value) < len(names) else value


def _on_tuning(p: _Proc, m: re.Match[str]) -> None:
    p.add("tuning", TuningChoice(m["coll"], int(m["bytes"]), _name(ALGOS, m["algo"]), _name(PROTOS, m["proto"])))


def _on_coll(p: _Proc, m: re.Match[str]) -> None:
    dtype = DTYPES.get(int(m["dtype"]))
    count = int(m["count"])
    p.calls.append(CollCall(
        func=m["func"], op_count=int(m["opCount"], 16), count=count, datatype=int(m["dtype"]),
        dtype=dtype[0] if dtype else None, size_bytes=count * dtype[1] if dtype else None, op=int(m["op"]),
        root=int(m["root"]), comm=m["comm"], nranks=int(m["nranks"]), in_place=m["send"] == m["recv"]))
    p.calls_total += 1


def _on_errprop(p: _Proc, m: re.Match[str]) -> None:
    step = ErrorStep(m["loc"], int(m["code"]), m["thread"])
    if p.chain is None:
        p.chain = (None, [])
    p.chain[1].append(step)


def _on_nvls(p: _Proc, m: re.Match[str]) -> None:
    p.features.add("nvls_line")


def _on_plugin(p: _Proc, m: re.Match[str]) -> None:
    p.add("plugins", m.string)
    if m.string.startswith("Using non-device net plugin"):
        p.features.add("non_device_plugin")


MESSAGE_RULES: tuple[MessageRule, ...] = (
    MessageRule("coll", re.compile(
        r"^(?P<func>\w+): opCount (?P<opCount>[0-9a-f]+) sendbuff (?P<send>\S+) recvbuff (?P<recv>\S+) "
        r"count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<op>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
        r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)"), _on_coll,
        "AllReduce: opCount 139d sendbuff 0x78d056200000 recvbuff 0x78d056200000 count 7382228 datatype 7 "
        "op 0 root 0 comm 0x78cfda045840 [nranks=128] stream 0x78d07125e5e0"),
    MessageRule("connection", re.compile(
        r"^(?P<kw>Ring|Channel) (?P<ch>\d+)(?:/(?P<conn>\d+))? ?: (?P<src>\d+)(?:\[(?P<srcdev>[0-9a-f]+)\])? -> "
        r"(?P<dst>\d+)(?:\[(?P<dstdev>[0-9a-f]+)\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>"
        r"NET/(?P<net>[^/\n]+?)/(?P<netdev>\d+)(?:\((?P<proxy>\d+)\))?(?P<gdr>/GDRDMA)?(?:\(PCI\))?(?:/Shared)?"
        r"|P2P/(?:direct pointer|IPC|CUMEM|MNNVL|indirect/\d+\[[0-9a-f]+\]|common device)(?:/read)?(?:/CE)?"
        r"|SHM/(?:direct|CE)(?:/(?:direct|CE))?|direct shared memory|CollNet\S*|NVLS\S*)"), _on_conn,
        "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"),
    MessageRule("ring", re.compile(
        r"^(?:Channel|Ring) (?P<c>\d+)(?:/(?P<n>\d+))? ?:(?P<ranks>(?: +\d+)+)(?P<trunc>\.\.\.)?"
        r"(?: comm \S+.*)?\s*$"), _on_ring, "Channel 00/02 :    0   1"),
    MessageRule("trees", re.compile(r"^Trees(?P<body>(?: \[\d+\] [-\d/>|]+)+)"), _on_trees,
                "Trees [0] -1/-1/-1->1->0 [1] -1/-1/-1->1->0"),
    MessageRule("init", re.compile(
        r"^(?:\[Rank \d+\] )?(?:(?P<fn>nccl\w+) )?comm (?P<comm>0x[0-9a-f]+|\(nil\)) rank (?P<rank>\d+) "
        r"nranks (?P<nranks>\d+) cudaDev (?P<cudaDev>\d+)(?: nvmlDev (?P<nvmlDev>\d+))?(?: busId (?P<busId>[0-9a-f]+))?"
        r"(?: parent \S+(?: splitCount \d+| childCount \d+)? color -?\d+ key -?\d+)?(?: commId (?P<commId>0x[0-9a-f]+))?"
        r" ?- Init (?P<phase>START|COMPLETE)"), _on_init,
        "ncclCommInitRankConfig comm 0x5629b5ee7340 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 "
        "commId 0x2fb902677fd5202e - Init COMPLETE"),
    MessageRule("comm shape", re.compile(
        r"^comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
        r"localRanks (?P<lr>\d+) localRank (?P<lrank>\d+)"), _on_shape,
        "comm 0x5639e9f0e8c0 rank 0 nRanks 24 nNodes 3 localRanks 8 localRank 0 MNNVL 0"),
    MessageRule("version", BARE_VERSION, _on_version, "NCCL version 2.25.1+cuda12.2"),
    MessageRule("rccl version", re.compile(r"^RCCL version\s*:?\s*(?P<v>\d+\.\d+\.\d+\S*)"), _on_rccl,
                "RCCL version 2.6.4+hip3.5"),
    MessageRule("cuda driver", re.compile(r"^cudaDriverVersion (?P<v>\d+)"), _on_driver, "cudaDriverVersion 12000"),
    MessageRule("env", re.compile(r"^(?P<var>NCCL_[A-Z0-9_]+) set by environment to (?P<val>.*?)\.?$"), _on_env,
                "NCCL_IB_DISABLE set by environment to 0."),
    MessageRule("env (NET)", re.compile(r"^(?P<var>NCCL_SOCKET_IFNAME|NCCL_IB_HCA) set to (?P<val>\S+)"),
                _on_env_set_to, "NCCL_IB_HCA set to mlx5_0"),
    MessageRule("comm config", re.compile(r"^Comm config (?P<field>\w+) set to (?P<val>\S+)"), _on_comm_config,
                "Comm config Blocking set to 1"),
    MessageRule("bootstrap", re.compile(r"^Bootstrap(?P<sep> :|:) ?Using(?P<ifs> .*)$"), _on_bootstrap,
                "Bootstrap : Using eth0:162.30.2.40<0>"),
    MessageRule("bootstrap timings", re.compile(r"^Bootstrap timings total (?P<total>[\d.]+) \((?P<parts>[^)]*)\)"),
                _on_timings("bootstrap_timings"),
                "Bootstrap timings total 0.84 (create 0.00, send 0.01, recv 0.80, ring 0.02, delay 0.00)"),
    MessageRule("socket threads", re.compile(r"^NET/Socket ?: ?Using (?P<t>\d+) threads and (?P<s>\d+) sockets"),
                _on_socket_threads, "NET/Socket: Using 2 threads and 8 sockets per thread"),
    MessageRule("net socket", re.compile(r"^NET/Socket ?: ?Using (?P<ifs>\[\d+\].*)$"), _on_socket,
                "NET/Socket : Using [0]eth0:10.0.0.34<0>"),
    MessageRule("net ib", re.compile(r"^NET/IB ?: ?Using(?P<devs>.*?)\s*(?P<ro>\[RO\])?\s*; OOB (?P<oob>\S+)"),
                _on_ib, "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>"),
    MessageRule("net ib none", re.compile(r"^NET/IB ?: ?No device found"), _on_ib_none, "NET/IB : No device found."),
    MessageRule("gdr", re.compile(r"^(?:NET/\S+ ?: ?)?GPU Direct RDMA (?:Enabled|Disabled)"), _adder("gdr"),
                "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)"),
    MessageRule("p2p blocked", re.compile(r"^P2P is disabled between (?:NVLINK )?connected GPUs"),
                _adder("p2p_blocked"),
                "P2P is disabled between connected GPUs 0 and 1. You can repress this message with "
                "NCCL_IGNORE_DISABLED_P2P=1."),
    MessageRule("network", re.compile(r"^Using network (?P<net>.+)$"), _on_network, "Using network IB"),
    MessageRule("plugin", re.compile(
        r"^(?:(?:NET|TUNER|PROFILER|ENV|GIN|RMA)/Plugin ?:|Plugin Path :|P2P plugin |"
        r"Using non-device net plugin|Initialized NET plugin|Assigned NET plugin)"), _on_plugin,
        "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)"),
    MessageRule("topology link", re.compile(r"^\s*\+?\s*NET\[(?P<bw>[\d.]+)\] - NET/\d+"), _on_link,
                "+ NET[50.0] - NET/3 (guid/port/50.000000)"),
    MessageRule("graph pattern", re.compile(
        r"^Pattern (?P<pattern>\d+), crossNic (?P<crossNic>\d+), nChannels (?P<nch>\d+), (?:speed|bw) "
        r"(?P<bwIntra>[\d.]+)/(?P<bwInter>[\d.]+), type (?P<tIntra>\w+)/(?P<tInter>\w+)"), _on_pattern,
        "Pattern 4, crossNic 1, nChannels 4, bw 24.000000/24.000000, type NVL/PIX, sameChannels 0"),
    MessageRule("channels", re.compile(
        r"^(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?:(?P<nvls>\d+) nvls channels, )?"
        r"(?P<p2p>\d+) p2p channels, (?P<pp>\d+) p2p channels per peer"), _on_channels,
        "16 coll channels, 0 collnet channels, 16 nvls channels, 16 p2p channels, 2 p2p channels per peer"),
    MessageRule("thread thresholds", re.compile(r"^threadThresholds (?P<t>.+)$"), _on_thresholds,
                "threadThresholds 8/8/64 | 32/8/64 | 512 | 512"),
    MessageRule("connected", re.compile(
        r"^Connected all (?P<what>rings|trees)(?:, use ring PXN (?P<pxn>\d) GDR (?P<gdr>\d))?"), _on_connected,
        "Connected all rings, use ring PXN 0 GDR 1"),
    MessageRule("init timings", re.compile(
        r"^Init timings(?: - (?P<fn>\w+))?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) total (?P<total>[\d.]+) "
        r"\((?P<parts>[^)]*)\)"), _on_timings("init_timings"),
        "Init timings: rank 5 nranks 8 total 2.46 (kernels 0.18, bootstrap 1.60, allgathers 0.00, topo 0.52, "
        "graphs 0.01, connections 0.12, rest 0.02)"),
    MessageRule("tuning", re.compile(
        r"^(?:(?P<coll>\w+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"), _on_tuning,
        "AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..15}"),
    MessageRule("error propagation", re.compile(
        r"^(?P<loc>[\w./+-]+:\d+) -> (?P<code>\d+)(?: \[(?P<thread>[^\]]+)\])?"), _on_errprop,
        "transport/net.cc:1298 -> 6"),
    MessageRule("nvls", re.compile(r"^NVLS multicast support is (?:not )?available"), _on_nvls,
                "NVLS multicast support is not available on dev 0"),
)

# --------------------------------------------------------------------------- WARN meanings

WARN_MEANINGS: tuple[tuple[re.Pattern[str], str, bool], ...] = tuple(
    (re.compile(p, re.IGNORECASE), meaning, benign) for p, meaning, benign in (
        (r"Failed to open libibverbs", "no InfiniBand user-space library: NET/IB is unavailable and NCCL uses "
         "sockets; harmless when no InfiniBand is expected", True),
        (r"Got completion.*(?:with error |status=)(?:\w+\()?4\b", "IB local protection error: GPU Direct RDMA "
         "blocked by PCIe ACS/IOMMU or nvidia-peermem; confirm with NCCL_NET_GDR_LEVEL=0", False),
        (r"Got completion.*(?:with error |status=)(?:\w+\()?5\b", "IB work request flushed: the connection was "
         "already broken by an earlier error", False),
        (r"Got completion.*(?:with error |status=)(?:\w+\()?12\b", "IB transport retry exceeded: link down, RoCE "
         "routing/GID setting or congestion (check NCCL_IB_GID_INDEX at start, NCCL_IB_TIMEOUT after long runs)",
         False),
        (r"Got completion.*(?:with error |status=)(?:\w+\()?13\b", "IB receiver-not-ready retry exceeded", False),
        (r"Got async event", "the NIC reported a port or device event (port error, GID change)", False),
        (r"ibv_modify_qp failed.*unreachable", "RoCE GID or route problem (NCCL_IB_GID_INDEX)", False),
        (r"Connection closed by remote peer|socket progress error|Call to recv .* failed",
         "a peer process died or the connection was cut; usually a consequence of a failure elsewhere", False),
        (r"Connection timed out|exceeded retries|exceeded error retry count|Connection refused",
         "could not connect to a peer: firewall, wrong interface, or the peer is not listening", False),
        (r"neither AF_INET", "garbage peer address: NCCL or plugin versions differ between ranks, or "
         "NCCL_SOCKET_IFNAME matches no interface", False),
        (r"wrong magic|wrong type", "something else connected to NCCL's port, or ranks run different NCCL versions",
         False),
        (r"no socket interface found|No usable listening interface|No interface found in the same subnet",
         "no usable IP interface: fix NCCL_SOCKET_IFNAME", False),
        (r"Bootstrap Root : (?:mismatch|rank \d+ of \d+ ranks has already checked in)",
         "inconsistent world size, a duplicate rank, or a stale process from an earlier job", False),
        (r"Message truncated", "ranks disagree on the operation sequence (desync) or run different versions",
         False),
        (r"Mismatched NCCL version", "ranks run different NCCL versions", False),
        (r"Duplicate GPU detected", "two ranks use the same GPU (set the device per rank)", False),
        (r"P2P is disabled between", "P2P between these GPUs is blocked by hardware, driver or virtualisation",
         False),
        (r"does not loop back", "ranks detected different topologies", False),
        (r"Attempted to merge incompatible devices", "IB and RoCE NICs mixed: restrict NCCL_IB_HCA", False),
        (r"Could not find real path", "soft-RoCE or a missing sysfs device", False),
        (r"nvmlDeviceGetHandleByPciBusId\(\) failed", "GPU not visible to NVML (container setup)", False),
        (r"out of memory|Cannot allocate memory", "memory allocation failed (GPU memory, pinned or registered "
         "host memory; check ulimit -l)", False),
        (r"Cuda failure", "a CUDA call failed inside NCCL", False),
        (r"Error encountered progressing operation", "NCCL's proxy thread failed on a network operation", False),
        (r"MNNVL .*not working", "multi-node NVLink is present but IMEX is not set up", False),
    ))


def warn_meaning(message: str) -> tuple[str | None, bool]:
    """Plain-language meaning of a WARN message and whether it is benign."""
    for pattern, meaning, benign in WARN_MEANINGS:
        if pattern.search(message):
            return meaning, benign
    return None, False


# --------------------------------------------------------------------------- PyTorch lines

PG_TAG = re.compile(
    r"\[(?:PG ID (?P<pgid>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))? |PG (?P<pg>\d+) )?"
    r"Rank (?P<rank>\d+)\]")
TORCH_TIMEOUT = re.compile(
    r"(?:Watchdog c|C)aught collective operation timeout: WorkNCCL\((?P<body>.*)\) ran for (?P<ran>\d+) milliseconds")
WORK_FIELD = re.compile(r"(?P<k>\w+(?:\(ms\))?)=(?P<v>\[[^\]]*\]|[^,]+)")
TORCH_PROGRESS = re.compile(
    r"(?:Exception \(either an error or timeout\) detected by watchdog at work|Timeout at NCCL work): (?P<work>\d+), "
    r"last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)")
FLIGHT_RECORDER = re.compile(
    r"flight ?recorder|Heartbeat monitor timed out|watchdog got stuck|dump(?:ing)? (?:the )?(?:nccl )?"
    r"(?:trace|debug info)|nccl_trace_rank_|TORCH_NCCL_DEBUG_INFO_TEMP_FILE", re.IGNORECASE)
TORCH_NOTES = re.compile(
    r"device used by this process is currently unknown|Some NCCL operations have failed or timed out|"
    r"taking the entire process down")
FRAMEWORK_ERRORS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"ncclRemoteError|remote process exited or there was a network error"), 6),
    (re.compile(r"ncclSystemError|unhandled system error"), 2),
    (re.compile(r"ncclInternalError|internal error - please report"), 3),
    (re.compile(r"ncclUnhandledCudaError|unhandled cuda error"), 1),
    (re.compile(r"ncclInvalidUsage|invalid usage \(run with"), 5),
    (re.compile(r"ncclInvalidArgument|invalid argument \(run with"), 4),
)


def _pg_fields(m: re.Match[str] | None) -> tuple[str | None, str | None, str | None]:
    if m is None:
        return None, None, None
    return m["pgid"] or m["pg"], m["guid"], m["desc"]


def parse_timeout(text: str, label: int | None = None) -> WatchdogTimeout | None:
    """A PyTorch watchdog timeout line (old and new WorkNCCL formats), else None."""
    m = TORCH_TIMEOUT.search(text)
    if not m:
        return None
    f = {k["k"]: k["v"].strip() for k in WORK_FIELD.finditer(m["body"])}
    tag = PG_TAG.search(text, 0, m.start())
    pg_id, guid, desc = _pg_fields(tag)
    rank = int(tag["rank"]) if tag else label
    return WatchdogTimeout(rank, _num(f.get("SeqNum")), f.get("OpType"), _num(f.get("NumelIn")),
                           _num(f.get("NumelOut")), _num(f.get("Timeout(ms)")), int(m["ran"]), pg_id, guid, desc,
                           text[m.start():])


def _num(s: str | None) -> int | None:
    return int(s) if s is not None and re.fullmatch(r"-?\d+", s) else None


def _parse_progress(text: str) -> WatchdogProgress | None:
    m = TORCH_PROGRESS.search(text)
    tag = PG_TAG.search(text) if m else None
    if not m or not tag:
        return None
    pg_id, guid, desc = _pg_fields(tag)
    return WatchdogProgress(int(tag["rank"]), pg_id, guid, desc, int(m["work"]), int(m["enq"]), int(m["done"]))


def _framework_error(text: str, label: int | None) -> FrameworkError | None:
    for pattern, code in FRAMEWORK_ERRORS:
        if pattern.search(text):
            tag = PG_TAG.search(text)
            name, meaning = RESULT_CODES[code]
            return FrameworkError(name, meaning, int(tag["rank"]) if tag else label, text)
    return None


# --------------------------------------------------------------------------- reading


ProcKey = tuple[Union[str, None], Union[int, None], Union[str, None]]


class _LogAcc:
    def __init__(self) -> None:
        self.procs: dict[ProcKey, _Proc] = {}
        self.versions: list[NcclVersion] = []
        self.version_lines: list[VersionLine] = []
        self.rccl: dict[str, str] = {}
        self.banners: list[RcclBanner] = []
        self.banner: _Banner | None = None  # the RCCL banner being read
        self.tags: dict[str, ProcKey] = {}  # launcher tag -> the host:pid process seen under it
        self.last: tuple[ProcKey, str | None] | None = None  # process and tag of the line just before
        self.timeouts: list[WatchdogTimeout] = []
        self.progress: list[WatchdogProgress] = []
        self.fr: list[str] = []
        self.notes: list[str] = []
        self.errors: dict[tuple[str, str], FrameworkError] = {}
        self.total = self.nccl = self.unrecognized = 0

    def key(self, host: str | None, pid: int | None, tag: str | None) -> ProcKey:
        """NCCL's host:pid names a process; without it, the launcher's tag does."""
        return (host, pid, None) if host is not None or pid is not None else (None, None, tag)

    def proc(self, host: str | None, pid: int | None, tag: str | None = None) -> _Proc:
        key = self.key(host, pid, tag)
        if key not in self.procs:
            self.procs[key] = _Proc(*key)
        return self.procs[key]

    def owner(self, tag: str | None) -> tuple[ProcKey | None, str | None]:
        """The process a line without NCCL's prefix belongs to, and how that was decided."""
        if tag is not None and tag in self.tags:
            return self.tags[tag], "wrapper"
        if tag is not None and (None, None, tag) in self.procs:
            return (None, None, tag), "wrapper"
        if self.last is not None and self.last[1] == tag:
            return self.last[0], "previous line"
        return None, None

    def add_version(self, library: str, version: NcclVersion, full: str, key: ProcKey | None, how: str | None,
                    tag: str | None, host: str | None = None) -> None:
        if key is not None:
            host, pid, tag = key
            p = self.procs.get(key)
            if p is not None and library == "NCCL" and p.version is None:
                p.version = version
            if p is not None and library == "RCCL" and p.rccl_version is None:
                p.rccl_version = full
        else:
            pid = None
        self.version_lines.append(VersionLine(library, version, full, host, pid, tag, how))


class _Banner:
    """An RCCL banner being read: its fields and the process it belongs to."""

    def __init__(self, key: ProcKey | None, how: str | None, tag: str | None, version: str) -> None:
        self.key, self.how, self.tag = key, how, tag
        self.fields: dict[str, str] = {"RCCL version": version}


def _open_banner(acc: _LogAcc, key: ProcKey | None, how: str | None, tag: str | None, version: str) -> None:
    _close_banner(acc)
    acc.banner = _Banner(key, how, tag, version)


def _close_banner(acc: _LogAcc) -> None:
    b, acc.banner = acc.banner, None
    if b is None:
        return
    for k, v in b.fields.items():
        acc.rccl.setdefault(k, v)
    key, how = b.key, b.how
    named = b.fields.get("Hostname")
    if key is None and named and not named.startswith("("):  # "(redacted)"
        key, how = (named, None, None), "banner hostname"
    host, pid, tag = key if key is not None else (None, None, b.tag)
    acc.banners.append(RcclBanner(dict(b.fields), host, pid, tag))
    full = b.fields["RCCL version"]
    number = VERSION_NUMBER.search(full)
    version = NcclVersion(number["v"] if number else full, None)
    if key is not None and key not in acc.procs:  # a host named only by the banner
        acc.add_version("RCCL", version, full, None, how, tag, host=host)
    else:
        acc.add_version("RCCL", version, full, key, how, tag)


def _read_banner_field(acc: _LogAcc, text: str) -> bool:
    b = acc.banner
    m = RCCL_FIELD.match(text) if b is not None else None
    if b is None or m is None or m["key"] == "RCCL version" or len(b.fields) > RCCL_BANNER_MAX:
        _close_banner(acc)
        return False
    b.fields[m["key"]] = m["val"].strip()
    return True


def _read_nccl_line(acc: _LogAcc, m: re.Match[str], tag: str | None = None) -> None:
    _close_banner(acc)
    host = m["host"] or None  # an empty hostname names nobody
    pid = _int(m["pid"])
    key = acc.key(host, pid, tag)
    if tag is not None and host is not None:
        acc.tags.setdefault(tag, key)
    p = acc.proc(*key)
    acc.last = (key, tag)
    p.lines += 1
    dev = int(m["dev"])
    if dev not in p.devices:
        p.devices.append(dev)
    msg = m["msg"].strip()
    if m["loc"] and msg.startswith("-> "):  # 2.30 error propagation: location in the prefix
        msg = f"{m['loc']} {msg}"
    if m["level"] == "WARN":
        _read_warn(p, m, msg)
        return
    for rule in MESSAGE_RULES:
        mm = rule.pattern.match(msg)
        if mm:
            if rule.kind != "error propagation":
                p.close_chain()
            rule.apply(p, mm)
            if rule.kind == "version":
                version = NcclVersion(mm["v"] + mm["suffix"], mm["cuda"])
                acc.versions.append(version)
                acc.add_version("NCCL", version, msg[len("NCCL version "):].strip(), key, "prefix", tag)
            elif rule.kind == "rccl version":
                _open_banner(acc, key, "prefix", tag, mm["v"])
            return


def _read_warn(p: _Proc, m: re.Match[str], msg: str) -> None:
    p.close_chain()
    meaning, benign = warn_meaning(msg)
    if len(p.lists.get("warnings", ())) < MAX_WARNINGS:
        p.add("warnings", NcclWarning(m["loc"], m["func"], msg, meaning, benign, m["ts"] or None))
    if m["ts"]:
        p.features.add("warn_timestamp")
    if m["func"]:
        p.features.add("warn_func")
    if not benign:
        p.chain = (msg, [])


def _read_other_line(acc: _LogAcc, text: str, label: int | None, tag: str | None = None) -> bool:
    """Bare version lines, RCCL's banner and PyTorch lines; True when the line was used."""
    m = BARE_VERSION.match(text)
    if m:
        version = NcclVersion(m["v"] + m["suffix"], m["cuda"])
        acc.versions.append(version)
        key, how = acc.owner(tag)
        acc.add_version("NCCL", version, text[len("NCCL version "):].strip(), key, how, tag)
        return True
    m = RCCL_BLOCK.match(text)
    if m and m["key"] == "RCCL version":
        key, how = acc.owner(tag)
        _open_banner(acc, key, how, tag, m["val"].strip())
        return True
    if m:  # a banner field without its first line (an excerpt)
        acc.rccl[m["key"]] = m["val"].strip()
        return True
    return _read_torch_line(acc, text, label)


def _read_torch_line(acc: _LogAcc, text: str, label: int | None) -> bool:
    timeout = parse_timeout(text, label)
    if timeout:
        acc.timeouts.append(timeout)
        return True
    progress = _parse_progress(text)
    if progress:
        acc.progress.append(progress)
        return True
    used = False
    if FLIGHT_RECORDER.search(text):
        acc.fr.append(text)
        used = True
    if TORCH_NOTES.search(text):
        acc.notes.append(text)
        used = True
    error = _framework_error(text, label)
    if error:
        acc.errors.setdefault((error.name, text), error)
        used = True
    return used


def _read_line(acc: _LogAcc, raw: str) -> None:
    acc.total += 1
    text, label, tag = unwrap(raw[:MAX_LINE_CHARS])
    if not text or text.startswith("#"):  # NCCL and PyTorch never start a line with '#'
        return  # (NCCL writes an empty line before each WARN: the line before still counts as "just before")
    m = PREFIX.match(text) or (PREFIX_INSIDE.search(text) if " NCCL INFO " in text or " NCCL WARN " in text else None)
    if m:
        acc.nccl += 1
        _read_nccl_line(acc, m, tag)
        return
    if acc.banner is not None and _read_banner_field(acc, text):
        return
    used = _read_other_line(acc, text, label, tag)
    if not used:
        acc.unrecognized += 1
    if acc.banner is None:
        acc.last = None


def _with_pg(t: WatchdogTimeout, progress: Sequence[WatchdogProgress]) -> WatchdogTimeout:
    """Fill a timeout's process group from the watchdog progress line of the same rank and work."""
    if t.pg_id is not None or t.pg_guid is not None:
        return t
    match = next((p for p in progress if p.rank == t.rank and p.work == t.seq), None)
    if match is None:
        return t
    return WatchdogTimeout(t.rank, t.seq, t.op_type, t.numel_in, t.numel_out, t.timeout_ms, t.ran_for_ms,
                           match.pg_id, match.pg_guid, match.pg_desc, t.message)


def _freeze_log(acc: _LogAcc, source: str, read_error: str | None = None) -> NcclLog:
    _close_banner(acc)
    progress = tuple(acc.progress)
    return NcclLog(
        source=source, processes=tuple(p.freeze() for p in acc.procs.values()), versions=tuple(acc.versions),
        rccl=dict(acc.rccl), timeouts=tuple(_with_pg(t, progress) for t in acc.timeouts), progress=progress,
        flight_recorder=tuple(acc.fr), torch_notes=tuple(acc.notes), framework_errors=tuple(acc.errors.values()),
        lines_total=acc.total, lines_nccl=acc.nccl, lines_unrecognized=acc.unrecognized, read_error=read_error,
        version_lines=tuple(acc.version_lines), rccl_banners=tuple(acc.banners))


def _decode(line: str | bytes) -> str:
    if isinstance(line, bytes):
        return line.decode("utf-8", errors="replace")
    return line if isinstance(line, str) else str(line)


def _iter_file(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:
        for raw in f:
            yield from raw.decode("utf-8", errors="replace").splitlines() or [""]


def _iter_input(data: LogInput) -> tuple[Iterable[str], str]:
    if isinstance(data, os.PathLike):
        return _iter_file(Path(data)), str(data)
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace").splitlines(), "<bytes>"
    if isinstance(data, str):
        if "\n" not in data and data and os.path.isfile(data):
            return _iter_file(Path(data)), data
        return data.splitlines(), "<text>"
    return (seg for item in data for seg in (_decode(item).splitlines() or [""])), "<lines>"


def parse_nccl_log(lines_or_path: LogInput, source: str | None = None) -> NcclLog:
    """Parse one NCCL debug log.

    ``lines_or_path``: a ``Path`` (read as bytes, undecodable bytes replaced), log text
    (``str``/``bytes``; a one-line ``str`` naming an existing file is read as a path),
    or an iterable of lines. Never raises on content; an unreadable file gives an
    empty log with ``read_error`` set.
    """
    lines, default_source = _iter_input(lines_or_path)
    acc = _LogAcc()
    try:
        for raw in lines:
            _read_line(acc, raw)
    except OSError as e:
        return _freeze_log(acc, source or default_source, f"{type(e).__name__}: {e}")
    return _freeze_log(acc, source or default_source)


# --------------------------------------------------------------------------- many files


def _expand(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p])
    return out


def parse_nccl_logs(paths: Iterable[str | os.PathLike[str]]) -> NcclReport:
    """Parse per-process log files (a folder is expanded to the files in it) and
    merge them per host."""
    return merge_logs([parse_nccl_log(p, source=str(p)) for p in _expand(paths)])


def merge_logs(logs: Sequence[NcclLog]) -> NcclReport:
    by_host: dict[str, list[NcclProcess]] = {}
    for log in logs:
        for p in log.processes:
            if p.host:
                by_host.setdefault(p.host, []).append(p)
    bare = _bare_versions_by_host(logs)
    for host in bare:
        by_host.setdefault(host, [])  # a host known only from RCCL's banner
    hosts = tuple(_summarise_host(h, ps, bare.get(h, ())) for h, ps in sorted(by_host.items()))
    return NcclReport(tuple(logs), hosts)


def _bare_versions_by_host(logs: Sequence[NcclLog]) -> dict[str, tuple[str, ...]]:
    """Version lines without a host prefix belong to a host when the file holds only that
    host, or when the line's process is known (launcher tag, the line just before, RCCL's
    banner). RCCL versions read "RCCL 2.21.5-HEAD:9a0e6a1"."""
    out: dict[str, tuple[str, ...]] = {}
    for log in logs:
        for v in log.version_lines:
            host = v.host or (log.hosts[0] if len(log.hosts) == 1 else None)
            if host and (v.how != "prefix" or v.library == "RCCL"):
                out[host] = out.get(host, ()) + (v.text,)
    return out


def version_text(v: NcclVersion | None) -> str | None:
    """"2.19.3+cuda12.2" as NCCL prints it; None for None."""
    if v is None:
        return None
    return f"{v.version}+cuda{v.cuda}" if v.cuda else v.version


def net_plugin_of(p: NcclProcess) -> str | None:
    """The net plugin a process loaded ("internal" when it said it uses none)."""
    for line in p.plugins:
        m = re.search(r"Loaded net plugin (?P<n>.+)$|P2P plugin (?P<p>\S+)", line)
        if m:
            return (m["n"] or m["p"]).strip()
    if any(re.search(r"internal (?:network plugin|implementation)", line) for line in p.plugins):
        return "internal"
    for line in p.plugins:  # "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so" alone
        m = re.match(r"Plugin Path ?: ?(?P<path>\S+)", line)
        if m:
            return m["path"]
    return None


def _summarise_host(host: str, procs: Sequence[NcclProcess], bare: Sequence[str]) -> HostSummary:
    versions = {version_text(p.version) for p in procs} | set(bare)
    env: dict[str, set[str]] = {}
    for p in procs:
        for k, v in p.env.items():
            env.setdefault(k, set()).add(v)
    local = [s.local_ranks for p in procs for s in p.shapes]
    return HostSummary(
        host=host, pids=tuple(sorted({p.pid for p in procs if p.pid is not None})),
        ranks=tuple(sorted({r for p in procs for r in p.ranks})), versions=_uniq(versions),
        networks=_uniq(p.network for p in procs), fabrics=_uniq(p.fabric for p in procs),
        plugins=_uniq(net_plugin_of(p) for p in procs),
        bootstrap_interfaces=_uniq(i.name for p in procs for i in p.bootstrap),
        net_interfaces=_uniq([i.name for p in procs for i in p.socket_interfaces]
                             + [d.name for p in procs for d in p.ib_devices]),
        env={k: tuple(sorted(v)) for k, v in sorted(env.items())}, local_ranks=max(local) if local else None)


def _uniq(items: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(sorted({i for i in items if i}))


# --------------------------------------------------------------------------- version dating (§15)

Minor = tuple[int, int]
VERSION_FEATURES: dict[str, tuple[Minor | None, Minor | None]] = {
    "conn_ring_prefix": (None, (2, 6)),
    "bootstrap_indexed": ((2, 5), (2, 7)),
    "trees_dual": ((2, 5), (2, 7)),
    "conn_busid_dev": ((2, 5), (2, 18)),
    "conn_nvml_dev": ((2, 18), None),
    "nvls_line": ((2, 17), None),
    "init_start_noapi": ((2, 18), (2, 20)),
    "init_api": ((2, 21), None),
    "init_api_config": ((2, 21), None),
    "non_device_plugin": ((2, 19), (2, 21)),
    "channels_plain": ((2, 7), (2, 16)),
    "channels_nvls": ((2, 17), (2, 19)),
    "channels_collnet": ((2, 20), None),
    "init_timings_plain": ((2, 22), (2, 22)),
    "init_timings_api": ((2, 23), None),
    "bootstrap_space": (None, (2, 23)),
    "bootstrap_nospace": ((2, 24), None),
    "connected_pxn": ((2, 24), None),
    "warn_timestamp": ((2, 26), None),
    "warn_func": ((2, 30), None),
    "ib_relaxed_ordering": ((2, 12), None),
}


def infer_version_range(features: Iterable[str]) -> tuple[str | None, str | None]:
    """NCCL major.minor range consistent with the line formats seen (formats.md §15);
    (None, None) when nothing dates the log or the formats contradict each other
    (a file mixing versions)."""
    lo: Minor | None = None
    hi: Minor | None = None
    for f in sorted(set(features)):
        flo, fhi = VERSION_FEATURES.get(f, (None, None))
        lo = max(lo, flo) if lo and flo else lo or flo
        hi = min(hi, fhi) if hi and fhi else hi or fhi
    if lo and hi and lo > hi:
        return None, None
    return (f"{lo[0]}.{lo[1]}" if lo else None), (f"{hi[0]}.{hi[1]}" if hi else None)
