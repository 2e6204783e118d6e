"""`distbench pp` read back: its report section and its bubble, measured beside the analytic one.
The pandas and matplotlib parts are imported when report runs, never when the command line is
built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.tables import Column, Output, number, us_as_ms

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

# pp
# Stable contract: add columns at the end, never rename.
OUTPUT = Output("pp.csv", csv=(
    "schedule", "dtype", "world_size", "nnodes", "stages", "virtual_stages", "layers",
    "layers_per_stage", "micro_batches", "micro_batch_size", "hidden_size", "seq_len", "iters",
    "step_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
    "samples_per_s", "bubble_measured", "bubble_measured_per_stage", "bubble_analytic",
    "p2p_bytes_per_step", "t1_us", "speedup", "efficiency", "max_abs_err", "backend", "status",
    "note",
), console=(
    Column("schedule", "schedule", "", 17, ident=True),
    Column("stages", "stages", "", 7, ident=True),
    Column("layers_per_stage", "layers", "/stage", 14, ident=True),
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("samples_per_s", "samples/s", "", 11, ".1f"),
    Column("bubble_measured", "bubble", "meas.", 8, ".3f"),
    Column("bubble_analytic", "bubble", "analytic", 9, ".3f"),
    Column("p2p_bytes_per_step", "p2p bytes", "per step", 13),
    Column("t1_us", "t1", "(ms)", 10, us_as_ms(".2f")),
    Column("speedup", "speedup", "", 8, ".2f"),
    Column("efficiency", "effic.", "", 7, ".2f"),
    Column("max_abs_err", "max err", "", 10, ".2e"),
    Column("bubble_measured_per_stage", "bubble per stage", "(per rank)", 20),
), read=("schedule", "dtype", "world_size", "micro_batches", "step_us", "bubble_measured",
         "bubble_analytic", "status"),
    identity=("schedule", "dtype", "world_size", "nnodes", "stages", "micro_batches",
              "micro_batch_size"),
    time="step_us", p99="p99_us")


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
