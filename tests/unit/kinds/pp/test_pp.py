"""pp's pure logic: stage split, analytic bubble, p2p byte accounting, the shape and the model,
the check's pairs; and on the fake group, a schedule the ranks cannot run."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
import torch
from helpers import refused, resolved

from distbench.kinds.pp.options import PPOptions
from distbench.kinds.pp.output import OUTPUT
from distbench.parallel import pipeline
from distbench.steps import pp_model, reference
from distbench.steps.stacks import PipelineShape, make_layer


@pytest.mark.parametrize(("layers", "stages", "want"), [
    (4, 2, [2, 2]), (5, 2, [3, 2]), (7, 3, [3, 2, 2]), (8, 3, [3, 3, 2]), (6, 6, [1] * 6),
    (7, 6, [2, 1, 1, 1, 1, 1]), (9, 4, [3, 2, 2, 2]),
])
def test_split_is_contiguous_and_as_even_as_possible(layers, stages, want):
    assert pipeline.split_layers(layers, stages) == want
    ranges = pipeline.stage_ranges(layers, stages)
    assert [len(r) for r in ranges] == want
    assert [i for r in ranges for i in r] == list(range(layers))  # contiguous, in order
    assert pp_model.layers_per_stage_text(layers, stages) == "/".join(map(str, want))


def test_split_refuses_fewer_layers_than_stages():
    with pytest.raises(ValueError, match="cannot fill"):
        pipeline.split_layers(3, 4)


def test_interleaved_stages_live_on_rank_s_mod_world():
    assert pipeline.num_stages("interleaved-1f1b", 3, 2) == 6
    assert pipeline.stages_of_rank("interleaved-1f1b", 0, 3, 2) == [0, 3]
    assert pipeline.stages_of_rank("interleaved-1f1b", 2, 3, 2) == [2, 5]
    for schedule in ("naive", "gpipe", "1f1b"):
        assert pipeline.num_stages(schedule, 3, 2) == 3
        assert pipeline.stages_of_rank(schedule, 1, 3, 2) == [1]


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (3, 6, 2), (4, 8, 3), (8, 32, 4), (1, 4, 2)])
def test_analytic_bubble(p, m, v):
    exact = {
        "naive": Fraction(p - 1, p),
        "gpipe": Fraction(p - 1, m + p - 1),
        "1f1b": Fraction(p - 1, m + p - 1),
        "interleaved-1f1b": Fraction(p - 1, v * m + p - 1),
    }
    for schedule, want in exact.items():
        assert pp_model.analytic_bubble(schedule, p, m, v) == pytest.approx(float(want), abs=1e-15)


def test_analytic_bubble_known_values():
    assert pp_model.analytic_bubble("gpipe", 2, 4) == pytest.approx(0.2)
    assert pp_model.analytic_bubble("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert pp_model.analytic_bubble("interleaved-1f1b", 2, 4, 2) == pytest.approx(1 / 9)
    assert pp_model.analytic_bubble("naive", 4, 100) == pytest.approx(0.75)  # m does not help naive
    with pytest.raises(ValueError):
        pp_model.analytic_bubble("zero-bubble", 2, 4)


def test_p2p_bytes_count_both_directions_over_every_boundary():
    # 2 stages, 8 samples x 32 tokens x 1024 float32: one boundary, activation + gradient
    assert pp_model.p2p_bytes_per_step(2, 8, 32, 1024, 4) == 2 * 8 * 32 * 1024 * 4
    # 6 stages (3 ranks x 2 virtual): 5 boundaries
    assert pp_model.p2p_bytes_per_step(6, 6, 16, 256, 2) == 5 * 2 * 6 * 16 * 256 * 2
    assert pp_model.p2p_bytes_per_step(1, 8, 32, 1024, 4) == 0


def _shape(**kw) -> PipelineShape:
    base = dict(hidden_size=32, seq_len=4, micro_batch_size=2, micro_batches=3, layers=3,
                dtype="float32")
    return PipelineShape(**{**base, **kw})


def test_the_shape_takes_the_options_names():
    opts = PPOptions(hidden_size=48, seq_len=6, micro_batch_size=2, micro_batches=5, layers=7,
                     dtype="bfloat16", virtual_stages=3)
    sh = PipelineShape.from_options(opts)
    assert sh == _shape(hidden_size=48, seq_len=6, micro_batch_size=2, micro_batches=5,
                        layers=7, dtype="bfloat16", virtual_stages=3)
    assert sh.seed == 1234  # not an option: the default
    assert (sh.samples, sh.elt_size, sh.torch_dtype) == (10, 2, torch.bfloat16)
    # the shape's names are pp.csv's own
    assert set(sh.to_json()) - {"dtype", "seed"} <= set(OUTPUT.csv)


def test_check_runs_on_the_measured_shape_when_small_else_a_small_one():
    small = _shape()
    assert pp_model.check_shape(small) is small
    big = _shape(hidden_size=1024, seq_len=128, micro_batch_size=1, micro_batches=8, layers=8)
    c = pp_model.check_shape(big)
    assert (c.hidden_size, c.seq_len, c.micro_batch_size) == (
        pp_model.SMALL_HIDDEN, pp_model.SMALL_SEQ, 1)
    assert (c.layers, c.micro_batches, c.dtype) == (8, 8, "float32")


def test_a_layer_depends_only_on_seed_and_index():
    shape, cpu = _shape(), torch.device("cpu")
    a, b = make_layer(1, shape, cpu), make_layer(1, shape, cpu)
    c = make_layer(2, shape, cpu)
    torch.manual_seed(99)  # the global RNG plays no part
    d = make_layer(1, shape, cpu)
    for pa, pb, pc, pd in zip(a.parameters(), b.parameters(), c.parameters(), d.parameters(),
                              strict=True):
        assert torch.equal(pa, pb) and torch.equal(pa, pd)
        assert not torch.equal(pa, pc)
    other = make_layer(1, replace(shape, seed=7), cpu)
    assert not torch.equal(a.fc1.weight, other.fc1.weight)


class _FakePipe:
    """What pp_vs_reference() reads of a pipeline: the layers a rank holds, their grads and the
    loss."""

    def __init__(self, shape, indices, holds_last):
        self.shape = shape
        full = pp_model.SingleRank(shape, torch.device("cpu"))
        full.step()
        self.layers = {i: full.layer(i) for i in indices}
        self.holds_last = holds_last
        self.loss = full.loss


def _compare(pipe, ref) -> reference.TensorCheck:
    return reference.check_tensors(pp_model.pp_vs_reference(pipe, ref),
                                   reference.RTOL["pp"][pipe.shape.dtype])


def test_pairs_hold_the_rank_s_gradients_then_the_loss():
    shape = _shape()
    ref = pp_model.SingleRank(shape, torch.device("cpu"))
    ref.step()
    pairs = pp_model.pp_vs_reference(_FakePipe(shape, [1, 2], holds_last=True), ref)
    assert [name for name, _, _ in pairs] == [
        f"layer {i} {p} grad" for i in (1, 2) for p in ("fc1.weight", "fc1.bias", "fc2.weight",
                                                        "fc2.bias")] + ["loss"]
    assert pairs[0][2] is ref.layer(1).fc1.weight.grad
    first_rank = pp_model.pp_vs_reference(_FakePipe(shape, [0], holds_last=False), ref)
    assert [name for name, _, _ in first_rank][-1] == "layer 0 fc2.bias grad"  # no loss here


def test_compare_accepts_equal_gradients_and_catches_a_corrupted_one():
    shape = _shape()
    ref = pp_model.SingleRank(shape, torch.device("cpu"))
    ref.step()
    pipe = _FakePipe(shape, [1, 2], holds_last=True)
    ok = _compare(pipe, ref)
    assert ok.wrong == 0 and ok.max_abs_err == 0.0

    # what the corrupt-rank fault does, on a copy of the first gradient as the check does
    (name, got, want), *rest = pp_model.pp_vs_reference(pipe, ref)
    got = got.clone()
    got.view(-1)[0] += 1
    bad = reference.check_tensors([(name, got, want), *rest], reference.RTOL["pp"][shape.dtype])
    assert bad.wrong == 1 and bad.max_abs_err == pytest.approx(1.0, rel=1e-3)


def test_compare_catches_a_wrong_loss_and_a_small_relative_error():
    shape = _shape()
    ref = pp_model.SingleRank(shape, torch.device("cpu"))
    ref.step()
    pipe = _FakePipe(shape, [0], holds_last=True)
    pipe.loss = pipe.loss * 1.01
    assert _compare(pipe, ref).wrong == 1
    # gradients are small (mean loss): 1e-3 of their own scale is still wrong
    pipe = _FakePipe(shape, [0], holds_last=False)
    g = pipe.layers[0].fc1.weight.grad
    g.view(-1)[0] += 1e-3 * float(g.abs().max())
    assert _compare(pipe, ref).wrong == 1


def test_pp_options_reach_the_command(tmp_path):
    opts = resolved(tmp_path, "pp", "--schedule", "gpipe,interleaved-1f1b", "--micro-batches",
                    "4", "--layers", "5", "--workers", "2", "--virtual-stages", "2")
    assert opts.schedules == ["gpipe", "interleaved-1f1b"]
    assert (opts.micro_batches, opts.layers, opts.virtual_stages) == (4, 5, 2)


@pytest.mark.parametrize(("args", "option"), [
    (["--workers", "1"], "--workers"),
    (["--workers", "2", "--layers", "3"], "--layers"),  # 2 ranks x 2 virtual stages = 4 stages
    (["--schedule", "zero-bubble"], "--schedule"),
    (["--micro-batches", "0"], "--micro-batches"),
])
def test_bad_pp_option_is_one_line_and_exit_2(tmp_path, args, option):
    err = refused(tmp_path, "pp", *args)  # one line, and no worker was started
    assert err.startswith(f"distbench: error: {option}:")


# ---- a schedule that cannot run: a skipped row, and the next schedule still runs ---------------

def _rows_on(rank: int, opts) -> list[dict]:
    """Each schedule's row as rank `rank` of two measures it, as pp.run does."""
    from fake_session import FakeSession, fake_runtime

    from distbench.steps import pp as steps

    s = FakeSession(fake_runtime(rank, 2), opts)
    shape = PipelineShape.from_options(opts)
    bad: list[str] = []
    rows = [steps._measure_schedule(s, schedule, shape, shape, None, 0.001, bad)
            for schedule in opts.schedules]
    assert bad == []
    return rows


def test_a_schedule_that_cannot_run_is_a_skipped_row(tmp_path, monkeypatch):
    from fake_group import run_ranks

    from distbench.core.tables import format_table

    # interleaved 1F1B on 2 ranks: 5 micro-batches make 2 rounds, and 5 is not a multiple of 2
    opts = resolved(tmp_path, "pp", "--workers", "2", "--schedule", "interleaved-1f1b,gpipe",
                    "--micro-batches", "5", "--hidden-size", "64", "--seq-len", "8",
                    "--layers", "4", "--iters", "2", "--warmup", "1", "--no-check")
    # the fake group has no point-to-point: gpipe's stages are built, its step does nothing
    monkeypatch.setattr(pipeline.TorchPipeline, "step", lambda self: None)
    r0, r1 = run_ranks(monkeypatch, 2, lambda rank: _rows_on(rank, opts))
    for inter, gpipe in (r0, r1):  # every rank skips it, for the same reason
        assert inter["schedule"] == "interleaved-1f1b" and inter["status"] == "skipped"
        assert "multiple of the number of rounds" in inter["note"]
        assert "step_us" not in inter and inter["layers_per_stage"] == "1/1/1/1"
        assert gpipe["status"] == "ok" and gpipe["step_us"] > 0
        assert gpipe["bubble_analytic"] == pytest.approx(1 / 6, rel=1e-5)
    assert r0[0]["note"] == r1[0]["note"]
    (line,) = format_table(OUTPUT.console, [r0[0]])
    assert "skipped" in line
