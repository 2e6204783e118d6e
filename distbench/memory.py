"""Buffers every rank can hold: the largest size that fits everywhere, agreed by all ranks, so
a size too large for device memory becomes a skipped row instead of a dead run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

# Free device memory a size must leave for the check's generated data (CHUNK-bounded) and the
# backend's own buffers; without it a size that just fits dies in the check instead.
HEADROOM_BYTES = 512 << 20


def agree(ok: bool, device: torch.device) -> bool:
    """True on every rank when it is true on every rank."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0


def allocate_fitting(alloc: Callable[[int], T], counts: Iterable[int],
                     device: torch.device) -> tuple[T | None, int]:
    """alloc(count) for the largest of `counts` that fits on every rank, and that count;
    (None, 0) when none fits."""
    for limit in sorted(set(counts), reverse=True):
        bufs = None
        try:
            bufs = alloc(limit)
            if device.type == "cuda" and torch.cuda.mem_get_info(device)[0] < HEADROOM_BYTES:
                bufs = None
        except (RuntimeError, MemoryError):  # torch.OutOfMemoryError is a RuntimeError
            bufs = None
        if agree(bufs is not None, device):
            return bufs, limit
        del bufs
    return None, 0
