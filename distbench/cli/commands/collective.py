"""`distbench collective`: every requested op x dtype x redop x placement over the size sweep,
bus bandwidth as nccl-tests reports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core import contracts, dtypes
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
from distbench.ops.collectives import OPS, CollectiveOp, Ctx, names
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


@dataclass(frozen=True)
class Plan:
    op: CollectiveOp
    dtype: str
    redop: str  # "none" for ops that do not reduce
    root: int  # -1 for ops without a root
    in_place: bool
    skip: str = ""  # why this combination cannot run, decided before any measurement

    def ctx(self, rank: int, n: int) -> Ctx:
        return Ctx(rank, n, self.root, self.redop if self.redop != "none" else "sum",
                   self.in_place)


def plans(opts: CollectiveOptions) -> list[Plan]:
    out = []
    wanted = {"out": [False], "in": [True], "both": [False, True]}[opts.placement]
    for name in opts.ops:
        op = OPS[name]
        root = opts.root if op.uses_root else -1
        for dtype in opts.dtypes:
            for redop in opts.redops if op.uses_redop else ["none"]:
                skip = ""
                if redop == "avg" and dtype not in dtypes.FLOATS:
                    skip = "avg needs a floating-point dtype"
                places = [p for p in wanted if p in op.placements]
                if not places:
                    if opts.placement == "in":  # asked for explicitly: say why not
                        out.append(Plan(op, dtype, redop, root, True,
                                        f"{name} has no in-place form in torch.distributed"))
                        continue
                    places = list(op.placements)  # out-of-place asked, op is in-place only
                out.extend(Plan(op, dtype, redop, root, in_place, skip) for in_place in places)
    return out


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.bench import engine, series
    from distbench.bench.measure import fail_if_wrong

    rt, opts = s.rt, s.opts
    all_plans = plans(opts)
    if opts.placement == "out" and any(p.in_place for p in all_plans):
        in_only = sorted({p.op.name for p in all_plans if p.in_place})
        s.console.log(f"{', '.join(in_only)}: in place only in torch.distributed; "
                      "their rows say in_place=1")
    s.console.log(f"{plural(len(all_plans), 'combination')} x {plural(len(opts.sizes), 'size')} "
                  f"on {plural(rt.world, 'rank')}, {plural(rt.nnodes, 'node')}, backend "
                  f"{rt.backend}, results in {s.run_dir}/")
    fail_if_wrong(engine.run(s, [series.collective(s, plan, OUTPUT) for plan in all_plans]))
    if opts.baseline:
        from distbench.bench.baseline_gate import judge

        judge(s)
    return EXIT_OK
