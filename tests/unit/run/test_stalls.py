"""Every wait honours --timeout: a rank stopped mid-loop, one that never starts, a startup that
hangs, a store that stops answering while the run ends. The run ends at --timeout plus the
documented margin (docs/results.md, "How long a stalled run takes to end"), run.json says
`timeout`, and the rows measured before are kept; and whichever rank's watchdog fires first,
the run ends the same way. The tests that start processes: test_stalls_multiproc.py."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.core.options import build
from distbench.kinds.collective.options import CollectiveOptions
from distbench.platform import env
from distbench.results import writer
from distbench.run import peers, runtime, session
from distbench.run.peers import Peers
from distbench.run.runtime import Runtime, Watchdog

pytestmark = pytest.mark.clock  # watchdogs, stalls and endings waited out on real time

# -- one run, one ending: the first rank to time out decides -----------------------------------

@pytest.fixture(scope="module")
def server():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


def _peers(server, rank: int, world: int = 2) -> Peers:
    return Peers(server, rank, world, own=dist.PrefixStore(peers._prefix(world), server))


def test_the_first_timeout_said_is_every_ranks_ending(server):
    ranks = [_peers(server, r) for r in range(2)]
    nonce = uuid.uuid4().hex
    for p in ranks:
        p.begin_run(nonce)
    assert ranks[0].first_timeout() is None
    assert ranks[1].timed_out("timed out after 3 s in x (setup) on rank 1", "x (setup)") is None
    first = {"rank": 1, "error": "timed out after 3 s in x (setup) on rank 1",
             "step": "x (setup)"}
    assert ranks[0].first_timeout() == first
    # rank 0's own watchdog, a moment later: rank 1's came first
    assert ranks[0].timed_out("timed out after 3 s in x (warmup) on rank 0", "x") == first
    assert ranks[1].first_timeout() is None  # its own: nothing to take from anyone


class _AfterRank1TimedOut:
    """Rank 0's view once rank 1's watchdog fired and rank 1 left: everyone had answered the
    roll call, and rank 1 said it timed out."""

    rank = 0
    step = ""

    def roll_call(self):
        return [0, 1], []

    def first_timeout(self):
        return {"rank": 1, "step": "all_reduce 64 KiB float32 sum in-place (setup)",
                "error": "timed out after 3 s in all_reduce 64 KiB float32 sum in-place (setup) "
                         f"on rank 1: {session.NO_LOST_RANK}"}

    def timed_out(self, error, step):
        return self.first_timeout()

    def publish_run_dir(self, path):
        pass


@pytest.mark.parametrize("status,code,error", [
    ("failed", 3, "all_reduce 64 KiB (warmup) failed: RuntimeError: Connection closed by peer"),
    ("terminated", 143, "stopped by SIGTERM in all_reduce 64 KiB (warmup)"),
    ("timeout", 3, "timed out after 3 s in all_reduce 64 KiB (warmup) on rank 0"),
], ids=["connection-closed", "launcher-sigterm", "own-timeout-later"])
def test_rank_0_ends_the_run_as_the_rank_that_timed_out_first(tmp_path, monkeypatch, capsys,
                                                              status, code, error):
    """What rank 0 saw after rank 1 timed out and left (the connection it closed, the
    launcher's SIGTERM, or its own watchdog a moment later) is not how the run ended: run.json
    says timeout, in rank 1's words, and rank 0 does not say it a second time."""
    monkeypatch.delenv(env.RUN_DIR_ENV, raising=False)
    opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    rt = Runtime(0, 2, 0, "gloo", torch.device("cpu"), peers=_AfterRank1TimedOut())
    s = session.Session("collective", opts, rt)
    s.open_run_dir()
    s.current = "all_reduce 64 KiB float32 sum in-place (warmup)"
    assert s._end(status, code, error) == ("timeout", 3)
    meta = json.loads((s.run_dir / "run.json").read_text())
    first = _AfterRank1TimedOut().first_timeout()
    assert (meta["status"], meta["exit_code"], meta["error"]) == ("timeout", 3, first["error"])
    assert "error" not in capsys.readouterr().err


def test_a_ctrl_c_stays_one_after_a_timeout_elsewhere(tmp_path, monkeypatch):
    monkeypatch.delenv(env.RUN_DIR_ENV, raising=False)
    opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    rt = Runtime(0, 2, 0, "gloo", torch.device("cpu"), peers=_AfterRank1TimedOut())
    s = session.Session("collective", opts, rt)
    s.open_run_dir()
    assert s._end("interrupted", 130, "interrupted in x") == ("interrupted", 130)


# -- the watchdog watches the loop, not only the clock ----------------------------------------

@pytest.fixture
def fine_ticks(monkeypatch):
    """The watchdog looking five times as often as in a run: a fifth of its lag, so that these
    tests' budgets, and their waits, can be a few tenths of a second."""
    monkeypatch.setattr(runtime, "TICK_S", 0.02)


def _watch(stall_s: float, progress) -> tuple[Watchdog, list, threading.Event]:
    fired: list = []
    done = threading.Event()

    def expire(what, seconds):
        fired.append((what, seconds, time.monotonic()))
        done.set()
    return Watchdog(expire, progress, stall_s), fired, done


def test_a_loop_that_stops_moving_ends_at_the_stall_not_its_budget(fine_ticks):
    """A loop with 60 s of budget, whose stamps stop coming after 0.4 s: it ends 0.3 s later
    (the stall allowance, --timeout in a run), naming the allowance."""
    progress = timing.Progress()
    dog, fired, done = _watch(0.3, progress)
    dog.arm(60, "all_reduce 1 MiB")
    progress.begin()
    progress.stamps = stamps = [0.0] * 1000
    for i in range(40):  # 0.4 s of progress, longer than the allowance
        time.sleep(0.01)
        stamps[i] = time.perf_counter()
        stalled_at = time.monotonic()
    assert done.wait(5)
    what, seconds, when = fired[0]
    assert (what, seconds) == ("all_reduce 1 MiB", 0.3)
    assert 0.3 <= when - stalled_at <= 0.3 + 0.5


def test_a_wait_outside_the_loop_has_the_steps_budget(fine_ticks):
    """Between repetitions (a rank done with its loop waits on the host for the others'), the
    loop does not move and nothing is stuck: only the step's budget ends it."""
    progress = timing.Progress()
    dog, fired, done = _watch(0.1, progress)
    dog.arm(0.4, "pingpong (waiting for the others)")
    progress.begin()
    progress.end()
    armed_at = time.monotonic()
    assert done.wait(5)
    assert fired[0][:2] == ("pingpong (waiting for the others)", 0.4)
    assert fired[0][2] - armed_at >= 0.4


def test_a_loop_that_keeps_moving_outlasts_its_budget_and_the_wait_after_it_has_it(fine_ticks):
    """The budget is an estimate (twice the loop's expected time, from the warmup): a loop
    slower than that on a busy machine, but moving, is not stuck. The wait after it, on the
    host for the others, has the budget."""
    progress = timing.Progress()
    dog, fired, done = _watch(0.3, progress)
    dog.arm(0.25, "long loop")
    progress.begin()
    progress.stamps = stamps = [0.0] * 200
    for i in range(90):  # 0.9 s: over three budgets, three stall allowances
        stamps[i] = time.perf_counter()
        time.sleep(0.01)
    assert not fired
    progress.end()
    waits_from = time.monotonic()
    assert done.wait(5)
    assert fired[0][:2] == ("long loop", 0.25)
    assert 0.25 - 0.1 <= fired[0][2] - waits_from <= 0.25 + 0.3


def test_a_gpu_loop_moves_at_the_hosts_waits():
    progress = timing.Progress()
    progress.begin()
    before = progress()
    progress.synced = 40
    assert progress() != before and progress()[1] == 40
    progress.end()
    assert progress() is None


# -- startup, and ending the run ----------------------------------------------------------------

def test_a_startup_that_hangs_ends_at_the_timeout_and_says_so(tmp_path, monkeypatch, capsys):
    """Process-group setup waits on a rank that stopped after the startup posts: the startup's
    watchdog ends the process --timeout later, with one line, and run.json says timeout."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer.RunRecord(run_dir, "collective", {}, []).update()
    monkeypatch.setenv(env.RUN_DIR_ENV, str(run_dir))
    monkeypatch.setenv("RANK", "0")
    exited: list[int] = []
    gone = threading.Event()

    def exit_(code):
        exited.append(code)
        gone.set()  # the thread that called it then ends, as the process would
    monkeypatch.setattr(session.os, "_exit", exit_)

    def start(backend, timeout_s, identity, check_backend, phase):
        phase(1.0, "startup (process group setup)")
        assert gone.wait(10)
        raise session.Terminated(signal.SIGTERM)  # what the launcher sends next
    monkeypatch.setattr(session, "start", start)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        opts = build(CollectiveOptions, {"out": str(tmp_path), "timeout": 1.0}, argv=[])
        session.run("collective", opts, lambda s: 0)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    said = "timed out after 1 s in startup (process group setup) on rank 0"
    assert exited == [3]
    assert capsys.readouterr().err == f"distbench: rank 0: error: {said}\n"
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"], meta["error"]) == ("timeout", 3, said)


def test_a_store_that_stops_answering_cannot_hold_the_ending(tmp_path, monkeypatch):
    """The roll call goes through the launcher's store; one that stops answering (its host
    stopped) would hold the rank for as long as its connection's timeout, run.json unwritten:
    ENDING_S later the rank writes it with what it knows."""
    monkeypatch.setattr(session, "ENDING_S", 0.5)
    monkeypatch.delenv(env.RUN_DIR_ENV, raising=False)
    released = threading.Event()

    class Hung:
        rank, step = 0, ""

        def roll_call(self):
            released.wait(10)
            return None

        def timed_out(self, error, step):
            return None

        def publish_run_dir(self, path):
            pass

    opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    rt = Runtime(0, 2, 0, "gloo", torch.device("cpu"), peers=Hung())
    s = session.Session("collective", opts, rt)
    s.open_run_dir()
    start = time.monotonic()
    try:
        assert s._end("timeout", 3, "timed out after 5 s in x on rank 0") == ("timeout", 3)
        assert time.monotonic() - start < 2
    finally:
        released.set()
    meta = json.loads((s.run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("timeout", 3)
    assert meta["error"] == f"timed out after 5 s in x on rank 0: {session.NO_LOST_RANK}"


def test_a_peer_stopped_at_the_last_barrier_holds_a_finished_run_timeout_at_most(monkeypatch,
                                                                                 capsys):
    """A run that ended well leaves through one barrier with every rank: a peer stopped just
    then holds it --timeout (plus the listeners' grace) at most, and it leaves with its code."""
    exited: list[int] = []
    gone = threading.Event()

    def exit_(code):
        exited.append(code)
        gone.set()
    monkeypatch.setattr(session.os, "_exit", exit_)
    with session._exit_if_stuck(0.3, 4, "leaving with the others", 1):
        assert gone.wait(5)
    assert exited == [4]
    assert capsys.readouterr().err == ("distbench: rank 1: error: still leaving with the others "
                                       "after 0.3 s; leaving with exit code 4\n")


def test_measure_shows_the_watchdog_each_repetition_and_nothing_between(monkeypatch):
    seen = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: seen.append(timing.LOOP()))
    begun = timing.LOOP.loops
    timing.measure(lambda: seen.append(timing.LOOP()), 4, torch.device("cpu"), reps=2,
                   settle=lambda: seen.append(timing.LOOP()))
    loop = begun + 1
    assert seen == [(loop, 0, 0), (loop, 0, 1), (loop, 0, 2), None,  # barrier, 2 ops, settle
                    (loop + 1, 0, 0), (loop + 1, 0, 1), (loop + 1, 0, 2), None]
    assert timing.LOOP() is None
