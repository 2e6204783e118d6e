"""distbench accept for real: on this CPU machine with 2 local workers (cpu-gloo, picked by
itself), and on 3 and 4 nodes (torchrun agents on one host) where one node is slow in both
directions, as a bad NIC or cable makes it, through the fault hook: that node is named and the
run fails; the same runs without the fault pass. Bad input and baselines too."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from helpers import assert_one_line_error, distbench, distbench_lines, torchrun_nodes

from distbench.profiles import load

PROFILES = Path(__file__).parent.parent / "configs" / "profiles"

pytestmark = pytest.mark.multiproc


def _accept(run_dir: Path) -> dict:
    return json.loads((run_dir / "accept.json").read_text())


def test_on_this_machine_it_picks_cpu_gloo_and_passes(tmp_path):
    start = time.monotonic()
    res = distbench(tmp_path, "accept", "--workers", "2")
    took = time.monotonic() - start
    assert res.code == 0, res.stderr
    assert took < 90, f"accept took {took:.0f} s"
    acc = _accept(res.run_dir)
    assert acc["verdict"] == "PASS" and acc["exit_code"] == 0
    assert acc["profile"]["name"] == "cpu-gloo" and "no GPU" in acc["profile"]["why"]
    assert "distbench: profile cpu-gloo: " in res.stderr  # which one, and why
    verdicts = {v["check"]: v["verdict"] for v in acc["verdicts"]}
    assert verdicts["pair all_reduce busbw"] == "SKIP"  # one node: no pair
    # one node: its floors are judged, and the checks against its peers have none to judge by
    peers = {c.name for c in load(PROFILES / "cpu-gloo.toml").checks if c.vs == "peers"}
    assert {k for k, v in verdicts.items() if v == "PASS"} == {
        k for k in verdicts if not k.startswith("pair") and k not in peers}
    assert {verdicts[k] for k in peers} == {"SKIP"}
    assert "skipped)" in acc["summary"]
    md = (res.run_dir / "accept.md").read_text()
    assert md.startswith("# Acceptance: PASS") and "## Topology" in md
    assert res.meta()["status"] == "ok"
    rows = res.rows("accept.csv")
    assert len(rows) == len(acc["verdicts"]) and rows[0]["check"] == acc["verdicts"][0]["check"]


@pytest.mark.parametrize("nnodes", [3, 4])
def test_a_node_slow_both_ways_is_named_and_fails_the_run(tmp_path, nnodes):
    """Node 2 is named, confirmed, in every attempt. A pair without it may fail too when this
    2-core machine starves one of 8 processes for a while (cpu-gloo's lines sit past the
    tenfold spread seen, but not by much): then the run is tried once more, and such a stray
    failure must be short of the fault's pairs, which fall to a hundredth and below."""
    args = ["accept", "--timeout", "60"]
    for attempt in (1, 2):
        out = tmp_path / f"try{attempt}"
        out.mkdir()
        procs = torchrun_nodes(out, nnodes=nnodes, nproc=1, per_node_args=[args] * nnodes,
                               DISTBENCH_TEST_SLOW_RANK="2:0.02")
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        acc = _accept(run_dir)
        assert acc["verdict"] == "FAIL" and acc["exit_code"] == 4, acc["summary"]
        named = [c for c in acc["culprits"] if c.startswith("pair")]
        assert named and all("node " in c and "#2 is in all" in c for c in named), \
            acc["culprits"]
        assert all("(confirmed against a node that passed)" in c for c in named)
        meta = json.loads((run_dir / "run.json").read_text())
        assert (meta["status"], meta["exit_code"]) == ("below_expectation", 4)
        assert procs[0].returncode != 0  # torchrun's own code: any failed worker
        assert any("#2 is in all" in line for line in distbench_lines(procs[0].stderr))
        failed = [v for v in acc["verdicts"] if v["verdict"] == "FAIL"
                  and v["scope"] == "pair" and not v["retest"]]
        stray = [v for v in failed if "#2" not in v["target"]]
        if failed and not stray:  # no pair without node 2 failed
            return
        assert attempt == 1 and all(v["ratio"] >= 0.02 for v in stray), acc["summary"]


@pytest.mark.parametrize("nnodes", [3, 4])
def test_the_same_nodes_without_the_fault_pass(tmp_path, nnodes):
    """Tried once more only when the first try failed short of a fault-sized drop: with 4 agents
    and 4 workers on this 2-core machine, one node can be starved for a whole run (cpu-gloo's
    lines sit past the tenfold spread seen, but not by much). The fault above puts a check at a
    hundredth of its peers and below; such a drop is no noise to try again on."""
    args = ["accept", "--timeout", "60"]
    for attempt in (1, 2):
        out = tmp_path / f"try{attempt}"
        out.mkdir()
        procs = torchrun_nodes(out, nnodes=nnodes, nproc=1, per_node_args=[args] * nnodes)
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        acc = _accept(run_dir)
        if procs[0].returncode == 0:
            assert all(p.returncode == 0 for p in procs), procs[0].stderr
            assert acc["verdict"] == "PASS" and acc["culprits"] == []
            return
        assert attempt == 1, acc["summary"]
        failed = [v for v in acc["verdicts"] if v["verdict"] == "FAIL"]
        assert failed and all(v["ratio"] is not None and v["ratio"] >= 0.02 for v in failed), \
            acc["summary"]


def test_a_baseline_is_the_expectation(tmp_path):
    (tmp_path / "a").mkdir()
    first = distbench(tmp_path / "a", "accept", "--workers", "2")
    assert first.code == 0, first.stderr
    baseline = first.run_dir
    doctored = _accept(baseline)
    for v in doctored["verdicts"]:
        # a baseline a thousand times better than anything here: gloo on two shared cores
        # swings more than tenfold between runs (an op takes 0.1 ms, or 2 to 8 ms)
        if v["measured"] is not None:
            better = v["metric"].endswith("gbps")
            v["measured"] = v["measured"] * 1000 if better else v["measured"] / 1000
    (baseline / "accept.json").write_text(json.dumps(doctored))
    with open(baseline / "accept.csv", newline="") as f:  # what compare reads: the same figures
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["measured"]:
            value = float(row["measured"])
            row["measured"] = value * 1000 if row["metric"].endswith("gbps") else value / 1000
    with open(baseline / "accept.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "b").mkdir()
    res = distbench(tmp_path / "b", "accept", "--workers", "2", "--baseline", str(baseline))
    assert res.code == 4, res.stderr
    acc = _accept(res.run_dir)
    assert acc["verdict"] == "FAIL"
    measured = [v for v in acc["verdicts"] if v["measured"] is not None]
    assert measured and all(v["verdict"] == "FAIL" and "baseline" in v["note"]
                            for v in measured), [(v["check"], v["verdict"]) for v in measured]
    # and the comparison, as distbench compare shows it: every check measured in both first
    # passes is worse (the retests have nothing to match in a baseline that passed)
    first = [v for v in measured if not v["retest"]]
    assert f"BASE {baseline.name} vs NEW {res.run_dir.name}" in res.stdout
    assert f"# {len(first)} rows worse by more than 5% and significant (0 +, {len(first)} -, " \
        "0 ~, " in res.stdout, res.stdout


@pytest.mark.parametrize("args,option,needle", [
    (["--profile", "h100-sxm"], "--profile", "h100-sxm-8"),  # lists what there is
    (["--baseline", "/nonexistent"], "--baseline", "no accept.json"),
])
def test_bad_input_is_one_line_before_any_worker(tmp_path, args, option, needle):
    import subprocess
    import sys

    from helpers import clean_env

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "distbench", "accept", *args, "--out",
                           str(tmp_path / "out")], capture_output=True, text=True,
                          env=clean_env(), cwd=tmp_path, timeout=60)
    line = assert_one_line_error(proc, time.monotonic() - start, option, ours=True)
    assert needle in line
    assert not (tmp_path / "out").exists()
