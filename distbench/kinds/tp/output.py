"""`distbench tp` read back: its report section and its step split into compute and communication.
The pandas and matplotlib parts are imported when report runs, never when the command line is
built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.tables import Column, Output, number, us_as_ms

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

# tp
# Stable contract: add columns at the end, never rename.
OUTPUT = Output("tp.csv", csv=(
    "block", "dtype", "world_size", "nnodes", "hidden_size", "ffn_size", "heads", "seq_len",
    "micro_batch_size", "layers", "iters", "step_us", "rank_min_us", "rank_max_us",
    "slowest_rank", "p50_us", "p99_us", "cv_pct", "compute_only_us", "comm_pct",
    "tflops_per_rank", "tokens_per_s", "allreduce_bytes_per_step", "implied_busbw_gbps",
    "t1_us", "speedup", "efficiency", "max_abs_err", "backend", "status", "note",
), console=(
    Column("block", "block", "", 10, ident=True),
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("compute_only_us", "compute", "(ms)", 10, us_as_ms(".2f")),
    Column("comm_pct", "comm", "(%)", 7, ".1f"),
    # model FLOPs, counted in closed form; the kernels execute more (docs/methodology.md)
    Column("tflops_per_rank", "mTFLOP/s", "(/rank)", 10, ".4f"),
    Column("tokens_per_s", "tokens/s", "", 11, ".1f"),
    Column("allreduce_bytes_per_step", "AR bytes", "(/step)", 12),
    Column("implied_busbw_gbps", "busbw", "(GB/s)", 9, ".3f"),
    Column("t1_us", "t1", "(ms)", 10, us_as_ms(".2f")),
    Column("speedup", "speedup", "", 9, ".2f"),
    Column("efficiency", "effic", "", 7, ".2f"),
    Column("max_abs_err", "max_err", "", 10, ".3g"),
), read=("block", "dtype", "world_size", "step_us", "compute_only_us", "comm_pct", "status"),
    identity=("block", "dtype", "world_size", "nnodes", "hidden_size", "seq_len",
              "micro_batch_size", "layers"),
    time="step_us", p99="p99_us")  # a training step's figure is its step time


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
