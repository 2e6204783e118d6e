"""A watch probe's drain, run for real: it names the node as Slurm does. The probe measured on
ranks as threads: test_watch_probe.py."""

from __future__ import annotations

import os
import socket

import pytest
from fake_session import FakeSession, fake_runtime
from watch_helpers import _straggler_judged

from distbench.kinds.watch.loop import _drain, node_name


@pytest.mark.procs(1)  # the fake scontrol
def test_the_drain_names_the_node_as_slurm_does(tmp_path, monkeypatch, one_rank_group):
    """The node in the argv and the straggler's place in the reason are SLURMD_NODENAME's, as
    slurmd hands it to its health check and srun to its tasks (the host may be called
    otherwise, and scontrol refuses a name it does not know)."""
    calls = tmp_path / "scontrol.calls"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {calls}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")
    s = FakeSession(fake_runtime())
    _drain(s, _straggler_judged())
    argv = calls.read_text().splitlines()
    reason = "Reason=distbench: straggler rank 0 (gpu7): 9891 us late in all_reduce 1 MiB"
    assert argv == ["update", "NodeName=gpu7", "State=drain", reason]
    monkeypatch.delenv("SLURMD_NODENAME")
    assert node_name() == socket.gethostname().split(".")[0]
