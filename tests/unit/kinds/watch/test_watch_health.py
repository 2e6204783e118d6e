"""watch's health-check forms: node-problem-detector's exit codes and 80-character message,
Slurm's drain (the argv, the line printed, the reason), and distbench's exit codes for a
verdict."""

from __future__ import annotations

import shlex

import pytest

from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.kinds.watch.health import (
    drain_command,
    drain_reason,
    exit_code,
    npd_result,
    should_drain,
)
from distbench.kinds.watch.records import Judgement, ProbeState

AR, AG = "all_reduce/1048576/cluster", "all_gather/65536/cluster"


def judged(verdict: str, **states: str) -> Judgement:
    return Judgement({k: ProbeState(s) for k, s in states.items()}, verdict)


def test_npd_ok_problem_unknown():
    # the exit code is node-problem-detector's contract; the message only has to say why
    code, msg = npd_result(judged("ok", **{AR: "ok", AG: "ok"}), [])
    assert code == 0 and msg.startswith("distbench: ok") and "2 probes" in msg, msg
    # the worst probe named, and not one at a milder state
    code, msg = npd_result(judged("fail", **{AR: "fail", AG: "warn"}), [])
    assert code == 1 and msg.startswith("distbench: fail all_reduce 1 MiB"), msg
    assert "all_gather" not in msg and "+" not in msg, msg
    # the first probe at the verdict's state named, and how many more share it
    code, msg = npd_result(judged("warn", **{AR: "warn", AG: "warn"}), [])
    assert code == 1 and msg.startswith("distbench: warn all_reduce 1 MiB"), msg
    assert msg.endswith(" +1"), msg
    assert npd_result(judged("unknown", **{AR: "unknown"}), [])[0] == 2
    code, msg = npd_result(None, [])
    assert code == 2 and msg.startswith("distbench: ") and "could not run" in msg, msg


def test_npd_a_named_straggler_is_a_problem_even_when_probes_read_ok():
    code, msg = npd_result(judged("ok", **{AR: "ok"}), ["rank 1 gpu7"])
    assert code == 1 and msg.startswith("distbench: ") and "straggler rank 1 gpu7" in msg, msg
    code, msg = npd_result(judged("unknown", **{AR: "unknown"}), ["rank 1 gpu7"])
    assert code == 1
    # as the judge gives it: warn for the straggler alone, no probe at warn (an IndexError)
    code, msg = npd_result(judged("warn", **{AR: "ok"}), ["rank 1 gpu7"])
    assert code == 1 and "straggler rank 1 gpu7" in msg, msg
    assert "all_reduce" not in msg, msg  # the probe read ok: not the problem


@pytest.mark.parametrize("n", [1, 5, 50, 500])
def test_npd_message_never_passes_80_characters(n):
    names = [f"rank {i} node-with-a-long-name-{i}.cluster.example.org" for i in range(n)]
    long = "x" * 300 + "/1048576/cluster"
    code, msg = npd_result(judged("fail", **{long: "fail"}), names)
    assert code == 1 and len(msg) <= 80 and msg.endswith("...")
    assert msg.startswith("distbench: fail " + "x" * 20)
    assert "\n" not in msg


def test_drain_command_is_an_argv_and_the_shell_line_that_gives_it_back():
    # what scontrol runs and the line printed are contracts: a script or a person runs them
    drain = drain_command("gpu7", "all_reduce 1 MiB fail (3 of the last 5 cycles)")
    assert drain.argv == ["scontrol", "update", "NodeName=gpu7", "State=drain",
                          "Reason=distbench: all_reduce 1 MiB fail (3 of the last 5 cycles)"]
    assert drain.line == ("scontrol update NodeName=gpu7 State=drain "
                          "'Reason=distbench: all_reduce 1 MiB fail (3 of the last 5 cycles)'")
    assert shlex.split(drain.line) == drain.argv  # pasted into a shell, it runs the same


def test_drain_reason_is_sanitized_and_bounded():
    evil = 'slow"; rm -rf / `x` $(y) \\ \'q\'\nnext line\r' + "z" * 500
    drain = drain_command("gpu7", evil)
    reason = drain.argv[-1]
    assert not set(reason) & set("\"'`$\\\n\r")
    assert len(reason) <= len("Reason=") + 120 and reason.endswith("...")
    assert shlex.split(drain.line) == drain.argv  # the shell line means the same


def test_drain_reason_names_the_failing_probe_its_ratio_and_the_straggler():
    j = Judgement({AR: ProbeState("fail", 9810.0, baseline_us=1000.0),
                   AG: ProbeState("warn", 1200.0, baseline_us=1000.0)}, "fail", (1,),
                  late_why={1: (AR, 8832.0)})
    assert should_drain(j)
    # docs/monitoring.md quotes this reason whole, as sinfo -R shows it
    assert drain_reason(j, {1: "rank 1 (gpu7)"}) == (
        "all_reduce 1 MiB fail 9.81x baseline; straggler rank 1 (gpu7): 8832 us late in "
        "all_reduce 1 MiB")
    # a straggler alone makes the verdict warn, and drains: the reason names where it was late
    j = Judgement({AR: ProbeState("ok", 1000.0, baseline_us=1000.0)}, "warn", (1,),
                  late_why={1: (AR, 8832.0)})
    assert should_drain(j)
    assert drain_command("gpu7", drain_reason(j, {1: "rank 1 (gpu7)"})).argv[-1] == \
        "Reason=distbench: straggler rank 1 (gpu7): 8832 us late in all_reduce 1 MiB"
    # a probe's warn alone does not drain (a slowdown within twice the tolerance)
    assert not should_drain(Judgement({AR: ProbeState("warn", 1200.0, baseline_us=1000.0)},
                                      "warn"))


@pytest.mark.parametrize("node", ["", "gpu7 State=resume", "a=b", "-x", "gpu7\n"])
def test_drain_refuses_what_is_not_a_node_name(node):
    with pytest.raises(ValueError, match="not a Slurm node name"):
        drain_command(node, "slow")


def test_exit_codes_of_a_verdict_are_the_loops():
    """warn exits 4, as the loop ends a warn (the docstring said 0)."""
    assert [exit_code(v) for v in ("ok", "warn", "fail", "unknown")] == \
        [EXIT_OK, EXIT_BELOW, EXIT_BELOW, EXIT_INCONCLUSIVE]
    with pytest.raises(ValueError):
        exit_code("PASS")
