"""tp's model: the stack of distbench.steps.stacks, tensor-parallel as production code applies
it: built on the meta device, sharded by parallel.tensor_parallel's plan (MLP: up column-wise,
down row-wise; attention: the fused QKV column-wise, out row-wise), and only then each rank's
shard materialised, as torchtitan does, so a model that needs TP to fit never exists whole on one
GPU. Beside it, its closed forms (parameters, FLOPs and all-reduced bytes per rank).

The same model classes with per-rank shard shapes and no DTensor make the compute-only
baseline; with full shapes on rank 0 alone, the scaling view's t1; and at the check's small
shape, on the CPU, the single-rank reference.
"""

from __future__ import annotations

import copy
import math

import torch

from distbench.parallel.data_parallel import gathered
from distbench.parallel.tensor_parallel import shard_stack
from distbench.steps.reference import TensorPair
from distbench.steps.stacks import (
    Stack,
    StackShape,
    build_stack,
    make_inputs,
    make_stack,
    make_step,
)
from distbench.steps.vocabulary import BLOCKS

# One reference forward+backward (and the TP one) on the configured shapes costs this much at
# most; larger configurations are checked on small_shape() instead.
CHECK_MAX_FLOPS = 2e9


def small_shape(world: int) -> StackShape:
    """A configuration that every world size can split: 2 heads of 16 per rank, ffn 64/rank."""
    heads = 2 * world
    return StackShape(hidden_size=16 * heads, ffn_size=64 * world, heads=heads, seq_len=8,
                      micro_batch_size=2, layers=2)


# ------------------------------------------------------------------------------------------
# Formulas (pure arithmetic: unit-tested)
# ------------------------------------------------------------------------------------------

def params_per_rank(kind: str, shape: StackShape, world: int) -> int:
    """Weights of this rank's shard of the `layers` blocks (no bias)."""
    from distbench.core.transformer import attention_params, mlp_params

    h = shape.hidden_size
    per_layer = (mlp_params(h, shape.ffn_size, False) if kind == "mlp"
                 else attention_params(h, shape.heads, shape.heads))
    return per_layer * shape.layers // world


def flops_per_rank(kind: str, shape: StackShape, world: int) -> float:
    """Forward+backward model FLOPs of this rank's shard per step: 3 x 2 x params x tokens for
    the linear layers (backward is twice the forward), plus, for attention, the score (QK^T)
    and value (PV) matmuls on the rank's heads: 2 x 2 x b x s^2 x h/n forward, times 3. Model
    FLOPs, not executed ones: flash and memory-efficient attention recompute QK^T backward."""
    linear = 3 * 2 * params_per_rank(kind, shape, world) * shape.tokens
    if kind == "mlp":
        return float(linear)
    s = shape.seq_len
    attn = 3 * 2 * 2 * shape.micro_batch_size * s * s * (shape.hidden_size // world)
    return float(linear + attn * shape.layers)


def allreduce_bytes(kind: str, shape: StackShape, elt: int, world: int) -> int:
    """Bytes all-reduced per step per rank: forward, one (b, s, h) per row-parallel projection;
    backward, one (b, s, h) per column-parallel input gradient. Two per layer, the same for
    both block kinds (the fused QKV projection is one column-parallel layer). None on 1 rank."""
    if world == 1:
        return 0
    return 2 * shape.layers * shape.tokens * shape.hidden_size * elt


def comm_fraction(step_s: float, compute_s: float) -> tuple[float, bool]:
    """1 - compute_only/step, clamped at 0 (and whether it was clamped)."""
    if step_s <= 0:
        return 0.0, True
    frac = 1.0 - compute_s / step_s
    return (0.0, True) if frac < 0 else (frac, False)


def implied_busbw_gbps(ar_bytes: int, world: int, step_s: float, compute_s: float
                       ) -> float | None:
    """All-reduce bus bandwidth if all of (step - compute_only) were the all-reduces, in decimal
    GB/s with nccl-tests' all_reduce factor 2(n-1)/n. None when step <= compute_only."""
    exposed = step_s - compute_s
    if exposed <= 0 or ar_bytes <= 0:
        return None
    return ar_bytes * 2 * (world - 1) / world / exposed / 1e9


def scaling(t1_s: float, tn_s: float, world: int) -> tuple[float, float]:
    """speedup = t1 / tn, efficiency = t1 / (n x tn)."""
    speedup = t1_s / tn_s
    return speedup, speedup / world


def check_shape(shape: StackShape, world: int) -> tuple[StackShape, bool]:
    """The configured shapes when one full forward+backward of both blocks is cheap, else the
    small configuration. Second value: whether the configured shapes are used."""
    cost = sum(flops_per_rank(kind, shape, 1) for kind in BLOCKS)
    if cost <= CHECK_MAX_FLOPS:
        return shape, True
    return small_shape(world), False


# ------------------------------------------------------------------------------------------
# Sharding
# ------------------------------------------------------------------------------------------

def apply_tp(full: Stack, kind: str, shape: StackShape, mesh, device=None) -> Stack:
    """A deep copy of `full` (on `device` when given), sharded by the TP plan: full
    stays the reference. For the check's small shapes; the timed model is build_sharded's."""
    model = copy.deepcopy(full)
    if device is not None:
        model = model.to(device)
    return shard_stack(model, kind, shape.layers, mesh)


def init_weights(model: Stack, seed: int) -> None:
    """Weights for a stack materialised from the meta device, shard by shard, at nn.Linear's
    own scale. The timed steps depend on their being finite, not on their values: the check
    builds its own weights from the seed."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            local = p.to_local() if isinstance(p, DTensor) else p
            gen = torch.Generator(device=local.device).manual_seed(seed + i)
            bound = 1 / math.sqrt(p.shape[-1])  # the global in_features
            local.uniform_(-bound, bound, generator=gen)


def build_sharded(kind: str, shape: StackShape, mesh, device, dtype, seed: int) -> Stack:
    """The TP stack with only this rank's shards ever allocated."""
    with torch.device("meta"):
        model = make_stack(kind, shape).to(dtype)
    model = shard_stack(model, kind, shape.layers, mesh)
    model.to_empty(device=device)
    init_weights(model, seed)
    return model


def build_local_shard(kind: str, shape: StackShape, world: int, device, dtype,
                      seed: int) -> Stack:
    """Plain modules of this rank's shard shapes: the same computation as TP minus its
    communication (compute-only), without the whole model ever being built."""
    with torch.device("meta"):
        model = make_stack(kind, shape, shards=world).to(dtype)
    model.to_empty(device=device)
    init_weights(model, seed)
    return model


# ------------------------------------------------------------------------------------------
# Correctness: TP against the single-rank reference from the same seed
# ------------------------------------------------------------------------------------------

def tp_vs_reference(kind: str, shape: StackShape, seed: int, device, dtype, mesh
                    ) -> list[TensorPair]:
    """One forward+backward of the sharded stack and of the unsharded reference, on the same
    input. The reference is built and run on the CPU (the check's small shape keeps that
    cheap), so no GPU ever holds the whole model twice; the sharded stack is a copy of it on
    `device`. (name, tp, reference) for the output, the input gradient and every weight
    gradient (the sharded ones gathered whole), all on the CPU."""
    cpu = torch.device("cpu")
    ref = build_stack(kind, shape, seed, cpu, dtype)
    tp = apply_tp(ref, kind, shape, mesh, device)
    x, dy = make_inputs(shape, seed, device, dtype)
    x_ref, dy_ref = make_inputs(shape, seed, cpu, dtype)
    y = make_step(tp, x, dy)().detach().cpu()
    y_ref = make_step(ref, x_ref, dy_ref)().detach()
    pairs = [("output", y, y_ref), ("input gradient", x.grad.cpu(), x_ref.grad)]
    for (name, p), (_, p_ref) in zip(tp.named_parameters(), ref.named_parameters(), strict=True):
        pairs.append((f"{name} gradient", gathered(p.grad).cpu(), p_ref.grad))
    return pairs
