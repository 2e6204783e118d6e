"""Which nodes meet in which round of a pair check: the circle method (N-1 rounds of N/2
disjoint pairs, every pair of nodes exactly once, the pairs of a round measured at the same
time), one quick round, and the retests that confirm a suspect node. Pure: no torch."""

from __future__ import annotations

Pair = tuple[int, int]  # node indices, lower first


def circle_rounds(nodes: int) -> list[list[Pair]]:
    """Round-robin pairing: node 0 stays, the others turn; with an odd count one node sits
    each round out (paired with nobody)."""
    return [circle_round(nodes, r) for r in range(circle_count(nodes))]


def circle_count(nodes: int) -> int:
    """How many rounds circle_rounds has: N - 1 for an even N, N for an odd one (each a round
    that one node sits out), none for one node."""
    return 0 if nodes < 2 else nodes - 1 + nodes % 2


def circle_round(nodes: int, r: int) -> list[Pair]:
    """Round r of circle_rounds, made alone: O(N), where making every round to reach one is
    O(N^2) (4.5 million pairs at 3000 nodes). The circle of m places (N, and one empty place
    for an odd N) keeps node 0 in place 0 and turns the others by one place a round: place j
    holds 1 + (j - 1 - r) mod (m - 1), and place i meets place m - 1 - i."""
    if not 0 <= r < circle_count(nodes):
        raise IndexError(f"round {r} of {circle_count(nodes)}")
    m = nodes + nodes % 2  # the empty place of an odd count is node `nodes`: nobody

    def at(j: int) -> int:
        return 0 if j == 0 else 1 + (j - 1 - r) % (m - 1)

    pairs = ((at(i), at(m - 1 - i)) for i in range(m // 2))
    return sorted((min(a, b), max(a, b)) for a, b in pairs if a < nodes and b < nodes)


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
