"""configs/prometheus/distbench-rules.yml checked and unit-tested with the real promtool; where
there is none, these skip. The rules read as YAML: test_watch_rules.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers import debian_tool
from paths import REPO
from watch_helpers import ALERTS, RULES, rules

RULE_TESTS = RULES.with_name("distbench-rules.test.yml")

UNPACKED = REPO / ".cache" / "prometheus" / "usr" / "bin" / "promtool"


def promtool_binary() -> tuple[Path | None, str]:
    """promtool, or None and why there is none."""
    return debian_tool("promtool", UNPACKED, "promtool")


@pytest.fixture
def promtool():
    exe, why = promtool_binary()
    if exe is None:
        pytest.skip(why)

    def run(*args: str | Path) -> tuple[int, str]:
        # the unit tests' failures go to stderr, their names to stdout: read as one
        proc = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                              timeout=60)
        return proc.returncode, proc.stdout + proc.stderr

    return run


@pytest.mark.procs(1)
def test_promtool_checks_the_rules_file(promtool):
    rc, said = promtool("check", "rules", RULES)
    assert rc == 0, said
    # promtool counts what the indentation reader above found: it missed no rule
    assert f"SUCCESS: {len(rules())} rules found" in said, said


@pytest.mark.procs(1)
def test_the_rules_pass_their_unit_tests(promtool):
    rc, said = promtool("test", "rules", RULE_TESTS)
    assert rc == 0 and "SUCCESS" in said, said


Expectation = tuple[str, str, str]  # (test name, alertname, eval_time)


def expectations(text: str) -> list[Expectation]:
    found, name, at = [], None, None
    for line in text.splitlines():
        if m := re.fullmatch(r"  - name: (.+)", line):
            name = m[1]
        elif m := re.fullmatch(r"\s+- eval_time: (\S+)", line):
            at = m[1]
        elif m := re.fullmatch(r"\s+alertname: (\S+)", line):
            found.append((name, m[1], at))
    return found


def failures(said: str) -> set[Expectation]:
    """The expectations promtool's output reports failed."""
    return set(re.findall(r"name: (.+),\n\s*alertname: (\S+), time: (\S+),", said))


def flipped(text: str) -> str:
    """Every expectation turned over: nothing fires where an alert was expected, and an alert
    is expected wherever none may fire."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if re.fullmatch(r"\s+exp_alerts: \[\]", line):
            out.append(line.replace("[]", '[{exp_labels: {flipped: "yes"}}]'))
        elif re.fullmatch(r"\s+exp_alerts:", line):
            out.append(f"{line} []")
            indent = len(line) - len(line.lstrip())
            while i < len(lines) and len(lines[i]) - len(lines[i].lstrip()) > indent:
                i += 1
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def with_rules(tmp_path: Path, rules_text: str, tests_text: str | None = None) -> Path:
    """A copy of the unit tests (or `tests_text`) run against `rules_text`, in tmp_path."""
    (tmp_path / RULES.name).write_text(rules_text)
    copy = tmp_path / RULE_TESTS.name
    copy.write_text(RULE_TESTS.read_text() if tests_text is None else tests_text)
    return copy


@pytest.mark.procs(1)
def test_every_expectation_of_the_unit_tests_can_fail(promtool, tmp_path):
    text = RULE_TESTS.read_text()
    expected = expectations(text)
    assert len(expected) == len(re.findall(r"exp_alerts:", text))
    assert {a for _, a, _ in expected} == set(ALERTS)
    assert text.count("exp_alerts: []") >= len(ALERTS)  # where nothing may fire
    rc, said = promtool("test", "rules", with_rules(tmp_path, RULES.read_text(), flipped(text)))
    assert rc != 0, said
    assert failures(said) == set(expected), said


# Each fix of issue 45 undone, and the scenarios that must then fail.
UNDONE = {
    "a deliberate end alerts as a lost watch": (
        "(distbench_up == 0) unless on(instance, job, Hostname) (distbench_ended == 1)",
        "distbench_up == 0",
        {"a lost watch fires DistbenchWatchDown, not Stale", "a deliberate end raises nothing",
         "a deliberate end after a FAIL verdict fires DistbenchFabricFail only"}),
    "one node's deliberate end hides another's lost watch": (
        "on(instance, job, Hostname)", "on()",
        {"a lost watch fires DistbenchWatchDown, not Stale"}),
    "an ended FAIL is forgotten": (
        'distbench_last_verdict{state="fail"}', 'distbench_verdict{state="fail"}',
        {"a deliberate end after a FAIL verdict fires DistbenchFabricFail only",
         "a running FAIL verdict fires after 5 minutes, not before"}),
    "the age is taken at evaluation, not at the scrape": (
        "timestamp(distbench_last_cycle_timestamp_seconds)", "time()",
        {"a healthy watch at --interval 2 scraped every 2 minutes is not stale"}),
    "every node's copy of a straggler alerts": (
        "max by (rank, Hostname, gpu, UUID) (distbench_straggler)",
        "distbench_straggler",
        {"a straggler named fires once, whichever nodes' files name it"}),
}


@pytest.mark.procs(1)
@pytest.mark.parametrize("undone", list(UNDONE))
def test_each_fix_undone_fails_its_scenarios(promtool, tmp_path, undone):
    find, replace, scenarios = UNDONE[undone]
    text = RULES.read_text()
    assert text.count(find) == 1
    rc, said = promtool("test", "rules", with_rules(tmp_path, text.replace(find, replace)))
    assert rc != 0, said
    assert {name for name, _, _ in failures(said)} == scenarios, said
