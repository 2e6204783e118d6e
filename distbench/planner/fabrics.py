"""A declared fabric: what a cluster that does not exist yet (or was never measured) would give
a plan, as named presets with a source for each figure, or as explicit figures. `plan --fabric`
prices every group no measured fit covers from it (planner.inputs.Inputs.comm_us), and its GPU
gives the compute (planner.gpus) when none was measured. Torch-free.

The model is NCCL's own ring model (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, the
Simple protocol that carries the large messages a training step sends):

- bus bandwidth inside a node: what a ring reaches over NVLink/NVSwitch per GPU (`node_gbps`);
  across nodes: one NIC per rank the group has on each node, at most `nics_per_node`, each at
  `nic_gbps`, never above the in-node figure; a pipeline hop across nodes is one NIC's;
- latency: `base_us` plus each ring step inside a node at `node_hop_us` and each across nodes
  at `net_hop_us` (an all-reduce takes 2 (n - 1) steps, 2 (nodes - 1) of them across nodes; an
  all-gather or reduce-scatter n - 1 and nodes - 1; a hop one). For small messages NCCL
  switches to its LL protocols, faster than this: the latency is an upper bound there.

The bandwidths are what nccl-tests reach on those systems, cited below, not the link rates of
the datasheets (also cited), which no ring reaches."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from distbench.core.options import OptionError
from distbench.planner.gpus import GPUS
from distbench.planner.inputs import BUS, CommFit, Inputs, Span

EXAMPLE = "--fabric dgx-h100"

# NCCL's ring latencies for the Simple protocol, in us: baseLat[Ring][Simple], hwLat[NVLINK]
# [Ring][Simple] and hwLat[NET][Ring][Simple] (NVIDIA/nccl src/graph/tuning.cc)
NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc: the ring's Simple-protocol latencies"
BASE_US, NODE_HOP_US, NET_HOP_US = 8.4, 3.4, 9.6


@dataclass(frozen=True, kw_only=True)
class Fabric:
    name: str
    node_gbps: float  # bus bandwidth of a ring inside a node, per GPU, GB/s
    nic_gbps: float  # bus bandwidth one NIC carries on a ring across nodes, GB/s
    nics_per_node: int
    gpus_per_node: int | None = None
    gpu: str | None = None  # a planner.gpus name: its datasheet compute and memory
    base_us: float = BASE_US
    node_hop_us: float = NODE_HOP_US
    net_hop_us: float = NET_HOP_US
    # the source of each figure, by field name
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def busbw_gbps(self, op: str, span: Span) -> float:
        if not span.crosses:
            return self.node_gbps
        per_node = 1 if op == "sendrecv" else (span.per_node or self.whole_node)
        return min(self.node_gbps, min(per_node, self.nics_per_node) * self.nic_gbps)

    @property
    def whole_node(self) -> int:
        return self.gpus_per_node or self.nics_per_node

    def fit(self, op: str, ranks: int, span: Span) -> CommFit:
        """The CommFit of `op` on `ranks` ranks placed as `span`, from this fabric's figures."""
        per_node = ranks if not span.crosses else (span.per_node or self.whole_node)
        nodes = max(2, math.ceil(ranks / per_node)) if span.crosses else 1
        if op == "sendrecv":
            steps, across = 1, int(span.crosses)
        elif op == "all_reduce":
            steps, across = 2 * (ranks - 1), 2 * (nodes - 1)
        else:
            steps, across = ranks - 1, nodes - 1
        alpha = self.base_us + (steps - across) * self.node_hop_us + across * self.net_hop_us
        busbw = self.busbw_gbps(op, span)
        return CommFit(op=op, ranks=ranks, span="nodes" if span.crosses else "node",
                       per_node=per_node if span.crosses else None, alpha_us=alpha,
                       beta_gbps=busbw / (BUS[op](ranks) or 1.0),
                       source=f"--fabric {self.name}")

    def describe(self) -> list[str]:
        """One line per figure, with its source: what plan.md lists under its inputs."""
        lines = [f"--fabric {self.name}: {self.node_gbps:g} GB/s bus bandwidth inside a node "
                 f"({self.sources.get('node_gbps', 'given')}); {self.nics_per_node} NICs per "
                 f"node ({self.sources.get('nics_per_node', 'given')}) of {self.nic_gbps:g} "
                 f"GB/s each ({self.sources.get('nic_gbps', 'given')})"]
        if self.gpu:
            lines.append(f"--fabric {self.name}: {self.gpus_per_node or '?'} x {self.gpu} "
                         f"per node ({self.sources.get('gpu', 'given')})")
        lines.append(f"--fabric {self.name}: latency {self.base_us:g} us + {self.node_hop_us:g} "
                     f"us a ring step inside a node, {self.net_hop_us:g} across "
                     f"({self.sources.get('base_us', NCCL_TUNING)})")
        return lines


ACCEPT_MD = "docs/accept.md's table of published figures"
PRESETS: dict[str, Fabric] = {f.name: f for f in (
    Fabric(name="dgx-a100", gpu="a100", gpus_per_node=8, node_gbps=235.0, nic_gbps=24.0,
           nics_per_node=8, sources={
               "gpu": "DGX A100 80GB: 8 A100 SXM4 80GB, 312 TFLOP/s bf16 dense each (NVIDIA "
                      "A100 datasheet; planner/gpus.py)",
               "node_gbps": "NVLink 3 through 6 NVSwitches, 12 links, 600 GB/s both ways per "
                            "GPU (NVIDIA A100 white paper; nvidia.com NVLink page): 300 each "
                            "way; a ring reaches ~235 GB/s busbw on 8 A100s (NCCL's tuning "
                            "model caps sm80 rings at 235, NVIDIA/nccl src/graph/tuning.cc; "
                            f"230-250 published, {ACCEPT_MD})",
               "nics_per_node": "8 single-port ConnectX-6 HDR InfiniBand 200 Gb/s for the "
                                "compute fabric (NVIDIA DGX SuperPOD reference architecture "
                                "RA-09950-001; developer.nvidia.com/blog/defining-ai-"
                                "innovation-with-dgx-a100)",
               "nic_gbps": "200 Gb/s = 25 GB/s a link; ~24 GB/s a NIC reached on rings "
                           "across 3+ DGX A100 nodes, 192 GB/s busbw for 8 (NVIDIA, "
                           f"nccl#812, nccl-tests#119, nccl-tests#160; {ACCEPT_MD})"}),
    Fabric(name="dgx-h100", gpu="h100", gpus_per_node=8, node_gbps=370.0, nic_gbps=46.0,
           nics_per_node=8, sources={
               "gpu": "DGX H100: 8 H100 SXM5 80GB, 989 TFLOP/s bf16 dense each (NVIDIA H100 "
                      "datasheet; planner/gpus.py)",
               "node_gbps": "NVLink 4 through 4 NVSwitches, 18 links, 900 GB/s both ways per "
                            "GPU (nvidia.com Hopper architecture page): 450 each way; a ring "
                            "reaches ~370 GB/s busbw (NVIDIA, nccl-tests#212; ~480 for an "
                            f"all-reduce with NVLink SHARP, not modelled; {ACCEPT_MD})",
               "nics_per_node": "four OSFP ports serving 8 single-port ConnectX-7, 400 Gb/s "
                                "InfiniBand NDR (NVIDIA DGX BasePOD reference architecture, "
                                "docs.nvidia.com/dgx-basepod, core components)",
               "nic_gbps": "400 Gb/s = 50 GB/s a link; 46-48 GB/s a NIC reached on rings "
                           "across 2 nodes (NVIDIA, nccl-tests#290), 365.84 GB/s busbw for 8 "
                           f"on 4 HGX H100 nodes (nccl-tests#309; {ACCEPT_MD})"}),
    Fabric(name="dgx-h200", gpu="h200", gpus_per_node=8, node_gbps=370.0, nic_gbps=46.0,
           nics_per_node=8, sources={
               "gpu": "DGX H200: 8 H200 SXM 141GB, the H100's 989 TFLOP/s bf16 dense "
                      "(NVIDIA H200 datasheet; planner/gpus.py)",
               "node_gbps": "the DGX H100's NVLink 4 and NVSwitches (NVIDIA DGX BasePOD "
                            "reference architecture): ~370 GB/s a ring (nccl-tests#212)",
               "nics_per_node": "as the DGX H100: 8 single-port ConnectX-7, 400 Gb/s (NVIDIA "
                                "DGX BasePOD reference architecture)",
               "nic_gbps": "as the DGX H100's: 46 GB/s a NIC reached (nccl-tests#290)"}),
)}

def declare(inputs: Inputs, fabric: Fabric) -> Inputs:
    """`inputs` planned on `fabric`: every group no measured fit covers priced from it, its
    node size the plan's (a measured run's, a CPU's workers say, is not the cluster's), and
    its figures listed with their sources. What `plan --fabric` and benchmarks use alike."""
    inputs.fabric = fabric
    inputs.gpus_per_node = fabric.gpus_per_node or inputs.gpus_per_node
    inputs.sources += fabric.describe()
    return inputs


# the explicit figures `--fabric` takes, as key=value, and what each must be
KEYS = {"node_gbps": float, "nic_gbps": float, "nics_per_node": int, "gpus_per_node": int,
        "gpu": str, "base_us": float, "node_hop_us": float, "net_hop_us": float}
NEEDED = ("node_gbps", "nic_gbps", "nics_per_node")

# The most GPUs a node holds, `plan --gpus-per-node`'s bound and a fabric's gpus_per_node='s:
# several times the largest NVLink domain, where TP may stay (72 GPUs, GB200 NVL72; 576
# announced). No plan's layouts grow without bound from one number (issue 30).
MAX_GPUS_PER_NODE = 1024
# Each figure's range, from `low` to `high` in `unit`, like a measured fit's in inputs.json
# (planner/inputs_check.py): a declared figure was taken as any number above 0, and
# node_gbps=5e-324 ranked a NaN step first, base_us=1.7e308 gave inf steps, exit 0. The highs
# are several times the largest real figure, so no real fabric is refused: a ring's bus
# bandwidth inside a node of ~370 GB/s (NVLink 4; NVLink 5's link rate is 900 GB/s each way),
# 100 GB/s a NIC (800 Gb/s: ConnectX-8), 8 NICs and 8 GPUs a node (DGX/HGX; 72 in an NVL72),
# NCCL's latencies of 8.4 and 9.6 us (tens of us over TCP sockets). The bandwidths' low, 10
# MB/s (under a tenth of 1 Gb/s Ethernet), keeps a step's time finite; a latency may be 0, as
# a measured alpha may.
BOUNDS: dict[str, tuple[float, float, str]] = {
    "node_gbps": (0.01, 10_000, "GB/s"), "nic_gbps": (0.01, 1_000, "GB/s"),
    "nics_per_node": (1, MAX_GPUS_PER_NODE, ""), "gpus_per_node": (1, MAX_GPUS_PER_NODE, ""),
    "base_us": (0, 1_000, "us"), "node_hop_us": (0, 1_000, "us"),
    "net_hop_us": (0, 1_000, "us")}


def parse(option_name: str, text: str) -> Fabric:
    """A preset, a preset with figures replaced (`dgx-a100,nics_per_node=4`), or figures alone
    (`node_gbps=300,nic_gbps=25,nics_per_node=8`). Raises OptionError in one line."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise OptionError(option_name, "names no fabric", EXAMPLE)
    base: Fabric | None = None
    if "=" not in parts[0]:
        name = parts.pop(0).lower()
        if name not in PRESETS:
            raise OptionError(option_name, f"no preset {name!r} (presets: "
                              f"{', '.join(PRESETS)}; or figures "
                              f"{'=,'.join(NEEDED)}=)", EXAMPLE)
        base = PRESETS[name]
    given: dict[str, object] = {}
    for part in parts:
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in KEYS or not _:
            raise OptionError(option_name, f"{part!r} is no figure (key=value, keys: "
                              f"{', '.join(KEYS)})", "--fabric dgx-a100,nics_per_node=4")
        if key in given:  # the last one winning hid the mistake, as --layout's and --model's
            raise OptionError(option_name, f"{key} is given twice in {text!r}",
                              "--fabric dgx-a100,nics_per_node=4")
        given[key] = _value(option_name, key, value.strip())
    if base is None:
        missing = [k for k in NEEDED if k not in given]
        if missing:
            raise OptionError(option_name, f"needs {', '.join(missing)} without a preset "
                              f"({', '.join(PRESETS)})",
                              "--fabric node_gbps=300,nic_gbps=25,nics_per_node=8")
        return Fabric(name=text, **given)  # type: ignore[arg-type]
    if not given:
        return base
    sources = {k: v for k, v in base.sources.items() if k not in given}
    return replace(base, name=text, sources=sources, **given)  # type: ignore[arg-type]


def _value(option_name: str, key: str, value: str):
    kind = KEYS[key]
    if kind is str:
        if value.lower() not in GPUS:
            raise OptionError(option_name, f"gpu={value!r}: no such GPU ({', '.join(GPUS)})",
                              "--fabric dgx-a100,gpu=a100")
        return value.lower()
    low, high, unit = BOUNDS[key]
    example = f"--fabric dgx-a100,{key}={getattr(PRESETS['dgx-a100'], key):g}"
    if not value.isascii():  # int() and float() take any script's digits: '８' was 8
        raise OptionError(option_name, f"{key}={value!r} is not a number: write it in ASCII "
                          "digits", example)
    try:
        number = kind(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and low <= number <= high):
        raise OptionError(option_name, f"{key} must be a {'whole ' if kind is int else ''}"
                          f"number from {low:g} to {high:,}{' ' + unit if unit else ''}, got "
                          f"{value!r}", example)
    return number
