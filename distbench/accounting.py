"""Byte accounting for every collective: the one table, identical to nccl-tests' PERFORMANCE.md.

`size_bytes` is the per-rank buffer size, the larger of send and receive. For the ops whose
buffer is split across ranks (`split=True`) a requested size is the total and the per-rank
count is size // (n * elt). algbw = size_bytes / time, busbw = algbw * factor(n), decimal GB/s.
No torch here: the CLI validates op names with it before any heavy import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _ring(n: int) -> float:
    return (n - 1) / n


def _allreduce(n: int) -> float:
    return 2 * (n - 1) / n


def _one(n: int) -> float:
    return 1.0


@dataclass(frozen=True)
class OpAccounting:
    name: str
    split: bool
    factor: Callable[[int], float]
    uses_redop: bool
    uses_root: bool
    # The torch.distributed call decides what "in place" can mean: all_reduce, broadcast and
    # reduce only work in place; gather/scatter take lists and all_to_all has no in-place form.
    placements: tuple[bool, ...]


ACCOUNTING: dict[str, OpAccounting] = {
    a.name: a
    for a in (
        OpAccounting("all_reduce", False, _allreduce, True, False, (True,)),
        OpAccounting("reduce_scatter", True, _ring, True, False, (False, True)),
        OpAccounting("all_gather", True, _ring, False, False, (False, True)),
        OpAccounting("broadcast", False, _one, False, True, (True,)),
        OpAccounting("reduce", False, _one, True, True, (True,)),
        OpAccounting("all_to_all", True, _ring, False, False, (False,)),
        OpAccounting("gather", True, _ring, False, True, (False,)),
        OpAccounting("scatter", True, _ring, False, True, (False,)),
        # p2p ring (send to r+1, receive from r-1), nccl-tests' sendrecv.
        OpAccounting("sendrecv", False, _one, False, False, (False,)),
    )
}

COLLECTIVES = tuple(n for n in ACCOUNTING if n != "sendrecv")


@dataclass(frozen=True)
class Layout:
    per_rank_count: int  # elements each rank contributes (the torch call's count)
    count: int  # size_bytes / element size, always (see DESIGN.md)
    size_bytes: int


def layout(op: str, requested_bytes: int, elt: int, n: int) -> Layout | None:
    """The buffer a requested size turns into, or None when it cannot give every rank an element."""
    acc = ACCOUNTING[op]
    if acc.split:
        per_rank = requested_bytes // (n * elt)
        count = per_rank * n
    else:
        per_rank = count = requested_bytes // elt
    if per_rank == 0:
        return None
    return Layout(per_rank, count, count * elt)


def bandwidth(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in decimal GB/s."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * ACCOUNTING[op].factor(n)
