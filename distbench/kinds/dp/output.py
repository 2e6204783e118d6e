"""`distbench dp` read back: its report section and its step and state per rank. The pandas and
matplotlib parts are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.tables import Column, Output, number, us_as_ms

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

# dp
# Stable contract: add columns at the end, never rename.
OUTPUT = Output("dp.csv", csv=(
    "mode", "bucket_cap_mb", "dtype", "world_size", "nnodes", "block", "hidden_size",
    "ffn_size", "heads", "seq_len", "micro_batch_size", "layers", "params", "iters", "step_us",
    "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
    "compute_only_us", "comm_alone_us", "exposed_comm_us", "overlap_pct", "bytes_per_step",
    "bytes_counted", "implied_busbw_gbps", "state_bytes_per_rank", "state_bytes_formula",
    "peak_mem_bytes",
    "samples_per_s", "t1_us", "efficiency", "max_abs_err", "backend", "status", "note",
), console=(
    Column("mode", "mode", "", 7, ident=True),
    Column("bucket_cap_mb", "bucket", "(MiB)", 8, "g", ident=True),
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("compute_only_us", "compute", "(ms)", 10, us_as_ms(".2f")),
    Column("comm_alone_us", "comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("exposed_comm_us", "exposed", "(ms)", 10, us_as_ms(".2f")),
    Column("overlap_pct", "overlap", "(%)", 8, ".1f"),
    Column("bytes_per_step", "bytes", "(/step)", 12),
    Column("implied_busbw_gbps", "busbw", "(GB/s)", 8, ".3f"),
    Column("state_bytes_per_rank", "state", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("samples_per_s", "samples/s", "", 10, ".1f"),
    Column("efficiency", "effic", "", 7, ".2f"),
    Column("max_abs_err", "max_err", "", 10, ".3g"),
), read=("mode", "bucket_cap_mb", "dtype", "world_size", "step_us", "compute_only_us",
         "comm_alone_us", "exposed_comm_us", "overlap_pct", "state_bytes_per_rank", "status"),
    identity=("mode", "bucket_cap_mb", "dtype", "world_size", "nnodes", "block",
              "micro_batch_size", "layers"),
    time="step_us", p99="p99_us")


def section(run: Run) -> list[str]:
    from distbench.results import reader, report

    lines = report.step_table(
        run, "dp.csv", "Data parallel",
        ["mode", "dtype", "ranks", "step (ms)", "compute only (ms)", "exposed comm (ms)",
         "comm alone (ms)", "overlap %", "state per rank", "ZeRO table"],
        lambda r: [reader.dp_mode(r), str(r["dtype"]), str(r["world_size"]),
                   number(r["step_us"] / 1e3), number(r["compute_only_us"] / 1e3),
                   number(r["exposed_comm_us"] / 1e3), number(r["comm_alone_us"] / 1e3),
                   report.fixed(r["overlap_pct"], ".1f"),
                   report.size_cell(r["state_bytes_per_rank"]),
                   report.size_cell(r.get("state_bytes_formula"))])
    return (lines + report.skipped(run.table("dp.csv"))) if lines else []


def dp_figure(runs: list[Run]):
    """Per mode of every dp run: the step as compute plus the communication it left exposed,
    and beside it the state each rank holds; None without a measured dp row."""

    from distbench.results import plots, reader

    rows = plots.measured_rows(runs, "dp.csv")
    if not rows:
        return None
    several = len({r.name for r, _ in rows}) > 1
    labels = [f"{r.name} {reader.dp_mode(row)}" if several else reader.dp_mode(row)
              for r, row in rows]
    width = max(4.0, 0.9 * len(rows))
    fig, (step, state) = plots.plt.subplots(1, 2, figsize=(2 * width, 3.8), squeeze=True)
    compute = [float(row["compute_only_us"]) / 1e3 for _, row in rows]
    # a step measured faster than its compute alone (noise) exposed nothing, not less
    exposed = [max(0.0, float(row["exposed_comm_us"]) / 1e3) for _, row in rows]
    plots.bars(step, labels, {"compute": compute, "exposed communication": exposed}, True)
    step.set_ylabel("step (ms)")
    step.set_title("dp: step = compute + exposed communication", fontsize=10)
    plots.bars(state, labels, {"measured": [float(row["state_bytes_per_rank"]) / 2**20
                                       for _, row in rows],
                          "ZeRO table": [float(row.get("state_bytes_formula", float("nan")))
                                         / 2**20 for _, row in rows]}, False)
    state.set_ylabel("state per rank (MiB)")
    state.set_title("dp: parameters, gradients, optimizer state per rank", fontsize=10)
    return fig


def draw(runs: list[Run], out: Path) -> list[Path]:
    from distbench.results import plots

    fig = dp_figure(runs)
    return [] if fig is None else [plots.save(fig, out / "dp_step.png")]
