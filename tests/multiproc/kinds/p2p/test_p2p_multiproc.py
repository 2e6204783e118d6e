"""p2p on real gloo workers: what the CSVs and run.json say."""

from __future__ import annotations

import csv
import json
import re
import signal
import socket

import pytest
from helpers import distbench, distbench_lines, torchrun_nodes

from distbench.run.peers import rank_names

pytestmark = pytest.mark.multiproc


# At 3 ranks the same run's cells are test_golden.py's recording; the odd rank of a ping-pong
# is never its slowest (test_the_odd_rank_of_...), and the matrix is judged by the slow-rank
# runs below.
@pytest.mark.parametrize("n", [2])
def test_ring_pingpong_and_matrix(tmp_path, n):
    res = distbench(tmp_path, "p2p", "--pattern", "all", "--sizes", "4K,64K", "--iters", "3",
                    "--warmup", "1", "--workers", str(n))
    assert res.code == 0, res.stderr
    rows = res.rows("p2p.csv")
    assert [(r["pattern"], r["size_bytes"]) for r in rows] == [
        ("ring", "4096"), ("ring", "65536"), ("pingpong", "4096"), ("pingpong", "65536")]
    for r in rows:
        assert r["status"] == "ok" and r["wrong"] == "0" and int(r["world_size"]) == n
        t = float(r["time_us"])
        assert float(r["algbw_gbps"]) == pytest.approx(int(r["size_bytes"]) / t / 1e3, rel=1e-4)
        assert float(r["busbw_gbps"]) == pytest.approx(float(r["algbw_gbps"]), rel=1e-4)
        assert float(r["p50_us"]) > 0 and float(r["p99_us"]) >= float(r["p50_us"])
    pingpong = [r for r in rows if r["pattern"] == "pingpong"]
    assert all(int(r["pairs"]) == n // 2 for r in pingpong)
    # the odd rank out of a ping-pong takes no part: it is never the slowest
    assert all(int(r["slowest_rank"]) < 2 * (n // 2) for r in pingpong)

    matrix = res.rows("p2p_matrix.csv")
    uni = [r for r in matrix if r["direction"] == "uni"]
    bi = [r for r in matrix if r["direction"] == "bi"]
    for size in ("4096", "65536"):
        pairs = {(int(r["src_rank"]), int(r["dst_rank"])) for r in uni if r["size_bytes"] == size}
        assert pairs == {(i, j) for i in range(n) for j in range(n) if i != j}
        assert len([r for r in bi if r["size_bytes"] == size]) == n * (n - 1) // 2
    for r in matrix:
        assert r["link"] == "intra" and r["wrong"] == "0"
        moved = int(r["size_bytes"]) * (2 if r["direction"] == "bi" else 1)
        assert float(r["gbps"]) == pytest.approx(moved / float(r["time_us"]) / 1e3, rel=1e-4)
    judged = res.meta()["matrix"]
    assert judged["links"] == len(matrix)
    assert {(r["direction"], r["size_bytes"], r["link"]) for r in judged["references"]} == {
        (d, size, "intra") for d in ("uni", "bi") for size in (4096, 65536)}
    # two ranks: each link is on both, so which end is slow cannot be told, and run.json says so
    assert len(judged["cannot_tell"]) == (1 if n == 2 else 0)
    assert "row = sender" in res.stdout
    for name in ("topo.txt", "topo.json"):
        assert (res.run_dir / name).exists()


# Both ways slow, on most links. On this shared 2-core machine a healthy link's figure (its mean
# time per op) is noisy where ops are short or few: at 16 KiB x 3 iterations healthy links fell
# to 4-15 % of their class median in most clean runs, and up to 4 MiB whole links now and then
# run at one 4 ms scheduler tick per op instead of ~1 ms. Either fails a fault-free run at
# --fail-below 0.5, whatever the rule. At 16 MiB (ops of 5-15 ms) over 0.1 s, 1 clean run in 24
# still had a link at 47 % (a burst of ~0.1 s of lost time); over 0.3 s such a burst costs a
# third. A 50 ms wait per op puts the slow rank's links at 10-30 %; 20 ms left its
# bidirectional links (16 MiB each way at once) at 50-75 %.
SLOW_RANK_RUN = ("p2p", "--pattern", "matrix", "--sizes", "16M", "--min-time", "0.3",
                 "--warmup", "1", "--fail-below", "0.5")
SLOW_RANK_2 = "2:0.05"
# One world size end to end: what only real ranks show (the fault slows every link rank 2 is on,
# a clean run's links stay within the judge's allowance). Torchrun agents on one host are nodes
# named host#node: test_two_nodes_label_links_intra_and_inter. The judgement at 2, 3 and 4
# ranks, with and without the slow rank, a rank slow sending only, for --workers and for
# agents, on the figures such runs measure: test_p2p_judge.py.
WORLD = [3]


@pytest.mark.parametrize("n", WORLD)
def test_a_rank_slow_both_ways_is_named_though_it_is_on_most_links(tmp_path, n):
    """Rank 2 slow in both directions (a bad NIC or cable) is on 4 of 6 ordered pairs at 3 ranks
    and 6 of 12 at 4: it set the class median, so the judge used to find nothing. Judged
    against the links off it, every link on it fails and it is named."""
    res = distbench(tmp_path, *SLOW_RANK_RUN, "--workers", str(n),
                    DISTBENCH_TEST_SLOW_RANK=SLOW_RANK_2)
    assert res.code == 4, res.stderr
    host = socket.gethostname()
    meta = res.meta()
    assert meta["status"] == "slow_links" and meta["exit_code"] == 4
    culprit = f"rank 2 ({host}:2)"
    judged = meta["matrix"]
    assert judged["culprits"][0].startswith(culprit + ": ")
    assert f"likely culprit: {culprit}" in res.stderr
    assert f"; likely culprit {culprit}" in meta["error"]
    for peer in (p for p in range(n) if p != 2):
        for start in (f"{host}:2 -> {host}:{peer} ", f"{host}:{peer} -> {host}:2 ",
                      f"{host}:{min(peer, 2)} <-> {host}:{max(peer, 2)} "):
            assert any(f.startswith(start) for f in judged["failing"]), (start, judged)
    assert all("of the healthy intra-node links'" in f for f in judged["failing"])
    for ref in judged["references"]:
        assert ref["basis"].endswith(f" not on {culprit}"), ref
    # the slow rank's rows are measured and kept, not dropped
    rows = res.rows("p2p_matrix.csv")
    on = [float(r["gbps"]) for r in rows if r["direction"] == "uni" and "2" in
          (r["src_rank"], r["dst_rank"])]
    off = [float(r["gbps"]) for r in rows if r["direction"] == "uni" and "2" not in
           (r["src_rank"], r["dst_rank"])]
    assert len(on) == 2 * (n - 1) and max(on) < min(off)


@pytest.mark.parametrize("n", WORLD)
def test_the_same_run_without_a_slow_rank_passes(tmp_path, n):
    """No rank's links are clearly slower here, so every reference stays at its class median and
    the judge fails only what the median did: a healthy link whose own figure halved in a burst
    of load on this shared machine (3 of 38 clean runs tried, all at 4 ranks, one to three links
    at 47-50 %). Such a run is tried once more; the judge's part is checked in each."""
    for attempt in (1, 2):
        out = tmp_path / f"try{attempt}"
        out.mkdir()
        res = distbench(out, *SLOW_RANK_RUN, "--workers", str(n))
        judged = res.meta()["matrix"]
        assert [r["basis"] for r in judged["references"]] == [
            f"median of all {n * (n - 1)} links", f"median of all {n * (n - 1) // 2} links"]
        assert judged["cannot_tell"] == []
        if res.code == 0:
            assert judged["failing"] == []
            return
        assert res.code == 4 and attempt == 1, res.stderr
        # a burst halves a link's figure; a fault-sized drop would be no noise to try again on
        shares = [int(f.split(" = ")[1].split("%")[0]) for f in judged["failing"]]
        assert min(shares) >= 20, judged["failing"]


def test_two_nodes_label_links_intra_and_inter(tmp_path):
    """The sweeps' one run of two torchrun agents (two ranks each) on 127.0.0.1: the nodes the
    startup tells apart, in run.json and in every link's name. That collective's rows and titles
    carry the same world and nodes: test_cross_rank (in-process, from the runtime)."""
    args = ["p2p", "--pattern", "matrix,pingpong", "--sizes", "4K", "--iters", "2",
            "--warmup", "1"]
    node0, node1 = torchrun_nodes(tmp_path, nnodes=2, nproc=2, per_node_args=[args, args])
    assert node0.returncode == 0, node0.stderr
    assert node1.returncode == 0, node1.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["nnodes"] == 2 and meta["world_size"] == 4
    assert [r["node"] for r in meta["ranks"]] == [0, 0, 1, 1]
    # agents on one host are nodes named host#node, as the judge names them (test_p2p_judge)
    host = socket.gethostname()
    assert rank_names(meta["ranks"]) == [f"{host}#{n}:{k}" for n in (0, 1) for k in (0, 1)]
    node_of = {r["rank"]: r["node"] for r in meta["ranks"]}
    rows = list(csv.DictReader(open(run_dir / "p2p_matrix.csv")))
    assert len([r for r in rows if r["direction"] == "uni"]) == 4 * 3
    for r in rows:
        same = node_of[int(r["src_rank"])] == node_of[int(r["dst_rank"])]
        assert r["link"] == ("intra" if same else "inter"), r
        assert r["nnodes"] == "2" and r["wrong"] == "0"
    assert {r["link"] for r in rows} == {"intra", "inter"}
    # ping-pong pairs i with i + n/2: on two nodes of two, every pair crosses nodes
    (pp,) = list(csv.DictReader(open(run_dir / "p2p.csv")))
    assert pp["pattern"] == "pingpong" and pp["pairs"] == "2" and pp["wrong"] == "0"


def test_topo_under_torchrun_gathers_every_node(tmp_path):
    node0, node1 = torchrun_nodes(tmp_path, nnodes=2, nproc=1,
                                  per_node_args=[["topo"], ["topo"]])
    assert node0.returncode == 0, node0.stderr
    assert node1.returncode == 0, node1.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["command"] == "topo" and meta["status"] == "ok" and meta["nnodes"] == 2
    nodes = json.loads((run_dir / "topo.json").read_text())["nodes"]
    # both agents run on this one machine: one physical snapshot, under its host name
    assert [n["host"] for n in nodes] == [socket.gethostname()]
    assert f"node {socket.gethostname()}" in node0.stdout


def test_workers_under_a_launcher_is_refused_in_one_line(tmp_path):
    """The launcher decided the world (2 ranks): --workers is refused, not ignored, with exit
    code 2 and one line (said once, not once per rank), before the run directory is made.
    The agent is torchrun's: it exits 1 for any failed worker and reports each one's exit
    code (and its own traceback), which is torchrun's and not distbench's."""
    (node,) = torchrun_nodes(tmp_path, nnodes=1, nproc=2, per_node_args=[
        ["p2p", "--pattern", "ring", "--sizes", "4K", "--iters", "2", "--warmup", "1",
         "--workers", "2"]])
    assert node.returncode != 0, node.stderr
    # torchrun's report: the first worker to end is the root cause; the agent then stops the
    # others with SIGTERM if they are not done refusing yet (-15), as it does for any failure
    root = re.search(r"failed \(exitcode: (-?\d+)\)", node.stderr)
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", node.stderr)
    assert root and root.group(1) == "2", node.stderr
    assert "2" in codes and set(codes) <= {"2", str(-signal.SIGTERM)}, node.stderr
    assert distbench_lines(node.stderr) == [
        "distbench: error: --workers: not with a launcher (torchrun, srun): it started 2 ranks "
        "already (example: torchrun --nproc-per-node 2 -m distbench p2p)"], node.stderr
    assert not [x for x in node.stderr.splitlines()
                if x.strip().startswith("File") and "/distbench/" in x], node.stderr
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # refused before anything


def test_the_odd_rank_of_a_pingpong_waits_out_a_loop_longer_than_the_timeout(tmp_path):
    """Three ranks: 0 and 1 ping-pong 14 round trips of 0.3 s (4.2 s), rank 2 sits out, and
    --timeout is 3 s. Every rank gives the loop the time the slowest rank's warmup says it
    takes, and the odd rank waits for it on the host; it used to give the loop its own idea of
    the time (none: it runs nothing) and time out in the statistics."""
    res = distbench(tmp_path, "p2p", "--pattern", "pingpong", "--workers", "3", "--sizes",
                    "4K", "--iters", "14", "--reps", "1", "--warmup", "1", "--timeout", "3",
                    DISTBENCH_TEST_SLOW_SEND="0,1:0.3")
    assert res.code == 0, res.stderr
    meta = res.meta()
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    (row,) = res.rows("p2p.csv")
    assert (row["pattern"], row["status"], row["wrong"], row["iters"]) == (
        "pingpong", "ok", "0", "14")
    assert int(row["slowest_rank"]) in (0, 1)
    assert float(row["time_us"]) >= 0.3e6 / 2  # one way of a 0.3 s round trip
