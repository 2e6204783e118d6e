"""What ranks tell each other through the launcher's store, on a real TCPStore in this process:
the startup verdict (a refusal ends every rank, naming the node), and the roll call after a
failure (live ranks answer from their listener thread even while blocked; the rest are lost, and
on this machine their process says whether they died or were stopped). Fast: threads as ranks.
The tests that start processes: test_peers_multiproc.py."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
from run_helpers import _gone_pid, _peers, _post, _world, own_keys, tcp_server

from distbench.run import peers
from distbench.run.peers import Lost, StartFailure, describe_lost, start_verdict

pytestmark = pytest.mark.clock  # roll calls and startups waited out on real time


@pytest.fixture(scope="module")
def server():
    return tcp_server()


@pytest.fixture
def store(server, monkeypatch):
    return own_keys(server, monkeypatch)

# -- startup --------------------------------------------------------------------------------

def test_start_verdict_names_the_refusing_node_first():
    ok = _post(0)
    assert start_verdict([ok, _post(1)]) is None
    bad = {"rank": 2, "node_name": "gpu7 (node rank 1)", "refused": "--dtype: unknown value"}
    assert start_verdict([ok, _post(1), bad]) == (
        "node gpu7 (node rank 1) refused the options: --dtype: unknown value")
    other = {**bad, "rank": 3, "node_name": "gpu9 (node rank 2)"}
    assert "(and 1 more node)" in start_verdict([ok, bad, other])


def test_start_verdict_names_the_options_that_differ():
    odd = _post(1, options="other", identity={"sizes": [2048]})
    why = start_verdict([_post(0), odd, _post(2)])
    assert why == ("ranks were started with different options (1 of 3 ranks differ from rank "
                   "0; sizes: rank 0 has [1024], rank 1 has [2048])")


def _start_all(master, posts: list[dict | None], timeout_s: float = 5.0) -> list:
    """Every rank whose post is not None agrees to start, each on its own thread."""
    world = len(posts)
    out: list = [None] * world

    def rank(r: int) -> None:
        try:
            out[r] = _peers(master, r, world).agree_to_start(posts[r], timeout_s)
        except StartFailure as e:
            out[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world) if posts[r]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_rank_starts_with_every_post(store, world):
    out = _start_all(store, [_post(r) for r in range(world)])
    for got in out:
        assert [p["rank"] for p in got] == list(range(world))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_one_refusing_rank_ends_every_rank_at_startup(store, world):
    posts = [_post(r) for r in range(world)]
    posts[-1] = {"rank": world - 1, "node_name": "vm (node rank 1)", "refused": "--iters: bad"}
    start = time.monotonic()
    out = _start_all(store, posts)
    assert time.monotonic() - start < 5
    for got in out:
        assert isinstance(got, StartFailure) and got.refused
        assert str(got) == "node vm (node rank 1) refused the options: --iters: bad"


def test_a_rank_that_never_starts_is_named_within_the_timeout(store):
    start = time.monotonic()
    out = _start_all(store, [_post(0), _post(1), None], timeout_s=1.0)
    assert time.monotonic() - start < 5
    for got in out[:2]:
        assert isinstance(got, StartFailure) and not got.refused
        assert str(got) == ("rank 2 did not start within 1 s (did their launcher start "
                            "them?)")


# -- roll call ------------------------------------------------------------------------------


@pytest.mark.parametrize("world,dead", [(2, [1]), (3, [0]), (4, [2, 3])],
                         ids=["2-ranks", "3-ranks-rank0", "4-ranks-half"])
def test_roll_call_names_the_dead_and_only_them(store, world, dead):
    """Live ranks answer from their listener, whatever their main thread does; a dead rank's
    process is gone. Rank 0 may be the dead one, and half the world may be."""
    posts = [_post(r, pid=_gone_pid() if r in dead else None) for r in range(world)]
    ranks = _world(store, posts)
    alive = [p for p in ranks if p.rank not in dead]
    for p in alive[1:]:
        p.phase = "all_reduce 64 KiB float32 (warmup)"
        p.listen()
        assert p.listening.wait(15)
    caller = alive[0]
    caller.phase = "all_reduce 64 KiB float32 (warmup)"
    start = time.monotonic()
    answered, lost = caller.roll_call(grace_s=0.5)  # the dead never answer: all of it waited
    assert time.monotonic() - start < 3
    assert answered == [p.rank for p in alive]
    assert lost == [Lost(r, socket.gethostname(), r, "dead") for r in dead]


def test_roll_call_with_everyone_alive_returns_at_once(store):
    ranks = _world(store, [_post(r) for r in range(3)])
    for p in ranks[1:]:
        p.listen()
        assert p.listening.wait(15)
    start = time.monotonic()
    answered, lost = ranks[0].roll_call(grace_s=5.0)
    assert (answered, lost) == ([0, 1, 2], [])
    assert time.monotonic() - start < 2  # not the grace: everyone answered


def test_an_ended_run_stops_the_listeners_and_refuses_a_late_roll_call(store, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    ranks = _world(store, [_post(0), _post(1)])
    ranks[1].listen()
    assert ranks[1].listening.wait(15)
    ranks[0].end()
    deadline = time.monotonic() + 5
    while ranks[0]._own.add("run/ended", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ranks[0]._own.add("run/ended", 0) == 1  # the listener saw the end and stopped
    # the listeners are gone: a roll call now would name every rank; it says it cannot know
    assert ranks[1].roll_call(grace_s=0.2) is None


def test_ranks_failing_one_after_another_join_one_roll_call(store):
    """Rank 2 fails first (it calls the roll, everyone answers) and leaves, having said its own
    error; rank 0 fails next: rank 2 answered this run's roll call, so it is not lost. And
    each rank is counted once, though its listener and its main thread both answer."""
    posts = [_post(0), _post(1), _post(2, pid=_gone_pid())]  # rank 2's process has ended
    ranks = _world(store, posts)
    for p in ranks[:2]:
        p.listen()
        assert p.listening.wait(15)
    assert ranks[2].roll_call(grace_s=2.0) == ([0, 1, 2], [])
    start = time.monotonic()
    assert ranks[0].roll_call(grace_s=2.0) == ([0, 1, 2], [])
    assert time.monotonic() - start < 1.5  # not the grace: the count was complete
    assert ranks[0]._own.add("run/count", 0) == 3


def test_runs_keep_to_their_own_keys(store):
    """A launcher's store outlives an attempt: a second run's roll call and end are its own."""
    first, second = _world(store, [_post(0), _post(1)]), _world(store, [_post(0), _post(1)])
    for p, nonce in ((first, "a"), (second, "b")):
        for rank in p:
            rank.begin_run(nonce)
    for rank in first:  # every rank listens, as in a run (session.py)
        rank.listen()
        assert rank.listening.wait(15)
    first[0].end()  # the first run ended well: its listeners stop, counted at once
    second[1].listen()
    assert second[1].listening.wait(15)
    assert second[0].roll_call(grace_s=2.0) == ([0, 1], [])  # not "over", and answered


def test_the_machine_key_holds_the_pid_namespace():
    """Containers with host networking share a hostname and boot id, not their processes."""
    assert peers.machine_key().endswith("|" + os.readlink("/proc/self/ns/pid"))


def test_snapshots_go_to_rank_0_alone(store):
    posts = [_post(0), _post(1), _post(2)]
    snaps = [{"host": "a"}, None, {"host": "b"}]
    out: list = [None] * 3

    def rank(r: int) -> None:
        p = _peers(store, r, 3)
        p.agree_to_start(posts[r], 5.0, snaps[r])
        out[r] = p

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert out[0].snapshots() == [{"host": "a"}, {"host": "b"}]
    # what every rank reads of the others says only whether a snapshot was posted
    assert [e["snapshot"] for e in out[1].everyone] == [True, False, True]


def test_run_dir_is_published_for_the_survivors(store, tmp_path):
    ranks = _world(store, [_post(0), _post(1)])
    assert ranks[1].run_dir() is None
    ranks[0].publish_run_dir(str(tmp_path / "run"))
    assert ranks[1].run_dir() == str(tmp_path / "run")


def test_lost_ranks_are_described_as_a_person_reads_them():
    dead, stopped, silent = (Lost(1, "gpu3", 1, "dead"), Lost(2, "gpu3", 2, "stopped"),
                             Lost(9, "gpu4", 1, "silent"))
    step = "all_reduce 16 KiB float32 (warmup)"
    assert dead.describe(step, 9) == (
        "rank 1 (gpu3:1) died (signal 9) during all_reduce 16 KiB float32 (warmup)")
    assert dead.describe(None) == "rank 1 (gpu3:1) died"
    assert stopped.describe(step).startswith("rank 2 (gpu3:2) was suspended (SIGSTOP")
    assert silent.describe(step).startswith("rank 9 (gpu4:1) stopped answering")
    assert describe_lost([dead, silent], step, {1: 9}) == (
        f"{dead.describe(step, 9)}; {silent.describe(step)}")
    many = [Lost(r, "h", r, "dead") for r in range(6)]
    assert describe_lost(many, step).endswith("(+2 more ranks)")
    assert peers.lost_from_json(json.loads(json.dumps(peers.lost_to_json(many)))) == many
