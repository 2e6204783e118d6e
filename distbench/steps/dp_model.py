"""dp's model: the stack of distbench.steps.stacks with AdamW, one Trainer per mode, wrapped by
parallel.data_parallel:

- ddp: DDP (gradient buckets of `bucket_cap_mb`) and AdamW;
- zero1: the same DDP with ZeroRedundancyOptimizer over AdamW;
- zero2 / zero3: FSDP2 on every block and on the root, and AdamW on the shards.

Beside each: the same per-rank work with the communication removed (compute-only), the state a
rank holds measured on the tensors themselves, and the check against a single-rank reference
that trains on the whole global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from distbench.parallel.data_parallel import (
    ddp,
    fully_sharded,
    gathered,
    no_allreduce,
    slowed_allreduce,
    zero_redundancy,
)
from distbench.parallel.device_mesh import world_mesh
from distbench.steps.dp_formulas import HALF
from distbench.steps.reference import Reference, TensorPair
from distbench.steps.stacks import StackShape, build_stack

# The check's AdamW: one step moves each parameter by up to LR. Its eps is a share of the
# reference's largest gradient, so that a gradient near zero (whose sign rounding may flip
# between a sharded and a whole computation) moves its parameter by a rounding-sized step, not
# by +-LR. The timed steps use AdamW's own eps and a learning rate of 0 (hold_still).
LR = 1e-2
CHECK_EPS_SHARE = 0.1


def needs_master(dtype: torch.dtype) -> bool:
    """Half-precision training keeps fp32 master weights: AdamW's second moment (g^2 / 1000 on
    the first step) underflows in half precision, and its updates are lost in rounding."""
    return str(dtype).removeprefix("torch.") in HALF


class MasterAdamW(torch.optim.Optimizer):
    """AdamW on fp32 copies of half-precision parameters (the master weights), copied back after
    each step. A chunk of parameters at a time: a chunk's gradients are made fp32 just before it
    steps and dropped just after, so the step holds at most about CHUNK_BYTES of fp32 gradients,
    not a copy of the whole model's (what the planner's memory counts: half-precision
    gradients, fp32 masters and moments). Takes parameter groups, so ZeroRedundancyOptimizer
    can build one per partition."""

    CHUNK_BYTES = 64 * 2**20

    def __init__(self, params, **adamw):
        super().__init__(params, {})
        self.pairs = [(p, p.detach().float().clone()) for g in self.param_groups
                      for p in g["params"]]
        self.chunks: list[tuple[list, torch.optim.Optimizer]] = []
        chunk: list = []
        for pair in self.pairs:
            if chunk and 4 * (sum(m.numel() for _, m in chunk) + pair[1].numel()) \
                    > self.CHUNK_BYTES:
                self.chunks.append((chunk, torch.optim.AdamW([m for _, m in chunk], **adamw)))
                chunk = []
            chunk.append(pair)
        if chunk:
            self.chunks.append((chunk, torch.optim.AdamW([m for _, m in chunk], **adamw)))

    @torch.no_grad()
    def step(self, closure=None):
        for pairs, inner in self.chunks:
            for p, m in pairs:
                m.grad = None if p.grad is None else p.grad.float()
            inner.step()
            for p, m in pairs:
                p.copy_(m)
                m.grad = None  # the fp32 copy of the gradient lives only while its chunk steps


def hold_still(opt: torch.optim.Optimizer) -> None:
    """Learning rate 0 from here on, in `opt` and the optimizers inside it (MasterAdamW's
    chunks, ZeroRedundancyOptimizer's partition): each step still runs every kernel of AdamW,
    but the weights keep the values they were built with, as `plan` times its layer. Training
    on random targets at the check's LR sends a deep model to inf (a 1.2B model of 24 layers:
    NaN after one step), and an H100 multiplies NaNs about 20% faster than numbers (10.05 ms a
    layer as built, 8.57 after that step; benchmarks/layer_alone.py). Steps that train while
    timed would also time a moving target."""
    todo = [opt]
    while todo:
        o = todo.pop()
        for group in o.param_groups:
            group["lr"] = 0.0
        todo += [inner for _, inner in getattr(o, "chunks", ())]
        local = getattr(o, "optim", None)  # ZeroRedundancyOptimizer's, synced from its groups
        if isinstance(local, torch.optim.Optimizer):
            todo.append(local)


def optimizer_class(dtype):
    return MasterAdamW if needs_master(dtype) else torch.optim.AdamW


def adamw(params, device: torch.device, dtype, eps: float = 1e-8) -> torch.optim.Optimizer:
    """AdamW as the mode needs it: on `params` themselves, or on fp32 masters of them."""
    return optimizer_class(dtype)(params, lr=LR, eps=eps, **_fused(device))


def _fused(device: torch.device) -> dict:
    return {"fused": True} if device.type == "cuda" else {}


def local_batch(shape: StackShape, seed: int, rank: int, device, dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's micro-batch and its regression target."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    dims = (shape.micro_batch_size, shape.seq_len, shape.hidden_size)
    return (torch.randn(dims, generator=g).to(device=device, dtype=dtype),
            torch.randn(dims, generator=g).to(device=device, dtype=dtype))


def global_batch(shape: StackShape, seed: int, world: int, dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's micro-batch, concatenated in rank order, on the CPU: the reference's batch."""
    xs, ts = zip(*(local_batch(shape, seed, r, "cpu", dtype) for r in range(world)), strict=True)
    return torch.cat(xs), torch.cat(ts)


def loss_of(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the rank's batch: DDP and FSDP average gradients over ranks, so
    the gradient is that of the mean over the global batch."""
    return F.mse_loss(model(x), target)


def training_step(model: nn.Module, params: list[torch.Tensor], opt: torch.optim.Optimizer,
                  x: torch.Tensor, target: torch.Tensor) -> Callable[[], None]:
    """One step: gradients reset (not accumulated), forward, backward, the optimizer's step."""
    def step() -> None:
        for p in params:
            p.grad = None
        loss_of(model, x, target).backward()
        opt.step()

    return step


@dataclass
class Trainer:
    """One mode, ready to step on this rank's batch."""

    mode: str
    model: nn.Module  # what forward runs: the DDP wrapper, or the FSDP root
    inner: nn.Module  # the stack itself (FSDP swaps gathered parameters in and out of it)
    params: list[torch.Tensor]  # the parameters at rest (FSDP: sharded DTensors)
    names: list[str]
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    target: torch.Tensor

    def __post_init__(self):
        # built once: the timed loop calls it with nothing in between
        self.step = training_step(self.model, self.params, self.optimizer, self.x, self.target)

    def measured_step(self) -> dict[str, int]:
        """One step, with the bytes this rank holds where each kind of state is largest:
        parameters after forward (FSDP without resharding still holds the gathered ones),
        gradients after backward, AdamW's states after the step."""
        for p in self.params:
            p.grad = None
        loss = loss_of(self.model, self.x, self.target)
        params = storage_bytes([*self.params, *self.inner.parameters()])
        loss.backward()
        grads = storage_bytes(p.grad for p in self.params)
        self.optimizer.step()
        states = storage_bytes(optimizer_tensors(self.optimizer))
        return {"parameters": params, "gradients": grads, "optimizer": states}


def storage_bytes(tensors: Iterable) -> int:
    """Bytes of the distinct storages behind `tensors` (a DTensor's local shard; views of one
    bucket or one padded shard counted once)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_tensors(opt: torch.optim.Optimizer) -> list:
    """What an optimizer holds: its states, and master weights where it keeps them."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(opt, ZeroRedundancyOptimizer):
        return optimizer_tensors(opt.optim)
    if isinstance(opt, MasterAdamW):
        return [m for _, m in opt.pairs] + [t for _, inner in opt.chunks
                                            for t in optimizer_tensors(inner)]
    return [t for state in opt.state.values() for t in state.values()]


def build(mode: str, kind: str, shape: StackShape, seed: int, device: torch.device, dtype,
          bucket_mb: float | None, batch: tuple[torch.Tensor, torch.Tensor], eps: float = 1e-8,
          before_allreduce: Callable[[], None] | None = None) -> Trainer:
    """The stack from `seed`, wrapped for `mode`, with its optimizer. `before_allreduce` is the
    session's fault (tests only): it slows DDP's gradient all-reduce through a comm hook."""
    fsdp = mode not in ("ddp", "zero1")
    inner = build_stack(kind, shape, seed, device, dtype)
    if fsdp and needs_master(dtype):
        inner = inner.float()  # FSDP2's shards are the fp32 masters; it computes in dtype
    names = [name for name, _ in inner.named_parameters()]
    if not fsdp:
        hook = None if before_allreduce is None else slowed_allreduce(before_allreduce)
        model = ddp(inner, device, bucket_mb, hook=hook)
        params = list(inner.parameters())
        if mode == "ddp":
            opt = adamw(params, device, dtype, eps)
        else:
            opt = zero_redundancy(params, optimizer_class(dtype), lr=LR, eps=eps,
                                  **_fused(device))
    else:
        shard = fully_sharded(world_mesh(device), mode == "zero3",
                              dtype if needs_master(dtype) else None)
        for block in inner.blocks:
            shard(block)
        model = shard(inner)
        params = list(inner.parameters())
        opt = adamw(params, device, torch.float32, eps)
    return Trainer(mode, model, inner, params, names, opt, *batch)


@dataclass(frozen=True)
class ComputePlan:
    """What compute-only takes from a mode's trainer, so the trainer can be freed first."""

    mode: str
    stepped: list[int] | None  # zero1: the indices of the parameters this rank steps
    shards: list[tuple[tuple[int, ...], torch.dtype]] | None  # FSDP: the rank's shards
    x: torch.Tensor
    target: torch.Tensor


def compute_plan(trainer: Trainer) -> ComputePlan:
    from torch.distributed.tensor import DTensor

    stepped = shards = None
    if trainer.mode == "zero1":
        index = {id(p): i for i, p in enumerate(trainer.params)}
        stepped = sorted(index[id(p)] for g in trainer.optimizer.optim.param_groups
                         for p in g["params"])
    elif trainer.mode not in ("ddp", "zero1"):
        locals_ = [p.to_local() if isinstance(p, DTensor) else p for p in trainer.params]
        shards = [(tuple(t.shape), t.dtype) for t in locals_]
    return ComputePlan(trainer.mode, stepped, shards, trainer.x, trainer.target)


def build_compute_only(plan: ComputePlan, kind: str, shape: StackShape, seed: int,
                       device: torch.device, dtype, bucket_mb: float | None
                       ) -> Callable[[], None]:
    """The same per-rank work as `trainer`'s step with the communication removed:
    - ddp, zero1: the same DDP with torch's no-op comm hook, and AdamW over what the rank steps
      (zero1: its own partition);
    - zero2, zero3: the same blocks unsharded on the rank's batch, and AdamW over tensors shaped
      like the rank's shards."""
    inner = build_stack(kind, shape, seed, device, dtype)
    model: nn.Module = inner
    params = list(inner.parameters())
    if plan.shards is None:
        model = ddp(inner, device, bucket_mb, hook=no_allreduce())
        stepped = params if plan.stepped is None else [params[i] for i in plan.stepped]
        opt = adamw(stepped, device, dtype)
    else:
        shards = []
        for dims, shard_dtype in plan.shards:
            shard = torch.zeros(dims, dtype=shard_dtype, device=device, requires_grad=True)
            shard.grad = torch.zeros_like(shard)
            shards.append(shard)
        opt = adamw(shards, device, plan.shards[0][1])  # fp32 masters, or dtype
    hold_still(opt)  # timed only: its weights stay as built, as the step's do
    return training_step(model, params, opt, plan.x, plan.target)


def single_rank_step(kind: str, shape: StackShape, seed: int, device: torch.device, dtype,
                     batch: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], None]:
    """t1: the whole model with AdamW on one rank, on one rank's batch (weak scaling)."""
    model = build_stack(kind, shape, seed, device, dtype)
    params = list(model.parameters())
    opt = adamw(params, device, dtype)
    hold_still(opt)  # timed only, as the step
    return training_step(model, params, opt, *batch)


# ---------------------------------------------------------------------------------------------
# Correctness: one step of a mode against one step of a single rank on the global batch


# The check's steps: DDP buckets the gradients as configured only from its second step on (the
# first all-reduces them in one bucket), so the compared step is the third, as timed.
CHECK_STEPS = 3


def reference(kind: str, shape: StackShape, seed: int, world: int, dtype) -> Reference:
    """The stack from `seed` on the CPU, CHECK_STEPS steps on every rank's micro-batch at
    once (the same batch each step)."""
    model = build_stack(kind, shape, seed, torch.device("cpu"), dtype)
    batch = global_batch(shape, seed, world, dtype)
    params = list(model.parameters())
    opt, eps = None, 1e-8
    for _ in range(CHECK_STEPS):
        for p in params:
            p.grad = None
        loss_of(model, *batch).backward()
        if opt is None:
            top = max(float(p.grad.abs().max()) for p in params)
            eps = CHECK_EPS_SHARE * top if top > 0 else eps
            opt = adamw(params, torch.device("cpu"), dtype, eps)
        opt.step()
    return Reference({n: p.grad.detach().clone() for n, p in model.named_parameters()},
                     {n: p.detach().clone() for n, p in model.named_parameters()}, eps)


def mode_vs_reference(mode: str, kind: str, shape: StackShape, seed: int, rank: int, world: int,
                      device: torch.device, dtype, bucket_mb: float | None, ref: Reference
                      ) -> list[TensorPair]:
    """CHECK_STEPS steps of `mode` on this rank's share of the reference's batch, from the same
    seed. (name, mode's, reference's) for every gradient of the last step and every parameter
    after it, sharded ones gathered whole, all on the CPU."""
    def whole(t: torch.Tensor) -> torch.Tensor:
        return gathered(t).detach().cpu()

    trainer = build(mode, kind, shape, seed, device, dtype, bucket_mb,
                    local_batch(shape, seed, rank, device, dtype), ref.eps)
    for _ in range(CHECK_STEPS):
        trainer.step()
    pairs: list[TensorPair] = []
    for name, p in zip(trainer.names, trainer.params, strict=True):
        pairs.append((f"{name} gradient", whole(p.grad), ref.grads[name]))
    for name, p in zip(trainer.names, trainer.params, strict=True):
        pairs.append((f"{name} after {CHECK_STEPS} steps", whole(p), ref.params[name]))
    return pairs
