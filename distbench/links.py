"""Judging a pairwise link matrix: which links are slow against their own class (intra-node links
and inter-node links are judged apart, as their hardware differs), and which rank or host is
the likely culprit. Pure data in, data out: no torch, no process group."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Outlier:
    link: Link
    median_gbps: float

    @property
    def fraction(self) -> float:
        return self.link.gbps / self.median_gbps if self.median_gbps else 0.0

    def describe(self) -> str:
        lk = self.link
        arrow = "<->" if lk.direction == "bi" else "->"
        return (f"{lk.src_name} {arrow} {lk.dst_name} ({lk.link}, {lk.direction}, "
                f"{lk.size_bytes} B): {lk.gbps:.3g} GB/s = {self.fraction:.0%} of the "
                f"{lk.link}-node median {self.median_gbps:.3g} GB/s")


def find_outliers(links: list[Link], below: float) -> list[Outlier]:
    """Links under `below` x the median of their (direction, size, intra|inter) class."""
    groups: dict[tuple, list[Link]] = {}
    for lk in links:
        groups.setdefault((lk.direction, lk.size_bytes, lk.link), []).append(lk)
    out = []
    for members in groups.values():
        median = statistics.median(lk.gbps for lk in members)
        out.extend(Outlier(lk, median) for lk in members if lk.gbps < below * median)
    return sorted(out, key=lambda o: o.fraction)


def culprits(outliers: list[Outlier]) -> list[str]:
    """The rank, then the host, that takes part in the most outlier links, when that is more
    than half of them: one slow GPU or NIC drags down every link it is on."""
    if not outliers:
        return []
    total = len(outliers)
    names: dict[int, str] = {}
    ranks: Counter[int] = Counter()
    hosts: Counter[str] = Counter()
    for o in outliers:
        lk = o.link
        names[lk.src_rank], names[lk.dst_rank] = lk.src_name, lk.dst_name
        ranks.update({lk.src_rank, lk.dst_rank})
        hosts.update({lk.src_name.rsplit(":", 1)[0], lk.dst_name.rsplit(":", 1)[0]})
    found = []
    for counter, label in ((ranks, "rank"), (hosts, "host")):
        top = counter.most_common(2)
        count = top[0][1]
        unique = len(top) == 1 or top[1][1] < count
        if count * 2 > total and unique and (label == "rank" or len(hosts) > 1):
            who = top[0][0]
            what = f"rank {who} ({names[who]})" if label == "rank" else f"host {who}"
            found.append(f"{what}: in {count} of {total} slow links")
    return found
