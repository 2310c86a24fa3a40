"""Lever `ddp_bucket_size`: a deep MLP whose gradients DDP sends in dozens of tiny
buckets (bucket_cap_mb=0.05): each all-reduce pays the full latency."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: a 4x larger cap, bucket_cap_mb=0.2. Each 256x256 weight (256 KB)
# still fills a bucket of its own under it: DDP makes the same 25 buckets as with 0.05.
FIX = {"bucket_cap_mb": 0.2}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(256, 256, 24, 10), Vectors(8192, 256, 10),
                   **settings(a, dict(batch=32, bucket_cap_mb=0.05, autocast="where_fast"), FIX)))
