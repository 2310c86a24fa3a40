"""NCCL findings from parsed logs: a table of small rule functions, and a hang diagnosis.

Each rule is a row of the one registry (``analyzers.rules.RULES``, which orders them):
it reads the parsed logs, ``ctx.nccl`` (an :class:`~pardiag.analyzers.nccl.log.NcclReport`),
and returns its findings (lever ``nccl_env``), [] for none::

    Finding(lever="nccl_env", severity="high|medium|low", title=str,
            evidence=[log lines and numbers, as text], ranks=[int],
            est_saving_pct=None, action={"env": {VAR: value, or None to remove}, "doc": url})

``est_saving_pct`` stays None: a log says what is misconfigured, not how much step time
it costs (that needs the trace's communication time). Thresholds and recommendations
come from ``reference/nccl/env_tuning.md``; each rule's docstring names its section.
NVIDIA's guidance there is to *remove* stale work-around variables rather than add new
ones, so actions prefer ``None`` (remove) where an override causes the symptom.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence

from pardiag.analysis import Analysis, Finding, Severity
from pardiag.analysis_blocks import CollLaggard, Hang, HangGroup, StuckRank, nccl_late, nccl_waited
from pardiag.analyzers.nccl.log import (
    Connection,
    NcclProcess,
    NcclReport,
    WatchdogProgress,
    WatchdogTimeout,
    net_plugin_of,
)

if TYPE_CHECKING:  # the registry imports this module
    from pardiag.analyzers.rules import RuleContext

ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
TROUBLESHOOTING_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"
TORCH_ENV_DOC = "https://pytorch.org/docs/stable/torch_nccl_environment_variables.html"
MAX_EVIDENCE = 8

SLOW_INIT_S = 10.0  # communicator init slower than this is reported (medium)
VERY_SLOW_INIT_S = 30.0  # ... and from this on it is high
FAST_ETHERNET_GBPS = 3.125  # 25 Gb/s in GB/s, the topology dump's NET[bw] unit
SOCKET_PRODUCT_MIN = 16  # threads x sockets per thread below this is "not tuned" (AWS auto: 2 x 8)
CHANNELS_PER_NIC = 2
BAD_BOOTSTRAP_IF = re.compile(r"^(?:lo|docker\d*|virbr\d*|veth\w*|ip6tnl\d*)$")
NVLINK_PATH = re.compile(r"^(?:NVL|NVB|C2C)$")


def env_doc(var: str) -> str:
    return f"{ENV_DOC}#{var.lower().replace('_', '-')}"


def _finding(severity: Severity, title: str, evidence: Iterable[str], ranks: Iterable[int],
             env: dict[str, str | None], doc: str) -> Finding:
    return Finding(lever="nccl_env", severity=severity, title=title,
                   evidence=list(dict.fromkeys(evidence))[:MAX_EVIDENCE], ranks=sorted(set(ranks)),
                   est_saving_pct=None, action={"env": env, "doc": doc})


def _who(p: NcclProcess) -> str:
    return p.who


def _node(p: NcclProcess) -> str:
    """The host a process runs on, else its launcher tag (lines without NCCL's prefix)."""
    return p.host or p.tag or "?"


def _ranks(procs: Iterable[NcclProcess]) -> list[int]:
    return [r for p in procs for r in p.ranks]


def _net_conns(p: NcclProcess) -> list[Connection]:
    return [c for c in p.connections if c.transport == "NET"]


def _uses_network(report: NcclReport, procs: Sequence[NcclProcess]) -> bool:
    return report.multi_node or any(_net_conns(p) for p in procs)


# --------------------------------------------------------------------------- rules


IB_CHECKS = ("check: NCCL_IB_DISABLE and NCCL_NET (unset both), NCCL_SOCKET_IFNAME (it picks the bootstrap "
             "and socket interfaces, not the HCAs), NCCL_IB_HCA (must name an active port), the net plugin "
             "(NCCL_NET_PLUGIN, libnccl-net.so) and, in containers, /dev/infiniband and libibverbs")


def _ib_hardware(p: NcclProcess) -> list[str]:
    """Log lines showing InfiniBand/RoCE hardware on the process's host: NET/IB devices
    listed, or an IP-over-IB (``ib*``) interface."""
    hints = [f"{_who(p)} NET/IB lists {', '.join(d.name for d in p.ib_devices)}"] if p.ib_devices else []
    ib_ifs = sorted({i.name for i in p.bootstrap + p.socket_interfaces if i.name.startswith("ib")})
    if ib_ifs:
        hints.append(f"{_who(p)} IP-over-IB interface {', '.join(ib_ifs)} in use")
    return hints


def _ib_overrides(p: NcclProcess) -> list[str]:
    hints = []
    if p.env.get("NCCL_IB_DISABLE", "0") != "0":
        hints.append(f"{_who(p)} NCCL_IB_DISABLE set by environment to {p.env['NCCL_IB_DISABLE']}")
    if p.env.get("NCCL_NET", "").lower() == "socket":
        hints.append(f"{_who(p)} NCCL_NET set by environment to {p.env['NCCL_NET']}")
    return hints


def _ib_missing(p: NcclProcess) -> list[str]:
    hints = [f"{_who(p)} NET/IB : No device found"] if p.ib_no_device and not p.ib_devices else []
    hints += [f"{_who(p)} {w.message}" for w in p.warnings if "libibverbs" in w.message][:1]
    return hints


def _ib_hints(p: NcclProcess) -> list[str]:
    return _ib_hardware(p) + _ib_overrides(p)


def socket_fallback_with_ib(ctx: RuleContext) -> list[Finding]:
    """Inter-node traffic over TCP sockets although InfiniBand/RoCE is there.

    env_tuning.md §2 (``NCCL_IB_DISABLE``, ``NCCL_NET``) and §8 row "Using network Socket
    while HCAs exist". Fires when processes use the Socket network (``Using network
    Socket`` or ``via NET/Socket``) on a multi-node job (or one with NET transport lines)
    and the log shows InfiniBand hardware on their host (NET/IB devices listed, an
    ``ib*`` interface) or on another host of the job (then this host said ``NET/IB : No
    device found`` or could not load libibverbs). Overrides alone (``NCCL_IB_DISABLE``,
    ``NCCL_NET=Socket``) prove no hardware, and a job without IB devices on sockets is
    normal: no finding. The first evidence line says how likely a configuration mistake
    is, the second what to check. Action: remove the overrides and set ``NCCL_NET=IB`` so
    a broken IB setup fails instead of falling back.
    """
    report = ctx.nccl
    hosts = _host_procs(report)
    ib_nodes = sorted({_node(p) for p in report.processes if _ib_hardware(p)})
    procs = [p for p in report.processes if p.fabric == "Socket"
             and (_node(p) in ib_nodes or (ib_nodes and any(_ib_missing(q) for q in hosts.get(p.host, [p]))))]
    if not procs or not _uses_network(report, procs):
        return []
    overrides = [h for p in procs for h in _ib_overrides(p)]
    here = [p for p in procs if _node(p) in ib_nodes]
    elsewhere = [p for p in procs if _node(p) not in ib_nodes]
    if overrides:
        verdict = ("deliberate: NCCL was told not to use InfiniBand; likely a leftover work-around, "
                   "a configuration mistake unless the HCAs are known to be broken")
    elif here:
        verdict = ("very likely a configuration mistake: the HCAs are there (NET/IB lists them, or an IP-over-IB "
                   "interface carries the traffic) but NCCL's network is Socket (the IB transport found no usable "
                   "port, the net plugin failed, or NCCL_IB_HCA names none)")
    else:
        verdict = ("very likely a configuration mistake: hosts " + ", ".join(sorted({_node(p) for p in elsewhere}))
                   + " see no HCA while " + ", ".join(ib_nodes) + " list them (device not passed to the "
                   "container, libibverbs missing, driver down)")
    env: dict[str, str | None] = {"NCCL_IB_DISABLE": None} if any(
        p.env.get("NCCL_IB_DISABLE", "0") != "0" for p in procs) else {}
    env["NCCL_NET"] = "IB"
    ib_seen = [h for p in report.processes if _node(p) in ib_nodes for h in _ib_hardware(p)]
    evidence = [f"Socket network with InfiniBand present: {verdict}", IB_CHECKS]
    evidence += [h for p in here for h in _ib_hardware(p)] + overrides
    evidence += [h for p in procs for h in _ib_missing(p)] + ([] if here else ib_seen[:1])
    evidence += [f"{_who(p)} Using network {p.network}" for p in procs]
    return [_finding("high", "NCCL falls back to TCP sockets although InfiniBand/RoCE is present", evidence,
                     _ranks(procs), env, env_doc("NCCL_NET"))]


P2P_OFF: dict[str, tuple[str, ...]] = {
    "NCCL_P2P_DISABLE": ("1",),
    "NCCL_P2P_LEVEL": ("LOC", "0"),  # NCCL < 2.23 logs NCCL_P2P_DISABLE=1 as NCCL_P2P_LEVEL=LOC
    "NCCL_SHM_DISABLE": ("1",),
}


def _p2p_overrides(p: NcclProcess) -> dict[str, str]:
    return {k: p.env[k] for k, off in P2P_OFF.items() if p.env.get(k, "").upper() in off}


def _intra_node_net(report: NcclReport, p: NcclProcess) -> list[Connection]:
    if report.nnodes == 1:
        return _net_conns(p)
    hosts = report.rank_hosts()
    return [c for c in _net_conns(p) if hosts.get(c.src_rank) is not None
            and hosts.get(c.src_rank) == hosts.get(c.dst_rank)]


def _host_memory_conns(report: NcclReport, p: NcclProcess) -> list[Connection]:
    return [c for c in p.connections if c.transport == "SHM"] + _intra_node_net(report, p)


def _has_nvlink(p: NcclProcess) -> bool:
    return any(NVLINK_PATH.match(g.type_intra) for g in p.patterns)


def _host_procs(report: NcclReport) -> dict[str | None, list[NcclProcess]]:
    out: dict[str | None, list[NcclProcess]] = {}
    for p in report.processes:
        out.setdefault(p.host, []).append(p)
    return out


def _p2p_symptom(report: NcclReport, procs: Sequence[NcclProcess]) -> tuple[dict[str, str], list[Connection]]:
    """Overrides set on a host and the host-memory connections seen there (a pasted log
    can show the ENV line in one process and the transport lines in another)."""
    overrides = {k: v for p in procs for k, v in _p2p_overrides(p).items()}
    conns = [c for p in procs for c in _host_memory_conns(report, p)]
    if overrides or (conns and any(_has_nvlink(p) for p in procs)):
        return overrides, conns
    return {}, []


def p2p_shm_disabled(ctx: RuleContext) -> list[Finding]:
    """GPU-to-GPU traffic inside a node goes through host memory or the NIC.

    env_tuning.md §3 (``NCCL_P2P_DISABLE``, ``NCCL_P2P_LEVEL``, ``NCCL_SHM_DISABLE``) and
    §8 rows "via SHM … or NCCL_P2P_LEVEL … LOC" and "intra-node [send] via NET". Fires,
    per host, when an override turns P2P or SHM off (before NCCL 2.23,
    ``NCCL_P2P_DISABLE=1`` is logged as ``NCCL_P2P_LEVEL set by environment to LOC``):
    high when transport lines show SHM or intra-node NET connections, medium otherwise;
    action removes the overrides. Without an override, SHM only fires (low) when the
    graph search shows NVLink paths, because PCIe topologies can legitimately need SHM.
    """
    report = ctx.nccl
    hits = [(procs, *_p2p_symptom(report, procs)) for procs in _host_procs(report).values()]
    hits = [(procs, o, c) for procs, o, c in hits if o or c]
    if not hits:
        return []
    overrides = {k: v for _, o, _ in hits for k, v in o.items()}
    conns = [c for _, _, cs in hits for c in cs]
    evidence = [f"{_who(p)} {k} set by environment to {v}" for procs, _, _ in hits for p in procs
                for k, v in _p2p_overrides(p).items()]
    evidence += [f"{len(conns)} intra-node connections through host memory, e.g. {c.message}" for c in conns[:1]]
    severity: Severity = "high" if overrides and conns else "medium" if overrides else "low"
    what = "SHM" if overrides and set(overrides) == {"NCCL_SHM_DISABLE"} else "P2P"
    title = (f"{what} disabled by {', '.join(f'{k}={v}' for k, v in sorted(overrides.items()))}: "
             "intra-node traffic goes through host memory" if overrides
             else "GPUs with NVLink talk through host memory (SHM)")
    ranks = [c.own_rank for c in conns] + [r for procs, _, _ in hits for r in _ranks(procs)]
    doc = env_doc("NCCL_P2P_DISABLE" if what == "P2P" else "NCCL_SHM_DISABLE")
    return [_finding(severity, title, evidence, ranks, {k: None for k in overrides}, doc)]


def _bad_bootstrap(p: NcclProcess) -> list[str]:
    return [f"{i.name}:{i.address}" for i in p.bootstrap
            if BAD_BOOTSTRAP_IF.match(i.name) or i.address.startswith(("127.", "fe80:"))]


def bootstrap_on_loopback(ctx: RuleContext) -> list[Finding]:
    """Bootstrap (out-of-band) interface that other nodes cannot reach.

    env_tuning.md §2 ``NCCL_SOCKET_IFNAME`` (a) and §8 row "Bootstrap … Using lo: / docker0
    / virbr / veth on a multi-node job"; formats.md §4.1. ``lo``, ``docker*``, ``virbr*``,
    ``veth*``, ``ip6tnl*``, 127.x and link-local IPv6 addresses count. High on a
    multi-node job; low on one node, where it works but cannot scale out. Action: remove
    ``NCCL_SOCKET_IFNAME`` when it forced the choice, else exclude those interfaces.
    """
    report = ctx.nccl
    procs = [p for p in report.processes if _bad_bootstrap(p)]
    if not procs:
        return []
    forced = any("NCCL_SOCKET_IFNAME" in p.env for p in procs)
    names = sorted({a for p in procs for a in _bad_bootstrap(p)})
    evidence = [f"{_who(p)} Bootstrap : Using {a}" for p in procs for a in _bad_bootstrap(p)]
    evidence += [f"{_who(p)} NCCL_SOCKET_IFNAME set by environment to {p.env['NCCL_SOCKET_IFNAME']}"
                 for p in procs if "NCCL_SOCKET_IFNAME" in p.env]
    multi = report.multi_node
    title = (f"Bootstrap on {', '.join(names)}: "
             + ("other nodes cannot reach it" if multi else "fine on one node, cannot work across nodes"))
    env: dict[str, str | None] = {"NCCL_SOCKET_IFNAME": None if forced else "^lo,docker,virbr,veth"}
    return [_finding("high" if multi else "low", title, evidence, _ranks(procs), env, env_doc("NCCL_SOCKET_IFNAME"))]


def _ib_family(c: Connection) -> bool:
    return c.net is not None and c.net.upper().startswith("IB")


def _gdr_env(procs: Sequence[NcclProcess], no_gdr: Sequence[Connection]) -> dict[str, str | None]:
    notes = [n for p in procs for n in p.gdr_notes]
    if any("Disabled for GPU" in n and "distance" in n for n in notes):
        return {"NCCL_NET_GDR_LEVEL": "PHB"}
    conns = [c for p in procs for c in p.connections if _ib_family(c)]
    sends_only = no_gdr and all(c.direction == "send" for c in no_gdr)
    if sends_only and any(c.gdr and c.direction == "receive" for c in conns):
        return {"NCCL_NET_GDR_READ": "1"}
    return {}


def ib_without_gdrdma(ctx: RuleContext) -> list[Finding]:
    """InfiniBand/RoCE connections without GPU Direct RDMA (data bounces through host memory).

    env_tuning.md §4 (``NCCL_NET_GDR_LEVEL``, ``NCCL_NET_GDR_READ``) and §8 row "IB/RoCE net
    lines without /GDRDMA"; formats.md §8.3. Fires on IB-family NET connections lacking
    ``/GDRDMA``, or ``Connected all rings, use ring … GDR 0`` on an IB network. High when
    no connection uses GDR, medium when some do. Action: ``NCCL_NET_GDR_LEVEL=PHB`` when
    NCCL says GDR was refused for distance, ``NCCL_NET_GDR_READ=1`` when only sends lack
    it (pre-Ampere), else none: load ``nvidia-peermem`` or enable dmabuf.
    """
    report = ctx.nccl
    ib_procs = [p for p in report.processes if any(_ib_family(c) for c in p.connections)
                or (p.fabric in ("IB", "RoCE") and any(c.gdr == 0 for c in p.connected if c.gdr is not None))]
    conns = [c for p in ib_procs for c in p.connections if _ib_family(c)]
    no_gdr = [c for c in conns if not c.gdr]
    ring_off = [p for p in ib_procs if any(c.gdr == 0 for c in p.connected)]
    if not no_gdr and not ring_off:
        return []
    evidence = [f"{len(no_gdr)} of {len(conns)} IB connections without /GDRDMA"] if conns else []
    evidence += [c.message for c in no_gdr[:2]] + [f"{_who(p)} Connected all rings, GDR 0" for p in ring_off]
    evidence += [n for p in ib_procs for n in p.gdr_notes if "Disabled" in n]
    severity: Severity = "high" if len(no_gdr) == len(conns) else "medium"
    procs = [p for p in ib_procs if any(not c.gdr for c in p.connections if _ib_family(c))] + ring_off
    return [_finding(severity, "InfiniBand without GPU Direct RDMA: transfers are staged through host memory",
                     evidence, _ranks(procs), _gdr_env(ib_procs, no_gdr), env_doc("NCCL_NET_GDR_LEVEL"))]


def _split(by_node: dict[str, dict[str, set[str]]]) -> dict[str, set[str]]:
    """One entry per node; a node whose processes disagree gets one entry per process."""
    out: dict[str, set[str]] = {}
    for node, whos in by_node.items():
        values = {v for vs in whos.values() for v in vs}
        if len(values) > 1 and len(whos) > 1:
            out.update((who, set(vs)) for who, vs in whos.items())
        elif values:
            out[node] = values
    return out


def _host_values(report: NcclReport, of: Callable[[NcclProcess], str | None]) -> dict[str, set[str]]:
    by_node: dict[str, dict[str, set[str]]] = {}
    for p in report.processes:
        value = of(p)
        if value and (p.host or p.tag):
            by_node.setdefault(_node(p), {}).setdefault(_who(p), set()).add(value)
    return _split(by_node)


UNNAMED = "(process not named)"


def _host_versions(report: NcclReport) -> dict[str, set[str]]:
    """NCCL/RCCL versions per host, from every version line: NCCL's prefixed lines, bare
    lines given to a process (launcher tag, the line just before), RCCL's banner; a bare
    line in a file of one host belongs to that host; one nobody can be named for counts
    as its own process."""
    by_node: dict[str, dict[str, set[str]]] = {}
    for log in report.logs:
        single = log.hosts[0] if len(log.hosts) == 1 else None
        for v in log.version_lines:
            node = v.host or v.tag or single or UNNAMED
            who = v.who if v.host or v.pid is not None else node
            by_node.setdefault(node, {}).setdefault(who, set()).add(v.text)
    return _split(by_node)


def _differing(values: dict[str, set[str]]) -> list[str]:
    distinct = {v for vs in values.values() for v in vs}
    if len(distinct) < 2:
        return []
    return [f"{host}: {', '.join(sorted(vs))}" for host, vs in sorted(values.items())]


def _minority_ranks(report: NcclReport, values: dict[str, set[str]]) -> list[int]:
    common = Counter(v for vs in values.values() for v in vs).most_common(1)[0][0]
    odd = {h for h, vs in values.items() if vs != {common}}
    ranks = [r for h in report.hosts if h.host in odd for r in h.ranks]
    return ranks + [r for p in report.processes if _who(p) in odd or (not p.host and p.tag in odd) for r in p.ranks]


MISMATCH_WARN = re.compile(r"Mismatched NCCL version detected : rank (?P<r1>\d+) version (?P<v1>\d+) "
                           r"rank (?P<r2>\d+) version (?P<v2>\d+)")


def version_of_code(code: int) -> str:
    """NCCL_VERSION_CODE as a version: 22105 is 2.21.5 (2.9 on), 2708 is 2.7.8 (before)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _mismatch_warning(p: NcclProcess, message: str) -> str:
    m = MISMATCH_WARN.search(message)
    if not m:
        return f"{_who(p)} {message}"
    return (f"{_who(p)} NCCL's own check: rank {m['r1']} runs {version_of_code(int(m['v1']))}, rank {m['r2']} runs "
            f"{version_of_code(int(m['v2']))} ({message})")


def version_mismatch(ctx: RuleContext) -> list[Finding]:
    """NCCL/RCCL version, net plugin or network differing between hosts (or processes of one host).

    env_tuning.md §8 row "version/plugin differs between hosts; Mismatched NCCL version;
    socketFinalizeAccept: wrong magic/type; ncclSocketInit … family N" and §2
    ``NCCL_NET_PLUGIN``; formats.md §2. Compares, per host (per process where a host's
    processes disagree, per launcher tag where lines name no host), every version line
    (prefixed, bare, RCCL's banner), the loaded net plugin, ``NCCL_NET_PLUGIN`` and the
    ``Using network`` name; also fires on NCCL's own "Mismatched NCCL version" warning,
    whose version codes it spells out. Evidence lines name each host and what it runs.
    Always high: mixed installs hang or crash at init.
    """
    report = ctx.nccl
    checks = (("NCCL version", _host_versions(report)),
              ("net plugin", _host_values(report, net_plugin_of)),
              ("NCCL_NET_PLUGIN", _host_values(report, lambda p: p.env.get("NCCL_NET_PLUGIN"))),
              ("network", _host_values(report, lambda p: p.network)))
    evidence: list[str] = []
    ranks: list[int] = []
    what: list[str] = []
    nodes: set[str] = set()
    for name, values in checks:
        lines = _differing(values)
        if lines and name == "NCCL version" and all(v.startswith("RCCL ") for vs in values.values() for v in vs):
            name = "RCCL version"
            lines = _differing({k: {v.removeprefix("RCCL ") for v in vs} for k, vs in values.items()})
        if lines:
            what.append(name)
            evidence += [f"{name} {line}" for line in lines]
            ranks += _minority_ranks(report, values)
            nodes |= {k.split(":")[0] for k in values}
    warns = [_mismatch_warning(p, w.message) for p in report.processes for w in p.warnings
             if "Mismatched NCCL version" in w.message]
    if warns and not any(w.endswith(" version") for w in what):
        what.append("NCCL version")
        nodes.add("?")
    if not what:
        return []
    where = "between hosts" if len(nodes) != 1 else "between processes of one host"
    return [_finding("high", f"{' and '.join(what)} differ {where}: install the same NCCL and plugin "
                     "everywhere", evidence + warns, ranks, {}, TROUBLESHOOTING_DOC)]


STALE_DEFAULTS: dict[str, str | None] = {
    "NCCL_ALGO": None,  # any value is an override
    "NCCL_PROTO": None,
    "NCCL_P2P_DISABLE": "0",
    "NCCL_IB_DISABLE": "0",
}


def _stale(p: NcclProcess) -> dict[str, str]:
    return {k: p.env[k] for k, default in STALE_DEFAULTS.items() if k in p.env and p.env[k] != default}


def stale_overrides(ctx: RuleContext) -> list[Finding]:
    """Debugging work-arounds left set: ``NCCL_ALGO``, ``NCCL_PROTO``, ``NCCL_P2P_DISABLE``,
    ``NCCL_IB_DISABLE``.

    env_tuning.md introduction ("should not be used in production nor retained in
    scripts") and §5 (``NCCL_ALGO``, ``NCCL_PROTO``), §3, §2. Fires on any value of
    ALGO/PROTO and on the DISABLE flags unless they are ``0``. Medium; action removes them.
    A variable that a finding of an earlier row already removes (``ctx.earlier``: the
    symptom rules come first in the registry) is left out: one action per variable.
    """
    report = ctx.nccl
    procs = [p for p in report.processes if _stale(p)]
    if not procs:
        return []
    found = {k: v for p in procs for k, v in _stale(p).items()}
    evidence = [f"{_who(p)} {k} set by environment to {v}" for p in procs for k, v in _stale(p).items()]
    title = f"Work-around override{'s' if len(found) > 1 else ''} left set: " + ", ".join(
        f"{k}={v}" for k, v in sorted(found.items()))
    f = _finding("medium", title, evidence, _ranks(procs), {k: None for k in sorted(found)}, env_doc(sorted(found)[0]))
    return _without_covered(f, ctx.earlier)


def _without_covered(f: Finding, earlier: Sequence[Finding]) -> list[Finding]:
    covered = {k for e in earlier if e.lever == "nccl_env" for k, v in e.action.get("env", {}).items() if v is None}
    env = {k: v for k, v in f.action["env"].items() if k not in covered}
    if not env:
        return []
    evidence = [e for e in f.evidence if any(k in e for k in env)]
    return [replace(f, evidence=evidence, action={**f.action, "env": env})]


PHASE_MEANING: dict[str, str] = {
    "kernels": "CUDA module loading of NCCL's kernels (first context, JIT from PTX)",
    "bootstrap": "waiting for all ranks to arrive over the bootstrap network",
    "topo": "topology detection",
    "connections": "transport setup (IB queue pairs, many peers)",
    "alloc": "buffer allocation",
    "allgathers": "exchanging peer information",
    "graphs": "ring/tree graph search",
}
PHASE_DOC: dict[str, str] = {
    "kernels": "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#lazy-loading",
    "bootstrap": env_doc("NCCL_SOCKET_IFNAME"),
    "connections": env_doc("NCCL_RUNTIME_CONNECT"),
}


def _phase(timing_phases: dict[str, float]) -> tuple[str, float]:
    return max(timing_phases.items(), key=lambda kv: kv[1], default=("?", 0.0))


def _jit_hint(p: NcclProcess) -> list[str]:
    if not (p.version and p.version.cuda and p.cuda_driver_version):
        return []
    built = tuple(int(x) for x in p.version.cuda.split("."))
    driver = (p.cuda_driver_version // 1000, p.cuda_driver_version % 1000 // 10)
    if built >= driver:
        return []
    return [f"NCCL built with CUDA {p.version.cuda}, driver supports {driver[0]}.{driver[1]}: a GPU newer than "
            "the build's kernels makes the driver JIT-compile them from PTX at init"]


def slow_init(ctx: RuleContext) -> list[Finding]:
    """Slow communicator init, with the phase that dominates.

    ``Init timings`` lines (NCCL 2.22+, formats.md §10, seconds) slower than
    ``SLOW_INIT_S`` = 10 s (medium) or ``VERY_SLOW_INIT_S`` = 30 s (high); env_tuning.md §8
    rows "Init timings … kernels ≫ other phases" and "bootstrap large". The phase with
    the largest share is named; ``kernels`` also checks the CUDA build against the
    driver (PTX JIT). Action: ``CUDA_MODULE_LOADING=LAZY`` for ``kernels`` when NCCL
    was built before CUDA 12.2 (lazy loading is the default from 12.2), else a doc link.
    """
    report = ctx.nccl
    slow = [(p, t) for p in report.processes for t in p.init_timings if t.total_s >= SLOW_INIT_S]
    if not slow:
        return []
    p, worst = max(slow, key=lambda pt: pt[1].total_s)
    phase, phase_s = _phase(worst.phases_s)
    share = phase_s / worst.total_s if worst.total_s else 0.0
    evidence = [f"{_who(p)} {worst.message}", f"{len(slow)} rank(s) took ≥ {SLOW_INIT_S:g} s to init",
                f"{phase} {phase_s:g} s of {worst.total_s:g} s ({share:.0%})"]
    evidence += [line for q, _ in slow for line in _jit_hint(q)][:1]
    env: dict[str, str | None] = {}
    if phase == "kernels" and p.version and p.version.cuda and _cuda(p.version.cuda) < (12, 2):
        env["CUDA_MODULE_LOADING"] = "LAZY"
    title = (f"Communicator init takes {worst.total_s:g} s, {share:.0%} of it in '{phase}': "
             f"{PHASE_MEANING.get(phase, 'see NCCL init timings')}")
    severity: Severity = "high" if worst.total_s >= VERY_SLOW_INIT_S else "medium"
    return [_finding(severity, title, evidence, [t.rank for _, t in slow if t.rank is not None], env,
                     PHASE_DOC.get(phase, TROUBLESHOOTING_DOC))]


def _cuda(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".") if x.isdigit())


def _nics(p: NcclProcess) -> int:
    if p.fabric in ("IB", "RoCE"):
        return len(p.ib_devices)
    return len(p.socket_interfaces) if p.fabric == "Socket" else 0


def _channel_shortfall(report: NcclReport, host: str) -> tuple[int, list[str], list[NcclProcess]]:
    procs = [p for p in report.processes if p.host == host and _nics(p) >= 2]
    if not procs:
        return 0, [], []
    nics = max(_nics(p) for p in procs)
    used = {c.net_dev for p in procs for c in _net_conns(p) if c.net_dev is not None}
    stated = [n for p in procs if (n := p.nchannels) is not None]
    evidence = []
    if stated and min(stated) < CHANNELS_PER_NIC * nics:
        evidence.append(f"{host}: {min(stated)} channels for {nics} NICs")
    if used and len(used) < nics:
        evidence.append(f"{host}: NET connections use NIC {sorted(used)} of {nics} listed ({_nic_names(procs)})")
    return nics, evidence, procs


def _nic_names(procs: Sequence[NcclProcess]) -> str:
    names = {i.name for p in procs for i in p.socket_interfaces} | {d.name for p in procs for d in p.ib_devices}
    return ", ".join(sorted(names))


def few_channels(ctx: RuleContext) -> list[Finding]:
    """Too few channels (or NICs left idle) on multi-NIC nodes.

    env_tuning.md §5 ``NCCL_MIN_NCHANNELS`` ("raising NCCL_MIN_NCHANNELS (e.g. ≥ 2 × NICs
    per node) can help") and §8 row "Channel 00/02 / 2 coll channels on an 8-NIC node".
    Multi-node jobs only. Fires when a host lists ≥ 2 NICs for the network in use and
    NCCL stated fewer than ``CHANNELS_PER_NIC`` × NICs channels, or its NET transport
    lines use fewer NICs than listed. Medium. Action: remove ``NCCL_MAX_NCHANNELS`` /
    ``NCCL_MAX_CTAS`` when they cap it, else ``NCCL_MIN_NCHANNELS`` = 2 × NICs.
    """
    report = ctx.nccl
    if not report.multi_node:
        return []
    shortfalls = [_channel_shortfall(report, h.host) for h in report.hosts]
    hits = [(n, e, ps) for n, e, ps in shortfalls if e]
    if not hits:
        return []
    nics = max(n for n, _, _ in hits)
    procs = [p for _, _, ps in hits for p in ps]
    caps: dict[str, str | None] = {k: None for p in procs for k in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS") if k in p.env}
    env: dict[str, str | None] = dict(caps) or {"NCCL_MIN_NCHANNELS": str(CHANNELS_PER_NIC * nics)}
    return [_finding("medium", f"Few channels for {nics} NICs per node: inter-node bandwidth is capped",
                     [e for _, ev, _ in hits for e in ev], _ranks(procs), env, env_doc("NCCL_MIN_NCHANNELS"))]


def _socket_product(p: NcclProcess) -> int:
    if p.socket_threads:
        threads, socks = p.socket_threads
    else:
        threads = _to_int(p.env.get("NCCL_SOCKET_NTHREADS"), 1)
        socks = _to_int(p.env.get("NCCL_NSOCKS_PERTHREAD"), 1)
    return max(threads, 1) * max(socks, 1)


def _to_int(text: str | None, default: int) -> int:
    return int(text) if text and text.lstrip("-").isdigit() else default


def socket_threading(ctx: RuleContext) -> list[Finding]:
    """Socket transport on fast Ethernet with NCCL's default (single-threaded) sockets.

    env_tuning.md §6 ``NCCL_SOCKET_NTHREADS`` / ``NCCL_NSOCKS_PERTHREAD`` ("Using network
    Socket with inter-node busbw far below NIC line rate on ≥25 GbE ⇒ try 4 …; product
    must stay ≤ 64") and §8 last row. Multi-node Socket jobs whose threads × sockets per
    thread (logged, or set by env; auto is 1 × 1 outside AWS/GCP) is below
    ``SOCKET_PRODUCT_MIN`` = 16. Skipped when the topology dump shows NICs below 25 Gb/s;
    medium when it shows ≥ 25 Gb/s, low when the link speed is unknown.
    """
    report = ctx.nccl
    if not report.multi_node:
        return []
    procs = [p for p in report.processes if p.fabric == "Socket" and _socket_product(p) < SOCKET_PRODUCT_MIN]
    links = [b for p in procs for b in p.net_link_gbps]
    if not procs or (links and max(links) < FAST_ETHERNET_GBPS):
        return []
    evidence = [f"{_who(p)} Using network Socket, {_socket_product(p)} socket(s) per connection" for p in procs]
    evidence += [f"NIC link {max(links):g} GB/s ({max(links) * 8:g} Gb/s)"] if links else []
    return [_finding("medium" if links else "low",
                     "TCP sockets with one thread per connection cannot fill a fast Ethernet link", evidence,
                     _ranks(procs), {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"},
                     env_doc("NCCL_SOCKET_NTHREADS"))]


def nccl_findings(report: NcclReport) -> list[dict[str, Any]]:
    """The NCCL rows of the registry on `report` alone, in registry order, as JSON
    (DESIGN.md's ``findings[]``; the Analysis' own findings come from `rules.advise`)."""
    from pardiag.analyzers.rules import RuleContext, run_rules

    from pardiag.run_info import RunInfo

    ctx = RuleContext(Analysis(run=RunInfo(), ranks=[], collectives=[], stragglers=[]), nccl=report)
    return [asdict(f) for f in run_rules(ctx, family="nccl")]


# --------------------------------------------------------------------------- hang diagnosis

FLIGHT_RECORDER_ENV = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
DESYNC_ENV = {"TORCH_NCCL_DESYNC_DEBUG": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def _unique_timeouts(timeouts: Iterable[WatchdogTimeout]) -> list[WatchdogTimeout]:
    seen: dict[tuple[Any, ...], WatchdogTimeout] = {}
    for t in timeouts:
        seen.setdefault((t.rank, t.seq, t.process_group, t.op_type), t)
    return list(seen.values())


def _group_by_pg(timeouts: Sequence[WatchdogTimeout]) -> dict[str, list[WatchdogTimeout]]:
    """Group per process group; a timeout without a group tag joins the one known group
    that timed out in the same SeqNum and op."""
    known = {(t.seq, t.op_type): t.process_group for t in timeouts if t.process_group != "?"}
    groups: dict[str, list[WatchdogTimeout]] = {}
    for t in timeouts:
        pg = t.process_group if t.process_group != "?" else known.get((t.seq, t.op_type), "?")
        groups.setdefault(pg, []).append(t)
    return groups


def _rank_entry(t: WatchdogTimeout, pg: str, progress: Sequence[WatchdogProgress]) -> StuckRank:
    prog = next((p for p in progress if p.rank == t.rank and p.work == t.seq), None)
    return StuckRank(rank=t.rank, process_group=pg, seq=t.seq, op_type=t.op_type, numel_in=t.numel_in,
                     numel_out=t.numel_out, timeout_ms=t.timeout_ms, ran_for_ms=t.ran_for_ms,
                     last_enqueued=prog.last_enqueued if prog else None,
                     last_completed=prog.last_completed if prog else None)


def _is_world_pg(pg: str) -> bool:
    return pg in ("?", "0", "0(default_pg)") or pg.endswith("(default_pg)")


def _diagnose_pg(pg: str, ts: Sequence[WatchdogTimeout], world: int | None) -> HangGroup:
    seqs = [t.seq for t in ts if t.seq is not None]
    top = max(seqs) if seqs else None
    reported = sorted({t.rank for t in ts if t.rank is not None})
    behind = sorted({t.rank for t in ts if t.rank is not None and t.seq is not None and top is not None
                     and t.seq < top})
    missing = sorted(set(range(world)) - set(reported)) if world and _is_world_pg(pg) else None
    at_top = next((t for t in ts if t.seq == top), ts[0])
    desync = len(set(seqs)) > 1 or len({t.op_type for t in ts if t.seq == top}) > 1
    return HangGroup(process_group=pg, seq=top, op_type=at_top.op_type, numel_in=at_top.numel_in,
                     numel_out=at_top.numel_out, timeout_ms=at_top.timeout_ms,
                     kind="desync" if desync else "collective_stuck",
                     ranks_timed_out=reported, ranks_behind=behind, ranks_without_timeout=missing)


def _first_error(report: NcclReport) -> str | None:
    for p in report.processes:
        for w in p.warnings:
            if not w.benign:
                return f"{_who(p)} {w.message}" + (f" ({w.meaning})" if w.meaning else "")
    errors = [e for log in report.logs for e in log.framework_errors]
    return f"{errors[0].name}: {errors[0].meaning}" if errors else None


def _summary(pgs: Sequence[HangGroup], never: Sequence[int] | None) -> str:
    parts = []
    for g in pgs:
        size = f", {g.numel_in} elements" if g.numel_in is not None else ""
        head = (f"process group {g.process_group}: ranks {g.ranks_timed_out} timed out in {g.op_type} "
                f"SeqNum {g.seq}{size} after {g.timeout_ms} ms")
        if g.kind == "desync":
            head += f"; ranks {g.ranks_behind} are at an earlier SeqNum (desync: ranks issued different collectives)"
        else:
            head += "; every reporting rank is stuck on the same collective (no desync)"
        parts.append(head)
    if never:
        parts.append(f"ranks {list(never)} never arrived (behind, or no timeout line)")
    elif never is not None:
        parts.append("every rank timed out in the same collective: suspect the transport or a hung GPU kernel")
    else:
        parts.append("world size unknown: ranks without a timeout line cannot be named")
    return ". ".join(parts) + "."


def _collect_next(report: NcclReport, kind: str, never: Sequence[int] | None) -> list[str]:
    fr = [line for log in report.logs for line in log.flight_recorder]
    steps = [("analyse the flight-recorder dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE, default /tmp/nccl_trace_rank_"
              "<rank>) with torchfrtrace" if fr else
              "rerun with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 (flight recorder) and "
              "analyse the dumps with torchfrtrace")]
    if never:
        steps.append(f"py-spy dump --native on ranks {list(never)} while hung: where they are instead of the "
                     "collective")
    if kind == "desync":
        steps.append("rerun with TORCH_NCCL_DESYNC_DEBUG=1 TORCH_DISTRIBUTED_DEBUG=DETAIL to name the divergent "
                     "collective")
    if not report.processes:
        steps.append("rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV to see transport warnings")
    else:
        steps.append("look for NCCL WARN lines on the hosts of the late ranks (network errors)")
    return steps


def coll_laggards(report: NcclReport) -> list[CollLaggard]:
    """Processes whose last COLL ``opCount`` (formats.md §11) is behind the others' on
    communicators of the same size: the ones that stopped issuing collectives first.
    Comm pointers differ per process, so communicators are matched by size."""
    last: dict[int, list[tuple[NcclProcess, int]]] = {}
    for p in report.processes:
        by_size: dict[int, int] = {}
        for c in p.coll_calls:
            by_size[c.nranks] = max(by_size.get(c.nranks, 0), c.op_count)
        for size, op in by_size.items():
            last.setdefault(size, []).append((p, op))
    out = []
    for size, entries in sorted(last.items()):
        top = max(op for _, op in entries)
        out += [CollLaggard(host=p.host, pid=p.pid, ranks=list(p.ranks), nranks=size, last_op_count=op,
                            behind_by=top - op) for p, op in entries if op < top]
    return out


def hang_diagnosis(report: NcclReport, world_size: int | None = None) -> Hang | None:
    """From PyTorch watchdog timeouts: which ranks were stuck in which collective (process
    group, SeqNum, op, size), which ranks never arrived (an earlier SeqNum, or no timeout
    line at all when the world size is known), and what to collect next. None without
    timeouts. Logic: formats.md §14 "Diagnostic logic"; env_tuning.md §7.
    """
    timeouts = _unique_timeouts(report.timeouts)
    if not timeouts:
        return None
    world = world_size or report.world_size
    groups = _group_by_pg(timeouts)
    pgs = [_diagnose_pg(pg, ts, world) for pg, ts in sorted(groups.items())]
    kind: Literal["desync", "collective_stuck"] = "desync" if any(g.kind == "desync" for g in pgs) else "collective_stuck"
    never = _never_arrived(pgs)
    env = dict(FLIGHT_RECORDER_ENV, **(DESYNC_ENV if kind == "desync" else {}))
    stuck = [_rank_entry(t, pg, report.progress) for pg, ts in sorted(groups.items()) for t in ts]
    return Hang(source="nccl", kind=kind, summary=_summary(pgs, never), world_size=world, process_groups=pgs,
                ranks_stuck=stuck, never_arrived=never, coll_laggards=coll_laggards(report),
                first_error=_first_error(report),
                flight_recorder=[line for log in report.logs for line in log.flight_recorder],
                collect_next=_collect_next(report, kind, never), env=env, doc=TORCH_ENV_DOC,
                waited=nccl_waited(stuck), late=nccl_late(pgs, never))


def _never_arrived(pgs: Sequence[HangGroup]) -> list[int] | None:
    behind = {r for g in pgs for r in g.ranks_behind}
    missing = [g.ranks_without_timeout for g in pgs if g.ranks_without_timeout is not None]
    if not missing and not behind:
        return None
    return sorted(behind | {r for m in missing for r in m})
