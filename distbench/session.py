"""One run of a command on one rank: the process group, the run directory, run.json from start
to end, and the rules for failure (what is printed, what run.json says, the exit code)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from distbench import results
from distbench.console import Console
from distbench.exitcodes import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    TERMINATING_SIGNALS,
    for_signal,
)
from distbench.faults import Faults
from distbench.launch import started_by_us
from distbench.options import OptionError
from distbench.peers import Lost, describe_lost, lost_to_json
from distbench.runtime import RunFailure, Runtime, Watchdog, start
from distbench.tables import Output

# Outcomes every rank of a run reaches together (the verdict is agreed by collectives): rank 0
# speaks for all, and all ranks are alive to leave together. A refused option is agreed too,
# but found before the session starts.
AGREED = ("ok", "wrong", "slow_links", "below_expectation", "inconclusive")
NO_LOST_RANK = "a peer stopped taking part (stalled or dead rank?)"


class Terminated(BaseException):
    """A terminating signal; usually SIGTERM, the launcher stopping us because another worker
    failed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_stop_signal(signum, frame):
    raise Terminated(signum)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "..."


class Session:
    def __init__(self, command: str, opts, rt: Runtime):
        self.command = command
        self.opts = opts
        self.rt = rt
        self.console = Console(rt.rank == 0)
        self.current = "startup"
        self.run_dir: Path | None = None
        self.record: results.RunRecord | None = None
        self._sinks: dict[str, results.CsvSink | results.NullSink] = {}
        self.faults = Faults.from_env(rt.rank)  # all off outside the test suite
        # The main thread and the watchdog's may both end the run: the first one does (the
        # other waits for its os._exit).
        self._ending = threading.RLock()
        self.watchdog = Watchdog(self._timed_out, self._orphaned)
        # (status, exit code, error) once run.json says how the run ended, from whichever
        # thread ends it: a command's own files can say the same (accept.json)
        self.on_end: list[Callable[[str, int, str | None], None]] = []

    def open_run_dir(self) -> None:
        """Rank 0 owns the files. The local launcher picks the directory so it can find run.json
        if every worker dies; under torchrun rank 0 picks it."""
        if self.rt.rank != 0:
            return
        given = os.environ.get(results.RUN_DIR_ENV)
        self.run_dir = Path(given) if given else results.new_run_dir(self.opts.out, self.command)
        rt = self.rt
        self.record = results.RunRecord(self.run_dir, self.command, self.opts.to_json(),
                                        self.opts.argv)
        driver = next((s.get("driver_version") for s in rt.snapshots if s.get("driver_version")),
                      None)
        self.record.update(backend=rt.backend, world_size=rt.world, nnodes=rt.nnodes,
                           versions={**rt.versions(), "driver": driver}, ranks=rt.ranks)
        results.write_topology(self.run_dir, rt.snapshots, rt.ranks)
        if rt.peers is not None:
            rt.peers.publish_run_dir(str(self.run_dir))

    def sink(self, output: Output) -> results.CsvSink | results.NullSink:
        """The output's CSV in the run directory on rank 0 (a sink that drops rows elsewhere),
        opened on first use; the session closes it when the run ends, however it ends."""
        if output.file not in self._sinks:
            self._sinks[output.file] = (
                results.NullSink() if self.run_dir is None
                else results.CsvSink(self.run_dir / output.file, list(output.csv)))
        return self._sinks[output.file]

    def step(self, what: str, seconds: float) -> None:
        """Name what runs now (errors and timeouts quote it) and how long it may take."""
        self.current = what
        if self.rt.peers is not None:
            self.rt.peers.step = what  # what a roll call answer says this rank was doing
        self.watchdog.arm(seconds, what)

    def _timed_out(self, what: str, seconds: float) -> None:
        message = f"timed out after {seconds:.0f} s in {what} on rank {self.rt.rank}"
        self._end("timeout", EXIT_FAILED, message)
        os._exit(EXIT_FAILED)

    def _orphaned(self, parent: int) -> None:
        message = (f"the launcher (pid {parent}) is gone, killed without stopping its workers; "
                   f"stopped in {self.current} on rank {self.rt.rank}")
        # no roll call: the launcher hosted the store it would go through
        self._end("terminated", EXIT_TERMINATED, message, roll_call=False)
        os._exit(EXIT_TERMINATED)

    def _end(self, status: str, code: int, error: str | None, roll_call: bool = True
             ) -> tuple[str, int]:
        """Say how the run ended, once: the roll call may change it (a lost rank is the cause
        of what this one saw); the status and exit code it settled on."""
        self._ending.acquire()  # never released: whoever ends the run, ends the process
        self.watchdog.disarm()
        self.console.stop_progress()
        for sink in self._sinks.values():
            sink.close()
        answered, lost = [self.rt.rank], []
        peers = self.rt.peers
        if roll_call and status not in (*AGREED, "bad_input") and peers is not None:
            called = peers.roll_call()
            if called is not None:
                answered, lost = called
        status, code, error = _with_lost_ranks(status, code, error, lost, self.current)
        fields = {"lost_ranks": lost_to_json(lost), "failed_step": self.current} if lost else {}
        if lost:  # one voice: the lowest rank left, or our own launcher, which knows the signals
            speaks = self.rt.rank == answered[0] and not started_by_us()
        else:  # other failures are local, and the rank that saw one may be the only one to tell
            speaks = self.rt.rank == 0 or status not in (*AGREED, "bad_input")
        if error and speaks:
            print(f"distbench: rank {self.rt.rank}: error: {error}", file=sys.stderr, flush=True)
        if self.record is not None:
            try:
                self.record.finish(status, code, error, **fields)
                for hook in self.on_end:
                    hook(status, code, error)
            except OSError as e:
                print(f"distbench: rank 0: error: cannot finish {self.record.path}: "
                      f"{e.strerror}; it may still say \"running\"", file=sys.stderr, flush=True)
            self.console.log(f"results in {self.run_dir}/")
        elif 0 in [x.rank for x in lost] and self.rt.rank == answered[0]:
            # rank 0 is gone: the lowest rank left says how the run ended, where it can reach
            run_dir = peers.run_dir()
            if run_dir is None or not results.mark_unfinished(Path(run_dir), error, code, status,
                                                              **fields):
                print(f"distbench: rank {self.rt.rank}: error: cannot finish run.json "
                      f"({run_dir or 'rank 0 had not created it'}); it may still say "
                      "\"running\"", file=sys.stderr, flush=True)
        sys.stdout.flush()
        return status, code


def run(command: str, opts, body: Callable[[Session], int]) -> int:
    for signum in TERMINATING_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    try:
        rt = start(opts.backend, opts.timeout, opts.identity(), opts.check_backend)
        try:
            opts.check_world(rt.world)  # a launcher may start any number of ranks
        except OptionError as e:
            raise RunFailure(str(e), status="bad_input", exit_code=EXIT_BAD_INPUT) from None
    except RunFailure as e:
        # every rank ends alike: one line per node, so each node's log says why
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"distbench: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except Terminated as e:  # stopped before the run began: nothing measured, nothing to say
        return for_signal(e.signum)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    session = Session(command, opts, rt)
    status, code, error = "ok", EXIT_OK, None
    try:
        session.open_run_dir()
        code = body(session)
        status = "ok" if code == EXIT_OK else "wrong"
    except RunFailure as e:
        status, code, error = e.status, e.exit_code, str(e)
    except Terminated as e:
        cause = f" while handling: {_first_line(e.__context__)}" if e.__context__ else ""
        status, code = "terminated", for_signal(e.signum)
        error = f"stopped by {signal.Signals(e.signum).name} in {session.current}{cause}"
    except KeyboardInterrupt:
        status, code, error = "interrupted", EXIT_INTERRUPTED, f"interrupted in {session.current}"
    except OSError as e:
        status, code = "failed", EXIT_FAILED
        where = e.filename or session.run_dir
        what = f"cannot write {where}" if where else f"{session.current} failed"
        error = f"{what}: {e.strerror or _first_line(e)} (in {session.current})"
    except Exception as e:
        status, code = "failed", EXIT_FAILED
        error = f"{session.current} failed: {type(e).__name__}: {_first_line(e)}"
    finally:
        # Writing run.json must not be cut short by the launcher's SIGTERM. Ignored, not
        # blocked: a mask would cover this thread only, and Python runs handlers here anyway.
        for signum in TERMINATING_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        session.watchdog.disarm()
        status, code = session._end(status, code, error)
    if status in AGREED:
        # Every rank is alive: leave together, so none closes its connections while a peer's
        # background threads still use them (seen: std::terminate in a rank's teardown), and
        # none exits non-zero (slow links) while rank 0 still writes run.json: the launcher
        # would SIGTERM it.
        if session.rt.peers is not None and session.rt.rank == 0:
            session.rt.peers.end()
        dist.barrier()
        dist.destroy_process_group()
    # Skip the interpreter's teardown of torch's C++ threads; and when peers may be dead or
    # stuck, tearing the process group down could hang. Everything is written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _with_lost_ranks(status: str, code: int, error: str | None, lost: list[Lost],
                     step: str) -> tuple[str, int, str | None]:
    """How the run ended, once the roll call has said which ranks are gone: a lost rank is the
    cause of whatever this rank saw (a reset connection, a launcher's SIGTERM), so the run
    failed; a timeout or a Ctrl-C stays what it was, and names them."""
    if status == "timeout":
        return status, code, f"{error}: {describe_lost(lost, step) if lost else NO_LOST_RANK}"
    if not lost:
        return status, code, error
    if status == "interrupted":
        return status, code, f"{error}; {describe_lost(lost, step)}"
    return "failed", EXIT_FAILED, describe_lost(lost, step)
