"""Property-based fuzzing of everything that reads files others wrote: the trace loader
and per-rank analysis, the run-directory readers (manifest, meta, steps). Whatever
the bytes, the result is a value or the module's own one-line error, never another
exception."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pardiag import rundir
from pardiag.analyzers.rank_trace import analyze_rank_trace
from pardiag.analyzers.trace import TraceError, load_trace

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
events = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "i", "M", "s", "f", "B"]),
        "cat": st.sampled_from(["cpu_op", "user_annotation", "kernel", "gpu_memcpy", "cuda_runtime", "Trace", "python_function"]),
        "name": st.sampled_from(["ProfilerStep#3", "aten::mm", "gloo:all_reduce", "ncclDevKernel_AllReduce_Sum_f32",
                                 "enumerate(DataLoader)#x.__next__", "autograd::engine::evaluate_function: X", "k"]),
        "pid": scalars, "tid": scalars, "ts": scalars, "dur": scalars,
        "args": st.dictionaries(st.sampled_from(["stream", "correlation", "External id", "Input Dims", "Input type",
                                                 "Collective name", "In msg nelems", "dtype", "Group size"]), scalars,
                                max_size=5),
    },
)
docs = st.fixed_dictionaries(
    {"traceEvents": st.lists(events, max_size=30)},
    optional={"distributedInfo": st.dictionaries(st.sampled_from(["rank", "world_size", "backend", "pg_config"]), scalars),
              "baseTimeNanoseconds": scalars},
)


@SETTINGS
@given(doc=docs, gz=st.booleans())
def test_any_event_soup_is_analysed_or_refused(tmp_path_factory, doc, gz: bool) -> None:
    p = tmp_path_factory.mktemp("t") / ("t.json.gz" if gz else "t.json")
    data = json.dumps(doc).encode()
    p.write_bytes(gzip.compress(data) if gz else data)
    try:
        trace = load_trace(p)
    except TraceError as e:
        assert "\n" not in str(e)
        return
    r = analyze_rank_trace(trace)
    assert all(math.isfinite(v) and v >= -1e-6 for v in r.breakdown_us.values())
    assert sum(r.breakdown_us.values()) == __import__("pytest").approx(r.window_us, abs=1e-3)


@SETTINGS
@given(blob=st.binary(max_size=400), gz=st.booleans(), cut=st.integers(min_value=0, max_value=400))
def test_any_bytes_are_refused_with_one_line(tmp_path_factory, blob: bytes, gz: bool, cut: int) -> None:
    p = tmp_path_factory.mktemp("b") / "x.json"
    p.write_bytes((gzip.compress(blob) if gz else blob)[:cut or None])
    try:
        load_trace(p)
    except TraceError as e:
        assert "\n" not in str(e)


@SETTINGS
@given(manifest=st.one_of(scalars, st.dictionaries(st.sampled_from(["format", "format_version", "x"]), scalars)),
       steps=st.text(max_size=300))
def test_run_directory_readers(tmp_path_factory, manifest, steps: str) -> None:
    root = tmp_path_factory.mktemp("run")
    run = rundir.RunDir(root)
    (root / "ranks" / "0").mkdir(parents=True)
    run.manifest.write_text(json.dumps(manifest))
    run.meta(0).write_text(json.dumps(manifest))
    run.steps(0).write_text(steps)
    for read in (lambda: rundir.read_manifest(run), lambda: rundir.read_meta(run, 0)):
        try:
            assert isinstance(read(), dict)
        except rundir.RunDirError as e:
            assert "\n" not in str(e)
    try:
        assert all(isinstance(r.step, int) for r in rundir.read_steps(run, 0))
    except rundir.RunDirError as e:  # a line of a newer version
        assert "\n" not in str(e)
