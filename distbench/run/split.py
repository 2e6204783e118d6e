"""Process groups of disjoint rank lists, made on every rank in one call and freed when done:
NCCL's rule is that every rank takes part in making every group, in the same order, and a
communicator is freed once its work is done (tests/nccl_rules.py checks both). `make` serves
acceptance's rounds; `split` the concurrent groups of `collective --group-size` and of the
fits `plan --workers` measures (core/rank_groups.py says which ranks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from distbench.core import rank_groups


def make(backend: str, lists: list[list[int]], timeout_s: float):
    """This rank's group among `lists` (disjoint, the same on every rank), with the run's
    timeout (torch's default would be NCCL's 10 minutes). NCCL splits the default communicator
    once (non-members get None); elsewhere torch makes the groups one by one.
    Not new_group(use_local_synchronization=True): torch names such a group by how many groups
    the rank holds, which differs between ranks that sat different rounds out. NCCL can let a
    split communicator share its parent's resources (ncclConfig_t.splitShare), which would make
    each round's groups cheaper in device memory; torch 2.13's ProcessGroupNCCL.NCCLConfig, as
    its type stubs list it (blocking, cga_cluster_size, min_ctas, max_ctas), does not offer it,
    so the groups are split with torch's defaults and released once used instead."""
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl" and hasattr(dist, "split_group"):
        return dist.split_group(split_ranks=lists, timeout=timeout)
    mine, _ = dist.new_subgroups_by_enumeration(lists, timeout=timeout)
    return mine


@dataclass(frozen=True)
class Split:
    """The world in equal groups, seen from one rank."""

    group: object  # this rank's process group; None when the one group is the whole world
    members: list[list[int]]  # every group's ranks
    mine: list[int]  # this rank's group's ranks
    rank: int  # this rank's rank in its group
    size: int
    stride: int
    per_node: int  # the fewest ranks a group has on a node it spans (rank_groups.placement)
    note: str  # why per_node is the fewest: the groups are not placed alike

    @property
    def crosses(self) -> bool:
        return self.per_node < self.size


def node_of(rt) -> list:
    """Each rank's node, by rank (one node when the runtime lists no ranks: a test's stand-in)."""
    return [r.get("node") for r in rt.ranks] if rt.ranks else [0] * rt.world


@contextmanager
def split(rt, size: int, stride: int, timeout_s: float) -> Iterator[Split]:
    """The world split into groups of `size` at `stride` (rank_groups.check has passed), made
    on every rank and destroyed when the block ends well (a run that failed ends its process
    instead: a destroy could wait on a peer that is gone); the whole world, as one group, is
    the default group and makes nothing."""
    lists = rank_groups.members(rt.world, size, stride)
    mine = next(g for g in lists if rt.rank in g)
    per_node, note = rank_groups.placement(lists, node_of(rt))
    group = None if len(lists) == 1 else make(rt.backend, lists, timeout_s)
    yield Split(group, lists, mine, mine.index(rt.rank), size, stride, per_node, note)
    if group is not None:
        dist.destroy_process_group(group)
