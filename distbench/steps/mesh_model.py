"""One training step of planner.models' transformer stack laid out on a 3-D device mesh, composed
the way torchtitan composes torch's own APIs:

1. the mesh: init_device_mesh(device, (pp, dp, tp)) with dimensions named pp, dp and tp (made
   unique per mesh: FreshMesh), tp fastest, its groups destroyed once the layout is done;
2. each rank builds only its pipeline stage's layers, layer i's weights from (seed, i), in a
   ModuleDict keyed by the global index, so parameter names are the whole model's;
3. TP: parallelize_module on mesh["tp"], column-wise qkv, up and the gate, row-wise out and
   down; with sequence parallelism (the layout's sp, on by default), torchtitan's plan: the
   residual stream, the stage's input and output, the samples and the targets sharded along
   the sequence over the TP ranks (local tensors), gathered into qkv and the MLP, and the
   row-wise outputs reduce-scattered back to the shards;
4. DP on mesh["dp"]: zero 0 DDP, zero 1 DDP with ZeroRedundancyOptimizer, zero 2 / 3 FSDP2
   (fully_shard per layer, then the stage; reshard_after_forward false / true);
5. PP on mesh["pp"]: a PipelineStage around the DP-wrapped stage and Schedule1F1B with an MSE
   loss; interleaved (v virtual stages), one PipelineStage per chunk of the rank's layers
   (stage index rank + k x pp, planner.layouts.rank_chunks: pp need not divide the layers,
   the ends hold fewer), each chunk DP-wrapped on its own as torchtitan wraps its model parts,
   and ScheduleInterleaved1F1B; with pp 1, the micro-batches are accumulated by hand. The
   gradients are synchronised as the layout's grad_sync says: after every micro-batch (FSDP2's
   default) or on the last one only (DDP no_sync, FSDP set_requires_gradient_sync(False));
6. AdamW (ZeroRedundancyOptimizer's inner optimizer at zero 1).

Beside it: the single-rank reference the check compares with, and the same per-rank work with no
communication (compute-only).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distbench.bench import timing
from distbench.planner.layouts import Layout, rank_chunks
from distbench.planner.models import ModelSpec
from distbench.steps.dp_model import (
    CHECK_EPS_SHARE,
    LR,
    ddp,
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


def layer_tp_plan(gated: bool = False, sequence_parallel: bool = False) -> dict:
    """One layer's TP plan (Megatron's): qkv, up and the gate column-wise, out and down
    row-wise: an all-reduce after each row-wise layer in forward, and of the block input's
    gradient in backward. Sequence-parallel (torchtitan's plan, torch's styles): the layer's
    input and output are its TP rank's part of the sequence (Shard(1)), all-gathered into qkv
    and, once for up and the gate, at the MLP's gather point (PrepareModuleInput, a DTensor
    kept so that the two gradients add up before one reduce-scatter), and each row-wise
    output reduce-scattered back to the shards: an all-reduce is a reduce-scatter and an
    all-gather, so the bus carries what it carried, split either side of the layer's work."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    if not sequence_parallel:
        plan = {"attn.qkv": ColwiseParallel(), "attn.out": RowwiseParallel(),
                "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    else:
        seq = Shard(1)
        plan = {"attn.qkv": ColwiseParallel(input_layouts=seq),
                "attn.out": RowwiseParallel(output_layouts=seq),
                "mlp.gather": PrepareModuleInput(input_layouts=seq,
                                                 desired_input_layouts=Replicate()),
                "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=seq)}
    if gated:
        plan["mlp.gate"] = ColwiseParallel()
    return plan


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
        from torch.distributed.tensor import DTensor

        spec = self.localized.get(name)
        if spec is not None and not isinstance(t, DTensor):
            t = DTensor.from_local(t, spec.mesh, spec.placements, run_check=False,
                                   shape=spec.shape, stride=spec.stride)
        if isinstance(t, DTensor):
            with _quiet_redistribute():
                t = t.full_tensor()
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


@contextmanager
def _quiet_redistribute():
    """Gathering a TP + FSDP tensor whole takes two all-gathers, and torch warns on every rank
    that one would be faster: true, and beside the point of a check that runs once."""
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def accumulate(model: nn.Module, layout: Layout, x: torch.Tensor, target: torch.Tensor,
               loss_fn=F.mse_loss) -> torch.Tensor:
    """pp 1: the micro-batches one after another, each loss divided by their count (the mean of
    equal means is the whole mean), gradients synchronised across replicas after each one
    (grad_sync micro: FSDP2 reduce-scatters them, DDP all-reduces) or on the last only (DDP's
    no_sync, FSDP2's set_requires_gradient_sync(False) before it)."""
    from contextlib import nullcontext

    m = layout.micro_batches
    every = layout.grad_sync == "micro"
    xs, ts = x.chunk(m), target.chunk(m)
    sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2
    total = torch.zeros((), dtype=x.dtype, device=x.device)
    for j in range(m):
        syncs = every or j == m - 1
        if sync is not None:
            sync(syncs)
        no_sync = getattr(model, "no_sync", None)  # DDP
        with nullcontext() if syncs or no_sync is None else no_sync():
            loss = loss_fn(model(xs[j]), ts[j])
            (loss / m).backward()
        total += loss.detach() / m
    return total


_STAGE_CLASSES: dict = {}


def pipeline_stage_class(layout: Layout):
    """torch's PipelineStage, or, where the layout syncs the gradients of every micro-batch
    (grad_sync micro, with replicas), one whose DP wrapper does so. torch 2.13's stage holds
    them to the last backward itself (backward_maybe_with_nosync): DDP under no_sync but there,
    FSDP2 with set_requires_gradient_sync(False) before every backward, its gradients then
    reduce-scattered once by perform_reduce_grad. This one runs every backward as DDP's last
    (prepare_for_backward, then the all-reduce), and as FSDP2 runs a backward of its own (the
    sync on, the backward finalized), so each micro-batch's gradients are reduced as they
    come and the sharded gradients accumulate; the stage stays gathered between micro-batches
    as torch's schedule keeps it (reshard_after_backward false; perform_reduce_grad reshards
    and scales at the end)."""
    from torch.distributed.pipelining import PipelineStage

    if not layout.syncs_every_micro_batch:
        return PipelineStage
    if "micro" not in _STAGE_CLASSES:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.pipelining._backward import stage_backward

        class EveryMicroBatch(PipelineStage):
            def backward_maybe_with_nosync(self, backward_type, bwd_kwargs,
                                           last_backward=False):
                if backward_type != "full":  # the split backwards of zero-bubble schedules
                    return super().backward_maybe_with_nosync(backward_type, bwd_kwargs,
                                                              last_backward)
                if isinstance(self.submod, FSDPModule):
                    self.submod.set_is_last_backward(True)
                    self.submod.set_reshard_after_backward(False)
                    self.submod.set_requires_gradient_sync(True)
                    return stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                          bwd_kwargs["input_values"]), None
                # DDP rebuilds its buckets from the order the first synced backward readied
                # the parameters in, at its next forward; two synced backwards of one chunk
                # with no forward between (interleaved 1F1B) would record the order twice
                # and fail its assert, so it rebuilds here first, as that forward would
                self.submod.reducer._rebuild_buckets()
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, True)

        _STAGE_CLASSES["micro"] = EveryMicroBatch
    return _STAGE_CLASSES["micro"]


class FreshMesh:
    """A device mesh of its own, its dimensions reached by their plain names (mesh["tp"]), ended
    by release_groups. torch's DeviceMesh underneath names them uniquely ("tp3"): DTensor caches
    its sharding decisions keyed by a mesh's equality, which its shape and names decide, so a
    later mesh of the same shape would run its collectives on an earlier mesh's groups, which
    are destroyed by then ("Could not resolve the process group registered under the name 63")."""

    _made = itertools.count()

    def __init__(self, device: torch.device, dims: dict[str, int]):
        from torch.distributed.device_mesh import init_device_mesh

        k = next(FreshMesh._made)
        self.names = {d: f"{d}{k}" for d in dims}
        self.device_mesh = init_device_mesh(device.type, tuple(dims.values()),
                                            mesh_dim_names=tuple(self.names.values()))

    def __getitem__(self, dim: str):
        return self.device_mesh[self.names[dim]]


def device_mesh(layout: Layout, device: torch.device) -> FreshMesh:
    """A fresh (pp, dp, tp) device mesh for `layout`, tp fastest (release_groups ends it)."""
    return FreshMesh(device, {"pp": layout.pp, "dp": layout.dp, "tp": layout.tp})


def build(model: ModelSpec, layout: Layout, device: torch.device, dtype, eps: float = 1e-8,
          mesh=None) -> MeshModel:
    """This rank's part of `layout` on `mesh` (a fresh one when None), from SEED."""
    t, p = layout.tp, layout.pp
    mesh = mesh if mesh is not None else device_mesh(layout, device)
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
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(layer, mesh["tp"],
                               layer_tp_plan(model.gated, layout.sequence_parallel))
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
        w, loc = _data_parallel(part, layout, mesh, device, shard)
        wrapped.append(w)
        localized.update(loc)
    opt = _optimizer(stage, layout, mesh, device, dtype, eps)
    schedule = None
    if p > 1:
        from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B

        n = p * layout.virtual_stages
        stage_class = pipeline_stage_class(layout)
        pipes = [stage_class(w, index, n, device, group=mesh["pp"].get_group())
                 for w, (index, _) in zip(wrapped, chunks, strict=True)]
        loss = sequence_loss(layout)
        if layout.virtual_stages > 1:
            schedule = ScheduleInterleaved1F1B(pipes, layout.micro_batches, loss_fn=loss)
        else:
            schedule = Schedule1F1B(pipes[0], layout.micro_batches, loss_fn=loss)
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


def release_groups(mesh) -> None:
    """The mesh's process groups destroyed, once its layout is done: NCCL's communicators hold
    device memory the caching allocator does not see, and a sweep of layouts would otherwise
    keep every layout's. The default group, which a dimension spanning the whole world reuses,
    stays. Every rank calls it at the same point."""
    world = dist.group.WORLD
    for name in mesh.names:
        group = mesh[name].get_group()
        if group is not None and group is not world:
            dist.destroy_process_group(group)


def _fsdp(layout: Layout, mesh, dtype) -> Callable[[nn.Module], object] | None:
    """fully_shard on mesh["dp"] as the layout's ZeRO stage asks (2: reshard_after_forward
    false, 3: true; computing in half precision on fp32 masters), or None below ZeRO 2."""
    if layout.dp == 1 or layout.zero < 2:
        return None
    from distbench.steps.dp_model import _fully_shard

    fully_shard, policy = _fully_shard()
    kwargs = {"mesh": mesh["dp"], "reshard_after_forward": layout.zero == 3}
    if needs_master(dtype):
        kwargs["mp_policy"] = policy(param_dtype=dtype, reduce_dtype=dtype)
    return lambda module: fully_shard(module, **kwargs)


def _data_parallel(stage: Stage, layout: Layout, mesh, device: torch.device,
                   shard: Callable[[nn.Module], object] | None) -> tuple[nn.Module, dict]:
    """The stage wrapped for the layout's data parallelism on mesh["dp"]: FSDP2's root over
    layers `shard` has wrapped already (in place), or DDP; and the DTensor specs of the TP
    shards DDP holds as plain tensors."""
    if layout.dp == 1:
        return stage, {}
    if shard is not None:
        shard(stage)
        return stage, {}
    localized = {}
    if layout.tp > 1:
        localized = _localize_tp_shards(stage)
    return ddp(stage, device, group=mesh["dp"].get_group()), localized


def _localize_tp_shards(stage: Stage) -> dict:
    """DDP cannot broadcast or bucket DTensor parameters (c10d.broadcast_ has no DTensor rule):
    torch's TP+DDP composition turns them into their local shards, made DTensors again around
    each forward. That function is private (torch.distributed.tensor.parallel.ddp); this is
    the one place that calls it, so a torch that moves it breaks here only. Returns each
    parameter's DTensor spec, kept on the parameter as `_st_info`, for the check."""
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

    _pre_dp_module_transform(stage)
    return {n: p._st_info for n, p in stage.named_parameters() if hasattr(p, "_st_info")}


def _optimizer(stage: Stage, layout: Layout, mesh, device: torch.device, dtype, eps: float
               ) -> torch.optim.Optimizer:
    params = list(stage.parameters())
    fused = {"fused": True} if device.type == "cuda" else {}
    if layout.dp > 1 and layout.zero == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class(dtype), lr=LR,
                                       eps=eps, process_group=mesh["dp"].get_group(), **fused)
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
    from distbench.steps.dp_model import adamw

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
    from distbench.steps.dp_model import adamw

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
