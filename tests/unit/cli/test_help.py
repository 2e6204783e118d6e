"""--help as a new user reads it at 80 columns: every command shows examples, each whole on
one line, and no option's help is cut short ("…"); the examples are command lines distbench
takes."""

from __future__ import annotations

import shlex

import pytest
from helpers import cli

from distbench.cli.app import app
from distbench.kinds import commands
from distbench.kinds.compare import options as compare
from distbench.kinds.report import options as report

EXAMPLES = {**{name: c.examples for name, c in commands().items()},
            "report": report.EXAMPLES, "compare": compare.EXAMPLES}


def test_every_command_on_the_command_line_has_examples():
    registered = {c.name for c in app.registered_commands}
    assert registered == set(EXAMPLES)
    assert all(EXAMPLES[name] for name in registered)


@pytest.mark.parametrize("argv", [[name, "--help"] for name in EXAMPLES] + [["--help"]],
                         ids=[*EXAMPLES, "distbench"])
def test_help_at_80_columns_shows_whole_examples_and_cuts_nothing(tmp_path, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    got = cli(tmp_path, *argv)
    assert got.code == 0, got.stderr
    lines = [line.strip() for line in got.stdout.splitlines()]
    assert max(len(line) for line in got.stdout.splitlines()) <= 80
    assert "Examples:" in lines
    shown = [line for line in lines if line.startswith("distbench ")]
    assert shown and all(e in shown for e in EXAMPLES.get(argv[0], ())), got.stdout
    assert "…" not in got.stdout, [line for line in lines if "…" in line]


RUNNABLE = [(name, e) for name, examples in EXAMPLES.items() for e in examples
            if "<" not in e and "/var/" not in e and name not in ("report", "compare")]


@pytest.mark.parametrize("name,example", RUNNABLE, ids=[e for _, e in RUNNABLE])
def test_each_example_is_a_command_line_distbench_takes(tmp_path, name, example):
    """Up to the start of the run (dispatch replaced): the options parse and validate here.
    Those naming earlier runs (results/<run>) or the reader's own directories (/var/lib/...)
    are left out: those are not here."""
    argv = shlex.split(example, comments=True)
    assert argv[:2] == ["distbench", name]
    got = cli(tmp_path, *argv[1:])
    assert got.code == 0, got.stderr
