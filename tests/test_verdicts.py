"""Judging acceptance results without a run: floors, healthy peers, baselines, the node a pair
check's failures point at (at 3 and 4 nodes, where the bad node is not a minority of the
pairs, and at 2, where no pair can tell), retests, and the run's outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from distbench import healthy
from distbench.profiles import load
from distbench.verdicts import Result, judge

PROFILE = """
name = "t"
description = "test"
[settings]
iters = 3
warmup = 1
baseline_tolerance = 0.05
[[check]]
name = "pair bw"
scope = "pair"
command = "collective"
op = "all_reduce"
size = "1M"
metric = "busbw_gbps"
vs = "peers"
fail = 0.5
warn = 0.8
[[check]]
name = "node lat"
scope = "node"
command = "p2p"
pattern = "pingpong"
size = "8"
metric = "time_us"
vs = "absolute"
# a floor for the test
fail = 100.0
# a warning line for the test
warn = 50.0
"""


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(PROFILE)
    return load(path)


def _pairs(profile, n: int, slow: int | None, healthy_bw: float = 10.0, factor: float = 0.05,
           noise=(1.0, 0.7, 1.3, 0.9, 1.1, 0.8)) -> list[Result]:
    """Every pair of n nodes; a node slow both ways drags every pair it is in."""
    check = profile.checks[0]
    out = []
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    for k, (a, b) in enumerate(pairs):
        bw = healthy_bw * noise[k % len(noise)] * (factor if slow in (a, b) else 1.0)
        out.append(Result(check, f"n{a}+n{b}", (a, b), 2, busbw_gbps=bw, wrong=0))
    return out


@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_node_slow_both_ways_is_named_though_it_sets_the_median(profile, n):
    """At 3 nodes the bad node is in 2 of 3 pairs, at 4 in half: the median is its own."""
    names = [f"n{i}" for i in range(n)]
    judged = judge(_pairs(profile, n, slow=2), profile, names)
    bad = {v.result.target for v in judged.verdicts if v.verdict == "FAIL"}
    assert bad == {t for t in (f"n{min(a, 2)}+n{max(a, 2)}" for a in range(n) if a != 2)}
    healthy_partner = 0  # the suspect is retested against a node that passed, nothing else
    assert judged.retests() == [("pair bw", [[(healthy_partner, 2)]])]
    assert [c.split(":")[0] for c in judged.culprits] == ["pair bw"]
    assert "node n2 is in all" in judged.culprits[0]
    assert judged.outcome(strict=False)[:2] == ("below_expectation", 4)


@pytest.mark.parametrize("n", [3, 4])
def test_healthy_pairs_with_noise_pass(profile, n):
    judged = judge(_pairs(profile, n, slow=None), profile, [f"n{i}" for i in range(n)])
    assert {v.verdict for v in judged.verdicts} <= {"PASS", "WARN"}
    assert judged.culprits == [] and judged.outcome(strict=False)[1] == 0


def test_two_nodes_cannot_tell_which_end(profile):
    """One pair, slower than the profile allows against itself cannot be; against a baseline
    it can fail, and then nothing can say which node is slow."""
    pair = _pairs(profile, 2, slow=None)
    judged = judge(pair, profile, ["n0", "n1"], baseline={("pair bw", "n0+n1"): 100.0})
    assert [v.verdict for v in judged.verdicts] == ["FAIL"]
    assert judged.culprits == []
    assert "a pair cannot tell which end is slow" in judged.notes[0]


def test_a_retest_confirms_the_suspect(profile):
    names = ["n0", "n1", "n2"]
    first = _pairs(profile, 3, slow=2)
    judged = judge(first, profile, names)
    assert judged.retests() == [("pair bw", [[(0, 2)]])]
    again = Result(profile.checks[0], "n0+n2", (0, 2), 2, busbw_gbps=0.4, wrong=0, retest=True)
    judged = judge([*first, again], profile, names)
    assert "(confirmed against a node that passed)" in judged.culprits[0]
    assert judged.retests() == []  # retested once, not again
    assert {v.verdict for v in judged.verdicts if "n2" in v.result.target} == {"FAIL"}
    clean = Result(profile.checks[0], "n0+n2", (0, 2), 2, busbw_gbps=9.0, wrong=0, retest=True)
    judged = judge([*first, clean], profile, names)
    assert judged.culprits == []  # it looked slow, but its retest passed: noise
    assert "(not confirmed: its retest passed)" in judged.notes[0]
    assert [v.verdict for v in judged.verdicts if not v.result.retest
            and "n2" in v.result.target] == ["WARN", "WARN"]
    assert judged.outcome(strict=False)[1] == 0 and judged.outcome(strict=True)[1] == 4


def test_a_failure_that_passes_its_retest_was_noise(profile):
    """Not a suspect's pattern: one pair among healthy ones fails once. It is measured again
    as it was; passing then, it is a warning that says why, and the run passes."""
    names = [f"n{i}" for i in range(4)]
    first = _pairs(profile, 4, slow=None)
    first[2] = Result(first[2].check, first[2].target, first[2].nodes, 2, busbw_gbps=0.1,
                      wrong=0)
    judged = judge(first, profile, names)
    assert judged.retests() == [("pair bw", [[first[2].nodes]])]
    again = Result(first[2].check, first[2].target, first[2].nodes, 2, busbw_gbps=9.5,
                   wrong=0, retest=True)
    judged = judge([*first, again], profile, names)
    (v,) = [v for v in judged.verdicts if v.result.target == first[2].target and
            not v.result.retest]
    assert v.verdict == "WARN" and "passed its retest: noise" in v.why
    assert judged.outcome(strict=False)[1] == 0
    bad = Result(first[2].check, first[2].target, first[2].nodes, 2, busbw_gbps=0.2, wrong=0,
                 retest=True)
    judged = judge([*first, bad], profile, names)
    assert judged.outcome(strict=False)[1] == 4  # failed twice: it stands


def test_absolute_floors_on_a_time_and_strict(profile):
    check = profile.checks[1]
    results = [Result(check, "n0", (0,), 2, time_us=20.0, wrong=0),
               Result(check, "n1", (1,), 2, time_us=70.0, wrong=0),
               Result(check, "n2", (2,), 2, time_us=150.0, wrong=0)]
    judged = judge(results, profile, ["n0", "n1", "n2"])
    assert [v.verdict for v in judged.verdicts if v.result.check is check] == [
        "PASS", "WARN", "FAIL"]
    assert judged.verdicts[0].ratio == pytest.approx(100.0 / 20.0)  # 5x better than the floor
    assert "node n2 failed" in judged.culprits[0]
    warned = judge(results[:2], profile, ["n0", "n1", "n2"])
    assert warned.outcome(strict=False)[1] == 0 and warned.outcome(strict=True)[1] == 4


def test_wrong_data_fails_with_exit_1_and_skips_say_why(profile):
    check = profile.checks[1]
    results = [Result(check, "n0", (0,), 2, time_us=20.0, wrong=3),
               Result(profile.checks[0], "pairs", (), 0, note="one node: no pair")]
    judged = judge(results, profile, ["n0"])
    assert judged.outcome(strict=False)[:2] == ("wrong", 1)
    assert "pair bw: skipped (one node: no pair)" in judged.notes


def test_healthy_reach_keeps_the_plain_median_without_a_clear_fault():
    items = [(10.0, frozenset({0, 1})), (7.0, frozenset({0, 2})), (13.0, frozenset({1, 2}))]
    assert healthy.reach(items) == healthy.Reach(10.0, "median of all 3 items", True)
    slow = [(10.0, frozenset({0, 1})), (0.5, frozenset({0, 2})), (0.6, frozenset({1, 2}))]
    assert healthy.reach(slow) == healthy.Reach(10.0, "median of the 1 item not on 2", True)
    both = [(10.0, frozenset({0, 1})), (12.0, frozenset({0, 1}))]
    assert healthy.reach(both).compared is False


def test_the_built_in_cpu_profile_judges_a_run_of_this_machine():
    """cpu-gloo's floors sit far above what a 2-core VM reaches: an all-reduce of 4 KiB in
    1-3 ms passes."""
    from distbench.profiles import resolve

    cpu = resolve("cpu-gloo")
    lat = next(c for c in cpu.checks if c.metric == "time_us" and c.vs == "absolute")
    judged = judge([Result(lat, "vm", (0,), 2, time_us=3000.0, wrong=0)], cpu, ["vm"])
    assert judged.verdicts[0].verdict == "PASS"
    assert Path(cpu.path).name == "cpu-gloo.toml"


# ---------------------------------------------------------------------------------------------
# What a review of the rules found: the bad nodes a majority of the pairs, a node just under
# the check's own line, a check with one target, skips and wrong data in retests.


def _pair(profile, a: int, b: int, bw: float | None, **more) -> Result:
    return Result(profile.checks[0], f"n{a}+n{b}", (a, b), 2, busbw_gbps=bw,
                  wrong=0 if bw is not None else None, **more)


def test_two_slow_nodes_of_four_fail_their_pairs_and_are_both_named(profile):
    """Nodes 2 and 3 are on 5 of the 6 pairs: the median is theirs, and no single node looks
    slow against the rest until the other is left out too."""
    names = [f"n{i}" for i in range(4)]
    results = [_pair(profile, a, b, 10.0 if (a, b) == (0, 1) else 0.5)
               for a in range(4) for b in range(a + 1, 4)]
    judged = judge(results, profile, names)
    failed = sorted(v.result.target for v in judged.verdicts if v.verdict == "FAIL")
    assert failed == ["n0+n2", "n0+n3", "n1+n2", "n1+n3", "n2+n3"]
    assert "not on n2, n3" in judged.verdicts[0].why or "not on n3, n2" in judged.verdicts[0].why
    assert judged.retests() == [("pair bw", [[(0, 2), (1, 3)]])]
    again = [_pair(profile, 0, 2, 0.5, retest=True), _pair(profile, 1, 3, 0.5, retest=True)]
    judged = judge(results + again, profile, names)
    assert sorted(c.split(" is in")[0] for c in judged.culprits) == [
        "pair bw: node n2", "pair bw: node n3"]
    assert all("2 of its 3 partners pass with other nodes (confirmed" in c
               for c in judged.culprits)


def test_a_node_under_the_checks_own_line_is_not_its_own_reference(profile):
    """3 nodes, node 2 at 0.4 of the others (the check fails under 0.5): it is on 2 of the 3
    pairs and sets their median, yet its pairs fail."""
    names = ["n0", "n1", "n2"]
    results = [_pair(profile, 0, 1, 10.0), _pair(profile, 0, 2, 4.0), _pair(profile, 1, 2, 4.0)]
    verdicts = {v.result.target: v.verdict for v in judge(results, profile, names).verdicts
                if v.result.check.name == "pair bw"}
    assert verdicts == {"n0+n1": "PASS", "n0+n2": "FAIL", "n1+n2": "FAIL"}
    # and at 0.7 of the others, between the fail (0.5) and warn (0.8) lines: warned
    results = [_pair(profile, 0, 1, 10.0), _pair(profile, 0, 2, 7.0), _pair(profile, 1, 2, 7.0)]
    verdicts = {v.result.target: v.verdict for v in judge(results, profile, names).verdicts
                if v.result.check.name == "pair bw"}
    assert verdicts == {"n0+n1": "PASS", "n0+n2": "WARN", "n1+n2": "WARN"}


def test_a_peers_check_with_one_target_is_skipped_not_passed(profile):
    judged = judge([_pair(profile, 0, 1, 0.01)], profile, ["n0", "n1"])
    (v,) = [v for v in judged.verdicts if v.result.check.name == "pair bw"]
    assert (v.verdict, v.why) == ("SKIP", "one target: no peers to judge it against")
    status, code, line = judged.outcome(strict=False)
    assert (status, code) == ("ok", 0) and "1 skipped" in line


def test_a_skipped_pair_neither_passes_nor_names_a_node(profile):
    names = ["n0", "n1", "n2"]
    results = [_pair(profile, 0, 1, 0.5), _pair(profile, 0, 2, 0.5),
               _pair(profile, 1, 2, None, note="does not fit in device memory")]
    judged = judge(results, profile, names, baseline={("pair bw", "n0+n1"): 10.0,
                                                      ("pair bw", "n0+n2"): 10.0})
    assert judged.culprits == []  # node 0 fails both its pairs, but no partner passed anything
    retest_skipped = _pair(profile, 0, 1, None, retest=True, note="does not fit")
    judged = judge(results + [retest_skipped], profile, names,
                   baseline={("pair bw", "n0+n1"): 10.0, ("pair bw", "n0+n2"): 10.0})
    (v,) = [v for v in judged.verdicts if v.result.target == "n0+n1" and not v.result.retest]
    assert v.verdict == "FAIL" and v.why.endswith("its retest measured nothing: it stands, "
                                                  "unconfirmed")


def test_wrong_data_in_a_retest_is_exit_1(profile):
    names = [f"n{i}" for i in range(3)]
    results = _pairs(profile, 3, slow=2)
    judged = judge(results + [Result(profile.checks[0], "n0+n2", (0, 2), 2, busbw_gbps=0.4,
                                     wrong=12, retest=True)], profile, names)
    assert judged.outcome(strict=False)[:2] == ("wrong", 1)
