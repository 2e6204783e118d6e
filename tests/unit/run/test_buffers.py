"""allocate_fitting: the largest size every rank can hold, the rest skipped, nothing fatal."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from helpers import free_port

from distbench.run import buffers
from distbench.run.buffers import allocate_fitting


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_largest_count_that_fits_is_chosen(one_rank_group):
    tried = []

    def alloc(count):
        tried.append(count)
        if count > 100:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return torch.empty(count)

    buf, fitted = allocate_fitting(alloc, [10, 1000, 100, 100, 50], torch.device("cpu"))
    assert fitted == 100 and buf.numel() == 100
    assert tried == [1000, 100]  # largest first, duplicates tried once


def test_nothing_fits(one_rank_group):
    def alloc(count):
        raise MemoryError

    assert allocate_fitting(alloc, [8, 16], torch.device("cpu")) == (None, 0)


# -- on a GPU, faked: torch.cuda's memory API over a caching allocator ----------------------

GiB = 1 << 30
CUDA = torch.device("cuda", 0)


class FakeCuda:
    """A device of `total` bytes behind torch's caching allocator: a freed block stays reserved
    (the driver counts it as taken) until empty_cache()."""

    def __init__(self, total: int):
        self.total, self.allocated, self.reserved = total, 0, 0
        self.emptied = 0

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (
            self.total - self.reserved, self.total))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device=None: type("Props", (), {"total_memory": self.total}))

    def empty_cache(self) -> None:
        self.reserved = self.allocated
        self.emptied += 1

    def alloc(self, nbytes: int) -> _Block:
        if self.allocated + nbytes > self.total:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        return _Block(self, nbytes)


class _Block:
    def __init__(self, device: FakeCuda, nbytes: int):
        self.device, self.nbytes = device, nbytes

    def __del__(self):
        self.device.allocated -= self.nbytes


@pytest.fixture
def fake_cuda(monkeypatch, one_rank_group):
    device = FakeCuda(8 * GiB)
    device.install(monkeypatch)
    # agreement runs on the CPU group: the device here exists only as far as memory goes
    real_agree = buffers.agree
    monkeypatch.setattr(buffers, "agree",
                        lambda ok, dev, group=None: real_agree(ok, torch.device("cpu"), group))
    return device


def test_a_rejected_size_does_not_make_the_smaller_ones_look_taken(fake_cuda):
    """7.75 GiB fits but leaves 0.25 GiB free, under the 512 MiB headroom: rejected. Its freed
    block stays reserved by the caching allocator; the next size must still be judged on what
    the device really has, not on what the driver reports free."""
    sizes = [int(7.75 * GiB), 4 * GiB, 1 * GiB]
    bufs, fitted = buffers.allocate_fitting(fake_cuda.alloc, sizes, CUDA)
    assert fitted == 4 * GiB and bufs.nbytes == 4 * GiB
    assert fake_cuda.emptied >= 1  # the rejected block was given back


def test_cached_but_unused_memory_counts_as_available(fake_cuda, monkeypatch):
    """Even with empty_cache doing nothing (blocks still cached), reserved-but-unused memory is
    available to the next allocation."""
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    fake_cuda.reserved = 6 * GiB  # cached from an earlier series, unused now
    assert buffers.available_bytes(CUDA) == 8 * GiB
    bufs, fitted = buffers.allocate_fitting(fake_cuda.alloc, [4 * GiB], CUDA)
    assert fitted == 4 * GiB


@pytest.mark.parametrize("headroom,fits", [("512M", 7 * GiB), ("0.25", 6 * GiB),
                                           ("1536M", 6 * GiB), ("0", 8 * GiB)])
def test_the_headroom_is_an_option_in_bytes_or_a_fraction(fake_cuda, headroom, fits):
    sizes = [8 * GiB, 7 * GiB, 6 * GiB]
    bufs, fitted = buffers.allocate_fitting(fake_cuda.alloc, sizes, CUDA, headroom)
    assert fitted == fits
