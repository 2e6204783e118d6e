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

from distbench.core.layout_label import layout_label
from distbench.core.options import pick
from distbench.planner.models import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)
# activation recomputation: none, the attention core (selective), each whole layer (full)
RECOMPUTE = ("none", "selective", "full")
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
                            self.virtual_stages, self.recompute)

    def key(self) -> tuple[int, int, int, int, int]:
        return (self.tp, self.pp, self.dp, self.zero, self.micro_batches)

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
    if model.layers % p:
        out.append(f"pp {p} must divide the layers ({model.layers})")
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


def rank_chunks(layers: int, pp_rank: int, pp: int, virtual_stages: int = 1
                ) -> list[tuple[int, range]]:
    """The model chunks rank `pp_rank` holds, as (stage index, its layers): pp x v stages of
    layers / (pp x v) consecutive layers each, stage s on rank s % pp (Megatron's and torch's
    interleaved placement: rank r holds stages r, r + pp, ...). One chunk without interleaving.
    pp x v divides the layers (problems())."""
    n = pp * virtual_stages
    per = layers // n
    return [(s, range(s * per, (s + 1) * per)) for s in range(pp_rank, n, pp)]


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


def enumerate_layouts(model: ModelSpec, gpus: int, gpus_per_node: int,
                      zero_stages: tuple[int, ...] = ZERO_STAGES,
                      recompute: tuple[str, ...] = ("none",)) -> Iterator[Layout]:
    """Every valid layout on exactly `gpus` ranks: tp a divisor of the GPUs per node, pp a
    divisor of the layers, dp what is left, each ZeRO stage (0 alone when dp is 1), each of
    micro_batch_counts() and each recomputation asked for."""
    for t in divisors(gpus_per_node):
        for p in divisors(model.layers):
            if gpus % (t * p):
                continue
            d = gpus // (t * p)
            if model.batch % d:
                continue
            counts = micro_batch_counts(model, p, d)
            for z in (zero_stages if d > 1 else (0,)):
                for m in counts:
                    for r in recompute:
                        layout = Layout(tp=t, pp=p, dp=d, zero=z, micro_batches=m,
                                        recompute=r)
                        if not problems(layout, model, gpus_per_node):
                            yield layout
