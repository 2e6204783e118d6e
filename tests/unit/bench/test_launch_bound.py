"""launch_bound on a simulated GPU: a host that launches ops into a queue of bounded depth, a GPU
that runs them in order, events stamped with the GPU's clock. Past the queue's depth the host
waits for a free slot, so it advances at the GPU's pace whatever the op costs to launch: the
flag must come from the launches before that happens, or every long loop reads launch-bound."""

from __future__ import annotations

import pytest
import torch
from fake_gpu import FakeGPU

from distbench.bench import timing

CUDA = torch.device("cuda", 0)


def _launch_bound(timed: timing.Timed) -> bool | None:
    per_iter = torch.tensor(timed.samples, dtype=torch.float64)
    st = timing.summarize_local(mean_sum=float(per_iter.mean()), wrong=0, n=1,
                                rank_max=0.0, rank_min=0.0, slowest=0, per_iter=per_iter,
                                host_share=-float("inf") if timed.host_share is None
                                else timed.host_share, rep_lengths=timed.rep_lengths)
    return st.launch_bound


@pytest.mark.parametrize("reps", [1, 5])
def test_a_long_loop_of_a_gpu_bound_op_is_not_launch_bound(monkeypatch, reps):
    """5 us to launch an op that runs 20 us: the GPU never waits. Over 20000 iterations the
    queue fills after some 500 and the host then keeps the GPU's pace: the share over the
    whole loop reads about 1, over its first launches a quarter."""
    flags = {}
    for iters in (200, 20_000):
        gpu = FakeGPU(launch_s=5e-6, op_s=20e-6)
        gpu.install(monkeypatch)
        timed = timing.measure(gpu.op, iters, CUDA, reps=reps)
        assert timed.host_share == pytest.approx(0.25, rel=0.05), iters
        flags[iters] = _launch_bound(timed)
    assert flags == {200: False, 20_000: False}


@pytest.mark.parametrize("iters", [200, 20_000])
def test_a_loop_the_host_cannot_keep_ahead_of_is_launch_bound(monkeypatch, iters):
    gpu = FakeGPU(launch_s=20e-6, op_s=5e-6)
    gpu.install(monkeypatch)
    timed = timing.measure(gpu.op, iters, CUDA)
    assert timed.host_share >= timing.LAUNCH_BOUND_SHARE
    assert _launch_bound(timed) is True


def test_a_sync_after_the_first_launches_leaves_the_share_known(monkeypatch):
    """The host waits every K ops only to keep queued work short; when the first wait comes
    after the launches the share is taken over, the share still says what it says."""
    gpu = FakeGPU(launch_s=5e-6, op_s=20e-6)
    gpu.install(monkeypatch)
    timed = timing.measure(gpu.op, 5000, CUDA, every=1000)
    assert timed.host_share == pytest.approx(0.25, rel=0.05)
    gpu = FakeGPU(launch_s=5e-6, op_s=20e-6)
    gpu.install(monkeypatch)
    assert timing.measure(gpu.op, 5000, CUDA, every=10).host_share is None  # waits within


def test_graph_replays_take_the_share_over_their_first_launches_too(monkeypatch):
    """--cuda-graph: one launch per replay of GRAPH_OPS ops; thousands of replays fill the
    queue as ops do."""
    gpu = FakeGPU(launch_s=5e-6, op_s=1e-9)  # a replay of 1000 ops: 1 us of GPU time
    gpu.install(monkeypatch)
    graph = timing.Captured(replay=lambda: gpu.op(timing.GRAPH_OPS), ops=timing.GRAPH_OPS)
    assert timing.measure(None, 2000 * timing.GRAPH_OPS, CUDA, graph=graph).host_share > 0.9
    gpu = FakeGPU(launch_s=5e-6, op_s=20e-9)  # 20 us per replay: the GPU never waits
    gpu.install(monkeypatch)
    graph = timing.Captured(replay=lambda: gpu.op(timing.GRAPH_OPS), ops=timing.GRAPH_OPS)
    timed = timing.measure(None, 2000 * timing.GRAPH_OPS, CUDA, graph=graph)
    assert timed.host_share == pytest.approx(0.25, rel=0.05)
