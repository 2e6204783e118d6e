"""Rounds of node pairs: every pair exactly once, the pairs of a round disjoint."""

from __future__ import annotations

import itertools

import pytest

from distbench.kinds.accept.schedule import (
    circle_count,
    circle_round,
    circle_rounds,
    quick_round,
    retest_rounds,
)


@pytest.mark.parametrize("nodes", range(2, 10))
def test_the_circle_meets_every_pair_once_in_disjoint_rounds(nodes):
    rounds = circle_rounds(nodes)
    assert len(rounds) == (nodes - 1 if nodes % 2 == 0 else nodes)
    met = [pair for r in rounds for pair in r]
    assert sorted(met) == list(itertools.combinations(range(nodes), 2))
    for r in rounds:
        busy = [n for pair in r for n in pair]
        assert len(busy) == len(set(busy))  # a node is in one pair of a round at most
        assert len(r) == nodes // 2


def _turning(nodes: int) -> list[list[tuple[int, int]]]:
    """The circle method as first written: every round made by turning the last one's."""
    ring: list = list(range(nodes)) + ([None] if nodes % 2 else [])
    m = len(ring)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ring[i], ring[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs
                             if a is not None and b is not None))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return [r for r in rounds if r]


@pytest.mark.parametrize("nodes", [*range(1, 41), 127, 128])
def test_any_round_is_made_alone_as_turning_the_circle_makes_it(nodes):
    """circle_round(n, r) without rounds 0 to r - 1: what a dry run of thousands of nodes asks
    for, round 0 alone, and what the run makes one round at a time."""
    expected = _turning(nodes)
    assert circle_count(nodes) == len(expected)
    assert [circle_round(nodes, r) for r in range(circle_count(nodes))] == expected
    with pytest.raises(IndexError):
        circle_round(nodes, circle_count(nodes))


def test_small_counts():
    assert circle_rounds(1) == [] and circle_rounds(2) == [[(0, 1)]]
    assert circle_rounds(3) == [[(1, 2)], [(0, 2)], [(0, 1)]]


def test_quick_pairs_even_with_odd_nodes():
    assert quick_round(4) == [[(0, 1), (2, 3)]]
    assert quick_round(5) == [[(0, 1), (2, 3)], [(0, 4)]]  # the odd node is not left out
    assert quick_round(3) == [[(0, 1)], [(0, 2)]]
    assert quick_round(1) == []


def test_each_suspect_is_retested_against_a_healthy_node():
    assert retest_rounds([2], [0, 1, 3]) == [[(0, 2)]]
    rounds = retest_rounds([2, 5], [0])  # one healthy node: one pair per round
    assert rounds == [[(0, 2)], [(0, 5)]]
    assert retest_rounds([2, 5], [0, 1]) == [[(0, 2), (1, 5)]]
    assert retest_rounds([2], []) == []
