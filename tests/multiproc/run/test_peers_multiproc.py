"""What ranks tell each other through the store, with real processes: a stopped process and one
elsewhere told apart, and this machine's process states. On threads: test_peers.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from run_helpers import _gone_pid, _post, _world, own_keys, tcp_server

from distbench.run import peers


@pytest.fixture(scope="module")
def server():
    return tcp_server()


@pytest.fixture
def store(server, monkeypatch):
    return own_keys(server, monkeypatch)


def _dead_pid() -> int:
    """A process that ran and ended (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.procs(1)
def test_a_stopped_process_and_one_elsewhere_are_told_apart(store):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        time.sleep(0.2)
        elsewhere = _post(2, machine="another-host|boot")
        ranks = _world(store, [_post(0), _post(1, pid=sleeper.pid), elsewhere])
        _, lost = ranks[0].roll_call(grace_s=0.5)
        assert [(x.rank, x.state) for x in lost] == [(1, "stopped"), (2, "silent")]
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.procs(1)
def test_the_process_state_of_this_machine():
    assert peers.process_state(os.getpid()) == "running"
    assert peers.process_state(_dead_pid()) == "dead"
    assert peers.process_state(_gone_pid()) == "dead"
