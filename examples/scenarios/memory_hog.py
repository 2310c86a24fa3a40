"""Lever `memory_imbalance`: the healthy job, except that rank 1 keeps 320 MiB of
evaluation data in memory for the whole job (loaded only there, as a rank-0-only
evaluation often is). Every rank trains the same model on the same batches, so the
extra is memory held outside the training step's tensors."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Batches, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Batches, args, mlp, settings, train

HOLD_MIB = 320
# The finding's advice: free what only that rank keeps (here: do not load the evaluation set there).
FIX = {"hold_mib": 0}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(512, 512, 4, 10), Batches(64, 1024, 512, 10),
                   **settings(a, dict(batch=None, autocast="where_fast", bucket_cap_mb=1, pause_ms=20,
                                      hold_rank=1, hold_mib=HOLD_MIB), FIX)))
