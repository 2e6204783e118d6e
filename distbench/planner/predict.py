"""The step time of a layout, predicted from measured inputs (planner.inputs), term by term.
Torch-free: docs/plan-model.md states each term, where its input comes from and what it ignores.

Per micro-batch, a pipeline stage runs its layers' forward and backward (`compute`) and the TP
collectives of those layers (two in forward, two in backward, of the micro-batch's activations:
all-reduces, or with sequence parallelism all-gathers and reduce-scatters; they block, so all of
them count unless `tp_overlap` hides them behind the matmuls): one slot, on the slowest stage
(the ends hold fewer layers where pp does not divide them; the last holds the LM head). 1F1B and
GPipe take (m + pp - 1) slots for m micro-batches; the pp - 1 extra are the bubble, in which
only some of a node's ranks compute: on a device its ranks share, at the measured speed of one
rank alone (`Inputs.alone_ratio`), its compute at the weight pure pipeline steps showed
(`Inputs.bubble_weight`: 1 where a stage's rank idles in it, near 0 where the node's cores stay
busy with the other stages' work). The pipeline's hops are sent without waiting, so only those
of the first micro-batch's forward and the last one's backward hold the critical path: 2 (pp -
1) one-way hops; the schedule's own work per micro-batch is measured
(`Inputs.pipeline_us_per_microbatch`). Megatron's interleaved 1F1B (v virtual stages a rank,
`Layout.virtual_stages`) cuts the bubble to (pp - 1) / v slots and sends v times the hops
(Narayanan et al. 2021, section 2.2.2). Full recomputation runs each layer's forward again in
backward, its two TP all-reduces with it. The data-parallel replicas sync their gradients (after
every micro-batch or at the last, `Layout.grad_sync`) and, with ZeRO, gather their parameters;
what of that hides behind backward, or what the wrapper adds to it, is measured
(`Inputs.overlap`, `Inputs.wrapper_us_per_layer`), else modelled one collective a layer beside
the compute (dp_step_us). Then the optimizer steps over the tensors and parameters this rank
updates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from distbench.planner.inputs import Inputs, Span
from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec, attention_core_flops, same_layer

# TP collectives per transformer layer and micro-batch: attention and MLP, forward and backward;
# each an all-reduce, or with sequence parallelism an all-gather and a reduce-scatter (the same
# bytes over a ring)
TP_ALLREDUCES_PER_LAYER = 4
# the matmuls a TP collective can hide behind when TP's communication is overlapped (Megatron's
# --tp-comm-overlap, torch's async TP): one beside each collective, an equal share of the layer
TP_OVERLAP_GEMMS = TP_ALLREDUCES_PER_LAYER


def tp_allreduces(layout: Layout) -> float:
    """A layer's TP collectives per micro-batch (all-reduces, or all-gather and reduce-scatter
    pairs): full recomputation runs the forward, and its attention's and MLP's collectives,
    again in backward (Megatron's checkpointed layer, as torch.utils.checkpoint over a TP
    layer); per-op selective (torchtitan's) reruns those whose outputs it does not keep: both
    all-reduces without sequence parallelism, the two all-gathers with it (the reduce-scatters'
    outputs are kept), half the bytes; selective recomputes the attention core, which has none."""
    rerun = {"full": 2.0, "op": 1.0 if layout.sequence_parallel else 2.0}
    return TP_ALLREDUCES_PER_LAYER + rerun.get(layout.recompute, 0.0)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    layout: Layout
    step_us: float
    compute_us: float  # m micro-batches of the stage's layers, forward and backward
    tp_comm_us: float
    pp_comm_us: float
    bubble_us: float  # (pp - 1) slots of compute, TP and PP communication
    dp_comm_us: float  # the data-parallel collectives alone
    dp_exposed_us: float
    optimizer_us: float
    tp_exposed_us: float  # TP's collectives less what tp_overlap hides behind the matmuls

    def to_json(self) -> dict:
        d = asdict(self)
        d["layout"] = self.layout.to_json()
        return d


def spans(layout: Layout, gpus_per_node: int) -> dict[str, Span]:
    """Where each dimension's groups sit, with ranks laid out as the mesh (pp, dp, tp): a
    group of k members at stride s stays inside a node of g GPUs when k x s <= g and its
    blocks of k x s tile the node (or the world is one node); else it crosses nodes with
    g // s of its members on each (at least 1, at most k). The pipeline's hop is a pair of
    ranks, one on each node once its stages cross nodes."""
    t, p, d = layout.tp, layout.pp, layout.dp
    world = t * p * d

    def group(members: int, stride: int) -> Span:
        extent = members * stride
        if members == 1:
            return Span()
        if extent <= gpus_per_node and (gpus_per_node % extent == 0 or world <= gpus_per_node):
            return Span()
        return Span(crosses=True, per_node=max(1, min(members, gpus_per_node // stride)))

    hop = group(p, t * d)
    return {"tp": group(t, 1), "dp": group(d, t),
            "pp": Span(crosses=True, per_node=1) if hop.crosses else Span()}


def params_per_rank(model: ModelSpec, layout: Layout) -> float:
    """Parameters of the largest stage's shard, before ZeRO."""
    return max(layout.stage_params(model, s) for s in layout.peak_stages(model))


def recompute_factor(model: ModelSpec, layout: Layout, tokens: int) -> float:
    """A layer's forward and backward with recomputation, over without: full runs the forward
    again in backward (a third of the FLOPs), per-op selective the matmuls it does not keep
    (every second one: half the forward's dense FLOPs), selective the attention core's
    forward. For a layer full recomputation leaves alone (recompute_layers), see
    layer_factors."""
    if layout.recompute == "none":
        return 1.0
    whole = model.flops_per_layer(tokens)
    dense_forward = 2 * tokens * model.params_per_layer
    if layout.recompute == "full":
        return 1 + (dense_forward + attention_core_flops(model, tokens, backward=False)) / whole
    if layout.recompute == "op":
        return 1 + dense_forward / 2 / whole
    return 1 + attention_core_flops(model, tokens, backward=False) / whole


def layer_factors(model: ModelSpec, layout: Layout, tokens: int, layers: int
                  ) -> tuple[float, float]:
    """(compute, TP collectives) of a stage of `layers` layers, in layers without
    recomputation: full recomputation of only k of them (recompute_layers) leaves the rest as
    they are."""
    k = layout.recomputed_layers(layers) if layout.recompute == "full" else layers
    compute = (layers - k) + k * recompute_factor(model, layout, tokens)
    tp = ((layers - k) * TP_ALLREDUCES_PER_LAYER + k * tp_allreduces(layout)) \
        / TP_ALLREDUCES_PER_LAYER
    return compute, tp


def layer_us(inputs: Inputs, model: ModelSpec, tp: int, tokens: int) -> tuple[float, bool]:
    """One layer's forward and backward on `tokens` tokens over `tp` shards, and whether that
    time already holds TP's all-reduces: the measured point of this model at this tp and token
    count (a TP layer timed as the step runs it holds them); else the nearest point timed
    without TP communication (same tp first, then the closest token count) scaled by the FLOPs
    of the two (noted)."""
    if not inputs.compute:
        raise LookupError("no measurement of compute")
    flops = model.flops_per_layer(tokens, tp)
    same_model = same_layer(inputs.compute_model, model)
    if same_model:
        for c in inputs.compute:
            if c.tp == tp and c.tokens == tokens:
                return c.layer_us, c.with_tp_comm
    plain = [c for c in inputs.compute if not c.with_tp_comm] or inputs.compute
    best = min(plain, key=lambda c: (
        not same_model or c.tp != tp, abs(math.log(c.tokens / tokens)), abs(c.tp - tp)))
    inputs.note(f"compute at tp {tp}, {tokens} tokens: scaled by FLOPs from the layer timed at "
                f"tp {best.tp}, {best.tokens} tokens" + ("" if same_model else
                                                         " of the measured model"))
    return best.layer_us * flops / best.flops, False


def tp_collective_us(inputs: Inputs, layout: Layout, span: Span, activation: float) -> float:
    """One of a layer's TP collectives on a micro-batch's activation: an all-reduce, or with
    sequence parallelism an all-gather and a reduce-scatter of the whole activation (each
    priced from its own fits; from the all-reduce's where neither was measured, noted)."""
    t = layout.tp
    if not layout.sequence_parallel:
        return inputs.comm_us("all_reduce", t, span, activation)
    try:
        return (inputs.comm_us("all_gather", t, span, activation)
                + inputs.comm_us("reduce_scatter", t, span, activation))
    except LookupError:
        inputs.note(f"sequence parallelism at tp {t}: no all-gather or reduce-scatter "
                    "measured, priced as the all-reduce of the same bytes")
        return inputs.comm_us("all_reduce", t, span, activation)


def exposed_of(comm_us: float, compute_us: float, pieces: int) -> float:
    """What stays exposed of `comm_us` cut into `pieces` equal pieces on one serial stream,
    each issued as one of `pieces` equal pieces of compute (`compute_us` in all) ends (a
    gradient's reduction after its layer's backward) or gathered ahead of it (a parameter's
    prefetch): the piece with no compute beside it, and what of each other outlasts its
    compute piece: c + (pieces - 1) max(0, c - x)."""
    if comm_us <= 0:
        return 0.0
    if pieces <= 1 or compute_us <= 0:
        return comm_us
    c, x = comm_us / pieces, compute_us / pieces
    return c + (pieces - 1) * max(0.0, c - x)


def predict(model: ModelSpec, layout: Layout, inputs: Inputs, elt_bytes: int,
            gpus_per_node: int, trainer: str = "torch") -> Prediction:
    t, p, d, z, m = layout.key()
    span = spans(layout, gpus_per_node)
    tokens = layout.micro_batch_size(model) * model.seq_len
    activation = tokens * model.hidden_size * elt_bytes

    layer, with_tp = layer_us(inputs, model, t, tokens)
    tp_layer = TP_ALLREDUCES_PER_LAYER * tp_collective_us(inputs, layout, span["tp"], activation)
    # a TP layer timed whole holds its all-reduces: the fit's share of it is shown as TP's
    compute_layer = layer
    if with_tp:
        tp_layer = min(tp_layer, compute_layer)
        compute_layer -= tp_layer
    head = 0.0
    if model.vocab:  # the LM head on the last stage, at the layer's FLOP rate
        head = compute_layer * model.head_flops(tokens, t) / model.flops_per_layer(tokens, t)

    def stage_times(stage: int) -> tuple[float, float, float]:
        """(compute, TP collectives, TP exposed) of one micro-batch on `stage`."""
        layers = layout.stage_layers(model, stage)
        cf, tf = layer_factors(model, layout, tokens, layers)
        compute = compute_layer * cf + (head if stage == p - 1 else 0.0)
        tp = tp_layer * tf
        exposed = tp
        if layout.tp_overlap and t > 1 and tp > 0:
            # each collective beside its matmul, cut in tp chunks (Megatron's ring exchange,
            # torch's async TP): the first chunk waits, the rest hides behind the matmul where
            # that is as long
            count = TP_OVERLAP_GEMMS * tf
            one, gemm = tp / count, compute_layer * cf / count
            exposed = count * max(one / t, one - gemm)
        return compute, tp, exposed

    # the slowest stage sets the pipeline's pace: every slot waits on it
    compute_mb, tp_mb, tp_exposed_mb = max((stage_times(s) for s in layout.peak_stages(model)),
                                           key=lambda x: x[0] + x[2])
    per_stage = layout.most_stage_layers(model)
    hop_bytes = activation / (t if layout.sequence_parallel else 1)
    hop = inputs.comm_us("sendrecv", 2, span["pp"], hop_bytes) if p > 1 else 0.0
    slot = compute_mb + tp_exposed_mb
    # in the fill and drain only some of a node's ranks compute: on a shared device they run as
    # fast as one rank alone, and their compute may cost less still (bubble_weight); the TP
    # all-reduces wait on their peers whatever the cores do
    bubble_slot = compute_mb * min(1.0, inputs.alone_ratio) * inputs.bubble_weight \
        + tp_exposed_mb
    # the sends are posted without waiting: in the steady state a stage's next input arrived
    # while it computed, so only the first micro-batch's activation (pp - 1 hops out) and the
    # last one's gradient (pp - 1 hops back) sit on the critical path
    # interleaved, a micro-batch crosses every stage v times: v times the hops, and the fill
    # and drain are (pp - 1) chunks of 1/v of a slot each
    v = layout.virtual_stages
    pp_comm = 2 * v * (p - 1) * hop
    if p > 1:  # every slot, the bubble's too, is some stage's micro-batch (v chunks of one)
        pp_comm += (v * m + p - 1) * inputs.pipeline_us_per_microbatch
    bubble = (p - 1) * bubble_slot / v
    pipeline = m * slot + bubble + pp_comm

    grads = params_per_rank(model, layout) * elt_bytes
    dp_comm, dp_exposed = dp_step_us(inputs, layout, span["dp"], grads, trainer,
                                     compute_mb, per_stage)
    if d > 1:
        dp_exposed += per_stage * inputs.wrapper_us_per_layer.get(dp_kind(z), 0.0)

    rate = inputs.optimizer_us_per_param
    if rate is None:
        inputs.note("no optimizer measurement: its step counted as 0")
        rate = 0.0
    # ZeRO-1 hands each replica whole tensors, a 1/dp share of them; FSDP shards every tensor
    shards = d if z >= 1 else 1
    tensors = per_stage / (d if z == 1 else 1)
    optimizer = (tensors * inputs.optimizer_us_per_layer
                 + params_per_rank(model, layout) / shards * rate)

    return Prediction(layout=layout, step_us=pipeline + dp_exposed + optimizer,
                      compute_us=m * compute_mb, tp_comm_us=m * tp_mb, pp_comm_us=pp_comm,
                      bubble_us=bubble, dp_comm_us=dp_comm, dp_exposed_us=dp_exposed,
                      optimizer_us=optimizer, tp_exposed_us=m * tp_exposed_mb)


# the data-parallel figures are kept by ZeRO stage, named as dp.csv's modes: DDP, DDP with
# ZeroRedundancyOptimizer, FSDP2 keeping the gathered parameters, FSDP2 resharding them
DP_KINDS = ("ddp", "zero1", "zero2", "zero3")


def dp_kind(zero: int) -> str:
    """The name a ZeRO stage's data-parallel figures are kept under (dp.csv's mode)."""
    return DP_KINDS[zero]


def split_exposed(exposed_us: float, collectives_us: float, layers: int
                  ) -> tuple[float, float]:
    """(overlap, wrapper cost per layer) of a data-parallel step that exposed `exposed_us`
    beyond its compute where its collectives cost `collectives_us` alone: a step that exposed
    less hid the rest behind backward; one that exposed more hid nothing and the wrapper's own
    work (per layer it wraps) is the excess. One measurement cannot tell both apart."""
    if exposed_us <= collectives_us:
        return 1 - max(exposed_us, 0.0) / collectives_us, 0.0
    return 0.0, (exposed_us - collectives_us) / layers


def pipeline_calibration(steps: list[tuple[Layout, float]], model: ModelSpec, inputs: Inputs,
                         elt_bytes: int, gpus_per_node: int) -> tuple[float, float]:
    """(the schedule's own work per micro-batch and stage, the bubble's weight) that pure
    pipeline steps (layout, measured step) showed beyond the model without either: each step's
    excess is its m + pp - 1 slots of the first plus its bubble's compute at one rank alone's
    speed times the second. Two steps of different m fit both, the weight held to [0, 1] (then
    the work refitted to both); one step keeps the weight at 1. The work is never below 0."""
    bare = replace(inputs, pipeline_us_per_microbatch=0.0, bubble_weight=0.0, notes=[])
    rows = []
    for layout, measured_us in steps:
        without = predict(model, layout, bare, elt_bytes, gpus_per_node)
        full = predict(model, layout, replace(bare, bubble_weight=1.0), elt_bytes,
                       gpus_per_node)
        rows.append((measured_us - without.step_us, full.bubble_us - without.bubble_us,
                     layout.micro_batches + layout.pp - 1))
    weight = 1.0
    if len(rows) >= 2:
        (r1, b1, s1), (r2, b2, s2) = rows[:2]
        det = b1 * s2 - b2 * s1
        if det:
            weight = min(1.0, max(0.0, (r1 * s2 - r2 * s1) / det))
    # with the weight set, the work per slot that fits every step best (least squares)
    work = sum(s * (r - weight * b) for r, b, s in rows) / sum(s * s for _, _, s in rows)
    return max(0.0, work), weight


def dp_ops(zero: int) -> tuple[str, ...]:
    """The collectives a DP group issues at a ZeRO stage under torch's step (dp_collectives),
    each once: what plan's workers measure on its groups."""
    stub = Layout(tp=1, pp=1, dp=2, zero=zero)
    return tuple(dict.fromkeys(op for op, _, _ in dp_collectives(stub)))


# what a data-parallel collective hides behind: a gradient's reduction behind its layer's
# backward, a parameter's gather ahead of its layer's forward or backward, or nothing
REDUCE, FORWARD, BACKWARD, NOTHING = "reduce", "forward", "backward", ""


def dp_collectives(layout: Layout, trainer: str = "torch") -> list[tuple[str, int, str]]:
    """The data-parallel collectives of one step, each as (op, how many a step, what it may
    hide behind). DDP (ZeRO 0) all-reduces the gradients; ZeRO-1 adds an all-gather of the
    updated parameters, after torch's ZeroRedundancyOptimizer's step (which nothing hides), or
    under Megatron's distributed optimizer, which reduce-scatters the gradients instead, before
    the next forward; FSDP reduce-scatters the gradients and all-gathers the parameters once
    (ZeRO-2) or, resharding after forward, in every micro-batch's forward and backward
    (ZeRO-3). The gradients are reduced once a step, or once a micro-batch where the layout
    syncs every micro-batch (FSDP2's default)."""
    z, m = layout.zero, layout.micro_batches
    reductions = m if layout.syncs_every_micro_batch else 1
    if z == 0:
        return [("all_reduce", reductions, REDUCE)]
    if z == 1 and trainer == "torch":
        return [("all_reduce", reductions, REDUCE), ("all_gather", 1, NOTHING)]
    gathers = [("all_gather", m, FORWARD), ("all_gather", m, BACKWARD)] if z == 3 else [
        ("all_gather", 1, FORWARD)]
    return [("reduce_scatter", reductions, REDUCE), *gathers]


def dp_collectives_us(inputs: Inputs, layout: Layout, span: Span | str, grad_bytes: float,
                      trainer: str = "torch") -> tuple[float, float]:
    """The data-parallel collectives of one step (dp_collectives), alone, and the fraction of
    them that hides behind backward (measured, per DDP or FSDP, on those that may hide). Each
    priced on the DP group as it sits (`span`): across nodes, by the ranks it has on each node
    (Inputs.comm_us)."""
    if layout.dp == 1:
        return 0.0, 0.0
    kind = dp_kind(layout.zero)
    overlap = inputs.overlap.get(kind)
    if overlap is None:
        if kind not in inputs.wrapper_us_per_layer:
            inputs.note(f"no {kind} overlap measured: its collectives counted as exposed")
        overlap = 0.0
    times = [(n * inputs.comm_us(op, layout.dp, span, grad_bytes), behind)
             for op, n, behind in dp_collectives(layout, trainer)]
    total = sum(t for t, _ in times)
    hideable = sum(t for t, behind in times if behind != NOTHING)
    return total, (overlap * hideable / total if total else overlap)


def dp_step_us(inputs: Inputs, layout: Layout, span: Span, grad_bytes: float, trainer: str,
               slot_compute_us: float, layers: int) -> tuple[float, float]:
    """(the data-parallel collectives of one step alone, what of them is exposed). Measured
    figures win (a `dp` run's overlap or wrapper cost for the layout's ZeRO stage:
    dp_collectives_us). Where none was measured and the trainer overlaps (`dp_overlap`), what
    the schedule hides is modelled, one collective per layer on one stream (exposed_of): a
    gradient's reduction (all-reduce, or reduce-scatter) issued as its layer's backward ends,
    a parameter's all-gather prefetched behind the layer before it (FSDP2's, and Megatron's
    --overlap-param-gather). `slot_compute_us`: a micro-batch's forward and backward on the
    stage, a third of it forward."""
    d, z = layout.dp, layout.zero
    kind = dp_kind(z)
    measured = kind in inputs.overlap or kind in inputs.wrapper_us_per_layer
    if d == 1:
        return 0.0, 0.0
    if measured or not layout.dp_overlap:
        comm, overlap = dp_collectives_us(inputs, layout, span, grad_bytes, trainer)
        return comm, comm * (1 - overlap)

    inputs.note(f"no {kind} overlap measured: what the schedule hides is modelled, a "
                "collective a layer behind the compute beside it")
    beside = {FORWARD: slot_compute_us / 3, BACKWARD: slot_compute_us * 2 / 3,
              REDUCE: slot_compute_us * 2 / 3}
    comm = exposed = 0.0
    for op, n, behind in dp_collectives(layout, trainer):
        one = inputs.comm_us(op, d, span, grad_bytes)
        comm += n * one
        if behind == NOTHING:
            exposed += n * one
        elif behind == REDUCE:
            # every micro-batch's reductions hide behind its backward; a micro-batch's last one
            # also behind the next micro-batch's forward, so only the step's last waits whole
            tail = one / max(1, layers)
            exposed += n * (exposed_of(one, beside[REDUCE], layers) - tail) + tail
        else:
            exposed += n * exposed_of(one, beside[behind], layers)
    return comm, exposed
