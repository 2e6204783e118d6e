"""configs/grafana/distbench-watch.json queries only what `watch` exports: every PromQL
expression in it (panels' targets, the template variables' queries) names distbench metrics
that metrics.ALL holds, filters and groups them on labels they have, and names no other metric
but the DCGM exporter's few in DCGM. A small PromQL tokenizer finds the names: label matchers'
values, strings, ranges, functions and keywords are not metrics."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from distbench.kinds.watch import metrics

DASHBOARD = Path(__file__).resolve().parents[1] / "configs" / "grafana" / "distbench-watch.json"
LABELS = {m.name: set(m.labels) for m in metrics.ALL}

# The DCGM exporter's metrics the dashboard joins to the stragglers (its panels say they need
# dcgm-exporter), with the labels dcgm-exporter gives every GPU series. Only these: any other
# non-distbench name is a typo or a dependency the docs do not tell users to install.
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}
DCGM = {"DCGM_FI_DEV_GPU_TEMP": DCGM_LABELS, "DCGM_FI_DEV_SM_CLOCK": DCGM_LABELS}

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = LABEL_LISTS | {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_]\w*)
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:ms|[smhdwy])?|0x[0-9a-fA-F]+)
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=(){},@])
""", re.VERBOSE)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str


def tokens(expr: str) -> list[Tok]:
    out, at = [], 0
    while at < len(expr):
        m = _TOKEN.match(expr, at)
        if m is None:
            raise ValueError(f"cannot read PromQL at {expr[at:at + 20]!r} in {expr!r}")
        if m.lastgroup != "space":
            out.append(Tok(m.lastgroup, m.group()))
        at = m.end()
    return out


def _closing(toks: list[Tok], i: int) -> int:
    """The index of the bracket that closes toks[i] ('(' or '{')."""
    pair = {"(": ")", "{": "}"}[toks[i].text]
    depth = 0
    for j in range(i, len(toks)):
        depth += (toks[j].text == toks[i].text) - (toks[j].text == pair)
        if depth == 0:
            return j
    raise ValueError("unbalanced brackets")


@dataclass
class Use:
    """What one expression names: metrics, and labels each with the metrics it must be on."""

    metrics: list[str]
    labels: list[tuple[str, str, tuple[str, ...]]]  # (label, why, the metrics it must be on)


def uses(expr: str) -> Use:
    toks = tokens(expr)
    names: list[tuple[int, str]] = []  # (token index, metric name)
    matchers: list[tuple[str, str]] = []  # (label, metric) from selectors
    lists: list[tuple[str, list[str], int, int]] = []  # (keyword, labels, scope start, end)
    skip: set[int] = set()
    for i, t in enumerate(toks):
        if i in skip or t.kind != "ident":
            continue
        nxt = toks[i + 1].text if i + 1 < len(toks) else ""
        if t.text in LABEL_LISTS:
            if nxt != "(":
                continue  # group_left with no list
            end = _closing(toks, i + 1)
            labels = [x.text for x in toks[i + 2:end] if x.kind == "ident"]
            skip.update(range(i + 1, end + 1))
            lists.append((t.text, labels, *_scope(toks, i, end)))
        elif t.text in KEYWORDS or t.text in AGGREGATIONS or nxt == "(":
            continue  # a keyword, an aggregation, or a function's name
        else:
            names.append((i, t.text))
            if nxt == "{":
                end = _closing(toks, i + 1)
                matchers += [(x.text, t.text) for k, x in enumerate(toks[i + 2:end], i + 2)
                             if x.kind == "ident" and toks[k + 1].kind == "op"
                             and toks[k + 1].text in ("=", "!=", "=~", "!~")]
                skip.update(range(i + 1, end + 1))
    for i, t in enumerate(toks):  # a bare selector: {__name__="..."} or {job="..."}
        if t.text == "{" and i not in skip and (i == 0 or toks[i - 1].kind != "ident"):
            raise ValueError(f"a selector with no metric name in {expr!r}: name it")
    labels = [(label, f"{m}{{{label}...}}", (m,)) for label, m in matchers]
    for keyword, names_listed, lo, hi in lists:
        inside = tuple(n for k, n in names if lo <= k <= hi)
        labels += [(label, f"{keyword}({label})", inside) for label in names_listed]
    return Use([n for _, n in names], labels)


def _scope(toks: list[Tok], at: int, list_end: int) -> tuple[int, int]:
    """The tokens a label list applies to. by/without: the aggregation's argument, the
    parentheses after the list, or before it (`sum(x) by (l)`). on/ignoring/group_*: both
    operands, taken as the innermost parentheses around the operator, or the whole query."""
    if toks[at].text in ("by", "without"):
        if list_end + 1 < len(toks) and toks[list_end + 1].text == "(":
            return list_end + 1, _closing(toks, list_end + 1)
        depth = 0
        for j in range(at - 1, -1, -1):
            depth += (toks[j].text == ")") - (toks[j].text == "(")
            if depth == 0:
                return j, at
        raise ValueError("an aggregation's label list with no argument")
    depth = 0
    for j in range(at - 1, -1, -1):
        depth += (toks[j].text == ")") - (toks[j].text == "(")
        if depth < 0:
            return j, _closing(toks, j)
    return 0, len(toks) - 1


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
