"""`distbench step` read back (plan --validate writes step.csv too): its report section, the
measured peak beside the model's, and each layout's step in its parts. The pandas and matplotlib
parts are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.contracts import LAYOUT_COLUMNS
from distbench.core.layout_label import EXTRA_COLUMNS, row_label
from distbench.core.tables import Column, Output, missing, us_as_ms

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from distbench.results.reader import Run

# step
# One row per layout: the parts add up as predicted (docs/plan.md) and as measured.
# Stable contract: add columns at the end, never rename.
OUTPUT = Output("step.csv", csv=(
    "model", "tp", "pp", "dp", "zero", "micro_batches", "micro_batch_size", "schedule",
    "dtype", "world_size", "nnodes", "layers", "hidden_size", "ffn_size", "heads", "seq_len",
    "batch", "params", "iters", "step_us", "rank_min_us", "rank_max_us", "slowest_rank",
    "p50_us", "p99_us", "cv_pct", "compute_only_us", "tp_comm_alone_us", "pp_comm_alone_us",
    "dp_comm_alone_us", "exposed_comm_us", "tp_exposed_us", "pp_exposed_us", "dp_exposed_us",
    "bubble_analytic", "bubble_us", "tp_bytes_per_step", "pp_bytes_per_step",
    "dp_bytes_per_step", "state_bytes_per_rank", "peak_mem_bytes", "samples_per_s",
    "max_abs_err", "backend", "status", "note", "recompute", "model_mem_bytes",
    "virtual_stages", *EXTRA_COLUMNS,
), console=(
    *LAYOUT_COLUMNS,
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("compute_only_us", "compute", "(ms)", 10, us_as_ms(".2f")),
    Column("tp_comm_alone_us", "tp comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("pp_comm_alone_us", "pp comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("dp_comm_alone_us", "dp comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("exposed_comm_us", "exposed", "(ms)", 10, us_as_ms(".2f")),
    Column("bubble_analytic", "bubble", "", 7, ".3f"),
    Column("state_bytes_per_rank", "state", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("peak_mem_bytes", "peak", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("model_mem_bytes", "model", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("max_abs_err", "max_err", "", 10, ".3g"),
), identity=("model", "tp", "pp", "dp", "zero", "micro_batches", "dtype", "world_size",
             "recompute", "virtual_stages", *EXTRA_COLUMNS),
    read=("tp", "pp", "dp", "zero", "micro_batches", "step_us", "compute_only_us",
          "exposed_comm_us", "status"),
    # a layout recomputed, interleaved, sequence-parallel or synced otherwise is another
    # layout; older runs lack the columns
    identity_since=("recompute", "virtual_stages", *EXTRA_COLUMNS),
    time="step_us", p99="p99_us",
    # a layout reads as its label, not as five bare numbers
    label=lambda row: f"{row_label(row)} {row.get('dtype')}")


def _memory_cells(row: pd.Series) -> list[str]:
    """The measured peak beside the model's figure, and how far the model is."""
    from distbench.results import report

    peak, model = row.get("peak_mem_bytes"), row.get("model_mem_bytes")
    known = not missing(peak) and not missing(model) and float(peak) > 0
    error = f"{(float(model) - float(peak)) / float(peak):+.1%}" if known else "-"
    return [report.size_cell(peak), report.size_cell(model), error]


def section(run: Run) -> list[str]:
    from distbench.results import report

    lines = report.step_table(
        run, "step.csv", "Training step per layout",
        ["layout", "step (ms)", "compute only (ms)", "exposed tp (ms)", "exposed pp (ms)",
         "exposed dp (ms)", "bubble (ms)", "peak memory", "model memory", "model error"],
        lambda r: [report.layout_text(r), *(report.ms(r, c) for c in (
            "step_us", "compute_only_us", "tp_exposed_us", "pp_exposed_us", "dp_exposed_us",
            "bubble_us")), *_memory_cells(r)])
    return (lines + report.skipped(run.table("step.csv"))) if lines else []


def draw(runs: list[Run], out: Path) -> list[Path]:
    """Each layout's step as its compute, bubble and the communication each dimension left
    exposed (ms)."""

    from distbench.results import plots

    parts = (("compute", "compute_only_us"), ("bubble", "bubble_us"),
             ("exposed tp", "tp_exposed_us"), ("exposed pp", "pp_exposed_us"),
             ("exposed dp", "dp_exposed_us"))

    def series(rows: list[pd.Series]) -> dict[str, list[float]]:
        # a part measured below 0 (noise) hid nothing, not less than nothing
        return {name: [max(0.0, plots.as_float(row.get(col)) or 0.0) / 1e3 for row in rows]
                for name, col in parts}

    return plots.bar_chart(runs, "step.csv", lambda row: row_label(row.to_dict()), series, True,
                      "step (ms)", "step: compute + bubble + exposed communication",
                      out / "step_parts.png")
