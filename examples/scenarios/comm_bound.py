"""Lever `gradient_accumulation`: a wide model (about 50 MB of gradients in several
DDP buckets) trained with a tiny batch and plain SGD: every step is mostly all-reduce
that the little compute cannot hide."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, train

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(1024, 2048, 3, 10), Vectors(4096, 1024, 10), steps=a.steps, batch=2, autocast=True,
                   optimizer="sgd"))
