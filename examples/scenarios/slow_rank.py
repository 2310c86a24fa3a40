"""Lever `straggler`: rank 1 does 40 ms of extra CPU work before every forward pass
(a busy loop, like logging or augmentation only that rank does)."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: remove the work only rank 1 does.
FIX = {"slow_ms": 0.0}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 2, 10), Vectors(8192, 256, 10),
                   **settings(a, dict(batch=64, autocast="where_fast", slow_rank=1, slow_ms=40), FIX)))
