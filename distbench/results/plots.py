"""The report's plots, drawn with matplotlib's Agg backend (no display needed): one PNG per kind
of result, several runs overlaid one line (or bar) per run. Each function takes the runs and
the output directory and returns the files it wrote."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    MaxNLocator,
    NullFormatter,
    NullLocator,
)

from distbench.core.layout_label import row_label  # noqa: E402
from distbench.results import reader  # noqa: E402
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


def _size_axis(ax, sizes) -> None:
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


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    # a tight box as well: a legend beside the last panel must not run off the image
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path


def _grid(n: int, width: float = 5.0, height: float = 3.4):
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
    fig, axes = _grid(len(panels))
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
        _size_axis(ax, sizes)
        _value_axis(ax, peaks)
        ax.set_title(f"{name}{title}")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        _legend_beside(ax)
    _widen_for_legends(fig, min(len(panels), 3), labels)
    return fig


def _curves(runs: list[Run], file: str, panel: str, line_keys: tuple[str, ...], y: str,
            ylabel: str, path: Path, small_only: bool = False, title: str = "") -> Path | None:
    fig = curves_figure(runs, file, panel, line_keys, y, ylabel, small_only, title)
    return None if fig is None else _save(fig, path)


# Lines whose peaks are further apart than this share a log axis: on a linear one a gloo run
# at 0.1 GB/s beside an H100 log at 300 lies flat on zero.
SPAN = 10.0


def _value_axis(ax, peaks: list[float]) -> None:
    shown = [p for p in peaks if p > 0]
    if len(shown) > 1 and max(shown) > SPAN * min(shown):
        # a 0 (nccl-tests prints 0.00 GB/s at 8 B) has no place on it: left out, not drawn as a
        # line falling off the bottom
        ax.set_yscale("log", nonpositive="mask")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def _legend_beside(ax) -> None:
    """The legend right of the axes: inside, it hides the lines it names wherever they run."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


LEGEND_CHAR_IN = 0.055  # inches per character of a legend label at fontsize 7
LEGEND_KEY_IN = 0.7  # the line sample, the padding and the frame


def _widen_for_legends(fig, columns: int, labels: list[str]) -> None:
    """As wide again as the legends beside each column of panels, so the panels keep theirs."""
    if labels:
        width, height = fig.get_size_inches()
        extra = LEGEND_CHAR_IN * max(map(len, labels)) + LEGEND_KEY_IN
        fig.set_size_inches(width + columns * extra, height)


def collective(runs: list[Run], out: Path) -> list[Path]:
    keys = ("dtype", "redop", "in_place")
    made = [_curves(runs, "collective.csv", "op", keys, "busbw_gbps", "busbw (GB/s)",
                    out / "collective_busbw.png"),
            _curves(runs, "collective.csv", "op", keys, "time_us", "time (us)",
                    out / "collective_latency.png", small_only=True,
                    title=f": sizes up to {binary(SMALL_BYTES)}")]
    return [p for p in made if p]


def p2p(runs: list[Run], out: Path) -> list[Path]:
    made = [_curves(runs, "p2p.csv", "pattern", ("dtype",), "busbw_gbps", "busbw (GB/s)",
                    out / "p2p_busbw.png"),
            _curves(runs, "p2p.csv", "pattern", ("dtype",), "time_us", "time (us)",
                    out / "p2p_latency.png")]
    made += [matrix(r, out) for r in runs if "p2p_matrix.csv" in r.tables]
    return [p for p in made if p]


def matrix_outliers(run: Run, frame: pd.DataFrame) -> set[tuple[str, int, int, int]]:
    """(direction, size, src, dst) of the links the run's own rule calls slow."""
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
    frame = run.tables["p2p_matrix.csv"]
    frame = frame[frame["gbps"].notna()]
    if not len(frame):
        return None
    slow = {(dtype, *link) for dtype, rows in frame.groupby("dtype", sort=False)
            for link in matrix_outliers(run, rows)}
    n = int(frame["world_size"].max())
    panels = [key for key, _ in frame.groupby(["dtype", "size_bytes", "direction"], sort=True)]
    fig, axes = _grid(len(panels), width=4.2, height=3.6)
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
                ax.add_patch(plt.Rectangle((int(r.dst_rank) - 0.5, int(r.src_rank) - 0.5), 1, 1,
                                           fill=False, edgecolor="red", linewidth=2.5))
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xlabel("destination rank")
        ax.set_ylabel("source rank")
        ax.set_title(f"{run.name}: {dtype} {direction} {binary(int(size))}", fontsize=9)
    return _save(fig, out / f"p2p_matrix_{_slug(run.name)}.png")


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _bars(ax, labels: list[str], series: dict[str, list[float]], stacked: bool) -> None:
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
    _legend_beside(ax)
    _widen_for_legends(ax.figure, 1, list(series))
    ax.grid(True, axis="y", alpha=0.3)


def _rows(runs: list[Run], file: str) -> list[tuple[Run, pd.Series]]:
    return [(r, row) for r in runs if file in r.tables
            for _, row in measured(r.tables[file]).iterrows()]


def _bar_chart(runs: list[Run], file: str, label, parts, stacked: bool, ylabel: str,
               title: str, path: Path) -> list[Path]:
    """One bar (or group of bars) per measured row of `file` in every run: `label(row)` names
    it, `parts(rows)` gives the bars' series."""
    rows = _rows(runs, file)
    if not rows:
        return []
    several = len({r.name for r, _ in rows}) > 1
    labels = [f"{r.name} {label(row)}" if several else label(row) for r, row in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(rows)), 3.6))
    _bars(ax, labels, parts([row for _, row in rows]), stacked)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return [_save(fig, path)]


def _step_split(rows: list[pd.Series]) -> dict[str, list[float]]:
    compute = [float(row["compute_only_us"]) / 1e3 for row in rows]
    return {"compute": compute,
            "communication": [max(0.0, float(row["step_us"]) / 1e3 - c)
                              for c, row in zip(compute, rows, strict=True)]}


def tp(runs: list[Run], out: Path) -> list[Path]:
    """Each block's step split into compute and the communication on top of it (ms)."""
    return _bar_chart(runs, "tp.csv", lambda row: f"{row['block']} {row['dtype']}",
                      _step_split, True, "step (ms)", "tp: step = compute + communication",
                      out / "tp_step.png")


def pp(runs: list[Run], out: Path) -> list[Path]:
    """Each schedule's measured bubble beside the analytic one."""
    return _bar_chart(
        runs, "pp.csv", lambda row: f"{row['schedule']} m={row['micro_batches']}",
        lambda rows: {"measured": [float(row["bubble_measured"]) for row in rows],
                      "analytic": [float(row["bubble_analytic"]) for row in rows]},
        False, "bubble (share of the step)", "pp: pipeline bubble, measured vs analytic",
        out / "pp_bubble.png")


def dp_figure(runs: list[Run]):
    """Per mode of every dp run: the step as compute plus the communication it left exposed,
    and beside it the state each rank holds; None without a measured dp row."""
    rows = _rows(runs, "dp.csv")
    if not rows:
        return None
    several = len({r.name for r, _ in rows}) > 1
    labels = [f"{r.name} {reader.dp_mode(row)}" if several else reader.dp_mode(row)
              for r, row in rows]
    width = max(4.0, 0.9 * len(rows))
    fig, (step, state) = plt.subplots(1, 2, figsize=(2 * width, 3.8), squeeze=True)
    compute = [float(row["compute_only_us"]) / 1e3 for _, row in rows]
    # a step measured faster than its compute alone (noise) exposed nothing, not less
    exposed = [max(0.0, float(row["exposed_comm_us"]) / 1e3) for _, row in rows]
    _bars(step, labels, {"compute": compute, "exposed communication": exposed}, True)
    step.set_ylabel("step (ms)")
    step.set_title("dp: step = compute + exposed communication", fontsize=10)
    _bars(state, labels, {"measured": [float(row["state_bytes_per_rank"]) / 2**20
                                       for _, row in rows],
                          "ZeRO table": [float(row.get("state_bytes_formula", float("nan")))
                                         / 2**20 for _, row in rows]}, False)
    state.set_ylabel("state per rank (MiB)")
    state.set_title("dp: parameters, gradients, optimizer state per rank", fontsize=10)
    return fig


def dp(runs: list[Run], out: Path) -> list[Path]:
    fig = dp_figure(runs)
    return [] if fig is None else [_save(fig, out / "dp_step.png")]


VERDICT_COLOURS = {"PASS": "tab:green", "WARN": "tab:orange", "FAIL": "tab:red",
                   "INCONCLUSIVE": "tab:purple", "SKIP": "tab:gray"}
OTHER_VERDICT = "black"
WARN_LINE = "black"
NOTE_CHARS = 60


def _number(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _margin(value: float | None, line: float | None, higher_is_better: bool) -> float | None:
    """How good `value` is against `line`, above 1 better whatever the metric's direction."""
    if value is None or line is None or line <= 0 or value < 0:
        return None
    if higher_is_better:
        return value / line
    return line / value if value > 0 else None


def verdict_margins(row: pd.Series) -> tuple[float | None, float | None, str]:
    """(the measurement against the line it fails below, the warn line on the same scale, what
    that line is): measured / expected, expected / measured for a time, so that 1 is the fail
    line and below it fails for every metric. A check with no fail line is drawn against its
    warn line. accept.csv's `ratio` is against the reference (the peers' value, the baseline's
    figure), not the fail line, so it is not what is drawn."""
    _, higher = reader.check_metric(row.get("metric"))
    measured = _number(row.get("measured"))
    fail, warn = _number(row.get("expected")), _number(row.get("warn_at"))
    if fail is None:
        return _margin(measured, warn, higher), None, "warn line"
    return _margin(measured, fail, higher), _margin(warn, fail, higher), "fail line"


def _retest(row: pd.Series) -> bool:
    return bool(_number(row.get("retest")))


def _verdict_label(run: Run, row: pd.Series, several: bool) -> str:
    return ((f"{run.name}: " if several else "") + f"{row['check']} @ {row['target']}"
            + (" (retest)" if _retest(row) else ""))


def _verdict_note(row: pd.Series, line_name: str) -> str:
    """The figures behind a row's bar, in the metric's unit; without them, why."""
    unit, _ = reader.check_metric(row.get("metric"))
    measured = _number(row.get("measured"))
    line = _number(row.get("expected" if line_name == "fail line" else "warn_at"))
    if measured is not None and line is not None:
        from distbench.core.tables import number  # the report's own format: 150000, not 1.5e+05

        return f"{number(measured)} {unit}, {line_name} {number(line)}"
    wrong = _number(row.get("wrong"))
    if wrong:
        return f"{wrong:.0f} wrong elements"
    note = "" if pd.isna(row.get("note")) else str(row.get("note") or "")
    why = note.split(";")[0] or ("not measured" if measured is None else "no line to judge by")
    return why if len(why) <= NOTE_CHARS else why[:NOTE_CHARS - 3] + "..."


def accept_figure(runs: list[Run]):
    """The figure behind accept_verdicts.png, or None when no run has accept.csv."""
    rows = [(r, row) for r in runs if "accept.csv" in r.tables
            for _, row in r.tables["accept.csv"].iterrows()]
    if not rows:
        return None
    several = len({r.name for r, _ in rows}) > 1
    drawn = [(row, *verdict_margins(row)) for _, row in rows]
    scale = [m for _, a, w, _ in drawn for m in (a, w) if m is not None and m > 0] + [1.0]
    # a log axis: a FAIL at a hundredth of its line is as plain beside a PASS at twenty times
    # it as the PASS is; a few tenths of a decade of room either side
    low, high = min(scale) / 2.5, max(scale) * 2.5
    low, high = min(low, 0.5), max(high, 2.0)
    # no tight_layout: the axes keep their width, and the labels and notes either side widen
    # the saved image instead (accept() saves with a tight box)
    fig, ax = plt.subplots(figsize=(8.0, 0.34 * len(rows) + 1.6))
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.axvline(1.0, color="black", linewidth=1.0, zorder=1)
    notes = ax.get_yaxis_transform()  # x in axes fractions, y in rows
    for i, (row, margin, warn, line_name) in enumerate(drawn):
        verdict = str(row.get("verdict"))
        colour = VERDICT_COLOURS.get(verdict, OTHER_VERDICT)
        hatch = "//" if _retest(row) else None
        if margin is not None:
            shown = min(max(margin, low), high)  # a 0 GB/s drawn at the axis' edge
            ax.barh(i, abs(shown - 1.0), left=min(shown, 1.0), height=0.6, color=colour,
                    hatch=hatch, edgecolor="white" if hatch else colour, zorder=2,
                    gid=f"verdict-{i}")
            ax.plot([shown], [i], marker="o", markersize=4, color=colour, zorder=3)
        else:  # nothing measured, or no line to measure it against: the verdict alone
            ax.plot([1.0], [i], marker="X" if verdict == "FAIL" else "o", markersize=8,
                    color=colour, zorder=3)
        if warn is not None:
            ax.plot([warn], [i], marker="|", markersize=14, markeredgewidth=2,
                    color=WARN_LINE, zorder=4)
        ax.text(1.01, i, f"{verdict}: {_verdict_note(row, line_name)}", transform=notes,
                va="center", fontsize=8, color=colour)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([_verdict_label(r, row, several) for r, row in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.set_xlabel("measured against its fail line (measured / expected; expected / measured "
                  "for a time), log scale: right of 1 passes it, left fails", fontsize=9)
    present = {str(row.get("verdict")) for row, *_ in drawn}
    seen = [v for v in VERDICT_COLOURS if v in present] + sorted(present - set(VERDICT_COLOURS))
    handles = [Patch(color=VERDICT_COLOURS.get(v, OTHER_VERDICT), label=v) for v in seen]
    handles += [Line2D([], [], color="black", label="fail line"),
                Line2D([], [], color=WARN_LINE, marker="|", markersize=12, linestyle="",
                       markeredgewidth=2, label="warn line")]
    if any(_retest(row) for row, *_ in drawn):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="retest"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles),
              fontsize=8, frameon=False, borderaxespad=0.2, handlelength=1.5,
              columnspacing=1.2)
    ax.set_title("accept: each check measured against its fail line", fontsize=11, pad=24)
    return fig


def accept(runs: list[Run], out: Path) -> list[Path]:
    """Each check and target measured against its fail line, coloured by its verdict."""
    fig = accept_figure(runs)
    if fig is None:
        return []
    path = out / "accept_verdicts.png"
    # labels and notes as long as the checks' names: the image grows to hold them, unclipped
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return [path]


# ---------------------------------------------------------------------------------------------
# A plan (planner.assemble draws these; its rows are plan.csv's and validation.csv's)


def _unit(values: list[float], units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
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
    mem_name, mem_scale = _unit([r["memory_per_rank_bytes"] for r in rows], MEMORY_UNITS)
    t_name, t_scale = _unit([r["predicted_step_ms"] for r in rows], TIME_UNITS)
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
    return _save(fig, path)


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
    return _save(fig, path)


def step(runs: list[Run], out: Path) -> list[Path]:
    """Each layout's step as its compute, bubble and the communication each dimension left
    exposed (ms)."""
    parts = (("compute", "compute_only_us"), ("bubble", "bubble_us"),
             ("exposed tp", "tp_exposed_us"), ("exposed pp", "pp_exposed_us"),
             ("exposed dp", "dp_exposed_us"))

    def series(rows: list[pd.Series]) -> dict[str, list[float]]:
        # a part measured below 0 (noise) hid nothing, not less than nothing
        return {name: [max(0.0, _number(row.get(col)) or 0.0) / 1e3 for row in rows]
                for name, col in parts}

    return _bar_chart(runs, "step.csv", lambda row: row_label(row.to_dict()), series, True,
                      "step (ms)", "step: compute + bubble + exposed communication",
                      out / "step_parts.png")


def plan(runs: list[Run], out: Path) -> list[Path]:
    """Each plan run's predicted step against memory, and its validation's predicted against
    measured steps."""
    paths = []
    for run in runs:
        frame = run.table("plan.csv")
        if frame is not None and len(frame):
            paths.append(plan_figure(frame.to_dict("records"), out / f"plan_{_slug(run.name)}.png",
                                     f"plan: {run.name}"))
        frame = run.table("validation.csv")
        if frame is not None and frame["measured_step_ms"].notna().any():
            paths.append(validation_figure(frame.to_dict("records"),
                                           out / f"validation_{_slug(run.name)}.png",
                                           f"plan --validate: {run.name}"))
    return paths


STATE_COLOURS = {"ok": "tab:green", "warn": "tab:orange", "fail": "tab:red",
                 "unknown": "tab:gray"}
OTHER_STATE = "tab:purple"  # a state a later watch adds
STRAGGLER = "darkred"
MAX_NOTES = 20  # change notes a panel writes; past that its lines alone (a flapping probe)
DOTS = 200


def watch(runs: list[Run], out: Path) -> list[Path]:
    """Per watch run: each probe's busbw per cycle, its states and the stragglers marked."""
    return [_save(fig, out / f"watch_{_slug(run.name)}.png") for run in runs
            if (fig := watch_figure(run)) is not None]


def watch_figure(run: Run):
    """The figure behind a watch run's plot, or None when it has no probe: a panel per probe,
    its busbw per cycle over bands of its state's colour, each state change a line in the new
    state's colour, the cycles the judge counted a rank late in a red x on the busbw, and each
    straggler named (dashed) or no longer named (dotted) a line across every panel. Artists
    carry gids (busbw, late, state:CYCLE, named:RANK, cleared:RANK) for what reads it back."""
    history = reader.watch_history(run)
    if history is None or not len(history.probes):
        return None
    rows, changes = history.probes, history.changes
    names = list(dict.fromkeys(rows["probe"]))
    fig, axes = plt.subplots(len(names), 1, figsize=(8.0, 2.3 * len(names) + 1.0),
                             sharex=True, squeeze=False)
    axes = axes[:, 0].tolist()
    late = history.cycles[history.cycles["late"].map(bool)]
    ranks = sorted({r for t in late["late"] for r in t})
    late_label = (f"rank {ranks[0]} late" if len(ranks) == 1 else "a rank late") + \
        " (the judge's late counts)"
    ranks_named = changes[changes["what"].str.startswith("rank ")]
    for i, (ax, name) in enumerate(zip(axes, names, strict=True)):
        mine = rows[rows["probe"] == name].sort_values("cycle", kind="stable")
        _state_bands(ax, mine)
        ok = mine[(mine["status"] == "ok") & mine["busbw_gbps"].notna()]
        # a dot per cycle while they are apart: a week of cycles would be a bar of dots
        ax.plot(ok["cycle"], ok["busbw_gbps"], marker="." if len(ok) <= DOTS else None,
                color="tab:blue", label="busbw", gid="busbw")
        failed = mine[(mine["status"] == "failed") & mine["busbw_gbps"].notna()]
        if len(failed):
            ax.scatter(failed["cycle"], failed["busbw_gbps"], marker="X", c="black", zorder=4,
                       label="failed (wrong data)", gid="failed")
        hit = ok[ok["cycle"].isin(late["cycle"])]
        if len(hit):
            ax.scatter(hit["cycle"], hit["busbw_gbps"], marker="x", s=50, c="tab:red",
                       zorder=5, label=late_label, gid="late")
        notes = ax.get_xaxis_transform()  # x in cycles, y in axes fractions
        shifts = changes[changes["what"] == name]
        for c in shifts.itertuples():
            new = c.change.rpartition(" -> ")[2]
            ax.axvline(c.cycle, color=STATE_COLOURS.get(new, OTHER_STATE), linewidth=1.5,
                       gid=f"state:{c.cycle}")
            if len(shifts) <= MAX_NOTES:
                ax.text(c.cycle, 0.97, f" {c.change.replace(' -> ', ' → ')}", transform=notes,
                        rotation=90, va="top", ha="right", fontsize=7)
        for c in ranks_named.itertuples():
            rank, on = c.what.split()[1], c.change == "named a straggler"
            ax.axvline(c.cycle, color=STRAGGLER, linestyle="--" if on else ":", linewidth=1.2,
                       gid=f"{'named' if on else 'cleared'}:{rank}")
            if i == 0 and len(ranks_named) <= MAX_NOTES:
                ax.text(c.cycle, 0.03, f" rank {rank} {'named' if on else 'cleared'}",
                        transform=notes, rotation=90, va="bottom", ha="left", fontsize=7,
                        color=STRAGGLER)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(name, fontsize=9)
        ax.grid(True, alpha=0.3)
    first = history.cycles.iloc[0]
    every = f", every {history.interval_s:g} s" if history.interval_s else ""
    axes[-1].set_xlabel(f"cycle (cycle {first['cycle']} started {first['started'] or '-'}"
                        f"{every})")
    # cycles are whole: a run of one cycle is not drawn on an axis of -0.04 to 0.04
    axes[-1].set_xlim(float(rows["cycle"].min()) - 0.5, float(rows["cycle"].max()) + 0.5)
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    handles = _watch_legend(axes, rows, ranks_named)
    axes[0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                   borderaxespad=0.0)
    _widen_for_legends(fig, 1, [h.get_label() for h in handles])
    fig.suptitle(f"watch: {run.name}", fontsize=11)
    return fig


def _state_bands(ax, rows: pd.DataFrame) -> None:
    """Behind a probe's line, each stretch of cycles in one state in that state's colour."""
    stretch = (rows["state"] != rows["state"].shift()).cumsum()
    for _, g in rows.groupby(stretch, sort=False):
        state = g["state"].iloc[0]
        ax.axvspan(g["cycle"].min() - 0.5, g["cycle"].max() + 0.5, linewidth=0, alpha=0.12,
                   color=STATE_COLOURS.get(state, OTHER_STATE), gid=f"band:{state}")


def _watch_legend(axes, rows: pd.DataFrame, ranks_named: pd.DataFrame) -> list:
    """Every panel's series once, then the states drawn and the straggler lines."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    handles = list(seen.values())
    states = set(rows["state"])
    handles += [Patch(color=STATE_COLOURS.get(s, OTHER_STATE), alpha=0.3, label=f"state {s}")
                for s in [*STATE_COLOURS, *sorted(states - set(STATE_COLOURS))] if s in states]
    for change, style in (("named a straggler", "--"), ("no longer a straggler", ":")):
        if (ranks_named["change"] == change).any():
            handles.append(Line2D([], [], color=STRAGGLER, linestyle=style, label=change))
    return handles
