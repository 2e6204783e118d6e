"""The process group and what every rank needs to know about the others: backend, device,
which ranks share a node, and that all ranks were started with the same options."""

from __future__ import annotations

import bisect
import hashlib
import json
import math
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

from distbench.core.errors import one_line
from distbench.core.exitcodes import EXIT_BAD_INPUT, EXIT_FAILED
from distbench.core.options import OptionError
from distbench.platform import env, topo_probe
from distbench.run import faults
from distbench.run.peers import READ_WAIT_S, Peers, StartFailure, machine_key, node_name, rank_names
from distbench.run.peers import node_names as node_names  # where reports import it from

# Our watchdog ends a stalled run at --timeout; the process group's own timeout only backs it up.
PG_TIMEOUT_GRACE_S = 30
# How often the watchdog looks: a part of the margin past --timeout (docs/results.md).
TICK_S = 0.1
# Startup waits for every rank with a timeout of its own, whose message names the missing ranks
# (and a rank that refused its options waits for the others to read why): the watchdog, which
# only backs that wait up, gives it this long past that.
START_SLACK_S = 2.0
# A rank that fails in a guarded part of a training step (steps.recipe) posts why; while some
# rank has not reached the part's end (a pipeline stage waiting in a receive on the failed one),
# every rank ends the run this long after seeing the post, unless all have reached it by then
# (the part is skipped and the run goes on). Long enough for the peers that are not waiting on
# it to finish the part: a build and two steps. How often a rank looks: once a second, through
# a store connection of its own, while it is in such a part.
FAILURE_GRACE_S = 15.0
FAILURE_POLL_S = 1.0
# On an NCCL error (a peer lost on another node) or timeout, ProcessGroupNCCL's watchdog thread
# takes the whole process down in modes 1 (what torchrun and torch's launcher API put in every
# worker's environment) and 3 (torch's default): no roll call, and run.json left "running". In
# mode 2 it aborts the communicators and the main thread's next NCCL call raises, which ends the
# run as any failure does. Modes 0 and 2 never tear down: a user's choice of them is kept.
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


class RunFailure(Exception):
    """A failure with a known cause: one line for the user, a status for run.json."""

    def __init__(self, message: str, status: str = "failed", exit_code: int = EXIT_FAILED,
                 agreed: bool = False):
        super().__init__(message)
        self.status = status
        self.exit_code = exit_code
        # every rank raised it at the same point, alive (watch's stop, agreed by a collective):
        # no roll call, and the ranks leave together as after an agreed verdict
        self.agreed = agreed


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
    local_world = env.local_world_size() or local_rank + 1
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
          check_backend: Callable[[str], None] | None = None,
          phase: Callable[[float, str], None] | None = None) -> Runtime:
    """Join the run: agree with every rank that it can start (the same options, none refused),
    then set up the process group. Raises RunFailure, on every rank alike, when it cannot.
    check_backend: the options' rules for the backend `auto` resolves to (OptionError). phase:
    a watchdog's arm(seconds, what), told each part of the startup and how long it may take."""
    phase = phase or (lambda seconds, what: None)
    pg_timeout = timeout_s + PG_TIMEOUT_GRACE_S
    local_rank = env.local_rank()
    where = env.store_address()
    phase(timeout_s, f"startup (reaching the launcher's store at {where})")
    try:
        peers = Peers.connect(pg_timeout)
    except (dist.DistError, ValueError) as e:
        raise RunFailure(f"cannot reach the launcher's store at {where}: "
                         f"{one_line(e)}") from None
    # Local work, not a wait on peers: no deadline of ours (the others' wait for this rank's
    # startup post bounds it, and nvidia-smi runs under a timeout of its own).
    phase(math.inf, "startup (devices and topology)")
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
            "node_key": f"{machine_key()}|{env.node_rank()}"
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
    snapshot = topo_probe.node_snapshot() if local_rank == 0 and refusal is None else None
    phase(timeout_s + min(timeout_s, READ_WAIT_S) + START_SLACK_S,
         "startup (waiting for every rank to start)")
    try:
        everyone = peers.agree_to_start(mine, timeout_s, snapshot)
    except StartFailure as e:
        if refusal is not None:  # say it in our own words on the node that refused
            raise refusal from None
        raise RunFailure(str(e), status="bad_input" if e.refused else "timeout",
                         exit_code=EXIT_BAD_INPUT if e.refused else EXIT_FAILED) from None
    phase(timeout_s, "startup (process group setup)")
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
    peers.names = rank_names(rt.ranks)
    rt.snapshots = topo_probe.dedupe_by_node(peers.snapshots()) if peers.rank == 0 else []
    return rt


@dataclass(frozen=True)
class _Armed:
    deadline: float
    seconds: float
    what: str


class Progress:
    """How far this process's timed loop has got, for the watchdog's thread, which reads it
    while the loop runs (and stays stuck where a peer stopped): the loop does nothing for it
    that it did not do anyway. On CPU it reads the stamps the loop writes, in order; on GPU the
    host's waits every K ops (sync_every) say how far they got. A loop replayed from a CUDA
    graph queues everything at once and has no such marks: none is watched."""

    def __init__(self):
        self.running = False
        self.loops = 0  # loops begun, each a new count
        self.stamps: list[float] = []  # CPU: the loop's, 0.0 until written
        self.synced = 0  # GPU: the last iteration the host waited for

    def begin(self) -> None:
        self.loops += 1
        self.stamps, self.synced = [], 0
        self.running = True

    def end(self) -> None:
        self.running = False

    def __call__(self) -> tuple[int, int, int] | None:
        """Something that changes whenever the loop advances; None while no loop runs (a wait
        for the others' loops is not this rank's loop being stuck)."""
        if not self.running:
            return None
        written = bisect.bisect_left(self.stamps, True, key=_unwritten)
        return self.loops, self.synced, written


def _unwritten(stamp: float) -> bool:
    return stamp == 0.0


# One timed loop at a time per process (one rank): the session's watchdog watches this one.
LOOP = Progress()


class FailureWatch:
    """While a guarded part runs: every FAILURE_POLL_S, `failure()` (what a rank that failed in
    the part posted, or None) and `everyone()` (whether every rank has reached the part's end);
    once a failure has stood for `grace_s` with some rank still short of the end, `on_failure`
    (which ends the process). stop() ends the watch, and once it has returned the watch never
    fires: the two share a lock. A question the store cannot answer is asked again."""

    def __init__(self, failure: Callable[[], dict | None], everyone: Callable[[], bool],
                 grace_s: float, on_failure: Callable[[dict], None]):
        self._failure, self._everyone = failure, everyone
        self._grace_s, self._on_failure = grace_s, on_failure
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="distbench-failure-watch",
                         daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()

    def _watch(self) -> None:
        since = None
        while not self._stopped.wait(FAILURE_POLL_S):
            try:
                failure = self._failure()
                short = failure is not None and not self._everyone()
            except Exception:  # noqa: BLE001 - the store did not answer: ask again
                continue
            if not short:
                since = None
                continue
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since >= self._grace_s:
                with self._lock:
                    if not self._stopped.is_set():
                        self._on_failure(failure)
                return


class Watchdog:
    """Ends a run whose ranks stop making progress (a lost launcher is the lifeline's to see).
    Runs beside the main thread, which may be blocked inside a collective (GIL released) at
    that moment.

    A step ends at its deadline, or, while a timed loop runs (`progress` says how far it got,
    None when none runs), when the loop has not moved for `stall_s`. Time in a running loop
    does not count against the deadline: a loop may rightly take far longer than its estimate
    (a busy machine), and one stopped by a peer must not hold the others until the estimate
    runs out; the deadline bounds the waits outside it (a rank done with its loop waiting on
    the host for the others')."""

    def __init__(self, on_expire: Callable[[str, float], None],
                 progress: Callable[[], object] | None = None, stall_s: float = 0.0):
        self.on_expire = on_expire  # reassigned when the session takes over from startup
        self._progress = progress
        self._stall_s = stall_s
        self._armed: _Armed | None = None  # replaced whole: the watcher reads it unlocked
        threading.Thread(target=self._watch, name="distbench-watchdog", daemon=True).start()

    def arm(self, seconds: float, what: str) -> None:
        self._armed = _Armed(time.monotonic() + seconds, seconds, what)

    def disarm(self) -> None:
        self._armed = None

    def _watch(self) -> None:
        last, seen, since, looped, tick = None, None, 0.0, 0.0, time.monotonic()
        while True:
            time.sleep(TICK_S)
            armed, now = self._armed, time.monotonic()
            moved = self._progress() if self._progress is not None and self._stall_s else None
            if armed is not last:
                last, seen, since, looped = armed, moved, now, 0.0
            elif moved is not None:  # time in a running loop is the stall rule's to judge
                looped += now - tick
            tick = now
            if armed is None:
                continue
            if now > armed.deadline + looped:
                self.on_expire(armed.what, armed.seconds)
                return
            if moved is None or moved != seen:
                seen, since = moved, now
            elif now - since > self._stall_s:
                self.on_expire(armed.what, self._stall_s)
                return
