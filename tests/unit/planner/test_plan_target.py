"""A figure measured on one device is never used for a plan of another without saying so
(issue 31): `plan --from <a CPU plan run> --gpu h100` used to keep the CPU's layer times,
optimizer, wrapper and pipeline figures, scaled by FLOPs, silently."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from paths import FIXTURES
from plan_helpers import plan as _plan

from distbench.kinds.plan import sources
from distbench.planner.gpus import GPUS
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.models import parse_model

TOY = "layers=4,hidden=128,ffn=512,heads=4,seq=32,batch=16"
LOG = FIXTURES / "nccl-tests" / "dgx_h100_8gpu.log"


def cpu_plan(root: Path) -> Path:
    """inputs.json of a plan measured on 4 CPU ranks: collectives, a layer, AdamW, DDP's
    wrapper, the pipeline's schedule."""
    model = parse_model("--model", TOY)
    shape = {k: getattr(model, k) for k in ("hidden_size", "ffn_size", "heads", "seq_len")}
    fits = [CommFit(op=op, ranks=n, span="node", alpha_us=900.0, beta_gbps=0.8,
                    source="measured here")
            for op in ("all_reduce", "all_gather", "reduce_scatter") for n in (2, 4)]
    fits.append(CommFit(op="sendrecv", ranks=2, span="node", alpha_us=300.0, beta_gbps=1.5))
    tokens = 4 * model.seq_len
    saved = Inputs(fits=fits, compute=[ComputePoint(tp=1, tokens=tokens, layer_us=40_000.0,
                                                    flops=model.flops_per_layer(tokens, 1))],
                   compute_model=shape, alone_ratio=0.5, optimizer_us_per_param=0.01,
                   optimizer_us_per_layer=300.0, wrapper_us_per_layer={"ddp": 6000.0},
                   pipeline_us_per_microbatch=3800.0, bubble_weight=0.0,
                   overlap_layouts={"pipeline": "tp1 pp4 dp1 zero0 m4"}, gpus_per_node=4,
                   device="cpu")
    root.mkdir()
    saved.write(root)
    return root


def test_a_cpu_runs_compute_like_figures_are_dropped_for_a_gpu_target_and_said(tmp_path):
    run = cpu_plan(tmp_path / "plan")
    measured, used = sources.read_for([run], GPUS["h100"])
    assert measured.compute and measured.optimizer_us_per_param == 0.01
    assert (used.compute, used.optimizer_us_per_param, used.wrapper_us_per_layer,
            used.pipeline_us_per_microbatch, used.alone_ratio, used.bubble_weight) == (
        [], None, {}, 0.0, 1.0, 1.0)
    assert len(used.fits) == 7  # kept, and said
    assert any("measured on the CPU, not h100: its layer times, optimizer step, data-parallel"
               in w for w in used.warnings)
    assert any("collectives measured on the CPU used for h100 GPUs" in w
               for w in used.warnings)
    _, with_fabric = sources.read_for([run], GPUS["h100"], fabric=True)
    assert with_fabric.fits == []
    assert any("the declared --fabric prices them" in w for w in with_fabric.warnings)


def test_figures_measured_on_the_target_gpu_are_used_unsaid():
    _, used = sources.read_for([LOG], GPUS["h100"])
    assert len(used.fits) == 4 and not used.warnings


def test_plan_from_a_cpu_run_for_h100_computes_from_the_datasheet_and_says_so(tmp_path):
    run = cpu_plan(tmp_path / "plan")
    got = _plan(tmp_path, "--from", str(run), "--gpus", "4", "--gpus-per-node", "4",
                "--gpu", "h100", "--mfu", "0.4", "--model", TOY, "--dtype", "bfloat16")
    assert got.returncode == 0, got.stderr
    assert "warning: " + str(run) + ": measured on the CPU, not h100" in got.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "h100's datasheet peak (989 TFLOPS bfloat16) x an assumed mfu of 0.4" in (
        run_dir / "plan.md").read_text()
    model = parse_model("--model", TOY)
    with open(run_dir / "plan.csv") as fh:
        row = next(r for r in csv.DictReader(fh)
                   if (r["tp"], r["pp"], r["zero"]) == ("1", "1", "0"))
    tokens = int(row["micro_batch_size"]) * model.seq_len
    per_layer_us = model.flops_per_layer(tokens, 1) / (989e12 * 0.4 / 1e6)
    assert float(row["compute_ms"]) == pytest.approx(
        int(row["micro_batches"]) * model.layers * per_layer_us / 1e3, rel=1e-5)  # csv: 6 digits
    # the CPU's AdamW (0.01 us a parameter) is not the GPU's: an H100's own, measured on one
    h100 = model.layers * 34.9 + model.params * 15.27e-6
    assert float(row["optimizer_ms"]) == pytest.approx(h100 / 1e3, rel=1e-4)


def test_an_h100_without_mfu_computes_at_the_fraction_measured_on_one():
    """The first H100 (docs/gpu-checklist.md, Figures) stands in for the assumed 0.5: 540
    TFLOP/s of 989 in bfloat16, and its AdamW for an optimizer counted as free."""
    from distbench.planner.gpus import synthesize

    model = parse_model("--model", TOY)
    got = Inputs()
    synthesize(got, model, GPUS["h100"], None, "bfloat16", {(1, 128)})
    (point,) = got.compute
    assert point.layer_us == pytest.approx(model.flops_per_layer(128, 1) / (989e6 * 0.546))
    assert got.optimizer_us_per_param == pytest.approx(15.27e-6)  # 15.3 ps
    assert got.optimizer_us_per_layer == pytest.approx(34.9)
    assert any("0.546, measured by distbench on one H100" in n for n in got.notes)


@pytest.mark.parametrize("gpu,mfu,dtype,fraction,optimizer", [
    ("h100", 0.4, "bfloat16", 0.4, 15.27e-6),  # --mfu given wins; the optimizer still measured
    ("h100", None, "float32", 0.5, None),  # measured in bfloat16 only
    ("a100", None, "bfloat16", 0.5, None),  # never measured: the assumption, said
])
def test_the_measured_figures_only_where_they_were_measured(gpu, mfu, dtype, fraction,
                                                            optimizer):
    from distbench.planner.gpus import peak_tflops, synthesize

    model = parse_model("--model", TOY)
    got = Inputs()
    synthesize(got, model, GPUS[gpu], mfu, dtype, {(1, 128)})
    peak = peak_tflops(GPUS[gpu], dtype)
    assert got.compute[0].layer_us == pytest.approx(
        model.flops_per_layer(128, 1) / (peak * 1e6 * fraction))
    assert got.optimizer_us_per_param == (pytest.approx(optimizer) if optimizer else None)
    if mfu is not None or fraction == 0.5:
        assert any(f"an assumed mfu of {fraction:g}" in n for n in got.notes)
