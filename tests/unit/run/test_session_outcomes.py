"""How a run ends, decided in session.run, without a process group: each outcome of the body
(a real signal included) maps to its exit code and run.json status. Fast: one rank, faked
start, os._exit turned into SystemExit."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from distbench.core.options import build
from distbench.kinds.collective.options import CollectiveOptions
from distbench.results import writer
from distbench.run import session
from distbench.run.peers import Lost
from distbench.run.runtime import RunFailure, Runtime


@pytest.fixture
def rt() -> Runtime:
    """The runtime one_rank's session starts with (a test may give it peers)."""
    return Runtime(0, 1, 0, "gloo", torch.device("cpu"),
                   ranks=[{"rank": 0, "host": "h", "node": 0, "local_rank": 0, "device": "cpu"}])


@pytest.fixture
def one_rank(monkeypatch, tmp_path, rt):
    monkeypatch.setattr(session, "start", lambda *a: rt)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)

    def exit_(code):
        raise SystemExit(code)
    monkeypatch.setattr(session.os, "_exit", exit_)
    monkeypatch.delenv("DISTBENCH_RUN_DIR", raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    yield build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    for s, h in handlers.items():
        signal.signal(s, h)


def _run(opts, body) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as exc:
        session.run("collective", opts, body)
    (run_json,) = opts.out.glob("*/run.json")
    return exc.value.code, json.loads(run_json.read_text())


def _signal_self(signum):
    def body(s):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler interrupts this
        return 0
    return body


class _FailsAsTheLauncherStopsUs(RuntimeError):
    """A collective's error (a peer died) whose text is read as the launcher's SIGTERM lands:
    the signal arrives while session.run handles the failure."""

    signalled = False

    def __str__(self):
        if not self.signalled:  # the launcher sends one SIGTERM
            self.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
        return "Connection reset by peer"


def test_the_launchers_sigterm_while_a_failure_is_handled_still_ends_the_run(one_rank):
    def body(s):
        raise _FailsAsTheLauncherStopsUs()
    got_code, meta = _run(one_rank, body)
    assert (got_code, meta["status"], meta["exit_code"]) == (143, "terminated", 143)
    said = meta["error"]
    # the signal and the step first, then the failure it interrupted
    assert said.startswith("stopped by SIGTERM in startup"), said
    assert said.endswith("handling: Connection reset by peer") and "\n" not in said, said


GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
               "Connection closed by peer [127.0.0.1]:5549. This is typically caused by a "
               "remote worker crashing. Check the logs of the remote worker before reporting "
               "an error. GLHF! \U0001f3d6\ufe0f")


def _says_what_gloo_saw_not_its_advice(said: str) -> None:
    """results.md's promise for run.json's error: the library's error as it said it, without
    gloo's C++ source line and its advice, on one line."""
    assert "Connection closed by peer [127.0.0.1]:5549." in said, said
    assert "pair.cc" not in said and "typically caused" not in said and "GLHF" not in said, said
    assert "\n" not in said, said


class _GlooFailsAsTheLauncherStopsUs(_FailsAsTheLauncherStopsUs):
    def __str__(self):
        super().__str__()
        return GLOO_CLOSED


def test_a_sigterm_while_a_gloo_error_is_handled_says_what_gloo_saw_not_its_advice(one_rank):
    def body(s):
        raise _GlooFailsAsTheLauncherStopsUs()
    got_code, meta = _run(one_rank, body)
    assert (got_code, meta["status"]) == (143, "terminated")
    said = meta["error"]
    assert said.startswith("stopped by SIGTERM in startup"), said
    _says_what_gloo_saw_not_its_advice(said)


def test_a_gloo_error_is_said_without_gloos_source_line_and_advice(one_rank):
    def body(s):
        raise RuntimeError(GLOO_CLOSED)
    got_code, meta = _run(one_rank, body)
    assert (got_code, meta["status"]) == (3, "failed")
    said = meta["error"]
    assert said.startswith("startup failed: RuntimeError: "), said
    _says_what_gloo_saw_not_its_advice(said)


@pytest.mark.parametrize("body,code,status", [
    (lambda s: 0, 0, "ok"),
    (lambda s: 1, 1, "wrong"),
    (lambda s: (_ for _ in ()).throw(RunFailure("x", status="slow_links", exit_code=4)), 4,
     "slow_links"),
    (lambda s: (_ for _ in ()).throw(ValueError("boom")), 3, "failed"),
    (lambda s: (_ for _ in ()).throw(KeyboardInterrupt()), 130, "interrupted"),
    (_signal_self(signal.SIGINT), 130, "interrupted"),
    (_signal_self(signal.SIGTERM), 143, "terminated"),
    (_signal_self(signal.SIGHUP), 129, "terminated"),
    (_signal_self(signal.SIGQUIT), 131, "terminated"),
], ids=["ok", "wrong", "slow-links", "error", "keyboard-interrupt", "sigint", "sigterm",
        "sighup", "sigquit"])
def test_each_ending_has_its_code_and_status(one_rank, body, code, status):
    got_code, meta = _run(one_rank, body)
    assert (got_code, meta["status"], meta["exit_code"]) == (code, status, code)
    assert meta["end_utc"]
    if code in (129, 131, 143):
        assert signal.Signals(code - 128).name in meta["error"]


def test_an_orphaned_worker_ends_terminated_143(one_rank):
    """The watchdog's path when the launcher was SIGKILLed: exit code and run.json (read inside
    the body: the faked os._exit returns, a real one would not)."""
    seen = {}

    def body(s):
        try:
            s._orphaned(12345)
        except SystemExit as e:
            seen["code"] = e.code
            seen["meta"] = json.loads((s.run_dir / "run.json").read_text())
        return 0
    _run(one_rank, body)
    meta = seen["meta"]
    assert (seen["code"], meta["status"], meta["exit_code"]) == (143, "terminated", 143)
    assert "the launcher (pid 12345) is gone" in meta["error"]


STEP = "all_reduce 64 KiB float32 (warmup)"
DEAD = Lost(0, "h", 0, "dead")


@pytest.mark.parametrize("status,code,error,lost,want", [
    ("failed", 3, "x failed: RuntimeError: Connection reset by peer", [DEAD],
     ("failed", 3, f"rank 0 (h:0) died during {STEP}")),
    ("terminated", 143, "stopped by SIGTERM in x", [DEAD],
     ("failed", 3, f"rank 0 (h:0) died during {STEP}")),
    ("timeout", 3, "timed out after 5 s in x on rank 1", [Lost(2, "h", 2, "stopped")],
     ("timeout", 3, f"timed out after 5 s in x on rank 1: rank 2 (h:2) was suspended (SIGSTOP "
                    f"or a debugger) during {STEP}")),
    ("timeout", 3, "timed out after 5 s in x on rank 1", [],
     ("timeout", 3, f"timed out after 5 s in x on rank 1: {session.NO_LOST_RANK}")),
    ("interrupted", 130, "interrupted in x", [DEAD],
     ("interrupted", 130, f"interrupted in x; rank 0 (h:0) died during {STEP}")),
    ("failed", 3, "x failed: ValueError: boom", [],
     ("failed", 3, "x failed: ValueError: boom")),
], ids=["peer-error", "launcher-sigterm", "timeout-stopped", "timeout-all-answer",
        "interrupted", "local-failure"])
def test_lost_ranks_decide_how_the_run_ended(status, code, error, lost, want):
    assert session._with_lost_ranks(status, code, error, lost, STEP) == want


class _FakePeers:
    """What a roll call found: rank 0 gone, ranks 1 and 2 answered."""

    def __init__(self, run_dir):
        self._run_dir = run_dir
        self.phase = ""

    def roll_call(self):
        return [1, 2], [DEAD]

    def first_timeout(self):
        return None

    def run_dir(self):
        return str(self._run_dir)


@pytest.mark.parametrize("rank,finishes", [(1, True), (2, False)])
def test_the_lowest_rank_left_finishes_run_json_when_rank_0_is_gone(tmp_path, monkeypatch,
                                                                     capsys, rank, finishes):
    monkeypatch.delenv("DISTBENCH_RUN_DIR", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = writer.RunRecord(run_dir, "collective", {}, [])
    record.update()  # as rank 0 left it: "running"
    opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    rt = Runtime(rank, 3, rank, "gloo", torch.device("cpu"), peers=_FakePeers(run_dir))
    s = session.Session("collective", opts, rt)
    s.current = STEP
    s._end("failed", 3, f"{STEP} failed: RuntimeError: Connection reset by peer")
    meta = json.loads((run_dir / "run.json").read_text())
    err = capsys.readouterr().err
    if finishes:
        assert (meta["status"], meta["exit_code"]) == ("failed", 3)
        assert meta["error"] == f"rank 0 (h:0) died during {STEP}"
        assert meta["lost_ranks"] == [{"rank": 0, "host": "h", "local_rank": 0,
                                       "state": "dead", "name": "h:0"}]
        assert meta["failed_step"] == STEP
        assert err == f"distbench: rank 1: error: rank 0 (h:0) died during {STEP}\n"
    else:  # one voice: rank 1's
        assert meta["status"] == "running" and err == ""


def test_under_our_own_launcher_the_workers_leave_the_telling_to_it(tmp_path, monkeypatch,
                                                                     capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer.RunRecord(run_dir, "collective", {}, []).update()
    monkeypatch.setenv("DISTBENCH_RUN_DIR", str(run_dir))
    opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    rt = Runtime(1, 3, 1, "gloo", torch.device("cpu"), peers=_FakePeers(run_dir))
    session.Session("collective", opts, rt)._end("failed", 3, "x")
    assert capsys.readouterr().err == ""
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


class _RankOneGone:
    step = ""

    def roll_call(self):
        return [0], [Lost(1, "h", 1, "dead")]

    def first_timeout(self):
        return None

    def run_dir(self):
        return None

    def end(self):
        pass


def test_the_process_exits_with_the_code_run_json_says(one_rank, rt):
    """SIGTERM from the launcher because rank 1 died: the roll call makes it a failure (3),
    and the process's own code is that one too, not the signal's 143."""
    rt.peers = _RankOneGone()
    code, meta = _run(one_rank, _signal_self(signal.SIGTERM))
    assert (code, meta["status"], meta["exit_code"]) == (3, "failed", 3)
    assert meta["lost_ranks"] == [{"rank": 1, "host": "h", "local_rank": 1, "state": "dead",
                                   "name": "h:1"}]


@pytest.mark.parametrize("error,code", [(session.Terminated(signal.SIGTERM), 143),
                                        (KeyboardInterrupt(), 130)],
                         ids=["sigterm", "sigint"])
def test_a_stop_during_startup_ends_with_its_code_not_a_traceback(monkeypatch, tmp_path, error,
                                                                  code):
    def start(*args):
        raise error
    monkeypatch.setattr(session, "start", start)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
        assert session.run("collective", opts, lambda s: 0) == code
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_the_launchers_sigterm_while_a_refusal_is_marked_ends_with_the_refusal(monkeypatch,
                                                                              tmp_path):
    """Node 1 refused its options; rank 0 of node 0, told so at startup, marks run.json while
    waiting to see whether its launcher is gone, and its agent's SIGTERM lands then (the
    node's other rank ended first). Seen in CI as a traceback: the refusal's exit code and a
    truthful run.json, not the signal's."""
    refusal = "node vm (node rank 1) refused the options: --dtype: unknown value 'flaot32'"

    def start(*args):
        raise RunFailure(refusal, status="bad_input", exit_code=2)

    def settling(settle_s):
        os.kill(os.getpid(), signal.SIGTERM)  # the agent stops this rank now
        time.sleep(0.2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer.RunRecord(run_dir, "collective", {}, []).update()
    monkeypatch.setattr(session, "start", start)
    monkeypatch.setattr(session.lifeline, "leave_if_orphaned", settling)
    monkeypatch.setenv("DISTBENCH_RUN_DIR", str(run_dir))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        opts = build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
        assert session.run("collective", opts, lambda s: 0) == 2
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"], meta["error"]) == ("bad_input", 2, refusal)


def test_our_launcher_blames_a_death_seen_first_not_one_it_caused(tmp_path, capsys):
    """Rank 1 fails (exit 3); rank 0, stuck in a device wait, is SIGKILLed by the agent at the
    end of its grace, seconds later: rank 1's failure is the one to report."""
    from types import SimpleNamespace

    from distbench.run import launch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = writer.RunRecord(run_dir, "collective", {}, [])
    record.update()
    failures = {1: SimpleNamespace(exitcode=3, timestamp=100),
                0: SimpleNamespace(exitcode=-9, timestamp=106)}
    assert launch._workers_failed(record, failures) == 3
    meta = json.loads((run_dir / "run.json").read_text())
    said = meta["error"]
    # rank 1's own exit blamed, not rank 0's SIGKILL that followed it
    assert "rank 1 " in said and said.endswith("code 3") and "-9" not in said, said
    assert "died" not in capsys.readouterr().err
    # a death seen first is the cause, and is named with its signal
    record.update(status="running")
    failures = {1: SimpleNamespace(exitcode=-9, timestamp=100),
                0: SimpleNamespace(exitcode=3, timestamp=101)}
    launch._workers_failed(record, failures)
    assert "rank 1 (" in json.loads((run_dir / "run.json").read_text())["error"]
