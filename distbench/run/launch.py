"""Under torchrun (or any launcher that sets the env:// variables) run this process as one rank;
otherwise start the local workers ourselves through torch's own launcher API, as torchrun
--standalone would, so one command works on a laptop."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import uuid

from distbench.core.exitcodes import (
    EXIT_FAILED,
    EXIT_OK,
    STOP_SIGNALS,
    TERMINATING_SIGNALS,
    for_signal,
)
from distbench.core.options import OptionError, to_argv
from distbench.platform import env, limits
from distbench.results import writer

SHUTDOWN_GRACE_S = 5


def check_machine(opts, world: int | None) -> None:
    """Before anything exists on disk, and before torch loads: local workers this machine cannot
    hold, refused (OptionError), where the backend is known without torch (gloo asked for, or
    `auto` on a machine with no GPU device node). `world`: the ranks the options were checked
    for (--workers), else the 2 a CPU run starts. start_local checks again once torch says."""
    if env.under_launcher() or opts.backend == "nccl" or \
            (opts.backend == "auto" and limits.nvidia_devices()):
        return
    nproc = world or 2
    opts.check_backend("gloo")  # in start_local's order, so a refusal reads the same
    opts.check_world(nproc)
    limits.check_workers(nproc, opts.host_bytes("gloo", nproc), opts.SIZED_BY)


def start_local(command: str, opts, preload: tuple[str, ...] = ()) -> int:
    """The run on local workers that this process starts: `preload`, modules they would each
    import at a cost (Kind.preload), imported here once where they are forked."""
    import torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from distbench.run.runtime import RunFailure, resolve_backend

    try:
        backend = resolve_backend(opts.backend)
    except RunFailure as e:
        print(f"distbench: error: {e}", file=sys.stderr)
        return e.exit_code
    gpus = torch.cuda.device_count() if backend == "nccl" else None
    nproc = opts.workers or gpus or 2
    if gpus is not None and nproc > gpus:
        raise OptionError("--workers", f"{nproc} workers need a GPU each; {gpus} visible",
                          f"--workers {gpus}")
    opts.check_backend(backend)  # what auto resolves to is only known now
    opts.check_world(nproc)  # and so is the default worker count
    limits.check_workers(nproc, opts.host_bytes(backend, nproc), opts.SIZED_BY)
    opts.workers = nproc  # what ran, for run.json and the workers' own command line
    # A stop signal must not kill this process before it can say so in run.json, nor land
    # inside an import, where Python swallows what a handler raises: stop signals wait, blocked,
    # until run_local_workers is about to hand over to torch's agent (whose handlers raise
    # SignalException too), and are raised there.
    def stopped(signum, frame):
        raise SignalException(f"stopped by {signal.Signals(signum).name}", signal.Signals(signum))

    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    for signum in TERMINATING_SIGNALS:
        signal.signal(signum, stopped)
    try:
        record = writer.RunRecord.in_new_dir(opts.out, command, opts.to_json(), opts.argv)
    except OSError as e:  # validated, then taken away (a race), or a full disk
        print(f"distbench: error: cannot create a run directory in {opts.out}: "
              f"{e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    run_dir = record.path.parent
    try:
        # run.json exists from the moment its directory does: a run stopped before rank 0
        # starts still says what it was and how it ended (rank 0 rewrites it once it runs).
        record.update()
        os.environ[env.RUN_DIR_ENV] = str(run_dir)
        os.environ[env.ARGV_ENV] = json.dumps(opts.argv)  # what the user typed, for run.json
        os.environ[env.LAUNCHER_PID_ENV] = str(os.getpid())  # workers end with us
        budget = limits.rank_budget(nproc) if backend != "nccl" else None
        if budget is not None:  # what each may hold, as checked above (plan sizes itself by it)
            os.environ[env.RANK_MEMORY_ENV] = str(budget)
        run_local_workers(nproc, ["-m", "distbench", command, *to_argv(opts)],
                          fork=forks_workers(backend), preload=preload)
        return EXIT_OK
    except OSError as e:
        print(f"distbench: error: cannot write {e.filename}: {e.strerror}", file=sys.stderr)
        return EXIT_FAILED
    except ChildFailedError as e:
        _ignore_stop_signals()  # the run is over: let nothing cut its bookkeeping short
        return _workers_failed(record, e.failures)
    except (KeyboardInterrupt, SignalException) as e:
        # the elastic agent turns SIGINT/SIGTERM (Ctrl-C, scancel) into SignalException
        _ignore_stop_signals()
        return _stopped(record, getattr(e, "sigval", signal.SIGINT))


def _workers_failed(record, failures: dict) -> int:
    """After a worker failed: run.json as the workers left it, made exact with what only this
    process knows (the signal that killed a worker), one line on stderr, and the exit code."""
    from distbench.run.peers import Lost, describe_lost, lost_from_json

    run_dir = record.path.parent
    first_rank, first = min(failures.items(), key=lambda item: item[1].timestamp)
    if -first.exitcode in STOP_SIGNALS:  # stopped (say Ctrl-C on the process group)
        return _stopped(record, -first.exitcode)
    signals = {rank: -f.exitcode for rank, f in failures.items() if f.exitcode < 0}
    data = writer.read_run_json(run_dir) or {}
    lost = lost_from_json(data.get("lost_ranks") or [])
    if lost:  # the workers found who was gone; they left the telling to us
        dead = {x.rank: signals[x.rank] for x in lost if x.state == "dead" and x.rank in signals}
        # only the part that names the lost ranks changes ("timed out after ...: " stays)
        said = describe_lost(lost, data["failed_step"])
        data["error"] = (data.get("error") or said).replace(
            said, describe_lost(lost, data["failed_step"], dead))
        try:
            writer.write_json(record.path, data, keep=writer.RUN_KEYS)
        except writer.PartlyWritten:
            pass  # the lost ranks are said: they are among what it keeps
        except OSError as e:
            print(f"distbench: error: cannot finish {record.path}: {e.strerror}",
                  file=sys.stderr)
        print(f"distbench: error: {data['error']}; rows measured so far are in {run_dir}/",
              file=sys.stderr)
        return data.get("exit_code") or EXIT_FAILED
    # No worker could say (none was left, or none saw a peer go): what this process saw. A
    # worker seen dead after the first failure may be one the agent killed at the end of its
    # grace (stuck in a device wait, say): not a cause.
    killed = [rank for rank in sorted(signals) if signals[rank] not in STOP_SIGNALS
              and failures[rank].timestamp <= first.timestamp]
    worker0 = failures.get(0)
    # Rank 0 decides the outcome (it sees the whole run); a signal death is a failure.
    chosen = worker0 if worker0 is not None and worker0.exitcode > 0 else first
    code = chosen.exitcode if chosen.exitcode > 0 else EXIT_FAILED
    if killed:
        message = Lost(killed[0], socket.gethostname(), killed[0], "dead").describe(
            None, signals[killed[0]])
    else:
        message = f"worker rank {first_rank} exited with code {first.exitcode}"
    if writer.mark_unfinished(run_dir, message, code) or killed:
        print(f"distbench: error: {message}; rows measured so far are in {run_dir}/",
              file=sys.stderr)
    return code


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _stopped(record, signum: int) -> int:
    """run.json says the run was stopped by `signum`, unless rank 0 already said how it ended;
    the exit code a shell reports for that signal."""
    status = "interrupted" if signum == signal.SIGINT else "terminated"
    code, error = for_signal(signum), f"interrupted by {signal.Signals(signum).name}"
    if record.path.exists():
        writer.mark_unfinished(record.path.parent, error, code, status)
    else:  # stopped before run.json was first written
        with contextlib.suppress(OSError):
            record.finish(status, code, error)
    return code


def forks_workers(backend: str) -> bool:
    """Whether the workers are forked from this launcher (run/forked_workers.py): only where
    the machine has no GPU at all, not merely where the run uses none. On a GPU host this
    process has initialized the CUDA driver already (resolve_backend asks torch whether CUDA is
    there), and a gloo worker forked from it fails with "CUDA error: initialization error" as
    soon as torch touches CUDA on its behalf, as dp's and step's did on an H100 (2026-11-27,
    docs/measurements/gpu-first-contact.md)."""
    return backend != "nccl" and env.fork_workers() and not limits.nvidia_devices()


def run_local_workers(nproc: int, python_args: list[str], fork: bool = False,
                      preload: tuple[str, ...] = ()) -> None:
    """`python -u <python_args>` in nproc local workers, as torchrun --standalone starts them;
    `fork`: forked from this process instead (run/forked_workers.py: no GPU in play), with
    `preload` imported first. Raises torch's ChildFailedError when a worker fails."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if fork:
        from distbench.run import forked_workers

        forked_workers.install(preload)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, minus its warning
    # The agent's own log lines (closing signals sent to workers) repeat what we report. torch
    # gives some of its elastic loggers their own level, so the parent's is not enough.
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    _cap_shutdown_grace()
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"distbench-{uuid.uuid4().hex}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
    )
    # before any worker is started: they would inherit the mask
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    elastic_launch(config, sys.executable)("-u", *python_args)


def _cap_shutdown_grace() -> None:
    """torch's agent gives workers 30 s between SIGTERM and SIGKILL when it stops them after a
    failure, and no option reaches that path (the process context closes itself with its
    default as soon as one worker fails). A worker of ours answers SIGTERM by writing run.json
    in milliseconds; one that does not answer (stopped, stuck) would hold the command 30 s past
    --timeout. Cap the grace, in this launcher process only."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    close = PContext.close
    if getattr(close, "distbench_capped", False):
        return

    def capped(self, death_sig=None, timeout=SHUTDOWN_GRACE_S):
        return close(self, death_sig, min(timeout, SHUTDOWN_GRACE_S))

    capped.distbench_capped = True
    PContext.close = capped
