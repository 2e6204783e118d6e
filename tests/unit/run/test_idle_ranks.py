"""Ranks that sit a pattern out (the odd rank of a ping-pong, the ranks off the link the p2p
matrix measures) while the others measure, and what could end them though nothing is wrong: a
collective they queue long before the others reach it (ProcessGroupNCCL, and gloo too, time a
collective from when a rank enters it), their own watchdog's budget, and NCCL's watchdog taking
the process down before distbench can say how the run ended.
The tests that start processes: test_idle_ranks_multiproc.py."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from fake_group import run_ranks
from run_helpers import CPU, _settings

from distbench.bench import measure
from distbench.ops.case import Case, idle
from distbench.run import runtime


class _HostBarrier:
    """Peers.wait_on_host for thread ranks: a barrier per name, through the host."""

    def __init__(self):
        self.lock = threading.Lock()
        self.arrived: dict[str, int] = {}
        self.waits: list[tuple[str, int]] = []

    def wait_on_host(self, name: str, members: int, timeout_s: float) -> bool:
        with self.lock:
            self.arrived[name] = self.arrived.get(name, 0) + 1
            self.waits.append((name, members))
        deadline = time.monotonic() + timeout_s
        while self.arrived[name] < members:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True


def _traced(monkeypatch, log: list, lock) -> None:
    """Every collective a rank enters, in order with the ops (after run_ranks' patches)."""
    for name in ("all_reduce", "barrier"):
        real = getattr(dist, name)

        def entered(*args, _real=real, **kwargs):
            with lock:
                log.append(("collective", dist.get_rank()))
            return _real(*args, **kwargs)
        monkeypatch.setattr(dist, name, entered)


def test_an_idle_rank_queues_no_collective_while_the_others_measure(monkeypatch):
    """Ranks 0 and 1 measure 10 ops of 10 ms, rank 2 sits out: it waits on the host (not in a
    collective) until they are done, and gives the loop the same time they do."""
    log: list = []
    lock = threading.Lock()
    peers = _HostBarrier()
    steps: list = []

    def active(rank: int) -> Case:
        def run():
            time.sleep(0.01)
            with lock:
                log.append(("op", rank))
        return Case(run=run, prepare=lambda: None, check=lambda: 0, output=None)

    def body(rank: int):
        run_ranks_patched.wait()
        case = idle() if rank == 2 else active(rank)
        mine = SimpleNamespace(wait_on_host=peers.wait_on_host)  # a rank's own Peers
        return measure.measure_case(_settings(rank, mine, steps), case, "x", 8)

    run_ranks_patched = threading.Barrier(3, action=lambda: _traced(monkeypatch, log, lock))
    stats = run_ranks(monkeypatch, 3, body)
    # at each of rank 0's timed ops (its first is the warmup), rank 2 has entered no more
    # collectives than rank 0: none waits for the others' loop to end
    entered, ahead, ops = {0: 0, 2: 0}, [], 0
    for kind, rank in log:
        if kind == "collective" and rank in entered:
            entered[rank] += 1
        elif (kind, rank) == ("op", 0):
            ops += 1
            if ops > 1 and entered[2] > entered[0]:
                ahead.append(ops)
    assert ops == 11 and ahead == [], log
    assert len({(w, n) for w, n in peers.waits}) == 1 and peers.waits[0][1] == 3
    assert stats[0] == stats[2] and stats[0].iters == 10 and stats[0].slowest_rank in (0, 1)
    loop = {rank: seconds for rank, what, seconds in steps if what == "x"}
    assert loop[2] == loop[0] == loop[1] >= 0.1 + 2 * 10 * 0.01  # the slowest rank's estimate


# -- on real gloo processes: a process-group timeout shorter than the active ranks' loop ------


# -- NCCL's watchdog must not take the process down before the run is ended ------------------

@pytest.mark.parametrize("given, used", [
    (None, "2"),  # torch's default, 3, tears the process down
    ("1", "2"),  # what torchrun and torch's launcher API put in every worker's environment
    ("3", "2"),
    ("0", "0"),  # modes that never tear down are the user's
    ("2", "2"),
])
def test_nccl_errors_do_not_tear_the_process_down(monkeypatch, given, used):
    var = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    if given is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, given)
    seen = {}

    class Started(Exception):
        pass

    def init_process_group(backend, **kwargs):
        seen[backend] = os.environ.get(var)
        raise Started

    me = {"rank": 0, "host": "h", "machine": "m", "node_key": "k", "local_rank": 0,
          "device": "cpu", "gpu_uuid": None, "gpu_bus_id": None, "pid": 1}

    class FakePeers:
        rank, world, store = 0, 1, None

        def agree_to_start(self, mine, timeout_s, snapshot=None):
            return [{**me, **mine}]

    monkeypatch.setattr(runtime.Peers, "connect", classmethod(lambda cls, t: FakePeers()))
    monkeypatch.setattr(runtime, "resolve_backend", lambda choice: choice)
    monkeypatch.setattr(runtime, "_device", lambda backend, local_rank: CPU)
    monkeypatch.setattr(runtime.topo_probe, "node_snapshot", lambda: {})
    monkeypatch.setattr(runtime.dist, "init_process_group", init_process_group)
    with pytest.raises(Started):
        runtime.start("nccl", 60, {})
    assert seen == {"nccl": used}
    monkeypatch.setenv(var, "1")
    with pytest.raises(Started):
        runtime.start("gloo", 60, {})
    assert seen["gloo"] == "1"  # not NCCL's business: left as it was
