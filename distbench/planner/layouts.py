"""A layout: how a model's training step is spread over tp x pp x dp ranks, which ZeRO stage
the data-parallel replicas use and how many micro-batches a step is cut into; what makes one
invalid for a model, and every valid one for a number of GPUs. Torch-free.

Ranks are laid out as torch's device mesh (pp, dp, tp): tp varies fastest, so a TP group is
`tp` consecutive ranks (inside a node when tp <= GPUs per node) and a pipeline's stages are
tp x dp ranks apart."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from distbench.core.layout_label import default_grad_sync, layout_label, shown_extras
from distbench.core.options import pick
from distbench.planner.models import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)
# activation recomputation: none, the attention core (selective: Megatron's
# --recompute-granularity selective), torchtitan's per-op selective (`op`: every matmul's output
# kept but every second one of the MLP's and attention's projections, which backward reruns), each
# whole layer (full; with `recompute_layers` k, only k layers of each stage: Megatron's
# --recompute-method block --recompute-num-layers k)
RECOMPUTE = ("none", "selective", "op", "full")
# when the data-parallel replicas sync their gradients in a step of several micro-batches: after
# every micro-batch (FSDP2's default: sharded gradients accumulate) or at the last only (DDP's
# no_sync, FSDP2's set_requires_gradient_sync(False), Megatron's grad buffers)
GRAD_SYNC = ("micro", "last")
# torch.distributed.pipelining's schedules the step runs (named as `distbench pp` names them):
# 1F1B needs micro_batches >= pp; the interleaved one also micro-batches a multiple of pp
SCHEDULE = "1f1b"
INTERLEAVED = "interleaved-1f1b"


def parse_zero(option_name: str, text, example: str) -> list[int]:
    """--zero as step and plan take it: a comma list of stages or 'all', order kept (OptionError
    with `example`)."""
    return [int(name) for name in pick(tuple(map(str, ZERO_STAGES)), example)(option_name, text)]


@dataclass(frozen=True, kw_only=True)
class Layout:
    tp: int
    pp: int
    dp: int
    zero: int = 0
    micro_batches: int = 1
    recompute: str = "none"  # planner.memory.RECOMPUTE
    # Megatron's interleaved 1F1B: each rank holds `virtual_stages` chunks of its layers, a
    # micro-batch passing every rank v times (--num-layers-per-virtual-pipeline-stage). Only a
    # layout the user names carries v > 1 (`plan --layout`, `step --virtual-stages`): the
    # enumeration weighs plain 1F1B
    virtual_stages: int = 1
    # sequence parallelism with TP (Megatron's --sequence-parallel, torchtitan's SequenceParallel
    # on the norms): the layer's input and the residual stream are sharded along the sequence
    # over the TP ranks, and TP's all-reduces become all-gathers and reduce-scatters. Both
    # trainers turn it on with tp > 1; it means nothing at tp 1
    sp: bool = True
    # with recompute "full": how many layers of each stage are recomputed (0: all of them)
    recompute_layers: int = 0
    # GRAD_SYNC; "" takes the wrapper's default: FSDP (ZeRO 2 and 3) every micro-batch, DDP the
    # last (no_sync, as `step` and Megatron run it)
    grad_sync: str = ""
    # TP's collectives overlapped with the layer's matmuls (Megatron's --tp-comm-overlap, torch's
    # async TP)
    tp_overlap: bool = False
    # the data-parallel collectives overlapped with backward (DDP's and FSDP2's buckets always;
    # Megatron's with --overlap-grad-reduce and --overlap-param-gather)
    dp_overlap: bool = True

    def __post_init__(self):
        if not self.grad_sync:
            object.__setattr__(self, "grad_sync", default_grad_sync(self.zero))

    @property
    def sequence_parallel(self) -> bool:
        return self.sp and self.tp > 1

    @property
    def syncs_every_micro_batch(self) -> bool:
        return self.dp > 1 and self.micro_batches > 1 and self.grad_sync == "micro"

    def recomputed_layers(self, stage_layers: int) -> int:
        """How many of a stage's `stage_layers` layers full recomputation reruns (all of them
        unless `recompute_layers` says fewer); 0 without full recomputation."""
        if self.recompute != "full":
            return 0
        return min(stage_layers, self.recompute_layers or stage_layers)

    @property
    def schedule(self) -> str | None:
        """The pipeline schedule this layout runs; None without a pipeline."""
        if self.pp == 1:
            return None
        return INTERLEAVED if self.virtual_stages > 1 else SCHEDULE

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def micro_batch_size(self, model: ModelSpec) -> int:
        return model.batch // (self.dp * self.micro_batches)

    def label(self) -> str:
        return layout_label(self.tp, self.pp, self.dp, self.zero, self.micro_batches,
                            self.virtual_stages, self.recompute, **self._keys())

    def extras(self) -> dict:
        """The keys beyond tp, pp, dp, zero, m, v and recompute that differ from their
        defaults, as the label names them (core.layout_label.shown_extras)."""
        return shown_extras(self.tp, self.dp, self.zero, self.micro_batches, self.recompute,
                            **self._keys())

    def _keys(self) -> dict:
        return {"sp": self.sp, "recompute_layers": self.recompute_layers,
                "grad_sync": self.grad_sync, "tp_overlap": self.tp_overlap,
                "dp_overlap": self.dp_overlap}

    def key(self) -> tuple[int, int, int, int, int]:
        return (self.tp, self.pp, self.dp, self.zero, self.micro_batches)

    def stage_layers(self, model: ModelSpec, stage: int) -> int:
        return stage_layers(model.layers, self.pp, stage)

    def stage_params(self, model: ModelSpec, stage: int) -> float:
        """Parameters of pipeline stage `stage`'s shard, before ZeRO: its layers over tp, and
        the embedding on the first stage and the LM head on the last (both without a
        pipeline)."""
        ends = (stage == 0) + (stage == self.pp - 1)
        return (self.stage_layers(model, stage) * model.params_per_layer
                + model.vocab * model.hidden_size * ends) / self.tp

    def most_stage_layers(self, model: ModelSpec) -> int:
        """The layers of the pipeline's fullest stage (every stage's when pp divides them)."""
        return -(-model.layers // self.pp)

    def peak_stages(self, model: ModelSpec) -> set[int]:
        """The pipeline stages that may be the slowest or hold the most: the first (the
        embedding, the most micro-batches in flight), the first of the fullest (where the ends
        hold fewer: stage_layers), the second (buffers both ways) and the last (the LM
        head)."""
        short = self.most_stage_layers(model) * self.pp - model.layers
        # the ends give up their layers first, 0, pp - 1, 1, ...: the first full stage follows
        # the front's share of them
        first_full = min(-(-short // 2), self.pp - 1)
        return {0, min(1, self.pp - 1), first_full, self.pp - 1}

    def to_json(self) -> dict:
        return asdict(self)


def problems(layout: Layout, model: ModelSpec, gpus_per_node: int | None = None) -> list[str]:
    """Why `layout` cannot train `model` (empty when it can)."""
    t, p, d, z, m = layout.key()
    out: list[str] = []
    if min(t, p, d, m) < 1:
        out.append("tp, pp, dp and micro-batches must be at least 1")
        return out
    if z not in ZERO_STAGES:
        out.append(f"ZeRO stage {z} is not one of {', '.join(map(str, ZERO_STAGES))}")
    if z and d == 1:
        out.append(f"ZeRO {z} shards over data-parallel replicas; dp is 1")
    if model.kv_heads % t or model.ffn_size % t:
        out.append(f"tp {t} must divide the {'kv ' if model.kv_heads != model.heads else ''}"
                   f"heads ({model.kv_heads}) and the ffn size ({model.ffn_size})")
    if model.vocab % t:
        out.append(f"tp {t} must divide the vocabulary ({model.vocab})")
    if layout.recompute not in RECOMPUTE:
        out.append(f"recomputation {layout.recompute!r} is not one of {', '.join(RECOMPUTE)}")
    if p > model.layers:
        out.append(f"pp {p} is more stages than the layers ({model.layers})")
    if layout.sequence_parallel and model.seq_len % t:
        out.append(f"sequence parallelism over tp {t} must divide the sequence "
                   f"({model.seq_len}); or sp=0")
    if layout.recompute_layers:
        if layout.recompute != "full":
            out.append(f"recompute_layers {layout.recompute_layers} counts the layers full "
                       f"recomputation reruns; recompute is {layout.recompute}")
        elif p <= model.layers and layout.recompute_layers > layout.most_stage_layers(model):
            out.append(f"recompute_layers {layout.recompute_layers} is more than a stage's "
                       f"{layout.most_stage_layers(model)} layers")
    if layout.grad_sync not in GRAD_SYNC:
        out.append(f"grad_sync {layout.grad_sync!r} is not one of {', '.join(GRAD_SYNC)}")
    v = layout.virtual_stages
    if v < 1:
        out.append(f"virtual stages must be at least 1, got {v}")
    elif v > 1:
        if p == 1:
            out.append(f"{v} virtual stages interleave a pipeline; pp is 1")
        elif model.layers % (p * v):
            out.append(f"pp x virtual stages ({p} x {v}) must divide the layers "
                       f"({model.layers})")
        elif m % p:
            # Megatron's interleaved schedule runs micro-batches in groups of pp
            out.append(f"the interleaved schedule needs micro-batches ({m}) a multiple of pp "
                       f"({p})")
    if model.batch % (d * m):
        out.append(f"dp x micro-batches ({d} x {m}) must divide the batch ({model.batch})")
    if p > 1 and m < p:
        out.append(f"the 1F1B schedule needs at least pp ({p}) micro-batches, got {m}")
    elif p > 1 and d > 1 and z <= 1 and m <= p * v:
        # torch's DDP fails an internal assert in the second step of such a pipeline (seen at
        # pp 2, dp 2, m 2, and interleaved at pp 2, v 2, m 4, with torch 2.13: "rebuilt
        # parameter indices size is not same as original model parameters size"); a rank that
        # fails leaves its stage's peers waiting
        what = f"pp x virtual stages ({p} x {v})" if v > 1 else f"pp ({p})"
        out.append(f"DDP (ZeRO {z}) in a 1F1B pipeline needs more micro-batches than {what}, "
                   f"got {m}")
    if gpus_per_node is not None and t > gpus_per_node:
        out.append(f"tp {t} spans nodes of {gpus_per_node} GPUs; TP stays inside a node")
    return out


def stage_layers(layers: int, stages: int, stage: int) -> int:
    """The layers stage `stage` of `stages` holds: as many each where the stages divide the
    layers; else each the most any holds (layers / stages, rounded up) but the stages at the
    ends, which give up one layer each, the first, the last, the second, the second-to-last and
    so on, until the layers are shared out. The ends hold the embedding and the LM head beside
    their layers; Megatron (--decoder-first/last-pipeline-num-layers) and torchtitan run 126
    layers on 16 stages so: 7, 8 x 14, 7."""
    most = -(-layers // stages)
    short = most * stages - layers
    # the order the stages give a layer up in: 0, n-1, 1, n-2, ...
    place = min(2 * stage, 2 * (stages - 1 - stage) + 1)
    # a stage giving up one layer per pass over the ends; `short` is below `stages`
    return most - (1 if place < short else 0)


def stage_starts(layers: int, stages: int) -> list[int]:
    """The first layer of each stage, and the layers' count at the end."""
    starts = [0]
    for s in range(stages):
        starts.append(starts[-1] + stage_layers(layers, stages, s))
    return starts


def rank_chunks(layers: int, pp_rank: int, pp: int, virtual_stages: int = 1
                ) -> list[tuple[int, range]]:
    """The model chunks rank `pp_rank` holds, as (stage index, its layers): pp x v stages of
    consecutive layers (stage_layers: as many each where they divide the layers, else fewer at
    the ends), stage s on rank s % pp (Megatron's and torch's interleaved placement: rank r
    holds stages r, r + pp, ...). One chunk without interleaving."""
    n = pp * virtual_stages
    starts = stage_starts(layers, n)
    return [(s, range(starts[s], starts[s + 1])) for s in range(pp_rank, n, pp)]


def divisors(n: int) -> list[int]:
    """n's divisors, ascending, in O(sqrt n): each k up to sqrt(n) that divides n, and n // k.
    A count up to n itself took minutes for a batch of 10^12 (issue 30)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def default_micro_batches(model: ModelSpec, pp: int, dp: int, virtual_stages: int = 1) -> int:
    """1 without a pipeline; else the fewest micro-batches from 2 x pp up that split a replica's
    share of the batch (bubble (pp-1)/(3pp-1): a third of pp's minimum's), else from pp up, else
    2 x pp (which problems() then refuses). Interleaved, a multiple of pp (its rounds) from
2 x pp x v up (bubble (pp-1)/(2 pp v^2 + pp - 1)), else above pp x v, else from pp up."""
    if pp == 1:
        return 1
    if virtual_stages == 1:
        return fewest_micro_batches(model, dp, 2 * pp) or fewest_micro_batches(model, dp, pp) \
            or 2 * pp
    lows = (2 * pp * virtual_stages, pp * virtual_stages + 1, pp)  # problems()' DDP bound
    return next((k for low in lows if (k := fewest_micro_batches(model, dp, low, pp))),
                2 * pp * virtual_stages)


def fewest_micro_batches(model: ModelSpec, dp: int, low: int, multiple_of: int = 1
                         ) -> int | None:
    """The fewest micro-batches from `low` up, a multiple of `multiple_of`, that split a
    replica's share of the batch; None when none does (or dp does not split the batch)."""
    if model.batch % dp:
        return None
    return next((k for k in divisors(model.batch // dp) if k >= low and k % multiple_of == 0),
                None)


def micro_batch_counts(model: ModelSpec, pp: int, dp: int) -> list[int]:
    """The micro-batch counts a plan weighs for `pp` stages and `dp` replicas: a ladder of the
    counts from pp up (from 1 without a pipeline: gradient accumulation) that split a
    replica's share of the batch: the fewest, then each the fewest at least twice the last
    taken, the most (micro-batches of one sample) and the step's default
    (default_micro_batches). Empty when none splits it. Without a pipeline more micro-batches
    only trade time for activation memory, and that trade is what makes a large model's
    replica fit (7b at ZeRO-3 over 8 GPUs: one sample per micro-batch).

    A ladder, not every divisor: each count is a row of the plan, and a batch of millions has
    hundreds of divisors (8,648,640 has 448), which made a plan of one model minutes long. A
    rung's bubble (pp-1)/(m+pp-1) and activations (about 1/m of the replica's share) are within
    2x of the next rung's; at most log2(batch) + 3 counts, whatever the batch. A batch that is
    a power of two (every preset's) keeps every divisor, as before."""
    if model.batch % dp:
        return []
    fit = [k for k in divisors(model.batch // dp) if k >= pp]
    if not fit:
        return []
    ladder = [fit[0]]
    for k in fit[1:]:
        if k >= 2 * ladder[-1]:
            ladder.append(k)
    return sorted({*ladder, fit[-1], default_micro_batches(model, pp, dp)})


def pipeline_depths(layers: int) -> list[int]:
    """The pipeline depths a plan weighs: those that divide the layers, and those that divide
    two more, whose first and last stages hold one layer fewer (stage_layers) beside the
    embedding and the LM head, as Megatron and torchtitan split 126 layers over 16 stages."""
    uneven = [p for p in divisors(layers + 2) if 2 < p <= layers // 2]
    return sorted({*divisors(layers), *uneven})


def enumerate_layouts(model: ModelSpec, gpus: int, gpus_per_node: int,
                      zero_stages: tuple[int, ...] = ZERO_STAGES,
                      recompute: tuple[str, ...] = ("none",)) -> Iterator[Layout]:
    """Every valid layout on exactly `gpus` ranks: tp a divisor of the GPUs per node, pp one of
    pipeline_depths(), dp what is left, each ZeRO stage (0 alone when dp is 1), each of
    micro_batch_counts() and each recomputation asked for."""
    for t in divisors(gpus_per_node):
        for p in pipeline_depths(model.layers):
            if gpus % (t * p):
                continue
            d = gpus // (t * p)
            if model.batch % d:
                continue
            counts = micro_batch_counts(model, p, d)
            for z in (zero_stages if d > 1 else (0,)):
                for m in counts:
                    for r in recompute:
                        # sequence parallelism where tp divides the sequence, as both
                        # trainers run TP; plain TP where it does not
                        layout = Layout(tp=t, pp=p, dp=d, zero=z, micro_batches=m,
                                        recompute=r, sp=model.seq_len % t == 0)
                        if not problems(layout, model, gpus_per_node):
                            yield layout
