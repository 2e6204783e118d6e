"""The world split into equal groups of ranks that run a collective at once, as a training
layout's groups do: `collective --group-size N --group-stride S` and the fits `plan --workers`
measures. Torch-free: the command line checks a split before any worker starts, and the
workers make the process groups from `members` (run/split.py).

A group of N ranks at stride S takes every S-th rank of a block of N x S consecutive ranks,
from each of the block's first S ranks: stride 1 gives blocks of N ({0..N-1}, {N..2N-1}: a
TP group), stride S the data-parallel groups of a layout of tp S ({r, r+S, r+2S, ...}).
nccl-tests splits its communicator alike with NCCL_TESTS_SPLIT ("DIV N" is stride 1, "MOD S"
the groups of a whole world at stride S)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from distbench.core.options import OptionError

SIZE_FLAG, STRIDE_FLAG = "--group-size", "--group-stride"
EXAMPLE = "--group-size 2 --group-stride 2"


def members(world: int, size: int, stride: int = 1) -> list[list[int]]:
    """Every group's ranks, in the same order on every rank: block by block, then by the
    block's first rank. `check` has refused a split that does not tile the world."""
    span = size * stride
    return [[start + offset + k * stride for k in range(size)]
            for start in range(0, world, span) for offset in range(stride)]


def check(world: int, size: int, stride: int, size_given: bool = True) -> None:
    """The split is one the world holds whole; raises OptionError (exit 2) saying why not.
    `size_given`: whether --group-size was on the command line (else it is the world's)."""
    if size < 2:
        raise OptionError(SIZE_FLAG, f"a group of {size} rank moves nothing; give 2 or more",
                          EXAMPLE)
    if size > world:
        raise OptionError(SIZE_FLAG, f"groups of {size} ranks in a world of {world}",
                          f"{SIZE_FLAG} {world}")
    if world % size:
        raise OptionError(SIZE_FLAG, f"{size} does not divide the {world} ranks into equal "
                          "groups", f"{SIZE_FLAG} {_divisor(world)}")
    if stride < 1:
        raise OptionError(STRIDE_FLAG, f"must be 1 or more, got {stride}", EXAMPLE)
    if world % (size * stride):
        raise OptionError(STRIDE_FLAG, f"groups of {size} ranks at stride {stride} take blocks "
                          f"of {size * stride} ranks, which do not tile the {world} ranks"
                          + (" (give --group-size too: it is the world by default)"
                             if not size_given else ""),
                          _tiling(world, size, stride))


def _tiling(world: int, size: int, stride: int) -> str:
    """A split of `world` that keeps what can be kept of the one asked for."""
    if size == world and world % stride == 0 and world // stride >= 2:
        return f"{SIZE_FLAG} {world // stride} {STRIDE_FLAG} {stride}"
    return f"{SIZE_FLAG} {size} {STRIDE_FLAG} {world // size}"


def _divisor(world: int) -> int:
    return next((d for d in range(2, world + 1) if world % d == 0), 2)


def per_node(group: Sequence[int], node_of: Sequence[Hashable]) -> int:
    """The group's ranks on each node it spans, the fewest where they differ (a node with fewer
    ranks has fewer NICs for the group's traffic): its size when it stays inside one node.
    `node_of[rank]`: the rank's node."""
    return min(Counter(node_of[r] for r in group).values())


def placement(groups: Sequence[Sequence[int]], node_of: Sequence[Hashable]) -> tuple[int, str]:
    """(ranks per node, a note): the fewest ranks any group has on a node it spans, the same on
    every rank; the note says so when the groups are not all placed alike (a contiguous group
    that straddles two nodes beside groups inside one)."""
    each = [per_node(g, node_of) for g in groups]
    if len(set(each)) == 1:
        return each[0], ""
    return min(each), (f"groups placed unlike: {', '.join(map(str, sorted(set(each))))} ranks "
                       "per node; per_node is the fewest")
