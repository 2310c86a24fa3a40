"""`pardiag demo`: the bundled example, end to end, as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import read_json, read_steps, run_pardiag

pytestmark = [pytest.mark.slow, pytest.mark.timed]


def test_demo_with_bf16_and_a_worker(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = run_pardiag("demo", "--out", str(out), "--", "--steps", "12", "--precision", "bf16", "--workers", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "run directory:" in res.stderr and "collectors: steps ok, meta ok, profiler ok" in res.stderr
    for rank in (0, 1):
        assert [s["step"] for s in read_steps(out / f"ranks/{rank}/steps.jsonl")] == list(range(12))
        assert (out / f"ranks/{rank}/trace.json.gz").is_file()
    meta = read_json(out / "ranks/1/meta.json")
    assert meta["amp"]["autocast"] == {"cpu": ["torch.bfloat16"]}
    assert meta["amp"]["grad_scaler_calls"] == 0
    (loader,) = meta["dataloaders"]
    assert loader["num_workers"] == 1 and loader["sampler"] == "DistributedSampler"
    assert meta["optimizers"][0]["class"] == "AdamW"
    # AdamW keeps two moments per parameter (plus a step counter per tensor)
    params = meta["parameters"]
    assert params["local_bytes"] * 2 <= meta["optimizers"][0]["state_bytes"] <= params["local_bytes"] * 2 + 8 * params["tensors"]
    (ddp,) = meta["ddp"]
    assert ddp["bucket_cap_mb"] == 25.0 and ddp["bucket_count"] == 1
    assert ddp["bucket_sizes_bytes"] == [params["local_bytes"]]  # 2 MB of parameters fit one 25 MB bucket
    m = read_json(out / "manifest.json")
    assert m["exit_code"] == 0 and m["world_size"] == 2 and m["launcher"] == "torchrun"
