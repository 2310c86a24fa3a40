"""Lever `sharding`: run with `pardiag run --memory-per-rank 400MiB`: parameters,
gradients and AdamW state of this model (about 4 x 40 MB) plus the process itself
exceed what a rank is given, so DDP's full replica per rank does not fit."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: ZeRO-1, AdamW's state sharded over the ranks (ZeroRedundancyOptimizer).
# It frees memory and estimates no speed-up; the pair measures what it costs per step.
FIX = {"optimizer": "zero_adamw"}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 1792, 4, 10), Vectors(4096, 256, 10), **settings(a, dict(batch=256, autocast="where_fast"), FIX)))
