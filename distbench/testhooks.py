"""Faults on demand, for the test suite only: they let tests prove that a wrong result, a stalled
rank and a dead rank are caught. Each is off unless its environment variable is set."""

from __future__ import annotations

import os
import signal
import time

CORRUPT_RANK = "DISTBENCH_TEST_CORRUPT_RANK"  # "1": rank 1 flips an element before the check
STALL = "DISTBENCH_TEST_STALL"  # "1:65536": rank 1 hangs when it reaches that size in bytes
DIE = "DISTBENCH_TEST_DIE"  # "1:65536": rank 1 is SIGKILLed when it reaches that size
SLOW_SEND = "DISTBENCH_TEST_SLOW_SEND"  # "2:0.002": rank 2 waits 2 ms before every p2p send


def _at(var: str, rank: int, size: int) -> bool:
    value = os.environ.get(var)
    if not value:
        return False
    want_rank, _, want_size = value.partition(":")
    return int(want_rank) == rank and int(want_size) == size


def before_measurement(rank: int, size: int) -> None:
    if _at(DIE, rank, size):
        os.kill(os.getpid(), signal.SIGKILL)
    if _at(STALL, rank, size):
        time.sleep(3600)


def corrupt(rank: int, tensor) -> None:
    if tensor is not None and tensor.numel() and os.environ.get(CORRUPT_RANK) == str(rank):
        tensor.view(-1)[0] += 1


def slow_send(rank: int) -> None:
    value = os.environ.get(SLOW_SEND)
    if value:
        want_rank, _, seconds = value.partition(":")
        if int(want_rank) == rank:
            time.sleep(float(seconds))
