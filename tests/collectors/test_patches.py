"""What pardiag wraps inside a training process can change nothing the job sees: every
wrapped callable keeps its signature and behaviour, no caller's keyword can collide with
the wrapper, nothing is attached to the user's objects (pickling, torch.save, deepcopy),
re-entrant calls and failures of the wrapper's own bookkeeping pass straight through,
and the numbers computed are bitwise the same."""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import SCRIPTS, read_json, run_pardiag, torchrun  # noqa: E402
from pardiag.collectors.framework import Framework  # noqa: E402


@pytest.fixture
def fw():
    errors: list[tuple[str, BaseException]] = []
    f = Framework(lambda where, e: errors.append((where, e)))
    f.install()
    f.errors = errors  # type: ignore[attr-defined]
    try:
        yield f
    finally:
        f.uninstall()


@pytest.fixture
def pg():
    """A one-rank gloo process group, in this process."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_every_wrapper_keeps_the_original_signature(fw) -> None:
    assert len(fw.patched) >= 6
    for owner, attr, original in fw.patched:
        wrapped = getattr(owner, attr)
        assert wrapped is not original and wrapped.__wrapped__ is original
        assert inspect.signature(wrapped) == inspect.signature(original), (owner, attr)
        assert wrapped.__name__ == original.__name__ and wrapped.__qualname__ == original.__qualname__


def test_uninstall_puts_the_originals_back() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    before = (DDP.forward, DataLoader.__iter__, torch.autograd.backward)
    f = Framework(lambda *_: None)
    f.install()
    assert (DDP.forward, DataLoader.__iter__, torch.autograd.backward) != before
    f.uninstall()
    assert (DDP.forward, DataLoader.__iter__, torch.autograd.backward) == before


def test_keyword_calls_and_subclasses_pass_through(fw) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    class MyLoader(DataLoader):
        def __iter__(self):  # a subclass that calls up with nothing special
            return super().__iter__()

    ds = TensorDataset(torch.arange(12.0).reshape(6, 2))
    loader = MyLoader(dataset=ds, batch_size=2, shuffle=False)
    batches = [b[0].tolist() for b in loader]
    assert batches == [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]], [[8.0, 9.0], [10.0, 11.0]]]
    info = next(iter(fw.loaders.values()))
    assert info["class"] == "MyLoader" and info["batch_size"] == 2 and info["dataset_len"] == 6
    assert fw.counters.data_calls == 4  # 3 batches + the StopIteration call

    scaler = torch.amp.GradScaler(device="cpu", init_scale=4.0)
    t = torch.ones(2)
    assert scaler.scale(outputs=t).tolist() == [4.0, 4.0]
    assert fw.grad_scaler_calls == 1
    x = torch.ones(3, requires_grad=True)
    torch.autograd.backward(tensors=(x * 2).sum())
    assert x.grad.tolist() == [2.0, 2.0, 2.0] and fw.counters.backwards == 1
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        pass
    with torch.autocast(device_type="cpu", enabled=False):
        pass
    assert fw.autocast_seen == {"cpu": {"torch.bfloat16"}}
    assert fw.errors == []


def test_a_loader_built_with_a_batch_sampler_records_its_batch(fw) -> None:
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=4, drop_last=False)
    assert [b.tolist() for b in DataLoader(list(range(10)), batch_sampler=sampler)] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    info = next(iter(fw.loaders.values()))
    assert info["batch_size"] is None and info["batch_sampler_batch_size"] == 4


def test_a_fetch_counts_the_loops_cpu_time_apart_from_its_wait(fw) -> None:
    """Each of 3 samples sleeps 20 ms and then spins 5 ms: the fetches' wall time holds
    both (75 ms), their CPU time the spins alone (15 ms), which is what loading in
    workers would move onto other processes on the same cores."""
    import time as _time

    from torch.utils.data import DataLoader, Dataset

    class SleepThenSpin(Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> int:
            _time.sleep(0.020)
            t = _time.thread_time() + 0.005
            while _time.thread_time() < t:
                pass
            return i

    assert [int(b) for b in DataLoader(SleepThenSpin(), batch_size=None)] == [0, 1, 2]
    c = fw.counters
    assert c.data_calls == 4 and c.data_ns >= 75e6
    assert 15e6 <= c.data_cpu_ns < 15e6 + 10e6, c.data_cpu_ns  # the sleeps burn next to nothing


def test_reentrant_dataloader_counts_the_outer_wait_once(fw) -> None:
    from torch.utils.data import DataLoader, Dataset

    class Nested(Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            inner = DataLoader(list(range(4)), batch_size=2)
            return sum(int(b.sum()) for b in inner) + i

    out = [int(b) for b in DataLoader(Nested(), batch_size=None)]
    assert out == [6, 7, 8]
    assert fw.counters.data_calls == 4  # the outer iterator only: 3 items + StopIteration


def test_backward_counts_the_page_faults_of_the_memory_it_touches_first(fw) -> None:
    import mmap
    import resource

    import torch

    if not hasattr(mmap, "MADV_NOHUGEPAGE"):
        pytest.skip("no madvise(MADV_NOHUGEPAGE) here: huge pages would fault once per 2 MB")
    pages = 2048  # 8 MiB of fresh anonymous memory, small pages: one minor fault per page touched
    size = pages * mmap.PAGESIZE

    class Touch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x * 2

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            m = mmap.mmap(-1, size)
            m.madvise(mmap.MADV_NOHUGEPAGE)
            for off in range(0, size, mmap.PAGESIZE):
                m[off] = 1
            m.close()
            return g * 2

    x = torch.ones(4, requires_grad=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    Touch.apply(x).sum().backward()
    total = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # every page touched faulted once inside backward; the rest of the process's faults in
    # that time (autograd's own allocations) are few, and all of them are the process's
    assert pages <= fw.counters.bwd_faults <= total
    assert fw.counters.bwd_faults < pages + 256
    assert x.grad is not None and x.grad.tolist() == [2.0] * 4  # the gradient is the one without pardiag


def test_a_failing_wrapper_records_once_and_steps_aside(fw, monkeypatch) -> None:
    from torch.utils.data import DataLoader

    def broken(loader):
        raise RuntimeError("bookkeeping failed")

    monkeypatch.setattr(fw, "_record_loader", broken)
    for _ in range(3):
        assert [b.tolist() for b in DataLoader([1, 2, 3], batch_size=3)] == [[1, 2, 3]]
    assert [w for w, _ in fw.errors] == ["framework.dataloader"]


def test_ddp_built_with_keywords_is_seen_and_still_pickles(fw, pg) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    ddp = DistributedDataParallel(module=model, bucket_cap_mb=1, find_unused_parameters=False)
    ddp(torch.randn(4, 8)).sum().backward()
    with ddp.no_sync():
        ddp(torch.randn(4, 8)).sum().backward()
    assert len(fw.ddp) == 1 and fw.ddp[0]() is ddp
    assert fw.counters.forwards == 2 and fw.no_sync_calls == 1
    assert not ddp._forward_pre_hooks and not ddp._forward_hooks  # nothing attached to it
    torch.save(ddp, io.BytesIO())
    copy.deepcopy(ddp)
    pickle.dumps(ddp)
    (facts,) = fw._ddp_facts()
    assert facts["bucket_cap_mb"] == 1.0 and facts["args"]["find_unused_parameters"] is False
    assert fw.errors == []


def test_objects_created_before_the_collector_installs_are_seen(pg) -> None:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    ddp = DistributedDataParallel(torch.nn.Linear(4, 1))
    loader = DataLoader(list(range(6)), batch_size=3)
    it = iter(loader)  # an iterator made before, too
    f = Framework(lambda *_: None)
    f.install()
    try:
        assert next(it).tolist() == [0, 1, 2]
        ddp(torch.randn(2, 4)).sum().backward()
        assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]
        assert f.ddp[0]() is ddp and f.counters.forwards == 1 and f.counters.backwards == 1
        assert f.counters.data_calls == 4  # the old iterator's next, then 2 batches + StopIteration
        assert next(iter(f.loaders.values()))["iterations_started"] == 1
    finally:
        f.uninstall()


def _train(seed: int) -> list[float]:
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(seed)
    ds = TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_losses_are_bitwise_equal_with_and_without_the_wrappers() -> None:
    plain = _train(3)
    f = Framework(lambda *_: None)
    f.install()
    try:
        wrapped = _train(3)
    finally:
        f.uninstall()
    assert wrapped == plain and len(plain) == 8


def test_framework_is_the_outermost_one_driving_the_step() -> None:
    f = Framework(lambda *_: None)
    # A torch optimizer stepped from accelerate's wrapper, itself called by transformers.
    inner = {"__name__": "accelerate.optimizer", "sys": sys, "f": f}
    exec("def step():\n    f.note_step_caller(sys._getframe())\n", inner)
    outer = {"__name__": "transformers.trainer", "inner_step": inner["step"]}
    exec("def train():\n    inner_step()\n", outer)
    outer["train"]()
    assert f.framework["name"] == "transformers"
    f.framework = None
    inner["step"]()
    assert f.framework["name"] == "accelerate"
    f.framework = None
    f.note_step_caller(sys._getframe())
    assert f.framework == {"name": "torch", "version": torch.__version__, "detected_from": "optimizer step caller"}


@pytest.mark.slow
def test_fsdp1_with_keywords_runs_identically_and_is_described(tmp_path: Path) -> None:
    cmd = torchrun(2, SCRIPTS / "fsdp1.py")
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = tmp_path / "run"
    res = run_pardiag("run", "--out", str(out), "--no-report", "--profile-steps", "1,1,2", "--", *torchrun(2, SCRIPTS / "fsdp1.py"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert res.returncode == 0, res.stderr[-2000:]
    losses = re.findall(r"^loss \d+ (\S+)$", plain.stdout, re.M)
    assert len(losses) == 6 and re.findall(r"^loss \d+ (\S+)$", res.stdout, re.M) == losses
    for rank in (0, 1):
        meta = read_json(out / "ranks" / str(rank) / "meta.json")
        assert meta["steps_completed"] == 6 and meta["errors"] == []
        fsdp1 = meta["fsdp"]["fsdp1"]
        assert fsdp1[0]["sharding_strategy"] == "ShardingStrategy.SHARD_GRAD_OP"
        assert fsdp1[0]["use_orig_params"] is True and fsdp1[0]["module"] == "Sequential"
        assert meta["framework"]["name"] == "torch" and meta["framework"]["version"] == torch.__version__
