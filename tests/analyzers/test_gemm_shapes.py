"""The GEMM shapes of a real torch.profiler trace: a small model recorded here, in this
process, with the profiler's step schedule and record_shapes (as pardiag records)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pardiag.analyzers.gemm_shapes import ShapeError, gemm_shapes

torch = pytest.importorskip("torch")

BATCH, DIM, HIDDEN, CLASSES = 16, 64, 48, 10
ACTIVE = 2


def record(path: Path, shapes: bool = True) -> None:
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x, img = torch.randn(BATCH, DIM), torch.randn(2, 3, 8, 8)

    def save(p: "profile") -> None:
        p.export_chrome_trace(str(path))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes, on_trace_ready=save,
                 schedule=schedule(wait=1, warmup=1, active=ACTIVE)) as p:
        for _ in range(1 + 1 + ACTIVE):
            loss = model(x).sum() + conv(img).sum()
            loss.backward()
            torch.mm(x, x.t())  # outside autograd's engine: a forward call
            p.step()


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "trace.json"
    record(path)
    return path


def test_each_shape_is_the_outermost_operator_with_its_calls_in_the_window(trace: Path) -> None:
    g = gemm_shapes(trace)
    by = {(s.op, s.dims, s.backward): s for s in g.shapes}
    first = ("aten::linear", ((BATCH, DIM), (HIDDEN, DIM), (HIDDEN,)), False)
    second = ("aten::linear", ((BATCH, HIDDEN), (CLASSES, HIDDEN), (CLASSES,)), False)
    assert by[first].calls == ACTIVE and by[second].calls == ACTIVE
    assert by[first].dtypes == ("float", "float", "float") and by[first].strides[1] == (DIM, 1)
    # linear calls addmm: the addmm inside is not a shape of its own
    assert not any(s.op == "aten::addmm" for s in g.shapes)
    # the backward of the second linear: grad_input = grad_out @ W, grad_W = grad_out^T @ x
    assert by[("aten::mm", ((BATCH, CLASSES), (CLASSES, HIDDEN)), True)].calls == ACTIVE
    assert by[("aten::mm", ((CLASSES, BATCH), (BATCH, HIDDEN)), True)].calls == ACTIVE
    mm = by[("aten::mm", ((BATCH, DIM), (DIM, BATCH)), False)]
    assert mm.calls == ACTIVE and mm.strides[1] == (1, DIM)  # x.t(): a transposed view
    conv = next(s for s in g.shapes if s.op == "aten::conv2d")
    assert conv.dims[:2] == ((2, 3, 8, 8), (4, 3, 3, 3)) and conv.concrete[3:5] == ("[2, 2]", "[1, 1]")
    assert conv.calls == ACTIVE and not conv.backward
    assert any(s.op == "aten::convolution_backward" and s.backward for s in g.shapes)


def test_the_shapes_hold_all_the_gemm_time_and_come_most_time_first(trace: Path) -> None:
    g = gemm_shapes(trace)
    assert g.with_shapes and g.window_us > 0
    assert sum(s.trace_us for s in g.shapes) == pytest.approx(g.total_us)
    assert [s.trace_us for s in g.shapes] == sorted((s.trace_us for s in g.shapes), reverse=True)
    assert g.top(3) == g.shapes[:3]
    doc = json.loads(trace.read_text())
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == ACTIVE
    assert g.window_us == pytest.approx(max(e["ts"] + e["dur"] for e in steps) - min(e["ts"] for e in steps))


def test_a_gzipped_trace_reads_the_same(trace: Path, tmp_path: Path) -> None:
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    assert gemm_shapes(gz) == gemm_shapes(trace)


def test_a_trace_without_shapes_has_gemm_time_but_no_shape(tmp_path: Path) -> None:
    path = tmp_path / "noshapes.json"
    record(path, shapes=False)
    g = gemm_shapes(path)
    assert g.total_us > 0 and not g.with_shapes and g.shapes == ()


@pytest.mark.parametrize("content", [b"", b"{\"traceEvents\": [", b"\x1f\x8b\x08garbage"])
def test_an_unreadable_trace_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(ShapeError) as e:
        gemm_shapes(path)
    assert "\n" not in str(e.value) and "t.json" in str(e.value)
    with pytest.raises(ShapeError, match="no such file"):
        gemm_shapes(tmp_path / "absent.json")


def gpu_trace(path: Path) -> None:
    """A GPU trace as Kineto writes one: host operators with shapes, the kernels they
    launched on a stream carrying the launching operator's External id."""
    def op(name: str, ts: float, dur: float, ext: int, dims: list, types: list) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"External id": ext, "Input Dims": dims, "Input type": types,
                         "Input Strides": [[], [], []][:len(dims)], "Concrete Inputs": [""] * len(dims)}}

    def kernel(ts: float, dur: float, ext: int) -> dict:
        return {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"External id": ext, "stream": 7, "device": 0, "correlation": ext + 1000}}

    lin = [[64, 128], [256, 128], [256]]
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
    for k, t in enumerate((10.0, 500.0)):
        events += [op("aten::linear", t, 30.0, 10 + 4 * k, lin, ["float"] * 3),
                   op("aten::t", t + 1, 2.0, 11 + 4 * k, [[256, 128]], ["float"]),
                   op("aten::addmm", t + 5, 20.0, 12 + 4 * k, [[256], [64, 128], [128, 256], [], []],
                      ["float", "float", "float", "Scalar", "Scalar"]),
                   kernel(t + 40, 75.0, 12 + 4 * k)]  # the kernel runs after its launch
    events.append(op("aten::mm", 900.0, 5.0, 99, [[8, 8], [8, 8]], ["float"] * 2))
    events.append(kernel(920.0, 3.0, 99))
    events.append(kernel(930.0, 50.0, 555))  # launched by no GEMM operator
    path.write_text(json.dumps({"traceEvents": events}))


def test_on_a_gpu_an_operator_weighs_the_kernels_its_nest_launched(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    gpu_trace(path)
    g = gemm_shapes(path)
    assert g.timing == "device"
    assert [(s.op, s.calls, s.trace_us) for s in g.shapes] == [("aten::linear", 2, 150.0), ("aten::mm", 1, 3.0)]
    assert g.total_us == 153.0 and g.window_us == 1000


def record_followers(path: Path, autocast: bool = False) -> None:
    """Linear -> GELU -> Dropout -> Linear (the GELU and the dropout follow the first
    linear), a ReLU on the raw input and one after a convolution (neither follows a
    matrix multiply whose output dims the trace tells)."""
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Dropout(0.1), nn.Linear(HIDDEN, CLASSES))
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(BATCH, DIM, requires_grad=True)
    img = torch.randn(2, 3, 8, 8)

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
                 schedule=schedule(wait=1, warmup=1, active=ACTIVE)) as p:
        for _ in range(1 + 1 + ACTIVE):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(x).sum() + torch.relu(x).sum() + torch.relu(conv(img)).sum()
            loss.backward()
            p.step()


def _window_ops(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    return [e for e in ev if e.get("cat") == "cpu_op" and lo <= e["ts"] < hi]


def test_followers_are_the_activations_a_matmul_feeds_and_their_backward(tmp_path: Path) -> None:
    from pardiag.analyzers.gemm_shapes import FOLLOWER_NAMES

    path = tmp_path / "followers.json"
    record_followers(path)
    g = gemm_shapes(path)
    got = {(s.op, s.backward): s for s in g.followers}
    # (dropout's backward on a CPU is a MulBackward0's aten::mul, a name too common to scale)
    assert set(got) == {("aten::gelu", False), ("aten::dropout", False), ("aten::gelu_backward", True)}
    for s in got.values():
        assert s.calls == ACTIVE and s.dims[0] == (BATCH, HIDDEN) and s.dtypes[0] == "float"
    ops = _window_ops(path)
    # each follower's time: its calls' durations in the trace
    for (op, _), s in got.items():
        assert s.trace_us == pytest.approx(sum(e["dur"] for e in ops if e["name"] == op
                                               and e["args"]["Input Dims"][0] == [BATCH, HIDDEN]))
    # the relus (on the raw input, after the convolution) are not followers but count in the
    # names' time, as every call of those names; native_dropout inside dropout counts once
    relus = [e for e in ops if e["name"] == "aten::relu"]
    assert len(relus) == 2 * ACTIVE and not any(s.op == "aten::relu" for s in g.followers)
    named = [e for e in ops if FOLLOWER_NAMES.match(e["name"])]
    outer = [e for e in named if not any(o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"]
                                         and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in named)]
    assert {e["name"] for e in outer} == {"aten::gelu", "aten::dropout", "aten::gelu_backward", "aten::relu",
                                          "aten::threshold_backward"}  # the relus' backward: no follower either
    assert g.follower_names_us == pytest.approx(sum(e["dur"] for e in outer))
    assert sum(s.trace_us for s in g.followers) < g.follower_names_us


def test_under_autocast_the_activations_already_run_in_bf16_and_gain_nothing(tmp_path: Path) -> None:
    path = tmp_path / "amp.json"
    record_followers(path, autocast=True)
    g = gemm_shapes(path)
    assert g.followers == () and g.follower_names_us > 0
    assert any(s.dtypes[0] == "c10::BFloat16" for s in g.shapes)


def record_sgd(path: Path, shapes: bool = True, adamw: bool = False) -> None:
    """Plain SGD (no foreach) on a 512x1024 float32 layer (2 MiB weight, 1024-float bias),
    2 profiled steps: the optimizer's ``param.add_(grad, alpha=-lr)`` per parameter (with
    ``adamw``, single-tensor AdamW: ``exp_avg.lerp_(grad, 1 - beta1)``)."""
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    model = nn.Linear(1024, 512)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False) if adamw else
           torch.optim.SGD(model.parameters(), lr=0.01, foreach=False))
    x = torch.randn(8, 1024)

    def save(p: "profile") -> None:
        p.export_chrome_trace(str(path))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes, on_trace_ready=save,
                 schedule=schedule(wait=1, warmup=1, active=ACTIVE)) as p:
        for _ in range(1 + 1 + ACTIVE):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            p.step()


@pytest.mark.parametrize("adamw, op", [(False, "aten::add_"), (True, "aten::lerp_")])
def test_the_in_place_add_rate_is_the_jobs_own_large_adds(tmp_path: Path, adamw: bool, op: str) -> None:
    """SGD's ``param.add_`` and AdamW's ``exp_avg.lerp_`` (which adds nothing same-shaped
    in place, but reads two tensors and writes one as an add does)."""
    from pardiag.analyzers.gemm_shapes import inplace_add_rate

    path = tmp_path / "opt.json"
    record_sgd(path, adamw=adamw)
    # the weight's call in each profiled step: 512x1024 float32, 2 MiB; the bias's 2 KiB is too small
    big = [e for e in _window_ops(path) if e["name"] == op and e["args"].get("Input Dims", [None])[0] == [512, 1024]]
    assert len(big) == ACTIVE
    r = inplace_add_rate(path)
    assert r is not None and r.calls == ACTIVE and r.bytes == 2 << 20
    durs = sorted(e["dur"] for e in big)
    assert r.us_per_byte == pytest.approx(sum(durs) / len(durs) / (2 << 20))  # the median of two: their mean
    # without recorded shapes (or on a GPU trace: the host only launches kernels) there is none
    bare = tmp_path / "bare.json"
    record_sgd(bare, shapes=False, adamw=adamw)
    assert inplace_add_rate(bare) is None
    gpu = tmp_path / "gpu.json"
    gpu_trace(gpu)
    assert inplace_add_rate(gpu) is None
