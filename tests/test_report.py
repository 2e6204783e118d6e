"""distbench report on real small runs made here (collective, p2p with the matrix, tp, pp,
accept): valid PNGs of a sensible size, report.md naming every op, model.json; several runs and
an nccl-tests log overlaid; --predict; bad input."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env, distbench

from distbench import report, rundirs

pytestmark = pytest.mark.multiproc

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"
OPS = ("all_reduce", "all_gather", "broadcast")


def _report(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distbench", "report", *map(str, args)],
                          capture_output=True, text=True, env=clean_env(), timeout=120,
                          cwd=cwd)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND", f"{path} is cut short"
    return width, height


def _sensible(path: Path) -> None:
    width, height = png_size(path)
    assert 300 <= width <= 4000 and 200 <= height <= 4000, (path.name, width, height)
    assert path.stat().st_size > 5000  # a drawn plot, not an empty canvas


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("runs")
    made = {}
    for name, args in {
        "collective": ("collective", "--op", ",".join(OPS), "--sizes", "256:256K:x4",
                       "--iters", "10", "--warmup", "1"),
        "p2p": ("p2p", "--pattern", "all", "--sizes", "1K,64K", "--iters", "5",
                "--warmup", "1"),
        "tp": ("tp", "--hidden-size", "64", "--ffn-size", "128", "--heads", "4", "--seq-len",
               "8", "--micro-batch-size", "2", "--layers", "2", "--iters", "3", "--warmup", "1"),
        "pp": ("pp", "--micro-batches", "4", "--micro-batch-size", "2", "--seq-len", "8",
               "--hidden-size", "64", "--layers", "4", "--iters", "3", "--warmup", "1"),
        "accept": ("accept",),
    }.items():
        (out / name).mkdir()
        res = distbench(out / name, *args, "--workers", "3" if name == "p2p" else "2")
        assert res.code == 0, res.stderr
        made[name] = res.run_dir
    return made


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


def test_report_of_p2p_tp_and_pp_runs(runs):
    for name, pngs, words in (
        ("p2p", ["p2p_busbw.png", "p2p_latency.png"], ["ring", "pingpong", "Link matrix"]),
        ("tp", ["tp_step.png"], ["| mlp |", "| attention |"]),
        ("pp", ["pp_bubble.png"], ["| naive |", "| gpipe |", "| 1f1b |"]),
        ("accept", ["accept_verdicts.png"], ["### Acceptance", "| node all_reduce busbw |"]),
    ):
        res = _report(runs[name])
        assert res.returncode == 0, res.stderr
        out = runs[name] / "report"
        text = (out / "report.md").read_text()
        for word in words:
            assert word in text, (name, word)
        for png in pngs:
            _sensible(out / png)
    (heatmap,) = (runs["p2p"] / "report").glob("p2p_matrix_*.png")
    _sensible(heatmap)


def test_several_runs_and_an_nccl_tests_log_on_one_plot(runs, tmp_path):
    log = FIXTURES / "bare_table.log"
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
    (f,) = [f for f in report.models(rundirs.load(runs["collective"]))
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
    res = _report(".", "--out", tmp_path / "r", cwd=runs["collective"])
    assert res.returncode == 0, res.stderr
    assert f"Runs: `{runs['collective'].name}`" in (tmp_path / "r" / "report.md").read_text()
