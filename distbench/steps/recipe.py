"""The one way the training-step commands (tp, dp, step, and plan's steps) measure a step, so
that what one of them learns the others keep:

1. `fits_here` (step's layouts): what the part will hold against what the device has left,
   agreed by every rank before anything is built (on a GPU a part that does not fit is a
   skipped row, not a rank out of memory while its peers wait on it);
2. `agreed`: the build and the first steps, which torch may refuse on some ranks only (out of
   memory, a combination it does not support), run guarded. The rank that fails says why at once,
   on stderr and to its peers through the launcher's store; every rank then agrees, through the
   store too (a collective now could pair with a peer's unfinished one on NCCL), on the first
   failure's reason, and the row is skipped on every rank alike. A peer left waiting on the
   failed rank (a pipeline stage in a receive) never reaches that agreement: every rank's
   failure watch sees the failure posted and ends the run FAILURE_GRACE_S later, naming the
   failed rank and why, instead of after --timeout;
3. `counted`: one step under the dispatcher's collective counter (off a GPU, the same step
   also counts the memory its tensors hold: `counted_with_peak`);
4. `timed`: warmup, barrier, timed loop and cross-rank statistics, as every command times, and
   on a GPU the peak memory of the timed steps;
5. `free` between the parts: what one part made goes before the next is built.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.measure import Settings, timed_samples
from distbench.core.errors import one_line
from distbench.core.sizes import format_size
from distbench.run.buffers import available_bytes, release
from distbench.run.session import Session
from distbench.steps.comms import CommCall, CommCounter

T = TypeVar("T")

# Longest text the agreed reasons carry; longer ones are cut.
TEXT_BYTES = 256
# What a GPU keeps beyond what a part is estimated to hold, when deciding whether it fits: the
# estimate leaves out the allocator's fragmentation, kernels' workspaces and what NCCL allocates
# for the part's new communicators.
FIT_MARGIN = 0.10
# torch's refusals: out of memory (torch.OutOfMemoryError is a RuntimeError), an unsupported
# combination (NotImplementedError), a shape a module refuses (ValueError)
REFUSALS = (RuntimeError, NotImplementedError, ValueError, MemoryError)


def attempt(s: Session, label: str, fn: Callable[[], T]) -> tuple[T | None, str]:
    """fn()'s value and "", or None and why torch refused (its first line). The failing rank
    prints it at once and posts it to its peers: they may be waiting in a collective or a
    receive it will never join. The session's fault (tests only) may fail it first."""
    try:
        s.faults.fail(label)
        return fn(), ""
    except dist.DistError:  # a peer lost, a communicator aborted: not a refusal to agree on
        raise
    except REFUSALS as e:
        reason = f"{type(e).__name__}: {one_line(e, 200, mark='')}"
        print(f"distbench: rank {s.rt.rank}: {label}: {reason}", file=sys.stderr, flush=True)
        s.failed_here(label, reason)
        return None, reason


def agreed(s: Session, label: str, fn: Callable[[], T]) -> tuple[T | None, str]:
    """attempt(), then the lowest failing rank's reason on every rank ("" when none failed);
    what fn made is freed on every rank when one failed. Peers' failures are watched for
    throughout (the module's text)."""
    with s.watching_failures():
        value, reason = attempt(s, label, fn)
        agreed_reason = s.end_part()
        reason = agree_reason(reason, s.rt.device) if agreed_reason is None else agreed_reason
    if reason:
        value = None
        free(s.rt.device)
    return value, reason


def fits_here(s: Session, need_bytes: float, what: str) -> str:
    """"" on every rank when every rank's device has room for `need_bytes` more (with
    FIT_MARGIN to spare); else, on every rank, why not, in the lowest short rank's figures.
    Host memory is the launcher's to bound, before any worker starts (platform.limits)."""
    reason = ""
    device = s.rt.device
    if device.type == "cuda":
        free(device)
        have = available_bytes(device)
        if need_bytes * (1 + FIT_MARGIN) > have:
            reason = (f"{what} needs about {format_size(int(need_bytes))} on each GPU, "
                      f"{format_size(int(have))} free on rank {s.rt.rank}'s")
    return agree_reason(reason, device)


def counted(s: Session, label: str, fn: Callable[[], T], part: str = "communication count"
            ) -> tuple[T, list[CommCall]]:
    """fn() once under the collective counter, and what it issued, in order."""
    s.phase(f"{label} ({part})", s.opts.timeout)
    with CommCounter() as counter:
        value = fn()
    timing.sync(s.rt.device)
    return value, counter.calls


def timed(s: Session, what: str, step: Callable[[], object]) -> timing.Stats:
    """warmup (fixed count), barrier, timed loop, cross-rank statistics: as every command."""
    samples = timed_samples(Settings.of(s), step, what).samples
    s.phase(f"{what} (statistics)", s.opts.timeout)
    return timing.summarize(samples, 0, s.rt.device)


def timed_with_peak(s: Session, what: str, step: Callable[[], object]
                    ) -> tuple[timing.Stats, int | None]:
    """timed(), and the most device memory any rank allocated in it (None off a GPU)."""
    device = s.rt.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    st = timed(s, what, step)
    if device.type != "cuda":
        return st, None
    return st, int(max_over_ranks([torch.cuda.max_memory_allocated(device)], device)[0])


def counted_with_peak(s: Session, label: str, fn: Callable[[], object], held: list,
                      ignore: list) -> tuple[list[CommCall], int | None]:
    """counted(), and off a GPU the most memory any rank's tensors held in that same step
    (steps.host_memory: one step under both, not a step each), with what the step starts
    holding (`held`: modules, optimizers, tensors; and what else Python holds, but `ignore`'s)
    counted from the start. None on a GPU, whose allocator counts it (timed_with_peak)."""
    device = s.rt.device
    if device.type == "cuda":
        return counted(s, label, fn)[1], None
    from distbench.steps.host_memory import peak_bytes

    peak, calls = counted(s, label, lambda: peak_bytes(fn, held, ignore),
                          "communication count and peak memory")
    return calls, int(max_over_ranks([peak], device)[0])


def free(device: torch.device) -> None:
    """FSDP's hooks hold its modules in reference cycles: collect them before the next part is
    built (timed loops run with the collector off), then hand the memory back."""
    gc.collect()
    release(device)


def max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def agree_reason(reason: str, device: torch.device) -> str:
    """"" on every rank when no rank has a reason to give up; else, on every rank, the reason of
    the lowest rank that has one (so rank 0, which writes the row, can quote it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first = torch.tensor([rank if reason else world], dtype=torch.int64, device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    src = int(first.item())
    return "" if src == world else broadcast_text(reason, src, device)


def broadcast_text(text: str, src: int, device: torch.device) -> str:
    """`text` from rank `src` on every rank, cut to TEXT_BYTES."""
    buf = torch.zeros(TEXT_BYTES, dtype=torch.uint8, device=device)
    if dist.get_rank() == src:
        data = text.encode()[:TEXT_BYTES]
        buf[:len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=src)
    return bytes(buf.cpu().tolist()).rstrip(b"\0").decode(errors="replace")
