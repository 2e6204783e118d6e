"""How a p2p run ends on the link matrix its ranks measured (kinds/p2p/body._judge): what
run.json's "matrix" records, what rank 0 logs, and whether the run fails, at 2, 3 and 4 ranks.
The ranks are placed as `--workers` places them (one host, one node: host:local_rank, every
link intra-node) and as torchrun agents on one host place them (a node each: host#node:0, every
link inter-node). The figures are those real ranks measure: healthy links within 2x of each
other, a rank slow both ways (a 50 ms wait per op of 16 MiB) at 10-30 % of them.
test_p2p_multiproc.py measures this end to end once (3 ranks, --workers, one rank slow both
ways), and once more without the fault; the rest is here."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable

import pytest
from fake_session import FakeSession, Record, fake_runtime

from distbench.kinds.p2p.body import _judge
from distbench.results.links import Link
from distbench.run.peers import rank_names
from distbench.run.runtime import RunFailure

HOST = socket.gethostname()
SEEDS = range(5)  # each draws its own noise: a verdict must not hang on one draw


def _ranks(n: int, agents: bool) -> list[dict]:
    """run.json's ranks as runtime.start makes them: `--workers` puts every rank on node 0,
    torchrun agents (one rank each) put rank i on node i."""
    return [{"rank": r, "host": HOST, "node": r if agents else 0,
             "local_rank": 0 if agents else r, "gpu_bus_id": None} for r in range(n)]


def _matrix(ranks: list[dict], gbps: Callable[[str, int, int], float]) -> list[Link]:
    """Every ordered pair one way, every pair once both ways, as series.matrix measures and
    names them."""
    names = rank_names(ranks)
    n = len(ranks)
    return [Link(s, d, names[s], names[d],
                 "intra" if ranks[s]["node"] == ranks[d]["node"] else "inter",
                 direction, 16 << 20, gbps(direction, s, d))
            for direction in ("uni", "bi") for s in range(n) for d in range(n)
            if s != d and (direction == "uni" or s < d)]


def _figures(seed: int, slow: set[int] = frozenset(),
             one_way: bool = False) -> Callable[[str, int, int], float]:
    """Healthy links at 10 GB/s times a factor within 2x of the others. Links the slow ranks
    are on at 10-30 % of 10 GB/s (a wait of 50 ms per 16 MiB op, both ways); one_way: those
    they send on, bidirectional links included, at 0.5-2 % (20 ms per 16 KiB send)."""
    rng = random.Random(seed)

    def gbps(direction: str, s: int, d: int) -> float:
        if one_way:
            on, share = s in slow or (direction == "bi" and d in slow), (0.005, 0.02)
        else:
            on, share = bool({s, d} & slow), (0.1, 0.3)
        return 10.0 * (rng.uniform(*share) if on else 2 ** rng.uniform(-0.5, 0.5))
    return gbps


def _judged(n: int, agents: bool, figures, fail_below: float | None = 0.5
            ) -> tuple[FakeSession, RunFailure | None]:
    """_judge on a session of the ranks: what it writes to run.json (s.record.meta) and says on
    rank 0's console (s.console.logged)."""
    ranks = _ranks(n, agents)
    s = FakeSession(fake_runtime(0, n, ranks=ranks), outlier_below=0.8, fail_below=fail_below,
                    record=Record())
    try:
        _judge(s, _matrix(ranks, figures))
    except RunFailure as e:
        return s, e
    return s, None


# -- one host, as --workers places the ranks -----------------------------------------------

@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_rank_slow_both_ways_fails_the_run_and_is_named(n, seed):
    """On 4 of 6 ordered pairs at 3 ranks, 6 of 12 at 4: judged against the links off it."""
    s, failed = _judged(n, False, _figures(seed, slow={2}))
    assert failed is not None and (failed.status, failed.exit_code) == ("slow_links", 4)
    culprit = f"rank 2 ({HOST}:2)"
    judged = s.record.meta["matrix"]
    assert judged["culprits"][0].startswith(culprit + ": ")
    assert f"  likely culprit: {culprit}: " in "\n".join(s.console.logged)
    assert str(failed).endswith(f"; likely culprit {judged['culprits'][0]}")
    for peer in (p for p in range(n) if p != 2):
        for start in (f"{HOST}:2 -> {HOST}:{peer} ", f"{HOST}:{peer} -> {HOST}:2 ",
                      f"{HOST}:{min(peer, 2)} <-> {HOST}:{max(peer, 2)} "):
            assert any(f.startswith(start) for f in judged["failing"]), (start, judged)
    assert len(judged["failing"]) == 3 * (n - 1)  # those, and no healthy link
    assert all("of the healthy intra-node links'" in f for f in judged["failing"])
    for ref in judged["references"]:
        assert ref["basis"].endswith(f" not on {culprit}"), ref
    assert judged["cannot_tell"] == []


@pytest.mark.parametrize("agents", [False, True], ids=["workers", "agents"])
@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_same_ranks_without_a_slow_rank_pass(n, seed, agents):
    """A/A, on one host (every link intra-node) and as agents (a node each, inter-node)."""
    s, failed = _judged(n, agents, _figures(seed))
    assert failed is None
    judged = s.record.meta["matrix"]
    assert judged["failing"] == [] and judged["cannot_tell"] == []
    assert [r["basis"] for r in judged["references"]] == [
        f"median of all {n * (n - 1)} links", f"median of all {n * (n - 1) // 2} links"]
    assert {r["link"] for r in judged["references"]} == {"inter" if agents else "intra"}
    assert judged["links"] == 3 * n * (n - 1) // 2


@pytest.mark.parametrize("seed", SEEDS)
def test_two_ranks_pass_a_rank_slow_both_ways_and_say_they_cannot_tell(seed):
    """Every link is on both ranks: nothing to judge either by, so nothing fails, and run.json
    and the log say which end is slow cannot be told."""
    for slow in (set(), {1}):
        s, failed = _judged(2, False, _figures(seed, slow=slow))
        assert failed is None
        judged = s.record.meta["matrix"]
        assert judged["failing"] == []
        assert all(r["basis"].endswith(" (only 2 ranks: either end may be slow)")
                   for r in judged["references"])
        (line,) = judged["cannot_tell"]
        assert line.startswith(f"the intra-node links join only {HOST}:0 and {HOST}:1: ")
        assert f"matrix: cannot tell: {line}" in s.console.logged


@pytest.mark.parametrize("seed", SEEDS)
def test_two_ranks_fail_a_link_slow_one_way_and_name_no_culprit(seed):
    s, failed = _judged(2, False, _figures(seed, slow={1}, one_way=True))
    assert failed is not None and failed.exit_code == 4
    judged = s.record.meta["matrix"]
    assert [f.split(" (")[0] for f in judged["failing"]] == [f"{HOST}:1 -> {HOST}:0"]
    assert judged["culprits"] == [] and "likely culprit" not in str(failed)


@pytest.mark.parametrize("seed", SEEDS)
def test_without_fail_below_slow_links_are_reported_but_pass(seed):
    """Rank 2 slow sending (test_p2p_multiproc's DISTBENCH_TEST_SLOW_SEND): named, logged, kept
    in run.json; without --fail-below the run still passes."""
    s, failed = _judged(3, False, _figures(seed, slow={2}, one_way=True), fail_below=None)
    assert failed is None
    judged = s.record.meta["matrix"]
    assert judged["culprits"][0].startswith(f"rank 2 ({HOST}:2): ")
    assert judged["failing"] == [] and judged["fail_below"] is None
    # those it sends on, and any healthy link that noise put under --outlier-below's 0.8
    assert {o.split(" (")[0] for o in judged["outliers"]} >= {
        f"{HOST}:2 -> {HOST}:0", f"{HOST}:2 -> {HOST}:1", f"{HOST}:0 <-> {HOST}:2",
        f"{HOST}:1 <-> {HOST}:2"}
    assert f"  likely culprit: {judged['culprits'][0]}" in s.console.logged


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rank_slow_sending_fails_the_run_and_is_named(seed):
    """Rank 2 of 3 waits 20 ms before every send (DISTBENCH_TEST_SLOW_SEND 2:0.02): with
    --fail-below 0.5 the run fails, each link it sends on is an outlier, and it is named first,
    in run.json and in the log."""
    s, failed = _judged(3, False, _figures(seed, slow={2}, one_way=True), fail_below=0.5)
    assert failed is not None and (failed.status, failed.exit_code) == ("slow_links", 4)
    judged = s.record.meta["matrix"]
    for dst in (0, 1):
        assert any(o.startswith(f"{HOST}:2 -> {HOST}:{dst} ") for o in judged["outliers"]), \
            judged["outliers"]
    assert judged["culprits"][0].startswith(f"rank 2 ({HOST}:2)")
    assert f"  likely culprit: {judged['culprits'][0]}" in s.console.logged


# -- torchrun agents on one host, one rank each: nodes named host#node ------------------------

@pytest.mark.parametrize("nnodes", [3, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_slow_node_is_named_by_its_own_name(nnodes, seed):
    s, failed = _judged(nnodes, True, _figures(seed, slow={2}))
    assert failed is not None and (failed.status, failed.exit_code) == ("slow_links", 4)
    judged = s.record.meta["matrix"]
    assert judged["culprits"][0].startswith(f"rank 2 ({HOST}#2:0): ")
    assert any(c.startswith(f"host {HOST}#2: ") for c in judged["culprits"])
    assert len(judged["failing"]) == 3 * (nnodes - 1)
    assert all(f"{HOST}#2:0" in f and "of the healthy inter-node links'" in f
               for f in judged["failing"])
