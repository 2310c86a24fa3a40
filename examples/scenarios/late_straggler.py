"""Lever `straggler`, found over time: from optimizer step 25 on, rank 1 does 30 ms of
extra CPU work before every forward pass (a job that starts on its host, a growing
cache): the profiled window (steps 7-9) is before it, and the median over all steps
hides it in a run of 40 steps."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: remove what started on rank 1.
FIX = {"slow_ms": 0.0}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 2, 10), Vectors(8192, 256, 10),
                   **settings(a, dict(batch=64, autocast="where_fast", slow_rank=1, slow_ms=30, slow_from=25), FIX)))
