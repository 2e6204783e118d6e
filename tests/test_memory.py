"""allocate_fitting: the largest size every rank can hold, the rest skipped, nothing fatal."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from helpers import free_port

from distbench.memory import allocate_fitting


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
