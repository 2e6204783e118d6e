"""Byte accounting, identical to nccl-tests' PERFORMANCE.md. No torch here: the CLI lists and
validates ops with it before any heavy import.

`size_bytes` is the per-rank buffer size, the larger of send and receive. For the ops whose
buffer is split across ranks (`split=True`) a requested size is the total and the per-rank
count is size // (n * elt). algbw = size_bytes / time, busbw = algbw * factor(n), decimal GB/s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def ring_factor(n: int) -> float:
    return (n - 1) / n


def allreduce_factor(n: int) -> float:
    return 2 * (n - 1) / n


def unit_factor(n: int) -> float:
    return 1.0


@dataclass(frozen=True)
class Accounting:
    split: bool  # the requested size is the whole buffer, split into one block per rank
    factor: Callable[[int], float]  # busbw / algbw at n ranks


@dataclass(frozen=True)
class Layout:
    per_rank_count: int  # elements each rank contributes (the torch call's count)
    count: int  # size_bytes / element size, always
    size_bytes: int


def layout(acc: Accounting, requested_bytes: int, elt: int, n: int) -> Layout | None:
    """The buffer a requested size turns into, or None when it cannot give every rank an element."""
    if acc.split:
        per_rank = requested_bytes // (n * elt)
        count = per_rank * n
    else:
        per_rank = count = requested_bytes // elt
    if per_rank == 0:
        return None
    return Layout(per_rank, count, count * elt)


def bandwidth(acc: Accounting, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in decimal GB/s."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * acc.factor(n)
