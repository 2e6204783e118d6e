"""What `plan --validate K` says of what it ran (issue 31): layouts out of sample first, what
was capped, and no rank correlation over too few layouts. The real runs:
test_plan_multiproc.py. And the numbers a plan is asked with, as typed (issue 46): a digit
of another script (`layers=８`, which int() reads as 8) and `kv_heads=0` (dropped silently)
refused in one line, as a declared fabric's bad figures are (test_plan_fabric.py)."""

from __future__ import annotations

from pathlib import Path

import helpers
import pytest

from distbench.core.options import OptionError
from distbench.planner import given
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec, parse_model
from distbench.planner.ranking import (
    MIN_RANKED,
    label,
    make_plan,
    pick_validation,
    validation_lines,
    validation_md,
    validation_notes,
)

MODEL = ModelSpec(name="custom", layers=4, hidden_size=64, ffn_size=256, heads=4, seq_len=16,
                  batch=32)


def _rows(world: int = 4) -> list[dict]:
    fits = [CommFit(op=op, ranks=n, span="node", alpha_us=10.0, beta_gbps=1.0)
            for op in ("all_reduce", "all_gather", "reduce_scatter") for n in (2, 4)]
    fits.append(CommFit(op="sendrecv", ranks=2, span="node", alpha_us=5.0, beta_gbps=4.0))
    inputs = Inputs(fits=fits, compute=[ComputePoint(
        tp=1, tokens=4 * MODEL.seq_len, layer_us=100.0,
        flops=MODEL.flops_per_layer(4 * MODEL.seq_len, 1))], compute_model={
            "hidden_size": 64, "ffn_size": 256, "heads": 4, "seq_len": 16},
        overlap={"ddp": 0.5, "zero1": 0.5, "zero2": 0.5, "zero3": 0.5})
    return make_plan(MODEL, inputs, world, world, 80 * 2**30, "float32")


def _calibrated(rows: list[dict]) -> set[str]:
    """The labels plan's workers (kinds/plan/workers.py) measure its figures on: the pure DP
    layouts at each ZeRO stage and the two pure pipelines (m = pp, and the fewest from 2 pp up
    that split the batch of 32)."""
    world = rows[0]["world_size"]
    return {Layout(tp=1, pp=1, dp=world, zero=z).label() for z in range(4)} | {
        Layout(tp=1, pp=world, dp=1, micro_batches=m).label() for m in (world, 2 * world)}


def test_validation_runs_layouts_out_of_sample_first():
    """--validate 3 picked both in-sample pipeline calibration layouts: the best half, then
    the layouts unlike them, whatever was measured on them."""
    rows = _rows()
    calibrated = _calibrated(rows)
    # a calibration layout is among the 6 predicted best (with m a plan dimension at every pp,
    # one: the m = 2 pp pipeline), so picking by rank alone would take it
    best = [label(r) for r in rows if r["fits"]][:6]
    assert calibrated & set(best), best
    outside = [r for r in rows if r["fits"] and label(r) not in calibrated]
    for k in (1, 3, 6, len(outside)):
        picked = pick_validation(rows, k, 4, calibrated)
        assert len(picked) == k
        assert not {label(r) for r in picked} & calibrated, [label(r) for r in picked]
    # past the layouts out of sample, in-sample ones are added, and said
    picked = pick_validation(rows, len(outside) + 2, 4, calibrated)
    assert len(picked) == len(outside) + 2
    inside = [label(r) for r in picked if label(r) in calibrated]
    assert len(inside) == 2 and [label(r) for r in picked[-2:]] == inside
    notes = validation_notes(len(outside) + 2, picked, calibrated, world=4, fitting=len(
        [r for r in rows if r["fits"]]))
    assert any(all(x in n for x in inside) and "in sample" in n for n in notes), notes


def test_a_capped_validation_says_so():
    """--validate 1000 ran 9 layouts without a word."""
    rows = _rows()
    fitting = [r for r in rows if r["fits"] and r["world_size"] == 4]
    picked = pick_validation(rows, 1000, 4, set())
    assert len(picked) == len(fitting)
    notes = validation_notes(1000, picked, set(), world=4, fitting=len(fitting))
    assert any("--validate 1000" in n and f"{len(fitting)} layouts" in n for n in notes), notes
    assert validation_notes(2, picked[:2], set(), world=4, fitting=len(fitting)) == []


def test_no_rank_correlation_is_printed_over_too_few_layouts():
    """"Spearman 1.00" over 2 layouts, where it can only be +1 or -1."""
    two = validation_lines([(10.0, 11.0), (20.0, 19.0)], [(10.0, 11.0), (20.0, 19.0)])
    text = " ".join(two)
    assert "Spearman" not in text and "rank correlation" in text, text
    assert f"fewer than {MIN_RANKED}" in text, text
    four = [(10.0, 11.0), (20.0, 19.0), (30.0, 33.0), (40.0, 38.0)]
    text = " ".join(validation_lines(four, four))
    assert "Spearman 1.00" in text and "MAPE" in text, text


def test_validation_table_tells_layouts_apart_by_recomputation():
    # on one GPU every layout is tp1 pp1 dp1: only m and the recomputation tell them apart, and
    # the first H200's table printed 'none' and 'selective' at m 2 both as 1/1/1/0/2
    base = {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "micro_batches": 2, "virtual_stages": 1,
            "predicted_step_ms": 10.0, "measured_step_ms": 10.0, "error_pct": 0.0,
            "in_sample": 0, "status": "ok"}
    text = validation_md({"layouts": [{**base, "recompute": "none"},
                                      {**base, "recompute": "selective"}]}, [], [])
    assert "| tp1 pp1 dp1 zero0 m2 |" in text
    assert "| tp1 pp1 dp1 zero0 m2 rc-selective |" in text


# ---------------------------------------------------------------------------------------------
# The numbers a plan is asked with, as typed

SHAPE = "layers=4,hidden=128,heads=4,seq=32,batch=16"


@pytest.mark.parametrize("text,needle", [
    (SHAPE.replace("layers=4", "layers=\uff18"),  # a full-width 8
     "layers='\uff18' is not a whole number in ASCII digits"),
    (SHAPE.replace("batch=16", "batch=1\u0666"),  # an Arabic-Indic 6
     "batch='1\u0666' is not a whole number in ASCII digits"),
    (SHAPE + ",kv_heads=0", "kv_heads must be at least 1, got 0 (leave kv_heads out for as "
     "many as heads)"),
    (SHAPE + ",vocab=\uff10", "vocab='\uff10' is not a whole number in ASCII digits"),
])
def test_a_model_number_of_another_script_or_kv_heads_0_is_refused(text, needle):
    with pytest.raises(OptionError, match="^--model: ") as e:
        parse_model("--model", text)
    assert needle in str(e.value)


def test_vocab_and_gated_may_still_be_0_and_kv_heads_left_out():
    spec = parse_model("--model", SHAPE + ",vocab=0,gated=0")
    assert (spec.vocab, spec.gated, spec.kv_heads) == (0, False, 4)
    assert spec == parse_model("--model", SHAPE)
    assert parse_model("--model", SHAPE + ",kv_heads=2").kv_heads == 2


@pytest.mark.parametrize("text", ["tp=\uff12", "pp=2,m=\uff14", "dp=\u0968"])
def test_a_layout_number_of_another_script_is_refused(text):
    with pytest.raises(OptionError, match="^--layout: ") as e:
        given.canonical("--layout", text)
    key, _, value = text.split(",")[-1].partition("=")
    assert f"{key}={value} in {text!r} must be a whole number" in str(e.value)


@pytest.mark.parametrize("option,value,needle", [
    ("--model", SHAPE.replace("layers=4", "layers=\uff18"), "in ASCII digits"),
    ("--model", SHAPE + ",kv_heads=0", "kv_heads must be at least 1"),
    ("--layout", "tp=\uff18", "must be a whole number"),
])
def test_a_number_as_typed_is_refused_in_one_line_and_nothing_made(tmp_path: Path, option,
                                                                    value, needle):
    args = {"--model": SHAPE, "--layout": "dp=8", option: value}
    got = helpers.cli(tmp_path, "plan", "--fabric", "dgx-a100", "--gpus", "8", "--dtype",
                      "bfloat16", *(x for kv in args.items() for x in kv),
                      "--out", str(tmp_path / "out"), dispatch=True)
    line = helpers.assert_one_line_error(got, None, option, ours=True)
    assert needle in line, line
    assert not (tmp_path / "out").exists()
