"""`distbench collective`: every requested op x dtype x redop x placement over the size sweep."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch.distributed as dist

from distbench import session as session_mod
from distbench import timing
from distbench.accounting import bandwidth, layout
from distbench.console import describe
from distbench.measure import fail_if_wrong, measure_case, stats_columns
from distbench.memory import agree, allocate_fitting
from distbench.ops.collectives import SPECS, CollectiveSpec, Ctx, allocate
from distbench.ops.dtypes import TORCH_DTYPES, element_size
from distbench.results import COLLECTIVE_COLUMNS


@dataclass(frozen=True)
class Plan:
    spec: CollectiveSpec
    dtype: str
    redop: str  # "none" for ops that do not reduce
    root: int  # -1 for ops without a root
    in_place: bool
    skip: str = ""  # why this combination cannot run, decided before any measurement


def plans(opts) -> list[Plan]:
    out = []
    for name in opts.ops:
        spec = SPECS[name]
        acc = spec.accounting
        wanted = {"out": [False], "in": [True], "both": [False, True]}[opts.placement]
        for dtype in opts.dtypes:
            for redop in opts.redops if acc.uses_redop else ["none"]:
                skip = ""
                if redop == "avg" and not TORCH_DTYPES[dtype].is_floating_point:
                    skip = "avg needs a floating-point dtype"
                places = [p for p in wanted if p in acc.placements]
                if not places:
                    if opts.placement == "in":  # asked for explicitly: say why not
                        out.append(Plan(spec, dtype, redop, opts.root if acc.uses_root else -1,
                                        True, f"{name} has no in-place form in torch.distributed"))
                        continue
                    places = list(acc.placements)  # out-of-place asked, op is in-place only
                for in_place in places:
                    out.append(Plan(spec, dtype, redop, opts.root if acc.uses_root else -1,
                                    in_place, skip))
    return out


def _probe(plan: Plan, ctx: Ctx, device) -> str:
    """Run the combination once on one element per rank: a dtype or redop the backend lacks
    becomes a skip reason here instead of a crash mid-sweep."""
    reason = ""
    try:
        inp, out = allocate(plan.spec, ctx, 1, TORCH_DTYPES[plan.dtype], device)
        case = plan.spec.build(ctx, inp, out, 1)
        case.prepare()
        case.run()
        timing.sync(device)
    except (RuntimeError, ValueError) as e:
        reason = f"{dist.get_backend()} cannot run this: " + (str(e).strip().splitlines()
                                                               or [type(e).__name__])[0][:200]
    if agree(not reason, device):
        return ""
    return reason or "another rank could not run this combination"


def run(opts) -> int:
    return session_mod.run("collective", opts, _sweep)


def _sweep(s: session_mod.Session) -> int:
    rt, opts, console = s.rt, s.opts, s.console
    n, device = rt.world, rt.device
    sink = s.csv("collective.csv", COLLECTIVE_COLUMNS)
    all_plans = plans(opts)
    if opts.placement == "out" and any(p.in_place for p in all_plans):
        in_only = sorted({p.spec.name for p in all_plans if p.in_place})
        console.log(f"{', '.join(in_only)}: in place only in torch.distributed; "
                    "their rows say in_place=1")
    console.log(f"{len(all_plans)} combinations x {len(opts.sizes)} sizes on {n} ranks, "
                f"{rt.nnodes} node(s), backend {rt.backend}, results in {s.run_dir}/")
    console.start_progress(len(all_plans) * len(opts.sizes))
    bad_rows: list[str] = []
    for plan in all_plans:
        ctx = Ctx(rt.rank, n, plan.root, plan.redop if plan.redop != "none" else "sum",
                  plan.in_place)
        console.section(f"{plan.spec.name}  {plan.dtype}  redop {plan.redop}  root {plan.root}  "
                        f"{'in-place' if plan.in_place else 'out-of-place'}  ranks {n}  "
                        f"nodes {rt.nnodes}  backend {rt.backend}")
        elt = element_size(plan.dtype)
        layouts = [(size, layout(plan.spec.name, size, elt, n)) for size in opts.sizes]
        s.step(f"{plan.spec.name} {plan.dtype} probe", opts.timeout)
        skip = plan.skip or _probe(plan, ctx, device)
        bufs, fitted = (None, 0)
        if not skip:
            counts = [lay.per_rank_count for _, lay in layouts if lay]
            if counts:
                s.step(f"{plan.spec.name} {plan.dtype} allocation", opts.timeout)
                bufs, fitted = allocate_fitting(
                    functools.partial(allocate, plan.spec, ctx, dtype=TORCH_DTYPES[plan.dtype],
                                      device=device), counts, device)
        for size, lay in layouts:
            row = _base_row(plan, rt, size, lay)
            reason = skip or _size_skip(plan, lay, fitted, n, elt)
            if reason:
                row.update(status="skipped", note=reason)
            else:
                what = describe(plan.spec.name, lay.size_bytes, plan.dtype, plan.redop,
                                plan.in_place)
                console.working_on(what)
                row.update(_measure(s, plan, ctx, bufs, size, lay, what))
                if row["wrong"]:
                    bad_rows.append(f"{what}: {row['wrong']} wrong")
            sink.append(row)
            console.row(row)
            console.advance()
        del bufs
    fail_if_wrong(bad_rows)
    return session_mod.EXIT_OK


def _size_skip(plan: Plan, lay, fitted: int, n: int, elt: int) -> str:
    if lay is None:
        need = n * elt if plan.spec.accounting.split else elt
        return f"too small: {n} ranks need at least {need} B of {plan.dtype}"
    if lay.per_rank_count > fitted:
        return "does not fit in device memory"
    return ""


def _base_row(plan: Plan, rt, size: int, lay) -> dict:
    return {
        "op": plan.spec.name, "dtype": plan.dtype, "redop": plan.redop, "root": plan.root,
        "in_place": plan.in_place, "world_size": rt.world, "nnodes": rt.nnodes,
        "size_bytes": lay.size_bytes if lay else size, "count": lay.count if lay else 0,
        "backend": rt.backend, "status": "ok", "note": "",
    }


def _measure(s: session_mod.Session, plan: Plan, ctx: Ctx, bufs, size: int, lay,
             what: str) -> dict:
    case = plan.spec.build(ctx, bufs[0], bufs[1], lay.per_rank_count)
    st = measure_case(s, case, what, size)
    algbw, busbw = bandwidth(plan.spec.name, lay.size_bytes, st.time_us / 1e6, ctx.n)
    return {**stats_columns(st, s.opts.check), "algbw_gbps": algbw, "busbw_gbps": busbw}
