"""The planner's memory model against what the step's own layer saves for backward, the presets
against the published parameter counts, and the peak's phases on hand-computed cases."""

from __future__ import annotations

import weakref
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from distbench.parallel.tensor_parallel import layer_plan
from distbench.planner import memory as mem
from distbench.planner.layouts import Layout, enumerate_layouts, micro_batch_counts
from distbench.planner.models import PRESETS, ModelSpec, parse_model
from distbench.steps.mesh_model import Layer

SHAPES = [
    ModelSpec(name="mha", layers=1, hidden_size=64, ffn_size=256, heads=4, seq_len=16, batch=1),
    ModelSpec(name="gqa", layers=1, hidden_size=96, ffn_size=192, heads=6, kv_heads=2,
              seq_len=8, batch=1, gated=True),
    ModelSpec(name="gqa4", layers=1, hidden_size=128, ffn_size=256, heads=8, kv_heads=4,
              seq_len=8, batch=1),
]


def _plain(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s data (a DTensor's local shard)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in names]
        return [p for i in inner if isinstance(i, torch.Tensor) for p in _plain(i)]
    return [t]


def kept_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """What one layer's forward keeps for backward: each storage its saved tensors hold, once
    (q, k and v are views of one), and each its forward made that outlives it: per-op
    recomputation's cache of the outputs it keeps, which no saved-tensor hook sees. The
    weights, the output and the input (but where it is saved) left out."""
    saved: dict[int, int] = {}
    made: list[weakref.ref] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        for plain in _plain(t):
            storage = plain.untyped_storage()
            saved[storage._cdata] = storage.nbytes()
        return t

    class Made(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            made.extend(weakref.ref(p.untyped_storage()) for t in tree_leaves(out)
                        if isinstance(t, torch.Tensor) for p in _plain(t))
            return out

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Made():
        y = layer(x)
    kept = dict(saved)
    for ref in made:
        storage = ref()
        if storage is not None:
            kept.setdefault(storage._cdata, storage.nbytes())
    unsaved = [*_plain(x), *_plain(y)]
    left_out = {p.untyped_storage()._cdata for t in layer.parameters() for p in _plain(t)} \
        | {p.untyped_storage()._cdata for p in unsaved} - set(saved)
    return sum(n for key, n in kept.items() if key not in left_out)


def saved_bytes(model: ModelSpec, tp: int, samples: int, recompute: str, dtype) -> int:
    """What one layer of TP rank's shapes (tp > 1: a shard of the heads and the ffn, on the
    whole sequence, as TP without sequence parallelism feeds it) keeps for backward."""
    layer = Layer(model, tp, recompute).to(dtype)
    x = torch.randn(samples, model.seq_len, model.hidden_size, dtype=dtype, requires_grad=True)
    return kept_bytes(layer, x)


RECOMPUTE = ["none", "selective", "op", "full"]


@pytest.mark.parametrize("model", SHAPES, ids=lambda m: m.name)
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("recompute", RECOMPUTE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_activation_formula_is_what_the_steps_layer_saves(model, tp, recompute, dtype):
    samples = 3
    tokens = samples * model.seq_len
    expected = tokens * mem.layer_activation_bytes(model, tp, dtype.itemsize, recompute)
    assert saved_bytes(model, tp, samples, recompute, dtype) == expected


@pytest.fixture(scope="module")
def tp_mesh():
    """Rank 0 of a TP group of 2 on torch's fake process group, in this process: collectives
    return at once and their values are garbage, but DTensor runs every op, gathers and
    reduce-scatters as on real ranks, so what a layer keeps is what it keeps there (the same
    bytes as on 2 gloo ranks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("model", SHAPES, ids=lambda m: m.name)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
@pytest.mark.parametrize("recompute", RECOMPUTE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_formula_is_what_the_steps_tp_layer_saves_with_and_without_sequence_parallelism(
        tp_mesh, model, sp, recompute, dtype):
    """The step's own TP plan (parallel.tensor_parallel.layer_plan) at tp 2. With sequence
    parallelism the layer takes and gives its part of the sequence, and torch's column-wise
    linears keep what they gathered (the whole sequence), not the part (Megatron keeps the part
    and gathers it again in backward): only what recomputation keeps of the input is sharded."""
    from torch.distributed.tensor.parallel import parallelize_module

    layer = Layer(model, 1, recompute).to(dtype)
    parallelize_module(layer, tp_mesh["tp"], layer_plan(model.gated, sp))
    samples, seq = 3, model.seq_len // (2 if sp else 1)
    x = torch.randn(samples, seq, model.hidden_size, dtype=dtype, requires_grad=True)
    expected = samples * model.seq_len * mem.layer_activation_bytes(model, 2, dtype.itemsize,
                                                                     recompute, sp=sp)
    assert kept_bytes(layer, x) == expected
    if sp and recompute in ("none", "selective"):
        assert expected == samples * model.seq_len * mem.layer_activation_bytes(
            model, 2, dtype.itemsize, recompute)


def test_fused_attention_keeps_no_scores():
    # the scores would be heads x seq per token: 8 samples of 8 tokens keep as much as one of
    # 64, where the scores would be 8 times more
    short = ModelSpec(name="s", layers=1, hidden_size=64, ffn_size=128, heads=4, seq_len=8,
                      batch=1)
    long = ModelSpec(name="l", layers=1, hidden_size=64, ffn_size=128, heads=4, seq_len=64,
                     batch=1)
    assert saved_bytes(short, 1, 8, "none", torch.float32) \
        == saved_bytes(long, 1, 1, "none", torch.float32)


@pytest.mark.parametrize(("name", "published"), [("7b", 6.74e9), ("13b", 13.0e9),
                                                  ("70b", 69.0e9)])
def test_the_llama_2_presets_hold_the_published_parameter_counts(name, published):
    # Touvron et al. 2023, table 1 (the released checkpoints: 6,738,415,616; 13,015,864,320;
    # 68,976,648,192 with the norms, which the model leaves out)
    assert PRESETS[name].params == pytest.approx(published, rel=0.01)


def test_a_shape_takes_kv_heads_vocab_and_gated():
    m = parse_model("--model", "layers=2,hidden=64,ffn=128,heads=8,kv_heads=2,seq=8,batch=4,"
                    "vocab=1000,gated=1")
    assert (m.kv_heads, m.vocab, m.gated) == (2, 1000, True)
    # q and out 64 x 64; k and v 64 x 16; gate, up and down 64 x 128; embedding and head
    assert m.params == 2 * (2 * 64 * 64 + 2 * 64 * 16 + 3 * 64 * 128) + 2 * 1000 * 64
    old = parse_model("--model", "layers=2,hidden=64,ffn=128,heads=8,seq=8,batch=4")
    assert (old.kv_heads, old.vocab, old.gated) == (8, 0, False)


SMALL = ModelSpec(name="custom", layers=2, hidden_size=8, ffn_size=32, heads=2, seq_len=4,
                  batch=8)
# per token, float32: attention 4 (h + (3h + h)) + 2 heads' fp32 logsumexp = 168; MLP
# 4 (h + 2 ffn) = 288
PER_TOKEN = 168 + 288
OUTPUT = 8 * 4  # the stage's output, kept for backward, per token
AT_WORK = 32 * 4  # the op at work: one MLP-wide output, per token


def test_the_peak_on_hand_cases():
    assert SMALL.params == 2 * 768
    assert mem.layer_activation_bytes(SMALL, 1, 4) == PER_TOKEN
    assert mem.layer_activation_bytes(SMALL, 2, 4) == 4 * (8 + 16) + 4 + 4 * (8 + 32)
    tokens = 2 * 4  # 2 samples of 4 tokens per replica
    micro = tokens * (2 * PER_TOKEN + OUTPUT)
    # DDP: the gradients, views of its buckets, are held throughout
    ddp = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=0), 4)
    assert ddp.parts() == {"params": 1536 * 4, "grads": 1536 * 4, "optimizer": 1536 * 8,
                           "buffers": 0, "activations": micro + tokens * AT_WORK}
    # ... and with two micro-batches the first's accumulate outside them (no_sync): twice
    ddp2 = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=0, micro_batches=2), 4)
    assert ddp2.grads == 2 * 1536 * 4
    # ZeRO-3, one micro-batch: the gradients come as the activations go (more activations)
    z3 = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=3), 4)
    # two layers gathered (the one at work, the next fetched ahead) and one's whole gradients
    assert z3.parts() == {"params": 1536, "grads": 0.0, "optimizer": 1536 * 2,
                          "buffers": 3 * 768 * 4, "activations": micro + tokens * AT_WORK}
    # two micro-batches of one sample synced at the last only: the second's forward beside the
    # first's gradients, whole until the last micro-batch reduce-scatters them
    # (requires_gradient_sync false)
    z3m = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=3, micro_batches=2,
                                   grad_sync="last"), 4)
    assert (z3m.grads, z3m.activations) == (1536 * 4, (micro + tokens * AT_WORK) / 2)
    assert z3m.buffers == 2 * 768 * 4  # two layers gathered
    # FSDP2's default reduce-scatters every micro-batch: the shards accumulate (a quarter),
    # and one layer's whole gradients wait for their reduce-scatter, as with one micro-batch
    z3s = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=3, micro_batches=2), 4)
    assert (z3s.grads, z3s.activations) == (1536, (micro + tokens * AT_WORK) / 2)
    assert z3s.buffers == 3 * 768 * 4
    # ZeRO 2 keeps the stage gathered from forward to backward, and one layer's gradients
    z2 = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=2), 4)
    assert (z2.params, z2.buffers) == (1536, 1536 * 4 + 768 * 4)
    # ZeRO-1 divides only the optimizer
    z1 = mem.memory(SMALL, Layout(tp=1, pp=1, dp=4, zero=1), 4)
    assert (z1.params, z1.grads, z1.optimizer) == (ddp.params, ddp.grads, ddp.optimizer / 4)
    # mixed precision: 2-byte weights and gradients, fp32 master and moments
    bf16 = mem.memory(SMALL, Layout(tp=1, pp=1, dp=1), 2)
    assert (bf16.params, bf16.optimizer) == (1536 * 2, 1536 * 12)
    assert bf16.total == sum(bf16.parts().values())


def test_gradients_win_the_peak_when_they_outweigh_the_activations():
    wide = ModelSpec(name="w", layers=2, hidden_size=64, ffn_size=256, heads=2, seq_len=2,
                     batch=1)
    one = mem.memory(wide, Layout(tp=1, pp=1, dp=1), 4)
    # the backward's end: every gradient, no activation kept, the last op at work
    assert (one.grads, one.activations) == (wide.params * 4, 2 * 256 * 4)


def test_1f1b_stages_hold_pp_minus_their_index_micro_batches_and_buffers():
    lay = Layout(tp=1, pp=2, dp=1, micro_batches=4)
    tokens = 2 * 4  # 8 samples a replica in 4 micro-batches of 2, 4 tokens each
    micro = tokens * (PER_TOKEN + OUTPUT)  # one layer a stage
    first = mem.stage_memory(SMALL, lay, 4, stage=0)
    last = mem.stage_memory(SMALL, lay, 4, stage=1)
    # the first stage: 2 micro-batches in flight, then a third's forward beside the gradients
    assert (first.activations, first.grads) == (2 * micro + tokens * AT_WORK, 768 * 4)
    assert (last.activations, last.grads) == (micro + tokens * AT_WORK, 768 * 4)
    # one receive buffer per micro-batch: the first stage's for gradients, the last's inputs
    assert first.buffers == last.buffers == 4 * tokens * 8 * 4
    assert mem.memory(SMALL, lay, 4) == max(first, last, key=lambda m: m.total)
    assert mem.in_flight(Layout(tp=1, pp=4, dp=1, micro_batches=8)) == 4
    assert mem.in_flight(Layout(tp=1, pp=4, dp=1, micro_batches=8), stage=3) == 1
    assert mem.in_flight(Layout(tp=1, pp=1, dp=1, micro_batches=8)) == 1


def test_the_last_stage_holds_the_lm_heads_logits():
    model = ModelSpec(name="v", layers=2, hidden_size=8, ffn_size=32, heads=2, seq_len=4,
                      batch=8, vocab=1000)
    lay = Layout(tp=1, pp=2, dp=1, micro_batches=2)
    last = mem.stage_memory(model, lay, 4, stage=1)
    first = mem.stage_memory(model, lay, 4, stage=0)
    tokens = 4 * 4
    micro = tokens * (PER_TOKEN + OUTPUT)
    head = tokens * (8 * 4 + 1000 * (4 + 4))  # its input, the logits, the log-probabilities
    assert last.activations == micro + tokens * AT_WORK + head
    # the first stage's embedding makes its gradients outweigh a micro-batch: its peak is the
    # first backward's end, one micro-batch's activations beside the gradients
    assert (first.activations, first.grads) == (micro + tokens * AT_WORK, first.params)
    assert mem.memory(model, lay, 4) == max(first, last, key=lambda m: m.total)


def test_full_recomputation_keeps_layer_inputs_and_rebuilds_one_layer():
    long = replace(SMALL, seq_len=64)  # activations that outweigh the gradients
    tokens = 8 * 64
    lay = Layout(tp=1, pp=1, dp=1, recompute="full")
    assert mem.memory(long, lay, 4).activations \
        == tokens * (2 * 8 * 4 + OUTPUT + AT_WORK + PER_TOKEN)
    assert mem.memory(long, replace(lay, recompute="none"), 4).activations \
        == tokens * (2 * PER_TOKEN + OUTPUT + AT_WORK)


def test_7b_trains_without_a_pipeline_on_8_gpus_of_80_gb():
    """Issue 31: 0 of the pp 1 layouts of 7b fit on 8 x 80 GB, with m = 1 the only count and
    the attention scores counted; ZeRO-3 over 8, one sample per micro-batch, is how 7b is
    trained. Synced on the last micro-batch only (grad_sync last), the gradients are whole
    until then (12.6 GiB in bfloat16): 41.9 GiB a rank; FSDP2's default, a reduce-scatter every
    micro-batch, holds an eighth of them: 31.3 GiB."""
    model = PRESETS["7b"]
    assert micro_batch_counts(model, 1, 8) == [1, 2, 4, 8, 16, 32, 64, 128]
    flat = [lay for lay in enumerate_layouts(model, 8, 8) if lay.pp == 1]
    fitting = [lay for lay in flat if mem.fits(mem.memory(model, lay, 2).total, 80 * 2**30)]
    z3 = Layout(tp=1, pp=1, dp=8, zero=3, micro_batches=128)
    assert z3 in fitting
    assert 31 * 2**30 < mem.memory(model, z3, 2).total < 32 * 2**30
    assert mem.memory(model, z3, 2).grads == model.params * 2 / 8
    last = Layout(tp=1, pp=1, dp=8, zero=3, micro_batches=128, grad_sync="last")
    assert 40 * 2**30 < mem.memory(model, last, 2).total < 43 * 2**30
    assert mem.memory(model, last, 2).grads == model.params * 2


@pytest.mark.parametrize("pp, v, m", [(2, 2, 4), (2, 2, 8), (4, 2, 4), (4, 2, 16), (3, 3, 3)])
def test_interleaved_ranks_hold_the_chunk_forwards_torchs_schedule_warms_up(pp, v, m):
    """in_flight against torch's own count of ScheduleInterleaved1F1B's warmup forwards (each
    a chunk's), plus the first steady forward; rank 0 holds Narayanan et al.'s
    pp (1 + (pp - 1) / (pp v)) micro-batches' worth where rounds allow."""
    from torch.distributed.pipelining.schedules import _get_warmup_ops

    lay = Layout(tp=1, pp=pp, dp=1, micro_batches=m, virtual_stages=v)
    for rank in range(pp):
        warmup = _get_warmup_ops(rank, v, pp, pp, m)
        assert mem.in_flight(lay, rank) == min(warmup + 1, v * m), rank
    if m >= pp * v:
        assert mem.in_flight(lay) / v == pp * (1 + (pp - 1) / (pp * v))


def test_an_interleaved_rank_holds_chunk_sized_micro_batches_and_buffers_per_chunk():
    four = replace(SMALL, layers=4)
    tokens = 2 * 4  # 8 samples a replica in 4 micro-batches of 2, 4 tokens each
    chunk = tokens * (PER_TOKEN + OUTPUT)  # one layer a chunk: 4 layers over pp 2 x v 2
    lay = Layout(tp=1, pp=2, dp=1, micro_batches=4, virtual_stages=2)
    first = mem.stage_memory(four, lay, 4, stage=0)
    last = mem.stage_memory(four, lay, 4, stage=1)
    # rank 0: (2 - 1) x 2 + 2 warmup chunk forwards and the first steady one; rank 1: 2 + 1
    assert first.activations == 5 * chunk + tokens * AT_WORK
    assert last.activations == 3 * chunk + tokens * AT_WORK
    # receive buffers per chunk: rank 0 holds stages 0 and 2 (gradient; input and gradient),
    # rank 1 stages 1 and 3 (input and gradient; input): 3 per micro-batch each
    assert first.buffers == last.buffers == 3 * 4 * tokens * 8 * 4
    # plain 1F1B on the same model: 2 micro-batches of both layers in flight on rank 0
    plain = mem.stage_memory(four, replace(lay, virtual_stages=1), 4, stage=0)
    assert plain.activations == 2 * 2 * chunk - 2 * tokens * OUTPUT + tokens * AT_WORK
