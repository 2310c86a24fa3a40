"""Straggler cause `garbage collection`: rank 1 keeps 300,000 small objects (a
cache, a tokenizer's tables) and calls gc.collect() after every step (as a
memory-minded callback might), so each of its steps carries a full collection that
scans them all while rank 0 waits."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: gc.freeze() once the long-lived objects are built, so that
# collections no longer scan them.
FIX = {"gc_freeze": True}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 2, 10), Vectors(8192, 256, 10),
                   **settings(a, dict(batch=64, autocast="where_fast", gc_rank=1, gc_every=1, gc_heap=300_000), FIX)))
