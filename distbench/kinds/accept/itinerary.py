"""What an acceptance does, before it does it: each check's targets (each node, each pair of
nodes, the cluster) in rounds of targets that share no node, the process groups those rounds
need, and an estimate of the wall time. `accept` runs this itinerary; `accept --dry-run` prints it,
from the same code, so the two cannot drift apart. A check's rounds are made when asked for
(Rounds): the run makes them one at a time, and a dry run counts them without making any (a
pair check has N(N-1)/2 targets, 4.5 million at 3000 nodes): 100000 nodes plan in about 2 s.

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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from distbench.core.accounting import SENDRECV, bandwidth, buffer_of
from distbench.core.dtypes import element_bytes
from distbench.core.sizes import format_size
from distbench.core.tables import plural
from distbench.kinds.accept import schedule
from distbench.kinds.accept.profile_model import Profile, ProfileCheck
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
class Cluster:
    """The cluster as accept sees it: node names, each node's global ranks, each node's host."""

    names: list[str]
    node_ranks: list[tuple[int, ...]]
    hosts: list[str]

    @property
    def world(self) -> int:
        return sum(len(r) for r in self.node_ranks)

    @classmethod
    def of_ranks(cls, ranks: list[dict], names: list[str]) -> Cluster:
        """From the runtime's rank records (rank, node, host)."""
        by_node: dict[int, list[int]] = {}
        hosts: dict[int, str] = {}
        for r in ranks:
            by_node.setdefault(r["node"], []).append(r["rank"])
            hosts.setdefault(r["node"], r["host"])
        nodes = sorted(by_node)
        return cls(names, [tuple(sorted(by_node[i])) for i in nodes], [hosts[i] for i in nodes])

    @classmethod
    def uniform(cls, nodes: int, per_node: int) -> Cluster:
        """`nodes` machines of `per_node` ranks each, in block placement (a dry run)."""
        width = len(str(nodes - 1))
        names = [f"node{i:0{width}d}" for i in range(nodes)]
        return cls(names, [tuple(range(i * per_node, (i + 1) * per_node)) for i in range(nodes)],
                   list(names))


def pair_target(a: int, b: int, lay: Cluster) -> Target:
    return Target(f"{lay.names[a]}+{lay.names[b]}", (a, b),
                  tuple(sorted(lay.node_ranks[a] + lay.node_ranks[b])))


def target_of(scope: str, nodes: tuple[int, ...], lay: Cluster) -> Target:
    """The target of a check of `scope` on these nodes (a retest names them so)."""
    if scope == "node":
        return Target(lay.names[nodes[0]], nodes, lay.node_ranks[nodes[0]])
    if scope == "pair":
        return pair_target(*nodes, lay)
    return Target("cluster", nodes, tuple(sorted(r for i in nodes for r in lay.node_ranks[i])))


class Rounds(Sequence[list[Target]]):
    """A check's targets, in rounds of targets that share no node, each made when asked for: a
    pair check has N(N-1)/2 targets (4.5 million at 3000 nodes, in 2999 rounds), which a run
    makes one round at a time and a dry run counts without making them."""

    def __init__(self, scope: str, lay: Cluster, quick: bool):
        self.scope, self.lay, self.quick = scope, lay, quick
        nodes = len(lay.names)
        self._quick = schedule.quick_round(nodes) if scope == "pair" and quick else None
        if scope != "pair":
            self._count = 1
        elif self._quick is not None:
            self._count = len(self._quick)
        else:
            self._count = schedule.circle_count(nodes)
        # the round made last, kept for whoever asks for it next (ranks as threads share one
        # itinerary, and each asks for every round)
        self._last: tuple[int, list[Target]] | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, r: int) -> list[Target]:  # type: ignore[override]
        last = self._last
        if last is not None and last[0] == r:
            return last[1]
        if not 0 <= r < self._count:
            raise IndexError(f"round {r} of {self._count}")
        lay, nodes = self.lay, len(self.lay.names)
        if self.scope == "cluster":
            targets = [target_of("cluster", tuple(range(nodes)), lay)]
        elif self.scope == "node":
            targets = [target_of("node", (i,), lay) for i in range(nodes)]
        else:
            pairs = self._quick[r] if self._quick is not None else schedule.circle_round(nodes, r)
            targets = [pair_target(a, b, lay) for a, b in pairs]
        self._last = (r, targets)
        return targets

    def key(self, r: int) -> tuple | None:
        """What names round r's process groups, without making its targets: equal keys, equal
        groups (the node round of every node check, round r of every pair check); None where
        the round needs none (every target is the whole world: one node, or the pair of
        two)."""
        nodes = len(self.lay.names)
        if self.scope == "cluster" or nodes < (2 if self.scope == "node" else 3):
            return None
        return (self.scope, self.quick, r)

    @property
    def targets(self) -> int:
        nodes = len(self.lay.names)
        if self.scope == "pair" and self._quick is None:
            return nodes * (nodes - 1) // 2
        return sum(len(r) for r in self._quick) if self._quick is not None else (
            nodes if self.scope == "node" else 1)

    def first_size(self) -> int:
        """The rank count of the first round's first target (0: no round), without making the
        round (100000 node targets, or 50000 pairs, at 100000 nodes)."""
        if not self._count:
            return 0
        if self.scope == "cluster":
            return self.lay.world
        first = (0,) if self.scope == "node" else (
            self._quick[0][0] if self._quick is not None else
            schedule.circle_round(len(self.lay.names), 0)[0])
        return sum(len(self.lay.node_ranks[i]) for i in first)

    def first_nodes(self) -> int:
        """The node count of each target: the cluster's, one, or a pair's two."""
        return {"cluster": len(self.lay.names), "node": 1}.get(self.scope, 2)

    def sizes(self) -> list[int]:
        """The targets' rank counts, ascending."""
        per_node = Counter(len(r) for r in self.lay.node_ranks)
        if self.scope == "cluster":
            return [self.lay.world]
        if self.scope == "node":
            return sorted(per_node)
        if self._quick is not None:
            return sorted({sum(len(self.lay.node_ranks[i]) for i in pair)
                           for r in self._quick for pair in r})
        # every pair of two nodes meets once
        return sorted({a + b for a in per_node for b in per_node if a != b or per_node[a] > 1})

    def batches(self) -> int:
        """How many batches the rounds are measured in (by_machine): one a round where every
        node is a machine of its own."""
        if len(set(self.lay.hosts)) == len(self.lay.hosts):
            return len(self)
        return sum(len(by_machine(targets, self.lay.hosts)) for targets in self)


def rounds_of(check: ProfileCheck, lay: Cluster, quick: bool) -> Rounds:
    """The check's targets, in rounds of targets that share no node."""
    return Rounds(check.scope, lay, quick)


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
        self.key: object = None  # what names the round whose groups are held
        self.created = 0  # creation calls this rank joined

    def for_round(self, targets: list[Target], key: object = None) -> list[object]:
        """Each target's group. `key` names the round's groups (Rounds.key); without one (a
        retest's round) its ranks do, and the groups held serve it if it needs no other (a
        retest of some of the round's targets). Every rank calls this with the same targets
        and key, so every rank makes and releases alike."""
        wanted = [t.ranks for t in targets if len(t.ranks) < self.world]
        if key is None and wanted:
            key = self.key if self.held and set(wanted) <= self.held.keys() else frozenset(wanted)
        self.hold(key, wanted)
        return [None if len(t.ranks) >= self.world else self.held[t.ranks] for t in targets]

    def hold(self, key: object, wanted: list[tuple[int, ...]] | None = None) -> None:
        """Hold the groups of the round `key` names (None: it needs none), releasing those of
        any other round first; made in one call from `wanted`, their rank lists. A dry run
        counts the creations with no lists: its maker makes nothing."""
        if key is not None and key == self.key:
            return
        self.release()
        if key is not None:
            made = self._make(wanted or [])
            self.held = {ranks: made.get(ranks) for ranks in wanted or []}
            self.key = key
            self.created += 1

    def release(self) -> None:
        for group in self.held.values():
            if group is not None:
                self._release(group)
        self.held, self.key = {}, None


@dataclass
class Leg:
    """One check's part of the itinerary: its rounds, and what they cost."""

    check: ProfileCheck
    rounds: Rounds
    creations: int = 0  # group creations per rank for this check
    issued: list[str] = field(default_factory=list)  # what one measuring rank issues
    seconds: float = 0.0


@dataclass
class Itinerary:
    profile: Profile
    cluster: Cluster
    quick: bool
    legs: list[Leg]  # one per check, in the profile's order

    @property
    def rounds(self) -> int:
        return sum(len(leg.rounds) for leg in self.legs)

    @property
    def creations(self) -> int:
        return sum(leg.creations for leg in self.legs)

    @property
    def seconds(self) -> float:
        return sum(leg.seconds for leg in self.legs)


def make(profile: Profile, lay: Cluster, quick: bool) -> Itinerary:
    """The acceptance of `profile` on this layout, as `accept` runs it (retests aside: they
    add rounds only where a target fails)."""
    legs: list[Leg] = []
    groups = Groups(lay.world, lambda lists: {})
    for check in profile.checks:
        rounds = rounds_of(check, lay, quick)
        leg = Leg(check, rounds)
        before = groups.created
        for r in range(len(rounds)):  # as the run holds them, by their keys: no target made
            groups.hold(rounds.key(r))
        leg.creations = groups.created - before
        leg.issued, per_measurement = _issued(check, profile, rounds)
        leg.seconds = (rounds.batches() * (per_measurement + SETUP_S) + len(rounds) * ROUND_S
                       + leg.creations * CREATE_S)
        legs.append(leg)
    return Itinerary(profile, lay, quick, legs)


def _issued(check: ProfileCheck, profile: Profile, rounds: Rounds) -> tuple[list[str], float]:
    """What a measuring rank issues per round, and the seconds one measurement takes at the
    figure the estimate assumes."""
    calls = profile.warmup + profile.iters + 1  # the last: the correctness check
    n = rounds.first_size()
    if n:  # floors by node count: the row for the target's
        check = check.for_nodes(rounds.first_nodes())[0]
    if n < 2:
        return ["nothing: one rank per target"], 0.0
    elt = element_bytes(check.dtype)
    acc = OPS[check.op].accounting if check.command == "collective" else SENDRECV
    lay = buffer_of(acc, check.size, elt, n)
    if lay is None:
        return ["nothing: too small for the group"], 0.0
    what = check.op if check.command == "collective" else f"p2p {check.op}"
    per_call = _seconds_per_call(check, acc, lay.size_bytes, n)
    return [f"{calls} x {what} of {format_size(lay.size_bytes)} on {n} ranks"], calls * per_call


def _seconds_per_call(check: ProfileCheck, acc, size: int, n: int) -> float:
    absolute = check.vs == "absolute" and (check.warn or check.fail)
    if check.metric == "time_us":
        us = (check.fail or check.warn) if absolute else ASSUMED_LATENCY_US[check.scope]
        return us / 1e6 * (2 if check.op == "pingpong" else 1)  # a round trip per call
    busbw = (check.warn or check.fail) if absolute else ASSUMED_BUSBW_GBPS[check.scope]
    algbw, bus = bandwidth(acc, size, 1.0, n)
    return size * (bus / algbw) / (busbw * 1e9)


def floors_line(check: ProfileCheck, nodes: int) -> str:
    """Which floors an absolute check with floors by node count judges a target of `nodes`
    nodes by, and the lines: "the profile's floor for 4 nodes (fail below 336, warn below 347
    GB/s)", and why that row where it is not the count's own."""
    used, floor_for, caveat = check.for_nodes(nodes)
    side = "below" if check.higher_is_better else "above"

    def both(fail: float | None, warn: float | None) -> str:
        return ", ".join(f"{what} {side} {value:g}" for what, value in (("fail", fail),
                                                                       ("warn", warn))
                         if value is not None)

    lines = f"{both(used.fail, used.warn)} {used.unit}"
    if used.fail_no_nvls is not None or used.warn_no_nvls is not None:
        lines += f" with NVLS; {both(used.fail_no_nvls, used.warn_no_nvls)} without"
    return f"the profile's floor{floor_for} ({lines}){caveat}"


def lines(route: Itinerary) -> list[str]:
    """The itinerary as an operator reads it before booking the nodes (the console calls it
    the plan); the last line sums it up."""
    lay = route.cluster
    per_node = {len(r) for r in lay.node_ranks}
    out = [f"accept plan: profile {route.profile.name}, {plural(len(lay.names), 'node')} of "
           f"{'/'.join(map(str, sorted(per_node)))} {'rank' if per_node == {1} else 'ranks'}, "
           f"{plural(lay.world, 'rank')}"
           + (", --quick" if route.quick else "")]
    for c in route.legs:
        rounds = c.rounds
        sizes = rounds.sizes() if rounds else []
        targets = rounds.targets if rounds else 0
        groups = ("no group" if not sizes else "the default group" if sizes == [lay.world] else
                  f"groups of {'/'.join(map(str, sizes))} ranks")
        kept = not c.creations and sizes and sizes != [lay.world]
        reuse = ", reusing the groups above" if kept else ""
        out.append(f"  {c.check.name} [{c.check.scope}]: {plural(targets, 'target')} in "
                   f"{plural(len(rounds), 'round')}, {groups}, "
                   f"{plural(c.creations, 'group creation')} per rank{reuse}; "
                   f"about {c.seconds / 60:.1f} min")
        out += [f"      each measuring rank issues {x}" for x in c.issued]
        if c.check.by_nodes and c.rounds and c.rounds[0]:
            out.append(f"      judged by {floors_line(c.check, len(c.rounds[0][0].nodes))}")
    out.append("  after each measurement: the cross-rank statistics in the target's group, a "
               "barrier on the host (the launcher's store), then one all_gather_object of the "
               "round's results on every rank")
    out.append(f"  estimated: {route.profile.warmup} warmup + {route.profile.iters} timed + 1 "
               f"checked call per measurement at the profile's warn figure (checks against "
               f"peers: {ASSUMED_BUSBW_GBPS['node']:.0f} GB/s busbw in a node, "
               f"{ASSUMED_BUSBW_GBPS['pair']:.0f} between nodes), plus {SETUP_S:.0f} s per "
               f"measurement, {CREATE_S:.0f} s per group creation and {ROUND_S} s per round; "
               "retests add rounds (and group creations) only where a target fails")
    out.append(f"plan: {plural(len(route.legs), 'check')}, {plural(route.rounds, 'round')}, "
               f"{plural(route.creations, 'group creation')} per rank, about "
               f"{math.ceil(route.seconds / 60)} min")
    return out
