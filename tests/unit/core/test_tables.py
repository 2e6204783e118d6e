"""The one table formatter, the column declarations beside each CSV contract, and the docs that
describe them: docs/columns.md lists every CSV column in order, README links only to pages that
exist."""

from __future__ import annotations

import re

import pytest
from paths import REPO

from distbench.core.tables import (
    Column,
    Output,
    fmt_us,
    format_header,
    format_matrix,
    format_row,
    format_table,
    markdown_table,
    us_as_ms,
)
from distbench.kinds.accept import output as accept
from distbench.kinds.collective import output as collective
from distbench.kinds.dp import output as dp
from distbench.kinds.p2p import output as p2p
from distbench.kinds.pp import output as pp
from distbench.kinds.tp import output as tp

OUTPUTS = [collective.OUTPUT, p2p.OUTPUT, p2p.MATRIX_OUTPUT, tp.OUTPUT, pp.OUTPUT,
           dp.OUTPUT, accept.OUTPUT]
COLS = (Column("name", "name", "", 6, ident=True), Column("t", "time", "(us)", 10, fmt=fmt_us),
        Column("bw", "bw", "(GB/s)", 8, ".2f"), Column("ok", "ok", "", 4))


def test_format_table_returns_header_then_rows():
    rows = [{"name": "a", "t": 12.345, "bw": 1.5, "ok": True},
            {"name": "b", "t": 2.5e6, "bw": None, "ok": False}]
    assert format_table(COLS, rows, title="demo") == [
        "#",
        "# demo",
        "#" + "  name      time      bw  ok"[1:],
        "#" + "            (us)  (GB/s)    "[1:],
        "     a     12.35    1.50   1",
        "     b   2.5e+06       -   0",
    ]
    assert format_table(COLS, rows[:1]) == ["     a     12.35    1.50   1"]
    assert format_table(COLS, [], title="x") == format_header(COLS, "x")


def test_a_cell_wider_than_its_column_never_runs_into_its_neighbour():
    # a plan's step of a 7b model scaled from a CPU's measurements: 12 characters in 10
    wide = (Column("a", "a", "", 10, ".2f"), Column("b", "b", "", 10, ".2f"))
    assert format_row(wide, {"a": 169573627.809, "b": 9246128.12}) == \
        "169573627.81 9246128.12"
    assert format_row(wide, {"a": 1.0, "b": 2.0}) == "      1.00      2.00"
    assert format_row(wide, {"a": 123456.789, "b": 2.0}) == " 123456.79      2.00"


def test_a_header_without_units_has_no_line_of_blanks():
    """compare's and accept's columns have no units: a unit line would be '#' and spaces."""
    bare = (Column("name", "name", "", 6), Column("ok", "ok", "", 4))
    assert format_header(bare, "x") == ["#", "# x", "#" + "  name  ok"[1:]]


def test_a_skipped_row_shows_what_names_it_and_why():
    row = {"name": "c", "t": None, "status": "skipped", "note": "too small"}
    assert format_row(COLS, row) == "     c   skipped: too small"
    # another status is a measured row, shown in full (tp's "wrong" rows)
    assert format_row(COLS, {"name": "c", "t": 1.0, "bw": 2.0, "ok": 0,
                             "status": "wrong"}) == "     c      1.00    2.00   0"


def test_cell_formats():
    assert us_as_ms(".2f")(1234.0) == "1.23"
    assert fmt_us(999_999.0) == "999999.00" and fmt_us(1e6) == "1e+06"
    assert Column("x", "x", fmt=lambda v: "in" if v else "out").cell({"x": True}) == "in"
    assert Column("x", "x").cell({"x": ""}) == "-"
    assert Column("x", "x").cell({}) == "-"


def test_matrix_grid():
    lines = format_matrix("m", ["h:0", "h:1"], {(0, 1): 1.25})
    assert lines[:2] == ["#", "# m"]
    assert lines[3].split() == ["0", "-", "1.25", "h:0"]
    assert lines[4].split() == ["1", "?", "-", "h:1"]


def test_console_columns_must_be_csv_columns():
    with pytest.raises(ValueError, match="nope"):
        Output("x.csv", csv=("a",), console=(Column("nope", "n"),))


def test_identity_and_read_columns_must_be_csv_columns_and_are_required_in_csv_order():
    with pytest.raises(ValueError, match=r"identity columns not in the CSV: \['nope'\]"):
        Output("x.csv", csv=("a",), identity=("nope",))
    with pytest.raises(ValueError, match=r"read columns not in the CSV: \['nope'\]"):
        Output("x.csv", csv=("a",), read=("nope",))
    out = Output("x.csv", csv=("a", "b", "c", "d"), identity=("c", "a"), read=("d",))
    assert out.identity == ("c", "a")  # compare matches and labels rows in this order
    assert out.required == ("a", "c", "d")


def test_markdown_table_aligns_escapes_and_leaves_a_nameless_header_cell_blank():
    assert markdown_table(["op", "n", ""], [["a|b", 3, "+ note"], ["c", "", ""]], align="lr") == [
        "| op | n | |", "|---|---:|---|", "| a\\|b | 3 | + note |", "| c |  |  |"]


@pytest.mark.parametrize("output", OUTPUTS, ids=[o.file for o in OUTPUTS])
def test_declared_columns_are_unique_and_shown_ones_exist(output):
    assert len(set(output.csv)) == len(output.csv)
    assert all(c.key in output.csv for c in output.console)


def _doc_table(text: str, heading: str) -> list[str]:
    """First-column names of the first `| column | meaning |` table under `heading`."""
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| column |"))
    names = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names.append(re.match(r"\|\s*`([^`]+)`", line).group(1))
    return names


@pytest.mark.parametrize("output", OUTPUTS, ids=[o.file for o in OUTPUTS])
def test_results_doc_lists_every_column_in_order(output):
    text = (REPO / "docs" / "columns.md").read_text()
    assert _doc_table(text, f"## `{output.file}`") == list(output.csv)


def test_readme_is_a_front_page_whose_links_exist():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make run" in text and "make test" in text
    links = re.findall(r"\]\(([^)#\s]+)", text)
    local = [link for link in links if "://" not in link]
    for page in ("commands", "results", "methodology", "architecture", "scale"):
        assert f"docs/{page}.md" in local
    for link in local:
        assert (REPO / link).exists(), link


def test_no_code_comment_points_outside_the_repository():
    for path in [*(REPO / "distbench").rglob("*.py"), *(REPO / "tests").glob("*.py")]:
        text = path.read_text()
        assert "DESIGN" + ".md" not in text, path


# The CSV contracts written out by hand: a column renamed, dropped or moved in a declaration
# must fail here, not pass by comparing the declaration with itself.
PINNED = {
    'collective.csv': (
        "op dtype redop root in_place world_size nnodes size_bytes count iters time_us "
        "rank_min_us rank_max_us slowest_rank p50_us p99_us cv_pct algbw_gbps busbw_gbps wrong "
        "backend status note launch_bound reps spread_pct group_size group_stride groups "
        "per_node "
    ).split(),
    'p2p.csv': (
        "pattern dtype world_size nnodes pairs size_bytes count iters time_us rank_min_us "
        "rank_max_us slowest_rank p50_us p99_us cv_pct algbw_gbps busbw_gbps wrong backend status "
        "note launch_bound reps spread_pct "
    ).split(),
    'p2p_matrix.csv': (
        "direction src_rank dst_rank src_host dst_host src_local_rank dst_local_rank link dtype "
        "world_size nnodes size_bytes count iters time_us p50_us p99_us cv_pct gbps wrong backend "
        "reps spread_pct "
    ).split(),
    'tp.csv': (
        "block dtype world_size nnodes hidden_size ffn_size heads seq_len micro_batch_size layers "
        "iters step_us rank_min_us rank_max_us slowest_rank p50_us p99_us cv_pct compute_only_us "
        "comm_pct tflops_per_rank tokens_per_s allreduce_bytes_per_step implied_busbw_gbps t1_us "
        "speedup efficiency max_abs_err backend status note "
    ).split(),
    'pp.csv': (
        "schedule dtype world_size nnodes stages virtual_stages layers layers_per_stage "
        "micro_batches micro_batch_size hidden_size seq_len iters step_us rank_min_us rank_max_us "
        "slowest_rank p50_us p99_us cv_pct samples_per_s bubble_measured "
        "bubble_measured_per_stage bubble_analytic p2p_bytes_per_step t1_us speedup efficiency "
        "max_abs_err backend status note "
    ).split(),
    'dp.csv': (
        "mode bucket_cap_mb dtype world_size nnodes block hidden_size ffn_size heads seq_len "
        "micro_batch_size layers params iters step_us rank_min_us rank_max_us slowest_rank p50_us "
        "p99_us cv_pct compute_only_us comm_alone_us exposed_comm_us overlap_pct bytes_per_step "
        "bytes_counted implied_busbw_gbps state_bytes_per_rank state_bytes_formula peak_mem_bytes "
        "samples_per_s t1_us efficiency max_abs_err backend status note"
    ).split(),
    'accept.csv': (
        "check scope target command op dtype size_bytes ranks iters time_us p99_us algbw_gbps "
        "busbw_gbps wrong metric measured expected warn_at reference ratio verdict retest note "
        "p50_us spread"
    ).split(),
}



@pytest.mark.parametrize("output", OUTPUTS, ids=[o.file for o in OUTPUTS])
def test_csv_contracts_are_pinned(output):
    assert list(output.csv) == PINNED[output.file]


def test_every_number_column_is_a_registered_csvs_column():
    """NUMBERS and NONNEGATIVE name columns of the contracts the kinds register: a column
    renamed or dropped in a contract is renamed or dropped here too."""
    from distbench.core.contracts import NONNEGATIVE, NUMBERS, outputs
    from distbench.kinds import KINDS

    assert KINDS and outputs()  # the kinds registered their contracts
    columns = {c for o in outputs() for c in o.csv}
    assert [c for c in NUMBERS if c not in columns] == []
    assert NONNEGATIVE <= set(NUMBERS)

