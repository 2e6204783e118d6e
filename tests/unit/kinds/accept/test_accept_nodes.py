"""distbench accept's own loop (acceptance.run: plan, rounds, groups, rank 0's judgement, the
retests it asks for, accept.csv and accept.json) in this process, on 3, 4 and 5 nodes of one or
two ranks: every rank a thread of a fake process group, every measurement a synthetic one. One
or two nodes are slow both ways, as test_accept.py's fault hook makes them: exactly those nodes
are named, no pair of a slow node and a healthy one passes, and the run fails on every rank. The
same nodes without the fault fail nothing and name no one: nodes of 2 ranks pass, nodes of one
rank have nothing to measure in their node checks, so the run is inconclusive. test_accept.py
runs a few of these layouts for real, with real processes and the real fault."""

from __future__ import annotations

import pytest
from accept_helpers import Accepted, accept_here
from helpers import distbench_lines

from distbench.kinds.accept import itinerary
from distbench.kinds.accept.itinerary import Cluster
from distbench.kinds.accept.profile_files import resolve


def _assert_files_agree(run: Accepted) -> None:
    assert [(r["check"], r["target"], r["verdict"]) for r in run.rows] == [
        (v["check"], v["target"], v["verdict"]) for v in run.acc["verdicts"]]
    assert run.acc["checks_done"] and run.acc["check_in_progress"] is None
    assert len(run.acc["checks_done"]) == run.acc["checks_total"]
    # every rank ends as rank 0 judged
    assert set(run.ends) == {(run.acc["status"], run.acc["exit_code"])}, run.ends


# (nodes, ranks per node, slow nodes): every node count with one and two slow nodes, on nodes of
# one rank (the pair checks alone name them) and of two (the node checks measure too). Three
# nodes of one rank with two slow have no pair without a slow end: nothing can tell which two.
SLOW = [(n, per_node, slow) for n in (3, 4, 5) for per_node in (1, 2)
        for slow in ([2], [1, 2] if n == 3 else [1, 3]) if (n, per_node, len(slow)) != (3, 1, 2)]


@pytest.mark.parametrize("nodes,per_node,slow", SLOW, ids=[
    f"{n}nodes-{p}ranks-slow{'+'.join(map(str, s))}" for n, p, s in SLOW])
def test_slow_nodes_are_named_and_fail_the_run(monkeypatch, capsys, tmp_path, nodes, per_node,
                                               slow):
    """Exactly the slow nodes are named, no pair of a slow node and a healthy one passes, and
    nothing without a slow node fails (the cluster's one target holds them all)."""
    run = accept_here(monkeypatch, capsys, tmp_path, nodes, per_node, slow)
    names = run.acc["nodes"]
    assert len(names) == nodes, names
    slow_names = {names[i] for i in slow}
    assert (run.acc["verdict"], run.acc["exit_code"]) == ("FAIL", 4), run.acc["summary"]
    assert run.acc["status"] == "below_expectation"
    _assert_files_agree(run)
    assert run.named() == slow_names, run.acc["culprits"]
    stray = [v for v in run.acc["verdicts"] if v["verdict"] == "FAIL" and v["scope"] != "cluster"
             and not set(v["target"].split("+")) & slow_names]
    assert stray == [], run.acc["summary"]
    mixed = [v for v in run.acc["verdicts"] if v["scope"] == "pair"
             and len(set(v["target"].split("+")) & slow_names) == 1]
    assert mixed and not [v for v in mixed if v["verdict"] == "PASS"], \
        [(v["target"], v["verdict"], v["note"]) for v in mixed]
    # the loop measured the retests rank 0 asked for, and the fault held in every one
    failed = [v for v in run.acc["verdicts"] if v["verdict"] == "FAIL" and not v["retest"]]
    assert all(v["note"].endswith("it failed its retest too") for v in failed), \
        [(v["check"], v["target"], v["note"]) for v in failed]
    said = " ".join(distbench_lines(run.stderr))
    assert all(f"node {n} " in said for n in slow_names), run.stderr


CLEAN = [(n, per_node) for n in (3, 4, 5) for per_node in (1, 2)]


@pytest.mark.parametrize("nodes,per_node", CLEAN, ids=[f"{n}nodes-{p}ranks" for n, p in CLEAN])
def test_the_same_nodes_without_a_fault_fail_nothing_and_name_no_one(monkeypatch, capsys,
                                                                     tmp_path, nodes, per_node):
    """A/A: no FAIL, no culprit, and every pair passes. Nodes of 2 ranks pass; nodes of one
    rank have nothing to measure in their node checks: inconclusive, never a pass."""
    run = accept_here(monkeypatch, capsys, tmp_path, nodes, per_node, [])
    _assert_files_agree(run)
    assert not [v for v in run.acc["verdicts"] if v["verdict"] == "FAIL"]
    assert run.acc["culprits"] == [], run.acc["summary"]
    pairs = [v for v in run.acc["verdicts"] if v["scope"] == "pair" and not v["retest"]]
    assert len(pairs) == 2 * nodes * (nodes - 1) // 2
    assert {v["verdict"] for v in pairs} == {"PASS"}, run.acc["summary"]
    if per_node == 2:
        assert (run.acc["verdict"], run.acc["exit_code"], run.acc["status"]) == ("PASS", 0, "ok")
        # a PASS says its summary line, once
        assert [x for x in distbench_lines(run.stderr) if run.acc["summary"] in x] == [
            f"distbench: {run.acc['summary']}"], run.stderr
    else:
        assert (run.acc["verdict"], run.acc["exit_code"], run.acc["status"]) == (
            "INCONCLUSIVE", 5, "inconclusive"), run.acc["summary"]
        node_checks = {v["verdict"] for v in run.acc["verdicts"] if v["scope"] == "node"}
        assert node_checks == {"SKIP"}


GROUPS = [(n, slow) for n in (3, 4, 5) for slow in ([], [2])]


@pytest.mark.parametrize("nodes,slow", GROUPS, ids=[
    f"{n}nodes-{'slow' + str(s[0]) if s else 'healthy'}" for n, s in GROUPS])
def test_a_rank_holds_one_rounds_groups_at_most_and_frees_them_all(monkeypatch, capsys,
                                                                   tmp_path, nodes, slow):
    """Every NCCL communicator holds device memory torch's allocator does not see (hundreds of
    MB): a rank that kept each pair round's group would hold N-1 of them at once. Each rank
    holds one group at most (a round's targets share no rank), and the groups alive anywhere
    are one round's, through the rounds, the retests a slow node causes, and from one check to
    the next; and every group it made is destroyed by the end."""
    run = accept_here(monkeypatch, capsys, tmp_path, nodes, 2, slow)
    world = run.world
    assert all(made > 1 for made in world.made), world.made  # node groups and pair rounds
    assert world.most == [1] * world.world, world.most
    assert world.stale == []  # one round's groups alive at a time, over all ranks
    assert world.freed == world.made and world.held == [[]] * world.world, world.held
    # the itinerary a dry run prints counts what the run made, retests aside
    route = itinerary.make(resolve("cpu-gloo"), Cluster.uniform(nodes, 2), quick=False)
    if not slow:
        assert world.calls == [route.creations] * world.world
    else:
        assert min(world.calls) >= route.creations
