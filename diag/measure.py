"""Speed-up factors measured after the job, on its own host: what `pardiag run` does
once the training command has exited 0 (`--no-measure` skips it).

* GEMM: the top matrix-multiply/convolution shapes of the lowest rank's trace, timed in
  fp32 and in bf16/fp16 by `pardiag.collectors.gemm_bench`, run with the job's Python
  on the job's device type -> ``factors/gemm.json``.
* all_reduce: the latency/bandwidth curve fitted to the run's own calls when their sizes
  span enough; otherwise, for a single-node torchrun job of at most 8 ranks, a short
  sweep by `pardiag.collectors.comm_sweep` under torchrun with the job's world size and
  backend -> ``factors/allreduce.json``.

* DataLoader hand-over: when the lowest rank's loop waited for its input (5% or more of
  its step, steps.jsonl) and its meta.json names the batch's first tensor, the time a
  worker process takes to hand a ready batch of that shape to the loop, timed by
  `pardiag.collectors.loader_bench` with the job's Python -> ``factors/loader.json``:
  what the loop still pays per batch once its input is loaded in workers.

* Page faults: when a rank of this node trained on the CPU and faulted inside backward
  ``FAULTS_MIN`` times or more per step (steps.jsonl ``bwd_faults``: the larger of its
  median over the profiled window and over the counted steps),
  what a fault of fresh memory costs on this host, timed by
  `pardiag.collectors.fault_bench` with the job's Python -> ``factors/faults.json``:
  the gradient-accumulation estimate counts the faults that micro-batches accumulating
  into gradients already in memory no longer take.

All run in processes of their own after the job: nothing of the job changes. Each is
bounded in time and killed past it; a failure is one line in the file and in the
manifest (``collectors.factors``), and never changes `pardiag run`'s exit code.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from pardiag import rundir
from pardiag.analyzers import factors
from pardiag.rank_meta import RankMeta

TOP_SHAPES = 8
FOLLOWER_ROWS = 8  # gemm.json lists the followers holding most time (all count in followers_us)
GEMM_TIMEOUT_S = 20.0  # the whole measurement, the interpreter's start and torch's import included
GEMM_BUDGET_S = 10.0  # of it, the timing itself
PEAK_BUDGET_S = 2.0  # of that, the square GEMM that measures this host's peak (gemm_bench.square_gemm)
LOADER_TIMEOUT_S = 20.0  # the interpreter's start and torch's import included
LOADER_BUDGET_S = 4.0
LOADER_WORKERS = 2
LOADER_MIN_SHARE = 0.05  # of the lowest rank's median step waiting for input: the dataloader rule's DATALOADER_MIN
LOADER_MAX_BYTES = 256 << 20  # a larger batch is not timed: 2 workers prefetching 2 each hold 5 copies
_DTYPE_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}
FAULTS_TIMEOUT_S = 10.0  # the interpreter's start included (the collector imports no torch)
FAULTS_BLOCK_MB = 16  # the block fault_bench writes afresh: a large layer's gradient (its docstring)
FAULTS_MIN = 1000  # backward page faults per counted step (median) from which their cost is timed
SWEEP_TIMEOUT_S = 30.0
SWEEP_BUDGET_S = 12.0
SWEEP_MAX_RANKS = 8
SWEEP_FACTORS = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)  # times the median bucket
SWEEP_MAX_BYTES = 256 << 20
# The job's Python, started without the user's sitecustomize/usercustomize (as
# torch_check's probe): the measurement is not the job.
PRELUDE = ("import sys; sys.modules['sitecustomize'] = sys.modules['usercustomize'] = None; "
           "import site; site.main(); import runpy; ")


def _collector_file(name: str) -> Path:
    from pardiag import collectors

    return Path(collectors.__file__).resolve().parent / name


def _env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith("PARDIAG_")}


def _run_bounded(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """(exit code, the tail of its output) of a process group killed after `timeout_s`
    (exit code None then)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        code: int | None = None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:  # past its time, or pardiag interrupted: the whole group goes
            if code is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    return code, text[-2000:]


def _run_for_json(argv: list[str], env: dict[str, str], timeout_s: float,
                  out_path: Path) -> tuple[dict[str, Any] | None, int | None, str]:
    """`_run_bounded`, then the JSON the process wrote to `out_path`: (the result or None,
    exit code, output tail or why there is no result)."""
    code, text = _run_bounded(argv, env, timeout_s)
    result = None
    if code == 0:
        try:
            result = json.loads(out_path.read_text())
        except (OSError, ValueError) as e:
            text = f"no result ({type(e).__name__})"
    return result, code, text


def _run_collector(python: str, name: str, spec: Mapping[str, Any], environ: Mapping[str, str],
                   timeout_s: float) -> tuple[dict[str, Any] | None, int | None, str]:
    """`_run_for_json` of the collector file `name` (``python NAME SPEC.json OUT.json``) with
    the job's Python, its spec in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="pardiag-measure-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        argv = [python, "-S", "-c", PRELUDE + "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                str(_collector_file(name)), str(spec_path), str(out_path)]
        return _run_for_json(argv, _env(environ), timeout_s, out_path)


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else "no output"


def _metas(run: rundir.RunDir) -> dict[int, RankMeta]:
    out = {}
    for r in run.ranks():
        try:
            out[r] = rundir.read_meta(run, r)
        except rundir.RunDirError:
            continue
    return out


def job_interpreter(metas: Mapping[int, RankMeta], cmd: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The Python the job's ranks ran (their meta says), else the one the command names."""
    for r in sorted(metas):
        exe = (metas[r].threads or {}).get("python_executable")
        if isinstance(exe, str) and exe and os.access(exe, os.X_OK):
            return exe
    from pardiag.torch_check import job_python

    return job_python(cmd, environ)


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(path, doc)


def _gemm_doc(status: str, reason: str | None, **kw: Any) -> dict[str, Any]:
    return {"format": factors.GEMM_FORMAT, "format_version": factors.GEMM_VERSION, "status": status,
            "reason": reason, **kw}


def _comm_doc(status: str, reason: str | None, **kw: Any) -> dict[str, Any]:
    return {"format": factors.COMM_FORMAT, "format_version": factors.COMM_VERSION, "status": status,
            "reason": reason, **kw}


# -- GEMM ---------------------------------------------------------------------------------------


def measure_gemm(run: rundir.RunDir, rank: int, trace: Path, meta: RankMeta | None, python: str,
                 environ: Mapping[str, str]) -> dict[str, Any]:
    """Time the top shapes of `trace`; writes factors/gemm.json and returns its document."""
    from pardiag.analyzers.gemm_shapes import ShapeError, gemm_shapes

    started = time.perf_counter()
    device = (meta.device.type if meta and meta.device else None) or "cpu"
    try:
        found = gemm_shapes(trace)
    except ShapeError as e:
        doc = _gemm_doc("failed", str(e), rank=rank, device=device)
        _write(run.gemm_factor, doc)
        return doc
    if not found.shapes:
        why = ("the trace records no input shapes (recorded with --no-shapes?)" if found.total_us and not found.with_shapes
               else "no matrix multiply or convolution in the profiled window")
        doc = _gemm_doc("skipped", why, rank=rank, device=device, gemm_us=found.total_us)
        _write(run.gemm_factor, doc)
        return doc
    top = found.top(TOP_SHAPES)
    amp = (meta.amp if meta else None) or {}
    threads = (meta.threads if meta else None) or {}
    spec = {"device": device, "threads": threads.get("torch_num_threads") if device == "cpu" else None,
            "cuda_matmul_allow_tf32": bool(amp.get("cuda_matmul_allow_tf32")),
            "cudnn_allow_tf32": amp.get("cudnn_allow_tf32", True), "budget_s": GEMM_BUDGET_S,
            "peak_budget_s": PEAK_BUDGET_S,
            "shapes": [s.to_dict() for s in top]}
    result, code, text = _run_collector(python, "gemm_bench.py", spec, environ, GEMM_TIMEOUT_S)
    seconds = time.perf_counter() - started
    base = {"rank": rank, "device": device, "gemm_us": found.total_us, "window_us": found.window_us,
            "trace_timing": found.timing,
            "seconds": seconds}
    if result is None:
        why = (f"killed after {GEMM_TIMEOUT_S:g} s" if code is None else
               f"the measurement failed (exit {code}): {_last_line(text)}")
        doc = _gemm_doc("failed", why, **base)
        _write(run.gemm_factor, doc)
        return doc
    rows = []
    for shape, row in zip(top, result.get("rows") or []):
        rows.append({"op": shape.op, "dims": [list(d) if d is not None else None for d in shape.dims],
                     "dtypes": list(shape.dtypes), "backward": shape.backward, "calls": shape.calls,
                     "trace_us": shape.trace_us, "fp32_us": row.get("fp32_us"), "half_us": row.get("half_us"),
                     "speedup": row.get("speedup"), "repeats": row.get("repeats"), "error": row.get("error")})
    timed = [r for r in rows if r["speedup"]]
    speedup = factors.weighted_speedup([(r["trace_us"], r["speedup"]) for r in timed])
    covered = sum(r["trace_us"] for r in timed) / found.total_us if found.total_us else 0.0
    status, reason = ("ok", None) if speedup else ("failed", "no shape could be timed: " + (
        next((r["error"] for r in rows if r.get("error")), "no result")))
    doc = _gemm_doc(status, reason, **base, device_name=result.get("device_name"), torch=result.get("torch"),
                    threads=result.get("threads"), from_dtype="float32", to_dtype=result.get("half_dtype"),
                    speedup=speedup, covered_share=covered, timing_s=result.get("seconds"), shapes=rows,
                    peak=result.get("peak"), followers=_followers_doc(found))
    _write(run.gemm_factor, doc)
    return doc


def _followers_doc(found: Any) -> dict[str, Any]:
    """The elementwise operators that would run in the lower precision after the matrix
    multiplies that feed them (gemm_shapes' followers): their time in the window, and the
    time of every call of their operators' names (``names_us``: what the replay can scale)."""
    return {"names_us": float(found.follower_names_us or 0.0),
            "followers_us": float(sum(s.trace_us for s in found.followers)),
            "shapes": [s.to_dict() for s in found.followers[:FOLLOWER_ROWS]]}


# -- DataLoader hand-over -----------------------------------------------------------------------


def _loader_doc(status: str, reason: str | None, **kw: Any) -> dict[str, Any]:
    return {"format": factors.LOADER_FORMAT, "format_version": factors.LOADER_VERSION, "status": status,
            "reason": reason, **kw}


def loader_wait_share(run: rundir.RunDir, rank: int) -> float | None:
    """The rank's median input wait over its median step, over its counted steps; None
    without step records that time the input."""
    from pardiag.analyzers.steps import median
    from pardiag.step_records import counted

    try:
        recs = [r for r in rundir.read_steps(run, rank) if counted(r)]
    except rundir.RunDirError:
        return None
    data = [v for r in recs if (v := r.get("dataloader")) is not None]
    steps = [r.dur_us for r in recs if r.dur_us]
    m_data, m_step = median(data), median(steps)  # type: ignore[arg-type]
    return m_data / m_step if data and m_step else None


def measure_loader(run: rundir.RunDir, rank: int, meta: RankMeta | None, python: str,
                   environ: Mapping[str, str]) -> dict[str, Any]:
    """Time a worker's hand-over of a batch of the rank's input shape; writes
    factors/loader.json and returns its document."""
    started = time.perf_counter()
    first = ((meta.inputs if meta else None) or {}).get("first") or {}
    shape, dtype = first.get("shape"), first.get("dtype")
    if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape)):
        doc = _loader_doc("skipped", "meta.json names no input tensor shape", rank=rank)
        _write(run.loader_factor, doc)
        return doc
    size = math.prod(shape) * _DTYPE_BYTES.get(str(dtype), 4)
    if size > LOADER_MAX_BYTES:
        doc = _loader_doc("skipped", f"the batch's first tensor is {size / 2**20:.0f} MiB, over the "
                                     f"{LOADER_MAX_BYTES >> 20} MiB timed", rank=rank, shape=shape, dtype=dtype)
        _write(run.loader_factor, doc)
        return doc
    spec = {"shape": shape, "dtype": dtype, "workers": LOADER_WORKERS, "budget_s": LOADER_BUDGET_S}
    result, code, text = _run_collector(python, "loader_bench.py", spec, environ, LOADER_TIMEOUT_S)
    base = {"rank": rank, "shape": shape, "dtype": dtype, "seconds": time.perf_counter() - started}
    us = result.get("handover_us") if result else None
    if not isinstance(us, (int, float)) or us < 0:
        why = (f"killed after {LOADER_TIMEOUT_S:g} s" if code is None else
               f"the measurement failed (exit {code}): {_last_line(text)}")
        doc = _loader_doc("failed", why, **base)
    else:
        doc = _loader_doc("ok", None, **base, handover_us=float(us), p90_us=result.get("p90_us"),
                          inline_us=result.get("inline_us"), samples=result.get("samples"),
                          workers=result.get("workers"), torch=result.get("torch"),
                          cpu_us=result.get("cpu_us"), loop_cpu_us=result.get("loop_cpu_us"),
                          workers_cpu_us=result.get("workers_cpu_us"), inline_cpu_us=result.get("inline_cpu_us"))
    _write(run.loader_factor, doc)
    return doc


# -- page faults ---------------------------------------------------------------------------------


def backward_faults(run: rundir.RunDir, rank: int) -> float | None:
    """The rank's page faults inside backward per step, as the accumulation estimate
    counts them (`summary.backward_faults`: the larger of the profiled window's median
    and the counted steps'), 0 where they count none; None without step records that
    count them."""
    from pardiag.analyzers.summary import backward_faults as counted_faults

    try:
        recs = rundir.read_steps(run, rank)
    except rundir.RunDirError:
        return None
    if not any(r.get("backward_page_faults") is not None for r in recs):
        return None
    return counted_faults(recs) or 0.0


def measure_faults(run: rundir.RunDir, python: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """Time a page fault of fresh memory on this host; writes factors/faults.json and
    returns its document."""
    started = time.perf_counter()
    result, code, text = _run_collector(python, "fault_bench.py", {"mb": FAULTS_BLOCK_MB, "repeats": 15}, environ,
                                        FAULTS_TIMEOUT_S)
    us = result.get("us_per_fault") if result else None
    base = {"seconds": time.perf_counter() - started}
    if not isinstance(us, (int, float)) or us <= 0:
        why = (f"killed after {FAULTS_TIMEOUT_S:g} s" if code is None else
               f"the measurement failed (exit {code}): {_last_line(text)}" if result is None else
               f"writing fresh memory was no slower than writing it again ({us})")
        doc = {"format": factors.FAULTS_FORMAT, "format_version": factors.FAULTS_VERSION, "status": "failed",
               "reason": why, **base}
    else:
        doc = {"format": factors.FAULTS_FORMAT, "format_version": factors.FAULTS_VERSION, "status": "ok",
               "reason": None, **base, **{k: result.get(k) for k in (
                   "us_per_fault", "faults", "pages", "page_bytes", "bytes", "repeats", "fresh_us", "again_us",
                   "each_us_per_fault")}}
    _write(run.faults_factor, doc)
    return doc


# -- all_reduce ---------------------------------------------------------------------------------


def _sweep_sizes(metas: Mapping[int, RankMeta], points: Sequence[factors.CurvePoint]) -> list[int]:
    buckets = [int(b) for m in metas.values() for d in (m.ddp or ()) for b in (d.bucket_sizes_bytes or ())
               if isinstance(b, (int, float)) and b > 0]
    from pardiag.analyzers.steps import median

    mid = median(buckets) or median([p.bytes for p in points]) or float(1 << 20)
    return sorted({max(4, min(SWEEP_MAX_BYTES, int(mid * f)) // 4 * 4) for f in SWEEP_FACTORS})


def measure_allreduce(run: rundir.RunDir, cmd: Sequence[str], host: str, metas: Mapping[int, RankMeta],
                      python: str | None, environ: Mapping[str, str], launchers: int = 1) -> dict[str, Any]:
    """factors/allreduce.json: the run's own fit, else a sweep where the run can afford
    one, else the reason there is none. Returns the document."""
    from pardiag.analyzers import reduce
    from pardiag.recording import launcher_kind

    world = max((m.world_size for m in metas.values() if m.world_size), default=None)
    backend = next((m.backend for m in metas.values() if m.backend), None)
    if not world or world < 2:
        doc = _comm_doc("skipped", "one process: no all_reduce between ranks", world_size=world)
        _write(run.allreduce_factor, doc)
        return doc
    calls = {}
    for r in sorted(metas):
        trace, _ = run.find_trace(r)
        got = reduce.load(run, r, trace) if trace is not None else None
        if got is not None:
            calls[r] = got[0].collectives
    fitted = factors.fit_run(calls) if calls else factors.Read(None, "no rank summary to read the calls from")
    if fitted.value is not None:
        curve = fitted.value
        doc = factors.curve_doc(curve, backend=backend, world_size=world)
        _write(run.allreduce_factor, doc)
        return doc
    hosts = {m.host for m in metas.values()}
    why_not = (None if launcher_kind(cmd) == "torchrun" else "the job was not launched with torchrun")
    one_node = hosts == {host} and len(metas) == world and launchers <= 1
    why_not = why_not or (None if one_node else "the job ran on more than one node (or torchrun agent)")
    why_not = why_not or (None if world <= SWEEP_MAX_RANKS else f"{world} ranks on this node (a sweep runs up to "
                                                                  f"{SWEEP_MAX_RANKS})")
    why_not = why_not or (None if backend in ("gloo", "nccl") else f"backend {backend} is not swept (gloo, nccl are)")
    why_not = why_not or (None if python else "the job's Python could not be told")
    if why_not:
        doc = _comm_doc("skipped", f"{fitted.reason}; no sweep: {why_not}", backend=backend, world_size=world)
        _write(run.allreduce_factor, doc)
        return doc
    started = time.perf_counter()
    sizes = _sweep_sizes(metas, factors.run_points(calls)[0])
    with tempfile.TemporaryDirectory(prefix="pardiag-sweep-") as tmp:
        out = Path(tmp) / "sweep.json"
        argv = [str(python), "-S", "-c", PRELUDE + "sys.argv[0] = 'torchrun'; "
                "runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)",
                "--standalone", "--nproc-per-node", str(world), str(_collector_file("comm_sweep.py")),
                "--backend", str(backend), "--out", str(out), "--sizes", ",".join(map(str, sizes)),
                "--budget-s", str(SWEEP_BUDGET_S)]
        result, code, text = _run_for_json(argv, _env(environ), SWEEP_TIMEOUT_S, out)
    seconds = time.perf_counter() - started
    base = {"source": "sweep", "backend": backend, "world_size": world, "seconds": seconds}
    if result is None:
        why = (f"the sweep was killed after {SWEEP_TIMEOUT_S:g} s" if code is None else
               f"the sweep failed (exit {code}): {_last_line(text)}")
        doc = _comm_doc("failed", why, **base)
        _write(run.allreduce_factor, doc)
        return doc
    pts = tuple(factors.CurvePoint(int(p["bytes"]), float(p["us"]), int(p["n"])) for p in result.get("points") or [])
    fit = factors.fit_line([(p.bytes, p.us) for p in pts])
    if fit is None:
        doc = _comm_doc("failed", f"the sweep timed {len(pts)} size(s); a curve needs two", **base,
                        points=[{"bytes": p.bytes, "us": p.us, "n": p.n} for p in pts])
        _write(run.allreduce_factor, doc)
        return doc
    curve = factors.CommCurve(fit.alpha_us, fit.beta_us_per_byte, pts, "sweep", "sweep after the job", fit.r2,
                              fit.rel_error_max, backend, world)
    doc = factors.curve_doc(curve, seconds=seconds, timing_s=result.get("seconds"), fit_reason=fitted.reason)
    _write(run.allreduce_factor, doc)
    return doc


# -- after the job ------------------------------------------------------------------------------


def _status(doc: dict[str, Any] | None, reason: str | None = None) -> dict[str, Any]:
    if doc is None:
        return {"status": "skipped", "reason": reason}
    return {"status": doc.get("status"), "reason": doc.get("reason"), "seconds": doc.get("seconds")}


def measure_after_job(run: rundir.RunDir, cmd: Sequence[str], host: str, mine: Sequence[int], exit_code: int,
                      environ: Mapping[str, str], quiet: bool = False) -> dict[str, Any]:
    """Measure what this node can, write factors/, and return the status for the manifest
    ({status, reason, gemm: {...}, allreduce: {...}}). Never raises."""
    def say(text: str) -> None:
        if not quiet:
            print(f"pardiag: {text}", file=sys.stderr, flush=True)

    if exit_code != 0:
        return {"status": "skipped", "reason": f"the job exited with code {exit_code}"}
    with _interruptible():
        return _measure(run, cmd, host, mine, environ, say)


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM and SIGHUP while measuring stop the measurement as Ctrl-C does, so that
    `pardiag run` still writes the manifest (a scheduler's end of job, a closed terminal)."""
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGHUP):
            previous[s] = signal.signal(s, stop)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _measure(run: rundir.RunDir, cmd: Sequence[str], host: str, mine: Sequence[int], environ: Mapping[str, str],
             say: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        launchers = rundir.read_launcher_records(run)
        here = sorted(int(l["pid"]) for l in launchers if l.get("host") == host and isinstance(l.get("pid"), int))
        if here and os.getpid() != here[0]:  # several `pardiag run` of one job on this host: one measures
            return {"status": "skipped", "reason": f"pardiag run {here[0]} on this host measures"}
        metas = _metas(run)
        traced = [r for r in run.ranks() if run.find_trace(r)[0] is not None]
        python = job_interpreter(metas, cmd, environ)
        if not traced:
            out["gemm"] = _status(None, "no rank left a trace")
        elif traced[0] not in mine:
            out["gemm"] = _status(None, f"rank {traced[0]}'s node measures it")
        elif python is None:
            out["gemm"] = _status(None, "the job's Python could not be told")
        else:
            rank = traced[0]
            say(f"timing the job's top matrix-multiply shapes in fp32 and a lower precision "
                f"(at most {GEMM_TIMEOUT_S:g} s; --no-measure skips it)")
            doc = measure_gemm(run, rank, run.find_trace(rank)[0], metas.get(rank), python, environ)  # type: ignore[arg-type]
            out["gemm"] = _status(doc)
            if doc.get("status") == "ok":
                x = doc["speedup"]
                say(f"{doc['to_dtype']} runs the top {sum(1 for r in doc['shapes'] if r.get('speedup'))} GEMM shapes "
                    f"({doc['covered_share']:.0%} of the GEMM time) "
                    + (f"{x:.2f}x faster" if x >= 1 else f"at {x:.2f}x the speed of float32: slower")
                    + f" (measured in {doc['seconds']:.1f} s)")
            else:
                say(f"GEMM speed-up not measured: {doc.get('reason')}")
        lowest = min(metas) if metas else None
        share = loader_wait_share(run, lowest) if lowest is not None and lowest in mine else None
        if lowest is None or lowest not in mine:
            out["loader"] = _status(None, "no rank of this node" if lowest is None else f"rank {lowest}'s node measures it")
        elif share is None or share < LOADER_MIN_SHARE:
            out["loader"] = _status(None, "the loop did not wait for its input" if share is not None
                                    else "no step records time the input")
        elif python is None:
            out["loader"] = _status(None, "the job's Python could not be told")
        else:
            say(f"timing a DataLoader worker's hand-over of a batch (at most {LOADER_TIMEOUT_S:g} s)")
            doc = measure_loader(run, lowest, metas.get(lowest), python, environ)
            out["loader"] = _status(doc)
            if doc.get("status") == "ok":
                cpu = doc.get("cpu_us")
                say(f"a worker hands over a batch of {tuple(doc['shape'])} in {doc['handover_us'] / 1e3:.2f} ms"
                    + (f"; workers add {cpu / 1e3:.2f} ms of CPU per batch" if isinstance(cpu, (int, float)) else ""))
            else:
                say(f"DataLoader hand-over not measured: {doc.get('reason')}")
        on_cpu = [r for r in mine if (m := metas.get(r)) is not None and m.device is not None
                  and m.device.type == "cpu"]
        faulted = (max(((f, r) for r in on_cpu if (f := backward_faults(run, r)) is not None), default=None)
                   if lowest is not None and lowest in mine else None)
        if lowest is None or lowest not in mine:  # one node measures, as for the other factors
            out["faults"] = _status(None, "no rank of this node" if lowest is None
                                    else f"rank {lowest}'s node measures it")
        elif not on_cpu:
            out["faults"] = _status(None, "no rank of this node trained on a CPU")
        elif faulted is None or faulted[0] < FAULTS_MIN:
            out["faults"] = _status(None, f"backward page-faulted fewer than {FAULTS_MIN} times per step"
                                    if faulted is not None else "no step records count the page faults")
        elif python is None:
            out["faults"] = _status(None, "the job's Python could not be told")
        else:
            say(f"timing a page fault of fresh memory (rank {faulted[1]}'s backward faulted {faulted[0]:,.0f} "
                f"times per step; at most {FAULTS_TIMEOUT_S:g} s)")
            doc = measure_faults(run, python, environ)
            out["faults"] = _status(doc)
            if doc.get("status") == "ok":
                say(f"a page fault of fresh memory costs {doc['us_per_fault']:.2f} us here")
            else:
                say(f"page-fault cost not measured: {doc.get('reason')}")
        if lowest is None or lowest not in mine:
            out["allreduce"] = _status(None, "no rank of this node" if lowest is None else f"rank {lowest}'s node measures it")
        else:
            world = max((m.world_size or 0 for m in metas.values()), default=0)
            if world > 1:
                say("all_reduce latency and bandwidth: fitting the run's calls, or a short sweep "
                    f"(at most {SWEEP_TIMEOUT_S:g} s)")
            doc = measure_allreduce(run, cmd, host, metas, python, environ, launchers=len(launchers))
            out["allreduce"] = _status(doc)
            if doc.get("status") == "ok":
                say(f"all_reduce ({doc['source']}): {doc['alpha_us']:.0f} us + {doc['beta_us_per_byte'] * 1e3:.3f} us/KB")
            elif world > 1:
                say(f"all_reduce curve: {doc.get('reason')}")
    except KeyboardInterrupt:  # Ctrl-C while measuring: the run's files and manifest are still written
        out["error"] = "interrupted"
        say("measuring the factors was interrupted")
    except Exception as e:  # a measurement never fails the run
        out["error"] = f"{type(e).__name__}: {e}"[:300]
        say(f"warning: measuring the factors failed: {out['error']}")
    parts = {k: v for k, v in out.items() if isinstance(v, dict)}
    states = {v.get("status") for v in parts.values()}
    others = "; ".join(f"{k}: {v.get('reason')}" for k, v in parts.items() if v.get("status") != "ok")
    if "error" in out:
        out.update(status="failed", reason=out.pop("error"))
    elif "ok" in states:  # what does not apply (one process, another node's rank) is no failure
        out.update(status="partial" if "failed" in states else "ok", reason=others or None)
    else:
        out.update(status="failed" if "failed" in states else "skipped", reason=others or None)
    return out
