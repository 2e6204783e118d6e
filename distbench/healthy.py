"""What the healthy members of a class reach, when the bad ones may be many of them: a node slow in
both directions is on 4 of the 6 directed links among 3 nodes and on half of them among 4, so it
sets the class median; two slow nodes among 4 are on 5 of their 6 pairs. Each item is a value
(higher is better) and the ends it involves (ranks, hosts, nodes). An end whose items are, on
average, clearly slower than the items off it is left out, the clearest first, and again among
what is left, until no end stands out; the reference is the median of what is left, never below
the plain median. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

# By default an end is left out only when the items on it reach, on average, under this share
# of what the items off it reach: a fault, not noise. Healthy links and nodes vary by up to ~2x
# on a busy machine, and leaving out ends unguarded would lift a noisy class toward its fastest
# item. A check that fails at a stricter share (0.8 of the peers) passes its own.
CLEARLY_SLOW = 0.5

Item = tuple[float, frozenset]  # (value, the ends it is on)


@dataclass(frozen=True)
class Reach:
    value: float
    basis: str  # "median of all 6 links", "median of the 2 links not on rank 2 (vm:2)"
    compared: bool  # False: every item involves every end, nothing to compare with


def reach(items: Sequence[Item], ends: Sequence[tuple[str, Hashable]] | None = None,
          noun: tuple[str, str] = ("item", "items"), clearly: float = CLEARLY_SLOW) -> Reach:
    """What the healthy items reach. `ends`: (a name for it, the end) in the order to try them
    (coarser first, so that a tie names the host rather than one of its ranks); default: every
    end the items are on. `noun`: how the basis counts items (singular, plural). `clearly`: the
    share under which an end's items are slow."""
    def counted(k: int) -> str:
        return f"{k} {noun[0] if k == 1 else noun[1]}"

    median = statistics.median(v for v, _ in items)
    if ends is None:
        ends = [(str(e), e) for e in sorted({e for _, on in items for e in on}, key=str)]
    compared = any(any(end not in where for _, where in items) for _, end in ends)
    left, out = list(items), []
    while True:
        worst = None  # (its share, its name, the items off it)
        for name, end in ends:
            on = [v for v, where in left if end in where]
            off = [(v, where) for v, where in left if end not in where]
            if not on or not off:
                continue
            share = statistics.fmean(on) / statistics.fmean(v for v, _ in off)
            if share < clearly and (worst is None or share < worst[0]):
                worst = (share, name, off)
        if worst is None:
            break
        out.append(worst[1])
        left = worst[2]
    rest = statistics.median(v for v, _ in left)
    if not out or rest <= median:
        return Reach(median, f"median of all {counted(len(items))}", compared)
    return Reach(rest, f"median of the {counted(len(left))} not on {', '.join(out)}", compared)
