"""One watch probe measured on a rank: timed as `collective` times an op (a back-to-back loop,
CUDA events on a GPU with one wait at its end, the time per op), the cycle's time the slowest
rank's, the late rank found op by op, and each rank's GPU labelled by its NVML index.
The tests that start processes: test_watch_probe_multiproc.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fake_gpu import FakeGPU
from fake_session import FakeSession, fake_runtime
from watch_helpers import AR, _straggler_judged

from distbench.bench import timing
from distbench.core.accounting import bandwidth
from distbench.kinds.watch.loop import _drain, _Probe, nvml_index, rank_infos, result_of
from distbench.kinds.watch.records import RankInfo, arrivals
from distbench.ops.collectives import OPS

CUDA = torch.device("cuda", 0)


def gpu_probe(iters: int) -> _Probe:
    """A probe whose op is the fake GPU's: its events made before the loop, as _Probe makes
    them."""
    p = _Probe.__new__(_Probe)
    p.probe, p.op = AR, OPS["all_reduce"]
    p.lay = SimpleNamespace(size_bytes=AR.size_bytes)
    p.marks = timing.events(2 * iters, CUDA)
    p.mine = torch.zeros(2 + iters, dtype=torch.float64)
    p.every = [torch.zeros_like(p.mine)]
    return p


@pytest.mark.parametrize("iters", [10, 100])
def test_a_gpu_probe_is_timed_by_events_with_no_wait_per_op(monkeypatch, one_rank_group,
                                                            iters):
    """5 us to launch an op the GPU runs in 20 us: the time is the GPU's 20 us per op (events,
    and the loop divided by --iters), not the host's 5 us; the host waits for the GPU the same
    number of times whatever --iters is (none per op), and makes no event in the loop."""
    gpu = FakeGPU(launch_s=5e-6, op_s=20e-6)
    gpu.install(monkeypatch)
    probe = gpu_probe(iters)
    probe.case = SimpleNamespace(run=gpu.op, prepare=lambda: None, check=lambda: 0)
    made = []
    real_event = torch.cuda.Event
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: made.append(1) or real_event(**kw))
    gpu.syncs = 0
    s = FakeSession(fake_runtime(device=CUDA), check=True)
    got = probe.measure(s, iters, None)
    assert got.status == "ok"
    # the first op's 5 us launch falls inside the loop: 0.5 us an op at 10, 0.05 at 100
    assert got.time_us == pytest.approx(20.0, abs=0.6)
    assert got.rank_time_us == pytest.approx((20.0,), abs=0.6)
    _, busbw = bandwidth(OPS["all_reduce"].accounting, AR.size_bytes, got.time_us / 1e6, 1)
    assert got.busbw_gbps == pytest.approx(busbw)
    # the warm-up's sync, the barrier before the loop, the loop's last event, the check's sync
    assert gpu.syncs == 4
    assert made == []


def test_a_planted_delay_stays_outside_the_stamps():
    """DISTBENCH_TEST_SLOW_RANK's sleep comes before each op: the loop's time holds it (the
    others would wait for it), the in-call times do not."""
    ops = []
    timed = timing.in_call_loop(lambda: ops.append(1), 5, torch.device("cpu"),
                                before=lambda: timing.time.sleep(0.01))
    assert len(ops) == 5
    assert timed.loop_s >= 0.04
    assert max(timed.calls_s) < 0.005


def test_the_cycle_time_is_the_slowest_ranks_loop():
    """Each rank's (loop time per op, wrong elements, in-call times): rank 1's loop was slower,
    and its time is the cycle's; busbw comes from it."""
    every = [[1000.0, 0, 900.0, 950.0], [1500.0, 0, 1400.0, 1450.0]]
    got = result_of(AR, OPS["all_reduce"].accounting, AR.size_bytes, 2, every)
    assert got.time_us == 1500.0
    _, busbw = bandwidth(OPS["all_reduce"].accounting, AR.size_bytes, 1500e-6, 2)
    assert got.busbw_gbps == pytest.approx(busbw)
    assert got.rank_time_us == (925.0, 1425.0)
    wrong = result_of(AR, OPS["all_reduce"].accounting, AR.size_bytes, 2,
                      [[1000.0, 3, 900.0], [1000.0, 1, 900.0]])
    # the note counts the wrong elements summed over the ranks (3 + 1)
    assert wrong.status == "failed" and wrong.note.startswith("4 wrong"), wrong.note
    assert "element" in wrong.note, wrong.note


def test_the_late_rank_is_late_in_most_ops_not_in_one():
    """Rank 2 comes 5 ms late in every op; rank 1 was descheduled once for 50 ms (the others
    waited that once). By the mean, rank 1 reads later; by the median over the ops, rank 2 is
    the one the others wait for, by about 5 ms."""
    op, late = 1000.0, 5000.0
    calls = [[op + late] * 8, [op + late] * 8, [op] * 8]  # rank 2 late: the others wait
    calls[0][3] += 50_000.0  # rank 1 descheduled in op 3: rank 0 and 2 waited for it
    calls[2][3] += 50_000.0
    calls[1][3] = op
    rank, by = arrivals(calls)
    assert rank == 2 and by == pytest.approx(late)
    means = [sum(c) / len(c) for c in calls]
    assert min(range(3), key=means.__getitem__) == 1  # what the means alone would name


def test_the_gpu_label_is_the_nvml_index_of_the_ranks_uuid():
    """Under CUDA_VISIBLE_DEVICES or per-task binding every rank may see its GPU as device 0:
    the label DCGM joins on is the NVML index of the GPU's UUID in its node's snapshot."""
    ranks = [{"rank": 0, "host": "gpu7", "node": 0, "local_rank": 0, "gpu_uuid": "GPU-bbb"},
             {"rank": 1, "host": "gpu7", "node": 0, "local_rank": 1, "gpu_uuid": "GPU-AAA"},
             {"rank": 2, "host": "gpu8", "node": 1, "local_rank": 0, "gpu_uuid": "GPU-ccc"},
             {"rank": 3, "host": "cpu1", "node": 2, "local_rank": 0, "gpu_uuid": None}]
    snapshots = [{"host": "gpu7", "gpus": [{"index": 0, "uuid": "GPU-aaa"},
                                           {"index": 1, "uuid": "GPU-bbb"}]},
                 {"host": "gpu8", "gpus": [{"index": 0, "error": "nvml failed"}]}]
    assert rank_infos(ranks, snapshots, 4) == [
        RankInfo(0, "gpu7", "1", "GPU-bbb"), RankInfo(1, "gpu7", "0", "GPU-AAA"),
        RankInfo(2, "gpu8", "", "GPU-ccc"), RankInfo(3, "cpu1", "", "")]
    assert nvml_index("GPU-bbb", []) == ""


def test_a_node_name_scontrol_would_misread_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                  one_rank_group, capsys):
    """It was a ValueError out of the run's end: a traceback, exit 3, the verdict lost."""
    monkeypatch.setenv("SLURMD_NODENAME", "x$(id) y")
    s = FakeSession(fake_runtime())
    _drain(s, _straggler_judged())
    (said,) = s.console.logged
    assert said.startswith("watch: cannot drain: "), said
    assert "not a Slurm node name" in said and "'x$(id) y'" in said, said
    assert "SLURMD_NODENAME" in said and "\n" not in said, said  # where the name came from
    assert capsys.readouterr().out == ""  # no drain line printed: none was run
