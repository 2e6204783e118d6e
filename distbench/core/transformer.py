"""The facts of a transformer layer every count derives from, torch-free and stated once:
its parameters, the bytes its forward keeps for backward per token, and AdamW's bytes per
parameter. planner.models and planner.memory build the model's counts from them; the tp, pp and
dp commands' host bounds and closed forms use them too. docs/plan.md states each."""

from __future__ import annotations

MASTER_BYTES = 4  # the fp32 master weights and moments of mixed precision


def attention_params(hidden: int, heads: int, kv_heads: int) -> int:
    """q and the output projection (hidden x hidden each), k and v (hidden x kv_heads' width)."""
    kv_width = kv_heads * (hidden // heads)
    return 2 * hidden * hidden + 2 * hidden * kv_width


def mlp_params(hidden: int, ffn: int, gated: bool) -> int:
    """up and down (hidden x ffn each), and the gate when gated."""
    return (3 if gated else 2) * hidden * ffn


def vocab_params(hidden: int, vocab: int) -> int:
    """The embedding and the untied LM head, vocab x hidden each (none without a vocabulary)."""
    return 2 * vocab * hidden


def optimizer_bytes_per_param(elt_bytes: int) -> int:
    """AdamW's two moments, and the fp32 master weights under mixed precision."""
    if elt_bytes < MASTER_BYTES:
        return 3 * MASTER_BYTES
    return 2 * elt_bytes


def logsumexp_bytes(elt_bytes: int) -> int:
    """Fused attention's logsumexp is fp32 for 16-bit inputs, the input's dtype above."""
    return max(MASTER_BYTES, elt_bytes)


def attention_activation_bytes(hidden: int, heads: int, kv_heads: int, tp: int,
                               elt_bytes: int, recompute: str = "none",
                               sp: bool = False) -> float:
    """An attention block's activations kept for backward, per token (planner.memory's
    text derives it from what the step's layer saves). With sequence parallelism (`sp`, at
    tp > 1) torch's column-wise qkv keeps the input it gathered, the whole sequence, as the
    block without it keeps its whole input: the same bytes. Per-op recomputation (`op`)
    keeps the layer's input (the checkpoint's: a sequence shard with sp), qkv's output (the
    first matmul's), the fused kernel's output and logsumexp, and with sp the output
    projection's reduce-scatter; it reruns the output projection (the second matmul) and the
    grouped queries' copy."""
    width = (heads + 2 * kv_heads) * (hidden // heads)
    lse = heads / tp * logsumexp_bytes(elt_bytes)
    shard = hidden / tp if sp else 0.0
    if recompute == "op":
        return elt_bytes * ((shard or hidden) + (width + hidden) / tp + shard) + lse
    if heads > kv_heads and kv_heads > tp:  # several groups of several queries: q copied
        width += hidden
    if recompute == "selective":
        lse = 0
    return elt_bytes * (hidden + (width + hidden) / tp) + lse


def mlp_activation_bytes(hidden: int, ffn: int, gated: bool, tp: int, elt_bytes: int,
                         recompute: str = "none", sp: bool = False) -> float:
    """An MLP block's activations kept for backward, per token (planner.memory's text); with
    sequence parallelism the same (the gathered input, where the block without it keeps its
    whole input). Per-op recomputation (`op`) keeps the layer's odd matmuls' outputs: the
    third, up's (gated, the gate's), and gated the fifth, down's, whole (its partial sums,
    before they are reduced), and with sp down's reduce-scatter."""
    if recompute == "op":
        kept = ffn / tp + (hidden if gated else 0.0) + (hidden / tp if sp else 0.0)
        return elt_bytes * kept
    return elt_bytes * (hidden + (4 if gated else 2) * ffn / tp)


# Unfused attention (Megatron-LM before FlashAttention: baddbmm for the scores, a fused
# scale-mask-softmax, torch's dropout, bmm for the weighted sum; NVIDIA/Megatron-LM
# megatron/model/transformer.py ParallelAttention at 6985e58938, the SC'21 runs' commit)
# writes the a x s scores of each token to memory and passes over them again and again, in
# elements of the dtype (the dropout mask one byte): forward, the scores written (1), the
# softmax read and written (2), the dropout read, its output written (2) and its mask, the
# weighted sum's read (1); backward, the probabilities' gradient written (1), the dropped
# probabilities read for v's gradient (1), the dropout's backward (2, and the mask), the
# softmax's (reads output and gradient, writes: 3), the scores' gradient read for q's and k's
# gradients (2). Fused attention (flash, memory-efficient, cuDNN) keeps the scores on chip.
UNFUSED_SCORE_PASSES_FORWARD, UNFUSED_SCORE_PASSES_BACKWARD = 6, 9
MASK_BYTES = 1


def unfused_score_bytes_moved(elt_bytes: int) -> int:
    """Bytes unfused attention reads and writes per score element in one forward and backward."""
    return ((UNFUSED_SCORE_PASSES_FORWARD + UNFUSED_SCORE_PASSES_BACKWARD) * elt_bytes
            + 2 * MASK_BYTES)


def unfused_score_bytes_kept(elt_bytes: int) -> int:
    """Bytes unfused attention keeps for backward per score element: the softmax's output, the
    dropout's mask and output (Korthikanti et al. 2022, section 4.1: 5as bytes in 16 bits)."""
    return 2 * elt_bytes + MASK_BYTES

