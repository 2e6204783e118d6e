"""distbench.links: slow links are judged against their own class (direction, size, intra|inter),
and the culprit is named only when one rank (or host) is in more than half of the slow links."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest

from distbench.links import Link, Outlier, culprits, find_outliers


def _names(hosts: list[str]) -> list[str]:
    """host:local_rank for each rank, local ranks counted per host in rank order."""
    seen: dict[str, int] = {}
    names = []
    for host in hosts:
        names.append(f"{host}:{seen.get(host, 0)}")
        seen[host] = seen.get(host, 0) + 1
    return names


def matrix(hosts: list[str], gbps: Callable[[int, int], float], *, direction: str = "uni",
           size_bytes: int = 1 << 20) -> list[Link]:
    """Every ordered pair of the ranks placed on `hosts` (rank i on hosts[i])."""
    names = _names(hosts)
    n = len(hosts)
    return [Link(s, d, names[s], names[d], "intra" if hosts[s] == hosts[d] else "inter",
                 direction, size_bytes, float(gbps(s, d)))
            for s in range(n) for d in range(n) if s != d]


def _pairs(outliers: list[Outlier]) -> set[tuple[int, int]]:
    return {(o.link.src_rank, o.link.dst_rank) for o in outliers}


def _slow_rank(rank: int, fast: float = 10.0, slow: float = 1.0) -> Callable[[int, int], float]:
    return lambda s, d: slow if rank in (s, d) else fast


# --------------------------------------------------------------------------------------------
# find_outliers
# --------------------------------------------------------------------------------------------

def test_slow_outgoing_links_of_one_rank_are_exactly_the_outliers():
    links = matrix(["a"] * 3, lambda s, d: 1.0 if s == 2 else 10.0)
    out = find_outliers(links, 0.8)
    assert _pairs(out) == {(2, 0), (2, 1)}
    assert all(o.median_gbps == 10.0 for o in out)
    assert all(o.fraction == pytest.approx(0.1) for o in out)


def test_uniform_links_have_no_outliers():
    assert find_outliers(matrix(["a"] * 4, lambda s, d: 7.5), 0.8) == []
    assert find_outliers([], 0.8) == []


def test_inter_node_links_are_judged_against_inter_node_links():
    # 4 ranks on host a, 1 on host b: 12 intra links at 10 GB/s, 8 inter links at 1 GB/s.
    # Far below the global median (10), but every inter link is at its own class median.
    hosts = ["a"] * 4 + ["b"]
    links = matrix(hosts, lambda s, d: 10.0 if hosts[s] == hosts[d] else 1.0)
    assert [lk.link for lk in links].count("intra") == 12
    assert [lk.link for lk in links].count("inter") == 8
    assert statistics.median(lk.gbps for lk in links) == 10.0
    assert find_outliers(links, 0.8) == []


def test_slow_inter_link_is_found_within_its_class():
    hosts = ["a", "a", "b", "b"]

    def speed(s, d):
        if (s, d) == (1, 2):
            return 0.5
        return 10.0 if hosts[s] == hosts[d] else 1.0

    out = find_outliers(matrix(hosts, speed), 0.8)
    assert _pairs(out) == {(1, 2)}
    (o,) = out
    assert o.link.link == "inter"
    assert o.median_gbps == 1.0  # the inter-node median, not the global one
    assert o.fraction == pytest.approx(0.5)


def test_sizes_are_judged_apart():
    # Small messages are slower everywhere; that is not an outlier.
    small = matrix(["a"] * 3, lambda s, d: 1.0, size_bytes=1024)
    big = matrix(["a"] * 3, lambda s, d: 2.0 if (s, d) == (0, 1) else 10.0, size_bytes=1 << 20)
    out = find_outliers(small + big, 0.8)
    assert [(o.link.size_bytes, o.link.src_rank, o.link.dst_rank) for o in out] == [
        (1 << 20, 0, 1)]
    assert out[0].median_gbps == 10.0


def test_directions_are_judged_apart():
    uni = matrix(["a"] * 3, lambda s, d: 10.0, direction="uni")
    bi = matrix(["a"] * 3, lambda s, d: 18.0 if (s, d) != (1, 0) else 9.0, direction="bi")
    out = find_outliers(uni + bi, 0.8)
    assert [(o.link.direction, o.link.src_rank, o.link.dst_rank) for o in out] == [("bi", 1, 0)]
    assert out[0].median_gbps == 18.0


def test_boundary_exactly_below_times_median_is_not_an_outlier():
    # median 10, below 0.5: 5.0 sits exactly on the line (not flagged), 4.99 is under it
    links = matrix(["a"] * 3, lambda s, d: {(0, 1): 5.0, (1, 0): 4.99}.get((s, d), 10.0))
    out = find_outliers(links, 0.5)
    assert _pairs(out) == {(1, 0)}


def test_below_is_honoured():
    links = matrix(["a"] * 3, lambda s, d: 7.0 if s == 0 else 10.0)  # 70% of the median
    assert _pairs(find_outliers(links, 0.8)) == {(0, 1), (0, 2)}
    assert find_outliers(links, 0.6) == []
    assert find_outliers(links, 0.7) == []  # exactly at the line


def test_most_severe_first():
    speeds = {(0, 1): 6.0, (1, 2): 2.0, (2, 0): 4.0}
    out = find_outliers(matrix(["a"] * 4, lambda s, d: speeds.get((s, d), 10.0)), 0.8)
    assert [(o.link.src_rank, o.link.dst_rank) for o in out] == [(1, 2), (2, 0), (0, 1)]
    fractions = [o.fraction for o in out]
    assert fractions == sorted(fractions)


# --------------------------------------------------------------------------------------------
# Outlier.describe
# --------------------------------------------------------------------------------------------

def test_describe_names_the_link_arrow_and_percentage():
    lk = Link(3, 1, "nodeb:1", "nodea:1", "inter", "uni", 4096, 2.5)
    text = Outlier(lk, 10.0).describe()
    assert text.startswith("nodeb:1 -> nodea:1 ")
    assert "<->" not in text
    assert "25%" in text
    assert "2.5 GB/s" in text and "10 GB/s" in text
    assert "inter-node median" in text
    assert "4096 B" in text


def test_describe_bidirectional_arrow():
    lk = Link(0, 1, "h:0", "h:1", "intra", "bi", 8, 3.0)
    text = Outlier(lk, 12.0).describe()
    assert "h:0 <-> h:1" in text
    assert "25%" in text
    assert "intra-node median" in text


def test_fraction_with_zero_median():
    assert Outlier(Link(0, 1, "h:0", "h:1", "intra", "uni", 8, 0.0), 0.0).fraction == 0.0


# --------------------------------------------------------------------------------------------
# culprits
# --------------------------------------------------------------------------------------------

def test_culprits_of_nothing():
    assert culprits([]) == []


def test_one_slow_rank_is_named():
    out = find_outliers(matrix(["n"] * 4, _slow_rank(2)), 0.8)
    assert len(out) == 6  # 2->x and x->2 for the 3 others
    found = culprits(out)
    assert found == ["rank 2 (n:2): in 6 of 6 slow links"]  # one host: no host line


def test_one_slow_link_is_a_tie_and_names_no_rank():
    speeds = {(0, 1): 1.0, (1, 0): 1.0}
    out = find_outliers(matrix(["n"] * 4, lambda s, d: speeds.get((s, d), 10.0)), 0.8)
    assert _pairs(out) == {(0, 1), (1, 0)}
    assert culprits(out) == []


def test_rank_in_no_more_than_half_is_not_named():
    # Two disjoint slow links: each rank is in 1 of 2 (half, not more than half).
    speeds = {(0, 1): 1.0, (2, 3): 1.0}
    out = find_outliers(matrix(["n"] * 6, lambda s, d: speeds.get((s, d), 10.0)), 0.8)
    assert len(out) == 2
    assert culprits(out) == []


def test_rank_in_exactly_half_is_not_named():
    # Rank 0 is in 2 of 4 equally slow links (0.5 of the median: exact in binary), no other
    # rank in more than 1: rank 0 leads but does not hold more than half, so it is not named.
    speeds = {(0, 1): 4.0, (0, 2): 4.0, (3, 4): 4.0, (5, 6): 4.0}
    out = find_outliers(matrix(["n"] * 8, lambda s, d: speeds.get((s, d), 8.0)), 0.8)
    assert _pairs(out) == set(speeds)
    assert culprits(out) == []
    # one more slow link on rank 0 tips it over half
    speeds[(7, 0)] = 4.0
    out = find_outliers(matrix(["n"] * 8, lambda s, d: speeds.get((s, d), 8.0)), 0.8)
    assert culprits(out) == ["rank 0 (n:0): in 3 of 5 slow links"]


def test_slow_rank_on_one_of_two_hosts_names_rank_and_host():
    hosts = ["a", "a", "b", "b"]
    out = find_outliers(matrix(hosts, _slow_rank(1)), 0.8)
    # intra: 1<->0 among {0<->1, 2<->3}; inter: 1<->2, 1<->3 among the 8 a<->b links
    assert _pairs(out) == {(1, 0), (0, 1), (1, 2), (2, 1), (1, 3), (3, 1)}
    found = culprits(out)
    assert found == ["rank 1 (a:1): in 6 of 6 slow links", "host a: in 6 of 6 slow links"]


def test_host_named_when_its_ranks_share_the_slow_links():
    # 5 hosts x 2 ranks; both ranks of host a slow on every inter-node link (a bad NIC). Each
    # rank of a is in exactly half of the slow links (not named), host a is in all of them.
    hosts = [h for h in "abcde" for _ in range(2)]

    def speed(s, d):
        if hosts[s] == hosts[d]:
            return 10.0
        return 1.0 if "a" in (hosts[s], hosts[d]) else 5.0

    out = find_outliers(matrix(hosts, speed), 0.8)
    assert len(out) == 2 * 8 * 2  # a's 2 ranks x 8 remote ranks x both directions
    assert all(o.link.link == "inter" and o.median_gbps == 5.0 for o in out)
    assert culprits(out) == ["host a: in 32 of 32 slow links"]
