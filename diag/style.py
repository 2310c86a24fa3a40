"""Colours and labels of the time and memory categories, defined once for every renderer (HTML
report, TUI). Plain data: importing this module pulls in nothing but the table of
per-step signals (`step_records.SIGNALS`), whose colours the host phases use."""

from __future__ import annotations

from pardiag.step_records import SIGNALS as _SIGNALS

# breakdown_us keys (Analysis.BREAKDOWN_KEYS), in stacking order
CATEGORY_LABELS: dict[str, str] = {
    "compute": "compute",
    "comm_exposed": "comm exposed",
    "comm_overlapped": "comm hidden",
    "memcpy": "copy",
    "dataloader": "data",
    "idle": "idle",
}
CATEGORY_COLOURS: dict[str, str] = {
    "compute": "#3b7dd8",
    "comm_exposed": "#e0603a",
    "comm_overlapped": "#f2b482",
    "memcpy": "#8a6fc9",
    "dataloader": "#3aa57a",
    "idle": "#c3c8d0",
}

# phases_us keys (Analysis.PHASE_KEYS)
PHASE_LABELS: dict[str, str] = {
    "dataloader": "data",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other",
    "host": "host work",
}
# the phases measured per step on the host take their colour from the signal table
PHASE_COLOURS: dict[str, str] = {
    **{s.name: s.colour for s in _SIGNALS if s.host_phase and s.colour},
    "other": "#b0b6bf",
    "host": "#c792b5",
}

# GpuTime fields, HTA's temporal breakdown of the GPU timeline
GPU_LABELS: dict[str, str] = {
    "compute_only": "compute only",
    "overlap": "compute + comm",
    "comm_only": "comm only",
    "memory": "copy",
    "idle": "idle",
}
GPU_COLOURS: dict[str, str] = {
    "compute_only": "#3b7dd8",
    "overlap": "#f2b482",
    "comm_only": "#e0603a",
    "memory": "#8a6fc9",
    "idle": "#c3c8d0",
}

# a rank's memory by category (RankResult.memory's "peak" and "steady" keys, analyzers/memory.py),
# in stacking order; the peak it is drawn against
MEMORY_LABELS: dict[str, str] = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
    "other": "other",
}
MEMORY_COLOURS: dict[str, str] = {
    "parameters": "#3b7dd8",
    "gradients": "#8a6fc9",
    "optimizer_state": "#3aa57a",
    "activations": "#e0903a",
    "other": "#c3c8d0",
}
MEMORY_PEAK_COLOUR = "#c0392b"

# waiting versus moving data inside collectives
TRANSFER_COLOUR = "#3b7dd8"
WAIT_COLOUR = "#e0603a"

SEVERITY_COLOURS: dict[str, str] = {"high": "#c0392b", "medium": "#d68910", "low": "#7f8c8d"}
NOTICE_COLOURS: dict[str, str] = {"error": "#c0392b", "warning": "#d68910", "info": "#5d6d7e"}
