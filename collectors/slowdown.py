"""A second profiler window when the job slows down after the first one.

Each rank watches its own step time once its first window has closed. When its last
``SLOW_STEPS`` steps were each at least ``SLOW_RATIO`` times the median of the
``BASELINE`` steps before them (undisturbed steps outside any window, at least
``MIN_BASELINE`` of them), it proposes a window starting ``LEAD`` steps later. The
ranks agree on one start step through the job's own rendezvous store (the first
proposal wins: ``compare_set``), which every rank reads every ``POLL`` steps (a
round trip to the store, one in ``POLL`` steps); all of them then record the same
steps, as the first window did. Without a process group (one process) the rank's own
proposal is the start. At most one extra window per run.

What was seen is kept for meta.json (`trigger`): the rank that proposed (when it was
this one), the step, its time and the median it was compared with.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Callable

SLOW_RATIO = 1.3
SLOW_STEPS = 5
BASELINE = 50
MIN_BASELINE = 10
POLL = 20
LEAD = POLL + 5  # every rank polls once before the agreed start (ranks in step stay within a step or two)
KEY = "pardiag/extra_window"


class SlowdownWatch:
    """Watches one rank's steps; `on_step` returns the agreed start of the extra window
    once it is known (else None)."""

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self.on_error = on_error
        self.recent: deque[float] = deque(maxlen=SLOW_STEPS)
        self.baseline: deque[float] = deque(maxlen=BASELINE)
        self.proposed: int | None = None
        self.start: int | None = None
        self.trigger: dict[str, Any] | None = None
        self.off: str | None = None  # why the watch stopped
        self._store: Any = None
        self._store_tried = False

    def _get_store(self) -> Any:
        if not self._store_tried:
            self._store_tried = True
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    from torch.distributed import distributed_c10d as c10d

                    self._store = c10d._get_default_store()
            except Exception as e:
                self.on_error("slowdown.store", e)
                self._store = None
        return self._store

    def on_step(self, step: int, dur_us: float | None, counts: bool) -> int | None:
        """After step `step` ended (`counts`: undisturbed and outside every window)."""
        if self.start is not None or self.off is not None:
            return self.start
        try:
            if counts and dur_us is not None and dur_us > 0:
                self._observe(step, dur_us)
            store = self._get_store()
            if store is None:
                if self.proposed is not None:
                    self.start = self.proposed
            elif step % POLL == 0 or self.proposed is not None:
                if self.proposed is not None:
                    got = store.compare_set(KEY, "", str(self.proposed))
                    self.start = int(got)
                    self.proposed = None
                elif store.check([KEY]):
                    self.start = int(store.get(KEY))
        except Exception as e:
            self.on_error("slowdown", e)
            self.off = f"{type(e).__name__}: {e}"
        return self.start

    def _observe(self, step: int, dur_us: float) -> None:
        if self.proposed is not None:
            return
        self.recent.append(dur_us)
        if len(self.recent) == SLOW_STEPS and len(self.baseline) >= MIN_BASELINE:
            median = statistics.median(self.baseline)
            if median > 0 and all(d >= SLOW_RATIO * median for d in self.recent):
                self.proposed = step + LEAD
                self.trigger = {"step": step, "step_us": round(dur_us, 1), "median_us": round(median, 1),
                                "ratio": round(dur_us / median, 3)}
                return
        if len(self.recent) == SLOW_STEPS:
            self.baseline.append(self.recent[0])
