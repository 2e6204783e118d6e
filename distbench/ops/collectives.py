"""One small spec per collective: buffer shapes, the torch call, input data and the check.
The byte accounting for each op lives in distbench.accounting, keyed by the same name."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distbench.accounting import ACCOUNTING
from distbench.ops import data
from distbench.ops.case import Case

REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}

# torch 2.13 renamed these; 2.4 only has the old names.
_torch_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_torch_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Ctx:
    rank: int
    n: int
    root: int
    redop: str
    in_place: bool


@dataclass(frozen=True)
class CollectiveSpec:
    name: str
    in_mult: str  # "0", "1" or "n": input elements as a multiple of the per-rank count
    out_mult: str
    build: Callable[[Ctx, torch.Tensor, torch.Tensor, int], Case]
    root_only: str = ""  # "in" or "out": that buffer exists on the root alone

    def elements(self, mult: str, c: int, n: int) -> int:
        return c * {"0": 0, "1": 1, "n": n}[mult]

    @property
    def accounting(self):
        return ACCOUNTING[self.name]


def _red_in(ctx, buf, offset=0):
    def make(start, count):
        return data.reduction_input(ctx.rank, offset + start, count, ctx.redop, buf.dtype,
                                    buf.device)
    return make


def _red_out(ctx, buf, offset=0):
    def make(start, count):
        return data.reduction_expected(offset + start, count, ctx.n, ctx.redop, buf.dtype,
                                       buf.device)
    return make


def _mov(rank, buf, offset=0):
    def make(start, count):
        return data.movement(rank, offset + start, count, buf.device, buf.dtype)
    return make


def _blocks(buf: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(buf.view(n, -1).unbind(0))


def _check_blocks(out: torch.Tensor, n: int, make_for_block) -> int:
    return sum(data.count_wrong(b, make_for_block(q, b)) for q, b in enumerate(_blocks(out, n)))


def _all_reduce(ctx, inp, out, c):
    buf = inp[:c]
    op = REDOPS[ctx.redop]
    return Case(run=functools.partial(dist.all_reduce, buf, op=op),
                prepare=lambda: data.fill(buf, _red_in(ctx, buf)),
                check=lambda: data.count_wrong(buf, _red_out(ctx, buf), ctx.redop),
                output=buf)


def _reduce(ctx, inp, out, c):
    buf = inp[:c]
    op = REDOPS[ctx.redop]
    is_root = ctx.rank == ctx.root
    return Case(run=functools.partial(dist.reduce, buf, dst=ctx.root, op=op),
                prepare=lambda: data.fill(buf, _red_in(ctx, buf)),
                check=lambda: data.count_wrong(buf, _red_out(ctx, buf), ctx.redop)
                if is_root else 0,
                output=buf if is_root else None)


def _broadcast(ctx, inp, out, c):
    buf = inp[:c]
    is_root = ctx.rank == ctx.root

    def prepare():
        if is_root:
            data.fill(buf, _mov(ctx.root, buf))
        else:
            buf.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.broadcast, buf, src=ctx.root), prepare=prepare,
                check=lambda: data.count_wrong(buf, _mov(ctx.root, buf)), output=buf)


def _reduce_scatter(ctx, inp, out, c):
    src = inp[:ctx.n * c]
    dst = src[ctx.rank * c:(ctx.rank + 1) * c] if ctx.in_place else out[:c]
    op = REDOPS[ctx.redop]

    def prepare():
        data.fill(src, _red_in(ctx, src))
        if not ctx.in_place:
            dst.fill_(data.SENTINEL)
    return Case(run=functools.partial(_torch_reduce_scatter, dst, src, op=op), prepare=prepare,
                check=lambda: data.count_wrong(dst, _red_out(ctx, dst, ctx.rank * c), ctx.redop),
                output=dst)


def _all_gather(ctx, inp, out, c):
    dst = out[:ctx.n * c]
    src = dst[ctx.rank * c:(ctx.rank + 1) * c] if ctx.in_place else inp[:c]

    def prepare():
        dst.fill_(data.SENTINEL)
        data.fill(src, _mov(ctx.rank, src))
    return Case(run=functools.partial(_torch_all_gather, dst, src), prepare=prepare,
                check=lambda: _check_blocks(dst, ctx.n, lambda q, b: _mov(q, b)), output=dst)


def _all_to_all(ctx, inp, out, c):
    src, dst = inp[:ctx.n * c], out[:ctx.n * c]

    def prepare():
        data.fill(src, _mov(ctx.rank, src))
        dst.fill_(data.SENTINEL)
    # block q of my output is block `rank` of rank q's input
    return Case(run=functools.partial(dist.all_to_all_single, dst, src), prepare=prepare,
                check=lambda: _check_blocks(dst, ctx.n, lambda q, b: _mov(q, b, ctx.rank * c)),
                output=dst)


def _gather(ctx, inp, out, c):
    src = inp[:c]
    is_root = ctx.rank == ctx.root
    dst = out[:ctx.n * c] if is_root else None
    blocks = _blocks(dst, ctx.n) if is_root else None

    def prepare():
        data.fill(src, _mov(ctx.rank, src))
        if is_root:
            dst.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.gather, src, blocks, dst=ctx.root), prepare=prepare,
                check=lambda: _check_blocks(dst, ctx.n, lambda q, b: _mov(q, b))
                if is_root else 0,
                output=dst)


def _scatter(ctx, inp, out, c):
    is_root = ctx.rank == ctx.root
    src = inp[:ctx.n * c] if is_root else None
    blocks = _blocks(src, ctx.n) if is_root else None
    dst = out[:c]

    def prepare():
        if is_root:
            data.fill(src, _mov(ctx.root, src))
        dst.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.scatter, dst, blocks, src=ctx.root), prepare=prepare,
                check=lambda: data.count_wrong(dst, _mov(ctx.root, dst, ctx.rank * c)),
                output=dst)


SPECS: dict[str, CollectiveSpec] = {
    s.name: s
    for s in (
        CollectiveSpec("all_reduce", "1", "0", _all_reduce),
        CollectiveSpec("reduce_scatter", "n", "1", _reduce_scatter),
        CollectiveSpec("all_gather", "1", "n", _all_gather),
        CollectiveSpec("broadcast", "1", "0", _broadcast),
        CollectiveSpec("reduce", "1", "0", _reduce),
        CollectiveSpec("all_to_all", "n", "n", _all_to_all),
        CollectiveSpec("gather", "1", "n", _gather, root_only="out"),
        CollectiveSpec("scatter", "n", "1", _scatter, root_only="in"),
    )
}


def allocate(spec: CollectiveSpec, ctx: Ctx, max_count: int, dtype,
             device) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers for the largest per-rank count, allocated once and sliced for every size. In place,
    the smaller side is a view into the larger one, so only the larger is allocated."""
    mults = {"in": spec.in_mult, "out": spec.out_mult}
    if ctx.in_place:
        small = "out" if spec.elements(spec.in_mult, 1, 2) >= spec.elements(spec.out_mult, 1, 2) \
            else "in"
        mults[small] = "0"
    if spec.root_only and ctx.rank != ctx.root:
        mults[spec.root_only] = "0"
    return tuple(torch.empty(spec.elements(m, max_count, ctx.n), dtype=dtype, device=device)
                 for m in (mults["in"], mults["out"]))
