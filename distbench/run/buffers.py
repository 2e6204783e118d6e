"""Buffers every rank can hold: the largest size that fits everywhere, agreed by all ranks, so
a size too large for device memory becomes a skipped row instead of a dead run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

from distbench.core.options import parse_headroom
from distbench.run.peers import agree

T = TypeVar("T")


def available_bytes(device: torch.device) -> int:
    """What a new allocation can still use: the driver's free memory plus what torch's caching
    allocator holds reserved but unused (the driver counts that as taken)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def headroom_bytes(headroom: str, device: torch.device) -> int:
    """--headroom in bytes on this device: a size as given, or a fraction of the device."""
    size, fraction = parse_headroom(headroom)
    if fraction:
        return int(fraction * torch.cuda.get_device_properties(device).total_memory)
    return size


def release(device: torch.device) -> None:
    """Give freed buffers back to the device: the caching allocator keeps them otherwise, and
    the next size's decision (and NCCL's own allocations) would find them taken."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def allocate_fitting(alloc: Callable[[int], T], counts: Iterable[int], device: torch.device,
                     headroom: str = "512M", group=None) -> tuple[T | None, int]:
    """alloc(count) for the largest of `counts` that fits on every rank (of `group`), leaving
    `headroom` (--headroom) free on the device for what the backend allocates itself, and that
    count; (None, 0) when none fits."""
    keep = headroom_bytes(headroom, device) if device.type == "cuda" else 0
    for limit in sorted(set(counts), reverse=True):
        bufs = None
        try:
            bufs = alloc(limit)
            if device.type == "cuda" and available_bytes(device) < keep:
                bufs = None
        except (RuntimeError, MemoryError):  # torch.OutOfMemoryError is a RuntimeError
            bufs = None
        if agree(bufs is not None, device, group):
            return bufs, limit
        del bufs
        release(device)  # a rejected size must not make the smaller ones look taken
    return None, 0
