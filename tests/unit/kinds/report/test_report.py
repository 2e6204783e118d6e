"""distbench report on real small runs (collective and tp, recorded in tests/fixtures/runs):
valid PNGs of a sensible size, report.md naming every op, model.json; several runs and an
nccl-tests log overlaid; --predict; bad input. (What each kind's section and plots hold, on its
recorded run: tests/unit/results/test_run_kinds.py.) And, on run
directories written by hand (no worker started): what the accept section and the verdict plot
say of failures and retests, and how an nccl-tests log's world shows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from helpers import Run, cli
from matplotlib.colors import to_rgba
from paths import FIXTURES
from report_helpers import _sensible
from runs import write_csv, write_meta

from distbench.kinds import KINDS
from distbench.kinds.accept import output as accept_output
from distbench.kinds.accept.output import OUTPUT as ACCEPT
from distbench.results import plots, reader, report

NCCL_TESTS = FIXTURES / "nccl-tests"
OPS = ("all_reduce", "all_gather", "broadcast")


def _report(*args, cwd=None) -> Run:
    """`distbench report *args`, in this process (it starts nothing)."""
    return cli(cwd or Path.cwd(), "report", *map(str, args))


# The real runs recorded in tests/fixtures/runs (remake.sh says how each was made: the
# collective of OPS over 256 B to 256 KiB, tp on 2 workers); report reads them here, in this
# process, as it would read fresh ones.
RECORDED = FIXTURES / "runs"
REPORTED = ("collective", "tp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A copy of each recorded run (report writes its report/ into the run)."""
    out = tmp_path_factory.mktemp("runs")
    return {name: Path(shutil.copytree(RECORDED / name, out / name)) for name in REPORTED}


def test_the_recorded_collective_run_has_every_op():
    ops = set(reader.load(RECORDED / "collective").tables["collective.csv"]["op"])
    assert ops == set(OPS)


def test_report_of_a_collective_run(runs):
    res = _report(runs["collective"])
    assert res.returncode == 0, res.stderr
    out = runs["collective"] / "report"
    text = (out / "report.md").read_text()
    assert res.stdout.strip() == text.strip()  # the summary goes to stdout too
    for op in OPS:
        assert f"| {op} | float32 |" in text  # its peak busbw row and its model row
    for name in ("collective_busbw.png", "collective_latency.png"):
        _sensible(out / name)
        assert f"]({name})" in text
    fits = json.loads((out / "model.json").read_text())["fits"]
    assert {f["op"] for f in fits} == set(OPS)
    assert all(f["alpha_us"] > 0 and f["busbw_gbps"] > 0 for f in fits)


def test_several_runs_and_an_nccl_tests_log_on_one_plot(runs, tmp_path):
    log = NCCL_TESTS / "bare_table.log"
    res = _report(runs["collective"], log, "--out", tmp_path / "both")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "both" / "report.md").read_text()
    assert f"`{runs['collective'].name}`" in text and f"`{log.name}`" in text
    fits = json.loads((tmp_path / "both" / "model.json").read_text())["fits"]
    assert {f["run"] for f in fits} == {runs["collective"].name, log.name}
    _sensible(tmp_path / "both" / "collective_busbw.png")


def test_predict_prints_the_model_and_writes_nothing(runs):
    res = _report(runs["collective"], "--predict", "all_reduce:1G")
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.strip().splitlines()
    assert line.startswith(f"{runs['collective'].name}: all_reduce float32 ")
    assert " at 1 GiB: " in line and " us, busbw " in line
    (f,) = [f for f in KINDS["collective"].fits(reader.load(runs["collective"]))
            if f["op"] == "all_reduce"]
    t_us = float(line.split(" at 1 GiB: ")[1].split(" us")[0])  # the model: alpha + S / beta
    assert t_us == pytest.approx(f["alpha_us"] + (1 << 30) / (f["beta_gbps"] * 1e3), rel=1e-3)


def test_bad_input_is_one_line_exit_2_and_writes_nothing(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "afile").write_text("")
    for args, words in (
        ([empty], [f"{empty}: no run here"]),
        ([runs["collective"], "--predict", "all_reduce"], ["--predict", "example:"]),
        ([runs["collective"], "--predict", "bogus:1M"], ["--predict", "all_reduce"]),
        ([runs["tp"], "--predict", "all_reduce:1M"], ["no run here has a fitted model"]),
        ([tmp_path / "nope.log"], ["no such file or directory"]),
        ([runs["collective"], "--out", tmp_path / "afile"],
         ["--out", "is a file, not a directory"]),
    ):
        res = _report(*args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distbench: error: "), res.stderr
        assert all(w in lines[0] for w in words), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "empty"]
    assert not list(empty.iterdir())


def test_a_run_reported_from_inside_its_directory_keeps_its_name(runs, tmp_path):
    res = _report(".", "--out", tmp_path / "r", cwd=runs["tp"])  # tp: one plot to draw
    assert res.returncode == 0, res.stderr
    assert f"Runs: `{runs['tp'].name}`" in (tmp_path / "r" / "report.md").read_text()


# ---------------------------------------------------------------------------------------------
# Accept runs written by hand: three nodes, n3 slow. Four checks fail on the first pass (n3's
# busbw and pingpong, the two pairs with n3), two of them fail their retests again; a PASS at
# 20.8 times its fail line sits beside FAILs at about a hundredth of theirs.


def _verdict(check, scope, target, metric, measured, expected, warn_at, reference, ratio,
             verdict, retest=0, note="", wrong=0) -> dict:
    return {"check": check, "scope": scope, "target": target, "metric": metric,
            "measured": measured, "expected": expected, "warn_at": warn_at,
            "reference": reference, "ratio": ratio, "verdict": verdict, "retest": retest,
            "note": note, "wrong": wrong}


LAT, BUS, PING = "node all_reduce latency", "node all_reduce busbw", "node pingpong latency"
PAIR = "pair all_reduce busbw"
SLOW_N3 = [
    _verdict(LAT, "node", "n1", "time_us", 640, 90000, 30000, None, 140.6, "PASS"),
    _verdict(LAT, "node", "n2", "time_us", 700, 90000, 30000, None, 128.6, "PASS"),
    _verdict(LAT, "node", "n3", "time_us", 900, 90000, 30000, None, 100.0, "PASS"),
    # peers at 0.256 GB/s: fail below half of it, warn below three quarters
    _verdict(BUS, "node", "n1", "p50_busbw_gbps", 0.26, 0.128, 0.192, 0.256, 1.016, "PASS"),
    _verdict(BUS, "node", "n2", "p50_busbw_gbps", 0.25, 0.128, 0.192, 0.256, 0.977, "PASS"),
    _verdict(BUS, "node", "n3", "p50_busbw_gbps", 0.003, 0.128, 0.192, 0.256, 0.0117, "FAIL"),
    _verdict(BUS, "node", "n3", "p50_busbw_gbps", 0.0031, 0.128, 0.192, 0.256, 0.0121, "FAIL",
             retest=1),
    # peers at 2000 us: a time twice theirs fails
    _verdict(PING, "node", "n1", "p50_us", 1990, 4000, 2667, 2000, 1.005, "PASS"),
    _verdict(PING, "node", "n2", "p50_us", 2800, 4000, 2667, 2000, 0.714, "WARN"),
    _verdict(PING, "node", "n3", "p50_us", 150000, 4000, 2667, 2000, 0.0133, "FAIL"),
    _verdict(PAIR, "pair", "n1+n2", "p50_busbw_gbps", 0.2, 0.1, 0.15, 0.2, 1.0, "PASS"),
    _verdict(PAIR, "pair", "n1+n3", "p50_busbw_gbps", 0.00234, 0.1, 0.15, 0.2, 0.0117, "FAIL"),
    _verdict(PAIR, "pair", "n2+n3", "p50_busbw_gbps", 0.0024, 0.1, 0.15, 0.2, 0.012, "FAIL"),
    _verdict(PAIR, "pair", "n1+n3", "p50_busbw_gbps", 0.0023, 0.1, 0.15, 0.2, 0.0115, "FAIL",
             retest=1),
    _verdict("cluster all_reduce busbw", "cluster", "cluster", "p50_busbw_gbps", 0.21, None,
             None, None, None, "SKIP", note="one target: no peers to judge it against"),
    _verdict("cluster all_reduce latency", "cluster", "cluster", "time_us", 4327, 90000, 30000,
             None, 20.8, "PASS"),
]
SUMMARY = "4 measurements failed, 1 warned: first node all_reduce busbw on n3"


def _accept_run(path: Path, rows: list[dict], summary: str = SUMMARY) -> Path:
    """accept.csv, accept.json and run.json as `distbench accept` writes them."""
    path.mkdir(parents=True)
    write_csv(path / "accept.csv", ACCEPT.csv, rows)
    outcome = {"verdict": "FAIL", "summary": summary,
               "culprits": ["pair all_reduce busbw: node n3 is in all 2 failing pairs"],
               "notes": []}
    (path / "accept.json").write_text(json.dumps(
        {"schema_version": 1, "exit_code": 4, **outcome,
         "verdicts": [{**r, "retest": bool(r["retest"])} for r in rows]}))
    return write_meta(path, "accept", schema_version=1, status="below_expectation",
                      exit_code=4, world_size=6, nnodes=3, accept=outcome)


def _tally(verdicts: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
    return counts


def _said(line: str) -> dict[str, int]:
    """'- First pass: FAIL 4, WARN 1 (...)' -> {'FAIL': 4, 'WARN': 1}."""
    counts = line.split(": ", 1)[1].split(" (")[0]
    return {v: int(n) for v, n in (c.split() for c in counts.split(", "))}


def test_the_accept_section_counts_the_first_pass_as_accept_json_does(tmp_path):
    run = _accept_run(tmp_path / "run", SLOW_N3)
    lines = report.markdown([reader.load(run)], KINDS.values(), [])
    verdicts = json.loads((run / "accept.json").read_text())["verdicts"]
    (first,) = [line for line in lines if line.startswith("- First pass: ")]
    (again,) = [line for line in lines if line.startswith("- Retests: ")]
    assert _said(first) == _tally([v for v in verdicts if not v["retest"]])
    assert _said(again) == _tally([v for v in verdicts if v["retest"]])
    assert _said(first)["FAIL"] == 4 and _said(again) == {"FAIL": 2}  # as the summary says
    assert f"Verdict **FAIL**: {SUMMARY}." in lines
    assert "- pair all_reduce busbw: node n3 is in all 2 failing pairs" in lines


def test_the_accept_table_gives_each_figure_in_its_metrics_unit(tmp_path):
    run = reader.load(_accept_run(tmp_path / "run", SLOW_N3))
    lines = report.markdown([run], KINDS.values(), [])
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0] == ("| check | target | pass | metric | measured | fail line | warn line "
                       "| ratio | verdict |")
    assert ("| node pingpong latency | n3 | first | p50_us | 150000 us | 4000 us | 2667 us "
            "| 0.0133 | FAIL |") in rows
    assert ("| pair all_reduce busbw | n1+n3 | retest | p50_busbw_gbps | 0.0023 GB/s "
            "| 0.1 GB/s | 0.15 GB/s | 0.0115 | FAIL |") in rows
    assert not any("GB/s" in r for r in rows if "_us |" in r)
    assert not any(" us " in r for r in rows if "_gbps |" in r)


def _pixels(path: Path, colour: str) -> int:
    image = matplotlib.image.imread(path)[..., :3]
    return int((np.abs(image - np.array(to_rgba(colour)[:3])).max(axis=2) < 0.05).sum())


def test_the_verdict_plot_shows_failures_beside_a_pass_twenty_times_its_line(tmp_path):
    run = reader.load(_accept_run(tmp_path / "run", SLOW_N3))
    (png,) = accept_output.draw([run], tmp_path)
    _sensible(png)
    fails = sum(r["verdict"] == "FAIL" for r in SLOW_N3)
    # each FAIL is a bar of about two decades on a five-decade axis: thousands of red pixels
    # (on a linear axis to 140 a bar at 0.0117 is under a pixel wide)
    assert _pixels(png, accept_output.VERDICT_COLOURS["FAIL"]) > fails * 1500
    assert _pixels(png, accept_output.VERDICT_COLOURS["PASS"]) > 1500


def test_the_verdict_plot_draws_measured_against_expected_not_the_ratio(tmp_path):
    fig = accept_output.accept_figure([reader.load(_accept_run(tmp_path / "run", SLOW_N3))])
    (ax,) = fig.axes
    bars = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    for i, row in enumerate(SLOW_N3):
        if row["expected"] is None:
            assert f"verdict-{i}" not in bars
            continue
        time = row["metric"].endswith("_us")
        margin = (row["expected"] / row["measured"] if time
                  else row["measured"] / row["expected"])
        bar = bars[f"verdict-{i}"]
        ends = sorted((bar.get_x(), bar.get_x() + bar.get_width()))
        assert ends == pytest.approx(sorted((margin, 1.0)), rel=1e-9), row
        assert (margin < 1) == (row["verdict"] == "FAIL"), row  # left of the fail line fails
        assert bar.get_facecolor() == to_rgba(accept_output.VERDICT_COLOURS[row["verdict"]]), row
    assert ax.get_xscale() == "log"
    assert "measured / expected" in ax.get_xlabel()


def test_every_verdict_has_its_colour_and_nothing_is_cut_off(tmp_path):
    rows = [*SLOW_N3,
            _verdict("node all_gather busbw", "node", "n3", "p50_busbw_gbps", 0.05, 0.06, 0.09,
                     0.12, 0.42, "INCONCLUSIVE", note="too noisy to tell"),
            _verdict("node all_gather busbw", "node", "n2", "p50_busbw_gbps", 0.1, None, None,
                     None, None, "FAIL", wrong=12, note="12 wrong elements")]
    run = reader.load(_accept_run(tmp_path / "a-rather-long-run-directory-name" / "run", rows))
    fig = accept_output.accept_figure([run, run])
    (ax,) = fig.axes
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(),
                                              ax.get_legend().legend_handles, strict=True)}
    for verdict in ("PASS", "WARN", "FAIL", "SKIP", "INCONCLUSIVE"):
        assert legend[verdict].get_facecolor() == to_rgba(accept_output.VERDICT_COLOURS[verdict])
    assert len(set(accept_output.VERDICT_COLOURS.values())) == len(accept_output.VERDICT_COLOURS)
    notes = [t.get_text() for t in ax.texts]
    assert "FAIL: 12 wrong elements" in notes
    assert "INCONCLUSIVE: 0.05 GB/s, fail line 0.06" in notes
    assert "SKIP: one target: no peers to judge it against" in notes
    plt = plots.plt
    plt.close(fig)
    (png,) = accept_output.draw([run, run], tmp_path)
    image = matplotlib.image.imread(png)[..., :3]
    edge = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
    assert (edge > 0.95).all(), "something drawn runs off the image's edge"


def test_an_nccl_tests_log_shows_its_world_or_says_unknown(tmp_path):
    text = (NCCL_TESTS / "tag_output.log").read_text()
    bare = tmp_path / "all_gather_perf.log"  # the same log with its device list cut out
    bare.write_text("\n".join(line for line in text.splitlines() if "Rank " not in line))
    known, unknown = reader.load(NCCL_TESTS / "tag_output.log"), reader.load(bare)
    assert (reader.world_size(known), reader.nnodes(known)) == ("8", "2")
    assert (reader.world_size(unknown), reader.nnodes(unknown)) == ("unknown", "unknown")
    lines = report.markdown([known, unknown], KINDS.values(), [])
    assert f"nccl-tests output read from `{known.path}`: 8 ranks on 2 node(s)." in lines
    assert f"nccl-tests output read from `{bare}`: ranks unknown, nodes unknown." in lines
    assert not any("None" in line for line in lines)


def test_a_log_of_tests_at_several_world_sizes_names_each(tmp_path):
    both = tmp_path / "sweep.log"  # 8 ranks on one node, then 4
    both.write_text((NCCL_TESTS / "bare_table.log").read_text()
                    + (NCCL_TESTS / "reduce_scatter_per_iter.log").read_text())
    run = reader.load(both)
    assert (reader.world_size(run), reader.nnodes(run)) == ("4, 8", "1")
    json_run = reader.load(NCCL_TESTS / "all_reduce.json")
    assert (reader.world_size(json_run), reader.nnodes(json_run)) == ("16", "2")


def test_runs_of_one_name_are_each_named_by_their_parent(tmp_path):
    paths = [_accept_run(tmp_path / parent / "run", SLOW_N3) for parent in ("a", "b")]
    assert [r.name for r in reader.load_all(paths)] == ["a/run", "b/run"]
