"""Data parallelism's closed forms, pure arithmetic (no torch at import: the command line checks
a model's fit with them before any worker starts): the parameter count Ψ, each mode's bytes on
the wire per step, the ZeRO table of what each rank holds, overlap, and memory needed against
memory there is.

Parameters and gradients are in --dtype (e bytes). AdamW's two states are too in float32 and
float64 (K = 2e); in float16 and bfloat16 the optimizer steps fp32 master weights, so K = 12
(master, two states), which is the ZeRO paper's table (Rajbhandari et al.):
    ddp    (2e + K)Ψ            everything whole
    zero1  2eΨ + KΨ/N           optimizer partitioned (ZeroRedundancyOptimizer)
    zero2  eNΨ' + 4sΨ'          FSDP2 keeping the parameters gathered between forward and
                                backward: the gathered copy, plus its shard, the gradient's
                                shard and two states, each s bytes an element
    zero3  4sΨ'                 FSDP2 resharding after forward: shards only
FSDP2 keeps its shards in fp32 under half precision (s = 4, the master weights) and in --dtype
otherwise (s = e); Ψ' is one rank's shard, each parameter's first dimension split in N and
padded (the gathered copy NΨ' keeps the padding). FSDP2's gradient shards are s bytes, not
e, so its zero2 holds more than the paper's 2Ψ + 14Ψ/N; at N = 2 it ties with zero1 (3eΨ in
float32, 10Ψ in half precision).
"""

from __future__ import annotations

import os

from distbench.core import dtypes


def param_shapes(block: str, hidden: int, ffn: int, layers: int) -> list[tuple[int, int]]:
    """(out, in) of every weight of the stack, in the model's parameter order (no bias)."""
    # planner.models' attention_params and mlp_params, weight by weight
    one = [(ffn, hidden), (hidden, ffn)] if block == "mlp" else [(3 * hidden, hidden),
                                                                (hidden, hidden)]
    return one * layers


def param_count(shapes: list[tuple[int, int]]) -> int:
    return sum(a * b for a, b in shapes)


def shard_count(shapes: list[tuple[int, int]], world: int) -> int:
    """Elements of one rank's FSDP2 shards: dim 0 split in world chunks, padded to equal size."""
    return sum(-(-a // world) * b for a, b in shapes)


def bytes_per_step(mode: str, shapes: list[tuple[int, int]], elt: int, world: int) -> int:
    """Per rank per step, nccl-tests' size of each collective (the larger of its send and receive
    buffers) summed: ddp all-reduces every gradient; zero1 also broadcasts every updated
    parameter from its owner; FSDP all-gathers every (padded) parameter before forward, again
    before backward for zero3, and reduce-scatters every gradient (none on one rank)."""
    whole = param_count(shapes) * elt
    padded = shard_count(shapes, world) * world * elt if world > 1 else 0
    return {"ddp": whole, "zero1": 2 * whole, "zero2": 2 * padded, "zero3": 3 * padded}[mode]


HALF = ("float16", "bfloat16")


def param_byte_sizes(dtype: str) -> tuple[int, int, int]:
    """(e, K, s): bytes of a parameter (and of its gradient), of its optimizer state, and of an
    element of FSDP's shards."""
    from distbench.core.transformer import optimizer_bytes_per_param

    elt = dtypes.element_bytes(dtype)
    return elt, optimizer_bytes_per_param(elt), (4 if dtype in HALF else elt)


def state_bytes(mode: str, shapes: list[tuple[int, int]], dtype: str, world: int) -> float:
    """The table above, in bytes per rank (zero1 partitions by Ψ/N, as the table does)."""
    return _state(mode, param_count(shapes), shard_count(shapes, world), dtype, world)


def _state(mode: str, psi: int, shard: int, dtype: str, world: int) -> float:
    elt, k, shard_elt = param_byte_sizes(dtype)
    return {"ddp": (2 * elt + k) * psi, "zero1": 2 * elt * psi + k * psi / world,
            "zero2": elt * shard * world + 4 * shard_elt * shard,
            "zero3": 4 * shard_elt * shard}[mode]


def overlap_pct(exposed_us: float, comm_alone_us: float) -> tuple[float, str]:
    """100 x (1 - exposed / comm_alone), clamped to 0..100, and a note when it was clamped."""
    if comm_alone_us <= 0:
        return 0.0, "overlap_pct set to 0: no communication to hide"
    pct = 100 * (1 - exposed_us / comm_alone_us)
    if pct < 0:
        return 0.0, (f"overlap_pct clamped from {pct:.0f} to 0: more was exposed than the "
                     "collectives take alone")
    if pct > 100:
        return 100.0, (f"overlap_pct clamped from {pct:.0f} to 100: the step took less than "
                       "compute-only")
    return pct, ""


def need_per_rank(opts, mode: str, world: int) -> int:
    """About what one rank allocates at most for `mode`: the largest of the mode's own state,
    its compute-only replica (the whole model's parameters and gradients with the optimizer
    the rank steps) and the replay's buffers (one per distinct collective size), plus the
    activations of one micro-batch. Per layer times layers: no list as long as --layers."""
    elt, k, shard_elt = param_byte_sizes(opts.dtype)
    layer = param_shapes(opts.block, opts.hidden_size, opts.ffn_size, 1)
    psi = param_count(layer) * opts.layers
    shard = shard_count(layer, world) * opts.layers
    state = _state(mode, psi, shard, opts.dtype, world)
    replica = 2 * elt * psi + ({"ddp": k * psi, "zero1": k * psi / world}.get(
        mode, 4 * shard_elt * shard))
    replay = (psi if mode in ("ddp", "zero1") else
              shard_count(layer, world) * world * (1 + 1 / world)) * elt
    from distbench.core.transformer import attention_activation_bytes, mlp_activation_bytes

    tokens, h = opts.micro_batch_size * opts.seq_len, opts.hidden_size
    per_token = (mlp_activation_bytes(h, opts.ffn_size, False, 1, elt) if opts.block == "mlp"
                 else attention_activation_bytes(h, opts.heads, opts.heads, 1, elt))
    return int(max(state, replica, replay) + 2 * tokens * per_token * opts.layers)


def capacity_per_rank(backend: str, local_ranks: int | None) -> tuple[int | None, str]:
    """Memory one rank may use: a GPU's, or this machine's shared by its local ranks (2 when
    distbench starts them itself on CPU). None when it cannot be told."""
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            return None, ""
        return int(torch.cuda.get_device_properties(0).total_memory), "one GPU"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None, ""
    ranks = local_ranks or 2
    return total // ranks, f"this machine (shared by {ranks} local ranks)"
