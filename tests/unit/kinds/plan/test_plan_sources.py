"""`plan --from` on what operators already have: nccl-tests logs, one or a folder of them
(issue 31). Their header gives the ranks, the hostnames the nodes; the fits are keyed by group
size and ranks per node like a distbench collective run's."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from paths import FIXTURES
from plan_helpers import plan as _plan

from distbench.core.options import OptionError
from distbench.kinds.plan import sources
from distbench.results import nccltests

LOGS = FIXTURES / "nccl-tests"
ONE_NODE = LOGS / "dgx_h100_8gpu.log"  # 8 H100s on one host: all_reduce, all_gather, ...
TWO_NODES = LOGS / "dgx_h100_2nodes.log"  # 16 H100s on two hosts


def largest(path: Path, op: str) -> dict:
    """The log's out-of-place row of `op` at its largest size."""
    rows = [r for r in nccltests.read(path) if r["op"] == op and r["in_place"] == 0]
    return max(rows, key=lambda r: r["size_bytes"])


def smallest(path: Path, op: str) -> dict:
    rows = [r for r in nccltests.read(path) if r["op"] == op and r["in_place"] == 0]
    return min(rows, key=lambda r: r["size_bytes"])


def test_an_nccl_tests_log_gives_a_fit_per_op_keyed_by_its_ranks_and_nodes():
    got = sources.read([ONE_NODE])
    fits = {(f.op, f.ranks, f.span, f.per_node): f for f in got.fits}
    assert set(fits) == {("all_reduce", 8, "node", None), ("all_gather", 8, "node", None),
                         ("reduce_scatter", 8, "node", None), ("sendrecv", 2, "node", None)}
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        big, small = largest(ONE_NODE, op), smallest(ONE_NODE, op)
        # at 4 GiB the latency is nothing: the log's algbw is the fit's beta; at 1 KiB the
        # bandwidth term is nothing: its time is the fit's alpha
        assert fits[op, 8, "node", None].beta_gbps == pytest.approx(big["algbw_gbps"], rel=0.05)
        assert fits[op, 8, "node", None].alpha_us == pytest.approx(small["time_us"], rel=0.1)
    assert (got.gpus_per_node, got.device) == (8, "NVIDIA H100 80GB HBM3")
    assert any("nccl-tests" in s for s in got.sources)


def test_a_log_across_two_nodes_is_a_fit_of_8_ranks_per_node(tmp_path):
    got = sources.read([TWO_NODES])
    (fit,) = [f for f in got.fits if f.op == "all_reduce"]
    assert (fit.ranks, fit.span, fit.per_node) == (16, "nodes", 8)
    assert fit.beta_gbps == pytest.approx(largest(TWO_NODES, "all_reduce")["algbw_gbps"],
                                          rel=0.05)


def test_a_folder_of_logs_is_read_whole_and_what_is_no_log_passed_over(tmp_path):
    folder = tmp_path / "acceptance"
    folder.mkdir()
    shutil.copy(ONE_NODE, folder)
    shutil.copy(TWO_NODES, folder)
    (folder / "README").write_text("cluster acceptance, week 12\n")
    got = sources.read([folder])
    assert {(f.op, f.span) for f in got.fits} == {
        (op, span) for op in ("all_reduce", "all_gather", "reduce_scatter")
        for span in ("node", "nodes")} | {("sendrecv", "node")}
    assert any("1 files that are no nccl-tests log passed over (README)" in n
               for n in got.notes)


@pytest.mark.parametrize("make", ["text", "empty folder"])
def test_what_is_no_log_nor_run_is_refused(tmp_path, make):
    if make == "text":
        path = tmp_path / "notes.txt"
        path.write_text("nothing here\n")
    else:
        path = tmp_path / "folder"
        path.mkdir()
    with pytest.raises(OptionError, match="nccl-tests"):
        sources.read([path])


def test_a_64_gpu_plan_from_an_8_gpu_log_in_seconds_says_where_each_figure_came_from(
        tmp_path):
    start = time.monotonic()
    got = _plan(tmp_path, "--from", str(ONE_NODE), "--gpus", "64", "--gpus-per-node", "8",
                "--gpu", "h100", "--model", "7b", "--dtype", "bfloat16")
    secs = time.monotonic() - start
    assert got.returncode == 0, got.stderr
    assert secs < 10
    (run_dir,) = (tmp_path / "out").iterdir()
    text = (run_dir / "plan.md").read_text()
    assert f"{ONE_NODE} (nccl-tests): 3 alpha-beta fits" in text
    assert "NVIDIA H100 80GB HBM3" in text
    assert "h100's datasheet peak (989 TFLOPS bfloat16)" in text
    # the log is one node: groups across nodes are priced from it, said in plan.md and aloud
    assert "all_reduce across nodes: no fit of a group placed so" in text
    assert "warning: all_reduce across nodes" in got.stderr


def test_a_log_and_a_two_node_log_price_a_tp_8_dp_group_at_one_nic(tmp_path):
    got = sources.read([ONE_NODE, TWO_NODES])
    from distbench.planner.inputs import Span

    whole = got.comm_us("all_reduce", 16, Span(True, 8), 2**30)
    one_nic = got.comm_us("all_reduce", 16, Span(True, 1), 2**30)
    fit = next(f for f in got.fits if f.op == "all_reduce" and f.crosses)
    assert whole == pytest.approx(fit.time_us(2**30))
    assert one_nic == pytest.approx(fit.alpha_us + 2**30 / (fit.beta_gbps / 8 * 1e3))


def test_a_one_node_log_and_a_declared_fabric_price_the_groups_across_nodes(tmp_path):
    got = _plan(tmp_path, "--from", str(ONE_NODE), "--fabric", "dgx-h100", "--gpus", "64",
                "--model", "7b", "--dtype", "bfloat16")
    assert got.returncode == 0, got.stderr
    assert "warning" not in got.stderr  # measured on H100s, planned for the fabric's H100s
    (run_dir,) = (tmp_path / "out").iterdir()
    text = (run_dir / "plan.md").read_text()
    assert "--fabric dgx-h100: 370 GB/s bus bandwidth inside a node" in text
    assert "no fit of a group placed so" not in text


def test_the_logs_gpu_gives_compute_and_memory_when_no_gpu_is_named(tmp_path):
    got = _plan(tmp_path, "--from", str(ONE_NODE), "--gpus", "16", "--model", "1b")
    assert got.returncode == 0, got.stderr
    assert ("8 per node (the --from runs'), 74.5 GiB per GPU (the --from runs' h100, its "
            "datasheet)") in got.stdout
    (run_dir,) = (tmp_path / "out").iterdir()
    assert "h100's datasheet peak" in (run_dir / "plan.md").read_text()
