"""Lever `straggler` (cause: page faults): rank 1's C library allocator maps every large
block afresh and hands it back when freed, so each of its steps faults the memory of its
activations and gradients in again; rank 0's allocator keeps freed memory for reuse.
The same code, the same work: only the allocator differs (glibc's own thresholds move
with what a process frees, and ranks running the same code end up apart: of comm_bound's
8 ranks in 4 recordings, 5 faulted 8,160 times per step, one none, one 4,096 or none in
turn, one 6,144-10,240)."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Batches, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Batches, args, mlp, settings, train

# The finding's advice: keep freed memory in every rank's allocator
# (MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set large).
FIX = {"keep_memory": True}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(128, 256, 3, 10), Batches(64, 4096, 128, 10),
                   **settings(a, dict(batch=None, autocast="where_fast", optimizer="sgd", fresh_rank=1), FIX)))
