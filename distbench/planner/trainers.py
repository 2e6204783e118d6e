"""Whose training step a plan prices and holds in memory (`plan --trainer`), torch-free.

- `torch`: torch's own APIs, what `distbench step` runs: torch.distributed.pipelining's
  schedules, DDP (with ZeroRedundancyOptimizer at ZeRO 1) and FSDP2 (ZeRO 2 and 3).
  planner.memory models its memory; its data-parallel collectives are planner.predict's.
- `megatron`: Megatron-LM (megatron.core's schedules, its DDP with contiguous gradient buffers
  and its distributed optimizer). ZeRO 1 is `--use-distributed-optimizer`: the gradients
  reduce-scattered into fp32 main-gradient shards and the parameters all-gathered after the
  step, where torch's ZeRO 1 all-reduces them; ZeRO 2 and 3 are not Megatron's (refused).
  planner.megatron_memory models its memory (Megatron's own formula, extended)."""

from __future__ import annotations

from distbench.planner import megatron_memory
from distbench.planner import memory as torch_memory
from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec

TORCH, MEGATRON = "torch", "megatron"
TRAINERS = (TORCH, MEGATRON)
# the ZeRO stages each trainer runs: Megatron shards its optimizer (ZeRO 1) and no more
ZERO_OF = {TORCH: (0, 1, 2, 3), MEGATRON: (0, 1)}


def problems(trainer: str, layout: Layout, model: ModelSpec | None = None) -> list[str]:
    """Why `trainer` cannot run `layout` (empty when it can): a ZeRO stage it lacks; for
    Megatron, torchtitan's per-op recomputation, and uneven stages but at the ends (its
    --decoder-first/last-pipeline-num-layers shorten the first and the last stage only)."""
    out = []
    if layout.zero not in ZERO_OF[trainer]:
        out.append(f"ZeRO {layout.zero} is not {trainer}'s: it runs ZeRO "
                   f"{', '.join(map(str, ZERO_OF[trainer]))} (1: its distributed optimizer)")
    if trainer == MEGATRON:
        out += megatron_memory.problems(layout)
        if model is not None and layout.pp > 2:
            inner = {layout.stage_layers(model, s) for s in range(1, layout.pp - 1)}
            if inner != {layout.most_stage_layers(model)}:
                out.append(f"pp {layout.pp} leaves stages short of "
                           f"{layout.most_stage_layers(model)} layers beside the first and the "
                           "last: Megatron shortens those two only")
    return out


def memory_of(model: ModelSpec, layout: Layout, elt_bytes: int, trainer: str = TORCH
              ) -> torch_memory.Memory:
    """The most a rank of `layout` holds in `trainer`'s step."""
    if trainer == MEGATRON:
        return megatron_memory.megatron_memory(model, layout, elt_bytes)
    return torch_memory.memory(model, layout, elt_bytes)
