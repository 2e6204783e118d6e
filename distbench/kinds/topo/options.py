"""`distbench topo`: the topology snapshot every benchmark run stores, without a benchmark.
Standalone it snapshots this machine; under torchrun, one snapshot per node, gathered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distbench.core.options import RunOptions

if TYPE_CHECKING:
    pass

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


