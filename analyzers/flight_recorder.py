"""PyTorch's flight recorder: which collective each rank last finished and last entered,
per process group, the first collective the ranks disagree on, and who never arrived.

c10d keeps a ring buffer of the collectives each process group issued (TORCH_FR_BUFFER_SIZE
entries; pardiag sets it) and writes it to `<TORCH_FR_DUMP_TEMP_FILE><rank>` (pardiag points
it at the run's `flight/rank_`). NCCL's watchdog dumps on a timeout by itself
(TORCH_NCCL_DUMP_ON_TIMEOUT); with torch 2.13 ProcessGroupGloo records into the same buffer
but never writes it, so pardiag's in-rank collector writes the dump when a collective of a
rank fails (see collectors.flight_dump). The file is a pickle of builtin containers and
scalars only (format version "2.x": `version`, `pg_config`, `pg_status`, `entries`), the
shape torch's own `torch.distributed.flight_recorder.components` (loader.py, types.py) read.

Those components are not imported here: their loader unpickles with `pickle.load`, which runs
whatever a file names, and the analysis works without torch. A dump is read with a restricted
unpickler that refuses every class and function (`find_class` always raises): the format
needs only dicts, lists, tuples, strings, numbers, booleans and None, so a file naming any
global is refused, not executed. Matching follows torch's `types.Op.match` rule by rule
(collective type, input sizes, output sizes, all-reduce in/out, all-gather and
reduce-scatter element counts, dtypes, state) and reports its `MatchState` names.

Every problem with a file (truncated, not a pickle, an unknown version, a rank missing) is a
one-line note in the result; the others are analysed as far as they go.
"""

from __future__ import annotations

import io
import math
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pardiag.analysis_blocks import FlightCall, FlightGroup, FlightMismatch, FlightRank, FlightRecord

SUPPORTED_MAJOR = 2  # c10d's FR format: "2.0" (torch 2.4) ... "2.10" (torch 2.13)
MAX_DUMP_BYTES = 256 << 20
_RANK_IN_NAME = re.compile(r"(\d+)$")
_P2P = frozenset({"send", "recv"})
# torch types.Op.match: the rules that skip some collectives
_NO_INPUT_CHECK = frozenset({"all_to_all", "scatter"})
_NO_OUTPUT_CHECK = frozenset({"all_to_all", "gather"})
_IN_EQUALS_OUT = frozenset({"all_reduce", "allreduce_coalesced"})
_GATHER_NUMEL = frozenset({"all_gather", "all_gather_base", "all_gather_into_tensor_coalesced"})
_SCATTER_NUMEL = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"})


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler that refuses every global: a flight-recorder dump holds only builtin
    containers and scalars, so a file that names a class or function is not one (and
    must not run)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name} (a flight-recorder dump names none)")


def load_dump(data: bytes) -> dict[str, Any]:
    """A dump's bytes as a dict, read with the restricted unpickler; raises ValueError with
    one line that says what is wrong (not a pickle, truncated, a global, not a dict)."""
    try:
        doc = _BuiltinsOnly(io.BytesIO(data)).load()
    except EOFError:
        raise ValueError("truncated (the pickle ends early)") from None
    except pickle.UnpicklingError as e:
        if "truncated" in str(e):  # a dump cut short (the C unpickler's wording)
            raise ValueError("truncated (the pickle ends early)") from None
        raise ValueError(f"not a flight-recorder pickle: {e}") from None
    except Exception as e:  # any other malformed byte stream
        raise ValueError(f"not a flight-recorder pickle: {type(e).__name__}: {e}") from None
    if not isinstance(doc, dict) or "entries" not in doc:
        raise ValueError("not a flight-recorder dump (no `entries`)")
    return doc


def _version_ok(v: Any) -> bool:
    m = re.fullmatch(r"(\d+)\.(\d+)", str(v))
    return m is not None and int(m.group(1)) == SUPPORTED_MAJOR


@dataclass(frozen=True)
class Entry:
    """One collective as one rank recorded it (a row of the dump's `entries`)."""

    rank: int
    pg: str
    pg_desc: str
    record_id: int
    seq: int  # collective_seq_id; p2p_seq_id for send/recv
    op: str  # profiling name without the backend: "all_reduce", "send 0->1"
    backend: str
    input_sizes: list[list[int]]
    output_sizes: list[list[int]]
    input_dtypes: list[str]
    output_dtypes: list[str]
    state: str
    completed: bool
    frames: list[str]
    timeout_ms: int | None

    @property
    def kind(self) -> str:
        return self.op.split(" ")[0]

    def call(self, completed: bool) -> FlightCall:
        """As the Analysis shows it; `completed` as the analysis of all ranks decided."""
        return FlightCall(seq=self.seq, op=self.op, state="completed" if completed else self.state,
                          input_sizes=self.input_sizes, output_sizes=self.output_sizes,
                          input_dtypes=self.input_dtypes, output_dtypes=self.output_dtypes,
                          frames=self.frames, timeout_ms=self.timeout_ms, rank=self.rank,
                          user_frame=user_frame(self.frames))


@dataclass
class RankDump:
    rank: int
    version: str
    groups: dict[str, list[int]]  # pg name -> member ranks (pg_config)
    entries: list[Entry] = field(default_factory=list)


def _frame(f: Any) -> str:
    if not isinstance(f, Mapping):
        return str(f)
    return f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})"


def _sizes(v: Any) -> list[list[int]]:
    return [[int(x) for x in s] for s in v or () if isinstance(s, (list, tuple))]


def _entry(rank: int, e: Mapping[str, Any], done: Mapping[str, int]) -> Entry:
    name = str(e.get("profiling_name") or "?")
    backend, _, op = name.partition(":") if ":" in name else ("", "", name)
    pg, desc = (list(e.get("process_group") or ("?", "")) + ["", ""])[:2]
    p2p = bool(e.get("is_p2p")) or op.split(" ")[0] in _P2P
    seq = int(e.get("p2p_seq_id" if p2p else "collective_seq_id") or 0)
    state = str(e.get("state") or "?")
    # gloo leaves `state` at "scheduled"; the group's last completed sequence id says more
    completed = state == "completed" or (not p2p and seq <= done.get(str(e.get("pg_id", pg)), -1))
    return Entry(rank=rank, pg=str(pg), pg_desc=str(desc), record_id=int(e.get("record_id") or 0), seq=seq,
                 op=op, backend=backend, input_sizes=_sizes(e.get("input_sizes")),
                 output_sizes=_sizes(e.get("output_sizes")),
                 input_dtypes=[str(d) for d in e.get("input_dtypes") or ()],
                 output_dtypes=[str(d) for d in e.get("output_dtypes") or ()], state=state, completed=completed,
                 frames=[_frame(f) for f in e.get("frames") or ()],
                 timeout_ms=int(e["timeout_ms"]) if isinstance(e.get("timeout_ms"), int) else None)


def _groups(pg_config: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, cfg in (pg_config or {}).items():
        ranks = cfg.get("ranks") if isinstance(cfg, Mapping) else None
        if isinstance(ranks, str):
            ranks = [int(x) for x in re.findall(r"-?\d+", ranks)]
        if isinstance(ranks, (list, tuple)):
            out[str(name)] = [int(x) for x in ranks]
    return out


def parse_dump(rank: int, doc: Mapping[str, Any]) -> RankDump:
    """One rank's loaded dump as typed entries; raises ValueError for an unknown version."""
    version = str(doc.get("version"))
    if not _version_ok(version):
        raise ValueError(f"format version {version!r}, this pardiag reads {SUPPORTED_MAJOR}.x")
    done = {str(k): int(v.get("last_completed_collective", -1))
            for k, v in (doc.get("pg_status") or {}).items() if isinstance(v, Mapping)}
    entries = [_entry(rank, e, done) for e in doc.get("entries") or () if isinstance(e, Mapping)]
    return RankDump(rank=rank, version=version, groups=_groups(doc.get("pg_config")),
                    entries=sorted(entries, key=lambda x: x.record_id))


def dump_files(folder: Path) -> dict[int, Path]:
    """rank -> dump file in `folder` (the rank is the number the file name ends with)."""
    out: dict[int, Path] = {}
    for p in sorted(folder.glob("*")) if folder.is_dir() else []:
        m = _RANK_IN_NAME.search(p.name)
        if p.is_file() and m:
            out[int(m.group(1))] = p
    return out


def read_dumps(files: Mapping[int, Path]) -> tuple[dict[int, RankDump], list[str]]:
    """The dumps that could be read, and one note per file that could not."""
    dumps: dict[int, RankDump] = {}
    notes: list[str] = []
    for rank, path in sorted(files.items()):
        try:
            if path.stat().st_size > MAX_DUMP_BYTES:
                raise ValueError(f"{path.stat().st_size} bytes, more than the {MAX_DUMP_BYTES >> 20} MiB read")
            dumps[rank] = parse_dump(rank, load_dump(path.read_bytes()))
        except (OSError, ValueError) as e:
            notes.append(f"{path.name}: {e}; rank {rank} left out")
    return dumps, notes


# --------------------------------------------------------------------------- matching


def _numel(sizes: Sequence[Sequence[int]]) -> int:
    return math.prod(sizes[0]) if sizes else 0


def match_state(a: Entry, b: Entry, pg_size: int) -> tuple[str, str]:
    """How `b` matches `a` (torch types.Op.match, collectives only): the MatchState name
    and, for a mismatch, what differs."""
    if a.kind != b.kind:
        return "COLLECTIVE_TYPE_MISMATCH", f"{a.kind} vs {b.kind}"
    k = a.kind
    if k not in _NO_INPUT_CHECK and a.input_sizes != b.input_sizes:
        return "SIZE_OR_SYNTAX_MISMATCH", f"input sizes {a.input_sizes} vs {b.input_sizes}"
    if k not in _NO_OUTPUT_CHECK and a.output_sizes != b.output_sizes:
        return "SIZE_OR_SYNTAX_MISMATCH", f"output sizes {a.output_sizes} vs {b.output_sizes}"
    if k in _IN_EQUALS_OUT and a.input_sizes != b.output_sizes:
        return "SIZE_OR_SYNTAX_MISMATCH", f"input sizes {a.input_sizes} vs output sizes {b.output_sizes}"
    if k in _GATHER_NUMEL and _numel(b.output_sizes) != _numel(a.input_sizes) * pg_size:
        return "SIZE_OR_SYNTAX_MISMATCH", (f"output numel {_numel(b.output_sizes)} vs input numel "
                                           f"{_numel(a.input_sizes)} x {pg_size} ranks")
    if k in _SCATTER_NUMEL and _numel(b.input_sizes) != _numel(a.output_sizes) * pg_size:
        return "SIZE_OR_SYNTAX_MISMATCH", (f"input numel {_numel(b.input_sizes)} vs output numel "
                                           f"{_numel(a.output_sizes)} x {pg_size} ranks")
    if _dtype_mismatch(a, b):
        return "COLLECTIVE_DTYPE_MISMATCH", (f"dtypes {sorted(set(a.input_dtypes))} vs "
                                             f"{sorted(set(b.input_dtypes) | set(b.output_dtypes))}")
    if a.completed != b.completed or (not a.completed and a.state != b.state):
        sa, sb = ("completed" if e.completed else e.state for e in (a, b))
        return "COLLECTIVE_STATE_MISMATCH", f"state {sa} vs {sb}"
    if k == "all_to_all":
        return "UNDECIDED", "all_to_all sizes need every rank"
    return "FULLY_MATCHED", ""


def _has_size(sizes: Sequence[Sequence[int]]) -> bool:
    """torch tests a call's first size for emptiness before comparing its dtypes."""
    return bool(sizes and sizes[0])


def _dtype_mismatch(a: Entry, b: Entry) -> bool:
    """torch types.Op.dtype_mismatch: in/out dtypes of one call, inputs and outputs across ranks."""
    ai, ao, bi, bo = set(a.input_dtypes), set(a.output_dtypes), set(b.input_dtypes), set(b.output_dtypes)
    return bool(
        (a.kind not in ("scatter", "gather", "broadcast") and ai != ao
         and _has_size(a.input_sizes) and _has_size(a.output_sizes))
        or (a.kind not in ("scatter", "broadcast") and ai != bi
            and _has_size(a.input_sizes) and _has_size(b.input_sizes))
        or (a.kind != "gather" and ao != bo and _has_size(a.output_sizes) and _has_size(b.output_sizes))
    )


def _majority(at_seq: Mapping[int, Entry], pg_size: int) -> tuple[int, list[int], str, str]:
    """The reference rank (of the largest set of ranks that match each other; ties: the set
    with the lowest rank), the ranks that differ from it, and the first difference."""
    classes: list[list[int]] = []
    for r in sorted(at_seq):
        for c in classes:
            if match_state(at_seq[c[0]], at_seq[r], pg_size)[0] in ("FULLY_MATCHED", "UNDECIDED"):
                c.append(r)
                break
        else:
            classes.append([r])
    ref = max(classes, key=lambda c: (len(c), -c[0]))[0]
    odd = sorted(r for c in classes if ref not in c for r in c)
    state, detail = match_state(at_seq[ref], at_seq[odd[0]], pg_size) if odd else ("FULLY_MATCHED", "")
    return ref, odd, state, detail


def user_frame(frames: Sequence[str]) -> str | None:
    """The innermost frame outside torch (where the user's code called the collective)."""
    return next((f for f in frames if "/torch/" not in f and "\\torch\\" not in f), frames[0] if frames else None)


def first_disagreement(colls: Mapping[int, Mapping[int, Entry]], size: int) -> FlightMismatch | None:
    """The first sequence id at which the ranks' collectives differ (torch's MatchState) or
    some ranks, whose dumps end before it, never entered it. Sequence ids older than every
    rank's oldest entry left the ring buffer and are not compared."""
    first_seq = max((min(c) for c in colls.values() if c), default=0)
    for seq in sorted({s for c in colls.values() for s in c if s >= first_seq}):
        at = {r: c[seq] for r, c in colls.items() if seq in c}
        ref, odd, state, detail = _majority(at, size)
        if state not in ("FULLY_MATCHED", "UNDECIDED"):
            return FlightMismatch(seq=seq, match_state=state, reference_rank=ref, culprit_ranks=odd,
                                  expected=at[ref].call(False), found=[at[r].call(False) for r in odd], detail=detail)
        absent = sorted(r for r, c in colls.items() if max(c, default=-1) < seq)
        if absent:
            return FlightMismatch(seq=seq, match_state="MISSING_RANKS", reference_rank=ref, culprit_ranks=absent,
                                  expected=at[ref].call(False), detail=f"rank(s) {absent} never entered it")
    return None


def analyze_group(pg: str, members: Sequence[int], by_rank: Mapping[int, Sequence[Entry]]) -> FlightGroup:
    """One process group: each dumped rank's last completed and last entered collective,
    the first sequence id where the ranks disagree (or where some never arrived), the
    culprits, and the Python frames of the stuck call. A collective the ranks disagree on
    cannot have completed, whatever a rank's dump says (gloo counts a collective that
    failed as completed)."""
    colls = {r: {e.seq: e for e in es if e.kind not in _P2P} for r, es in by_rank.items()}
    m = first_disagreement(colls, len(members) or len(by_rank))
    cut = m.seq if m else None

    def done(e: Entry) -> bool:
        return e.completed and (cut is None or e.kind in _P2P or e.seq < cut)

    last = [FlightRank(rank=r, last_completed=next((e.call(True) for e in reversed(es) if done(e)), None),
                       last_entered=es[-1].call(done(es[-1])) if es else None)
            for r, es in sorted(by_rank.items())]
    stuck = m.expected if m else next((x.last_entered for x in last if x.last_entered and
                                       x.last_entered.state != "completed"), None)
    return FlightGroup(process_group=pg, ranks=sorted(members), dumped_ranks=sorted(by_rank),
                       missing_dumps=sorted(set(members) - set(by_rank)), last=last, first_mismatch=m,
                       culprit_ranks=m.culprit_ranks if m else [],
                       never_arrived=m.culprit_ranks if m and m.match_state == "MISSING_RANKS" else [],
                       stuck_frames=stuck.frames if stuck else [],
                       stuck_user_frame=stuck.user_frame if stuck else None)


def analyze_dumps(dumps: Mapping[int, RankDump], notes: Sequence[str] = (), world_size: int | None = None,
                  files: Sequence[str] = ()) -> FlightRecord:
    """Every process group the dumps mention, analysed; ranks of the world that left no
    readable dump are named in `missing_ranks` and in the notes."""
    notes = list(notes)
    members: dict[str, set[int]] = {}
    by_group: dict[str, dict[int, list[Entry]]] = {}
    for d in dumps.values():
        for name, ranks in d.groups.items():
            members.setdefault(name, set()).update(ranks)
        for e in d.entries:
            by_group.setdefault(e.pg, {}).setdefault(d.rank, []).append(e)
    world = world_size or (max(dumps) + 1 if dumps else 0)
    missing = sorted(set(range(world)) - set(dumps))
    if missing:
        notes.append(f"no readable dump from rank(s) {', '.join(map(str, missing))}: "
                     "their side of each collective is unknown")
    versions = Counter(d.version for d in dumps.values())
    groups = [analyze_group(pg, sorted(members.get(pg) or _default_members(pg, dumps, world)), ranks)
              for pg, ranks in sorted(by_group.items())]
    return FlightRecord(files=list(files), ranks_dumped=sorted(dumps), missing_ranks=missing,
                        version=versions.most_common(1)[0][0] if versions else None, groups=groups, notes=notes,
                        summary=_summary(groups, dumps, missing))


def _default_members(pg: str, dumps: Mapping[int, RankDump], world: int) -> set[int]:
    """Members of a group whose pg_config row is keyed differently (gloo's default group
    is recorded under "" in pg_config, "0" in the entries): the world, for group "0"."""
    return set(range(world)) if pg == "0" else {r for r, d in dumps.items() if any(e.pg == pg for e in d.entries)}


def _summary(groups: Sequence[FlightGroup], dumps: Mapping[int, RankDump], missing: Sequence[int]) -> str:
    if not dumps:
        return "no readable flight-recorder dump"
    for g in groups:
        m = g.first_mismatch
        if m is None:
            continue
        where = f"process group {g.process_group}, collective #{m.seq} ({m.expected.op})"
        if m.match_state == "MISSING_RANKS":
            return f"{where}: rank(s) {', '.join(map(str, m.culprit_ranks))} never entered it"
        return (f"{where}: {m.match_state} — rank(s) {', '.join(map(str, m.culprit_ranks))} differ from rank "
                f"{m.reference_rank}: {m.detail}")
    tail = f"; no dump from rank(s) {', '.join(map(str, missing))}" if missing else ""
    return "every dumped rank issued the same collectives" + tail


def analyze_flight_dir(folder: Path, world_size: int | None = None) -> FlightRecord | None:
    """The run's `flight/` folder analysed; None when it holds no dump."""
    files = dump_files(folder)
    if not files:
        return None
    dumps, notes = read_dumps(files)
    return analyze_dumps(dumps, notes, world_size, files=[p.name for _, p in sorted(files.items())])
