"""Judging a pairwise link matrix: which links are slow against what the healthy links of their
class reach (intra-node and inter-node links are judged apart, as their hardware differs, and so
are directions and sizes), and which rank or host is the likely culprit. Pure data in, data
out: no torch, no process group."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from distbench.results import healthy


@dataclass(frozen=True)
class Link:
    src_rank: int
    dst_rank: int
    src_name: str  # host:local_rank
    dst_name: str
    link: str  # "intra" or "inter"
    direction: str  # "uni" or "bi"
    size_bytes: int
    gbps: float


ClassKey = tuple[str, int, str]  # (direction, size_bytes, "intra" | "inter")


def class_of(lk: Link) -> ClassKey:
    return lk.direction, lk.size_bytes, lk.link


@dataclass(frozen=True)
class Expectation:
    """What the links of one class should reach. Derived from the links themselves
    (healthy_reference), or given: an absolute expectation for the hardware is passed as, say,
    Expectation(45.0, "expected", "profile h100: NVLink")."""
    gbps: float
    name: str  # how a finding names it: "... = 3% of the {name} 12.3 GB/s"
    basis: str  # what the figure rests on, for run.json


@dataclass(frozen=True)
class Outlier:
    link: Link
    reference_gbps: float
    reference: str = "reference"  # Expectation.name

    @property
    def fraction(self) -> float:
        return self.link.gbps / self.reference_gbps if self.reference_gbps else 0.0

    def describe(self) -> str:
        lk = self.link
        arrow = "<->" if lk.direction == "bi" else "->"
        return (f"{lk.src_name} {arrow} {lk.dst_name} ({lk.link}, {lk.direction}, "
                f"{lk.size_bytes} B): {lk.gbps:.3g} GB/s = {self.fraction:.0%} of the "
                f"{self.reference} {self.reference_gbps:.3g} GB/s")


def _host(name: str) -> str:
    return name.rsplit(":", 1)[0]


def _ends(members: list[Link]) -> dict[int, str]:
    """Every rank the links touch, with its host:local_rank."""
    names: dict[int, str] = {}
    for lk in members:
        names[lk.src_rank], names[lk.dst_rank] = lk.src_name, lk.dst_name
    return names


def _leave_outs(members: list[Link]) -> list[tuple[str, tuple[str, object]]]:
    """What a reference may leave out, in the order to try: each host of several ranks (a bad
    NIC slows all of them; first, so that a tie names the host), then each rank."""
    names = _ends(members)
    per_host = Counter(_host(name) for name in names.values())
    return ([(f"host {h}", ("host", h)) for h in sorted(h for h, k in per_host.items() if k > 1)]
            + [(f"rank {r} ({names[r]})", ("rank", r)) for r in sorted(names)])


def _items(members: list[Link]) -> list[healthy.Item]:
    """Each link as healthy.reach takes it: its GB/s, and the ranks and hosts it is on."""
    return [(lk.gbps, frozenset({("rank", lk.src_rank), ("rank", lk.dst_rank),
                                 ("host", _host(lk.src_name)), ("host", _host(lk.dst_name))}))
            for lk in members]


def healthy_reference(members: list[Link]) -> Expectation:
    """What the healthy links of one class reach (healthy.reach): a rank or host slow in both
    directions is on 4 of 6 links at 3 ranks and on half of them at 4, so it sets the class
    median, while the links off it are all healthy. Between two ranks every link is on both
    ends and there is nothing to compare with: the median, named as such."""
    kind = members[0].link
    found = healthy.reach(_items(members), _leave_outs(members), noun=("link", "links"))
    if not found.compared:
        return Expectation(found.value, f"{kind}-node median",
                         f"{found.basis} (only 2 ranks: either end may be slow)")
    return Expectation(found.value, f"healthy {kind}-node links'", found.basis)


def _classes(links: list[Link]) -> dict[ClassKey, list[Link]]:
    groups: dict[ClassKey, list[Link]] = {}
    for lk in links:
        groups.setdefault(class_of(lk), []).append(lk)
    return groups


def references(links: list[Link],
               given: Mapping[ClassKey, Expectation] | None = None) -> dict[ClassKey, Expectation]:
    """Each class's reference: the one `given` for it, else what its healthy links reach."""
    given = given or {}
    return {key: given[key] if key in given else healthy_reference(members)
            for key, members in _classes(links).items()}


def find_outliers(links: list[Link], below: float,
                  refs: Mapping[ClassKey, Expectation] | None = None) -> list[Outlier]:
    """Links under `below` x their class's reference (`refs`, or derived), the worst first."""
    refs = references(links, refs)
    out = []
    for lk in links:
        ref = refs[class_of(lk)]
        if lk.gbps < below * ref.gbps:
            out.append(Outlier(lk, ref.gbps, ref.name))
    return sorted(out, key=lambda o: o.fraction)


def blind_spots(links: list[Link]) -> list[str]:
    """What the matrix cannot tell, one line each: links between only two ranks (or, across
    nodes, two hosts) are each on both ends, so a rank (host) slow in both directions looks
    like a slow link, or a slow network, and which end is slow is not known."""
    found = []
    for kind in ("intra", "inter"):
        names = _ends([lk for lk in links if lk.link == kind])
        hosts = sorted({_host(name) for name in names.values()})
        if len(names) == 2:
            a, b = sorted(names.values())
            found.append(f"the {kind}-node links join only {a} and {b}: a rank slow in both "
                         "directions looks like a slow link, and which end is slow cannot be "
                         "told")
        elif kind == "inter" and len(hosts) == 2:
            found.append(f"the inter-node links join only hosts {hosts[0]} and {hosts[1]}: a "
                         "host slow in both directions (a bad NIC or cable) looks like a slow "
                         "network, and which host is slow cannot be told")
    return found


def culprits(outliers: list[Outlier], gpus: dict[int, str] | None = None) -> list[str]:
    """The rank, then the host, that most of the slowness goes through: one slow GPU or NIC
    drags down every link it is on. Each outlier link counts by how far it fell short
    (1 - fraction of its reference), so one marginal, noisy link cannot tie with a rank whose
    links are all far below; the top one is named when it holds over half of that weight. A
    link's two ends weigh the same, so a lone slow link, or slow links all between the same two
    ranks, name neither. `gpus`: each rank's GPU bus id, which names the physical GPU where
    host:local_rank may not."""
    if not outliers:
        return []
    names: dict[int, str] = {}
    weight: dict[str, dict] = {"rank": {}, "host": {}}
    count: dict[str, Counter] = {"rank": Counter(), "host": Counter()}
    for o in outliers:
        lk = o.link
        names[lk.src_rank], names[lk.dst_rank] = lk.src_name, lk.dst_name
        short = 1.0 - o.fraction
        ends = {"rank": {lk.src_rank, lk.dst_rank},
                "host": {_host(lk.src_name), _host(lk.dst_name)}}
        for label, keys in ends.items():
            for key in keys:
                weight[label][key] = weight[label].get(key, 0.0) + short
                count[label][key] += 1
    total = sum(1.0 - o.fraction for o in outliers)
    found = []
    for label in ("rank", "host"):
        if label == "host" and len(weight["host"]) < 2:
            continue  # one host in every slow link says nothing beyond the rank
        ranked = sorted(weight[label].items(), key=lambda kv: -kv[1])
        who, top = ranked[0]
        if top * 2 > total and (len(ranked) == 1 or ranked[1][1] < top):
            gpu = f", GPU {gpus[who]}" if label == "rank" and (gpus or {}).get(who) else ""
            what = f"rank {who} ({names[who]}{gpu})" if label == "rank" else f"host {who}"
            found.append(f"{what}: in {count[label][who]} of {len(outliers)} slow links")
    return found
