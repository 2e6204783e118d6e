"""`distbench pp` read back: its report section and its bubble, measured beside the analytic one.
The pandas and matplotlib parts are imported when report runs, never when the command line is
built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core import contracts
from distbench.core.tables import number

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

OUTPUT = contracts.PP


def section(run: Run) -> list[str]:
    from distbench.results import report

    return report.step_table(
        run, "pp.csv", "Pipeline parallel",
        ["schedule", "micro-batches", "stages", "step (ms)", "bubble measured",
         "bubble analytic"],
        lambda r: [str(r["schedule"]), str(r["micro_batches"]), str(r.get("stages")),
                   number(r["step_us"] / 1e3), report.fixed(r["bubble_measured"], ".3f"),
                   report.fixed(r["bubble_analytic"], ".3f")])


def draw(runs: list[Run], out: Path) -> list[Path]:
    """Each schedule's measured bubble beside the analytic one."""
    from distbench.results import plots

    return plots.bar_chart(
        runs, "pp.csv", lambda row: f"{row['schedule']} m={row['micro_batches']}",
        lambda rows: {"measured": [float(row["bubble_measured"]) for row in rows],
                      "analytic": [float(row["bubble_analytic"]) for row in rows]},
        False, "bubble (share of the step)", "pp: pipeline bubble, measured vs analytic",
        out / "pp_bubble.png")
