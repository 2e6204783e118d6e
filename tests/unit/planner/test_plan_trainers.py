"""The planner for the trainers people run (issue 46): sequence parallelism, what the schedule
hides of TP's and DP's collectives where nothing was measured, FSDP2's gradient sync every
micro-batch, full recomputation of k layers, uneven pipeline stages and `--trainer`. Expected
figures are worked by hand from the fits below, not read from the code."""

from __future__ import annotations

from dataclasses import replace

import helpers
import pytest

from distbench.planner import memory as mem
from distbench.planner.inputs import CommFit, ComputePoint, Inputs, Span
from distbench.planner.layouts import (
    Layout,
    enumerate_layouts,
    pipeline_depths,
    problems,
    rank_chunks,
    stage_layers,
)
from distbench.planner.models import PRESETS, ModelSpec
from distbench.planner.predict import dp_step_us, exposed_of, predict
from distbench.planner.ranking import layout_of, make_plan

MODEL = ModelSpec(name="custom", layers=4, hidden_size=64, ffn_size=256, heads=8, seq_len=16,
                  batch=32)
FP32 = 4


def _inputs(tokens: int, tp: int = 1, layer_us: float = 100.0, **extra) -> Inputs:
    """A layer of 100 us at `tokens`; collectives whose bandwidth is so high that each costs
    its latency: an all-reduce 10 us, an all-gather 4, a reduce-scatter 3, a hop 5."""
    lat = {"all_reduce": 10.0, "all_gather": 4.0, "reduce_scatter": 3.0, "sendrecv": 5.0}
    fits = [CommFit(op=op, ranks=n, span="node", alpha_us=a, beta_gbps=1e12)
            for op, a in lat.items() for n in ((2,) if op == "sendrecv" else (2, 4, 8))]
    compute = [ComputePoint(tp=tp, tokens=tokens, layer_us=layer_us,
                            flops=MODEL.flops_per_layer(tokens, tp))]
    return Inputs(fits=fits, compute=compute, compute_model=MODEL.layer_shape(), **extra)


def _predict(layout: Layout, inputs: Inputs, trainer: str = "torch"):
    return predict(MODEL, layout, inputs, FP32, 8, trainer)


# ---------------------------------------------------------------------------------------------
# What hides behind compute

@pytest.mark.parametrize("comm,compute,pieces,expected", [
    (40.0, 400.0, 4, 10.0),  # each piece hides behind its layer: the last one waits
    (400.0, 40.0, 4, 100.0 + 3 * 90.0),  # the stream is the bottleneck
    (40.0, 400.0, 1, 40.0),  # one piece, nothing beside it
    (0.0, 400.0, 4, 0.0),
])
def test_exposed_of_a_collective_cut_per_layer(comm, compute, pieces, expected):
    assert exposed_of(comm, compute, pieces) == pytest.approx(expected)


def test_ddp_hides_its_all_reduce_behind_backward_where_nothing_was_measured():
    """dp 8 at tp 1, one micro-batch of 4 samples: 4 layers of 100 us (a third forward), the
    all-reduce 10 us, cut in 4 of 2.5 us, each behind 50 us of backward: 2.5 us exposed."""
    layout = Layout(tp=1, pp=1, dp=8, zero=0, micro_batches=1)
    p = _predict(layout, _inputs(tokens=4 * 16))
    assert (p.dp_comm_us, p.dp_exposed_us) == (pytest.approx(10.0), pytest.approx(2.5))
    # a trainer that does not overlap (Megatron without --overlap-grad-reduce): all of it
    off = _predict(replace(layout, dp_overlap=False), _inputs(tokens=4 * 16))
    assert off.dp_exposed_us == pytest.approx(10.0)
    # a measured overlap wins over the model: half of 10 us
    measured = _predict(layout, _inputs(tokens=4 * 16, overlap={"ddp": 0.5}))
    assert measured.dp_exposed_us == pytest.approx(5.0)


def test_zero3_gathers_ahead_of_each_layer_and_reduce_scatters_every_micro_batch():
    """FSDP2 at ZeRO 3, dp 4, 2 micro-batches of 4 samples, synced every micro-batch: each
    micro-batch gathers in forward and in backward (4 passes of 4 us) and reduce-scatters
    (2 of 3 us). Per layer the pieces (1 and 0.75 us) are far under the layer's 33 or 67 us:
    each pass exposes its first gather's piece, 1 us; the reduce-scatters the last piece once,
    0.75 us."""
    layout = Layout(tp=1, pp=1, dp=4, zero=3, micro_batches=2)
    p = _predict(layout, _inputs(tokens=4 * 16))
    assert p.dp_comm_us == pytest.approx(4 * 4.0 + 2 * 3.0)
    assert p.dp_exposed_us == pytest.approx(4 * 1.0 + 0.75)
    # synced at the last micro-batch only: one reduce-scatter
    last = _predict(replace(layout, grad_sync="last"), _inputs(tokens=4 * 16))
    assert last.dp_comm_us == pytest.approx(4 * 4.0 + 3.0)


def test_megatrons_distributed_optimizer_reduce_scatters_where_torchs_zero1_all_reduces():
    """ZeRO 1: torch's ZeroRedundancyOptimizer all-reduces (10 us), then gathers after its step
    (4 us, exposed whole); Megatron's distributed optimizer reduce-scatters (3 us) and gathers
    ahead of the next forward (4 us, hidden but for the first layer's piece)."""
    layout = Layout(tp=1, pp=1, dp=4, zero=1, micro_batches=1)
    torch_p = _predict(layout, _inputs(tokens=8 * 16))
    megatron = _predict(layout, _inputs(tokens=8 * 16), trainer="megatron")
    assert torch_p.dp_comm_us == pytest.approx(10.0 + 4.0)
    assert torch_p.dp_exposed_us == pytest.approx(10.0 / 4 + 4.0)
    assert megatron.dp_comm_us == pytest.approx(3.0 + 4.0)
    assert megatron.dp_exposed_us == pytest.approx(3.0 / 4 + 4.0 / 4)


def test_dp_step_with_one_replica_is_nothing():
    inputs = _inputs(tokens=64)
    assert dp_step_us(inputs, Layout(tp=2, pp=2, dp=1, micro_batches=4), Span(), 1e6,
                      "torch", 100.0, 2) == (0.0, 0.0)


# ---------------------------------------------------------------------------------------------
# TP: sequence parallelism and overlap

def test_sequence_parallel_tp_is_an_all_gather_and_a_reduce_scatter_per_all_reduce():
    """tp 2, 4 layers, 4 collectives a layer each micro-batch: 16 all-reduces of 10 us
    without sequence parallelism, 16 all-gathers (4 us) and reduce-scatters (3 us) with it."""
    layout = Layout(tp=2, pp=1, dp=1, micro_batches=1)
    inputs = _inputs(tokens=32 * 16, tp=2)
    assert _predict(replace(layout, sp=False), inputs).tp_comm_us == pytest.approx(16 * 10.0)
    assert _predict(layout, inputs).tp_comm_us == pytest.approx(16 * (4.0 + 3.0))


def test_tp_overlap_hides_the_collectives_behind_their_matmuls_but_the_first_chunk():
    """16 collectives of 7 us beside 4 layers of 100 us: each matmul (25 us) outlasts its
    collective, so each exposes its first of tp 2 chunks, 3.5 us."""
    layout = Layout(tp=2, pp=1, dp=1, micro_batches=1, tp_overlap=True)
    p = _predict(layout, _inputs(tokens=32 * 16, tp=2))
    assert p.tp_comm_us == pytest.approx(16 * 7.0)
    assert p.tp_exposed_us == pytest.approx(16 * 3.5)
    plain = _predict(replace(layout, tp_overlap=False), _inputs(tokens=32 * 16, tp=2))
    assert p.step_us == pytest.approx(plain.step_us - 16 * 3.5)


def test_full_recomputation_of_k_layers_reruns_only_those():
    """Full recomputation reruns a layer's forward (a third more compute) and its 2 forward
    collectives: of 4 layers, k = 1 reruns one."""
    inputs = _inputs(tokens=32 * 16, tp=2)
    base = Layout(tp=2, pp=1, dp=1, micro_batches=1, sp=False)
    none = _predict(base, inputs)
    full = _predict(replace(base, recompute="full"), inputs)
    one = _predict(replace(base, recompute="full", recompute_layers=1), inputs)
    assert full.tp_comm_us == pytest.approx(4 * 6 * 10.0)
    assert one.tp_comm_us == pytest.approx(3 * 4 * 10.0 + 6 * 10.0)
    extra = (full.compute_us - none.compute_us) / 4
    assert one.compute_us == pytest.approx(none.compute_us + extra)
    # memory: one layer keeps only its input, the other three everything; the recomputed
    # layer is the stage's first, rebuilt last in backward, once the others' are gone, so no
    # layer is rebuilt beside them (all four recomputed: one is, beside the inputs kept)
    elt, tokens = FP32, 32 * 16
    kept = mem.layer_activation_bytes(MODEL, 2, elt)
    m1 = mem.stage_memory(MODEL, replace(base, recompute="full", recompute_layers=1), elt, 0)
    m0 = mem.stage_memory(MODEL, base, elt, 0)
    m4 = mem.stage_memory(MODEL, replace(base, recompute="full"), elt, 0)
    assert m0.activations - m1.activations == tokens * (kept - MODEL.hidden_size * elt)
    assert m0.activations - m4.activations == 4 * tokens * (kept - MODEL.hidden_size * elt) \
        - tokens * kept


def test_sequence_parallelism_shards_what_full_recomputation_keeps_and_the_hops():
    layout = Layout(tp=2, pp=2, dp=1, micro_batches=4, recompute="full")
    assert mem.layer_activation_bytes(MODEL, 2, FP32, "full", sp=True) == 64 * FP32 / 2
    on, off = (mem.stage_memory(MODEL, replace(layout, sp=s), FP32, 1) for s in (True, False))
    # the receive buffers (4 micro-batches, one way on the last stage) and what is kept: half
    assert on.buffers == off.buffers / 2 and on.activations < off.activations


# ---------------------------------------------------------------------------------------------
# Uneven stages

def test_uneven_stages_give_the_ends_one_layer_fewer():
    assert [stage_layers(126, 16, s) for s in range(16)] == [7] + [8] * 14 + [7]
    assert [stage_layers(9, 4, s) for s in range(4)] == [2, 2, 3, 2]
    assert [len(r) for _, r in (rank_chunks(10, s, 4)[0] for s in range(4))] == [2, 3, 3, 2]
    assert 16 in pipeline_depths(126) and 16 not in pipeline_depths(127)
    model = replace(PRESETS["70b"], layers=126)
    assert not problems(Layout(tp=8, pp=16, dp=1, micro_batches=16), model)
    assert problems(Layout(tp=1, pp=5, dp=1, micro_batches=8), MODEL) == [
        "pp 5 is more stages than the layers (4)"]


def test_an_uneven_pipeline_runs_at_its_fullest_stages_pace():
    """3 layers on 2 stages: the first gives up a layer, 1 and 2; a slot is the 2-layer
    stage's 200 us."""
    model = replace(MODEL, layers=3)
    layout = Layout(tp=1, pp=2, dp=1, micro_batches=4)
    inputs = _inputs(tokens=8 * 16)
    p = predict(model, layout, inputs, FP32, 8)
    assert p.compute_us == pytest.approx(4 * 2 * 100.0)
    first, last = (mem.stage_memory(model, layout, FP32, s) for s in (0, 1))
    assert first.params == model.params_per_layer * FP32
    assert last.params == 2 * model.params_per_layer * FP32
    # the plan weighs the depths whose ends hold one layer fewer: 14 layers on 4 stages
    fourteen = replace(MODEL, layers=14)
    assert {lay.pp for lay in enumerate_layouts(fourteen, 4, 4)} == {1, 2, 4}


# ---------------------------------------------------------------------------------------------
# The layout's keys through plan.csv and --layout

def test_every_key_survives_a_plan_csv_row():
    layout = Layout(tp=2, pp=2, dp=2, zero=3, micro_batches=4, recompute="full",
                    recompute_layers=1, grad_sync="last", tp_overlap=True, dp_overlap=False,
                    sp=False)
    (row,) = make_plan(MODEL, _inputs(tokens=4 * 16, tp=2), 8, 8, 80 * 2**30, "float32",
                       layouts=[layout])
    csv_row = {k: str(v) for k, v in row.items()}  # as a CSV reader hands it back
    assert layout_of(csv_row) == layout
    assert layout.label() == "tp2 pp2 dp2 zero3 m4 rc-full:1 sp0 sync-last tpo dpo0"
    assert Layout(tp=2, pp=2, dp=2, zero=3, micro_batches=4).label() == "tp2 pp2 dp2 zero3 m4"


@pytest.mark.parametrize("layout,needle", [
    ("tp=2,sp=2", "sp=2 in 'tp=2,sp=2' must be 1 (on) or 0 (off)"),
    ("zero=3,grad_sync=often", "grad_sync=often in 'zero=3,grad_sync=often' is not one of"),
    ("recompute=op,recompute_layers=2", "recompute_layers 2 counts the layers full"),
    ("pp=2,m=4,recompute=full,recompute_layers=3", "recompute_layers 3 is more than a stage's"),
    ("tp=3", "tp=3 in 'tp=3' must divide the 4 GPUs per node"),
])
def test_a_layout_key_out_of_range_is_one_line(tmp_path, layout, needle):
    line = helpers.refused(tmp_path, "plan", "--fabric", "dgx-h100", "--gpus", "4",
                           "--gpus-per-node", "4", "--model",
                           "layers=4,hidden=64,ffn=256,heads=8,seq=16,batch=32",
                           "--layout", layout, "--out", str(tmp_path / "r"))
    assert needle in line
    assert not (tmp_path / "r").exists()


def test_megatron_runs_no_zero_2_or_3_and_plans_without_workers(tmp_path):
    base = ("plan", "--fabric", "dgx-h100", "--gpus", "8", "--gpus-per-node", "8", "--model",
            "layers=4,hidden=64,ffn=256,heads=8,seq=16,batch=32", "--trainer", "megatron",
            "--out", str(tmp_path / "r"))
    assert "ZeRO 3 is not megatron's" in helpers.refused(tmp_path, *base, "--layout", "zero=3")
    assert "the workers run torch's" in helpers.refused(
        tmp_path, "plan", "--workers", "2", "--model", "toy", "--trainer", "megatron")
    assert "--trainer" in helpers.refused(tmp_path, *base[:-2], "--trainer", "deepspeed")
    assert not (tmp_path / "r").exists()


def test_unfused_attention_is_planned_but_never_stepped(tmp_path):
    """step and plan's workers run scaled_dot_product_attention: a shape that says unfused
    (Megatron before FlashAttention) would be timed and trained otherwise than it says."""
    unfused = "layers=2,hidden=64,ffn=128,heads=4,seq=8,batch=4,attention=unfused"
    assert "the step runs fused attention" in helpers.refused(
        tmp_path, "step", "--workers", "2", "--model", unfused)
    assert "the workers time and step fused attention" in helpers.refused(
        tmp_path, "plan", "--workers", "2", "--model", unfused)
