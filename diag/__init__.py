"""pardiag: explains why a distributed PyTorch training job does not scale.

Inside a training script run under `pardiag run`, `pardiag.step()` marks the end of a
training step for loops that do not use a torch optimizer. Elsewhere it does nothing.
"""

from __future__ import annotations

import sys

__version__ = "0.5.6"


def step() -> None:
    """Mark the end of one training step (only needed when no torch optimizer steps)."""
    runtime = sys.modules.get("pardiag.collectors.runtime")
    c = runtime.collector() if runtime is not None else None
    if c is not None:
        c.explicit_step()
