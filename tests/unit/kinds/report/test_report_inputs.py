"""distbench report on run directories written by hand and on the nccl-tests fixtures, no worker
started: a dp run and a run with no table read like any other; labels of inputs given twice;
a gloo run beside an H100 log on a log axis, legends off the lines; figures in one format; the
link matrix's arrows; cells no measurement can take; --out where nothing can be made; --help.
The tests that start processes: test_report_inputs_multiproc.py."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from helpers import cli
from paths import FIXTURES
from report_helpers import _gloo_collective
from runs import write_csv, write_meta

from distbench.kinds import KINDS
from distbench.kinds.collective import output as collective_output
from distbench.kinds.dp import output as dp_output
from distbench.kinds.dp.output import OUTPUT as DP
from distbench.results import plots, reader, report
from distbench.results.reader import required

NCCL_TESTS = FIXTURES / "nccl-tests"
H100_LOG = NCCL_TESTS / "bare_table.log"  # all_reduce on 8 H100s, up to 312 GB/s


DP_ROWS = [  # ms: step, compute only, comm alone; state bytes measured, formula
    ("ddp", 25, 4.13, 0.89, 1.12, 131088, 131072),
    ("zero1", 25, 5.33, 1.07, 2.00, 98312, 98304),
    ("zero2", None, 19.69, 0.99, 1.65, 98320, 98304),
    ("zero3", None, 19.90, 1.50, 6.42, 65552, 65536),
]


def _dp_run(path: Path) -> Path:
    """dp.csv with every column of the contract, as `distbench dp` writes it."""
    path.mkdir(parents=True)
    rows = [{"mode": mode, "bucket_cap_mb": "" if bucket is None else bucket,
             "dtype": "float32", "world_size": 2, "nnodes": 1, "step_us": step * 1e3,
             "compute_only_us": compute * 1e3, "comm_alone_us": alone * 1e3,
             "exposed_comm_us": (step - compute) * 1e3, "overlap_pct": 0,
             "state_bytes_per_rank": state, "state_bytes_formula": formula,
             "backend": "gloo", "status": "ok"}
            for mode, bucket, step, compute, alone, state, formula in DP_ROWS]
    write_csv(path / "dp.csv", DP.csv, rows)
    write_meta(path, "dp", schema_version=1)
    return path


# ---------------------------------------------------------------------------------------------
# Every command's run


def test_a_dp_run_is_reported_with_its_step_split_and_state(tmp_path):
    run = reader.load(_dp_run(tmp_path / "dp-run"))
    lines, files = report.write([run], tmp_path / "out", KINDS.values())
    assert "### Data parallel" in lines
    assert ("| ddp 25 MiB | float32 | 2 | 4.13 | 0.89 | 3.24 | 1.12 | 0.0 | 128.02 KiB "
            "| 128 KiB |") in lines
    assert any(line.startswith("| zero3 | float32 | 2 | 19.9 | 1.5 | 18.4 | 6.42 |")
               for line in lines)
    assert [f.name for f in files] == ["report.md", "dp_step.png"]
    fig = dp_output.dp_figure([run])
    step, state = fig.axes
    compute, exposed = step.containers  # stacked: compute, then the exposed part on top
    assert [b.get_height() for b in compute] == pytest.approx([r[3] for r in DP_ROWS])
    assert [b.get_height() for b in exposed] == pytest.approx([r[2] - r[3] for r in DP_ROWS])
    assert [b.get_y() for b in exposed] == pytest.approx([r[3] for r in DP_ROWS])
    measured, _ = state.containers
    assert [b.get_height() for b in measured] == pytest.approx([r[5] / 2**20 for r in DP_ROWS])
    assert [t.get_text() for t in step.get_xticklabels()] == [
        "ddp 25 MiB", "zero1 25 MiB", "zero2", "zero3"]
    plots.plt.close(fig)


def test_a_dp_run_in_a_list_does_not_stop_the_report(tmp_path):
    dp = _dp_run(tmp_path / "dp-run")
    coll = _gloo_collective(tmp_path / "coll-run")
    topo = tmp_path / "topo-run"  # topo writes run.json and no CSV
    topo.mkdir()
    write_meta(topo, "topo", schema_version=1)
    res = cli(tmp_path, "report", *map(str, (coll, dp, topo, "--out", tmp_path / "out")))
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Runs: `coll-run`, `dp-run`, `topo-run`" in text
    assert "### Collectives" in text and "### Data parallel" in text
    assert "No result rows: `distbench topo` wrote none." in text
    assert (tmp_path / "out" / "dp_step.png").is_file()


# ---------------------------------------------------------------------------------------------
# Labels


def test_the_same_input_given_twice_is_numbered_each_time(tmp_path):
    a = _gloo_collective(tmp_path / "a" / "run")
    b = _gloo_collective(tmp_path / "b" / "run")
    assert [r.name for r in reader.load_all([a, a])] == ["run (1)", "run (2)"]
    assert [r.name for r in reader.load_all([a, b, a])] == ["a/run (1)", "b/run", "a/run (2)"]
    assert [r.name for r in reader.load_all([H100_LOG, H100_LOG])] == [
        "bare_table.log (1)", "bare_table.log (2)"]


# ---------------------------------------------------------------------------------------------
# A gloo run beside an H100 log


def _segments_in(box, line) -> bool:
    """Whether any stretch of `line`, as drawn (display coordinates), passes through `box`."""
    xy = line.get_transform().transform(line.get_xydata())
    xy = xy[np.isfinite(xy).all(axis=1)]
    for (x0, y0), (x1, y1) in zip(xy, xy[1:], strict=False):
        t = np.linspace(0.0, 1.0, 200)
        xs, ys = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
        if ((xs > box.x0) & (xs < box.x1) & (ys > box.y0) & (ys < box.y1)).any():
            return True
    return any(box.x0 < x < box.x1 and box.y0 < y < box.y1 for x, y in xy)


@pytest.mark.parametrize("y, small_only", [("busbw_gbps", False), ("time_us", True)])
def test_a_gloo_run_beside_an_h100_log_is_drawn_on_a_log_axis(tmp_path, y, small_only):
    runs = reader.load_all([_gloo_collective(tmp_path / "gloo", gbps=0.5), H100_LOG])
    fig = plots.curves_figure(runs, "collective.csv", "op", ("dtype", "redop", "in_place"), y,
                              y, small_only=small_only)
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    gloo = [line for line in ax.get_lines() if line.get_label().startswith("gloo")]
    # on a linear axis to 312 GB/s the gloo line, below 0.5, lies on the bottom pixel row
    low, high = ax.get_ylim()
    (peak,) = [max(line.get_ydata()) for line in gloo]
    assert np.log10(peak / low) > 0.2 * np.log10(high / low)
    plots.plt.close(fig)


def test_no_legend_covers_a_line(tmp_path):
    # six reruns, each a level line across the latency panel: inside the axes, a legend of six
    # entries crosses one wherever it goes
    runs = reader.load_all([_gloo_collective(tmp_path / f"rerun-{i}", alpha_us=100.0 * i,
                                              ops=("all_reduce", "all_gather"))
                             for i in range(1, 7)] + [H100_LOG])
    fig = plots.curves_figure(runs, "collective.csv", "op", ("dtype", "redop", "in_place"),
                              "time_us", "time (us)", small_only=True)
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent(renderer)
        for other in fig.axes:
            for line in other.get_lines():
                assert not _segments_in(box, line), (ax.get_title(), line.get_label())
    plots.plt.close(fig)
    # beside the axes, and still inside the image
    for png in collective_output.draw(runs, tmp_path):
        image = matplotlib.image.imread(png)[..., :3]
        edge = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
        assert (edge > 0.95).all(), f"something drawn runs off the edge of {png.name}"


# ---------------------------------------------------------------------------------------------
# Figures


def test_figures_are_written_out_in_full_never_in_exponent_form():
    assert [report.number(v, 3) for v in (1080.4, 966.2, 12.34, 0.012345, 999.96, 0.0)] == [
        "1080", "966", "12.3", "0.0123", "1000", "0"]
    assert [report.number(v) for v in (150000.0, 2667.0, 0.0023, 4.1296)] == [
        "150000", "2667", "0.0023", "4.13"]


def test_alpha_is_in_one_format_in_the_model_table(tmp_path):
    runs = [reader.load(_gloo_collective(tmp_path / "slow", alpha_us=1080.0)),
            reader.load(_gloo_collective(tmp_path / "fast", alpha_us=966.0))]
    lines = report.markdown(runs, KINDS.values(), [])
    alphas = [line.split(" | ")[4] for line in lines
              if line.startswith("| all_reduce |") and line.count(" | ") == 9]
    assert alphas == ["1080", "966"]
    (line,) = report.predict(report.fits_of(runs[0], KINDS.values()), "all_reduce", 1 << 30)
    assert "alpha 1080 us" in line and "e+" not in line


def test_predict_takes_an_op_report_fits_from_an_nccl_tests_log(tmp_path):
    """sendrecv has no distbench collective, but report fits it from sendrecv_perf's rows: it
    predicts it, and still refuses an op that neither measures nor fits."""
    log = NCCL_TESTS / "dgx_h100_8gpu.log"
    assert "sendrecv" in {f["op"] for f in KINDS["collective"].fits(reader.load(log))}
    res = cli(tmp_path, "report", str(log), "--predict", "sendrecv:1G")
    assert res.code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [x.split(" at ")[0] for x in lines] == [  # the log's out-of-place and in-place fits
        f"{log.name}: sendrecv bfloat16 sum out-of-place", f"{log.name}: sendrecv bfloat16 sum "
        "in-place"]
    assert all(" at 1 GiB: " in x and " us, busbw " in x for x in lines)
    res = cli(tmp_path, "report", str(log), "--predict", "sendrcv:1G")
    assert res.code == 2 and "unknown op 'sendrcv'" in res.stderr and "sendrecv" in res.stderr
    res = cli(tmp_path, "report", str(H100_LOG), "--predict", "sendrecv:1G")
    assert res.code == 2 and "unknown op 'sendrecv'" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The link matrix


def _matrix_run(path: Path) -> Path:
    """4 ranks on one node: the one-way link 0 -> 2 and the two-way 1 <-> 3 at a tenth of the
    rest."""
    path.mkdir(parents=True)
    rows = []
    for direction in ("uni", "bi"):
        for src in range(4):
            for dst in range(4):
                if src == dst or (direction == "bi" and dst < src):
                    continue
                slow = (direction, src, dst) in {("uni", 0, 2), ("bi", 1, 3)}
                gbps = (1.0 if slow else 10.0) * (2 if direction == "bi" else 1)
                rows.append({"direction": direction, "src_rank": src, "dst_rank": dst,
                             "src_host": "h", "dst_host": "h", "src_local_rank": src,
                             "dst_local_rank": dst, "link": "intra", "dtype": "float32",
                             "world_size": 4, "nnodes": 1, "size_bytes": 1 << 20,
                             "time_us": 100.0, "p99_us": 100.0, "gbps": gbps})
    write_csv(path / "p2p_matrix.csv", required()["p2p_matrix.csv"], rows)
    write_meta(path, "p2p", schema_version=1)
    return path


def test_a_two_way_link_is_written_with_a_two_way_arrow(tmp_path):
    lines = report.markdown([reader.load(_matrix_run(tmp_path / "run"))], KINDS.values(), [])
    slow = [line for line in lines if line.startswith("- float32 ")]
    assert slow == ["- float32 bi 1 MiB: rank 1 <-> rank 3",
                    "- float32 uni 1 MiB: rank 0 -> rank 2"]


# ---------------------------------------------------------------------------------------------
# Cells no measurement can take


# ---------------------------------------------------------------------------------------------
# The command line


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_out_where_no_directory_can_be_made_is_bad_input(tmp_path):
    res = cli(tmp_path, "report", str(H100_LOG), "--out", "/proc/distbench-report")
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith("distbench: error: --out: cannot write to '/proc/distbench-report'")
    assert not res.stdout and not list(tmp_path.iterdir())


def test_help_says_where_the_report_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("TERM", "dumb")
    res = cli(tmp_path, "report", "--help")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "the PNGs go ." not in text
    assert "Where report.md, model.json and the PNGs go." in text
    assert "RUN_DIR/report for one run directory, else results/<UTC time>-report" in text
