"""Each rank's memory by category (`RankResult.memory`, analyzers/memory.py) worded once
for every renderer: the terminal summary, markdown, HTML and the TUI take their lines
and cells from here, so they agree.

Sizes are written as the memory findings write them (analyzers/memory_rules.py): GB is
2**30 bytes, MB 2**20; from 0.1 GB on in GB with two decimals ("0.91 GB"), below in MB
with one ("4.0 MB"). A figure the block does not know is said as unknown, with why
(the block's `sources` entry for it where a writer gives one, else what the block tells:
its device, whether the profiler's allocation events were read), never as 0; one a
device does not have (the allocator's peak on a CPU) is "n/a" in a table and left out
of the words.

Reads only the Analysis; imports nothing heavy (the definitions, MEMORY_DEFINITIONS in
analyzers/memory.py, pull in numpy: the HTML report reads them itself).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pardiag.analysis import Analysis, RankResult
from pardiag.manifest import rank_ranges
from pardiag.style import MEMORY_LABELS

GB, MB, KB = 2**30, 2**20, 2**10
GB_FROM = 0.1 * GB  # from here on a size is written in GB
MAX_RANK_LINES = 8  # the terminal summary and the markdown: this many ranks, then "… N more ranks"
CATEGORIES = tuple(MEMORY_LABELS)  # analyzers/memory.py's CATEGORIES, in stacking order
TOTALS = ("allocated", "reserved", "steady_total", "rss_peak", "rss_steady", "capacity")
TOTAL_LABELS = {"allocated": "peak allocated", "reserved": "reserved", "steady_total": "step-end allocated",
                "rss_peak": "RSS peak", "rss_steady": "RSS steady", "capacity": "capacity"}
GPU_ONLY = frozenset({"other", "allocated", "reserved", "steady_total"})  # a CPU's allocator keeps no count
MEMORY_HEADER = ("rank", *MEMORY_LABELS.values(), *TOTAL_LABELS.values())
UNKNOWN = "unknown"
NOT_APPLICABLE = "n/a"


def size_text(n: float | None) -> str:
    """4223016 -> '4.0 MB', 981037056 -> '0.91 GB', 12638029824 -> '11.77 GB'; None -> 'unknown'."""
    if n is None:
        return UNKNOWN
    if abs(n) >= GB_FROM:
        return f"{n / GB:,.2f} GB"
    if abs(n) >= MB:
        return f"{n / MB:.1f} MB"
    if abs(n) >= KB:
        return f"{n / KB:.0f} kB"
    return f"{n:.0f} B"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _part(mem: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    p = mem.get(name)
    return p if isinstance(p, Mapping) else {}


def memory_of(r: RankResult) -> Mapping[str, Any] | None:
    """The rank's block when it is one (a newer or broken writer's other values: none)."""
    return r.memory if isinstance(r.memory, Mapping) else None


def memory_ranks(a: Analysis) -> list[tuple[int, Mapping[str, Any]]]:
    """(rank, block) of the ranks with a memory block, in rank order."""
    return [(r.rank, m) for r in a.ranks if (m := memory_of(r)) is not None]


def value(mem: Mapping[str, Any], key: str) -> float | None:
    """A category at the peak (CATEGORIES) or a total (TOTALS), in bytes; None when unknown."""
    if key in CATEGORIES:
        return _num(_part(mem, "peak").get(key))
    if key == "steady_total":
        return _num(_part(mem, "steady").get("total"))
    return _num(mem.get(key))


def _gpu(mem: Mapping[str, Any]) -> bool:
    return mem.get("device") == "cuda"


def applies(mem: Mapping[str, Any], key: str) -> bool:
    """False for a figure the rank's device does not have: the allocator's on a CPU."""
    return key not in GPU_ONLY or _gpu(mem) or mem.get("device") is None or value(mem, key) is not None


def why_unknown(mem: Mapping[str, Any], key: str) -> str:
    """Why the block does not know `key`: what its writer said (`sources`), else what the
    block shows (its device, the profiler's allocation events read or not)."""
    said = _part(mem, "sources").get(key)
    if isinstance(said, str) and said.strip():
        return " ".join(said.split())
    gpu, device = _gpu(mem), mem.get("device")
    if key == "parameters":
        return "no optimizer parameters in meta.json"
    if key == "gradients":
        return "no trainable parameters in meta.json"
    if key == "optimizer_state":
        return "no optimizer state in meta.json"
    if key == "activations":
        if isinstance(mem.get("profiled"), Mapping):
            return "no backward inside the profiled steps' allocation events"
        if gpu:
            return "no sampled step reached backward, no --profile-memory"
        return "no --profile-memory on a CPU" if device == "cpu" else "no --profile-memory"
    if key == "other":
        if not gpu:
            return "GPU only"
        return "no peak allocated" if value(mem, "allocated") is None else "needs the four categories"
    if key in ("allocated", "reserved"):
        return "not recorded at the job's end" if gpu else "GPU only"
    if key == "steady_total":
        return "no sampled step's end" if gpu else "GPU only"
    if key == "rss_peak":
        return "recorded on CPU ranks only" if gpu else "not recorded"
    if key == "rss_steady":
        return "no rss_mb in steps.jsonl"
    return "the device's memory was not recorded" if key == "capacity" else "not recorded"


def figure_words(mem: Mapping[str, Any], key: str) -> str:
    """'4.0 MB', or 'unknown (no --profile-memory on a CPU)'."""
    v = value(mem, key)
    return size_text(v) if v is not None else f"{UNKNOWN} ({why_unknown(mem, key)})"


def peak_of(mem: Mapping[str, Any]) -> tuple[float | None, str]:
    """The rank's peak to compare ranks by, and what it is: allocated on a GPU, the
    process's RSS elsewhere (as memory_imbalance compares them)."""
    if (v := value(mem, "allocated")) is not None:
        return v, "allocated"
    if (v := value(mem, "rss_peak")) is not None:
        return v, "RSS"
    return None, ""


def peak_words(mem: Mapping[str, Any]) -> str:
    """'peak 61.20 GB allocated, 70.00 GB reserved', 'peak 0.91 GB RSS', or why unknown."""
    v, what = peak_of(mem)
    if v is None:
        return f"peak {UNKNOWN} ({why_unknown(mem, 'allocated' if _gpu(mem) else 'rss_peak')})"
    reserved = value(mem, "reserved")
    res = f", {size_text(reserved)} reserved" if what == "allocated" and reserved is not None else ""
    return f"peak {size_text(v)} {what}{res}"


def category_words(mem: Mapping[str, Any]) -> str:
    """'parameters 4.0 MB, gradients 8.1 MB, optimizer state 8.1 MB, activations unknown
    (no --profile-memory on a CPU)'; other only where the device has it."""
    return ", ".join(f"{MEMORY_LABELS[k]} {figure_words(mem, k)}" for k in CATEGORIES if applies(mem, k))


def rank_memory_words(rank: int, mem: Mapping[str, Any]) -> str:
    """One line per rank: 'rank 1: peak 0.91 GB RSS; parameters 4.0 MB, ...'."""
    return f"rank {rank}: {peak_words(mem)}; {category_words(mem)}"


def memory_words(a: Analysis) -> str | None:
    """The job's line: the rank with the largest peak and how full its memory is, the
    spread across ranks: 'largest rank 1, peak 0.91 GB RSS of 11.77 GB (8%); across 2
    ranks 0.59 GB to 0.91 GB (spread 0.32 GB, +55%)'. None when no rank has a block."""
    rows = memory_ranks(a)
    if not rows:
        return None
    peaks = [(rank, v, what) for rank, m in rows for v, what in [peak_of(m)] if v is not None]
    unknown = len(a.ranks) - len(peaks)
    without = f"; {unknown} rank{'s' if unknown != 1 else ''} without a known peak" if unknown else ""
    if not peaks:
        return f"peak {UNKNOWN} on every rank ({why_unknown(rows[0][1], 'rss_peak')})"
    top, hi, what = max(peaks, key=lambda p: (p[1], -p[0]))
    text = f"largest rank {top}, peak {size_text(hi)} {what}"
    cap = value(dict(rows)[top], "capacity")
    if cap:
        text += f" of {size_text(cap)} ({hi / cap:.0%})"
    if len(peaks) > 1:
        if len({w for _, _, w in peaks}) > 1:
            text += "; the ranks' peaks are measured differently (allocated on a GPU, RSS elsewhere): no spread"
        else:
            lo = min(v for _, v, _ in peaks)
            rel = f", +{(hi - lo) / lo:.0%}" if lo > 0 else ""
            text += f"; across {len(peaks)} ranks {size_text(lo)} to {size_text(hi)} (spread {size_text(hi - lo)}{rel})"
    return text + without


def shown_ranks(a: Analysis, limit: int) -> list[tuple[int, Mapping[str, Any]]]:
    """At most `limit` ranks with a block, in rank order: past that the largest peaks."""
    rows = memory_ranks(a)
    if len(rows) <= limit:
        return rows
    keep = sorted(rows, key=lambda x: (-(peak_of(x[1])[0] or -1.0), x[0]))[:limit]
    return sorted(keep, key=lambda x: x[0])


def memory_lines(a: Analysis, limit: int = MAX_RANK_LINES) -> list[str]:
    """The ranks' lines under the job's (the largest peaks past `limit`, then how many
    more); [] when no rank has a block."""
    rows = memory_ranks(a)
    shown = shown_ranks(a, limit)
    out = [rank_memory_words(rank, m) for rank, m in shown]
    if len(rows) > len(shown):
        out.append(f"… {len(rows) - len(shown)} more ranks")
    return out


def memory_cells(rank: int, mem: Mapping[str, Any]) -> list[str]:
    """A table row (MEMORY_HEADER): rank, the categories at the peak, peak allocated,
    reserved, allocated at the step's end, RSS peak and steady, capacity."""
    keys = (*CATEGORIES, *TOTALS)
    return [str(rank), *(size_text(value(mem, k)) if applies(mem, k) else NOT_APPLICABLE for k in keys)]


def memory_table(rows: Sequence[tuple[int, Mapping[str, Any]]]) -> tuple[list[str], list[list[str]]]:
    """The header and cells (MEMORY_HEADER, memory_cells) of these ranks, less the
    columns that are n/a on every one of them (the allocator's on a CPU-only run)."""
    cells = [memory_cells(rank, m) for rank, m in rows]
    keep = [i for i in range(len(MEMORY_HEADER)) if not cells or any(row[i] != NOT_APPLICABLE for row in cells)]
    return [MEMORY_HEADER[i] for i in keep], [[row[i] for i in keep] for row in cells]


def rank_memory_rows(mem: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, words) of each figure the rank's device has: the categories at the peak,
    then the totals; unknown ones say why."""
    return [(MEMORY_LABELS.get(k) or TOTAL_LABELS[k], figure_words(mem, k))
            for k in (*CATEGORIES, *TOTALS) if applies(mem, k)]


def _grouped(pairs: Sequence[tuple[int, str, str]], every: int) -> list[tuple[str, str, str]]:
    """(rank, label, words) -> (label, words, 'ranks 0-3' or '' when on every rank)."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for rank, label, words in pairs:
        ranks.setdefault((label, words), []).append(rank)
    out = []
    for (label, words), rs in ranks.items():
        where = "" if len(rs) == every else f"rank{'s' if len(rs) > 1 else ''} {rank_ranges(sorted(rs))}"
        out.append((label, words, where))
    return out


def unknown_lines(a: Analysis) -> list[str]:
    """What is not known and why, once for all the ranks it holds for: 'activations
    unknown: no --profile-memory on a CPU' ('..., on ranks 0-3' when not on all)."""
    rows = memory_ranks(a)
    pairs = [(rank, MEMORY_LABELS.get(k) or TOTAL_LABELS[k], why_unknown(m, k)) for k in (*CATEGORIES, *TOTALS)
             for rank, m in rows if applies(m, k) and value(m, k) is None]  # in the categories' order
    return [f"{label} {UNKNOWN}" + (f" on {where}" if where else "") + f": {why}"
            for label, why, where in _grouped(pairs, len(rows))]


def _order(key: str) -> tuple[int, str]:
    keys = (*CATEGORIES, *TOTALS)
    return (keys.index(key) if key in keys else len(keys), key)


def rank_sources(mem: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, where it comes from) of the rank's known figures, from its `sources`, in
    the categories' order (an entry for an unknown figure says why: `why_unknown`)."""
    said = sorted(_part(mem, "sources").items(), key=lambda kv: _order(str(kv[0])))
    return [(MEMORY_LABELS.get(str(k)) or TOTAL_LABELS.get(str(k)) or str(k).replace("_", " "), " ".join(v.split()))
            for k, v in said if isinstance(v, str) and v.strip()
            and (str(k) not in (*CATEGORIES, *TOTALS) or value(mem, str(k)) is not None)]


def source_lines(a: Analysis) -> list[str]:
    """Where each figure comes from (the blocks' `sources`), once for all the ranks it
    holds for: 'parameters: the optimizers' parameters (meta.json)'."""
    rows = memory_ranks(a)
    said = [(rank, label, words) for rank, m in rows for label, words in rank_sources(m)]
    order = {label: i for i, label in enumerate(dict.fromkeys(label for _, label, _ in said))}
    pairs = sorted(said, key=lambda x: order[x[1]])  # each figure once, as the first rank lists them
    return [f"{label}: {words}" + (f" ({where})" if where else "")
            for label, words, where in _grouped(pairs, len(rows))]
