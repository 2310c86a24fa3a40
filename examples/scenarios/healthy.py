"""Control: bf16 autocast (on a CPU with bf16 units; fp32 elsewhere), batches ready in
memory and a small model whose gradients go in several buckets that hide under
backward: no lever should fire. Each step also
pauses 20 ms (as for I/O outside the job), which leaves CPU to spare on a small
machine so that other processes do not turn one rank into a straggler."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Batches, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Batches, args, mlp, settings, train

# Nothing to fix: --fix runs the same job, so the pair measures run-to-run noise.
FIX: dict = {}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(512, 512, 4, 10), Batches(64, 1024, 512, 10),
                   **settings(a, dict(batch=None, autocast="where_fast", bucket_cap_mb=1, pause_ms=20), FIX)))
