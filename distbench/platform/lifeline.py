"""A worker never outlives the process that started it. A launcher that dies without stopping
its workers (SIGKILLed, OOM-killed) leaves them waiting on peers that will never come, each
holding its memory, until their own timeouts, or forever in a rendezvous. Each worker watches
its parent from a thread, so it sees the loss even while its main thread waits inside torch:
rank 0 says in run.json how the run ended, then every worker exits. The kernel's parent-death
signal is set too (Linux), for a worker whose threads cannot run at all.

Bound: a worker is gone within WATCH_INTERVAL_S of its launcher's death, plus the time rank 0
takes to rewrite run.json. No torch here: it starts before torch is imported, so a launcher
killed while its workers start up is seen too."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from distbench.core.exitcodes import EXIT_TERMINATED
from distbench.platform import env

WATCH_INTERVAL_S = 0.5
# What a launcher that is a container's first process looks like on its command line.
LAUNCHERS = ("torchrun", "torch.distributed.run", "distbench", "srun", "slurmstepd", "mpirun",
             "orted", "prterun")
_PR_SET_PDEATHSIG = 1


_parent: int | None = None
# What runs, from the watching thread, when the parent is found gone, before the process exits:
# (parent pid) -> exit code. The session replaces the startup one once the run has begun.
on_loss: Callable[[int], int | None] | None = None


def watch(handler: Callable[[int], int | None] | None = None) -> None:
    """From now on this process ends when its parent does: `handler` (see on_loss) runs, then
    the process exits. A rank without one (it writes nothing) is also killed by the kernel
    the moment its parent dies. A parent already gone (the launcher killed while this process
    started) ends it at once."""
    global _parent, on_loss
    _parent = env.launcher_pid() or os.getppid()
    on_loss = handler
    if handler is None:
        _set_parent_death_signal(signal.SIGKILL)
    if orphaned() or _born_orphan():
        _leave()
    threading.Thread(target=_watch, name="distbench-lifeline", daemon=True).start()


def describe_loss(parent: int, step: str, rank: int | str) -> str:
    """How a lost launcher is told, in run.json and on stderr, whenever it is found."""
    return (f"the launcher (pid {parent}) is gone, killed without stopping its workers; "
            f"stopped in {step} on rank {rank}")


def orphaned(settle_s: float = 0.0) -> int | None:
    """The pid of this process's launcher when it is gone (orphans are re-parented, to init or
    a subreaper: a changed parent is a dead one); None while it lives or when not watched.
    `settle_s`: how long to keep looking. A launcher SIGKILLed tears its threads down one by
    one, and its children are re-parented only when the last is gone, some milliseconds after
    the ranks it kills with the parent-death signal have closed their connections."""
    if _parent is None:
        return None
    deadline = time.monotonic() + settle_s
    while os.getppid() == _parent:
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return _parent


def _born_orphan() -> bool:
    """A launcher that is not ours (torchrun) may die between starting this process and this
    check: then init is already the parent. Unless init is the launcher itself (torchrun as a
    container's first process), a rank started by init has lost its launcher."""
    if env.launcher_pid() or os.getppid() != 1:
        return False
    try:
        init = open("/proc/1/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return not any(name in init for name in LAUNCHERS)


def leave_if_orphaned(settle_s: float = 0.0) -> None:
    """From a rank's own failure path: when the launcher is gone, that is the cause to report
    (the thread would find it within WATCH_INTERVAL_S, after a misleading error). `settle_s`:
    see orphaned; a failure that may be the launcher's death itself (its store's connection
    reset) is seen before this process is re-parented."""
    if orphaned(settle_s):
        _leave()


def _watch() -> None:
    stop = threading.Event()
    while not stop.wait(WATCH_INTERVAL_S):
        if orphaned():
            _leave()


def _leave() -> None:
    code = EXIT_TERMINATED
    try:
        if on_loss is not None:
            code = on_loss(_parent) or code
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _set_parent_death_signal(signum: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
