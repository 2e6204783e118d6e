"""`distbench tp` read back: its report section and its step split into compute and communication.
The pandas and matplotlib parts are imported when report runs, never when the command line is
built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core import contracts
from distbench.core.tables import number

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

OUTPUT = contracts.TP


def section(run: Run) -> list[str]:
    from distbench.results import report

    return report.step_table(
        run, "tp.csv", "Tensor parallel",
        ["block", "dtype", "ranks", "step (ms)", "compute only (ms)", "comm %"],
        lambda r: [str(r["block"]), str(r["dtype"]), str(r["world_size"]),
                   number(r["step_us"] / 1e3), number(r["compute_only_us"] / 1e3),
                   report.fixed(r["comm_pct"], ".1f")])


def draw(runs: list[Run], out: Path) -> list[Path]:
    """Each block's step split into compute and the communication on top of it (ms)."""
    from distbench.results import plots

    return plots.bar_chart(runs, "tp.csv", lambda row: f"{row['block']} {row['dtype']}",
                      plots.step_split, True, "step (ms)", "tp: step = compute + communication",
                      out / "tp_step.png")
