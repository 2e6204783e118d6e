"""What a rank posts to its backend, read from torch's dispatcher, in the order it posts it: each
collective (op, process group, bytes, dtype, root) and each point-to-point op (peer, bytes, dtype,
and the batch it was posted in). Whoever issued it is seen alike: DTensor's functional
collectives, DDP's reducer, FSDP, ZeroRedundancyOptimizer, torch's pipeline schedules, our own.

Two users:
- the training-step commands count what one step issued, and replay it alone
  (steps.comms.CommCounter, a `Listener` as the recorder below is);
- the test suite records a whole run, DISTBENCH_TEST_COMM_TRACE=DIR (one file per rank,
  `rank<R>.jsonl`), and holds it to NCCL's rules (tests/nccl_rules.py): gloo buffers sends and
  forgives a pair of ranks that both send first, NCCL does not.

A batch is one `torch.distributed.batch_isend_irecv` call: NCCL posts it as one group, whose ops
progress together. gloo's process group posts the same ops one by one, so the batch is only
known from the call around them: `marking_batches` stamps it."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

TRACE_ENV = "DISTBENCH_TEST_COMM_TRACE"

_COMM_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")

# dispatcher op names (trailing "_" dropped) -> one name per collective
_CANONICAL = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather_into_tensor": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast",
}
P2P = ("send", "recv")


@dataclass(frozen=True)
class CommCall:
    op: str  # canonical name when known, else the dispatcher's
    size_bytes: int
    dtype: torch.dtype | None
    root: int = 0  # broadcast's source rank; a send's or receive's peer (group ranks)
    # the process group's name, which tells a mesh's dimensions apart; left out of equality:
    # a call is the same collective on whichever group it is replayed
    group: str = field(default="", compare=False)
    # the batch_isend_irecv call a send or receive was posted in (None: posted alone)
    batch: int | None = field(default=None, compare=False)


def _tensors(arg) -> list[torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, list | tuple):
        return [t for t in arg if isinstance(t, torch.Tensor)]
    return []


def call_of(func, args) -> CommCall | None:
    """The collective or point-to-point op a dispatcher call posts, or None for anything else
    (waits and autograd wrappers (`_wrap_tensor_autograd`) are not collectives)."""
    namespace = getattr(func, "namespace", "")
    name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
    collective = namespace in _COMM_NAMESPACES and not name.startswith(("wait", "_wrap"))
    if not (collective or name == "shard_dim_alltoall"):
        return None
    key = name.rstrip("_")
    op = _CANONICAL.get(key, key)
    buffers = [t for a in args[:2] for t in _tensors(a)]
    size = max((t.numel() * t.element_size() for t in buffers), default=0)
    if op == "all_gather" and namespace != "c10d" and len(args) > 1 and \
            isinstance(args[1], int):
        # a functional all-gather (DTensor's) is handed its input and the group's size, not
        # the output c10d's is: the output is the larger buffer, as nccl-tests counts it
        size *= args[1]
    root = args[2] if op in ("broadcast", *P2P) and len(args) > 2 and \
        isinstance(args[2], int) else 0
    return CommCall(op, size, buffers[0].dtype if buffers else None, root, group_name(args),
                getattr(_BATCH, "current", None) if op in P2P else None)


def group_name(args) -> str:
    """The group a call ran on: c10d's ops take the ProcessGroup (boxed), functional
    collectives its name (their last text argument)."""
    from torch._C._distributed_c10d import ProcessGroup

    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a).group_name
            except RuntimeError:  # another boxed argument (a ReduceOp)
                continue
    names = [a for a in args if isinstance(a, str)]
    return names[-1] if names else ""


def ranks_of(name: str) -> tuple[int, ...]:
    """The global ranks of a process group known by its name, as collectives carry it. torch
    resolves names only through a private function: this is the one place that calls it."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        return tuple(dist.get_process_group_ranks(_resolve_process_group(name)))
    except (RuntimeError, ValueError):  # an unnamed or unknown group
        return ()


# ---------------------------------------------------------------------------------------------
# Batches

_BATCH = threading.local()
_BATCH_IDS = itertools.count(1)
_PATCH_LOCK = threading.Lock()
_patched = 0  # marking_batches blocks open, in any thread
_original = None


def _marked(p2p_op_list):
    if getattr(_BATCH, "current", None) is not None:  # a batch inside a batch: the outer one
        return _original(p2p_op_list)
    _BATCH.current = next(_BATCH_IDS)
    try:
        return _original(p2p_op_list)
    finally:
        _BATCH.current = None


@contextlib.contextmanager
def marking_batches() -> Iterator[None]:
    """Within it, every send and receive that `batch_isend_irecv` posts carries that call's
    batch number (torch's schedules and ops.p2p look the function up on torch.distributed at
    each call, so replacing it there is seen by all of them)."""
    global _patched, _original
    with _PATCH_LOCK:
        if _patched == 0:
            _original = dist.batch_isend_irecv
            dist.batch_isend_irecv = _marked
        _patched += 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _patched -= 1
            if _patched == 0:
                dist.batch_isend_irecv = _original


# ---------------------------------------------------------------------------------------------
# Listening


# The dispatcher's ops call_of found to be no collective nor point-to-point op.
_NOT_POSTED: set = set()


class Listener(TorchDispatchMode):
    """Hears every collective and point-to-point op posted while it is active (`posted`, called
    as the op is posted), sends and receives stamped with their batch."""

    def __init__(self):
        super().__init__()
        self._batches = marking_batches()

    def posted(self, call: CommCall) -> None:
        raise NotImplementedError

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise torch wraps __torch_dispatch__ in torch._dynamo.disable, whose first call
        # imports torch._dynamo: 1.2 CPU-s a rank (half the cost of torch itself), and inside
        # a rank's first collective, where on a busy machine it looked like a stalled peer to a
        # 3 s --timeout. Nothing compiles under a listener, so there is nothing to disable.
        return False

    def __enter__(self):
        self._batches.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._batches.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # DTensor turns itself into plain ops and collectives. Looked up, never imported: a
        # run that uses none (collective, p2p) would pay the import inside its first timed op
        dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
        if dtensor is not None and any(issubclass(t, dtensor) for t in types):
            return NotImplemented
        # whether an op is a collective is the op's alone: the others, nearly every op a step
        # posts, are known after their first call and cost a set lookup
        if func not in _NOT_POSTED:
            call = call_of(func, args)
            if call is not None:
                self.posted(call)
            else:
                _NOT_POSTED.add(func)
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------------------------
# A whole run, for the test suite


class Recorder(Listener):
    """Every collective and point-to-point op this rank posts while it is active, with global
    ranks (a group's members, a peer), in posting order."""

    def __init__(self, rank: int, path: Path):
        super().__init__()
        self.rank, self.path = rank, path
        self.events: list[dict] = []
        self.groups: dict[str, list[int]] = {}
        self._lock = threading.Lock()  # DDP's reducer posts from autograd's threads on CUDA

    def posted(self, c: CommCall) -> None:
        with self._lock:
            if c.group not in self.groups:
                self.groups[c.group] = list(ranks_of(c.group)) if c.group else \
                    list(range(dist.get_world_size()))
            members = self.groups[c.group]
            event = {"op": c.op, "group": c.group, "bytes": c.size_bytes,
                     "dtype": str(c.dtype).removeprefix("torch.")}
            if c.op in P2P:
                event.update(peer=members[c.root] if c.root < len(members) else -1,
                             batch=c.batch)
            elif c.op == "broadcast":
                event["root"] = members[c.root] if c.root < len(members) else -1
            self.events.append(event)

    def dump(self, complete: bool) -> None:
        """rank<R>.jsonl: the events, then a last line saying whether the run ended as every
        rank agreed (a run cut short records only what came before), the groups' members, and
        the process groups still alive beside the default one."""
        self.path.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(e) for e in self.events]
        lines.append(json.dumps({"end": True, "rank": self.rank, "world": dist.get_world_size(),
                                 "complete": complete,
                                 "groups": self.groups, "alive": alive_groups()}))
        (self.path / f"rank{self.rank}.jsonl").write_text("\n".join(lines) + "\n")


def alive_groups() -> dict[str, list[int]]:
    """The process groups this rank still holds, beside the default one, by name."""
    from torch.distributed.distributed_c10d import _world

    default = dist.group.WORLD
    return {name: dist.get_process_group_ranks(pg) for pg, name in _world.pg_names.items()
            if pg is not default}


@contextlib.contextmanager
def recording(rank: int) -> Iterator[Recorder | None]:
    """Under DISTBENCH_TEST_COMM_TRACE, the run's body recorded (the recorder, which the caller
    dumps once it knows how the run ended); otherwise nothing at all."""
    where = os.environ.get(TRACE_ENV)
    if not where:
        yield None
        return
    recorder = Recorder(rank, Path(where))
    with recorder:
        yield recorder
