"""What a plan is predicted from, all measured: alpha-beta fits of the collectives per group size
and span (inside a node, or across nodes with so many of the group's ranks on each), the time
of one transformer layer's forward and backward at the shapes it was timed on, the optimizer's
cost per layer and per parameter, and how much of the data-parallel communication hid behind
compute. inputs.json holds them; a later `plan --from` reads them back. Torch-free.

Each comes with its source (a run directory and what in it), and each scaling applied to reach
a point that was not measured is stated in `Inputs.notes` by the lookup that applies it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from distbench.core.accounting import allreduce_factor, ring_factor, unit_factor

INPUTS_JSON = "inputs.json"
# collective.csv's op names; "sendrecv" is one pipeline hop (a p2p pingpong's one-way time)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")
SPANS = ("node", "nodes")  # the group inside one node, or across nodes
BUS = {"all_reduce": allreduce_factor, "all_gather": ring_factor,
       "reduce_scatter": ring_factor, "sendrecv": unit_factor}
_B_PER_US = 1e3  # 1 GB/s in bytes per microsecond


@dataclass(frozen=True)
class Span:
    """Where a group's ranks sit: inside one node, or across nodes with `per_node` of them on
    each (None: not known, as a group of whole nodes). Across nodes a group's traffic leaves
    each node through as many NICs as it has ranks there (one NIC per GPU, as DGX and HGX
    nodes are built), at most the node's NICs: a DP group of one GPU per node gets one NIC's
    bandwidth, one of 8 per node 8 NICs'."""

    crosses: bool = False
    per_node: int | None = None

    def __str__(self) -> str:
        if not self.crosses:
            return "node"
        return "nodes" if self.per_node is None else f"nodes, {self.per_node} per node"

    @classmethod
    def of(cls, value: Span | str) -> Span:
        """A Span, or a span's name ("node", "nodes": across whole nodes)."""
        if isinstance(value, Span):
            return value
        if value not in SPANS:
            raise ValueError(f"no span {value!r} ({', '.join(SPANS)})")
        return cls(crosses=value == "nodes")


@dataclass(frozen=True, kw_only=True)
class CommFit:
    """T(S) = alpha_us + S / beta for `op` on a group of `ranks`, S the per-rank buffer in
    bytes as collective.csv counts it (an all-gather's whole output, a reduce-scatter's whole
    input); beta the asymptotic algbw in GB/s. `per_node`: across nodes, the group's ranks on
    each node (None where not known: a group of whole nodes)."""

    op: str
    ranks: int
    span: str
    alpha_us: float
    beta_gbps: float
    source: str = ""
    per_node: int | None = None

    @property
    def crosses(self) -> bool:
        return self.span == "nodes"

    def time_us(self, size_bytes: float) -> float:
        return self.alpha_us + size_bytes / (self.beta_gbps * _B_PER_US)


class FabricLookup(Protocol):
    """A declared fabric (planner.fabrics.Fabric) as the lookup uses it."""

    nics_per_node: int

    def fit(self, op: str, ranks: int, span: Span) -> CommFit: ...


@dataclass(frozen=True, kw_only=True)
class ComputePoint:
    """One layer's forward and backward, timed with every rank of the node computing at once:
    `tokens` tokens (micro-batch x sequence) on a 1/`tp` shard of the layer (with tp > 1, as
    torch's TP layer runs it when `with_tp_comm`)."""

    tp: int
    tokens: int
    layer_us: float
    flops: float  # of that layer shard, as ModelSpec.flops_per_layer counts them
    source: str = ""
    # timed as the step runs a TP layer (torch's DTensor layer, its four all-reduces inside):
    # the time of that layout's layer as a whole, never scaled to another shape
    with_tp_comm: bool = False


@dataclass(kw_only=True)
class Inputs:
    fits: list[CommFit] = field(default_factory=list)
    compute: list[ComputePoint] = field(default_factory=list)
    # a layer's time with one rank per node computing, over its time with every rank at once:
    # below 1 where a node's ranks share one device (CPU cores), about 1 with a GPU each. The
    # pipeline's bubble slots run at the first: only some of a node's ranks compute in them
    alone_ratio: float = 1.0
    # the model the compute points were timed on (hidden, ffn, heads, seq): a plan for another
    # model scales them by FLOPs
    compute_model: dict | None = None
    # AdamW's step: optimizer_us_per_layer for each layer's tensors it holds (a kernel each,
    # whatever their size) plus optimizer_us_per_param per parameter, fitted on one layer of two
    # widths
    optimizer_us_per_param: float | None = None
    optimizer_us_per_layer: float = 0.0
    # fraction of the data-parallel collectives' time hidden behind backward, by ZeRO stage as
    # dp.csv names them: "ddp", "zero1", "zero2", "zero3"
    overlap: dict[str, float] = field(default_factory=dict)
    # a step that exposed more than its collectives cost alone: what the data-parallel wrapper
    # adds beyond them, per layer it wraps (hooks, copies, its threads taking the cores), by
    # ZeRO stage as `overlap`; a stage has this or an overlap, never both
    wrapper_us_per_layer: dict[str, float] = field(default_factory=dict)
    # the pipeline schedule's own work per micro-batch and stage (its sends' and receives' cost
    # to the ranks, its bookkeeping) beyond the hops on the critical path, measured on a pure
    # pipeline step; 0 when not measured
    pipeline_us_per_microbatch: float = 0.0
    # what the bubble's pp - 1 slots cost, as a share of their compute at one rank alone's
    # speed: 1 with a device per rank, where they idle; near 0 where the ranks share a node's
    # cores, busy with the other stages' work anyway. Fitted with the figure above on two pure
    # pipeline steps (m = pp and m = 2 pp); 1 when only one could be measured
    bubble_weight: float = 1.0
    # the layout (Layout.label) each of the above was measured on (a ZeRO stage's name;
    # "pipeline" and "pipeline 2" for the pipeline's two steps), where a plan's workers measured
    # it: a validation of that layout is in-sample
    overlap_layouts: dict[str, str] = field(default_factory=dict)
    gpus_per_node: int | None = None
    memory_per_gpu: int | None = None  # bytes
    device: str = ""
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # declared, not measured (never in inputs.json): the fabric a group no fit covers is priced
    # from (planner.fabrics), and what the console must say beside the notes
    fabric: FabricLookup | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        data = asdict(self)
        for declared in ("fabric", "warnings"):
            data.pop(declared)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Inputs:
        data = dict(data)
        for declared in ("fabric", "warnings"):
            data.pop(declared, None)
        fits = [CommFit(**f) for f in data.pop("fits", [])]
        compute = [ComputePoint(**c) for c in data.pop("compute", [])]
        return cls(fits=fits, compute=compute, **data)

    def write(self, run_dir: Path) -> None:
        from distbench.results import writer

        writer.write_json(run_dir / INPUTS_JSON, self.to_json())  # whole, or not there

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def warn(self, text: str) -> None:
        """A note the console says too: a figure used where it may not hold."""
        self.note(text)
        if text not in self.warnings:
            self.warnings.append(text)

    def comm_us(self, op: str, ranks: int, span: Span | str, size_bytes: float) -> float:
        """The time of `op` on `ranks` ranks placed as `span`. From the fits of that op on
        groups placed alike (inside a node, or across nodes): the one of the nearest ranks per
        node, then of the nearest group size; a different group size scaled as a ring (the
        latency term with the ring's steps, ranks - 1, the bandwidth term at constant bus
        bandwidth), different ranks per node by the NICs they use (one per rank, at most the
        declared fabric's NICs per node; with none declared, never more than the fit's). With no
        such fit, from the declared fabric; else from a fit placed otherwise (noted). 0 for a
        group of one. Every scaling is noted."""
        if ranks <= 1 or size_bytes <= 0:
            return 0.0
        where = asked = Span.of(span)
        alike = [f for f in self.fits if f.op == op and f.crosses == where.crosses]
        if not alike and self.fabric is not None:
            return self.fabric.fit(op, ranks, where).time_us(size_bytes)
        if not alike:
            alike = [f for f in self.fits if f.op == op]
            if not alike:
                raise LookupError(f"no measurement of {op}")
            self.warn(f"{op} {'across' if where.crosses else 'inside'} nodes: no fit of a group "
                      f"placed so and no fabric declared: priced from groups "
                      f"{'inside a node' if where.crosses else 'across nodes'}, as if they "
                      "shared the same links")
            where = Span(crosses=alike[0].crosses)

        def per_node(f: CommFit) -> int | None:
            return f.per_node or (f.ranks if not f.crosses else self.gpus_per_node)

        want = where.per_node if where.crosses else None
        f = min(alike, key=lambda f: (
            want is not None and per_node(f) != want,
            abs((per_node(f) or 0) - (want or 0)) if want else 0,
            abs(f.ranks - ranks), -f.ranks))
        nics = 1.0
        have = per_node(f)
        if want is not None and have is None:
            self.note(f"{op} across nodes, {want} ranks per node: the fit's ranks per node are "
                      "not known (no GPUs per node measured): its bandwidth used as is")
        elif want is not None and have != want:
            most = self.fabric.nics_per_node if self.fabric is not None else have
            nics = min(want, most) / min(have, most)
            self.note(f"{op} across nodes, {want} ranks per node: the bandwidth of the fit at "
                      f"{have} per node x {nics:g} (NICs used: one per rank on a node, at most "
                      + (f"the fabric's {most}" if self.fabric is not None else
                         f"the fit's {have}: NICs per node not declared") + ")")
        if f.ranks == ranks and nics == 1.0:
            return f.time_us(size_bytes)
        if f.ranks != ranks:
            self.note(f"{op} on {ranks} ranks ({asked}): scaled from the fit on {f.ranks} "
                      "as a ring")
        steps = max(1, ranks - 1) / max(1, f.ranks - 1)
        busbw = f.beta_gbps * (BUS[op](f.ranks) or 1.0) * nics
        algbw = busbw / (BUS[op](ranks) or 1.0)
        return f.alpha_us * steps + size_bytes / (algbw * _B_PER_US)
