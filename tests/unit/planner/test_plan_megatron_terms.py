"""The time model's terms a Megatron-LM run needs (issue 31): the interleaved schedule's
bubble and hops, full recomputation's TP all-reduces, and unfused attention's passes over its
scores at the memory's bandwidth (and the scores it keeps), each against a hand-computed case."""

from __future__ import annotations

from dataclasses import replace

import pytest

from distbench.core.transformer import unfused_score_bytes_kept, unfused_score_bytes_moved
from distbench.planner import gpus
from distbench.planner import memory as mem
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.layouts import Layout, problems
from distbench.planner.models import PRESETS, ModelSpec
from distbench.planner.predict import layer_us, predict

# 8 layers, so that pp 2 can hold 2 and 4 virtual stages; a batch of 48 splits into 6
MODEL = ModelSpec(name="custom", layers=8, hidden_size=64, ffn_size=256, heads=4, seq_len=16,
                  batch=48)
LAYER_US = 100.0
HOP = CommFit(op="sendrecv", ranks=2, span="node", alpha_us=5.0, beta_gbps=4.0)
ALL_REDUCE = CommFit(op="all_reduce", ranks=2, span="node", alpha_us=10.0, beta_gbps=1.0)


def inputs_at(tp: int, mbs: int) -> Inputs:
    tokens = mbs * MODEL.seq_len
    return Inputs(fits=[HOP, ALL_REDUCE], compute_model=MODEL.layer_shape(), compute=[
        ComputePoint(tp=tp, tokens=tokens, layer_us=LAYER_US,
                     flops=MODEL.flops_per_layer(tokens, tp))])


@pytest.mark.parametrize("v", [1, 2, 4])
def test_the_interleaved_bubble_is_p_minus_1_slots_over_v_and_the_hops_v_times(v):
    m, pp = 6, 2
    layout = Layout(tp=1, pp=pp, dp=1, micro_batches=m, virtual_stages=v)
    assert not problems(layout, MODEL)
    got = predict(MODEL, layout, inputs_at(1, MODEL.batch // m), 4, 8)
    slot = MODEL.layers // pp * LAYER_US  # a micro-batch through a rank's layers, all chunks
    assert got.compute_us == pytest.approx(m * slot)
    assert got.bubble_us == pytest.approx((pp - 1) * slot / v)
    activation = MODEL.batch // m * MODEL.seq_len * MODEL.hidden_size * 4
    hop = 5.0 + activation / 4e3
    assert got.pp_comm_us == pytest.approx(2 * v * (pp - 1) * hop)
    assert got.step_us == pytest.approx(got.compute_us + got.bubble_us + got.pp_comm_us)


def test_interleaving_needs_a_pipeline_layers_for_every_chunk_and_micro_batches_by_pp():
    def why(**kw) -> list[str]:
        return problems(Layout(**{"tp": 1, "dp": 1, **kw}), MODEL)

    assert any("pp is 1" in r for r in why(pp=1, micro_batches=6, virtual_stages=2))
    # 2 stages x 8 chunks is 16 chunks of 8 layers
    assert any("must divide the layers" in r for r in why(pp=2, micro_batches=6,
                                                          virtual_stages=8))
    # Megatron runs micro-batches in groups of pp: 6 micro-batches over 4 stages is refused
    assert any("a multiple of pp" in r for r in why(pp=4, micro_batches=6, virtual_stages=2))
    assert not why(pp=4, micro_batches=8, virtual_stages=2)
    assert any("at least 1" in r for r in why(pp=2, micro_batches=6, virtual_stages=0))
    assert Layout(tp=1, pp=2, dp=1, micro_batches=6, virtual_stages=2).label().endswith(" v2")


@pytest.mark.parametrize("recompute,count", [("none", 4), ("selective", 4), ("full", 6)])
def test_full_recomputation_runs_the_forwards_two_tp_all_reduces_again(recompute, count):
    layout = Layout(tp=2, pp=1, dp=1, micro_batches=1, recompute=recompute)
    got = predict(MODEL, layout, inputs_at(2, MODEL.batch), 4, 8)
    activation = MODEL.batch * MODEL.seq_len * MODEL.hidden_size * 4
    assert got.tp_comm_us == pytest.approx(MODEL.layers * count * (10.0 + activation / 1e3))


def test_unfused_attention_moves_its_scores_15_times_and_its_mask_twice():
    assert unfused_score_bytes_moved(2) == 15 * 2 + 2
    assert unfused_score_bytes_kept(2) == 5  # Korthikanti et al.'s 5as bytes in 16 bits
    unfused = replace(MODEL, fused_attention=False)
    # 128 tokens, 4 heads over tp 2, 16 scores a head and token, 32 bytes each
    assert unfused.score_bytes(128, 2, 2) == 128 * 2 * 16 * 32
    assert MODEL.score_bytes(128, 2, 2) == 0


def test_a_datasheet_layer_of_unfused_attention_adds_its_scores_at_the_memorys_bandwidth():
    unfused = replace(MODEL, fused_attention=False)
    a100 = gpus.GPUS["a100"]
    shapes = {(2, 128)}
    fused_in, unfused_in = Inputs(), Inputs()
    gpus.synthesize(fused_in, MODEL, a100, 0.5, "bfloat16", shapes)
    gpus.synthesize(unfused_in, unfused, a100, 0.5, "bfloat16", shapes)
    flops_us = MODEL.flops_per_layer(128, 2) / (312e12 * 0.5 / 1e6)
    assert fused_in.compute[0].layer_us == pytest.approx(flops_us)
    moved_us = 128 * 2 * 16 * 32 / (2039.0 * 1e3)  # bytes over GB/s in bytes per us
    assert unfused_in.compute[0].layer_us == pytest.approx(flops_us + moved_us)
    assert any("2039 GB/s" in n for n in unfused_in.notes)
    # the point is this model's layer: used as is, not scaled from another shape
    assert layer_us(unfused_in, unfused, 2, 128) == (unfused_in.compute[0].layer_us, False)


def test_unfused_attention_keeps_its_scores_unless_recomputed():
    unfused = replace(MODEL, fused_attention=False)
    kept = MODEL.heads / 2 * MODEL.seq_len * 5
    for recompute, extra in (("none", kept), ("selective", 0), ("full", 0)):
        assert mem.layer_activation_bytes(unfused, 2, 2, recompute) == pytest.approx(
            mem.layer_activation_bytes(MODEL, 2, 2, recompute) + extra)


def test_a_datasheet_plan_of_a_gated_model_uses_its_own_layer_not_a_scaled_one():
    model = PRESETS["7b"]
    inputs = Inputs()
    tokens = 2 * model.seq_len
    gpus.synthesize(inputs, model, gpus.GPUS["h100"], None, "bfloat16", {(1, tokens)})
    assert layer_us(inputs, model, 1, tokens) == (inputs.compute[0].layer_us, False)
    assert not any("scaled by FLOPs" in n for n in inputs.notes)
