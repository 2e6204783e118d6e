"""configs/prometheus/distbench-rules.yml, the alert rules docs/monitoring.md links to, checked
and unit-tested with the real promtool (Debian's prometheus package; `make promtool` unpacks it
into .cache/, .ci/run does). Where there is none, the promtool tests skip and say why. The unit
tests (distbench-rules.test.yml) are shown to bite: every expectation flipped fails, and each
fix of issue 45 undone fails the scenario it was made for. The rules name only what metrics.ALL
exports, and the doc names the file without copying it."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import debian_tool
from test_grafana_dashboard import uses

from distbench.kinds.watch import metrics

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "configs" / "prometheus" / "distbench-rules.yml"
RULE_TESTS = RULES.with_name("distbench-rules.test.yml")
DOC = REPO / "docs" / "monitoring.md"
UNPACKED = REPO / ".cache" / "prometheus" / "usr" / "bin" / "promtool"
ALERTS = ("DistbenchFabricFail", "DistbenchWatchDown", "DistbenchWatchStale", "DistbenchStraggler")
LABELS = {m.name: set(m.labels) for m in metrics.ALL}
SCRAPE_LABELS = {"instance", "job"}  # what Prometheus adds to every scraped series


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


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str  # whitespace folded, as YAML's `>-` folds it
    text: str  # the rule's lines: annotations included


def rules(text: str | None = None) -> list[Rule]:
    """The alerting rules of the rules file (or `text`), read by indentation: the file keeps to
    `- alert:` items whose `expr` is one line or a `>-` block (no YAML parser in the venv)."""
    lines = (RULES.read_text() if text is None else text).splitlines()
    found = []
    starts = [i for i, line in enumerate(lines) if re.match(r"\s*- alert:", line)]
    for at, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        block = lines[at:end]
        alert = block[0].split(":", 1)[1].strip()
        (i,) = [k for k, line in enumerate(block) if re.match(r"\s*expr:", line)]
        indent = len(block[i]) - len(block[i].lstrip())
        value = block[i].split(":", 1)[1].strip()
        if value in (">", ">-", "|", "|-"):
            more = []
            for line in block[i + 1:]:
                if line.strip() and len(line) - len(line.lstrip()) <= indent:
                    break
                more.append(line.strip())
            value = " ".join(x for x in more if x)
        found.append(Rule(alert, value, "\n".join(block)))
    return found


def rule_problems(rule: Rule) -> list[str]:
    """What in one rule names a metric distbench does not export, or a label that neither its
    metrics nor Prometheus' scrape give them."""
    found = []
    use = uses(rule.expr)
    for name in use.metrics:
        if name not in LABELS:
            found.append(f"{rule.alert}: {name}: not a metric distbench exports (metrics.ALL)")
    if found:
        return found
    for label, why, on in use.labels:
        for name in on:
            if label not in LABELS[name] | SCRAPE_LABELS:
                found.append(f"{rule.alert}: {why}: {name} has no label {label!r}")
    known = set().union(SCRAPE_LABELS, *(LABELS[n] for n in use.metrics))
    found += [f"{rule.alert}: $labels.{x}: no metric of the rule has that label"
              for x in re.findall(r"\$labels\.(\w+)", rule.text) if x not in known]
    return found


def test_the_rules_file_holds_the_four_alerts_on_distbench_metrics_alone():
    assert tuple(r.alert for r in rules()) == ALERTS
    assert all(r.expr and "distbench_" in r.expr for r in rules())
    assert [p for r in rules() for p in rule_problems(r)] == []


@pytest.mark.parametrize(("alert", "find", "replace", "said"), [
    ("DistbenchFabricFail", "distbench_last_verdict", "distbench_last_verdicts",
     "not a metric distbench exports"),
    ("DistbenchFabricFail", '{state="fail"}', '{status="fail"}', "no label 'status'"),
    ("DistbenchWatchDown", "on(instance, job, Hostname)", "on(instance, job, hostname)",
     "no label 'hostname'"),
    ("DistbenchWatchDown", "$labels.Hostname", "$labels.node", "$labels.node"),
    ("DistbenchWatchStale", "on(instance, job)", "on(instance, job, Hostname)",
     "no label 'Hostname'"),
    ("DistbenchWatchStale", "- distbench_last_cycle_timestamp_seconds",
     "- distbench_last_cycle_seconds", "not a metric distbench exports"),
    ("DistbenchStraggler", "by (rank, Hostname, gpu, UUID)", "by (rank, Hostname, gpu, uuid)",
     "no label 'uuid'"),
])
def test_a_rule_on_a_misspelt_metric_or_an_unknown_label_fails(alert, find, replace, said):
    (rule,) = [r for r in rules() if r.alert == alert]
    assert rule.text.count(find) == 1
    bad = rule_problems(rules(rule.text.replace(find, replace))[0])
    assert bad and all(said in b for b in bad), bad


def alert_rules_section(doc: str) -> str:
    return doc.split("\n## Alert rules\n", 1)[1].split("\n## ", 1)[0]


def doc_problems(doc: str) -> list[str]:
    """The doc's Alert rules section must link the rules file, say how to load it, name each
    alert, and copy none of the rules."""
    section = alert_rules_section(doc)
    found = []
    link = "](../configs/prometheus/distbench-rules.yml)"
    if link not in section:
        found.append(f"no link {link}")
    if "rule_files:" not in section:
        found.append("does not say how to load the file (rule_files:)")
    found += [f"does not name {a}" for a in ALERTS if a not in section]
    folded = " ".join(doc.split())
    found += [f"copies {r.alert}'s expr" for r in rules() if r.expr in folded]
    found += [f"holds rule YAML ({key!r})" for key in ("- alert:", "expr:", "groups:")
              if key in doc]
    return found


def test_the_doc_links_the_rules_file_and_does_not_copy_it():
    assert (DOC.parent / "../configs/prometheus/distbench-rules.yml").resolve() == RULES
    assert doc_problems(DOC.read_text()) == []


def test_a_doc_that_pastes_the_rules_or_drops_the_link_fails():
    doc = DOC.read_text()
    pasted = doc.replace("\n## Grafana\n", f"\n```yaml\n{RULES.read_text()}```\n\n## Grafana\n")
    bad = doc_problems(pasted)
    assert {f"copies {a}'s expr" for a in ALERTS} <= set(bad), bad
    unlinked = doc.replace("](../configs/prometheus/distbench-rules.yml)", "]")
    assert doc_problems(unlinked) == ["no link ](../configs/prometheus/distbench-rules.yml)"]


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
