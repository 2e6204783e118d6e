"""benchmarks/megatron_sc21.py: the paper's arithmetic (its FLOPs per iteration, the step time a
published TFLOP/s stands for, the layouts its scripts ran) and issue 46's bars on the published
runs, each predicted through `distbench plan`'s command line from the declared DGX A100 fabric
alone: the script's own command lines, run in this process (helpers.cli, one at a time; the
script runs them as processes), read back from the plan.csv each writes.
The tests that start processes: test_megatron_sc21_multiproc.py."""

from __future__ import annotations

import helpers
import pytest
from planner_helpers import fit, sc21

from distbench.planner import given
from distbench.planner.layouts import Layout
from distbench.planner.models import parse_model
from distbench.planner.predict import recompute_factor


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("sc21"))

BY_NAME = {r.name: r for r in sc21.ROWS}


def model_of(row):
    """The model the row's --model text names, as the CLI parses it."""
    return parse_model("--model", sc21.model_arg(row))


def layout_of(row):
    """The layout the row's --layout text names on its GPUs, as the CLI resolves it."""
    [named] = given.parse("--layout", sc21.layout_arg(row))
    return given.resolve(named, model_of(row), row.gpus, 8)


def test_the_papers_flops_on_a_hand_case():
    # 96 x 1 x 6 x 1 x 1 x (1 + 6/6 + 16/16)
    assert sc21.paper_flops(batch=1, seq=6, layers=1, hidden=1, vocab=16) == 96 * 6 * 3


def test_the_papers_flops_are_the_planners_with_full_recomputation_and_the_head():
    row = BY_NAME["145.6B"]
    model, layout = model_of(row), layout_of(row)
    tokens = row.batch * sc21.SEQ
    planner = (row.layers * model.flops_per_layer(tokens)
               * recompute_factor(model, layout, tokens) + model.head_flops(tokens))
    assert sc21.paper_flops(row.batch, sc21.SEQ, row.layers, row.hidden, sc21.VOCAB) \
        == pytest.approx(planner, rel=1e-12)


def test_a_published_rate_is_a_step_time():
    row = sc21.TABLE1[0]  # 1.7B: 137 TFLOP/s a GPU on 32
    flops = 96 * 512 * 2048 * 24 * 2304 ** 2 * (1 + 2048 / (6 * 2304)
                                                 + 51200 / (16 * 24 * 2304))
    assert sc21.published_step_s(row) == pytest.approx(flops / (137e12 * 32))
    assert sc21.published_step_s(row) == pytest.approx(3.53, abs=0.005)


def test_the_command_lines_name_megatrons_model_and_trainer():
    row = BY_NAME["145.6B"]
    argv = sc21.plan_argv(row, 0.6, "OUT")
    assert argv[:3] == ["plan", "--fabric", "dgx-a100"]
    assert dict(zip(argv[1::2], argv[2::2], strict=True)) == {
        "--fabric": "dgx-a100", "--gpus": "1536", "--dtype": "bfloat16",
        "--model": "layers=80,hidden=12288,heads=96,ffn=49152,seq=2048,vocab=51200,batch=2304,"
                   "attention=unfused",
        "--trainer": "megatron", "--zero": "0",
        "--layout": "tp=8,pp=8,mbs=2,recompute=full,v=2,sp=0,dp_overlap=0",
        "--mfu": "0.6", "--out": "OUT"}
    assert not model_of(row).fused_attention
    # DeepSpeed's ZeRO-3 is no Megatron layout: torch's FSDP2, not overlapped
    zero3 = sc21.plan_argv(BY_NAME["ZeRO-3 768"], 0.6, "OUT")
    zero3 = dict(zip(zero3[1::2], zero3[2::2], strict=True))
    assert (zero3["--trainer"], zero3["--zero"]) == ("torch", "3")
    assert zero3["--layout"] == "tp=1,pp=1,zero=3,mbs=2,recompute=full,dp_overlap=0"


def test_attention_is_a_model_key_written_back_and_checked(tmp_path):
    from distbench.planner.models import model_text

    text = sc21.model_arg(BY_NAME["1.7B"])
    assert model_text(parse_model("--model", text)).endswith(",attention=unfused")
    assert parse_model("--model", text.replace("unfused", "fused")).fused_attention
    # fused is the default, and not written
    assert "attention" not in model_text(parse_model("--model", text.replace(
        ",attention=unfused", ",attention=fused")))
    line = helpers.refused(tmp_path, "plan", "--fabric", "dgx-a100", "--gpus", "8", "--model",
                           text.replace("unfused", "flash"))
    assert "--model: attention='flash' is not one of fused, unfused" in line, line


def test_the_layouts_are_the_scripts():
    megatron_2021 = dict(recompute="full", sp=False, dp_overlap=False)
    assert layout_of(BY_NAME["145.6B"]) == Layout(
        tp=8, pp=8, dp=24, micro_batches=48, virtual_stages=2, **megatron_2021)
    assert layout_of(BY_NAME["529.6B"]) == Layout(
        tp=8, pp=35, dp=9, micro_batches=280, virtual_stages=3, **megatron_2021)
    assert layout_of(BY_NAME["1008.0B"]).virtual_stages == 1
    assert layout_of(BY_NAME["ZeRO-3 768"]) == Layout(
        tp=1, pp=1, dp=768, zero=3, micro_batches=1, recompute="full", dp_overlap=False)
    assert model_of(BY_NAME["PTD-P 384"]).params == pytest.approx(174.6e9, rel=0.005)


@pytest.fixture(scope="module")
def results(fitted):
    return fitted[1]


def test_the_fit_row_alone_is_in_sample_and_predicted_to_the_fits_tolerance(fitted, results):
    mfu, _ = fitted
    inside = [r for r in results if r["in_sample"]]
    assert [r["row"].name for r in inside] == [sc21.FIT_ROW]
    assert abs(inside[0]["error_pct"]) <= sc21.FIT_TOL * 100
    # every row ran at the fraction written, the one fitted
    assert all(f"--mfu {sc21.mfu_arg(mfu)} " in r["command"] for r in results)


def test_table_1_every_row_out_of_sample_within_15_percent(results):
    off = {r["row"].name: round(r["error_pct"], 1) for r in results
           if r["row"].table == "1" and not r["in_sample"]
           and abs(r["error_pct"]) > sc21.TABLE1_BAR}
    assert not off


def test_table_2_ptdp_within_20_percent_and_within_10_percent_as_the_gpus_double(results):
    ptdp = [r for r in results if r["row"].table == "2" and r["row"].scored]
    assert [r["row"].gpus for r in ptdp] == [384, 768, 1536]
    off = {r["row"].name: round(r["error_pct"], 1) for r in ptdp
           if abs(r["error_pct"]) > sc21.TABLE2_BAR}
    assert not off
    rates = [r["predicted_tflops"] for r in ptdp]
    assert max(rates) / min(rates) - 1 <= sc21.PTDP_SPREAD / 100


def test_every_layout_megatron_ran_fits_with_its_trainer(results):
    # issue 46's bar on planner/megatron_memory.py (`--trainer megatron`): Megatron ran every
    # one of these, so a plan that judges one not to fit is wrong. Not an expected failure:
    # with torch's memory priced instead (a receive buffer per micro-batch), 529.6B, 1T and
    # PTD-P on 384 GPUs came out over the A100's 80 GB
    megatron = [r for r in results if r["row"].scored]
    assert len(megatron) == 9 and all(r["trainer"] == "megatron" for r in megatron)
    over = {r["row"].name: f"{r['memory_gib']:.1f} GiB of {r['limit_gib']:.1f}"
            for r in megatron if not r["fits"]}
    assert not over


def test_table_2_zero3_is_unscored_but_falls_as_the_gpus_double(results):
    zero3 = [r for r in results if not r["row"].scored]
    assert [(r["row"].zero, r["row"].gpus) for r in zero3] == [(3, 384), (3, 768), (3, 1536)]
    rates = [r["predicted_tflops"] for r in zero3]
    assert rates[0] > rates[1] > rates[2]
    # each halving of the samples a GPU costs over 5% of the rate, not a rounding's worth
    assert all(b < 0.95 * a for a, b in zip(rates, rates[1:], strict=False))
    # retired from the bar: no check reads their error, and the MAPE leaves them out
    lines = sc21.table_lines(0.6, results)
    assert not any(r["row"].name in line for r in zero3 for line in lines if "holds" in line
                   or "FAILS" in line)
    assert all(f"({r['error_pct']:+.1f}%)" in "\n".join(lines) for r in zero3)


def test_the_bars_the_script_prints_are_the_tests(results):
    assert all(ok for _, ok in sc21.checks(results)), sc21.checks(results)
