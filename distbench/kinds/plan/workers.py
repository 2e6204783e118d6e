"""`distbench plan` on workers: the plan's inputs measured on the ranks at hand, the plan made
from them (kinds/plan/pipeline.py, as from earlier runs), then `--validate K` of its layouts run
for real (kinds/plan/validation.py).

The inputs are measured by kinds/plan/measurements.py. Every rank ends up with the same
inputs, so every rank makes the same plan and picks the same layouts to validate."""

from __future__ import annotations

import gc
import math

import torch
import torch.distributed as dist

from distbench.core.exitcodes import EXIT_OK
from distbench.core.sizes import format_size
from distbench.core.tables import plural
from distbench.kinds.plan import pipeline, validation
from distbench.kinds.plan.cluster import memory_per_gpu, named_layouts
from distbench.kinds.plan.measurements import INPUT_STAGES, layer_us, measure_inputs
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.planner import assemble
from distbench.planner import ranking as planning
from distbench.planner.inputs import Inputs
from distbench.planner.memory import held_by_step, usable_bytes
from distbench.planner.models import ModelSpec, parse_model
from distbench.platform import env, limits
from distbench.run.session import Session


def run(s: Session) -> int:
    gc.freeze()  # torch's objects are set aside: the layouts' collections walk only their own
    rt, opts = s.rt, s.opts
    model: ModelSpec = parse_model("--model", opts.model)
    dtype = TORCH_DTYPES[opts.dtype]
    gpn = opts.gpus_per_node or rt.world // max(1, rt.nnodes)
    gpus = opts.gpus or rt.world
    budget = rank_budget(s)
    s.console.log(f"plan: {model.describe()}; inputs measured on {plural(rt.world, 'rank')}, "
                  f"{plural(rt.nnodes, 'node')}, backend {rt.backend}, within "
                  f"{format_size(int(budget))} a rank")
    # the bar's steps: each kind of input measured, then each layout validated
    s.console.start_progress(len(INPUT_STAGES) + opts.validations)
    inputs = measure_inputs(s, model, dtype, gpn, budget, named_layouts(opts, gpus, gpn))
    measured = Inputs.from_json(inputs.to_json())
    details: dict = {"model": model.to_json(), "inputs": measured.to_json()}
    memory, memory_from = memory_per_gpu(opts, inputs)
    # the workers plan torch's step from what they measured here: no --gpu scaling nor --mfu
    rows = pipeline.rows(opts, model, inputs, gpus=gpus, per_node=gpn, memory=memory, gpu=None,
                         mfu=None, trainer="torch")
    pipeline.publish(opts, s.run_dir, s.console, rows, model, inputs, measured, gpus=gpus,
                     per_node=gpn, per_node_from=("--gpus-per-node" if opts.gpus_per_node
                                                  else "the workers'"),
                     memory=memory, memory_from=memory_from, trainer="torch")
    if s.record is not None:
        s.record.update(plan=details)
    if not opts.validations:
        s.console.stop_progress()
        return EXIT_OK
    if gpus != rt.world or gpn != rt.world // max(1, rt.nnodes):
        s.console.log(f"--validate runs layouts on the {rt.world} ranks at hand; the plan above "
                      f"is for {gpus}: validating the same model's plan for the workers"
                      + (" (the layouts named with --layout are for the plan's GPUs: not run)"
                         if opts.layouts else ""))
        rows = assemble.plan_rows(model, inputs, rt.world, rt.world // max(1, rt.nnodes),
                                  memory, opts.dtype, opts.zero, recompute=opts.recompute)
    here = [r for r in rows if held_by_step(model, planning.layout_of(r), dtype.itemsize)
            <= budget]
    if len(here) < len(rows):
        s.console.log(f"validating only among the {len(here)} layouts whose ranks fit in "
                      f"{format_size(int(budget))} here")
    for r in rows:
        if r.get("given") and (not r["fits"] or r not in here):
            s.console.log(f"your layout {planning.label(r)} is not validated: it does not fit "
                          + ("the GPU's memory" if not r["fits"] else
                             f"the {format_size(int(budget))} a rank may hold here"))
    return validation.validate(s, model, dtype, here, details, measured,
                               lambda: speed_drift(s, model, dtype, measured))


def rank_budget(s: Session) -> float:
    """What one rank may hold while plan measures, the same on every rank (the least of
    theirs): a GPU's memory less the planner's reserve; on the CPU what our launcher gave each
    worker, else an even share of what this node's memory allows (platform.limits)."""
    device = s.rt.device
    if device.type == "cuda":
        mine = usable_bytes(torch.cuda.get_device_properties(device).total_memory)
    else:
        mine = env.rank_memory()
        if mine is None:
            node = s.rt.ranks[s.rt.rank]["node"] if s.rt.ranks else 0
            local = sum(1 for r in s.rt.ranks if r["node"] == node) or 1
            mine = limits.rank_budget(local)
    t = torch.tensor([math.inf if mine is None else float(mine)], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return float(t.item())


def speed_drift(s: Session, model: ModelSpec, dtype, inputs: Inputs
                ) -> tuple[float | None, str | None]:
    """The machine's own speed between the inputs and the validations: the first layer the
    inputs timed at tp 1 timed again once every layout has run, as a percentage of its first
    time, and the line that says it. A validation's error holds whatever the machine's speed
    moved between the two (on this project's shared VM a run's first minutes measured up to a
    third faster than its validations: docs/measurements/bench-plan.md, runs 26 to 34); None
    where no tp 1 layer of this model was timed here."""
    point = next((c for c in inputs.compute if c.tp == 1 and c.source == "measured here"), None)
    if point is None or model.seq_len > point.tokens:
        return None, None
    again, _ = layer_us(s, model, 1, point.tokens // model.seq_len, dtype)
    drift = (again / point.layer_us - 1) * 100
    return drift, (f"the machine's speed: one layer at tp 1, {point.tokens} tokens, took "
                   f"{again / 1e3:.2f} ms after the validations against "
                   f"{point.layer_us / 1e3:.2f} ms when the inputs were measured ({drift:+.1f}%); "
                   "the errors above hold that drift")
