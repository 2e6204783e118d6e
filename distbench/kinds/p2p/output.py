"""`distbench p2p` read back: its report section (each pattern's peak, the link matrix's slow
links), its busbw and latency curves and the matrix's heatmaps. The pandas and matplotlib parts
are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.contracts import MEASURED_COLUMNS, SIZE_COLUMNS
from distbench.core.sizes import format_size
from distbench.core.tables import Output, markdown_table, number

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from distbench.results.reader import Run

# p2p
# Stable contracts: add columns at the end, never rename.
OUTPUT = Output("p2p.csv", csv=(
    "pattern", "dtype", "world_size", "nnodes", "pairs", "size_bytes", "count", "iters",
    "time_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
    "algbw_gbps", "busbw_gbps", "wrong", "backend", "status", "note", "launch_bound", "reps",
    "spread_pct",
), console=(*SIZE_COLUMNS, *MEASURED_COLUMNS),
    identity=("pattern", "dtype", "world_size", "nnodes", "pairs", "size_bytes"),
    read=("time_us", "p99_us", "busbw_gbps", "status"),
    busbw="busbw_gbps", time="time_us", p99="p99_us", group=lambda row: str(row["pattern"]))
# Long form: one row per ordered pair, direction and size. On the console: N x N grids.
MATRIX_OUTPUT = Output("p2p_matrix.csv", csv=(
    "direction", "src_rank", "dst_rank", "src_host", "dst_host", "src_local_rank",
    "dst_local_rank", "link", "dtype", "world_size", "nnodes", "size_bytes", "count", "iters",
    "time_us", "p50_us", "p99_us", "cv_pct", "gbps", "wrong", "backend", "reps", "spread_pct",
), identity=("direction", "src_rank", "dst_rank", "dtype", "world_size", "nnodes", "size_bytes"),
    read=("src_host", "dst_host", "src_local_rank", "dst_local_rank", "link", "time_us", "p99_us",
          "gbps"),
    busbw="gbps", time="time_us", p99="p99_us", group=lambda row: f"matrix {row['direction']}")


def section(run: Run) -> list[str]:
    from distbench.results import report

    lines = []
    frame = run.table("p2p.csv")
    if frame is not None:
        lines += ["### Point-to-point", ""]
        lines += markdown_table(["pattern", "dtype", "peak busbw (GB/s)", "at size",
                                 "smallest size", "time there (us)"],
                                [[p["pattern"], p["dtype"], number(p["peak"]),
                                  report.size_cell(p["peak_at"]), report.size_cell(p["small"]),
                                  number(p["small_us"])]
                                 for p in report.peaks(frame, ["pattern", "dtype"], "busbw_gbps")])
        lines.append("")
    frame = run.table("p2p_matrix.csv")
    if frame is not None:
        slow = sorted((dtype, *link) for dtype, rows in frame.groupby("dtype", sort=False)
                      for link in matrix_outliers(run, rows))
        lines += ["### Link matrix", "",
                  f"{len(frame)} measurements; {len(slow)} slow links by the run's own rule"
                  + (":" if slow else "."), ""]
        lines += [f"- {dtype} {d} {format_size(int(size))}: rank {src} "
                  f"{'<->' if d == 'bi' else '->'} rank {dst}"
                  for dtype, d, size, src, dst in slow[:20]]
        culprits = (run.meta.get("matrix") or {}).get("culprits") or []
        if culprits:
            lines += ["", "Likely culprit: " + ", ".join(culprits)]
        lines.append("")
    return lines


def draw(runs: list[Run], out: Path) -> list[Path]:
    from distbench.results import plots

    made = [plots.curves(runs, "p2p.csv", "pattern", ("dtype",), "busbw_gbps", "busbw (GB/s)",
                    out / "p2p_busbw.png"),
            plots.curves(runs, "p2p.csv", "pattern", ("dtype",), "time_us", "time (us)",
                    out / "p2p_latency.png")]
    made += [matrix(r, out) for r in runs if "p2p_matrix.csv" in r.tables]
    return [p for p in made if p]


def matrix_outliers(run: Run, frame: pd.DataFrame) -> set[tuple[str, int, int, int]]:
    """(direction, size, src, dst) of the links the run's own rule calls slow."""
    import pandas as pd

    from distbench.results.links import Link, find_outliers, references

    below = float((run.meta.get("matrix") or {}).get("outlier_below") or 0.8)
    links = [Link(int(r.src_rank), int(r.dst_rank), f"{r.src_host}:{r.src_local_rank}",
                  f"{r.dst_host}:{r.dst_local_rank}", str(r.link), str(r.direction),
                  int(r.size_bytes), float(r.gbps))
             for r in frame.itertuples() if pd.notna(r.gbps)]
    return {(o.link.direction, o.link.size_bytes, o.link.src_rank, o.link.dst_rank)
            for o in find_outliers(links, below, references(links))}


def matrix(run: Run, out: Path) -> Path | None:
    """A heatmap per dtype, size (rows of panels) and direction: GB/s from the source rank (row)
    to the destination rank (column); slow links, judged within their dtype, boxed in red."""

    from distbench.results import plots

    frame = run.tables["p2p_matrix.csv"]
    frame = frame[frame["gbps"].notna()]
    if not len(frame):
        return None
    slow = {(dtype, *link) for dtype, rows in frame.groupby("dtype", sort=False)
            for link in matrix_outliers(run, rows)}
    n = int(frame["world_size"].max())
    panels = [key for key, _ in frame.groupby(["dtype", "size_bytes", "direction"], sort=True)]
    fig, axes = plots.grid(len(panels), width=4.2, height=3.6)
    for ax, (dtype, size, direction) in zip(axes, panels, strict=True):
        cells = frame[(frame["dtype"] == dtype) & (frame["size_bytes"] == size)
                      & (frame["direction"] == direction)]
        grid = [[float("nan")] * n for _ in range(n)]
        for r in cells.itertuples():
            grid[int(r.src_rank)][int(r.dst_rank)] = float(r.gbps)
        image = ax.imshow(grid, cmap="viridis")
        fig.colorbar(image, ax=ax, label="GB/s")
        for r in cells.itertuples():
            if (dtype, direction, int(size), int(r.src_rank), int(r.dst_rank)) in slow:
                ax.add_patch(plots.plt.Rectangle((int(r.dst_rank) - 0.5, int(r.src_rank) - 0.5),
                                                 1, 1, fill=False, edgecolor="red",
                                                 linewidth=2.5))
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xlabel("destination rank")
        ax.set_ylabel("source rank")
        ax.set_title(f"{run.name}: {dtype} {direction} {plots.binary(int(size))}", fontsize=9)
    return plots.save(fig, out / f"p2p_matrix_{plots.slug(run.name)}.png")
