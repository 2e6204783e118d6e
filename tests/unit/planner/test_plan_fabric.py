"""A declared fabric (issue 31): presets with a source for each figure, or explicit figures,
priced as NCCL's ring model, for a cluster that was never measured. The expected figures are
worked by hand from the presets' published numbers."""

from __future__ import annotations

import csv
import math

import helpers
import pytest
from plan_helpers import plan as _plan

from distbench.core.options import OptionError
from distbench.planner import fabrics
from distbench.planner.inputs import CommFit, Inputs, Span

A100 = fabrics.PRESETS["dgx-a100"]
H100 = fabrics.PRESETS["dgx-h100"]


def test_every_preset_figure_has_a_source():
    for fabric in fabrics.PRESETS.values():
        assert set(fabric.sources) == {"gpu", "node_gbps", "nics_per_node", "nic_gbps"}
        assert all(len(text) > 20 for text in fabric.sources.values())


def test_a_dgx_a100_all_reduce_inside_a_node_on_the_ring_model():
    fit = A100.fit("all_reduce", 8, Span())
    assert fit.alpha_us == pytest.approx(8.4 + 14 * 3.4)  # 2 (8 - 1) steps over NVLink
    assert fit.beta_gbps == pytest.approx(235.0 / (2 * 7 / 8))


def test_a_dgx_a100_dp_group_of_one_gpu_per_node_runs_at_one_hdr_nic():
    fit = A100.fit("all_reduce", 16, Span(True, 1))
    # 16 nodes: all 30 ring steps cross the network
    assert fit.alpha_us == pytest.approx(8.4 + 30 * 9.6)
    assert fit.beta_gbps == pytest.approx(24.0 / (2 * 15 / 16))


def test_a_dgx_h100_group_of_whole_nodes_uses_its_8_ndr_nics_under_nvlinks_bound():
    fit = H100.fit("all_gather", 16, Span(True, 8))
    assert fit.alpha_us == pytest.approx(8.4 + 14 * 3.4 + 1 * 9.6)  # 15 steps, 1 across
    assert fit.beta_gbps == pytest.approx(min(370.0, 8 * 46.0) / (15 / 16))
    assert H100.fit("sendrecv", 2, Span(True, 1)).beta_gbps == pytest.approx(46.0)


def test_figures_replace_a_presets_and_lose_its_source():
    fabric = fabrics.parse("--fabric", "dgx-a100,nics_per_node=4")
    assert fabric.nics_per_node == 4 and "nics_per_node" not in fabric.sources
    assert fabric.busbw_gbps("all_reduce", Span(True, 8)) == pytest.approx(4 * 24.0)
    given = fabrics.parse("--fabric", "node_gbps=300,nic_gbps=25,nics_per_node=2")
    assert given.busbw_gbps("all_reduce", Span(True, 8)) == pytest.approx(50.0)
    assert given.gpu is None


@pytest.mark.parametrize("text,match", [
    ("dgx-z9", "no preset 'dgx-z9'"),
    ("dgx-a100,links=4", "'links=4' is no figure"),
    ("dgx-a100,nic_gbps=-1", "nic_gbps must be a number from 0.01 to 1,000 GB/s, got '-1'"),
    ("dgx-a100,nics_per_node=2.5", "nics_per_node must be a whole number from 1 to 1,024, "
     "got '2.5'"),
    ("dgx-a100,nic_gbps=nan", "nic_gbps must be a number from 0.01 to 1,000 GB/s, got 'nan'"),
    ("node_gbps=300", "needs nic_gbps, nics_per_node"),
    ("dgx-a100,gpu=tpu", "no such GPU"),
    # issue 46: every figure bounded as a measured one is (planner/inputs_check.py); 5e-324
    # ranked a NaN step first, 1.7e308 gave inf steps
    ("dgx-a100,node_gbps=5e-324", "node_gbps must be a number from 0.01 to 10,000 GB/s, got "
     "'5e-324'"),
    ("dgx-a100,node_gbps=10001", "node_gbps must be a number from 0.01 to 10,000 GB/s"),
    ("dgx-a100,nic_gbps=inf", "nic_gbps must be a number from 0.01 to 1,000 GB/s"),
    ("dgx-a100,nic_gbps=0.009", "nic_gbps must be a number from 0.01 to 1,000 GB/s"),
    ("dgx-a100,base_us=1.7e308", "base_us must be a number from 0 to 1,000 us, got '1.7e308'"),
    ("dgx-a100,node_hop_us=-0.1", "node_hop_us must be a number from 0 to 1,000 us"),
    ("dgx-a100,net_hop_us=1e400", "net_hop_us must be a number from 0 to 1,000 us"),
    ("dgx-a100,nics_per_node=1025", "nics_per_node must be a whole number from 1 to 1,024"),
    ("dgx-a100,gpus_per_node=0", "gpus_per_node must be a whole number from 1 to 1,024"),
    ("dgx-a100,gpus_per_node=1025", "gpus_per_node must be a whole number from 1 to 1,024"),
    # taken last-wins, where --layout and --model refuse a key given twice
    ("dgx-a100,nic_gbps=10,nic_gbps=20", "nic_gbps is given twice in "
     "'dgx-a100,nic_gbps=10,nic_gbps=20'"),
    ("node_gbps=300,nic_gbps=25,nics_per_node=8,gpu=a100,gpu=h100", "gpu is given twice"),
    # int() and float() take any script's digits: a full-width 8 was 8
    ("dgx-a100,nics_per_node=\uff18", "nics_per_node='\uff18' is not a number: write it in "
     "ASCII digits"),
    ("dgx-a100,nic_gbps=\uff12\uff15", "nic_gbps='\uff12\uff15' is not a number"),
    ("dgx-a100,gpus_per_node=\u0968", "gpus_per_node='\u0968' is not a number"),  # Devanagari 2
])
def test_a_bad_fabric_is_one_line(text, match):
    with pytest.raises(OptionError, match="^--fabric: ") as e:
        fabrics.parse("--fabric", text)
    assert match in str(e.value)
    assert "\n" not in str(e.value)


def test_a_fabric_at_its_bounds_is_taken():
    """The bounds refuse no real fabric: each end is a figure."""
    fabric = fabrics.parse("--fabric", "node_gbps=10000,nic_gbps=0.01,nics_per_node=1024,"
                           "gpus_per_node=1024,base_us=0,node_hop_us=1000,net_hop_us=0")
    assert (fabric.node_gbps, fabric.nic_gbps, fabric.nics_per_node, fabric.gpus_per_node,
            fabric.base_us, fabric.node_hop_us, fabric.net_hop_us) == (
        10_000.0, 0.01, 1024, 1024, 0.0, 1000.0, 0.0)
    assert fabrics.parse("--fabric", "dgx-a100,node_gbps=0.01,nic_gbps=1000").nic_gbps == 1000
    # the GPUs per node a fabric may declare are those --gpus-per-node may
    from distbench.kinds.plan import options as plan

    assert plan.MAX_GPUS_PER_NODE == fabrics.MAX_GPUS_PER_NODE == 1024


def test_measured_fits_win_and_the_fabric_prices_what_they_do_not_cover():
    node = CommFit(op="all_reduce", ranks=8, span="node", alpha_us=10.0, beta_gbps=100.0)
    given = Inputs(fits=[node], fabric=A100)
    assert given.comm_us("all_reduce", 8, Span(), 1e6) == pytest.approx(node.time_us(1e6))
    assert given.comm_us("all_reduce", 16, Span(True, 1), 1e6) == pytest.approx(
        A100.fit("all_reduce", 16, Span(True, 1)).time_us(1e6))
    assert not given.warnings


def test_a_declared_fabric_lets_a_measured_fit_gain_the_nics_it_declares():
    fit = CommFit(op="all_reduce", ranks=4, span="nodes", per_node=2, alpha_us=5.0,
                  beta_gbps=10.0)
    busbw = 10.0 * 2 * 3 / 4
    given = Inputs(fits=[fit], fabric=fabrics.parse("--fabric", "dgx-a100,nics_per_node=8"))
    # 8 ranks per node on 16 ranks: 4x the NICs of the fit's 2 per node, the ring's 15 steps
    assert given.comm_us("all_reduce", 16, Span(True, 8), 1e6) == pytest.approx(
        5.0 * 15 / 3 + 1e6 / (busbw * 4 / (2 * 15 / 16) * 1e3))


def test_plan_from_a_declared_fabric_alone(tmp_path):
    got = _plan(tmp_path, "--fabric", "dgx-a100", "--gpus", "64", "--model", "7b", "--dtype",
                "bfloat16")
    assert got.returncode == 0, got.stderr
    assert "8 per node" in got.stdout and "74.5 GiB per GPU (--fabric dgx-a100's a100" in \
        got.stdout
    (run_dir,) = (tmp_path / "out").iterdir()
    text = (run_dir / "plan.md").read_text()
    for cited in ("RA-09950-001", "nccl-tests#119", "src/graph/tuning.cc",
                  "a100's datasheet peak (312 TFLOPS bfloat16)"):
        assert cited in text
    assert "warning" not in got.stderr


@pytest.mark.parametrize("args,option,needle", [
    (("--fabric", "dgx-a100,nic_gbps=0", "--gpus", "64"), "--fabric", "nic_gbps must be"),
    (("--fabric", "dgx-a100", "--workers", "2"), "--fabric", "drop --workers"),  # not measured
    (("--fabric", "dgx-a100", "--validate", "2"), "--fabric", "drop --workers"),
    (("--fabric", "dgx-a100,node_gbps=5e-324", "--gpus", "64"), "--fabric",
     "node_gbps must be a number from 0.01 to 10,000 GB/s, got '5e-324'"),
    (("--fabric", "dgx-a100,base_us=1.7e308", "--gpus", "64"), "--fabric",
     "base_us must be a number from 0 to 1,000 us, got '1.7e308'"),
    (("--fabric", "dgx-a100,gpus_per_node=2048", "--gpus", "64"), "--fabric",
     "gpus_per_node must be a whole number from 1 to 1,024"),
    (("--fabric", "dgx-a100,nic_gbps=10,nic_gbps=20", "--gpus", "64"), "--fabric",
     "nic_gbps is given twice"),
    (("--fabric", "dgx-a100,nics_per_node=\uff18", "--gpus", "64"), "--fabric",
     "write it in ASCII digits"),
    # no --from: what is missing is the node size, not "the --from runs'" GPUs
    (("--fabric", "nic_gbps=25,node_gbps=300,nics_per_node=8", "--gpus", "64"),
     "--gpus-per-node", "--fabric nic_gbps=25,node_gbps=300,nics_per_node=8 gives no "
     "gpus_per_node=: say how many GPUs a node has, with --gpus-per-node or the fabric's "
     "gpus_per_node="),
])
def test_bad_fabric_input_is_one_line_exit_2_and_no_run_dir(tmp_path, args, option, needle):
    got = _plan(tmp_path, *args)
    line = helpers.assert_one_line_error(got, None, option, ours=True)
    assert needle in line, line
    assert "--from" not in line, line  # there is none
    assert not (tmp_path / "out").exists()


def test_a_fabric_without_gpus_per_node_plans_with_either_one(tmp_path):
    """What the refusal above asks for is what plans: --gpus-per-node, or the figure."""
    figures = "nic_gbps=25,node_gbps=300,nics_per_node=8"
    for i, args in enumerate((("--fabric", figures, "--gpus-per-node", "8"),
                              ("--fabric", f"{figures},gpus_per_node=8"))):
        (tmp_path / str(i)).mkdir()
        got = _plan(tmp_path / str(i), *args, "--gpus", "16", "--gpu", "a100")
        assert got.returncode == 0, got.stderr
        assert "16 GPUs, 8 per node" in got.stdout, got.stdout


def test_a_plan_on_a_fabric_at_its_slowest_bounds_ranks_finite_steps(tmp_path):
    """The bounds keep every step finite: the slowest fabric they allow (10 MB/s links, 1 ms a
    ring step) still gives each layout a finite time, ranked. (A low of 5e-324 GB/s ranked
    NaN steps first.)"""
    slowest = {k: (low if k.endswith("_gbps") else high)
               for k, (low, high, _) in fabrics.BOUNDS.items() if k.endswith(("_gbps", "_us"))}
    assert slowest == {"node_gbps": 0.01, "nic_gbps": 0.01, "base_us": 1000,
                       "node_hop_us": 1000, "net_hop_us": 1000}
    text = ",".join(["dgx-a100", *(f"{k}={v!r}" for k, v in slowest.items())])
    got = _plan(tmp_path, "--fabric", text, "--gpus", "64", "--model", "7b", "--dtype",
                "bfloat16")
    assert got.returncode == 0, got.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    with open(run_dir / "plan.csv", newline="") as fh:
        steps = [float(r["predicted_step_ms"]) for r in csv.DictReader(fh)]
    assert steps and all(math.isfinite(x) and x > 0 for x in steps), steps
