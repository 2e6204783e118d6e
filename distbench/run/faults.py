"""Faults on demand, for the test suite: a wrong result, a stalled rank, a dead rank and slow
links, so tests can prove each is caught; and fake nodes, so tests can judge many nodes in few
processes. Read from the environment once per run, when the session starts (the fake nodes when
the ranks are grouped into nodes, runtime.start); the engine applies the faults at one point
(Faults.apply), so nothing here runs in timed code unless a fault was asked for, and ops and
the parallel/ wrappers know nothing of it.

    DISTBENCH_TEST_CORRUPT_RANK=1        rank 1 flips an element of what its check reads
    DISTBENCH_TEST_STALL=1:65536         rank 1 hangs when it reaches that size in bytes
    DISTBENCH_TEST_DIE=1:65536           rank 1 is SIGKILLed when it reaches that size
    DISTBENCH_TEST_STALL_JOIN=1          rank 1 never joins: it hangs before the process group
                                         exists, and its peers wait in the rendezvous
    DISTBENCH_TEST_FAIL=0:first steps    rank 0 fails (a RuntimeError that reads as CUDA's out of
                                         memory) as it starts a guarded part of a training step
                                         whose label holds the text (steps.recipe.attempt):
                                         torch refusing on one rank while its peers go on
    DISTBENCH_TEST_SLOW_SEND=2:0.002     rank 2 waits 2 ms before every op in which it sends
    DISTBENCH_TEST_SLOW_RANK=2:0.002     rank 2 waits 2 ms before every op in which it sends or
                                         receives: slow in both directions, like a bad NIC
    DISTBENCH_TEST_SLOW_RANK=2,3:0.1     ranks 2 and 3 do: every rank of a node with a bad NIC
                                         (STALL, DIE and SLOW_SEND take lists too)
    DISTBENCH_TEST_SLOW_FROM=3           the SLOW_RANK or SLOW_SEND delay starts at watch's
                                         cycle 3 (0-based): a rank that turns slow mid-run
    DISTBENCH_TEST_NODE_SIZE=2           each launcher's ranks count as nodes of 2 local ranks
                                         (local ranks 0-1, 2-3, ...): many nodes of several
                                         ranks in few processes, where a torchrun agent per
                                         node would start too many on a test machine
    DISTBENCH_TEST_HOST=n1               this rank counts as running on node n1, set rank by
                                         rank: `mpirun --map-by node` faked on one machine
                                         (Open MPI gives no node index, so ranks are grouped
                                         by machine). Only the grouping changes: the rank's
                                         host and machine, which process lookups read, stay
                                         the real ones

The training-step commands have no ops of their own to wrap: dp asks before_collective() for
the delay and puts it ahead of every gradient all-reduce (a DDP comm hook) and of every
all-reduce it replays alone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

PREFIX = "DISTBENCH_TEST_"
CORRUPT_RANK = PREFIX + "CORRUPT_RANK"
STALL = PREFIX + "STALL"
DIE = PREFIX + "DIE"
SLOW_SEND = PREFIX + "SLOW_SEND"
SLOW_RANK = PREFIX + "SLOW_RANK"
NODE_SIZE = PREFIX + "NODE_SIZE"
HOST = PREFIX + "HOST"
STALL_JOIN = PREFIX + "STALL_JOIN"
FAIL = PREFIX + "FAIL"
SLOW_FROM = PREFIX + "SLOW_FROM"


def _rank_and(value: str | None, rank: int, kind: type) -> object | None:
    """"R:X" or "R,R,...:X" -> X (as `kind`) when this rank is one of them, else None."""
    if not value:
        return None
    want_ranks, _, rest = value.partition(":")
    return kind(rest) if rank in {int(r) for r in want_ranks.split(",")} else None


def stall_before_join(rank: int, env: Mapping[str, str] = os.environ) -> None:
    """DISTBENCH_TEST_STALL_JOIN: a rank that never joins the run, as a node that hangs while
    its workers start; only its launcher's death or a signal ends it."""
    if rank in {int(r) for r in env.get(STALL_JOIN, "").split(",") if r.strip()}:
        while True:
            time.sleep(3600)


def fake_node(local_rank: int, env: Mapping[str, str] = os.environ) -> str:
    """What tells this rank's fake node apart from the others of its launcher under
    DISTBENCH_TEST_NODE_SIZE (its local rank's group), or "" without it: runtime adds it to the
    key that groups ranks into nodes."""
    size = env.get(NODE_SIZE)
    return f"|fake node {local_rank // int(size)}" if size else ""


def fake_host(env: Mapping[str, str] = os.environ) -> str:
    """The node this rank believes it runs on under DISTBENCH_TEST_HOST, or "" without it:
    runtime adds it to the key that groups ranks into nodes, and nowhere else."""
    host = env.get(HOST)
    return f"|fake host {host}" if host else ""


@dataclass(frozen=True)
class Faults:
    corrupt: bool = False
    stall_at: int | None = None  # size in bytes
    die_at: int | None = None
    delay_s: float = 0.0  # before each op this rank takes part in...
    delay_on_receive: bool = False  # ...as a sender, or as a receiver too
    fail_in: str | None = None  # a guarded part whose label holds this text fails
    slow_from: int = 0  # watch's first cycle with the delay

    @classmethod
    def from_env(cls, rank: int, env: Mapping[str, str] = os.environ) -> Faults:
        both = _rank_and(env.get(SLOW_RANK), rank, float)
        send = _rank_and(env.get(SLOW_SEND), rank, float)
        return cls(corrupt=env.get(CORRUPT_RANK) == str(rank),
                   stall_at=_rank_and(env.get(STALL), rank, int),
                   die_at=_rank_and(env.get(DIE), rank, int),
                   delay_s=both or send or 0.0, delay_on_receive=both is not None,
                   fail_in=_rank_and(env.get(FAIL), rank, str),
                   slow_from=int(env.get(SLOW_FROM) or 0))

    @property
    def any(self) -> bool:
        return self != Faults()

    def apply(self, case, size: int):
        """The case as this rank should run it at `size`: the same object when no fault applies
        (the timed loop then calls the op itself, nothing between)."""
        if size == self.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if size == self.stall_at:
            time.sleep(3600)
        changes = {}
        if self.delay_s and (case.sends or (self.delay_on_receive and case.receives)):
            changes["run"] = _delayed(case.run, self.delay_s)
        if self.corrupt and case.output is not None:
            changes["check"] = _corrupting(case.check, case.output)
        return replace(case, **changes) if changes else case

    def before_collective(self):
        """A function that waits this rank's delay (an all-reduce both sends and receives), or
        None when no delay was asked for."""
        if not self.delay_s:
            return None
        return lambda: time.sleep(self.delay_s)

    def fail(self, label: str) -> None:
        """Raise as torch does when a GPU runs out of memory, in the part named `label`."""
        if self.fail_in and self.fail_in in label:
            raise RuntimeError(f"CUDA out of memory (planted by {FAIL} in {label})")

    def corrupt_tensor(self, tensor) -> None:
        """For checks that compare with a reference outside the engine (tp, pp)."""
        if self.corrupt:
            _flip(tensor)


def _delayed(run, seconds: float):
    def slow_run():
        time.sleep(seconds)
        return run()
    return slow_run


def _flip(tensor) -> None:
    if tensor is not None and tensor.numel():
        tensor.view(-1)[0] += 1


def _corrupting(check, output):
    def corrupt_then_check():
        _flip(output)
        return check()
    return corrupt_then_check
