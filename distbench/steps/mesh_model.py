"""One training step of planner.models' transformer stack laid out on a 3-D device mesh, composed
the way torchtitan composes torch's own APIs, each through distbench.parallel:

1. the mesh: (pp, dp, tp), tp fastest, fresh for each layout (parallel.device_mesh), its
   groups destroyed once the layout is done;
2. each rank builds only its pipeline stage's layers, layer i's weights from (seed, i), in a
   ModuleDict keyed by the global index, so parameter names are the whole model's;
3. TP on mesh["tp"], layer by layer (parallel.tensor_parallel's plan); with sequence
   parallelism (the layout's sp, on by default), the residual stream, the stage's input and
   output, the samples and the targets sharded along the sequence over the TP ranks;
4. DP on mesh["dp"] (parallel.data_parallel): zero 0 DDP, zero 1 DDP with
   ZeroRedundancyOptimizer, zero 2 / 3 FSDP2 (per layer, then the stage);
5. PP on mesh["pp"] (parallel.pipeline): a PipelineStage around the DP-wrapped stage and 1F1B
   with an MSE loss; interleaved (v virtual stages), one PipelineStage per chunk of the rank's
   layers (stage index rank + k x pp, planner.layouts.rank_chunks: pp need not divide the
   layers, the ends hold fewer), each chunk DP-wrapped on its own as torchtitan wraps its
   model parts; with pp 1, the micro-batches are accumulated by hand. The gradients are
   synchronised as the layout's grad_sync says: after every micro-batch (FSDP2's default) or
   on the last one only (DDP no_sync, FSDP set_requires_gradient_sync(False));
6. AdamW (ZeroRedundancyOptimizer's inner optimizer at zero 1).

Beside it: the single-rank reference the check compares with, and the same per-rank work with no
communication (compute-only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distbench.bench import timing
from distbench.parallel.data_parallel import (
    accumulate,
    fully_sharded,
    gathered,
    wrap_stage,
    zero_redundancy,
)
from distbench.parallel.device_mesh import layout_mesh
from distbench.parallel.pipeline import torch_schedule, torch_stages
from distbench.parallel.tensor_parallel import sequence_loss, sequence_shard, shard_layer
from distbench.planner.layouts import Layout, rank_chunks
from distbench.planner.models import ModelSpec
from distbench.steps.dp_model import (
    CHECK_EPS_SHARE,
    LR,
    adamw,
    needs_master,
    optimizer_class,
    optimizer_tensors,
    storage_bytes,
)
from distbench.steps.reference import Reference, TensorPair
from distbench.steps.stacks import MLP, Attention

SEED = 1234


# ---------------------------------------------------------------------------------------------
# The model


class Layer(nn.Module):
    """Attention then MLP, each adding its own residual (steps.stacks' blocks). Recomputation
    (torch.utils.checkpoint, non-reentrant, as torchtitan applies it): full checkpoints the
    whole layer, keeping only its input; selective the attention core; op the whole layer
    under torchtitan's per-op policy (op_contexts), which keeps some ops' outputs and reruns
    the rest in backward."""

    def __init__(self, model: ModelSpec, tp: int = 1, recompute: str = "none"):
        super().__init__()
        self.recompute = recompute
        core = _checkpointed if recompute == "selective" else None
        self.attn = Attention(model.hidden_size, model.head_dim * (model.heads // tp),
                              model.head_dim, model.head_dim * (model.kv_heads // tp), core)
        self.mlp = MLP(model.hidden_size, model.ffn_size // tp, model.gated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full":
            return _checkpointed(self._layer, x)
        if self.recompute == "op":
            return _checkpointed(self._layer, x, context_fn=op_contexts)
        return self._layer(x)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


def _checkpointed(fn, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


def _op_sets() -> tuple[frozenset, frozenset]:
    """(the matmuls, the other ops whose outputs op_contexts keeps): the fused attention kernels,
    the CPU's among them (torchtitan lists only the GPUs'), whose output backward cannot have
    without rerunning the attention; and the reduce-scatter, kept rather than run again in
    backward (torchtitan keeps it too). aten.linear where a backend does not decompose it."""
    aten = torch.ops.aten
    mm = frozenset({aten.mm.default, aten.linear.default})
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_fused_attention_overrideable")
    kept = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    kept.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return mm, frozenset(kept)


def op_contexts():
    """torch.utils.checkpoint's contexts for one layer's forward under torchtitan's per-op
    selective recomputation (its _apply_op_sac): the outputs of the odd matmuls (the 1st, the
    3rd, ...) and of op_sets' ops kept, everything else recomputed in backward. The count
    starts again with each layer's forward, and the recomputation counts its own, so both
    take the same matmuls."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    mm, kept = _op_sets()
    counts = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func in mm:
            counts[ctx.is_recompute] += 1
            keep = counts[ctx.is_recompute] % 2 == 1
        else:
            keep = func in kept
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Stage(nn.Module):
    """Layers keyed by their global index (torchtitan's ModuleDict): a parameter is named as in
    the whole model, whichever stage holds it."""

    def __init__(self, layers: dict[str, nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


def make_layer(model: ModelSpec, index: int, device, dtype, tp: int = 1,
               recompute: str = "none") -> Layer:
    """Layer `index`, its weights from (SEED, index) alone, so any rank builds the same one;
    tp > 1 builds a shard's shapes (compute-only: the values do not matter there)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED * 1000 + index)
        layer = Layer(model, tp, recompute)
    return layer.to(device=device, dtype=dtype)


def make_stage(model: ModelSpec, indices, device, dtype, tp: int = 1,
               recompute: str | dict[int, str] = "none") -> Stage:
    """The layers `indices`; `recompute` one kind for all, or each layer's (layer_recompute)."""
    kinds = recompute if isinstance(recompute, dict) else dict.fromkeys(indices, recompute)
    return Stage({str(i): make_layer(model, i, device, dtype, tp, kinds[i]) for i in indices})


def layer_recompute(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[int, str]:
    """The recomputation of each layer pipeline rank `pp_rank` holds: the layout's, but with
    full recomputation of k layers (recompute_layers) only the first k of each of its chunks,
    the rest none (Megatron's --recompute-method block, whose k counts per model chunk)."""
    out = {}
    for _, layers in rank_chunks(model.layers, pp_rank, layout.pp, layout.virtual_stages):
        k = layout.recomputed_layers(len(layers))
        for position, i in enumerate(layers):
            full = layout.recompute != "full" or position < k
            out[i] = layout.recompute if full else "none"
    return out


def samples(model: ModelSpec, first: int, count: int, device, dtype, targets: bool = False
            ) -> torch.Tensor:
    """Samples first .. first + count - 1 of the step (or their regression targets), sample i
    drawn from a generator of its own: a replica makes its share alone, the single-rank reference
    the whole batch, and both hold the same values. Drawn on the CPU one sample at a time, so the
    host holds one sample beside the device's share."""
    out = torch.empty((count, model.seq_len, model.hidden_size), device=device, dtype=dtype)
    for j in range(count):
        g = torch.Generator().manual_seed(SEED * 1_000_003 + 2 * (first + j) + targets)
        out[j].copy_(torch.randn((model.seq_len, model.hidden_size), generator=g))
    return out


# ---------------------------------------------------------------------------------------------
# One layout on a fresh mesh


@dataclass
class MeshModel:
    """This rank's part of one layout, ready to step."""

    layout: Layout
    mesh: object  # the DeviceMesh
    stage: Stage  # all this rank's layers (TP-sharded, DP-wrapped in place by FSDP)
    model: nn.Module  # what forward runs without a pipeline: the DDP wrapper, or the stage
    optimizer: torch.optim.Optimizer
    # this replica's samples (all micro-batches) on the first stage, its targets on the last;
    # with sequence parallelism, this TP rank's part of their sequence
    x: torch.Tensor | None
    target: torch.Tensor | None
    schedule: object | None  # Schedule1F1B (ScheduleInterleaved1F1B) when pp > 1
    localized: dict = field(default_factory=dict)  # name -> DTensor spec (TP under DDP)
    loss: torch.Tensor | None = None  # the last step's, on the last stage

    def __post_init__(self):
        # taken before any forward: what DDP and the optimizer hold (with TP under DDP, torch
        # swaps new parameter objects into the module around every forward)
        named = list(self.stage.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.pp_rank = self.mesh["pp"].get_local_rank()
        self.first = self.pp_rank == 0
        # the rank that holds the model's last stage (its last chunk, interleaved)
        self.last = self.pp_rank == self.layout.pp - 1

    def forward_backward(self) -> None:
        for p in self.params:
            p.grad = None
        if self.schedule is None:
            self.loss = accumulate(self.model, self.layout, self.x, self.target,
                                   sequence_loss(self.layout))
            return
        losses: list | None = [] if self.last else None
        args = (self.x,) if self.first else ()
        self.schedule.step(*args, target=self.target if self.last else None, losses=losses)
        if self.last:
            self.loss = torch.stack([t.detach() for t in losses]).mean()

    def step(self) -> None:
        self.forward_backward()
        self.optimizer.step()

    def whole_loss(self) -> torch.Tensor:
        """The replica's loss on the last stage: with sequence parallelism each TP rank holds
        its part's, summed here over the TP group (every rank of it calls this)."""
        loss = self.loss.detach().reshape(1).float()
        if self.layout.sequence_parallel:
            dist.all_reduce(loss, group=self.mesh["tp"].get_group())
        return loss

    def whole(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A parameter or gradient whole, on the CPU: a DTensor (TP, FSDP) gathered, a TP shard
        that DDP holds as a plain tensor made a DTensor again first. Collective over the tensor's
        mesh: every rank of the stage calls it for the same names in the same order."""
        t = gathered(t, self.localized.get(name))
        return t.detach().cpu().clone()  # a copy: the next steps train on in place

    def state_bytes(self) -> int:
        """Parameters, gradients and optimizer states this rank holds (its shards)."""
        return (storage_bytes(self.params) + storage_bytes(p.grad for p in self.params)
                + storage_bytes(optimizer_tensors(self.optimizer)))

    def optimizer_shards(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """The shapes of what this rank's optimizer steps (ZeRO-1: its partition; FSDP: its
        shards), for compute-only."""
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.distributed.tensor import DTensor

        opt = self.optimizer
        inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
        out = []
        for group in inner.param_groups:
            for p in group["params"]:
                local = p.to_local() if isinstance(p, DTensor) else p
                out.append((tuple(local.shape), local.dtype))
        return out


def build(model: ModelSpec, layout: Layout, device: torch.device, dtype, eps: float = 1e-8,
          mesh=None) -> MeshModel:
    """This rank's part of `layout` on `mesh` (a fresh one when None), from SEED."""
    t, p = layout.tp, layout.pp
    mesh = mesh if mesh is not None else layout_mesh(layout, device)
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    chunks = rank_chunks(model.layers, pp_rank, p, layout.virtual_stages)
    shard = _fsdp(layout, mesh, dtype)
    built = torch.float32 if shard is not None and needs_master(dtype) else dtype
    kinds = layer_recompute(model, layout, pp_rank)
    layers = {}
    for i in rank_layers(model, layout, pp_rank):
        # whole one layer at a time: the stage whole would not fit where it runs
        layer = make_layer(model, i, device, built, recompute=kinds[i])
        if t > 1:
            shard_layer(layer, mesh["tp"], model.gated, layout.sequence_parallel)
        if shard is not None:
            shard(layer)
        layers[str(i)] = layer
    stage = Stage(layers)
    # each chunk a Stage of the same layer modules: the rank's Stage names every parameter as
    # the whole model does, the chunks are what the pipeline runs and DP wraps
    parts = [Stage({str(i): layers[str(i)] for i in r}) for _, r in chunks] \
        if len(chunks) > 1 else [stage]
    localized: dict = {}
    wrapped = []
    for part in parts:
        w, loc = wrap_stage(part, layout, mesh, device, shard)
        wrapped.append(w)
        localized.update(loc)
    opt = _optimizer(stage, layout, mesh, device, dtype, eps)
    schedule = None
    if p > 1:
        parts = [(index, w) for w, (index, _) in zip(wrapped, chunks, strict=True)]
        pipes = torch_stages(parts, p * layout.virtual_stages, device, mesh["pp"].get_group(),
                             layout.syncs_every_micro_batch)
        schedule = torch_schedule(layout.schedule, pipes, layout.micro_batches,
                                  sequence_loss(layout))
    x, target = replica_inputs(model, layout, pp_rank, dp_rank, device, dtype,
                               mesh["tp"].get_local_rank())
    return MeshModel(layout, mesh, stage, wrapped[0], opt, x, target, schedule, localized)


def rank_layers(model: ModelSpec, layout: Layout, pp_rank: int) -> list[int]:
    """The global indices of the layers pipeline rank `pp_rank` holds, in every chunk."""
    return [i for _, r in rank_chunks(model.layers, pp_rank, layout.pp, layout.virtual_stages)
            for i in r]


def replica_inputs(model: ModelSpec, layout: Layout, pp_rank: int, dp_rank: int, device,
                   dtype, tp_rank: int = 0) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What a rank is fed for the whole step: its replica's share of the samples where they
    enter (the first stage) and of the targets where the loss is taken (the last), with
    sequence parallelism its TP rank's part of their sequence; None where it uses neither (a
    middle stage)."""
    share = model.batch // layout.dp
    first = dp_rank * share
    x = target = None
    if pp_rank == 0:
        x = sequence_shard(samples(model, first, share, device, dtype), layout, tp_rank)
    if pp_rank == layout.pp - 1:
        target = sequence_shard(samples(model, first, share, device, dtype, targets=True),
                                layout, tp_rank)
    return x, target


def _fsdp(layout: Layout, mesh, dtype) -> Callable[[nn.Module], object] | None:
    """fully_shard on mesh["dp"] as the layout's ZeRO stage asks (2: reshard_after_forward
    false, 3: true; computing in half precision on fp32 masters), or None below ZeRO 2."""
    if layout.dp == 1 or layout.zero < 2:
        return None
    return fully_sharded(mesh["dp"], layout.zero == 3, dtype if needs_master(dtype) else None)


def _optimizer(stage: Stage, layout: Layout, mesh, device: torch.device, dtype, eps: float
               ) -> torch.optim.Optimizer:
    params = list(stage.parameters())
    fused = {"fused": True} if device.type == "cuda" else {}
    if layout.dp > 1 and layout.zero == 1:
        return zero_redundancy(params, optimizer_class(dtype), mesh["dp"].get_group(), lr=LR,
                               eps=eps, **fused)
    # FSDP's shards are fp32 masters in half precision: plain AdamW on them
    cls = torch.optim.AdamW if layout.dp > 1 and layout.zero >= 2 else optimizer_class(dtype)
    return cls(params, lr=LR, eps=eps, **fused)


# ---------------------------------------------------------------------------------------------
# Compute-only: the rank's own work with no communication


@dataclass
class ComputeOnly:
    """The rank's TP-sharded layers as plain modules: its M micro-batches forward and backward
    (the last stage through the loss, the others fed a gradient as the pipeline feeds them),
    then AdamW over tensors shaped as what the rank's optimizer steps. `forward_backward` sums
    the forward and backward part, for the bubble."""

    stage: Stage
    first: bool
    last: bool
    micro: list[tuple[torch.Tensor, torch.Tensor]]
    optimizer: torch.optim.Optimizer
    forward_backward: timing.Spans  # on the device's clock: CUDA events on a GPU

    def step(self) -> None:
        self.forward_backward.start()
        for p in self.stage.parameters():
            p.grad = None
        for x, other in self.micro:
            y = self.stage(x)
            if self.last:
                (F.mse_loss(y, other) / len(self.micro)).backward()
            else:
                y.backward(other)
        self.forward_backward.stop()
        self.optimizer.step()


def build_compute_only(model: ModelSpec, layout: Layout, pp_rank: int, shards: list,
                       device: torch.device, dtype) -> ComputeOnly:
    indices = rank_layers(model, layout, pp_rank)
    stage = make_stage(model, indices, device, dtype, layout.tp,
                       layer_recompute(model, layout, pp_rank))
    first, last = pp_rank == 0, pp_rank == layout.pp - 1
    g = torch.Generator().manual_seed(SEED + 1)
    dims = (layout.micro_batch_size(model), model.seq_len, model.hidden_size)
    micro = []
    for _ in range(layout.micro_batches):
        x = torch.randn(dims, generator=g).to(device=device, dtype=dtype)
        other = torch.randn(dims, generator=g).to(device=device, dtype=dtype)
        micro.append((x if first else x.requires_grad_(True), other))
    tensors = []
    for dims_, shard_dtype in shards:
        t = torch.zeros(dims_, dtype=shard_dtype, device=device, requires_grad=True)
        t.grad = torch.zeros_like(t)
        tensors.append(t)
    opt_dtype = shards[0][1] if shards else dtype
    return ComputeOnly(stage, first, last, micro, adamw(tensors, device, opt_dtype),
                       timing.Spans(device))


# ---------------------------------------------------------------------------------------------
# The check: one step against the whole model on the whole batch on one rank


def reference(model: ModelSpec, dtype) -> Reference:
    """The whole stack on the whole batch on the CPU, one step. AdamW's eps is a share of the
    largest gradient, as dp's check takes it (a gradient near zero, whose sign rounding may flip,
    then moves its parameter by a rounding-sized step, not by +-lr)."""
    cpu = torch.device("cpu")
    whole = make_stage(model, range(model.layers), cpu, dtype)
    x = samples(model, 0, model.batch, cpu, dtype)
    target = samples(model, 0, model.batch, cpu, dtype, targets=True)
    loss = F.mse_loss(whole(x), target)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in whole.named_parameters()}
    top = max(float(g.abs().max()) for g in grads.values())
    eps = CHECK_EPS_SHARE * top if top > 0 else 1e-8
    adamw(list(whole.parameters()), cpu, dtype, eps).step()
    params = {n: p.detach().clone() for n, p in whole.named_parameters()}
    return Reference(grads, params, eps, loss=float(loss.detach()))


def check_step(mm: MeshModel, ref: Reference, dp_mean: Callable[[torch.Tensor], torch.Tensor]
               ) -> list[TensorPair]:
    """One step of `mm` from the seed: (name, distributed, reference) for every gradient and
    every parameter after the step of this rank's layers, and the loss on the last stage
    (averaged over the replicas by `dp_mean`)."""
    mm.forward_backward()
    pairs: list[TensorPair] = []
    for name, p in zip(mm.names, mm.params, strict=True):
        pairs.append((f"{name} gradient", mm.whole(name, p.grad), ref.grads[name]))
    if mm.last:
        loss = dp_mean(mm.whole_loss())
        pairs.append(("loss", loss.cpu(), torch.tensor([ref.loss])))
    mm.optimizer.step()
    for name, p in zip(mm.names, mm.params, strict=True):
        pairs.append((f"{name} after the step", mm.whole(name, p), ref.params[name]))
    return pairs
