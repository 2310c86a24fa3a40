"""NCCL/RCCL log shapes seen in public issue threads beyond the six reference logs.

Each log in tests/data/nccl/ reproduces the line shapes of one public thread (named on
its first line). One section per class of misreading: lines whose NCCL prefix lacks
``host:pid:tid`` or sits behind another launcher's prefix, bare version lines, RCCL's
multi-line banner, versions and plugins that differ between hosts, and InfiniBand
hardware left unused while the job runs on sockets. Expected values are read by hand
from the log lines.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from conftest import run_pardiag
from pardiag.analysis import Analysis
from pardiag.analyzers.nccl.findings import nccl_findings, socket_fallback_with_ib, version_mismatch
from pardiag.analyzers.nccl.log import NcclLog, NcclProcess, NcclReport, merge_logs, parse_nccl_log
from pardiag.analyzers.rules import RuleContext
from pardiag.cli import main
from pardiag.run_info import RunInfo

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
DATA_LOGS = sorted(DATA.glob("*.log"))


def read(name: str) -> NcclLog:
    return parse_nccl_log(DATA / name)


def report(*names: str) -> NcclReport:
    return merge_logs([read(n) for n in names])


def lines(*text: str) -> NcclReport:
    return merge_logs([parse_nccl_log(list(text))])


def by_who(log: NcclLog) -> dict[str, NcclProcess]:
    return {p.who: p for p in log.processes}


def run_rule(rule: Any, rep: NcclReport) -> list[dict[str, Any]]:
    ctx = RuleContext(Analysis(run=RunInfo(), ranks=[], collectives=[], stragglers=[]), nccl=rep)
    return [asdict(f) for f in rule(ctx)]


def only(rule: Any, rep: NcclReport) -> dict[str, Any]:
    (f,) = run_rule(rule, rep)
    assert f["lever"] == "nccl_env" and f["severity"] == "high" and f["est_saving_pct"] is None
    return f


def test_every_log_names_the_thread_it_is_modelled_on() -> None:
    assert len(DATA_LOGS) >= 10
    for path in DATA_LOGS:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# modelled on https://github.com/"), path.name
        assert len(path.read_text().splitlines()) <= 40, path.name


@pytest.mark.parametrize("path", DATA_LOGS, ids=[p.name for p in DATA_LOGS])
def test_every_line_of_the_data_logs_is_read(path: Path) -> None:
    log = parse_nccl_log(path)
    assert log.lines_unrecognized == 0
    json.dumps(merge_logs([log]).to_dict())


# --------------------------------------------------------------------------- prefixes


def test_prefix_trimmed_to_the_device() -> None:
    log = read("prefix-trimmed-dev-only-nccl783.log")
    (p,) = log.processes
    assert (p.host, p.pid, p.tag, p.devices, p.network) == (None, None, None, (0,), "Socket")
    assert [(i.name, i.address) for i in p.bootstrap] == [("eth0", "10.0.0.1<0>")]
    assert p.ib_no_device and [(i.rank, i.nranks) for i in p.inits] == [(0, 2)]
    assert [(c.func, c.op_count, c.size_bytes, c.root) for c in p.coll_calls] == [
        ("Send", 1, 1572864 * 4, 1), ("Send", 2, 1572864 * 4, 1)]
    assert log.lines_nccl == 8


def test_prefix_with_empty_hostname() -> None:
    log = read("prefix-empty-hostname-tf34375.log")
    assert log.lines_nccl == 8
    (p,) = log.processes
    assert (p.host, p.pid, p.who) == (None, 5202, "?:5202")
    assert [(c.via, c.direction, c.legacy_ring) for c in p.connections] == [
        ("NET/IB/0", "receive", True), ("NET/IB/0", "send", True)]
    assert p.env == {"NCCL_IB_GID_INDEX": "3"} and p.nranks == 2 and p.fabric == "IB"


def test_mpirun_tag_output_keeps_hostless_ranks_apart() -> None:
    log = read("prefix-mpirun-tag-output-horovod3658.log")
    procs = by_who(log)
    assert set(procs) == {"ip-172-31-0-63:2120", "rank 4", "rank 5"}
    assert procs["ip-172-31-0-63:2120"].network == "Socket"
    r4, r5 = procs["rank 4"], procs["rank 5"]
    assert [i.address for i in r4.bootstrap] == ["172.31.12.129<0>"] and r4.devices == (0,)
    assert r4.ranks == (4,) and r5.ranks == (5,) and r5.devices == (1,)
    assert r5.socket_threads == (2, 8) and r4.socket_threads is None
    assert r4.fabric == r5.fabric == "Socket"  # from their own "via NET/Socket" lines


def test_ray_worker_prefixes() -> None:
    log = read("prefix-ray-workers-vllm2734.log")
    procs = by_who(log)
    assert set(procs) == {"[pod-name]:5310", "pid=1234 ip=10.72.7.6", "pid=1235 ip=10.72.7.6", "pid=927", "?:?"}
    assert [procs[w].network for w in ("pid=1234 ip=10.72.7.6", "pid=1235 ip=10.72.7.6", "pid=927")] == [
        "Socket", "Socket", "IB"]
    assert [i.name + ":" + i.address for i in procs["[pod-name]:5310"].bootstrap] == ["eth0:10.4.22.79<0>"]
    # Ray's own logging format in front of a trimmed NCCL line
    assert [i.address for i in procs["?:?"].bootstrap] == ["10.0.0.9<0>"]


def test_torchrun_labels_timestamps_and_logging_frameworks() -> None:
    log = read("prefix-torchrun-timestamps-llamafactory7396.log")
    procs = by_who(log)
    assert set(procs) == {"node-1:80746", "rank 3", "rank 5", "algo-1:17773", "?:?", "node-2:901", "node-9:77"}
    assert procs["rank 3"].network == "IB" and [i.name for i in procs["rank 3"].bootstrap] == ["bond0"]
    assert procs["node-2:901"].devices == (1,)  # DeepSpeed "[ts] [INFO] [comm.py:…]" prefix
    assert procs["node-9:77"].network == "IB"  # c10d glog prefix
    assert procs["?:?"].env == {"NCCL_IB_HCA": "mlx5_0"}
    assert log.lines_nccl == 8


# --------------------------------------------------------------------------- bare version lines


def test_bare_version_belongs_to_the_process_printing_just_before() -> None:
    log = read("version-bare-after-rank0-nccl1068.log")
    (v,) = log.version_lines
    assert (v.text, v.host, v.pid, v.how) == ("2.10.3+cuda11.1", "nvidia2020", 27646, "previous line")
    versions = {p.pid: p.version.version if p.version else None for p in log.processes}
    assert versions == {27646: "2.10.3", 27649: None, 27647: None}
    assert merge_logs([log]).hosts[0].versions == ("2.10.3+cuda11.1",)


def test_bare_version_under_a_ray_tag_goes_to_that_worker() -> None:
    log = read("version-bare-ray-nccl1212.log")
    (v,) = log.version_lines
    assert (v.who, v.how) == ("jamin-g2-cluster-a-0:355353", "wrapper")  # not the worker whose line came before
    hosts = {h.host: h.versions for h in merge_logs([log]).hosts}
    assert hosts == {"jamin-g2-cluster-a-0": ("2.14.3+cuda11.8",), "jamin-g2-cluster-a-1": ()}


def test_bare_version_under_an_mpirun_tag_goes_to_that_rank() -> None:
    log = read("version-bare-mpirun-nccl224.log")
    (v,) = log.version_lines
    assert (v.who, v.how, v.text) == ("gpu6:1407", "wrapper", "2.4.2+cuda10.0")
    hosts = {h.host: h.versions for h in merge_logs([log]).hosts}
    assert hosts == {"gpu6": ("2.4.2+cuda10.0",), "gpu7": ()}


def test_bare_version_of_a_broken_build_and_alone() -> None:
    (v,) = read("prefix-empty-hostname-tf34375.log").version_lines
    assert (v.version.version, v.version.cuda, v.full, v.how) == ("2.4.7", None, "2.4.7+cudaCUDA_MAJOR.CUDA_MINOR", None)
    alone = parse_nccl_log(["NCCL version 2.11.4+cuda11.4"])
    assert alone.version is not None and (alone.version.version, alone.version.cuda) == ("2.11.4", "11.4")
    assert [(v.text, v.who) for v in alone.version_lines] == [("2.11.4+cuda11.4", "?")]


# --------------------------------------------------------------------------- RCCL


def test_rccl_banner_without_prefix() -> None:
    log = read("rccl-banner-bare-rccltests163.log")
    (b,) = log.rccl_banners
    assert b.fields == {"RCCL version": "2.21.5-HEAD:9a0e6a1", "HIP version": "6.3.42134-a9a80e791",
                        "ROCm version": "6.3.3.0-74-cbc70b5", "Hostname": "z292",
                        "Librccl path": "/opt/rocm-6.3.3/lib/librccl.so.1"}
    assert (b.host, b.pid) == ("z292", 58192)
    (p,) = log.processes
    assert p.rccl_version == "2.21.5-HEAD:9a0e6a1" and p.network == "Socket"
    assert merge_logs([log]).hosts[0].versions == ("RCCL 2.21.5-HEAD:9a0e6a1",)


def test_rccl_banner_after_a_prefixed_first_line_on_two_hosts() -> None:
    log = read("rccl-banner-prefixed-two-hosts.log")
    assert [(b.host, b.pid, b.fields["HIP version"], b.fields.get("Librccl path")) for b in log.rccl_banners] == [
        ("mi300-a", 2421, "6.2.41134-", "/opt/rocm/lib/librccl.so.1"), ("mi300-b", 927, "7.0.51831-a3e329ad8", None)]
    assert {p.host: p.rccl_version for p in log.processes} == {
        "mi300-a": "2.21.5-main:a29a210+", "mi300-b": "2.26.6-HEAD:f224e2c"}
    f = only(version_mismatch, merge_logs([log]))
    assert "RCCL version" in f["title"]
    assert "RCCL version mi300-a: 2.21.5-main:a29a210+" in f["evidence"]
    assert "RCCL version mi300-b: 2.26.6-HEAD:f224e2c" in f["evidence"]


def test_rccl_banner_names_its_host_when_nothing_else_does() -> None:
    rep = lines("RCCL version : 2.18.3-HEAD:a1b2c3d", "HIP version  : 6.0.32830-d62f6a171", "Hostname     : mi250-7",
                "RCCL version : 2.20.5-HEAD:e4f5a6b", "Hostname     : mi250-8")
    assert {h.host: h.versions for h in rep.hosts} == {
        "mi250-7": ("RCCL 2.18.3-HEAD:a1b2c3d",), "mi250-8": ("RCCL 2.20.5-HEAD:e4f5a6b",)}
    f = only(version_mismatch, rep)
    assert "RCCL version mi250-7: 2.18.3-HEAD:a1b2c3d" in f["evidence"]


# --------------------------------------------------------------------------- version and plugin mismatch


def test_versions_plugins_and_networks_differing_between_hosts() -> None:
    f = only(version_mismatch, report("mismatch-versions-plugins-two-hosts-nccl1267.log"))
    assert {"NCCL version node-a: 2.23.4+cuda12.4", "NCCL version node-b: 2.21.5+cuda12.4",
            "net plugin node-a: GPUDirectTCPX (v7)", "net plugin node-b: internal",
            "network node-a: GPUDirectTCPX_v7", "network node-b: Socket"} <= set(f["evidence"])
    assert "between hosts" in f["title"]


def test_nccl_mismatch_warning_spells_out_the_versions() -> None:
    f = only(version_mismatch, report("mismatch-warn-and-plugin-nccl676.log"))
    assert "net plugin gpu01: IBext" in f["evidence"] and "net plugin gpu02: internal" in f["evidence"]
    assert any(e.startswith("gpu01:351578 NCCL's own check: rank 0 runs 2.23.4, rank 1 runs 2.21.5") for e in f["evidence"])
    assert "NCCL version" in f["title"]


def test_bare_versions_of_hostless_ray_workers_differ() -> None:
    rep = lines("(RayWorkerWrapper pid=581, ip=10.225.128.18) NCCL version 2.21.5+cuda12.4",
                "(RayWorkerWrapper pid=2361, ip=10.225.128.19) NCCL version 2.20.5+cuda12.4")
    f = only(version_mismatch, rep)
    assert set(f["evidence"]) == {"NCCL version pid=581 ip=10.225.128.18: 2.21.5+cuda12.4",
                                  "NCCL version pid=2361 ip=10.225.128.19: 2.20.5+cuda12.4"}


def test_processes_of_one_host_with_different_versions() -> None:
    rep = lines("host-a:11:11 [0] NCCL INFO NCCL version 2.23.4+cuda12.4",
                "host-a:12:12 [1] NCCL INFO NCCL version 2.21.5+cuda12.4",
                "host-a:12:12 [1] NCCL INFO ncclCommInitRank comm 0x1 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2000 "
                "commId 0x9 - Init START")
    f = only(version_mismatch, rep)
    assert {"NCCL version host-a:11: 2.23.4+cuda12.4", "NCCL version host-a:12: 2.21.5+cuda12.4"} == set(f["evidence"])
    assert "between processes of one host" in f["title"]


def test_net_plugin_setting_differs() -> None:
    rep = lines("node-a:1:1 [0] NCCL INFO NCCL_NET_PLUGIN set by environment to aws-ofi-nccl",
                "node-b:2:2 [0] NCCL INFO NCCL_NET_PLUGIN set by environment to none")
    f = only(version_mismatch, rep)
    assert "NCCL_NET_PLUGIN" in f["title"] and "NCCL_NET_PLUGIN node-b: none" in f["evidence"]


@pytest.mark.parametrize("name", ["version-bare-after-rank0-nccl1068.log", "rccl-banner-bare-rccltests163.log",
                                  "version-bare-ray-nccl1212.log", "prefix-mpirun-tag-output-horovod3658.log"])
def test_one_version_one_plugin_is_quiet(name: str) -> None:
    assert run_rule(version_mismatch, report(name)) == []


# --------------------------------------------------------------------------- IB present, Socket used


def test_ib_listed_but_disabled_by_override() -> None:
    f = only(socket_fallback_with_ib, report("ib-present-socket-override-nccl676.log"))
    assert f["action"]["env"] == {"NCCL_IB_DISABLE": None, "NCCL_NET": "IB"}
    assert "deliberate" in f["evidence"][0]
    check = f["evidence"][1]
    assert check.startswith("check:") and all(k in check for k in ("NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "plugin"))
    assert {"gpu01:351578 NET/IB lists mlx5_9", "gpu02:290077 NCCL_IB_DISABLE set by environment to 1"} <= set(
        f["evidence"])
    assert f["ranks"] == [0, 1]


def test_ib_over_ip_and_hcas_listed_but_socket_without_override() -> None:
    f = only(socket_fallback_with_ib, report("ib-present-socket-no-device-nccl952.log"))
    assert "configuration mistake" in f["evidence"][0] and f["action"]["env"] == {"NCCL_NET": "IB"}
    assert {"<cluster_name>:919 IP-over-IB interface ibp12s0 in use", "<cluster_name>:919 NET/IB : No device found",
            "other-node:4410 NET/IB lists mlx5_0, mlx5_1"} <= set(f["evidence"])
    assert f["ranks"] == [0, 8]


def test_host_without_ibverbs_next_to_a_host_with_hcas() -> None:
    f = only(socket_fallback_with_ib, report("ib-missing-elsewhere-libibverbs.log"))
    assert "21346d5cefce" in f["evidence"][0] and "6a5a91752e39" in f["evidence"][0]
    assert {"21346d5cefce:5325 Failed to open libibverbs.so[.1]", "6a5a91752e39:74352 NET/IB lists mlx5_0, mlx5_1"} <= set(
        f["evidence"])
    assert f["ranks"] == [1]


@pytest.mark.parametrize("name", ["socket-only-multinode-nccl226.log", "version-bare-after-rank0-nccl1068.log",
                                  "prefix-mpirun-tag-output-horovod3658.log", "rccl-banner-bare-rccltests163.log"])
def test_socket_without_ib_hardware_is_quiet(name: str) -> None:
    # NCCL_IB_DISABLE=1 and "NET/IB : No device found" on every host prove no hardware
    assert run_rule(socket_fallback_with_ib, report(name)) == []


def test_ib_listed_on_one_node_without_network_traffic_is_quiet() -> None:
    rep = lines("solo:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>",
                "solo:1:1 [0] NCCL INFO Using network Socket",
                "solo:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
    assert run_rule(socket_fallback_with_ib, rep) == []


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("path", DATA_LOGS, ids=[p.name for p in DATA_LOGS])
def test_cli_reads_each_log(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--nccl-log", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "NCCL: 1 log files" in out and "Traceback" not in out + err
    assert main(["analyze", "--nccl-log", str(path), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["nccl"]["files"] == 1
    assert [f["lever"] for f in a["findings"]] == ["nccl_env"] * len(nccl_findings(report(path.name)))


def test_cli_process_on_a_mismatch_log() -> None:
    res = run_pardiag("analyze", "--nccl-log", str(DATA / "rccl-banner-prefixed-two-hosts.log"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "RCCL version" in res.stdout


def test_the_run_block_lists_nccl_versions_in_version_order() -> None:
    from pardiag.analyzers.pipeline import _nccl_run_info

    hosts = [{"host": "b", "versions": ["2.10.3"]}, {"host": "a", "versions": ["2.9.6+cuda11.3"]}]
    assert _nccl_run_info({"hosts": hosts})["versions"] == {"nccl": "2.9.6+cuda11.3, 2.10.3"}  # not text order
