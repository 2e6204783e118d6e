"""Timing statistics and loops (distbench.bench.timing), without and with a one-rank gloo group."""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.core import noise

CPU = torch.device("cpu")


def _stats(per_iter, *, mean_sum=0.002, n=1, rank_max=0.002, rank_min=0.002, slowest=0, wrong=0):
    return timing.summarize_local(mean_sum=mean_sum, wrong=wrong, n=n, rank_max=rank_max,
                                  rank_min=rank_min, slowest=slowest,
                                  per_iter=torch.tensor(per_iter, dtype=torch.float64))


def test_summarize_local_means_and_rank_extremes():
    s = _stats([1e-3, 2e-3, 3e-3], mean_sum=0.009, n=3, rank_max=0.004, rank_min=0.0025,
               slowest=2, wrong=7)
    assert s.time_us == pytest.approx(3000.0)  # mean over ranks, in microseconds
    assert s.rank_max_us == pytest.approx(4000.0)
    assert s.rank_min_us == pytest.approx(2500.0)
    assert s.slowest_rank == 2
    assert s.wrong == 7
    assert s.iters == 3


def test_summarize_local_percentiles_hand_computed():
    # linear interpolation: p50 of 1,2,3,4 is 2.5; p99 is at position 0.99 * 3 = 2.97 -> 3.97
    s = _stats([4e-6, 1e-6, 3e-6, 2e-6])
    assert s.p50_us == pytest.approx(2.5)
    assert s.p99_us == pytest.approx(3.97)
    v = torch.tensor([5.0, 1.0, 9.0, 2.0, 7.0, 7.5, 100.0], dtype=torch.float64) * 1e-6
    s = _stats(v.tolist())
    assert s.p50_us == pytest.approx(float(torch.quantile(v, 0.5)) * 1e6)
    assert s.p50_us == pytest.approx(7.0)
    assert s.p99_us == pytest.approx(float(torch.quantile(v, 0.99)) * 1e6)
    assert s.p99_us > 9.0  # the outlier pulls p99 up, not p50


@pytest.mark.parametrize(("per_iter", "cv"), [
    ([1.0, 1.0, 1.0, 1.0], 0.0),
    ([1.0, 3.0], 50.0),  # population std 1, mean 2
    ([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], 40.0),  # std 2, mean 5
])
def test_summarize_local_cv_is_population(per_iter, cv):
    s = _stats([x * 1e-3 for x in per_iter])
    assert s.cv_pct == pytest.approx(cv)


def test_summarize_local_single_sample():
    s = _stats([5e-6])
    assert s.iters == 1
    assert s.p50_us == pytest.approx(5.0) and s.p99_us == pytest.approx(5.0)
    assert s.cv_pct == 0.0


def test_calibrated_iters():
    assert timing.calibrated_iters(0.0625, 0.5) == max(timing.MIN_ITERS, 8)
    assert timing.calibrated_iters(0.001, 0.0205) == 21  # ceil, not round or floor
    assert timing.calibrated_iters(0.001, 0.0201) == 21
    assert timing.calibrated_iters(1.0, 0.1) == timing.MIN_ITERS
    assert timing.calibrated_iters(10.0, 0.1) == timing.MIN_ITERS
    assert timing.calibrated_iters(1e-9, 1.0) == timing.MAX_ITERS
    assert timing.calibrated_iters(0.0, 1.0) == timing.MAX_ITERS
    assert timing.calibrated_iters(-1.0, 1.0) == timing.MAX_ITERS
    assert 1 <= timing.MIN_ITERS < timing.MAX_ITERS
    for per_op in (1e-7, 1e-5, 3.3e-4, 0.01, 0.7):
        it = timing.calibrated_iters(per_op, 0.2)
        assert timing.MIN_ITERS <= it <= timing.MAX_ITERS
        if timing.MIN_ITERS < it < timing.MAX_ITERS:
            assert it == math.ceil(0.2 / per_op)
            assert it * per_op >= 0.2 - 1e-12


def test_timed_loop_cpu_samples():
    calls = []

    def fn():
        calls.append(None)
        time.sleep(0.002)

    samples = timing.timed_loop(fn, 4, CPU)
    assert len(samples) == 4 and len(calls) == 4
    assert all(s >= 0.002 for s in samples)
    assert sum(samples) < 1.0


def test_timed_loop_each_sample_is_one_call():
    delays = iter([0.0, 0.02, 0.0])
    samples = timing.timed_loop(lambda: time.sleep(next(delays)), 3, CPU)
    assert samples[1] >= 0.02
    assert samples[1] > samples[0] and samples[1] > samples[2]


# ---- with a process group ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def group(one_rank_group):
    return None


def test_summarize_single_rank(group):
    s = timing.summarize([0.001, 0.002, 0.003], 0, CPU)
    assert s.time_us == pytest.approx(2000.0)
    assert s.slowest_rank == 0
    assert s.rank_min_us == pytest.approx(2000.0)
    assert s.rank_max_us == pytest.approx(2000.0)
    assert s.rank_min_us == s.rank_max_us
    assert s.p50_us == pytest.approx(2000.0)
    assert s.iters == 3
    assert s.wrong == 0
    assert timing.summarize([0.001, 0.001], 5, CPU).wrong == 5


def test_warmup_and_calibrate(group):
    calls = []

    def fn():
        calls.append(None)
        time.sleep(0.001)

    iters, per_op = timing.warmup_and_calibrate(fn, 3, 17, 0.05, CPU)
    assert iters == 17
    assert len(calls) == 3
    assert per_op >= 0.001

    calls.clear()
    iters, per_op = timing.warmup_and_calibrate(fn, 0, None, 0.02, CPU)
    assert len(calls) == 1  # at least one untimed op
    assert per_op >= 0.001
    assert timing.MIN_ITERS <= iters <= timing.MAX_ITERS
    assert iters == timing.calibrated_iters(per_op, 0.02)
    assert iters <= 20  # 1 ms per op fills 20 ms in at most 20 iterations


def test_measure_single_rank(group):
    timed = timing.measure(lambda: time.sleep(0.001), 3, CPU)
    assert len(timed.samples) == 3 and all(s >= 0.001 for s in timed.samples)
    assert timed.host_share is None  # on CPU the host's time is the op's time


# -- the GPU branch, faked: events as host stamps ---------------------------------------------

class _FakeEvent:
    made = 0
    recorded = 0
    synced = 0

    def __init__(self, enable_timing=False):
        type(self).made += 1
        self.t = 0.0

    def record(self):
        type(self).recorded += 1
        self.t = time.perf_counter()

    def synchronize(self):
        type(self).synced += 1

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


@pytest.fixture
def fake_events(monkeypatch):
    for name in ("made", "recorded", "synced"):
        setattr(_FakeEvent, name, 0)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return _FakeEvent


CUDA = torch.device("cuda", 0)


def test_events_are_made_and_recorded_before_the_barrier(fake_events, monkeypatch):
    """A CUDA event's creation and first record cost host time: none of it inside the loop."""
    at_barrier = {}
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: at_barrier.update(
        made=fake_events.made, recorded=fake_events.recorded))
    made_in_loop = []
    timed = timing.measure(lambda: made_in_loop.append(fake_events.made), 20, CUDA)
    assert at_barrier == {"made": 21, "recorded": 21}  # iters + 1, each recorded once
    assert set(made_in_loop) == {21}  # nothing created while the ops ran
    assert len(timed.samples) == 20 and timed.host_share is not None


def test_the_host_syncs_every_k_ops_and_then_says_nothing_of_launch_bound(fake_events,
                                                                          monkeypatch):
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    timed = timing.measure(lambda: None, 10, CUDA, every=3)
    assert fake_events.synced == 3 + 1  # after ops 3, 6 and 9, then the end
    assert timed.host_share is None  # the host waited, so its time is not its launch time
    timing.measure(lambda: None, 10, CUDA, every=None)


def test_sync_every_keeps_queued_work_within_half_the_timeout():
    assert timing.sync_every(0.4, 300) == 375  # 375 x 0.4 s = 150 s queued at most
    assert timing.sync_every(1e-5, 300) >= 10_000_000  # any loop --iters allows, queued whole
    assert timing.sync_every(1000.0, 300) == 1  # an op longer than that: one at a time
    assert timing.sync_every(0.0, 300) is None


def test_no_collection_runs_inside_a_timed_loop():
    seen = []
    timing.timed_loop(lambda: seen.append(gc.isenabled()), 5, CPU)
    assert seen == [False] * 5 and gc.isenabled()


def test_a_loop_is_launch_bound_when_any_rank_s_host_set_the_pace(monkeypatch):
    from fake_group import run_ranks

    shares = {0: 0.2, 1: 0.95}
    stats = run_ranks(monkeypatch, 2, lambda r: timing.summarize(
        [1e-3] * 3, 0, CPU, host_share=shares[r]))
    assert stats[0].launch_bound is True and stats[1].launch_bound is True
    stats = run_ranks(monkeypatch, 2, lambda r: timing.summarize([1e-3] * 3, 0, CPU,
                                                                 host_share=0.5))
    assert stats[0].launch_bound is False
    stats = run_ranks(monkeypatch, 2, lambda r: timing.summarize([1e-3] * 3, 0, CPU))
    assert stats[0].launch_bound is None  # CPU: the host's time is the op's time


def test_a_torch_without_cuda_graphs_gives_a_skip_every_rank_agrees_on(monkeypatch):
    """--cuda-graph where capture is impossible: Skipped with torch's reason, not a crash."""
    from fake_group import run_ranks

    from distbench.bench.measure import Settings, Skipped, timed_samples

    def capture(fn, iters, device):  # rank 1's torch cannot capture, rank 0's can
        if dist.get_rank() == 1:
            raise RuntimeError("Tried to instantiate dummy base class CUDAGraph")
        return lambda: None

    monkeypatch.setattr(timing, "capture", capture)

    def attempt(rank: int):
        m = Settings(device=CPU, timeout=60, warmup=1, iters=3, cuda_graph=True,
                     phase=lambda what, seconds: None)
        try:
            timed_samples(m, lambda: None, "x")
        except Skipped as e:
            return str(e)
        return "measured"

    out = run_ranks(monkeypatch, 2, attempt)
    assert out[1] == "cannot capture in a CUDA graph: Tried to instantiate dummy base class " \
                     "CUDAGraph"
    assert out[0] == "another rank could not capture this in a CUDA graph"


class _FakeGraphs:
    """torch.cuda's stream and graph API, recording what is done to the current stream. A
    capture that fails raises from the graph context's exit, as torch's does when capture_end
    finds the capture invalidated, and that is before the context gives the stream back."""

    def __init__(self, monkeypatch, fail: bool):
        self.current, self.replays, self.fail = "ours", 0, fail
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: _Stream("ours"))
        monkeypatch.setattr(cuda, "Stream", lambda device=None: _Stream("side"))
        monkeypatch.setattr(cuda, "stream", self._stream_ctx)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "set_stream", lambda s: setattr(self, "current", s.name))
        monkeypatch.setattr(cuda, "CUDAGraph", lambda: SimpleNamespace(replay=self._replay))
        monkeypatch.setattr(cuda, "graph", self._graph_ctx)

    def _replay(self):
        self.replays += 1

    @contextmanager
    def _stream_ctx(self, s):
        before, self.current = self.current, s.name
        yield
        self.current = before

    @contextmanager
    def _graph_ctx(self, graph):
        before, self.current = self.current, "capture"
        yield
        if self.fail:
            try:
                raise RuntimeError("operation not permitted when stream is capturing")
            except RuntimeError:
                raise RuntimeError("CUDA error: operation failed due to a previous error "
                                   "during capture") from None
        self.current = before


class _Stream:
    def __init__(self, name):
        self.name = name

    def wait_stream(self, other):
        pass


def test_a_failed_capture_gives_the_stream_back(monkeypatch):
    graphs = _FakeGraphs(monkeypatch, fail=True)
    with pytest.raises(RuntimeError):
        timing.capture(lambda: None, 5, CUDA)
    assert graphs.current == "ours"  # later rows must not run on torch's capture stream


def test_a_long_loop_replays_a_graph_of_at_most_graph_ops(monkeypatch, fake_events):
    graphs = _FakeGraphs(monkeypatch, fail=False)
    calls = []
    captured = timing.capture(lambda: calls.append(1), 2500, CUDA)
    assert captured.ops == timing.GRAPH_OPS and len(calls) == 1 + timing.GRAPH_OPS
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    timed = timing.measure(lambda: None, 2500, CUDA, graph=captured)
    assert graphs.replays == 1 + 3  # one untimed (the upload), then 3 x 1000 >= 2500 ops
    assert len(timed.samples) == 3 * timing.GRAPH_OPS  # whole replays: what really ran


# -- separated repetitions --------------------------------------------------------------------

@pytest.mark.parametrize("iters,reps,lengths", [
    (20, 5, (4, 4, 4, 4, 4)), (7, 5, (2, 2, 1, 1, 1)), (3, 5, (1, 1, 1)), (1, 5, (1,)),
    (10, 1, (10,)),
])
def test_iterations_split_into_repetitions_differing_by_one_at_most(iters, reps, lengths):
    assert noise.rep_lengths(iters, reps) == lengths


def test_each_repetition_starts_after_a_barrier_and_none_is_timed_across_it(monkeypatch):
    events = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: events.append("barrier"))
    timed = timing.measure(lambda: events.append("op"), 7, CPU, reps=3)
    assert events == ["barrier", "op", "op", "op", "barrier", "op", "op", "barrier", "op", "op"]
    assert len(timed.samples) == 7 and timed.rep_lengths == (3, 2, 2)
    one = timing.measure(lambda: None, 4, CPU)  # one loop, as before repetitions
    assert one.rep_lengths == ()


def test_repetitions_make_their_events_once_before_the_first_barrier(fake_events, monkeypatch):
    made_at_barrier = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: made_at_barrier.append(
        fake_events.made))
    made_in_loop = []
    timed = timing.measure(lambda: made_in_loop.append(fake_events.made), 10, CUDA, reps=4)
    assert made_at_barrier == [4] * 4  # the longest repetition (3) + 1, made once
    assert set(made_in_loop) == {4}
    assert timed.rep_lengths == (3, 3, 2, 2) and len(timed.samples) == 10


def test_summarize_local_keeps_each_repetition_s_median():
    per_iter = [1e-3, 3e-3, 2e-3, 10e-3, 4e-3, 5e-3, 6e-3]
    s = timing.summarize_local(mean_sum=0.004, wrong=0, n=1, rank_max=0.004, rank_min=0.004,
                               slowest=0, per_iter=torch.tensor(per_iter, dtype=torch.float64),
                               rep_lengths=(3, 2, 2))
    assert s.reps_us == pytest.approx((2000.0, 7000.0, 5500.0))
    assert _stats([1e-3, 2e-3]).reps_us == pytest.approx((1500.0,))  # one loop: one median
    with pytest.raises(ValueError, match="repetitions of"):
        timing.summarize_local(mean_sum=0.004, wrong=0, n=1, rank_max=0.004, rank_min=0.004,
                               slowest=0, per_iter=torch.tensor(per_iter, dtype=torch.float64),
                               rep_lengths=(3, 3))


def test_queued_work_and_the_watchdog_follow_the_typical_warmup_op(monkeypatch):
    """One fast warmup op among slow ones (an op that found the link idle, a lucky
    scheduler slot): the fastest op sets the count to fill --min-time (noise only ever makes
    an op slower), but the host's syncs and the watchdog's budget are bounds on how long the
    loop's ops take, which the fastest op understates. Taken from it, K ops at the loop's
    real pace were 20 times half the timeout, the stretch NCCL's watchdog allows."""
    from fake_group import run_ranks

    from distbench.bench.measure import Settings, timed_samples

    seen = {}

    def fake_measure(fn, iters, device, every=None, *args, **kwargs):
        seen.update(iters=iters, every=every)
        return timing.Timed([0.02] * iters)

    monkeypatch.setattr(timing, "measure", fake_measure)
    steps = []
    m = Settings(device=CPU, timeout=1.0, warmup=5, iters=None, reps=1, min_time=0.5,
                 phase=lambda what, seconds: steps.append((what, seconds)))
    delays = iter([0.001, 0.02, 0.02, 0.02, 0.02])
    run_ranks(monkeypatch, 1, lambda r: timed_samples(m, lambda: time.sleep(next(delays)), "x"))
    # --min-time / the fastest op (500 here; sleep(0.001) took 5 ms under load, giving 98), not
    # / the typical op (25): the count is not cut short
    assert seen["iters"] >= 2 * 0.5 / 0.02
    assert seen["every"] is not None and seen["every"] * 0.02 <= timing.QUEUE_SHARE * 1.0
    budget = dict(steps)["x"]
    assert budget >= 1.0 + 2 * seen["iters"] * 0.02  # the loop at the typical op's pace
