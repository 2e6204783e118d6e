"""Self-launched CPU workers forked from the launcher, which has imported torch already, rather
than started as fresh interpreters that each import it again: about 2 CPU-seconds and 2 s of
wall time saved per worker, before the first row (benchmarks/launch_cost.py).

torch's elastic agent still does everything else as it does for `python -u -m distbench ...`:
rendezvous, each worker's environment, watching them, stopping them with a signal to their
process group, reading their exit codes. Only the one call that starts a worker process is
replaced (SubprocessHandler._popen); the child is made to look like what exec would have made
(its own session, default signal handlers, no inherited descriptors, unbuffered output, the
environment given) and then runs the same entry point a fresh interpreter would.

Only on a machine with no GPU (launch.forks_workers): a process that has touched CUDA cannot be
forked safely, and on a GPU host the launcher has, even for a gloo run. And only from a
launcher that has run no torch op yet, whose thread pools do not exist (OpenMP's do not survive
a fork)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import NoReturn

from distbench.run.held_stops import HeldStops

# What the commands that train import in each worker, about 1.2 CPU-s: torch.optim's and
# DTensor's first calls import torch._dynamo (torch._disable_dynamo).
TRAINING = ("torch._dynamo",)
# What a fresh `python -u -m distbench` would be started as: the only command line forked.
_ENTRY = ("-u", "-m", "distbench")
_POLL_S = 0.01
_HANDSHAKE_POLL_S = 0.05


def install(preload: tuple[str, ...] = ()) -> None:
    """From now on, in this (launcher) process, torch's agent forks each `python -u -m distbench`
    worker instead of executing one; `preload`: modules imported first, so that no worker
    imports them again. The levels of the loggers as they are now are what each worker starts
    with (the launcher quiets torch's own afterwards)."""
    for name in preload:
        importlib.import_module(name)
    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler as handler,
    )

    popen = handler.SubprocessHandler._popen
    if getattr(popen, "distbench_forks", False):
        return
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}

    def forking(self, args, env):
        if tuple(args[:1 + len(_ENTRY)]) != (sys.executable, *_ENTRY):
            return popen(self, args, env)  # not ours (a numactl wrapper, say): as torch would
        return ForkedWorker(list(args[1 + len(_ENTRY):]), env, self._stdout, self._stderr,
                            levels)

    forking.distbench_forks = True
    handler.SubprocessHandler._popen = forking


class ForkedWorker:
    """The part of subprocess.Popen that torch's agent uses (pid, poll, wait, send_signal), for
    a worker forked from this process."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout, stderr,
                 levels: dict[str, int]):
        for stream in (sys.stdout, sys.stderr):  # or the child writes it a second time
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        ready_r, ready_w = os.pipe()
        # a stop signal now is raised once the worker is forked and registered: raised inside
        # the fork's hooks it was lost, and the launcher ran on to --count or hung (watch)
        with HeldStops() as held:
            pid = os.fork()
            if pid == 0:
                _become_worker(argv, env, stdout, stderr, levels, ready_w)  # never returns
        os.close(ready_w)
        try:
            ended = _await_own_group(pid, ready_r)
        finally:
            os.close(ready_r)
        self.pid = pid
        self.args = argv
        self.returncode: int | None = ended
        held.deliver()  # the agent's handler raises now, not inside logging's fork hook

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(_POLL_S)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


def _await_own_group(pid: int, ready_r: int) -> int | None:
    """Returns once the child leads its own process group, as Popen(start_new_session=True)
    returns, so that the agent's killpg reaches it and only it; or its exit code, if it ended
    first. A child stopped before it could say so (SIGSTOP as it was born) is made to lead a
    group from here: the launcher goes on, and its timeout and killpg still reach it."""
    while True:
        readable, _, _ = select.select([ready_r], [], [], _HANDSHAKE_POLL_S)
        if readable:  # it said so, or it ended (the pipe's end closed)
            return None
        got, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if not got:
            continue
        if os.WIFSTOPPED(status):
            with contextlib.suppress(OSError):  # it had its own session: a group already
                os.setpgid(pid, pid)
            return None
        return os.waitstatus_to_exitcode(status)  # ended between the two looks


def _become_worker(argv, env, stdout, stderr, levels, ready_w) -> None:
    """In the forked child: a session of its own, as Popen(start_new_session=True) gives, said
    to the launcher; then as_if_exec. Nothing here may return into the agent's code that
    forked it."""
    try:
        # the launcher made it lead a group already if it was stopped before it got here
        with contextlib.suppress(PermissionError):
            os.setsid()
        with contextlib.suppress(OSError):  # the launcher stopped listening
            os.write(ready_w, b"x")
        # the agent's redirect files, as Popen would have used them
        stdio = (None, *(s.fileno() if s is not None else None for s in (stdout, stderr)))
    except BaseException:
        os._exit(1)
    as_if_exec(argv, env, stdio, levels, threads_from_env=True)


def as_if_exec(argv: list[str], env: dict[str, str], stdio: tuple[int | None, ...],
               levels: dict[str, int] | None = None, threads_from_env: bool = False,
               module: str = "distbench") -> NoReturn:
    """In a child just forked from a process that has imported distbench: what exec of
    `python -u -m distbench *argv` would have given it, then distbench's entry point, then
    gone (os._exit). `module`: another module run so (the test suite's fork server runs
    torchrun's agent, `torch.distributed.run`, too). `stdio`: the descriptors that become 0,
    1 and 2 (None: the parent's stays); every other descriptor is closed. `levels`: the
    loggers' levels to start with. `threads_from_env`: apply OMP_NUM_THREADS, for a worker (a
    launcher must not: its thread pools would not survive the fork of its own workers)."""
    code = 1
    try:
        # The parent's objects are never collected here: one holding a descriptor closed
        # below would otherwise close whatever the child opened under the same number.
        gc.freeze()
        _default_signals()
        for fd, given in enumerate(stdio):
            if given is not None:
                os.dup2(given, fd)
        os.closerange(3, _max_fd())  # the parent's store, its sockets: not the child's
        os.environ.clear()
        os.environ.update(env)
        _unbuffered()
        for name, level in (levels or {}).items():
            logging.getLogger(name).setLevel(level)
        if threads_from_env:
            _threads_from_env()
        sys.argv = [sys.argv[0], *argv]
        # what `python -m distbench` runs, as it runs it (argv[0] becomes its path)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:  # as an interpreter dies of an uncaught one: by SIGINT
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as e:
        with contextlib.suppress(Exception):
            # from the module's frames on, as the interpreter prints it: not this function's
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    finally:
        _flush()
        os._exit(code)


def _default_signals() -> None:
    """The launcher's handlers (torch's agent turns SIGTERM into an exception) are not the
    worker's: as a fresh interpreter starts, SIGINT raises KeyboardInterrupt and what Python
    handled is back to its default; ignored signals stay ignored, as exec keeps them."""
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _unbuffered() -> None:
    """`python -u`: every write reaches the descriptor at once (a worker killed mid-run has
    already said what it said)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False),
                                  encoding=getattr(old, "encoding", None) or "utf-8",
                                  errors=getattr(old, "errors", None) or "strict",
                                  write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _threads_from_env() -> None:
    """OpenMP read OMP_NUM_THREADS when the launcher loaded torch, before the launcher set it
    for its workers: what a fresh worker would have read, applied now."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 65536


def _exit_code(code) -> int:
    """What the interpreter makes of sys.exit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
