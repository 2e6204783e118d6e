"""The collectives a training step really issues, counted from the dispatcher, and the same
collectives replayed alone: tp holds the count against its formula; dp also times the replay
(comm_alone) to see how much of the step's communication hid behind compute.

Sizes follow nccl-tests' accounting: a call's `size_bytes` is the larger of its send and receive
buffers on this rank (an all-gather's whole output, a reduce-scatter's whole input)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from distbench.core.accounting import allreduce_factor, ring_factor, unit_factor
from distbench.run.comm_trace import CommCall, Listener

# busbw / algbw at n ranks, as nccl-tests' PERFORMANCE.md has it
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": allreduce_factor, "all_gather": ring_factor, "reduce_scatter": ring_factor,
    "broadcast": unit_factor,
}


class CommCounter(Listener):
    """Counts the collectives (and their bytes) that run inside it, in order: what DTensor, DDP's
    reducer, ZeroRedundancyOptimizer or FSDP really issued, and the pipeline's sends and
    receives with the batch each was posted in. Waits are not collectives."""

    def __init__(self):
        super().__init__()
        self.calls: list[CommCall] = []

    def posted(self, call: CommCall) -> None:
        self.calls.append(call)


def op_counts(calls: list[CommCall]) -> dict[str, int]:
    """How many calls of each op, in the order the ops first came."""
    out: dict[str, int] = {}
    for c in calls:
        out[c.op] = out.get(c.op, 0) + 1
    return out


def op_bytes(calls: list[CommCall]) -> dict[str, int]:
    """The calls' bytes summed per op."""
    out: dict[str, int] = {}
    for c in calls:
        out[c.op] = out.get(c.op, 0) + c.size_bytes
    return out


def bus_bytes(calls: list[CommCall], world: int) -> float:
    """Bytes on the bus per rank: each call's size times its op's busbw factor."""
    return sum(c.size_bytes * BUS_FACTOR[c.op](world) for c in calls if c.op in BUS_FACTOR)


def replayable(calls: list[CommCall]) -> tuple[list[CommCall], dict[str, int]]:
    """The calls replay() can run, and a count of those it cannot, by op."""
    ok: list[CommCall] = []
    left: dict[str, int] = {}
    for c in calls:
        if c.op in BUS_FACTOR and c.dtype is not None:
            ok.append(c)
        else:
            left[c.op] = left.get(c.op, 0) + 1
    return ok, left


def replay(calls: list[CommCall], device: torch.device, before: Callable[[], None] | None = None,
           group=None) -> Callable[[], None]:
    """One function that issues `calls` back to back, alone, on buffers of the same sizes and
    dtypes, allocated here, once per distinct size (a step's calls come in few sizes: one
    buffer per size keeps the replay's memory near one call's, not the whole step's).
    `before` runs ahead of every all-reduce (the fault hook's delay, in tests). `group`: the
    process group they ran on (None: every rank), a broadcast's root a rank of it."""
    world = dist.get_world_size(group)
    on = {} if group is None else {"group": group}
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    buffers: dict[tuple, torch.Tensor] = {}

    def zeros(count: int, dtype) -> torch.Tensor:
        if (count, dtype) not in buffers:
            buffers[count, dtype] = torch.zeros(count, dtype=dtype, device=device)
        return buffers[count, dtype]

    steps: list[Callable[[], object]] = []
    for c in calls:
        elt = c.dtype.itemsize
        count = c.size_bytes // elt
        if c.op == "all_reduce":
            buf = zeros(count, c.dtype)
            if before is None:
                steps.append(lambda b=buf: dist.all_reduce(b, **on))
            else:
                steps.append(lambda b=buf: (before(), dist.all_reduce(b, **on)))
        elif c.op == "broadcast":
            buf = zeros(count, c.dtype)
            if group is None:
                steps.append(lambda b=buf, r=c.root: dist.broadcast(b, src=r))
            else:
                steps.append(lambda b=buf, r=c.root: dist.broadcast(b, group=group, group_src=r))
        else:
            whole = zeros(count - count % world, c.dtype)
            part = zeros(whole.numel() // world, c.dtype)
            if c.op == "all_gather":
                steps.append(lambda w=whole, p=part: gather(w, p, **on))
            else:
                steps.append(lambda w=whole, p=part: scatter(p, w, **on))

    def run() -> None:
        for step in steps:
            step()

    return run


def replay_p2p(calls: list[CommCall], device: torch.device, group) -> Callable[[], None]:
    """The sends and receives among `calls` (peers: ranks of `group`), alone, posted as the step
    posted them: the ops of one batch together (one batch_isend_irecv), an op posted alone
    alone, in the step's order, each batch waited for before the next is posted. NCCL holds a
    send until its peer posts the matching receive, and only a batch's ops progress together:
    posted one by one, the two stages of a 1F1B pipeline would both send first and wait on each
    other for ever (gloo buffers sends, and would not show it). No compute holds a transfer
    back: the time the transfers take by themselves. One buffer per direction and size."""
    buffers: dict[tuple, torch.Tensor] = {}
    batches: list[list[dist.P2POp]] = []
    last = None
    for c in calls:
        if c.op not in ("send", "recv") or c.dtype is None:
            continue
        key = (c.op, c.size_bytes // c.dtype.itemsize, c.dtype)
        if key not in buffers:
            buffers[key] = torch.zeros(key[1], dtype=c.dtype, device=device)
        op = dist.P2POp(dist.isend if c.op == "send" else dist.irecv, buffers[key], group=group,
                        group_peer=c.root)
        if c.batch is not None and c.batch == last:
            batches[-1].append(op)
        else:
            batches.append([op])
        last = c.batch

    def run() -> None:
        for ops in batches:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    return run
