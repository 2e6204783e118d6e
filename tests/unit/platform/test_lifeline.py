"""platform/lifeline.py, in this process, with the parent's death played by os.getppid: a rank
whose startup fails because its launcher was SIGKILLed (the store it held reset the
connection) sees the launcher gone, though the kernel re-parents it a moment after the error,
and says so instead of leaving run.json "running". The real deaths: test_launcher_death."""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist

import distbench.cli.app as app
from distbench.core.exitcodes import EXIT_TERMINATED
from distbench.platform import lifeline

pytestmark = pytest.mark.clock  # the settle after a parent's death, waited out on real time
LAUNCHER = 4242


@pytest.fixture
def launcher_dies(monkeypatch):
    """This process's parent is LAUNCHER until `die(after_s)` is called: `after_s` later it is
    init, as for an orphan. What the lifeline then does is recorded, not done."""
    died_at: list[float] = []
    left: list[int] = []
    monkeypatch.setattr(lifeline, "_parent", LAUNCHER)
    monkeypatch.setattr(os, "getppid", lambda: 1 if died_at and
                        time.monotonic() >= died_at[0] else LAUNCHER)

    def leave():
        left.append(lifeline._parent)
        raise SystemExit(EXIT_TERMINATED)

    monkeypatch.setattr(lifeline, "_leave", leave)

    def die(after_s: float) -> None:
        died_at.append(time.monotonic() + after_s)

    die.left = left
    return die


def test_a_parent_gone_a_moment_after_the_failure_is_seen_within_the_settle(launcher_dies):
    launcher_dies(0.1)
    assert lifeline.orphaned() is None  # what a look at once sees: not yet re-parented
    assert lifeline.orphaned(settle_s=lifeline.WATCH_INTERVAL_S) == LAUNCHER


def test_a_living_parent_is_not_orphaned_however_long_one_looks(launcher_dies):
    start = time.monotonic()
    assert lifeline.orphaned(settle_s=0.2) is None
    assert time.monotonic() - start >= 0.2
    lifeline.leave_if_orphaned(0.1)
    assert launcher_dies.left == []


def test_a_rank_whose_startup_fails_as_its_launcher_dies_leaves_as_terminated(launcher_dies,
                                                                               monkeypatch):
    """The store's reset reaches the rank first (a DistNetworkError out of its startup); the
    lifeline, given the moment, names the lost launcher as the cause."""

    def startup(args, argv):
        launcher_dies(0.1)
        raise dist.DistNetworkError("Connection reset by peer")

    monkeypatch.setattr(app, "_run_app", startup)
    with pytest.raises(SystemExit) as ended:
        app.main(["collective"])
    assert ended.value.code == EXIT_TERMINATED
    assert launcher_dies.left == [LAUNCHER]


def test_a_rank_that_fails_with_its_launcher_alive_keeps_its_own_error(launcher_dies,
                                                                       monkeypatch):
    def startup(args, argv):
        raise dist.DistNetworkError("Connection reset by peer")

    monkeypatch.setattr(app, "_run_app", startup)
    with pytest.raises(dist.DistNetworkError):
        app.main(["collective"])
    assert launcher_dies.left == []
