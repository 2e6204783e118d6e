"""Megatron-LM's own estimate of the memory a rank holds, transcribed to check
distbench.planner.megatron_memory against (tests/unit/planner/test_megatron_memory.py).
Test-only: the reference, not the model.

Source: NVIDIA/Megatron-LM, megatron/training/theoretical_memory_usage.py at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22): `compute_weight_and_optimizer_memory`,
`compute_activation_memory` (sequence parallelism with selective recomputation),
`compute_activation_memory_without_sp`, and `report_theoretical_memory`'s choice between the
two. Each function below is Megatron's, line for line, with `args.x` as an explicit argument
(the verbose prints dropped, the schedule's two adjustments, the same lines in both activation
functions, written once in `pipeline_factor`), for a dense model: the branches for
mixture-of-experts, multi-latent attention and multi-token prediction are left out (Megatron
takes them only with --num-experts, --multi-latent-attention or --mtp-num-layers; with none of
those their terms are 0 in Megatron's code too). Megatron's argument defaults are kept:
kv_channels = hidden / heads (--kv-channels), the vocabulary padded to a multiple of 128 x tp
(`vocab_size_with_padding`, megatron/core/tokenizers/utils/build_tokenizer.py), no virtual
stages as None (megatron/training/arguments.py turns 1 into None) and sequence parallelism off
at tp 1 (arguments.py: "Disabling sequence parallelism because tensor model parallelism is
disabled").

What it assumes (bf16 training):
- weights and optimizer: the most loaded rank is the first pipeline stage, with layers / pp
  layers (a fraction where pp does not divide them) and the word embedding, both over tp, and
  the norms' parameters whole; the untied output layer counted only at pp 1. 18 bytes a
  parameter (bf16 weights 2, fp32 main gradients 4, fp32 master weights 4, two fp32 Adam
  moments 8), or 6 + 12 / dp with the distributed optimizer;
- activations with --sequence-parallel and --recompute-granularity selective: Korthikanti et
  al. 2022 (arXiv 2205.05198) Table 2's 34 s b h / t a layer, written for any ffn as
  s b h (18 + 4 ffn / h) / t; the first stage holding pp micro-batches of layers / pp layers
  (all the layers' worth), fewer with fewer micro-batches, pp (1 + (pp - 1) / (pp v)) with v
  virtual stages; the embedding's input ids (8 bytes a token) and dropout mask per micro-batch
  in flight; at pp 1 the output layer's input and fp32 logits; everything over tp. It counts
  every attention as multi-head (a TODO in Megatron's code: no narrower keys and values under
  grouped-query attention) and every MLP as ungated (SwiGLU's wider activations not counted);
- any other layout (no sequence parallelism, tp 1, full or no recomputation) takes
  `compute_activation_memory_without_sp`: Korthikanti's tensor-parallel-with-selective-
  recomputation row, s b h (10 + 24 / t) a layer, with ffn = 4 h fixed, the embedding's terms
  not over tp, the logits in 2 bytes, and 5% on top for temporaries.
All figures are in bytes (Megatron divides by 2^20 to print them).
"""

from __future__ import annotations

import math

MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEGATRON_PATH = "megatron/training/theoretical_memory_usage.py"


def padded_vocab_size(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """megatron/core/tokenizers/utils/build_tokenizer.py `vocab_size_with_padding`."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab / multiple) * multiple)


def compute_weight_and_optimizer_memory(
    *, num_layers: int, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
    padded_vocab_size: int, tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int, data_parallel_size: int,
    use_distributed_optimizer: bool, swiglu: bool = False, group_query_attention: bool = False,
    num_query_groups: int | None = None, kv_channels: int | None = None,
    normalization: str = "LayerNorm", untie_embeddings_and_output_weights: bool = False,
) -> float:
    if kv_channels is None:  # arguments.py: kv_channels defaults to hidden / heads
        kv_channels = hidden_size // num_attention_heads
    # Attention projection size.
    query_projection_size = kv_channels * num_attention_heads
    query_projection_to_hidden_size_ratio = query_projection_size / hidden_size
    # Group Query Attention.
    if not group_query_attention:
        num_query_groups = num_attention_heads
    gated_linear_multiplier = 3 / 2 if swiglu else 1
    # dense model: moe_layer_pattern all 0, no MTP layers
    num_dense_layers = num_layers

    # RMSNorm does not have bias, but LayerNorm has.
    norm_size = 1 if normalization == "RMSNorm" else 2

    self_attn_term = (
        2
        * hidden_size
        * hidden_size
        # Attention.
        * ((1 + (num_query_groups / num_attention_heads)) * query_projection_to_hidden_size_ratio)
    )

    embedding_size = hidden_size * padded_vocab_size
    final_layernorm = norm_size * hidden_size

    attention_params = self_attn_term
    dense_mlp_params = 2 * hidden_size * ffn_hidden_size * gated_linear_multiplier
    layernorm_params = 2 * hidden_size * norm_size

    # Split params by how they are held on each rank: regular TP, replicated, or EP/ETP.
    tp_sharded_params_in_transformer_block = (
        (attention_params + dense_mlp_params) * num_dense_layers
    )
    replicated_params_in_transformer_block = layernorm_params * num_dense_layers + final_layernorm

    # Most loaded model shard has 1/pp_size transformer layers, 1 mtp block, and 1 embedding layer.
    tp_sharded_params_on_most_loaded_shard = (
        (tp_sharded_params_in_transformer_block / pipeline_model_parallel_size)
        + embedding_size
    ) / tensor_model_parallel_size
    replicated_params_on_most_loaded_shard = (
        replicated_params_in_transformer_block / pipeline_model_parallel_size
    )
    if untie_embeddings_and_output_weights and pipeline_model_parallel_size == 1:
        tp_sharded_params_on_most_loaded_shard += embedding_size / tensor_model_parallel_size

    def num_bytes_per_parameter(data_parallel_size):
        # This estimator assumes bf16 training: bf16 model params, fp32 main gradients,
        # fp32 main params, and fp32 Adam states. See docs/user-guide/features/dist_optimizer.md.
        return 18 if not use_distributed_optimizer else 6 + (12 / data_parallel_size)

    weight_and_optimizer_memory = (
        (tp_sharded_params_on_most_loaded_shard + replicated_params_on_most_loaded_shard)
        * num_bytes_per_parameter(data_parallel_size)
    )
    return weight_and_optimizer_memory


def pipeline_factor(pipeline_model_parallel_size: int,
                     virtual_pipeline_model_parallel_size: int | None,
                     num_microbatches: int | None) -> float:
    """The two schedule adjustments both activation functions apply, in their order."""
    factor = 1.0
    # Multiply by interleaved PP memory factor.
    if virtual_pipeline_model_parallel_size is not None:
        interleaved_schedule_memory_penalty = 1 + (
            (pipeline_model_parallel_size - 1)
            / (pipeline_model_parallel_size * virtual_pipeline_model_parallel_size)
        )
        factor *= interleaved_schedule_memory_penalty
    # If using non-interleaved schedule, number of microbatches in pipeline can be less than
    # pp_size, so discount accordingly.
    if virtual_pipeline_model_parallel_size is None and pipeline_model_parallel_size > 1:
        if num_microbatches is not None:
            factor *= min(1, num_microbatches / pipeline_model_parallel_size)
    return factor


def compute_activation_memory(
    *, num_layers: int, hidden_size: int, ffn_hidden_size: int, seq_length: int,
    micro_batch_size: int, padded_vocab_size: int, tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int, virtual_pipeline_model_parallel_size: int | None = None,
    num_microbatches: int | None = None,
) -> float:
    # Using formula in Table 2 of https://arxiv.org/pdf/2205.05198.pdf.
    # We are trying to compute the maximum activation footprint, so all calculations in this
    # function are for the first pipeline stage.

    # Memory footprint from transformer layer (self-attention and MLP).
    activation_memory = (seq_length * micro_batch_size * hidden_size) * (
        18 + (4 * (ffn_hidden_size / hidden_size))
    )
    activation_memory *= num_layers

    # Now add activation memory required for input embeddings, last LayerNorm and output layer.

    # Input to embedding (pp_size microbatches in flight).
    activation_memory += 8 * seq_length * micro_batch_size * pipeline_model_parallel_size
    # Dropout in embedding layer (pp_size microbatches in flight).
    activation_memory += (
        seq_length * micro_batch_size * hidden_size * pipeline_model_parallel_size
    )

    activation_memory *= pipeline_factor(pipeline_model_parallel_size,
                                          virtual_pipeline_model_parallel_size,
                                          num_microbatches)

    if pipeline_model_parallel_size == 1:
        # Inputs to output layer and CE loss.
        activation_memory += (
            seq_length
            * micro_batch_size
            * hidden_size
            * 4
            * (1 + (padded_vocab_size / hidden_size))
        )

    # Activation memory is partitioned by TP size due to tensor and sequence model parallelism.
    return activation_memory / tensor_model_parallel_size


def compute_activation_memory_without_sp(
    *, num_layers: int, hidden_size: int, seq_length: int, micro_batch_size: int,
    padded_vocab_size: int, tensor_model_parallel_size: int, pipeline_model_parallel_size: int,
    virtual_pipeline_model_parallel_size: int | None = None,
    num_microbatches: int | None = None,
) -> float:
    """Compute activation memory without sequence parallelism"""

    # 4. Compute per-layer memory
    per_layer_memory = seq_length * micro_batch_size * hidden_size * (
        10 + (24 / tensor_model_parallel_size))

    # 5. Multiply by number of layers
    total_activation_memory = per_layer_memory * num_layers

    # 6. Add embedding activations
    # Input to embedding (pp_size microbatches in flight)
    total_activation_memory += 8 * seq_length * micro_batch_size * pipeline_model_parallel_size
    # Dropout in embedding layer (pp_size microbatches in flight)
    total_activation_memory += (
        seq_length * micro_batch_size * hidden_size * pipeline_model_parallel_size
    )

    # 7. Handle pipeline parallelism schedules
    total_activation_memory *= pipeline_factor(pipeline_model_parallel_size,
                                                virtual_pipeline_model_parallel_size,
                                                num_microbatches)

    # 8. Add output layer memory if needed
    if pipeline_model_parallel_size == 1:
        # Logits calculation
        logits_size = seq_length * micro_batch_size * padded_vocab_size
        # The output projection is partitioned across TP
        logits_size /= tensor_model_parallel_size

        # Outputs from final layer norm
        final_ln_output = seq_length * micro_batch_size * hidden_size

        total_activation_memory += (logits_size + final_ln_output) * 2  # multiply by 2 for bytes

    # 9. Add buffer for optimizer and miscellaneous temporaries (5% overhead)
    overhead_factor = 1.05
    total_activation_memory *= overhead_factor

    return total_activation_memory


def report_theoretical_memory(
    *, num_layers: int, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
    seq_length: int, micro_batch_size: int, vocab_size: int, tensor_model_parallel_size: int,
    pipeline_model_parallel_size: int, data_parallel_size: int,
    use_distributed_optimizer: bool, sequence_parallel: bool, recompute_granularity: str | None,
    virtual_pipeline_model_parallel_size: int | None = None,
    num_microbatches: int | None = None, swiglu: bool = False,
    num_query_groups: int | None = None, normalization: str = "LayerNorm",
    untie_embeddings_and_output_weights: bool = False,
) -> tuple[float, float, float]:
    """(weights and optimizer, activations, total) in bytes, as Megatron reports them at the
    start of training, for the arguments Megatron would have after arguments.py's checks."""
    if tensor_model_parallel_size == 1:
        sequence_parallel = False  # arguments.py
    padded = padded_vocab_size(vocab_size, tensor_model_parallel_size)
    gqa = num_query_groups is not None and num_query_groups != num_attention_heads
    weight_and_optimizer_memory = compute_weight_and_optimizer_memory(
        num_layers=num_layers, hidden_size=hidden_size, ffn_hidden_size=ffn_hidden_size,
        num_attention_heads=num_attention_heads, padded_vocab_size=padded,
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        data_parallel_size=data_parallel_size,
        use_distributed_optimizer=use_distributed_optimizer, swiglu=swiglu,
        group_query_attention=gqa, num_query_groups=num_query_groups,
        normalization=normalization,
        untie_embeddings_and_output_weights=untie_embeddings_and_output_weights)
    schedule = dict(seq_length=seq_length, micro_batch_size=micro_batch_size,
                    padded_vocab_size=padded,
                    tensor_model_parallel_size=tensor_model_parallel_size,
                    pipeline_model_parallel_size=pipeline_model_parallel_size,
                    virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
                    num_microbatches=num_microbatches)
    # Choose the appropriate activation memory calculation based on parallelism strategy
    if sequence_parallel and recompute_granularity == "selective":
        activation_memory = compute_activation_memory(
            num_layers=num_layers, hidden_size=hidden_size, ffn_hidden_size=ffn_hidden_size,
            **schedule)
    else:
        activation_memory = compute_activation_memory_without_sp(
            num_layers=num_layers, hidden_size=hidden_size, **schedule)
    total_memory = weight_and_optimizer_memory + activation_memory
    return weight_and_optimizer_memory, activation_memory, total_memory
