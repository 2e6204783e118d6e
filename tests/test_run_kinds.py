"""Every kind of run the CLI writes is reportable and comparable (issue 33): one real run of each
command that writes a run directory (tests/fixtures/runs, made by its remake.sh), read back by
`report` and `compare` in this process. A command added without its report kind, or whose
runs compare crashes on, fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cli

from distbench.cli.commands import COMMANDS
from distbench.results import compare, reader, report

RUNS = Path(__file__).parent / "fixtures" / "runs"
# the kinds whose rows are repeated measurements of one thing; topo measures nothing, and a
# watch run's rows are cycles, whose judge is watch's own (a baseline run), not compare
COMPARED = {"collective", "p2p", "tp", "pp", "dp", "step", "accept", "plan"}


def test_every_command_that_writes_a_run_has_a_fixture_and_a_report_kind():
    assert set(COMMANDS) <= report.reported_commands()
    assert {p.name for p in RUNS.iterdir() if p.is_dir()} == set(COMMANDS)
    assert COMPARED <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_report_writes_a_section_of_each_run_kinds_figures(command, tmp_path):
    run = reader.load(RUNS / command)
    assert run.command == command
    lines, files = report.write([run], tmp_path)
    text = "\n".join(lines)
    sections = [line for line in lines if line.startswith("### ")]
    assert sections, f"report on a {command} run shows no section:\n{text}"
    assert "None" not in text.split("### ")[0], text  # the header says nothing it lacks
    kinds = [k for k in report.KINDS if command in k.commands]
    if kinds[0].plots and run.tables:
        assert [f for f in files if f.suffix == ".png"], f"no plot of a {command} run"


@pytest.mark.parametrize("command", sorted(COMMANDS))
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
