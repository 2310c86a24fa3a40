"""Lever `sharding`: run with `pardiag run --memory-per-rank 400MiB`: parameters,
gradients and AdamW state of this model (about 4 x 40 MB) plus the process itself
exceed what a rank is given, so DDP's full replica per rank does not fit."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, train

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 1792, 4, 10), Vectors(4096, 256, 10), steps=a.steps, batch=256, autocast=True))
