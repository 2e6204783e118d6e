"""The report's plots, drawn with matplotlib's Agg backend (no display needed): one PNG per kind
of result, several runs overlaid one line (or bar) per run. Each function takes the runs and
the output directory and returns the files it wrote."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402, F401 - the kinds' legend keys
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    NullFormatter,
    NullLocator,
)

from distbench.results.reader import Run, measured  # noqa: E402

DPI = 100
# Sizes up to this are the latency view: where the time, not the bandwidth, is what matters.
SMALL_BYTES = 64 * 1024
MAX_TICKS = 12


def binary(size: float) -> str:
    """1024 -> 1K, 3 * 2**20 -> 3M: sizes as people write them."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{size:.0f}"


def size_axis(ax, sizes) -> None:
    """A log2 axis with binary labels at powers of two, at most MAX_TICKS of them."""
    ax.set_xscale("log", base=2)
    sizes = [int(s) for s in sizes if s == s and s > 0]  # s == s: not NaN
    if not sizes:
        return
    low, high = min(sizes).bit_length() - 1, max(sizes).bit_length()
    step = max(1, (high - low) // MAX_TICKS + 1)
    ax.xaxis.set_major_locator(FixedLocator([2.0 ** e for e in range(low, high + 1, step)]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: binary(v)))
    ax.set_xlabel("size (bytes per rank)")


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    # a tight box as well: a legend beside the last panel must not run off the image
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path


def grid(n: int, width: float = 5.0, height: float = 3.4):
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = axes.ravel().tolist()
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _series_label(run: Run, key: tuple, names: tuple[str, ...], varying: set[str],
                  several_runs: bool) -> str:
    parts = [run.name] if several_runs else []
    for name, value in zip(names, key, strict=True):
        if name in varying:
            parts.append(("in-place" if value else "out-of-place") if name == "in_place"
                         else str(value))
    return " ".join(parts) or run.name


def curves_figure(runs: list[Run], file: str, panel: str, line_keys: tuple[str, ...], y: str,
                  ylabel: str, small_only: bool = False, title: str = ""):
    """One panel per value of `panel` (an op, a pattern), one line per run and line key; None
    when no run has a row to draw."""
    frames = [(r, measured(r.tables[file])) for r in runs if file in r.tables]
    frames = [(r, f[f[y].notna()]) for r, f in frames]
    if small_only:
        frames = [(r, f[f["size_bytes"] <= SMALL_BYTES]) for r, f in frames]
    frames = [(r, f) for r, f in frames if len(f)]
    if not frames:
        return None
    panels = list(dict.fromkeys(v for _, f in frames for v in f[panel]))
    fig, axes = grid(len(panels))
    labels = []
    for ax, name in zip(axes, panels, strict=True):
        sizes, peaks = [], []
        # what tells this panel's lines apart is all a label needs to say
        varying = {k for k in line_keys if len({v for _, f in frames
                                                for v in f[f[panel] == name][k].astype(str)}) > 1}
        for run, frame in frames:
            rows = frame[frame[panel] == name]
            for key, line in rows.groupby(list(line_keys), sort=False, dropna=False):
                line = line.sort_values("size_bytes")
                sizes += line["size_bytes"].tolist()
                peaks.append(float(line[y].max()))
                labels.append(_series_label(run, key, line_keys, varying, len(frames) > 1))
                ax.plot(line["size_bytes"], line[y], marker="o", markersize=3, label=labels[-1])
        size_axis(ax, sizes)
        value_axis(ax, peaks)
        ax.set_title(f"{name}{title}")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        legend_beside(ax)
    widen_for_legends(fig, min(len(panels), 3), labels)
    return fig


def curves(runs: list[Run], file: str, panel: str, line_keys: tuple[str, ...], y: str,
            ylabel: str, path: Path, small_only: bool = False, title: str = "") -> Path | None:
    fig = curves_figure(runs, file, panel, line_keys, y, ylabel, small_only, title)
    return None if fig is None else save(fig, path)


# Lines whose peaks are further apart than this share a log axis: on a linear one a gloo run
# at 0.1 GB/s beside an H100 log at 300 lies flat on zero.
SPAN = 10.0


def value_axis(ax, peaks: list[float]) -> None:
    shown = [p for p in peaks if p > 0]
    if len(shown) > 1 and max(shown) > SPAN * min(shown):
        # a 0 (nccl-tests prints 0.00 GB/s at 8 B) has no place on it: left out, not drawn as a
        # line falling off the bottom
        ax.set_yscale("log", nonpositive="mask")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def legend_beside(ax) -> None:
    """The legend right of the axes: inside, it hides the lines it names wherever they run."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


LEGEND_CHAR_IN = 0.055  # inches per character of a legend label at fontsize 7
LEGEND_KEY_IN = 0.7  # the line sample, the padding and the frame


def widen_for_legends(fig, columns: int, labels: list[str]) -> None:
    """As wide again as the legends beside each column of panels, so the panels keep theirs."""
    if labels:
        width, height = fig.get_size_inches()
        extra = LEGEND_CHAR_IN * max(map(len, labels)) + LEGEND_KEY_IN
        fig.set_size_inches(width + columns * extra, height)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def bars(ax, labels: list[str], series: dict[str, list[float]], stacked: bool) -> None:
    """Bars per label: stacked parts of one whole, or side by side."""
    xs = range(len(labels))
    width = 0.8 if stacked else 0.8 / max(1, len(series))
    bottom = [0.0] * len(labels)
    for i, (name, values) in enumerate(series.items()):
        if stacked:
            ax.bar(xs, values, width, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        else:
            ax.bar([x + (i - (len(series) - 1) / 2) * width for x in xs], values, width,
                   label=name)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    legend_beside(ax)
    widen_for_legends(ax.figure, 1, list(series))
    ax.grid(True, axis="y", alpha=0.3)


def measured_rows(runs: list[Run], file: str) -> list[tuple[Run, pd.Series]]:
    return [(r, row) for r in runs if file in r.tables
            for _, row in measured(r.tables[file]).iterrows()]


def bar_chart(runs: list[Run], file: str, label, parts, stacked: bool, ylabel: str,
               title: str, path: Path) -> list[Path]:
    """One bar (or group of bars) per measured row of `file` in every run: `label(row)` names
    it, `parts(rows)` gives the bars' series."""
    rows = measured_rows(runs, file)
    if not rows:
        return []
    several = len({r.name for r, _ in rows}) > 1
    labels = [f"{r.name} {label(row)}" if several else label(row) for r, row in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows)), 3.6))
    bars(ax, labels, parts([row for _, row in rows]), stacked)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return [save(fig, path)]


def step_split(rows: list[pd.Series]) -> dict[str, list[float]]:
    compute = [float(row["compute_only_us"]) / 1e3 for row in rows]
    return {"compute": compute,
            "communication": [max(0.0, float(row["step_us"]) / 1e3 - c)
                              for c, row in zip(compute, rows, strict=True)]}


# ---------------------------------------------------------------------------------------------
# A plan (planner.assemble draws these; its rows are plan.csv's and validation.csv's)


def as_float(value) -> float | None:
    """A cell as a float; None for none (NaN or missing)."""
    return None if value is None or pd.isna(value) else float(value)


def unit(values: list[float], units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    """The largest unit the values reach one of: a plan's points on a readable scale, never
    every one at 0 beside a limit far off, nor a shared offset ("1e6") over them."""
    top = max(values, default=0.0)
    return next(((name, scale) for name, scale in units if top >= scale), units[-1])


MEMORY_UNITS = (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10))
TIME_UNITS = (("h", 3.6e6), ("s", 1e3), ("ms", 1.0))  # of milliseconds


def plan_figure(rows: list[dict], path: Path, title: str, best: str | None = None) -> Path:
    """Predicted step against memory per rank, fitting and not, the best and the layouts named
    with --layout marked; the usable memory drawn where it is on the scale of the points, else
    named in the legend."""
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    mem_name, mem_scale = unit([r["memory_per_rank_bytes"] for r in rows], MEMORY_UNITS)
    t_name, t_scale = unit([r["predicted_step_ms"] for r in rows], TIME_UNITS)
    for fit, colour, name in ((True, "tab:blue", "fits"), (False, "tab:grey", "does not fit")):
        sel = [r for r in rows if bool(r["fits"]) == fit]
        if sel:
            ax.scatter([r["memory_per_rank_bytes"] / mem_scale for r in sel],
                       [r["predicted_step_ms"] / t_scale for r in sel], s=12, c=colour,
                       alpha=0.7 if fit else 0.4, label=f"{name} ({len(sel)})")
    top = [r for r in rows if r.get("rank") == 1]
    if top:
        b = top[0]
        ax.scatter([b["memory_per_rank_bytes"] / mem_scale], [b["predicted_step_ms"] / t_scale],
                   s=90, marker="*", c="tab:red", label=f"best: {best or ''}".rstrip(": "),
                   zorder=3)
    mine = [r for r in rows if r.get("given")]
    if mine:  # plan --layout: the layouts the user runs, beside the ranked ones
        ax.scatter([r["memory_per_rank_bytes"] / mem_scale for r in mine],
                   [r["predicted_step_ms"] / t_scale for r in mine], s=70, marker="D",
                   facecolors="none", edgecolors="tab:orange", linewidths=1.5,
                   label=f"named with --layout ({len(mine)})", zorder=4)
    limit = rows[0]["memory_limit_bytes"] if rows else None
    if limit:
        most = max(r["memory_per_rank_bytes"] for r in rows)
        text = f"usable memory ({limit / 2**30:.1f} GiB)"
        if limit <= 3 * most:
            ax.axvline(limit / mem_scale, color="tab:red", linestyle="--", linewidth=1,
                       label=text)
        else:  # far right of every point: drawn, it would squash them against 0
            ax.plot([], [], color="tab:red", linestyle="--", linewidth=1,
                    label=f"{text}, off the axis")
    steps = [r["predicted_step_ms"] for r in rows if r["predicted_step_ms"] > 0]
    if steps and max(steps) > 10 * min(steps):
        ax.set_yscale("log")
    else:
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.set_xlabel(f"memory per rank ({mem_name})")
    ax.set_ylabel(f"predicted step ({t_name})")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, path)


def validation_figure(rows: list[dict], path: Path, title: str, band: float = 0.15) -> Path:
    """Each validated layout's predicted step against its measured one, on the diagonal where
    the plan was right, with the +-band around it; in-sample layouts apart."""
    done = [r for r in rows if r.get("measured_step_ms")]
    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    values = [v for r in done for v in (r["measured_step_ms"], r["predicted_step_ms"])]
    low, high = (min(values) * 0.8, max(values) * 1.2) if values else (0.1, 1.0)
    line = [low, high]
    ax.plot(line, line, color="black", linewidth=1, label="predicted = measured")
    ax.fill_between(line, [v * (1 - band) for v in line], [v * (1 + band) for v in line],
                    color="tab:green", alpha=0.15, label=f"within {band:.0%}")
    for inside, marker, name in ((False, "o", "out of sample"), (True, "s", "in sample")):
        sel = [r for r in done if bool(int(r.get("in_sample") or 0)) == inside]
        if sel:
            ax.scatter([r["measured_step_ms"] for r in sel],
                       [r["predicted_step_ms"] for r in sel], marker=marker, s=30,
                       label=f"{name} ({len(sel)})", zorder=3)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    if high > 10 * low:
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        ax.ticklabel_format(style="plain", useOffset=False)
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, path)


