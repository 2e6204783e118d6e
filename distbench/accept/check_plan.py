"""What an acceptance does, before it does it: each check's targets (each node, each pair of
nodes, the cluster) in rounds of targets that share no node, the process groups those rounds
need, and an estimate of the wall time. `accept` runs this plan; `accept --dry-run` prints it,
from the same code, so the two cannot drift apart.

Process groups. On NCCL every group creation is a collective of the whole world (an NCCL split
of the default communicator, which every rank joins, member or not), so what a run costs at
64 to 128 nodes is the number of creations, not their size. A round's disjoint groups are made
in one call (Groups.for_round), and a rank holds one round's groups at most: each NCCL
communicator holds device memory torch's allocator does not see (hundreds of MB), so the N-1
pair rounds' groups kept at once would take tens of GB per GPU at 128 nodes, and the large
checks after them would not fit. A round releases the groups held unless they are its own: the
node checks share the node groups (one round, the same each check), and each pair check makes
its rounds afresh (a pair round's groups cannot serve the next pair check's same round without
measuring the checks out of order, and each check is finished before the next starts).
Creations per rank: one for the node checks, one per pair round per pair check (N-1 each for
N nodes), none for the cluster (the default group): they grow with the node count, not with
the N(N-1)/2 pairs. Pure: no torch (the caller hands Groups its maker)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from distbench.accept import schedule
from distbench.accept.profiles import Check, Profile
from distbench.core.accounting import SENDRECV, bandwidth, layout
from distbench.core.dtypes import element_bytes
from distbench.core.sizes import format_size
from distbench.core.tables import plural
from distbench.ops.collectives import OPS

# What the estimate assumes where the profile sets no absolute figure (a check judged against
# its peers): the slow end of a healthy H100 node (NVLink, ~370 GB/s effective, nccl-tests
# issue 212) and of one 400 Gb/s NIC per GPU between nodes (~45 of its 50 GB/s).
ASSUMED_BUSBW_GBPS = {"node": 370.0, "pair": 45.0, "cluster": 45.0}
ASSUMED_LATENCY_US = {"node": 30.0, "pair": 50.0, "cluster": 100.0}
SETUP_S = 1.0  # per measurement: buffers allocated and filled, data checked, statistics
CREATE_S = 2.0  # per group creation at scale: an NCCL split of the world communicator
ROUND_S = 0.2  # per round: ranks meet on the host and rank 0 gathers the results


@dataclass(frozen=True)
class Target:
    """What one measurement of a check runs on."""

    name: str  # a node's name, "a+b" for a pair, "cluster"
    nodes: tuple[int, ...]  # node indices
    # global ranks, ascending: the order torch gives a new group's ranks (new_group and
    # split_group sort them), so ranks.index(rank) is a rank's group rank under any placement
    # (srun -m cyclic and mpirun --map-by node put a node's ranks apart)
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """The cluster as accept sees it: node names, each node's global ranks, each node's host."""

    names: list[str]
    node_ranks: list[tuple[int, ...]]
    hosts: list[str]

    @property
    def world(self) -> int:
        return sum(len(r) for r in self.node_ranks)

    @classmethod
    def of_ranks(cls, ranks: list[dict], names: list[str]) -> Layout:
        """From the runtime's rank records (rank, node, host)."""
        by_node: dict[int, list[int]] = {}
        hosts: dict[int, str] = {}
        for r in ranks:
            by_node.setdefault(r["node"], []).append(r["rank"])
            hosts.setdefault(r["node"], r["host"])
        nodes = sorted(by_node)
        return cls(names, [tuple(sorted(by_node[i])) for i in nodes], [hosts[i] for i in nodes])

    @classmethod
    def uniform(cls, nodes: int, per_node: int) -> Layout:
        """`nodes` machines of `per_node` ranks each, in block placement (a dry run)."""
        width = len(str(nodes - 1))
        names = [f"node{i:0{width}d}" for i in range(nodes)]
        return cls(names, [tuple(range(i * per_node, (i + 1) * per_node)) for i in range(nodes)],
                   list(names))


def pair_target(a: int, b: int, lay: Layout) -> Target:
    return Target(f"{lay.names[a]}+{lay.names[b]}", (a, b),
                  tuple(sorted(lay.node_ranks[a] + lay.node_ranks[b])))


def target_of(scope: str, nodes: tuple[int, ...], lay: Layout) -> Target:
    """The target of a check of `scope` on these nodes (a retest names them so)."""
    if scope == "node":
        return Target(lay.names[nodes[0]], nodes, lay.node_ranks[nodes[0]])
    if scope == "pair":
        return pair_target(*nodes, lay)
    return Target("cluster", nodes, tuple(sorted(r for i in nodes for r in lay.node_ranks[i])))


def rounds_of(check: Check, lay: Layout, quick: bool) -> list[list[Target]]:
    """The check's targets, in rounds of targets that share no node."""
    if check.scope == "cluster":
        return [[target_of("cluster", tuple(range(len(lay.names))), lay)]]
    if check.scope == "node":
        return [[target_of("node", (i,), lay) for i in range(len(lay.names))]]
    pairs = schedule.quick_round(len(lay.names)) if quick else schedule.circle_rounds(
        len(lay.names))
    return [[pair_target(a, b, lay) for a, b in r] for r in pairs]


def by_machine(targets: list[Target], hosts: list[str]) -> list[list[Target]]:
    """A round's targets in batches that share no host: targets measured at the same time on one
    machine contend for its cores and NICs and measure each other (several launcher agents on
    one host, as the tests run them). On a cluster every node is a machine: one batch."""
    batches: list[tuple[set[str], list[Target]]] = []
    for target in targets:
        mine = {hosts[i] for i in target.nodes}
        for used, batch in batches:
            if not used & mine:
                used |= mine
                batch.append(target)
                break
        else:
            batches.append((set(mine), [target]))
    return [batch for _, batch in batches]


Maker = Callable[[list[tuple[int, ...]]], dict[tuple[int, ...], object]]


class Groups:
    """The process groups of one round at most, by their ranks. `make(lists)` creates the
    groups of disjoint rank lists in one call on every rank (an NCCL split), and returns this
    rank's group by its ranks (other ranks' lists may map to anything: they are never used
    here); `release(group)` frees one. A target of the whole world uses the default group
    (None)."""

    def __init__(self, world: int, make: Maker, release: Callable[[object], None] = lambda g: None):
        self.world = world
        self._make, self._release = make, release
        self.held: dict[tuple[int, ...], object] = {}
        self.created = 0  # creation calls this rank joined

    def for_round(self, targets: list[Target]) -> list[object]:
        """Each target's group. The groups held serve the round if it needs no other (the next
        node check, a retest of some of the round's targets); otherwise they are released and
        the round's made, in one call. Every rank calls this with the same targets and holds
        the same keys, so every rank makes and releases alike."""
        wanted = [t.ranks for t in targets if len(t.ranks) < self.world]
        if not wanted or not set(wanted) <= self.held.keys():
            self.release()
        if wanted and not self.held:
            made = self._make(wanted)
            self.held = {ranks: made.get(ranks) for ranks in wanted}
            self.created += 1
        return [None if len(t.ranks) >= self.world else self.held[t.ranks] for t in targets]

    def release(self) -> None:
        for group in self.held.values():
            if group is not None:
                self._release(group)
        self.held = {}


@dataclass
class CheckPlan:
    check: Check
    rounds: list[list[Target]]
    creations: int = 0  # group creations per rank for this check
    issued: list[str] = field(default_factory=list)  # what one measuring rank issues
    seconds: float = 0.0


@dataclass
class Plan:
    profile: Profile
    layout: Layout
    quick: bool
    checks: list[CheckPlan]

    @property
    def rounds(self) -> int:
        return sum(len(c.rounds) for c in self.checks)

    @property
    def creations(self) -> int:
        return sum(c.creations for c in self.checks)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.checks)


def make(profile: Profile, lay: Layout, quick: bool) -> Plan:
    """The acceptance of `profile` on this layout, as `accept` runs it (retests aside: they
    add rounds only where a target fails)."""
    plans: list[CheckPlan] = []
    groups = Groups(lay.world, lambda lists: {r: r for r in lists})
    for check in profile.checks:
        rounds = rounds_of(check, lay, quick)
        plan = CheckPlan(check, rounds)
        before = groups.created
        for targets in rounds:
            groups.for_round(targets)
        plan.creations = groups.created - before
        plan.issued, per_measurement = _issued(check, profile, rounds)
        batches = sum(len(by_machine(t, lay.hosts)) for t in rounds)
        plan.seconds = (batches * (per_measurement + SETUP_S) + len(rounds) * ROUND_S
                        + plan.creations * CREATE_S)
        plans.append(plan)
    return Plan(profile, lay, quick, plans)


def _issued(check: Check, profile: Profile, rounds: list[list[Target]]
            ) -> tuple[list[str], float]:
    """What a measuring rank issues per round, and the seconds one measurement takes at the
    figure the estimate assumes."""
    calls = profile.warmup + profile.iters + 1  # the last: the correctness check
    n = len(rounds[0][0].ranks) if rounds and rounds[0] else 0
    if n < 2:
        return ["nothing: one rank per target"], 0.0
    elt = element_bytes(check.dtype)
    acc = OPS[check.op].accounting if check.command == "collective" else SENDRECV
    lay = layout(acc, check.size, elt, n)
    if lay is None:
        return ["nothing: too small for the group"], 0.0
    what = check.op if check.command == "collective" else f"p2p {check.op}"
    per_call = _seconds_per_call(check, acc, lay.size_bytes, n)
    return [f"{calls} x {what} of {format_size(lay.size_bytes)} on {n} ranks"], calls * per_call


def _seconds_per_call(check: Check, acc, size: int, n: int) -> float:
    absolute = check.vs == "absolute" and (check.warn or check.fail)
    if check.metric == "time_us":
        us = (check.fail or check.warn) if absolute else ASSUMED_LATENCY_US[check.scope]
        return us / 1e6 * (2 if check.op == "pingpong" else 1)  # a round trip per call
    busbw = (check.warn or check.fail) if absolute else ASSUMED_BUSBW_GBPS[check.scope]
    algbw, bus = bandwidth(acc, size, 1.0, n)
    return size * (bus / algbw) / (busbw * 1e9)


def lines(plan: Plan) -> list[str]:
    """The plan as an operator reads it before booking the nodes; the last line sums it up."""
    lay = plan.layout
    per_node = {len(r) for r in lay.node_ranks}
    out = [f"accept plan: profile {plan.profile.name}, {plural(len(lay.names), 'node')} of "
           f"{'/'.join(map(str, sorted(per_node)))} {'rank' if per_node == {1} else 'ranks'}, "
           f"{plural(lay.world, 'rank')}"
           + (", --quick" if plan.quick else "")]
    for c in plan.checks:
        rounds = c.rounds
        sizes = sorted({len(t.ranks) for r in rounds for t in r})
        targets = sum(len(r) for r in rounds)
        groups = ("the default group" if sizes == [lay.world] else
                  f"groups of {'/'.join(map(str, sizes))} ranks")
        kept = not c.creations and sizes and sizes != [lay.world]
        reuse = ", reusing the groups above" if kept else ""
        out.append(f"  {c.check.name} [{c.check.scope}]: {plural(targets, 'target')} in "
                   f"{plural(len(rounds), 'round')}, {groups}, "
                   f"{plural(c.creations, 'group creation')} per rank{reuse}; "
                   f"about {c.seconds / 60:.1f} min")
        out += [f"      each measuring rank issues {x}" for x in c.issued]
    out.append("  after each measurement: the cross-rank statistics in the target's group, a "
               "barrier on the host (the launcher's store), then one all_gather_object of the "
               "round's results on every rank")
    out.append(f"  estimated: {plan.profile.warmup} warmup + {plan.profile.iters} timed + 1 "
               f"checked call per measurement at the profile's warn figure (checks against "
               f"peers: {ASSUMED_BUSBW_GBPS['node']:.0f} GB/s busbw in a node, "
               f"{ASSUMED_BUSBW_GBPS['pair']:.0f} between nodes), plus {SETUP_S:.0f} s per "
               f"measurement, {CREATE_S:.0f} s per group creation and {ROUND_S} s per round; "
               "retests add rounds (and group creations) only where a target fails")
    out.append(f"plan: {plural(len(plan.checks), 'check')}, {plural(plan.rounds, 'round')}, "
               f"{plural(plan.creations, 'group creation')} per rank, about "
               f"{math.ceil(plan.seconds / 60)} min")
    return out
