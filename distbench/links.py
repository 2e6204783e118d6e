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


def culprits(outliers: list[Outlier], gpus: dict[int, str] | None = None) -> list[str]:
    """The rank, then the host, that most of the slowness goes through: one slow GPU or NIC
    drags down every link it is on. Each outlier link counts by how far it fell short
    (1 - fraction of its median), so one marginal, noisy link cannot tie with a rank whose links
    are all far below; the top one is named when it holds over half of that weight. `gpus`:
    each rank's GPU bus id, which names the physical GPU where host:local_rank may not."""
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
                "host": {lk.src_name.rsplit(":", 1)[0], lk.dst_name.rsplit(":", 1)[0]}}
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
