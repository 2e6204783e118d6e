"""`distbench pp`: pipeline-parallel training steps, the schedules side by side.

Per schedule, one pp.csv row: the step time (timing.warmup_and_calibrate / measure / summarize,
as every command), samples/s, the measured bubble of every pipeline rank beside the analytic
one, the bytes sent across stage boundaries per step, and the scaling view against the same
global problem run on one rank (t1). With --check the pipelined loss and every parameter gradient
are compared with a single-rank reference on the same seed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.measure import Settings, fail_if_wrong, timed_samples, timing_cells
from distbench.core.errors import one_line
from distbench.core.exitcodes import EXIT_OK
from distbench.core.tables import Output, format_table
from distbench.parallel.pipeline import Pipeline, num_stages
from distbench.run.peers import agree
from distbench.run.session import Session
from distbench.steps import pp_model
from distbench.steps.common import NO_T1, check_against_reference, time_on_rank0_alone
from distbench.steps.reference import RTOL
from distbench.steps.stacks import PipelineShape


def _agree(reason: str, device) -> str:
    """A configuration runs only if every rank could set it up."""
    if agree(not reason, device):
        return ""
    return reason or "another rank could not set this schedule up"


def run(s: Session, output: Output) -> int:
    rt, opts = s.rt, s.opts
    # at least 2 ranks, and layers for every stage: opts.check_world saw to it
    shape = PipelineShape.from_options(opts)
    cshape = pp_model.check_shape(shape)
    if opts.check and cshape != shape:
        s.console.log(f"check on a small configuration (hidden {cshape.hidden_size}, seq "
                      f"{cshape.seq_len}, micro-batch size {cshape.micro_batch_size}, same "
                      "layers, micro-batches and stages); the measured one is too large for a "
                      "single-rank reference on every rank")
    if s.record is not None:
        s.record.update(pp={
            "compute_time": "timers around each stage's forward and backward compute inside "
                            "the schedule (PipelineStage.forward_one_chunk/backward_one_chunk; "
                            "the naive schedule's own forward/backward)",
            "bubble_per_stage": "one value per pipeline rank (interleaved: a rank's v stages "
                                "together)",
            "check_shape": {"hidden": cshape.hidden_size, "seq_len": cshape.seq_len,
                            "micro_batch_size": cshape.micro_batch_size} if opts.check else None,
        })
    s.console.lines(format_table(output.console, [], title=(
        f"pp  ranks {rt.world}  nodes {rt.nnodes}  backend {rt.backend}  {shape.dtype}  "
        f"layers {shape.layers}  hidden {shape.hidden_size}  seq {shape.seq_len}  "
        f"micro-batches {shape.micro_batches} x {shape.micro_batch_size}  "
        f"virtual stages {shape.virtual_stages}")))
    t1 = time_on_rank0_alone(s, "pp single-rank run (t1)",
                             lambda: pp_model.SingleRank(shape, rt.device).step)
    ref = None
    if opts.check:
        s.phase("pp single-rank reference (check)", opts.timeout)
        ref = pp_model.SingleRank(cshape, rt.device)
        ref.step()
        timing.sync(rt.device)
    sink = s.sink(output)
    bad: list[str] = []
    for schedule in opts.schedules:
        row = _measure_schedule(s, schedule, shape, cshape, ref, t1, bad)
        sink.append(row)
        s.console.lines(format_table(output.console, [row]))
    fail_if_wrong(bad)
    return EXIT_OK


def _base_row(s: Session, schedule: str, shape: PipelineShape) -> dict:
    rt = s.rt
    v = shape.virtual_stages if schedule == "interleaved-1f1b" else 1
    stages = num_stages(schedule, rt.world, v)
    row = {
        "schedule": schedule, "dtype": shape.dtype, "world_size": rt.world, "nnodes": rt.nnodes,
        "stages": stages, "virtual_stages": v, "layers": shape.layers, "layers_per_stage": "",
        "micro_batches": shape.micro_batches, "micro_batch_size": shape.micro_batch_size,
        "hidden_size": shape.hidden_size, "seq_len": shape.seq_len,
        "bubble_analytic": pp_model.analytic_bubble(schedule, rt.world, shape.micro_batches, v),
        "p2p_bytes_per_step": pp_model.p2p_bytes_per_step(stages, shape.samples, shape.seq_len,
                                                    shape.hidden_size, shape.elt_size),
        "backend": rt.backend, "status": "ok", "note": "",
    }
    if shape.layers >= stages:
        row["layers_per_stage"] = pp_model.layers_per_stage_text(shape.layers, stages)
    return row


def _build(s: Session, schedule: str, shape: PipelineShape) -> tuple[Pipeline | None, str]:
    rt = s.rt
    v = shape.virtual_stages if schedule == "interleaved-1f1b" else 1
    stages = num_stages(schedule, rt.world, v)
    reason, pipe = "", None
    if shape.layers < stages:
        reason = f"{shape.layers} layers cannot fill {stages} stages ({rt.world} ranks x {v})"
    else:
        try:
            pipe = pp_model.build_pipeline(schedule, shape, rt.rank, rt.world, rt.device)
        except ValueError as e:  # the schedule's own requirements (micro-batch counts)
            reason = f"{schedule} cannot run this: {one_line(e)}"
    reason = _agree(reason, rt.device)
    return (None, reason) if reason else (pipe, "")


def _measure_schedule(s: Session, schedule: str, shape: PipelineShape,
                      cshape: PipelineShape, ref, t1: float | None, bad: list[str]) -> dict:
    rt, opts = s.rt, s.opts
    device, n = rt.device, rt.world
    row = _base_row(s, schedule, shape)
    what = f"pp {schedule}"
    s.phase(f"{what} (setup)", opts.timeout)
    pipe, reason = _build(s, schedule, shape)
    if reason:
        row.update(status="skipped", note=reason)
        return row
    # The first steps also exchange the stages' shapes (torch's metadata inference).
    samples = timed_samples(Settings.of(s), pipe.step, what, before_loop=pipe.clock.reset).samples
    compute = pipe.clock.seconds() / len(samples)  # this rank's compute seconds per step

    err, wrong = 0.0, 0
    if opts.check:
        s.phase(f"{what} (check)", opts.timeout)
        check = pipe
        if cshape != shape:
            del pipe
            check = pp_model.build_pipeline(schedule, cshape, rt.rank, rt.world, device)
        check.step()
        timing.sync(device)
        result = check_against_reference(s, pp_model.pp_vs_reference(check, ref),
                                          RTOL["pp"][cshape.dtype])
        err, wrong = result.max_abs_err, result.wrong
        del check
    s.phase(f"{what} (statistics)", opts.timeout)
    st = timing.summarize(samples, 0, device)
    per_rank = torch.zeros(n, dtype=torch.float64, device=device)
    per_rank[rt.rank] = compute
    dist.all_reduce(per_rank, op=dist.ReduceOp.SUM)

    step_s = st.time_us / 1e6
    bubbles = [1 - c / step_s for c in per_rank.tolist()]
    row.update(
        **timing_cells(st, "step_us"), samples_per_s=shape.samples / step_s,
        bubble_measured=sum(bubbles) / len(bubbles),
        bubble_measured_per_stage="/".join(f"{b:.3f}" for b in bubbles),
        max_abs_err=err if opts.check else None)
    if t1 is not None:
        row.update(t1_us=t1 * 1e6, speedup=t1 / step_s, efficiency=t1 / (n * step_s))
    else:
        row.update(note="; ".join(x for x in (row.get("note"), NO_T1) if x))
    if wrong:
        bad.append(f"pp {schedule}: {wrong} tensors differ from the single-rank reference "
                   f"(max abs err {err:.3g})")
    return row
