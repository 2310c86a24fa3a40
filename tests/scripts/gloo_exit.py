"""How the test jobs end: their process group is destroyed once the training function
returned. With torch 2.13 on gloo, a group left to the interpreter's exit can abort the
process ("terminate called without an active exception") when a gloo thread releases its
last work after Python began shutting down."""

import gc

import torch.distributed as dist


def shutdown() -> None:
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
