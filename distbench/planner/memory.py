"""The most memory one rank holds in a step of a layout, torch-free: its share of the
parameters, gradients and AdamW states (ZeRO divides them over the data-parallel replicas),
what FSDP holds gathered, and the activations it keeps for backward, at the step's peak.
docs/plan-model.md states the model, what it leaves out, and how far it is from what
`distbench step` measures. core.transformer holds the per-layer facts it counts from.

Parameters of one rank: its stage's layers (layers / pp) over tp, and the embedding on the
first stage and the LM head on the last, `P` below.

- parameters: P x b, gradients: P x b, with b the dtype's bytes;
- AdamW: two moments, and an fp32 master copy of the weights when the dtype is under 4 bytes
  (mixed precision); the moments are fp32 then too: 12 bytes per parameter for 16-bit, 8 for
  fp32 (2 moments in fp32), 16 for fp64 (ZeRO paper, Rajbhandari et al. 2020, section 3.1);
- ZeRO divides over dp: stage 1 the optimizer states (ZeroRedundancyOptimizer), stages 2 and 3
  the gradients and the parameters too (FSDP2 shards both), and FSDP holds some whole beside
  its shards in `buffers` (gathered_bytes): ZeRO 2 the stage's parameters from forward to the
  end of backward, ZeRO 3 two layers at a time (the one at work and the one gathered ahead;
  the stage in a pipeline), each with one layer's whole gradients before they are
  reduce-scattered.

Activations kept for backward, per layer, per token: what the step's layer saves, measured
(torch.autograd.graph.saved_tensors_hooks over one layer's forward;
tests/unit/planner/test_memory_model.py compares the two). Fused attention
(scaled_dot_product_attention: flash, memory-efficient, cuDNN, and the CPU's flash kernel) keeps
no a x s scores: it saves q, k, v, its output and a logsumexp per head and token, in fp32 at
least, and recomputes the scores in backward (Korthikanti et al. 2022, section 4.1, count the
scores, which unfused attention keeps). With h hidden, w the fused qkv's width ((heads + 2
kv_heads) x head_dim), f ffn, a heads, in elements:

- attention: its input (h, the qkv projection's), the qkv output (w: q, k and v are views of
  it), the attention's output (h: the output projection's input is the same tensor), and the
  logsumexp (a, fp32 or wider). Grouped-query attention whose TP shard holds several groups
  copies q out of the fused output (h more; Megatron's layout does the same);
- MLP: its input (h), then up's output (f, the GELU's input) and the GELU's output (f, down's
  input); gated, the gate's and up's outputs (2f), the SiLU's output and the product (2f);
- the residual adds keep nothing. With tensor parallelism (Megatron, no sequence
  parallelism) the two block inputs are whole on every TP rank, the rest sharded:
  2h + (w + h + 2f) / tp elements and a / tp logsumexps per token (4f for gated).

Unfused attention (a model with `fused_attention` False, Megatron-LM before FlashAttention)
keeps its scores' softmax output, dropout mask and dropout output besides: (2 b + 1) a s / tp
bytes a token (Korthikanti et al.'s 5as in 16 bits), which selective recomputation drops.

Recomputation (--recompute): selective recomputes the attention core, whose inputs (the qkv
output) the layer keeps anyway, so it saves only the logsumexp: fused attention already does
what selective recomputation was for. Full keeps each layer's input (h, whole on every TP rank)
and rebuilds one layer's activations at a time in backward.

With a vocabulary, the first stage holds the embedding (vocab x hidden / tp) and the last the
LM head (the same), its input (h) and, per token, the logits (vocab / tp, in the dtype) and
the cross-entropy's log-probabilities (vocab / tp, fp32 at least).

The peak, not a sum of everything (what `distbench step` measures, within 10% on every
layout of `step --workers 4`; docs/plan-model.md gives the figures): a rank holds its parameters
and optimizer states (and DDP's gradients, views of its buckets) throughout; a micro-batch is
micro_batch_size x seq tokens, and stage i holds min(pp - i, m) micro-batches' activations at
once under 1F1B (one without a pipeline: accumulation runs one at a time), each with the
stage's output, kept for its backward. The step starts with no gradients (set to None), so
with as many micro-batches as in flight the most is the first backward's start (every
micro-batch's activations) or its end (one micro-batch fewer and the stage's gradients); with
more, a later forward holds both. DDP's micro-batches before the last accumulate their
gradients outside its buckets (no_sync): a second copy. Beside them: the op at work (one
MLP-wide output), and torch's pipeline's receive buffers, one per micro-batch for the input
(but on the first stage) and one for the output's gradient (but on the last). The first
stage, the second and the last are counted; the peak is the largest.

Interleaved 1F1B (v virtual stages a rank) counts in chunks, each 1/v of the rank's layers:
torch's ScheduleInterleaved1F1B runs (v - 1) x pp + 2 (pp - 1 - rank) chunk forwards before
the rank's first backward (at most v x m), so rank 0 holds pp (1 + (pp - 1) / (pp v))
micro-batches' worth (Narayanan et al.'s figure) where plain 1F1B holds pp; and each chunk
keeps receive buffers of its own (but the model's first stage's input and last's gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

from distbench.core.transformer import (
    MASTER_BYTES,
    attention_activation_bytes,
    logsumexp_bytes,
    mlp_activation_bytes,
    optimizer_bytes_per_param,
    unfused_score_bytes_kept,
)
from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec

# What a GPU's memory keeps beyond what the model counts: the CUDA context, the allocator's
# fragmentation, NCCL's buffers, the temporaries of the kernels. Stated in every plan.
RESERVE_FRACTION = 0.10
RESERVE_MIN_BYTES = 2 * 2**30


@dataclass(frozen=True, kw_only=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    buffers: float  # ZeRO-3's gathered layer
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.buffers + self.activations

    def parts(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "buffers": self.buffers, "activations": self.activations}


def reserve_bytes(memory_per_gpu: float) -> float:
    return max(RESERVE_MIN_BYTES, RESERVE_FRACTION * memory_per_gpu)


def usable_bytes(memory_per_gpu: float) -> float:
    """What a layout may use of a GPU's memory: the memory less the reserve."""
    return memory_per_gpu - reserve_bytes(memory_per_gpu)


def memory_of_limit(usable: float) -> float:
    """The GPU memory whose usable part is `usable` (usable_bytes' inverse)."""
    by_fraction = usable / (1 - RESERVE_FRACTION)
    if RESERVE_FRACTION * by_fraction >= RESERVE_MIN_BYTES:
        return by_fraction
    return usable + RESERVE_MIN_BYTES


def reserve_text() -> str:
    return (f"{RESERVE_FRACTION:.0%} of each GPU's memory, at least "
            f"{RESERVE_MIN_BYTES / 2**30:g} GiB, kept for the CUDA context, the allocator, NCCL "
            "and kernel temporaries")


def layer_activation_bytes(model: ModelSpec, tp: int, elt_bytes: int,
                           recompute: str = "none", sp: bool = False) -> float:
    """One layer's activations kept for backward, per token, in bytes: with full
    recomputation only its input (a sequence shard of it with sequence parallelism, `sp`,
    which means nothing at tp 1). Sequence parallelism changes nothing else here: the layers
    have no norms, and torch's column-wise linears keep the input they gathered, the whole
    sequence (core.transformer; docs/plan-model.md#memory)."""
    sp = sp and tp > 1
    if recompute == "full":
        return model.hidden_size * elt_bytes / (tp if sp else 1)
    # unfused attention keeps its scores' softmax and dropout, which selective recomputation
    # (Korthikanti et al.'s) recomputes; per-op recomputation keeps the scores' matmul output
    # alone (torchtitan keeps batched matmuls' outputs) and reruns the softmax and dropout
    scores = 0.0
    if not model.fused_attention and recompute != "selective":
        kept = elt_bytes if recompute == "op" else unfused_score_bytes_kept(elt_bytes)
        scores = model.heads / tp * model.seq_len * kept
    return scores + (
        attention_activation_bytes(model.hidden_size, model.heads, model.kv_heads, tp,
                                   elt_bytes, recompute, sp)
        + mlp_activation_bytes(model.hidden_size, model.ffn_size, model.gated, tp, elt_bytes,
                               recompute, sp))


def in_flight(layout: Layout, stage: int = 0) -> int:
    """Chunk forwards (micro-batches, without interleaving) whose activations pipeline rank
    `stage` holds at once: its warmup forwards and the first steady one (torch's
    _get_warmup_ops: (v - 1) x pp + 2 (pp - 1 - rank) interleaved, pp - 1 - rank plain)."""
    p, v, m = layout.pp, layout.virtual_stages, layout.micro_batches
    if v == 1:
        return min(p - stage, m)
    return min((v - 1) * p + 2 * (p - 1 - stage) + 1, v * m)


def gathered_bytes(model: ModelSpec, layout: Layout, elt_bytes: int, stage: int = 0) -> float:
    """What FSDP holds whole beside its shards in forward and backward (none without it): at
    ZeRO 2 the stage's parameters, gathered in forward and kept to the end of backward; at
    ZeRO 3 two layers' (the one at work and the next, which FSDP2 gathers ahead in forward
    and in backward), but in a pipeline, where torch's schedule keeps the stage gathered from
    its first backward to the step's end (no reshard after backward), the stage's. Where the
    gradients are reduce-scattered as they come (one micro-batch, or FSDP2's default of a
    sync every micro-batch), one layer's whole gradients before they are (with the sync at
    the last micro-batch only, the gradients are whole until then: stage_memory counts
    them)."""
    t, p, d, z = layout.tp, layout.pp, layout.dp, layout.zero
    if z < 2 or d == 1:
        return 0.0
    layer = model.params_per_layer / t * elt_bytes
    per_stage = layout.stage_layers(model, stage)
    params = min(2, per_stage) * layer if z == 3 and p == 1 else per_stage * layer
    synced = layout.micro_batches == 1 or layout.grad_sync == "micro"
    # in a pipeline synced every micro-batch, a micro-batch's reduce-scatter (its input and its
    # output) is still in flight when the next one's backward makes the next layer's
    in_flight_sync = p > 1 and layout.syncs_every_micro_batch
    return params + layer * (synced + in_flight_sync)


def stage_memory(model: ModelSpec, layout: Layout, elt_bytes: int, stage: int) -> Memory:
    """What stage `stage`'s rank holds at its peak (the module's text)."""
    t, p, d, z = layout.tp, layout.pp, layout.dp, layout.zero
    per_stage = layout.stage_layers(model, stage)
    v = layout.virtual_stages
    sp = layout.sequence_parallel
    last = stage == p - 1
    params = layout.stage_params(model, stage)
    tokens = layout.micro_batch_size(model) * model.seq_len
    # the residual stream between layers and stages: a sequence shard of it with sequence
    # parallelism
    stream = tokens * model.hidden_size * elt_bytes / (t if sp else 1)
    # one chunk's forward of one micro-batch (the whole stage's without interleaving); full
    # recomputation of only k layers keeps the others' activations whole
    kept = layer_activation_bytes(model, t, elt_bytes, layout.recompute, sp)
    plain = layer_activation_bytes(model, t, elt_bytes, "none", sp)
    rebuilt = layout.recomputed_layers(per_stage)
    if rebuilt < per_stage and layout.recompute == "full":
        per_micro = tokens * (rebuilt * kept + (per_stage - rebuilt) * plain) // v
    else:
        per_micro = per_stage // v * tokens * kept
    k = in_flight(layout, stage)
    # the stage's output of each micro-batch in flight, kept for its backward (by the
    # pipeline's cache, or the loss), and the op at work: one MLP-wide output
    per_micro += stream
    working = tokens * model.ffn_size / t * elt_bytes
    # backward rebuilds a recomputed layer's activations beside what it kept: all of them under
    # full recomputation (but where only the first k layers are recomputed: they are rebuilt
    # last, once the others' activations are gone), what per-op recomputation did not keep
    if rebuilt == per_stage:
        working += tokens * plain
    elif layout.recompute == "op":
        working += tokens * (plain - kept)
    if last and model.vocab:  # the LM head's input, logits and log-probabilities
        working += tokens * (model.hidden_size * elt_bytes
                             + model.vocab / t * (elt_bytes + logsumexp_bytes(elt_bytes)))
    whole = params * elt_bytes
    # DDP's gradients are views of its buckets, held throughout; FSDP's are its shards. With
    # the gradients synced at the last micro-batch only (DDP's no_sync, FSDP's
    # requires_gradient_sync false) the micro-batches before it accumulate theirs
    # unsynchronised: whole, beside the buckets or the shards. FSDP2 by default reduce-scatters
    # every micro-batch, and its sharded gradients accumulate
    ddp, fsdp = d > 1 and z <= 1, d > 1 and z >= 2
    unsynced = layout.micro_batches > 1 and layout.grad_sync == "last"
    grads = whole / d if fsdp and not unsynced else whole
    fresh = 0.0 if ddp and not unsynced else grads
    after = (k - 1) * per_micro + fresh  # the first backward done
    if v * layout.micro_batches > k:
        after += per_micro  # a later forward, beside the gradients
    acts, held = max((k * per_micro, 0.0), (after - fresh, fresh), key=sum)
    # torch's pipeline receives each micro-batch's input (but the model's first stage's) and
    # output gradient (but the last's) into buffers of its own, per chunk, kept between steps
    ends = (stage > 0) + (stage < p - 1) + 2 * (v - 1)
    received = (p > 1) * layout.micro_batches * stream * ends
    return Memory(params=whole / (d if fsdp else 1),
                  grads=held + (whole if ddp else 0.0),
                  optimizer=params * optimizer_bytes_per_param(elt_bytes) / (d if z else 1),
                  buffers=gathered_bytes(model, layout, elt_bytes, stage) + received,
                  activations=acts + working)


def memory(model: ModelSpec, layout: Layout, elt_bytes: int) -> Memory:
    """The most a rank of `layout` holds in torch's step: the largest peak of the first stage
    (the most micro-batches in flight, the embedding), the second (as many less one, buffers
    both ways, the most layers where the ends hold fewer) and the last (the LM head).
    Megatron-LM's is planner.megatron_memory's (planner.trainers.memory_of)."""
    return max((stage_memory(model, layout, elt_bytes, s) for s in layout.peak_stages(model)),
               key=lambda mem: mem.total)


def step_inputs_bytes(model: ModelSpec, layout: Layout, elt_bytes: int) -> float:
    """What `distbench step` feeds a rank for the whole step, beside the memory above: its
    replica's share of the samples (batch / dp of seq x hidden) on the first stage and of the
    regression targets on the last; both without a pipeline. A real trainer feeds token ids,
    which this leaves out."""
    share = model.batch // layout.dp * model.seq_len * model.hidden_size * elt_bytes
    return share * (2 if layout.pp == 1 else 1)


def build_bytes(model: ModelSpec, layout: Layout, elt_bytes: int) -> float:
    """What a rank holds while `distbench step` builds its stage, a layer at a time: the layers
    already split (their parameters, as above) and the next one whole, before TP and FSDP split
    it (in fp32 where FSDP keeps fp32 masters of a half-precision model)."""
    fsdp = layout.dp > 1 and layout.zero >= 2
    whole = model.params_per_layer * (MASTER_BYTES if fsdp and elt_bytes < MASTER_BYTES
                                      else elt_bytes)
    return memory(model, layout, elt_bytes).params + whole


def held_by_step(model: ModelSpec, layout: Layout, elt_bytes: int) -> float:
    """The most one rank of `layout` holds in `distbench step`: the model above and its inputs
    in the step, or its build, whichever is more."""
    return max(memory(model, layout, elt_bytes).total
               + step_inputs_bytes(model, layout, elt_bytes),
               build_bytes(model, layout, elt_bytes))


def fits(total: float, memory_per_gpu: float) -> bool:
    return total <= usable_bytes(memory_per_gpu)
