"""What this machine can hold: the local workers distbench may start, checked before any
process, file or directory exists. A run sized past the machine would not fail by itself: it
would take the machine's memory, and the kernel's OOM killer would pick its victims across the
machine, other people's jobs among them. No torch here: the check answers within a second."""

from __future__ import annotations

import os
from pathlib import Path

from distbench.core.options import OptionError
from distbench.core.sizes import format_size

# A worker's peak resident memory before its buffers: Python, torch and a gloo process group,
# and for tp, pp, dp, step and plan torch's autograd, optimizers, DTensor, FSDP and pipelining.
# Measured by benchmarks/worker_footprint.py on torch 2.13 CPU at 4 workers: 250 MiB
# (collective), 385 MiB (step), 415 to 475 MiB (plan --validate 6: rank 0 also draws the plan
# with matplotlib); the launcher holds about 235 MiB, and counts as one more worker.
WORKER_BYTES = 512 * 2**20
# Workers per core: oversubscribed ranks share cores and time slower (tests run 4 workers on
# 2 cores), but a run of hundreds of ranks per core measures nothing but the scheduler.
WORKERS_PER_CORE = 4
# Of the memory the kernel says is available, what a run may plan to use: the rest is for
# the launcher, the page cache and everyone else on the machine.
MEMORY_SHARE = 0.8


def nvidia_devices(dev: Path = Path("/dev")) -> bool:
    """Whether this machine shows a GPU's device node (NVIDIA's, or WSL2's /dev/dxg, through
    which CUDA runs there): without one CUDA cannot run, and `--backend auto` is gloo, known
    without loading torch."""
    return bool(list(dev.glob("nvidia[0-9]*"))) or (dev / "dxg").exists()


def cores() -> int:
    """Cores this process may run on (a cgroup or taskset may give fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")  # where cgroup v2 is mounted
SELF_CGROUP = Path("/proc/self/cgroup")  # this process's cgroup, under that root


def available_memory(meminfo: Path = MEMINFO, cgroup_root: Path = CGROUP_ROOT,
                     self_cgroup: Path = SELF_CGROUP) -> int | None:
    """Bytes a new process can still use: the kernel's MemAvailable, or what this cgroup's
    limit leaves, whichever is less (a container's limit is far below what the host has
    available, and the kernel kills past it); None when neither can be read. The paths stand
    in for the machine's (tests)."""
    found = [v for v in (_meminfo_available(meminfo), _cgroup_left(cgroup_root, self_cgroup))
             if v is not None]
    return min(found) if found else None


def _meminfo_available(meminfo: Path = MEMINFO) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_left(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int | None:
    """cgroup v2's memory.max less memory.current, for the cgroup this process is in."""
    try:
        rel = next(line.split("::", 1)[1] for line in
                   self_cgroup.read_text().splitlines() if line.startswith("0::"))
        where = root / rel.strip().lstrip("/")
        limit = (where / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((where / "memory.current").read_text()))
    except (OSError, ValueError, StopIteration):
        return None


def rank_budget(workers: int, memory: int | None = -1) -> int | None:
    """The most host memory each of `workers` local workers may hold beyond WORKER_BYTES, as
    check_workers allows it; None when the machine's memory cannot be read. `memory` stands in
    for the machine's (tests); -1: read it."""
    memory = available_memory() if memory == -1 else memory
    return None if memory is None else max(0, _room(workers, memory))


def _room(workers: int, memory: int) -> int:
    """What each of `workers` workers may hold beyond WORKER_BYTES when they and their launcher
    (one more WORKER_BYTES) share MEMORY_SHARE of `memory`; below 0 when not even that fits."""
    return (int(memory * MEMORY_SHARE) - WORKER_BYTES) // max(1, workers) - WORKER_BYTES


def check_workers(workers: int, per_rank: int = 0, sized_by: tuple[str, str] = ("", ""), *,
                  memory: int | None = -1, ncores: int | None = None) -> None:
    """Refuse `workers` local workers, each holding WORKER_BYTES plus `per_rank` bytes of its
    own, past this machine's cores or memory. Raises OptionError with the numbers, naming
    `sized_by` (the flags that set per_rank, and a valid example) when even one worker's
    share is too much. `memory` and `ncores` stand in for the machine's (tests); -1: read it."""
    ncores = cores() if ncores is None else ncores
    most = WORKERS_PER_CORE * ncores
    if workers > most:
        raise OptionError("--workers", f"{workers} workers on {ncores} cores: at most "
                          f"{most} ({WORKERS_PER_CORE} per core) may run on this machine",
                          f"--workers {min(2, most)}")
    memory = available_memory() if memory == -1 else memory
    if memory is None:
        return
    if per_rank <= _room(workers, memory):
        return
    each = WORKER_BYTES + per_rank
    need, allowed = workers * each + WORKER_BYTES, int(memory * MEMORY_SHARE)
    fit = (allowed - WORKER_BYTES) // each
    flags, example = sized_by if fit < min(2, workers) and sized_by[0] else \
        ("--workers", f"--workers {max(fit, 1)}")
    parts = f" ({format_size(WORKER_BYTES)} to run, {format_size(per_rank)} for " \
        f"{sized_by[0] or 'its work'})" if per_rank else ""
    raise OptionError(flags, f"{workers} workers and their launcher need about "
                      f"{format_size(need)} of memory, {format_size(each)} a worker{parts}; "
                      f"this machine has {format_size(memory)} "
                      f"available, and a run may plan on {MEMORY_SHARE:.0%} of it", example)
