"""`distbench plan` without workers: the prediction's arithmetic against hand-computed cases,
the memory model, the enumeration, reading earlier runs, the validation figures, and the
command end to end from a synthetic collective run (a 1024-GPU plan in seconds)."""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import replace

import helpers
import pytest
from plan_helpers import LAYER_US, MODEL, hand_inputs, one_row
from plan_helpers import plan as _plan
from runs import planner_sources_run, write_csv, write_meta

from distbench.core.options import OptionError
from distbench.kinds.accept.output import OUTPUT as ACCEPT
from distbench.kinds.plan import sources
from distbench.planner import memory as mem
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.layouts import (
    Layout,
    default_micro_batches,
    divisors,
    enumerate_layouts,
    micro_batch_counts,
    problems,
)
from distbench.planner.models import PRESETS, ModelSpec, parse_model
from distbench.planner.predict import DP_KINDS
from distbench.planner.ranking import make_plan, pick_validation, validation_summary


def test_pure_dp_is_compute_plus_exposed_gradient_all_reduce_plus_optimizer():
    inputs = hand_inputs(overlap={"ddp": 0.25}, optimizer_us_per_param=0.001)
    row = one_row(Layout(tp=1, pp=1, dp=4, zero=0, micro_batches=1), inputs)
    grads = MODEL.params * 4  # float32
    all_reduce = 20.0 + grads / 2e3  # 2 GB/s = 2e3 bytes per us
    compute = MODEL.layers * LAYER_US
    expected = compute + (1 - 0.25) * all_reduce + MODEL.params * 0.001
    assert row["compute_ms"] == pytest.approx(compute / 1e3)
    assert row["dp_comm_ms"] == pytest.approx(all_reduce / 1e3)
    assert row["dp_exposed_ms"] == pytest.approx(0.75 * all_reduce / 1e3)
    assert row["predicted_step_ms"] == pytest.approx(expected / 1e3)
    assert row["tp_comm_ms"] == row["pp_comm_ms"] == row["bubble_ms"] == 0


@pytest.mark.parametrize("pp,m", [(2, 2), (2, 4), (4, 4), (4, 8)])
def test_the_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1(pp, m):
    mbs = MODEL.batch // m
    row = one_row(Layout(tp=1, pp=pp, dp=1, micro_batches=m), hand_inputs(mbs=mbs))
    slots = row["compute_ms"] + row["tp_comm_ms"] + row["bubble_ms"]
    assert row["bubble_ms"] / slots == pytest.approx((pp - 1) / (m + pp - 1))
    assert row["bubble_fraction"] == pytest.approx((pp - 1) / (m + pp - 1))
    # a slot is one micro-batch through the stage's layers; m + pp - 1 of them
    assert row["compute_ms"] == pytest.approx(m * MODEL.layers / pp * LAYER_US / 1e3)
    assert slots == pytest.approx((m + pp - 1) * MODEL.layers / pp * LAYER_US / 1e3)
    # on the critical path: the first micro-batch's activation out through pp - 1 hops, the
    # last one's gradient back through as many; the others' hops hide behind compute
    hop = 5.0 + mbs * MODEL.seq_len * MODEL.hidden_size * 4 / 4e3
    assert row["pp_comm_ms"] == pytest.approx(2 * (pp - 1) * hop / 1e3)
    assert row["predicted_step_ms"] == pytest.approx(slots + row["pp_comm_ms"])


def test_on_a_shared_device_the_bubble_runs_at_the_speed_of_one_rank_alone():
    inputs = hand_inputs(mbs=8, alone_ratio=0.5)
    row = one_row(Layout(tp=1, pp=4, dp=1, micro_batches=4), inputs)
    stage = MODEL.layers / 4 * LAYER_US
    assert row["compute_ms"] == pytest.approx(4 * stage / 1e3)
    assert row["bubble_ms"] == pytest.approx(3 * 0.5 * stage / 1e3)
    assert row["predicted_step_ms"] == pytest.approx(
        row["compute_ms"] + row["bubble_ms"] + row["pp_comm_ms"])
    # without a pipeline there is no bubble to run faster in
    flat = one_row(Layout(tp=1, pp=1, dp=1, micro_batches=1), hand_inputs(mbs=32,
                                                                         alone_ratio=0.5))
    assert flat["predicted_step_ms"] == pytest.approx(MODEL.layers * LAYER_US / 1e3)


def _pure_pipeline(m: int, inputs: Inputs) -> tuple[Layout, float, float]:
    """A pure 4-stage pipeline of m micro-batches: (layout, its step without the schedule's
    work and bubble, its bubble at weight 1), from the model's own terms."""
    layout = Layout(tp=1, pp=4, dp=1, micro_batches=m)
    row = one_row(layout, replace(inputs, pipeline_us_per_microbatch=0.0, bubble_weight=0.0))
    bubble = one_row(layout, replace(inputs, pipeline_us_per_microbatch=0.0,
                                     bubble_weight=1.0))["bubble_ms"]
    return layout, row["predicted_step_ms"] * 1e3, bubble * 1e3


def test_the_pipeline_schedule_costs_its_measured_work_in_every_slot():
    from distbench.planner.predict import pipeline_calibration

    inputs = hand_inputs(mbs=4, alone_ratio=0.5)
    calibration, base, bubble = _pure_pipeline(8, inputs)
    assert bubble > 0
    # one pure pipeline step that took 11 slots x 30 us more than predicted: the bubble as
    # the model has it (weight 1), the rest the schedule's work per slot
    got = pipeline_calibration([(calibration, base + bubble + 11 * 30.0)], MODEL, inputs, 4, 8)
    assert got == (pytest.approx(30.0), 1.0)
    assert pipeline_calibration([(calibration, base - 100.0)], MODEL, inputs, 4, 8) == (0.0, 1.0)
    assert inputs.pipeline_us_per_microbatch == 0.0  # the inputs are left as they were
    # another pipeline pays it in each of its m + pp - 1 slots, beside its hops
    inputs = hand_inputs(mbs=4, pipeline_us_per_microbatch=30.0)
    row = one_row(Layout(tp=1, pp=2, dp=1, micro_batches=16), replace(inputs, compute=[
        ComputePoint(tp=1, tokens=2 * MODEL.seq_len, layer_us=LAYER_US,
                     flops=MODEL.flops_per_layer(2 * MODEL.seq_len, 1))]))
    hop = 5.0 + 2 * MODEL.seq_len * MODEL.hidden_size * 4 / 4e3
    assert row["pp_comm_ms"] == pytest.approx((2 * hop + 17 * 30.0) / 1e3)
    assert one_row(Layout(tp=1, pp=1, dp=1, micro_batches=1), hand_inputs(
        mbs=32, pipeline_us_per_microbatch=30.0))["pp_comm_ms"] == 0


@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_two_pipeline_steps_fit_the_schedules_work_and_the_bubbles_weight(weight):
    """m = pp and m = 2 pp, each planted with 30 us a slot and its bubble at `weight`: both
    come back; a weight the steps put outside [0, 1] is held there and the work refitted."""
    from distbench.planner.predict import pipeline_calibration

    points = {m: _pure_pipeline(m, hand_inputs(mbs=32 // m, alone_ratio=0.5)) for m in (4, 8)}
    inputs = hand_inputs(mbs=8, alone_ratio=0.5)
    inputs.compute += hand_inputs(mbs=4).compute
    steps = [(lay, base + weight * bubble + (m + 3) * 30.0)
             for m, (lay, base, bubble) in points.items()]
    work, got = pipeline_calibration(steps, MODEL, inputs, 4, 8)
    assert (work, got) == (pytest.approx(30.0), pytest.approx(weight, abs=1e-9))
    # the fill and drain cost less than nothing: weight 0, and the slots take the rest
    steps = [(lay, base - 0.5 * bubble + (m + 3) * 30.0)
             for m, (lay, base, bubble) in points.items()]
    work, got = pipeline_calibration(steps, MODEL, inputs, 4, 8)
    assert got == 0.0
    excess = [(-0.5 * bubble + (m + 3) * 30.0, m + 3) for m, (_, _, bubble) in points.items()]
    assert work == pytest.approx(sum(r * s for r, s in excess) / sum(s * s for _, s in excess))


def test_the_bubble_is_charged_at_its_measured_weight():
    layout = Layout(tp=1, pp=4, dp=1, micro_batches=8)
    full = one_row(layout, hand_inputs(mbs=4, alone_ratio=0.5))
    quarter = one_row(layout, hand_inputs(mbs=4, alone_ratio=0.5, bubble_weight=0.25))
    assert quarter["bubble_ms"] == pytest.approx(0.25 * full["bubble_ms"])
    assert full["predicted_step_ms"] - quarter["predicted_step_ms"] == pytest.approx(
        0.75 * full["bubble_ms"])


def test_a_step_that_exposed_more_than_its_collectives_charges_the_wrapper_per_layer():
    from distbench.planner.predict import split_exposed

    assert split_exposed(30.0, 40.0, 4) == (pytest.approx(0.25), 0.0)
    assert split_exposed(-5.0, 40.0, 4) == (1.0, 0.0)  # noise below compute: all hidden
    assert split_exposed(60.0, 40.0, 4) == (0.0, pytest.approx(5.0))
    inputs = hand_inputs(wrapper_us_per_layer={"ddp": 7.0})
    grads = MODEL.params * 4
    all_reduce = 20.0 + grads / 2e3
    row = one_row(Layout(tp=1, pp=1, dp=4, zero=0, micro_batches=1), inputs)
    assert row["dp_exposed_ms"] == pytest.approx((all_reduce + MODEL.layers * 7.0) / 1e3)
    assert not any("overlap measured" in n for n in inputs.notes)
    # a pipeline stage wraps its own layers only; FSDP's figure is another's
    inputs = hand_inputs(mbs=4, wrapper_us_per_layer={"ddp": 7.0, "zero3": 1000.0},
                         overlap={"ddp": 0.0})
    row = one_row(Layout(tp=1, pp=2, dp=2, zero=0, micro_batches=4), inputs)
    half = 10.0 + grads / 2 / 1e3
    assert row["dp_exposed_ms"] == pytest.approx((half + MODEL.layers / 2 * 7.0) / 1e3)


@pytest.mark.parametrize("dp,zero,tensors,params", [
    (1, 0, 4, 1.0), (4, 0, 4, 1.0), (4, 1, 1, 0.25), (4, 2, 4, 0.25), (4, 3, 4, 0.25)])
def test_the_optimizer_costs_per_layer_held_and_per_parameter_updated(dp, zero, tensors,
                                                                       params):
    inputs = hand_inputs(mbs=MODEL.batch // dp, optimizer_us_per_layer=50.0,
                         optimizer_us_per_param=0.002, overlap=dict.fromkeys(DP_KINDS, 1.0))
    inputs.fits += [CommFit(op=op, ranks=4, span="node", alpha_us=1, beta_gbps=1)
                    for op in ("all_gather", "reduce_scatter")]
    row = one_row(Layout(tp=1, pp=1, dp=dp, zero=zero, micro_batches=1), inputs)
    # ZeRO-1 gives each of the dp replicas whole tensors; FSDP shards every tensor dp ways
    expected = tensors * 50.0 + params * MODEL.params * 0.002
    assert row["optimizer_ms"] == pytest.approx(expected / 1e3)


def test_tensor_parallel_all_reduces_four_per_layer_of_the_activations():
    row = one_row(Layout(tp=2, pp=1, dp=1, micro_batches=1), hand_inputs(tp=2, mbs=32))
    activation = 32 * MODEL.seq_len * MODEL.hidden_size * 4
    assert row["tp_comm_ms"] == pytest.approx(MODEL.layers * 4 * (10.0 + activation / 1e3) / 1e3)
    assert row["predicted_step_ms"] == pytest.approx(
        row["compute_ms"] + row["tp_comm_ms"])


def test_a_tp_layer_timed_whole_holds_its_all_reduces():
    inputs = hand_inputs(tp=2, mbs=32)
    inputs.compute = [replace(c, with_tp_comm=True) for c in inputs.compute]
    row = one_row(Layout(tp=2, pp=1, dp=1, micro_batches=1), inputs)
    # the layer's time is the step's, its all-reduces' share (from the fit) shown as TP's
    assert row["predicted_step_ms"] == pytest.approx(MODEL.layers * LAYER_US / 1e3)
    activation = 32 * MODEL.seq_len * MODEL.hidden_size * 4
    share = min(LAYER_US, 4 * (10.0 + activation / 1e3))
    assert row["tp_comm_ms"] == pytest.approx(MODEL.layers * share / 1e3)
    # another shape is scaled from a layer timed without TP's communication, then adds it
    inputs.compute.append(ComputePoint(tp=1, tokens=16 * MODEL.seq_len, layer_us=50.0,
                                       flops=MODEL.flops_per_layer(16 * MODEL.seq_len, 1)))
    row = one_row(Layout(tp=2, pp=1, dp=1, micro_batches=2), inputs)
    scaled = 50.0 * MODEL.flops_per_layer(16 * MODEL.seq_len, 2) / MODEL.flops_per_layer(
        16 * MODEL.seq_len, 1)
    assert row["compute_ms"] == pytest.approx(2 * MODEL.layers * scaled / 1e3)


@pytest.mark.parametrize("zero,m,refused", [(0, 2, True), (1, 2, True), (0, 4, False),
                                            (3, 2, False)])
def test_ddp_in_a_pipeline_needs_more_micro_batches_than_stages(zero, m, refused):
    layout = Layout(tp=1, pp=2, dp=2, zero=zero, micro_batches=m)
    reasons = problems(layout, MODEL)
    assert any("more micro-batches than pp" in r for r in reasons) == refused


def test_a_group_size_not_measured_is_scaled_as_a_ring():
    inputs = Inputs(fits=[CommFit(op="all_reduce", ranks=4, span="node", alpha_us=30.0,
                                  beta_gbps=10.0)])
    busbw = 10.0 * 2 * 3 / 4  # algbw x 2(n-1)/n at 4 ranks
    algbw_8 = busbw / (2 * 7 / 8)
    expected = 30.0 * 7 / 3 + 1e6 / (algbw_8 * 1e3)
    assert inputs.comm_us("all_reduce", 8, "node", 1e6) == pytest.approx(expected)
    assert any("scaled from the fit on 4" in n for n in inputs.notes)
    assert inputs.comm_us("all_reduce", 4, "node", 1e6) == pytest.approx(30.0 + 1e6 / 1e4)


SMALL = ModelSpec(name="custom", layers=2, hidden_size=8, ffn_size=32, heads=2, seq_len=4,
                  batch=8)


def test_fits_leaves_the_stated_reserve():
    gpu = 80 * 2**30
    assert mem.fits(0.9 * gpu, gpu) and not mem.fits(0.9 * gpu + 1, gpu)
    assert mem.usable_bytes(8 * 2**30) == 6 * 2**30  # the 2 GiB floor
    for memory in (8 * 2**30, 80 * 2**30, 141e9):
        assert mem.memory_of_limit(mem.usable_bytes(memory)) == pytest.approx(memory)


def test_every_layout_uses_exactly_the_gpus_and_tp_stays_in_a_node():
    model = PRESETS["7b"]
    layouts = list(enumerate_layouts(model, 64, 8))
    assert layouts
    assert all(lay.world == 64 and lay.tp <= 8 for lay in layouts)
    assert {lay.tp for lay in layouts} == {1, 2, 4, 8}
    assert {lay.zero for lay in layouts} == {0, 1, 2, 3}
    assert all(lay.micro_batches >= lay.pp for lay in layouts if lay.pp > 1)


def test_divisors_are_every_divisor_found_in_square_root_time():
    for n in range(1, 500):
        assert divisors(n) == [k for k in range(1, n + 1) if n % k == 0], n
    with helpers.within(5):  # counting up to n took hours for these (issue 30)
        assert len(divisors(10**12)) == 169
        assert divisors(999_999_999_989) == [1, 999_999_999_989]  # a prime


def test_a_pipeline_weighs_a_ladder_of_micro_batch_counts_not_every_divisor():
    # a power of two (every preset's batch): every divisor from pp up, as before the ladder
    assert micro_batch_counts(PRESETS["7b"], 4, 8) == [4, 8, 16, 32, 64, 128]
    assert micro_batch_counts(PRESETS["7b"], 1, 8) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert micro_batch_counts(PRESETS["7b"], 2, 3) == []  # dp 3 does not split 1024
    # 8,648,640 samples have 448 divisors: each a row of the plan, per tp, pp, dp and zero
    big = replace(MODEL, batch=8_648_640)
    with helpers.within(5):
        counts = micro_batch_counts(big, 3, 1)
    fit = [k for k in divisors(big.batch) if k >= 3]
    assert len(fit) == 446 and len(counts) <= math.log2(big.batch) + 3, counts
    assert set(counts) <= set(fit)
    # the fewest, micro-batches of one sample, the step's default, and every divisor left out
    # within 2x of a count below it
    assert counts[0] == 3 and counts[-1] == big.batch
    assert default_micro_batches(big, 3, 1) in counts
    assert all(any(c <= k < 2 * c for c in counts) for k in fit)


def test_the_largest_plan_accepted_is_tens_of_thousands_of_layouts():
    """The most layouts a search over the bounds found (highly composite layers, GPUs per node,
    GPUs and batch): 840 layers and 840 GPUs per node (32 divisors each), 705,600 GPUs, a
    batch of 16,228,800: 36,149 layouts (35,221 before pp 1 weighed micro-batch counts too),
    planned in seconds here (docs/plan.md). With every divisor as a micro-batch count it was
    182,854, and each divisor counted up to n."""
    model = parse_model("--model", "layers=840,hidden=53760,ffn=215040,heads=840,seq=4096,"
                        "batch=16228800")
    with helpers.within(10):
        count = sum(1 for _ in enumerate_layouts(model, 705_600, 840))
    assert 30_000 < count <= 40_000, count


def test_validation_summary_on_known_values():
    assert validation_summary([(1, 1), (2, 2), (3, 3)]) == (0.0, pytest.approx(1.0))
    mape, rho = validation_summary([(3, 1), (2, 2), (1, 3)])
    assert rho == pytest.approx(-1.0)
    assert mape == pytest.approx((200 + 0 + 200 / 3) / 3)
    assert validation_summary([(110, 100), (90, 100)])[0] == pytest.approx(10.0)
    # ties: average ranks (1.5, 1.5, 3) against (1, 2, 3)
    assert validation_summary([(1, 1), (1, 2), (2, 3)])[1] == pytest.approx(1.5 / math.sqrt(3))
    assert math.isnan(validation_summary([(1, 2)])[1])


def test_pick_validation_takes_the_best_then_spans_the_space():
    inputs = hand_inputs()
    inputs.overlap = dict.fromkeys(DP_KINDS, 0.5)
    inputs.fits.append(CommFit(op="all_gather", ranks=4, span="node", alpha_us=1, beta_gbps=1))
    inputs.fits.append(CommFit(op="reduce_scatter", ranks=4, span="node", alpha_us=1,
                               beta_gbps=1))
    rows = make_plan(MODEL, inputs, 8, 8, 80 * 2**30, "float32")
    picked = pick_validation(rows, 4, 8)
    assert picked == pick_validation(rows, 4, 8)
    assert len(picked) == 4 and picked[0]["rank"] == 1 and picked[1]["rank"] == 2
    assert len({(r["tp"], r["pp"], r["dp"], r["zero"]) for r in picked[2:]}) == 2
    assert all(r["fits"] and r["world_size"] == 8 for r in picked)
    assert pick_validation(rows, 3, 16) == []


# ---------------------------------------------------------------------------------------------
# Earlier runs, and the command

def test_earlier_runs_are_read_into_fits_overlap_and_the_topology(tmp_path):
    inputs = sources.read([planner_sources_run(tmp_path / "run")])
    fit = {(f.op, f.ranks, f.span): f for f in inputs.fits}
    assert set(fit) == {(op, w, s) for op in ("all_reduce", "all_gather", "reduce_scatter")
                        for w, s in ((8, "node"), (16, "nodes"))} | {
        ("sendrecv", 2, "node"), ("sendrecv", 2, "nodes")}
    assert fit["all_reduce", 8, "node"].alpha_us == pytest.approx(20.0, rel=0.01)
    assert fit["all_reduce", 16, "nodes"].beta_gbps == pytest.approx(20.0, rel=0.01)
    assert fit["sendrecv", 2, "nodes"].alpha_us == pytest.approx(30.0, rel=0.01)
    assert inputs.overlap == {"ddp": pytest.approx(0.6), "zero3": pytest.approx(0.4)}
    assert (inputs.gpus_per_node, inputs.memory_per_gpu) == (8, 85520809984)
    assert len(inputs.sources) == 6
    assert inputs.sources[-1].endswith("run: measured on NVIDIA H100 80GB HBM3")


def test_a_plans_figures_are_read_back_a_zero_one_too(tmp_path):
    saved = hand_inputs(wrapper_us_per_layer={"zero3": 30.0}, overlap={"ddp": 0.2},
                        pipeline_us_per_microbatch=0.0, alone_ratio=0.5, bubble_weight=0.0,
                        overlap_layouts={"ddp": "tp1 pp1 dp4 zero0 m1",
                                         "zero3": "tp1 pp1 dp4 zero3 m1",
                                         "pipeline": "tp1 pp4 dp1 zero0 m4",
                                         "pipeline 2": "tp1 pp4 dp1 zero0 m8"})
    (tmp_path / "plan").mkdir()
    saved.write(tmp_path / "plan")
    # a later run's figures do not replace the first one's, its measured 0 included
    later = hand_inputs(pipeline_us_per_microbatch=99.0, overlap={"ddp": 0.9},
                        overlap_layouts={"pipeline": "x", "ddp": "y"})
    (tmp_path / "later").mkdir()
    later.write(tmp_path / "later")
    got = sources.read([tmp_path / "plan", tmp_path / "later"])
    assert (got.pipeline_us_per_microbatch, got.bubble_weight) == (0.0, 0.0)
    assert got.overlap_layouts == saved.overlap_layouts
    assert (got.overlap, got.wrapper_us_per_layer, got.alone_ratio) == (
        {"ddp": 0.2}, {"zero3": 30.0}, 0.5)


def test_an_accept_run_with_one_size_per_check_is_refused(tmp_path):
    run = tmp_path / "accept"
    run.mkdir()
    write_csv(run / "accept.csv", ACCEPT.csv, [
        {"check": "node all_reduce busbw", "scope": "node", "target": "a",
         "command": "collective", "op": "all_reduce", "dtype": "float32", "size_bytes": 2**30,
         "ranks": 8, "time_us": 5000, "measured": 1, "expected": 1, "ratio": 1,
         "verdict": "PASS", "retest": 0}])
    write_meta(run, "accept", finished=False, nnodes=1)
    with pytest.raises(OptionError, match="one size per group"):
        sources.read_one(run)


def test_a_1024_gpu_plan_from_a_collective_run_in_seconds(tmp_path):
    run = planner_sources_run(tmp_path / "run")
    start = time.monotonic()
    got = _plan(tmp_path, "--from", str(run), "--gpus", "1024", "--gpus-per-node", "8",
                "--model", "7b", "--dtype", "bfloat16", plot=True)
    secs = time.monotonic() - start
    print(f"1024-GPU plan of 7b: {secs:.2f} s")
    assert got.returncode == 0, got.stderr
    assert secs < 10
    (run_dir,) = (tmp_path / "out").iterdir()
    with open(run_dir / "plan.csv") as fh:
        rows = list(csv.DictReader(fh))
    expected = {lay.key() for lay in enumerate_layouts(PRESETS["7b"], 1024, 8)}
    assert {(int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["zero"]),
             int(r["micro_batches"])) for r in rows} == expected
    assert all(r["world_size"] == "1024" and r["fits"] in ("0", "1") for r in rows)
    assert all(float(r["memory_per_rank_bytes"]) > 0 for r in rows)
    ranked = [int(r["rank"]) for r in rows if r["fits"] == "1"]
    assert ranked == list(range(1, len(ranked) + 1))
    assert all(r["rank"] == "" for r in rows if r["fits"] == "0")
    steps = [float(r["predicted_step_ms"]) for r in rows if r["fits"] == "1"]
    assert steps == sorted(steps)
    text = (run_dir / "plan.md").read_text()
    assert "## Top layouts" in text and "h100's datasheet peak" in text
    assert (run_dir / "plan.png").stat().st_size > 0
    saved = json.loads((run_dir / "inputs.json").read_text())
    assert saved["compute"] == []  # as measured: the datasheet's scaling is no measurement
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    assert "tp" in got.stdout and "7b" in got.stdout


def test_no_plot_writes_the_same_plan_without_its_figure(tmp_path):
    """--no-plot, for a sweep that reads plan.csv: the same rows and plan.md, no plan.png."""
    args = ("--fabric", "dgx-a100", "--gpus", "64", "--model", "7b", "--dtype", "bfloat16")
    drawn = helpers.cli(tmp_path, "plan", *args, "--out", str(tmp_path / "a"), dispatch=True)
    bare = helpers.cli(tmp_path, "plan", *args, "--no-plot", "--out", str(tmp_path / "b"),
                       dispatch=True)
    assert drawn.code == bare.code == 0, drawn.stderr + bare.stderr
    (with_png,) = (tmp_path / "a").glob("*-plan")
    (without,) = (tmp_path / "b").glob("*-plan")
    assert (with_png / "plan.png").stat().st_size > 0
    assert not (without / "plan.png").exists()
    for name in ("plan.csv", "plan.md"):
        assert (without / name).read_text() == (with_png / name).read_text(), name
    assert bare.stdout == drawn.stdout


def test_memory_assumed_when_nothing_says_is_said(tmp_path):
    run = planner_sources_run(tmp_path / "run")
    (run / "topo.json").unlink()
    got = _plan(tmp_path, "--from", str(run), "--gpus", "16", "--gpus-per-node", "8",
                "--model", "1b", "--gpu", "a100", "--gpu-memory", "40G")
    assert got.returncode == 0, got.stderr
    assert "40.0 GiB per GPU (--gpu-memory)" in got.stdout
    (tmp_path / "out").rename(tmp_path / "first")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "16", "--gpus-per-node", "8",
                "--model", "1b", "--mfu", "0.4", "--gpu", "h100", "--zero", "0")
    assert got.returncode == 0, got.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "--gpu h100's datasheet" in (run_dir / "plan.md").read_text()


@pytest.mark.parametrize("args,option", [
    (("--gpus", "1000", "--gpus-per-node", "8"), "--gpus"),
    (("--gpus", "16"), "--gpus-per-node"),  # no topology below, none given
    (("--gpus", "16", "--gpus-per-node", "8", "--gpu", "mi300"), "--gpu"),
    (("--gpus", "16", "--gpus-per-node", "8", "--gpu-memory", "lots"), "--gpu-memory"),
    (("--gpus", "16", "--gpus-per-node", "8", "--model", "13x"), "--model"),
    (("--gpus", "16", "--gpus-per-node", "8"), "--gpu"),  # no compute, no GPU to scale from
])
def test_bad_input_is_one_line_exit_2_and_no_run_dir(tmp_path, args, option):
    run = planner_sources_run(tmp_path / "run")
    (run / "topo.json").unlink()
    got = _plan(tmp_path, "--from", str(run), *args)
    helpers.assert_one_line_error(got, None, option, ours=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dtype,said", [
    ("int8", "unknown value 'int8' (valid: float32, bfloat16, float16, float64) (example"),
    ("all", "takes one floating-point dtype (float32, bfloat16, float16, float64), got 'all'"),
    ("bf16,float32", "takes one floating-point dtype"),
])
def test_one_dtype_is_asked_and_all_is_not_offered(tmp_path, dtype, said):
    got = _plan(tmp_path, "--fabric", "dgx-a100", "--gpus", "8", "--dtype", dtype)
    line = helpers.assert_one_line_error(got, None, "--dtype", ours=True)
    assert said in line, line
    assert not (tmp_path / "out").exists()


TOY = "hidden=128,ffn=512,heads=4,seq=32"


@pytest.mark.parametrize("given,option,needle", [
    ({"--model": f"layers=1000000000,{TOY},batch=16"}, "--model",
     "layers must be at most 1,024"),
    ({"--model": f"layers=4,{TOY},batch=1000000000000"}, "--model",
     "batch must be at most 16,777,216"),
    ({"--gpus": "2000000"}, "--gpus", "must be at most 1,048,576"),
    ({"--gpus-per-node": "2048"}, "--gpus-per-node", "must be at most 1,024"),
], ids=["layers", "batch", "gpus", "gpus-per-node"])
def test_one_number_past_any_real_model_or_cluster_is_refused_at_once(tmp_path, given, option,
                                                                      needle):
    """Each made the plan's arithmetic spin for minutes (issue 30), or ran a plan of a node
    no machine has."""
    run = planner_sources_run(tmp_path / "run")
    args = {"--gpus": "8", "--gpus-per-node": "8", **given}
    with helpers.within(5):
        got = _plan(tmp_path, "--from", str(run), *(x for kv in args.items() for x in kv))
    line = helpers.assert_one_line_error(got, None, option, ours=True)
    assert needle in line, line
    assert not (tmp_path / "out").exists()


def test_the_largest_values_accepted_together_plan_in_seconds(tmp_path):
    run = planner_sources_run(tmp_path / "run")
    start = time.monotonic()
    with helpers.within(30):
        got = _plan(tmp_path, "--from", str(run), "--gpus", str(2**20), "--gpus-per-node",
                    "1024", "--dtype", "bfloat16", "--model",
                    "layers=1024,hidden=1048576,ffn=4194304,heads=65536,seq=16777216,"
                    "batch=16777216")
    secs = time.monotonic() - start
    print(f"the largest plan accepted: {secs:.2f} s")
    assert got.returncode == 0, got.stderr
    assert secs < 10
    assert "4577 layouts, 0 fit in memory" in got.stderr, got.stderr


@pytest.mark.parametrize("make", ["missing", "empty", "tp"])
def test_a_from_that_holds_no_inputs_is_refused(tmp_path, make):
    path = tmp_path / make
    if make == "empty":
        path.mkdir()
    if make == "tp":
        path.mkdir()
        write_meta(path, "tp", finished=False, status="ok")
    got = _plan(tmp_path, "--from", str(path), "--gpus", "16", "--gpus-per-node", "8")
    helpers.assert_one_line_error(got, None, "--from", ours=True)
    assert not (tmp_path / "out").exists()


def test_the_plan_is_written_through_the_results_writer(tmp_path):
    """planner.assemble.write, the one writer of both plan paths: plan.csv with the contract's
    columns (the writer's), one row per layout; inputs.json; plan.md; plan.png."""
    import csv as csvmod

    from distbench.kinds.plan.output import OUTPUT as PLAN
    from distbench.planner.assemble import write
    from distbench.planner.ranking import top_lines

    inputs = hand_inputs(mbs=4, overlap={"ddp": 0.5})
    rows = make_plan(MODEL, inputs, 8, 8, 40 * 2**30, "float32", zero_stages=(0,))
    written = write(tmp_path, PLAN, rows, MODEL, inputs, gpus=8, gpus_per_node=8,
                    memory_per_gpu=40 * 2**30, memory_from="--gpu-memory", dtype="float32",
                    top=2)
    assert [p.name for p in written] == ["plan.csv", "inputs.json", "plan.md", "plan.png"]
    assert all(p.stat().st_size > 0 for p in written)
    with open(tmp_path / "plan.csv", newline="") as fh:
        read = list(csvmod.reader(fh))
    assert read[0] == list(PLAN.csv) and len(read) == 1 + len(rows)
    text = (tmp_path / "plan.md").read_text()
    assert "8 GPUs, 8 per node, 40.0 GiB per GPU" in text and "float32" in text
    lines = top_lines(rows, 2, PLAN.console)
    assert len([line for line in lines if not line.startswith("#")]) == 2


def test_recomputation_adds_the_forward_it_reruns_and_the_lm_head_its_flops():
    from distbench.planner.predict import predict

    tokens = 8 * MODEL.seq_len
    plain = predict(MODEL, Layout(tp=1, pp=1, dp=1, micro_batches=4), hand_inputs(), 4, 8)
    assert plain.compute_us == pytest.approx(4 * MODEL.layers * LAYER_US)
    flops = MODEL.flops_per_layer(tokens)
    core = 2 * 2 * tokens * MODEL.seq_len * MODEL.hidden_size  # scores and weighted sum
    full = predict(MODEL, Layout(tp=1, pp=1, dp=1, micro_batches=4, recompute="full"),
                   hand_inputs(), 4, 8)
    # the forward again: a third of the matmuls' 6 FLOPs a parameter and token, and the core
    forward = 2 * tokens * MODEL.params_per_layer + core
    assert full.compute_us == pytest.approx(plain.compute_us * (1 + forward / flops))
    assert 1.3 < full.compute_us / plain.compute_us < 1.34
    selective = predict(MODEL, Layout(tp=1, pp=1, dp=1, micro_batches=4,
                                      recompute="selective"), hand_inputs(), 4, 8)
    assert selective.compute_us == pytest.approx(plain.compute_us * (1 + core / flops))
    # the LM head, 6 V h FLOPs a token, at the layer's rate, on every micro-batch
    vocab = replace(MODEL, vocab=1000)
    headed = predict(vocab, Layout(tp=1, pp=1, dp=1, micro_batches=4), hand_inputs(), 4, 8)
    head = 6 * tokens * 1000 * MODEL.hidden_size
    assert headed.compute_us == pytest.approx(4 * LAYER_US * (MODEL.layers + head / flops))
