"""Lever `dataloader`: every sample takes 1.5 ms to load and the DataLoader has no
workers, so the training loop waits for its input."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, train

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 2, 10), Vectors(4096, 256, 10, delay_s=0.0015), steps=a.steps, batch=32,
                   autocast=True))
