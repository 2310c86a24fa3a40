"""The Analysis' `nccl` block: NCCL's setup per host, its problems, and the hang
diagnosis, condensed from the parsed logs (the full parse stays out of the
Analysis: a large job writes one log per rank)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from pardiag.analysis_blocks import NcclSummary
from pardiag.analyzers.nccl.findings import hang_diagnosis, nccl_findings
from pardiag.analyzers.nccl.log import NcclReport, parse_nccl_logs

MAX_LINES = 10


def nccl_block(paths: Sequence[Path], world_size: int | None) -> tuple[NcclSummary, list[dict[str, Any]]]:
    """(the nccl block, the nccl_env findings) for the given log files or folders."""
    report = parse_nccl_logs(list(paths))
    return summarise(report, world_size), list(nccl_findings(report))


def summarise(report: NcclReport, world_size: int | None) -> NcclSummary:
    d = report.to_dict()
    transports: dict[str, Counter[str]] = {}
    init_s: list[float] = []
    warnings: list[str] = []
    errors: list[str] = []
    processes = 0
    for log in report.logs:
        for p in log.processes:
            processes += 1
            host = p.host or "?"
            transports.setdefault(host, Counter()).update(c.via for c in p.connections)
            init_s += [t.total_s for t in p.init_timings]
            warnings += [w.message for w in p.warnings if not w.benign]
            errors += [f"{e.result_name}: {e.meaning}" for e in p.errors]
    hang = hang_diagnosis(report, world_size=world_size)
    return NcclSummary(
        files=len(report.logs),
        processes=processes,
        world_size=d.get("world_size"),
        nnodes=d.get("nnodes"),
        multi_node=d.get("multi_node"),
        hosts=list(d.get("hosts", [])),
        transports={h: dict(sorted(c.items())) for h, c in sorted(transports.items())},
        init_s_max=max(init_s) if init_s else None,
        warnings=sorted(set(warnings))[:MAX_LINES],
        errors=sorted(set(errors))[:MAX_LINES],
        hang=hang,
    )
