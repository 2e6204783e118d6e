"""`distbench step`: one step.csv row per layout (tp x pp x dp, a ZeRO stage, micro-batches),
each built on a fresh device mesh by steps.mesh_model and measured on every rank at once, timed
as every command times (warmup, barrier, timed loop, cross-rank statistics):

1. the build and two untimed steps (DDP settles its buckets in them); with --check the first is
   compared with a single-rank reference, or a small model in the same layout is built and
   checked first when the configured one is too large for the reference;
2. one step under the dispatcher's collective counter, its calls told apart by process group:
   the bytes of each mesh dimension; and the state the rank holds;
3. the step itself (step_us);
4. compute-only: the rank's own layers as plain modules, the same micro-batches forward and
   backward and AdamW on what its optimizer steps, no communication;
5. each dimension's counted calls replayed alone on its own group (the alone columns).

The parts: step = compute_only + bubble + exposed communication. The bubble is what the 1F1B
schedule leaves idle even with free communication, (pp - 1) micro-batches' forward and
backward, and (pp - 1) / v of them interleaved (v virtual stages: each slot is a chunk's, 1/v
of the rank's layers); exposed_comm = step - compute_only - bubble. TP's and PP's calls sit on
the critical path (nothing computes while a layer's all-reduce or a stage's input is awaited),
so each is taken as exposed in full, up to what is left; DP's exposed share is the rest.
"""

from __future__ import annotations

import gc
import math

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.measure import Settings, timed_samples, timing_cells
from distbench.core.tables import Output, format_table, plural
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.parallel.device_mesh import layout_mesh, release_groups
from distbench.planner.layouts import Layout
from distbench.planner.memory import held_by_step, memory, step_inputs_bytes
from distbench.planner.models import ModelSpec, model_text, parse_model
from distbench.planner.ranking import layout_columns
from distbench.run.comm_trace import ranks_of
from distbench.run.session import Session
from distbench.steps import mesh_model, recipe
from distbench.steps.common import check_against_reference, write_rows
from distbench.steps.comms import CommCall, op_bytes, op_counts, replay, replay_p2p, replayable
from distbench.steps.dp_model import hold_still
from distbench.steps.reference import RTOL, Reference

DIMS = ("tp", "pp", "dp")
# The reference (the whole model on the whole batch, forward and backward on every rank) may
# cost this many FLOPs; a larger model is checked on a small one in the same layout.
CHECK_MAX_FLOPS = 1e10


def run(s: Session, output: Output, model: ModelSpec, layouts: list[Layout],
        notes: list[str]) -> int:
    """`model` and `layouts`: what the options select (kinds/step/options.py); `notes`, what
    was left out of them and why."""
    # torch's own objects, loaded by now, are set aside: each layout's collection walks only
    # what the layout made
    gc.freeze()
    rt, opts = s.rt, s.opts
    dtype = TORCH_DTYPES[opts.dtype]
    named = parse_model("--model", opts.model)
    if named.vocab:
        notes.append(f"the model's vocabulary ({named.vocab:,}) is left out: step builds no "
                     "embedding or LM head")
    s.console.log(f"step: {model.describe()}; {plural(len(layouts), 'layout')} on "
                  f"{plural(rt.world, 'rank')}, {plural(rt.nnodes, 'node')}, backend "
                  f"{rt.backend}")
    for note in notes:
        s.console.log(note)
    schedules = sorted({lay.schedule for lay in layouts if lay.schedule})
    details: dict = {"seed": mesh_model.SEED, "model": model.to_json(),
                     "schedule": ",".join(schedules), "layouts": {},
                     "check": {"enabled": opts.check, "rtol": RTOL["step"][opts.dtype]}}
    s.console.lines(format_table(output.console, [], title=(
        f"step  {opts.dtype}  ranks {rt.world}  nodes {rt.nnodes}  backend {rt.backend}  "
        f"{model.describe()}")))
    sink = s.sink(output)
    return write_rows(s, sink, output, details, "layouts", [
        (layout.label(), lambda bad, layout=layout: measure_layout(
            s, model, layout, dtype, bad, opts.check)) for layout in layouts])


# ---------------------------------------------------------------------------------------------
# One layout


def measure_layout(s: Session, model: ModelSpec, layout: Layout, dtype, bad: list[str],
                   check: bool) -> tuple[dict, dict]:
    """One layout measured on every rank: (the step.csv row, what run.json keeps of it). What it
    found wrong goes into `bad`. Refused before anything is built where a rank's device has no
    room for it (recipe.fits_here). Leaves nothing behind for the next layout: its modules are
    collected, the memory handed back and its mesh's process groups destroyed."""
    device = s.rt.device
    dtype_name = str(dtype).removeprefix("torch.")
    row = _base_row(s, model, layout, dtype_name)
    s.phase(f"step {layout.label()} (memory)", s.opts.timeout)
    reason = recipe.fits_here(s, held_by_step(model, layout, dtype.itemsize), layout.label())
    if reason:
        return _skipped(row, reason)
    mesh = layout_mesh(layout, device)
    measured = _measure_on(s, mesh, model, layout, dtype, row, bad, check)
    recipe.free(device)
    release_groups(mesh)
    return measured


def _measure_on(s: Session, mesh, model: ModelSpec, layout: Layout, dtype, row: dict,
                bad: list[str], check: bool) -> tuple[dict, dict]:
    rt, timeout = s.rt, s.opts.timeout
    device, label = rt.device, f"step {layout.label()}"
    dtype_name = str(dtype).removeprefix("torch.")
    notes: list[str] = []
    info: dict = {}
    verdict: dict = {}
    ref, cmodel = None, model
    if check:
        cmodel = check_model(model, layout)
        ref = _reference(cmodel, dtype)
        if cmodel != model:
            notes.append(f"checked on {model_text(cmodel)} (the model is too large for a "
                         "single-rank reference on every rank)")
            s.phase(f"{label} (check)", timeout)
            built, reason = _checked_build(s, mesh, cmodel, layout, dtype, ref,
                                           f"{label} (check)")
            if reason:
                return _skipped(row, reason)
            verdict = _judge(s, built[1], cmodel, layout, dtype_name, bad)
            built = None
            recipe.free(device)

    s.phase(f"{label} (build and first steps)", timeout)
    built, reason = _checked_build(s, mesh, model, layout, dtype,
                                   ref if cmodel == model else None,
                                   f"{label} (build and first steps)")
    if reason:
        return _skipped(row, reason)
    mm, pairs = built
    built = None
    if pairs is not None:
        verdict = _judge(s, pairs, cmodel, layout, dtype_name, bad)
        pairs = None
    if verdict:
        info["check"] = verdict
        if verdict["wrong"]:
            notes.append(verdict["wrong"])

    # the check's reference, kept on the host for the next layout, is not this layout's
    kept = [(r.grads, r.params) for r in _REFERENCE.values()]
    calls, host_peak = recipe.counted_with_peak(
        s, label, mm.step, [mm.stage, mm.optimizer, mm.x, mm.target],
        [d for pair in kept for d in pair])
    state = recipe.max_over_ranks([mm.state_bytes()], device)[0]
    by_dim, other = split_by_dimension(calls, mesh, layout)
    if other:
        notes.append(f"collectives on no mesh dimension's group: {op_counts(other)}")
    dim_bytes = recipe.max_over_ranks([sum(c.size_bytes for c in by_dim[d]) for d in DIMS],
                                      device)
    info["collectives_counted"] = {d: op_counts(by_dim[d]) for d in DIMS}
    info["bytes_counted"] = {d: op_bytes(by_dim[d]) for d in DIMS}

    st, peak = recipe.timed_with_peak(s, label, mm.step)
    peak = peak if peak is not None else host_peak
    if recipe.max_over_ranks([float(mm.loss is not None and not torch.isfinite(mm.loss))],
                             device)[0]:
        notes.append("the loss is not finite: timed on infs or NaNs, which a GPU multiplies "
                     "faster than numbers")

    s.phase(f"{label} compute-only (build)", timeout)
    pp_rank, shards = mm.pp_rank, mm.optimizer_shards()
    mm = None  # the layout's model and states go before compute-only's are built
    recipe.free(device)
    compute, fb_us = _compute_only(s, model, layout, dtype, pp_rank, shards, label)
    recipe.free(device)

    alone = {}
    for d in DIMS:
        alone[d], left = _alone(s, d, by_dim[d], mesh, layout, label)
        if left:
            notes.append(f"{d}: not replayed alone: {left}")

    step_us, compute_us = st.time_us, compute.time_us
    bubble_us = bubble_time(layout, fb_us)
    exposed = step_us - compute_us - bubble_us
    parts = attribute_exposed(exposed, alone, layout)
    if layout.dp == 1 and exposed > parts["tp"] + parts["pp"]:
        notes.append(f"{(exposed - parts['tp'] - parts['pp']) / 1e3:.3g} ms of the exposed time "
                     "is no dimension's communication alone (the wrappers' own work)")
    info.update(compute_forward_backward_us=fb_us, state_bytes=state)
    row.update({
        **timing_cells(st, "step_us"), "compute_only_us": compute_us,
        "tp_comm_alone_us": alone["tp"], "pp_comm_alone_us": alone["pp"],
        "dp_comm_alone_us": alone["dp"], "exposed_comm_us": exposed,
        "tp_exposed_us": parts["tp"], "pp_exposed_us": parts["pp"], "dp_exposed_us": parts["dp"],
        "bubble_us": bubble_us, "tp_bytes_per_step": int(dim_bytes[0]),
        "pp_bytes_per_step": int(dim_bytes[1]), "dp_bytes_per_step": int(dim_bytes[2]),
        "state_bytes_per_rank": int(state), "peak_mem_bytes": peak,
        "samples_per_s": model.batch / (step_us / 1e6),
        "max_abs_err": verdict.get("max_abs_err"),
        "status": "wrong" if verdict.get("wrong") else "ok", "note": "; ".join(notes),
    })
    return row, info


def _base_row(s: Session, model: ModelSpec, layout: Layout, dtype_name: str) -> dict:
    rt = s.rt
    p, m = layout.pp, layout.micro_batches
    elt = TORCH_DTYPES[dtype_name].itemsize
    return {"model": model_text(model), "tp": layout.tp, "pp": p, "dp": layout.dp,
            "zero": layout.zero, "micro_batches": m, "recompute": layout.recompute,
            "model_mem_bytes": int(memory(model, layout, elt).total
                                   + step_inputs_bytes(model, layout, elt)),
            "micro_batch_size": layout.micro_batch_size(model),
            "schedule": layout.schedule, "virtual_stages": layout.virtual_stages,
            **layout_columns(layout), "dtype": dtype_name,
            "world_size": rt.world, "nnodes": rt.nnodes, "layers": model.layers,
            "hidden_size": model.hidden_size, "ffn_size": model.ffn_size, "heads": model.heads,
            "seq_len": model.seq_len, "batch": model.batch, "params": model.params,
            "bubble_analytic": (p - 1) / (layout.virtual_stages * m + p - 1),
            "backend": rt.backend}


def _skipped(row: dict, reason: str) -> tuple[dict, dict]:
    note = f"cannot run here: {reason}"
    return {**row, "status": "skipped", "note": note}, {"skipped": note}


# ---------------------------------------------------------------------------------------------
# Build, first steps, check


def _checked_build(s: Session, mesh, model: ModelSpec, layout: Layout, dtype, ref,
                   label: str):
    """((the built layout, the check's pairs or None), "") after two untimed steps, the first
    compared with `ref` when given; or (None, why) on every rank when some rank could not."""
    device = s.rt.device

    def build_and_step():
        eps = ref.eps if ref is not None else 1e-8
        mm = mesh_model.build(model, layout, device, dtype, eps, mesh)
        pairs = None
        if ref is not None:
            pairs = mesh_model.check_step(mm, ref, _dp_mean(mm))
        # from here the steps keep the weights: one at the check's learning rate already
        # sends a deep model's activations to inf (1.2B, 24 layers: NaN after one step), and a
        # GPU multiplies NaNs 20% faster than numbers (benchmarks/layer_alone.py)
        hold_still(mm.optimizer)
        if ref is None:
            mm.step()
        mm.step()  # DDP rebuilds its buckets as its second step starts
        timing.sync(device)
        return mm, pairs

    return recipe.agreed(s, label, build_and_step)


def _judge(s: Session, pairs, cmodel: ModelSpec, layout: Layout, dtype_name: str,
           bad: list[str]) -> dict:
    """The check's verdict, agreed by every rank; what was wrong also goes into `bad`."""
    rtol = RTOL["step"][dtype_name]
    c = check_against_reference(s, pairs, rtol)
    wrong = ""
    if c.worst_ratio > 1:
        wrong = (f"WRONG: {c.worst} off by {c.max_abs_err:.3g} ({c.worst_ratio:.3g} x "
                 "tolerance)")
        bad.append(f"step {layout.label()} {dtype_name}: {c.worst} differs from the "
                   f"single-rank reference by {c.max_abs_err:.3g}, {c.worst_ratio:.3g} x the "
                   f"tolerance ({rtol:g} x max|ref|)")
    return {"model": model_text(cmodel), "max_abs_err": c.max_abs_err,
            "worst_err_over_tolerance": c.worst_ratio, "worst": c.worst, "wrong": wrong}


def _dp_mean(mm: mesh_model.MeshModel):
    group, dp = mm.mesh["dp"].get_group(), mm.layout.dp

    def mean(t: torch.Tensor) -> torch.Tensor:
        if dp > 1:
            dist.all_reduce(t, group=group)
            t = t / dp
        return t

    return mean


_REFERENCE: dict = {}


def _reference(model: ModelSpec, dtype) -> Reference:
    """The single-rank reference, kept for the next layout of the same model (it does not
    depend on the layout: every layout trains the same samples)."""
    key = (model, str(dtype))
    if key not in _REFERENCE:
        _REFERENCE.clear()
        _REFERENCE[key] = mesh_model.reference(model, dtype)
    return _REFERENCE[key]


def check_model(model: ModelSpec, layout: Layout) -> ModelSpec:
    """`model` when its reference is cheap enough, else a small one the layout also fits: the
    same layers, two heads per TP rank of 8 dimensions (one kv head per TP rank where the model
    groups them), the same MLP, one sample per micro-batch, a sequence of 8 (or one a token
    per TP rank, for sequence parallelism)."""
    tokens = model.batch * model.seq_len
    if model.layers * model.flops_per_layer(tokens) <= CHECK_MAX_FLOPS:
        return model
    heads = 2 * layout.tp
    kv_heads = layout.tp if model.kv_heads < model.heads else heads
    return ModelSpec(name="check", layers=model.layers, hidden_size=8 * heads,
                     ffn_size=16 * heads, heads=heads, kv_heads=kv_heads, gated=model.gated,
                     seq_len=math.lcm(8, layout.tp), batch=layout.dp * layout.micro_batches)


# ---------------------------------------------------------------------------------------------
# Communication per dimension


def split_by_dimension(calls: list[CommCall], mesh, layout: Layout
                       ) -> tuple[dict[str, list[CommCall]], list[CommCall]]:
    """The counted calls by the mesh dimension whose ranks their process group holds; the calls
    on no dimension's ranks apart, told by the ranks a call's group holds. A dimension of size 1
    issues nothing."""
    dims = {}
    for d in DIMS:
        if getattr(layout, d) > 1:
            dims[tuple(dist.get_process_group_ranks(mesh[d].get_group()))] = d
    by_dim: dict[str, list[CommCall]] = {d: [] for d in DIMS}
    other: list[CommCall] = []
    seen: dict[str, str | None] = {}
    for c in calls:
        if c.group not in seen:
            seen[c.group] = dims.get(ranks_of(c.group))
        d = seen[c.group]
        (by_dim[d] if d else other).append(c)
    return by_dim, other


def _alone(s: Session, dim: str, calls: list[CommCall], mesh, layout: Layout, label: str
           ) -> tuple[float, dict]:
    """The dimension's calls replayed alone on its group, timed on every rank at once (each
    rank its own group's); 0 for a dimension of size 1. What could not be replayed, by op."""
    if getattr(layout, dim) == 1:
        return 0.0, {}
    group = mesh[dim].get_group()
    if dim == "pp":
        fn, left = replay_p2p(calls, s.rt.device, group), {}
    else:
        ok, left = replayable(calls)
        fn = replay(ok, s.rt.device, group=group)
    s.phase(f"{label} {dim} communication alone (setup)", s.opts.timeout)
    return recipe.timed(s, f"{label} {dim} communication alone", fn).time_us, left


def bubble_time(layout: Layout, forward_backward_us: float) -> float:
    """What 1F1B leaves idle with free communication: a rank computes its m micro-batches in
    (m + pp - 1) slots, so (pp - 1) / m of its forward and backward time; interleaved, its v x m
    chunk passes in (v m + pp - 1) slots, (pp - 1) / (v m)."""
    return (layout.pp - 1) / (layout.virtual_stages * layout.micro_batches) \
        * forward_backward_us


def attribute_exposed(exposed: float, alone: dict[str, float], layout: Layout
                      ) -> dict[str, float]:
    """The exposed communication split by dimension: TP's and PP's calls block the critical path,
    so each is exposed in full, up to what is left (TP first); DP's share is the rest (0 with
    dp 1: nothing to hide behind). Never below 0."""
    rest = max(exposed, 0.0)
    out = {}
    for d in ("tp", "pp"):
        out[d] = min(alone[d], rest)
        rest -= out[d]
    out["dp"] = rest if layout.dp > 1 else 0.0
    return out


# ---------------------------------------------------------------------------------------------
# Compute-only


def _compute_only(s: Session, model: ModelSpec, layout: Layout, dtype, pp_rank: int,
                  shards: list, label: str) -> tuple[timing.Stats, float]:
    """The rank's own work with no communication, timed; and its forward-and-backward part in
    microseconds per step, the mean over ranks."""
    rt = s.rt
    co = mesh_model.build_compute_only(model, layout, pp_rank, shards, rt.device, dtype)

    settings = Settings.of(s)
    samples = timed_samples(settings, co.step, f"{label} compute-only",
                            before_loop=lambda: co.forward_backward.reset(settings.iters or 0)
                            ).samples
    s.phase(f"{label} compute-only (statistics)", s.opts.timeout)
    st = timing.summarize(samples, 0, rt.device)
    fb = torch.tensor([co.forward_backward.seconds() / len(samples) * 1e6],
                      dtype=torch.float64, device=rt.device)
    dist.all_reduce(fb)
    return st, float(fb.item()) / rt.world


# ---------------------------------------------------------------------------------------------
