"""`distbench collective`: every requested op x dtype x redop x placement over the size sweep,
bus bandwidth as nccl-tests reports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core import rank_groups
from distbench.core.exitcodes import EXIT_BELOW
from distbench.core.options import (
    OptionError,
    SweepOptions,
    at_least,
    one_of,
    option,
    pick,
    require,
)
from distbench.ops.collectives import OPS, names
from distbench.results.baseline import check_world as baseline_world
from distbench.results.baseline import option_check

if TYPE_CHECKING:
    pass

REDOPS = ("sum", "prod", "max", "min", "avg")
PLACEMENTS = ("out", "in", "both")

HELP = "Time collectives over a size sweep; bus bandwidth as nccl-tests reports it."
EXAMPLES = (
    "distbench collective --op all --sizes 1K:16M:x4",
    "distbench collective --op all_reduce --sizes 8:256M:x2 --workers 4",
    "distbench collective --workers 8 --group-size 4 --group-stride 2  # tp2's DP",
    "distbench collective --baseline results/<run>   # exit 4 when slower",
)


@dataclass(kw_only=True)
class CollectiveOptions(SweepOptions):
    ops: list[str] = option(
        "all_reduce", lambda: f"Collectives, comma-separated, or 'all': {', '.join(names())}.",
        flag="op", check=pick(names, "--op all_reduce,all_gather"), cli_type=str)
    redops: list[str] = option("sum", f"{', '.join(REDOPS)}; comma list or 'all'.",
                               flag="redop", check=pick(REDOPS, "--redop sum"), cli_type=str)
    root: int = option(0, "Root rank for broadcast, reduce, gather, scatter.",
                       check=require(lambda v: v >= 0, "must be a rank (0 or more), got {value}",
                                     "--root 0"))
    placement: str = option("out", "out, in or both: out-of-place or in-place buffers.",
                            check=one_of(PLACEMENTS, "--placement both"))
    group_size: int | None = option(
        None, "Split the world into groups of this many ranks, every group running each op at "
        "once, as a layout's TP or DP groups do (torch's new_subgroups(group_size)); busbw is "
        "by the group's size. Default: the whole world, one group.",
        check=require(lambda v: v >= 2, "a group needs 2 ranks or more, got {value}",
                      "--group-size 2", optional=True), show_default=False)
    group_stride: int = option(
        1, "The ranks of a group are this far apart: 1 takes consecutive ranks ({0,1}, {2,3}), "
        "S every S-th ({r, r+S, ...}: the DP group of a layout of tp S, which crosses nodes "
        "with fewer ranks on each). Needs --group-size x stride to divide the world.",
        check=at_least(1, "--group-stride 2"))
    baseline: str | None = option(
        None, "A previous collective run directory: print the comparison with it at the end "
        f"(as distbench compare), and exit {EXIT_BELOW} when a row is worse by more than 5% and "
        "beyond the noise the two runs show.", check=option_check("collective.csv"),
        cli_type=str, show_default=False)

    def buffer_multiple(self, world: int) -> int:
        n = group_of(self, world)
        return max(op.elements(op.in_mult, 1, n) + op.elements(op.out_mult, 1, n)
                   for op in (OPS[name] for name in self.ops))

    def check_world(self, world: int) -> None:
        if self.group_size is not None or self.group_stride != 1:
            rank_groups.check(world, group_of(self, world), self.group_stride,
                              size_given=self.group_size is not None)
        n = group_of(self, world)
        if self.root >= n:
            where = (f"a group of {n} (the root is a rank of each group)" if n < world
                     else f"a world of {world}")
            raise OptionError("--root", f"rank {self.root} does not exist in {where}", "--root 0")
        baseline_world(self.baseline, ("collective.csv",), world)
        _baseline_groups(self.baseline, world, n, self.group_stride)


def _baseline_groups(value: str | None, world: int, size: int, stride: int) -> None:
    """A baseline measured on other groups (`--group-size`, `--group-stride`) has no
    row to compare: refused now. A run that records no groups ran on the whole world."""
    from distbench.platform import env

    if value is None or not env.reads_files():
        return
    from distbench.results.baseline import EXAMPLE, load

    frame = load(value, ("collective.csv",)).tables["collective.csv"]
    shapes = {(int(g), int(st)) for g, st in frame[["group_size", "group_stride"]].dropna()
              .itertuples(index=False)} if "group_size" in frame.columns else set()
    if not shapes:
        shapes = {(int(w), 1) for w in frame["world_size"].dropna()}
    if (size, stride) not in shapes:
        said = ", ".join(f"groups of {g} at stride {st}" for g, st in sorted(shapes))
        raise OptionError("--baseline", f"{value!r} was measured on {said or 'no groups'}, "
                          f"this run on groups of {size} at stride {stride}: no row to compare",
                          EXAMPLE)


def group_of(opts, world: int) -> int:
    """The ranks each op runs on: --group-size, else the world."""
    return opts.group_size or world
