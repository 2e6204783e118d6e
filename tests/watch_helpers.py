"""Shared by watch's tests (tests/unit/kinds/watch/, tests/multiproc/kinds/watch/): runs and
records written by hand, and the alert rules and dashboard read back."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from paths import REPO

from distbench.kinds.watch.records import Judgement, Probe, ProbeState

MIB = 1 << 20


def accept_row(check: str, scope: str, op: str, size: int | None, ranks: int, time_us,
               spread, verdict: str = "PASS", command: str = "collective",
               dtype: str = "float32", retest: bool = False, wrong: int | None = 0) -> dict:
    return {"check": check, "scope": scope, "target": scope, "command": command, "op": op,
            "dtype": dtype, "size_bytes": size, "ranks": ranks, "time_us": time_us,
            "spread": spread, "verdict": verdict, "retest": retest, "wrong": wrong,
            "metric": "time_us", "measured": time_us}


def accept_run(where: Path, rows: list[dict], world: int = 2) -> Path:
    """An accept run directory: accept.json as accept writes it (accept.csv holds the same
    rows, and is not read)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "accept.json").write_text(json.dumps({
        "schema_version": 1, "status": "ok", "verdict": "PASS", "world_size": world,
        "nodes": ["vm"], "verdicts": rows}))
    (where / "accept.csv").write_text("check\n")
    return where


CPU_GLOO_ROWS = [  # what `accept --profile cpu-gloo --workers 2` wrote on one node
    accept_row("node all_reduce latency", "node", "all_reduce", 4096, 2, 916.5, 14.8),
    accept_row("node all_reduce busbw", "node", "all_reduce", MIB, 2, 2655.4, 3.96, "SKIP"),
    accept_row("node all_gather busbw", "node", "all_gather", 65536, 2, 1959.4, 1.75, "SKIP"),
    accept_row("node pingpong latency", "node", "pingpong", 4096, 2, 612.4, 42.7, "SKIP",
               command="p2p"),
    accept_row("pair all_reduce busbw", "pair", "all_reduce", None, 0, None, None, "SKIP",
               wrong=None),
    accept_row("cluster all_reduce latency", "cluster", "all_reduce", 4096, 2, 226.9, 0.498),
]

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


def probe_line(op: str = "all_reduce", size: int = MIB, dtype: str = "float32", world: int = 2,
               time_us: float = 100.0, status: str = "ok") -> dict:
    return {"op": op, "size_bytes": size, "scope": "cluster", "dtype": dtype, "status": status,
            "time_us": time_us, "rank_time_us": [time_us] * world}


def watch_run(where: Path, probes_per_cycle: list[list[dict]] | None = None, *,
              world: int | None = 2, dtype: str = "float32", tail: str = "") -> Path:
    """A watch run directory as watch leaves one: watch.jsonl, a line per cycle, and run.json
    (world: None writes none). `tail`: bytes after the last whole line (a torn write)."""
    where.mkdir(parents=True, exist_ok=True)
    cycles = probes_per_cycle or [[probe_line(time_us=t)] for t in (100.0, 110.0, 105.0)]
    text = "".join(json.dumps({"cycle": i, "probes": p}) + "\n" for i, p in enumerate(cycles))
    (where / "watch.jsonl").write_text(text + tail)
    if world is not None:
        (where / "run.json").write_text(json.dumps({
            "command": "watch", "world_size": world,
            "options": {"ops": ["all_reduce"], "sizes": [MIB], "dtype": dtype}}))
    return where


AR = Probe("all_reduce", 1 << 20)


def _straggler_judged() -> Judgement:
    return Judgement({AR.key: ProbeState("ok", 1000.0, baseline_us=1000.0)}, "warn", (0,),
                     late_why={0: (AR.key, 9891.0)})


RULES = REPO / "configs" / "prometheus" / "distbench-rules.yml"

ALERTS = ("DistbenchFabricFail", "DistbenchWatchDown", "DistbenchWatchStale", "DistbenchStraggler")


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
