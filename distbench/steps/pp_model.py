"""pp's model: the residual stack of distbench.steps.stacks split into pipeline stages, each
rank building its own stages' layers from the shape's seed (so no weights travel) and handing them
to parallel.pipeline's schedules; the accounting pp.csv reports beside the measured step (the
analytic bubble, the bytes crossing stage boundaries); and the single-rank reference the check
compares the pipelined gradients and loss with.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from distbench.parallel.pipeline import (
    NaivePipeline,
    Pipeline,
    TorchPipeline,
    num_stages,
    split_layers,
    stage_ranges,
    stages_of_rank,
)
from distbench.steps.reference import TensorPair
from distbench.steps.stacks import Block, PipelineShape, loss_fn, make_batch, make_stage

# Above this (layers x hidden^2 x tokens per step) the check runs on a small configuration
# instead: every rank computes the single-rank reference itself.
CHECK_MAX_WORK = 2**31
SMALL_HIDDEN, SMALL_SEQ = 64, 8


# ---------------------------------------------------------------------------------------------
# Pure accounting


def layers_per_stage_text(layers: int, stages: int) -> str:
    return "/".join(str(c) for c in split_layers(layers, stages))


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
# The pipelines


def build_pipeline(schedule: str, shape: PipelineShape, rank: int, world: int,
                   device: torch.device) -> Pipeline:
    """This rank's stages of pp's stack, from the shape's seed, run by `schedule`. ValueError:
    the schedule refusing the configuration (micro-batch counts)."""
    if schedule == "naive":
        indices = stage_ranges(shape.layers, world)[rank]
        return NaivePipeline(make_stage(indices, shape, device), indices, rank, world,
                             make_batch(shape, device), loss_fn, device)
    v = shape.virtual_stages if schedule == "interleaved-1f1b" else 1
    ranges = stage_ranges(shape.layers, num_stages(schedule, world, v))
    modules = {s: make_stage(ranges[s], shape, device)
               for s in stages_of_rank(schedule, rank, world, v)}
    return TorchPipeline(schedule, modules, ranges, shape.micro_batches,
                         make_batch(shape, device), loss_fn, device)


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
