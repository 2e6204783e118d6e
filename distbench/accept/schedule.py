"""Which nodes meet in which round of a pair check: the circle method (N-1 rounds of N/2
disjoint pairs, every pair of nodes exactly once, the pairs of a round measured at the same
time), one quick round, and the retests that confirm a suspect node. Pure: no torch."""

from __future__ import annotations

Pair = tuple[int, int]  # node indices, lower first


def circle_rounds(nodes: int) -> list[list[Pair]]:
    """Round-robin pairing: node 0 stays, the others turn; with an odd count one node sits
    each round out (paired with nobody)."""
    ring: list[int | None] = list(range(nodes)) + ([None] if nodes % 2 else [])
    m = len(ring)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ring[i], ring[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs
                             if a is not None and b is not None))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return [r for r in rounds if r]


def quick_round(nodes: int) -> list[list[Pair]]:
    """One round: even nodes with odd ones (0-1, 2-3, ...); an odd last node meets node 0 in a
    second round of its own, so that no node goes untested."""
    pairs = [(i, i + 1) for i in range(0, nodes - 1, 2)]
    rounds = [pairs] if pairs else []
    if nodes > 1 and nodes % 2:
        rounds.append([(0, nodes - 1)])
    return rounds


def pack(targets: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Targets (tuples of nodes) in rounds whose targets share no node, in order."""
    rounds: list[list[tuple[int, ...]]] = []
    for target in targets:
        for r in rounds:
            if not {*target} & {n for t in r for n in t}:
                r.append(target)
                break
        else:
            rounds.append([target])
    return rounds


def retest_rounds(suspects: list[int], healthy: list[int]) -> list[list[Pair]]:
    """Each suspect against a node that passed, so that its second opinion comes from a node
    known good; in rounds of disjoint pairs."""
    if not healthy:
        return []
    return pack([tuple(sorted((s, healthy[i % len(healthy)]))) for i, s in enumerate(suspects)])
