"""`distbench collective`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.bench.combinations import combinations
from distbench.core.exitcodes import EXIT_OK
from distbench.core.tables import plural
from distbench.kinds.collective.options import group_of
from distbench.kinds.collective.output import OUTPUT

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.bench import engine, series
    from distbench.bench.measure import fail_if_wrong
    from distbench.run.split import split

    rt, opts = s.rt, s.opts
    combos = combinations(opts.ops, opts.dtypes, opts.redops, opts.root, opts.placement)
    if opts.placement == "out" and any(c.in_place for c in combos):
        in_only = sorted({c.op.name for c in combos if c.in_place})
        s.console.log(f"{', '.join(in_only)}: in place only in torch.distributed; "
                      "their rows say in_place=1")
    n = group_of(opts, rt.world)
    with split(rt, n, opts.group_stride, opts.timeout) as part:
        groups = (f", in {plural(len(part.members), 'group')} of {n} at stride "
                  f"{part.stride} ({plural(part.per_node, 'rank')} a node) all at once"
                  if n < rt.world else "")
        s.console.log(f"{plural(len(combos), 'combination')} x {plural(len(opts.sizes), 'size')} "
                      f"on {plural(rt.world, 'rank')}, {plural(rt.nnodes, 'node')}{groups}, "
                      f"backend {rt.backend}, results in {s.run_dir}/")
        if part.note:
            s.console.log(part.note)
        bad = engine.run(s, [series.collective(s, c, OUTPUT, part) for c in combos])
    fail_if_wrong(bad)
    if opts.baseline:
        from distbench.bench.baseline_gate import judge

        judge(s)
    return EXIT_OK
