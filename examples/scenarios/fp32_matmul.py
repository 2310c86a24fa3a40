"""Lever `mixed_precision`: large fp32 matrix multiplies on a CPU whose bf16 matrix
units (AMX / AVX512-BF16) would run them several times faster."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import Vectors, args, mlp, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import Vectors, args, mlp, settings, train

# The finding's advice: forward and loss under bf16 autocast.
FIX = {"autocast": True}

if __name__ == "__main__":
    a = args()
    sys.exit(train(mlp(512, 512, 3, 10), Vectors(65536, 512, 10), **settings(a, dict(batch=1024), FIX)))
