"""steps.host_memory: the most a step's tensors held off a GPU, counted by a dispatch mode."""

from __future__ import annotations

import gc

import torch

from distbench.steps.host_memory import peak_bytes

MB = 2**20


def idle() -> int:
    """What the process's tensors hold with nothing done: every measure counts them (garbage
    collected first, so that none is freed in the middle of a measure)."""
    gc.collect()
    return peak_bytes(lambda: None, [])


def test_the_peak_is_what_was_alive_at_once_not_the_sum():
    held = torch.zeros(MB // 4)  # 1 MB, from before the step

    def step():
        a = torch.ones(2 * MB // 4)  # 2 MB
        del a
        b = torch.ones(MB // 4) + 1  # 1 MB (and its 1 MB temporary)
        return b.sum()

    base = idle() - MB  # `held` is one of the process's tensors
    peak = peak_bytes(step, [held], ignore=[held]) - base
    # `held` ignored: 2 MB at once at most (the ones and the sum's operand, 1 + 1 MB, tie)
    assert 2 * MB <= peak < 2 * MB + 4096
    with_held = peak_bytes(step, [held]) - base
    assert with_held - peak == MB


def test_a_storage_resized_in_place_is_counted_at_its_size():
    """FSDP frees and refills its gathered parameters by resizing their storage, not through
    an op: the mode re-reads the sizes it counts after every op."""
    buf = torch.zeros(MB // 4)

    def step():
        buf.untyped_storage().resize_(0)
        torch.zeros(1) + 1  # an op, after which the sizes are read again
        buf.untyped_storage().resize_(MB)
        return (torch.zeros(1) + 1).sum()

    # 1 MB held, freed, then held again: never more than 1 MB and the ops' few bytes
    base = idle() - MB
    assert MB <= peak_bytes(step, [buf]) - base < MB + 4096
    # without re-reading, the refill would go unseen, or the free: here it is seen going
    buf.untyped_storage().resize_(0)
    assert idle() == base
    # the resizes were noted through a wrapper of torch's resize_, gone once the count ends
    assert "resize_" not in vars(torch.UntypedStorage)


def test_a_storage_resized_where_no_op_holds_it_counts_from_the_next_op():
    """FSDP's refill and free: a storage resized between two ops, by a caller no op shows the
    mode, is read again at the next op (and only then: reading every storage after every op
    cost a tenth of a step run)."""
    buf = torch.zeros(MB // 4)
    buf.untyped_storage().resize_(0)

    def refill():
        buf.untyped_storage().resize_(MB)
        return torch.ones(MB // 4).sum()  # 1 MB beside the refilled 1 MB

    base = idle()
    assert 2 * MB <= peak_bytes(refill, [buf]) - base < 2 * MB + 4096

    def free():
        buf.untyped_storage().resize_(0)
        return torch.ones(MB // 4).sum()  # 1 MB where the freed 1 MB was

    base = idle()  # the refilled 1 MB in it
    assert peak_bytes(free, [buf]) - base < 4096

