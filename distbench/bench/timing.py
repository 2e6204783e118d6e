"""Timed loops and their cross-rank statistics (the timing contract in docs/methodology.md).

Per rank: `iters` back-to-back ops with a timestamp after each (CUDA events on the stream with
one sync at the end on GPU, perf_counter on CPU), or with --cuda-graph the ops captured in one
CUDA graph and replayed. Across ranks: three small tensor collectives per measurement whatever
the world size (SUM, MAX, MIN), never Python-object gathers.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distbench.core.noise import rep_lengths
from distbench.run.runtime import LOOP, Progress

MIN_ITERS = 5
MAX_ITERS = 10_000
# The host took this share of the GPU's time or more to launch the loop: the GPU waited for the
# host, and the time is the launch rate, not the op's (see --cuda-graph).
LAUNCH_BOUND_SHARE = 0.9
# Launches the share is taken over, from a loop's start. Past about a thousand queued launches
# (an op and its event are two) the launch queue is full and the host advances at the GPU's
# pace, whatever a launch costs it: over a long loop the share reads ~1 for any op.
SHARE_LAUNCHES = 128
# Of the process group's timeout, what one stretch of queued work may take (see sync_every).
QUEUE_SHARE = 0.5
# Ops captured in one CUDA graph; a loop of more replays it as often as it needs (--iters goes
# to 10 million, and a graph holds every op it captured).
GRAPH_OPS = 1000


@dataclass(frozen=True)
class Timed:
    """One rank's timed loop."""

    samples: list[float]  # seconds per iteration, the repetitions one after another
    # GPU: the host's time to launch the first SHARE_LAUNCHES iterations / the GPU's time for
    # them; None on CPU, and when the host waited for the GPU among those launches
    host_share: float | None = None
    rep_lengths: tuple[int, ...] = ()  # iterations in each repetition; () for one loop


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def events(n: int, device: torch.device) -> list:
    """n timing events, each created and recorded once, then waited for: a CUDA event's
    creation (and its first record) costs host time, which must not land inside a timed loop
    where the host sets the pace (small messages)."""
    made = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for event in made:
        event.record()
    torch.cuda.synchronize(device)
    return made


class Spans:
    """Time summed over spans of a loop's iterations (start() and stop() around a part of each,
    or calls of a function wrap() made), on the clock of the device that runs the part: CUDA
    events on a GPU, where the host only queues the kernels and its clock would time their
    launch; perf_counter elsewhere. A span may run inside another: each is timed whole. The
    events are made before the loop (`expect` spans), so none is created inside it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self, expect: int = 0) -> None:
        self._host = 0.0
        self._open: list = []  # the spans begun and not ended, innermost last
        self._done: list[tuple] = []  # (start, end) events of the spans ended, on a GPU
        self._made = events(2 * expect, self.device) if self.cuda and expect else []

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def start(self) -> None:
        if self.cuda:
            event = self._made.pop() if self._made else torch.cuda.Event(enable_timing=True)
            event.record()
            self._open.append(event)
        else:
            self._open.append(time.perf_counter())

    def stop(self) -> None:
        begun = self._open.pop()
        if self.cuda:
            end = self._made.pop() if self._made else torch.cuda.Event(enable_timing=True)
            end.record()
            self._done.append((begun, end))
        else:
            self._host += time.perf_counter() - begun

    def wrap(self, fn: Callable) -> Callable:
        """fn, each call a span."""
        def timed(*args, **kwargs):
            self.start()
            try:
                return fn(*args, **kwargs)
            finally:
                self.stop()
        return timed

    def seconds(self) -> float:
        """The spans' total so far (on a GPU, once the device has run them)."""
        if not self.cuda:
            return self._host
        sync(self.device)
        return sum(a.elapsed_time(b) for a, b in self._done) / 1e3


@contextmanager
def _no_gc():
    """A collection mid-loop is a pause of the host's, not of the op's."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def sync_every(per_op_s: float, timeout_s: float) -> int | None:
    """How many ops the host may queue ahead of the GPU before it waits for them. NCCL's watchdog
    counts a collective's time from its enqueue, so a whole loop queued at once that takes longer
    than the process group's timeout would be killed while healthy (10000 iterations at 8 GiB).
    None: the whole loop can be queued."""
    if per_op_s <= 0:
        return None
    return max(1, int(QUEUE_SHARE * timeout_s / per_op_s))


def timed_loop(fn: Callable[[], object], iters: int, device: torch.device) -> list[float]:
    """Seconds taken by each of `iters` back-to-back calls."""
    return _loop(fn, iters, device).samples


def _launch(fn: Callable[[], object], marks: list, first: int, last: int,
            every: int | None, progress: Progress | None = None) -> None:
    for i in range(first, last + 1):
        fn()
        marks[i].record()
        if every and i % every == 0:
            marks[i].synchronize()
            if progress is not None:  # the host waited for the GPU: the loop got this far
                progress.synced = i


def _share(launched: float, gpu: float, waited: bool) -> float | None:
    return None if waited or gpu <= 0 else launched / gpu


def _loop(fn: Callable[[], object], iters: int, device: torch.device, made: list | None = None,
          every: int | None = None, progress: Progress | None = None) -> Timed:
    with _no_gc():
        if device.type == "cuda":
            marks = made or events(iters + 1, device)
            head = min(iters, SHARE_LAUNCHES)
            start = time.perf_counter()
            marks[0].record()
            # two calls, so no clock read inside the loop
            _launch(fn, marks, 1, head, every, progress)
            launched = time.perf_counter() - start
            _launch(fn, marks, head + 1, iters, every, progress)
            marks[-1].synchronize()
            samples = [marks[i - 1].elapsed_time(marks[i]) / 1e3 for i in range(1, iters + 1)]
            # a wait among the first launches would be in the host's time
            return Timed(samples, _share(launched, sum(samples[:head]),
                                         bool(every and every <= head)))
        clock = time.perf_counter
        stamps = [0.0] * (iters + 1)
        if progress is not None:
            progress.stamps = stamps
        stamps[0] = clock()
        for i in range(1, iters + 1):
            fn()
            stamps[i] = clock()
    return Timed([stamps[i] - stamps[i - 1] for i in range(1, iters + 1)])


@dataclass(frozen=True)
class InCall:
    """One rank's back-to-back loop, timed whole and inside each call (watch's probes)."""

    loop_s: float  # from the first op's start to the last op's end: the rate, as _loop times it
    calls_s: list[float]  # each op's time inside the call: a rank the others waited for
    # spends the least there (watch.records.ProbeResult)


def in_call_loop(fn: Callable[[], object], iters: int, device: torch.device,
                 before: Callable[[], object] | None = None, made: list | None = None
                 ) -> InCall:
    """`iters` back-to-back calls of fn with a stamp before and after each (CUDA events on the
    stream, made beforehand (2 * iters, `made`), and one sync at the end; perf_counter on CPU).
    `before`: a test's planted delay, outside the stamps. Nothing else sits between the
    stamps and the op."""
    with _no_gc():
        if device.type == "cuda":
            marks = made or events(2 * iters, device)
            for i in range(iters):
                if before is not None:
                    before()
                marks[2 * i].record()
                fn()
                marks[2 * i + 1].record()
            marks[2 * iters - 1].synchronize()
            calls = [marks[2 * i].elapsed_time(marks[2 * i + 1]) / 1e3 for i in range(iters)]
            return InCall(marks[0].elapsed_time(marks[2 * iters - 1]) / 1e3, calls)
        clock = time.perf_counter
        stamps = [0.0] * (2 * iters)
        for i in range(iters):
            if before is not None:
                before()
            stamps[2 * i] = clock()
            fn()
            stamps[2 * i + 1] = clock()
    return InCall(stamps[-1] - stamps[0],
                  [stamps[2 * i + 1] - stamps[2 * i] for i in range(iters)])


@dataclass(frozen=True)
class Captured:
    replay: Callable[[], None]
    ops: int  # calls of the op in one replay


def capture(fn: Callable[[], object], iters: int, device: torch.device) -> Captured:
    """Calls of fn (up to GRAPH_OPS) captured in one CUDA graph, as nccl-tests -G does:
    replaying it launches them all at once, so the host's launch cost leaves the time. Raises
    RuntimeError (or AttributeError) where torch or the backend cannot capture."""
    ops = min(iters, GRAPH_OPS)
    graph = torch.cuda.CUDAGraph()
    ours = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(ours)
    with torch.cuda.stream(side):
        fn()  # torch asks for a run on a side stream before capture
    ours.wait_stream(side)
    torch.cuda.synchronize(device)
    try:
        with torch.cuda.graph(graph):
            for _ in range(ops):
                fn()
    except BaseException:
        # A capture that failed ends in capture_end raising, before torch.cuda.graph restores
        # the stream: every later op would run on torch's private capture stream.
        torch.cuda.set_stream(ours)
        raise
    return Captured(graph.replay, ops)


def _replays(graph: Captured, iters: int, device: torch.device) -> Timed:
    """The graph replayed until `iters` ops have run (whole replays: the row's iters says how
    many ran), each replay between two events. A graph has no stamp between its ops, so each
    op gets its replay's mean."""
    replays = math.ceil(iters / graph.ops)
    marks = events(replays + 1, device)
    head = min(replays, SHARE_LAUNCHES)
    with _no_gc():
        start = time.perf_counter()
        marks[0].record()
        _launch(graph.replay, marks, 1, head, None)
        launched = time.perf_counter() - start
        _launch(graph.replay, marks, head + 1, replays, None)
        marks[-1].synchronize()
    per_replay = [marks[i - 1].elapsed_time(marks[i]) / 1e3 for i in range(1, replays + 1)]
    return Timed([t / graph.ops for t in per_replay for _ in range(graph.ops)],
                 _share(launched, sum(per_replay[:head]), False))


def calibrated_iters(per_op_seconds: float, min_time: float) -> int:
    """Iterations to fill min_time (pyperf's approach), within [MIN_ITERS, MAX_ITERS]."""
    if per_op_seconds <= 0:
        return MAX_ITERS
    return max(MIN_ITERS, min(MAX_ITERS, math.ceil(min_time / per_op_seconds)))


@dataclass(frozen=True)
class Warmup:
    """What the warmup says, the same on every rank (of the group): the slowest rank's figures."""

    iters: int  # the timed loop's count: --iters, or calibrated on `fastest`
    # The fastest op, for the count: noise (connection setup, a scheduler hiccup, a burst of
    # load from a neighbour) only ever makes an op slower, so a burst during the warmup can
    # lengthen the timed loop past --min-time but never cut it short. A median was seen 4.6x the
    # timed loop's mean on a shared 2-core machine, giving a fifth of --min-time.
    fastest: float
    # The median op, for what bounds the loop's time (sync_every, the watchdog's budget, the
    # wait of a rank that sits the loop out): the loop's ops are slower than the fastest, and a
    # bound taken from it would let queued work outlast NCCL's watchdog.
    typical: float


def warm_up(fn: Callable[[], object], warmup: int, iters: int | None, min_time: float,
            device: torch.device, group=None) -> Warmup:
    """Untimed ops (at least one), then one small collective: a rank that sits the pattern out
    (its op does nothing) learns from it how long the others' loop will take."""
    sync(device)
    dist.barrier(group=group)
    times = timed_loop(fn, max(1, warmup), device)
    est = torch.tensor([min(times), statistics.median(times)], dtype=torch.float64,
                       device=device)
    dist.all_reduce(est, op=dist.ReduceOp.MAX, group=group)
    fastest, typical = est.tolist()
    return Warmup(iters if iters is not None else calibrated_iters(fastest, min_time), fastest,
                  typical)


def warmup_and_calibrate(fn: Callable[[], object], warmup: int, iters: int | None,
                         min_time: float, device: torch.device, group=None
                         ) -> tuple[int, float]:
    """warm_up's count and fastest op (benchmarks/overhead.py calibrates its loops on it)."""
    w = warm_up(fn, warmup, iters, min_time, device, group)
    return w.iters, w.fastest


def measure(fn: Callable[[], object], iters: int, device: torch.device,
            every: int | None = None, graph: Captured | None = None, group=None,
            reps: int = 1, settle: Callable[[], object] | None = None,
            progress: Progress | None = LOOP) -> Timed:
    """Events made, then for each of `reps` repetitions a barrier and a timed loop: the least
    possible loop, with a stamp per iteration (a sync every `every` ops on GPU); or, given a
    captured graph, its replays (the first, which uploads the graph, untimed). The barrier lines
    the ranks up again, so a stall in one repetition does not carry into the next. `settle`
    runs after each repetition, before the collective that follows it (a wait on the host).
    `progress` is told of each repetition's barrier and loop (not of a graph's replays)."""
    lengths = rep_lengths(iters, reps)
    if graph is not None:
        progress = None
        graph.replay()
        sync(device)
    made = events(max(lengths) + 1, device) if device.type == "cuda" and graph is None else None
    samples: list[float] = []
    shares, ran = [], []
    for length in lengths:
        if progress is not None:
            progress.begin()
        try:
            dist.barrier(group=group)
            if graph is not None:
                one = _replays(graph, length, device)
            else:
                one = _loop(fn, length, device, made[:length + 1] if made else None, every,
                            progress)
        finally:
            if progress is not None:
                progress.end()
        if settle is not None:
            settle()
        samples += one.samples
        ran.append(len(one.samples))
        if one.host_share is not None:
            shares.append(one.host_share)
    share = sum(shares) / len(shares) if shares else None
    return Timed(samples, share, tuple(ran) if len(ran) > 1 else ())


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
    launch_bound: bool | None = None  # GPU: some rank's host could not keep ahead; else None
    per_iter_us: tuple[float, ...] = ()  # the slowest rank's time of each iteration
    # the median of per_iter_us over each repetition; one value when the loop was not repeated
    reps_us: tuple[float, ...] = ()


def summarize(samples: list[float], wrong: int, device: torch.device,
              active: bool = True, host_share: float | None = None, group=None,
              rep_lengths: tuple[int, ...] = ()) -> Stats:
    """Cross-rank statistics. A rank with no part in the pattern (say the odd rank out of a
    ping-pong) passes active=False with the same number of samples: it adds nothing.
    host_share: Timed.host_share, whose largest over ranks says whether the loop was
    launch-bound. Over the ranks of `group` (None: every rank). rep_lengths: Timed.rep_lengths,
    the same on every rank."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    mean = sum(samples) / len(samples)
    f64 = dict(dtype=torch.float64, device=device)
    sums = torch.tensor([mean if active else 0.0, float(wrong), float(active)], **f64)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    share = host_share if active and host_share is not None else -math.inf
    if active:
        maxes = torch.tensor([mean, -mean, share, *samples], **f64)
    else:
        maxes = torch.full((len(samples) + 3,), -math.inf, **f64)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=group)
    rank_max = float(maxes[0].item())
    slowest = torch.tensor([rank if active and mean >= rank_max else n], dtype=torch.int64,
                           device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MIN, group=group)
    return summarize_local(
        mean_sum=float(sums[0].item()), wrong=int(sums[1].item()), n=int(sums[2].item()),
        rank_max=rank_max, rank_min=-float(maxes[1].item()), slowest=int(slowest.item()),
        per_iter=maxes[3:].cpu(), host_share=float(maxes[2].item()), rep_lengths=rep_lengths)


def summarize_local(*, mean_sum: float, wrong: int, n: int, rank_max: float, rank_min: float,
                    slowest: int, per_iter: torch.Tensor, host_share: float = -math.inf,
                    rep_lengths: tuple[int, ...] = ()) -> Stats:
    """The arithmetic half of summarize, separate so it can be tested without a process group.
    n is the number of ranks that took part; host_share the largest over them (-inf: none
    measured one, as on CPU)."""
    per_iter = per_iter.double()
    p50, p99 = torch.quantile(per_iter, torch.tensor([0.5, 0.99], dtype=torch.float64)).tolist()
    avg = float(per_iter.mean())
    cv = float(per_iter.std(unbiased=False)) / avg * 100 if avg > 0 else 0.0
    launch_bound = None if host_share == -math.inf else host_share >= LAUNCH_BOUND_SHARE
    lengths = rep_lengths or (len(per_iter),)
    if sum(lengths) != len(per_iter):
        raise ValueError(f"repetitions of {lengths} iterations, but {len(per_iter)} samples")
    reps = [float(torch.quantile(part, 0.5)) * 1e6 for part in per_iter.split(list(lengths))]
    return Stats(iters=len(per_iter), time_us=mean_sum / n * 1e6, rank_min_us=rank_min * 1e6,
                 rank_max_us=rank_max * 1e6, slowest_rank=slowest, p50_us=p50 * 1e6,
                 p99_us=p99 * 1e6, cv_pct=cv, wrong=wrong, launch_bound=launch_bound,
                 per_iter_us=tuple((per_iter * 1e6).tolist()), reps_us=tuple(reps))
