"""`distbench watch` read back: its report section (cycles, late ranks, stragglers, each probe's
state changes) and a figure per run of each probe over the cycles. The pandas and matplotlib
parts are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.tables import Output, markdown_table, number, plural

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from distbench.kinds.watch.history import WatchHistory
    from distbench.results.reader import Run

WATCH_SHOWN = 30  # the changes report.md lists; watch.jsonl keeps every one


RUNS_SHOWN = 12  # stretches of cycles a line lists: a weeks-long watch can hold thousands


# watch: one row per probe per cycle, flushed as each cycle ends (distbench/watch)
OUTPUT = Output("watch.csv", csv=(
    "cycle", "started", "duration_s", "late", "op", "size_bytes", "scope", "dtype", "world_size",
    "nnodes", "status", "time_us", "busbw_gbps", "spread_pct", "late_rank", "lateness_us",
    "state", "median_us", "p95_us", "cv", "baseline_us", "verdict", "stragglers", "note",
), identity=("cycle", "op", "size_bytes", "scope", "dtype"),
    read=("time_us", "busbw_gbps", "state", "verdict"),
    not_compared="cycles watch judges itself, against its own baseline")


def _cycle_runs(cycles) -> str:
    """Cycles as stretches of consecutive ones: "3-7, 9"."""
    import pandas as pd

    s = pd.Series(sorted({int(c) for c in cycles}), dtype="int64")
    runs = s.groupby((s.diff() != 1).cumsum()).agg(["first", "last"])
    shown = [str(a) if a == b else f"{a}-{b}"
             for a, b in runs.head(RUNS_SHOWN).itertuples(index=False)]
    more = len(runs) - RUNS_SHOWN
    return ", ".join(shown) + (f" and {plural(more, 'more stretch', 'more stretches')}"
                               if more > 0 else "")


def _ranks_by_cycle(cycles: pd.DataFrame, column: str) -> dict[int, list[int]]:
    """rank -> the cycles whose `column` (a tuple of ranks) holds it."""
    pairs = cycles[["cycle", column]].explode(column).dropna()
    return {int(r): sorted(int(c) for c in g["cycle"])
            for r, g in pairs.groupby(column, sort=True)}


def _watch_late(history: WatchHistory) -> list[str]:
    """Which ranks came late, in which cycles, and which were named stragglers: from the
    judge's late counts and straggler lists, never from late_rank alone (some rank always
    arrives last, by a hair on a healthy machine)."""
    from distbench.kinds.watch.history import WATCH_LINES

    late = _ranks_by_cycle(history.cycles, "late")
    named = _ranks_by_cycle(history.cycles, "stragglers")
    if not late and not named:
        return ["No rank late: no cycle's late counts say a rank came late, and no straggler "
                "was named.", ""]
    lines = []
    if history.source != WATCH_LINES:
        lines.append(f"{history.source} records no late counts: a rank counts late where it "
                     "was named a straggler.")
    if late:
        over = (f"late_counts over the last {plural(history.window, 'cycle')}"
                if history.window else "a rise in late_counts")
        lines.append(f"Ranks late, as the judge counted them ({over}): " + "; ".join(
            f"rank {r} in {plural(len(c), 'cycle')} ({_cycle_runs(c)})"
            for r, c in late.items()) + ".")
    lines.append("Stragglers named: " + ("; ".join(
        f"rank {r} first in cycle {c[0]} (named in {_cycle_runs(c)})" for r, c in named.items())
        if named else "none") + ".")
    return [" ".join(lines), ""]


def section(run: Run) -> list[str]:
    from distbench.kinds.watch.history import watch_history
    from distbench.results import report

    history = watch_history(run)
    if history is None:
        return []
    cycles, probes, changes = history.cycles, history.probes, history.changes
    lines = ["### Watch", "", f"{plural(len(cycles), 'cycle')}.", ""]
    if history.unreadable:
        lines += [f"Left out {plural(history.unreadable, 'line')} of {history.source} that "
                  "hold no cycle (cut short by a crash, or not JSON).", ""]
    if not len(cycles):
        return lines
    first, last = cycles.iloc[0], cycles.iloc[-1]
    every = f", every {history.interval_s:g} s" if history.interval_s else ""
    lines += [f"Cycle {first['cycle']} started {first['started'] or '-'}, cycle {last['cycle']} "
              f"{last['started'] or '-'}{every}; the last verdict **{last['verdict']}**.", ""]
    lines += _watch_late(history)
    rows = []
    for (probe, op, size, scope), g in probes.groupby(["probe", "op", "size_bytes", "scope"],
                                                      sort=False, dropna=False):
        ok = g[(g["status"] == "ok") & g["time_us"].notna()]
        rows.append([op or "-", report.size_cell(size), scope, str(len(ok)),
                     number(ok["time_us"].median()), number(ok["busbw_gbps"].median()),
                     str(g["state"].iloc[-1]), str(int((changes["what"] == probe).sum()))])
    lines += markdown_table(["op", "size", "scope", "cycles measured", "median time (us)",
                             "median busbw (GB/s)", "last state", "state changes"], rows)
    lines += ["", "#### Changes", ""]
    if not len(changes):
        return lines + ["No probe's state changed and no straggler was named.", ""]
    lines += markdown_table(["cycle", "started", "probe or rank", "change", "why (the judge's "
                             "words)"],
                            [[str(c.cycle), c.started or "-", c.what, c.change, c.why or "-"]
                             for c in changes.head(WATCH_SHOWN).itertuples()])
    if len(changes) > WATCH_SHOWN:
        lines += ["", f"... and {len(changes) - WATCH_SHOWN} more; {history.source} holds "
                  "every one."]
    return lines + [""]


STATE_COLOURS = {"ok": "tab:green", "warn": "tab:orange", "fail": "tab:red",
                 "unknown": "tab:gray"}


OTHER_STATE = "tab:purple"  # a state a later watch adds


STRAGGLER = "darkred"


MAX_NOTES = 20  # change notes a panel writes; past that its lines alone (a flapping probe)


DOTS = 200


def draw(runs: list[Run], out: Path) -> list[Path]:
    """Per watch run: each probe's busbw per cycle, its states and the stragglers marked."""
    from distbench.results import plots

    return [plots.save(fig, out / f"watch_{plots.slug(run.name)}.png") for run in runs
            if (fig := watch_figure(run)) is not None]


def watch_figure(run: Run):
    """The figure behind a watch run's plot, or None when it has no probe: a panel per probe,
    its busbw per cycle over bands of its state's colour, each state change a line in the new
    state's colour, the cycles the judge counted a rank late in a red x on the busbw, and each
    straggler named (dashed) or no longer named (dotted) a line across every panel. Artists
    carry gids (busbw, late, state:CYCLE, named:RANK, cleared:RANK) for what reads it back."""

    from distbench.kinds.watch.history import watch_history
    from distbench.results import plots

    history = watch_history(run)
    if history is None or not len(history.probes):
        return None
    rows, changes = history.probes, history.changes
    names = list(dict.fromkeys(rows["probe"]))
    fig, axes = plots.plt.subplots(len(names), 1, figsize=(8.0, 2.3 * len(names) + 1.0),
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
    axes[-1].xaxis.set_major_locator(plots.plt.MaxNLocator(integer=True, min_n_ticks=1))
    handles = _watch_legend(axes, rows, ranks_named)
    axes[0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                   borderaxespad=0.0)
    plots.widen_for_legends(fig, 1, [h.get_label() for h in handles])
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
    from distbench.results import plots

    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    handles = list(seen.values())
    states = set(rows["state"])
    handles += [plots.Patch(color=STATE_COLOURS.get(s, OTHER_STATE), alpha=0.3, label=f"state {s}")
                for s in [*STATE_COLOURS, *sorted(states - set(STATE_COLOURS))] if s in states]
    for change, style in (("named a straggler", "--"), ("no longer a straggler", ":")):
        if (ranks_named["change"] == change).any():
            handles.append(plots.plt.Line2D([], [], color=STRAGGLER, linestyle=style, label=change))
    return handles
