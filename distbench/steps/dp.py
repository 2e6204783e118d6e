"""`distbench dp`: one dp.csv row per mode (and per DDP bucket size), each measured on every rank
at once and timed as every command times (warmup, barrier, timed loop, cross-rank statistics):

1. two untimed steps (DDP settles its buckets in them), then one under the dispatcher's collective
   counter that also measures the state this rank holds;
2. the step itself (step_us);
3. the same work with the communication removed (compute_only_us);
4. the counted collectives replayed alone, back to back (comm_alone_us);
5. with --check, three steps from the seed against a single rank on the global batch.

t1, the whole model stepping on one rank's batch on rank 0 alone, is timed once: weak scaling,
so efficiency = t1 / step.
"""

from __future__ import annotations

import gc

from distbench.bench import timing
from distbench.bench.measure import timing_cells
from distbench.core.tables import Output, format_table, plural
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.run.session import Session
from distbench.steps import dp_formulas as formulas
from distbench.steps import dp_model as strat
from distbench.steps import recipe
from distbench.steps.common import (
    NO_T1,
    check_against_reference,
    time_on_rank0_alone,
    write_rows,
)
from distbench.steps.comms import bus_bytes, op_bytes, op_counts, replay, replayable
from distbench.steps.reference import RTOL
from distbench.steps.stacks import StackShape

SEED = 1234
# A check on the configured shapes costs this many FLOPs at most (the reference runs the whole
# global batch, then every mode its share, CHECK_STEPS steps each); larger ones are checked on
# SMALL.
CHECK_MAX_FLOPS = 2e9


# The check's shape when the configured one is too large: dimensions that no world size from 2
# to 4 divides (67 rows, 33 columns; the attention's 99), so FSDP's padding is checked too.
SMALL = StackShape(hidden_size=33, ffn_size=67, heads=3, seq_len=8, micro_batch_size=2,
                   layers=2)


def check_shape(kind: str, shape: StackShape, world: int) -> tuple[StackShape, bool]:
    shapes = formulas.param_shapes(kind, shape.hidden_size, shape.ffn_size, shape.layers)
    cost = 6 * formulas.param_count(shapes) * shape.tokens * world * strat.CHECK_STEPS
    if cost <= CHECK_MAX_FLOPS:
        return shape, True
    return SMALL, False


def check_bucket(bucket: float | None, shape: StackShape, check_sh: StackShape, block: str
                 ) -> float | None:
    """The bucket size that splits the check's gradients in about as many buckets as the
    configured model's (None for FSDP, which has no buckets)."""
    if bucket is None:
        return None
    def psi(sh: StackShape) -> int:
        return formulas.param_count(formulas.param_shapes(block, sh.hidden_size, sh.ffn_size,
                                                          sh.layers))
    return bucket * psi(check_sh) / psi(shape)


def run(s: Session, output: Output) -> int:
    # recipe.free collects between rows; torch's own objects, loaded by now and alive to the
    # end, are set aside so that each collection walks only what the rows made (2-3 CPU-s a
    # rank a run)
    gc.freeze()
    rt, opts = s.rt, s.opts
    shape = StackShape.from_options(opts)
    dtype = TORCH_DTYPES[opts.dtype]
    shapes = formulas.param_shapes(opts.block, shape.hidden_size, shape.ffn_size, shape.layers)
    psi = formulas.param_count(shapes)
    elt = dtype.itemsize
    check_sh, on_configured = check_shape(opts.block, shape, rt.world)
    s.console.log(f"dp: {opts.block} x {plural(shape.layers, 'layer')}, {psi:,} parameters "
                  f"({psi * elt / 1e6:.1f} MB in {opts.dtype}), {plural(rt.world, 'rank')}, "
                  f"{plural(rt.nnodes, 'node')}, backend {rt.backend}; each rank trains "
                  f"{shape.micro_batch_size} x "
                  f"{shape.seq_len} tokens per step (weak scaling)")
    details: dict = {"seed": SEED, "params": psi, "shape": shape.to_json(), "block": opts.block,
                     "modes": {}, "check": {"enabled": opts.check, "shape": check_sh.to_json(),
                                            "configured_shapes": on_configured,
                                            "rtol": RTOL["dp"][opts.dtype]}}
    batch = strat.local_batch(shape, SEED, rt.rank, rt.device, dtype)
    t1 = time_on_rank0_alone(s, "dp t1 (the whole model on rank 0 alone)", lambda: (
        strat.single_rank_step(opts.block, shape, SEED, rt.device, dtype, batch)))
    ref = None
    if opts.check:
        s.console.log(f"check: every mode vs one rank on the global batch, "
                      f"{check_sh.describe()}" + ("" if on_configured else
                                                  " (the configured shapes are too large)"))
        s.phase("dp single-rank reference (check)", opts.timeout)
        ref = strat.reference(opts.block, check_sh, SEED, rt.world, dtype)
    s.console.lines(format_table(output.console, [], title=(
        f"dp  {opts.dtype}  ranks {rt.world}  nodes {rt.nnodes}  backend {rt.backend}  "
        f"{opts.block}  {shape.describe()}  params {psi:,}")))
    sink = s.sink(output)
    return write_rows(s, sink, output, details, "modes", [
        (_label(mode, bucket), lambda bad, mode=mode, bucket=bucket: _measure(
            s, mode, bucket, shape, dtype, batch, t1, ref, check_sh, on_configured, bad))
        for mode, bucket in _rows(opts)])


def _rows(opts) -> list[tuple[str, float | None]]:
    rows: list[tuple[str, float | None]] = []
    for mode in opts.modes:
        if mode == "ddp":
            rows += [(mode, b) for b in opts.bucket_cap_mb]
        else:
            rows.append((mode, opts.bucket_cap_mb[0] if mode == "zero1" else None))
    return rows


def _label(mode: str, bucket: float | None) -> str:
    return mode if bucket is None else f"{mode} {bucket:g} MiB"


def _first_steps(step, device) -> None:
    for _ in range(2):  # DDP rebuilds its buckets (a broadcast) as the second step starts
        step()
    timing.sync(device)


def _base_row(s: Session, mode: str, bucket: float | None, shape: StackShape, psi: int) -> dict:
    rt, opts = s.rt, s.opts
    return {"mode": mode, "bucket_cap_mb": bucket, "dtype": opts.dtype, "world_size": rt.world,
            "nnodes": rt.nnodes, "block": opts.block, "hidden_size": shape.hidden_size,
            "ffn_size": shape.ffn_size, "heads": shape.heads, "seq_len": shape.seq_len,
            "micro_batch_size": shape.micro_batch_size, "layers": shape.layers, "params": psi,
            "backend": rt.backend}


def _measure(s: Session, mode: str, bucket: float | None, shape: StackShape, dtype, batch,
             t1: float | None, ref, check_sh: StackShape, on_configured: bool, bad: list[str]
             ) -> tuple[dict, dict]:
    rt, opts = s.rt, s.opts
    n, device, label = rt.world, rt.device, _label(mode, bucket)
    shapes = formulas.param_shapes(opts.block, shape.hidden_size, shape.ffn_size, shape.layers)
    psi = formulas.param_count(shapes)
    elt = dtype.itemsize
    row = _base_row(s, mode, bucket, shape, psi)
    slow = s.faults.before_collective()

    # Agreed twice (recipe.agreed): after the build (no rank steps into a collective a peer
    # will never join) and after the first steps (a backend that lacks a collective fails
    # there, on every rank).
    s.phase(f"dp {label} (build)", opts.timeout)
    trainer, reason = recipe.agreed(s, f"dp {label} (build)", lambda: strat.build(
        mode, opts.block, shape, SEED, device, dtype, bucket, batch,
        before_allreduce=slow))
    if not reason:
        strat.hold_still(trainer.optimizer)  # checked apart (mode_vs_reference): timed as built
        s.phase(f"dp {label} (first steps)", opts.timeout)
        _, reason = recipe.agreed(s, f"dp {label} (first steps)",
                                  lambda: _first_steps(trainer.step, device))
    if reason:
        trainer = None
        note = f"cannot run here: {reason}"
        return {**row, "status": "skipped", "note": note}, {"skipped": note}

    notes: list[str] = []
    if n == 1:
        notes.append("1 rank: nothing to overlap; step - compute_only is the wrappers' own cost")
    state, calls = recipe.counted(s, f"dp {label}", trainer.measured_step)
    formula_bytes = formulas.bytes_per_step(mode, shapes, elt, n)
    counted_bytes = sum(c.size_bytes for c in calls)
    if counted_bytes != formula_bytes:
        notes.append(f"{mode} moved {counted_bytes} B per step, the formula says {formula_bytes} B")
    state_bytes = recipe.max_over_ranks([sum(state.values())], device)[0]
    st, peak = recipe.timed_with_peak(s, f"dp {label} step", trainer.step)

    s.phase(f"dp {label} compute-only (build)", opts.timeout)
    plan = strat.compute_plan(trainer)
    trainer = None  # the mode's model and states go before compute-only's are built
    recipe.free(device)
    compute_step = strat.build_compute_only(plan, opts.block, shape, SEED, device, dtype,
                                            bucket)
    _first_steps(compute_step, device)  # DDP's bucket rebuild, outside the timed steps
    compute = recipe.timed(s, f"dp {label} compute-only", compute_step)
    compute_step = plan = None
    recipe.free(device)

    ok_calls, left = replayable(calls)
    if left:
        notes.append(f"not replayed alone: {left}")
    alone_us = None
    if ok_calls:
        s.phase(f"dp {label} communication alone (setup)", opts.timeout)
        alone_us = recipe.timed(s, f"dp {label} communication alone",
                                replay(ok_calls, device, slow)).time_us
        recipe.free(device)

    step_us, compute_us = st.time_us, compute.time_us
    exposed = step_us - compute_us
    overlap = None
    if ok_calls:
        overlap, clamped = formulas.overlap_pct(exposed, alone_us)
        if clamped:
            notes.append(clamped)
    elif n > 1:
        notes.append("no collectives issued: nothing to overlap")
    busbw = bus_bytes(ok_calls, n) / (alone_us / 1e6) / 1e9 if alone_us else None
    table = formulas.state_bytes(mode, shapes, opts.dtype, n)
    info = {"collectives_counted": op_counts(calls), "bytes_counted": op_bytes(calls),
            "bytes_per_step_formula": formula_bytes, "state_bytes_measured": state,
            "state_bytes_formula": table}

    max_err = None
    status = "ok"
    if opts.check:
        s.phase(f"dp {label} (check)", opts.timeout)
        rtol = RTOL["dp"][opts.dtype]
        pairs = strat.mode_vs_reference(mode, opts.block, check_sh, SEED, rt.rank, n, device,
                                        dtype, check_bucket(bucket, shape, check_sh, opts.block),
                                        ref)
        c = check_against_reference(s, pairs, rtol)
        pairs = None
        recipe.free(device)
        max_err = c.max_abs_err
        info["check"] = {"max_abs_err": max_err, "worst_err_over_tolerance": c.worst_ratio,
                         "worst": c.worst}
        if not on_configured:
            notes.append(f"checked on {check_sh.describe()}")
        if c.worst_ratio > 1:
            status = "wrong"
            notes.append(f"WRONG: {c.worst} off by {max_err:.3g} ({c.worst_ratio:.3g} x "
                         "tolerance)")
            bad.append(f"dp {label} {opts.dtype}: {c.worst} differs from the single-rank "
                       f"reference by {max_err:.3g}, {c.worst_ratio:.3g} x the tolerance "
                       f"({rtol:g} x max|ref|)")
    if t1 is None:
        notes.append(NO_T1)

    row.update({
        **timing_cells(st, "step_us"), "compute_only_us": compute_us,
        "comm_alone_us": alone_us, "exposed_comm_us": exposed, "overlap_pct": overlap,
        "bytes_per_step": formula_bytes, "bytes_counted": counted_bytes,
        "implied_busbw_gbps": busbw,
        "state_bytes_per_rank": int(state_bytes), "state_bytes_formula": round(table),
        "peak_mem_bytes": peak,
        "samples_per_s": n * shape.micro_batch_size / (step_us / 1e6),
        "t1_us": None if t1 is None else t1 * 1e6,
        "efficiency": None if t1 is None else t1 * 1e6 / step_us, "max_abs_err": max_err,
        "status": status, "note": "; ".join(notes),
    })
    return row, info
