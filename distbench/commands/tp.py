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

import torch
import torch.distributed as dist

from distbench import session as session_mod
from distbench import testhooks, timing
from distbench.measure import fail_if_wrong, timed_samples
from distbench.ops.dtypes import TORCH_DTYPES
from distbench.results import TP_COLUMNS
from distbench.strategies import tp as strat

SEED = 1234

# (header, unit, width)
TABLE = [("block", "", 10), ("step", "(ms)", 10), ("compute", "(ms)", 10), ("comm", "(%)", 7),
         ("TFLOP/s", "(/rank)", 10), ("tokens/s", "", 11), ("AR bytes", "(/step)", 12),
         ("busbw", "(GB/s)", 9), ("t1", "(ms)", 10), ("speedup", "", 9), ("effic", "", 7),
         ("max_err", "", 10)]


def run(opts) -> int:
    return session_mod.run("tp", opts, _body)


def _line(cells: list[str]) -> str:
    return "".join(c.rjust(w) for c, (_, _, w) in zip(cells, TABLE, strict=True))


def header_lines(title: str) -> list[str]:
    return ["#", f"# {title}", "#" + _line([h for h, _, _ in TABLE])[1:],
            "#" + _line([u for _, u, _ in TABLE])[1:]]


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3


def table_line(r: dict) -> str:
    ms = _ms
    return _line([r["block"], _num(ms(r["step_us"]), ".2f"), _num(ms(r["compute_only_us"]), ".2f"),
                  _num(r["comm_pct"], ".1f"), _num(r["tflops_per_rank"], ".4f"),
                  _num(r["tokens_per_s"], ".1f"), str(r["allreduce_bytes_per_step"]),
                  _num(r["implied_busbw_gbps"], ".3f"), _num(ms(r["t1_us"]), ".2f"),
                  _num(r["speedup"], ".2f"), _num(r["efficiency"], ".2f"),
                  _num(r["max_abs_err"], ".3g")])


def _print(s: session_mod.Session, text: str) -> None:
    if s.console.enabled:
        print(text, flush=True)


def _body(s: session_mod.Session) -> int:
    rt, opts = s.rt, s.opts
    shape = strat.shape_of(opts)
    dtype = TORCH_DTYPES[opts.dtype]
    s.step("tp device mesh", opts.timeout)
    mesh = strat.device_mesh(rt.device, rt.world)
    check_sh, on_configured = strat.check_shape(shape, rt.world)
    sink = s.csv("tp.csv", TP_COLUMNS)
    s.console.log(f"tp: {', '.join(opts.blocks)} x {shape.layers} layers on {rt.world} ranks, "
                  f"{rt.nnodes} node(s), backend {rt.backend}; t1 = the unsharded stack on rank 0 "
                  "alone while the others wait")
    if opts.check:
        s.console.log(f"check: TP vs single-rank reference on {check_sh.describe()}"
                      + ("" if on_configured else " (the configured shapes are too large)"))
    details: dict = {"seed": SEED, "shape": shape.to_json(), "blocks": {}, "check": {
        "enabled": opts.check, "shape": check_sh.to_json(), "configured_shapes": on_configured,
        "rtol": strat.RTOL[opts.dtype]}}
    for line in header_lines(f"tp  {opts.dtype}  ranks {rt.world}  nodes {rt.nnodes}  backend "
                             f"{rt.backend}  {shape.describe()}"):
        _print(s, line)
    bad: list[str] = []
    for kind in opts.blocks:
        row, info = _measure_block(s, kind, shape, mesh, dtype, check_sh, on_configured, bad)
        details["blocks"][kind] = info
        sink.append(row)
        if s.record is not None:
            s.record.update(tp=details)
        _print(s, table_line(row))
    fail_if_wrong(bad)
    return session_mod.EXIT_OK


def _timed(s: session_mod.Session, what: str, step) -> timing.Stats:
    """warmup (fixed count), barrier, timed loop, cross-rank statistics: as every command."""
    samples = timed_samples(s, step, what)
    s.step(f"{what} (statistics)", s.opts.timeout)
    return timing.summarize(samples, 0, s.rt.device)


def _time_on_rank0(s: session_mod.Session, what: str, step, expected_s: float) -> float | None:
    """Rank 0 runs `step` alone (warmup, then the timed loop) while the other ranks wait at a
    barrier; its mean in seconds on rank 0, None elsewhere."""
    opts, device = s.opts, s.rt.device
    s.step(what, opts.timeout + 4 * (opts.warmup + opts.iters + 1) * expected_s)
    dist.barrier()
    mean = None
    if s.rt.rank == 0:
        for _ in range(max(1, opts.warmup)):
            step()
        timing.sync(device)
        samples = timing.timed_loop(step, opts.iters, device)
        mean = sum(samples) / len(samples)
    dist.barrier()
    return mean


def _check(s: session_mod.Session, kind: str, check_sh: strat.Shape, mesh, dtype
           ) -> tuple[float, float, str]:
    """(max_abs_err, worst err / tolerance, which tensor), the same on every rank."""
    rt = s.rt
    s.step(f"tp {kind} (check)", s.opts.timeout)
    pairs = strat.tp_vs_reference(kind, check_sh, SEED, rt.device, dtype, mesh,
                                  corrupt=lambda t: testhooks.corrupt(rt.rank, t))
    c = strat.compare(pairs, strat.RTOL[s.opts.dtype])
    f64 = dict(dtype=torch.float64, device=rt.device)
    agreed = torch.tensor([c.max_abs_err, c.worst_ratio], **f64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    names = [name for name, _, _ in pairs]
    mine = names.index(c.worst) if c.worst_ratio >= float(agreed[1]) else len(names)
    which = torch.tensor([mine], dtype=torch.int64, device=rt.device)
    dist.all_reduce(which, op=dist.ReduceOp.MIN)
    index = int(which.item())
    return float(agreed[0]), float(agreed[1]), names[index] if index < len(names) else "?"


def _measure_block(s: session_mod.Session, kind: str, shape: strat.Shape, mesh, dtype,
                   check_sh: strat.Shape, on_configured: bool, bad: list[str]
                   ) -> tuple[dict, dict]:
    rt, opts = s.rt, s.opts
    n, device = rt.world, rt.device
    s.step(f"tp {kind} (build)", opts.timeout)
    full = strat.build_full(kind, shape, SEED, device, dtype)
    tp_model = strat.parallelize(full, kind, shape, mesh)
    local = strat.local_shard(full, kind, shape, rt.rank, n)
    x, dy = strat.inputs(shape, SEED, device, dtype)
    elt = x.element_size()
    notes: list[str] = []
    if n == 1:
        notes.append("1 rank: no communication; step - compute_only is DTensor's own overhead")

    # One untimed step under the counter: what DTensor really sends, against the formula.
    s.step(f"tp {kind} (communication count)", opts.timeout)
    tp_step = strat.make_step(tp_model, x, dy)
    with strat.CommCounter() as counter:
        tp_step()
    ar_bytes = strat.allreduce_bytes(kind, shape, elt, n)
    counted = counter.allreduce_bytes()
    if counted != ar_bytes:
        notes.append(f"DTensor all-reduced {counted} B per step, the formula says {ar_bytes} B")
    if counter.other_collectives():
        notes.append(f"other collectives: {counter.other_collectives()}")

    st = _timed(s, f"tp {kind} step", tp_step)
    compute = _timed(s, f"tp {kind} compute-only", strat.make_step(local, x, dy))
    del tp_model, local
    t1 = _time_on_rank0(s, f"tp {kind} t1 (unsharded on rank 0)", strat.make_step(full, x, dy),
                        st.time_us / 1e6 * n)
    del full

    step_s, compute_s = st.time_us / 1e6, compute.time_us / 1e6
    comm, clamped = strat.comm_fraction(step_s, compute_s)
    if clamped:
        notes.append("comm_pct clamped to 0: compute-only took as long as the step")
    busbw = strat.implied_busbw_gbps(ar_bytes, n, step_s, compute_s)
    speedup = efficiency = None
    if t1 is not None:
        speedup, efficiency = strat.scaling(t1, step_s, n)

    max_err = None
    info = {"allreduce_bytes_formula": ar_bytes, "allreduce_bytes_counted": counted,
            "collectives_counted": counter.counts,
            "flops_per_rank_per_step": strat.flops_per_rank(kind, shape, n)}
    if opts.check:
        max_err, ratio, worst = _check(s, kind, check_sh, mesh, dtype)
        rtol = strat.RTOL[opts.dtype]
        info["check"] = {"max_abs_err": max_err, "worst_err_over_tolerance": ratio,
                         "worst": worst}
        if not on_configured:
            notes.append(f"checked on {check_sh.describe()}")
        if ratio > 1:
            notes.append(f"WRONG: {worst} off by {max_err:.3g} ({ratio:.3g} x tolerance)")
            bad.append(f"tp {kind} {opts.dtype}: {worst} differs from the single-rank reference "
                       f"by {max_err:.3g}, {ratio:.3g} x the tolerance ({rtol:g} x max|ref|)")

    row = {
        "block": kind, "dtype": opts.dtype, "world_size": n, "nnodes": rt.nnodes,
        "hidden_size": shape.hidden, "ffn_size": shape.ffn, "heads": shape.heads,
        "seq_len": shape.seq, "micro_batch_size": shape.batch, "layers": shape.layers,
        "iters": st.iters, "step_us": st.time_us, "rank_min_us": st.rank_min_us,
        "rank_max_us": st.rank_max_us, "slowest_rank": st.slowest_rank, "p50_us": st.p50_us,
        "p99_us": st.p99_us, "cv_pct": st.cv_pct, "compute_only_us": compute.time_us,
        "comm_pct": comm * 100,  # percent, like cv_pct
        "tflops_per_rank": strat.flops_per_rank(kind, shape, n) / step_s / 1e12,
        "tokens_per_s": shape.tokens / step_s, "allreduce_bytes_per_step": ar_bytes,
        "implied_busbw_gbps": busbw, "t1_us": None if t1 is None else t1 * 1e6,
        "speedup": speedup, "efficiency": efficiency, "max_abs_err": max_err,
        "backend": rt.backend, "status": "wrong" if any(t.startswith("WRONG") for t in notes)
        else "ok", "note": "; ".join(notes),
    }
    return row, info
