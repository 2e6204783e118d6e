"""distbench accept's own loop (acceptance.run: plan, rounds, groups, rank 0's judgement, the
retests it asks for, accept.csv and accept.json) in this process, on 3, 4 and 5 nodes of one or
two ranks: every rank a thread of a fake process group, every measurement a synthetic one. One
or two nodes are slow both ways, as test_accept.py's fault hook makes them: exactly those nodes
are named, no pair of a slow node and a healthy one passes, and the run fails on every rank. The
same nodes without the fault fail nothing and name no one: nodes of 2 ranks pass, nodes of one
rank have nothing to measure in their node checks, so the run is inconclusive. test_accept.py
runs a few of these layouts for real, with real processes and the real fault."""

from __future__ import annotations

import csv
import json
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist
from fake_group import ThreadWorld, on_threads
from fake_session import FakeSession, fake_runtime
from helpers import distbench_lines

from distbench.bench import series, timing
from distbench.core import noise
from distbench.core.accounting import buffer_of
from distbench.core.dtypes import element_bytes
from distbench.kinds.accept import acceptance, itinerary
from distbench.kinds.accept import output as accept_output
from distbench.kinds.accept.itinerary import Cluster
from distbench.kinds.accept.profile_files import resolve
from distbench.results import writer
from distbench.run.console import Console
from distbench.run.runtime import RunFailure

# What a healthy op takes on this loaded 2-core machine: 0.3 ms, and anything up to ten times
# that (cpu-gloo's notes: one clean run's pairs spread over a tenfold range).
HEALTHY_US = 300.0
SPREAD = 9.9
# A bad NIC or cable, as test_accept.py's fault hook makes it: every rank of a slow node waits
# this long before every op it sends or receives in. Healthy gloo on this loaded 2-core machine
# takes 0.3 to 3.4 ms for a 1 MiB all_reduce: a slow node's targets fall to a thirtieth of the
# healthy ones at most, past cpu-gloo's fail line (a twentieth), and a hundredth as a rule.
SLOW_S = 0.1
NAMED = re.compile(r"node (\S+) (?:failed|is in all)")


class _World(ThreadWorld):
    """torch.distributed as acceptance.run calls it, among threads. A measurement's figures are
    synthetic: a healthy op anywhere in [1, SPREAD) x HEALTHY_US on a log scale, SLOW_S more
    where the measured ranks hold a slow one; drawn from the seed, the measurement's name and
    how many times this rank measured it, so every rank of a target draws the same, and a
    retest draws afresh."""

    def __init__(self, world: int, slow: set[int], seed: str):
        super().__init__(world)
        self.slow, self.seed = slow, seed
        # the process groups each rank holds (made and not yet destroyed), and how many it
        # made, destroyed and held at once at most; groups alive, anywhere, that the creation
        # call that just ended did not make
        self.lock = threading.Lock()
        self.held: list[list] = [[] for _ in range(world)]
        self.made, self.freed, self.most = [0] * world, [0] * world, [0] * world
        self.stale: list = []
        self.calls = [0] * world  # creation calls joined, member or not

    def new_subgroups_by_enumeration(self, lists, timeout=None):
        mine, subgroups = super().new_subgroups_by_enumeration(lists, timeout)
        rank = self.local.rank
        with self.lock:
            self.calls[rank] += 1
            if mine is not None:
                self.held[rank].append(mine)
                self.made[rank] += 1
                self.most[rank] = max(self.most[rank], len(self.held[rank]))
            # past the call's barrier every rank has released what it would: what is alive
            # now is this round's, or a group kept from another round
            this_round = {("group", tuple(r)) for r in lists}
            self.stale += [g for held in self.held for g in held if g not in this_round]
        return mine, subgroups

    def destroy_process_group(self, group=None) -> None:
        assert group is not None, "the default group destroyed by accept"
        with self.lock:
            self.held[self.local.rank].remove(group)  # ValueError: not held, or freed twice
            self.freed[self.local.rank] += 1

    def start(self, rank: int) -> None:
        super().start(rank)
        self.local.measured = Counter()

    def _stats(self, what: str, group) -> timing.Stats:
        self.local.measured[what] += 1
        rng = random.Random(f"{self.seed}/{what}/{self.local.measured[what]}")
        ranks = range(self.world) if group is None else group[1]
        op_us = HEALTHY_US * SPREAD ** rng.random() + (
            SLOW_S * 1e6 if self.slow & set(ranks) else 0.0)
        reps = tuple(op_us * (1 + 0.3 * rng.random()) for _ in range(noise.REPS))
        return timing.Stats(iters=5, time_us=op_us, rank_min_us=op_us, rank_max_us=op_us,
                            slowest_rank=0, p50_us=op_us, p99_us=2 * op_us, cv_pct=10.0,
                            wrong=0, reps_us=reps)

    def collective_once(self, m, op, dtype: str, size: int, ctx, what: str):
        lay = buffer_of(op.accounting, size, element_bytes(dtype), ctx.n)
        return lay, self._stats(what, ctx.group)

    def p2p_once(self, m, pattern: str, dtype: str, size: int, rank: int, n: int, what: str,
                 group=None):
        return buffer_of(series.SENDRECV, size, element_bytes(dtype), n), self._stats(what, group)


@dataclass
class Accepted:
    """One acceptance, as rank 0's files and every rank's ending say it went."""

    acc: dict  # accept.json
    rows: list[dict]  # accept.csv
    ends: list[tuple[str, int]]  # each rank's (status, exit code): run() returned or raised
    stdout: str  # rank 0's: the rows, and with a baseline the comparison
    stderr: str  # rank 0's
    world: _World  # what the ranks called

    def named(self) -> set[str]:
        return {m for line in self.acc["culprits"] for m in NAMED.findall(line)}


def _session(rank: int, ranks: list[dict], run_dir: Path, baseline: Path | None
             ) -> FakeSession:
    """Rank `rank`'s session; rank 0 owns the files, as a real one does."""
    chief = rank == 0
    return FakeSession(fake_runtime(rank, len(ranks), ranks=ranks), console=Console(chief),
                       run_dir=run_dir if chief else None,
                       record=writer.RunRecord(run_dir, "accept", {}, ["accept"])
                       if chief else None, command="accept",
                       profile="cpu-gloo", quick=False, timeout=60.0, strict=False,
                       baseline=str(baseline) if baseline else None)


def accept_here(monkeypatch, capsys, run_dir: Path, nodes: int, per_node: int, slow: list[int],
                host: str = "h", baseline: Path | None = None) -> Accepted:
    """The acceptance of cpu-gloo (--baseline `baseline`) on `nodes` nodes of `per_node` ranks,
    all on `host` as the tests run them, every rank of the `slow` nodes slowed both ways."""
    world = _World(nodes * per_node, {i * per_node + r for i in slow for r in range(per_node)},
                   seed=f"{nodes}x{per_node}-{slow}")
    world.patch(monkeypatch)
    monkeypatch.setattr(dist, "destroy_process_group", world.destroy_process_group)
    monkeypatch.setattr(series, "collective_once", world.collective_once)
    monkeypatch.setattr(series, "p2p_once", world.p2p_once)
    ranks = [{"rank": r, "node": r // per_node, "local_rank": r % per_node, "host": host,
              "device": "cpu"} for r in range(nodes * per_node)]
    capsys.readouterr()

    def rank(r: int) -> tuple[str, int]:
        world.start(r)
        s = _session(r, ranks, run_dir, baseline)
        try:
            return "ok", acceptance.run(s, accept_output.OUTPUT)
        except RunFailure as e:
            return e.status, e.exit_code
        finally:
            s.close_sinks()  # as the session closes them, however the run ends

    ends = on_threads(world.world, rank, world.barrier)
    with open(run_dir / "accept.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    said = capsys.readouterr()
    return Accepted(json.loads((run_dir / "accept.json").read_text()), rows, ends, said.out,
                    said.err, world)


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
