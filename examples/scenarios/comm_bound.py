"""Lever `gradient_accumulation`: a wide model (about 50 MB of gradients in several
DDP buckets) trained with a tiny batch and plain SGD: every step is mostly all-reduce
that the little compute cannot hide."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: accumulate 4 micro-batches per gradient sync (a 4x larger global
# batch per optimizer step: compare time per micro-batch).
FIX = {"accum": 4}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(1024, 2048, 3, 10), Vectors(4096, 1024, 10),
                   **settings(a, dict(batch=2, autocast="where_fast", optimizer="sgd"), FIX)))
