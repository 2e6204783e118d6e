"""`distbench topo`: the topology snapshot every benchmark run stores, without a benchmark.
Standalone it snapshots this machine; under torchrun, one snapshot per node, gathered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_OK
from distbench.core.options import RunOptions

if TYPE_CHECKING:
    from distbench.run.session import Session

HELP = ("Topology snapshot (nvidia-smi topo -m, NVML inventory, CPU/NUMA): this machine, or "
        "one per node under torchrun.")
EXAMPLES = (
    "distbench topo                  # this machine",
)


@dataclass(kw_only=True)
class TopoOptions(RunOptions):
    workers: int | None = field(default=None)  # not an option: one machine needs no workers
    # Not an option either: the snapshots travel through the launcher's store before any
    # process group exists, and the group topo then needs is gloo's, so a broken NCCL (the
    # very thing a topology snapshot is taken to look into) cannot block it.
    backend: str = field(default="gloo")


def run(s: Session) -> int:
    """Per rank, under a launcher: the session start has already gathered one snapshot per
    node."""
    from distbench.platform import topo

    s.console.lines(topo.summary_lines(s.rt.snapshots))
    return EXIT_OK


def run_local(opts: TopoOptions) -> int:
    """No workers needed to look at one machine."""
    from distbench.platform import topo
    from distbench.results import writer
    from distbench.run.console import Console

    snapshots = [topo.node_snapshot()]
    run_dir = writer.new_run_dir(opts.out, "topo")
    record = writer.RunRecord(run_dir, "topo", opts.to_json(), opts.argv)
    record.update(nnodes=1)
    writer.write_topology(run_dir, snapshots)
    console = Console(True)
    console.lines(topo.summary_lines(snapshots))
    record.finish("ok", EXIT_OK)
    console.log(f"results in {run_dir}/")
    return EXIT_OK
