"""Collectives matched across ranks: how long the transfer took and how long each
rank waited for the others.

Every rank issues the collectives of a process group in the same order, so the k-th
collective of group G in step N is the same operation on every rank. Its transfer
time is the shortest duration across ranks (the rank that arrived last waited least,
and its duration is the data movement alone); each rank's wait is its duration minus
that (as AMD TraceLens does before computing bandwidth).

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / transfer time,
busbw = algbw x factor, with factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
reduce-scatter and all-to-all, 1 for broadcast, reduce and point-to-point.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

from pardiag.analysis import Collective
from pardiag.analyzers.intervals import total_length
from pardiag.analyzers.rank_trace import CollectiveCall


def bus_factor(op: str, n: int | None) -> float | None:
    if not n or n < 1:
        return None
    op = op.replace("allreduce", "all_reduce").replace("allgather", "all_gather")
    if "all_reduce" in op:
        return 2 * (n - 1) / n
    if any(k in op for k in ("all_gather", "reduce_scatter", "all_to_all", "alltoall")):
        return (n - 1) / n
    if any(k in op for k in ("broadcast", "reduce", "send", "recv")):
        return 1.0
    return None


@dataclass(frozen=True)
class MatchResult:
    collectives: list[Collective]
    wait_by_rank_us: dict[int, float]
    transfer_by_rank_us: dict[int, float]
    unmatched: int  # collectives seen on only one rank of several: left out
    mismatched: int  # same position, different op: the ranks disagree on the order
    launch_only: int = 0  # NCCL calls whose kernels are not in the trace: not timed
    mismatched_unnamed: int = 0  # of the mismatched, those whose process group is not named
    mismatched_size: int = 0  # same position and op, different sizes on different ranks (not all-to-all)
    launch_only_alone: int = 0  # of the launch-only, those of process groups of one rank (NCCL moves nothing)


def _key(calls: Sequence[CollectiveCall]) -> list[tuple[str, int | None, int]]:
    seen: dict[tuple[str, int | None], int] = defaultdict(int)
    keys = []
    for c in calls:
        k = (c.process_group, c.step)
        keys.append((c.process_group, c.step, seen[k]))
        seen[k] += 1
    return keys


Key = tuple[str, "int | None", int]  # (process group, step, position in the group's calls of that step)


def _instances(per_rank: Mapping[int, Sequence[CollectiveCall]]) -> dict[Key, dict[int, CollectiveCall]]:
    """Each collective instance (key) with its call on every rank that has it, keys in
    (group, step, position) order, ranks in rank order."""
    instances: dict[Key, dict[int, CollectiveCall]] = defaultdict(dict)
    for rank, calls in sorted(per_rank.items()):  # rank order: results never depend on arrival order
        for key, call in zip(_key(calls), calls):
            instances[key][rank] = call
    return {k: instances[k] for k in sorted(instances, key=lambda k: (k[0], -1 if k[1] is None else k[1], k[2]))}


def _left_out(by_rank: Mapping[int, CollectiveCall], several: bool) -> str | None:
    """Why `match` leaves an instance out ("mismatched": different ops at one position;
    "mismatched_size": different sizes where the op moves the same amount on every rank;
    "unmatched": seen on one rank of several), or None when it is one collective."""
    if len({c.op for c in by_rank.values()}) > 1:
        return "mismatched"
    first = next(iter(by_rank.values()))
    sizes = [c.bytes for c in by_rank.values() if c.bytes]
    if len(set(sizes)) > 1 and not _uneven_ok(first.op):
        # an all-reduce of 19 MB on one rank and 26 MB on the other is not one collective:
        # the ranks' k-th calls are different operations (a sampled trace, unnamed groups)
        return "mismatched_size"
    if len(by_rank) < 2 and several:
        # seen on one rank only (windows that start or end at different steps): its
        # duration holds an unknown wait, so it is counted, not timed as a transfer
        return "unmatched"
    return None


def matched_instances(per_rank: Mapping[int, Sequence[CollectiveCall]]) -> list[tuple[Key, dict[int, CollectiveCall]]]:
    """The collective instances `match` counts (its `calls`), each with its call on every
    rank that has it: one op, one size (unless the op may send uneven amounts), on two
    ranks or more when several ranks are given."""
    several = len(per_rank) > 1
    return [(k, b) for k, b in _instances(per_rank).items() if _left_out(b, several) is None]


def match(per_rank: Mapping[int, Sequence[CollectiveCall]]) -> MatchResult:
    instances = _instances(per_rank)

    agg: dict[tuple[str, str], dict[str, float]] = {}
    meta: dict[tuple[str, str], dict[str, object]] = {}
    # per rank, the time intervals spent waiting and transferring: collectives in flight
    # together (gloo runs DDP's buckets concurrently) wait for the same late rank, so a
    # rank's wait is the union of its waits, not their sum
    wait_iv: dict[int, list[tuple[float, float]]] = defaultdict(list)
    transfer_iv: dict[int, list[tuple[float, float]]] = defaultdict(list)
    wait_detail: dict[tuple[str, str], dict[int, float]] = defaultdict(lambda: defaultdict(float))
    unmatched = mismatched = launch_only = unnamed = mismatched_size = alone = 0
    for key, by_rank in instances.items():
        why = _left_out(by_rank, len(per_rank) > 1)
        if why == "mismatched":
            mismatched += 1
            unnamed += key[0].startswith("?")
            continue
        if why == "mismatched_size":
            mismatched_size += 1
            continue
        if why == "unmatched":
            unmatched += 1
            continue
        first = next(iter(by_rank.values()))
        sizes = [c.bytes for c in by_rank.values() if c.bytes]
        if any(c.timing == "launch" for c in by_rank.values()):
            # only the enqueue was seen: count it, do not time it
            durs = {r: 0.0 for r in by_rank}
            launch_only += 1
            alone += all(c.group_size == 1 for c in by_rank.values())
        else:
            durs = {r: c.dur_us for r, c in by_rank.items()}
        transfer = min(durs.values())
        mean = sum(durs.values()) / len(durs)
        ident = (first.op, first.process_group)
        a = agg.setdefault(ident, {"calls": 0, "bytes": 0, "sized": 0, "total": 0.0, "transfer": 0.0, "sized_transfer": 0.0})
        m = meta.setdefault(ident, {"group_size": first.group_size, "ranks": set(), "implementation": first.implementation})
        m["ranks"] |= set(by_rank)  # type: ignore[operator]
        a["calls"] += 1
        a["total"] += mean
        a["transfer"] += transfer
        size = round(sum(sizes) / len(sizes)) if sizes else None  # all-to-all: each rank's own share, averaged
        if size and transfer > 0:
            a["bytes"] += size
            a["sized"] += 1
            a["sized_transfer"] += transfer
        for r, d in durs.items():
            # a rank waits from its arrival until the last one arrives, then the data moves
            start = by_rank[r].start_us
            wait_iv[r].append((start, start + d - transfer))
            transfer_iv[r].append((start + d - transfer, start + d))
            wait_detail[ident][r] += d - transfer

    out = []
    for ident in sorted(agg, key=lambda i: -agg[i]["total"]):
        a, m = agg[ident], meta[ident]
        op, pg = ident
        algbw = a["bytes"] / a["sized_transfer"] / 1e3 if a["sized_transfer"] > 0 and a["bytes"] else None
        # the group's size from the traces; unknown, busbw stays empty (the ranks matched are
        # the ranks analysed, not the group: 2 of a sampled 128-rank job)
        n = m["group_size"] if isinstance(m["group_size"], int) else None
        factor = bus_factor(op, n)
        out.append(
            Collective(
                op=op,
                process_group=pg,
                calls=int(a["calls"]),
                bytes=int(a["bytes"]),
                total_us=a["total"],
                transfer_us=a["transfer"],
                wait_us=a["total"] - a["transfer"],
                algbw_gbps=algbw,
                busbw_gbps=algbw * factor if algbw is not None and factor is not None else None,
                group_size=n,
                ranks_matched=len(m["ranks"]),  # type: ignore[arg-type]
                wait_by_rank_us={str(r): w for r, w in sorted(wait_detail[ident].items())},
                implementation=m["implementation"] if isinstance(m["implementation"], str) else None,
            )
        )
    return MatchResult(out, _union_lengths(wait_iv), _union_lengths(transfer_iv), unmatched, mismatched, launch_only, unnamed,
                       mismatched_size, alone)


def _union_lengths(by_rank: Mapping[int, list[tuple[float, float]]]) -> dict[int, float]:
    return {r: total_length([s for s, _ in iv], [e for _, e in iv]) for r, iv in sorted(by_rank.items())}


def _uneven_ok(op: str) -> bool:
    """Ops whose ranks may legitimately send different amounts (all_to_all with uneven
    splits; point-to-point pairs)."""
    return any(k in op for k in ("all_to_all", "alltoall", "send", "recv", "gather", "scatter")) and not any(
        k in op for k in ("all_gather", "reduce_scatter"))


def clock_offsets(per_rank_ends: Mapping[int, Sequence[tuple[tuple[str, int | None, int], float]]]) -> dict[int, float]:
    """Offset of each rank's clock from the lowest rank's, from the end times of matched
    collectives (they end together on every rank): the median of the differences."""
    if not per_rank_ends:
        return {}
    ref_rank = min(per_rank_ends)
    ref = dict(per_rank_ends[ref_rank])
    out = {ref_rank: 0.0}
    for r, ends in per_rank_ends.items():
        if r == ref_rank:
            continue
        diffs = sorted(t - ref[k] for k, t in ends if k in ref)
        if diffs:
            out[r] = diffs[len(diffs) // 2]
    return out


def end_times(calls: Sequence[CollectiveCall], base_us: float = 0.0) -> list[tuple[tuple[str, int | None, int], float]]:
    return [(k, base_us + c.start_us + c.dur_us) for k, c in zip(_key(calls), calls)]


def transfers(per_rank: Mapping[int, Sequence[CollectiveCall]], op: str = "all_reduce") -> list[tuple[int, float]]:
    """(bytes, transfer time) of each collective `op` matched across ranks as `match`
    matches them (waiting left out: the shortest duration across ranks); instances seen on
    one rank of several, of different ops or sizes on different ranks, unsized, or whose
    kernels the trace lacks are left out."""
    out = []
    for by_rank in _instances(per_rank).values():
        if {c.op for c in by_rank.values()} != {op} or (len(by_rank) < 2 and len(per_rank) > 1):
            continue
        sizes = {c.bytes for c in by_rank.values()}
        if len(sizes) != 1 or not next(iter(sizes)) or any(c.timing == "launch" for c in by_rank.values()):
            continue
        transfer = min(c.dur_us for c in by_rank.values())
        if transfer > 0:
            out.append((int(next(iter(sizes))), float(transfer)))  # type: ignore[arg-type]
    return out
