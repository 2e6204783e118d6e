"""`distbench plan` at its edges (issue 31), in process, nothing started: --from with workers,
a corrupted inputs.json, an empty plan, a GPU memory at or below the reserve, and the node
count. What a validation says of what it ran: test_plan_validation.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import helpers
import pytest
from plan_helpers import plan as _plan

from distbench.core.options import OptionError
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.models import PRESETS
from distbench.planner.ranking import summary_md

TOY = PRESETS["toy"]


def saved_inputs(root: Path, device: str = "", **changes) -> Path:
    """A plan's inputs.json, alone in `root`: every op fitted on 2 to 8 ranks in a node and
    across nodes, one toy layer timed, AdamW and DDP's overlap measured."""
    fits = [CommFit(op=op, ranks=n, span=span, alpha_us=10.0, beta_gbps=5.0)
            for op in ("all_reduce", "all_gather", "reduce_scatter") for n in (2, 4, 8)
            for span in ("node", "nodes")]
    fits += [CommFit(op="sendrecv", ranks=2, span=span, alpha_us=5.0, beta_gbps=10.0)
             for span in ("node", "nodes")]
    tokens = TOY.seq_len
    inputs = Inputs(fits=fits, compute=[ComputePoint(tp=1, tokens=tokens, layer_us=300.0,
                                                     flops=TOY.flops_per_layer(tokens, 1))],
                    compute_model={"hidden_size": TOY.hidden_size, "ffn_size": TOY.ffn_size,
                                   "heads": TOY.heads, "seq_len": TOY.seq_len},
                    optimizer_us_per_param=0.001, overlap={"ddp": 0.5}, device=device,
                    sources=["hand-made"])
    root.mkdir(parents=True)
    inputs.write(root)
    data = json.loads((root / "inputs.json").read_text())
    for where, value in changes.items():
        _set(data, where, value)
    (root / "inputs.json").write_text(json.dumps(data))
    return root


def _set(data: dict, where: str, value) -> None:
    """data at a path "fits.0.alpha_us" set to value."""
    *parents, last = where.split(".")
    for key in parents:
        data = data[int(key)] if key.isdigit() else data[key]
    data[int(last) if last.isdigit() else last] = value


def _refused(got: helpers.Run, tmp_path: Path, option: str) -> str:
    line = helpers.assert_one_line_error(got, None, option, ours=True)
    assert not (tmp_path / "out").exists()
    return line


# ---------------------------------------------------------------------------------------------
# 1. --from with workers

@pytest.mark.parametrize("extra", [("--workers", "2"), ("--validate", "2"),
                                   ("--workers", "2", "--validate", "2")])
def test_from_with_workers_or_validate_is_refused_before_anything_starts(tmp_path, extra):
    """It measured on the workers and left --from out of the plan without a word."""
    run = saved_inputs(tmp_path / "run")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8", "--gpus-per-node", "8", *extra,
                dispatch=False)
    line = _refused(got, tmp_path, "--from")
    assert all(f in line for f in extra if f.startswith("--")), line
    assert "give one or the other" in line, line


def test_from_under_a_launcher_is_refused(tmp_path, monkeypatch):
    """Under torchrun every rank would measure and ignore --from."""
    from distbench.kinds.plan.options import PlanOptions
    from distbench.platform import env

    monkeypatch.setattr(env, "under_launcher", lambda: True)
    opts = PlanOptions(sources=[str(tmp_path)], gpus=8, gpus_per_node=8)
    with pytest.raises(OptionError, match="--from: .*launcher"):
        opts.validate()


# ---------------------------------------------------------------------------------------------
# 2. a corrupted inputs.json

@pytest.mark.parametrize("where,value,needle", [
    ("fits.0.alpha_us", "abc", "fits[0].alpha_us"),
    ("fits.0.alpha_us", math.nan, "fits[0].alpha_us"),
    ("fits.0.alpha_us", -3.0, "fits[0].alpha_us"),
    ("fits.0.beta_gbps", 0, "fits[0].beta_gbps"),
    ("fits.0.beta_gbps", -1, "fits[0].beta_gbps"),
    ("fits.0.beta_gbps", math.inf, "fits[0].beta_gbps"),
    ("fits.0.ranks", 0, "fits[0].ranks"),
    ("fits.0.ranks", True, "fits[0].ranks"),
    ("fits", {"a": 1}, "fits"),
    ("compute.0.layer_us", math.nan, "compute[0].layer_us"),
    ("compute.0.layer_us", -5.0, "compute[0].layer_us"),
    ("compute.0.flops", 0, "compute[0].flops"),
    ("compute.0.tokens", 1.5, "compute[0].tokens"),
    ("compute.0.tp", "2", "compute[0].tp"),
    ("alone_ratio", 0, "alone_ratio"),
    ("bubble_weight", 2.0, "bubble_weight"),
    ("overlap.ddp", 1.5, "overlap.ddp"),
    ("wrapper_us_per_layer", {"zero3": -1.0}, "wrapper_us_per_layer.zero3"),
    ("optimizer_us_per_param", -0.5, "optimizer_us_per_param"),
    ("pipeline_us_per_microbatch", math.nan, "pipeline_us_per_microbatch"),
    ("memory_per_gpu", 0, "memory_per_gpu"),
    ("compute_model.hidden_size", 0, "compute_model.hidden_size"),
], ids=lambda v: str(v))
def test_a_corrupted_inputs_json_is_one_line_naming_file_and_field(tmp_path, where, value,
                                                                    needle):
    """TypeError, ZeroDivisionError, or a plan ranking NaN steps and negative times as fitting,
    exit 0."""
    run = saved_inputs(tmp_path / "run", **{where: value})
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8", "--gpus-per-node", "8")
    line = _refused(got, tmp_path, "--from")
    assert f"{run / 'inputs.json'}: {needle}" in line, line


def test_a_zero_node_size_in_inputs_json_is_refused_not_divided_by(tmp_path):
    run = saved_inputs(tmp_path / "run", gpus_per_node=0)
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8")
    line = _refused(got, tmp_path, "--from")
    assert "gpus_per_node" in line, line


def test_good_saved_inputs_still_plan(tmp_path):
    run = saved_inputs(tmp_path / "run")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8", "--gpus-per-node", "8")
    assert got.returncode == 0, got.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    rows = helpers.Run(0, "", "", tmp_path / "out").rows("plan.csv")
    steps = [float(r["predicted_step_ms"]) for r in rows]
    assert steps and all(math.isfinite(s) and s > 0 for s in steps)
    assert all(float(r[k]) >= 0 for r in rows for k in ("tp_comm_ms", "dp_comm_ms"))
    assert (run_dir / "plan.md").is_file()


# ---------------------------------------------------------------------------------------------
# 3. an empty plan

@pytest.mark.parametrize("args,option", [
    (("--workers", "2", "--gpus", "1024", "--gpus-per-node", "8"), "--gpus"),
    (("--workers", "3"), "--workers"),  # toy: no tp, pp or dp of 3 divides it
    (("--workers", "3", "--gpus", "4", "--gpus-per-node", "4", "--validate", "2"),
     "--validate"),
])
def test_an_empty_plan_is_refused_before_workers_start(tmp_path, args, option):
    """It measured for 22 s, then reported "the 0 fastest of 0 layouts" with exit 0."""
    got = _plan(tmp_path, *args, "--backend", "gloo", dispatch=False)
    line = _refused(got, tmp_path, option)
    assert "no layout of toy" in line, line


def test_the_from_path_refuses_the_same_empty_plan(tmp_path):
    run = saved_inputs(tmp_path / "run")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "1024", "--gpus-per-node", "8")
    line = _refused(got, tmp_path, "--gpus")
    assert "no layout of toy" in line, line


def test_plan_md_never_says_both_none_and_every_layout_fits():
    text = summary_md([], TOY, Inputs(), gpus=1024, gpus_per_node=8, memory_per_gpu=80 * 2**30,
                      memory_from="", dtype="float32")
    assert "No layout" in text
    assert "Every layout fits" not in text


# ---------------------------------------------------------------------------------------------
# 4. GPU memory at or below the reserve

@pytest.mark.parametrize("memory", ["1K", "1G", "2G"])
def test_gpu_memory_at_or_below_the_reserve_is_refused(tmp_path, memory):
    """--gpu-memory 1K planned "15.2 GiB per rank against -2.0 GiB usable"."""
    run = saved_inputs(tmp_path / "run")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8", "--gpus-per-node", "8",
                "--gpu-memory", memory)
    line = _refused(got, tmp_path, "--gpu-memory")
    assert "2 GiB" in line and "reserve" in line, line


def test_gpu_memory_just_above_the_reserve_plans(tmp_path):
    run = saved_inputs(tmp_path / "run")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8", "--gpus-per-node", "8",
                "--gpu-memory", "3G")
    assert got.returncode == 0, got.stderr
    assert "3.0 GiB per GPU (--gpu-memory)" in got.stdout


def test_a_topology_memory_at_or_below_the_reserve_is_refused(tmp_path):
    run = saved_inputs(tmp_path / "run", memory_per_gpu=2**30)
    got = _plan(tmp_path, "--from", str(run), "--gpus", "8", "--gpus-per-node", "8")
    line = _refused(got, tmp_path, "--from")
    assert "reserve" in line, line


# ---------------------------------------------------------------------------------------------
# 6. the node count

def test_a_cpu_runs_worker_count_is_no_gpu_node_size(tmp_path):
    """A 1024-GPU plan from a CPU run was planned at "4 per node", the 4 CPU workers."""
    run = saved_inputs(tmp_path / "run", device="cpu", gpus_per_node=4)
    got = _plan(tmp_path, "--from", str(run), "--gpus", "1024", "--model", "7b", "--gpu",
                "h100")
    line = _refused(got, tmp_path, "--gpus-per-node")
    assert "CPU" in line, line


def test_cpu_workers_planning_other_gpus_need_a_node_size(tmp_path):
    got = _plan(tmp_path, "--workers", "2", "--gpus", "16", "--backend", "gloo",
                dispatch=False)
    line = _refused(got, tmp_path, "--gpus-per-node")
    assert "CPU" in line, line


def test_where_the_node_size_came_from_is_said(tmp_path):
    run = saved_inputs(tmp_path / "run", device="NVIDIA H100 80GB HBM3", gpus_per_node=8)
    got = _plan(tmp_path, "--from", str(run), "--gpus", "16")
    assert got.returncode == 0, got.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "8 per node (the --from runs')" in (run_dir / "plan.md").read_text()
    assert "8 per node (the --from runs')" in got.stdout
    (tmp_path / "out").rename(tmp_path / "first")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "16", "--gpus-per-node", "4")
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "4 per node (--gpus-per-node)" in (run_dir / "plan.md").read_text()


@pytest.mark.parametrize("gpus,per_node,whole", [
    (1, 8, True), (2, 8, True), (3, 8, True), (7, 8, True),  # a part of one node
    (8, 8, True), (16, 8, True), (1024, 8, True),
    (12, 8, False), (9, 8, False), (20, 8, False)])
def test_one_partial_node_is_fine_more_than_one_must_be_whole_nodes(gpus, per_node, whole):
    """--gpus 1 and 2 at 8 per node were accepted and 3 refused as not whole nodes."""
    from distbench.kinds.plan.options import PlanOptions

    opts = PlanOptions(gpus=gpus, gpus_per_node=per_node)
    if whole:
        opts.validate()
        return
    with pytest.raises(OptionError) as e:
        opts.validate()
    text = str(e.value)
    assert text.startswith("--gpus:") and "more than one node" in text and "whole" in text, text
