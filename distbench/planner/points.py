"""What `distbench plan` measures on its workers, bounded by the memory one rank may hold there
(`budget`: a GPU's usable memory, or a worker's share of the host's): only the layouts whose
rank fits are measured or validated, the collective sweep stops at the largest collective such a
layout issues and at what two buffers of it leave room for, and a layer is timed only at the
(tp, micro-batch) points whose layer, inputs and activations fit. Torch-free: the launcher bounds
a run by it before any worker starts (`need`), and the workers measure by it."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from distbench.core import rank_groups
from distbench.planner.layouts import Layout, enumerate_layouts
from distbench.planner.memory import (
    held_by_step,
    layer_activation_bytes,
    optimizer_bytes_per_param,
)
from distbench.planner.models import ModelSpec

# The sweep's sizes: from a quarter of the smallest TP activation, in 4x steps, multiples of 64
# bytes so that every group size up to 8 splits them, at least this many (an alpha-beta fit).
SWEEP_STEP = 4
SWEEP_FLOOR = 1024
MIN_SIZES = 3
# A collective's point holds at most two buffers of its size (all-gather's output and input,
# reduce-scatter's input and output).
BUFFERS_PER_POINT = 2


@dataclass(frozen=True)
class Unmeasured:
    """A point left unmeasured: what it is, and the bytes it would need on a rank."""

    what: str
    need: float  # bytes


def fitting_layouts(model: ModelSpec, world: int, gpus_per_node: int, zero: Sequence[int],
                    elt: int, budget: float) -> list[Layout]:
    """The layouts of `world` ranks whose every rank holds at most `budget` bytes in a step."""
    return [lay for lay in enumerate_layouts(model, world, gpus_per_node, tuple(zero))
            if held_by_step(model, lay, elt) <= budget]


def smallest_layout(model: ModelSpec, world: int, gpus_per_node: int, zero: Sequence[int],
                    elt: int) -> tuple[Layout | None, float]:
    """The layout of `world` ranks that holds the least per rank, and how much (None, 0: the
    model has no layout on `world` ranks)."""
    layouts = list(enumerate_layouts(model, world, gpus_per_node, tuple(zero)))
    if not layouts:
        return None, 0.0
    best = min(layouts, key=lambda lay: held_by_step(model, lay, elt))
    return best, held_by_step(model, best, elt)


def sweep_sizes(model: ModelSpec, layouts: Sequence[Layout], elt: int, budget: float
                ) -> tuple[list[int], list[Unmeasured]]:
    """The collective sweep: from a quarter of the smallest TP activation the layouts carry, in
    SWEEP_STEP steps, to the first size at or past the largest collective one of them issues (a
    stage's gradients, or an activation); the sizes whose buffers would pass `budget` skipped."""
    acts = [lay.micro_batch_size(model) * model.seq_len * model.hidden_size * elt
            for lay in layouts] or [4096]
    grads = [model.params / (lay.tp * lay.pp) * elt for lay in layouts] or [4096]
    lo, hi = max(SWEEP_FLOOR, min(acts) // 4), max(max(grads), max(acts))
    sizes: list[int] = []
    size = lo
    while len(sizes) < MIN_SIZES or sizes[-1] < hi:
        sizes.append(int(size) // 64 * 64)
        size *= SWEEP_STEP
    kept = [n for n in sizes if BUFFERS_PER_POINT * n <= budget]
    skipped = [Unmeasured(f"collectives of {n} bytes", BUFFERS_PER_POINT * n)
               for n in sizes if n not in kept]
    return kept, skipped


def compute_point_bytes(model: ModelSpec, tp: int, micro_batch_size: int, elt: int) -> float:
    """One TP shard of a layer timed forward and backward: its weights and gradients, the input
    and the output's gradient, and the activations it keeps for backward; or the layer whole,
    as it is built before TP splits it, where that is more."""
    tokens = micro_batch_size * model.seq_len
    return max(elt * model.params_per_layer,
               elt * (2 * model.params_per_layer / tp + 2 * tokens * model.hidden_size)
               + tokens * layer_activation_bytes(model, tp, elt))


def compute_points(model: ModelSpec, layouts: Sequence[Layout], elt: int, budget: float
                   ) -> tuple[list[tuple[int, int]], list[Unmeasured]]:
    """The (tp, micro-batch size) points the layouts run a layer at, those that fit `budget`
    first, the others skipped."""
    points = sorted({(lay.tp, lay.micro_batch_size(model)) for lay in layouts})
    kept = [p for p in points if compute_point_bytes(model, *p, elt) <= budget]
    skipped = [Unmeasured(f"one layer at tp {t}, micro-batch {m}",
                       compute_point_bytes(model, t, m, elt))
               for t, m in points if (t, m) not in kept]
    return kept, skipped


def optimizer_point_bytes(model: ModelSpec, elt: int) -> float:
    """AdamW timed on one whole layer: its weights, gradients and states."""
    return model.params_per_layer * (2 * elt + optimizer_bytes_per_param(elt))


def need(model: ModelSpec, world: int, gpus_per_node: int, zero: Sequence[int], elt: int,
         budget: float) -> float:
    """The most a rank holds while plan measures on `world` workers within `budget`: what fits
    of the layouts, the sweep and the points. When no layout fits, what the smallest one would
    hold: more than the budget, which the launcher then refuses with the figures."""
    layouts = fitting_layouts(model, world, gpus_per_node, zero, elt, budget)
    if not layouts:
        return smallest_layout(model, world, gpus_per_node, zero, elt)[1]
    sizes, _ = sweep_sizes(model, layouts, elt, budget)
    points, _ = compute_points(model, layouts, elt, budget)
    return max([held_by_step(model, lay, elt) for lay in layouts]
               + [BUFFERS_PER_POINT * n for n in sizes]
               + [compute_point_bytes(model, t, m, elt) for t, m in points]
               + [optimizer_point_bytes(model, elt)])


@dataclass(frozen=True)
class GroupShape:
    """Groups of `size` ranks at `stride` (core.rank_groups), each running `ops` at once."""

    size: int
    stride: int
    ops: tuple[str, ...]


def group_shapes(layouts: Sequence[Layout], world: int, node_of: Sequence[Hashable]
                 ) -> list[GroupShape]:
    """The groups the fits are measured on: consecutive ranks at every size the world divides
    into (a TP group's shape, and a DP or PP group's inside one node, where a stride shares the
    same links), each with every op the layouts issue (the pipeline's hop on pairs); then, where
    the workers span nodes, the strided groups of `layouts` that cross them placed otherwise
    than the consecutive group of their size: a DP group of tp t (stride t) with its data-
    parallel collectives (predict.dp_ops), a pipeline hop between stages t x dp apart (pairs at
    that stride, where the stages pair off). Keyed by their ranks per node, so that a layout's
    DP group is priced from a fit of its own placement (Inputs.comm_us)."""
    from distbench.planner.predict import dp_ops

    sizes = [g for g in range(2, world + 1) if world % g == 0]
    shapes = [GroupShape(g, 1, ("all_reduce", "all_gather", "reduce_scatter")
                         + (("sendrecv",) if g == 2 else ())) for g in sizes]
    wanted: dict[tuple[int, int], list[str]] = {}
    for lay in layouts:
        if lay.dp > 1 and lay.tp > 1:
            wanted.setdefault((lay.dp, lay.tp), []).extend(dp_ops(lay.zero))
        if lay.pp > 1 and lay.pp % 2 == 0 and lay.tp * lay.dp > 1:
            wanted.setdefault((2, lay.tp * lay.dp), []).append("sendrecv")
    for (size, stride), ops in sorted(wanted.items()):
        if world % (size * stride):
            continue
        here = rank_groups.placement(rank_groups.members(world, size, stride), node_of)[0]
        alike = rank_groups.placement(rank_groups.members(world, size), node_of)[0]
        if here < size and here != alike:
            shapes.append(GroupShape(size, stride, tuple(dict.fromkeys(sorted(ops)))))
    return shapes
