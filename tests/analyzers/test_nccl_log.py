"""NCCL log parsing and NCCL findings.

Real logs (shared reference folder): each test encodes by hand the facts the log's
header says a correct parser must conclude. Format variants: the example lines of
formats.md, one test per variant. Rules: each fires on a log showing its symptom and
stays quiet on a healthy one. Garbage never raises.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pardiag.analysis import Analysis
from pardiag.run_info import RunInfo
from pardiag.analyzers.nccl.findings import coll_laggards, hang_diagnosis, nccl_findings
from pardiag.analyzers.nccl.log import (
    MESSAGE_RULES,
    Interface,
    MessageRule,
    NcclLog,
    NcclProcess,
    NcclReport,
    merge_logs,
    net_plugin_of,
    parse_nccl_log,
    parse_nccl_logs,
    strip_wrappers,
    version_text,
)
from pardiag.analyzers.rules import RULES, Row, RuleContext

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "nccl"
LOGS = REFERENCE / "logs"
needs_logs = pytest.mark.skipif(not LOGS.is_dir(), reason="reference NCCL logs not present (shared/reference/nccl)")

def _alone(row: Row) -> Callable[[NcclReport], list[dict[str, Any]]]:
    """An NCCL row of the registry on a report alone, its findings as JSON."""
    def check(report: NcclReport) -> list[dict[str, Any]]:
        ctx = RuleContext(Analysis(run=RunInfo(), ranks=[], collectives=[], stragglers=[]), nccl=report)
        return [asdict(f) for f in row.check(ctx)]
    return check


RULE = {row.name: _alone(row) for row in RULES if row.family == "nccl"}


def ref(prefix: str) -> NcclLog:
    path = next(LOGS.glob(f"{prefix}-*.log"))
    return parse_nccl_log(path)


def report_of(log: NcclLog) -> NcclReport:
    return merge_logs([log])


def lines(*text: str) -> NcclLog:
    return parse_nccl_log(list(text))


# --------------------------------------------------------------------------- reference logs


def check_01(log: NcclLog) -> None:
    # NCCL 2.5.6, 2 nodes x 4 GPUs, one process per node, sockets only, two NICs configured.
    assert log.version is None and log.version_range == ("2.5", "2.6")  # dated from the formats alone
    assert log.hosts == ("sh-01", "sh-03")
    assert {(p.host, p.pid) for p in log.processes} == {("sh-01", 98911), ("sh-03", 97552)}
    assert log.network == "Socket" and all(p.fabric == "Socket" and p.network_inferred for p in log.processes)
    assert not any(p.ib_devices for p in log.processes)
    for p in log.processes:
        assert [(i.index, i.name) for i in p.bootstrap] == [(0, "enP1p1s0f0"), (1, "enP1p1s0f1")]
        assert [(i.index, i.name) for i in p.socket_interfaces] == [(0, "enP1p1s0f0"), (1, "enP1p1s0f1")]
    assert [i.address for i in log.processes[0].bootstrap] == ["10.30.0.127<0>", "10.30.0.227<0>"]
    conns = log.connections
    assert len(conns) == 4 and all(c.legacy_ring and c.via == "NET/Socket/0" and c.net_dev == 0 for c in conns)
    assert {c.direction for c in conns} == {"send", "receive"}
    assert {c.src_dev for c in conns} | {c.dst_dev for c in conns} == {"b01000", "201000", "a01000"}
    assert max(log.ranks_seen) == 7 and log.nranks is None and log.nranks_min == 8
    assert log.lines_unrecognized == 0  # blank lines skipped, header comments ignored
    assert set(log.processes[1].devices) == {0, 2, 3}  # one process drives several GPUs


def check_05(log: NcclLog) -> None:
    # NCCL 2.10.3 single node, no libibverbs, sockets.
    assert log.version is not None and (log.version.version, log.version.cuda) == ("2.10.3", "11.3")
    assert log.hosts == ("ai",) and sorted(d for p in log.processes for d in p.devices) == [0, 1, 2, 3]
    assert log.network == "Socket"
    assert {i.name + ":" + i.address for p in log.processes for i in p.bootstrap} == {"eth0:162.30.2.40<0>"}
    assert {i.name for p in log.processes for i in p.socket_interfaces} == {"eth0"}
    warns = log.warnings
    assert len(warns) == 3 and all(w.location == "misc/ibvwrap.cc:63" for w in warns)
    assert all(w.message == "Failed to open libibverbs.so[.1]" and w.benign for w in warns)
    assert log.fatal_warnings == () and all(p.errors == () for p in log.processes)
    assert {net_plugin_of(p) for p in log.processes if p.plugins} == {"internal"}
    report = report_of(log)
    assert report.hosts[0].versions == ("2.10.3+cuda11.3",) and not report.multi_node
    assert nccl_findings(report) == [] and hang_diagnosis(report) is None  # nothing fatal in init


def check_08(log: NcclLog) -> None:
    # NCCL 2.19.3, one node, loopback bootstrap, P2P disabled => SHM, HPC-X plugins.
    assert log.version is not None and (log.version.version, log.version.cuda) == ("2.19.3", "12.2")
    assert {p.cuda_driver_version for p in log.processes} - {None} == {12000}
    assert {(i.name, i.address) for p in log.processes for i in p.bootstrap} == {("lo", "127.0.0.1<0>")}
    env = {k: v for p in log.processes for k, v in p.env.items()}
    assert env == {"NCCL_SOCKET_IFNAME": "lo", "NCCL_P2P_LEVEL": "LOC"}
    plugins = {line for p in log.processes for line in p.plugins}
    assert "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)" in plugins
    assert "NET/Plugin: Loaded coll plugin SHARP (v6)" in plugins
    assert {net_plugin_of(p) for p in log.processes if p.plugins} == {"NCCL RDMA Plugin v6 (v6)"}
    conns = log.connections
    assert len(conns) == 4 and all(c.transport == "SHM" and c.via == "SHM/direct/direct" for c in conns)
    assert all(c.conn_index is None and not c.legacy_ring for c in conns)
    rings = [r for p in log.processes for r in p.rings]
    assert [(r.channel, r.nchannels, r.ranks) for r in rings] == [(0, 2, (0, 1)), (1, 2, (0, 1))]
    p65960 = next(p for p in log.processes if p.pid == 65960)
    assert p65960.coll_channels == 2 and p65960.p2p_channels == 2
    assert p65960.thread_thresholds == "8/8/64 | 16/8/64 | 512 | 512"
    assert [c.what for c in p65960.connected] == ["rings", "trees"]
    assert next(p for p in log.processes if p.pid == 65958).devices == (1, 0)
    assert sum(len(p.trees) for p in log.processes) == 2
    assert log.ranks_seen == (0, 1) and log.version_range == ("2.18", "2.19")
    assert log.network is None  # no "Using network" line and no NET transport in the excerpt


def check_13(log: NcclLog) -> None:
    # NCCL 2.25.1 DGX B200, init dominated by kernel loading, lazy P2P/CUMEM connections.
    versions = {(p.pid, p.version.version) for p in log.processes if p.version}
    assert versions == {(1106803, "2.25.1"), (1106805, "2.25.1")}  # INFO version line, one per process
    assert {(i.name, i.address) for p in log.processes for i in p.bootstrap} == {("bond0", "172.19.50.38<0>")}
    assert {p.env.get("NCCL_SOCKET_IFNAME") for p in log.processes if p.env} == {"bond0"}
    assert {p.comm_config.get("Blocking") for p in log.processes if p.comm_config} == {"1"}
    init = next(i for p in log.processes for i in p.inits)
    assert (init.api, init.rank, init.nranks, init.cuda_dev, init.nvml_dev, init.bus_id, init.comm_id, init.phase) == (
        "ncclCommInitRankConfig", 0, 8, 0, 0, "18000", "0x2fb902677fd5202e", "COMPLETE")
    timings = sorted((t.rank, t.total_s, t.phases_s["kernels"]) for p in log.processes for t in p.init_timings)
    assert timings == [(0, 55.17, 52.33), (3, 55.01, 52.45), (4, 54.93, 52.94)]
    assert all(t.api == "ncclCommInitRankConfig" and t.nranks == 8 for p in log.processes for t in p.init_timings)
    assert {c.via for c in log.connections} == {"P2P/CUMEM"} and {c.conn_index for c in log.connections} == {0}
    assert max(p.channels_seen for p in log.processes) == 32
    assert [(c.what, c.pxn, c.gdr) for p in log.processes for c in p.connected] == [("rings", 0, 1)]
    assert any(line.startswith("TUNER/Plugin") for p in log.processes for line in p.plugins)
    assert log.nranks == 8 and log.version_range[0] == "2.24"
    assert len(log.torch_notes) == 1 and "using GPU 6 as device" in log.torch_notes[0]


def check_16(log: NcclLog) -> None:
    # Ray-prefixed COLL lines, 128 ranks.
    assert len(log.hosts) == 3 and all(h.startswith("r24-02-22-23-29-0066-raycluster") for h in log.hosts)
    assert {p.pid for p in log.processes} == {615, 22754, 619}
    calls = [c for p in log.processes for c in p.coll_calls]
    assert len(calls) == 4 and all(c.func == "AllReduce" and c.nranks == 128 for c in calls)
    assert all(c.datatype == 7 and c.dtype == "float32" and c.op == 0 and c.root == 0 and c.in_place for c in calls)
    assert {(c.op_count, c.count, c.size_bytes) for c in calls} == {
        (0x139D, 7382228, 29_528_912), (0x139E, 7066572, 28_266_288)}
    srrss = next(p for p in log.processes if p.pid == 22754)
    assert [c.op_count for c in srrss.coll_calls] == [0x139D, 0x139E] and srrss.coll_calls_total == 2
    assert log.nranks == 128 and log.lines_unrecognized == 0
    # opCount per process: the fqztx worker (pid 615) is one collective behind in this excerpt
    assert [(d.pid, d.nranks, d.last_op_count, d.behind_by) for d in coll_laggards(report_of(log))] == [
        (615, 128, 0x139D, 1)]


def check_17(log: NcclLog) -> None:
    # PyTorch watchdog timeouts, PG GUID prefix format.
    assert log.processes == ()
    ts = sorted(log.timeouts, key=lambda t: t.rank or 0)
    assert [(t.rank, t.seq, t.op_type, t.numel_in, t.numel_out, t.timeout_ms) for t in ts] == [
        (r, 808, "ALLREDUCE", 9801523, 9801523, 600000) for r in (0, 1, 2)]
    assert [t.ran_for_ms for t in ts] == [600030, 600020, 600061]
    assert [(p.rank, p.pg_id, p.pg_guid, p.pg_desc, p.work, p.last_enqueued, p.last_completed)
            for p in sorted(log.progress, key=lambda p: p.rank)] == [
        (0, "0", "0", "default_pg", 808, 811, 807), (1, "0", "0", "default_pg", 808, 811, 807)]
    d = hang_diagnosis(report_of(log))
    assert d is not None and d.kind == "collective_stuck" and d.process_groups and d.ranks_stuck and d.env
    (pg,) = d.process_groups
    assert (pg.process_group, pg.seq, pg.op_type, pg.numel_in, pg.ranks_timed_out) == (
        "0(default_pg)", 808, "ALLREDUCE", 9801523, [0, 1, 2])
    assert pg.ranks_behind == [] and d.never_arrived is None  # world size not in the log
    assert d.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] and d.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert any("NCCL_DEBUG=INFO" in step for step in d.collect_next)
    assert {(r.rank, r.last_completed) for r in d.ranks_stuck} == {(0, 807), (1, 807), (2, None)}
    with_world = hang_diagnosis(report_of(log), world_size=4)
    assert with_world is not None and with_world.never_arrived == [3]


REFERENCE_CHECKS: dict[str, Callable[[NcclLog], None]] = {
    "01": check_01, "05": check_05, "08": check_08, "13": check_13, "16": check_16, "17": check_17}


def reference_files() -> list[Path]:
    return sorted(LOGS.glob("*.log")) if LOGS.is_dir() else []


@needs_logs
def test_every_reference_log_has_a_check() -> None:
    assert {p.name[:2] for p in reference_files()} == set(REFERENCE_CHECKS)


@needs_logs
@pytest.mark.parametrize("prefix", sorted(REFERENCE_CHECKS))
def test_reference_log(prefix: str) -> None:
    log = ref(prefix)
    REFERENCE_CHECKS[prefix](log)
    json.dumps(log.to_dict())
    json.dumps(report_of(log).to_dict())


@needs_logs
def test_many_per_process_files_merge_per_host(tmp_path: Path) -> None:
    """A run directory's NCCL folder: one file per process, merged per host."""
    source = next(LOGS.glob("05-*.log")).read_text().splitlines()
    for pid in ("480850", "480851", "480852", "480853"):
        (tmp_path / f"ai.{pid}.log").write_text("\n".join(l for l in source if f":{pid}:" in l) + "\n")
    (tmp_path / "other.1.log").write_bytes(b"\xff\xfe\x00garbage\nother:1:1 [0] NCCL INFO Using network IB\n")
    report = parse_nccl_logs([tmp_path])
    assert len(report.logs) == 5
    assert [h.host for h in report.hosts] == ["ai", "other"]
    ai = report.hosts[0]
    assert ai.pids == (480850, 480851, 480852, 480853) and ai.networks == ("Socket",)
    assert ai.bootstrap_interfaces == ("eth0",) and report.hosts[1].networks == ("IB",)


def test_missing_file_is_an_empty_log(tmp_path: Path) -> None:
    log = parse_nccl_log(tmp_path / "absent.log")
    assert log.processes == () and log.read_error and "FileNotFoundError" in log.read_error


# --------------------------------------------------------------------------- message table


@pytest.mark.parametrize("rule", MESSAGE_RULES, ids=[r.kind for r in MESSAGE_RULES])
def test_message_rule_matches_its_example_first(rule: MessageRule) -> None:
    assert rule.pattern.match(rule.example), rule.example
    first = next(r for r in MESSAGE_RULES if r.pattern.match(rule.example))
    assert first.kind == rule.kind


# --------------------------------------------------------------------------- format variants

P = "host-a:1234:1240 [0] NCCL INFO "


def one(log: NcclLog) -> NcclProcess:
    (p,) = log.processes
    return p


VARIANTS: list[tuple[str, list[str], Callable[[NcclLog], object], object]] = [
    # §1.1 prefixes
    ("prefix INFO 2.4-2.25", ["d5618706-01:1106803:1106803 [4] NCCL INFO NCCL version 2.25.1+cuda12.2"],
     lambda l: (one(l).host, one(l).pid, one(l).devices, version_text(one(l).version)),
     ("d5618706-01", 1106803, (4,), "2.25.1+cuda12.2")),
    ("prefix WARN 2.4-2.25", ["", "ai:480850:480850 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]"],
     lambda l: [(w.location, w.benign) for w in l.warnings], [("misc/ibvwrap.cc:63", True)]),
    ("prefix WARN 2.26 timestamp", ["[2025-03-19 12:03:46] host-a:1:2 [0] transport/net_ib.cc:1234 NCCL WARN "
                                    "NET/IB : Got completion from peer 10.0.0.2<5678> with status=12 opcode=0 len=0 "
                                    "vendor err 129 (Send)"],
     lambda l: (l.warnings[0].timestamp, "retry exceeded" in (l.warnings[0].meaning or ""), l.version_range[0]),
     ("2025-03-19 12:03:46", True, "2.26")),
    ("prefix WARN 2.30 function", ["host-a:1:2 [0] misc/socket.cc:717 (ncclSocketConnect) NCCL WARN ncclSocketInit: "
                                   "connecting to address  with family 0 is neither AF_INET(2) nor AF_INET6(10)"],
     lambda l: (l.warnings[0].func, l.warnings[0].location, "versions differ" in (l.warnings[0].meaning or "")),
     ("ncclSocketConnect", "misc/socket.cc:717", True)),
    ("prefix user-trimmed", [" [0] NCCL INFO Ring 00 : 15[41000] -> 0[1b000] [receive] via NET/IB/0"],
     lambda l: (one(l).host, one(l).connections[0].own_rank, one(l).connections[0].via), (None, 0, "NET/IB/0")),
    # §2 versions
    ("version bare <=2.21", ["NCCL version 2.7.8+cuda10.2"], lambda l: version_text(l.version), "2.7.8+cuda10.2"),
    ("version INFO >=2.22", [P + "NCCL version 2.25.1+cuda12.2"], lambda l: version_text(one(l).version),
     "2.25.1+cuda12.2"),
    ("version RCCL block", ["RCCL version : 2.21.5-HEAD:9a0e6a1", "HIP version  : 6.2.41133-dd7f95766"],
     lambda l: l.rccl, {"RCCL version": "2.21.5-HEAD:9a0e6a1", "HIP version": "6.2.41133-dd7f95766"}),
    ("version RCCL old", [P + "RCCL version 2.6.4+hip3.5"], lambda l: one(l).rccl_version, "2.6.4+hip3.5"),
    # §3 environment
    ("env integer", [P + "NCCL_IB_DISABLE set by environment to 0."], lambda l: one(l).env, {"NCCL_IB_DISABLE": "0"}),
    ("env string", [P + "NCCL_SOCKET_IFNAME set by environment to bond0"], lambda l: one(l).env,
     {"NCCL_SOCKET_IFNAME": "bond0"}),
    ("env path type", [P + "NCCL_P2P_LEVEL set by environment to LOC"], lambda l: one(l).env, {"NCCL_P2P_LEVEL": "LOC"}),
    ("env cross nic", [P + "NCCL_CROSS_NIC set by environment to 2."], lambda l: one(l).env, {"NCCL_CROSS_NIC": "2"}),
    ("env NET set to", [P + "NCCL_IB_HCA set to mlx5_0"], lambda l: one(l).env, {"NCCL_IB_HCA": "mlx5_0"}),
    ("comm config", [P + "Comm config Blocking set to 1"], lambda l: one(l).comm_config, {"Blocking": "1"}),
    # §4.1 bootstrap
    ("bootstrap 2.5-2.7 list", [P + "Bootstrap : Using [0]ib8:192.168.1.8<0> [1]ib9:192.168.1.9<0>"],
     lambda l: [(i.index, i.name, i.address) for i in one(l).bootstrap],
     [(0, "ib8", "192.168.1.8<0>"), (1, "ib9", "192.168.1.9<0>")]),
    ("bootstrap 2.8-2.23", [P + "Bootstrap : Using eth0:162.30.2.40<0>"],
     lambda l: [(i.index, i.name, i.address) for i in one(l).bootstrap], [(None, "eth0", "162.30.2.40<0>")]),
    ("bootstrap 2.24+", [P + "Bootstrap: Using bond0:172.19.50.38<0>"],
     lambda l: ([i.name for i in one(l).bootstrap], l.version_range[0]), (["bond0"], "2.24")),
    # §4.2 sockets
    ("net socket one", [P + "NET/Socket : Using [0]eth0:10.0.0.34<0>"],
     lambda l: [(i.index, i.name) for i in one(l).socket_interfaces], [(0, "eth0")]),
    ("net socket two", [P + "NET/Socket : Using [0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>"],
     lambda l: [i.name for i in one(l).socket_interfaces], ["ibs85f0", "ib0"]),
    ("net socket threads", [P + "NET/Socket: Using 2 threads and 8 sockets per thread"],
     lambda l: one(l).socket_threads, (2, 8)),
    # §4.3 IB
    ("net ib <=2.11", [P + "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>"],
     lambda l: ([(d.name, d.port, d.link) for d in one(l).ib_devices], str(one(l).ib_oob), one(l).ib_relaxed_ordering),
     ([("mlx5_0", 1, "IB")], str(Interface("ib0", "192.168.11.1<0>")), False)),
    ("net ib 2.12+ RoCE [RO]", [P + "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB bond0:10.82.177.33<0>",
                                P + "Using network IB"],
     lambda l: ([d.name for d in one(l).ib_devices], one(l).ib_relaxed_ordering, one(l).fabric),
     (["mlx5_0", "mlx5_1"], True, "RoCE")),
    ("net ib SHARP", [P + "NET/IB : Using [0]mlx5_54:1/IB/SHARP [RO]; OOB eth0:10.224.3.43<0>"],
     lambda l: [(d.name, d.link) for d in one(l).ib_devices], [("mlx5_54", "IB/SHARP")]),
    ("net ib merged", [P + "NET/IB : Using [0]={[0] mlx5_0:1/RoCE, [1] mlx5_1:1/RoCE} [RO]; OOB bond0:10.0.0.1<0>"],
     lambda l: [(d.index, d.name, d.link) for d in one(l).ib_devices], [(0, "mlx5_0+mlx5_1", "RoCE")]),
    ("net ib none", [P + "NET/IB : No device found."], lambda l: (one(l).ib_no_device, one(l).ib_devices), (True, ())),
    ("net ib empty list", [P + "NET/IB : Using [RO]; OOB eth0:10.0.0.1<0>"],
     lambda l: (one(l).ib_no_device, one(l).ib_devices), (True, ())),
    ("gdr per HCA", [P + "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)"],
     lambda l: len(one(l).gdr_notes), 1),
    # §4.4 network and plugins
    ("using network IB", [P + "Using network IB"], lambda l: (one(l).network, one(l).fabric), ("IB", "IB")),
    ("using network plugin", [P + "Using network IBext_v8"], lambda l: one(l).fabric, "IB"),
    ("using network with space", [P + "Using network AWS Libfabric"], lambda l: one(l).fabric, "AWS Libfabric"),
    ("plugin none 2.5-2.16", [P + "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation"],
     lambda l: net_plugin_of(one(l)), "internal"),
    ("plugin internal 2.21-2.25", [P + "NET/Plugin: Using internal network plugin."], lambda l: net_plugin_of(one(l)),
     "internal"),
    ("plugin loaded", [P + "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)"], lambda l: net_plugin_of(one(l)),
     "NCCL RDMA Plugin v6 (v6)"),
    ("plugin HPC-X", [P + "P2P plugin IBext"], lambda l: net_plugin_of(one(l)), "IBext"),
    # §5 init lines
    ("init 2.4", [P + "comm 0x7f4ce0006640 rank 5 nranks 16 cudaDev 5 nvmlDev 5 - Init COMPLETE"],
     lambda l: (one(l).inits[0].rank, one(l).inits[0].nvml_dev, one(l).inits[0].bus_id), (5, 5, None)),
    ("init 2.8-2.15", [P + "comm 0x7f4ce0006640 rank 5 nranks 16 cudaDev 5 busId 89000 - Init COMPLETE"],
     lambda l: (one(l).inits[0].nranks, one(l).inits[0].bus_id, one(l).nranks), (16, "89000", 16)),
    ("init 2.18-2.20", [P + "comm 0x55555d812aa0 rank 11 nranks 16 cudaDev 3 nvmlDev 3 busId 4e000 commId "
                            "0xf03f81dc1a49efab - Init START"],
     lambda l: (one(l).inits[0].phase, one(l).inits[0].comm_id, one(l).inits[0].api),
     ("START", "0xf03f81dc1a49efab", None)),
    ("init 2.23+ api", [P + "ncclCommInitRankConfig comm 0x5629b5ee7340 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 "
                            "commId 0x2fb902677fd5202e - Init COMPLETE"],
     lambda l: one(l).inits[0].api, "ncclCommInitRankConfig"),
    ("init split", [P + "ncclCommSplit comm 0x5629b5ee8000 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 2a000 parent "
                        "0x5629b5ee7340 splitCount 1 color 0 key 1- Init START"],
     lambda l: (one(l).inits[0].api, one(l).inits[0].rank, one(l).inits[0].nranks), ("ncclCommSplit", 1, 4)),
    ("init 2.29 rank tag", [P + "[Rank 3] ncclCommInitRank comm 0x1 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 5a000 "
                                "commId 0x1 - Init START"], lambda l: one(l).inits[0].rank, 3),
    ("comm shape", [P + "comm 0x5639e9f0e8c0 rank 0 nRanks 24 nNodes 3 localRanks 8 localRank 0 MNNVL 0"],
     lambda l: (one(l).shapes[0].nnodes, one(l).shapes[0].local_ranks, report_of(l).nnodes), (3, 8, 3)),
    ("cuda driver", [P + "cudaDriverVersion 12040"], lambda l: one(l).cuda_driver_version, 12040),
    # §6 graph
    ("pattern bw", [P + "Pattern 4, crossNic 1, nChannels 4, bw 24.000000/24.000000, type NVL/PIX, sameChannels 0"],
     lambda l: (one(l).patterns[0].nchannels, one(l).patterns[0].type_intra, one(l).nchannels), (4, "NVL", 4)),
    ("pattern speed", [P + "Pattern 4, crossNic 0, nChannels 2, speed 12.000000/12.000000, type PHB/PIX, sameChannels 1"],
     lambda l: one(l).patterns[0].bw_intra_gbps, 12.0),
    ("topology NET link", [P + "+ NET[50.0] - NET/3 (guid/port/50.000000)"], lambda l: one(l).net_link_gbps, (50.0,)),
    # §7 rings, trees, channel summary
    ("ring 2.5-2.22", [P + "Channel 00/02 :    0   1"], lambda l: [(r.channel, r.nchannels, r.ranks) for r in one(l).rings],
     [(0, 2, (0, 1))]),
    ("ring 2.23+", [P + "Channel 01/16 : 0 1 2 3"], lambda l: (one(l).rings[0].ranks, one(l).nchannels),
     ((0, 1, 2, 3), 16)),
    ("ring truncated", [P + "Channel 00/32 : 0 1 2 3 4 5..."], lambda l: one(l).rings[0].truncated, True),
    ("ring 2.4", [P + "Ring 00 :  0 1 2 3"], lambda l: one(l).rings[0].ranks, (0, 1, 2, 3)),
    ("trees 2.5-2.7", [P + "Trees [0] 1/-1/-1->0->7|7->0->1/-1/-1"], lambda l: (len(one(l).trees), l.version_range),
     (1, ("2.5", "2.7"))),
    ("trees 2.8+", [P + "Trees [0] -1/-1/-1->1->0 [1] -1/-1/-1->1->0"], lambda l: one(l).trees,
     ("[0] -1/-1/-1->1->0 [1] -1/-1/-1->1->0",)),
    ("channels 2.7-2.16", [P + "2 coll channels, 2 p2p channels, 2 p2p channels per peer"],
     lambda l: (one(l).coll_channels, one(l).p2p_channels), (2, 2)),
    ("channels 2.17-2.19", [P + "2 coll channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer"],
     lambda l: one(l).coll_channels, 2),
    ("channels 2.20+", [P + "16 coll channels, 0 collnet channels, 16 nvls channels, 16 p2p channels, "
                             "2 p2p channels per peer"],
     lambda l: (one(l).coll_channels, one(l).nchannels), (16, 16)),
    ("thread thresholds", [P + "threadThresholds 8/8/64 | 32/8/64 | 512 | 512"], lambda l: one(l).thread_thresholds,
     "8/8/64 | 32/8/64 | 512 | 512"),
    # §8 transports
    *[(f"via {via}", [P + line], lambda l: tuple((c.transport, c.via, c.gdr, c.net, c.net_dev, c.direction)
                                                for c in one(l).connections), expected)
      for via, line, expected in [
          ("P2P/IPC/read", "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
           (("P2P", "P2P/IPC/read", False, None, None, None),)),
          ("P2P/CUMEM", "Channel 00/0 : 3[3] -> 4[4] via P2P/CUMEM", (("P2P", "P2P/CUMEM", False, None, None, None),)),
          ("P2P/CUMEM/read", "Channel 00/0 : 0[0] -> 7[7] via P2P/CUMEM/read",
           (("P2P", "P2P/CUMEM/read", False, None, None, None),)),
          ("P2P/direct pointer", "Channel 00 : 0[25000] -> 1[2b000] via P2P/direct pointer/read",
           (("P2P", "P2P/direct pointer/read", False, None, None, None),)),
          ("P2P/indirect", "Channel 00/1 : 0[0] -> 3[3] via P2P/indirect/1[1]",
           (("P2P", "P2P/indirect/1[1]", False, None, None, None),)),
          ("SHM 2.13-2.29", "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
           (("SHM", "SHM/direct/direct", False, None, None, None),)),
          ("SHM 2.30", "Channel 00 : 0[0] -> 1[1] via SHM/direct", (("SHM", "SHM/direct", False, None, None, None),)),
          ("SHM <=2.12", "Channel 00 : 0[0] -> 1[1] via direct shared memory",
           (("SHM", "direct shared memory", False, None, None, None),)),
          ("NET 2.7 GDRDMA", "Channel 02 : 3[ca000] -> 0[87000] [send] via NET/IB/0/GDRDMA",
           (("NET", "NET/IB/0/GDRDMA", True, "IB", 0, "send"),)),
          ("NET plugin GDRDMA", "Channel 07/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/7/GDRDMA",
           (("NET", "NET/IBext_v8/7/GDRDMA", True, "IBext_v8", 7, "send"),)),
          ("NET plugin no GDR", "Channel 00/0 : 36[4] -> 52[4] [send] via NET/IBext_v8/3",
           (("NET", "NET/IBext_v8/3", False, "IBext_v8", 3, "send"),)),
          ("NET Socket", "Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
           (("NET", "NET/Socket/3", False, "Socket", 3, "send"),)),
          ("NET Shared", "Channel 02/1 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA/Shared",
           (("NET", "NET/IB/0/GDRDMA/Shared", True, "IB", 0, "send"),)),
          ("NET proxy", "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/3(1)/GDRDMA",
           (("NET", "NET/IB/3(1)/GDRDMA", True, "IB", 3, "receive"),)),
          ("NET 2.26 PCI", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA(PCI)",
           (("NET", "NET/IB/0/GDRDMA(PCI)", True, "IB", 0, "send"),)),
          ("NET plugin name with space", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
           (("NET", "NET/AWS Libfabric/0/GDRDMA", True, "AWS Libfabric", 0, "send"),)),
          ("Ring 2.5-2.6", "Ring 00 : 3[b01000] -> 4[201000] [send] via NET/Socket/0",
           (("NET", "NET/Socket/0", False, "Socket", 0, "send"),)),
          ("Ring 2.4", "Ring 00 : 3 -> 4 [send] via NET/IB/0", (("NET", "NET/IB/0", False, "IB", 0, "send"),)),
      ]],
    # §9 connected, tuning
    ("connected <=2.23", [P + "Connected all rings"], lambda l: [(c.what, c.gdr) for c in one(l).connected],
     [("rings", None)]),
    ("connected 2.24+", [P + "Connected all rings, use ring PXN 0 GDR 1"],
     lambda l: [(c.pxn, c.gdr) for c in one(l).connected], [(0, 1)]),
    ("tuning 2.20-2.22", [P + "1048576 Bytes -> Algo 1 proto 2 time 36.900000"],
     lambda l: [(t.coll, t.size_bytes, t.algo, t.proto) for t in one(l).tuning], [(None, 1048576, "Ring", "Simple")]),
    ("tuning 2.23", [P + "AllReduce: 1048576 Bytes -> Algo 0 proto 0 time 12.500000"],
     lambda l: [(t.coll, t.algo, t.proto) for t in one(l).tuning], [("AllReduce", "Tree", "LL")]),
    ("tuning 2.24+", [P + "AllReduce: 1048576 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..15}"],
     lambda l: [(t.algo, t.proto) for t in one(l).tuning], [("Ring", "Simple")]),
    # §10 timings
    ("init timings 2.22", [P + "Init timings: rank 5 nranks 8 total 2.46 (kernels 0.18, bootstrap 1.60, allgathers 0.00, "
                               "topo 0.52, graphs 0.01, connections 0.12, rest 0.02)"],
     lambda l: (one(l).init_timings[0].total_s, one(l).init_timings[0].phases_s["bootstrap"], one(l).init_timings[0].api),
     (2.46, 1.60, None)),
    ("init timings 2.23+", [P + "Init timings - ncclCommInitRankConfig: rank 0 nranks 8 total 55.17 (kernels 52.33, "
                                "alloc 0.42, bootstrap 0.84, allgathers 0.08, topo 1.10, graphs 0.01, connections 0.39, "
                                "rest 0.00)"],
     lambda l: (one(l).init_timings[0].api, one(l).init_timings[0].phases_s["kernels"]), ("ncclCommInitRankConfig", 52.33)),
    ("bootstrap timings", [P + "Bootstrap timings total 0.84 (create 0.00, send 0.01, recv 0.80, ring 0.02, delay 0.00)"],
     lambda l: one(l).bootstrap_timings[0].phases_s["recv"], 0.80),
    # §11 COLL
    ("coll", [P + "AllReduce: opCount 139d sendbuff 0x78d056200000 recvbuff 0x78d056200000 count 7382228 datatype 7 op 0 "
                  "root 0 comm 0x78cfda045840 [nranks=128] stream 0x78d07125e5e0"],
     lambda l: (one(l).coll_calls[0].op_count, one(l).coll_calls[0].size_bytes), (0x139D, 29_528_912)),
    ("coll bf16 recv", [P + "Recv: opCount 2 sendbuff (nil) recvbuff 0x7f00 count 10 datatype 9 op 0 root 3 comm 0x1 "
                            "[nranks=4] stream 0x2"],
     lambda l: (one(l).coll_calls[0].dtype, one(l).coll_calls[0].size_bytes, one(l).coll_calls[0].in_place),
     ("bfloat16", 20, False)),
    # §12 errors
    ("error chain", ["", "host-a:1:2 [0] include/socket.h:423 NCCL WARN Net : Connection closed by remote peer "
                         "10.0.0.2<42>", "host-a:1:2 [0] NCCL INFO transport/net_socket.cc:474 -> 6",
                     "host-a:1:2 [0] NCCL INFO proxy.cc:874 -> 6 [Progress Thread]"],
     lambda l: [(e.result_name, len(e.steps), e.steps[-1].thread, e.warning is not None) for e in one(l).errors],
     [("ncclRemoteError", 2, "Progress Thread", True)]),
    ("error chain without WARN", [P + "init.cc:1234 -> 2", P + "group.cc:64 -> 2 [Async thread]"],
     lambda l: [(e.result, e.result_name) for e in one(l).errors], [(2, "ncclSystemError")]),
    ("error chain 2.30 location in prefix", [P.replace("NCCL INFO ", "init.cc:1234 NCCL INFO ") + "-> 3"],
     lambda l: [(e.steps[0].location, e.result_name) for e in one(l).errors], [("init.cc:1234", "ncclInternalError")]),
    ("warn mismatched version", ["host-a:1:2 [0] init.cc:900 NCCL WARN Mismatched NCCL version detected : rank 0 "
                                 "version 22105 rank 8 version 21903"],
     lambda l: l.warnings[0].meaning, "ranks run different NCCL versions"),
    # §14 PyTorch
    ("torch timeout new", ["[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                           "operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, "
                           "Timeout(ms)=600000) ran for 600020 milliseconds before timing out."],
     lambda l: [(t.rank, t.seq, t.op_type, t.numel_in, t.timeout_ms, t.ran_for_ms) for t in l.timeouts],
     [(1, 808, "ALLREDUCE", 9801523, 600000, 600020)]),
    ("torch timeout old", ["[E ProcessGroupNCCL.cpp:737] [Rank 3] Watchdog caught collective operation timeout: "
                           "WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800472 milliseconds "
                           "before timing out."],
     lambda l: [(t.rank, t.seq, t.numel_in, t.timeout_ms) for t in l.timeouts], [(3, 96120, None, 1800000)]),
    ("torch timeout PG guid", ["[rank2]:[E1016 03:31:38.928019586 ProcessGroupNCCL.cpp:607] [PG ID 1 PG GUID 5(tp) Rank 2] "
                               "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=_ALLGATHER_BASE, "
                               "NumelIn=19008, NumelOut=152064, Timeout(ms)=600000) ran for 600100 milliseconds before "
                               "timing out."],
     lambda l: [(t.process_group, t.op_type, t.numel_out) for t in l.timeouts], [("5(tp)", "_ALLGATHER_BASE", 152064)]),
    ("torch timeout PG 2.3", ["[rank25]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 25] Watchdog caught collective operation "
                              "timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                              "ran for 600001 milliseconds before timing out."],
     lambda l: [(t.rank, t.pg_id, t.process_group) for t in l.timeouts], [(25, "0", "0")]),
    ("torch progress", ["[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] "
                        "[PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by "
                        "watchdog at work: 808, last enqueued NCCL "
                        "work: 811, last completed NCCL work: 807."],
     lambda l: [(p.rank, p.work, p.last_enqueued, p.last_completed) for p in l.progress], [(1, 808, 811, 807)]),
    ("torch timeout at work", ["[PG 0 Rank 3] Timeout at NCCL work: 20, last enqueued NCCL work: 21, last completed NCCL "
                               "work: 19."], lambda l: [(p.rank, p.work) for p in l.progress], [(3, 20)]),
    ("flight recorder", ["[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:1595] [PG ID 1 PG GUID 1 Rank 3] timed "
                         "out after waiting for 60000ms flight recorder dumps to finish."],
     lambda l: len(l.flight_recorder), 1),
    ("heartbeat", ["[rank25]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 25] Heartbeat monitor timed out! Process will be "
                   "terminated after dumping debug info. workMetaList_.size()=2"], lambda l: len(l.flight_recorder), 1),
    ("torch NCCL error", ["RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, "
                          "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1"],
     lambda l: [e.name for e in l.framework_errors], ["ncclSystemError"]),
    ("torch remote error", ["ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
                            "prematurely.", "Last error: remote process exited or there was a network error"],
     lambda l: [e.name for e in l.framework_errors], ["ncclRemoteError", "ncclRemoteError"]),
    ("torch internal error", ["torch.distributed.DistBackendError: NCCL error in: x.cpp:1, internal error - please report "
                              "this issue to the NCCL developers, NCCL version 2.19.3",
                              "ncclInternalError: Internal check failed."],
     lambda l: {e.name for e in l.framework_errors}, {"ncclInternalError"}),
]


@pytest.mark.parametrize("text, get, expected", [(t, g, e) for _, t, g, e in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_format_variant(text: list[str], get: Callable[[NcclLog], object], expected: object) -> None:
    assert get(lines(*text)) == expected


# --------------------------------------------------------------------------- wrappers

INNER = "node-7:4242:4250 [3] NCCL INFO Using network IB"
WRAPPED: list[tuple[str, str, int | None]] = [
    ("openmpi tag", "[1,2]<stdout>:" + INNER, 2),
    ("launcher rank label", "[0] " + INNER, 0),
    ("srun -l", "0: " + INNER, 0),
    ("torch rank label", "[rank3]:" + INNER, 3),
    ("torchrun role label", "[default5]:" + INNER, 5),
    ("ray train worker", "(RayTrainWorker pid=615, ip=10.72.7.6) " + INNER, None),
    ("ray pid", "(pid=615) " + INNER, None),
    ("ray ansi remnants", " [36m(RayWorkerVllm pid=5310) [0m " + INNER + " [32m [repeated 6x across cluster] [0m", None),
    ("ray ansi escapes", "\x1b[36m(RayWorkerVllm pid=5310)\x1b[0m " + INNER, None),
    ("cloudwatch", "  | 2024-11-28T07:42:14.532Z | " + INNER, None),
    ("iso timestamp", "2024-11-28 07:42:14,532 " + INNER, None),
    ("pdsh host tag", "node-7: " + INNER, None),
    ("markdown quote", "> " + INNER, None),
    ("backticks", "`" + INNER + "`", None),
    ("viewer line number + torch label", "[80746] [rank0]:" + INNER, 0),
    ("carriage return", INNER + "\r", None),
]


@pytest.mark.parametrize("line, label", [(l, r) for _, l, r in WRAPPED], ids=[w[0] for w in WRAPPED])
def test_wrapper_stripped(line: str, label: int | None) -> None:
    assert strip_wrappers(line) == (INNER, label)
    p = one(lines(line))
    assert (p.host, p.pid, p.devices, p.network) == ("node-7", 4242, (3,), "IB")


def test_wrapped_torch_timeout_keeps_rank() -> None:
    log = lines("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=3, OpType=BARRIER, NumelIn=1, NumelOut=1, Timeout(ms)=60000) ran for "
                "60001 milliseconds before timing out.")
    assert [(t.rank, t.op_type) for t in log.timeouts] == [(0, "BARRIER")]


def test_user_trimmed_prefix_is_not_a_label() -> None:
    assert strip_wrappers(" [0] NCCL INFO Using network IB") == ("[0] NCCL INFO Using network IB", None)


# --------------------------------------------------------------------------- findings


def node(host: str, pid: int, rank: int, version: str = "2.23.4+cuda12.4", extra: tuple[str, ...] = (),
         gdr: str = "/GDRDMA", net: str = "IB", boot: str = "eth0:10.0.0.{n}<0>", channels: int = 16) -> list[str]:
    """Lines one healthy process of a 2-node x 8-GPU InfiniBand job prints (NCCL 2.23 formats)."""
    n = rank // 8 + 1
    peer = (rank + 8) % 16
    h = f"{host}:{pid}:{pid} [0] NCCL INFO "
    t = f"{host}:{pid}:{pid + 1} [0] NCCL INFO "
    return [
        h + f"NCCL version {version}", h + "cudaDriverVersion 12040", *(h + e for e in extra),
        h + "Bootstrap : Using " + boot.format(n=n),
        t + "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
        t + (f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.{n}<0>" if net != "Socket"
             else "NET/Socket : Using [0]" + boot.format(n=n)),
        t + f"Using network {net}",
        t + f"ncclCommInitRank comm 0x55d0 rank {rank} nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc - Init START",
        t + f"comm 0x55d0 rank {rank} nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
        t + f"Pattern 4, crossNic 0, nChannels {channels}, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1",
        t + f"Channel 00/0 : {rank}[0] -> {rank + 1}[1] via P2P/CUMEM/read",
        t + f"Channel 00/0 : {peer}[0] -> {rank}[0] [receive] via NET/{net}/0{gdr}",
        t + f"Channel 00/0 : {rank}[0] -> {peer}[0] [send] via NET/{net}/0{gdr}",
        t + f"Channel 01/0 : {rank}[0] -> {peer}[0] [send] via NET/{net}/1{gdr}",
        t + "Connected all rings",
        t + f"{channels} coll channels, {channels} collnet channels, 0 nvls channels, 16 p2p channels, "
            "2 p2p channels per peer",
        t + "Init timings - ncclCommInitRank: rank 0 nranks 16 total 1.92 (kernels 0.31, alloc 0.10, bootstrap 0.85, "
            "allgathers 0.05, topo 0.40, graphs 0.02, connections 0.17, rest 0.02)",
        t + f"ncclCommInitRank comm 0x55d0 rank {rank} nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabc "
            "- Init COMPLETE",
    ]


def job(a: dict[str, Any] | None = None, b: dict[str, Any] | None = None) -> NcclReport:
    """Two per-process logs, one per host, as parse_nccl_logs would read them."""
    return merge_logs([parse_nccl_log(node("node-a", 100, 0, **(a or {})), source="node-a.100.log"),
                       parse_nccl_log(node("node-b", 200, 8, **(b or {})), source="node-b.200.log")])


HEALTHY = job()


def test_healthy_job_parses_as_expected() -> None:
    assert HEALTHY.multi_node and HEALTHY.nnodes == 2 and HEALTHY.world_size == 16
    assert [h.host for h in HEALTHY.hosts] == ["node-a", "node-b"]
    assert all(h.fabrics == ("IB",) and h.versions == ("2.23.4+cuda12.4",) for h in HEALTHY.hosts)
    assert HEALTHY.rank_hosts() == {0: "node-a", 8: "node-b"}


@pytest.mark.parametrize("name", sorted(RULE))
def test_rule_quiet_on_healthy_job(name: str) -> None:
    assert RULE[name](HEALTHY) == []


def test_no_findings_on_healthy_job() -> None:
    assert nccl_findings(HEALTHY) == [] and hang_diagnosis(HEALTHY) is None


def check_shape(f: dict[str, Any]) -> None:
    assert set(f) == {"lever", "severity", "title", "evidence", "ranks", "est_saving_pct", "action", "estimate"}
    assert f["lever"] == "nccl_env" and f["severity"] in ("high", "medium", "low") and f["est_saving_pct"] is None
    assert f["estimate"] is None  # no saving estimated, so nothing to say how
    assert f["evidence"] and all(isinstance(e, str) for e in f["evidence"])
    action = f["action"]
    assert isinstance(action, dict) and set(action) == {"env", "doc"} and str(action["doc"]).startswith("https://")
    json.dumps(f)


def only(name: str, report: NcclReport) -> dict[str, Any]:
    (f,) = RULE[name](report)
    check_shape(f)
    return f


def test_socket_fallback_with_ib_fires() -> None:
    extra = ("NCCL_IB_DISABLE set by environment to 1.",)
    report = job(dict(extra=extra, net="Socket", gdr="", boot="ib0:192.168.0.{n}<0>"),
                 dict(extra=extra, net="Socket", gdr="", boot="ib0:192.168.0.{n}<0>"))
    f = only("socket_fallback_with_ib", report)
    assert f["severity"] == "high" and f["action"]["env"] == {"NCCL_IB_DISABLE": None, "NCCL_NET": "IB"}
    assert f["ranks"] == [0, 8]
    assert "node-a:100 IP-over-IB interface ib0 in use" in f["evidence"]


@needs_logs
def test_socket_fallback_quiet_without_ib_hardware() -> None:
    for prefix in ("01", "05"):
        assert RULE["socket_fallback_with_ib"](report_of(ref(prefix))) == []


@needs_logs
def test_p2p_disabled_fires_on_log_08() -> None:
    f = only("p2p_shm_disabled", report_of(ref("08")))
    assert f["severity"] == "high" and f["action"]["env"] == {"NCCL_P2P_LEVEL": None}
    assert "NCCL_P2P_LEVEL=LOC" in str(f["title"]) and f["ranks"] == [0, 1]
    assert RULE["p2p_shm_disabled"](report_of(ref("13"))) == []


def test_shm_disabled_with_intra_node_net_fires() -> None:
    log = lines(P + "NCCL_SHM_DISABLE set by environment to 1.", P + "NCCL_P2P_DISABLE set by environment to 1",
                P + "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA")
    f = only("p2p_shm_disabled", report_of(log))
    assert f["severity"] == "high"
    assert f["action"]["env"] == {"NCCL_SHM_DISABLE": None, "NCCL_P2P_DISABLE": None}
    # the stale-override rule also sees NCCL_P2P_DISABLE; nccl_findings keeps one action per variable
    assert [x["title"] for x in nccl_findings(report_of(log))] == [f["title"]]


@needs_logs
def test_bootstrap_on_loopback() -> None:
    single = only("bootstrap_on_loopback", report_of(ref("08")))
    assert single["severity"] == "low" and single["action"]["env"] == {"NCCL_SOCKET_IFNAME": None}
    multi = only("bootstrap_on_loopback", job(dict(boot="docker0:172.17.0.{n}<0>")))
    assert multi["severity"] == "high" and multi["ranks"] == [0]
    assert multi["action"]["env"] == {"NCCL_SOCKET_IFNAME": "^lo,docker,virbr,veth"}
    assert RULE["bootstrap_on_loopback"](report_of(ref("13"))) == []


def test_ib_without_gdrdma() -> None:
    f = only("ib_without_gdrdma", job(dict(gdr=""), dict(gdr="")))
    assert f["severity"] == "high" and "6 of 6 IB connections without /GDRDMA" in f["evidence"]
    partial = only("ib_without_gdrdma", job(b=dict(gdr="", extra=(
        "GPU Direct RDMA Disabled for GPU 0 / HCA 0 (distance 5 > 4)",))))
    assert partial["severity"] == "medium" and partial["action"]["env"] == {"NCCL_NET_GDR_LEVEL": "PHB"}
    assert partial["ranks"] == [8]


def test_version_mismatch() -> None:
    f = only("version_mismatch", job(b=dict(version="2.21.5+cuda12.4")))
    assert f["severity"] == "high" and "NCCL version node-b: 2.21.5+cuda12.4" in f["evidence"]
    plugin = only("version_mismatch", job(b=dict(extra=("NET/Plugin: Loaded net plugin FastSocket v4 (v4)",))))
    assert "net plugin" in str(plugin["title"])
    network = only("version_mismatch", job(b=dict(net="Socket", gdr="")))
    assert "network" in str(network["title"]) and network["ranks"]


@needs_logs
def test_version_mismatch_quiet_on_one_version() -> None:
    for prefix in ("05", "08", "13"):
        assert RULE["version_mismatch"](report_of(ref(prefix))) == []


def test_stale_overrides() -> None:
    f = only("stale_overrides", job(dict(extra=("NCCL_ALGO set by environment to Ring", "NCCL_IB_DISABLE set by "
                                                 "environment to 0."))))
    assert f["action"]["env"] == {"NCCL_ALGO": None} and f["severity"] == "medium"
    both = only("stale_overrides", job(dict(extra=("NCCL_PROTO set by environment to LL128",
                                                    "NCCL_P2P_DISABLE set by environment to 1"))))
    assert both["action"]["env"] == {"NCCL_P2P_DISABLE": None, "NCCL_PROTO": None}


@needs_logs
def test_slow_init_names_the_kernels_phase() -> None:
    f = only("slow_init", report_of(ref("13")))
    assert f["severity"] == "high" and "'kernels'" in str(f["title"]) and "55.17 s" in str(f["title"])
    assert f["ranks"] == [0, 3, 4]
    assert any("JIT" in e for e in f["evidence"])
    slow_bootstrap = lines(P + "Init timings - ncclCommInitRank: rank 2 nranks 4 total 12.50 (kernels 0.30, alloc 0.10, "
                               "bootstrap 11.80, allgathers 0.05, topo 0.20, graphs 0.01, connections 0.04, rest 0.00)")
    bootstrap = only("slow_init", report_of(slow_bootstrap))
    assert bootstrap["severity"] == "medium" and "'bootstrap'" in str(bootstrap["title"])


@needs_logs
def test_few_channels() -> None:
    f = only("few_channels", report_of(ref("01")))
    assert f["action"]["env"] == {"NCCL_MIN_NCHANNELS": "4"}
    assert "sh-01: NET connections use NIC [0] of 2 listed (enP1p1s0f0, enP1p1s0f1)" in f["evidence"]
    capped = only("few_channels", job(dict(channels=2, extra=("NCCL_MAX_NCHANNELS set by environment to 2.",))))
    assert capped["action"]["env"] == {"NCCL_MAX_NCHANNELS": None}
    assert "node-a: 2 channels for 2 NICs" in capped["evidence"]
    assert RULE["few_channels"](report_of(ref("05"))) == []


@needs_logs
def test_socket_threading() -> None:
    f = only("socket_threading", report_of(ref("01")))
    assert f["severity"] == "low"  # link speed unknown in the excerpt
    assert f["action"]["env"] == {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
    fast = only("socket_threading", job(dict(net="Socket", gdr="", extra=("+ NET[12.5] - NET/0",))))
    assert fast["severity"] == "medium"
    slow = job(dict(net="Socket", gdr="", extra=("+ NET[1.25] - NET/0",)), dict(extra=("+ NET[1.25] - NET/0",)))
    assert RULE["socket_threading"](slow) == []  # 10 GbE: threads will not help
    tuned = job(dict(net="Socket", gdr="", extra=("NET/Socket: Using 4 threads and 4 sockets per thread",)))
    assert RULE["socket_threading"](tuned) == []
    assert RULE["socket_threading"](report_of(ref("05"))) == []  # one node


TIMEOUT = ("[rank{r}]:[E626 06:24:44.9 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Watchdog caught "
           "collective operation timeout: WorkNCCL(SeqNum={s}, OpType={op}, NumelIn=10, NumelOut=10, Timeout(ms)=600000) "
           "ran for 600100 milliseconds before timing out.")


def test_hang_diagnosis_desync_names_the_late_rank() -> None:
    log = lines(*(TIMEOUT.format(r=r, s=41, op="ALLREDUCE") for r in (0, 1, 2)), TIMEOUT.format(r=3, s=40, op="BROADCAST"),
                "node-a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 5 cudaDev 0 busId 1000 - Init COMPLETE")
    d = hang_diagnosis(report_of(log))
    assert d is not None and d.kind == "desync" and d.world_size == 5 and d.process_groups and d.env
    (pg,) = d.process_groups
    assert (pg.seq, pg.op_type, pg.ranks_timed_out, pg.ranks_behind, pg.ranks_without_timeout) == (
        41, "ALLREDUCE", [0, 1, 2, 3], [3], [4])
    assert d.never_arrived == [3, 4] and d.env["TORCH_NCCL_DESYNC_DEBUG"] == "1"
    assert any("py-spy" in s for s in d.collect_next) and any("DESYNC" in s for s in d.collect_next)
    json.dumps(d.to_dict())


def test_hang_diagnosis_quotes_first_error_and_flight_recorder() -> None:
    log = lines("", "node-b:7:8 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> "
                    "with status=12 opcode=0 len=0 vendor err 129 (Send)",
                TIMEOUT.format(r=0, s=5, op="ALLREDUCE"), TIMEOUT.format(r=1, s=5, op="ALLREDUCE"),
                "[rank0]:[E1 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0 Rank 0] timed out after waiting for 60000ms flight "
                "recorder dumps to finish.")
    d = hang_diagnosis(report_of(log), world_size=2)
    assert d is not None and d.kind == "collective_stuck" and d.never_arrived == [] and d.first_error
    assert "status=12" in d.first_error and "retry exceeded" in d.first_error
    assert "every rank timed out in the same collective" in d.summary
    assert d.flight_recorder and "torchfrtrace" in d.collect_next[0]


# --------------------------------------------------------------------------- garbage


def test_empty_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    for data in (empty, "", b"", [], [""], ["\n\n"]):
        log = parse_nccl_log(data)
        assert log.processes == () and log.timeouts == () and log.read_error is None
        assert nccl_findings(merge_logs([log])) == [] and hang_diagnosis(merge_logs([log])) is None


@needs_logs
def test_truncated_lines_never_raise() -> None:
    for path in reference_files():
        for line in path.read_text().splitlines():
            for cut in range(0, len(line), 7):
                log = parse_nccl_log([line[:cut]])
                nccl_findings(merge_logs([log]))
                hang_diagnosis(merge_logs([log]))


def test_binary_file_is_partial_not_fatal(tmp_path: Path) -> None:
    rng = random.Random(7)
    blob = bytes(rng.randrange(256) for _ in range(20000))
    path = tmp_path / "node.1.log"
    path.write_bytes(blob + b"\nnode:1:1 [0] NCCL INFO Using network IB\n" + blob[:500] + b"\xc3\x28\n")
    log = parse_nccl_log(path)
    assert any(p.network == "IB" for p in log.processes)
    json.dumps(log.to_dict())


FRAGMENTS = [
    "host:1:2 [0] NCCL INFO ", "host:1:2 [0] x.cc:1 NCCL WARN ", "Channel 00/0 : 0[0] -> 1[1] via ", "NET/IB/0/GDRDMA",
    "NCCL version 2.", "Bootstrap : Using ", "[0]eth0:1.2.3.4<0>", "Init timings - x: rank 0 nranks 2 total ",
    "WorkNCCL(SeqNum=", "Watchdog caught collective operation timeout: ", ") ran for 5 milliseconds", "[Rank ",
    "NET/IB : Using [0]={", "; OOB ", "comm 0x1 rank ", " nranks ", "-> 2 [", "(pid=1) ", "[rank1]:", "\x1b[0m", "\x00",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=60), st.sampled_from(FRAGMENTS)), max_size=12).map("".join))
def test_random_text_never_raises(text: str) -> None:
    log = parse_nccl_log(text.splitlines() or [text])
    report = merge_logs([log])
    nccl_findings(report)
    hang_diagnosis(report, world_size=4)
    json.dumps(report.to_dict())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_random_bytes_never_raise(chunks: list[bytes]) -> None:
    log = parse_nccl_log(chunks)
    assert parse_nccl_log(b"".join(chunks)).lines_total >= 0
    nccl_findings(merge_logs([log]))
