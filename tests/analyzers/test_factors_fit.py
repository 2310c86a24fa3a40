"""The factors' arithmetic and readers: the all_reduce curve fitted to matched calls
(waiting left out), the time-weighted GEMM speed-up, and files that are missing,
corrupt or newer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pardiag.analyzers import factors
from pardiag.analyzers.rank_trace import CollectiveCall


def call(size: int, dur: float, start: float = 0.0, op: str = "all_reduce", timing: str = "host") -> CollectiveCall:
    return CollectiveCall(step=1, op=op, process_group="0:default_pg", group_size=2, bytes=size, start_us=start,
                          dur_us=dur, on_gpu=False, timing=timing)


def test_exact_points_give_back_alpha_and_beta() -> None:
    alpha, beta = 40.0, 0.0025  # 40 us + 2.5 us per KB-ish
    pts = [(b, alpha + beta * b) for b in (4096, 65536, 1 << 20, 16 << 20)]
    fit = factors.fit_line(pts)
    assert fit is not None
    assert fit.alpha_us == pytest.approx(alpha, rel=1e-9) and fit.beta_us_per_byte == pytest.approx(beta, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.rel_error_max == pytest.approx(0.0, abs=1e-9)


def test_the_fit_weighs_small_sizes_by_their_relative_error() -> None:
    # 10% too slow at the smallest size, exact elsewhere: relative least squares keeps alpha
    # near 100 (an unweighted fit would let the 1 GB point decide alone)
    alpha, beta = 100.0, 0.001
    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 30]
    pts = [(b, (alpha + beta * b) * (1.1 if b == sizes[0] else 1.0)) for b in sizes]
    fit = factors.fit_line(pts)
    assert fit is not None
    assert 100.0 < fit.alpha_us < 110.0 and fit.beta_us_per_byte == pytest.approx(beta, rel=0.02)
    assert fit.rel_error_max < 0.1


def test_alpha_and_beta_are_never_negative() -> None:
    # points on a line through (0, -50): the best line with alpha >= 0 goes through the origin
    pts = [(b, -50.0 + 0.01 * b) for b in (10_000, 20_000, 40_000)]
    fit = factors.fit_line(pts)
    assert fit is not None and fit.alpha_us == 0.0
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    w = [1 / y**2 for y in ys]
    expect = sum(wi * x * y for wi, x, y in zip(w, xs, ys)) / sum(wi * x * x for wi, x in zip(w, xs))
    assert fit.beta_us_per_byte == pytest.approx(expect)
    # times that fall with size: no bandwidth term, alpha is their weighted mean
    flat = factors.fit_line([(1000, 30.0), (8000, 20.0)])
    assert flat is not None and flat.beta_us_per_byte == 0.0
    assert flat.alpha_us == pytest.approx((30 / 30**2 + 20 / 20**2) / (1 / 30**2 + 1 / 20**2))


def test_one_size_is_no_curve() -> None:
    assert factors.fit_line([(4096, 10.0), (4096, 12.0)]) is None
    assert factors.fit_line([]) is None


def test_the_run_fit_takes_each_calls_transfer_not_its_wait() -> None:
    alpha, beta = 30.0, 0.002
    sizes = [8192, 32768, 262144]
    r0, r1 = [], []
    for k, b in enumerate(sizes * 2):
        t = alpha + beta * b
        # rank 0 arrives first and waits 500 us more on the first round; rank 1 waits on the second
        r0.append(call(b, t + (500.0 if k < 3 else 0.0), start=k * 1e4))
        r1.append(call(b, t + (0.0 if k < 3 else 200.0), start=k * 1e4))
    pts, calls = factors.run_points({0: r0, 1: r1})
    assert calls == 6 and [p.bytes for p in pts] == sizes and all(p.n == 2 for p in pts)
    assert [p.us for p in pts] == pytest.approx([alpha + beta * b for b in sizes])
    got = factors.fit_run({0: r0, 1: r1})
    assert got.value is not None and got.value.kind == "fit"
    assert got.value.alpha_us == pytest.approx(alpha) and got.value.beta_us_per_byte == pytest.approx(beta)
    assert got.value.source == "fit of this run's 6 all_reduce calls"
    assert got.value.predict_us(1 << 20) == pytest.approx(alpha + beta * (1 << 20))


def test_calls_that_do_not_match_are_left_out() -> None:
    r0 = [call(4096, 50.0), call(65536, 90.0), call(1 << 20, 300.0, op="broadcast"), call(1 << 18, 1.0, timing="launch")]
    r1 = [call(4096, 60.0), call(65537, 90.0), call(1 << 20, 300.0, op="broadcast"), call(1 << 18, 1.0, timing="launch")]
    # the second differs in size between ranks, the third is not an all_reduce, the fourth is only an enqueue
    pts, calls = factors.run_points({0: r0, 1: r1})
    assert calls == 1 and pts == (factors.CurvePoint(4096, 50.0, 1),)


def test_sizes_within_4x_are_not_fitted_and_say_why() -> None:
    calls = {r: [call(1 << 20, 900.0), call(3 << 20, 2000.0)] for r in (0, 1)}
    got = factors.fit_run(calls)
    assert got.value is None and "span 3.0x" in (got.reason or "") and "4x" in (got.reason or "")


def test_weighted_speedup_is_the_speedup_of_the_whole_time() -> None:
    # 300 us at 4x and 100 us at 1x: 400 us become 75 + 100 = 175 us
    assert factors.weighted_speedup([(300.0, 4.0), (100.0, 1.0)]) == pytest.approx(400 / 175)
    assert factors.weighted_speedup([(300.0, 0.0)]) is None


def gemm_doc(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "format": "pardiag.gemm-factor", "format_version": 1, "status": "ok", "reason": None, "device": "cpu",
        "device_name": "Some CPU", "from_dtype": "float32", "to_dtype": "bfloat16", "covered_share": 0.9,
        "seconds": 3.5, "speedup": 9.9,  # the reader recomputes it from the rows
        "shapes": [
            {"op": "aten::linear", "dims": [[1024, 512], [512, 512], [512]], "dtypes": ["float"] * 3, "backward": False,
             "calls": 9, "trace_us": 600.0, "fp32_us": 60.0, "half_us": 20.0, "speedup": 3.0},
            {"op": "aten::mm", "dims": [[512, 1024], [1024, 512]], "dtypes": ["float"] * 2, "backward": True,
             "calls": 9, "trace_us": 300.0, "fp32_us": 30.0, "half_us": 20.0, "speedup": 1.5},
            {"op": "aten::convolution", "dims": [[2, 3, 8, 8], [4, 3, 3, 3], None], "dtypes": ["float", "float", ""],
             "backward": False, "calls": 1, "trace_us": 50.0, "fp32_us": None, "half_us": None, "speedup": None,
             "error": "RuntimeError: no"},
        ]}
    doc.update(over)
    return doc


def write(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)


def test_gemm_factor_reads_the_rows_and_weighs_them(tmp_path: Path) -> None:
    write(tmp_path / "factors" / "gemm.json", gemm_doc())
    g = factors.gemm_factor(tmp_path)
    assert g is not None
    assert g.speedup == pytest.approx(900 / (600 / 3 + 300 / 1.5))  # the timed rows only
    assert g.half_dtype == "bfloat16" and g.covered_share == 0.9 and len(g.rows) == 3 and len(g.timed) == 2
    assert g.rows[2].error == "RuntimeError: no" and g.rows[2].dims[2] is None
    assert g.source == ("measured: 2 matmul shapes of this job timed in fp32 and bf16 autocast on this host's CPU "
                        "after the job")


@pytest.mark.parametrize("content, words", [
    (None, "gemm.json: not recorded"),
    ("{not json", "gemm.json: unreadable"),
    ("[1, 2]", "not a pardiag.gemm-factor file"),
    (gemm_doc(format_version=2), "format version 2 is newer than this pardiag reads (1)"),
    (gemm_doc(shapes=[{"op": "aten::mm"}]), "gemm.json: unreadable (KeyError"),
    (gemm_doc(shapes=[{**gemm_doc()["shapes"][0], "speedup": None}]), "no shape was timed"),  # type: ignore[index]
    (gemm_doc(status="failed", reason="killed after 20 s"), "gemm.json: killed after 20 s"),
])
def test_a_gemm_file_that_cannot_be_used_is_refused_in_one_line(tmp_path: Path, content: object, words: str) -> None:
    if content is not None:
        write(tmp_path / "factors" / "gemm.json", content)
    got = factors.read_gemm(tmp_path)
    assert got.value is None and words in (got.reason or "") and "\n" not in (got.reason or "")
    assert factors.gemm_factor(tmp_path) is None


def sweep_doc(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {"format": "pardiag.allreduce-curve", "format_version": 1, "status": "ok", "reason": None,
                              "source": "sweep", "backend": "gloo", "world_size": 2,
                              "points": [{"bytes": 1024, "us": 52.0, "n": 10}, {"bytes": 1 << 20, "us": 2100.0, "n": 10}],
                              "alpha_us": 50.0, "beta_us_per_byte": 0.002, "r2": 0.99, "rel_error_max": 0.02}
    doc.update(over)
    return doc


def test_comm_curve_prefers_the_runs_own_fit_and_else_reads_the_sweep(tmp_path: Path) -> None:
    write(tmp_path / "factors" / "allreduce.json", sweep_doc())
    one_size = {r: [call(1 << 20, 900.0)] for r in (0, 1)}
    c = factors.comm_curve(tmp_path, one_size)
    assert c is not None and c.kind == "sweep" and c.alpha_us == 50.0 and c.predict_us(1000) == pytest.approx(52.0)
    assert c.source == "sweep after the job: all_reduce timed at 2 sizes on 2 ranks (gloo)" and c.world_size == 2
    spread = {r: [call(4096, 30.0 + 0.001 * 4096), call(1 << 20, 30.0 + 0.001 * (1 << 20))] for r in (0, 1)}
    f = factors.comm_curve(tmp_path, spread)
    assert f is not None and f.kind == "fit" and f.alpha_us == pytest.approx(30.0)
    assert factors.comm_curve(tmp_path) is not None  # no calls given: the file


@pytest.mark.parametrize("content, words", [
    (None, "allreduce.json: not recorded"),
    ("\x00\x01", "allreduce.json: unreadable"),
    (sweep_doc(format_version=7), "newer than this pardiag reads"),
    (sweep_doc(alpha_us=-1.0), "not negative"),
    (sweep_doc(alpha_us="fast"), "unreadable (ValueError"),
    (sweep_doc(source="guess"), "unknown source 'guess'"),
    (sweep_doc(status="skipped", reason="one process: no all_reduce between ranks"), "one process"),
])
def test_an_allreduce_file_that_cannot_be_used_is_refused_in_one_line(tmp_path: Path, content: object,
                                                                      words: str) -> None:
    if content is not None:
        write(tmp_path / "factors" / "allreduce.json", content)
    one_size = {r: [call(1 << 20, 900.0)] for r in (0, 1)}
    got = factors.read_comm(tmp_path, one_size)
    assert got.value is None and words in (got.reason or "") and "\n" not in (got.reason or "")
    assert "span 1.0x" in (got.reason or "")  # why the run's own calls gave no fit either


def test_a_line_that_explains_nothing_is_no_fit() -> None:
    # one late small bucket: the times fall with size (as gloo's concurrent buckets give)
    calls = {r: [call(1024, 1500.0), call(263168, 590.0), call(263168, 600.0), call(272424, 800.0)] for r in (0, 1)}
    got = factors.fit_run(calls)
    assert got.value is None and "fit no latency/bandwidth line" in (got.reason or "")
    assert "4 all_reduce calls (3 sizes)" in (got.reason or "")
