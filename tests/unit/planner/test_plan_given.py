"""`plan --layout`: layouts the user names, in Megatron's terms, predicted beside the ranked list
(planner/given.py), and `plan --recompute`. Nothing started; the workers' path:
test_plan_given_multiproc.py."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import helpers
import pytest
from plan_helpers import MODEL, hand_inputs, one_row, plan

from distbench.core.options import OptionError
from distbench.planner import given
from distbench.planner.assemble import plan_rows
from distbench.planner.inputs import CommFit
from distbench.planner.layouts import Layout, micro_batch_counts
from distbench.planner.ranking import make_plan, pick_validation, ranked

MEMORY = 80 * 2**30
COLUMNS = ("predicted_step_ms", "compute_ms", "tp_comm_ms", "pp_comm_ms", "bubble_ms",
           "dp_comm_ms", "dp_exposed_ms", "optimizer_ms", "memory_per_rank_bytes",
           "micro_batch_size", "fits")


def _resolve(text: str, model=MODEL, gpus: int = 4, per_node: int = 4) -> Layout:
    (layout,) = given.resolve_all(given.canonical("--layout", text), model, gpus, per_node)
    return layout


# ---------------------------------------------------------------------------------------------
# Megatron's terms to a layout

def test_mbs_gives_the_micro_batch_count_from_the_global_batch_and_dp_the_gpus_left():
    # MODEL's global batch is 32 samples: dp 2 x mbs 4 leaves 4 micro-batches
    assert _resolve("tp=2,zero=1,mbs=4,recompute=full") == Layout(
        tp=2, pp=1, dp=2, zero=1, micro_batches=4, recompute="full")
    assert _resolve("pp=2,dp=2,m=4") == Layout(tp=1, pp=2, dp=2, micro_batches=4)
    # both, when they agree; neither: step's default count (1 without a pipeline)
    assert _resolve("dp=4,mbs=2,m=4") == _resolve("dp=4,m=4")
    assert _resolve("dp=4").micro_batches == 1


def test_layouts_repeat_or_split_on_semicolons_and_are_stored_in_one_order():
    assert given.canonical("--layout", ["recompute=full,tp=2", "pp=2 ; dp=4,m=8"]) == \
        "tp=2,recompute=full;pp=2;dp=4,m=8"
    assert given.canonical("--layout", None) is None
    assert given.canonical("--layout", []) is None


@pytest.mark.parametrize("text,needle", [
    ("tp=2,foo=1", "unknown key 'foo'"),
    ("tp=2,tp=4", "tp is given twice"),
    ("tp=two", "tp=two in 'tp=two' must be a whole number"),
    ("tp=0", "tp=0 in 'tp=0' must be a whole number, at least 1"),
    ("zero=4", "zero=4 in 'zero=4' is not a ZeRO stage"),
    ("recompute=most", "recompute=most in 'recompute=most' is not one of"),
    ("tp=2;", "an empty layout"),
    ("tp", "'tp' in 'tp' is not key=value"),
])
def test_a_malformed_layout_names_the_bad_key(text, needle):
    with pytest.raises(OptionError, match="^--layout: ") as e:
        given.canonical("--layout", text)
    assert needle in str(e.value)


@pytest.mark.parametrize("text,needle", [
    ("tp=8", "tp=8 in 'tp=8' must divide the 4 GPUs per node"),          # beyond a node
    ("tp=3", "tp=3 in 'tp=3' must divide the 4 GPUs per node"),
    ("tp=2,pp=2,dp=2", "tp x pp x dp = 2 x 2 x 2 = 8 in 'tp=2,pp=2,dp=2', but the plan is "
     "for 4 GPUs"),
    ("pp=3", "tp x pp = 3 in 'pp=3' does not divide the 4 GPUs"),
    ("dp=4,mbs=3", "dp x mbs = 4 x 3 in 'dp=4,mbs=3' does not divide the global batch of 32"),
    ("dp=4,mbs=2,m=2", "m=2 and mbs=2 in 'dp=4,mbs=2,m=2' disagree: dp x mbs x m = 4 x 2 x 2"
     " = 16, not the global batch of 32"),
    ("dp=4,m=3", "dp x micro-batches (4 x 3) must divide the batch (32)"),
    ("pp=4,dp=1,m=2", "the 1F1B schedule needs at least pp (4) micro-batches"),
    ("dp=1,tp=4,zero=1", "ZeRO 1 shards over data-parallel replicas; dp is 1"),
])
def test_a_layout_that_cannot_run_here_is_refused_naming_why(text, needle):
    with pytest.raises(OptionError, match="^--layout: ") as e:
        _resolve(text)
    assert needle in str(e.value)


def test_tp_must_divide_the_heads_and_pp_is_at_most_the_layers():
    with pytest.raises(OptionError, match="tp 8 must divide the heads \\(4\\)"):
        _resolve("tp=8", gpus=8, per_node=8)
    # a pp that does not divide the layers is uneven stages (the ends hold fewer); more
    # stages than layers is no layout
    assert _resolve("pp=3,m=8", gpus=6, per_node=6).pp == 3
    with pytest.raises(OptionError, match="pp 5 is more stages than the layers \\(4\\)"):
        _resolve("pp=5,m=8", gpus=5, per_node=5)


# ---------------------------------------------------------------------------------------------
# A named layout's row and its place

def _dp_inputs():
    inputs = hand_inputs(overlap={"ddp": 0.25, "zero1": 0.25}, optimizer_us_per_param=0.001)
    inputs.fits += [CommFit(op=op, ranks=4, span="node", alpha_us=1.0, beta_gbps=1.0)
                    for op in ("all_gather", "reduce_scatter")]
    return inputs


def test_a_named_layout_is_its_own_row_marked_and_ranked_where_the_enumeration_put_it():
    inputs = _dp_inputs()
    mine = Layout(tp=1, pp=1, dp=4, zero=0, micro_batches=1)
    plain = make_plan(MODEL, inputs, 4, 4, MEMORY, "float32", zero_stages=(0,))
    rows = make_plan(MODEL, inputs, 4, 4, MEMORY, "float32", zero_stages=(0,), given=[mine])
    (row,) = [r for r in rows if r["given"]]
    # the same figures as make_plan's own row for the layout alone, by hand too: the layers'
    # compute, a quarter of the gradients' all-reduce exposed, and the optimizer
    alone = one_row(mine, inputs)
    assert {k: row[k] for k in COLUMNS} == {k: alone[k] for k in COLUMNS}
    all_reduce = 20.0 + MODEL.params * 4 / 2e3
    expected = MODEL.layers * 100.0 + 0.75 * all_reduce + MODEL.params * 0.001
    assert row["predicted_step_ms"] == pytest.approx(expected / 1e3)
    # in the enumeration: its rank is the one it had unnamed, and no row was added or moved
    assert row["enumerated"] == 1 and len(rows) == len(plain)
    assert [r["rank"] for r in rows] == [r["rank"] for r in plain]
    step = row["predicted_step_ms"]
    faster = [r for r in ranked(rows) if r["predicted_step_ms"] < step]
    equal = [r for r in ranked(rows) if r["predicted_step_ms"] == step]  # then by memory
    assert len(faster) < row["rank"] <= len(faster) + len(equal)
    best = ranked(rows)[0]
    (line,) = given.lines(rows)
    assert f"rank {row['rank']} of {len(ranked(rows))} that fit" in line
    gain = row["predicted_step_ms"] / best["predicted_step_ms"] - 1
    if best is row:
        assert "it is the best predicted" in line
    else:
        assert f"the best predicted is {gain:.0%} faster: tp{best['tp']} pp{best['pp']}" in line
    assert "micro-batch size 8 x 1 micro-batch" in line


def test_a_named_layout_off_the_ladder_is_a_row_outside_the_enumeration():
    model = replace(MODEL, batch=96)  # a replica's 24 samples: 3 micro-batches is no rung
    inputs = _dp_inputs()
    assert 3 not in micro_batch_counts(model, 1, 4)
    plain = plan_rows(model, inputs, 4, 4, MEMORY, "float32", (0,))
    rows = plan_rows(model, inputs, 4, 4, MEMORY, "float32", (0,), layouts="dp=4,mbs=8")
    (row,) = [r for r in rows if r["given"]]
    mine = Layout(tp=1, pp=1, dp=4, micro_batches=3)
    assert (row["micro_batches"], row["micro_batch_size"]) == (3, 8)
    assert row["enumerated"] == 0 and row["rank"] is None and row["fits"]
    alone = make_plan(model, inputs, 4, 4, MEMORY, "float32", layouts=[mine])[0]
    assert {k: row[k] for k in COLUMNS} == {k: alone[k] for k in COLUMNS}
    # every enumerated row as it was: naming a layout moves no rank
    assert [(r["rank"], r["predicted_step_ms"]) for r in rows if r["enumerated"]] == \
        [(r["rank"], r["predicted_step_ms"]) for r in plain]
    (line,) = given.lines(rows)
    assert "not in the enumeration (3 micro-batches are not on the ladder" in line
    place = 1 + sum(1 for r in plain if r["rank"] and r["predicted_step_ms"]
                    < row["predicted_step_ms"])
    assert f"it would rank {place} of {len(ranked(plain)) + 1} that fit" in line


def test_a_named_zero_stage_or_recomputation_not_weighed_is_outside_and_says_which():
    inputs = _dp_inputs()
    rows = plan_rows(MODEL, inputs, 4, 4, MEMORY, "float32", (0,),
                     layouts="dp=4,zero=1;dp=4,recompute=full")
    named = {r["zero"]: r for r in rows if r["given"]}
    assert {r["enumerated"] for r in named.values()} == {0}
    assert named[1]["outside"] == ["ZeRO 1 is not in --zero 0"]
    assert named[0]["outside"] == ["recompute full is not in --recompute none"]


def test_named_layouts_are_validated_first():
    inputs = _dp_inputs()
    mine = Layout(tp=1, pp=1, dp=4, micro_batches=4)
    rows = make_plan(MODEL, inputs, 4, 4, MEMORY, "float32", zero_stages=(0,), given=[mine])
    picked = pick_validation(rows, 2, 4)
    assert picked[0]["given"] == 1 and picked[0]["micro_batches"] == 4
    assert picked[1]["rank"] == 1 and not picked[1]["given"]
    assert pick_validation(rows, 1, 4) == picked[:1]


# ---------------------------------------------------------------------------------------------
# --recompute

def test_recompute_options_are_enumerated_and_written():
    inputs = _dp_inputs()
    none = plan_rows(MODEL, inputs, 4, 4, MEMORY, "float32", (0,))
    both = plan_rows(MODEL, inputs, 4, 4, MEMORY, "float32", (0,), recompute=("none", "full"))
    assert {r["recompute"] for r in none} == {"none"}
    assert len(both) == 2 * len(none)
    assert sorted(r["recompute"] for r in both) == ["full"] * len(none) + ["none"] * len(none)
    # recomputation reruns the forward: each full row costs more compute than its plain twin
    plain = {(r["tp"], r["pp"], r["dp"], r["micro_batches"]): r for r in none}
    for r in both:
        if r["recompute"] == "full":
            twin = plain[(r["tp"], r["pp"], r["dp"], r["micro_batches"])]
            assert r["compute_ms"] > twin["compute_ms"]
            assert r["activations_bytes"] < twin["activations_bytes"]


# ---------------------------------------------------------------------------------------------
# The command

def _plan(tmp_path: Path, *args: str, dispatch: bool = True) -> helpers.Run:
    return plan(tmp_path, "--fabric", "dgx-a100", "--model", "7b", "--dtype", "bfloat16", *args,
                dispatch=dispatch)


def _csv(tmp_path: Path) -> list[dict]:
    (run_dir,) = (tmp_path / "out").iterdir()
    with open(run_dir / "plan.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_plan_shows_the_layouts_named_beside_the_ranked_list(tmp_path):
    got = _plan(tmp_path, "--gpus", "64", "--layout", "tp=8,pp=2,zero=1,mbs=2,recompute=full",
                "--layout", "tp=2,dp=32,zero=3,m=8;tp=1,zero=3,mbs=1")
    assert got.returncode == 0, got.stderr
    rows = _csv(tmp_path)
    named = {(r["tp"], r["pp"], r["dp"], r["zero"], r["micro_batches"], r["recompute"]):
             r for r in rows if r["given"] == "1"}
    assert set(named) == {("8", "2", "4", "1", "128", "full"), ("2", "1", "32", "3", "8", "none"),
                          ("1", "1", "64", "3", "16", "none")}
    outside = named[("8", "2", "4", "1", "128", "full")]
    assert outside["enumerated"] == "0" and outside["rank"] == ""
    assert all(r["enumerated"] == "1" for k, r in named.items() if k[-1] == "none")
    assert all(r["rank"] for k, r in named.items() if k[-1] == "none")
    assert sum(r["enumerated"] == "0" for r in rows) == 1
    text = (tmp_path / "out").iterdir().__next__().joinpath("plan.md").read_text()
    section = text.split("## Your layouts")[1].split("## Top layouts")[0]
    assert section.count("\n- ") == 3 and "not in the enumeration (recompute full" in section
    assert "the best predicted is" in section
    assert got.stderr.count("your layout: ") == 3


@pytest.mark.parametrize("args,needle", [
    (("--gpus", "64", "--layout", "tp=16"), "must divide the 8 GPUs per node"),
    (("--gpus", "64", "--gpus-per-node", "8", "--layout", "tp=8,pp=3"), "does not divide the"
     " 64 GPUs"),
    (("--gpus", "64", "--layout", "tp=8,bogus=2"), "unknown key 'bogus'"),
    (("--gpus", "64", "--layout", "pp=5"), "does not divide the 64 GPUs"),
    (("--gpus", "64", "--layout", "tp=8,dp=8,mbs=3"), "does not divide the global batch of "
     "1024"),
    (("--gpus", "64", "--recompute", "some"), "unknown value 'some'"),
])
def test_a_bad_layout_or_recompute_is_one_line_exit_2_and_nothing_written(tmp_path, args,
                                                                          needle):
    got = _plan(tmp_path, *args)
    option = "--recompute" if "--recompute" in args else "--layout"
    line = helpers.assert_one_line_error(got, None, option, ours=True)
    assert needle in line, line
    assert not (tmp_path / "out").exists()


def test_a_bad_layout_is_refused_before_workers_start(tmp_path):
    got = helpers.cli(tmp_path, "plan", "--workers", "2", "--backend", "gloo", "--layout",
                      "tp=4", "--out", str(tmp_path / "out"), dispatch=False)
    line = helpers.assert_one_line_error(got, None, "--layout", ours=True)
    assert "tp=4 in 'tp=4' must divide the 2 GPUs per node" in line
    assert not (tmp_path / "out").exists()


def test_a_named_layout_that_does_not_fit_is_predicted_anyway_and_said(tmp_path):
    # 7b whole on every GPU (ZeRO 0): 16 bytes a parameter, past 80 GB before any activation
    got = _plan(tmp_path, "--gpus", "64", "--layout", "tp=1,zero=0,mbs=16")
    assert got.returncode == 0, got.stderr
    (row,) = [r for r in _csv(tmp_path) if r["given"] == "1"]
    assert (row["fits"], row["rank"], row["enumerated"]) == ("0", "", "1")
    assert float(row["predicted_step_ms"]) > 0
    assert float(row["memory_per_rank_bytes"]) > float(row["memory_limit_bytes"])
    (line,) = [x for x in got.stderr.splitlines() if "your layout: " in x]
    usable = float(row["memory_limit_bytes"]) / 2**30
    assert f"which does not fit the {usable:.1f} GiB usable (predicted anyway)" in line
    step = float(line.split("predicted ")[1].split(" ms a step")[0])
    assert step == pytest.approx(float(row["predicted_step_ms"]), rel=1e-5)
    # the same compute as the best that fits, within 0.05% of its step
    assert "as fast as the best predicted, tp1 pp1 dp64 zero2 m16" in line


def test_recompute_full_plans_only_full_rows(tmp_path):
    got = _plan(tmp_path, "--gpus", "64", "--recompute", "full")
    assert got.returncode == 0, got.stderr
    rows = _csv(tmp_path)
    assert rows and {r["recompute"] for r in rows} == {"full"}
    assert {r["given"] for r in rows} == {"0"} and {r["enumerated"] for r in rows} == {"1"}


def test_layouts_in_a_config_file_are_a_list_or_one_text(tmp_path):
    config = tmp_path / "plan.toml"
    config.write_text('[plan]\nlayout = ["tp=8,pp=2,zero=1,mbs=2", "tp=1,zero=3,mbs=1"]\n')
    got = _plan(tmp_path, "--gpus", "64", "--config", str(config))
    assert got.returncode == 0, got.stderr
    assert sum(r["given"] == "1" for r in _csv(tmp_path)) == 2


def test_layouts_in_a_config_file_may_be_one_text_split_on_semicolons(tmp_path):
    config = tmp_path / "plan.toml"
    config.write_text('[plan]\nlayout = "tp=8,pp=2,zero=1,mbs=2;tp=1,zero=3,mbs=1"\n'
                      'recompute = ["none", "full"]\n')
    got = _plan(tmp_path, "--gpus", "64", "--config", str(config))
    assert got.returncode == 0, got.stderr
    rows = _csv(tmp_path)
    assert sum(r["given"] == "1" for r in rows) == 2
    assert {r["recompute"] for r in rows} == {"none", "full"}


def test_a_layout_of_the_wrong_type_in_a_config_file_is_one_line(tmp_path):
    config = tmp_path / "plan.toml"
    config.write_text("[plan]\nlayout = 8\n")
    got = _plan(tmp_path, "--gpus", "64", "--config", str(config))
    line = helpers.assert_one_line_error(got, None, "--config", ours=True)
    assert "layout = 8" in line and "wrong type for --layout" in line, line
    assert not (tmp_path / "out").exists()


def test_a_named_interleaved_layout_keeps_its_virtual_stages_to_the_validation():
    """v= names Megatron's virtual pipeline stages: checked like the step's option, its
    default micro-batches whole rounds, and the plan row hands them to the validation's step
    (layout_of), which then runs the interleaved schedule."""
    from distbench.planner.ranking import layout_of

    model = replace(MODEL, layers=8)
    mine = _resolve("pp=2,dp=2,v=2", model)
    assert (mine.virtual_stages, mine.micro_batches, mine.schedule) == (2, 8, "interleaved-1f1b")
    assert given.canonical("--layout", "v=2,pp=2") == "pp=2,v=2"
    with pytest.raises(OptionError, match="pp x virtual stages"):
        _resolve("pp=2,v=3", model)
    with pytest.raises(OptionError, match="interleave a pipeline; pp is 1"):
        _resolve("dp=4,v=2", model)
    rows = plan_rows(model, _dp_inputs(), 4, 4, MEMORY, "float32", (0,),
                     layouts="pp=2,dp=2,v=2")
    (row,) = [r for r in rows if r["given"]]
    assert layout_of(row) == mine
    assert row["enumerated"] == 0
    assert row["outside"] == ["2 virtual stages: the enumeration weighs plain 1F1B"]
