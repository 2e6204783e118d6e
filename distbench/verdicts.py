"""Judging acceptance results: each measurement against the profile's expectation (a floor in
the metric's unit, or a share of what the healthy peers reach) or a baseline run's figure; PASS,
WARN, FAIL or SKIP; the node a pair check's failures point at; the retests that confirm it; and
the run's outcome. Pure: results in, verdicts out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from distbench import healthy
from distbench.exitcodes import EXIT_BELOW, EXIT_OK, EXIT_WRONG
from distbench.profiles import Check, Profile
from distbench.schedule import pack, retest_rounds


@dataclass(frozen=True)
class Result:
    """One measurement of a check on one target."""

    check: Check
    target: str  # a node, "a+b" for a pair, "cluster"
    nodes: tuple[int, ...]  # node indices it ran on
    ranks: int
    size_bytes: int | None = None
    iters: int | None = None
    time_us: float | None = None
    p99_us: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    wrong: int | None = None
    p50_us: float | None = None
    p50_busbw_gbps: float | None = None
    note: str = ""  # why nothing was measured
    retest: bool = False  # a suspect node measured again against a node that passed

    @property
    def value(self) -> float | None:
        return getattr(self, self.check.metric)


@dataclass
class Verdict:
    result: Result
    verdict: str  # PASS, WARN, FAIL, SKIP
    expected: float | None = None  # the fail line, in the metric's unit
    warn_at: float | None = None
    reference: float | None = None  # what the healthy peers reach, or the baseline's figure
    ratio: float | None = None  # measured / expected, as "how good" (time inverted)
    why: str = ""


GRADES = {"fail": "FAIL", "warn": "WARN", "ok": "PASS"}


def _line(check: Check, reference: float, share: float | None) -> float | None:
    """The measured value that does `share` as well as `reference` (the fraction's inverse)."""
    if share is None:
        return None
    return reference * share if check.higher_is_better else reference / share


def _peers(check: Check, results: list[Result], names: list[str]) -> tuple[float, str] | None:
    """What the healthy targets of a check reach, in the metric's unit, and what it rests on."""
    measured = _first_measured(results)
    if len(measured) < 2:  # one target has no peers: nothing to judge it against
        return None
    # healthy.reach takes higher as better: a time is judged by its inverse
    flip = (lambda v: v) if check.higher_is_better else (lambda v: 1.0 / v if v else math.inf)
    items = [(flip(r.value), frozenset(r.nodes)) for r in measured]
    ends = [(names[i], i) for i in sorted({i for r in measured for i in r.nodes})]
    # a node is left out of the peers where its targets fall below the check's own strictest
    # line, so a node the check would fail (or warn about) cannot set what the peers reach
    lines = [x for x in (check.fail, check.warn) if x is not None]
    found = healthy.reach(items, ends, noun=("target", "targets"),
                          clearly=max(lines) if lines else healthy.CLEARLY_SLOW)
    why = "" if found.compared else " (each involves every node: nothing to compare with)"
    return flip(found.value), found.basis + why


def _first_measured(results: list[Result]) -> list[Result]:
    return [r for r in results if r.value is not None and not r.wrong and not r.retest]


NO_PEERS = "one target: no peers to judge it against"


def _judge_check(check: Check, results: list[Result], names: list[str], tolerance: float,
                 baseline: dict | None) -> list[Verdict]:
    """Every result of the check, retests too; what the peers reach comes from the first
    pass alone, and a retest is graded against it."""
    peers = _peers(check, results, names) if check.vs == "peers" else None
    out = []
    for r in results:
        if r.value is None:
            out.append(Verdict(r, "SKIP", why=r.note))
            continue
        if r.wrong:
            out.append(Verdict(r, "FAIL", why=f"{r.wrong} wrong elements: the data arrived "
                               "corrupted"))
            continue
        base = (baseline or {}).get((check.name, r.target))
        if base is not None:
            ratio = check.fraction(r.value, base)
            out.append(Verdict(r, "FAIL" if ratio < 1 - tolerance else "PASS",
                               _line(check, base, 1 - tolerance), None, base, ratio,
                               f"baseline {base:.4g}, worse than -{tolerance:.0%} fails"))
        elif check.vs == "peers" and peers is None:
            out.append(Verdict(r, "SKIP", why=NO_PEERS))
        elif peers is not None:
            reference, basis = peers
            out.append(Verdict(r, GRADES[check.grade(r.value, reference)],
                               _line(check, reference, check.fail),
                               _line(check, reference, check.warn), reference,
                               check.fraction(r.value, reference),
                               f"healthy peers reach {reference:.4g} ({basis})"))
        else:
            floor = check.fail if check.fail is not None else check.warn
            out.append(Verdict(r, GRADES[check.grade(r.value)], check.fail, check.warn, None,
                               check.fraction(r.value, floor), "the profile's floor"))
    return out


@dataclass
class Judged:
    verdicts: list[Verdict]
    names: list[str]
    culprits: list[str] = field(default_factory=list)  # one line each
    notes: list[str] = field(default_factory=list)
    # check name -> targets (tuples of nodes) to measure again: a suspect node paired with a
    # node that passed, or a failing target as it was
    plan: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)

    def retests(self) -> list[tuple[str, list[list[tuple[int, ...]]]]]:
        """(check name, rounds of targets that share no node)."""
        return [(check, pack(targets)) for check, targets in self.plan.items() if targets]

    def outcome(self, strict: bool) -> tuple[str, int, str]:
        """(run.json status, exit code, one line)."""
        first = [v for v in self.verdicts if not v.result.retest]
        wrong = [v for v in self.verdicts if v.result.wrong]  # a retest's wrong data counts
        failed = [v for v in first if v.verdict == "FAIL"]
        warned = [v for v in first if v.verdict == "WARN"]
        skipped = [v for v in first if v.verdict == "SKIP"]
        if wrong:
            return "wrong", EXIT_WRONG, (f"wrong results in {len(wrong)} measurements, "
                                         f"first {_name(wrong[0])}")
        if failed or (strict and warned):
            bad = failed or warned
            blame = f"; {self.culprits[0]}" if self.culprits else ""
            return "below_expectation", EXIT_BELOW, (
                f"{len(failed)} measurements failed, {len(warned)} warned: first "
                f"{_name(bad[0])}"
                f"{blame}")
        return "ok", EXIT_OK, (f"every check passed ({len(warned)} warnings"
                               + (f", {len(skipped)} skipped" if skipped else "") + ")")

    def rows(self) -> list[dict]:
        return [_row(v) for v in self.verdicts]

    def findings(self) -> list[str]:
        return [*self.culprits, *self.notes]


def _name(v: Verdict) -> str:
    return f"{v.result.check.name} on {v.result.target} ({v.verdict.lower()}: {v.why})"


def _row(v: Verdict) -> dict:
    r, c = v.result, v.result.check
    return {"check": c.name, "scope": c.scope, "target": r.target, "command": c.command,
            "op": c.op, "dtype": c.dtype, "size_bytes": r.size_bytes, "ranks": r.ranks,
            "iters": r.iters, "time_us": r.time_us, "p99_us": r.p99_us,
            "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps, "wrong": r.wrong,
            "metric": c.metric, "measured": r.value, "expected": v.expected,
            "warn_at": v.warn_at, "reference": v.reference, "ratio": v.ratio,
            "verdict": v.verdict, "retest": r.retest, "note": v.why, "p50_us": r.p50_us}


PASSED = ("PASS", "WARN")


def _suspects(first: list[Verdict]) -> tuple[list[int], list[int]]:
    """A pair check's suspect nodes (every pair they are in fails, while some partner of theirs
    passes with another node: two slow nodes among four are both named) and its healthy ones
    (they pass with every partner but the suspects, with whom nothing can pass). A pair that
    was skipped neither passes nor fails."""
    judged = [v for v in first if v.verdict in (*PASSED, "FAIL")]
    nodes = sorted({i for v in judged for i in v.result.nodes})
    fails = {i: [v.verdict == "FAIL" for v in judged if i in v.result.nodes] for i in nodes}
    passes = {i: not all(fails[i]) for i in nodes}
    suspects = [i for i in nodes if all(fails[i]) and any(
        passes[j] for v in judged if i in v.result.nodes for j in v.result.nodes if j != i)]
    healthy_nodes = [i for i in nodes if i not in suspects and not any(
        v.verdict == "FAIL" for v in judged if i in v.result.nodes
        and not set(v.result.nodes) & set(suspects))]
    return suspects, healthy_nodes


def _settle(check: Check, verdicts: list[Verdict], names: list[str], judged: Judged) -> None:
    """What the first pass's failures mean, once retests exist: a failure whose retest passed
    was noise (WARN, said so); one whose retest failed too stands. Names the node at fault and
    plans the retests when there are none yet."""
    first = [v for v in verdicts if not v.result.retest]
    again = [v for v in verdicts if v.result.retest]
    failing = [v for v in first if v.verdict == "FAIL" and not v.result.wrong]
    if not failing:
        return
    if check.scope == "pair" and len(names) == 2:
        judged.notes.append(f"{check.name}: {names[0]}+{names[1]} failed, and with 2 nodes a "
                            "pair cannot tell which end is slow; run with a third node, or "
                            "the node checks, to tell")
    suspects, healthy_nodes = _suspects(first) if check.scope == "pair" and len(names) > 2 \
        else ([], [])
    if not again:  # plan: suspects against nodes that passed, other failures as they were
        plan = [p for p in retest_rounds(suspects, healthy_nodes) for p in p]
        plan += [v.result.nodes for v in failing if not set(v.result.nodes) & set(suspects)]
        judged.plan[check.name] = plan
    for i in suspects:
        mine = [v for v in again if i in v.result.nodes and v.verdict != "SKIP"]
        held = mine and all(v.verdict == "FAIL" for v in mine)
        how = (" (confirmed against a node that passed)" if held else
               " (not confirmed: its retest passed)" if mine else "")
        pairs = sum(i in v.result.nodes and v.verdict == "FAIL" for v in first)
        partners = {j for v in first if i in v.result.nodes for j in v.result.nodes if j != i}
        fine = [j for j in partners if j in healthy_nodes]
        line = (f"{check.name}: node {names[i]} is in all {pairs} failing pairs, "
                + ("its partners pass" if len(fine) == len(partners) else
                   f"{len(fine)} of its {len(partners)} partners pass")
                + f" with other nodes{how}")
        (judged.culprits if held or not mine else judged.notes).append(line)
    for v in failing:
        same = [a for a in again if a.result.nodes == v.result.nodes]
        if not same:  # a suspect's pair: its node's retest against a healthy node decides
            same = [a for a in again if set(a.result.nodes) & set(v.result.nodes) & {*suspects}]
        if same and all(a.verdict in PASSED for a in same):
            v.verdict = "WARN"
            v.why += "; it passed its retest: noise, not a fault"
        elif any(a.verdict == "FAIL" for a in same):
            v.why += "; it failed its retest too"
        elif same:  # skipped: nothing measured, so nothing confirmed either way
            v.why += "; its retest measured nothing: it stands, unconfirmed"
    if check.scope == "node":
        judged.culprits += [f"{check.name}: node {v.result.target} failed ({v.why})"
                            for v in failing if v.verdict == "FAIL"]


def judge(results: list[Result], profile: Profile, names: list[str],
          baseline: dict | None = None) -> Judged:
    """`baseline`: (check name, target) -> the baseline run's measured value."""
    judged = Judged([], names)
    for check in profile.checks:
        mine = [r for r in results if r.check.name == check.name]
        verdicts = _judge_check(check, mine, names, profile.baseline_tolerance, baseline)
        judged.verdicts += verdicts
        if verdicts and all(v.verdict == "SKIP" for v in verdicts):
            judged.notes.append(f"{check.name}: skipped ({verdicts[0].why})")
        _settle(check, verdicts, names, judged)
    return judged
