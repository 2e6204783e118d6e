"""Test-only faults on real runs: fake nodes are nodes to the run, and a rank slowed both ways
slows every link it is on. The faults read and applied: test_faults.py."""

from __future__ import annotations

import pytest
from helpers import distbench


@pytest.fixture(scope="module")
def slow_in_fake_nodes(tmp_path_factory):
    """The p2p matrix on four local workers in fake nodes of 2, ranks 1 and 2 slow both ways
    (20 ms before every op they send or receive in): read by the two tests below. The same
    fault on one rank of 3, judged: test_p2p_multiproc.py."""
    return distbench(tmp_path_factory.mktemp("fake-nodes"), "p2p", "--pattern", "matrix",
                     "--sizes", "16K", "--iters", "3", "--warmup", "1", "--workers", "4",
                     DISTBENCH_TEST_NODE_SIZE="2", DISTBENCH_TEST_SLOW_RANK="1,2:0.02")


@pytest.mark.multiproc
def test_fake_nodes_are_nodes_to_the_run(slow_in_fake_nodes):
    """Four local workers in fake nodes of 2: run.json counts 2 nodes, ranks 0-1 and 2-3, and
    the links between them are inter-node."""
    res = slow_in_fake_nodes
    assert res.code == 0, res.stderr
    meta = res.meta()
    assert meta["nnodes"] == 2
    assert [r["node"] for r in meta["ranks"]] == [0, 0, 1, 1]
    rows = res.rows("p2p_matrix.csv")
    assert {r["nnodes"] for r in rows} == {"2"} and len(rows) == 12 + 6
    for r in rows:
        same = int(r["src_rank"]) // 2 == int(r["dst_rank"]) // 2
        assert r["link"] == ("intra" if same else "inter"), r


@pytest.mark.multiproc
def test_ranks_slow_both_ways_slow_every_link_they_are_on(slow_in_fake_nodes):
    """The slow ranks wait 20 ms before every op they send or receive in: each link one of them
    is on, as sender or receiver, is slower than every link none of them is on."""
    res, n, slow_ranks = slow_in_fake_nodes, 4, {"1", "2"}
    assert res.code == 0, res.stderr
    uni = [r for r in res.rows("p2p_matrix.csv") if r["direction"] == "uni"]
    assert len(uni) == n * (n - 1)
    on = [float(r["gbps"]) for r in uni if {r["src_rank"], r["dst_rank"]} & slow_ranks]
    off = [float(r["gbps"]) for r in uni if not {r["src_rank"], r["dst_rank"]} & slow_ranks]
    assert len(on) == n * (n - 1) - (n - len(slow_ranks)) * (n - len(slow_ranks) - 1) and off
    assert max(on) < min(off)
    as_receiver = [float(r["gbps"]) for r in uni if r["dst_rank"] in slow_ranks]
    assert max(as_receiver) < min(off)
