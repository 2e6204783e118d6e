"""configs/grafana/distbench-watch.json queries only what `watch` exports: every PromQL
expression in it (panels' targets, the template variables' queries) names distbench metrics
that metrics.ALL holds, filters and groups them on labels they have, and names no other metric
but the DCGM exporter's few in DCGM. A small PromQL tokenizer finds the names: label matchers'
values, strings, ranges, functions and keywords are not metrics."""

from __future__ import annotations

import copy
import json
import re

import pytest
from paths import REPO
from watch_helpers import uses

from distbench.kinds.watch import metrics

DASHBOARD = REPO / "configs" / "grafana" / "distbench-watch.json"
LABELS = {m.name: set(m.labels) for m in metrics.ALL}

# The DCGM exporter's metrics the dashboard joins to the stragglers (its panels say they need
# dcgm-exporter), with the labels dcgm-exporter gives every GPU series. Only these: any other
# non-distbench name is a typo or a dependency the docs do not tell users to install.
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}
DCGM = {"DCGM_FI_DEV_GPU_TEMP": DCGM_LABELS, "DCGM_FI_DEV_SM_CLOCK": DCGM_LABELS}


def problems(expr: str, legend: str = "") -> list[str]:
    """What in one query names a metric distbench does not export, a label its metric lacks,
    or a non-distbench metric DCGM does not allow."""
    found = []
    use = uses(expr)
    for name in use.metrics:
        if name.startswith("distbench_"):
            if name not in LABELS:
                found.append(f"{name}: not a metric distbench exports (metrics.ALL)")
        elif name not in DCGM:
            found.append(f"{name}: neither distbench's nor an allowed DCGM metric")
    for label, why, on in use.labels:
        for name in on:
            have = LABELS.get(name) if name.startswith("distbench_") else DCGM.get(name)
            if have is not None and label not in have and not (
                    why.startswith("group_") and not name.startswith("distbench_")):
                found.append(f"{why}: {name} has no label {label!r} (it has {sorted(have)})")
    if found:
        return found  # a legend's labels are judged against metrics that exist
    known = set().union(*(LABELS[n] if n in LABELS else DCGM[n] for n in use.metrics))
    return [f"legend {{{{{x}}}}}: no metric of the query has that label"
            for x in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend) if x not in known]


def queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend) for every query: panels' targets (rows' nested panels too) and
    query variables (`label_values(<query>, <label>)` checked as `<query>` grouped by label)."""
    found = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                found.append((f"panel {p['title']!r} {t['refId']}", t["expr"],
                              t.get("legendFormat", "")))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    for v in dashboard["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q, re.S)
        expr = f"max by ({m[2]}) ({m[1]})" if m else q
        found.append((f"variable {v['name']}", expr, ""))
    return found


def dashboard_problems(dashboard: dict) -> list[str]:
    return [f"{where}: {p}" for where, expr, legend in queries(dashboard)
            for p in problems(expr, legend)]


def _load() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_queries_only_what_distbench_exports_on_labels_it_has():
    assert dashboard_problems(_load()) == []


def test_every_metric_distbench_exports_has_a_panel():
    named = {n for _, expr, _ in queries(_load()) for n in uses(expr).metrics}
    assert {m.name for m in metrics.ALL} - named == set()


def test_the_dashboard_imports_with_a_prometheus_datasource_and_the_asked_variables():
    d = _load()
    assert d["schemaVersion"] >= 36 and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"Hostname", "op", "size"} <= set(variables)
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in panels:
        assert p["targets"], p["title"]
        for ds in [p["datasource"], *(t["datasource"] for t in p["targets"])]:
            assert ds == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
    for p in panels:  # a panel that is empty without dcgm-exporter says so
        if any(n in DCGM for t in p["targets"] for n in uses(t["expr"]).metrics):
            assert "needs DCGM exporter" in p["title"], p["title"]


def test_metric_names_are_read_past_strings_ranges_functions_and_keywords():
    use = uses('max by (op) (rate(distbench_cycles_total{op="distbench_nope", '
               "scope!~'x'}[$__rate_interval] offset 5m)) / on() group_left "
               "sum without (scope) (distbench_late_cycles_total) > bool 0.5e3")
    assert use.metrics == ["distbench_cycles_total", "distbench_late_cycles_total"]
    assert ("op", "distbench_cycles_total{op...}", ("distbench_cycles_total",)) in use.labels
    assert ("op", "by(op)", ("distbench_cycles_total",)) in use.labels
    assert ("scope", "without(scope)", ("distbench_late_cycles_total",)) in use.labels
    assert uses("time() - distbench_up").metrics == ["distbench_up"]
    assert uses('DCGM_FI_DEV_GPU_TEMP * on(Hostname, gpu) group_left(rank) '
                '(max by (Hostname, gpu, rank) (distbench_straggler) == 1)').labels[2] == (
        "rank", "group_left(rank)", ("DCGM_FI_DEV_GPU_TEMP", "distbench_straggler"))


def _mutated(path: tuple, find: str, replace: str) -> dict:
    d = copy.deepcopy(_load())
    node = d
    for key in path[:-1]:
        node = node[key]
    assert find in node[path[-1]], (node[path[-1]], find)
    node[path[-1]] = node[path[-1]].replace(find, replace, 1)
    return d


def _target(title: str) -> tuple:
    d = _load()
    i = next(i for i, p in enumerate(d["panels"]) if p["title"] == title)
    return ("panels", i, "targets", 0, "expr")


@pytest.mark.parametrize(("title", "find", "replace", "said"), [
    ("Bus bandwidth per probe", "distbench_busbw_bytes_per_second",
     "distbench_busbw_bytes_per_secnd", "not a metric distbench exports"),
    ("Cycles", "distbench_cycles_total", "distbench_cycles", "not a metric distbench exports"),
    ("Stragglers now", 'Hostname=~"$Hostname"', 'hostname=~"$Hostname"', "no label 'hostname'"),
    ("Time per probe", "by (op, size, scope)", "by (op, size, scope, rank)", "no label 'rank'"),
    ("GPU temperature of stragglers (needs DCGM exporter)", "group_left(rank)",
     "group_left(rnak)", "no label 'rnak'"),
    ("GPU temperature of stragglers (needs DCGM exporter)", "DCGM_FI_DEV_GPU_TEMP",
     "DCGM_FI_DEV_POWER_USAGE", "neither distbench's nor an allowed DCGM metric"),
    ("Cycle duration vs interval", "max(distbench_cycle_duration_seconds)",
     "max(node_load1)", "neither distbench's nor an allowed DCGM metric"),
])
def test_a_dashboard_with_a_misspelt_metric_or_an_unknown_label_fails(title, find, replace, said):
    bad = dashboard_problems(_mutated(_target(title), find, replace))
    assert len(bad) == 1 and said in bad[0], bad


def test_a_misspelt_label_in_a_variable_or_a_legend_fails():
    d = _load()
    i = next(i for i, v in enumerate(d["templating"]["list"]) if v["name"] == "op")
    bad = dashboard_problems(_mutated(("templating", "list", i, "query", "query"), ", op)",
                                      ", opp)"))
    assert len(bad) == 1 and "no label 'opp'" in bad[0], bad
    path = _target("Bus bandwidth per probe")[:-1] + ("legendFormat",)
    bad = dashboard_problems(_mutated(path, "{{scope}}", "{{scop}}"))
    assert len(bad) == 1 and "legend {{scop}}" in bad[0], bad
