"""A CSV cell or row no measurement can write is left out and named, by report and by compare
alike (docs/report.md): a row cut short by a write that stopped mid-row (`...,262144,65536,10,11`
is 11 us where 1136 was being written), and a time or bandwidth below zero. The intact run is
read with nothing left out and nothing said."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import cli
from paths import FIXTURES

from distbench.kinds import KINDS
from distbench.results import alphabeta, compare, reader, report

FIXTURE = FIXTURES / "runs" / "collective"
CUT_CELLS = 11  # the cut row keeps op .. iters and the first digits of its time


def _copy(tmp_path: Path, name: str) -> Path:
    run = tmp_path / name
    shutil.copytree(FIXTURE, run)
    return run


def _lines(run: Path) -> list[str]:
    return (run / "collective.csv").read_text().splitlines()


def _cut_last_row(run: Path) -> str:
    """The last row cut after its 11th cell and two digits of its 11th, no newline after."""
    lines = _lines(run)
    cells = lines[-1].split(",")
    lines[-1] = ",".join(cells[:CUT_CELLS - 1] + [cells[CUT_CELLS - 1][:2]])
    (run / "collective.csv").write_text("\n".join(lines))
    return lines[-1]


def _set_cell(run: Path, row: int, column: str, value: str) -> None:
    lines = _lines(run)
    header = lines[0].split(",")
    cells = lines[row].split(",")
    cells[header.index(column)] = value
    lines[row] = ",".join(cells)
    (run / "collective.csv").write_text("\n".join(lines) + "\n")


def _broadcast_fit(run: reader.Run) -> dict:
    frame = run.table("collective.csv")
    return next(f for f in alphabeta.fit_rows(frame) if f["op"] == "broadcast")


def test_the_intact_run_leaves_nothing_out():
    run = reader.load(FIXTURE)
    assert run.dropped == [] and run.cut == [] and reader.left_out(run) == []
    lines = report.markdown([run], KINDS.values(), [])
    assert not any(line.startswith("Left out") for line in lines)


def test_a_row_cut_short_is_left_out_whole_and_named(tmp_path):
    intact = reader.load(FIXTURE)
    rows = len(intact.table("collective.csv"))
    cut_dir = _copy(tmp_path, "cut")
    cut_text = _cut_last_row(cut_dir)
    assert cut_text.endswith(",262144,65536,10,11")  # the row
    cut = reader.load(cut_dir)
    table = cut.table("collective.csv")
    assert len(table) == rows - 1 and 262144 not in set(
        table[table["op"] == "broadcast"]["size_bytes"])
    assert cut.cut == [f"collective.csv row {rows} ({CUT_CELLS} of 26 cells)"]
    # the fit is the one over the rows that were written whole
    whole_dir = _copy(tmp_path, "whole")
    (whole_dir / "collective.csv").write_text("\n".join(_lines(whole_dir)[:-1]) + "\n")
    assert _broadcast_fit(cut) == pytest.approx(_broadcast_fit(reader.load(whole_dir)))
    text = "\n".join(report.markdown([cut], KINDS.values(), []))
    assert (f"Left out 1 row(s) cut short, fewer cells than the header (a write that stopped "
            f"mid-row): collective.csv row {rows} ({CUT_CELLS} of 26 cells).") in text


def test_compare_neither_reads_the_cut_row_nor_keeps_quiet_about_it(tmp_path):
    cut_dir = _copy(tmp_path, "cut")
    _cut_last_row(cut_dir)
    c = compare.compare(reader.load(FIXTURE), reader.load(cut_dir), "time")
    broadcast = [r for r in c.rows if r.group == "broadcast" and "256 KiB" in r.label]
    assert broadcast == [], broadcast  # on one side only: no 1136 -> 11
    assert any(n.startswith("NEW: Left out 1 row(s) cut short") for n in c.unmatched), c.unmatched
    # through the command line, the note is printed
    res = cli(tmp_path, "compare", str(FIXTURE), str(cut_dir), "--metric", "time")
    assert "# note: NEW: Left out 1 row(s) cut short" in res.stdout, res.stdout


def test_the_same_run_twice_says_nothing_is_left_out(tmp_path):
    c = compare.compare(reader.load(FIXTURE), reader.load(_copy(tmp_path, "again")), "time")
    assert not any("Left out" in n for n in c.unmatched), c.unmatched
    assert not c.worse


@pytest.mark.parametrize("column", ["time_us", "busbw_gbps"])
def test_a_negative_time_or_bandwidth_is_left_out_and_named(tmp_path, column):
    run_dir = _copy(tmp_path, "neg")
    _set_cell(run_dir, 2, column, "-5")
    run = reader.load(run_dir)
    assert run.dropped == [f"collective.csv row 2 {column} -5"]
    assert run.table("collective.csv")[column].isna().sum() == 1
    text = "\n".join(report.markdown([run], KINDS.values(), []))
    assert (f"Left out 1 value(s) no measurement can take (not finite, negative, or beyond "
            f"1e+18): collective.csv row 2 {column} -5.") in text
    c = compare.compare(reader.load(FIXTURE), run, column.split("_")[0])
    assert all(r.new is None or r.new >= 0 for r in c.rows)
    assert any(n.startswith("NEW: Left out 1 value(s)") for n in c.unmatched)


def test_a_root_of_minus_one_is_no_broken_cell():
    """-1 is how a run says an op has no root: not a negative measurement."""
    run = reader.load(FIXTURE)
    assert (run.table("collective.csv")["root"] == -1).any() and run.dropped == []


def test_a_row_left_out_for_its_size_names_its_cells_up_to_the_size_alone(tmp_path):
    """A size no measurement can take leaves the row out whole: its broken cells in the columns
    read before size_bytes are named, those after it are not (the row is gone), and the other
    rows' are."""
    run_dir = _copy(tmp_path, "size")
    _set_cell(run_dir, 2, "world_size", "-2")
    _set_cell(run_dir, 2, "size_bytes", "-256")
    _set_cell(run_dir, 2, "time_us", "-5")
    _set_cell(run_dir, 3, "time_us", "inf")
    run = reader.load(run_dir)
    assert run.dropped == ["collective.csv row 2 world_size -2",
                           "collective.csv row 2 size_bytes -256",
                           "collective.csv row 3 time_us inf"]
    table = run.table("collective.csv")
    assert len(table) == len(reader.load(FIXTURE).table("collective.csv")) - 1
    assert table["time_us"].isna().sum() == 1 and (table["size_bytes"] > 0).all()
