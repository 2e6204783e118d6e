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

from distbench import session as session_mod
from distbench import testhooks, timing
from distbench.measure import fail_if_wrong, timed_samples
from distbench.memory import agree
from distbench.results import PP_COLUMNS
from distbench.strategies import pp


def run(opts) -> int:
    return session_mod.run("pp", opts, _body)


def _shape(opts) -> pp.Shape:
    return pp.Shape(hidden=opts.hidden_size, seq_len=opts.seq_len,
                    micro_batch_size=opts.micro_batch_size, micro_batches=opts.micro_batches,
                    layers=opts.layers, dtype=opts.dtype, virtual_stages=opts.virtual_stages)


def _agree(reason: str, device) -> str:
    """A configuration runs only if every rank could set it up."""
    if agree(not reason, device):
        return ""
    return reason or "another rank could not set this schedule up"


def _body(s: session_mod.Session) -> int:
    rt, opts = s.rt, s.opts
    # at least 2 ranks, and layers for every stage: opts.check_world saw to it
    shape = _shape(opts)
    cshape = pp.check_shape(shape)
    if opts.check and cshape != shape:
        s.console.log(f"check on a small configuration (hidden {cshape.hidden}, seq "
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
            "check_shape": {"hidden": cshape.hidden, "seq_len": cshape.seq_len,
                            "micro_batch_size": cshape.micro_batch_size} if opts.check else None,
        })
    _header(s, shape)
    t1 = _single_rank_time(s, shape)
    ref = None
    if opts.check:
        s.step("pp single-rank reference (check)", opts.timeout)
        ref = pp.SingleRank(cshape, rt.device)
        ref.step()
        timing.sync(rt.device)
    sink = s.csv("pp.csv", PP_COLUMNS)
    bad: list[str] = []
    for schedule in opts.schedules:
        row = _measure_schedule(s, schedule, shape, cshape, ref, t1, bad)
        sink.append(row)
        _print_row(s, row)
    fail_if_wrong(bad)
    return session_mod.EXIT_OK


def _single_rank_time(s: session_mod.Session, shape: pp.Shape) -> float | None:
    """t1: the whole model on the whole batch (all micro-batches at once) on rank 0 alone, while
    the other ranks wait at a barrier. A barrier after every step keeps each wait one step long,
    well inside the process group's timeout."""
    rt, opts = s.rt, s.opts
    s.step("pp single-rank run (t1) setup", opts.timeout)
    single, failed = None, 0.0
    if rt.rank == 0:
        try:
            single = pp.SingleRank(shape, rt.device)
        except torch.OutOfMemoryError:
            failed = 1.0
    flag = torch.tensor([failed], dtype=torch.float64, device=rt.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        s.console.log("t1: the whole model does not fit on one rank; no scaling view")
        return None
    warm = max(1, opts.warmup)
    samples: list[float] = []
    for i in range(warm + opts.iters):
        s.step(f"pp single-rank run (t1) step {i + 1}", opts.timeout)
        if single is not None:
            if i < warm:
                single.step()
                timing.sync(rt.device)
            else:
                samples += timing.timed_loop(single.step, 1, rt.device)
        dist.barrier()
    del single
    t1 = torch.tensor([sum(samples) / len(samples) if samples else 0.0], dtype=torch.float64,
                      device=rt.device)
    dist.broadcast(t1, src=0)
    return float(t1.item())


def _base_row(s: session_mod.Session, schedule: str, shape: pp.Shape) -> dict:
    rt = s.rt
    v = shape.virtual_stages if schedule == "interleaved-1f1b" else 1
    stages = pp.num_stages(schedule, rt.world, v)
    row = {
        "schedule": schedule, "dtype": shape.dtype, "world_size": rt.world, "nnodes": rt.nnodes,
        "stages": stages, "virtual_stages": v, "layers": shape.layers, "layers_per_stage": "",
        "micro_batches": shape.micro_batches, "micro_batch_size": shape.micro_batch_size,
        "hidden_size": shape.hidden, "seq_len": shape.seq_len,
        "bubble_analytic": pp.analytic_bubble(schedule, rt.world, shape.micro_batches, v),
        "p2p_bytes_per_step": pp.p2p_bytes_per_step(stages, shape.samples, shape.seq_len,
                                                    shape.hidden, shape.elt_size),
        "backend": rt.backend, "status": "ok", "note": "",
    }
    if shape.layers >= stages:
        row["layers_per_stage"] = pp.layers_per_stage_text(shape.layers, stages)
    return row


def _build(s, schedule: str, shape: pp.Shape) -> tuple[pp.Pipeline | None, str]:
    rt = s.rt
    v = shape.virtual_stages if schedule == "interleaved-1f1b" else 1
    stages = pp.num_stages(schedule, rt.world, v)
    reason, pipe = "", None
    if shape.layers < stages:
        reason = f"{shape.layers} layers cannot fill {stages} stages ({rt.world} ranks x {v})"
    else:
        try:
            pipe = pp.build_pipeline(schedule, shape, rt.rank, rt.world, rt.device)
        except ValueError as e:  # the schedule's own requirements (micro-batch counts)
            reason = f"{schedule} cannot run this: {str(e).strip().splitlines()[0]}"
    reason = _agree(reason, rt.device)
    return (None, reason) if reason else (pipe, "")


def _measure_schedule(s: session_mod.Session, schedule: str, shape: pp.Shape,
                      cshape: pp.Shape, ref, t1: float | None, bad: list[str]) -> dict:
    rt, opts = s.rt, s.opts
    device, n = rt.device, rt.world
    row = _base_row(s, schedule, shape)
    what = f"pp {schedule}"
    s.step(f"{what} (setup)", opts.timeout)
    pipe, reason = _build(s, schedule, shape)
    if reason:
        row.update(status="skipped", note=reason)
        return row
    # The first steps also exchange the stages' shapes (torch's metadata inference).
    samples = timed_samples(s, pipe.step, what, before_loop=pipe.clock.reset)
    compute = pipe.clock.total() / len(samples)  # this rank's compute seconds per step

    err, wrong = 0.0, 0
    if opts.check:
        s.step(f"{what} (check)", opts.timeout)
        check = pipe
        if cshape != shape:
            del pipe
            check = pp.build_pipeline(schedule, cshape, rt.rank, rt.world, device)
        check.step()
        timing.sync(device)
        result = pp.compare(check, ref, lambda t: testhooks.corrupt(rt.rank, t))
        err, wrong = result.max_abs_err, result.wrong
        del check
    s.step(f"{what} (statistics)", opts.timeout)
    st = timing.summarize(samples, wrong, device)
    per_rank = torch.zeros(n, dtype=torch.float64, device=device)
    per_rank[rt.rank] = compute
    dist.all_reduce(per_rank, op=dist.ReduceOp.SUM)
    err_t = torch.tensor([err], dtype=torch.float64, device=device)
    dist.all_reduce(err_t, op=dist.ReduceOp.MAX)
    err = float(err_t.item())

    step_s = st.time_us / 1e6
    bubbles = [1 - c / step_s for c in per_rank.tolist()]
    row.update(
        iters=st.iters, step_us=st.time_us, rank_min_us=st.rank_min_us,
        rank_max_us=st.rank_max_us, slowest_rank=st.slowest_rank, p50_us=st.p50_us,
        p99_us=st.p99_us, cv_pct=st.cv_pct, samples_per_s=shape.samples / step_s,
        bubble_measured=sum(bubbles) / len(bubbles),
        bubble_measured_per_stage="/".join(f"{b:.3f}" for b in bubbles),
        max_abs_err=err if opts.check else None)
    if t1 is not None:
        row.update(t1_us=t1 * 1e6, speedup=t1 / step_s, efficiency=t1 / (n * step_s))
    if st.wrong:
        bad.append(f"pp {schedule}: {st.wrong} tensors differ from the single-rank reference "
                   f"(max abs err {err:.3g})")
    return row


# ---------------------------------------------------------------------------------------------
# The table on rank 0

COLUMNS = [  # (header, unit, width)
    ("schedule", "", 17), ("stages", "", 7), ("layers", "/stage", 14), ("step", "(ms)", 10),
    ("samples/s", "", 11), ("bubble", "meas.", 8), ("bubble", "analytic", 9),
    ("p2p bytes", "per step", 13), ("t1", "(ms)", 10), ("speedup", "", 8), ("effic.", "", 7),
    ("max err", "", 10), ("bubble per stage", "(per rank)", 20),
]


def _line(cells: list[str]) -> str:
    return "".join(c.rjust(w) for c, (_, _, w) in zip(cells, COLUMNS, strict=False))


def _out(s, text: str) -> None:
    if s.console.enabled:
        print(text, flush=True)


def _header(s: session_mod.Session, shape: pp.Shape) -> None:
    rt = s.rt
    _out(s, "#")
    _out(s, f"# pp  ranks {rt.world}  nodes {rt.nnodes}  backend {rt.backend}  {shape.dtype}  "
            f"layers {shape.layers}  hidden {shape.hidden}  seq {shape.seq_len}  "
            f"micro-batches {shape.micro_batches} x {shape.micro_batch_size}  "
            f"virtual stages {shape.virtual_stages}")
    _out(s, "#" + _line([h for h, _, _ in COLUMNS])[1:])
    _out(s, "#" + _line([u for _, u, _ in COLUMNS])[1:])


def _fmt(value, spec: str) -> str:
    return "-" if value is None or value == "" else format(value, spec)


def _print_row(s: session_mod.Session, r: dict) -> None:
    head = [r["schedule"], str(r["stages"]), r["layers_per_stage"] or "-"]
    if r["status"] != "ok":
        _out(s, _line(head) + f"   {r['status']}: {r['note']}")
        return
    _out(s, _line(head + [
        f"{r['step_us'] / 1e3:.2f}", f"{r['samples_per_s']:.1f}",
        f"{r['bubble_measured']:.3f}", f"{r['bubble_analytic']:.3f}",
        str(r["p2p_bytes_per_step"]), _fmt(r.get("t1_us") and r["t1_us"] / 1e3, ".2f"),
        _fmt(r.get("speedup"), ".2f"), _fmt(r.get("efficiency"), ".2f"),
        _fmt(r.get("max_abs_err"), ".2e"), r["bubble_measured_per_stage"]]))
