"""The steps' vocabulary, torch-free: the blocks a stack is built of, the data-parallel modes
and the pipeline schedules. The command line validates against these names before torch loads;
the steps build what they name."""

from __future__ import annotations

# Megatron-style blocks (steps.stacks builds them).
BLOCKS = ("mlp", "attention")
# Data-parallel modes, in the order the ZeRO stages shrink what each rank holds.
MODES = ("ddp", "zero1", "zero2", "zero3")
# FSDP2 is zero3 when it reshards after forward, zero2 when it keeps the parameters gathered.
FSDP = "fsdp"
# Pipeline schedules (parallel.pipeline runs them).
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved-1f1b")
