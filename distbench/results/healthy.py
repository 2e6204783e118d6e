"""What the healthy members of a class reach, when the bad ones may be most of them: a node slow in
both directions is on 4 of the 6 directed links among 3 nodes and on half of them among 4, so it
sets the class median; two slow nodes among 4 are on 5 of their 6 pairs. Pure.

Each item is a value (higher is better) and the ends it involves (ranks, hosts, nodes). An item
is as fast as its slowest end allows, so what an end can do shows in its best item: a healthy
node has at least one fast pair (with another healthy node) however many of its partners are
slow, while every pair of a slow node is slow. An end is left out when its best item is under
`clearly` x what the other ends reach at their best (their upper median: a slow end is seen as
long as the healthy ends are about half of the others, so two slow nodes among 4 or 5 are both
seen); the clearest first, then again among what is left, until no end stands out. The
reference is the median of the items left, never below the plain median.

Comparing best items keeps healthy-but-noisy values quiet by construction: an end's best is at
least the smallest item and the others' upper median at most the largest, so no end is left out
unless the items spread wider than 1 / `clearly` (10x at `clearly` = 0.1). The means of the
items on and off an end, which this rule once compared, miss where the bad ends are many: off
one of two slow nodes among 4 are 2 slow pairs and 1 healthy one, whose mean is about a third
of the healthy pair's, so a node slowed 20x looked only 7x slow against it."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from distbench.core.tables import plural

# By default an end is left out only when its best item is under this share of what the other
# ends reach at theirs: a fault, not noise. Healthy links and nodes vary by up to ~2x on a busy
# machine, and leaving out ends unguarded would lift a noisy class toward its fastest item. A
# check that fails at a stricter share (0.8 of the peers) passes its own.
CLEARLY_SLOW = 0.5

Item = tuple[float, frozenset]  # (value, the ends it is on)


@dataclass(frozen=True)
class Reach:
    value: float
    basis: str  # "median of all 6 links", "median of the 2 links not on rank 2 (vm:2)"
    compared: bool  # False: every item involves every end, nothing to compare with
    # the names of the ends left out as clearly slow, the clearest first (also when the plain
    # median was kept as the reference, being higher)
    out: tuple[str, ...] = ()


def _upper_median(values: list[float]) -> float:
    """The median, or the higher of the two middle values: with two others, the better one."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def reach(items: Sequence[Item], ends: Sequence[tuple[str, Hashable]] | None = None,
          noun: tuple[str, str] = ("item", "items"), clearly: float = CLEARLY_SLOW) -> Reach:
    """What the healthy items reach. `ends`: (a name for it, the end) in the order to try them
    (coarser first, so that a tie names the host rather than one of its ranks); default: every
    end the items are on. `noun`: how the basis counts items (singular, plural). `clearly`: the
    share of the other ends' best under which an end's best item is slow."""
    median = statistics.median(v for v, _ in items)
    if ends is None:
        ends = [(str(e), e) for e in sorted({e for _, on in items for e in on}, key=str)]
    compared = any(any(end not in where for _, where in items) for _, end in ends)
    left, out = list(items), []
    while True:
        # an end with every item left on it has nothing off it to be told apart from
        best = {}
        for name, end in ends:
            on = [v for v, where in left if end in where]
            if on and len(on) < len(left):
                best[name] = (max(on), end)
        worst = None  # (its share, its name, the end)
        for name, (top, end) in best.items():
            others = [t for other, (t, _) in best.items() if other != name]
            if not others:
                continue
            peers = _upper_median(others)
            share = top / peers if peers > 0 else 1.0
            if share < clearly and (worst is None or share < worst[0]):
                worst = (share, name, end)
        if worst is None:
            break
        out.append(worst[1])
        left = [(v, where) for v, where in left if worst[2] not in where]
    rest = statistics.median(v for v, _ in left)
    # Never below the plain median: leaving out ends must only ever find more slow items than
    # the median rule would, never fewer.
    if not out or rest <= median:
        every = "all " if len(items) > 1 else "the "  # not "all 1 link"
        return Reach(median, f"median of {every}{plural(len(items), *noun)}", compared,
                     tuple(out))
    return Reach(rest, f"median of the {plural(len(left), *noun)} not on {', '.join(out)}",
                 compared, tuple(out))
