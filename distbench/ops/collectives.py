"""The collectives: one CollectiveOp each, holding its byte accounting, its buffer shapes and its
builder (the torch call, the deterministic input and the independent check). Adding an op is one
`register(CollectiveOp(...))`, here or in any module imported before the command line is read.

No torch at import: the command line lists and validates op names from this registry. The
builders run only in workers, after the process group exists, and load torch then.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from distbench.core.accounting import Accounting, allreduce_factor, ring_factor, unit_factor


@dataclass(frozen=True)
class Ctx:
    rank: int  # in `group`
    n: int  # ranks in `group`
    root: int  # a rank in `group`
    redop: str
    in_place: bool
    group: object = None  # a process group of some ranks (a node, a pair); None: every rank


@dataclass(frozen=True)
class CollectiveOp:
    name: str
    accounting: Accounting
    uses_redop: bool
    uses_root: bool
    # The torch.distributed call decides what "in place" can mean: all_reduce, broadcast and
    # reduce only work in place; gather/scatter take lists and all_to_all has no in-place form.
    placements: tuple[bool, ...]  # in_place values the op can run with
    in_mult: str  # "0", "1" or "n": input elements as a multiple of the per-rank count
    out_mult: str
    build: Callable  # (ctx, input buffer, output buffer, per-rank count) -> Case
    root_only: str = ""  # "in" or "out": that buffer exists on the root alone

    def elements(self, mult: str, c: int, n: int) -> int:
        return c * {"0": 0, "1": 1, "n": n}[mult]


OPS: dict[str, CollectiveOp] = {}


def register(op: CollectiveOp) -> CollectiveOp:
    if op.name in OPS:
        raise ValueError(f"collective {op.name!r} is registered twice")
    OPS[op.name] = op
    return op


def names() -> tuple[str, ...]:
    return tuple(OPS)


# ---------------------------------------------------------------------------------------------
# Builders. Each returns the Case the engine times and checks.

def _torch():
    import torch.distributed as dist

    from distbench.ops import data
    from distbench.ops.case import Case
    return dist, data, Case


def _all_reduce(ctx, inp, out, c):
    dist, data, Case = _torch()
    buf = inp[:c]
    return Case(run=functools.partial(dist.all_reduce, buf, op=data.reduce_op(ctx.redop),
                                      group=ctx.group),
                prepare=lambda: data.fill_reduction(buf, ctx),
                check=lambda: data.wrong_reduction(buf, ctx), output=buf)


def _reduce(ctx, inp, out, c):
    dist, data, Case = _torch()
    buf = inp[:c]
    is_root = ctx.rank == ctx.root
    return Case(run=functools.partial(dist.reduce, buf, group_dst=ctx.root,
                                      op=data.reduce_op(ctx.redop), group=ctx.group),
                prepare=lambda: data.fill_reduction(buf, ctx),
                check=lambda: data.wrong_reduction(buf, ctx) if is_root else 0,
                output=buf if is_root else None)


def _broadcast(ctx, inp, out, c):
    dist, data, Case = _torch()
    buf = inp[:c]
    is_root = ctx.rank == ctx.root

    def prepare():
        if is_root:
            data.fill_movement(buf, ctx.root)
        else:
            buf.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.broadcast, buf, group_src=ctx.root,
                                      group=ctx.group), prepare=prepare,
                check=lambda: data.wrong_movement(buf, ctx.root), output=buf)


def _reduce_scatter(ctx, inp, out, c):
    dist, data, Case = _torch()
    src = inp[:ctx.n * c]
    dst = src[ctx.rank * c:(ctx.rank + 1) * c] if ctx.in_place else out[:c]

    def prepare():
        data.fill_reduction(src, ctx)
        if not ctx.in_place:
            dst.fill_(data.SENTINEL)
    return Case(run=functools.partial(data.reduce_scatter, dst, src,
                                      op=data.reduce_op(ctx.redop), group=ctx.group),
                prepare=prepare,
                check=lambda: data.wrong_reduction(dst, ctx, ctx.rank * c), output=dst)


def _all_gather(ctx, inp, out, c):
    dist, data, Case = _torch()
    dst = out[:ctx.n * c]
    src = dst[ctx.rank * c:(ctx.rank + 1) * c] if ctx.in_place else inp[:c]

    def prepare():
        dst.fill_(data.SENTINEL)
        data.fill_movement(src, ctx.rank)
    return Case(run=functools.partial(data.all_gather, dst, src, group=ctx.group),
                prepare=prepare,
                check=lambda: data.wrong_blocks(dst, ctx.n), output=dst)


def _all_to_all(ctx, inp, out, c):
    dist, data, Case = _torch()
    src, dst = inp[:ctx.n * c], out[:ctx.n * c]

    def prepare():
        data.fill_movement(src, ctx.rank)
        dst.fill_(data.SENTINEL)
    # block q of my output is block `rank` of rank q's input
    return Case(run=functools.partial(dist.all_to_all_single, dst, src, group=ctx.group),
                prepare=prepare,
                check=lambda: data.wrong_blocks(dst, ctx.n, ctx.rank * c), output=dst)


def _gather(ctx, inp, out, c):
    dist, data, Case = _torch()
    src = inp[:c]
    is_root = ctx.rank == ctx.root
    dst = out[:ctx.n * c] if is_root else None
    blocks = data.blocks(dst, ctx.n) if is_root else None

    def prepare():
        data.fill_movement(src, ctx.rank)
        if is_root:
            dst.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.gather, src, blocks, group_dst=ctx.root,
                                      group=ctx.group), prepare=prepare,
                check=lambda: data.wrong_blocks(dst, ctx.n) if is_root else 0, output=dst)


def _scatter(ctx, inp, out, c):
    dist, data, Case = _torch()
    is_root = ctx.rank == ctx.root
    src = inp[:ctx.n * c] if is_root else None
    blocks = data.blocks(src, ctx.n) if is_root else None
    dst = out[:c]

    def prepare():
        if is_root:
            data.fill_movement(src, ctx.root)
        dst.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.scatter, dst, blocks, group_src=ctx.root,
                                      group=ctx.group), prepare=prepare,
                check=lambda: data.wrong_movement(dst, ctx.root, ctx.rank * c), output=dst)


_RING = Accounting(split=True, factor=ring_factor)
_WHOLE = Accounting(split=False, factor=unit_factor)
IN, OUT = (True,), (False,)

register(CollectiveOp("all_reduce", Accounting(split=False, factor=allreduce_factor),
                      uses_redop=True, uses_root=False, placements=IN, in_mult="1",
                      out_mult="0", build=_all_reduce))
register(CollectiveOp("reduce_scatter", _RING, uses_redop=True, uses_root=False,
                      placements=(False, True), in_mult="n", out_mult="1",
                      build=_reduce_scatter))
register(CollectiveOp("all_gather", _RING, uses_redop=False, uses_root=False,
                      placements=(False, True), in_mult="1", out_mult="n", build=_all_gather))
register(CollectiveOp("broadcast", _WHOLE, uses_redop=False, uses_root=True, placements=IN,
                      in_mult="1", out_mult="0", build=_broadcast))
register(CollectiveOp("reduce", _WHOLE, uses_redop=True, uses_root=True, placements=IN,
                      in_mult="1", out_mult="0", build=_reduce))
register(CollectiveOp("all_to_all", _RING, uses_redop=False, uses_root=False, placements=OUT,
                      in_mult="n", out_mult="n", build=_all_to_all))
register(CollectiveOp("gather", _RING, uses_redop=False, uses_root=True, placements=OUT,
                      in_mult="1", out_mult="n", build=_gather, root_only="out"))
register(CollectiveOp("scatter", _RING, uses_redop=False, uses_root=True, placements=OUT,
                      in_mult="n", out_mult="1", build=_scatter, root_only="in"))
