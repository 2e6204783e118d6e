"""distbench compare: the rank test (pinned to scipy), the row matching and marks, the noise
rule on repetitions, the refusal of samples that contradict their rows, the CI gate (a run
against itself, and against a run slowed as the fault hook slows one, both written as this
machine measures: tests/runs.py), --baseline at the end of a real collective and p2p run, and
bad input. The tests that start processes: test_compare_multiproc.py."""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
from pathlib import Path

import pytest
from compare_helpers import SIZES, STALLED, SWEPT, _plain_and_slowed
from helpers import Run, cli
from paths import FIXTURES
from runs import collective_row, times, write_csv, write_meta, write_run

from distbench.core import noise
from distbench.core.errors import ReadError
from distbench.core.tables import markdown_row
from distbench.kinds.collective.output import OUTPUT as COLLECTIVE
from distbench.results import compare, comparison_text, reader, samples

NCCL_TESTS = FIXTURES / "nccl-tests"

# ---------------------------------------------------------------------------------------------
# The rank test


def test_mann_whitney_fully_separated_samples():
    # U = 0 for 10 against 10: z = (50 - 0.5) / sqrt(100 * 21 / 12), p = erfc(z / sqrt 2)
    p, slower = compare.rank_test([float(i) for i in range(1, 11)],
                                  [float(i) for i in range(11, 21)])
    assert p == pytest.approx(math.erfc(49.5 / math.sqrt(175) / math.sqrt(2)), rel=1e-9)
    assert p == pytest.approx(0.000183, abs=2e-6)
    assert slower == 1.0  # every iteration of the second is the slower


def test_mann_whitney_same_samples_and_ties():
    same = [3.0, 1.0, 2.0, 2.0, 5.0]
    assert compare.rank_test(same, list(same)) == pytest.approx((1.0, 0.5))
    assert compare.rank_test([1.0] * 6, [1.0] * 6) == (1.0, 0.5)  # every value tied
    assert math.isnan(compare.rank_test([1.0], [2.0, 3.0])[0])


# scipy.stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic") on these inputs,
# pinned so that a change of scipy cannot move the reference along with the code
PINNED = [
    ([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0], 0.012185780355344813),
    ([3.1, 2.2, 5.0, 2.2, 9.4, 1.0], [2.2, 4.4, 8.1, 7.7, 2.2], 0.6403735394530488),
    ([638.7, 683.2, 571.4, 717.9, 508.6], [555.6, 723.4, 1048, 590.8, 378.7], 1.0),
]


@pytest.mark.parametrize("a,b,p", PINNED)
def test_mann_whitney_matches_scipy_pinned(a, b, p):
    from scipy.stats import mannwhitneyu  # here: a second of import for every pytest process

    assert compare.rank_test(a, b)[0] == pytest.approx(p, abs=1e-6)
    ref = mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue
    assert ref == pytest.approx(p, abs=1e-6)


def test_mann_whitney_matches_scipy_on_random_inputs_with_ties():
    from scipy.stats import mannwhitneyu

    rng = random.Random(11)
    for _ in range(200):
        a = [float(rng.randint(0, 12)) for _ in range(rng.randint(2, 30))]
        b = [float(rng.randint(0, 15)) for _ in range(rng.randint(2, 30))]
        if len(set(a + b)) == 1:
            continue  # scipy divides by a zero spread there; ours says 1.0 (tested above)
        ref = mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
        p, slower = compare.rank_test(a, b)
        assert p == pytest.approx(ref.pvalue, abs=1e-6), (a, b)
        # scipy's U is the first sample's; our slower share is the second's over n1 * n2
        assert slower == pytest.approx(1 - ref.statistic / (len(a) * len(b)), abs=1e-12)


def test_mann_whitney_shifted_noisy_samples_are_told_apart():
    rng = random.Random(7)
    a = [100 + rng.gauss(0, 5) for _ in range(200)]
    assert compare.rank_test(a, [x * 1.10 for x in a])[0] < 1e-6
    b = [100 + rng.gauss(0, 5) for _ in range(200)]  # the same distribution drawn again
    assert compare.rank_test(a, b)[0] > 0.001


# ---------------------------------------------------------------------------------------------
# Runs written by hand: the matching and the marks


def test_rows_are_marked_better_worse_same_and_incomparable(tmp_path):
    sizes = [1024, 4096, 16384, 65536]
    base = write_run(tmp_path / "base", [collective_row("all_reduce", s, 100.0) for s in sizes]
                      + [collective_row("all_gather", 1024, 50.0)],
                      [times(100.0, seed=s) for s in sizes] + [times(50.0)])
    new_times = {1024: 100.5, 4096: 80.0, 16384: 130.0}  # same, better, worse; 64K skipped
    new_rows = [collective_row("all_reduce", s, new_times[s]) for s in sizes[:3]]
    new_rows.append({**collective_row("all_reduce", 65536, 100.0), "status": "skipped",
                     "time_us": None, "busbw_gbps": None})
    new_rows.append(collective_row("broadcast", 1024, 10.0))  # only in NEW
    new = write_run(tmp_path / "new", new_rows,
                     [times(new_times[s], seed=s + 1) for s in sizes[:3]] + [[], times(10.0)])
    c = compare.compare(reader.load(base), reader.load(new), "busbw", 0.05)
    marks = {(r.group, r.label): r.mark for r in c.rows}
    assert marks == {("all_reduce", "float32 sum in 1024 B"): "~",
                     ("all_reduce", "float32 sum in 4096 B"): "+",
                     ("all_reduce", "float32 sum in 16384 B"): "-",
                     ("all_reduce", "float32 sum in 65536 B"): "x"}
    assert [r.label for r in c.worse] == ["float32 sum in 16384 B"]
    worse = c.worse[0]
    assert worse.ratio == pytest.approx(100 / 130, rel=1e-6)  # busbw: new / base
    # 5 repetitions a side, every one of NEW beyond every one of BASE
    assert worse.p_value == pytest.approx(0.012185780355344813, abs=1e-6)
    assert worse.noise is not None and worse.noise < 0.05
    assert any("1 row only in BASE, 1 only in NEW" in n for n in c.unmatched)
    (geo,) = [g for g in c.geomeans() if g[1] == "all_reduce"]
    assert geo[2] == pytest.approx((1 / 1.005 * 1 / 0.8 * 1 / 1.3) ** (1 / 3), rel=1e-6)
    assert geo[3] == 3


def test_a_change_within_the_noise_is_noisy_not_worse(tmp_path):
    """Repetitions 50% apart: a 30% slowdown cannot be told from the noise, and a 2% change
    cannot be called the same at a 5% threshold either."""
    rng = random.Random(3)
    noisy = [100 * (1 + rng.uniform(-0.4, 0.4)) for _ in range(50)]
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [noisy])
    for factor, note in ((1.3, "within the noise"), (1.02, "noisy: repetitions")):
        new = write_run(tmp_path / f"new{factor}", [collective_row("all_reduce", 1024, 100.0)],
                         [[x * factor for x in noisy[::-1]]])
        (row,) = compare.compare(reader.load(base), reader.load(new), "time", 0.05).rows
        assert row.ratio == pytest.approx(factor, rel=1e-6)
        assert row.mark == "x" and row.note.startswith(note), row
        assert row.noise > 0.3


def test_a_noisy_run_against_itself_is_the_same_not_too_noisy_to_tell(tmp_path):
    """Issue 33: a run compared with itself read '0 ~, 12 x; 12 of the x too noisy to tell'
    where every ratio was 1.000: identical measurements are the same, however noisy."""
    rng = random.Random(4)
    noisy = [100 * (1 + rng.uniform(-0.4, 0.4)) for _ in range(50)]
    run = reader.load(write_run(tmp_path / "run", [collective_row("all_reduce", 1024, 100.0)],
                                [noisy]))
    (row,) = compare.compare(run, run, "time", 0.05).rows
    assert (row.ratio, row.mark) == (1.0, "~")
    assert "0 x" in comparison_text.format_text(compare.compare(run, run), run, run)[-1]


def test_without_samples_the_threshold_alone_decides(tmp_path):
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [[]])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 120.0)], [[]])
    c = compare.compare(reader.load(base), reader.load(new))
    (row,) = c.rows
    assert (row.mark, row.p_value) == ("-", None)
    assert "no repetitions" in row.note and "threshold alone" in row.note, row.note
    assert row.by_threshold
    # the verdict line as report.md shows it, counting the rows judged by the threshold apart
    said = comparison_text._verdict(c)
    assert said.startswith("# 1 row worse by more than 5% and beyond the noise"), said
    assert "1 of them by the threshold alone" in said, said
    assert said.endswith("(0 +, 1 -, 0 ~, 0 x)"), said


def test_a_run_made_before_repetitions_were_kept_splits_its_loop(tmp_path):
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 100.0)], [times(150.0)])
    for run in (base, new):  # drop the "reps" as an older distbench wrote the file
        path = run / "collective.samples.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(samples.encode(o["row"], o["us"]) for o in lines))
    (row,) = compare.compare(reader.load(base), reader.load(new)).rows
    assert row.mark == "-" and row.p_value == pytest.approx(0.012185780355344813, abs=1e-6)


def test_setup_differences_are_listed(tmp_path):
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)],
                     versions={"torch": "2.14.0", "nccl": "2.27.3"}, backend="nccl")
    c = compare.compare(reader.load(base), reader.load(new))
    assert ("torch", "2.13.0+cpu", "2.14.0") in c.setup
    assert ("NCCL", "unknown", "2.27.3") in c.setup
    assert ("backend", "gloo", "nccl") in c.setup
    text = "\n".join(comparison_text.format_text(c, reader.load(base), reader.load(new)))
    assert "#   torch: 2.13.0+cpu -> 2.14.0" in text


def test_markdown_and_csv_formats(tmp_path):
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 150.0)], [times(150.0)])
    res = _compare(base, new, "--format", "md")
    assert res.returncode == 4, res.stderr
    table = [line for line in res.stdout.splitlines() if line.startswith("| all_reduce")]
    assert len(table) == 2  # the row and its geometric mean
    assert table[0].split("|")[-2].strip().startswith("-")
    res = _compare(base, new, "--format", "csv")
    lines = res.stdout.splitlines()
    assert lines[0] == "file,op,row,metric,base,new,ratio,p_value,mark,note,noise"
    cells = lines[1].split(",")
    assert cells[:4] == ["collective.csv", "all_reduce", "float32 sum in 1024 B", "busbw"]
    assert float(cells[6]) == pytest.approx(100 / 150, rel=1e-4) and cells[8] == "-"


def _one_and_one(tmp_path) -> tuple[Path, Path]:
    """BASE with two ops, NEW with one of them much slower and a torch of its own: a setup
    that differs, a row on one side only, and one row worse."""
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0),
                                          collective_row("all_gather", 1024, 50.0)],
                      [times(100.0), times(50.0, seed=2)])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 150.0)], [times(150.0)],
                     versions={"torch": "2.14.0"})
    return base, new


def test_markdown_blocks_stand_apart_so_github_renders_the_tables(tmp_path):
    """A table right after a list line is read as more of the list item: GitHub shows its
    pipes as text. Every table, list and paragraph starts after a blank line."""
    res = _compare(*_one_and_one(tmp_path), "--format", "md")
    assert res.returncode == 4, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    (unmatched,) = [line for line in lines if "only in BASE" in line]
    assert unmatched.startswith("- collective.csv: ") and "1 row only in BASE" in unmatched
    kinds = ["table" if line.startswith("|") else "list" if line.startswith("- ") else
             "" if not line else "text" for line in lines]
    starts = [i for i in range(1, len(lines)) if kinds[i] and kinds[i] != kinds[i - 1]]
    assert len(starts) == 5  # setup, notes, rows, geometric means, verdict
    assert all(kinds[i - 1] == "" for i in starts), lines
    heads = [lines[i] for i in starts if kinds[i] == "table"]
    assert heads[1] == "| op | row | BASE | NEW | ratio | noise | p | |"
    assert lines[-1] == ("1 row worse by more than 5% and beyond the noise (0 +, 1 -, 0 ~, "
                         "0 x)")


def test_a_pipe_in_a_markdown_cell_is_escaped():
    assert markdown_row(["node a|b", "1.000"]) == "| node a\\|b | 1.000 |"


def test_a_threshold_under_one_percent_is_echoed_as_given_and_one_row_is_one_row(tmp_path):
    """--threshold 0.5% printed as "0%" read as no threshold at all; "(1 rows)" as a slip."""
    base, new = _one_and_one(tmp_path)
    res = _compare(base, new, "--threshold", "0.5%")
    assert res.returncode == 4, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    # the noise as finely as the threshold it is held against, not "typical BASE 2%"
    assert lines[0].endswith("threshold 0.5%, and beyond the noise (repetitions' spread; "
                             "typical BASE 1.7%, NEW 1.8%)"), lines[0]
    (unmatched,) = [line for line in lines if "only in BASE" in line]
    assert unmatched.startswith("# note: collective.csv: ") and "1 row only in BASE" in unmatched
    assert lines[-2].endswith("(1 row)") and lines[-2].split()[1] == "all_reduce"
    assert lines[-1] == ("# 1 row worse by more than 0.5% and beyond the noise (0 +, 1 -, 0 ~, "
                         "0 x)")
    # the header holds no line of blanks where compare's columns have no units
    assert not [line for line in lines if len(line) > 1 and not line.strip("# ")], lines


def test_a_noisy_row_names_a_fine_threshold_as_given(tmp_path):
    """Repetitions 4.6% apart against a 0.5% threshold: noisy, and the note says so (it said
    "more than the 0% threshold")."""
    us = times(100.0, spread=0.05)
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [us])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 100.2)],
                     [[x * 1.002 for x in us]])
    (row,) = compare.compare(reader.load(base), reader.load(new), "time", 0.005).rows
    assert (row.mark, row.note) == ("x", "noisy: repetitions 4.6% apart, more than the 0.5% "
                                         "threshold"), row


# ---------------------------------------------------------------------------------------------
# The command line


def _compare(*args) -> Run:
    """`distbench compare *args`, in this process (it starts nothing)."""
    return cli(Path.cwd(), "compare", *map(str, args))


def _one_error_line(res, *fragments: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distbench: error: "), res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_error_line(_compare(empty, ok), f"{empty}: no run here")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "collective.csv").write_text("op,dtype,size_bytes\nall_reduce,float32,8\n")
    _one_error_line(_compare(ok, broken), f"{broken}/collective.csv: missing columns redop")
    other = tmp_path / "p2p"
    other.mkdir()
    shutil.copy(tmp_path / "ok" / "run.json", other / "run.json")
    from distbench.kinds.p2p.output import OUTPUT as P2P

    (other / "p2p.csv").write_text(",".join(P2P.csv) + "\n")
    _one_error_line(_compare(ok, other), "shares no table compare reads")
    far = write_run(tmp_path / "far", [collective_row("all_reduce", 1 << 20, 100.0)],
                    [times(100.0)])
    _one_error_line(_compare(ok, far), "no row in common")
    log = tmp_path / "nccl.log"
    log.write_text("some output that is no nccl-tests table\n")
    _one_error_line(_compare(log, ok), str(log))
    _one_error_line(_compare(ok, ok, "--threshold", "five"), "--threshold", "example:")
    _one_error_line(_compare(ok, ok, "--metric", "speed"), "--metric", "busbw, time, p99")
    _one_error_line(_compare(ok, tmp_path / "missing"), "no such file or directory")


# ---------------------------------------------------------------------------------------------
# Real runs


def test_a_run_against_itself_is_the_same_everywhere(tmp_path):
    plain, _ = _plain_and_slowed(tmp_path)
    res = _compare(plain, plain)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith(" ")
            and ("all_reduce" in line or "all_gather" in line)]
    assert len(rows) == 6
    c = compare.compare(reader.load(plain), reader.load(plain))
    # nothing changed: the same, even the row whose repetitions are far apart; never better,
    # worse or too noisy to tell
    assert all(r.ratio == 1.0 and r.mark == "~" for r in c.rows), res.stdout
    assert "# setup: the same" in res.stdout
    assert "# no row worse by more than 5% and beyond the noise (0 +, 0 -," in res.stdout


def test_a_slowed_run_is_worse_and_fails_the_gate(tmp_path):
    plain, slowed = _plain_and_slowed(tmp_path)
    res = _compare(plain, slowed)
    assert res.returncode == 4, res.stdout + res.stderr
    c = compare.compare(reader.load(plain), reader.load(slowed))
    assert len(c.rows) == 6 and len(c.worse) >= 3
    # worse: every repetition of the slowed run beyond every one of the plain run (5 against 5),
    # by more than the noise allows; a row not called worse is one whose own repetitions (a
    # stall of the plain run) are too far apart to tell: never the same, never better
    assert all(r.ratio < 0.5 and r.p_value < 0.05 for r in c.worse)
    base, new = reader.load(plain), reader.load(slowed)
    for i, r in enumerate(c.rows):  # both runs wrote the same rows in the same order
        b, n = compare._reps(base, "collective.csv", i), compare._reps(new, "collective.csv", i)
        # the rule is on the repetitions (noise.call): the gap between the nearest ones against
        # the noise said, which is never less than the faster (plain) run's own spread. A stall
        # of the plain run (seen under load: 739 to 2654 us) makes its row too noisy to tell.
        gap = min(n) / max(b)
        assert r.noise >= noise.spread(b), (r, b)
        assert statistics.median(n) / statistics.median(b) > 1.05, (r, b, n)
        assert r.mark == "-" and gap > (1 + r.noise) ** noise.GAP_MARGIN or \
            r.mark == "x" and r.note.startswith("within the noise") and \
            gap <= (1 + r.noise) ** noise.GAP_MARGIN, (r, b, n)
    # both kinds of row are here: the stalled one too noisy to tell, the others worse
    assert [r.mark == "x" for r in c.rows] == [k == STALLED for k in
                                              ((op, size) for op, _, _ in SWEPT for size in SIZES)]
    assert f"{len(c.worse)} rows worse by more than 5% and beyond the noise" in res.stdout
    # the other way round every row is better, and the gate passes
    assert _compare(slowed, plain).returncode == 0


def test_baseline_is_validated_before_any_worker(tmp_path):
    res = cli(tmp_path, "collective", "--baseline", str(tmp_path / "nothing"), "--out",
              str(tmp_path))
    assert res.code == 2
    (said,) = res.stderr.strip().splitlines()
    assert said.startswith(f"distbench: error: --baseline: {tmp_path / 'nothing'}: "), said
    assert "no such file or directory" in said and "distbench run directory" in said, said
    assert "(example: --baseline " in said, said
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_an_nccl_tests_log_compares_with_itself_and_with_a_distbench_run(tmp_path):
    log = NCCL_TESTS / "bare_table.log"
    res = _compare(log, log)
    assert res.returncode == 0, res.stdout + res.stderr
    # 6 sizes, both placements; 8 bytes shows a busbw of 0.00, which nothing can be compared to
    assert "(0 +, 0 -, 10 ~, 2 x)" in res.stdout
    # a distbench run of the same shape (8 ranks, one node), half as fast at 1 MiB out of place
    ours = write_run(tmp_path / "ours", [
        {**collective_row("all_reduce", 1024, 15.62), "world_size": 8, "in_place": 0,
         "busbw_gbps": 0.11},
        {**collective_row("all_reduce", 1048576, 90.5), "world_size": 8, "in_place": 0,
         "busbw_gbps": 20.27}], [times(15.62), times(90.5)], world_size=8)
    c = compare.compare(reader.load(log), reader.load(ours))
    assert [(r.label, r.mark) for r in c.rows] == [("float32 sum out 1024 B", "~"),
                                                   ("float32 sum out 1048576 B", "-")]
    (worse,) = c.worse
    assert worse.ratio == pytest.approx(20.27 / 40.55, rel=1e-3)
    assert "no repetitions" in worse.note and "threshold alone" in worse.note, worse.note


# ---------------------------------------------------------------------------------------------
# What an adversarial review found


def test_a_cell_that_is_no_number_is_one_line_naming_file_column_and_row(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    fast = {**collective_row("all_reduce", 4096, 100.0), "busbw_gbps": "fast"}
    junk = write_run(tmp_path / "junk", [collective_row("all_reduce", 1024, 100.0), fast],
                      [times(100.0), times(100.0)])
    _one_error_line(_compare(ok, junk), f"{junk}/collective.csv: column busbw_gbps holds 'fast' "
                    "in row 2, not a number")
    nan = write_run(tmp_path / "nan",
                    [{**collective_row("all_reduce", 1024, 100.0), "busbw_gbps": "nan"}], [[]])
    (row,) = compare.compare(reader.load(ok), reader.load(nan)).rows
    assert row.mark == "x"  # no value: nothing to compare, not a slowdown


def test_a_run_with_no_rows_yet_is_refused_as_base_and_as_baseline(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    empty = write_run(tmp_path / "empty", [], [])
    _one_error_line(_compare(empty, ok), "no row in common", "collective.csv: no rows in BASE")
    res = cli(tmp_path, "collective", "--baseline", str(empty), "--out", str(tmp_path))
    assert res.code == 2 and "no rows of collective.csv" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_baseline_of_another_world_size_is_refused_before_any_worker(tmp_path):
    three = write_run(tmp_path / "three", [{**collective_row("all_reduce", 1024, 100.0),
                                             "world_size": 3}], [times(100.0)])
    (tmp_path / "out").mkdir()
    res = cli(tmp_path / "out", "collective", "--workers", "2", "--baseline", str(three),
              "--out", str(tmp_path / "out"))
    assert res.code == 2, res.stderr
    (said,) = res.stderr.strip().splitlines()
    assert said.startswith("distbench: error: --baseline: ") and str(three) in said, said
    assert "3 ranks" in said and "has 2" in said and "(example: --baseline " in said, said
    assert not list((tmp_path / "out").iterdir())


def test_time_is_worse_by_its_own_growth_not_by_the_bandwidth_it_implies(tmp_path):
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)], [[]])
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, 111.0)], [[]])
    (row,) = compare.compare(reader.load(base), reader.load(new), "time", 0.10).rows
    assert row.mark == "-" and row.ratio == pytest.approx(1.11)
    (row,) = compare.compare(reader.load(base), reader.load(new), "time", 0.12).rows
    assert row.mark == "~"


def test_a_mean_moved_by_outliers_against_most_iterations_is_not_a_slowdown(tmp_path):
    base = write_run(tmp_path / "base", [collective_row("all_reduce", 1024, 100.0)],
                      [times(100.0, n=50)])
    # 49 iterations 10% faster, one spike: the mean is slower, the iterations are not
    faster = times(90.0, n=49) + [1500.0]
    new = write_run(tmp_path / "new", [collective_row("all_reduce", 1024, sum(faster) / 50)],
                    [faster])
    (row,) = compare.compare(reader.load(base), reader.load(new)).rows
    assert row.ratio < 0.95 and row.p_value < 0.05  # the repetitions are 10% faster
    assert (row.mark, row.note) == ("x", "the row's mean and its repetitions disagree")


def test_rows_that_share_an_identity_pair_up_in_order(tmp_path):
    twice = tmp_path / "twice.log"
    text = (NCCL_TESTS / "bare_table.log").read_text()
    twice.write_text(text + text)
    c = compare.compare(reader.load(twice), reader.load(twice))
    assert len(c.rows) == 24 and all(r.ratio in (None, 1.0) for r in c.rows)


def test_run_json_and_topo_json_of_the_wrong_shape_are_no_traceback(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    odd = write_run(tmp_path / "odd", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)],
                     versions="2.3")
    (odd / "topo.json").write_text(json.dumps({"nodes": [{"gpus": "none", "cpu": []}, 5]}))
    res = _compare(ok, odd)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "#   torch: 2.13.0+cpu -> unknown" in res.stdout


# ---------------------------------------------------------------------------------------------
# Samples that cannot be what measured their row: refused, not compared


def _edit_csv(run: Path, column: str, factor: float) -> None:
    path = run / "collective.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    at = header.index(column)
    for i in range(1, len(lines)):
        cells = lines[i].split(",")
        cells[at] = str(float(cells[at]) * factor)
        lines[i] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _edit_samples(run: Path, change) -> None:
    path = run / "collective.samples.jsonl"
    items = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(o)) + "\n" for o in items))


def test_a_csv_edited_slower_with_its_samples_unchanged_is_refused(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    edited = write_run(tmp_path / "edited", [collective_row("all_reduce", 1024, 100.0)],
                       [times(100.0)])
    for column in ("time_us", "p50_us"):
        _edit_csv(edited, column, 2.0)
    _one_error_line(_compare(ok, edited), f"{edited}/collective.csv: row 0",
                    "contradicts its samples", "refusing to compare it")
    _one_error_line(_compare(edited, ok), "contradicts its samples")  # as BASE too


def test_samples_doubled_with_the_csv_unchanged_are_refused(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    doubled = write_run(tmp_path / "doubled", [collective_row("all_reduce", 1024, 100.0)],
                         [times(100.0)])
    _edit_samples(doubled, lambda o: {**o, "us": [2 * v for v in o["us"]],
                                      "reps": [2 * v for v in o["reps"]]})
    _one_error_line(_compare(ok, doubled), "contradicts its samples", "median")
    # the repetitions alone doubled: they no longer split the iterations they claim to
    reps = write_run(tmp_path / "reps", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    _edit_samples(reps, lambda o: {**o, "reps": [2 * v for v in o["reps"]]})
    _one_error_line(_compare(ok, reps), "contradicts its samples", "repetition 0")


@pytest.mark.parametrize("change,needle", [
    (lambda o: {**o, "us": [float("nan")] + o["us"][1:]}, "NaN, infinite or negative"),
    (lambda o: {**o, "us": [-1.0] + o["us"][1:]}, "NaN, infinite or negative"),
    (lambda o: {**o, "reps": [-5.0] + o["reps"][1:]}, "NaN, infinite or negative"),
])
def test_nan_and_negative_samples_are_refused(tmp_path, change, needle):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    bad = write_run(tmp_path / "bad", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    _edit_samples(bad, change)
    _one_error_line(_compare(ok, bad), "collective.samples.jsonl: line 1", needle)


def test_duplicate_samples_of_a_row_are_refused(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    twice = write_run(tmp_path / "twice", [collective_row("all_reduce", 1024, 100.0)],
                      [times(100.0)])
    path = twice / "collective.samples.jsonl"
    path.write_text(path.read_text() * 2)
    _one_error_line(_compare(ok, twice), "line 2: a second line for row 0")


def test_samples_for_a_row_the_csv_does_not_have_are_refused(tmp_path):
    ok = write_run(tmp_path / "ok", [collective_row("all_reduce", 1024, 100.0)], [times(100.0)])
    extra = write_run(tmp_path / "extra", [collective_row("all_reduce", 1024, 100.0)],
                      [times(100.0)])
    _edit_samples(extra, lambda o: {**o, "row": 7})
    res = _compare(ok, extra)
    _one_error_line(res, "samples for row 7, but collective.csv has 1 row")
    assert res.stderr.rstrip().endswith("has 1 row"), res.stderr  # not "1 rows"


def test_accept_rows_are_headed_in_their_own_units_and_named_in_full(tmp_path):
    """accept.csv rows are each in their check's unit: no "busbw (GB/s)" over microseconds, and
    check names longer than the op column still line up."""
    from distbench.kinds.accept.output import OUTPUT as ACCEPT

    def accept_run(path: Path, latency: float) -> Path:
        path.mkdir()
        rows = [{"check": "cluster all_reduce latency", "scope": "cluster", "target": "cluster",
                 "metric": "time_us", "measured": latency, "verdict": "PASS", "retest": 0},
                {"check": "node all_reduce busbw", "scope": "node", "target": "vm",
                 "metric": "p50_busbw_gbps", "measured": 1.0, "verdict": "PASS", "retest": 0}]
        write_csv(path / "accept.csv", ACCEPT.csv, rows)
        return write_meta(path, "accept", finished=False, status="ok", world_size=2, nnodes=1)

    base, new = accept_run(tmp_path / "a", 100.0), accept_run(tmp_path / "b", 300.0)
    res = _compare(base, new)
    assert res.returncode == 4, res.stdout + res.stderr  # latency tripled: worse
    head = res.stdout.splitlines()[0]
    assert head.startswith("# compare busbw (each check in its own unit)") and "GB/s" not in head
    rows = [line for line in res.stdout.splitlines() if "all_reduce" in line
            and not line.startswith("#")]
    # the ratio column starts at one place in both rows
    assert len(rows) == 2 and rows[0].index("3.000") == rows[1].index("1.000"), rows
    assert "# geometric mean of NEW/BASE per check" in res.stdout
    # the first column holds checks, and is headed so, in text and in Markdown
    (head,) = [line for line in res.stdout.splitlines() if "BASE" in line and "ratio" in line]
    assert head.split()[:3] == ["#", "check", "row"], head
    md = _compare(base, new, "--format", "md").stdout.splitlines()
    assert "| check | row | BASE | NEW | ratio | noise | p | |" in md
    assert "| check | geometric mean NEW/BASE | rows |" in md


def test_rows_of_other_groups_do_not_pair_and_older_runs_match_as_before(tmp_path):
    """collective --group-size: a row of 2 groups of 2 at stride 2 is no row of consecutive
    groups, nor of the whole world; a run without the group columns (written before them) is
    still read, and two such runs match without a word about them."""
    def rows(**group) -> list[dict]:
        return [collective_row("all_reduce", 1024, 100.0, world_size=4, **group)]

    strided = dict(group_size=2, group_stride=2, groups=2, per_node=1)
    base = write_run(tmp_path / "consecutive", rows(group_size=2, group_stride=1, groups=2,
                                                     per_node=2), [times(100.0)])
    new = write_run(tmp_path / "strided", rows(**strided), [times(100.0, seed=2)])
    again = write_run(tmp_path / "strided-again", rows(**strided), [times(100.0, seed=3)])
    with pytest.raises(ReadError, match="1 row only in BASE, 1 only in NEW"):
        compare.compare(reader.load(base), reader.load(new), "time", 0.05)
    (row,) = compare.compare(reader.load(new), reader.load(again), "time", 0.05).rows
    assert row.ratio is not None and row.label == "float32 sum in 1024 B groups of 2 stride 2"
    old = [write_run(tmp_path / f"old{i}", [collective_row("all_reduce", 1024, 100.0)],
                      [times(100.0, seed=i)]) for i in (4, 5)]
    for path in old:  # as a run written before the group columns: none of them
        text = (path / "collective.csv").read_text().splitlines()
        cut = len(COLLECTIVE.csv) - 4
        (path / "collective.csv").write_text("\n".join(",".join(line.split(",")[:cut])
                                                       for line in text) + "\n")
    c = compare.compare(reader.load(old[0]), reader.load(old[1]), "time", 0.05)
    assert len(c.rows) == 1 and c.rows[0].ratio is not None
    assert not any("group" in n for n in c.unmatched), c.unmatched
