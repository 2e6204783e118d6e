"""The suite's own rules (tests/helpers.py, tests/conftest.py): a test that starts a process is
marked so, and the processes the tests start, however many pytest processes run them, stay
within MAX_PROCESSES at once."""

from __future__ import annotations

import subprocess
import threading
import time

import helpers
import pytest


def test_an_unmarked_test_cannot_start_a_process():
    """This test is not marked multiproc: `make test-fast` runs it, so it may start nothing,
    and the refusal comes before the fork."""
    with pytest.raises(AssertionError, match="is not marked multiproc"):
        subprocess.run(["true"], check=True)


@pytest.mark.parametrize("args,procs", [
    (("collective", "--sizes", "4K"), 3),  # 2 workers on CPU, and the launcher
    (("p2p", "--workers", "3"), 4),
    (("tp", "--workers=4"), 5),
    (("dp", "--workers", "x"), 1),  # refused before any worker
    (("report", "results/run"), 1),
    (("compare", "a", "b"), 1),
    (("topo",), 1),
    (("accept", "--dry-run", "--nodes", "128", "--gpus-per-node", "8"), 1),
    (("collective", "--help"), 1),
])
def test_a_run_counts_its_launcher_and_workers(args, procs):
    assert helpers.processes_of(args) == procs


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A pool of this test's own, so that the suite's runs beside it take nothing from it."""
    monkeypatch.setattr(helpers, "SLOTS_DIR", tmp_path)
    return tmp_path


@pytest.mark.clock
def test_slots_beyond_the_pool_wait_for_a_run_to_end(pool):
    """5 held: a run of 4 waits until they are given back; one of 3 goes at once."""
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold_five():
        with helpers.processes(5):
            holding.set()
            release.wait(10)
            order.append("five done")

    def run(n: int):
        with helpers.processes(n):
            order.append(f"{n} started")

    first = threading.Thread(target=hold_five)
    first.start()
    assert holding.wait(10)
    run(3)
    assert order == ["3 started"]
    second = threading.Thread(target=run, args=(4,))
    second.start()
    time.sleep(0.3)
    assert order == ["3 started"]  # 5 + 4 > MAX_PROCESSES: still waiting
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["3 started", "five done", "4 started"]


def test_a_test_that_reserved_its_slots_cannot_start_more(pool, monkeypatch):
    monkeypatch.setattr(helpers._Budget, "reserved", 3)
    with helpers.processes(3):
        pass
    with pytest.raises(AssertionError, match=r"reserved 3: mark it procs\(4\)"):
        with helpers.processes(4):
            pass


def test_no_run_may_take_more_than_the_machine_allows(pool):
    with pytest.raises(AssertionError, match="more than 8"):
        with helpers.processes(helpers.MAX_PROCESSES + 1):
            pass
