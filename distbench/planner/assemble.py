"""A plan from its inputs to its files: the one path `plan --from` (kinds/plan/body.py) and
plan's workers (kinds/plan/workers.py) both take. The rows (every layout, predicted and ranked:
planner.ranking), compute from a GPU's datasheet where none was measured (planner.gpus), every
refusal one line; then plan.csv through the results writer, inputs.json, plan.md and the
figures (results/plots). Torch-free, as all of planner/."""

from __future__ import annotations

from pathlib import Path

from distbench.core.options import OptionError
from distbench.core.tables import Output
from distbench.planner import given, trainers
from distbench.planner import gpus as gpu_table
from distbench.planner.inputs import Inputs
from distbench.planner.layouts import enumerate_layouts
from distbench.planner.models import ModelSpec
from distbench.planner.ranking import (
    PLAN_MD,
    PLAN_PNG,
    compute_shapes,
    label,
    layout_of,
    layouts_for,
    make_plan,
    summary_md,
)

VALIDATION_PNG = "validation.png"


def require_layouts(model: ModelSpec, gpus: int, per_node: int, zero, option: str,
                    why: str = "", example: str = "--gpus 1024 --gpus-per-node 8") -> None:
    """An empty plan refused in one line, before anything is measured or written (the first
    layout found is enough: this runs before workers start, and again on each)."""
    if next(enumerate_layouts(model, gpus, per_node, tuple(zero)), None) is None:
        raise OptionError(option, f"no layout of {model.name} uses exactly {gpus} GPUs"
                          f"{why} (tp a divisor of {per_node} GPUs per node, pp of "
                          f"{model.layers} layers, dp of the batch of {model.batch}, ZeRO "
                          f"{','.join(map(str, zero))})", example)


def plan_rows(model: ModelSpec, inputs: Inputs, gpus: int, per_node: int, memory: float,
              dtype: str, zero, *, gpu: str | None = None, mfu: float | None = None,
              recompute=("none",), layouts: str | None = None, trainer: str = "torch"
              ) -> list[dict]:
    """The plan's rows: the enumeration (`zero` stages, `recompute` choices) and the layouts
    `layouts` names (plan --layout, planner.given), each predicted. Where no layer was timed,
    compute from `gpu`'s datasheet (or the GPU the inputs name) x `mfu`
    (planner.gpus.synthesize). Raises OptionError."""
    zero = [z for z in zero if z in trainers.ZERO_OF[trainer]]
    require_layouts(model, gpus, per_node, zero, "--gpus")
    named = given.resolve_all(layouts, model, gpus, per_node, trainer=trainer)
    listed = [lay for lay in layouts_for(model, gpus, per_node, zero, recompute)
              if not trainers.problems(trainer, lay, model)]
    if not inputs.compute:
        chip = gpu_table.GPUS[gpu] if gpu else gpu_table.by_device_name(inputs.device)
        if chip is None:
            raise OptionError("--gpu", "the --from runs hold no compute measurement: name a GPU "
                              f"to scale it from ({', '.join(gpu_table.GPUS)})", "--gpu h100")
        try:
            gpu_table.synthesize(inputs, model, chip, mfu, dtype,
                                 compute_shapes(model, [*listed, *named]))
        except LookupError as e:
            raise OptionError("--dtype", str(e), "--dtype bfloat16") from None
    try:
        rows = make_plan(model, inputs, gpus, per_node, memory, dtype, zero, layouts=listed,
                         given=named, trainer=trainer)
    except LookupError as e:
        raise OptionError("--from", f"the runs lack a measurement: {e}",
                          "--from results/COLLECTIVE_RUN,results/P2P_RUN") from None
    for r in rows:
        if not r["enumerated"]:
            r["outside"] = given.outside(layout_of(r), model, zero, recompute)
    return rows


def title(model: ModelSpec, gpus: int, per_node: int, dtype: str, device: str = "") -> str:
    """The figures' title: what was planned, on what (a plan of CPU workers is no GPU's)."""
    what = "CPU ranks" if device.strip().lower() == "cpu" else "GPUs"
    return f"{model.name} on {gpus} {what}, {per_node} a node ({dtype})"


def write(run_dir: Path, output: Output, rows: list[dict], model: ModelSpec, inputs: Inputs,
          *, gpus: int, gpus_per_node: int, memory_per_gpu: float, memory_from: str, dtype: str,
          top: int, measured: Inputs | None = None, per_node_from: str = "", recompute=(),
          trainer: str = "torch", plot: bool = True) -> list[Path]:
    """plan.csv, inputs.json, plan.md and (with `plot`) plan.png in `run_dir`; the paths
    written.
    `measured`: the inputs as measured, before any synthesis or lookup note, for inputs.json
    (a later plan --from reads it as measurements); `inputs` otherwise."""
    from distbench.results import writer

    run_dir = Path(run_dir)
    sink = writer.CsvSink(run_dir / output.file, list(output.csv))
    try:
        for r in rows:
            sink.append({k: r.get(k) for k in output.csv})
    finally:
        sink.close()
    (measured or inputs).write(run_dir)
    (run_dir / PLAN_MD).write_text(summary_md(
        rows, model, inputs, gpus=gpus, gpus_per_node=gpus_per_node,
        memory_per_gpu=memory_per_gpu, memory_from=memory_from, dtype=dtype, top=top,
        per_node_from=per_node_from, recompute=recompute, named=given.lines(rows),
        trainer=trainer))
    written = [run_dir / n for n in (output.file, "inputs.json", PLAN_MD)]
    if not plot:
        return written
    from distbench.results import plots  # matplotlib: only to draw

    best = next((label(r) for r in rows if r.get("rank") == 1), None)
    plots.plan_figure(rows, run_dir / PLAN_PNG, title(model, gpus, gpus_per_node, dtype,
                                                      (measured or inputs).device), best)
    return [*written, run_dir / PLAN_PNG]


def write_validation(run_dir: Path, validated: list[dict], model: ModelSpec, world: int,
                     per_node: int, dtype: str, device: str = "") -> Path:
    """validation.png: each layout run, its predicted step against its measured one."""
    from distbench.results import plots

    return plots.validation_figure(
        validated, Path(run_dir) / VALIDATION_PNG,
        "validated: " + title(model, world, per_node, dtype, device))
