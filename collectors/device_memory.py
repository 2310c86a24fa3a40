"""Device memory by phase of a step, sampled on a few steps: what the step's forward
left alive for backward (activations) and what stays allocated at the step's end.

On one step in `EVERY` (from `FIRST` on), when CUDA is initialised, the caching
allocator's count of allocated bytes (`torch.cuda.memory_allocated`) is read

* at the step's start: the previous step's boundary, and again at the step's first
  DDP (or FSDP) forward's start (after a `zero_grad()` that freed the gradients,
  before the batch's activations), the later read standing as the base;
* just before the step's first `torch.autograd.backward`: activations = that read less
  the base (the tensors forward saved for backward, its outputs and the loss; the
  batch too when it was moved to the device after the base);
* at the step's end (after the optimizer step): the bytes that stay allocated.

A read costs a walk of the allocator's statistics (about 0.1 ms), so it is made on
sampled steps only: three reads every `EVERY` steps. On a CPU nothing is read (the CPU
allocator keeps no count; RSS is in steps.jsonl, and `--profile-memory` gives the
allocations in the window). A read that fails stops the probe, recorded once.
"""

from __future__ import annotations

from typing import Any, Callable

EVERY = 16
FIRST = 3  # after the first steps' one-time allocations (the allocator's pool, DDP's buckets)


class DeviceMemoryProbe:
    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self.on_error = on_error
        self.armed = False  # this step is sampled and its backward has not started
        self.sampled = False  # this step is sampled (its end reads too)
        self.base: int | None = None
        self.forward_seen = False
        self.off = False
        self._read: Callable[[], int] | None = None

    def _reader(self) -> Callable[[], int] | None:
        if self._read is None and not self.off:
            try:
                import torch

                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    self._read = torch.cuda.memory_allocated
            except Exception as e:
                self._stop(e)
        return self._read

    def _stop(self, e: BaseException) -> None:
        self.off, self.armed, self.sampled, self._read = True, False, False, None
        self.on_error("device_memory", e)

    def _now(self) -> int | None:
        read = self._reader()
        if read is None:
            return None
        try:
            return int(read())
        except Exception as e:
            self._stop(e)
            return None

    def start_step(self, step: int) -> None:
        """At the boundary before step `step`."""
        self.armed = self.sampled = self.forward_seen = False
        if self.off or step < FIRST or (step - FIRST) % EVERY:
            return
        self.base = self._now()
        self.armed = self.sampled = self.base is not None

    def at_forward(self) -> None:
        """At a wrapped module's forward: the step's first (outermost) one moves the base."""
        if self.armed and not self.forward_seen:
            self.forward_seen = True
            now = self._now()
            if now is not None:
                self.base = now

    def at_backward(self, counters: Any) -> None:
        """Before a backward: the first of a sampled step records its activations."""
        if not self.armed:
            return
        self.armed = False
        now = self._now()
        if now is not None and self.base is not None:
            counters.act_bytes, counters.act_seen = max(0, now - self.base), 1

    def end_step(self, counters: Any) -> None:
        """At the step's end, before its record is written."""
        if self.sampled:
            now = self._now()
            if now is not None:
                counters.dev_alloc_bytes, counters.dev_alloc_seen = now, 1
