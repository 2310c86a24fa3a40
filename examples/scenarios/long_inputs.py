"""Straggler cause `input imbalance`: rank 1's data shard holds sequences twice as long
(256 tokens against 128), so its forward and backward do twice the work while rank 0
waits; the model's work is in proportion to tokens."""

import sys

try:  # imported as pardiag.examples.scenarios.<name>
    from .harness import TokenModel, Tokens, args, settings, train
except ImportError:  # run as a script: torchrun .../<name>.py
    from harness import TokenModel, Tokens, args, settings, train

# The finding's advice: balance the tokens per rank (here: both shards at 128 tokens).
FIX = {"long_factor": 1}
DATA_KEYS = ("long_factor",)  # settings of this scenario's data, taken out before train()

if __name__ == "__main__":
    a = args()
    kw = settings(a, dict(batch=32, autocast="where_fast", long_factor=2), FIX)
    factor = kw.pop("long_factor")
    sys.exit(train(TokenModel(1000, 128, 512, 10), Tokens(4096, 128, 1000, 10, long_rank=1, factor=factor), **kw))
