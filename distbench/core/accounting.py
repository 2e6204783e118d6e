"""Byte accounting, identical to nccl-tests' PERFORMANCE.md. No torch here: the CLI lists and
validates ops with it before any heavy import.

`size_bytes` is the per-rank buffer size, the larger of send and receive. For the ops whose
buffer is split across ranks (`split=True`) a requested size is the total and the per-rank
count is size // (n * elt) rounded down to a multiple of 16 bytes, as in nccl-tests.
algbw = size_bytes / time, busbw = algbw * factor(n), decimal GB/s.
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


# p2p ring (send to r+1, receive from r-1), nccl-tests' sendrecv: what accept's plan estimates
# a p2p check by, without the torch its measurement needs
SENDRECV = Accounting(split=False, factor=unit_factor)


@dataclass(frozen=True)
class Buffer:
    """The buffer a requested size turns into (a parallel layout is planner.layouts.Layout)."""

    per_rank_count: int  # elements each rank contributes (the torch call's count)
    count: int  # size_bytes / element size, always
    size_bytes: int


# nccl-tests rounds a split op's per-rank count down to this many bytes
# (`(count/nranks) & -(16/eltSize)` in all_gather.cu, reduce_scatter.cu, alltoall.cu, gather.cu,
# scatter.cu), so every rank's block starts 16-byte aligned. Matching it keeps size_bytes
# comparable row for row with nccl-tests.
SPLIT_ALIGN_BYTES = 16


def split_granule(elt: int) -> int:
    """The elements a split op's per-rank count is a multiple of."""
    # nccl-tests' mask only means "a multiple of 16/eltSize" when eltSize divides 16; every
    # dtype distbench has does, and any other would need its own reading of nccl-tests.
    if elt <= 0 or SPLIT_ALIGN_BYTES % elt:
        raise ValueError(f"element size {elt} does not divide {SPLIT_ALIGN_BYTES}")
    return SPLIT_ALIGN_BYTES // elt


def min_bytes(acc: Accounting, elt: int, n: int) -> int:
    """The smallest requested size `buffer_of` gives a buffer for (smaller ones are skipped)."""
    return n * split_granule(elt) * elt if acc.split else elt


def buffer_of(acc: Accounting, requested_bytes: int, elt: int, n: int) -> Buffer | None:
    """The buffer a requested size turns into, or None when it leaves a rank no element (for a
    split op, less than 16 bytes per rank)."""
    if acc.split:
        granule = split_granule(elt)
        per_rank = requested_bytes // (n * elt) // granule * granule
        count = per_rank * n
    else:
        per_rank = count = requested_bytes // elt
    if per_rank == 0:
        return None
    return Buffer(per_rank, count, count * elt)


def bandwidth(acc: Accounting, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in decimal GB/s."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * acc.factor(n)
