"""Control: a compute-bound job with bf16 autocast, batches ready in memory and a
small model whose gradients go in several buckets that hide under backward: no
lever should fire."""

import sys

from harness import Batches, args, mlp, train

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(512, 512, 4, 10), Batches(64, 2048, 512, 10), steps=a.steps, batch=None, autocast=True,
                   bucket_cap_mb=1))
