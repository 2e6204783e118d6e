"""Every point-to-point transfer goes through batch_isend_irecv, one op at a time where there is
one tensor to move. On NCCL an unbatched send/recv makes a communicator of its own per pair on
older torch, and newer torch warns on every rank that it serializes them."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distbench.models import PipelineShape
from distbench.ops import p2p
from distbench.strategies.pp import NaivePipeline


class _Done:
    def wait(self):
        return True


class _Op:
    """dist.P2POp without its process-group checks."""

    def __init__(self, op, tensor, peer):
        self.op, self.tensor, self.peer = op, tensor, peer


@pytest.fixture
def batches(monkeypatch) -> list[list[tuple[str, int]]]:
    """What each batch_isend_irecv call moved: (isend or irecv, peer) per op. Unbatched calls
    fail the test."""
    seen: list[list[tuple[str, int]]] = []

    def batch(ops):
        seen.append([(op.op.__name__, op.peer) for op in ops])
        return [_Done() for _ in ops]

    def unbatched(*args, **kwargs):
        raise AssertionError("an unbatched send or recv")

    monkeypatch.setattr(dist, "P2POp", _Op)
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    monkeypatch.setattr(dist, "send", unbatched)
    monkeypatch.setattr(dist, "recv", unbatched)
    return seen


@pytest.mark.parametrize("rank,want", [(0, [[("isend", 1)], [("irecv", 1)]]),
                                       (1, [[("irecv", 0)], [("isend", 0)]])])
def test_pingpong_sends_one_batched_op_at_a_time(batches, rank, want):
    p2p.pingpong(rank, 2, torch.zeros(4)).run()
    assert batches == want


@pytest.mark.parametrize("rank,want", [
    (0, [[("isend", 1)], [("irecv", 1)]]),  # activations forward, gradient back
    (1, [[("irecv", 0)], [("isend", 2)], [("irecv", 2)], [("isend", 0)]]),
    (2, [[("irecv", 1)], [("isend", 1)]]),
], ids=["first", "middle", "last"])
def test_the_naive_pipeline_sends_one_batched_op_at_a_time(batches, rank, want):
    shape = PipelineShape(hidden_size=8, seq_len=2, micro_batch_size=1, layers=3,
                          micro_batches=2, dtype="float32")
    NaivePipeline(shape, rank, 3, torch.device("cpu")).step()
    assert batches == want
