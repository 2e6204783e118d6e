"""On a real GPU, what the rest of the suite checks against a faked torch.cuda and pynvml: CUDA
events time the GPU's work (not the host's launch), the fit check reads the driver's memory, a
too-large buffer becomes a skip (not an out-of-memory error inside NCCL), NVML's inventory
matches torch's device, and the dispatcher counter hears NCCL's collectives, DDP's reductions
(posted on autograd's CUDA threads) among them. Every test skips where no GPU is visible
(benchmarks/gpu_first_contact.sh runs them where one is)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from helpers import free_port

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")

GIB = 1 << 30


@pytest.fixture(scope="module")
def gpu():
    return torch.device("cuda", 0)


@pytest.fixture(scope="module")
def nccl_group(gpu):
    """A one-rank NCCL process group in the test process."""
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, device_id=gpu)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _spin(gpu, ms: float) -> None:
    """About `ms` of GPU time that costs the host one launch."""
    rate_khz = torch.cuda.get_device_properties(gpu).clock_rate  # kHz: cycles per ms
    torch.cuda._sleep(int(rate_khz * ms))


def test_spans_time_the_gpus_work_not_the_hosts_launch(gpu):
    from distbench.bench.timing import Spans

    torch.cuda.synchronize(gpu)
    spans = Spans(gpu)
    spans.reset(expect=1)
    host0 = time.perf_counter()
    spans.start()
    _spin(gpu, 50)
    spans.stop()
    launched = time.perf_counter() - host0
    measured = spans.seconds()
    assert 0.025 < measured < 0.5, measured  # the clock rate is the boost clock: ~50 ms or less
    assert launched < 0.2 * measured, (launched, measured)  # the host did not wait for it


def test_timed_loop_gives_gpu_time_per_op(gpu):
    from distbench.bench.timing import _loop

    src = torch.empty(64 << 20, dtype=torch.uint8, device=gpu)
    dst = torch.empty_like(src)
    timed = _loop(lambda: dst.copy_(src), 50, gpu)
    per_op = sorted(timed.samples)[len(timed.samples) // 2]
    moved = 2 * src.numel()  # read and written
    gbps = moved / per_op / 1e9
    # HBM: ~3 TB/s on an H100 SXM, ~2 on a PCIe H100 or an A100; a host clock timing the launch
    # alone would read tens of TB/s, a wrong unit 1000x off
    assert 300 < gbps < 6000, gbps
    assert timed.host_share is not None and timed.host_share < 0.9, timed.host_share


def test_available_bytes_follows_the_driver(gpu):
    from distbench.run.buffers import available_bytes, release

    release(gpu)
    before = available_bytes(gpu)
    block = torch.empty(GIB, dtype=torch.uint8, device=gpu)
    during = available_bytes(gpu)
    assert abs((before - during) - GIB) < 64 << 20, (before, during)
    del block
    # freed but held by torch's caching allocator: still available to the next allocation
    assert abs(available_bytes(gpu) - before) < 64 << 20
    release(gpu)


def test_a_buffer_larger_than_the_device_is_skipped_not_fatal(gpu, nccl_group):
    from distbench.run.buffers import allocate_fitting, release

    total = torch.cuda.get_device_properties(gpu).total_memory
    counts = [2 * total, total // 2, GIB]
    buf, fitted = allocate_fitting(lambda n: torch.empty(n, dtype=torch.uint8, device=gpu),
                                   counts, gpu, headroom="512M")
    assert fitted == total // 2, (fitted, total)
    assert buf.numel() == fitted
    del buf
    release(gpu)
    # and NCCL still works after the refused allocation
    x = torch.ones(1024, device=gpu)
    dist.all_reduce(x)
    assert x.sum().item() == 1024


def test_nvml_inventory_is_torchs_device(gpu):
    from distbench.platform.topo_probe import node_snapshot

    props = torch.cuda.get_device_properties(gpu)
    snap = node_snapshot()
    gpus = [g for g in snap["gpus"] if "error" not in g]
    assert gpus, snap.get("nvml_error") or snap["gpus"]
    uuids = {str(g.get("uuid", "")).removeprefix("GPU-") for g in gpus}
    assert str(props.uuid) in uuids, (props.uuid, uuids)
    mine = next(g for g in gpus if str(g.get("uuid", "")).removeprefix("GPU-") == str(props.uuid))
    assert abs(mine["memory_total_bytes"] - props.total_memory) < 0.05 * props.total_memory
    # NVLink fields may be unsupported on a lone or passed-through card; the rest must read
    failed = {k: v for k, v in (mine.get("errors") or {}).items() if not k.startswith("nvlink")}
    assert not failed, failed
    assert mine["pcie_gen_max"] and mine["pcie_gen_max"] >= 3


def test_the_counter_hears_nccl_and_ddps_reductions(gpu, nccl_group):
    from distbench.steps.comms import CommCounter, op_counts

    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(256, 256, device=gpu), device_ids=[gpu.index])
    x = torch.randn(8, 256, device=gpu)
    with CommCounter() as counter:
        t = torch.ones(4096, device=gpu)
        dist.all_reduce(t)
        model(x).sum().backward()
        torch.cuda.synchronize(gpu)
    counts = op_counts(counter.calls)
    # one all_reduce of ours and at least one bucket of DDP's
    assert counts.get("all_reduce", 0) >= 2, counts
