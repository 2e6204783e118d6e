"""Every kind of run the CLI writes is reportable and comparable (issue 33): one real run of each
command that writes a run directory (tests/fixtures/runs, made by its remake.sh), read back by
`report` and `compare` in this process. A command added without its report kind, or whose
runs compare crashes on, fails here."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
from helpers import cli
from paths import FIXTURES
from report_helpers import _sensible
from runs import read_csv, rewrite_csv, write_csv

from distbench.core.errors import ReadError
from distbench.core.tables import plural
from distbench.kinds import KINDS, commands
from distbench.kinds.watch import output as watch_output
from distbench.planner.ranking import validation_md
from distbench.results import compare, plots, reader, report

RUNS = FIXTURES / "runs"
# the kinds whose rows are repeated measurements of one thing; topo measures nothing, and a
# watch run's rows are cycles, whose judge is watch's own (a baseline run), not compare
COMPARED = {"collective", "p2p", "tp", "pp", "dp", "step", "accept", "plan"}


def test_every_command_that_writes_a_run_has_a_fixture_and_a_report_kind():
    assert all(KINDS[c].section for c in commands())
    assert {p.name for p in RUNS.iterdir() if p.is_dir()} == set(commands())
    assert COMPARED <= set(commands())


@pytest.mark.parametrize("command", sorted(commands()))
def test_compare_reads_each_run_kind_or_refuses_in_one_line(command, tmp_path):
    run = RUNS / command
    res = cli(tmp_path, "compare", str(run), str(run))
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    if command in COMPARED:
        assert res.returncode == 0, res.stdout + res.stderr
        assert "no row worse" in res.stdout.splitlines()[-1], res.stdout
        # a run against itself: every row measured on both sides is the same (a check that
        # was skipped, measuring nothing, stays x)
        c = compare.compare(reader.load(run), reader.load(run))
        measured = [r for r in c.rows if r.ratio is not None]
        assert measured and all(r.mark == "~" for r in measured), c.rows
    else:
        assert res.returncode == 2, res.stdout + res.stderr
        assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("distbench: error:")


def test_compare_refuses_a_metric_a_step_run_does_not_record_in_one_line(tmp_path):
    """Issue 33: `compare STEP STEP` raised KeyError: 'step.csv' (busbw), and KeyError:
    'direction' with --metric time."""
    run = RUNS / "step"
    res = cli(tmp_path, "compare", str(run), str(run), "--metric", "busbw")
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "--metric busbw: step.csv records none" in res.stderr
    res = cli(tmp_path, "compare", str(run), str(run), "--metric", "time")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# compare time (us)")
    assert " tp1 pp1 dp2 zero0 m1 float32 " in res.stdout


def _figure_rows(lines: list[str]) -> list[str]:
    """A section's table rows that hold a figure (a number in a cell of its own)."""
    return [line for line in lines if line.startswith("| ") and not line.startswith("|---")
            and re.search(r"\| [-+]?[0-9][0-9.]*(%| [KMG]iB)? \|", line)]


# What a kind's section must name, and the plots it must draw (a p2p run's link matrix is named
# after the run)
NAMED = {
    "p2p": (["ring", "pingpong", "Link matrix"], ["p2p_busbw", "p2p_latency", "p2p_matrix_"]),
    "tp": (["| mlp |", "| attention |"], ["tp_step"]),
    "pp": (["| naive |", "| gpipe |", "| 1f1b |"], ["pp_bubble"]),
    "dp": (["### Data parallel", "| ddp 25 MiB | float32 | 2 |", "| zero1 25 MiB |", "| zero2 |",
            "| zero3 |"], ["dp_step"]),
    "accept": (["### Acceptance", "| node all_reduce busbw |"], ["accept_verdicts"]),
}


@pytest.mark.parametrize("command", sorted(commands()))
def test_report_writes_a_section_of_each_run_kinds_figures_and_links_each_plot(command,
                                                                                tmp_path):
    """A section is its figures in a table, not a title alone (topo's was one line naming the
    CPU, and said its run wrote no result; step's and plan's were a header and nothing else);
    each plot is drawn and linked."""
    run = reader.load(RUNS / command)
    assert run.command == command
    kind = KINDS[command]
    section = kind.section(run)
    assert _figure_rows(section), "\n".join(section)
    lines, files = report.write([run], tmp_path, KINDS.values())
    text = "\n".join(lines)
    assert [line for line in lines if line.startswith("### ")], text
    assert "None" not in text.split("### ")[0], text  # the header says nothing it lacks
    assert "\n".join(section) in text and "No result rows" not in text, text
    drawn = [f for f in files if f.suffix == ".png"]
    assert bool(drawn) == bool(kind.plots), drawn
    if kind.plots:
        assert run.tables, f"a {command} run with a plot but no table"
    for png in drawn:
        _sensible(png)
        assert f"![{png.stem}]({png.name})" in text
    words, plotted = NAMED.get(command, ([], []))
    assert [w for w in words if w not in text] == []
    assert [p for p in plotted if not any(f.name.startswith(p) for f in drawn)] == []


def test_a_topo_runs_header_says_its_nodes_not_unknown_ranks(tmp_path):
    """topo gathers each node's snapshot and runs no ranks: its header said "ranks unknown"."""
    lines, _ = report.write([reader.load(RUNS / "topo")], tmp_path, KINDS.values())
    header = next(line for line in lines if line.startswith("`distbench topo`"))
    assert "1 node(s)" in header and "unknown" not in header, header


def test_topo_reports_each_nodes_figures():
    run = reader.load(RUNS / "topo")
    (node,) = run.topo["nodes"]
    section = "\n".join(KINDS["topo"].section(run))
    assert f"| {node['host']} | {len(node['gpus'])} |" in section
    assert f"| {node['cpu']['model']} | {node['cpu']['logical_cores']} |" in section


def test_counts_of_one_read_as_one():
    """"1 cycles." and "over 1 layouts out of sample" (the fixtures hold one of each)."""
    watch = KINDS["watch"].section(reader.load(RUNS / "watch"))
    assert any(line.startswith("1 cycle") for line in watch), watch
    assert not any("1 cycles" in line for line in watch), watch
    plan = "\n".join(KINDS["plan"].section(reader.load(RUNS / "plan")))
    assert "over 1 layout out of sample." in plan


def test_the_watch_plot_counts_cycles_whole():
    """One cycle was drawn on an axis from -0.04 to 0.04."""
    fig = watch_output.watch_figure(reader.load(RUNS / "watch"))
    ticks = fig.axes[0].get_xticks()
    plots.plt.close(fig)
    assert len(ticks) and all(float(t).is_integer() for t in ticks), ticks


def _slowed(src: Path, dst: Path, file: str, factor: float) -> Path:
    """A copy of a run with every step in `file` taking `factor` times as long."""
    shutil.copytree(src, dst)
    rewrite_csv(dst / file, lambda r: {**r, "step_us": str(float(r["step_us"]) * factor)}
                if r["step_us"] else r)
    return dst


@pytest.mark.parametrize(("command", "file"), [("step", "step.csv"), ("plan", "step.csv"),
                                               ("dp", "dp.csv"), ("tp", "tp.csv"),
                                               ("pp", "pp.csv")])
def test_a_slower_training_step_is_worse_by_its_time_and_fails_the_gate(command, file,
                                                                        tmp_path):
    """Not only a run against itself: two step, plan or dp runs are compared row by row."""
    slow = _slowed(RUNS / command, tmp_path / "slow", file, 1.5)
    res = cli(tmp_path, "compare", str(RUNS / command), str(slow))
    assert res.returncode == 4, res.stdout + res.stderr
    assert res.stdout.startswith("# compare time (us)")
    rows = len(reader.measured(reader.load(slow).tables[file]))
    assert f"# {plural(rows, 'row')} worse by more than 5%" in res.stdout
    assert "by the threshold alone" in res.stdout  # no repetitions: said, not hidden
    assert cli(tmp_path, "compare", str(slow), str(RUNS / command)).returncode == 0


def test_a_plan_without_validation_is_refused_saying_it_holds_predictions(tmp_path):
    plan = tmp_path / "plan"
    shutil.copytree(RUNS / "plan", plan)
    for name in ("step.csv", "validation.csv"):
        (plan / name).unlink()
    res = cli(tmp_path, "compare", str(plan), str(plan))
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "plan.csv (predictions, not measurements: plan --validate measures step.csv)" \
        in line, line
    watch = cli(tmp_path, "compare", str(RUNS / "watch"), str(RUNS / "watch"))
    assert "watch.csv (cycles watch judges itself" in watch.stderr, watch.stderr



def _table_after(lines: list[str], heading: str) -> list[str]:
    start = lines.index(heading) + 2
    return [line for line in lines[start:start + 50] if line.startswith("|")]


def _typed(row: dict) -> dict:
    def cell(v: str):
        if v == "":
            return None
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v
    return {k: cell(v) for k, v in row.items()}


def test_a_plans_validation_reads_the_same_in_plan_md_and_in_its_report(tmp_path):
    """One builder (core/validation_table) for both: the report once wrote its own table, with
    4 significant digits ("130" where plan.md said "129.95") and other missing cells."""
    run = tmp_path / "plan"
    shutil.copytree(RUNS / "plan", run)
    with (run / "validation.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows and rows[0]["measured_step_ms"]
    more = [{**rows[0], "predicted_step_ms": "131.207", "measured_step_ms": "129.953",
             "error_pct": "0.965", "micro_batches": "1"},
            {**rows[0], "measured_step_ms": "", "error_pct": "", "status": "failed",
             "micro_batches": "4", "in_sample": "1"}]
    with (run / "validation.csv").open("w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows + more)
    lines, _ = report.write([reader.load(run)], tmp_path / "report", KINDS.values())
    in_report = _table_after(lines, "### Validation")
    in_plan_md = _table_after(
        validation_md({"layouts": [_typed(r) for r in rows + more]}, [], []).splitlines(),
        "## Validation")
    assert in_report == in_plan_md
    assert "| 131.21 | 129.95 | +1.0% | no | ok |" in in_report[-2], in_report
    assert in_report[-1].endswith("| - | - | yes | failed |"), in_report
    # and the recorded run's own plan.md, written by the plan command, reads the same
    recorded = (RUNS / "plan" / "plan.md").read_text().splitlines()
    assert in_report[:2 + len(rows)] == _table_after(recorded, "## Validation")


@pytest.mark.parametrize("column,base_value,new_value", [("recompute", "none", "full"),
                                                        ("virtual_stages", "1", "2")])
def test_a_recomputed_or_interleaved_layout_is_not_compared_with_the_plain_one(
        tmp_path, column, base_value, new_value):
    """step.csv's rows matched on tp, pp, dp, ZeRO and m alone: a run recomputing every layer
    (or interleaving its pipeline) was compared with the plain one, row for row."""
    runs = {}
    for name, value in (("base", base_value), ("new", new_value)):
        runs[name] = tmp_path / name
        shutil.copytree(RUNS / "step", runs[name])
        rows = read_csv(runs[name] / "step.csv")
        write_csv(runs[name] / "step.csv", [*rows[0], *([column] * (column not in rows[0]))],
                  [{**row, column: value} for row in rows])
    with pytest.raises(ReadError, match="no row in common"):
        compare.compare(reader.load(runs["base"]), reader.load(runs["new"]))
    same = compare.compare(reader.load(runs["new"]), reader.load(runs["new"]))
    assert same.rows and all(r.mark == "~" for r in same.rows if r.ratio is not None)
