"""Lever `straggler`: rank 1 does 40 ms of extra CPU work before every forward pass
(a busy loop, like logging or augmentation only that rank does)."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, train

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 2, 10), Vectors(8192, 256, 10), steps=a.steps, batch=64, autocast=True,
                   slow_rank=1, slow_ms=40))
