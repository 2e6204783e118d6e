"""Test-only faults: read once per run, applied at the engine's one hook point, and absent from
timed code unless asked for. The slow-rank fault slows ranks in both directions, as a bad NIC or
cable does (two ranks of 4 here, one of 3 in test_p2p_multiproc.py); fake nodes group a
launcher's ranks into nodes. The tests that start processes: test_faults_multiproc.py."""

from __future__ import annotations

import pytest
import torch

from distbench.ops.case import Case, idle
from distbench.run.faults import Faults, fake_node


def _case(sends=True, receives=True, output=None, calls=None) -> Case:
    calls = [] if calls is None else calls
    return Case(run=lambda: calls.append("run"), prepare=lambda: None,
                check=lambda: int(output.sum()) if output is not None else 0, output=output,
                sends=sends, receives=receives)


def test_no_fault_leaves_the_case_untouched():
    faults = Faults.from_env(1, {})
    assert not faults.any
    case = _case()
    assert faults.apply(case, 4096) is case  # the timed loop calls the op itself


def test_env_is_parsed_for_this_rank_only():
    env = {"DISTBENCH_TEST_SLOW_RANK": "2:0.5", "DISTBENCH_TEST_STALL": "1:64",
           "DISTBENCH_TEST_CORRUPT_RANK": "2"}
    assert Faults.from_env(2, env) == Faults(corrupt=True, delay_s=0.5, delay_on_receive=True)
    assert Faults.from_env(1, env) == Faults(stall_at=64)
    assert Faults.from_env(0, env) == Faults()
    assert Faults.from_env(2, {"DISTBENCH_TEST_SLOW_SEND": "2:0.1"}) == Faults(delay_s=0.1)


def test_several_ranks_take_one_fault():
    """Every rank of a node with a bad NIC is slow: "R,R,...:X" names them all, and the single
    form still names one."""
    env = {"DISTBENCH_TEST_SLOW_RANK": "1,3:0.1", "DISTBENCH_TEST_DIE": "0,2:4096"}
    slow = Faults(delay_s=0.1, delay_on_receive=True)
    assert [Faults.from_env(r, env) for r in range(4)] == [
        Faults(die_at=4096), slow, Faults(die_at=4096), slow]
    assert Faults.from_env(3, {"DISTBENCH_TEST_SLOW_RANK": "3:0.1"}) == slow
    assert Faults.from_env(13, {"DISTBENCH_TEST_SLOW_RANK": "1,3:0.1"}) == Faults()


def test_fake_nodes_group_a_launchers_local_ranks():
    groups = [fake_node(r, {"DISTBENCH_TEST_NODE_SIZE": "2"}) for r in range(6)]
    assert groups[0] == groups[1] != groups[2] == groups[3] != groups[4] == groups[5]
    assert len(set(groups)) == 3
    assert {fake_node(r, {}) for r in range(4)} == {""}  # without the hook: no change


@pytest.mark.parametrize("sends,receives", [(True, False), (False, True), (True, True)])
def test_slow_rank_delays_sends_and_receives_slow_send_only_sends(sends, receives):
    both = Faults(delay_s=0.001, delay_on_receive=True)
    send_only = Faults(delay_s=0.001)
    case = _case(sends=sends, receives=receives)
    assert both.apply(case, 8) is not case
    assert (send_only.apply(case, 8) is not case) == sends
    calls: list[str] = []
    both.apply(_case(sends, receives, calls=calls), 8).run()
    assert calls == ["run"]
    sits_out = idle()  # neither sends nor receives: nothing to slow
    assert both.apply(sits_out, 8) is sits_out


def test_corrupt_flips_what_the_check_reads():
    out = torch.zeros(4)
    case = Faults(corrupt=True).apply(_case(output=out), 8)
    assert case.check() == 1 and out[0] == 1
    t = torch.zeros(3)
    Faults().corrupt_tensor(t)
    assert t.sum() == 0
    Faults(corrupt=True).corrupt_tensor(t)
    assert t.tolist() == [1, 0, 0]
