"""The most memory one rank holds in a Megatron-LM training step (`plan --trainer megatron`),
torch-free: Megatron's mechanics, counted as Megatron's own estimate counts them
(NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py, read at d98e8a64dd;
tests/unit/planner/test_megatron_memory.py holds the two within 5% on published layouts), rank by
rank instead of for the first stage alone, and over the layouts that estimate leaves out.

Weights and optimizer (Megatron's DDP and optimizer; docs/user-guide/features/
dist_optimizer.md): a rank's parameters are its chunks' layers over tp, the word embedding
(padded vocab x hidden / tp) on the first stage and the output layer (the same) on the last.
It holds them in the dtype (2 bytes in bf16), their fp32 main gradients in DDP's contiguous
gradient buffer (whole on every replica, even with the distributed optimizer, which
reduce-scatters into it), and the optimizer's fp32 master weights and two Adam moments (12
bytes in bf16; in fp32 the weights are their own masters: 8), which the distributed optimizer
(--use-distributed-optimizer, ZeRO 1 under this trainer) divides over dp: 18 or 6 + 12 / dp
bytes a parameter in bf16, Megatron's figures. The vocabulary is padded to a multiple of 128
x tp as Megatron pads it (--make-vocab-size-divisible-by).

Activations kept for backward (Korthikanti et al. 2022, arXiv 2205.05198, section 4 and Table
2, as the estimate counts them), per token of a layer, with e the dtype's bytes and 1-byte
dropout masks: the residual stream's tensors, the two norms' inputs, the QKV and fc1 inputs
(the norms' outputs) and the two dropout masks, 4 e h + 2 h, whole on every TP rank without
sequence parallelism and over tp with it; the TP-sharded ones, q, k and v, the output
projection's input, fc1's output and the activation's output, e (2 h + 2 kv + 2 f) / tp for kv
the keys' width (h under multi-head attention) and f the ffn (fc1's output is 2 f gated:
SwiGLU keeps gate and up, 3 f in all). With kv = h and ungated that is Korthikanti's
(18 h + 4 f) / tp with sequence parallelism, (10 + 24 / tp) h without (f = 4 h). The attention
core keeps nothing more under selective recomputation (Megatron's recomputes it); without
recomputation fused attention (TE/flash) keeps its fp32 logsumexp (heads / tp a token) and
unfused attention its softmax, dropout mask and dropout output (5 a s / tp in bf16).

Megatron's schedules keep activations only for the micro-batches in flight (their received
inputs are the first layer's kept input; outputs are deallocated once sent): stage i of plain
1F1B min(pp - i, m), and with v virtual stages (pp - 1 - i) x 2 + (v - 1) x pp + 1 chunk
forwards (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, the same as
torch's: planner.memory.in_flight), in rounds of pp micro-batches per chunk. The first stage's
chunk adds the embedding's int64 token ids (whole on every TP rank) and dropout mask per
micro-batch it holds; the last stage's, the final norm's and output layer's inputs (e h each,
over tp with sequence parallelism) and the cross-entropy's fp32 softmax (vocab / tp). Every
rank is counted, and the peak is the largest.

Beyond Megatron's estimate, which assumes the first stage is the most loaded and holds
layers / pp layers (a fraction where pp does not divide them), multi-head attention (its
TODO), an ungated MLP and, without sequence parallelism and selective recomputation, its
no-SP formula (f = 4 h, 5% added for temporaries):
- uneven stages: each stage's layers (layouts.stage_layers), every rank counted, so a middle
  stage of 126 layers on 16 (8 layers, 15 micro-batches) can hold the most;
- the last stage's output layer and logits at pp > 1 (the estimate counts them at pp 1 only);
- grouped-query attention's narrower k and v, and SwiGLU's wider fc1 output (above);
- sequence parallelism off, and recomputation `none` (the attention core's kept tensors) and
  `full`: Megatron's --recompute-granularity full --recompute-method block with
  --recompute-num-layers k (`recompute_layers`, 0: every layer of a chunk) keeps only each
  recomputed layer's input (e h, over tp with sequence parallelism), and holds one layer's
  activations again while backward reruns it;
- dtypes other than bf16 (e bytes; fp32 keeps no separate master weights).
Left out, as the estimate leaves them: biases, norms' parameters, learned position
embeddings, the step's transients (an op's output before it is kept, the logits in bf16
before their fp32 copy), and the allocator's fragmentation (planner.memory's reserve covers
those). The model is untied (ModelSpec's): one output layer of its own, at pp 1 beside the
embedding. Torchtitan's per-op recomputation (`op`) is not Megatron's (`problems`).
"""

from __future__ import annotations

from distbench.core.transformer import (
    MASK_BYTES,
    MASTER_BYTES,
    logsumexp_bytes,
    optimizer_bytes_per_param,
    unfused_score_bytes_kept,
)
from distbench.planner.layouts import Layout, rank_chunks
from distbench.planner.memory import Memory, in_flight
from distbench.planner.models import ModelSpec

# Megatron pads the vocabulary to a multiple of this x tp (--make-vocab-size-divisible-by)
VOCAB_MULTIPLE = 128
TOKEN_ID_BYTES = 8  # int64 token ids, kept by the embedding's lookup for its backward
RECOMPUTE = ("none", "selective", "full")  # Megatron's --recompute-granularity, and none


def problems(layout: Layout) -> list[str]:
    """What Megatron cannot run of `layout` that the memory model would otherwise count."""
    if layout.recompute not in RECOMPUTE:
        return [f"recompute {layout.recompute} is not Megatron's (it recomputes "
                f"{', '.join(RECOMPUTE[1:])}, or none)"]
    return []


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = VOCAB_MULTIPLE * tp
    return -(-vocab // multiple) * multiple


def layer_bytes(model: ModelSpec, layout: Layout, elt_bytes: int, recompute: str) -> float:
    """One layer's activations kept for backward per token, in bytes, under `recompute`
    ("none" or "selective"; the module's text)."""
    h, t = model.hidden_size, layout.tp
    kv = model.kv_heads * model.head_dim
    residual = 4 * elt_bytes * h + 2 * MASK_BYTES * h
    sharded = elt_bytes * (2 * h + 2 * kv + (3 if model.gated else 2) * model.ffn_size)
    if recompute == "selective":
        core = 0.0
    elif model.fused_attention:
        core = model.heads * logsumexp_bytes(elt_bytes)
    else:
        core = model.heads * model.seq_len * unfused_score_bytes_kept(elt_bytes)
    return residual / (t if layout.sequence_parallel else 1) + (sharded + core) / t


def chunk_in_flight(layout: Layout, rank: int) -> list[int]:
    """The micro-batches each of pipeline rank `rank`'s chunks holds at once, at its first
    backward: its in-flight chunk forwards, which run chunk by chunk in rounds of pp."""
    k, p, v = in_flight(layout, rank), layout.pp, layout.virtual_stages
    if v == 1:
        return [k]
    rounds, rest = divmod(k, p * v)
    return [rounds * p + min(max(rest - c * p, 0), p) for c in range(v)]


def rank_memory(model: ModelSpec, layout: Layout, elt_bytes: int, rank: int) -> Memory:
    """What pipeline rank `rank` holds at its peak (the module's text)."""
    t, p, v = layout.tp, layout.pp, layout.virtual_stages
    sp = t if layout.sequence_parallel else 1
    tokens = layout.micro_batch_size(model) * model.seq_len
    vocab = padded_vocab(model.vocab, t) if model.vocab else 0
    per_layer = layer_bytes(model, layout, elt_bytes, layout.recompute)
    if layout.recompute == "full":  # the layers not recomputed keep all theirs
        per_layer = layer_bytes(model, layout, elt_bytes, "none")
    checkpoint = elt_bytes * model.hidden_size / sp
    params = 0.0
    kept = 0.0
    rebuilt = 0.0
    for (stage, layers), held in zip(rank_chunks(model.layers, rank, p, v),
                                     chunk_in_flight(layout, rank), strict=True):
        n = len(layers)
        params += n * model.params_per_layer / t
        recomputed = layout.recomputed_layers(n)
        per_token = recomputed * checkpoint + (n - recomputed) * per_layer
        if recomputed:
            rebuilt = tokens * per_layer
        if stage == 0 and vocab:
            params += vocab * model.hidden_size / t
            per_token += TOKEN_ID_BYTES + MASK_BYTES * model.hidden_size / sp
        if stage == p * v - 1 and vocab:
            params += vocab * model.hidden_size / t
            per_token += (2 * elt_bytes * model.hidden_size / sp
                          + vocab / t * logsumexp_bytes(elt_bytes))
        kept += held * tokens * per_token
    sharded = layout.dp if layout.zero == 1 else 1
    return Memory(params=params * elt_bytes,
                  grads=params * max(MASTER_BYTES, elt_bytes),
                  optimizer=params * optimizer_bytes_per_param(elt_bytes) / sharded,
                  buffers=0.0,
                  activations=kept + rebuilt)


def megatron_memory(model: ModelSpec, layout: Layout, elt_bytes: int) -> Memory:
    """The most a rank of `layout` holds under Megatron-LM: the largest peak of the pipeline
    ranks that may hold the most (Layout.peak_stages: the first, the embedding's and the most
    micro-batches in flight; the second and the first of the fullest; the last, the output
    layer's), which is every rank's largest, since a later rank of as many layers holds fewer
    micro-batches; counting every rank made a plan of 840 stages minutes long.
    ZeRO 1 is the distributed optimizer; ZeRO 2 and 3 are not Megatron's (planner.trainers
    refuses them) and raise, as `problems`' recomputation does."""
    if layout.zero not in (0, 1):
        raise ValueError(f"ZeRO {layout.zero} is not Megatron's")
    if problems(layout):
        raise ValueError(problems(layout)[0])
    return max((rank_memory(model, layout, elt_bytes, r) for r in layout.peak_stages(model)),
               key=lambda mem: mem.total)
