"""Timed loops and their cross-rank statistics (the timing contract in docs/methodology.md).

Per rank: `iters` back-to-back ops with a timestamp after each (CUDA events on the stream with
one sync at the end on GPU, perf_counter on CPU). Across ranks: three small tensor collectives
per measurement whatever the world size (SUM, MAX, MIN), never Python-object gathers.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

MIN_ITERS = 5
MAX_ITERS = 10_000


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(fn: Callable[[], object], iters: int, device: torch.device) -> list[float]:
    """Seconds taken by each of `iters` back-to-back calls."""
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for i in range(1, iters + 1):
            fn()
            events[i].record()
        events[-1].synchronize()
        return [events[i - 1].elapsed_time(events[i]) / 1e3 for i in range(1, iters + 1)]
    clock = time.perf_counter
    stamps = [0.0] * (iters + 1)
    stamps[0] = clock()
    for i in range(1, iters + 1):
        fn()
        stamps[i] = clock()
    return [stamps[i] - stamps[i - 1] for i in range(1, iters + 1)]


def calibrated_iters(per_op_seconds: float, min_time: float) -> int:
    """Iterations to fill min_time (pyperf's approach), within [MIN_ITERS, MAX_ITERS]."""
    if per_op_seconds <= 0:
        return MAX_ITERS
    return max(MIN_ITERS, min(MAX_ITERS, math.ceil(min_time / per_op_seconds)))


def warmup_and_calibrate(fn: Callable[[], object], warmup: int, iters: int | None,
                         min_time: float, device: torch.device) -> tuple[int, float]:
    """Untimed ops (at least one), then the iteration count every rank will use and the
    per-op time the warmup suggests."""
    sync(device)
    dist.barrier()
    times = timed_loop(fn, max(1, warmup), device)
    if iters is not None:
        return iters, statistics.median(times)
    # The fastest warmup op: noise (connection setup, a scheduler hiccup, a burst of load from
    # a neighbour) only ever makes an op slower, so a burst during the warmup can lengthen the
    # timed loop past --min-time but never cut it short. A median was seen 4.6x the timed
    # loop's mean on a shared 2-core machine, giving a fifth of --min-time.
    per_op = min(times)
    # the slowest rank's estimate, so every rank runs the same count
    est = torch.tensor([per_op], dtype=torch.float64, device=device)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    per_op = float(est.item())
    return calibrated_iters(per_op, min_time), per_op


def measure(fn: Callable[[], object], iters: int, device: torch.device) -> list[float]:
    """barrier, then the timed loop: the least possible loop, with a stamp per iteration."""
    dist.barrier()
    return timed_loop(fn, iters, device)


@dataclass(frozen=True)
class Stats:
    iters: int
    time_us: float  # each rank's mean per op, averaged over ranks
    rank_min_us: float
    rank_max_us: float
    slowest_rank: int
    p50_us: float  # percentiles of the per-iteration slowest-rank time
    p99_us: float
    cv_pct: float
    wrong: int


def summarize(samples: list[float], wrong: int, device: torch.device,
              active: bool = True) -> Stats:
    """Cross-rank statistics. A rank with no part in the pattern (say the odd rank out of a
    ping-pong) passes active=False with the same number of samples: it adds nothing."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mean = sum(samples) / len(samples)
    f64 = dict(dtype=torch.float64, device=device)
    sums = torch.tensor([mean if active else 0.0, float(wrong), float(active)], **f64)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    if active:
        maxes = torch.tensor([mean, -mean, *samples], **f64)
    else:
        maxes = torch.full((len(samples) + 2,), -math.inf, **f64)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    rank_max = float(maxes[0].item())
    slowest = torch.tensor([rank if active and mean >= rank_max else n], dtype=torch.int64,
                           device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MIN)
    return summarize_local(
        mean_sum=float(sums[0].item()), wrong=int(sums[1].item()), n=int(sums[2].item()),
        rank_max=rank_max, rank_min=-float(maxes[1].item()), slowest=int(slowest.item()),
        per_iter=maxes[2:].cpu())


def summarize_local(*, mean_sum: float, wrong: int, n: int, rank_max: float, rank_min: float,
                    slowest: int, per_iter: torch.Tensor) -> Stats:
    """The arithmetic half of summarize, separate so it can be tested without a process group.
    n is the number of ranks that took part."""
    per_iter = per_iter.double()
    p50, p99 = torch.quantile(per_iter, torch.tensor([0.5, 0.99], dtype=torch.float64)).tolist()
    avg = float(per_iter.mean())
    cv = float(per_iter.std(unbiased=False)) / avg * 100 if avg > 0 else 0.0
    return Stats(iters=len(per_iter), time_us=mean_sum / n * 1e6, rank_min_us=rank_min * 1e6,
                 rank_max_us=rank_max * 1e6, slowest_rank=slowest, p50_us=p50 * 1e6,
                 p99_us=p99 * 1e6, cv_pct=cv, wrong=wrong)
