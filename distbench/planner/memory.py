"""The memory one rank holds for a layout, torch-free: its share of the parameters, gradients
and AdamW states (ZeRO divides them over the data-parallel replicas), ZeRO-3's gathered layer,
and the activations it keeps for backward. docs/plan.md states the model and what it leaves out.

Parameters of one rank: the stage's layers (layers / pp) over tp, `P` below.

- parameters: P x b, gradients: P x b, with b the dtype's bytes;
- AdamW: two moments, and an fp32 master copy of the weights when the dtype is under 4 bytes
  (mixed precision); the moments are fp32 then too: 12 bytes per parameter for 16-bit, 8 for
  fp32 (2 moments in fp32), 16 for fp64 (ZeRO paper, Rajbhandari et al. 2020, section 3.1);
- ZeRO divides over dp: stage 1 the optimizer states, stage 2 and the gradients, stage 3 and the
  parameters; ZeRO-3 gathers one layer's parameters (its TP shard) at a time and produces its
  whole gradients before reduce-scattering them: one layer's P x 2b in `buffers`.

Activations kept for backward, per layer, per token, in elements (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", section 4.1, without their
layer norms and dropout masks, which these layers lack; h hidden, f ffn, a heads, s sequence):

- attention: the fused qkv's input (h), Q and K for the scores' backward (2h), the softmax's
  output (a x s: one row of scores per head) and V for the weighted sum's backward (h), the
  output projection's input (h): 5h + a s;
- MLP: the up projection's input (h), the GELU's input (f) and the down projection's input
  (the GELU's output, f): h + 2f;
- the residual adds keep nothing. With tensor parallelism (Megatron, no sequence
  parallelism) the two block inputs (2h) are whole on every TP rank, the rest sharded:
  2h + (4h + a s + 2f) / tp elements per token, times the dtype's bytes.

A micro-batch is micro_batch_size x seq tokens; the first pipeline stage holds min(pp, m)
micro-batches in flight under 1F1B (with pp = 1, one: accumulation runs one at a time)."""

from __future__ import annotations

from dataclasses import dataclass

from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec

# What a GPU's memory keeps beyond what the model counts: the CUDA context, the allocator's
# fragmentation, NCCL's buffers, the temporaries of the kernels. Stated in every plan.
RESERVE_FRACTION = 0.10
RESERVE_MIN_BYTES = 2 * 2**30
MASTER_BYTES = 4  # the fp32 master weights and moments of mixed precision


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


def optimizer_bytes_per_param(elt_bytes: int) -> int:
    """AdamW's two moments, and the fp32 master weights under mixed precision."""
    if elt_bytes < MASTER_BYTES:
        return 3 * MASTER_BYTES
    return 2 * elt_bytes


def activation_elements_per_token(model: ModelSpec, tp: int) -> float:
    """One layer's activations kept for backward, per token, in elements (the module's
    docstring derives it)."""
    h, f, a, s = model.hidden_size, model.ffn_size, model.heads, model.seq_len
    return 2 * h + (4 * h + a * s + 2 * f) / tp


def in_flight(layout: Layout) -> int:
    """Micro-batches whose activations the first stage holds at once under 1F1B."""
    return 1 if layout.pp == 1 else min(layout.pp, layout.micro_batches)


def memory(model: ModelSpec, layout: Layout, elt_bytes: int) -> Memory:
    t, p, d, z = layout.tp, layout.pp, layout.dp, layout.zero
    per_stage = model.layers // p
    params = per_stage * model.params_per_layer / t
    state = params * optimizer_bytes_per_param(elt_bytes)
    tokens = layout.micro_batch_size(model) * model.seq_len
    activations = (per_stage * tokens * activation_elements_per_token(model, t) * elt_bytes
                   * in_flight(layout))
    gathered = 2 * model.params_per_layer / t * elt_bytes if z >= 3 and d > 1 else 0.0
    return Memory(params=params * elt_bytes / (d if z >= 3 else 1),
                  grads=params * elt_bytes / (d if z >= 2 else 1),
                  optimizer=state / (d if z >= 1 else 1),
                  buffers=gathered, activations=activations)


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
