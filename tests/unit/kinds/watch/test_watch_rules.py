"""configs/prometheus/distbench-rules.yml, the alert rules docs/monitoring.md links to, checked
and unit-tested with the real promtool (Debian's prometheus package; `make promtool` unpacks it
into .cache/, .ci/run does). Where there is none, the promtool tests skip and say why. The unit
tests (distbench-rules.test.yml) are shown to bite: every expectation flipped fails, and each
fix of issue 45 undone fails the scenario it was made for. The rules name only what metrics.ALL
exports, and the doc names the file without copying it.
The tests that start processes: test_watch_rules_multiproc.py."""

from __future__ import annotations

import re

import pytest
from paths import REPO
from watch_helpers import ALERTS, RULES, Rule, rules, uses

from distbench.kinds.watch import metrics

DOC = REPO / "docs" / "monitoring.md"
LABELS = {m.name: set(m.labels) for m in metrics.ALL}
SCRAPE_LABELS = {"instance", "job"}  # what Prometheus adds to every scraped series


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
