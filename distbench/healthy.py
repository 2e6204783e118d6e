"""What the healthy members of a class reach, when a bad one may be many of them: a node slow in
both directions is on 4 of the 6 directed links among 3 nodes and on half of them among 4, so it
sets the class median. Each item is a value (higher is better) and the ends it involves (ranks,
hosts, nodes); the reference is the median of the items off whichever end has its items clearly
slower than the rest, the best such view where several do, never below the plain median. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

# An end is left out only when the items on it are, in the median, under this share of what the
# items off it reach: a fault, not noise. Healthy links and nodes vary by up to ~2x on a busy
# machine, and taking the best view unguarded would lift a noisy class toward its fastest item.
CLEARLY_SLOW = 0.5

Item = tuple[float, frozenset]  # (value, the ends it is on)


@dataclass(frozen=True)
class Reach:
    value: float
    basis: str  # "median of all 6 links", "median of the 2 links not on rank 2 (vm:2)"
    compared: bool  # False: every item involves every end, nothing to compare with


def reach(items: Sequence[Item], ends: Sequence[tuple[str, Hashable]] | None = None,
          noun: tuple[str, str] = ("item", "items")) -> Reach:
    """What the healthy items reach. `ends`: (a name for it, the end) in the order to try them
    (coarser first, so that a tie names the host rather than one of its ranks); default: every
    end the items are on. `noun`: how the basis counts items (singular, plural)."""
    def counted(k: int) -> str:
        return f"{k} {noun[0] if k == 1 else noun[1]}"

    median = statistics.median(v for v, _ in items)
    if ends is None:
        ends = [(str(e), e) for e in sorted({e for _, on in items for e in on}, key=str)]
    views = [(f"all {counted(len(items))}", median)]  # first, so ties keep the plainest basis
    compared = False
    for name, end in ends:
        on = [v for v, where in items if end in where]
        off = [v for v, where in items if end not in where]
        compared |= bool(off)
        if on and off and statistics.median(on) < CLEARLY_SLOW * statistics.median(off):
            views.append((f"the {counted(len(off))} not on {name}", statistics.median(off)))
    label, value = max(views, key=lambda view: view[1])
    return Reach(value, f"median of {label}", compared)
