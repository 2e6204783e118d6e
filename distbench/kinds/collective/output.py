"""`distbench collective` read back: its report section (peaks and the alpha-beta model), the
header's note on a run split into groups, the fits model.json holds, and its busbw and latency
curves. The pandas and matplotlib parts are imported when report runs, never when the command
line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.contracts import MEASURED_COLUMNS, SIZE_COLUMNS
from distbench.core.tables import Column, Output, markdown_table, missing, number

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.results.reader import Run

# Stable contract: add columns at the end, never rename.
OUTPUT = Output("collective.csv", csv=(
    "op", "dtype", "redop", "root", "in_place", "world_size", "nnodes", "size_bytes", "count",
    "iters", "time_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us",
    "cv_pct", "algbw_gbps", "busbw_gbps", "wrong", "backend", "status", "note", "launch_bound",
    "reps", "spread_pct", "group_size", "group_stride", "groups", "per_node",
), console=(
    *SIZE_COLUMNS,
    Column("redop", "redop", "", 6, ident=True),
    Column("root", "root", "", 5, ident=True),
    Column("in_place", "place", "", 6, fmt=lambda v: "in" if v else "out", ident=True),
    *MEASURED_COLUMNS,
), identity=("op", "dtype", "redop", "root", "in_place", "world_size", "nnodes", "size_bytes",
             "group_size", "group_stride"),
    read=("time_us", "p99_us", "algbw_gbps", "busbw_gbps", "status"),
    identity_since=("group_size", "group_stride"),
    busbw="busbw_gbps", time="time_us", p99="p99_us", group=lambda row: str(row["op"]),
    nccl_tests=True)


def fits(run: Run) -> list[dict]:
    """The alpha-beta fit of every op (and dtype, redop, placement) of a run's collective.csv,
    plus the run's name."""
    from distbench.results import alphabeta

    frame = run.table("collective.csv")
    if frame is None:
        return []
    return [{"run": run.name, **m} for m in alphabeta.fit_rows(frame)]


def world_note(run: Run) -> str:
    """How a `collective --group-size` run split its world, said where it did."""
    frame = run.tables.get("collective.csv")
    if frame is None or "group_size" not in frame.columns or not len(frame):
        return ""
    row = frame.iloc[0]
    if missing(row.get("groups")) or int(row["groups"]) <= 1:
        return ""
    return (f", in {int(row['groups'])} groups of {int(row['group_size'])} at stride "
            f"{int(row['group_stride'])} ({int(row['per_node'])} a node) all at once")


def section(run: Run) -> list[str]:
    from distbench.results import report

    frame = run.table("collective.csv")
    if frame is None:
        return []
    lines = ["### Collectives", ""]
    group = ["op", "dtype", "redop", "in_place"]
    peaks = report.peaks(frame, group, "busbw_gbps")
    lines += markdown_table(["op", "dtype", "redop", "place", "peak busbw (GB/s)", "at size",
                             "smallest size", "time there (us)"],
                            [[p["op"], p["dtype"], str(p["redop"]),
                              "in" if p["in_place"] else "out", number(p["peak"]),
                              report.size_cell(p["peak_at"]), report.size_cell(p["small"]),
                              number(p["small_us"])]
                             for p in peaks])
    lines += [""] + report.skipped(frame)
    lines += ["#### Alpha-beta model", "",
              "`T(S) = alpha + S / beta`, alpha fitted on the small sizes and beta past the "
              "knee (docs/report.md).", ""]
    lines += markdown_table(["op", "dtype", "redop", "place", "alpha (us)",
                             "busbw asymptote (GB/s)", "fit error (median / max %)", "n_half",
                             "n_90%", "note"],
                            [[f["op"], f["dtype"], report.redop_root(f),
                              "in" if f["in_place"] else "out", number(f["alpha_us"], 3),
                              number(f["busbw_gbps"]),
                              f"{report.fixed(f['err_pct'], '.1f')} / "
                              f"{report.fixed(f['max_err_pct'], '.1f')}",
                              report.size_cell(f["n_half_bytes"]),
                              report.size_cell(f["n90_bytes"]),
                              f.get("note") or ""]
                             for f in fits(run)])
    return lines + [""]


def draw(runs: list[Run], out: Path) -> list[Path]:
    from distbench.results import plots

    keys = ("dtype", "redop", "in_place")
    made = [plots.curves(runs, "collective.csv", "op", keys, "busbw_gbps", "busbw (GB/s)",
                    out / "collective_busbw.png"),
            plots.curves(runs, "collective.csv", "op", keys, "time_us", "time (us)",
                    out / "collective_latency.png", small_only=True,
                    title=f": sizes up to {plots.binary(plots.SMALL_BYTES)}")]
    return [p for p in made if p]
