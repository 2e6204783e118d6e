"""`distbench collective`: every requested op x dtype x redop x placement over the size sweep,
bus bandwidth as nccl-tests reports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.bench.combinations import combinations
from distbench.core import contracts
from distbench.core.exitcodes import EXIT_BELOW, EXIT_OK
from distbench.core.options import (
    OptionError,
    SweepOptions,
    one_of,
    option,
    pick,
    require,
)
from distbench.core.tables import plural
from distbench.ops.collectives import OPS, names
from distbench.results.baseline import check_world as baseline_world
from distbench.results.baseline import option_check

if TYPE_CHECKING:
    from distbench.run.session import Session

REDOPS = ("sum", "prod", "max", "min", "avg")
PLACEMENTS = ("out", "in", "both")

HELP = "Time collectives over a size sweep; bus bandwidth as nccl-tests reports it."
EXAMPLES = (
    "distbench collective --op all --sizes 1K:16M:x4",
    "distbench collective --op all_reduce --sizes 8:256M:x2 --workers 4",
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
    baseline: str | None = option(
        None, "A previous collective run directory: print the comparison with it at the end "
        f"(as distbench compare), and exit {EXIT_BELOW} when a row is worse by more than 5% and "
        "beyond the noise the two runs show.", check=option_check("collective.csv"),
        cli_type=str, show_default=False)

    def buffer_multiple(self, world: int) -> int:
        return max(op.elements(op.in_mult, 1, world) + op.elements(op.out_mult, 1, world)
                   for op in (OPS[name] for name in self.ops))

    def check_world(self, world: int) -> None:
        if self.root >= world:
            raise OptionError("--root", f"rank {self.root} does not exist in a world of {world}",
                              "--root 0")
        baseline_world(self.baseline, ("collective.csv",), world)


OUTPUT = contracts.COLLECTIVE


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.bench import engine, series
    from distbench.bench.measure import fail_if_wrong

    rt, opts = s.rt, s.opts
    combos = combinations(opts.ops, opts.dtypes, opts.redops, opts.root, opts.placement)
    if opts.placement == "out" and any(c.in_place for c in combos):
        in_only = sorted({c.op.name for c in combos if c.in_place})
        s.console.log(f"{', '.join(in_only)}: in place only in torch.distributed; "
                      "their rows say in_place=1")
    s.console.log(f"{plural(len(combos), 'combination')} x {plural(len(opts.sizes), 'size')} "
                  f"on {plural(rt.world, 'rank')}, {plural(rt.nnodes, 'node')}, backend "
                  f"{rt.backend}, results in {s.run_dir}/")
    fail_if_wrong(engine.run(s, [series.collective(s, c, OUTPUT) for c in combos]))
    if opts.baseline:
        from distbench.bench.baseline_gate import judge

        judge(s)
    return EXIT_OK
