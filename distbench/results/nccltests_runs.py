"""What an nccl-tests run holds as nccltests.py reads it, from its text log (nccltests_text.py)
or its -J JSON file (nccltests_json.py): the run, each size's line and each placement's figures,
before they are made collective.csv rows; the collectives' names; and the values' checks.
No torch here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# An nccl-tests binary, less its "_perf", as distbench names the collective. File names get
# the spellings people use too.
TESTS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "bcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "gather": "gather",
    "scatter": "scatter",
    "sendrecv": "sendrecv",
    "hypercube": "hypercube",
}
# an nccl-tests binary named in a path or a command line: all_reduce_perf -> all_reduce
PERF = re.compile(r"([A-Za-z0-9_]+?)_perf(?![A-Za-z0-9])")


@dataclass
class NcclPlacement:
    """One placement's figures (out of place 0, in place 1) on one size's line."""

    in_place: int
    time: object  # as printed (text) or written (JSON); checked when the row is made
    algbw: object
    busbw: object
    wrong: int | None = None
    p50: object = None
    p99: object = None
    cv: object = None
    notes: list[str] = field(default_factory=list)


@dataclass
class NcclSize:
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    placements: list[NcclPlacement]


@dataclass(frozen=True)
class NcclTable:
    idents: tuple[str, ...]  # the columns between type and time: redop, root, either or none
    group: tuple[str, ...]  # one placement's columns, from time on
    placements: int


@dataclass
class NcclRun:
    """One run of one nccl-tests binary (what nccl-tests calls a test)."""
    program: str | None = None  # the binary its header names
    mention: str | None = None  # the collective of a *_perf named before its table
    iters: int | None = None
    ranks: dict[int, tuple[int, str]] = field(default_factory=dict)  # rank -> (group, host)
    names: dict[int, str] = field(default_factory=dict)  # rank -> its device's name
    world_size: int | None = None
    nnodes: int | None = None
    layout: NcclTable | None = None
    table_open: bool = False
    notes: list[str] = field(default_factory=list)
    results: list[NcclSize] = field(default_factory=list)

    def begun(self) -> bool:
        return bool(self.program or self.iters or self.ranks or self.layout)



def as_number(value) -> float | None:
    """A finite number, from a printed token or a JSON value; None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def as_whole(value) -> int | None:
    x = as_number(value)
    return int(x) if x is not None and x == int(x) else None


def as_wrong_count(value) -> int | None:
    """#wrong: "N/A" (no check), and -1 from builds that print it for no check, are None."""
    n = as_whole(value)
    return n if n is not None and n >= 0 else None
