"""Pipeline parallelism: pp's residual stack (distbench.steps.stacks) split into stages, the
schedules that run them, and their accounting. Stage s holds a contiguous run of layers; every
rank builds its own layers from the shape's seed, so no weights travel.

Schedules:
- naive: the whole batch (all micro-batches at once) goes through one stage at a time forward,
  then backward in reverse, by hand with one send or receive at a time. One stage is busy at
  any moment.
- gpipe, 1f1b: torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B, one stage per rank.
- interleaved-1f1b: ScheduleInterleaved1F1B with v stages per rank (world x v stages, stage s on
  rank s % world).

Compute time (for the measured bubble) is taken by timers wrapped around each stage's forward and
backward compute *inside* the schedule: PipelineStage.forward_one_chunk / backward_one_chunk for
torch's schedules (their receives are posted and waited on by the schedule outside those calls),
and the stage's own forward / backward calls in the naive schedule. perf_counter on CPU; CUDA
events on the current stream on GPU, read once at the end of the timed loop.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from distbench.bench import timing
from distbench.ops import p2p
from distbench.steps.reference import TensorPair
from distbench.steps.stacks import Block, PipelineShape, loss_fn, make_batch, make_stage

# Above this (layers x hidden^2 x tokens per step) the check runs on a small configuration
# instead: every rank computes the single-rank reference itself.
CHECK_MAX_WORK = 2**31
SMALL_HIDDEN, SMALL_SEQ = 64, 8


# ---------------------------------------------------------------------------------------------
# Pure accounting


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


def layers_per_stage_text(layers: int, stages: int) -> str:
    return "/".join(str(c) for c in split_layers(layers, stages))


def num_stages(schedule: str, world: int, virtual_stages: int) -> int:
    return world * virtual_stages if schedule == "interleaved-1f1b" else world


def stages_of_rank(schedule: str, rank: int, world: int, virtual_stages: int) -> list[int]:
    """Stage indices a rank holds: stage s lives on rank s % world."""
    return list(range(rank, num_stages(schedule, world, virtual_stages), world))


def analytic_bubble(schedule: str, p: int, m: int, v: int = 1) -> float:
    """Idle fraction of a rank in the ideal schedule (equal stages, free communication)."""
    if schedule == "naive":
        return (p - 1) / p  # one stage busy at a time
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved-1f1b":
        return (p - 1) / (v * m + p - 1)
    raise ValueError(f"unknown schedule {schedule!r}")


def p2p_bytes_per_step(stages: int, samples: int, seq_len: int, hidden_size: int,
                       elt_size: int) -> int:
    """Activations forward plus their gradients backward, across every stage boundary, summed
    over the stages - 1 boundaries. Each boundary carries the whole batch (all micro-batches)
    once in each direction."""
    return 2 * (stages - 1) * samples * seq_len * hidden_size * elt_size


# ---------------------------------------------------------------------------------------------
# The check's configuration


def check_shape(shape: PipelineShape) -> PipelineShape:
    """The configuration the correctness check runs on: the measured one when it is small,
    else a small one with the same layer count, micro-batches and stage split."""
    work = shape.layers * shape.hidden_size ** 2 * shape.samples * shape.seq_len
    if work <= CHECK_MAX_WORK:
        return shape
    return replace(shape, hidden_size=min(shape.hidden_size, SMALL_HIDDEN),
                   seq_len=min(shape.seq_len, SMALL_SEQ), micro_batch_size=1)


# ---------------------------------------------------------------------------------------------
# Compute timing


# ---------------------------------------------------------------------------------------------
# Pipelines: one object per schedule on each rank, with the same surface


class Pipeline:
    """One rank's part of a pipelined training step (forward + backward, no optimizer)."""

    schedule: str
    shape: PipelineShape
    clock: timing.Spans  # the rank's compute inside the step, on the device's clock
    layers: dict[int, Block]  # global layer index -> the block this rank holds
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
    hand with blocking sends and receives: the baseline the schedules are judged against."""

    def __init__(self, shape: PipelineShape, rank: int, world: int, device: torch.device):
        self.schedule = "naive"
        self.shape, self.rank, self.world = shape, rank, world
        self.clock = timing.Spans(device)
        rng = stage_ranges(shape.layers, world)[rank]
        self.module = make_stage(rng, shape, device)
        self.layers = dict(zip(rng, self.module, strict=True))
        self.holds_last = rank == world - 1
        self.x, self.target = make_batch(shape, device)
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
            self.loss = loss_fn(out, self.target)
            self._backward(self.loss)
        else:
            p2p.send(out.detach(), self.rank + 1)
            p2p.recv(self.grad_buf, self.rank + 1)
            self._backward(out, self.grad_buf)
        if not first:
            p2p.send(inp.grad, self.rank - 1)


class TorchPipeline(Pipeline):
    """gpipe, 1f1b, interleaved-1f1b through torch.distributed.pipelining."""

    def __init__(self, schedule: str, shape: PipelineShape, rank: int, world: int,
                 device: torch.device):
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        self.schedule = schedule
        self.shape = shape
        self.clock = timing.Spans(device)
        v = shape.virtual_stages if schedule == "interleaved-1f1b" else 1
        n_stages = world * v
        ranges = stage_ranges(shape.layers, n_stages)
        self.layers = {}
        self.stages = []
        for s in stages_of_rank(schedule, rank, world, v):
            module = make_stage(ranges[s], shape, device)
            self.layers.update(zip(ranges[s], module, strict=True))
            stage = PipelineStage(module, s, n_stages, device)
            # the compute timers: the schedule looks these up on the instance
            stage.forward_one_chunk = self.clock.wrap(stage.forward_one_chunk)
            stage.backward_one_chunk = self.clock.wrap(stage.backward_one_chunk)
            stage.backward_weight_one_chunk = self.clock.wrap(stage.backward_weight_one_chunk)
            self.stages.append(stage)
        self.holds_first = any(st.is_first for st in self.stages)
        self.holds_last = any(st.is_last for st in self.stages)
        m = shape.micro_batches
        # ValueError here is the schedule refusing the configuration (micro-batch counts)
        if schedule == "gpipe":
            self.sched = ScheduleGPipe(self.stages[0], m, loss_fn=loss_fn)
        elif schedule == "1f1b":
            self.sched = Schedule1F1B(self.stages[0], m, loss_fn=loss_fn)
        elif schedule == "interleaved-1f1b":
            self.sched = ScheduleInterleaved1F1B(self.stages, m, loss_fn=loss_fn)
        else:
            raise ValueError(f"unknown schedule {schedule!r}")
        x, target = make_batch(shape, device)
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


def build_pipeline(schedule: str, shape: PipelineShape, rank: int, world: int,
                   device: torch.device) -> Pipeline:
    if schedule == "naive":
        return NaivePipeline(shape, rank, world, device)
    return TorchPipeline(schedule, shape, rank, world, device)


# ---------------------------------------------------------------------------------------------
# Single rank: the reference for the check, and t1 for the scaling view


class SingleRank:
    """The whole model on the whole batch on one rank: one forward, one backward."""

    def __init__(self, shape: PipelineShape, device: torch.device):
        self.shape = shape
        self.model = make_stage(range(shape.layers), shape, device)
        self.x, self.target = make_batch(shape, device)
        self.loss: torch.Tensor | None = None

    def step(self) -> None:
        for p in self.model.parameters():
            p.grad = None
        self.loss = loss_fn(self.model(self.x), self.target)
        self.loss.backward()

    def layer(self, index: int) -> Block:
        return self.model[index]


def pp_vs_reference(pipe: Pipeline, ref: SingleRank) -> list[TensorPair]:
    """(name, pipelined, reference) for this rank's parameter gradients, then the loss on the
    rank holding the last stage: what the check compares."""
    pairs: list[TensorPair] = []
    for index, block in sorted(pipe.layers.items()):
        ref_block = ref.layer(index)
        for (name, p), (ref_name, r) in zip(block.named_parameters(),
                                            ref_block.named_parameters(), strict=True):
            assert name == ref_name
            if p.grad is None or r.grad is None:
                raise RuntimeError(f"layer {index} {name}: no gradient")
            pairs.append((f"layer {index} {name} grad", p.grad.detach(), r.grad))
    if pipe.holds_last:
        pairs.append(("loss", pipe.loss.detach().reshape(1), ref.loss.detach().reshape(1)))
    return pairs
