"""Lever `dataloader`: every sample takes 1.5 ms to load and the DataLoader has no
workers, so the training loop waits for its input."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: DataLoader(num_workers=N, persistent_workers=True, prefetch_factor=2),
# N from the share of the step spent waiting (4 here; the benchmark passes the run's own
# advice with --set workers=N).
FIX = {"workers": 4, "persistent_workers": True}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 2, 10), Vectors(4096, 256, 10, delay_s=0.0015),
                   **settings(a, dict(batch=32, autocast="where_fast"), FIX)))
