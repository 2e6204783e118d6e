"""The NCCL-rules checker (nccl_rules.py): it must catch what NCCL would hang on or corrupt, and
stay quiet on what NCCL runs. Synthetic traces for each rule, then a real 2-stage 1F1B pipeline
(4 micro-batches) replayed alone the way steps.comms.replay_p2p did before issue 30 (each op
alone: caught) and the way it does now (batches as the schedule posted them: clean).
The tests that start processes: test_nccl_rules_multiproc.py."""

from __future__ import annotations

import nccl_rules
import pytest
from nccl_traces import allreduce, recv, send, write


def one_f_one_b(batched: bool) -> dict[int, list[dict]]:
    """What the two stages of torch's 1F1B post at 4 micro-batches: stage 0 sends f0, then
    sends f1 with the receive of b0, ...; stage 1 receives f0, then sends b0 with the receive of
    f1, ... (Schedule1F1B's fused sends and receives). Unbatched: the same ops, each alone."""
    b = iter(range(1, 100))

    def pair(x: dict, y: dict) -> list[dict]:
        if not batched:
            return [x, y]
        n = next(b)
        return [{**x, "batch": n}, {**y, "batch": n}]
    stage0 = [send(1)] + pair(send(1), recv(1)) + pair(send(1), recv(1)) \
        + pair(send(1), recv(1)) + [recv(1)]
    stage1 = [recv(0)] + pair(send(0), recv(0)) + pair(send(0), recv(0)) \
        + pair(send(0), recv(0)) + [send(0)]
    return {0: stage0, 1: stage1}


def test_a_pipeline_posted_op_by_op_would_hang(tmp_path):
    found = nccl_rules.check(write(tmp_path, one_f_one_b(batched=False)))
    assert len(found) == 1 and found[0].startswith("would hang on NCCL"), found
    assert "rank 0 waits at post #2" in found[0] and "rank 1 waits at post #2" in found[0]


def test_the_same_pipeline_in_batches_passes(tmp_path):
    assert nccl_rules.check(write(tmp_path, one_f_one_b(batched=True))) == []


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_ring_sends_alone_would_hang_and_batched_passes(tmp_path, world):
    """Every rank sends to the next, then receives from the previous: gloo buffers it; on NCCL
    every rank waits in its send."""
    alone = {r: [send((r + 1) % world), recv((r - 1) % world)] for r in range(world)}
    assert nccl_rules.check(write(tmp_path, alone))[0].startswith("would hang")
    together = {r: [send((r + 1) % world, 1), recv((r - 1) % world, 1)] for r in range(world)}
    assert nccl_rules.check(write(tmp_path, together)) == []


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matching_orders_pass_at_every_size(tmp_path, world):
    """A ping-pong then an all-reduce of everyone: every post has its partner in turn."""
    ranks = {r: [] for r in range(world)}
    for r in range(0, world - 1, 2):
        ranks[r] += [send(r + 1), recv(r + 1)]
        ranks[r + 1] += [recv(r), send(r)]
    for r in ranks:
        ranks[r].append(allreduce())
    assert nccl_rules.check(write(tmp_path, ranks)) == []


def test_collectives_in_another_order_are_named(tmp_path):
    ranks = {0: [allreduce(64), allreduce(128)], 1: [allreduce(128), allreduce(64)]}
    found = nccl_rules.check(write(tmp_path, ranks))
    assert any("collective #1 is all_reduce of 64 B" in f and "128 B" in f for f in found), found


def test_a_collective_one_member_skips_is_named_and_would_hang(tmp_path):
    ranks = {0: [allreduce(), allreduce()], 1: [allreduce()]}
    found = nccl_rules.check(write(tmp_path, ranks))
    assert any("collective #2" in f and "nothing on rank 1" in f for f in found), found
    assert any(f.startswith("would hang") for f in found), found


def test_collectives_on_separate_groups_do_not_pair(tmp_path):
    """Ranks 0 and 1 all-reduce on their pair's group, 2 and 3 on theirs: no rank waits for
    another pair, even when the pairs post different sizes."""
    groups = {"0": [0, 1, 2, 3], "a": [0, 1], "b": [2, 3]}
    ranks = {0: [allreduce(64, "a")], 1: [allreduce(64, "a")], 2: [allreduce(8, "b")],
             3: [allreduce(8, "b")]}
    assert nccl_rules.check(write(tmp_path, ranks, groups=groups)) == []


def test_a_receive_of_another_size_is_named(tmp_path):
    ranks = {0: [send(1, size=64)], 1: [recv(0, size=32)]}
    found = nccl_rules.check(write(tmp_path, ranks))
    assert found == ["rank 0 sends 64 B float32 to rank 1 (#1 on group 0), which receives 32 B "
                     "float32"], found


def test_a_run_cut_short_is_held_to_what_it_shares(tmp_path):
    """A rank killed mid-run posted less: no hang is claimed, but what both posted still has to
    agree."""
    ranks = {0: [allreduce(), allreduce(), send(1)], 1: [allreduce()]}
    assert nccl_rules.check(write(tmp_path, ranks, complete=False)) == []
    ranks = {0: [allreduce(64), allreduce()], 1: [allreduce(32)]}
    assert nccl_rules.check(write(tmp_path, ranks, complete=False)) != []


def test_groups_left_at_the_end_of_a_run_that_ended_well_are_named(tmp_path):
    """NCCL's communicators hold device memory until destroyed: a run that ended as every rank
    agreed must hold none but the default group (a run cut short is not held to it)."""
    ranks = {0: [allreduce()], 1: [allreduce()]}
    write(tmp_path, ranks)
    assert nccl_rules.leaked_groups(tmp_path) == {}
    write(tmp_path, ranks, alive={"7": [0, 1]})
    assert nccl_rules.leaked_groups(tmp_path) == {0: {"7": [0, 1]}, 1: {"7": [0, 1]}}
    write(tmp_path, ranks, complete=False, alive={"7": [0, 1]})
    assert nccl_rules.leaked_groups(tmp_path) == {}
