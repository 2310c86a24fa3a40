"""Straggler cause `CPU contention`: each rank has its own CPU, and another process
spins on rank 1's for the whole job (a neighbour's job, a stray data-prep script), so
rank 1's training thread waits for its CPU about half the time. Linux only (CPU
affinity); it needs two CPUs."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: give rank 1 its CPU back (stop or move the other process).
FIX = {"burner_rank": -1}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 512, 3, 10), Vectors(32768, 256, 10),
                   **settings(a, dict(batch=1024, autocast="where_fast", pin_ranks=True, burner_rank=1), FIX)))
