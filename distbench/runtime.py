"""The process group and what every rank needs to know about the others: backend, device,
which ranks share a node, and that all ranks were started with the same options."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from distbench import topo
from distbench.exitcodes import EXIT_BAD_INPUT, EXIT_FAILED

# Our watchdog ends a stalled run at --timeout; the process group's own timeout only backs it up.
PG_TIMEOUT_GRACE_S = 30


class RunFailure(Exception):
    """A failure with a known cause: one line for the user, a status for run.json."""

    def __init__(self, message: str, status: str = "failed", exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.status = status
        self.exit_code = exit_code


def resolve_backend(choice: str) -> str:
    cuda = torch.cuda.is_available()
    if choice == "auto":
        return "nccl" if cuda else "gloo"
    if choice == "nccl" and not cuda:
        raise RunFailure("--backend: nccl needs CUDA GPUs and none is visible here "
                         "(example: --backend gloo)", status="bad_input", exit_code=EXIT_BAD_INPUT)
    return choice


@dataclass
class Runtime:
    rank: int
    world: int
    local_rank: int
    backend: str
    device: torch.device
    ranks: list[dict] = field(default_factory=list)  # per rank: host, node, local_rank, device
    snapshots: list[dict] = field(default_factory=list)  # one topology snapshot per node

    @property
    def nnodes(self) -> int:
        return len({r["node"] for r in self.ranks})

    def versions(self) -> dict:
        nccl = None
        if self.backend == "nccl":
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}


def _node_key() -> str:
    """hostname + boot id as nccl-tests hashes them, plus the launcher's node rank so that two
    torchrun agents on one host (a test of multi-node runs) count as two nodes."""
    snap_boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            snap_boot = f.read().strip()
    except OSError:
        pass
    return f"{socket.gethostname()}|{snap_boot}|{os.environ.get('GROUP_RANK', '')}"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def start(backend_choice: str, timeout_s: float, identity: dict) -> Runtime:
    backend = resolve_backend(backend_choice)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        # Slurm and some launchers give each task only its own GPU: local rank 3 sees GPU 0.
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    kwargs: dict = {"timeout": timedelta(seconds=timeout_s + PG_TIMEOUT_GRACE_S)}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(backend, **kwargs)
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = Runtime(rank, world, local_rank, backend, device)
    # Once per run, so a Python-object gather is fine here (never per measurement).
    mine = {
        "rank": rank,
        "host": socket.gethostname(),
        "node_key": _node_key(),
        "local_rank": local_rank,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "options": _digest(identity),
        "identity": identity,
        "snapshot": topo.node_snapshot() if local_rank == 0 else None,
    }
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    _refuse_mismatched_options(everyone, rank)
    nodes: dict[str, int] = {}
    for r in everyone:
        r["node"] = nodes.setdefault(r.pop("node_key"), len(nodes))
        r.pop("identity")
        r.pop("options")
    rt.snapshots = topo.dedupe_by_node([r["snapshot"] for r in everyone if r["snapshot"]])
    for r in everyone:
        r.pop("snapshot")
    rt.ranks = everyone
    return rt


def _refuse_mismatched_options(everyone: list[dict], rank: int) -> None:
    ref = everyone[0]
    odd = [r for r in everyone if r["options"] != ref["options"]]
    if not odd:
        return
    first = odd[0]
    keys = sorted(k for k in set(ref["identity"]) | set(first["identity"])
                  if ref["identity"].get(k) != first["identity"].get(k))
    detail = ", ".join(f"{k}: rank 0 has {ref['identity'].get(k)!r}, rank {first['rank']} has "
                       f"{first['identity'].get(k)!r}" for k in keys)
    raise RunFailure(f"ranks were started with different options ({len(odd)} of "
                     f"{len(everyone)} ranks differ from rank 0; {detail})",
                     status="bad_input", exit_code=EXIT_BAD_INPUT)


class Watchdog:
    """Ends a run whose ranks stop making progress, or whose launcher is gone (SIGKILLed: it
    could not stop us, and an orphan would run on and report success). Runs beside the main
    thread, which may be blocked inside a collective (GIL released) at that moment."""

    def __init__(self, on_expire: Callable[[str, float], None],
                 on_orphaned: Callable[[int], None]):
        self._on_expire = on_expire
        self._on_orphaned = on_orphaned
        self._parent = os.getppid()
        self._deadline: float | None = None
        self._what = ""
        self._seconds = 0.0
        threading.Thread(target=self._watch, name="distbench-watchdog", daemon=True).start()

    def arm(self, seconds: float, what: str) -> None:
        self._what, self._seconds = what, seconds
        self._deadline = time.monotonic() + seconds

    def disarm(self) -> None:
        self._deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            if os.getppid() != self._parent:  # reparented: the launcher died
                self._on_orphaned(self._parent)
                return
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                self._on_expire(self._what, self._seconds)
                return
