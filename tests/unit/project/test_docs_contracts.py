"""The CSV columns docs/columns.md documents are the contract users read: every CSV a command
writes must have exactly those columns, in that order. `documented_columns` reads them from the
document, so the tests that check a written header (test_*_multiproc.py, test_nccltests.py)
check it against what users were told, not against the tuple that wrote it."""

from __future__ import annotations

import re

import pytest
from doc_columns import COLUMNS_MD, RESULTS_MD, documented_columns

from distbench.core.tables import Output
from distbench.kinds import KINDS


def _outputs() -> dict[str, Output]:
    """Every CSV contract the commands declare, by file name."""
    return {o.file: o for kind in KINDS.values() for o in kind.outputs}


def test_every_csv_a_command_writes_is_documented_and_every_documented_one_is_written():
    documented = set(re.findall(r"^## `([a-z0-9_]+\.csv)`$", COLUMNS_MD.read_text(), re.M))
    assert set(_outputs()) == documented


@pytest.mark.parametrize("name", sorted(_outputs()))
def test_each_commands_columns_are_the_documented_ones_in_order(name):
    assert list(_outputs()[name].csv) == documented_columns(name)


def test_the_column_table_is_told_from_other_tables_and_ends_at_the_next_heading():
    text = "\n".join([
        "## `x.csv`", "", "| mode | what |", "|---|---|", "| `fast` | quick |", "",
        "| column | meaning |", "|---|---|", "| `a` | first |", "| `b` | second, with `c` |",
        "", "after the table", "| `d` | another table's row |", "## `y.csv`", "",
        "| column | meaning |", "|---|---|", "| `e` | only |"])
    assert documented_columns("x.csv", text) == ["a", "b"]
    assert documented_columns("y.csv", text) == ["e"]
    with pytest.raises(LookupError, match="no heading"):
        documented_columns("z.csv", text)
    with pytest.raises(LookupError, match="no `column` name"):
        documented_columns("y.csv", text.replace("| `e` |", "| e |"))


REPORT_MD = RESULTS_MD.parent / "report.md"


def test_the_identity_columns_report_md_lists_are_the_declared_ones():
    """docs/report.md tells users which columns pair two runs' rows of each file compare
    reads: the same as its contract declares, in its order."""
    listed = {}
    for line in REPORT_MD.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `([a-z0-9_]+\.csv)` \| ([a-z0-9_, ]+)", line)
        if m:
            listed[m.group(1)] = [c.strip() for c in m.group(2).split(",")]
    declared = {name: list(o.identity) for name, o in _outputs().items()
                if o.identity and not o.not_compared}
    assert listed == declared


def test_run_jsons_command_field_lists_every_command_that_writes_a_run():
    """results.md's run.json table listed 7 of the 10 commands (step, plan and watch were added
    after it was written)."""
    from distbench.kinds import commands

    row = next(line for line in RESULTS_MD.read_text().splitlines()
               if line.startswith("| `command` |") and "`accept`" in line)
    assert re.findall(r"`([a-z0-9]+)`", row.split("|")[2]) == list(commands())
