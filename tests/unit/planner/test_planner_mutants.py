"""Tests that kill the mutants issue 31's hand mutation pass left alive in the planner: each
would change a ranking, and each was planted by hand and seen to fail its test here. Expected
values are worked by hand from the fits below, not read from the code; where a model detail
may change (what a layer holds), a test compares layouts the detail affects alike.

- predict.spans with `<` for `<=`: tp equal to the GPUs per node priced as inter-node;
- the pipeline's stride t*d as t: pipelines that cross nodes priced as hops inside one;
- ZeRO-3's 2m all-gathers as m;
- ZeRO-2's gradients divided by dp only from stage 3 (memory);
- the micro-batch counts' `k >= pp` as `k > pp` (layouts): every layout with m = pp gone;

and those issue 46 named, of a declared fabric and a named layout:

- a pipeline hop across nodes priced at every NIC of a node instead of one (fabrics.Fabric.
  busbw_gbps's `1 if op == "sendrecv"`; a plan's hop is handed one rank per node by
  predict.spans, so only the fabric's own figures show it);
- bandwidth across nodes not capped at the in-node figure (busbw_gbps's `min(node_gbps, ...)`):
  `--fabric dgx-h100,nic_gbps=100` priced 8 NICs at 800 GB/s where NVLink's ring reaches 370;
- `--layout tp=2,pp=2,dp=2` taken for `--gpus 16` (given.resolve's tp x pp x dp != gpus as
  `>`: too few GPUs named accepted)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import helpers
import pytest
from plan_helpers import plan

from distbench.planner import fabrics
from distbench.planner.inputs import CommFit, ComputePoint, Inputs, Span
from distbench.planner.layouts import Layout, enumerate_layouts
from distbench.planner.models import ModelSpec
from distbench.planner.ranking import make_plan

# 8 heads, so that tp 8 splits them
MODEL = ModelSpec(name="custom", layers=4, hidden_size=64, ffn_size=256, heads=8, seq_len=16,
                  batch=32)
FP32 = 4
# inside a node: fast; across nodes: slow, so a span mispriced shows
NODE = {"all_reduce": (10.0, 100.0), "sendrecv": (5.0, 40.0)}
NODES = {"all_reduce": (50.0, 10.0), "sendrecv": (30.0, 5.0)}


def _inputs(tokens: int, tp: int = 1, **extra) -> Inputs:
    fits = [CommFit(op=op, ranks=n, span=span, alpha_us=a, beta_gbps=b)
            for span, table in (("node", NODE), ("nodes", NODES))
            for op, (a, b) in table.items() for n in ((2,) if op == "sendrecv" else (2, 4, 8))]
    compute = [ComputePoint(tp=tp, tokens=tokens, layer_us=100.0,
                            flops=MODEL.flops_per_layer(tokens, tp))]
    return Inputs(fits=fits, compute=compute, compute_model={
        "hidden_size": 64, "ffn_size": 256, "heads": 8, "seq_len": 16}, **extra)


def _row(layout: Layout, inputs: Inputs, gpus_per_node: int, model: ModelSpec = MODEL) -> dict:
    (row,) = make_plan(model, inputs, layout.world, gpus_per_node, 80 * 2**30, "float32",
                       layouts=[layout])
    return row


def _time_us(table: dict, op: str, size_bytes: float) -> float:
    alpha, beta = table[op]
    return alpha + size_bytes / (beta * 1e3)  # 1 GB/s is 1e3 bytes a microsecond


def test_tp_as_wide_as_a_node_is_priced_inside_the_node():
    """spans: k x s <= g stays in a node; with `<` tp 8 on 8 GPUs a node went "nodes"."""
    layout = Layout(tp=8, pp=1, dp=1, micro_batches=1)
    row = _row(layout, _inputs(tokens=32 * 16, tp=8), gpus_per_node=8)
    activation = 32 * 16 * 64 * FP32  # the micro-batch's 512 tokens x hidden 64, fp32
    # 4 layers x 4 all-reduces of the activation on 8 ranks in one node: 10 us + 131,072 B at
    # 100 GB/s = 11.31072 us each
    assert activation == 131_072
    assert row["tp_comm_ms"] == pytest.approx(4 * 4 * 11.31072 / 1e3)
    assert row["tp_comm_ms"] == pytest.approx(4 * 4 * _time_us(NODE, "all_reduce", activation)
                                              / 1e3)
    # dp as wide as a node, tp 1: its all-reduce inside the node too (stride 1, 8 x 1 <= 8);
    # bandwidths so high that the all-reduce is its latency, 10 us in a node, 50 across
    inputs = _inputs(tokens=4 * 16, overlap={"ddp": 0.0})
    inputs.fits = [CommFit(op="all_reduce", ranks=8, span=span, alpha_us=alpha, beta_gbps=1e12)
                   for span, alpha in (("node", 10.0), ("nodes", 50.0))]
    row = _row(Layout(tp=1, pp=1, dp=8, micro_batches=1), inputs, gpus_per_node=8)
    assert row["dp_comm_ms"] == pytest.approx(10.0 / 1e3, rel=1e-6)


def test_a_pipeline_whose_stages_are_nodes_apart_is_priced_across_nodes():
    """Ranks as the mesh (pp, dp, tp): tp 2 x dp 2 fill a node of 4, so stage 2 is the next
    node and each hop crosses; with the stride t for t x d, the pair looked like one node's."""
    layout = Layout(tp=2, pp=2, dp=2, zero=0, micro_batches=4, sp=False)
    row = _row(layout, _inputs(tokens=4 * 16, tp=2), gpus_per_node=4)
    # 32 samples / (dp 2 x 4 micro-batches) = 4 samples of 16 tokens, x hidden 64, fp32
    activation = 4 * 16 * 64 * FP32
    assert activation == 16_384
    # 2 (pp - 1) one-way hops across nodes: 30 us + 16,384 B at 5 GB/s = 33.2768 us each
    assert row["pp_comm_ms"] == pytest.approx(2 * 33.2768 / 1e3)
    # with sequence parallelism (the default at tp 2) a hop carries a sequence shard, half
    sp = _row(replace(layout, sp=True), _inputs(tokens=4 * 16, tp=2), gpus_per_node=4)
    assert sp["pp_comm_ms"] == pytest.approx(2 * (30 + 8_192 / 5e3) / 1e3)
    # the same pipeline on nodes of 8 stays in one node: 5 us + 16,384 B at 40 GB/s
    inside = _row(layout, _inputs(tokens=4 * 16, tp=2), gpus_per_node=8)
    assert inside["pp_comm_ms"] == pytest.approx(2 * (5.0 + 16_384 / 40e3) / 1e3)


def test_zero3_gathers_the_parameters_twice_per_micro_batch():
    """ZeRO-3 reshards after forward: every micro-batch gathers in forward and again in
    backward (2m all-gathers), then one reduce-scatter. Bandwidths so high that each collective
    is its latency: 7 us an all-gather, 3 us a reduce-scatter; synced every micro-batch (FSDP2's
    default), a reduce-scatter each."""
    inputs = _inputs(tokens=2 * 16, overlap={"zero3": 0.0})
    inputs.fits += [CommFit(op="all_gather", ranks=4, span="node", alpha_us=7.0,
                            beta_gbps=1e12),
                    CommFit(op="reduce_scatter", ranks=4, span="node", alpha_us=3.0,
                            beta_gbps=1e12)]
    for m, sync, expected in ((1, "", 2 * 7.0 + 3.0), (4, "last", 8 * 7.0 + 3.0),
                              (4, "micro", 8 * 7.0 + 4 * 3.0)):
        layout = Layout(tp=1, pp=1, dp=4, zero=3, micro_batches=m, grad_sync=sync)
        row = _row(layout, inputs, gpus_per_node=4)
        assert row["dp_comm_ms"] == pytest.approx(expected / 1e3, rel=1e-6), m


def test_zero2_shards_the_gradients_over_dp_and_not_the_parameters():
    """ZeRO-1 shards the optimizer states, ZeRO-2 the gradients too, ZeRO-3 the parameters too
    (Rajbhandari et al. 2020): whatever a rank's share of a layer holds, stage 2's gradients
    are stage 1's over dp."""
    dp = 4
    # one token a replica: the gradients, not the activations, make the peak (the memory model
    # reports what is held at the peak, after the backward here)
    heavy = ModelSpec(name="custom", layers=4, hidden_size=64, ffn_size=256, heads=8,
                      seq_len=1, batch=dp)
    inputs = _inputs(tokens=1, overlap=dict.fromkeys(("ddp", "zero1", "zero2", "zero3"), 0.0))
    inputs.fits += [CommFit(op=op, ranks=dp, span="node", alpha_us=1.0, beta_gbps=1.0)
                    for op in ("all_gather", "reduce_scatter")]
    rows = {z: _row(Layout(tp=1, pp=1, dp=dp, zero=z, micro_batches=1), inputs, 8, heavy)
            for z in range(4)}
    assert rows[0]["grads_bytes"] == heavy.params * FP32
    whole = rows[0]["grads_bytes"]
    assert whole > 0
    assert rows[1]["grads_bytes"] == pytest.approx(whole)
    assert rows[2]["grads_bytes"] == pytest.approx(whole / dp)
    assert rows[3]["grads_bytes"] == pytest.approx(whole / dp)
    # ZeRO-2 holds the parameters whole from forward to backward (FSDP's gathered copy,
    # counted as a buffer beside its shard); ZeRO-3 keeps only its shard between layers
    assert rows[2]["params_bytes"] + rows[2]["buffers_bytes"] >= rows[0]["params_bytes"]
    assert rows[3]["params_bytes"] == pytest.approx(rows[0]["params_bytes"] / dp)
    # and never holds more at its peak than ZeRO-1 (how much less is the memory model's, held
    # to the step's measured peak in test_step_multiproc: FSDP's ZeRO-2 keeps the parameters
    # whole from forward to backward and a layer's gradients whole until reduced)
    assert rows[2]["memory_per_rank_bytes"] <= rows[1]["memory_per_rank_bytes"]


@pytest.mark.parametrize("pp,dp", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_a_pipeline_may_take_as_many_micro_batches_as_stages(pp, dp):
    """1F1B needs m >= pp: m = pp (the fewest, the least activation memory per stage for the
    most samples each) is a layout, at every ZeRO stage the schedule allows with it."""
    layouts = list(enumerate_layouts(MODEL, pp * dp, 8))
    ours = [lay for lay in layouts if (lay.tp, lay.pp, lay.dp) == (1, pp, dp)]
    assert ours
    # 32 samples split into pp micro-batches per replica: pp divides 32 / dp
    assert min(lay.micro_batches for lay in ours) == pp
    stages = {lay.zero for lay in ours if lay.micro_batches == pp}
    # DDP (ZeRO 0, 1) in a pipeline needs m > pp (torch's DDP fails at m = pp); FSDP does not
    assert stages == ({0} if dp == 1 else {2, 3})


def test_the_fewest_micro_batches_from_a_count_up_may_be_the_count_itself():
    """The pipeline calibration's m = pp step and step's default (from 2 pp up) start at the
    count: with `>` the m = pp calibration became m = 2 pp, the same step twice."""
    from distbench.planner.layouts import default_micro_batches, fewest_micro_batches

    # 32 samples: 4 splits them, 5 does not (8 is the next that does); 16 per replica of dp 2
    assert fewest_micro_batches(MODEL, 1, 4) == 4
    assert fewest_micro_batches(MODEL, 1, 5) == 8
    assert fewest_micro_batches(MODEL, 2, 16) == 16
    assert fewest_micro_batches(MODEL, 2, 17) is None
    assert default_micro_batches(MODEL, 4, 1) == 8  # the fewest from 2 x 4 up


# ---------------------------------------------------------------------------------------------
# A declared fabric and a named layout, through the command line where the user meets them

H100 = fabrics.PRESETS["dgx-h100"]
# 2 layers of hidden 1,024 (attention 4 x 1,024^2 = 4,194,304 parameters, MLP 2 x 1,024 x
# 4,096 = 8,388,608): 25,165,824 parameters, no vocabulary
SHAPE = "layers=2,hidden=1024,ffn=4096,heads=8,seq=128,batch=64"
PARAMS = 2 * (4 * 1024**2 + 2 * 1024 * 4096)
BF16 = 2


def _plan(tmp_path: Path, fabric: str, *args: str) -> helpers.Run:
    return plan(tmp_path, "--fabric", fabric, "--model", SHAPE, "--dtype", "bfloat16", *args)


def _named_row(tmp_path: Path) -> dict:
    (run_dir,) = (tmp_path / "out").iterdir()
    with open(run_dir / "plan.csv", newline="") as fh:
        (row,) = [r for r in csv.DictReader(fh) if r["given"] == "1"]
    return row


def test_a_pipeline_hop_across_nodes_runs_at_one_nic():
    """A hop is one pair of ranks, one on each node: one NIC's 46 GB/s on dgx-h100 whatever
    the span says of the group's ranks per node. At every NIC's, 8 x 46 = 368 GB/s, a pipeline
    across nodes was priced 8 times too fast."""
    for span in (Span(True), Span(True, 1), Span(True, 4), Span(True, 8)):
        fit = H100.fit("sendrecv", 2, span)
        assert fit.beta_gbps == pytest.approx(46.0), span  # a hop's bus factor is 1
        assert fit.alpha_us == pytest.approx(8.4 + 9.6), span  # its one step, across nodes
        # 1 MiB: 18 us + 1,048,576 B at 46 GB/s = 40.795 us
        assert fit.time_us(2**20) == pytest.approx(18.0 + 2**20 / 46e3), span


def test_a_plans_pipeline_across_nodes_sends_each_hop_through_one_nic(tmp_path):
    """pp 2 x dp 8 on nodes of 8: the two stages are a node apart, each hop one NIC's, as the
    command line prices it (the hop's span and the fabric's figures together).
    64 samples / dp 8 / 4 micro-batches = 2 samples of 128 tokens, x hidden 1,024, bf16:
    524,288 B a hop, 18 us + 524,288 B at 46 GB/s = 29.3976 us; 2 (pp - 1) hops sit on the
    critical path (the first micro-batch's forward, the last one's backward)."""
    got = _plan(tmp_path, "dgx-h100", "--gpus", "16", "--layout", "pp=2,dp=8,m=4")
    assert got.returncode == 0, got.stderr
    row = _named_row(tmp_path)
    activation = 2 * 128 * 1024 * BF16
    assert activation == 524_288
    hop_us = 8.4 + 9.6 + activation / 46e3
    assert hop_us == pytest.approx(29.3976, abs=1e-4)
    assert float(row["pp_comm_ms"]) == pytest.approx(2 * hop_us / 1e3, rel=1e-3)


def test_bandwidth_across_nodes_is_capped_at_the_in_node_ring(tmp_path):
    """`--fabric dgx-h100,nic_gbps=100`: a DP group of 8 ranks a node leaves each node
    through 8 NICs of 100 GB/s, 800 GB/s, but a ring across nodes also runs through NVLink
    inside each node, whose ring reaches 370: the group's bus bandwidth is 370, not 800."""
    fabric = fabrics.parse("--fabric", "dgx-h100,nic_gbps=100")
    assert fabric.busbw_gbps("all_reduce", Span(True, 8)) == pytest.approx(370.0)
    assert fabric.busbw_gbps("all_reduce", Span(True, 2)) == pytest.approx(200.0)  # 2 NICs
    got = _plan(tmp_path, "dgx-h100,nic_gbps=100", "--gpus", "16", "--layout", "dp=16")
    assert got.returncode == 0, got.stderr
    row = _named_row(tmp_path)
    # DDP all-reduces the bf16 gradients, 25,165,824 x 2 = 50,331,648 B, once a step on 16
    # ranks across 2 nodes: 2 x 15 = 30 ring steps, 2 of them across nodes, so 8.4 + 28 x 3.4
    # + 2 x 9.6 = 122.8 us; bus bandwidth 370 GB/s, the data's 2 x 15/16 of the bytes:
    # 50,331,648 x 1.875 / 370e3 = 255.059 us; 377.859 us in all (at 800: 240.765 us)
    grads = PARAMS * BF16
    assert grads == 50_331_648
    expected_us = 122.8 + grads * 1.875 / 370e3
    assert expected_us == pytest.approx(377.859, abs=1e-3)
    assert float(row["dp_comm_ms"]) == pytest.approx(expected_us / 1e3, rel=1e-3)


def test_a_layout_of_too_few_gpus_for_the_plan_is_refused(tmp_path):
    """tp x pp x dp = 8 named for a plan of 16 GPUs: half the cluster idle, priced as if it
    were the plan's. Refused as the layout of too many is: one line, exit 2, nothing made."""
    for gpus in ("16", "4"):
        got = helpers.cli(tmp_path, "plan", "--fabric", "dgx-a100", "--model", "7b",
                          "--dtype", "bfloat16", "--gpus", gpus, "--layout", "tp=2,pp=2,dp=2",
                          "--out", str(tmp_path / "out"), dispatch=True)
        line = helpers.assert_one_line_error(got, None, "--layout", ours=True)
        assert (f"tp x pp x dp = 2 x 2 x 2 = 8 in 'tp=2,pp=2,dp=2', but the plan is for "
                f"{gpus} GPUs (--gpus)") in line, line
        assert not (tmp_path / "out").exists()
