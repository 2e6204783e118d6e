"""`distbench step` read back (plan --validate writes step.csv too): its report section, the
measured peak beside the model's, and each layout's step in its parts. The pandas and matplotlib
parts are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core import contracts
from distbench.core.layout_label import row_label
from distbench.core.tables import missing

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from distbench.results.reader import Run

OUTPUT = contracts.STEP


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
