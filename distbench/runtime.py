"""The process group and what every rank needs to know about the others: backend, device,
which ranks share a node, and that all ranks were started with the same options."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from distbench import faults, topo
from distbench.exitcodes import EXIT_BAD_INPUT, EXIT_FAILED
from distbench.options import OptionError
from distbench.peers import Peers, StartFailure, machine_key, node_name

# Our watchdog ends a stalled run at --timeout; the process group's own timeout only backs it up.
PG_TIMEOUT_GRACE_S = 30
# On an NCCL error (a peer lost on another node) or timeout, ProcessGroupNCCL's watchdog thread
# takes the whole process down in modes 1 (what torchrun and torch's launcher API put in every
# worker's environment) and 3 (torch's default): no roll call, and run.json left "running". In
# mode 2 it aborts the communicators and the main thread's next NCCL call raises, which ends the
# run as any failure does. Modes 0 and 2 never tear down: a user's choice of them is kept.
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


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
    snapshots: list[dict] = field(default_factory=list)  # one per node, on rank 0 only
    peers: Peers | None = None  # None only in tests that fake a runtime

    @property
    def nnodes(self) -> int:
        return len({r["node"] for r in self.ranks})

    def versions(self) -> dict:
        """What ran, and from where: on a GPU cluster the torch (and NCCL) that matter are the
        ones the workloads use, often a container's, not one installed for distbench."""
        nccl = None
        if self.backend == "nccl":
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        return {"torch": torch.__version__, "torch_path": os.path.dirname(torch.__file__),
                "cuda": torch.version.cuda, "nccl": nccl,
                "nccl_library": loaded_library("libnccl") if nccl else None}


def loaded_library(name: str) -> str | None:
    """The file this process loaded a shared library from (Linux): torch's bundled NCCL, or the
    system's when LD_LIBRARY_PATH or LD_PRELOAD points there."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line and name in line}
    except OSError:
        return None
    found = sorted(p for p in paths if os.path.basename(p).startswith(name))
    return found[0] if found else None


def node_names(ranks: list[dict]) -> list[str]:
    """Each node (by index) by its host name, or host#index where hosts repeat (several launcher
    agents on one host, as the tests run them): what reports name a node by."""
    hosts: dict[int, str] = {}
    for r in ranks:
        hosts.setdefault(r["node"], r["host"])
    repeated = len(set(hosts.values())) < len(hosts)
    return [f"{hosts[i]}#{i}" if repeated else hosts[i] for i in sorted(hosts)]


def rank_names(ranks: list[dict]) -> list[str]:
    """Each rank as node:local_rank (host:local_rank on a cluster)."""
    nodes = node_names(ranks)
    return [f"{nodes[r['node']]}:{r['local_rank']}" for r in ranks]


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def pick_gpu(local_rank: int, local_world: int, count: int, visible: str | None) -> int:
    """The GPU a local rank takes: its own index among the visible GPUs, or GPU 0 when each
    task sees one GPU (Slurm's per-task binding: that two tasks do not share it is checked at
    startup, by UUID). Fewer GPUs than local ranks otherwise would put two ranks on one GPU,
    which NCCL refuses later with "Duplicate GPU": refused here, with the counts."""
    if local_rank < count or count == 1:
        return local_rank if local_rank < count else 0
    seen = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else \
        "CUDA_VISIBLE_DEVICES unset"
    raise RunFailure(f"local rank {local_rank} has no GPU of its own: {count} GPUs visible "
                     f"({seen}) for {local_world} ranks on this node; start at most {count} "
                     "ranks per node, or make each rank's GPU visible to it",
                     status="bad_input", exit_code=EXIT_BAD_INPUT)


def _device(backend: str, local_rank: int) -> torch.device:
    if backend != "nccl":
        return torch.device("cpu")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
    index = pick_gpu(local_rank, local_world, torch.cuda.device_count(),
                     os.environ.get("CUDA_VISIBLE_DEVICES"))
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def gpu_identity(device: torch.device) -> dict:
    """The physical GPU behind a device, as NVML and nvidia-smi name it: under
    CUDA_VISIBLE_DEVICES or a scheduler's binding, "cuda:0" names a different GPU per rank."""
    if device.type != "cuda":
        return {"gpu_uuid": None, "gpu_bus_id": None}
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    bus = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    return {"gpu_uuid": f"GPU-{uuid}" if uuid is not None else None,
            "gpu_bus_id": None if None in bus else f"{bus[0]:08x}:{bus[1]:02x}:{bus[2]:02x}.0"}


def start(backend_choice: str, timeout_s: float, identity: dict,
          check_backend: Callable[[str], None] | None = None) -> Runtime:
    """Join the run: agree with every rank that it can start (the same options, none refused),
    then set up the process group. Raises RunFailure, on every rank alike, when it cannot.
    check_backend: the options' rules for the backend `auto` resolves to (OptionError)."""
    pg_timeout = timeout_s + PG_TIMEOUT_GRACE_S
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        peers = Peers.connect(pg_timeout)
    except (dist.DistError, ValueError) as e:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise RunFailure(f"cannot reach the launcher's store at {where}: "
                         f"{str(e).strip().splitlines()[0]}") from None
    mine: dict = {"rank": peers.rank, "node_name": node_name(), "pid": os.getpid()}
    refusal = None
    try:
        backend = resolve_backend(backend_choice)
        try:
            if check_backend is not None:
                check_backend(backend)
        except OptionError as e:
            raise RunFailure(str(e), status="bad_input", exit_code=EXIT_BAD_INPUT) from None
        device = _device(backend, local_rank)
        mine.update({
            "host": socket.gethostname(),
            "machine": machine_key(),
            # two torchrun agents on one host (a test of multi-node runs) count as two nodes,
            # and so do a launcher's groups of local ranks under the test suite's fake nodes,
            # and ranks the test suite places on fake hosts (host and machine stay real)
            "node_key": f"{machine_key()}|{os.environ.get('GROUP_RANK', '')}"
                        + faults.fake_node(local_rank) + faults.fake_host(),
            "local_rank": local_rank,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            **gpu_identity(device),
            "options": _digest(identity),
            "identity": identity,
        })
    except RunFailure as e:
        if e.status != "bad_input":
            raise
        refusal = e
        mine["refused"] = str(e)
    snapshot = topo.node_snapshot() if local_rank == 0 and refusal is None else None
    try:
        everyone = peers.agree_to_start(mine, timeout_s, snapshot)
    except StartFailure as e:
        if refusal is not None:  # say it in our own words on the node that refused
            raise refusal from None
        raise RunFailure(str(e), status="bad_input" if e.refused else "failed",
                         exit_code=EXIT_BAD_INPUT if e.refused else EXIT_FAILED) from None
    kwargs: dict = {"timeout": timedelta(seconds=pg_timeout)}
    if backend == "nccl":
        kwargs["device_id"] = device
        if os.environ.get(NCCL_ERROR_HANDLING) not in ("0", "2"):
            os.environ[NCCL_ERROR_HANDLING] = "2"  # read when the process group is made
    dist.init_process_group(backend, store=peers.store, rank=peers.rank,
                            world_size=peers.world, **kwargs)
    nonce = [uuid.uuid4().hex if peers.rank == 0 else None]
    dist.broadcast_object_list(nonce, src=0)  # once per run
    peers.begin_run(nonce[0])
    peers.listen()
    rt = Runtime(peers.rank, peers.world, local_rank, backend, device, peers=peers)
    nodes: dict[str, int] = {}
    for e in everyone:
        nodes.setdefault(e["node_key"], len(nodes))
    rt.ranks = [{"rank": e["rank"], "host": e["host"], "node": nodes[e["node_key"]],
                 "local_rank": e["local_rank"], "device": e["device"], "pid": e["pid"],
                 "gpu_uuid": e["gpu_uuid"], "gpu_bus_id": e["gpu_bus_id"]}
                for e in everyone]
    rt.snapshots = topo.dedupe_by_node(peers.snapshots()) if peers.rank == 0 else []
    return rt


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
