"""Data parallelism through torch's own wrappers, as dp and the 3D step apply them:

- DDP, gradients as views of its buckets (each rank holds one gradient copy), with a comm hook
  where a run slows its all-reduce (a test fault) or removes it (compute-only);
- ZeRO-1: ZeroRedundancyOptimizer, each rank stepping its partition and broadcasting it;
- ZeRO-2 / 3: FSDP2, fully_shard with reshard_after_forward false / true, computing in half
  precision on fp32 shards where asked;
- TP under DDP: the DTensor shards DDP cannot hold made plain, and made whole again for a check;
- micro-batches accumulated by hand with each wrapper's switch for syncing the gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from distbench.planner.layouts import Layout

# ---------------------------------------------------------------------------------------------
# DDP and ZeRO-1


def ddp(module: nn.Module, device: torch.device, bucket_mb: float | None = None, group=None,
        hook=None):
    """DDP as trainers run it (and as the planner's memory counts it): gradients as views of
    its buckets, so each rank holds one copy of them, not two. `hook`: a comm hook in place of
    its all-reduce (slowed_allreduce, no_allreduce)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=bucket_mb,
                                    process_group=group, gradient_as_bucket_view=True)
    if hook is not None:
        model.register_comm_hook(None, hook)
    return model


def slowed_allreduce(before: Callable[[], None]):
    """DDP's own all-reduce hook with the fault's delay ahead of every bucket (tests only)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        before()
        return allreduce_hook(state, bucket)

    return hook


def no_allreduce():
    """torch's no-op hook (its docs: "to see whether all-reduce is the bottleneck")."""
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

    return noop_hook


def zero_redundancy(params: list, optimizer_class, group=None, **optimizer):
    """ZeRO-1: `optimizer_class(**optimizer)` over this rank's partition of `params` on `group`
    (None: the world), the stepped parameters broadcast to the others."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, process_group=group,
                                   **optimizer)


# ---------------------------------------------------------------------------------------------
# FSDP2


def _fully_shard():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def fully_sharded(mesh, reshard_after_forward: bool, compute_dtype: torch.dtype | None = None
                  ) -> Callable[[nn.Module], nn.Module]:
    """fully_shard on `mesh` (ZeRO-3 when it reshards after forward, ZeRO-2 when it keeps the
    parameters gathered), as a function applied to each module in turn: the layers first, then
    the root. `compute_dtype`: the shards are fp32 masters, gathered and reduced in it."""
    fully_shard, policy = _fully_shard()
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if compute_dtype is not None:
        kwargs["mp_policy"] = policy(param_dtype=compute_dtype, reduce_dtype=compute_dtype)
    return lambda module: fully_shard(module, **kwargs)


# ---------------------------------------------------------------------------------------------
# A layout's stage


def wrap_stage(stage: nn.Module, layout: Layout, mesh, device: torch.device,
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


def _localize_tp_shards(stage: nn.Module) -> dict:
    """DDP cannot broadcast or bucket DTensor parameters (c10d.broadcast_ has no DTensor rule):
    torch's TP+DDP composition turns them into their local shards, made DTensors again around
    each forward. That function is private (torch.distributed.tensor.parallel.ddp); this is
    the one place that calls it, so a torch that moves it breaks here only. Returns each
    parameter's DTensor spec, kept on the parameter as `_st_info`, for the check."""
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

    _pre_dp_module_transform(stage)
    return {n: p._st_info for n, p in stage.named_parameters() if hasattr(p, "_st_info")}


def gathered(t: torch.Tensor, spec=None) -> torch.Tensor:
    """`t` whole: a DTensor (TP's, FSDP's) gathered, a TP shard that DDP holds as a plain tensor
    (`spec`: its DTensor spec, from wrap_stage) made a DTensor again first; a plain tensor as it
    is. Collective over the tensor's mesh: every rank holding a part calls it, for the same
    tensors in the same order."""
    from torch.distributed.tensor import DTensor

    if spec is not None and not isinstance(t, DTensor):
        t = DTensor.from_local(t, spec.mesh, spec.placements, run_check=False,
                               shape=spec.shape, stride=spec.stride)
    if isinstance(t, DTensor):
        with _quiet_redistribute():
            t = t.full_tensor()
    return t


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
