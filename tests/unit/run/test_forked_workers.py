"""run/forked_workers.py: a worker forked from the launcher starts as exec would have started it
(its own session, default signal handlers, an empty signal mask, no inherited descriptor, only
the environment it was given, unbuffered output), ends with the code or signal a fresh
interpreter would have ended with, and is what torch's agent starts for distbench's command
line only. What the child runs is replaced here by a probe (runpy.run_module, which the child
calls as `python -m distbench` would); every self-launched multi-process test runs the real one.
The tests that start processes: test_forked_workers_multiproc.py."""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.subprocess_handler import (
    subprocess_handler as handler,
)

from distbench.run import forked_workers


def test_install_imports_what_the_workers_would_each_import(monkeypatch):
    """Command.preload: imported once by the launcher, before any worker is forked."""
    monkeypatch.setattr(handler.SubprocessHandler, "_popen", handler.SubprocessHandler._popen)
    monkeypatch.delitem(sys.modules, "xml.dom.minidom", raising=False)
    forked_workers.install(("xml.dom.minidom",))
    assert "xml.dom.minidom" in sys.modules


def test_workers_are_forked_only_on_a_machine_without_a_gpu(monkeypatch):
    """On a GPU host the launcher has initialized CUDA (resolve_backend asks torch), and a gloo
    worker forked from it failed on the first H100 that ran dp and step: "CUDA error:
    initialization error". There every worker is a fresh interpreter, gloo's too."""
    from distbench.platform import env, limits
    from distbench.run import launch

    monkeypatch.delenv(env.FORK_ENV, raising=False)
    monkeypatch.setattr(limits, "nvidia_devices", lambda: False)
    assert launch.forks_workers("gloo")
    assert not launch.forks_workers("nccl")
    monkeypatch.setenv(env.FORK_ENV, "0")
    assert not launch.forks_workers("gloo")
    monkeypatch.delenv(env.FORK_ENV)
    monkeypatch.setattr(limits, "nvidia_devices", lambda: True)
    assert not launch.forks_workers("gloo")
