"""A collective that exists only in the test suite: registering it must be all it takes to run
it through `distbench collective` (see test_registry.py). Not imported by distbench itself."""

from __future__ import annotations

import functools

from distbench.core.accounting import Accounting, unit_factor
from distbench.ops.collectives import CollectiveOp, register


def _build(ctx, inp, out, c):
    import torch.distributed as dist

    from distbench.ops import data
    from distbench.ops.case import Case

    buf, src = inp[:c], ctx.n - 1

    def prepare():
        if ctx.rank == src:
            data.fill_movement(buf, src)
        else:
            buf.fill_(data.SENTINEL)
    return Case(run=functools.partial(dist.broadcast, buf, src=src), prepare=prepare,
                check=lambda: data.wrong_movement(buf, src), output=buf)


BROADCAST_FROM_LAST = register(CollectiveOp(
    "broadcast_from_last", Accounting(split=False, factor=unit_factor), uses_redop=False,
    uses_root=False, placements=(True,), in_mult="1", out_mult="0", build=_build))
