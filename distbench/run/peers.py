"""What ranks tell each other outside the process group, through the launcher's key-value store
(torchrun's agent, or distbench's own launcher, hosts it and outlives every worker):

- at startup, whether each rank accepted its options: every rank posts a verdict before the
  process group is set up, so a rank that refused its options (or was started with different
  ones) ends every rank at once with one line, instead of leaving them waiting in setup;
- after a failure, who is still there: a roll call that a listener thread on every live rank
  answers at once, even while its main thread is blocked in a collective. A rank that does not
  answer is lost; on the same machine its process tells whether it died or was stopped.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from distbench.core.tables import plural
from distbench.platform import env, lifeline


class StartFailure(Exception):
    """The run cannot start; `refused` when that is bad input (options), not a missing rank."""

    def __init__(self, message: str, refused: bool):
        super().__init__(message)
        self.refused = refused

# How long a roll call waits for the ranks that have not answered: live ranks answer in
# milliseconds, so this is the price of naming a dead one. It must leave room, within the
# grace a launcher gives a worker between SIGTERM and SIGKILL (5 s for distbench's own), to
# write run.json afterwards.
ROLL_CALL_GRACE_S = 2.0
# How long a rank that ends the run at startup waits for every rank to have read why, so
# the store it may host does not vanish under a reader.
READ_WAIT_S = 10.0
POLL_S = 0.005  # store polls start this often and back off to MAX_POLL_S
MAX_POLL_S = 0.1



def agree(ok: bool, device: torch.device, group=None) -> bool:
    """True on every rank (of `group`) when it is true on every one of them."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return flag.item() == 0

def _prefix(world: int) -> str:
    # A launcher that restarts workers keeps its store: an attempt's startup keys are its own
    # (restart count and world size; a run's later keys carry rank 0's nonce too).
    return f"distbench/{env.restart_count()}/{world}"


def machine_key() -> str:
    """Where process ids can be looked up: the machine (hostname, boot id) and the pid
    namespace (containers on one host share the first two, not their processes)."""
    boot, pidns = "", ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return f"{socket.gethostname()}|{boot}|{pidns}"


def node_name() -> str:
    """A node as a person reads it in one line: the host, and the launcher's node rank."""
    group = env.node_rank()
    return socket.gethostname() + (f" (node rank {group})" if group else "")


def node_names(ranks: list[dict]) -> list[str]:
    """Each node (by index) by its host name, or host#index where hosts repeat (several launcher
    agents on one host, as the tests run them): what reports name a node by."""
    hosts: dict[int, str] = {}
    for r in ranks:
        hosts.setdefault(r["node"], r["host"])
    repeated = len(set(hosts.values())) < len(hosts)
    return [f"{hosts[i]}#{i}" if repeated else hosts[i] for i in sorted(hosts)]


def rank_names(ranks: list[dict]) -> list[str]:
    """Each rank as node:local_rank (host:local_rank on a cluster), the one way every message
    and report places a rank: a lost rank, a slow link, a node's checks."""
    nodes = node_names(ranks)
    return [f"{nodes[r['node']]}:{r['local_rank']}" for r in ranks]


@dataclass(frozen=True)
class Lost:
    """A rank that did not answer the roll call."""

    rank: int
    host: str
    local_rank: int
    state: str  # "dead", "stopped" (its process is suspended) or "silent" (no answer)
    name: str = ""  # where it ran, as rank_names says; host:local_rank when not given

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", f"{self.host}:{self.local_rank}")

    def describe(self, phase: str | None, signum: int | None = None) -> str:
        how = {"dead": "died" + (f" (signal {signum})" if signum else ""),
               "stopped": "was suspended (SIGSTOP or a debugger)",
               "silent": "stopped answering (hung, dead, or its node unreachable)"}
        during = f" during {phase}" if phase else ""
        return f"rank {self.rank} ({self.name}) {how[self.state]}{during}"


def describe_lost(lost: list[Lost], phase: str, signals: dict[int, int] | None = None) -> str:
    signals = signals or {}
    shown = "; ".join(x.describe(phase, signals.get(x.rank)) for x in lost[:4])
    return shown + (f" (+{plural(len(lost) - 4, 'more rank')})" if len(lost) > 4 else "")


def lost_from_json(items: list[dict]) -> list[Lost]:
    return [Lost(**item) for item in items]


def lost_to_json(lost: list[Lost]) -> list[dict]:
    return [asdict(x) for x in lost]


def process_state(pid: int) -> str:
    """"dead", "stopped" or "running", for a process on this machine."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "dead"
    return {"T": "stopped", "t": "stopped", "Z": "dead", "X": "dead"}.get(state, "running")


def start_verdict(everyone: list[dict]) -> str | None:
    """Why the run cannot start, from every rank's startup post; None when it can."""
    refused = [e for e in everyone if e.get("refused")]
    if refused:
        nodes = list(dict.fromkeys(e["node_name"] for e in refused))
        more = f" (and {plural(len(nodes) - 1, 'more node')})" if len(nodes) > 1 else ""
        return f"node {nodes[0]} refused the options{more}: {refused[0]['refused']}"
    ref = everyone[0]
    odd = [e for e in everyone if e["options"] != ref["options"]]
    if not odd:
        return _shared_gpu(everyone)
    first = odd[0]
    keys = sorted(k for k in set(ref["identity"]) | set(first["identity"])
                  if ref["identity"].get(k) != first["identity"].get(k))
    detail = ", ".join(f"{k}: rank 0 has {ref['identity'].get(k)!r}, rank {first['rank']} has "
                       f"{first['identity'].get(k)!r}" for k in keys)
    return (f"ranks were started with different options ({len(odd)} of {len(everyone)} ranks "
            f"differ from rank 0; {detail})")


def _shared_gpu(everyone: list[dict]) -> str | None:
    """Two ranks on one physical GPU (NCCL would refuse it later, as "Duplicate GPU")."""
    first: dict[str, dict] = {}
    for e in everyone:
        uuid = e.get("gpu_uuid")
        if uuid is None:
            continue
        if uuid in first:
            a = first[uuid]
            return (f"ranks {a['rank']} and {e['rank']} ({a['host']}:{a['local_rank']} and "
                    f"{e['host']}:{e['local_rank']}) share one GPU, {uuid} (bus "
                    f"{e.get('gpu_bus_id')}): each rank needs a GPU of its own; check "
                    "CUDA_VISIBLE_DEVICES and the scheduler's GPU binding")
        first[uuid] = e
    return None


class Peers:
    """This rank's line to the others through the launcher's store."""

    def __init__(self, store, rank: int, world: int, own=None):
        self.store = store  # the rendezvous store, which the process group uses too
        self.rank = rank
        self.world = world
        self.phase = "startup"  # what this rank is doing: a roll call answer says it
        self.everyone: list[dict] = []  # every rank's startup post, by rank
        # A connection of our own, opened now: a failure path should not have to open one, and
        # a client serialises its operations, so a roll call made from the watchdog's thread
        # must not queue behind a store wait of the main thread's (a process group being set
        # up waits on the rendezvous store).
        self._own = own if own is not None else self._client()
        self._run = "run/"  # this run's keys; begin_run scopes them by rank 0's nonce
        self.listening = threading.Event()
        self.names: list[str] = []  # every rank as rank_names places it, once the run is set up
        self._watching = None  # watch_client's connection, made on first use

    @classmethod
    def connect(cls, timeout_s: float) -> Peers:
        """The store a launcher's env:// variables point at, as init_process_group finds it."""
        store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
        store.set_timeout(timedelta(seconds=timeout_s))
        return cls(store, rank, world)

    def _client(self):
        client = dist.TCPStore(self.store.host, self.store.port, is_master=False,
                               timeout=timedelta(seconds=30))
        return dist.PrefixStore(_prefix(self.world), client)

    def _count_reaches(self, s, key: str, timeout_s: float) -> bool:
        """Whether the count at `key` reaches the world size within timeout_s (polled, less
        and less often)."""
        deadline, pause = time.monotonic() + timeout_s, POLL_S
        while s.add(key, 0) < self.world:
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, MAX_POLL_S)
        return True

    def _arrive(self, s, key: str, timeout_s: float, count: int | None = None) -> bool:
        """Count this rank in at `key`; True once every rank (or `count` ranks) has, False at the
        timeout. The rank that completes the count marks it, so the others poll one small key,
        less and less often, and nobody rereads a list."""
        if s.add(key, 1) >= (count or self.world):
            s.set(key + "/all", "1")
            return True
        deadline, pause = time.monotonic() + timeout_s, POLL_S
        while not s.check([key + "/all"]):
            if time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, MAX_POLL_S)
        return True

    # -- startup ---------------------------------------------------------------------------

    def agree_to_start(self, mine: dict, timeout_s: float, snapshot: dict | None = None
                       ) -> list[dict]:
        """Post this rank's startup record (its options, or why it refused them), wait for
        every rank's, and raise StartFailure when the run cannot start: on every rank, within
        timeout_s, before any process group exists. `snapshot` (a node's topology, from its
        local rank 0) goes to rank 0 alone: no other rank needs every node's."""
        s = self._own
        if snapshot is not None:
            s.set(f"snapshot/{self.rank}", json.dumps(snapshot))
        s.set(f"start/{self.rank}", json.dumps({**mine, "snapshot": snapshot is not None}))
        if not self._arrive(s, "start/posted", timeout_s):
            missing = [r for r in range(self.world) if not s.check([f"start/{r}"])]
            raise StartFailure(f"{_ranks_text(missing)} did not start within {timeout_s:.0f} s "
                               "(did their launcher start them?)", False)
        self.everyone = [json.loads(v) for v in
                         s.multi_get([f"start/{r}" for r in range(self.world)])]
        why = start_verdict(self.everyone)
        if why is None:
            return self.everyone
        # Rank 0 holds the store (or its node's launcher agent, which lives as long as it
        # does): it stays until every rank has read why; the others leave at once.
        s.add("start/read", 1)
        if self.rank == 0:
            try:
                self._count_reaches(s, "start/read", min(timeout_s, READ_WAIT_S))
            except dist.DistError:
                pass
        raise StartFailure(why, True)

    def snapshots(self) -> list[dict]:
        """Rank 0: every node's topology snapshot, posted at startup."""
        keys = [f"snapshot/{e['rank']}" for e in self.everyone if e.get("snapshot")]
        return [json.loads(v) for v in self._own.multi_get(keys)] if keys else []

    def begin_run(self, nonce: str) -> None:
        """Scope this run's keys by rank 0's nonce (shared over the process group): a launcher
        that restarts workers keeps its store, and an older attempt's roll call or end must not
        be read as this one's."""
        self._run = f"run/{nonce}/"

    # -- during the run ----------------------------------------------------------------------

    def listen(self) -> None:
        """Answer the roll call from a thread of its own, whatever the main thread is doing. It
        connects in that thread too, off the path of the run's startup."""
        threading.Thread(target=self._listen, name="distbench-roll-call", daemon=True).start()

    def _listen(self) -> None:
        try:
            s = self._client()  # its wait blocks the client it uses
            self.listening.set()
            key = self._run + "rollcall"
            s.wait([key], timedelta(days=30))
            if s.get(key) == b"end":
                s.add(self._run + "ended", 1)
            else:
                self._answer(s, "listener")
        except dist.DistError:
            pass  # the store is gone: the run is over, for better or worse

    def _answer(self, s, who: str) -> None:
        """This rank's answer, once (its listener and its main thread may both try)."""
        if s.compare_set(f"{self._run}answered/{self.rank}", "", who) != who.encode():
            return
        s.append(self._run + "answers", json.dumps([self.rank, self.phase]) + "\n")
        s.add(self._run + "count", 1)

    def wait_on_host(self, name: str, members: int, timeout_s: float) -> bool:
        """A barrier of `members` ranks through the store, not the process group: a rank that
        sits out a measurement waits here before it queues the collective that follows, since
        ProcessGroupNCCL times a collective from when it is queued and would abort an idle rank
        whose peers measure for longer than the timeout. `name`: unique in the run, the same on
        every member. False at the timeout."""
        try:
            return self._arrive(self._own, f"{self._run}host/{name}", timeout_s, members)
        except dist.DistError:
            return False

    def post_stop(self, signum: int) -> None:
        """A stop signal this rank was sent, for the ranks that were not sent one: they wake
        from their wait between cycles and leave at the same collective (watch). A store
        already gone says nothing: the boundary's collective fails them all anyway."""
        try:
            self._own.set(self._run + "stop", str(signum))
        except dist.DistError:
            pass

    def stop_posted(self) -> int | None:
        """The stop signal some rank posted (post_stop), 0 if none has; None when the store
        cannot be reached (asking again would print torch's warning every time)."""
        key = self._run + "stop"
        if lifeline.orphaned() is not None:  # the launcher held the store
            return None
        try:
            return int(self._own.get(key)) if self._own.check([key]) else 0
        except dist.DistError:
            return None

    def publish_run_dir(self, path: str) -> None:
        """Where run.json is, so a surviving rank can finish it if rank 0 dies."""
        self._own.set(self._run + "run_dir", os.path.abspath(path))

    def run_dir(self) -> str | None:
        key = self._run + "run_dir"
        try:
            return self._own.get(key).decode() if self._own.check([key]) else None
        except dist.DistError:
            return None

    def end(self) -> None:
        """The run ended with every rank alive: the listeners stop. Where rank 0 hosts the store
        (no launcher agent holds it), it waits for them first: a listener whose store vanishes
        under it makes torch print a C++ backtrace."""
        s = self._own
        s.compare_set(self._run + "rollcall", "", "end")
        if self.rank == 0 and not env.agent_store():
            self._count_reaches(s, self._run + "ended", ROLL_CALL_GRACE_S)

    def roll_call(self, grace_s: float = ROLL_CALL_GRACE_S) -> tuple[list[int], list[Lost]] | None:
        """Who was there when the run began to fail: (the ranks that answered, the ranks lost).
        One roll call per run, which every failing rank joins: a rank that answered and then
        left, having said its own error, is not lost. None when it cannot be known: the store
        cannot be reached, or the run already ended well (the listeners are gone)."""
        s = self._own
        try:
            if s.compare_set(self._run + "rollcall", "", "call") == b"end":
                return None
            self._answer(s, "caller")
            self._count_reaches(s, self._run + "count", grace_s)
            lines = s.get(self._run + "answers").decode().split("\n")
        except dist.DistError:
            return None
        answered = {json.loads(line)[0] for line in lines if line}
        lost = [self._lost(r) for r in range(self.world) if r not in answered]
        return sorted(answered), lost

    def _lost(self, rank: int) -> Lost:
        them = self.everyone[rank]
        state = "silent"
        if them["machine"] == machine_key():  # its process can be looked at
            found = process_state(them["pid"])
            state = found if found != "running" else state
        return Lost(rank, them["host"], them["local_rank"], state,
                    self.names[rank] if self.names else "")

    def timed_out(self, error: str, phase: str) -> dict | None:
        """Say that this rank's watchdog fired, unless another rank's said so first: then what
        that one said, {"rank", "error", "step"}, which is how the run ended (None: ours is).
        A rank that timed out leaves, and the others then fail on the connection it closed, or
        on their launcher's SIGTERM (first_timeout): whichever watchdog fired first, the run
        ends the same way."""
        mine = json.dumps({"rank": self.rank, "error": error, "step": phase})
        try:
            return self._not_ours(self._own.compare_set(self._run + "timeout", "", mine))
        except dist.DistError:
            return None

    def first_timeout(self) -> dict | None:
        """What the first rank to time out said (timed_out), or None: none has."""
        key = self._run + "timeout"
        try:
            return self._not_ours(self._own.get(key)) if self._own.check([key]) else None
        except dist.DistError:
            return None

    # -- guarded parts of a training step (steps.recipe) --------------------------------------

    def post_failure(self, part: int, failure: dict) -> None:
        """Say that this rank failed in guarded part number `part` (steps.recipe.attempt), unless
        another rank said so first: {"rank", "error", "step"}."""
        try:
            self._own.compare_set(f"{self._run}failed/{part}", "", json.dumps(failure))
        except dist.DistError:
            pass  # the store is gone: the run is ending anyway

    def end_part(self, part: int, timeout_s: float) -> dict | None:
        """This rank has reached the end of guarded part `part`: once every rank has, what the
        first to fail in it said (None: no rank failed). The agreement goes through the store,
        not the process group, whose collectives a rank that failed mid-part would pair with its
        peers' (NCCL pairs by order). Raises DistError when some rank has not come within
        timeout_s."""
        if not self._arrive(self._own, f"{self._run}part/{part}", timeout_s):
            raise dist.DistError(f"not every rank reached the end of part {part} within "
                                 f"{timeout_s:.0f} s")
        return self.failure(part)

    def watch_client(self):
        """A store connection for the failure watch's thread alone (made once): its questions
        must not queue behind the main thread's waits."""
        if self._watching is None:
            self._watching = self._client()
        return self._watching

    def failure(self, part: int, s=None) -> dict | None:
        """What the first rank to fail in guarded part number `part` said, or None: none has."""
        s = s or self._own
        key = f"{self._run}failed/{part}"
        return json.loads(s.get(key)) if s.check([key]) else None

    def all_ended(self, part: int, s=None) -> bool:
        """Whether every rank has reached the end of guarded part `part`."""
        return (s or self._own).add(f"{self._run}part/{part}", 0) >= self.world

    def _not_ours(self, said: bytes) -> dict | None:
        first = json.loads(said)
        return first if first["rank"] != self.rank else None


def refuse(message: str, timeout_s: float) -> None:
    """Under a launcher, a rank that refused its options tells the others (who would otherwise
    wait in process-group setup until their timeout) and waits until they have read it."""
    try:
        peers = Peers.connect(timeout_s)
        peers.agree_to_start({"refused": message, "node_name": node_name(),
                              "rank": peers.rank}, timeout_s)
    except (StartFailure, dist.DistError, ValueError, RuntimeError):
        pass  # the others were told, or the store cannot be reached: either way, we are done


def _ranks_text(ranks: list[int]) -> str:
    """"rank 2", "ranks 2, 3", "ranks 0, 1, ... (+3 more)"."""
    shown = ", ".join(str(r) for r in ranks[:8])
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + (
        f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")

