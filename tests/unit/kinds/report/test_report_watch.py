"""`distbench report` on a watch run (issue 45): busbw per cycle per probe with the probes' state
changes and the stragglers named marked, in watch_<run>.png and report.md. A cycle has "a rank
late" only where the judge's late counts or its stragglers say so: late_rank is set in every
cycle (some rank always arrives last, by a hair), and the report used to mark every cycle late
from it, and print a lone straggler rank read from watch.csv as 1.0.

The run directories are written by watch's own writers (loop.cycle_line and csv_rows, the
Appender and CsvSink) from cycles and judgements each test states, so the judge's rules, which
change apart from the report, do not move these figures; the last test reports a real watch.
The tests that start processes: test_report_watch_multiproc.py."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import cli
from matplotlib.colors import to_rgba
from report_helpers import _drawn, _report, _section, _table
from runs import write_meta

from distbench.kinds.watch import output as watch_output
from distbench.kinds.watch.history import watch_history
from distbench.kinds.watch.loop import csv_rows, cycle_line
from distbench.kinds.watch.output import OUTPUT as WATCH
from distbench.kinds.watch.records import Cycle, Judgement, Probe, ProbeResult, ProbeState
from distbench.results import plots, reader
from distbench.results.writer import Appender, CsvSink

AR, AG = Probe("all_reduce", 64 * 1024), Probe("all_gather", 1 << 20)
AR_NAME, AG_NAME = "all_reduce 64 KiB cluster", "all_gather 1 MiB cluster"
T0 = 1_790_000_000.0  # a fixed start: report.md quotes each cycle's
INTERVAL = 0.5
WINDOW, AGREE = 3, 2  # --last, --agree


@dataclass
class Step:
    """One cycle as a test states it: who came late, each probe's state, what the judge named
    and said. Every rank's in-call time follows: the late rank's call is the short one."""

    late: tuple[int, ...] = ()  # ranks the judge counted late in this cycle
    states: dict[Probe, str] = field(default_factory=dict)  # unknown where not given
    stragglers: tuple[int, ...] = ()
    changes: tuple[str, ...] = ()
    slow: bool = False  # the cycle waited 10 ms a call for rank 1: busbw falls tenfold


def _results(step: Step, world: int) -> tuple[ProbeResult, ...]:
    out = []
    for i, probe in enumerate((AR, AG)):
        base = 1000.0 * (i + 1)
        if step.slow:
            calls = [base + 10_000.0] * world
            calls[1] = base
        else:  # healthy: the last to arrive is a few microseconds behind, and it moves about
            calls = [base + 3.0 * ((r + i) % world) for r in range(world)]
        time_us = max(calls)
        out.append(ProbeResult(probe, "ok", time_us, probe.size_bytes / time_us / 1e3,
                               tuple(calls)))
    return tuple(out)


def write_watch(path: Path, steps: list[Step], world: int = 2, once: bool = False) -> Path:
    """A watch run directory of `steps`, each cycle's late counts those of its last WINDOW
    cycles, as watch writes them."""
    write_meta(path, "watch", world_size=world, options={
        "interval": INTERVAL, "last": WINDOW, "agree": AGREE, "once": once, "count": len(steps)})
    lines, sink = Appender(path / "watch.jsonl"), CsvSink(path / WATCH.file, list(WATCH.csv))
    for i, step in enumerate(steps):
        cycle = Cycle(i, T0 + i * INTERVAL, 0.05, False, _results(step, world))
        recent = steps[max(0, i - WINDOW + 1):i + 1]
        counts = {r: n for r in range(world) if (n := sum(r in s.late for s in recent))}
        states = {p.key: ProbeState(step.states.get(p, "unknown")) for p in (AR, AG)}
        judged = [s.state for s in states.values() if s.state != "unknown"]
        verdict = max(judged, key=("ok", "warn", "fail").index) if judged else "unknown"
        if step.stragglers and verdict in ("ok", "unknown"):
            verdict = "warn"
        line = cycle_line(cycle, Judgement(states, verdict, step.stragglers, counts,
                                           step.changes), INTERVAL)
        lines.write(json.dumps(line) + "\n")
        for row in csv_rows(line, cycle, world, 1):
            sink.append(row)
    lines.close()
    sink.close()
    return path


OK = {AR: "ok", AG: "ok"}
WARMED = (f"{AR_NAME}: unknown -> ok (baseline 1003 us, noise 1%, the first 2 cycles'; this "
          "one 1.00x the baseline 1003 us)",
          f"{AG_NAME}: unknown -> ok (baseline 2003 us, noise 1%, the first 2 cycles'; this "
          "one 1.00x the baseline 2003 us)")


def healthy(cycles: int = 8) -> list[Step]:
    return [Step(states=OK if i >= 2 else {}, changes=WARMED if i == 2 else ())
            for i in range(cycles)]


NAMED = "rank 1: named a straggler (late in 2 of the last 3 cycles; this one 1e+04 us late in " \
        f"{AR_NAME})"
FAILED = f"{AR_NAME}: ok -> fail (2 of the last 2 cycles fail-bad; this one 11x the baseline)"
CLEARED = "rank 1: no longer a straggler (2 cycles in a row not late)"
RECOVERED = f"{AR_NAME}: fail -> ok (2 cycles in a row clean; this one 1.00x the baseline)"


def slowed() -> list[Step]:
    """Rank 1 late from cycle 3 to 7: named in cycle 4 (2 of 3), no longer in cycle 9 (2 in a
    row not late); all_reduce fails in 4 and recovers in 9. From cycle 5 its late count stays 3
    while it is still late every cycle: a rise of the count alone misses cycles 6 and 7."""
    steps = healthy(12)
    for i in range(3, 8):
        steps[i].late, steps[i].slow = (1,), True
    for i in range(4, 9):
        steps[i].stragglers = (1,)
        steps[i].states = {AR: "fail", AG: "ok"}
    steps[4].changes = (FAILED, NAMED)
    steps[9].changes = (RECOVERED, CLEARED)
    return steps


def test_a_healthy_run_says_no_rank_late_though_late_rank_is_set_in_every_cycle(tmp_path):
    run = write_watch(tmp_path / "healthy", healthy())
    lines = [json.loads(x) for x in (run / "watch.jsonl").read_text().splitlines()]
    # the trap the old report fell in: some rank arrives last in every cycle of every probe
    assert all(p["late_rank"] is not None for x in lines for p in x["probes"])
    text, _ = _report(run)
    section = _section(text)
    assert "No rank late: no cycle's late counts say a rank came late, and no straggler was " \
           "named." in section
    assert "Stragglers named" not in section and "late in" not in section
    assert _table(section, "#### Changes") == [
        ["2", lines[2]["started"], AR_NAME, "unknown -> ok", WARMED[0].split("(", 1)[1][:-1]],
        ["2", lines[2]["started"], AG_NAME, "unknown -> ok", WARMED[1].split("(", 1)[1][:-1]]]
    drawn = _drawn(run)
    assert set(drawn) == {AR_NAME, AG_NAME}
    for panel in drawn.values():
        assert panel["late"] == []  # no red x on any cycle
        assert [x for x, _ in panel["busbw"]] == list(range(8))
        assert not any(g.startswith(("named:", "cleared:")) for g in panel["lines"])
        assert panel["lines"]["state:2"] == (2.0, "tab:green")


def test_a_slowed_run_names_the_straggler_its_late_cycles_and_every_change(tmp_path):
    run = write_watch(tmp_path / "slowed", slowed())
    started = [json.loads(x)["started"] for x in (run / "watch.jsonl").read_text().splitlines()]
    text, _ = _report(run)
    section = _section(text)
    assert ("Ranks late, as the judge counted them (late_counts over the last 3 cycles): rank 1 "
            "in 5 cycles (3-7). Stragglers named: rank 1 first in cycle 4 (named in 4-8).") \
        in section
    assert "No rank late" not in section
    assert [row[:4] for row in _table(section, "#### Changes")] == [
        ["2", started[2], AR_NAME, "unknown -> ok"],
        ["2", started[2], AG_NAME, "unknown -> ok"],
        ["4", started[4], AR_NAME, "ok -> fail"],
        ["4", started[4], "rank 1", "named a straggler"],
        ["9", started[9], AR_NAME, "fail -> ok"],
        ["9", started[9], "rank 1", "no longer a straggler"]]
    why = {(r[0], r[2]): r[4] for r in _table(section, "#### Changes")}
    assert why["4", "rank 1"] == NAMED.split("(", 1)[1][:-1]
    assert why["9", "rank 1"] == "2 cycles in a row not late"
    # counts are whole numbers: 12 cycles measured, 3 state changes of all_reduce
    assert _table(section, "| op |")[:2] == [
        ["all_reduce", "64 KiB", "cluster", "12", "1003", "0.06534", "ok", "3"],
        ["all_gather", "1 MiB", "cluster", "12", "2003", "0.5235", "ok", "1"]]
    assert not re.search(r"\b\d+\.0\b", section), section

    drawn = _drawn(run)
    for name, panel in drawn.items():
        assert panel["late"] == [3.0, 4.0, 5.0, 6.0, 7.0], name
        assert panel["lines"]["named:1"][0] == 4.0 and panel["lines"]["cleared:1"][0] == 9.0
        assert all(float(t).is_integer() for t in panel["xticks"])
        # the slowed cycles' busbw is what is drawn: a tenfold fall in cycles 3 to 7
        busbw = dict(panel["busbw"])
        assert max(busbw[c] for c in range(3, 8)) < min(busbw[c] for c in (0, 1, 2, 8)) / 5
    assert drawn[AR_NAME]["lines"]["state:4"] == (4.0, "tab:red")
    assert drawn[AR_NAME]["lines"]["state:9"] == (9.0, "tab:green")
    assert "state:4" not in drawn[AG_NAME]["lines"]


def test_a_late_cycle_entering_as_another_leaves_the_window_still_counts(tmp_path):
    """Late in cycles 3, 5 and 6 with a window of 3: cycle 6's count stays at 2 (cycle 3 left
    as 6 came), and 6 was late all the same; cycle 4's count stays 1, and 4 was not."""
    steps = healthy(9)
    for i in (3, 5, 6):
        steps[i].late = (1,)
    run = write_watch(tmp_path / "on-off", steps)
    counts = [json.loads(x)["late_counts"] for x in (run / "watch.jsonl").read_text().splitlines()]
    assert [c.get("1", 0) for c in counts] == [0, 0, 0, 1, 1, 2, 2, 2, 1]
    history = watch_history(reader.load(run))
    assert [c for c, late in zip(history.cycles["cycle"], history.cycles["late"], strict=True)
            if late] == [3, 5, 6]
    section = _section(_report(run)[0])
    assert "rank 1 in 3 cycles (3, 5-6). Stragglers named: none." in section


def test_a_long_watchs_late_cycles_are_listed_as_stretches_the_first_12_of_them():
    cycles = [*range(3, 8), 9, *range(20, 200, 2)]
    assert watch_output._cycle_runs(cycles) == (
        "3-7, 9, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38 and 80 more stretches")
    assert watch_output._cycle_runs([5, 4, 4]) == "4-5"


def test_a_run_of_once_counts_each_cycle_alone(tmp_path):
    """--once judges with --last 1: the count is the cycle's own."""
    steps = healthy(3)
    steps[2].late, steps[2].stragglers = (1,), (1,)
    run = write_watch(tmp_path / "once", steps, once=True)
    history = watch_history(reader.load(run))
    assert history.window == 1
    assert list(history.cycles["late"]) == [(), (), (1,)]


def test_from_watch_csv_alone_a_lone_straggler_reads_as_a_rank_not_1_0(tmp_path):
    """watch.csv spells the stragglers "1"; pandas read that column as 1.0 beside empty cells,
    and the report printed 1.0. Without watch.jsonl there are no late counts: a named straggler
    is what says a rank came late."""
    run = write_watch(tmp_path / "csv-only", slowed())
    (run / "watch.jsonl").unlink()
    section = _section(_report(run)[0])
    assert "watch.csv records no late counts" in section
    assert "rank 1 in 5 cycles (4-8)" in section
    assert "Stragglers named: rank 1 first in cycle 4 (named in 4-8)." in section
    assert "1.0" not in section
    assert ["4", "rank 1", "named a straggler", "-"] in [
        [r[0], r[2], r[3], r[4]] for r in _table(section, "#### Changes")]


def test_a_line_cut_short_or_missing_fields_is_left_out_not_a_traceback(tmp_path):
    run = write_watch(tmp_path / "cut", slowed())
    lines = (run / "watch.jsonl").read_text().splitlines()
    third = json.loads(lines[2])
    for key in ("late_counts", "stragglers", "changes", "verdict", "started"):
        del third[key]
    for probe in third["probes"]:
        probe["busbw_gbps"], probe["state"] = None, None
        del probe["time_us"]
    lines[2] = json.dumps(third)
    (run / "watch.jsonl").write_text("\n".join(lines) + "\n" + lines[-1][:40])
    section = _section(_report(run)[0])
    assert "Left out 1 line of watch.jsonl that hold no cycle" in section
    assert "12 cycles." in section
    assert "rank 1 first in cycle 4" in section
    drawn = _drawn(run)
    assert 2 not in [x for x, _ in drawn[AR_NAME]["busbw"]]  # no busbw, no point


def test_the_state_bands_and_legend_colour_each_state(tmp_path):
    run = write_watch(tmp_path / "slowed", slowed())
    fig = watch_output.watch_figure(reader.load(run))
    try:
        ax = next(a for a in fig.axes if a.get_title() == AR_NAME)
        bands = [(p.get_gid(), p.get_facecolor()[:3]) for p in ax.patches]
        legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    finally:
        plots.plt.close(fig)
    assert [g for g, _ in bands] == ["band:unknown", "band:ok", "band:fail", "band:ok"]
    assert bands[2][1] == pytest.approx(to_rgba("tab:red")[:3])
    assert {"busbw", "state fail", "state ok", "state unknown", "named a straggler",
            "no longer a straggler", "rank 1 late (the judge's late counts)"} <= legend


def test_a_watch_stopped_before_its_first_cycle_is_reported_in_one_file(tmp_path):
    """Nothing measured, so no plot: report.md alone, and the count says "1 file"."""
    run = write_watch(tmp_path / "run", [])
    res = cli(tmp_path, "report", str(run))
    assert res.returncode == 0, res.stderr
    said = res.stderr.splitlines()[-1]
    assert said.startswith(f"distbench: report in {run / 'report'}/"), said
    assert "1 file: report.md" in said and ".png" not in said, said
