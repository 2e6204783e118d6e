"""Every group priced by what it crosses (issue 31): a group across nodes gets the NICs of the
ranks it has on each node, so a tp 8 layout's DP group (one GPU per node) runs at one NIC's
bandwidth and a pure DP group (8 per node) at eight. The figures below are computed by hand
from the fits, not read from the code."""

from __future__ import annotations

import pytest

from distbench.planner.inputs import CommFit, ComputePoint, Inputs, Span
from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec
from distbench.planner.predict import spans
from distbench.planner.ranking import make_plan

MODEL = ModelSpec(name="custom", layers=8, hidden_size=256, ffn_size=1024, heads=8,
                  seq_len=16, batch=32)
PER_NODE = 8


def inputs(**extra) -> Inputs:
    """All-reduce measured on 2 whole nodes of 8 (16 ranks, 8 per node): 50 us + S at 20 GB/s
    algbw; inside a node on 8 ranks: 10 us + S at 100 GB/s. Compute at every tp the tests use."""
    fits = [CommFit(op="all_reduce", ranks=16, span="nodes", per_node=8, alpha_us=50.0,
                    beta_gbps=20.0),
            CommFit(op="all_reduce", ranks=8, span="node", alpha_us=10.0, beta_gbps=100.0)]
    compute = [ComputePoint(tp=tp, tokens=tokens, layer_us=100.0,
                            flops=MODEL.flops_per_layer(tokens, tp))
               for tp in (1, 2, 4, 8) for tokens in (16, 32, 64, 128, 256, 512)]
    shape = {k: getattr(MODEL, k) for k in ("hidden_size", "ffn_size", "heads", "seq_len")}
    return Inputs(fits=fits, compute=compute, compute_model=shape, **extra)


def dp_comm_us(layout: Layout, given: Inputs) -> float:
    (row,) = make_plan(MODEL, given, layout.world, PER_NODE, 80 * 2**30, "float32",
                       layouts=[layout])
    return row["dp_comm_ms"] * 1e3


def grads(tp: int) -> float:
    return MODEL.layers * MODEL.params_per_layer / tp * 4  # float32, one stage


# the fit's bus bandwidth on 16 ranks: algbw x 2 (n - 1) / n, the all-reduce's bus factor
BUSBW_16 = 20.0 * 2 * 15 / 16  # 37.5 GB/s, 8 NICs' worth


def test_a_pure_dp_group_of_whole_nodes_is_priced_by_the_fit_of_whole_nodes():
    got = dp_comm_us(Layout(tp=1, pp=1, dp=16, zero=0, micro_batches=1), inputs())
    assert got == pytest.approx(50.0 + grads(1) / (20.0 * 1e3))


def test_a_tp_8_layouts_dp_group_of_one_gpu_per_node_gets_one_nic():
    given = inputs()
    got = dp_comm_us(Layout(tp=8, pp=1, dp=2, zero=0, micro_batches=1), given)
    busbw = BUSBW_16 / 8  # one rank per node: one NIC of the eight the fit used
    algbw = busbw / (2 * 1 / 2)  # the all-reduce's bus factor on 2 ranks
    alpha = 50.0 * 1 / 15  # the ring's steps: 1 on 2 ranks, 15 on 16
    assert got == pytest.approx(alpha + grads(8) / (algbw * 1e3))
    # priced as a group of whole nodes, as before, it came out 8 times too fast in bandwidth
    whole = alpha + grads(8) / (BUSBW_16 / 1.0 * 1e3)
    assert got > 7 * whole
    assert any("1 ranks per node" in n and "x 0.125" in n for n in given.notes)


def test_a_dp_group_of_two_gpus_per_node_gets_two_nics():
    got = dp_comm_us(Layout(tp=4, pp=1, dp=4, zero=0, micro_batches=1), inputs())
    busbw = BUSBW_16 * 2 / 8
    algbw = busbw / (2 * 3 / 4)
    alpha = 50.0 * 3 / 15
    assert got == pytest.approx(alpha + grads(4) / (algbw * 1e3))  # 10 us + S at 6.25 GB/s


def test_a_dp_group_inside_a_node_is_priced_by_the_node_fit():
    got = dp_comm_us(Layout(tp=1, pp=1, dp=8, zero=0, micro_batches=1), inputs())
    assert got == pytest.approx(10.0 + grads(1) / (100.0 * 1e3))


def test_more_ranks_per_node_than_the_fit_had_never_gains_nics_not_declared():
    fit = CommFit(op="all_reduce", ranks=4, span="nodes", per_node=2, alpha_us=5.0,
                  beta_gbps=10.0)
    given = Inputs(fits=[fit])
    assert given.comm_us("all_reduce", 4, Span(crosses=True, per_node=4), 1e6) == \
        pytest.approx(5.0 + 1e6 / 10e3)


@pytest.mark.parametrize("tp,pp,dp,expect", [
    # tp equal to the GPUs per node stays inside a node (`<=`, not `<`)
    (8, 2, 1, {"tp": Span(), "dp": Span(), "pp": Span(True, 1)}),
    # dp at stride tp: 16 x 1 crosses, 8 of it per node
    (1, 1, 16, {"tp": Span(), "dp": Span(True, 8), "pp": Span()}),
    # dp at stride 2: 4 per node; pp at stride tp x dp = 16 crosses though tp x pp = 4 would not
    (2, 2, 8, {"tp": Span(), "dp": Span(True, 4), "pp": Span(True, 1)}),
    (8, 1, 4, {"tp": Span(), "dp": Span(True, 1), "pp": Span()}),
    # a pipeline of 2 stages of 4 ranks fills one node
    (2, 2, 2, {"tp": Span(), "dp": Span(), "pp": Span()}),
])
def test_spans_place_each_group_by_its_stride(tp, pp, dp, expect):
    assert spans(Layout(tp=tp, pp=pp, dp=dp, zero=0, micro_batches=max(pp, 1)), 8) == expect


def test_a_group_that_does_not_tile_its_node_crosses():
    # ranks (pp, dp, tp) with dp 3 at stride 2 on nodes of 8: the second stage's group is
    # ranks 6, 8 and 10, across two nodes
    got = spans(Layout(tp=2, pp=4, dp=3, zero=0, micro_batches=4), 8)
    assert got["dp"] == Span(True, 3) and got["pp"] == Span(True, 1)


@pytest.mark.parametrize("zero,expect", [
    (0, lambda ar, ag, rs: ar),
    (1, lambda ar, ag, rs: ar + ag),  # the parameters gathered after the optimizer
    # FSDP2's default: a reduce-scatter after each of the 4 micro-batches
    (2, lambda ar, ag, rs: ag + 4 * rs),
    (3, lambda ar, ag, rs: 2 * 4 * ag + 4 * rs),  # gathered in each micro-batch, both ways
])
def test_each_zero_stage_issues_its_collectives_on_the_dp_group(zero, expect):
    from distbench.planner.predict import dp_collectives_us

    fits = [CommFit(op="all_reduce", ranks=4, span="node", alpha_us=10.0, beta_gbps=1.0),
            CommFit(op="all_gather", ranks=4, span="node", alpha_us=20.0, beta_gbps=2.0),
            CommFit(op="reduce_scatter", ranks=4, span="node", alpha_us=30.0, beta_gbps=4.0)]
    given = Inputs(fits=fits, overlap={"ddp": 0.5, "zero1": 0.5, "zero2": 0.5, "zero3": 0.5})
    size = 1e6
    ar, ag, rs = 10.0 + size / 1e3, 20.0 + size / 2e3, 30.0 + size / 4e3
    total, overlap = dp_collectives_us(
        given, Layout(tp=1, pp=2, dp=4, zero=zero, micro_batches=4), Span(), size)
    assert total == pytest.approx(expect(ar, ag, rs))
    # ZeRO-1's all-gather follows the optimizer: only the all-reduce's share hides
    assert overlap == pytest.approx(0.5 * ar / (ar + ag) if zero == 1 else 0.5)
