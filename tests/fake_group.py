"""A process group of threads, for fast tests of cross-rank logic: each thread is a rank, and
torch.distributed's all_reduce, broadcast, barrier, get_rank and get_world_size work across
them through a shared board. Real reductions, no processes, milliseconds."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

_REDUCE = {
    dist.ReduceOp.SUM: lambda ts: torch.stack(ts).sum(0),
    dist.ReduceOp.MAX: lambda ts: torch.stack(ts).amax(0),
    dist.ReduceOp.MIN: lambda ts: torch.stack(ts).amin(0),
}


def run_ranks(monkeypatch, world: int, fn: Callable[[int], object]) -> list:
    """fn(rank) on `world` threads acting as ranks; their results, by rank."""
    local = threading.local()
    barrier = threading.Barrier(world)
    board: list = [None] * world

    def exchange(tensor: torch.Tensor) -> list[torch.Tensor]:
        board[local.rank] = tensor.clone()
        barrier.wait()
        everyone = list(board)
        barrier.wait()
        return everyone

    def all_reduce(tensor, op=dist.ReduceOp.SUM, **kwargs):
        tensor.copy_(_REDUCE[op](exchange(tensor)))

    def broadcast(tensor, src, **kwargs):
        tensor.copy_(exchange(tensor)[src])

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "broadcast", broadcast)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: barrier.wait())
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: local.rank)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    def body(rank: int) -> object:
        local.rank = rank
        return fn(rank)

    return on_threads(world, body, barrier)


def on_threads(world: int, fn: Callable[[int], object], barrier: threading.Barrier) -> list:
    """fn(rank) on `world` threads; their results, by rank. The first error aborts `barrier`
    (the others would wait at it forever) and is raised here."""
    results: list = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - reported to the test below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


class ThreadWorld:
    """torch.distributed's object collectives and subgroups among threads, as acceptance calls
    them: every call is a call of every rank. Subclasses add what a test records or fakes."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        # one board per parity of the call's number: a rank done reading one call writes the
        # next on the other board, and cannot reach the one after before every rank has arrived
        # at the next, done reading; so a call is one barrier, not two (128 threads woken at a
        # barrier are much of what a 128-node schedule costs)
        self.boards: tuple[list, list] = ([None] * world, [None] * world)
        self.local = threading.local()

    def start(self, rank: int) -> None:
        """On the rank's own thread, before its first call."""
        self.local.rank, self.local.calls = rank, 0

    def patch(self, monkeypatch) -> None:
        for name in ("all_gather_object", "broadcast_object_list",
                     "new_subgroups_by_enumeration", "get_rank"):
            monkeypatch.setattr(dist, name, getattr(self, name))

    def everyone(self, obj) -> list:
        """What every rank handed in to this call, by rank."""
        board = self.boards[self.local.calls % 2]
        board[self.local.rank] = obj
        self.barrier.wait()
        self.local.calls += 1
        return list(board)

    def all_gather_object(self, out: list, obj) -> None:
        out[:] = self.everyone(obj)

    def broadcast_object_list(self, objs: list, src: int = 0) -> None:
        objs[:] = self.everyone(list(objs))[src]

    def new_subgroups_by_enumeration(self, lists, timeout=None):
        self.barrier.wait()
        mine = next((tuple(r) for r in lists if self.local.rank in r), None)
        return (("group", mine) if mine else None), []

    def get_rank(self, group=None) -> int:
        return self.local.rank if group is None else group[1].index(self.local.rank)
