"""`distbench plan` read back: its report section (the fastest layouts that fit, the validation)
and the plan's and the validation's figures. The pandas and matplotlib parts are imported when
report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core import contracts
from distbench.core.tables import markdown_table, number, plural

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

OUTPUT = contracts.PLAN
VALIDATION = contracts.VALIDATION


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
