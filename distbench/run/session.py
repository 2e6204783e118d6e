"""One run of a command on one rank: the process group, the run directory, run.json from start
to end, and the rules for failure (what is printed, what run.json says, the exit code)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch.distributed as dist

from distbench.core.errors import one_line
from distbench.core.exitcodes import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    TERMINATING_SIGNALS,
    for_signal,
)
from distbench.core.options import OptionError
from distbench.core.tables import Output
from distbench.platform import env, lifeline
from distbench.results import writer
from distbench.run import comm_trace
from distbench.run.console import Console
from distbench.run.faults import Faults
from distbench.run.peers import ROLL_CALL_GRACE_S, Lost, describe_lost, lost_to_json
from distbench.run.runtime import (
    FAILURE_GRACE_S,
    LOOP,
    FailureWatch,
    RunFailure,
    Runtime,
    Watchdog,
    start,
)

# Outcomes every rank of a run reaches together (the verdict is agreed by collectives): rank 0
# speaks for all, and all ranks are alive to leave together. A refused option is agreed too,
# but found before the session starts.
AGREED = ("ok", "wrong", "slow_links", "below_expectation", "inconclusive")
NO_LOST_RANK = "a peer stopped taking part (stalled or dead rank?)"
# How long a rank ending the run asks the others (the roll call, with its grace, and who timed
# out first) through the launcher's store: one that stops answering must not hold it longer.
ENDING_S = ROLL_CALL_GRACE_S + 3
T = TypeVar("T")


class Terminated(BaseException):
    """A terminating signal; usually SIGTERM, the launcher stopping us because another worker
    failed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_stop_signal(signum, frame):
    raise Terminated(signum)


# What run.json's error quotes of an exception: one line, bounded.
_ERROR_CHARS = 300


class Session:
    def __init__(self, command: str, opts, rt: Runtime, watchdog: Watchdog | None = None):
        self.command = command
        self.opts = opts
        self.rt = rt
        self.console = Console(rt.rank == 0)
        self.current = "startup"
        self.run_dir: Path | None = None
        self.record: writer.RunRecord | None = None
        self._sinks: dict[str, writer.CsvSink | writer.NullSink] = {}
        self.faults = Faults.from_env(rt.rank)  # all off outside the test suite
        # The main thread and the watchdog's may both end the run: the first one does (the
        # other waits for its os._exit).
        self._ending = threading.RLock()
        self.watchdog = watchdog or _watchdog(opts)  # the startup's, when it had one
        self.watchdog.on_expire = self._timed_out
        self._parts = 0  # guarded parts begun (watching_failures), alike on every rank
        self._part: int | None = None  # the one running
        lifeline.on_loss = self._orphaned  # the startup's handler knew no step
        # (status, exit code, error) once run.json says how the run ended, from whichever
        # thread ends it: a command's own files can say the same (accept.json)
        self.on_end: list[Callable[[str, int, str | None], None]] = []
        # on every rank, first thing as the run ends however it ends (watch's textfile stops
        # reading healthy): before the roll call, which may wait on lost peers
        self.on_stop: list[Callable[[], None]] = []

    def open_run_dir(self) -> None:
        """Rank 0 owns the files. The local launcher picks the directory so it can find run.json
        if every worker dies; under torchrun rank 0 picks it."""
        if self.rt.rank != 0:
            return
        rt = self.rt
        driver = next((s.get("driver_version") for s in rt.snapshots if s.get("driver_version")),
                      None)
        fields = dict(backend=rt.backend, world_size=rt.world, nnodes=rt.nnodes,
                      versions={**rt.versions(), "driver": driver}, ranks=rt.ranks)
        given = env.given_run_dir()
        args = (self.command, self.opts.to_json(), self.opts.argv)
        self.record = writer.RunRecord(Path(given), *args) if given else \
            writer.RunRecord.in_new_dir(self.opts.out, *args)
        self.run_dir = self.record.path.parent
        self.record.update(**fields)
        writer.write_topology(self.run_dir, rt.snapshots, rt.ranks)
        if rt.peers is not None:
            rt.peers.publish_run_dir(str(self.run_dir))

    def sink(self, output: Output) -> writer.CsvSink | writer.NullSink:
        """The output's CSV in the run directory on rank 0 (a sink that drops rows elsewhere),
        opened on first use; the session closes it when the run ends, however it ends."""
        if output.file not in self._sinks:
            self._sinks[output.file] = (
                writer.NullSink() if self.run_dir is None
                else writer.CsvSink(self.run_dir / output.file, list(output.csv)))
        return self._sinks[output.file]

    def phase(self, what: str, seconds: float) -> None:
        """Name what runs now (errors and timeouts quote it) and how long it may take."""
        self.current = what
        if self.rt.peers is not None:
            self.rt.peers.phase = what  # what a roll call answer says this rank was doing
        self.watchdog.arm(seconds, what)

    @contextmanager
    def watching_failures(self) -> Iterator[None]:
        """A guarded part (steps.recipe.agreed): within it a rank that fails says so to the
        others (failed_here), and every rank ends the run FAILURE_GRACE_S after a failure is
        posted while some rank is still short of the part's end (end_part)."""
        self._parts += 1
        self._part = part = self._parts
        peers, watch = self.rt.peers, None
        if peers is not None:
            store = peers.watch_client()
            watch = FailureWatch(lambda: peers.failure(part, store),
                                 lambda: peers.all_ended(part, store),
                                 min(FAILURE_GRACE_S, self.opts.timeout), self._failed)
        try:
            yield
        finally:
            if watch is not None:
                watch.stop()
            self._part = None

    def end_part(self) -> str | None:
        """At the end of the guarded part running now, through the store: "" when no rank failed
        in it, else the first failure's reason, on every rank alike; None without a store
        (a test's stand-in session), for the caller to agree over the process group."""
        peers = self.rt.peers
        if peers is None or self._part is None:
            return None
        try:
            failure = peers.end_part(self._part, self.opts.timeout)
        except dist.DistError as e:
            raise RunFailure(f"{self.current}: {one_line(e, _ERROR_CHARS)}", status="timeout"
                             ) from None
        return "" if failure is None else failure["error"]

    def failed_here(self, label: str, reason: str) -> None:
        """This rank failed in the guarded part running now: its peers are told."""
        if self.rt.peers is not None and self._part is not None:
            self.rt.peers.post_failure(self._part, {"rank": self.rt.rank, "error": reason,
                                                    "step": label})

    def _failed(self, failure: dict) -> None:
        """A rank failed in a guarded part and the part did not end within the grace: some rank
        is waiting on the failed one."""
        message = f"rank {failure['rank']} failed in {failure['step']}: {failure['error']}"
        if failure["rank"] != self.rt.rank:
            message += f"; rank {self.rt.rank} was left waiting on it in {self.current}"
        self._end("failed", EXIT_FAILED, message)
        os._exit(EXIT_FAILED)

    def _timed_out(self, what: str, seconds: float) -> None:
        message = f"timed out after {seconds:.0f} s in {what} on rank {self.rt.rank}"
        self._end("timeout", EXIT_FAILED, message)
        os._exit(EXIT_FAILED)

    def _orphaned(self, parent: int) -> None:
        self._end("terminated", EXIT_TERMINATED, self._orphan_message(parent), roll_call=False)
        os._exit(EXIT_TERMINATED)

    def _orphan_message(self, parent: int) -> str:
        return lifeline.describe_loss(parent, self.current, self.rt.rank)

    def _end(self, status: str, code: int, error: str | None, roll_call: bool = True,
             agreed: bool = False) -> tuple[str, int]:
        """Say how the run ended, once: the roll call may change it (a lost rank is the cause
        of what this one saw), and so may a rank that timed out first; the status and exit code
        it settled on. `agreed`: every rank reached this end together, alive (an AGREED status,
        or a RunFailure raised as agreed)."""
        agreed = agreed or status in AGREED
        self._ending.acquire()  # never released: whoever ends the run, ends the process
        self.watchdog.disarm()
        for hook in self.on_stop:
            try:
                hook()
            except OSError as e:
                print(f"distbench: rank {self.rt.rank}: error: {e}", file=sys.stderr, flush=True)
        self.console.stop_progress()
        for sink in self._sinks.values():
            sink.close()
        parent = lifeline.orphaned()
        if parent is not None and not agreed and status != "bad_input":
            # whatever this rank saw (a peer that left as it noticed first, and closed its
            # connections), the lost launcher is the cause; no roll call: it held the store
            status, code, error = "terminated", EXIT_TERMINATED, self._orphan_message(parent)
            roll_call = False
        answered, lost, first = [self.rt.rank], [], None
        peers = self.rt.peers
        if roll_call and not agreed and status != "bad_input" and peers is not None:
            answered, lost, first = _within(ENDING_S, lambda: self._ask_the_others(
                status, code, error), (answered, lost, first))
            parent = lifeline.orphaned(settle_s=lifeline.WATCH_INTERVAL_S)
            if parent is not None:  # the launcher was dying as this rank failed: the cause
                answered, lost, first = [self.rt.rank], [], None
                status, code, error = "terminated", EXIT_TERMINATED, self._orphan_message(parent)
        status, code, error = _with_lost_ranks(status, code, error, lost, self.current)
        phase = self.current
        if first is not None:  # it said so already, or its voice is the one below
            status, code, error, phase = "timeout", EXIT_FAILED, first["error"], first["step"]
        self._say(status, code, error, answered, lost, phase, told=first is not None,
                  agreed=agreed)
        return status, code

    def _say(self, status: str, code: int, error: str | None, answered: list[int],
             lost: list[Lost], phase: str, told: bool, agreed: bool = False) -> None:
        """How the run ended, on stderr by one voice and in run.json. `told`: the rank that
        timed out first said it already."""
        fields = {"lost_ranks": lost_to_json(lost), "failed_step": phase} if lost else {}
        if lost:  # one voice: the lowest rank left, or our own launcher, which knows the signals
            speaks = self.rt.rank == answered[0] and not env.started_by_us()
        else:  # other failures are local, and the rank that saw one may be the only one to tell
            speaks = not told and (self.rt.rank == 0 or not (agreed or status == "bad_input"))
        if error and speaks:
            print(f"distbench: rank {self.rt.rank}: error: {error}", file=sys.stderr, flush=True)
        if self.record is not None:
            try:
                self.record.finish(status, code, error, **fields)
                for hook in self.on_end:
                    hook(status, code, error)
            except writer.PartlyWritten as e:
                print(f"distbench: rank 0: error: cannot write all of {self.record.path}: "
                      f"{e.strerror}; it says how the run ended, without {self.command}'s own "
                      "sections", file=sys.stderr, flush=True)
            except OSError as e:
                print(f"distbench: rank 0: error: cannot finish {self.record.path}: "
                      f"{e.strerror}; it may still say \"running\"", file=sys.stderr, flush=True)
            self.console.log(f"results in {self.run_dir}/")
        elif 0 in [x.rank for x in lost] and self.rt.rank == answered[0]:
            # rank 0 is gone: the lowest rank left says how the run ended, where it can reach
            run_dir = _within(ENDING_S, self.rt.peers.run_dir, None)
            if run_dir is None or not writer.mark_unfinished(Path(run_dir), error, code, status,
                                                              **fields):
                print(f"distbench: rank {self.rt.rank}: error: cannot finish run.json "
                      f"({run_dir or 'rank 0 had not created it'}); it may still say "
                      "\"running\"", file=sys.stderr, flush=True)
        sys.stdout.flush()

    def _ask_the_others(self, status: str, code: int, error: str | None
                        ) -> tuple[list[int], list[Lost], dict | None]:
        """Through the launcher's store: who answers the roll call, who is lost, and the
        timeout of a rank that timed out first (_first_timeout)."""
        called = self.rt.peers.roll_call()
        answered, lost = called if called is not None else ([self.rt.rank], [])
        status, _, error = _with_lost_ranks(status, code, error, lost, self.current)
        return answered, lost, _first_timeout(self.rt.peers, status, error, self.current)


def _within(seconds: float, ask: Callable[[], T], default: T) -> T:
    """ask(), or `default` when it has not answered `seconds` later: it goes through the
    launcher's store, and a store that stopped answering (its host stopped) would hold this
    rank for as long as its connection's timeout, with run.json still unwritten."""
    got = [default]

    def call():
        got[0] = ask()
    asking = threading.Thread(target=call, name="distbench-ending", daemon=True)
    asking.start()
    asking.join(seconds)
    return default if asking.is_alive() else got[0]


def _first_timeout(peers, status: str, error: str | None, phase: str) -> dict | None:
    """Another rank's timeout, when it came first: it decides how the run ended. This rank's
    own failure (the connection the timed-out rank closed as it left, the launcher's SIGTERM
    that followed) is its consequence; this rank's own timeout, at the same moment, says the
    same in other words. None: this rank's ending stands."""
    if status == "timeout":
        return peers.timed_out(error, phase)
    if status in ("failed", "terminated"):
        return peers.first_timeout()
    return None  # a Ctrl-C stays one


@contextmanager
def _exit_if_stuck(seconds: float, code: int, doing: str, rank: int) -> Iterator[None]:
    """Whatever the body waits on (a peer stopped at the last barrier), the process leaves
    `seconds` later with `code`."""
    def stuck():
        print(f"distbench: rank {rank}: error: still {doing} after {seconds:g} s; leaving "
              f"with exit code {code}", file=sys.stderr, flush=True)
        os._exit(code)
    timer = threading.Timer(seconds, stuck)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _watchdog(opts) -> Watchdog:
    """One watchdog for the process, from its startup on; the session takes it over. A timed
    loop that stops moving is ended after --timeout, however long the loop was to take. A
    lost launcher is the lifeline's to see: its startup handler (cli.app.main), then the
    session's."""
    return Watchdog(_startup_timed_out, LOOP, opts.timeout)


def _startup_timed_out(what: str, seconds: float) -> None:
    """Startup took longer than --timeout: no roll call (the process group may not exist), one
    line from this rank, and run.json (where our own launcher made it) says so."""
    message = f"timed out after {seconds:.0f} s in {what} on rank {env.rank_text()}"
    print(f"distbench: rank {env.rank_text()}: error: {message}", file=sys.stderr, flush=True)
    _mark_run_json(message, EXIT_FAILED, "timeout")
    os._exit(EXIT_FAILED)


def _mark_run_json(error: str, code: int, status: str) -> None:
    """Before rank 0 has opened the run directory, only our own launcher's exists. A lost
    launcher is the cause of whatever failed (its store went with it): the lifeline says so,
    given the moment a SIGKILLed launcher's ranks take to be re-parented."""
    lifeline.leave_if_orphaned(lifeline.WATCH_INTERVAL_S)
    given = env.given_run_dir()
    if given:
        writer.mark_unfinished(Path(given), error, code, status)


def _ignore_stop_signals() -> None:
    """The rank is ending with its own code: writing run.json and leaving must not be cut short
    by the launcher's SIGTERM. Ignored, not blocked: a mask would cover this thread only, and
    Python runs handlers here anyway."""
    for signum in TERMINATING_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def run(command: str, opts, body: Callable[[Session], int]) -> int:
    for signum in TERMINATING_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    watchdog = _watchdog(opts)
    try:
        rt = start(opts.backend, opts.timeout, opts.identity(), opts.check_backend, watchdog.arm)
        try:
            opts.check_world(rt.world)  # a launcher may start any number of ranks
        except OptionError as e:
            raise RunFailure(str(e), status="bad_input", exit_code=EXIT_BAD_INPUT) from None
    except RunFailure as e:
        # the launcher's SIGTERM comes while this runs (the node's other rank refused first and
        # ended, and the agent stops the rest; seen in make test): this rank ends with its own code
        _ignore_stop_signals()
        watchdog.disarm()
        # every rank ends alike: one line per node, so each node's log says why
        if env.local_rank() == 0:
            print(f"distbench: error: {e}", file=sys.stderr, flush=True)
        if env.rank_text() == "0":
            _mark_run_json(str(e), e.exit_code, e.status)
        return e.exit_code
    except Terminated as e:  # stopped before the run began: nothing measured, nothing to say
        watchdog.disarm()
        return for_signal(e.signum)
    except KeyboardInterrupt:
        watchdog.disarm()
        return EXIT_INTERRUPTED
    watchdog.disarm()
    session = Session(command, opts, rt, watchdog)
    status, code, error = "ok", EXIT_OK, None
    trace, agreed = None, False
    try:
        try:
            session.open_run_dir()
            with comm_trace.recording(rt.rank) as trace:  # the test suite's, else nothing
                code = body(session)
            status = "ok" if code == EXIT_OK else "wrong"
        except RunFailure as e:
            status, code, error, agreed = e.status, e.exit_code, str(e), e.agreed
        except KeyboardInterrupt:
            status, code = "interrupted", EXIT_INTERRUPTED
            error = f"interrupted in {session.current}"
        except OSError as e:
            status, code = "failed", EXIT_FAILED
            where = e.filename or session.run_dir
            what = f"cannot write {where}" if where else f"{session.current} failed"
            error = f"{what}: {e.strerror or one_line(e, _ERROR_CHARS)} (in {session.current})"
        except Exception as e:
            status, code = "failed", EXIT_FAILED
            error = f"{session.current} failed: {type(e).__name__}: {one_line(e, _ERROR_CHARS)}"
    # outside the handlers above: the launcher's SIGTERM also comes while one of them runs (a
    # peer died, this rank's collective failed, and the agent stops the rest), seen in CI
    except Terminated as e:
        cause = f" while handling: {one_line(e.__context__, _ERROR_CHARS)}" if e.__context__ else ""
        status, code = "terminated", for_signal(e.signum)
        error = f"stopped by {signal.Signals(e.signum).name} in {session.current}{cause}"
    finally:
        _ignore_stop_signals()
        session.watchdog.disarm()
        agreed = agreed or status in AGREED
        if trace is not None:  # the test suite's record: never a reason to lose run.json
            try:
                trace.dump(complete=agreed)
            except OSError as e:
                print(f"distbench: rank {rt.rank}: cannot write the trace: {e}",
                      file=sys.stderr, flush=True)
        status, code = session._end(status, code, error, agreed=agreed)
    if agreed:
        # Every rank is alive: leave together, so none closes its connections while a peer's
        # background threads still use them (seen: std::terminate in a rank's teardown), and
        # none exits non-zero (slow links) while rank 0 still writes run.json: the launcher
        # would SIGTERM it. A peer stopped now holds the others --timeout at most: run.json
        # already says how the run ended.
        with _exit_if_stuck(opts.timeout + ROLL_CALL_GRACE_S, code, "leaving with the others",
                            session.rt.rank):
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
                     phase: str) -> tuple[str, int, str | None]:
    """How the run ended, once the roll call has said which ranks are gone: a lost rank is the
    cause of whatever this rank saw (a reset connection, a launcher's SIGTERM), so the run
    failed; a timeout or a Ctrl-C stays what it was, and names them."""
    if status == "timeout":
        return status, code, f"{error}: {describe_lost(lost, phase) if lost else NO_LOST_RANK}"
    if not lost:
        return status, code, error
    if status == "interrupted":
        return status, code, f"{error}; {describe_lost(lost, phase)}"
    return "failed", EXIT_FAILED, describe_lost(lost, phase)
