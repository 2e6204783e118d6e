"""benchmarks/megatron_sc21.py: the paper's arithmetic (its FLOPs per iteration, the step time a
published TFLOP/s stands for, the layouts its scripts ran) and issue 31's bars on the published
runs, predicted from the declared DGX A100 fabric alone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from distbench.planner.layouts import Layout
from distbench.planner.predict import recompute_factor

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "megatron_sc21.py"
_spec = importlib.util.spec_from_file_location("megatron_sc21", PATH)
sc21 = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("megatron_sc21", sc21)  # dataclasses look their module up there
_spec.loader.exec_module(sc21)


def test_the_papers_flops_on_a_hand_case():
    # 96 x 1 x 6 x 1 x 1 x (1 + 6/6 + 16/16)
    assert sc21.paper_flops(batch=1, seq=6, layers=1, hidden=1, vocab=16) == 96 * 6 * 3


def test_the_papers_flops_are_the_planners_with_full_recomputation_and_the_head():
    row = sc21.TABLE1[3]  # 145.6B
    model, layout = sc21.model_of(row), sc21.layout_of(row)
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


def test_the_layouts_are_the_scripts():
    by_name = {r.name: r for r in sc21.ROWS}
    assert sc21.layout_of(by_name["145.6B"]) == Layout(
        tp=8, pp=8, dp=24, micro_batches=48, recompute="full", virtual_stages=2)
    assert sc21.layout_of(by_name["529.6B"]) == Layout(
        tp=8, pp=35, dp=9, micro_batches=280, recompute="full", virtual_stages=3)
    assert sc21.layout_of(by_name["1008.0B"]).virtual_stages == 1
    assert sc21.layout_of(by_name["ZeRO-3 768"]) == Layout(
        tp=1, pp=1, dp=768, zero=3, micro_batches=1, recompute="full")
    assert sc21.model_of(by_name["PTD-P 384"]).params == pytest.approx(174.6e9, rel=0.005)


@pytest.fixture(scope="module")
def results():
    mfu, rows = sc21.evaluate()
    assert 0 < mfu < 1
    return rows


def test_the_fit_row_alone_is_in_sample_and_predicted_exactly(results):
    inside = [r for r in results if r["in_sample"]]
    assert [r["row"].name for r in inside] == [sc21.FIT_ROW]
    assert inside[0]["error_pct"] == pytest.approx(0, abs=1e-6)


def test_table_1_every_row_out_of_sample_within_15_percent(results):
    off = {r["row"].name: round(r["error_pct"], 1) for r in results
           if r["row"].table == "1" and not r["in_sample"]
           and abs(r["error_pct"]) > sc21.TABLE1_BAR}
    assert not off


def test_table_2_ptdp_within_20_percent_and_within_10_percent_as_the_gpus_double(results):
    ptdp = [r for r in results if r["row"].table == "2" and r["row"].zero == 0]
    assert len(ptdp) == 3
    assert all(abs(r["error_pct"]) <= sc21.TABLE2_BAR for r in ptdp)
    rates = [r["predicted_tflops"] for r in ptdp]
    assert max(rates) / min(rates) - 1 <= sc21.PTDP_SPREAD / 100


def test_table_2_zero3_falls_as_the_gpus_double(results):
    rates = [r["predicted_tflops"] for r in results if r["row"].zero == 3]
    assert len(rates) == 3 and rates[0] > rates[1] > rates[2]


@pytest.mark.xfail(strict=True, reason="DeepSpeed's ZeRO-3 of 2021 fell to 88 and 44 TFLOP/s "
                   "on 768 and 1536 GPUs, 8x slower collectives than NCCL's ring reaches on 8 "
                   "HDR NICs a node; the model predicts -44% and -68% there (docs/plan.md)")
def test_table_2_zero3_within_20_percent(results):
    zero3 = [r for r in results if r["row"].zero == 3]
    assert all(abs(r["error_pct"]) <= sc21.TABLE2_BAR for r in zero3)
