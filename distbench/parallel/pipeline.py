"""Pipeline parallelism: layers split into stages, the schedules that run them, and the
pipeline stage that syncs data-parallel gradients every micro-batch. Stage s holds a contiguous
run of layers; every rank builds its own stages' layers, so no weights travel.

Schedules:
- naive: the whole batch (all micro-batches at once) goes through one stage at a time forward,
  then backward in reverse, by hand with one send or receive at a time. One stage is busy at
  any moment.
- gpipe, 1f1b: torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B, one stage per rank.
- interleaved-1f1b: ScheduleInterleaved1F1B with v stages per rank (world x v stages, stage s on
  rank s % world).

pp runs them through a Pipeline, which times each stage's forward and backward compute *inside*
the schedule (for the measured bubble): PipelineStage.forward_one_chunk / backward_one_chunk for
torch's schedules (their receives are posted and waited on by the schedule outside those calls),
and the stage's own forward / backward calls in the naive schedule. perf_counter on CPU; CUDA
events on the current stream on GPU, read once at the end of the timed loop. The 3D step builds
its stages and schedule here too (torch_stages, torch_schedule) and runs them itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from distbench.bench import timing
from distbench.ops import p2p

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# ---------------------------------------------------------------------------------------------
# Stages


def split_layers(layers: int, stages: int) -> list[int]:
    """Layers per stage, contiguous and as even as possible; the first stages take the extra
    ones (5 layers on 2 stages -> [3, 2])."""
    if stages < 1 or layers < stages:
        raise ValueError(f"{layers} layers cannot fill {stages} stages")
    base, extra = divmod(layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]


def stage_ranges(layers: int, stages: int) -> list[range]:
    """The global layer indices of each stage."""
    out, start = [], 0
    for count in split_layers(layers, stages):
        out.append(range(start, start + count))
        start += count
    return out


def num_stages(schedule: str, world: int, virtual_stages: int) -> int:
    return world * virtual_stages if schedule == "interleaved-1f1b" else world


def stages_of_rank(schedule: str, rank: int, world: int, virtual_stages: int) -> list[int]:
    """Stage indices a rank holds: stage s lives on rank s % world."""
    return list(range(rank, num_stages(schedule, world, virtual_stages), world))


# ---------------------------------------------------------------------------------------------
# torch's stages and schedules


def torch_stages(parts: list[tuple[int, nn.Module]], n_stages: int, device: torch.device,
                 group=None, every_micro_batch: bool = False) -> list:
    """A PipelineStage around each (stage index, module) this rank holds, of `n_stages` in all,
    on `group` (None: the world); with `every_micro_batch`, the stage that syncs its data-parallel
    wrapper's gradients after every micro-batch (_stage_class)."""
    cls = _stage_class(every_micro_batch)
    return [cls(module, index, n_stages, device, group=group) for index, module in parts]


def torch_schedule(schedule: str, stages: list, micro_batches: int, loss_fn: LossFn):
    """torch's schedule `schedule` over this rank's stages. ValueError: an unknown schedule, or
    the schedule refusing the configuration (micro-batch counts)."""
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    if schedule == "gpipe":
        return ScheduleGPipe(stages[0], micro_batches, loss_fn=loss_fn)
    if schedule == "1f1b":
        return Schedule1F1B(stages[0], micro_batches, loss_fn=loss_fn)
    if schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, micro_batches, loss_fn=loss_fn)
    raise ValueError(f"unknown schedule {schedule!r}")


_STAGE_CLASSES: dict = {}


def _stage_class(every_micro_batch: bool):
    """torch's PipelineStage, or, where the gradients of every micro-batch are synced (grad_sync
    micro, with replicas), one whose DP wrapper does so. torch 2.13's stage holds them to the
    last backward itself (backward_maybe_with_nosync): DDP under no_sync but there, FSDP2 with
    set_requires_gradient_sync(False) before every backward, its gradients then
    reduce-scattered once by perform_reduce_grad. This one runs every backward as DDP's last
    (prepare_for_backward, then the all-reduce), and as FSDP2 runs a backward of its own (the
    sync on, the backward finalized), so each micro-batch's gradients are reduced as they
    come and the sharded gradients accumulate; the stage stays gathered between micro-batches
    as torch's schedule keeps it (reshard_after_backward false; perform_reduce_grad reshards
    and scales at the end)."""
    from torch.distributed.pipelining import PipelineStage

    if not every_micro_batch:
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


# ---------------------------------------------------------------------------------------------
# Pipelines: one object per schedule on each rank, with the same surface


class Pipeline:
    """One rank's part of a pipelined training step (forward + backward, no optimizer)."""

    schedule: str
    clock: timing.Spans  # the rank's compute inside the step, on the device's clock
    layers: dict[int, nn.Module]  # global layer index -> the layer this rank holds
    holds_last: bool
    loss: torch.Tensor | None  # the step's loss, on the rank holding the last stage

    def step(self) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for block in self.layers.values():
            for p in block.parameters():
                p.grad = None


class NaivePipeline(Pipeline):
    """The whole batch through stage 0, then stage 1, ... forward; backward in reverse. Written by
    hand with blocking sends and receives: the baseline the schedules are judged against. Rank r
    holds stage r, `module`, whose children are layers `indices`; a stage's output has the
    shape of its input."""

    def __init__(self, module: nn.Sequential, indices: range, rank: int, world: int,
                 batch: tuple[torch.Tensor, torch.Tensor], loss_fn: LossFn,
                 device: torch.device):
        self.schedule = "naive"
        self.rank, self.world = rank, world
        self.clock = timing.Spans(device)
        self.module = module
        self.layers = dict(zip(indices, module, strict=True))
        self.holds_last = rank == world - 1
        self.x, self.target = batch
        self.loss_fn = loss_fn
        self.recv_buf = torch.empty_like(self.x)
        self.grad_buf = torch.empty_like(self.x)
        self.loss = None
        self._forward = self.clock.wrap(self.module)
        self._backward = self.clock.wrap(torch.autograd.backward)

    def step(self) -> None:
        self.zero_grad()
        first, last = self.rank == 0, self.rank == self.world - 1
        if first:
            inp = self.x
        else:
            p2p.recv(self.recv_buf, self.rank - 1)
            inp = self.recv_buf.detach().requires_grad_(True)
        out = self._forward(inp)
        if last:
            # the loss is left out of the compute time, as in torch's schedules
            self.loss = self.loss_fn(out, self.target)
            self._backward(self.loss)
        else:
            p2p.send(out.detach(), self.rank + 1)
            p2p.recv(self.grad_buf, self.rank + 1)
            self._backward(out, self.grad_buf)
        if not first:
            p2p.send(inp.grad, self.rank - 1)


class TorchPipeline(Pipeline):
    """gpipe, 1f1b, interleaved-1f1b through torch.distributed.pipelining: `modules` maps each
    stage index this rank holds to its module, whose children are layers ranges[index] (ranges:
    every stage's)."""

    def __init__(self, schedule: str, modules: dict[int, nn.Sequential], ranges: list[range],
                 micro_batches: int, batch: tuple[torch.Tensor, torch.Tensor], loss_fn: LossFn,
                 device: torch.device):
        self.schedule = schedule
        self.clock = timing.Spans(device)
        self.layers = {}
        for s, module in modules.items():
            self.layers.update(zip(ranges[s], module, strict=True))
        self.stages = torch_stages(list(modules.items()), len(ranges), device)
        for stage in self.stages:
            # the compute timers: the schedule looks these up on the instance
            stage.forward_one_chunk = self.clock.wrap(stage.forward_one_chunk)
            stage.backward_one_chunk = self.clock.wrap(stage.backward_one_chunk)
            stage.backward_weight_one_chunk = self.clock.wrap(stage.backward_weight_one_chunk)
        self.holds_first = any(st.is_first for st in self.stages)
        self.holds_last = any(st.is_last for st in self.stages)
        self.sched = torch_schedule(schedule, self.stages, micro_batches, loss_fn)
        x, target = batch
        self.args = (x,) if self.holds_first else ()
        self.target = target if self.holds_last else None
        self.losses: list[torch.Tensor] = []
        self.loss = None

    def step(self) -> None:
        self.zero_grad()
        losses = self.losses if self.holds_last else None
        self.sched.step(*self.args, target=self.target, losses=losses, return_outputs=False)
        if self.holds_last:
            self.loss = torch.stack([t.detach() for t in self.losses]).mean()
