"""What `distbench collective` measures, typed: each op x dtype x redop x placement it was asked
for, and why one cannot run (decided before any measurement). bench.series turns each into a
Series. Torch-free, so the command line names them without loading torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distbench.core import dtypes
from distbench.ops.collectives import OPS, CollectiveOp, Ctx


@dataclass(frozen=True)
class Combination:
    op: CollectiveOp
    dtype: str
    redop: str  # "none" for ops that do not reduce
    root: int  # -1 for ops without a root
    in_place: bool
    skip: str = ""  # why this combination cannot run, decided before any measurement

    def ctx(self, rank: int, n: int) -> Ctx:
        return Ctx(rank, n, self.root, self.redop if self.redop != "none" else "sum",
                   self.in_place)


def combinations(ops: Sequence[str], dtype_names: Sequence[str], redops: Sequence[str],
                 root: int, placement: str) -> list[Combination]:
    """Every combination of the options (--op, --dtype, --redop, --root, --placement); an op
    without an out-of-place form measures in place, one without an in-place form asked for in
    place is a skipped combination that says why."""
    out = []
    wanted = {"out": [False], "in": [True], "both": [False, True]}[placement]
    for name in ops:
        op = OPS[name]
        op_root = root if op.uses_root else -1
        for dtype in dtype_names:
            for redop in redops if op.uses_redop else ["none"]:
                skip = ""
                if redop == "avg" and dtype not in dtypes.FLOATS:
                    skip = "avg needs a floating-point dtype"
                places = [p for p in wanted if p in op.placements]
                if not places:
                    if placement == "in":  # asked for explicitly: say why not
                        out.append(Combination(op, dtype, redop, op_root, True,
                                               f"{name} has no in-place form in torch.distributed"))
                        continue
                    places = list(op.placements)  # out-of-place asked, op is in-place only
                out.extend(Combination(op, dtype, redop, op_root, in_place, skip)
                           for in_place in places)
    return out
