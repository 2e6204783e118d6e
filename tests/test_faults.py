"""Test-only faults: read once per run, applied at the engine's one hook point, and absent from
timed code unless asked for. The slow-rank fault slows a rank in both directions, as a bad NIC or
cable does, at several world sizes."""

from __future__ import annotations

import pytest
import torch
from helpers import distbench

from distbench.faults import Faults
from distbench.ops.case import Case, idle


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


@pytest.mark.multiproc
@pytest.mark.parametrize("n", [3, 4])
def test_a_rank_slow_both_ways_slows_every_link_it_is_on(tmp_path, n):
    """Rank 2 waits 20 ms before every op it sends or receives in: each link it is on, as sender
    or receiver, is slower than every link it is not on."""
    res = distbench(tmp_path, "p2p", "--pattern", "matrix", "--sizes", "16K", "--iters", "3",
                    "--warmup", "1", "--workers", str(n), DISTBENCH_TEST_SLOW_RANK="2:0.02")
    assert res.code == 0, res.stderr
    uni = [r for r in res.rows("p2p_matrix.csv") if r["direction"] == "uni"]
    assert len(uni) == n * (n - 1)
    on = [float(r["gbps"]) for r in uni if "2" in (r["src_rank"], r["dst_rank"])]
    off = [float(r["gbps"]) for r in uni if "2" not in (r["src_rank"], r["dst_rank"])]
    assert len(on) == 2 * (n - 1) and off
    assert max(on) < min(off)
    as_receiver = [float(r["gbps"]) for r in uni if r["dst_rank"] == "2"]
    assert max(as_receiver) < min(off)
