"""What the sweep commands measure, as the engine's Series: buffers, cases and row cells for
each of collective's Combinations, a p2p pattern and the pairwise link matrix; and one size of a
collective or a p2p pattern measured on a group of its own, as acceptance measures each target."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from distbench.bench import timing
from distbench.bench.engine import NO_FIT, Point, Series, bandwidth_point
from distbench.bench.measure import Settings, Skipped, measure_case, stats_columns
from distbench.core.accounting import SENDRECV, Buffer, buffer_of, min_bytes
from distbench.core.dtypes import element_bytes
from distbench.core.sizes import format_size
from distbench.core.tables import format_matrix
from distbench.ops import p2p
from distbench.ops.case import Case
from distbench.ops.collectives import CollectiveOp, Ctx
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.results.links import Link
from distbench.run.buffers import allocate_fitting
from distbench.run.runtime import rank_names

if TYPE_CHECKING:
    from distbench.bench.combinations import Combination
    from distbench.run.session import Session
    from distbench.run.split import Split


def allocate(op, ctx, count: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers for the largest per-rank count, allocated once and sliced for every size. In place,
    the smaller side is a view into the larger one, so only the larger is allocated."""
    mults = {"in": op.in_mult, "out": op.out_mult}
    if ctx.in_place:
        small = "out" if op.elements(op.in_mult, 1, 2) >= op.elements(op.out_mult, 1, 2) \
            else "in"
        mults[small] = "0"
    if op.root_only and ctx.rank != ctx.root:
        mults[op.root_only] = "0"
    return tuple(torch.empty(op.elements(m, count, ctx.n), dtype=dtype, device=device)
                 for m in (mults["in"], mults["out"]))


def describe(op: str, size: int, dtype: str, redop: str, in_place: bool) -> str:
    """How errors and progress name a collective measurement."""
    extra = f" {redop}" if redop != "none" else ""
    return f"{op} {format_size(size)} {dtype}{extra} {'in-place' if in_place else 'out-of-place'}"


def collective(s: Session, combo: Combination, output, part: Split) -> Series:
    """`combo` on each group of `part` at once (one group: the world); busbw by the group's
    size, the timing statistics over every rank of every group."""
    rt = s.rt
    n, op = part.size, combo.op
    ctx = replace(combo.ctx(part.rank, n), group=part.group)
    elt = element_bytes(combo.dtype)
    alloc = functools.partial(allocate, op, ctx, dtype=TORCH_DTYPES[combo.dtype],
                              device=rt.device)

    def probe():
        inp, out = alloc(1)
        return op.build(ctx, inp, out, 1)

    def points(bufs, lay: Buffer) -> list[Point]:
        what = describe(op.name, lay.size_bytes, combo.dtype, combo.redop, combo.in_place)
        case = op.build(ctx, bufs[0], bufs[1], lay.per_rank_count)
        return [bandwidth_point(s, what, case, op.accounting, lay, ranks=n)]

    need = min_bytes(op.accounting, elt, n)
    groups = len(part.members)
    return Series(
        name=f"{op.name} {combo.dtype}", output=output,
        title=f"{op.name}  {combo.dtype}  redop {combo.redop}  root {combo.root}  "
              f"{'in-place' if combo.in_place else 'out-of-place'}  ranks {rt.world}  "
              f"nodes {rt.nnodes}  backend {rt.backend}" + (
                  f"  groups {groups} of {n} stride {part.stride} ({part.per_node} a node)"
                  if groups > 1 else ""),
        accounting=op.accounting, elt=elt, alloc=alloc, points=points,
        row={"op": op.name, "dtype": combo.dtype, "redop": combo.redop, "root": combo.root,
             "in_place": combo.in_place, "world_size": rt.world, "nnodes": rt.nnodes,
             "backend": rt.backend, "status": "ok", "note": part.note, "group_size": n,
             "group_stride": part.stride, "groups": groups, "per_node": part.per_node},
        too_small=f"too small: {n} ranks need at least {need} B of {combo.dtype}",
        skip=combo.skip, probe=probe, ranks=n)


def _send_recv(dtype: str, device):
    tdtype = TORCH_DTYPES[dtype]
    return lambda c: (torch.empty(c, dtype=tdtype, device=device),
                      torch.empty(c, dtype=tdtype, device=device))


def p2p_case(pattern: str, rank: int, n: int, send, recv, group=None) -> Case:
    """The ring (send to r+1, receive from r-1) or the ping-pong of rank pairs; `rank` and `n`
    in `group` (None: every rank)."""
    return p2p.ring(rank, n, send, recv, group) if pattern == "ring" else \
        p2p.pingpong(rank, n, send, group)


def p2p_scale(pattern: str) -> float:
    """A timed call of the pattern -> the time reported: a ping-pong's is one way."""
    return 1.0 if pattern == "ring" else 0.5


def p2p_pattern(s: Session, pattern: str, dtype: str, output) -> Series:
    rt = s.rt
    n = rt.world
    elt = element_bytes(dtype)
    alloc = _send_recv(dtype, rt.device)

    def case(send, recv) -> Case:
        return p2p_case(pattern, rt.rank, n, send, recv)

    def points(bufs, lay: Buffer) -> list[Point]:
        send, recv = (b[:lay.count] for b in bufs)
        what = f"p2p {pattern} {format_size(lay.size_bytes)} {dtype}"
        return [bandwidth_point(s, what, case(send, recv), SENDRECV, lay, p2p_scale(pattern))]

    return Series(
        name=f"p2p {pattern} {dtype}", output=output,
        title=f"p2p {pattern}  {dtype}  ranks {n}  nodes {rt.nnodes}  backend {rt.backend}"
              + ("  (time = one-way latency, half the round trip)"
                 if pattern == "pingpong" else ""),
        accounting=SENDRECV, elt=elt, alloc=alloc, points=points,
        row={"pattern": pattern, "dtype": dtype, "world_size": n, "nnodes": rt.nnodes,
             "pairs": n // 2 if pattern == "pingpong" else n, "backend": rt.backend,
             "status": "ok", "note": ""},
        too_small=f"too small: needs at least {elt} B of {dtype}",
        probe=lambda: case(*alloc(1)))


def matrix(s: Session, dtype: str, output, links: list[Link]) -> Series:
    """Every ordered pair measured alone while the others wait, one-way then bidirectional;
    each measured link is added to `links` for judging."""
    rt, console = s.rt, s.console
    n = rt.world
    who = rank_names(rt.ranks)
    grids: dict[str, dict[tuple[int, int], float]] = {}

    def point(src: int, dst: int, direction: str, send, recv, lay: Buffer) -> Point:
        arrow = "<->" if direction == "bi" else "->"
        what = f"p2p matrix {src}{arrow}{dst} {format_size(lay.size_bytes)} {dtype}"
        case = p2p.one_link(rt.rank, src, dst, direction == "bi", send, recv)

        def columns(st) -> dict:
            moved = lay.size_bytes * (2 if direction == "bi" else 1)
            gbps = moved / (st.time_us / 1e6) / 1e9
            grid = grids.setdefault(direction, {})
            grid[src, dst] = gbps
            if direction == "bi":
                grid[dst, src] = gbps
            same_node = rt.ranks[src]["node"] == rt.ranks[dst]["node"]
            link = Link(src, dst, who[src], who[dst], "intra" if same_node else "inter",
                        direction, lay.size_bytes, gbps)
            links.append(link)
            stats = stats_columns(st, s.opts.check)
            return {"direction": direction, "src_rank": src, "dst_rank": dst,
                    "src_host": rt.ranks[src]["host"], "dst_host": rt.ranks[dst]["host"],
                    "src_local_rank": rt.ranks[src]["local_rank"],
                    "dst_local_rank": rt.ranks[dst]["local_rank"], "link": link.link,
                    **{k: stats[k] for k in ("iters", "time_us", "p50_us", "p99_us", "cv_pct",
                                             "reps", "spread_pct")},
                    "gbps": gbps, "wrong": stats["wrong"]}
        return Point(what, case, columns, steps=2 if direction == "bi" else 1)

    def points(bufs, lay: Buffer) -> list[Point]:
        grids.clear()
        send, recv = (b[:lay.count] for b in bufs)
        return [point(src, dst, direction, send, recv, lay)
                for direction in ("uni", "bi") for src in range(n) for dst in range(n)
                if src != dst and not (direction == "bi" and dst < src)]

    def after_size(lay: Buffer) -> None:
        for direction in ("uni", "bi"):
            console.lines(format_matrix(
                f"p2p matrix {direction} GB/s, {format_size(lay.size_bytes)} {dtype} "
                "(row = sender)", who, grids.get(direction, {})))

    def on_skip(size: int, lay: Buffer | None, reason: str) -> None:
        console.log(f"matrix: {size} B of {dtype} skipped: {reason}")

    def probe() -> Case:
        """Every ordered pair once on one element: NCCL connects each pair the first time it is
        used, allocating as it does, and that must happen before the sizes are decided."""
        send, recv = _send_recv(dtype, rt.device)(1)
        cases = [p2p.one_link(rt.rank, src, dst, False, send, recv)
                 for src in range(n) for dst in range(n) if src != dst]

        def run_all() -> None:
            for c in cases:
                c.prepare()
                c.run()
        return Case(run=run_all, prepare=lambda: None, check=lambda: 0, output=None)

    return Series(
        name=f"p2p matrix {dtype}", output=output, title=None, accounting=SENDRECV,
        elt=element_bytes(dtype), alloc=_send_recv(dtype, rt.device), points=points,
        row={"dtype": dtype, "world_size": n, "nnodes": rt.nnodes, "backend": rt.backend},
        too_small="too small", steps_per_size=2 * n * (n - 1), on_skip=on_skip,
        after_size=after_size, probe=probe)


def collective_once(m: Settings, op: CollectiveOp, dtype: str, size: int, ctx: Ctx, what: str
                    ) -> tuple[Buffer, timing.Stats]:
    """One size of a collective on ctx's group alone, on buffers of its own (a sweep slices one
    allocation for every size). Skipped when the size gives a rank no element, or does not fit
    on some rank of the group."""
    lay = buffer_of(op.accounting, size, element_bytes(dtype), ctx.n)
    if lay is None:
        raise Skipped(f"too small for {ctx.n} ranks")
    alloc = functools.partial(allocate, op, ctx, dtype=TORCH_DTYPES[dtype], device=m.device)
    bufs, _ = allocate_fitting(alloc, [lay.per_rank_count], m.device, group=ctx.group)
    if bufs is None:
        raise Skipped(NO_FIT)
    case = op.build(ctx, bufs[0], bufs[1], lay.per_rank_count)
    return lay, measure_case(m, case, what, lay.size_bytes, group=ctx.group)


def p2p_once(m: Settings, pattern: str, dtype: str, size: int, rank: int, n: int, what: str,
             group=None) -> tuple[Buffer, timing.Stats]:
    """One size of a p2p pattern on `group`'s ranks alone (`rank` of `n` in it), on buffers of
    its own. Skipped when the size holds no element."""
    lay = buffer_of(SENDRECV, size, element_bytes(dtype), n)
    if lay is None:
        raise Skipped(f"too small for one {dtype} element")
    send, recv = _send_recv(dtype, m.device)(lay.count)
    return lay, measure_case(m, p2p_case(pattern, rank, n, send, recv, group), what,
                             lay.size_bytes, p2p_scale(pattern), group)
