"""step's options and layouts, in this process: what is refused before any worker starts (one
line, exit 2, nothing on disk), which layouts a world expands to, and the parts' arithmetic.
The runs themselves: test_step_multiproc.py."""

from __future__ import annotations

import helpers
import pytest
from helpers import LAUNCHER_VARS, assert_one_line_error

from distbench.core.options import OptionError, build
from distbench.kinds.step.options import StepCommandOptions, layouts_of, model_of
from distbench.planner.layouts import Layout, default_micro_batches
from distbench.planner.models import PRESETS
from distbench.steps.step3d import attribute_exposed, bubble_time, check_model


@pytest.fixture
def no_launcher(monkeypatch, tmp_path):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _opts(**raw) -> StepCommandOptions:
    return build(StepCommandOptions, raw, argv=[])


BAD = [
    ("product-not-the-world", ["--tp", "2", "--pp", "2", "--dp", "2"], "--tp/--pp/--dp",
     "2 x 2 x 2 must be the 4 ranks"),
    ("tp-does-not-divide", ["--tp", "3"], "--tp", "tp 3 does not divide the 4 ranks"),
    ("tp-pp-do-not-divide", ["--tp", "2", "--pp", "3"], "--tp/--pp",
     "tp 2 x pp 3 does not divide the 4 ranks"),
    ("pp-more-than-layers", ["--pp", "4", "--model",
                             "layers=3,hidden=64,heads=4,seq=8,batch=8"], "--pp",
     "pp 4 is more stages than the layers (3)"),
    ("too-few-micro-batches", ["--tp", "2", "--pp", "2", "--micro-batches", "1"], "--tp/--pp",
     "needs at least pp (2) micro-batches"),
    ("zero-unknown", ["--zero", "4"], "--zero", "unknown value '4' (valid: 0, 1, 2, 3, all)"),
    ("zero-not-a-number", ["--zero", "one"], "--zero", "unknown value 'one'"),
    ("zero-without-replicas", ["--tp", "4", "--zero", "3"], "--zero",
     "no layout asked for has dp > 1"),
    ("model-unknown", ["--model", "huge"], "--model", "unknown model 'huge'"),
    ("model-key-twice", ["--model", "layers=4,hidden=64,heads=4,seq=8,batch=8,layers=8"],
     "--model", "layers is given twice"),
    # one dtype: "all" is not listed as valid, and refused as no single dtype
    ("dtype-int8", ["--dtype", "int8"], "--dtype",
     "unknown value 'int8' (valid: float32, bfloat16, float16, float64) (example"),
    ("dtype-all", ["--dtype", "all"], "--dtype", "takes one floating-point dtype (float32, "
     "bfloat16, float16, float64), got 'all'"),
    ("model-shape-lacks", ["--model", "layers=4,hidden=64"], "--model", "lacks heads"),
    ("tp-zero", ["--tp", "0"], "--tp", "at least 1"),
    ("recompute-unknown", ["--recompute", "some"], "--recompute", "some"),
    ("recompute-layers-negative", ["--recompute", "full", "--recompute-layers", "-1"],
     "--recompute-layers", "must be 0 or more, got -1"),
    ("recompute-layers-without-full", ["--recompute", "op", "--recompute-layers", "2"],
     "--recompute-layers", "2 counts the layers full recomputation checkpoints in each stage; "
     "--recompute is op"),
    ("recompute-layers-past-a-stage", ["--pp", "2", "--recompute", "full",
                                       "--recompute-layers", "3"], "--recompute-layers",
     "tp1 pp2 dp2 zero0 m4 rc-full:3: recompute_layers 3 is more than a stage's 2 layers"),
    ("recompute-layers-no-layout", ["--recompute", "full", "--recompute-layers", "5"],
     "--recompute-layers", "no tp x pp x dp layout of 4 ranks has 5 layers in each stage"),
    ("grad-sync-unknown", ["--grad-sync", "first"], "--grad-sync",
     "unknown value 'first' (valid: micro, last)"),
    ("sequence-parallel-splits-no-sequence", ["--tp", "4", "--model",
                                              "layers=2,hidden=64,heads=4,seq=6,batch=8"],
     "--tp/--sp", "sequence parallelism over tp 4 must divide the sequence (6)"),
    ("virtual-stages-zero", ["--pp", "2", "--virtual-stages", "0"], "--virtual-stages",
     "at least 1"),
    ("virtual-stages-without-pipeline", ["--tp", "1", "--pp", "1", "--virtual-stages", "2"],
     "--tp/--pp/--virtual-stages", "2 virtual stages interleave a pipeline; pp is 1"),
    ("virtual-stages-split-no-layers", ["--pp", "2", "--virtual-stages", "3"],
     "--pp/--virtual-stages", "pp x virtual stages (2 x 3) must divide the layers (4)"),
    ("virtual-stages-micro-batches-not-rounds", ["--pp", "2", "--virtual-stages", "2",
                                                 "--micro-batches", "3"],
     "--pp/--virtual-stages", "needs micro-batches (3) a multiple of pp (2)"),
    ("virtual-stages-ddp-too-few", ["--pp", "2", "--virtual-stages", "2", "--micro-batches",
                                    "4"], "--pp/--virtual-stages",
     "needs more micro-batches than pp x virtual stages (2 x 2), got 4"),
    ("virtual-stages-no-layout", ["--virtual-stages", "4"], "--virtual-stages",
     "no tp x pp x dp layout of 4 ranks runs toy at 4 virtual stages"),
    ("kv-heads-do-not-divide", ["--model", "layers=2,hidden=64,heads=4,kv_heads=3,seq=8,"
                                "batch=8"], "--model", "kv_heads=3 do not divide heads=4"),
    ("tp-splits-a-kv-head", ["--tp", "4", "--model", "layers=2,hidden=64,heads=4,kv_heads=2,"
                             "seq=8,batch=8"], "--tp", "tp 4 must divide the kv heads (2)"),
]


@pytest.mark.parametrize("args, option, needle", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_step_option_is_one_line_exit_2_and_nothing_on_disk(tmp_path, args, option,
                                                               needle):
    out = tmp_path / "results"
    proc = helpers.cli(tmp_path, "step", "--workers", "4", *args, "--out", str(out))
    line = assert_one_line_error(proc, None, option, ours=True)
    assert needle in line, line
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_with_no_layout_flag_every_factorization_of_the_world_runs(no_launcher):
    layouts, notes = layouts_of(_opts(zero="0,1,3"), 4)
    shapes = [(x.tp, x.pp, x.dp, x.zero) for x in layouts]
    assert shapes == [(1, 1, 4, 0), (1, 1, 4, 1), (1, 1, 4, 3), (1, 2, 2, 0), (1, 2, 2, 1),
                      (1, 2, 2, 3), (1, 4, 1, 0), (2, 1, 2, 0), (2, 1, 2, 1), (2, 1, 2, 3),
                      (2, 2, 1, 0), (4, 1, 1, 0)]
    # ZeRO above 0 is left out where dp is 1, with a note each
    assert len(notes) == 3 and all("ZeRO 1, 3 left out" in n for n in notes)
    # the default micro-batches: 1 without a pipeline, 2 x pp with one
    assert {(x.pp, x.micro_batches) for x in layouts} == {(1, 1), (2, 4), (4, 8)}


def test_a_world_the_model_does_not_fit_everywhere_keeps_only_valid_layouts(no_launcher):
    # 2 heads: tp 4 does not fit, tp 2 does; 6 layers take pp 4 in stages of 1, 2, 2 and 1
    opts = _opts(model="layers=6,hidden=64,heads=2,seq=8,batch=8")
    assert [(x.tp, x.pp, x.dp) for x in layouts_of(opts, 4)[0]] == [(1, 1, 4), (1, 2, 2),
                                                                 (1, 4, 1), (2, 1, 2),
                                                                 (2, 2, 1)]


SHAPE = {"layers": 4, "hidden": 128, "ffn": 512, "heads": 4, "seq": 32, "batch": 16}


def _shape(**changed: int) -> str:
    return ",".join(f"{k}={v}" for k, v in {**SHAPE, **changed}.items())


@pytest.mark.parametrize("key, value, most", [
    ("layers", 10**9, "1,024"), ("hidden", 2**21, "1,048,576"), ("ffn", 2**23, "4,194,304"),
    ("heads", 2**17, "65,536"), ("seq", 2**25, "16,777,216"),
    ("batch", 10**12, "16,777,216")])
def test_a_shape_past_any_real_model_is_refused_at_once(tmp_path, key, value, most):
    """batch=10^12 made the layouts' arithmetic spin for hours (issue 30); each bound is
    several times the largest public model's figure (planner.models.MAX_SHAPE)."""
    out = tmp_path / "results"
    with helpers.within(5):
        proc = helpers.cli(tmp_path, "step", "--workers", "4", "--model",
                           _shape(**{key: value}), "--out", str(out))
    line = assert_one_line_error(proc, None, "--model", ours=True)
    assert f"{key} must be at most {most} (several times the largest model's), got " \
        f"{value:,}" in line, line
    assert not out.exists()


def test_the_largest_batch_accepted_is_laid_out_at_once(tmp_path):
    with helpers.within(5):
        # gloo named: on a GPU machine `auto` means NCCL, which no host memory bounds (the
        # first GPU ran this test with dispatch reached, issue 34)
        proc = helpers.cli(tmp_path, "step", "--workers", "4", "--backend", "gloo", "--model",
                           _shape(batch=2**24), "--out", str(tmp_path / "results"))
    # the arithmetic done in time: every layout's memory judged, and the run refused for it
    line = assert_one_line_error(proc, None, "--model", ours=True)
    assert "4 workers and their launcher need about" in line


@pytest.mark.parametrize("given, want", [
    (dict(tp=2), (2, 1, 2)), (dict(pp=2), (1, 2, 2)), (dict(dp=2), (2, 1, 2)),
    (dict(tp=2, dp=1), (2, 2, 1)), (dict(tp=1, pp=1, dp=4), (1, 1, 4)),
])
def test_the_first_unset_of_dp_tp_pp_takes_what_is_left(no_launcher, given, want):
    (layout,), _ = layouts_of(_opts(**given), 4)
    assert (layout.tp, layout.pp, layout.dp) == want


def test_the_model_is_stored_as_text_for_run_json(no_launcher):
    assert _opts(model="TOY").model == "toy"
    text = "layers=2,hidden=32,ffn=64,heads=2,seq=4,batch=4"
    assert _opts(model=text).model == text
    with pytest.raises(OptionError, match="--model"):
        _opts(model="layers=2")


def test_default_micro_batches_split_the_replicas_batch():
    toy = PRESETS["toy"]  # batch 16
    assert default_micro_batches(toy, 1, 4) == 1
    assert default_micro_batches(toy, 2, 2) == 4
    assert default_micro_batches(toy, 4, 1) == 8
    # batch 12 over dp 2 leaves 6 samples: 2 x pp = 4 does not divide 6, so 6
    m = PRESETS["toy"].__class__(name="x", layers=4, hidden_size=8, ffn_size=8, heads=2,
                                 seq_len=2, batch=12)
    assert default_micro_batches(m, 2, 2) == 6


def test_exposed_time_goes_to_tp_and_pp_first_then_dp_takes_the_rest():
    lay = Layout(tp=2, pp=2, dp=2)
    assert attribute_exposed(100.0, {"tp": 30.0, "pp": 20.0, "dp": 90.0}, lay) == \
        {"tp": 30.0, "pp": 20.0, "dp": 50.0}
    # less exposed than tp and pp alone: they share what there is, dp none
    assert attribute_exposed(40.0, {"tp": 30.0, "pp": 20.0, "dp": 5.0}, lay) == \
        {"tp": 30.0, "pp": 10.0, "dp": 0.0}
    assert attribute_exposed(-5.0, {"tp": 30.0, "pp": 20.0, "dp": 5.0}, lay) == \
        {"tp": 0.0, "pp": 0.0, "dp": 0.0}
    # without replicas the rest is no dimension's
    assert attribute_exposed(100.0, {"tp": 30.0, "pp": 0.0, "dp": 0.0},
                             Layout(tp=4, pp=1, dp=1))["dp"] == 0.0


def test_the_bubble_is_pp_minus_1_micro_batches_of_forward_and_backward():
    assert bubble_time(Layout(tp=1, pp=4, dp=1, micro_batches=8), 800.0) == 300.0
    assert bubble_time(Layout(tp=1, pp=1, dp=4), 800.0) == 0.0


def test_a_large_model_is_checked_on_a_small_one_the_layout_fits():
    from distbench.planner.layouts import problems

    assert check_model(PRESETS["toy"], Layout(tp=2, pp=2, dp=1, micro_batches=4)) == \
        PRESETS["toy"]
    for lay in (Layout(tp=4, pp=2, dp=2, zero=3, micro_batches=4),
                Layout(tp=1, pp=8, dp=1, micro_batches=16)):
        small = check_model(PRESETS["7b"], lay)
        assert small.layers == 32 and small.params < 2e6
        assert problems(lay, small) == []
        assert small.gated  # the same MLP
        # grouped kv heads stay grouped: one kv head per TP rank
        grouped = check_model(PRESETS["70b"], lay)
        assert grouped.kv_heads == lay.tp < grouped.heads and problems(lay, grouped) == []


def test_recompute_reaches_every_layout_and_the_vocabulary_is_left_out(no_launcher):
    layouts, _ = layouts_of(_opts(recompute="full", zero="0,3"), 4)
    assert layouts and {lay.recompute for lay in layouts} == {"full"}
    opts = _opts(model="7b")
    assert model_of(opts).vocab == 0 and model_of(opts).params < PRESETS["7b"].params


def test_virtual_stages_keep_the_pipelines_and_default_to_whole_rounds(no_launcher):
    """Interleaved, every layout of the world with a pipeline the split fits: pp 1 has none
    to interleave; micro-batches default to 2 x pp x v (a multiple of pp, above pp x v)."""
    opts = _opts(model="layers=8,hidden=64,heads=4,seq=8,batch=16", virtual_stages=2,
                 zero="0,3")
    layouts, _ = layouts_of(opts, 4)
    got = [(x.tp, x.pp, x.dp, x.zero, x.micro_batches, x.virtual_stages) for x in layouts]
    assert got == [(1, 2, 2, 0, 8, 2), (1, 2, 2, 3, 8, 2), (1, 4, 1, 0, 16, 2),
                   (2, 2, 1, 0, 8, 2)]
    assert {x.schedule for x in layouts} == {"interleaved-1f1b"}
    assert Layout(tp=1, pp=2, dp=2).schedule == "1f1b"
    assert Layout(tp=1, pp=1, dp=4).schedule is None


@pytest.mark.parametrize("layers, pp, v, want", [
    # rank r holds stages r, r + pp, ...: each layers / (pp v) consecutive layers
    (8, 2, 2, {0: [(0, [0, 1]), (2, [4, 5])], 1: [(1, [2, 3]), (3, [6, 7])]}),
    (8, 4, 2, {0: [(0, [0]), (4, [4])], 1: [(1, [1]), (5, [5])], 2: [(2, [2]), (6, [6])],
               3: [(3, [3]), (7, [7])]}),
    (12, 2, 3, {0: [(0, [0, 1]), (2, [4, 5]), (4, [8, 9])],
                1: [(1, [2, 3]), (3, [6, 7]), (5, [10, 11])]}),
    (8, 2, 1, {0: [(0, [0, 1, 2, 3])], 1: [(1, [4, 5, 6, 7])]}),
])
def test_each_rank_holds_the_chunks_of_the_interleaved_placement(layers, pp, v, want):
    from distbench.planner.layouts import rank_chunks
    from distbench.planner.models import ModelSpec
    from distbench.steps.mesh_model import rank_layers

    got = {r: [(s, list(ls)) for s, ls in rank_chunks(layers, r, pp, v)] for r in range(pp)}
    assert got == want
    model = ModelSpec(name="m", layers=layers, hidden_size=8, ffn_size=16, heads=2, seq_len=4,
                      batch=16)
    lay = Layout(tp=1, pp=pp, dp=1, micro_batches=2 * pp, virtual_stages=v)
    held = sorted(i for r in range(pp) for i in rank_layers(model, lay, r))
    assert held == list(range(layers))  # every layer once


def test_the_interleaved_bubble_is_pp_minus_one_over_v_slots():
    plain = Layout(tp=1, pp=4, dp=1, micro_batches=8)
    inter = Layout(tp=1, pp=4, dp=1, micro_batches=8, virtual_stages=2)
    assert bubble_time(plain, 800.0) == 3 / 8 * 800
    assert bubble_time(inter, 800.0) == 3 / 16 * 800
    assert default_micro_batches(PRESETS["toy"], 2, 2, 2) == 8
    assert default_micro_batches(PRESETS["toy"], 2, 1, 2) == 8


def test_the_layout_keys_reach_every_layout(no_launcher):
    layouts, _ = layouts_of(_opts(zero="0,3", recompute="full", recompute_layers=1, sp=False,
                                  grad_sync="last"), 4)
    assert {(x.sp, x.recompute, x.recompute_layers, x.grad_sync) for x in layouts} == \
        {(False, "full", 1, "last")}
    # not given: each wrapper's default, FSDP2's sync of every micro-batch and DDP's at the last
    layouts, _ = layouts_of(_opts(zero="0,3"), 4)
    assert {(x.zero, x.grad_sync) for x in layouts} == {(0, "last"), (3, "micro")}
    assert all(x.sp for x in layouts) and {x.recompute for x in layouts} == {"none"}
    # without sequence parallelism a sequence tp does not split is run
    opts = _opts(tp=4, model="layers=2,hidden=64,heads=4,seq=6,batch=8", sp=False)
    (lay,), _ = layouts_of(opts, 4)
    assert (lay.tp, lay.sequence_parallel) == (4, False)
    assert layouts_of(_opts(recompute="op"), 4)[0][0].recompute == "op"


def test_a_pipeline_the_layers_do_not_divide_gives_the_ends_fewer(no_launcher):
    from distbench.steps.mesh_model import rank_layers

    toy = PRESETS["toy"]  # 4 layers
    (lay,), _ = layouts_of(_opts(pp=3), 3)
    assert (lay.pp, lay.micro_batches) == (3, 8)
    assert [rank_layers(toy, lay, r) for r in range(3)] == [[0], [1, 2], [3]]
    # every layout of 3 ranks the model fits: the pipeline alone (dp 3 splits no batch of 16)
    assert [(x.tp, x.pp, x.dp) for x in layouts_of(_opts(), 3)[0]] == [(1, 3, 1)]


def test_full_recomputation_of_k_layers_checkpoints_the_first_k_of_each_chunk():
    from dataclasses import replace

    from distbench.planner.models import ModelSpec
    from distbench.steps.mesh_model import layer_recompute

    model = ModelSpec(name="m", layers=8, hidden_size=8, ffn_size=16, heads=2, seq_len=4,
                      batch=16)
    lay = Layout(tp=1, pp=2, dp=1, micro_batches=4, recompute="full", recompute_layers=1)
    assert layer_recompute(model, lay, 0) == {0: "full", 1: "none", 2: "none", 3: "none"}
    inter = replace(lay, virtual_stages=2)  # rank 1 holds stages 1 and 3: layers 2-3, 6-7
    assert layer_recompute(model, inter, 1) == {2: "full", 3: "none", 6: "full", 7: "none"}
    assert set(layer_recompute(model, replace(lay, recompute_layers=0), 1).values()) == {"full"}
    assert set(layer_recompute(model, replace(lay, recompute="op", recompute_layers=0),
                               1).values()) == {"op"}
    # 5 layers on 2 stages (2 and 3): the first of each
    five = replace(model, layers=5)
    assert [layer_recompute(five, lay, r) for r in range(2)] == \
        [{0: "full", 1: "none"}, {2: "full", 3: "none", 4: "none"}]


@pytest.mark.parametrize("gated", [False, True])
def test_per_op_recomputation_computes_the_same_gradients(gated):
    """The policy reruns what it does not keep: the same gradients as keeping everything,
    and the matmuls it keeps are the odd ones of each layer's forward, in the recomputation
    too (else torch's checkpoint fails on a mismatch)."""
    import torch

    from distbench.planner.models import ModelSpec
    from distbench.steps.mesh_model import make_stage

    model = ModelSpec(name="m", layers=2, hidden_size=32, ffn_size=64, heads=4, kv_heads=2,
                      seq_len=8, batch=2, gated=gated)
    x = torch.randn(2, 8, 32)
    grads = {}
    for kind in ("none", "op"):
        stage = make_stage(model, range(2), torch.device("cpu"), torch.float32, recompute=kind)
        stage(x).square().mean().backward()
        grads[kind] = {n: p.grad for n, p in stage.named_parameters()}
    for name, g in grads["none"].items():
        torch.testing.assert_close(grads["op"][name], g)


def test_an_all_gather_counts_its_whole_output_as_nccl_tests_do():
    """DTensor's all-gather (a functional collective) is handed its input and the group's
    size; its bytes are the output's, as a reduce-scatter's are its input's (the design's byte
    accounting), so sequence parallelism's tp bytes are those of its gathered sequence."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from distbench.steps.comms import CommCounter

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        part = torch.zeros(8, 16)
        with CommCounter() as counter:
            funcol.all_gather_single(part, 0, dist.group.WORLD).wait()
            funcol.reduce_scatter_single(torch.zeros(32, 16), "sum", 0, dist.group.WORLD).wait()
    finally:
        dist.destroy_process_group()
    assert [(c.op, c.size_bytes) for c in counter.calls] == \
        [("all_gather", 32 * 16 * 4), ("reduce_scatter", 32 * 16 * 4)]
