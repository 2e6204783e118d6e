"""run/forked_workers.py with real launchers and workers: a forked worker starts, ends and
dies of signals as exec would have it, and a run forked throughout measures and says what a
fresh one does. The rest: test_forked_workers.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing.subprocess_handler import (
    subprocess_handler as handler,
)

from distbench.run import forked_workers
from distbench.run.forked_workers import ForkedWorker

ARGV = ["collective", "--sizes", "4K"]


def _probe(seen, then=None):
    """In place of `python -m distbench`, in the child: what it started with, written to
    `seen` whole (a test that waits for it to appear reads it as the child runs on); then
    `then()`."""

    def run_module(name, run_name=None, alter_sys=False):
        opened = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                opened[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass  # the listing's own descriptor, closed by now
        partial = seen.with_name(seen.name + ".partial")
        partial.write_text(json.dumps({
            "module": [name, run_name, alter_sys], "argv": sys.argv[1:],
            "session": [os.getsid(0), os.getpgid(0), os.getpid()], "env": dict(os.environ),
            "opened": opened,
            "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "sigint_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            "write_through": [sys.stdout.write_through, sys.stderr.write_through]}))
        os.replace(partial, seen)
        if then is not None:
            then()

    return run_module


@pytest.mark.procs(1)
def test_a_forked_worker_starts_as_exec_would_have_started_it(tmp_path, monkeypatch):
    seen, marker = tmp_path / "seen.json", tmp_path / "launcher-only"
    monkeypatch.setattr(forked_workers.runpy, "run_module", _probe(seen))
    # what the launcher holds as it forks: torch's agent's handlers, a blocked signal, a
    # descriptor of its own
    previous = signal.signal(signal.SIGTERM, lambda *a: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    held = os.open(marker, os.O_WRONLY | os.O_CREAT)
    try:
        worker = ForkedWorker(ARGV, {"RANK": "1", "ONLY": "this"}, None, None, {})
        assert worker.wait(timeout=60) == 0
    finally:
        os.close(held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGTERM, previous)
    got = json.loads(seen.read_text())
    assert got["module"] == ["distbench", "__main__", True]
    assert got["argv"] == ARGV
    sid, pgid, pid = got["session"]
    assert sid == pgid == pid == worker.pid  # torch's agent stops it with killpg
    assert got["env"] == {"RANK": "1", "ONLY": "this"}
    assert set(got["opened"]) <= {"0", "1", "2"}, got["opened"]
    assert str(marker) not in got["opened"].values()
    assert got["sigterm_default"] and got["sigint_raises"]
    assert got["blocked"] == []
    assert got["write_through"] == [True, True]


@pytest.mark.procs(1)
@pytest.mark.parametrize("raised,code", [(SystemExit(0), 0), (SystemExit(None), 0),
                                         (SystemExit(3), 3), (SystemExit("why"), 1),
                                         (RuntimeError("boom"), 1), (None, 0)])
def test_a_forked_worker_ends_with_the_code_an_interpreter_would(tmp_path, monkeypatch, capfd,
                                                                 raised, code):
    def then():
        if raised is not None:
            raise raised

    monkeypatch.setattr(forked_workers.runpy, "run_module", _probe(tmp_path / "seen", then))
    worker = ForkedWorker(ARGV, {}, None, None, {})
    assert worker.wait(timeout=60) == code == worker.poll()
    err = capfd.readouterr().err
    if isinstance(raised, RuntimeError):
        assert "RuntimeError: boom" in err  # the traceback, as an interpreter prints it
    if raised is not None and raised.args == ("why",):
        assert "why" in err


@pytest.mark.procs(1)
def test_a_forked_worker_dies_of_the_signals_a_fresh_one_would(tmp_path, monkeypatch):
    """SIGTERM to its process group (how torch's agent stops workers) kills it: the launcher's
    handler is gone. An uncaught KeyboardInterrupt ends it by SIGINT, as in an interpreter."""
    import time

    monkeypatch.setattr(forked_workers.runpy, "run_module",
                        _probe(tmp_path / "seen", lambda: time.sleep(60)))
    worker = ForkedWorker(ARGV, {}, None, None, {})
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(timeout=0.3)
    assert worker.poll() is None
    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=30) == -signal.SIGTERM

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(forked_workers.runpy, "run_module",
                        _probe(tmp_path / "seen", interrupted))
    assert ForkedWorker(ARGV, {}, None, None, {}).wait(timeout=30) == -signal.SIGINT


@pytest.mark.procs(1)
def test_a_worker_stopped_as_it_is_born_does_not_hang_the_launcher(tmp_path, monkeypatch):
    """A SIGSTOP that lands before the child could lead its own session: the launcher goes on
    at once with the child leading a group of its own (the agent's killpg reaches it), and the
    child, continued, runs as any other. The launcher waited on it forever before (CI, in
    test_stalls' rank that never starts)."""
    import time

    setsid = os.setsid

    def stopped_first():
        os.kill(os.getpid(), signal.SIGSTOP)
        setsid()

    seen = tmp_path / "seen.json"
    monkeypatch.setattr(forked_workers.runpy, "run_module", _probe(seen))
    monkeypatch.setattr(os, "setsid", stopped_first)
    began = time.monotonic()
    worker = ForkedWorker(ARGV, {}, None, None, {})
    try:
        assert time.monotonic() - began < 10
        assert worker.poll() is None and not seen.exists()  # still stopped
        assert os.getpgid(worker.pid) == worker.pid
        os.killpg(worker.pid, signal.SIGCONT)
        assert worker.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        worker.poll()
    _, pgid, pid = json.loads(seen.read_text())["session"]
    assert pgid == pid == worker.pid


@pytest.mark.procs(1)
def test_only_distbench_workers_are_forked(tmp_path, monkeypatch):
    """install(): torch's agent forks `python -u -m distbench ...`, and starts any other
    command line (a numactl wrapper, say) as it always did."""
    monkeypatch.setattr(handler.SubprocessHandler, "_popen", handler.SubprocessHandler._popen)
    monkeypatch.setattr(forked_workers.runpy, "run_module", _probe(tmp_path / "seen"))
    forked_workers.install()
    installed = handler.SubprocessHandler._popen
    forked_workers.install()
    assert handler.SubprocessHandler._popen is installed  # not wrapped twice
    ours = handler.SubprocessHandler(sys.executable, ("-u", "-m", "distbench", *ARGV), {},
                                     None, None, 0, None)
    other = handler.SubprocessHandler(sys.executable, ("-c", "pass"), {}, None, None, 0, None)
    assert isinstance(ours.proc, ForkedWorker)
    assert isinstance(other.proc, subprocess.Popen)
    assert ours.proc.wait(timeout=60) == 0 and other.proc.wait(timeout=60) == 0
    assert json.loads((tmp_path / "seen").read_text())["argv"] == ARGV


@pytest.mark.multiproc
def test_a_run_forked_throughout_measures_and_says_what_a_fresh_one_does(tmp_path):
    """The suite's usual run (its launcher forked by the fork server, tests/forkserver.py, its
    workers forked from the launcher) against the path every GPU run takes and the suite's
    self-launched runs otherwise never do: a fresh launcher, fresh worker interpreters
    (DISTBENCH_FORK_WORKERS=0). Both measure right, and say so alike."""
    from helpers import distbench

    args = ("collective", "--op", "all_reduce,all_gather", "--sizes", "4K", "--iters", "3",
            "--warmup", "1", "--workers", "2")
    forked = distbench(tmp_path / "forked", *args, cwd=tmp_path)
    fresh = distbench(tmp_path / "fresh", *args, cwd=tmp_path, fresh=True,
                      DISTBENCH_FORK_WORKERS="0")
    for res in (forked, fresh):
        assert res.code == 0, res.stderr
        assert [(r["op"], r["size_bytes"], r["wrong"]) for r in res.rows()] == [
            ("all_reduce", "4096", "0"), ("all_gather", "4096", "0")]
        assert res.meta()["status"] == "ok"
    assert forked.meta()["argv"][:-1] == fresh.meta()["argv"][:-1]
    # the table's header, and what it said on stderr but where it wrote
    assert forked.stdout.splitlines()[:2] == fresh.stdout.splitlines()[:2]
    assert forked.stderr.replace(str(forked.out), "OUT").splitlines()[0] == \
        fresh.stderr.replace(str(fresh.out), "OUT").splitlines()[0]


class _Stopped(Exception):
    """What torch's agent raises from its SIGTERM handler (SignalException)."""


_SIGNAL_AT_FORK: list[bool] = []


def _sigterm_self_at_fork() -> None:
    if _SIGNAL_AT_FORK:
        _SIGNAL_AT_FORK.clear()
        os.kill(os.getpid(), signal.SIGTERM)


os.register_at_fork(before=_sigterm_self_at_fork)  # inert until a test arms it


@pytest.mark.procs(1)
def test_a_stop_signal_as_a_worker_is_forked_is_raised_after_the_fork_not_lost(tmp_path,
                                                                             monkeypatch):
    """The launcher's SIGTERM landing while a worker is forked: the agent's handler raised inside
    the fork's hooks, where Python prints "Exception ignored" and drops it, and the launcher ran
    on (watch to its --count, or forever). It is raised once the worker is forked."""
    seen = tmp_path / "seen.json"
    monkeypatch.setattr(forked_workers.runpy, "run_module", _probe(seen))

    def stopped(signum, frame):
        raise _Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        _SIGNAL_AT_FORK.append(True)
        with pytest.raises(_Stopped):
            ForkedWorker(ARGV, {}, None, None, {})
    finally:
        _SIGNAL_AT_FORK.clear()
        signal.signal(signal.SIGTERM, previous)
    deadline = time.monotonic() + 60
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = json.loads(seen.read_text())["session"][2]  # the worker was forked and ran
    os.waitpid(pid, 0)
