"""The training steps where they are meant to run, in this process: the GPU branches taken with
a faked torch.cuda (the fit check before a layout is built, the bubble timed with CUDA events),
the watchdog that ends a run whose rank failed while its peers wait, DDP as trainers build it,
each rank fed only its replica's share, and plan's optimizer point timing the step's AdamW."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest
import torch
from fake_session import FakeSession, fake_runtime

from distbench.bench import timing
from distbench.kinds.plan import measurements
from distbench.parallel import data_parallel
from distbench.planner.layouts import Layout
from distbench.planner.models import PRESETS, ModelSpec
from distbench.run import runtime
from distbench.steps import mesh_model, recipe, step3d
from distbench.steps.dp_model import MasterAdamW

GPU = torch.device("cuda", 0)
CPU = torch.device("cpu")
GIB = 2**30
SMALL = ModelSpec(name="small", layers=2, hidden_size=16, ffn_size=32, heads=2, seq_len=4,
                  batch=8)


# ---- the fit check, before anything is built --------------------------------------------------

def _session(device, rank: int = 0):
    return FakeSession(fake_runtime(rank, 2, device=device, backend="nccl"), timeout=60, iters=2,
                       warmup=1)


@pytest.fixture
def one_gpu(monkeypatch):
    """A GPU with 10 GiB free, as torch.cuda would say; the agreement is this rank's alone."""
    asked: list = []
    monkeypatch.setattr(recipe, "available_bytes", lambda d: asked.append(d) or 10 * GIB)
    monkeypatch.setattr(recipe, "free", lambda d: None)
    monkeypatch.setattr(recipe, "agree_reason", lambda reason, device: reason)
    return asked


def test_a_layout_the_gpu_cannot_hold_is_refused_with_the_figures(one_gpu):
    s = _session(GPU, rank=1)
    assert recipe.fits_here(s, 20 * GIB, "tp1 pp2 dp1 zero0 m4") == (
        "tp1 pp2 dp1 zero0 m4 needs about 20 GiB on each GPU, 10 GiB free on rank 1's")
    assert recipe.fits_here(s, 5 * GIB, "tp1 pp2 dp1 zero0 m4") == ""
    # the estimate leaves out fragmentation, workspaces and NCCL's buffers: 10% to spare
    assert recipe.fits_here(s, 9.5 * GIB, "x") != ""
    assert one_gpu == [GPU] * 3


def test_host_memory_is_the_launchers_to_bound(one_gpu):
    assert recipe.fits_here(_session(CPU), 1e15, "x") == ""
    assert one_gpu == []


def test_step_skips_a_layout_that_does_not_fit_before_building_it(monkeypatch):
    """Stage 0 of a pipeline out of memory mid-step leaves its peers waiting in a receive: a
    layout that cannot fit is a skipped row, and no mesh, model or batch is made for it."""
    monkeypatch.setattr(recipe, "fits_here", lambda s, need, what: f"{what} needs about 90 GiB")
    monkeypatch.setattr(step3d, "layout_mesh", lambda *a: pytest.fail("mesh built"))
    s = _session(GPU)
    row, info = step3d.measure_layout(s, PRESETS["7b"], Layout(tp=1, pp=2, dp=1,
                                                                micro_batches=4),
                                      torch.bfloat16, [], check=True)
    assert row["status"] == "skipped" and "step_us" not in row
    assert row["note"] == "cannot run here: tp1 pp2 dp1 zero0 m4 needs about 90 GiB"
    assert info == {"skipped": row["note"]}


# ---- the bubble on the device's clock -----------------------------------------------------------

class FakeEvent:
    """torch.cuda.Event as the GPU times it: each record 5 ms after the last, whatever the host
    does between."""

    clock = itertools.count(0, 5)

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self) -> None:
        self.at = next(FakeEvent.clock)

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at - self.at


@pytest.fixture
def cuda_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


def test_spans_on_a_gpu_are_timed_by_cuda_events(cuda_events):
    spans = timing.Spans(GPU)
    spans.reset(expect=2)
    for _ in range(3):  # one more span than expected: an event more is made
        spans.start()
        time.sleep(0.01)  # host time, which a GPU's span must not see
        spans.stop()
    assert spans.seconds() == pytest.approx(3 * 0.005)


def test_spans_off_a_gpu_use_the_host_clock():
    spans = timing.Spans(CPU)
    spans.start()
    time.sleep(0.02)
    spans.stop()
    assert 0.015 < spans.seconds() < 1


def test_the_bubbles_compute_is_timed_on_the_gpu_not_by_the_host(cuda_events):
    """compute-only's forward and backward, on a GPU: its span comes from CUDA events (5 ms per
    step here), however long the host took to launch the kernels."""
    shards = [((4, 16), torch.float32)]
    co = mesh_model.build_compute_only(SMALL, Layout(tp=1, pp=1, dp=1), 0, shards, CPU,
                                       torch.float32)
    co.forward_backward = timing.Spans(GPU)
    co.forward_backward.reset(expect=4)
    for _ in range(2):
        co.step()
    assert co.forward_backward.seconds() == pytest.approx(0.010)


# ---- a rank that failed, seen by every rank's failure watch -----------------------------------

FAILURE = {"rank": 0, "error": "RuntimeError: CUDA out of memory", "step": "build"}


@pytest.fixture
def fast_poll(monkeypatch):
    monkeypatch.setattr(runtime, "FAILURE_POLL_S", 0.05)


def _wait_for(seen: list, seconds: float) -> None:
    start = time.monotonic()
    while not seen and time.monotonic() - start < seconds:
        time.sleep(0.02)


@pytest.mark.clock
def test_a_failure_while_a_rank_waits_ends_the_run_after_the_grace(fast_poll):
    seen: list = []
    start = time.monotonic()
    runtime.FailureWatch(lambda: FAILURE, lambda: False, 0.3, seen.append)
    _wait_for(seen, 5)
    assert seen == [FAILURE]
    assert 0.3 <= time.monotonic() - start < 2


@pytest.mark.clock
def test_a_failure_every_rank_reached_the_end_of_ends_nothing(fast_poll):
    """Every rank came to the part's end (they all failed alike, or the failed rank's peers were
    not waiting on it): the part is skipped, the run goes on."""
    seen: list = []
    runtime.FailureWatch(lambda: FAILURE, lambda: True, 0.1, seen.append)
    time.sleep(0.4)  # four graces
    assert seen == []


@pytest.mark.clock
def test_a_watch_stopped_within_the_grace_never_fires(fast_poll):
    seen: list = []
    watch = runtime.FailureWatch(lambda: FAILURE, lambda: False, 0.3, seen.append)
    time.sleep(0.1)
    watch.stop()
    time.sleep(0.5)  # the grace ran out 0.3 s ago
    assert seen == []


@pytest.mark.clock
def test_no_failure_posted_ends_nothing_and_a_silent_store_is_asked_again(fast_poll):
    seen: list = []
    answers = iter([RuntimeError("store timeout"), None, None])

    def failure():
        answer = next(answers, FAILURE)
        if isinstance(answer, Exception):
            raise answer
        return answer

    runtime.FailureWatch(failure, lambda: False, 0.1, seen.append)
    _wait_for(seen, 5)
    assert seen == [FAILURE]  # the watch outlived the store's silence and saw the post


# ---- DDP, the inputs and the optimizer, as trainers hold them ----------------------------------

def test_the_steps_ddp_keeps_one_copy_of_the_gradients(monkeypatch):
    """Without gradient_as_bucket_view, DDP holds every gradient twice (the parameters' and its
    buckets'), which the planner's memory does not count."""
    made: list[dict] = []

    class RecordingDDP(torch.nn.Module):
        def __init__(self, module, **kwargs):
            super().__init__()
            made.append(kwargs)

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", RecordingDDP)
    group = object()
    mesh = {"dp": SimpleNamespace(get_group=lambda: group)}
    stage = mesh_model.make_stage(SMALL, range(2), CPU, torch.float32)
    data_parallel.wrap_stage(stage, Layout(tp=1, pp=1, dp=2), mesh, CPU, None)
    assert made == [{"device_ids": None, "bucket_cap_mb": None, "process_group": group,
                     "gradient_as_bucket_view": True}]


@pytest.mark.parametrize("pp, pp_rank, want", [(1, 0, (True, True)), (2, 0, (True, False)),
                                               (2, 1, (False, True)), (3, 1, (False, False))])
def test_each_rank_holds_its_replicas_share_where_it_is_used(pp, pp_rank, want):
    """dp 2 over a batch of 8: replica 1 holds samples 4 to 7, the first stage the inputs, the
    last the targets, a middle stage neither (the whole batch sat on every rank)."""
    model = ModelSpec(name="m", layers=6, hidden_size=16, ffn_size=32, heads=2, seq_len=4,
                      batch=8)
    layout = Layout(tp=1, pp=pp, dp=2, micro_batches=max(pp, 1) * 2 if pp > 1 else 1)
    x, target = mesh_model.replica_inputs(model, layout, pp_rank, 1, CPU, torch.float32)
    assert (x is not None, target is not None) == want
    whole_x = mesh_model.samples(model, 0, 8, CPU, torch.float32)
    whole_t = mesh_model.samples(model, 0, 8, CPU, torch.float32, targets=True)
    if x is not None:
        assert x.shape == (4, 4, 16) and torch.equal(x, whole_x[4:])
    if target is not None:
        assert torch.equal(target, whole_t[4:])
    assert not torch.equal(whole_x, whole_t)


@pytest.mark.parametrize("dtype, kind", [(torch.float32, torch.optim.AdamW),
                                         (torch.bfloat16, MasterAdamW)])
def test_plans_optimizer_point_times_the_steps_adamw(monkeypatch, dtype, kind):
    """The step runs AdamW fused on a GPU and on fp32 masters in half precision: plan's
    calibration times that one, not a plain foreach AdamW."""
    made: list = []
    real = measurements.adamw

    def recording(params, device, dt, *args, **kwargs):
        made.append((device, dt))
        opt = real(params, device, dt, *args, **kwargs)
        made.append(opt)
        return opt

    monkeypatch.setattr(measurements, "adamw", recording)
    monkeypatch.setattr(measurements, "_time_us", lambda s, fn, **kw: (fn(), 100.0)[1])
    s = _session(CPU)
    measurements.measure_optimizer(s, SMALL, dtype)
    assert made[0] == (CPU, dtype) and type(made[1]) is kind
