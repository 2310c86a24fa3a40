"""NCCL's debug logs: ``log`` parses them (per process, merged per host), ``findings``
holds the nccl_env rules and the hang diagnosis, ``summary`` condenses both into the
Analysis' ``nccl`` block."""
