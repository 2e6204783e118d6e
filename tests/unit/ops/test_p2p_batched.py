"""Every point-to-point transfer goes through batch_isend_irecv, one op at a time where there is
one tensor to move. On NCCL an unbatched send/recv makes a communicator of its own per pair on
older torch, and newer torch warns on every rank that it serializes them."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fake_session import FakeSession, fake_runtime

from distbench.ops import p2p
from distbench.steps.pp_model import build_pipeline
from distbench.steps.stacks import PipelineShape


class _Done:
    def wait(self):
        return True


class _Op:
    """dist.P2POp without its process-group checks."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        self.op, self.tensor, self.group = op, tensor, group
        self.peer = peer if group_peer is None else group_peer


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
    build_pipeline("naive", shape, rank, 3, torch.device("cpu")).step()
    assert batches == want


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_matrix_probe_uses_every_pair_this_rank_is_in_once(batches, world):
    """NCCL connects a pair the first time it is used, allocating as it does: the probe, run
    before the sizes are decided, must use every link, in one order every rank shares."""
    from distbench.bench import series
    from distbench.kinds.p2p.output import MATRIX_OUTPUT

    s = FakeSession(fake_runtime(1, world), check=True)
    ser = series.matrix(s, "float32", MATRIX_OUTPUT, [])
    case = ser.probe()
    case.prepare()
    case.run()
    others = [r for r in range(world) if r != 1]
    want = []
    for src in range(world):
        for dst in range(world):
            if src == 1 and dst != 1:
                want.append([("isend", dst)])
            elif dst == 1 and src != 1:
                want.append([("irecv", src)])
    assert batches == want and len(want) == 2 * len(others)


@pytest.mark.parametrize("pattern", ["ring", "pingpong"])
def test_every_p2p_pattern_is_probed_on_one_element(batches, pattern):
    from distbench.bench import series
    from distbench.kinds.p2p.output import OUTPUT

    s = FakeSession(fake_runtime(0, 2), check=True)
    ser = series.p2p_pattern(s, pattern, "float32", OUTPUT)
    case = ser.probe()
    case.prepare()
    case.run()
    assert batches and all(len(b) <= 2 for b in batches)
