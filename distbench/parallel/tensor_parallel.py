"""Tensor parallelism, Megatron's through torch's own styles (torch.distributed.tensor.parallel),
and its sequence-parallel form as torchtitan plans it: one plan per block kind, for tp's stack of
blocks and for a transformer layer of the 3D step, which plan's workers also time alone.

A block's plan: the projection into the block column-wise (the MLP's up and gate, attention's
fused QKV, whose rows are grouped per head so a contiguous row shard holds whole heads), the one
out of it row-wise. Forward, one all-reduce after each row-wise projection; backward, one of
each column-wise projection's input gradient (DTensor's from_local backward makes the partial
input gradient a replicated one). Separate q/k/v projections would cost three backward
all-reduces instead of one.

Sequence-parallel (the layout's sp): the layer's input and output are its TP rank's part of the
sequence (Shard(1)), all-gathered into qkv and, once for up and the gate, at the MLP's gather
point (PrepareModuleInput, a DTensor kept so that the two gradients add up before one
reduce-scatter), and each row-wise output reduce-scattered back to the shards: an all-reduce is a
reduce-scatter and an all-gather, so the bus carries what it carried, split either side of the
layer's work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from distbench.planner.layouts import Layout


def block_plan(kind: str, gated: bool = False, sequence_parallel: bool = False) -> dict:
    """One block's plan, keyed by its projections' names (steps.stacks' MLP and Attention)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    seq = Shard(1) if sequence_parallel else None  # None: the styles' own, replicated
    if kind != "mlp":
        return {"qkv": ColwiseParallel(input_layouts=seq),
                "out": RowwiseParallel(output_layouts=seq)}
    plan = {}
    if sequence_parallel:
        plan["gather"] = PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate())
    plan.update(up=ColwiseParallel(), down=RowwiseParallel(output_layouts=seq))
    if gated:
        plan["gate"] = ColwiseParallel()
    return plan


def stack_plan(kind: str, layers: int) -> dict:
    """tp's stack: `layers` blocks of one kind (Stack.blocks), none sequence-parallel."""
    return {f"blocks.{i}.{name}": style for i in range(layers)
            for name, style in block_plan(kind).items()}


def layer_plan(gated: bool = False, sequence_parallel: bool = False) -> dict:
    """One transformer layer (attention then MLP): its attention's plan, then its MLP's."""
    return {f"{part}.{name}": style
            for part, kind in (("attn", "attention"), ("mlp", "mlp"))
            for name, style in block_plan(kind, gated, sequence_parallel).items()}


def shard_stack(model: nn.Module, kind: str, layers: int, mesh) -> nn.Module:
    """tp's stack sharded in place over the 1-D `mesh` (on the meta device too: nothing is
    gathered)."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, stack_plan(kind, layers))


def shard_layer(layer: nn.Module, mesh, gated: bool, sequence_parallel: bool) -> nn.Module:
    """One transformer layer sharded in place over the TP dimension `mesh`."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(layer, mesh, layer_plan(gated, sequence_parallel))


def sequence_shard(t: torch.Tensor, layout: Layout, tp_rank: int) -> torch.Tensor:
    """`t` (samples, sequence, hidden) as TP rank `tp_rank` holds it: its part of the sequence
    with sequence parallelism (a copy: the whole goes), else the whole."""
    if not layout.sequence_parallel:
        return t
    return t.chunk(layout.tp, dim=1)[tp_rank].clone()


def sequence_loss(layout: Layout):
    """The step's loss on what a rank holds: the mean squared error, divided by tp where each
    TP rank holds a part of the sequence, so that the TP ranks' losses add up to the whole
    batch's mean (equal parts: the mean of the parts' means) and backward, which sums each
    rank's share through the reduce-scatters, gives the whole mean's gradients."""
    if not layout.sequence_parallel:
        return F.mse_loss
    tp = layout.tp

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target) / tp

    return loss
