"""`distbench tp`: forward+backward of Megatron-style tensor-parallel blocks (MLP, attention),
sharded over every rank with torch.distributed.tensor.parallel. One row per block kind:

- step time of the TP stack (timed as every other command times: warmup, barrier, timed loop,
  cross-rank statistics);
- compute-only time: the same per-rank shard shapes as plain nn.Linear modules, no
  communication, timed the same way on every rank at once; comm_pct = 100 x (1 - compute_only/step);
- the scaling view: the same global problem unsharded on rank 0 alone (the others wait at a
  barrier) gives t1, speedup = t1/tn and efficiency = t1/(n tn);
- a correctness check against a single-rank reference built from the same seed.
"""

from __future__ import annotations

from distbench.bench.measure import timing_cells
from distbench.core.tables import Output, format_table, plural
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.parallel.device_mesh import flat_mesh
from distbench.run.buffers import release
from distbench.run.session import Session
from distbench.steps import recipe
from distbench.steps import tp_model as strat
from distbench.steps.common import (
    NO_T1,
    check_against_reference,
    time_on_rank0_alone,
    write_rows,
)
from distbench.steps.comms import op_bytes, op_counts
from distbench.steps.reference import RTOL
from distbench.steps.stacks import StackShape, build_stack, make_inputs, make_step

SEED = 1234


def run(s: Session, output: Output) -> int:
    rt, opts = s.rt, s.opts
    shape = StackShape.from_options(opts)
    dtype = TORCH_DTYPES[opts.dtype]
    s.phase("tp device mesh", opts.timeout)
    mesh = flat_mesh(rt.device, rt.world)
    check_sh, on_configured = strat.check_shape(shape, rt.world)
    sink = s.sink(output)
    s.console.log(f"tp: {', '.join(opts.blocks)} x {plural(shape.layers, 'layer')} on "
                  f"{plural(rt.world, 'rank')}, {plural(rt.nnodes, 'node')}, backend "
                  f"{rt.backend}; t1 = the unsharded stack on rank 0 "
                  "alone while the others wait")
    if opts.check:
        s.console.log(f"check: TP vs single-rank reference on {check_sh.describe()}"
                      + ("" if on_configured else " (the configured shapes are too large)"))
    details: dict = {"seed": SEED, "shape": shape.to_json(), "blocks": {}, "check": {
        "enabled": opts.check, "shape": check_sh.to_json(), "configured_shapes": on_configured,
        "rtol": RTOL["tp"][opts.dtype]}}
    s.console.lines(format_table(output.console, [], title=(
        f"tp  {opts.dtype}  ranks {rt.world}  nodes {rt.nnodes}  backend {rt.backend}  "
        f"{shape.describe()}")))
    return write_rows(s, sink, output, details, "blocks", [
        (kind, lambda bad, kind=kind: _measure_block(s, kind, shape, mesh, dtype, check_sh,
                                                      on_configured, bad))
        for kind in opts.blocks])


def _measure_block(s: Session, kind: str, shape: StackShape, mesh, dtype,
                   check_sh: StackShape, on_configured: bool, bad: list[str]
                   ) -> tuple[dict, dict]:
    rt, opts = s.rt, s.opts
    n, device = rt.world, rt.device
    base = {"block": kind, "dtype": opts.dtype, "world_size": n, "nnodes": rt.nnodes,
            **shape.to_json(), "backend": rt.backend}
    s.phase(f"tp {kind} (build)", opts.timeout)
    built, reason = recipe.agreed(s, f"tp {kind} (build)", lambda: (
        strat.build_sharded(kind, shape, mesh, device, dtype, SEED),
        strat.build_local_shard(kind, shape, n, device, dtype, SEED),
        make_inputs(shape, SEED, device, dtype)))
    if reason:
        note = f"cannot run here: {reason}"
        return {**base, "status": "skipped", "note": note}, {"skipped": note}
    tp_model, local, (x, dy) = built
    built = None
    elt = x.element_size()
    notes: list[str] = []
    if n == 1:
        notes.append("1 rank: no communication; step - compute_only is DTensor's own overhead")

    # One untimed step under the counter: what DTensor really sends, against the formula.
    tp_step = make_step(tp_model, x, dy)
    _, calls = recipe.counted(s, f"tp {kind}", tp_step)
    ar_bytes = strat.allreduce_bytes(kind, shape, elt, n)
    counts, counted = op_counts(calls), op_bytes(calls).get("all_reduce", 0)
    if counted != ar_bytes:
        notes.append(f"DTensor all-reduced {counted} B per step, the formula says {ar_bytes} B")
    others = {op: k for op, k in counts.items() if op != "all_reduce"}
    if others:
        notes.append(f"other collectives: {others}")

    st = recipe.timed(s, f"tp {kind} step", tp_step)
    compute = recipe.timed(s, f"tp {kind} compute-only", make_step(local, x, dy))
    # tp_step holds the sharded model too: both go before rank 0 builds the whole one, with
    # what the allocator keeps of them
    del tp_model, local, tp_step
    release(device)
    # the whole stack exists on rank 0 alone, and only while t1 is timed
    t1 = time_on_rank0_alone(s, f"tp {kind} t1 (unsharded on rank 0)", lambda: make_step(
        build_stack(kind, shape, SEED, device, dtype), x, dy))

    step_s, compute_s = st.time_us / 1e6, compute.time_us / 1e6
    comm, clamped = strat.comm_fraction(step_s, compute_s)
    if clamped:
        notes.append("comm_pct clamped to 0: compute-only took as long as the step")
    busbw = strat.implied_busbw_gbps(ar_bytes, n, step_s, compute_s)
    speedup = efficiency = None
    if t1 is not None:
        speedup, efficiency = strat.scaling(t1, step_s, n)
    else:
        notes.append(NO_T1)

    max_err = None
    info = {"allreduce_bytes_formula": ar_bytes, "allreduce_bytes_counted": counted,
            "collectives_counted": counts,
            "flops_per_rank_per_step": strat.flops_per_rank(kind, shape, n)}
    if opts.check:
        s.phase(f"tp {kind} (check)", opts.timeout)
        rtol = RTOL["tp"][opts.dtype]
        pairs = strat.tp_vs_reference(kind, check_sh, SEED, device, dtype, mesh)
        c = check_against_reference(s, pairs, rtol)
        max_err, ratio, worst = c.max_abs_err, c.worst_ratio, c.worst
        info["check"] = {"max_abs_err": max_err, "worst_err_over_tolerance": ratio,
                         "worst": worst}
        if not on_configured:
            notes.append(f"checked on {check_sh.describe()}")
        if ratio > 1:
            notes.append(f"WRONG: {worst} off by {max_err:.3g} ({ratio:.3g} x tolerance)")
            bad.append(f"tp {kind} {opts.dtype}: {worst} differs from the single-rank reference "
                       f"by {max_err:.3g}, {ratio:.3g} x the tolerance ({rtol:g} x max|ref|)")

    row = {
        **base,  # shape.to_json()'s hidden_size, ffn_size, heads, seq_len...: the CSV's names
        **timing_cells(st, "step_us"), "compute_only_us": compute.time_us,
        "comm_pct": comm * 100,  # percent, like cv_pct
        "tflops_per_rank": strat.flops_per_rank(kind, shape, n) / step_s / 1e12,
        "tokens_per_s": shape.tokens / step_s, "allreduce_bytes_per_step": ar_bytes,
        "implied_busbw_gbps": busbw, "t1_us": None if t1 is None else t1 * 1e6,
        "speedup": speedup, "efficiency": efficiency, "max_abs_err": max_err,
        "status": "wrong" if any(t.startswith("WRONG") for t in notes)
        else "ok", "note": "; ".join(notes),
    }
    return row, info
