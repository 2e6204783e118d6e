"""What plan's workers measure, the inputs of the plan (planner.inputs), each timed on every rank
at once so that a rank shares the machine as it does in a step, and agreed as the slowest
rank's (a step waits for it): the collectives the layouts issue, over a size sweep, fitted; one
layer's forward and backward at each (tp, tokens); AdamW's step; one layer computing alone;
each ZeRO stage's overlap or wrapper cost; the pipeline schedule's own work and the bubble's
weight. kinds/plan/workers.py says the whole."""


from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.core.dtypes import element_bytes
from distbench.core.exitcodes import EXIT_BAD_INPUT
from distbench.core.sizes import format_size
from distbench.ops import data
from distbench.parallel.device_mesh import FreshMesh, release_groups
from distbench.parallel.tensor_parallel import shard_layer
from distbench.planner import points
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.layouts import Layout
from distbench.planner.memory import held_by_step
from distbench.planner.models import ModelSpec
from distbench.results.alphabeta import fit
from distbench.run import split
from distbench.run.runtime import RunFailure
from distbench.run.session import Session
from distbench.steps import mesh_model, recipe, step3d
from distbench.steps.dp_model import adamw

# each of an input point's REPS repetitions fills this share of --min-time, so that a stall of a
# few ms is a minority of each
POINT_SHARE = 0.05
# a layer's point fills this many times as much: a TP layer here takes 30-80 ms, which a
# collective's share would time 3 times a repetition, and a compute point weighs on every
# layout's prediction (a collective's size on few)
LAYER_POINT_SHARE = 4 * POINT_SHARE
REPS = 3
SEED = 4321




def measure_inputs(s: Session, model: ModelSpec, dtype, gpn: int, budget: float,
                   named: list[Layout] = ()) -> Inputs:
    """The inputs, measured only on what fits in `budget` a rank (planner.points): what does
    not is skipped, and said. `named`: the layouts plan --layout names, whose layer is timed
    too where its TP fits the workers (a micro-batch size off the ladder is then measured,
    not scaled)."""
    rt = s.rt
    # the GPU by name, not "cuda": a later plan --from for another GPU must see these figures
    # were not measured on it (the first H100 run wrote "cuda", issue 34)
    device = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else \
        str(rt.device.type)
    inputs = Inputs(gpus_per_node=gpn, device=device, compute_model={
        "hidden_size": model.hidden_size, "ffn_size": model.ffn_size, "heads": model.heads,
        "seq_len": model.seq_len}, sources=["measured on the workers of this run"])
    elt = element_bytes(s.opts.dtype)
    layouts = points.fitting_layouts(model, rt.world, gpn, s.opts.zero, elt, budget)
    if not layouts:
        smallest, need = points.smallest_layout(model, rt.world, gpn, s.opts.zero, elt)
        raise RunFailure(
            f"--model: no layout of {model.name} on {rt.world} ranks fits in the "
            f"{format_size(int(budget))} a rank may hold here" + (
                f": the smallest, {smallest.label()}, needs about {format_size(int(need))}"
                if smallest is not None else ""), status="bad_input", exit_code=EXIT_BAD_INPUT)
    stages = iter(INPUT_STAGES)

    def next_stage() -> None:
        s.console.working_on(f"measuring {next(stages)}")

    next_stage()
    inputs.fits = measure_fits(s, model, layouts, elt, budget)
    s.console.advance()
    next_stage()
    inputs.compute = measure_compute(s, model, [*layouts, *(
        lay for lay in named if rt.world % lay.tp == 0)], dtype, inputs, budget)
    s.console.advance()
    next_stage()
    inputs.optimizer_us_per_layer, inputs.optimizer_us_per_param = measure_optimizer(
        s, model, dtype)
    s.console.advance()
    next_stage()
    measure_overlap(s, model, dtype, inputs, budget)
    s.console.advance()
    next_stage()
    measure_pipeline(s, model, dtype, inputs, gpn, budget)
    s.console.advance()
    return inputs


# what measure_inputs measures, in order: the progress bar's first steps
INPUT_STAGES = ("collectives", "layers", "the optimizer", "overlap", "the pipeline")


def _agreed_us(seconds: float, device) -> float:
    """The slowest rank's time, in microseconds, on every rank."""
    return recipe.max_over_ranks([seconds * 1e6], device)[0]


def _time_us(s: Session, fn: Callable[[], object], active: bool = True,
             share: float = POINT_SHARE) -> float:
    """fn's time per call: warmed up, each of REPS repetitions calibrated to fill `share` of
    --min-time, their median, the slowest rank's. Every rank runs as many calls (the count is
    agreed), so collectives pair; a rank not `active` runs none and waits at the barriers (fn
    must then start no collective)."""
    device = s.rt.device

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n if active else 0):
            fn()
        timing.sync(device)
        return time.perf_counter() - t0

    run(1)
    once = _agreed_us(run(1), device) / 1e6
    n = max(3, min(500, math.ceil(s.opts.min_time * share / max(once, 1e-6))))
    reps = []
    for _ in range(REPS):
        dist.barrier()
        reps.append(_agreed_us(run(n) / n, device))
    return sorted(reps)[len(reps) // 2]


def measure_fits(s: Session, model: ModelSpec, layouts: list[Layout], elt: int,
                 budget: float) -> list[CommFit]:
    """Each collective on every group shape of points.group_shapes, every group of a shape at
    once, over the sweep of planner.points: consecutive ranks at every group size, and where
    the workers span nodes the strided groups of the layouts that cross them otherwise (a DP
    group of tp 2: stride 2). A fit across nodes says its group's ranks per node, the same on
    every rank (rank_groups.placement)."""
    rt, opts = s.rt, s.opts
    sizes, skipped = points.sweep_sizes(model, layouts, elt, budget)
    _say_skipped(s, skipped, budget)
    fits: list[CommFit] = []
    for shape in points.group_shapes(layouts, rt.world, split.node_of(rt)):
        g, stride = shape.size, shape.stride
        shaped = f"groups of {g}" + (f" at stride {stride}" if stride > 1 else "")
        with split.split(rt, g, stride, opts.timeout) as part:
            where = f"nodes, {part.per_node} per node" if part.crosses else "node"
            for op in shape.ops:
                s.phase(f"plan inputs: {op} on {shaped}", opts.timeout)
                hops = 2 if op == "sendrecv" else 1  # a ping-pong is two one-way hops
                times = [_time_us(s, _collective(op, size, part.group, part.mine, rt)) / hops
                         for size in sizes]
                f = fit(sizes, times)
                fits.append(CommFit(
                    op=op, ranks=g, span="nodes" if part.crosses else "node",
                    alpha_us=f.alpha_us, beta_gbps=f.beta_gbps,
                    source="measured here" + (f" ({shaped}, {where})" if stride > 1 else ""),
                    per_node=part.per_node if part.crosses else None))
                s.console.log(f"  {op} on {g} ranks" + (f" at stride {stride}" if stride > 1
                                                        else "")
                              + f" ({where}): alpha {f.alpha_us:.0f} us, beta "
                              f"{f.beta_gbps:.2f} GB/s (fit error {f.err_pct:.0f}%)")
        gc.collect()
    return fits


def _collective(op: str, size: int, group, members: list[int], rt) -> Callable[[], object]:
    n = len(members)
    count = size // 4
    dev = rt.device
    if op == "all_reduce":
        buf = torch.ones(count, dtype=torch.float32, device=dev)
        return lambda: dist.all_reduce(buf, group=group)
    if op == "all_gather":
        out = torch.empty(count // n * n, dtype=torch.float32, device=dev)
        inp = torch.ones(count // n, dtype=torch.float32, device=dev)
        return lambda: data.all_gather(out, inp, group=group)
    if op == "reduce_scatter":
        inp = torch.ones(count // n * n, dtype=torch.float32, device=dev)
        out = torch.empty(count // n, dtype=torch.float32, device=dev)
        return lambda: data.reduce_scatter(out, inp, group=group)
    # a ping-pong between the pair's two ranks: two one-way hops
    buf = torch.ones(count, dtype=torch.float32, device=dev)
    me = members.index(rt.rank)
    peer = members[1 - me]

    def pingpong() -> None:
        for turn in (0, 1):
            if turn == me:
                dist.send(buf, peer, group=group)
            else:
                dist.recv(buf, peer, group=group)
    return pingpong


def _say_skipped(s: Session, skipped: list[points.Unmeasured], budget: float) -> None:
    for x in skipped:
        s.console.log(f"  skipped: {x.what} would hold {format_size(int(x.need))}, past the "
                      f"{format_size(int(budget))} a rank may hold here")


def measure_compute(s: Session, model: ModelSpec, layouts: list[Layout], dtype,
                    inputs: Inputs, budget: float) -> list[ComputePoint]:
    """One layer's forward and backward at each (tp, micro-batch) of the layouts, every rank at
    once: with tp 1 a plain layer, with tp > 1 torch's TP layer on groups of tp consecutive
    ranks, as the step runs it (DTensor's dispatch and the four all-reduces inside, since on a
    CPU the dispatch costs as much as the matmuls). With tp 1 also with one rank per node
    computing alone: `inputs.alone_ratio`, the median of the two's ratio."""
    shapes, skipped = points.compute_points(model, layouts, dtype.itemsize, budget)
    _say_skipped(s, skipped, budget)
    out = []
    alone: list[float] = []
    firsts = _first_of_each_node(s)
    for tp, mbs in shapes:
        s.phase(f"plan inputs: one layer at tp {tp}, micro-batch {mbs}", s.opts.timeout)
        us, alone_us = layer_us(s, model, tp, mbs, dtype,
                                 alone=s.rt.rank in firsts if tp == 1 else None)
        tokens = mbs * model.seq_len
        if alone_us is not None:
            alone.append(alone_us / us)
        out.append(ComputePoint(tp=tp, tokens=tokens, layer_us=us,
                                flops=model.flops_per_layer(tokens, tp), source="measured here",
                                with_tp_comm=tp > 1))
        s.console.log(f"  one layer at tp {tp}, {tokens} tokens: {us / 1e3:.2f} ms")
    if alone:
        inputs.alone_ratio = min(1.0, statistics.median(alone))
        s.console.log(f"  one rank per node alone: {inputs.alone_ratio:.2f} x the time with "
                      "every rank computing")
    return out


def _first_of_each_node(s: Session) -> set[int]:
    """The lowest rank of each node."""
    if not s.rt.ranks:
        return {0}
    first: dict = {}
    for r in s.rt.ranks:
        first.setdefault(r.get("node"), r["rank"])
    return set(first.values())


def layer_us(s: Session, model: ModelSpec, tp: int, mbs: int, dtype,
              alone: bool | None = None) -> tuple[float, float | None]:
    """One layer's forward and backward at (tp, micro-batch), every rank at once, and where
    `alone` is given, again with only the ranks it is true on computing (the others wait at
    the barriers); the layer, its data and its mesh's groups freed after."""
    layer, x, dy, mesh = _one_layer(s, model, tp, mbs, dtype)

    def step() -> None:
        layer(x).backward(dy)

    us = _time_us(s, step, share=LAYER_POINT_SHARE)
    alone_us = None if alone is None else _time_us(s, step, active=alone,
                                                   share=LAYER_POINT_SHARE)
    layer = x = dy = None
    recipe.free(s.rt.device)
    if mesh is not None:
        release_groups(mesh)
    return us, alone_us


def _one_layer(s: Session, model: ModelSpec, tp: int, mbs: int, dtype):
    """One layer at (tp, micro-batch), its input and its output's gradient, and the mesh its TP
    runs on (None at tp 1), for release_groups once the point is timed."""
    device = s.rt.device
    layer = mesh_model.make_layer(model, 0, device, dtype)
    mesh = None
    # sequence-parallel where tp divides the sequence, as the plan's layouts run TP there
    # (layouts.enumerate_layouts): its rank's part of the sequence in, and out
    sp = tp > 1 and model.seq_len % tp == 0
    if tp > 1:
        mesh = FreshMesh(device, {"rest": s.rt.world // tp, "tp": tp})
        shard_layer(layer, mesh["tp"], model.gated, sp)
    g = torch.Generator().manual_seed(SEED)
    dims = (mbs, model.seq_len // (tp if sp else 1), model.hidden_size)
    x = torch.randn(dims, generator=g).to(device, dtype).requires_grad_(True)
    dy = torch.randn(dims, generator=g).to(device, dtype)
    return layer, x, dy, mesh


def measure_optimizer(s: Session, model: ModelSpec, dtype) -> tuple[float, float]:
    """AdamW's step, the one the step runs (fused on a GPU, on fp32 masters in half precision):
    (microseconds per layer held, per parameter), from one layer of the model and one of half
    its width (the same tensors, a quarter of the parameters). A step costs a
    few kernels per tensor whatever its size, which per parameter alone would charge a stage
    of many small shards too little."""
    s.phase("plan inputs: the optimizer", s.opts.timeout)
    half = replace(model, hidden_size=max(model.heads, model.hidden_size // 2 // model.heads
                                          * model.heads), ffn_size=max(1, model.ffn_size // 2))
    points = []
    for shape in (model, half):
        layer = mesh_model.make_stage(shape, range(1), s.rt.device, dtype)
        for p in layer.parameters():
            p.grad = torch.ones_like(p)
        opt = adamw(list(layer.parameters()), s.rt.device, dtype)  # as the step's
        points.append((sum(p.numel() for p in layer.parameters()),
                       _time_us(s, opt.step)))
        layer = opt = None
    (n1, t1), (n2, t2) = points
    per_param = max(0.0, (t1 - t2) / (n1 - n2)) if n1 != n2 else t1 / n1
    per_layer = max(0.0, t1 - per_param * n1)
    s.console.log(f"  AdamW: {per_layer:.0f} us per layer + {per_param * 1e3:.3f} ns per "
                  "parameter")
    return per_layer, per_param


def measure_pipeline(s: Session, model: ModelSpec, dtype, inputs: Inputs, gpn: int,
                     budget: float) -> None:
    """The pipeline schedule's own work per micro-batch and the bubble's weight, into `inputs`:
    pure pipeline steps of the whole world (pp = world) at the fewest micro-batches 1F1B takes
    (m from pp up) and at the step command's (m from 2 pp up), held against their prediction
    from the inputs measured so far (predict.pipeline_calibration). Nothing when the model's
    layers or batch do not split that way; one step when both counts are the same."""
    from distbench.planner.layouts import default_micro_batches, fewest_micro_batches, problems
    from distbench.planner.predict import pipeline_calibration

    world = s.rt.world
    if world == 1:
        return
    counts = [m for m in (fewest_micro_batches(model, 1, world),) if m is not None]
    counts += [m for m in [default_micro_batches(model, world, 1)] if m not in counts]
    steps: list[tuple[Layout, float]] = []
    for m in counts:
        layout = Layout(tp=1, pp=world, dp=1, micro_batches=m)
        if problems(layout, model) or _too_large(s, model, layout, dtype, budget):
            continue
        row, _ = step3d.measure_layout(s, model, layout, dtype, [], check=False)
        if row.get("status") == "ok" and row.get("step_us"):
            steps.append((layout, row["step_us"]))
    if not steps:
        return
    elt = element_bytes(s.opts.dtype)
    inputs.pipeline_us_per_microbatch, inputs.bubble_weight = pipeline_calibration(
        steps, model, inputs, elt, gpn)
    for i, (layout, _) in enumerate(steps):
        inputs.overlap_layouts["pipeline" if i == 0 else f"pipeline {i + 1}"] = layout.label()
    took = " and ".join(f"{us / 1e3:.2f} ms at m = {lay.micro_batches}" for lay, us in steps)
    s.console.log(f"  pipeline: a step of {took}; its schedule's own work "
                  f"{inputs.pipeline_us_per_microbatch / 1e3:.2f} ms per micro-batch, its "
                  f"bubble at {inputs.bubble_weight:.2f} of one rank alone's compute")


def _too_large(s: Session, model: ModelSpec, layout: Layout, dtype, budget: float) -> bool:
    need = held_by_step(model, layout, dtype.itemsize)
    if need <= budget:
        return False
    _say_skipped(s, [points.Unmeasured(f"the step {layout.label()}", need)], budget)
    return True


def measure_overlap(s: Session, model: ModelSpec, dtype, inputs: Inputs, budget: float) -> None:
    """What a pure data-parallel step of the whole world exposes of its communication, at each
    ZeRO stage asked for, into `inputs`: exposed, the step's time beyond its compute-only time
    (step.csv), against the model's time for its collectives (predict.dp_collectives_us from
    the fits just measured), split by predict.split_exposed into the share that hid behind
    backward, or the wrapper's own cost per layer."""
    from distbench.planner.predict import (
        dp_collectives_us,
        dp_kind,
        params_per_rank,
        split_exposed,
    )

    world = s.rt.world
    if world == 1 or model.batch % world:
        return
    elt = element_bytes(s.opts.dtype)
    for zero in sorted(s.opts.zero):
        kind = dp_kind(zero)
        layout = Layout(tp=1, pp=1, dp=world, zero=zero, micro_batches=1)
        if _too_large(s, model, layout, dtype, budget):
            continue
        row, _ = step3d.measure_layout(s, model, layout, dtype, [], check=False)
        exposed = row.get("dp_exposed_us")
        if row.get("status") != "ok" or exposed is None:
            continue
        span = "node" if s.rt.nnodes == 1 else "nodes"
        modelled, _ = dp_collectives_us(Inputs(fits=inputs.fits, overlap={kind: 0.0}), layout,
                                        span, params_per_rank(model, layout) * elt)
        overlap, wrapper = split_exposed(exposed, modelled, model.layers)
        if wrapper:
            inputs.wrapper_us_per_layer[kind] = wrapper
        else:
            inputs.overlap[kind] = overlap
        inputs.overlap_layouts[kind] = layout.label()
        s.console.log(f"  {kind}: {exposed / 1e3:.2f} ms exposed in a step of "
                      f"{row['step_us'] / 1e3:.2f} ms; the fits give its collectives "
                      f"{modelled / 1e3:.2f} ms: " + (
                          f"{overlap:.0%} of them hidden" if not wrapper else
                          f"none hidden, and {wrapper / 1e3:.2f} ms per layer of the "
                          "wrapper's own"))
