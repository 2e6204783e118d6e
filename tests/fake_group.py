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
