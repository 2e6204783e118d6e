"""The one path from a plan's inputs to its rows, its files and its console table, for a plan
from earlier runs (kinds/plan/body.py) and for one its workers measured (kinds/plan/workers.py):
the layouts predicted and ranked (planner.assemble.plan_rows), plan.csv, inputs.json, plan.md
and plan.png written (planner.assemble.write), the fastest that fit shown and the user's own
layouts said."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from distbench.kinds.plan.output import OUTPUT
from distbench.planner import assemble
from distbench.planner.given import lines as given_lines
from distbench.planner.ranking import top_lines

if TYPE_CHECKING:
    from distbench.planner.inputs import Inputs
    from distbench.planner.models import ModelSpec
    from distbench.run.console import Console


def rows(opts, model: ModelSpec, inputs: Inputs, *, gpus: int, per_node: int, memory: float,
         gpu: str | None, mfu: float | None, trainer: str) -> list[dict]:
    """Every layout predicted and ranked; raises OptionError (a --layout the cluster cannot
    hold, no layout at all) before anything is written."""
    return assemble.plan_rows(model, inputs, gpus, per_node, memory, opts.dtype, opts.zero,
                              gpu=gpu, mfu=mfu, recompute=opts.recompute, layouts=opts.layouts,
                              trainer=trainer)


def publish(opts, run_dir: Path | None, console: Console, rows: list[dict], model: ModelSpec,
            inputs: Inputs, measured: Inputs, *, gpus: int, per_node: int, per_node_from: str,
            memory: float, memory_from: str, trainer: str, title: str | None = None) -> None:
    """plan.csv, inputs.json, plan.md and (unless --no-plot) plan.png where there is a run
    directory (rank 0's), then the fastest that fit and the user's own layouts on the console."""
    if run_dir is not None:
        assemble.write(run_dir, OUTPUT, rows, model, inputs, gpus=gpus, gpus_per_node=per_node,
                       memory_per_gpu=memory, memory_from=memory_from, dtype=opts.dtype,
                       top=opts.top, measured=measured, per_node_from=per_node_from,
                       recompute=opts.recompute, trainer=trainer, plot=opts.plot)
    console.lines(top_lines(rows, opts.top, OUTPUT.console, title=title))
    for line in given_lines(rows):
        console.log(f"your layout: {line}")
