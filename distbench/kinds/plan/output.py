"""`distbench plan` read back: its report section (the fastest layouts that fit, the validation)
and the plan's and the validation's figures. The pandas and matplotlib parts are imported when
report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.contracts import LAYOUT_COLUMNS
from distbench.core.layout_label import EXTRA_COLUMNS
from distbench.core.tables import Column, Output, markdown_table, number, plural

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

# plan
# One row per layout on --gpus ranks: the predicted step and its parts (docs/plan.md), the
# memory per rank and its parts, whether it fits, and its rank among those that fit. Predicted,
# not measured: no identity, so compare does not pair it with a measurement.
# Stable contract: add columns at the end, never rename.
OUTPUT = Output("plan.csv", csv=(
    "model", "tp", "pp", "dp", "zero", "micro_batches", "micro_batch_size", "dtype",
    "world_size", "gpus_per_node", "predicted_step_ms", "compute_ms", "tp_comm_ms",
    "pp_comm_ms", "bubble_ms", "dp_comm_ms", "dp_exposed_ms", "optimizer_ms",
    "bubble_fraction", "tokens_per_s", "memory_per_rank_bytes", "params_bytes", "grads_bytes",
    "optimizer_bytes", "buffers_bytes", "activations_bytes", "memory_limit_bytes", "fits",
    "rank", "recompute", "given", "enumerated", "virtual_stages", *EXTRA_COLUMNS,
    "tp_exposed_ms", "trainer",
), console=(
    Column("rank", "rank", "", 5),
    Column("tp", "tp", "", 4),
    Column("pp", "pp", "", 4),
    Column("dp", "dp", "", 6),
    Column("zero", "zero", "", 5),
    Column("micro_batches", "micro", "batches", 8),
    Column("predicted_step_ms", "step", "(ms)", 10, ".2f"),
    Column("compute_ms", "compute", "(ms)", 10, ".2f"),
    Column("tp_comm_ms", "tp comm", "(ms)", 10, ".2f"),
    Column("pp_comm_ms", "pp comm", "(ms)", 10, ".2f"),
    Column("bubble_ms", "bubble", "(ms)", 10, ".2f"),
    Column("dp_exposed_ms", "dp exp.", "(ms)", 10, ".2f"),
    Column("optimizer_ms", "optim", "(ms)", 9, ".2f"),
    Column("memory_per_rank_bytes", "memory", "(GiB)", 9, lambda b: f"{b / 2**30:.1f}"),
    Column("fits", "fits", "", 5, lambda v: "yes" if v else "no"),
), read=("tp", "pp", "dp", "zero", "micro_batches", "predicted_step_ms", "fits"),
    not_compared="predictions, not measurements: plan --validate measures step.csv")
# validation
# One row per layout `plan --validate K` ran for real: what was predicted against what a real
# step took. Stable contract: add columns at the end, never rename.
VALIDATION = Output("validation.csv", csv=(
    "model", "tp", "pp", "dp", "zero", "micro_batches", "predicted_step_ms",
    "measured_step_ms", "error_pct", "in_sample", "status", "note", "recompute",
    "virtual_stages", *EXTRA_COLUMNS,
), console=(
    *LAYOUT_COLUMNS,
    Column("predicted_step_ms", "predicted", "(ms)", 11, ".2f"),
    Column("measured_step_ms", "measured", "(ms)", 11, ".2f"),
    Column("error_pct", "error", "(%)", 8, ".1f"),
), read=("predicted_step_ms", "measured_step_ms", "status"),
    not_compared="each prediction against one measurement: its step.csv is compared")


PLAN_SHOWN = 10  # the fastest layouts that fit, as the console shows them


def section(run: Run) -> list[str]:
    from distbench.core.validation_table import validation_table
    from distbench.results import report

    lines = []
    frame = run.table("plan.csv")
    if frame is not None:
        fits = frame[frame["fits"].astype(bool)].sort_values("predicted_step_ms")
        lines += ["### Plan", "",
                  f"{len(frame)} layouts predicted, {len(fits)} fit in memory; the "
                  f"{min(PLAN_SHOWN, len(fits))} fastest:", ""]
        lines += markdown_table(
            ["layout", "predicted step (ms)", "compute (ms)", "exposed dp (ms)",
             "bubble (ms)", "memory per rank"],
            [[report.layout_text(r), number(r["predicted_step_ms"]), number(r.get("compute_ms")),
              number(r.get("dp_exposed_ms")), number(r.get("bubble_ms")),
              report.size_cell(r.get("memory_per_rank_bytes"))]
             for _, r in fits.head(PLAN_SHOWN).iterrows()])
        lines.append("")
    frame = run.table("validation.csv")
    if frame is not None and len(frame):
        lines += ["### Validation", ""]
        lines += validation_table(frame.to_dict("records"))
        errors = frame.dropna(subset=["error_pct"])
        unseen = errors[errors["in_sample"].fillna(0).astype(int) == 0]
        if len(unseen):  # plan.md gives the rank correlation too
            lines += ["", f"Mean absolute error {unseen['error_pct'].abs().mean():.1f}% over "
                      f"{plural(len(unseen), 'layout')} out of sample."]
        lines.append("")
    return lines


def draw(runs: list[Run], out: Path) -> list[Path]:
    """Each plan run's predicted step against memory, and its validation's predicted against
    measured steps."""
    from distbench.results import plots

    paths = []
    for run in runs:
        frame = run.table("plan.csv")
        if frame is not None and len(frame):
            paths.append(plots.plan_figure(frame.to_dict("records"),
                                           out / f"plan_{plots.slug(run.name)}.png",
                                           f"plan: {run.name}"))
        frame = run.table("validation.csv")
        if frame is not None and frame["measured_step_ms"].notna().any():
            paths.append(plots.validation_figure(frame.to_dict("records"),
                                                 out / f"validation_{plots.slug(run.name)}.png",
                                                 f"plan --validate: {run.name}"))
    return paths
