"""`distbench accept` read back: its report section (the verdict, first pass and retests) and the
verdicts' figure, each check against its fail and warn lines. The pandas and matplotlib parts
are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.tables import Column, Output, markdown_table, number

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from distbench.results.reader import Run

# accept
# One row per check and target (a node, a pair of nodes, the cluster), retests included; its
# metric (a profile's choice) says which way is better, so it is part of the row's identity.
# Stable contract: add columns at the end, never rename.
OUTPUT = Output("accept.csv", csv=(
    "check", "scope", "target", "command", "op", "dtype", "size_bytes", "ranks", "iters",
    "time_us", "p99_us", "algbw_gbps", "busbw_gbps", "wrong", "metric", "measured", "expected",
    "warn_at", "reference", "ratio", "verdict", "retest", "note", "p50_us", "spread",
), console=(
    Column("check", "check", "", 28, ident=True),
    Column("scope", "scope", "", 8, ident=True),
    Column("target", "target", "", 22, ident=True),
    Column("measured", "measured", "", 11, ".4g"),
    Column("expected", "expected", "", 11, ".4g"),
    Column("ratio", "ratio", "", 8, ".3g"),
    Column("verdict", "verdict", "", 8),
), identity=("check", "scope", "target", "metric", "retest"),
    read=("measured", "expected", "ratio", "verdict"),
    # each check is judged by its own metric: `measured` is whatever the profile judged
    busbw="measured", time="measured", p99="measured", row_metric="metric",
    group=lambda row: str(row["check"]), grouped_by="check")

# accept's verdicts in the order of how bad; one it does not know (a newer run's) goes last
VERDICTS = ("FAIL", "INCONCLUSIVE", "WARN", "PASS", "SKIP")


def _counts(frame: pd.DataFrame) -> str:
    counts = frame["verdict"].astype(str).value_counts().to_dict()
    order = [v for v in VERDICTS if v in counts] + sorted(set(counts) - set(VERDICTS))
    return ", ".join(f"{v} {counts[v]}" for v in order) or "none"


FIGURES = ("measured", "expected", "warn_at")  # in the metric's unit


def _measured_cell(row: pd.Series, column: str) -> str:
    """A figure of an accept row in its metric's unit: a time in us, a bandwidth in GB/s."""
    import pandas as pd

    from distbench.results import reader

    value = row.get(column)
    if value is None or pd.isna(value):
        return "-"
    unit, _ = reader.check_metric(row.get("metric"))
    return f"{number(value)} {unit}"


def section(run: Run) -> list[str]:
    from distbench.results import reader

    frame = run.table("accept.csv")
    if frame is None:
        return []
    again = reader.is_retest(frame)
    first, retests = frame[~again], frame[again]
    lines = ["### Acceptance", ""]
    outcome = run.meta.get("accept") if isinstance(run.meta.get("accept"), dict) else {}
    if outcome.get("verdict"):
        lines += [f"Verdict **{outcome['verdict']}**: {outcome.get('summary')}.", ""]
    # the run's verdict and accept.json's summary count the first pass: a retest only confirms
    # a failure, or clears it as noise (the failure then reads WARN)
    lines.append(f"- First pass: {_counts(first)} ({len(first)} measurements, what the "
                 "verdict counts)")
    if len(retests):
        lines.append(f"- Retests: {_counts(retests)} ({len(retests)} measurements taken again "
                     "to confirm or clear a first-pass failure)")
    lines.append("")
    culprits = outcome.get("culprits") or []
    if culprits:
        lines += ["Named:", "", *[f"- {c}" for c in culprits], ""]
    lines += markdown_table(["check", "target", "pass", "metric", "measured", "fail line",
                             "warn line", "ratio", "verdict"],
                            [[str(r["check"]), str(r["target"]), "retest" if again[i] else "first",
                              str(r["metric"]), *(_measured_cell(r, c) for c in FIGURES),
                              number(r["ratio"], 3), str(r["verdict"])]
                             for i, r in frame.iterrows()])
    return lines + ["", "ratio: the measurement against what it was judged by (the profile's "
                    "floor, the healthy peers' value or the baseline's figure), above 1 "
                    "better, whatever the metric's direction.", ""]


VERDICT_COLOURS = {"PASS": "tab:green", "WARN": "tab:orange", "FAIL": "tab:red",
                   "INCONCLUSIVE": "tab:purple", "SKIP": "tab:gray"}


OTHER_VERDICT = "black"


WARN_LINE = "black"


NOTE_CHARS = 60


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
    from distbench.results import plots, reader

    _, higher = reader.check_metric(row.get("metric"))
    measured = plots.as_float(row.get("measured"))
    fail, warn = plots.as_float(row.get("expected")), plots.as_float(row.get("warn_at"))
    if fail is None:
        return _margin(measured, warn, higher), None, "warn line"
    return _margin(measured, fail, higher), _margin(warn, fail, higher), "fail line"


def _retest(row: pd.Series) -> bool:
    from distbench.results import plots

    return bool(plots.as_float(row.get("retest")))


def _verdict_label(run: Run, row: pd.Series, several: bool) -> str:
    return ((f"{run.name}: " if several else "") + f"{row['check']} @ {row['target']}"
            + (" (retest)" if _retest(row) else ""))


def _verdict_note(row: pd.Series, line_name: str) -> str:
    """The figures behind a row's bar, in the metric's unit; without them, why."""
    import pandas as pd

    from distbench.results import plots, reader

    unit, _ = reader.check_metric(row.get("metric"))
    measured = plots.as_float(row.get("measured"))
    line = plots.as_float(row.get("expected" if line_name == "fail line" else "warn_at"))
    if measured is not None and line is not None:
        from distbench.core.tables import number  # the report's own format: 150000, not 1.5e+05

        return f"{number(measured)} {unit}, {line_name} {number(line)}"
    wrong = plots.as_float(row.get("wrong"))
    if wrong:
        return f"{wrong:.0f} wrong elements"
    note = "" if pd.isna(row.get("note")) else str(row.get("note") or "")
    why = note.split(";")[0] or ("not measured" if measured is None else "no line to judge by")
    return why if len(why) <= NOTE_CHARS else why[:NOTE_CHARS - 3] + "..."


def accept_figure(runs: list[Run]):
    """The figure behind accept_verdicts.png, or None when no run has accept.csv."""
    from distbench.results import plots

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
    fig, ax = plots.plt.subplots(figsize=(8.0, 0.34 * len(rows) + 1.6))
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
    ax.xaxis.set_major_formatter(plots.plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.set_xlabel("measured against its fail line (measured / expected; expected / measured "
                  "for a time), log scale: right of 1 passes it, left fails", fontsize=9)
    present = {str(row.get("verdict")) for row, *_ in drawn}
    seen = [v for v in VERDICT_COLOURS if v in present] + sorted(present - set(VERDICT_COLOURS))
    handles = [plots.Patch(color=VERDICT_COLOURS.get(v, OTHER_VERDICT), label=v) for v in seen]
    handles += [plots.plt.Line2D([], [], color="black", label="fail line"),
                plots.plt.Line2D([], [], color=WARN_LINE, marker="|", markersize=12, linestyle="",
                       markeredgewidth=2, label="warn line")]
    if any(_retest(row) for row, *_ in drawn):
        handles.append(plots.Patch(facecolor="white", edgecolor="black", hatch="//",
                                   label="retest"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles),
              fontsize=8, frameon=False, borderaxespad=0.2, handlelength=1.5,
              columnspacing=1.2)
    ax.set_title("accept: each check measured against its fail line", fontsize=11, pad=24)
    return fig


def draw(runs: list[Run], out: Path) -> list[Path]:
    """Each check and target measured against its fail line, coloured by its verdict."""

    from distbench.results import plots

    fig = accept_figure(runs)
    if fig is None:
        return []
    path = out / "accept_verdicts.png"
    # labels and notes as long as the checks' names: the image grows to hold them, unclipped
    fig.savefig(path, dpi=plots.DPI, bbox_inches="tight", pad_inches=0.15)
    plots.plt.close(fig)
    return [path]
