"""Speed-up factors measured on the run's own hardware, and their typed readers.

Files under ``RUN/factors/``, written by `pardiag run` after the job (never inside
it, `pardiag.measure`):

``gemm.json``
    the job's top matrix-multiply/convolution shapes (from the lowest rank's trace),
    each timed on the job's host and device type in fp32 and in a lower precision
    (bf16 autocast; fp16 on GPUs without bf16); the time-weighted speed-up
    ``speedup = sum(trace_us) / sum(trace_us / speedup_i)`` over the timed shapes and the
    share of the window's GEMM time they cover. `gemm_factor` reads it.
``allreduce.json``
    the latency/bandwidth curve of all_reduce, ``time = alpha + bytes * beta``: fitted to
    the run's own matched all_reduce calls when their sizes span at least 4x and the
    line explains their times (r2 >= 0.8, a bandwidth term; source "fit"), else measured by a short sweep after the job (source "sweep"), else the
    reason there is none. `comm_curve` reads it, or fits the calls it is given.

``loader.json``
    a DataLoader worker's hand-over of a batch of the job's input shape
    (`loader_handover`).
``faults.json``
    what a minor page fault of fresh memory costs on the job's host (`fault_cost`):
    measured when a CPU rank faulted inside backward in every step.

Each carries ``format``/``format_version``; a newer version is refused in one line, a
corrupt file never raises: the readers return None and say why (`read_gemm`,
`read_comm`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Mapping, Sequence, TypeVar

from pardiag.analyzers.collectives import transfers
from pardiag.analyzers.rank_trace import CollectiveCall
from pardiag.analyzers.steps import median

GEMM_FORMAT = "pardiag.gemm-factor"
GEMM_VERSION = 1
COMM_FORMAT = "pardiag.allreduce-curve"
COMM_VERSION = 1
LOADER_FORMAT = "pardiag.loader-handover"
LOADER_VERSION = 1
FAULTS_FORMAT = "pardiag.page-fault-cost"
FAULTS_VERSION = 1
FIT_MIN_SPAN = 4.0  # the sizes must span at least this ratio for a fit of the run's own calls
FIT_MIN_R2 = 0.8  # ... and the line must explain the times this well, with a bandwidth term

T = TypeVar("T")


@dataclass(frozen=True)
class Read(Generic[T]):
    """A factor, or None with the one line that says why there is none."""

    value: T | None
    reason: str | None = None


# -- GEMM ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmRow:
    op: str
    dims: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[str, ...]
    backward: bool
    calls: int  # in the profiled window
    trace_us: float  # their total time in the window
    fp32_us: float | None  # one call, measured
    half_us: float | None
    speedup: float | None
    error: str | None = None  # why this shape was not timed


BYTE_RATIO = {"bfloat16": 2.0, "float16": 2.0}
"""float32's 4 bytes an element over the lower precision's."""


@dataclass(frozen=True)
class Followers:
    """The elementwise operators a lower precision would run on half the bytes (the
    activations right after the matrix multiplies, and their backward: gemm_shapes'
    followers), from gemm.json's ``followers``. Not timed after the job: such an operator
    moves each byte once, and inside a profiled step its time is mostly memory traffic
    and the pages of its fresh output (a float32 1024x512 ReLU took 1,678 us per call in
    a job's profiled window and 145 us alone from a warm cache; in bf16 567 and 125), so
    a timing of it alone does not say what it saves there; its time is taken as the bytes
    it moves, ``speedup`` the byte ratio (an assumption, labelled)."""

    followers_us: float  # their time in the window (rank measured)
    names_us: float  # every call of their operators' names in the window
    byte_ratio: float
    source: str

    @property
    def speedup(self) -> float:
        """Of ALL the time in their names' operators (what the replay scales): the
        followers' at the byte ratio, the rest as it was."""
        gone = self.followers_us * (1 - 1 / self.byte_ratio)
        return self.names_us / (self.names_us - gone) if self.names_us > gone else 1.0


@dataclass(frozen=True)
class GemmFactor:
    speedup: float  # time-weighted over the timed shapes
    from_dtype: str  # "float32"
    half_dtype: str  # "bfloat16" or "float16"
    device: str  # "cpu" or "cuda"
    device_name: str
    covered_share: float  # of the window's GEMM time, the share the timed shapes hold
    rows: tuple[GemmRow, ...]
    seconds: float  # how long the measurement took
    source: str  # in words, for evidence
    followers: Followers | None = None

    @property
    def timed(self) -> tuple[GemmRow, ...]:
        return tuple(r for r in self.rows if r.speedup)


def weighted_speedup(rows: Sequence[tuple[float, float]]) -> float | None:
    """(trace_us, speedup) pairs -> sum(trace) / sum(trace / speedup): the speed-up of
    the whole of that time."""
    rows = [(t, s) for t, s in rows if t > 0 and s and s > 0]
    after = sum(t / s for t, s in rows)
    return sum(t for t, _ in rows) / after if after > 0 else None


def _kind_words(rows: Sequence[GemmRow]) -> str:
    conv = sum("conv" in r.op for r in rows)
    att = sum("attention" in r.op for r in rows)
    mm = len(rows) - conv - att
    parts = [f"{n} {w} shape{'s' if n != 1 else ''}" for n, w in ((mm, "matmul"), (conv, "convolution"),
                                                                 (att, "attention")) if n]
    return " and ".join(parts) if len(parts) < 3 else f"{parts[0]}, {parts[1]} and {parts[2]}"


def read_gemm(run_dir: str | Path) -> Read[GemmFactor]:
    path = Path(run_dir) / "factors" / "gemm.json"
    doc, why = _load(path, GEMM_FORMAT, GEMM_VERSION)
    if doc is None:
        return Read(None, why)
    if doc.get("status") != "ok":
        return Read(None, f"gemm.json: {doc.get('reason') or 'no measurement'}")
    try:
        rows = tuple(
            GemmRow(op=str(r["op"]), dims=tuple(tuple(int(x) for x in d) if d is not None else None for d in r["dims"]),
                    dtypes=tuple(str(t) for t in r["dtypes"]), backward=bool(r.get("backward")),
                    calls=int(r["calls"]), trace_us=float(r["trace_us"]),
                    fp32_us=_opt_float(r.get("fp32_us")), half_us=_opt_float(r.get("half_us")),
                    speedup=_opt_float(r.get("speedup")), error=r.get("error"))
            for r in doc["shapes"])
        speedup = weighted_speedup([(r.trace_us, r.speedup or 0.0) for r in rows])
        if speedup is None:
            return Read(None, "gemm.json: no shape was timed")
        half = str(doc["to_dtype"])
        device = str(doc["device"])
        timed = tuple(r for r in rows if r.speedup)
        where = "this host's CPU" if device == "cpu" else f"this host's {doc.get('device_name') or 'GPU'}"
        short = {"bfloat16": "bf16", "float16": "fp16"}.get(half, half)
        source = (f"measured: {_kind_words(timed)} of this job timed in fp32 and {short} autocast on {where} "
                  f"after the job")
        return Read(GemmFactor(
            speedup=speedup, from_dtype=str(doc.get("from_dtype") or "float32"), half_dtype=half, device=device,
            device_name=str(doc.get("device_name") or ""), covered_share=float(doc["covered_share"]), rows=rows,
            seconds=float(doc.get("seconds") or 0.0), source=source, followers=_followers(doc, half, short)))
    except (KeyError, TypeError, ValueError) as e:
        return Read(None, f"gemm.json: unreadable ({type(e).__name__}: {e})")


def _followers(doc: dict[str, Any], half: str, short: str) -> Followers | None:
    f = doc.get("followers")
    ratio = BYTE_RATIO.get(half)
    if not isinstance(f, dict) or ratio is None or doc.get("from_dtype", "float32") != "float32":
        return None
    fol, names = _opt_float(f.get("followers_us")), _opt_float(f.get("names_us"))
    if not fol or not names or fol <= 0 or names < fol * (1 - 1e-6):
        return None
    names = max(names, fol)  # the two sums of one set of calls can differ in the last bit
    ops = sorted({str(r.get("op", "")).removeprefix("aten::") for r in f.get("shapes") or [] if isinstance(r, dict)})
    return Followers(fol, names, ratio,
                     f"assumed: {', '.join(ops) or 'elementwise operators'} on the matrix multiplies' float32 "
                     f"outputs ({fol / 1e3:.1f} ms of the window) run in {short} on {1 / ratio:.0%} of the bytes, "
                     "in as much less time")


@dataclass(frozen=True)
class MeasuredPeak:
    """The throughput of a large square matrix multiply on the job's host, device type
    and threads, per precision, timed after the job (gemm.json's ``peak``)."""

    tflops: dict[str, float]  # "fp32" (or "tf32" on a GPU that allowed it), "bf16", "fp16"
    n: dict[str, int]  # the matrices' size per precision
    device: str  # "cpu" or "cuda"
    device_name: str
    threads: int | None
    source: str  # in words, for evidence


_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def read_peak(run_dir: str | Path) -> Read[MeasuredPeak]:
    """The square GEMM measured after the job (`gemm_bench.measure_peaks`), or None and why."""
    doc, why = _load(Path(run_dir) / "factors" / "gemm.json", GEMM_FORMAT, GEMM_VERSION)
    if doc is None:
        return Read(None, why)
    peak = doc.get("peak")
    if not isinstance(peak, dict):
        if doc.get("status") != "ok":
            return Read(None, f"gemm.json: {doc.get('reason') or 'no measurement'}")
        return Read(None, "gemm.json has no square GEMM (measured by a pardiag that did not time one)")
    tflops: dict[str, float] = {}
    sizes: dict[str, int] = {}
    ops: dict[str, str] = {}
    for dtype, key in _PRECISION.items():
        row = peak.get(dtype)
        if not isinstance(row, dict):
            continue
        v = _opt_float(row.get("tflops"))
        if v is not None and v > 0:
            if key == "fp32" and peak.get("float32_allow_tf32"):
                key = "tf32"
            tflops[key] = v
            sizes[key] = int(row.get("n") or 0)
            ops[key] = str(row.get("op") or "mm")
    if not tflops:
        errors = [str(r.get("error")) for r in peak.values() if isinstance(r, dict) and r.get("error")]
        return Read(None, "gemm.json: the square GEMM was not timed" + (f" ({errors[0]})" if errors else ""))
    device = str(doc.get("device") or "cpu")
    threads = doc.get("threads") if isinstance(doc.get("threads"), int) else None
    where = (f"this host's CPU ({doc.get('device_name') or 'cpu'}, {threads} thread{'s' if threads != 1 else ''})"
             if device == "cpu" else f"this host's {doc.get('device_name') or 'GPU'}")
    sizes_words = ", ".join(f"{k} n={v} by {ops[k]}" for k, v in sizes.items())
    return Read(MeasuredPeak(tflops, sizes, device, str(doc.get("device_name") or ""), threads,
                             f"measured: a square matrix multiply ({sizes_words}) timed on {where} after the job"))


def gemm_factor(run_dir: str | Path) -> GemmFactor | None:
    """The GEMM speed-up of a lower precision measured after the job, or None
    (`read_gemm` says why)."""
    return read_gemm(run_dir).value


# -- DataLoader hand-over -----------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderHandover:
    """What the training loop pays per batch to take a ready batch from a DataLoader
    worker process (loader.json, `pardiag.collectors.loader_bench`)."""

    us: float
    shape: tuple[int, ...]
    source: str  # in words, for evidence
    cpu_us: float | None = None  # the CPU time loading in workers adds to the host per batch (None: not measured)
    cpu_source: str = ""  # in words, for evidence
    loop_cpu_us: float = 0.0  # of cpu_us, the loop's own per batch (taking it from a worker)


def read_loader(run_dir: str | Path) -> Read[LoaderHandover]:
    doc, why = _measured(run_dir, "loader.json", LOADER_FORMAT, LOADER_VERSION)
    if doc is None:
        return Read(None, why)
    us = _opt_float(doc.get("handover_us"))
    shape = doc.get("shape")
    if us is None or us < 0 or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        return Read(None, "loader.json: unreadable (no hand-over time or shape)")
    dims = "x".join(str(d) for d in shape)
    cpu = _opt_float(doc.get("cpu_us"))
    loop, workers, inline = (_opt_float(doc.get(k)) for k in ("loop_cpu_us", "workers_cpu_us", "inline_cpu_us"))
    cpu_source = ""
    if cpu is not None and cpu >= 0 and loop is not None and workers is not None and inline is not None:
        cpu_source = (f"measured: {doc.get('workers') or 'the'} DataLoader workers collating {dims} batches on this "
                      f"host after the job burned {workers / 1e3:.2f} ms of CPU per batch and the loop "
                      f"{loop / 1e3:.2f} ms taking each, against {inline / 1e3:.2f} ms to make one in the loop "
                      f"(mean of {doc.get('samples') or '?'})")
    return Read(LoaderHandover(us, tuple(shape), f"measured: a {dims} {doc.get('dtype') or ''} batch handed over by "
                                                 f"{doc.get('workers') or 'a'} DataLoader workers on this host after "
                                                 f"the job (median of {doc.get('samples') or '?'} batches)",
                               cpu if cpu_source else None, cpu_source, loop if cpu_source and loop is not None else 0.0))


def loader_handover(run_dir: str | Path) -> LoaderHandover | None:
    """The DataLoader hand-over measured after the job, or None (`read_loader` says why)."""
    return read_loader(run_dir).value


# -- page faults -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultCost:
    """What a minor page fault of fresh memory costs on the job's host (faults.json,
    `pardiag.collectors.fault_bench`)."""

    us: float
    source: str  # in words, for evidence


def read_faults(run_dir: str | Path) -> Read[FaultCost]:
    doc, why = _measured(run_dir, "faults.json", FAULTS_FORMAT, FAULTS_VERSION)
    if doc is None:
        return Read(None, why)
    us = _opt_float(doc.get("us_per_fault"))
    if us is None or us <= 0:
        return Read(None, "faults.json: unreadable (no cost per fault)")
    mb = (_opt_float(doc.get("bytes")) or 0.0) / 2**20
    return Read(FaultCost(us, f"measured: {mb:.0f} MB of fresh memory written on this host after the job, less "
                              f"the same memory written again, over its {doc.get('faults') or '?'} faults "
                              f"(median of {doc.get('repeats') or '?'})"))


def fault_cost(run_dir: str | Path) -> FaultCost | None:
    """The cost of a page fault measured after the job, or None (`read_faults` says why)."""
    return read_faults(run_dir).value


# -- all_reduce ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurvePoint:
    bytes: int
    us: float  # median transfer time at this size
    n: int  # calls (fit) or repeats (sweep) behind it


@dataclass(frozen=True)
class Fit:
    alpha_us: float
    beta_us_per_byte: float
    r2: float | None  # of the times, over the points
    rel_error_max: float  # the largest |predicted - measured| / measured over the points


@dataclass(frozen=True)
class CommCurve:
    alpha_us: float
    beta_us_per_byte: float
    points: tuple[CurvePoint, ...]
    kind: str  # "fit" or "sweep"
    source: str  # in words
    r2: float | None
    rel_error_max: float
    backend: str | None = None
    world_size: int | None = None

    def predict_us(self, nbytes: float) -> float:
        return self.alpha_us + self.beta_us_per_byte * nbytes


def fit_line(points: Sequence[tuple[float, float]]) -> Fit | None:
    """time = alpha + bytes * beta with alpha, beta >= 0, by least squares of the relative
    errors (each point weighs 1/time^2, so that small sizes, which set the latency, count
    as much as large ones); None with fewer than two distinct sizes."""
    pts = [(float(x), float(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    w = [1.0 / (y * y) for _, y in pts]
    sw = sum(w)
    swx = sum(wi * x for wi, (x, _) in zip(w, pts))
    swxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    swy = sum(wi * y for wi, (_, y) in zip(w, pts))
    swxy = sum(wi * x * y for wi, (x, y) in zip(w, pts))

    def cost(a: float, b: float) -> float:
        return sum(wi * (a + b * x - y) ** 2 for wi, (x, y) in zip(w, pts))

    candidates = [(0.0, swxy / swxx), (swy / sw, 0.0)]  # on the bounds
    det = sw * swxx - swx * swx
    if det > 0:
        a = (swy * swxx - swx * swxy) / det
        b = (sw * swxy - swx * swy) / det
        if a >= 0 and b >= 0:
            candidates.append((a, b))
    a, b = min(candidates, key=lambda ab: cost(*ab))
    ys = [y for _, y in pts]
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum((a + b * x - y) ** 2 for x, y in pts)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else None
    return Fit(a, b, r2, max(abs(a + b * x - y) / y for x, y in pts))


def run_points(collectives: Mapping[int, Sequence[CollectiveCall]]) -> tuple[tuple[CurvePoint, ...], int]:
    """The matched all_reduce calls' transfer times, one point per size (the median),
    and how many calls they hold."""
    by_size: dict[int, list[float]] = {}
    for size, us in transfers(collectives, "all_reduce"):
        by_size.setdefault(size, []).append(us)
    pts = tuple(CurvePoint(s, float(median(v) or 0.0), len(v)) for s, v in sorted(by_size.items()))
    return pts, sum(p.n for p in pts)


def fit_run(collectives: Mapping[int, Sequence[CollectiveCall]]) -> Read[CommCurve]:
    """The curve fitted to the run's own all_reduce calls, when their sizes span at least
    FIT_MIN_SPAN; else None and why."""
    pts, calls = run_points(collectives)
    if not pts:
        return Read(None, "no matched all_reduce call with a size and a transfer time")
    span = pts[-1].bytes / pts[0].bytes
    if span < FIT_MIN_SPAN:
        return Read(None, f"the run's all_reduce sizes span {span:.1f}x ({len(pts)} size(s)); a fit needs "
                          f"{FIT_MIN_SPAN:g}x")
    fit = fit_line([(p.bytes, p.us) for p in pts])
    if fit is None:
        return Read(None, "fewer than two all_reduce sizes")
    if fit.beta_us_per_byte <= 0 or fit.r2 is None or fit.r2 < FIT_MIN_R2:
        # calls in flight together (gloo runs DDP's buckets concurrently) or one late bucket
        # can make the times fall with size: such a line predicts nothing
        r2 = "none" if fit.r2 is None else f"{fit.r2:.2f}"
        return Read(None, f"the run's {calls} all_reduce calls ({len(pts)} sizes) fit no latency/bandwidth line "
                          f"(r2 {r2}, bandwidth term {fit.beta_us_per_byte:.3g} us/byte; a fit needs r2 >= "
                          f"{FIT_MIN_R2:g})")
    return Read(CommCurve(fit.alpha_us, fit.beta_us_per_byte, pts, "fit",
                          f"fit of this run's {calls} all_reduce calls", fit.r2, fit.rel_error_max,
                          world_size=len(collectives) or None))


def read_comm(run_dir: str | Path, collectives: Mapping[int, Sequence[CollectiveCall]] | None = None) -> Read[CommCurve]:
    """The all_reduce curve: fitted to `collectives` (each rank's calls in issue order, as
    `RankTrace.collectives`) when their sizes span enough and the line explains them, else
    the one in ``factors/allreduce.json`` (which `pardiag run` wrote from the same fit, or
    from a sweep): a run directory alone is enough."""
    why_not_fit = None
    if collectives:
        fitted = fit_run(collectives)
        if fitted.value is not None:
            return fitted
        why_not_fit = fitted.reason
    got = _read_curve(Path(run_dir) / "factors" / "allreduce.json")
    if got.value is None and why_not_fit:
        return Read(None, f"{why_not_fit}; {got.reason}")
    return got


def _read_curve(path: Path) -> Read[CommCurve]:
    doc, why = _load(path, COMM_FORMAT, COMM_VERSION)
    if doc is None:
        return Read(None, why)
    if doc.get("status") != "ok":
        return Read(None, f"allreduce.json: {doc.get('reason') or 'no curve'}")
    try:
        pts = tuple(CurvePoint(int(p["bytes"]), float(p["us"]), int(p.get("n") or 0)) for p in doc["points"])
        alpha, beta = float(doc["alpha_us"]), float(doc["beta_us_per_byte"])
        if not (math.isfinite(alpha) and math.isfinite(beta)) or alpha < 0 or beta < 0:
            return Read(None, "allreduce.json: alpha and beta must be finite and not negative")
        kind = str(doc["source"])
        if kind not in ("fit", "sweep"):
            return Read(None, f"allreduce.json: unknown source {kind!r}")
        source = (f"sweep after the job: all_reduce timed at {len(pts)} sizes on {doc.get('world_size')} ranks "
                  f"({doc.get('backend')})" if kind == "sweep" else
                  f"fit of this run's {sum(p.n for p in pts)} all_reduce calls")
        return Read(CommCurve(alpha, beta, pts, kind, source, _opt_float(doc.get("r2")),
                              float(doc.get("rel_error_max") or 0.0), doc.get("backend"),
                              int(doc["world_size"]) if doc.get("world_size") is not None else None))
    except (KeyError, TypeError, ValueError) as e:
        return Read(None, f"allreduce.json: unreadable ({type(e).__name__}: {e})")


def comm_curve(run_dir: str | Path, collectives: Mapping[int, Sequence[CollectiveCall]] | None = None) -> CommCurve | None:
    """all_reduce time by size on this run's hardware, or None (`read_comm` says why)."""
    return read_comm(run_dir, collectives).value


def curve_doc(curve: CommCurve, **extra: Any) -> dict[str, Any]:
    """allreduce.json's body for a curve (status ok)."""
    return {"format": COMM_FORMAT, "format_version": COMM_VERSION, "status": "ok", "reason": None,
            "source": curve.kind, "backend": curve.backend, "world_size": curve.world_size,
            "points": [{"bytes": p.bytes, "us": p.us, "n": p.n} for p in curve.points],
            "alpha_us": curve.alpha_us, "beta_us_per_byte": curve.beta_us_per_byte, "r2": curve.r2,
            "rel_error_max": curve.rel_error_max, **extra}


# -- files --------------------------------------------------------------------------------------


def _opt_float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _measured(run_dir: str | Path, name: str, fmt: str, version: int) -> tuple[dict[str, Any] | None, str | None]:
    """``factors/NAME`` of the run when it holds a measurement (status "ok"), else None and why."""
    doc, why = _load(Path(run_dir) / "factors" / name, fmt, version)
    if doc is not None and doc.get("status") != "ok":
        return None, f"{name}: {doc.get('reason') or 'no measurement'}"
    return doc, why


def _load(path: Path, fmt: str, version: int) -> tuple[dict[str, Any] | None, str | None]:
    """(the document, None) or (None, one line: missing, corrupt, another format, newer)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path.name}: not recorded"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{path.name}: unreadable ({type(e).__name__})"
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        return None, f"{path.name}: not a {fmt} file"
    v = doc.get("format_version")
    if not isinstance(v, int) or isinstance(v, bool):
        return None, f"{path.name}: no format version"
    if v > version:
        return None, f"{path.name}: format version {v} is newer than this pardiag reads ({version}); upgrade pardiag"
    return doc, None
