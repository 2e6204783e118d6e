"""Ranks that are gone, for real: a worker SIGKILLed by the fault hook, rank 0 among them, under
distbench's own launcher and under torchrun agents (two agents as two nodes); and a node whose
ranks refuse their options while the other node's ranks would wait for them. What the user
reads, the exit code, run.json and the rows kept."""

from __future__ import annotations

import csv
import json
import re
import socket

import pytest
from helpers import distbench, distbench_lines, torchrun_nodes

pytestmark = pytest.mark.multiproc

HOST = socket.gethostname()
SWEEP = ["collective", "--sizes", "4K,64K,1M", "--iters", "2", "--warmup", "1", "--timeout",
         "60"]


# The step the surviving ranks were in when one died at 64 KiB: that size, or the 4 KiB size's
# statistics, when the dead rank left that all-reduce before the survivors returned from it
DEATHS_STEP = re.compile(r"all_reduce (64 KiB float32|4 KiB float32 .*\(statistics\))")


def _only_row_before_the_death(rows: list[dict]) -> None:
    assert [r["size_bytes"] for r in rows] == ["4096"]
    assert (rows[0]["status"], rows[0]["wrong"]) == ("ok", "0")


# At 3 ranks; at 2, test_a_lost_rank_is_placed_as_every_report_places_it kills rank 1 the same
# way, and test_peers.py's test_lost_ranks_are_described_as_a_person_reads_them builds the line.
@pytest.mark.parametrize("n", [3])
def test_a_killed_worker_is_named_with_its_signal_and_step(tmp_path, n):
    """distbench's own launcher knows the signal; the workers know the step: one line says
    both, and run.json says the same."""
    res = distbench(tmp_path, *SWEEP, "--workers", str(n), DISTBENCH_TEST_DIE="1:65536")
    assert res.code == 3, res.stderr
    said = f"rank 1 ({HOST}:1) died (signal 9) during "
    (line,) = [x for x in distbench_lines(res.stderr) if "error" in x]
    assert line.startswith(f"distbench: error: {said}"), res.stderr
    assert line.endswith(f"; rows measured so far are in {res.run_dir}/"), line
    meta = res.meta()
    assert (meta["status"], meta["exit_code"]) == ("failed", 3)
    assert meta["error"].startswith(said + meta["failed_step"]), meta["error"]
    assert meta["lost_ranks"] == [{"rank": 1, "host": HOST, "local_rank": 1, "state": "dead",
                                   "name": f"{HOST}:1"}]
    assert DEATHS_STEP.match(meta["failed_step"]), meta["failed_step"]
    _only_row_before_the_death(res.rows())
    assert "Traceback" not in res.stderr


def test_a_lost_rank_is_placed_as_every_report_places_it(tmp_path):
    """Where nodes share a host (the fake nodes here, two agents on one host), reports name
    them host#index (accept's targets, the p2p matrix's culprits): so does a lost rank, and
    our launcher still finds the line to add the signal to."""
    res = distbench(tmp_path, *SWEEP, "--workers", "2", DISTBENCH_TEST_DIE="1:65536",
                    DISTBENCH_TEST_NODE_SIZE="1")
    assert res.code == 3, res.stderr
    # the step is the one the others were in, not always 64 KiB: rank 0 may still be in the
    # 4 KiB statistics when the launcher's SIGTERM comes
    said = f"rank 1 ({HOST}#1:1) died (signal 9) during all_reduce "
    meta = res.meta()
    assert meta["error"].startswith(said), meta["error"]
    assert meta["lost_ranks"] == [{"rank": 1, "host": HOST, "local_rank": 1, "state": "dead",
                                   "name": f"{HOST}#1:1"}]
    (line,) = [x for x in distbench_lines(res.stderr) if "error" in x]
    assert line.startswith(f"distbench: error: {said}"), res.stderr


# Two agents as two nodes, 4 ranks. One agent of 3: the same roll call and hand-over, in this
# process at 3 ranks (test_session_outcomes.py's
# test_the_lowest_rank_left_finishes_run_json_when_rank_0_is_gone).
@pytest.mark.parametrize("nnodes,nproc", [(2, 2)], ids=["two-agents"])
def test_rank_0_killed_under_torchrun_the_lowest_rank_left_finishes_run_json(tmp_path, nnodes,
                                                                              nproc):
    procs = torchrun_nodes(tmp_path, nnodes=nnodes, nproc=nproc,
                           per_node_args=[SWEEP] * nnodes, DISTBENCH_TEST_DIE="0:65536")
    assert all(p.returncode != 0 for p in procs)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    where = f"{HOST}#0:0" if nnodes == 2 else f"{HOST}:0"  # two agents: two nodes, one host
    assert (meta["status"], meta["exit_code"]) == ("failed", 3), meta
    assert DEATHS_STEP.match(meta["failed_step"]), meta["failed_step"]
    assert meta["error"].startswith(f"rank 0 ({where}) died during {meta['failed_step']}"), \
        meta["error"]
    assert meta["lost_ranks"] == [{"rank": 0, "host": HOST, "local_rank": 0, "state": "dead",
                                   "name": where}]
    assert meta["end_utc"]
    # rank 1, on rank 0's node, is the lowest rank left: it says so, once
    lines = [x for x in distbench_lines(procs[0].stderr) if "error" in x]
    assert lines == [f"distbench: rank 1: error: {meta['error']}"], procs[0].stderr
    _only_row_before_the_death(list(csv.DictReader(open(run_dir / "collective.csv"))))


def test_a_node_that_refuses_its_options_ends_every_node_at_once(tmp_path):
    """Node 1 was given a misspelt dtype: its ranks refuse before any process group exists.
    Node 0's ranks, already waiting for them, are told, and node 0 ends soon after node 1,
    well inside the timeout, with one line each. (Counted from node 1's end, not from the
    start: how long four interpreters take to load torch is the machine's load, not this.)"""
    args = ["collective", "--sizes", "4K", "--iters", "2", "--timeout", "20"]
    node0, node1 = torchrun_nodes(tmp_path, nnodes=2, nproc=2,
                                  per_node_args=[args, [*args, "--dtype", "flaot32"]])
    late = node0.ended - node1.ended
    assert late < 8, f"node 0 ended {late:.1f} s after node 1, with --timeout 20"
    assert node0.returncode != 0 and node1.returncode != 0
    refusal = "--dtype: unknown value 'flaot32'"
    (own,) = distbench_lines(node1.stderr)  # one line per node, though two ranks refused
    assert own.startswith(f"distbench: error: {refusal}"), node1.stderr
    (told,) = distbench_lines(node0.stderr)
    assert told.startswith(f"distbench: error: node {HOST} (node rank 1) refused the options: "
                           f"{refusal}"), node0.stderr
    for proc in (node0, node1):
        assert not [x for x in proc.stderr.splitlines()
                    if x.strip().startswith("File") and "/distbench/" in x], proc.stderr
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # refused before anything
