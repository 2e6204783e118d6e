"""`distbench topo`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_OK
from distbench.kinds.topo.options import TopoOptions

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session) -> int:
    """Per rank, under a launcher: the session start has already gathered one snapshot per
    node."""
    from distbench.platform import topo_render

    s.console.lines(topo_render.summary_lines(s.rt.snapshots))
    return EXIT_OK


def run_local(opts: TopoOptions) -> int:
    """No workers needed to look at one machine."""
    from distbench.platform import topo_probe, topo_render
    from distbench.results import writer
    from distbench.run.console import Console

    snapshots = [topo_probe.node_snapshot()]
    record = writer.RunRecord.in_new_dir(opts.out, "topo", opts.to_json(), opts.argv)
    run_dir = record.path.parent
    record.update(nnodes=1)
    writer.write_topology(run_dir, snapshots)
    console = Console(True)
    console.lines(topo_render.summary_lines(snapshots))
    record.finish("ok", EXIT_OK)
    console.log(f"results in {run_dir}/")
    return EXIT_OK
