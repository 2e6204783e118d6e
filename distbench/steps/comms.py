"""The collectives a training step really issues, counted from the dispatcher, and the same
collectives replayed alone: tp holds the count against its formula; dp also times the replay
(comm_alone) to see how much of the step's communication hid behind compute.

Sizes follow nccl-tests' accounting: a call's `size_bytes` is the larger of its send and receive
buffers on this rank (an all-gather's whole output, a reduce-scatter's whole input)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from distbench.core.accounting import allreduce_factor, ring_factor, unit_factor

_COMM_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")

# dispatcher op names (trailing "_" dropped) -> one name per collective
_CANONICAL = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather_into_tensor": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast",
}

# busbw / algbw at n ranks, as nccl-tests' PERFORMANCE.md has it
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": allreduce_factor, "all_gather": ring_factor, "reduce_scatter": ring_factor,
    "broadcast": unit_factor,
}


@dataclass(frozen=True)
class Call:
    op: str  # canonical name when known, else the dispatcher's
    size_bytes: int
    dtype: torch.dtype | None
    root: int = 0  # broadcast's source rank; a send's or receive's peer (group ranks)
    # the process group's name, which tells a mesh's dimensions apart; left out of equality:
    # a call is the same collective on whichever group it is replayed
    group: str = field(default="", compare=False)


def _tensors(arg) -> list[torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, list | tuple):
        return [t for t in arg if isinstance(t, torch.Tensor)]
    return []


class CommCounter(TorchDispatchMode):
    """Counts the collectives (and their bytes) that run inside it, in order: what DTensor, DDP's
    reducer, ZeroRedundancyOptimizer or FSDP really issued. Waits are not collectives."""

    def __init__(self):
        super().__init__()
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor turn itself into plain ops and collectives
        out = func(*args, **(kwargs or {}))
        namespace = getattr(func, "namespace", "")
        name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
        # waits and autograd wrappers (`_wrap_tensor_autograd`) are not collectives
        collective = namespace in _COMM_NAMESPACES and not name.startswith(("wait", "_wrap"))
        if collective or name == "shard_dim_alltoall":
            key = name.rstrip("_")
            op = _CANONICAL.get(key, key)
            buffers = [t for a in args[:2] for t in _tensors(a)]
            size = max((t.numel() * t.element_size() for t in buffers), default=0)
            root = args[2] if op in ("broadcast", "send", "recv") and len(args) > 2 and \
                isinstance(args[2], int) else 0
            self.calls.append(Call(op, size, buffers[0].dtype if buffers else None, root,
                                   _group_name(args)))
        return out

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.op] = out.get(c.op, 0) + 1
        return out

    @property
    def bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.op] = out.get(c.op, 0) + c.size_bytes
        return out

    def allreduce_bytes(self) -> int:
        return self.bytes.get("all_reduce", 0)

    def other_collectives(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if k != "all_reduce"}


def _group_name(args) -> str:
    """The group a call ran on: c10d's ops take the ProcessGroup (boxed), functional
    collectives its name (their last text argument)."""
    from torch._C._distributed_c10d import ProcessGroup

    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a).group_name
            except RuntimeError:  # another boxed argument (a ReduceOp)
                continue
    names = [a for a in args if isinstance(a, str)]
    return names[-1] if names else ""


def bus_bytes(calls: list[Call], world: int) -> float:
    """Bytes on the bus per rank: each call's size times its op's busbw factor."""
    return sum(c.size_bytes * BUS_FACTOR[c.op](world) for c in calls if c.op in BUS_FACTOR)


def replayable(calls: list[Call]) -> tuple[list[Call], dict[str, int]]:
    """The calls replay() can run, and a count of those it cannot, by op."""
    ok: list[Call] = []
    left: dict[str, int] = {}
    for c in calls:
        if c.op in BUS_FACTOR and c.dtype is not None:
            ok.append(c)
        else:
            left[c.op] = left.get(c.op, 0) + 1
    return ok, left


def replay(calls: list[Call], device: torch.device, before: Callable[[], None] | None = None,
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


def replay_p2p(calls: list[Call], device: torch.device, group) -> Callable[[], None]:
    """The sends and receives among `calls` (peers: ranks of `group`), alone: each posted in
    the step's order without waiting, then all waited for. A pipeline's peers send and receive
    in matching orders, so nothing deadlocks, and no compute holds a transfer back: the time the
    transfers take by themselves. One buffer per distinct size."""
    buffers: dict[tuple, torch.Tensor] = {}
    posts: list[Callable[[], object]] = []
    for c in calls:
        if c.op not in ("send", "recv") or c.dtype is None:
            continue
        key = (c.size_bytes // c.dtype.itemsize, c.dtype)
        if key not in buffers:
            buffers[key] = torch.zeros(key[0], dtype=c.dtype, device=device)
        buf = buffers[key]
        if c.op == "send":
            posts.append(lambda b=buf, r=c.root: dist.isend(b, group=group, group_dst=r))
        else:
            posts.append(lambda b=buf, r=c.root: dist.irecv(b, group=group, group_src=r))

    def run() -> None:
        for work in [post() for post in posts]:
            work.wait()

    return run
