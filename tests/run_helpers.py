"""Shared by the run box's tests (tests/unit/run/, tests/multiproc/run/): a real TCPStore in
the test's process and the peers that talk through it, and a rank's measurement settings."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

from distbench.bench import measure
from distbench.run import peers
from distbench.run.peers import Peers

CPU = torch.device("cpu")


def _settings(rank: int, peers, steps: list, **opts) -> measure.Settings:
    return measure.Settings(
        device=CPU, peers=peers, phase=lambda what, seconds: steps.append((rank, what, seconds)),
        **{"timeout": 0.1, "warmup": 1, "iters": 10, "min_time": 0.0, "check": False,
           "cuda_graph": False, "reps": 1, **opts})


def tcp_server() -> dist.TCPStore:
    """A store in the test's process, for a module's `server` fixture: one for the module,
    outliving every client, as a launcher's does (a process that opens many store connections
    sees some stall for seconds, whatever their server)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


def own_keys(server: dist.TCPStore, monkeypatch) -> dist.TCPStore:
    """The server, with keys of this test's own (as a launcher's restart would give)."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", uuid.uuid4().hex)
    return server


def _peers(master, rank: int, world: int) -> Peers:
    return Peers(master, rank, world, own=dist.PrefixStore(peers._prefix(world), master))


def _post(rank: int, pid: int | None = None, **extra) -> dict:
    return {"rank": rank, "host": socket.gethostname(), "machine": peers.machine_key(),
            "local_rank": rank, "pid": pid or os.getpid(), "options": "same",
            "identity": {"sizes": [1024]}, "node_name": "vm", **extra}


def _gone_pid() -> int:
    """A process id with no process, as a dead rank's is once reaped, without starting one:
    pid_max itself, which the kernel never hands out."""
    return int(open("/proc/sys/kernel/pid_max").read())


def _world(master, posts: list[dict]) -> list[Peers]:
    ranks = [_peers(master, r, len(posts)) for r in range(len(posts))]
    for p in ranks:
        p.everyone = posts
    return ranks
